"""Real transformers: loading (bundled, hub, local, GGUF), sites, tracing."""

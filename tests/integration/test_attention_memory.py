"""Attention tracing keeps reduced statistics, never T x T matrices per head and layer."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import torch

import tokenfield as tf
from tests.integration.tiny import WORDS, tiny_tokenizer
from tokenfield.models.attention import capture_attention, eager_attention
from tokenfield.models.load import wrap_model

ROOT = Path(__file__).resolve().parents[2]
HEADS = 4


def long_model(layers: int):
    import transformers as tr

    torch.manual_seed(0)
    config = tr.LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=HEADS,
        num_key_value_heads=2,
        vocab_size=128,
        max_position_embeddings=4096,
    )
    model = tr.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    return wrap_model(model, tiny_tokenizer(), name="long")


def long_text(tokens: int) -> str:
    return " ".join(WORDS[i % len(WORDS)] for i in range(tokens))


def held_bytes(capture) -> int:
    total = 0
    for per_block in capture.summaries:
        for summary in per_block:
            total += sum(np.asarray(v).nbytes for v in summary.to_dict().values())
    return total


def test_hook_and_dataset_hold_bytes_linear_in_tokens():
    layers = 3
    model = long_model(layers)
    held, stored = {}, {}
    for tokens in (150, 300):
        ids = torch.tensor([model.tokenizer(long_text(tokens))["input_ids"]])
        with (
            torch.no_grad(),
            eager_attention(model.model),
            capture_attention(model.sites, causal=True) as capture,
        ):
            capture.reset(layers, torch.ones_like(ids))
            model.model(ids, use_cache=False)
        held[tokens] = held_bytes(capture)
        ds = tf.trace(model, [long_text(tokens)], positions="all", attention=True)
        stored[tokens] = sum(ds[name].nbytes for name in ds.data_vars if name.startswith("attn_"))
        matrices = layers * HEADS * tokens * tokens * 4  # float32 T x T per head and layer
        assert held[tokens] < matrices / 10
        assert stored[tokens] < matrices / 10
    # doubling T doubles what is kept (T^2 would quadruple it)
    assert held[300] / held[150] < 2.2
    assert stored[300] / stored[150] < 2.2


SCRIPT = textwrap.dedent(
    """
    import resource, sys
    sys.path.insert(0, {root!r})
    from tests.integration.test_attention_memory import long_model, long_text
    import tokenfield as tf
    tokens, layers, attention = {tokens}, {layers}, {attention}
    model = long_model(layers)
    tf.trace(model, ["the water"], positions="last", attention=attention)  # warm up
    tf.trace(model, [long_text(tokens)], positions="last", attention=attention)
    print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)  # KiB on Linux
    """
)


def peak_kib(tokens: int, layers: int, attention: bool) -> int:
    code = SCRIPT.format(root=str(ROOT), tokens=tokens, layers=layers, attention=attention)
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return int(done.stdout.strip().splitlines()[-1])


def test_peak_memory_is_far_below_keeping_every_matrix():
    tokens, layers = 768, 16
    without = peak_kib(tokens, layers, attention=False)
    with_attention = peak_kib(tokens, layers, attention=True)
    extra = (with_attention - without) * 1024
    every_matrix = layers * HEADS * tokens * tokens * 4  # 151 MB in float32
    # eager attention materialises one layer's (heads, T, T) scores a few times over;
    # keeping every layer's would add 16x that.
    assert extra < every_matrix / 2, (extra, every_matrix)

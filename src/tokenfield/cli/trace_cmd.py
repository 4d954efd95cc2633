"""``tokenfield trace``: run prompts through a model and store every layer."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tokenfield.cli._app import app, command
from tokenfield.cli._options import (
    BatchSize,
    Device,
    Positions,
    RunOut,
    model_option,
    overwrite_option,
    seed_option,
)


@command(
    app,
    "trace",
    epilog=(
        "Example: tokenfield trace --model smollm2 --prompts seed-spectrum --out runs/spectrum\n\n"
        "Read it back with xarray.open_zarr('runs/spectrum/trajectory.zarr'). "
        "An interrupted trace resumes when the same command is run again."
    ),
)
def trace_command(
    out: RunOut,
    model: Annotated[
        str,
        model_option(
            help="Bundled name (smollm2, gemma3-270m, minilm), local model dir, .gguf file, or hub id."
        ),
    ] = "smollm2",
    prompts: Annotated[
        str,
        typer.Option(
            "--prompts",
            "-p",
            help="Bundled set (seed-categories, seed-spectrum, replication-categories, "
            "replication-spectrum) or a file: .txt (one a line), "
            ".jsonl/.csv with 'text' and optional 'category', .yaml.",
        ),
    ] = "seed-categories",
    positions: Positions = "last",
    batch_size: BatchSize = 8,
    chat: Annotated[
        bool, typer.Option("--chat", help="Wrap prompts in the chat template.")
    ] = False,
    truncate: Annotated[
        bool, typer.Option("--truncate", help="Keep the last tokens of over-long prompts.")
    ] = False,
    device: Device = "cpu",
    dtype: Annotated[
        str,
        typer.Option(
            help="Precision the model computes in: float32, bfloat16 or float16 (states "
            "are stored as float32 all the same unless --store-dtype says otherwise)."
        ),
    ] = "float32",
    store_dtype: Annotated[
        str,
        typer.Option(
            "--store-dtype", help="Precision the states are stored in: float32 or float16."
        ),
    ] = "float32",
    workers: Annotated[
        int | None,
        typer.Option(
            "--workers",
            help="Data parallel: start a local Dask cluster of N worker processes (torch "
            "threads = cores / N each); each loads the model once and writes its shards "
            "of the prompts into its own region of the one run store. The run equals a "
            "single-process trace. See docs/scaling.md.",
        ),
    ] = None,
    scheduler: Annotated[
        str | None,
        typer.Option(
            "--scheduler",
            help="Data parallel on a running Dask cluster (e.g. tcp://host:8786, started "
            "with 'dask scheduler' and 'dask worker' or 'dask cuda worker'); the workers "
            "must see --out and the model.",
        ),
    ] = None,
    device_map: Annotated[
        str | None,
        typer.Option(
            "--device-map",
            help="Model parallel: auto, balanced or sequential; accelerate spreads the "
            "blocks over the GPUs, the CPU and (with --offload-folder) the disk.",
        ),
    ] = None,
    max_memory: Annotated[
        str | None,
        typer.Option(
            "--max-memory",
            help="With --device-map: memory per device, e.g. cuda:0=20GiB,cuda:1=20GiB,cpu=60GiB.",
        ),
    ] = None,
    offload_folder: Annotated[
        Path | None,
        typer.Option(
            "--offload-folder",
            help="With --device-map: a folder for the weights that fit in no device's memory.",
        ),
    ] = None,
    random_weights: Annotated[
        bool,
        typer.Option("--random-weights", help="Trace a random-weight copy (the baseline)."),
    ] = False,
    seed: Annotated[int, seed_option(help="Seed for --random-weights.")] = 0,
    attention: Annotated[
        bool,
        typer.Option(
            "--attention",
            help="Also reduce every block's attention to Markov-chain statistics (entropy, "
            "sink mass, |lambda_2|, stationary distribution), from the queries and keys with the "
            "model's SDPA left running (eager attention for a model that cannot).",
        ),
    ] = False,
    attention_readout: Annotated[
        str,
        typer.Option(
            "--attention-readout",
            help="With --attention: 'auto' (queries and keys with SDPA where the model "
            "supports it, else eager attention), 'sdpa' (that path, or an error) or 'eager' "
            "(the model switched to eager attention for the trace; resumes a run started "
            "that way).",
        ),
    ] = "auto",
    logit_lens: Annotated[
        bool,
        typer.Option(
            "--logit-lens",
            help="Also read each last-token state through the final norm and the "
            "unembedding at every layer (top tokens, rank of the final prediction).",
        ),
    ] = False,
    generate: Annotated[
        int,
        typer.Option(
            "--generate",
            help="Greedily generate N tokens after each prompt and keep each generated "
            "token's states at every layer as particles too (is_generated true; fewer "
            "than N only at an end-of-sequence token). The report draws them as the "
            "continuation of the prompt's path.",
        ),
    ] = 0,
    steer: Annotated[
        Path | None,
        typer.Option(
            "--steer",
            help="Trace (and generate) with this steering vector (vector.safetensors of "
            "'tokenfield steer vector') added at its layer; overlay the run on the unsteered one "
            "with 'tokenfield report RUN --overlay STEERED'.",
        ),
    ] = None,
    alpha: Annotated[
        float, typer.Option("--alpha", help="Multiple of the --steer vector to add.")
    ] = 1.0,
    steer_positions: Annotated[
        str,
        typer.Option(
            "--steer-positions",
            help="'last' (the last token of the sequence) or 'all'; with --generate, 'all'.",
        ),
    ] = "last",
    overwrite: Annotated[
        bool, overwrite_option(help="Replace a run made with another config.")
    ] = False,
) -> None:
    """Trace prompts through a model: the residual stream after every layer.

    Stores time 0 = embedding output and time i = raw output of block i for the
    chosen positions, the final-norm output apart, and the top-5 next tokens.
    With --attention and --logit-lens, also the attention statistics and the
    logit lens (read them with 'tokenfield lens RUN'). To grow: --workers N or
    --scheduler ADDRESS share the prompts among Dask workers, --device-map spreads
    one model over devices, --dtype bfloat16 computes in half precision
    (docs/scaling.md).
    """
    from tokenfield._progress import console
    from tokenfield.models.load import ModelSpec
    from tokenfield.models.placement import Placement
    from tokenfield.models.trace_config import TraceConfig
    from tokenfield.pipelines.trace import run

    config = TraceConfig(
        prompts,
        positions=positions,  # type: ignore[arg-type]
        batch_size=batch_size,
        chat=chat,
        truncate=truncate,
        attention=attention,
        attention_readout=attention_readout,
        logit_lens=logit_lens,
        generate=generate,
        steer=None if steer is None else (steer, alpha, steer_positions),
        store_dtype=store_dtype,
        workers=workers,
        scheduler=scheduler,
    )  # every option checked before the vector file is read
    if steer is not None:
        from tokenfield.steering.vectors import SteeringVector

        config = config.replace(steer=(SteeringVector.load(steer), alpha, steer_positions))
    placed = device_map is not None or max_memory is not None or offload_folder is not None
    spec = ModelSpec(
        model,
        dtype=dtype,
        device=device,
        random_weights=random_weights,
        seed=seed,
        placement=Placement.parse(device_map, max_memory, offload_folder) if placed else None,
    )
    ds = run(spec, config, out=out, overwrite=overwrite, progress=True)
    console().print(
        f"[green]traced[/green] {ds.sizes['particle']} particles x {ds.sizes['time']} times "
        f"x {ds.sizes['feature']} features -> {out}"
    )

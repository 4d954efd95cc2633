"""``tokenfield trace``: run prompts through a model and store every layer."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tokenfield.cli._app import app
from tokenfield.cli._options import Device, out_option, overwrite_option, seed_option


@app.command(
    "trace",
    epilog=(
        "Example: tokenfield trace --model smollm2 --prompts seed-spectrum --out runs/spectrum\n\n"
        "Read it back with xarray.open_zarr('runs/spectrum/trajectory.zarr'). "
        "An interrupted trace resumes when the same command is run again."
    ),
)
def trace_command(
    out: Annotated[Path, out_option(help="Run directory to write.")],
    model: Annotated[
        str,
        typer.Option(
            "--model",
            "-m",
            help="Bundled name (smollm2, gemma3-270m, minilm), local model dir, .gguf file, or hub id.",
        ),
    ] = "smollm2",
    prompts: Annotated[
        str,
        typer.Option(
            "--prompts",
            "-p",
            help="Bundled set (seed-categories, seed-spectrum) or a file: .txt (one a line), "
            ".jsonl/.csv with 'text' and optional 'category', .yaml.",
        ),
    ] = "seed-categories",
    positions: Annotated[
        str, typer.Option(help="'last': last token of each prompt; 'all': every token.")
    ] = "last",
    batch_size: Annotated[int, typer.Option("--batch-size", help="Prompts per forward pass.")] = 8,
    chat: Annotated[
        bool, typer.Option("--chat", help="Wrap prompts in the chat template.")
    ] = False,
    truncate: Annotated[
        bool, typer.Option("--truncate", help="Keep the last tokens of over-long prompts.")
    ] = False,
    device: Device = "cpu",
    dtype: Annotated[str, typer.Option(help="float32, bfloat16 or float16.")] = "float32",
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
            "sink mass, |lambda_2|, stationary distribution); runs with eager attention.",
        ),
    ] = False,
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
            "'tokenfield steer') added at its layer; overlay the run on the unsteered one "
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
    logit lens (read them with 'tokenfield lens RUN').
    """
    from tokenfield._progress import console as make_console
    from tokenfield.models.load import ModelSpec
    from tokenfield.models.trace import check_trace_options, trace
    from tokenfield.prompts import load_prompts
    from tokenfield.runs import check_writable_dir

    console = make_console(stderr=True)  # progress; the result goes to stdout
    prompt_list = load_prompts(prompts)  # bad prompt input fails before any loading
    # the library's own checks, before anything is loaded or written
    check_trace_options(
        positions=positions,
        batch_size=batch_size,
        generate=generate,
        steer_positions=None if steer is None else steer_positions,
    )
    steering = None
    if steer is not None:
        from tokenfield.steering.vectors import SteeringVector

        steering = (SteeringVector.load(steer), alpha, steer_positions)
    spec = ModelSpec(
        model,
        dtype=dtype,
        device=device,
        random_weights=random_weights,
        seed=seed,
        attn_implementation="eager" if attention else None,
    )  # a bad --device or --dtype fails here, before the run directory is touched
    check_writable_dir(out)
    from tokenfield._lock import hold_for_command

    hold_for_command(out, what="run")  # a second writer fails here, before loading
    with console.status(f"loading {model}"):
        loaded = spec.load()
    ds = trace(
        loaded,
        prompt_list,
        positions=positions,  # type: ignore[arg-type]
        batch_size=batch_size,
        chat=chat,
        truncate=truncate,
        attention=attention,
        logit_lens=logit_lens,
        generate=generate,
        steer=steering,
        out=out,
        overwrite=overwrite,
        progress=True,
    )
    make_console().print(
        f"[green]traced[/green] {ds.sizes['particle']} particles x {ds.sizes['time']} times "
        f"x {ds.sizes['feature']} features -> {out}"
    )

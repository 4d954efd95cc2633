"""``tokenfield steer vector`` and ``tokenfield steer eval`` (older spellings, still
working: ``tokenfield steer RUN ...`` without a subcommand, and ``tokenfield
eval-steering``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tokenfield._progress import plural
from tokenfield.cli._app import command, steer_app
from tokenfield.cli._options import (
    ALPHAS_HELP,
    Alphas,
    BatchSize,
    ControlSeed,
    Device,
    Json,
    MaxNewTokens,
    Positions,
    echo_json,
    model_option,
    numbers,
    one_run,
    out_option,
    overwrite_option,
    seed_option,
)


@command(
    steer_app,
    "vector",
    epilog=(
        "Example: tokenfield steer vector runs/demo/seed-spectrum --from 'Word Problems' "
        "--to 'Pure Math' --layer 15 --alphas 0.5,1,2 --out runs/steer\n\n"
        "'tokenfield steer RUN ...' (no subcommand) is this command."
    ),
)
def steer_command(
    source: Annotated[str, typer.Option("--from", help="Category to steer.")],
    target: Annotated[str, typer.Option("--to", help="Category whose region to steer toward.")],
    layer: Annotated[
        int,
        typer.Option(
            "--layer", help="Where to add the vector: 0 = embedding, i = output of block i-1."
        ),
    ],
    out: Annotated[Path, out_option(help="Directory for the vector, results and figures.")],
    run: Annotated[
        Path | None,
        typer.Argument(
            metavar="RUN", help="A traced run with categories (the reference).", show_default=False
        ),
    ] = None,
    run_option: Annotated[
        Path | None, typer.Option("--run", hidden=True, help="The run (old spelling of RUN).")
    ] = None,
    alpha: Annotated[str, typer.Option("--alphas", "--alpha", help=ALPHAS_HELP)] = "0.5,1,2",
    method: Annotated[
        str, typer.Option(help="'mean' (difference of means) or 'pca' (of differences).")
    ] = "mean",
    positions: Positions = "last",
    vector: Annotated[
        Path | None,
        typer.Option(
            "--vector", help="Use a saved vector (.safetensors) instead of computing one."
        ),
    ] = None,
    model: Annotated[str | None, model_option(help="Model (default: the run's).")] = None,
    max_new_tokens: MaxNewTokens = 12,
    control_seed: ControlSeed = 0,
    device: Device = "cpu",
    overwrite: Annotated[bool, overwrite_option(help="Replace an earlier steer output.")] = False,
    as_json: Json = False,
) -> None:
    """Steer one category's prompts toward another's region and measure the change.

    Writes vector.safetensors (with provenance), control.safetensors,
    steering.json (progress toward the target, KL of the next-token distribution,
    top-5 tokens, continuations, paths in the run's frozen PCA frame) and
    figures/steered_paths.png.
    """
    from rich.table import Table

    from tokenfield._progress import console as make_console
    from tokenfield.pipelines.steer import steer_run

    run = one_run(run, run_option)
    alphas = numbers(alpha, "--alphas", ranges=False, example="0.5,1,2")
    console = make_console(stderr=True)  # progress; the table goes to stdout
    result = steer_run(
        run, source=source, target=target, layer=layer, out=out, alphas=alphas, method=method,
        positions=positions, vector=vector, model=model, max_new_tokens=max_new_tokens,
        control_seed=control_seed, device=device, overwrite=overwrite, progress=True,
    )  # fmt: skip
    if as_json:
        echo_json({"rows": result["rows"], "out": str(out)})
        console.print(f"wrote {out / 'steering.json'} and {out / 'figures'}")
        return
    table = Table(title=f"{source} -> {target} at layer {layer}")
    for col in (
        "condition",
        "alpha",
        "progress@layer",
        "progress@final",
        "KL (nats)",
        "top-1 changed",
    ):
        table.add_column(col)
    for r in result["rows"]:
        table.add_row(r["condition"], f"{r['alpha']:g}", f"{r['progress_at_layer']:.2f}",
                      f"{r['progress_final']:.2f}", f"{r['kl_mean']:.3f}", f"{r['top1_changed']:.0%}")  # fmt: skip
    make_console().print(table)
    make_console(stderr=True).print(PROGRESS_NOTE)
    make_console().print(f"wrote {out / 'steering.json'} and {out / 'figures'}")


@command(
    steer_app,
    "eval",
    old=("eval-steering",),
    epilog=(
        "Example: tokenfield steer eval --model smollm2 --out runs/eval-smollm2  "
        "(defaults: 300 test, 100 validation, 64 fit problems, 3 layers x 3 alphas, "
        "32 random directions, 32 label shuffles, 32 centroid halves)"
    ),
)
def eval_steering_command(
    out: Annotated[Path, out_option(help="Directory for eval.json and figures.")],
    model: Annotated[str, model_option(help="A causal model.")] = "smollm2",
    n: Annotated[
        int, typer.Option("--test", "--n", help="Test problems (the only ones reported).")
    ] = 300,
    validation: Annotated[
        int, typer.Option("--validation", help="Problems that select the layer and alpha.")
    ] = 100,
    fit: Annotated[
        int, typer.Option("--fit", help="Problems used only to build the vectors.")
    ] = 64,
    shots: Annotated[
        int, typer.Option("--shots", help="Solved examples before each question.")
    ] = 4,
    seed: Annotated[int, seed_option(help="Seed of the problem set.")] = 0,
    max_operand: Annotated[
        int, typer.Option("--max-operand", help="Largest operand (difficulty).")
    ] = 20,
    templates: Annotated[
        str, typer.Option(help="Any of add,sub,mul,mul_add.")
    ] = "add,sub,mul,mul_add",
    layers: Annotated[
        str | None, typer.Option(help="Comma-separated layers (default: 1/4, 1/2, 3/4 depth).")
    ] = None,
    alphas: Alphas = "0.5,1,2",
    controls: Annotated[
        int,
        typer.Option("--controls", help="Random directions of the vector's norm (one seed each)."),
    ] = 32,
    control_seed: ControlSeed = 0,
    shuffle_seed: Annotated[
        int,
        typer.Option("--shuffle-seed", help="Seed of the first label shuffle (then +1, +2, ...)."),
    ] = 0,
    shuffles: Annotated[
        int,
        typer.Option(
            "--shuffles",
            help="Label-shuffle controls: the pooled fit states split at random into halves.",
        ),
    ] = 32,
    halves: Annotated[
        int,
        typer.Option(
            "--halves",
            help="Centroid-half controls: the fit problems split at random into halves "
            "(both forms of a problem in one half).",
        ),
    ] = 32,
    halves_seed: Annotated[
        int,
        typer.Option("--halves-seed", help="Seed of the first centroid half (then +1, +2, ...)."),
    ] = 0,
    positions: Positions = "last",
    max_new_tokens: MaxNewTokens = 5,
    batch_size: BatchSize = 256,
    dtype: Annotated[
        str,
        typer.Option(
            "--dtype",
            help="Weights and activations: float32 (default) or bfloat16 (answers can "
            "differ slightly; its speed has not been measured, see docs/steering.md).",
        ),
    ] = "float32",
    device: Device = "cpu",
    overwrite: Annotated[bool, overwrite_option()] = False,
    as_json: Json = False,
) -> None:
    """Does steering word problems toward the math region make the model solve them better?

    Splits generated problems into shot/fit/validation/test (no math form shared),
    builds word->math vectors on the fit split, picks the (layer, alpha) with the best
    validation accuracy, and on the test split compares that one condition with the
    unsteered word form (exact McNemar test), trivial baselines (best constant, copy an
    operand, the last example's answer), the math form, and three control families of
    the vector's norm: --controls random directions, --shuffles label shuffles and
    --halves centroid halves of the fit prompts. Writes eval.json (with the verdict
    and its reasons) and figures; see docs/steering.md for the rule.
    """
    from rich.console import Console

    from tokenfield.pipelines.steer_eval import SteeringEvaluation, evaluate_run

    evaluation = SteeringEvaluation(
        model=model, n=n, validation=validation, fit=fit, shots=shots, seed=seed,
        max_operand=max_operand, templates=[t.strip() for t in templates.split(",") if t.strip()],
        layers=numbers(layers, "--layers", integer=True, ranges=False, example="8,15") if layers
        else None,
        alphas=numbers(alphas, "--alphas", ranges=False, example="0.5,1,2"),
        controls=controls, control_seed=control_seed, shuffle_seed=shuffle_seed,
        shuffles=shuffles, halves=halves, halves_seed=halves_seed, positions=positions,
        max_new_tokens=max_new_tokens, batch_size=batch_size, dtype=dtype, device=device,
    )  # fmt: skip
    result = evaluate_run(evaluation, out, overwrite=overwrite, progress=True)
    if as_json:
        echo_json(result)  # what eval.json holds
    else:
        Console(soft_wrap=True).print(summary_text(result), markup=False, highlight=False)
    # results on stdout; with --json stdout holds only the JSON
    Console(stderr=as_json).print(f"wrote {out / 'eval.json'} and {out / 'figures'}")


PROGRESS_NOTE = (
    "note: progress = 1 - d(steered, target centroid) / d(unsteered, target centroid), "
    "mean over the source prompts (0: not moved, 1: on the centroid). At alpha = 1 the "
    "source prompts' mean lands on the target centroid, but each prompt keeps its own "
    "distance from that mean, so progress@layer stays below 1 (see docs/steering.md)."
)


def summary_text(result: dict) -> str:
    """The evaluation in words: the selected condition, the test table, the verdict."""
    from tokenfield.steering.evaluate import FAMILIES, control_families

    sel, steered = result["selected"], result["steered"]
    name = result["config"]["model"].get("name", "model")
    lines = [
        f"{name}: selected on validation: layer {sel['layer']}, alpha {sel['alpha']:g} "
        f"(validation accuracy {sel['validation_accuracy']:.3f})",
        f"test (n = {steered['n']}):",
        f"  steered            {steered['accuracy']:.3f}  "
        f"95% CI [{steered['ci95'][0]:.3f}, {steered['ci95'][1]:.3f}]",
    ]
    for key, value in result["baselines"].items():
        lines.append(f"  {key:<18} {value:.3f}")
    for key, fam in control_families(result).items():
        lines.append(
            f"  {fam['k']} {FAMILIES[key]}: median {fam['median']:.3f}, 95th percentile "
            f"{fam['p95']:.3f}, max {fam['max']:.3f}; steered ranks {fam['rank']} of "
            f"{fam['of']} ({fam['n_at_or_above']} at or above it, p = {fam['p_empirical']:.3g})"
        )
    lines.append(
        f"  McNemar (steered vs unsteered word form): "
        f"{plural(result['mcnemar']['b'], 'item')} fixed, "
        f"{result['mcnemar']['c']} broken, exact p = {result['mcnemar_p']:.3g}"
    )
    if result["verdict"] == "supports":
        lines.append("verdict: the evaluation SUPPORTS the claim that steering helps.")
    else:
        lines.append("verdict: the claim that steering helps is NOT SUPPORTED, because:")
        lines += [f"  - {reason}" for reason in result["verdict_reasons"]]
    return "\n".join(lines)

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
    Device,
    Json,
    echo_json,
    model_option,
    numbers,
    one_run,
    out_option,
    overwrite_option,
    seed_option,
)
from tokenfield.errors import UserError

# What steer / eval-steering write: --overwrite deletes these (and the command's own
# figures, viz.steering.FIGURES) and nothing else; the marker file last.
OUTPUTS = {
    "steering.json": ("vector.safetensors", "control.safetensors", "steering.json"),
    "eval.json": ("eval.json",),
}


def _prepare_out(out: Path, overwrite: bool, marker: str) -> Path:
    """A fresh output directory, locked for this process (one writer); an existing
    non-empty one only with --overwrite, and only if this command wrote it, and
    then only this command's own files are deleted."""
    from tokenfield._lock import LOCK_NAME, hold_for_command
    from tokenfield.runs import check_writable_dir

    check_writable_dir(out)
    if out.exists() and (not out.is_dir()):
        raise UserError(f"output path '{out}' is a file", "choose a directory for --out")
    hold_for_command(out)
    present = [p for p in out.iterdir() if p.name != LOCK_NAME]
    if present:
        if not overwrite:
            raise UserError(
                f"output directory '{out}' is not empty", "choose another --out or pass --overwrite"
            )
        if not (out / marker).exists():
            raise UserError(
                f"'{out}' was not written by this command; refusing to overwrite it",
                "choose another --out",
            )
        from tokenfield.runs import figures_dir
        from tokenfield.viz.steering import FIGURES

        figures = figures_dir(out, create=False)  # a symlinked figures/: refused, untouched
        command = "steer" if marker == "steering.json" else "eval-steering"
        mine = [figures / f"{stem}.{fmt}" for stem in FIGURES[command] for fmt in ("png", "svg")]
        files = [out / name for name in OUTPUTS[marker]]
        for target in (*mine, *files):  # the marker last: a crash leaves it a run to redo
            if target.is_symlink() or target.is_file():
                target.unlink()
    return out


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
    alpha: Annotated[
        str, typer.Option("--alphas", "--alpha", help="Comma-separated multiples of the vector.")
    ] = "0.5,1,2",
    method: Annotated[
        str, typer.Option(help="'mean' (difference of means) or 'pca' (of differences).")
    ] = "mean",
    positions: Annotated[
        str, typer.Option(help="'last' (last token, and each generated one) or 'all'.")
    ] = "last",
    vector: Annotated[
        Path | None,
        typer.Option(
            "--vector", help="Use a saved vector (.safetensors) instead of computing one."
        ),
    ] = None,
    model: Annotated[str | None, model_option(help="Model (default: the run's).")] = None,
    max_new_tokens: Annotated[
        int, typer.Option("--max-new-tokens", help="Length of the continuation.")
    ] = 12,
    control_seed: Annotated[
        int, typer.Option("--control-seed", help="Seed of the random control direction.")
    ] = 0,
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
    from tokenfield.models.load import ModelSpec
    from tokenfield.pipelines.steer import closed_loop
    from tokenfield.runs import open_run, write_json_atomic
    from tokenfield.steering.vectors import SteeringVector, steering_vector

    run = one_run(run, run_option)
    alphas = numbers(alpha, "--alphas", ranges=False, example="0.5,1,2")
    if positions not in ("last", "all"):
        raise UserError(f"unknown --positions '{positions}'", "use 'last' or 'all'")
    ds = open_run(run).load()
    if vector is not None:
        steer_vec = SteeringVector.load(vector)
        if steer_vec.layer != layer:
            raise UserError(
                f"the vector belongs to layer {steer_vec.layer}, not {layer}",
                f"pass --layer {steer_vec.layer}",
            )
        if steer_vec.provenance.get("from") != source or steer_vec.provenance.get("to") != target:
            raise UserError(
                "the vector was made for other categories", "match --from/--to to the vector's"
            )
    else:
        steer_vec = steering_vector(
            ds, source=source, target=target, layer=layer, method=method, run=str(run)
        )
    spec = ModelSpec.from_run(ds, name=model, device=device)  # the run's model, dtype, weights
    console = make_console(stderr=True)  # progress; the table goes to stdout
    with console.status("loading model"):
        loaded = spec.load()
    steer_vec.check_model(loaded)
    from tokenfield.steering.generate import _require_causal

    _require_causal(loaded)
    frame = None
    if (run / "projection.npz").is_file():
        from tokenfield.analysis.projection import load_projection

        frame = load_projection(run)
    out = _prepare_out(out, overwrite, "steering.json")
    result = closed_loop(loaded, ds, steer_vec, alphas, positions=positions, control_seed=control_seed,
                         max_new_tokens=max_new_tokens, frame=frame, progress=True)  # fmt: skip
    steer_vec.save(out / "vector.safetensors")
    from tokenfield.steering.vectors import random_control

    random_control(steer_vec, control_seed).save(out / "control.safetensors")
    write_json_atomic(out / "steering.json", {"vector": steer_vec.provenance, **result})
    from tokenfield.viz.steering import plot_steered_paths, save

    (out / "figures").mkdir(exist_ok=True)
    save(plot_steered_paths(result, times=_time_convention(run)), out / "figures" / "steered_paths")
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
    alphas: Annotated[
        str, typer.Option(help="Comma-separated multiples of the vector.")
    ] = "0.5,1,2",
    controls: Annotated[
        int,
        typer.Option("--controls", help="Random directions of the vector's norm (one seed each)."),
    ] = 32,
    control_seed: Annotated[
        int, typer.Option("--control-seed", help="Seed of the first control (then +1, +2, ...).")
    ] = 0,
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
    positions: Annotated[str, typer.Option(help="'last' or 'all'.")] = "last",
    max_new_tokens: Annotated[
        int, typer.Option("--max-new-tokens", help="Longest continuation (tokens).")
    ] = 5,
    batch_size: Annotated[
        int, typer.Option("--batch-size", help="Rows (prompt x condition) per forward pass.")
    ] = 256,
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

    from tokenfield.models.load import ModelSpec
    from tokenfield.runs import write_json_atomic
    from tokenfield.steering.evaluate import evaluate_steering

    alpha_list = numbers(alphas, "--alphas", ranges=False, example="0.5,1,2")
    layer_list = (
        numbers(layers, "--layers", integer=True, ranges=False, example="8,15") if layers else None
    )
    template_list = [t.strip() for t in templates.split(",") if t.strip()]
    from tokenfield.steering.problems import make_splits

    # validates templates, sizes and the number of distinct forms before any loading
    make_splits({"shot": shots, "fit": fit, "validation": validation, "test": n}, seed,
                max_operand=max_operand, templates=template_list)  # fmt: skip
    if positions not in ("last", "all"):
        raise UserError(f"unknown --positions '{positions}'", "use 'last' or 'all'")
    for flag, value, least in (("--controls", controls, 1), ("--shuffles", shuffles, 1),
                               ("--halves", halves, 1), ("--batch-size", batch_size, 1),
                               ("--max-new-tokens", max_new_tokens, 1), ("--test", n, 1),
                               ("--validation", validation, 1), ("--fit", fit, 2)):  # fmt: skip
        if value < least:
            raise UserError(f"{flag} must be at least {least}, got {value}", f"raise {flag}")
    if dtype not in ("float32", "bfloat16"):
        raise UserError(f"unknown --dtype '{dtype}'", "use float32 or bfloat16")
    from tokenfield.steering.evaluate import _n_splits

    # every draw of a family is a different split: no more draws than splits
    for flag, value, states in (("--shuffles", shuffles, 2 * fit), ("--halves", halves, fit)):
        if value > _n_splits(states):
            raise UserError(
                f"{flag} {value} asks for more distinct splits than --fit {fit} gives "
                f"({_n_splits(states)})",
                f"lower {flag} or raise --fit",
            )
    spec = ModelSpec(model, dtype=dtype, device=device)
    console = Console(stderr=True)
    with console.status(f"loading {model}"):
        loaded = spec.load()
    from tokenfield.steering.generate import _require_causal

    _require_causal(loaded)  # an encoder fails here, before --out is created
    if layer_list:
        from tokenfield.steering.vectors import check_layer

        for layer in layer_list:
            check_layer(layer, loaded.n_layers)
    out = _prepare_out(out, overwrite, "eval.json")
    result = evaluate_steering(
        loaded, n=n, validation=validation, fit=fit, shots=shots, seed=seed,
        max_operand=max_operand, templates=template_list, layers=layer_list, alphas=alpha_list,
        controls=controls, control_seed=control_seed, shuffle_seed=shuffle_seed,
        shuffles=shuffles, halves=halves, halves_seed=halves_seed,
        positions=positions, max_new_tokens=max_new_tokens, batch_size=batch_size, progress=True,
    )  # fmt: skip
    write_json_atomic(out / "eval.json", result)
    from tokenfield.viz.steering import plot_accuracy, plot_test_summary, save

    (out / "figures").mkdir(exist_ok=True)
    save(plot_accuracy(result), out / "figures" / "accuracy_vs_alpha")
    save(plot_test_summary(result), out / "figures" / "test_summary")
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


def _time_convention(run: Path) -> str:
    """The times the run's own figures use (its metrics.json; ``seed`` before
    it is analysed, analyze's default)."""
    import json

    try:
        options = json.loads((run / "metrics.json").read_text(encoding="utf-8")).get("options")
        times = options.get("times", "seed") if isinstance(options, dict) else "seed"
    except (OSError, ValueError, AttributeError):
        return "seed"
    return times if times in ("seed", "all") else "seed"


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

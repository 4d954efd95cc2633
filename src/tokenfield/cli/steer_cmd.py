"""``tokenfield steer`` and ``tokenfield eval-steering``."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Annotated

import typer

from tokenfield.cli._app import app
from tokenfield.errors import UserError


def _floats(text: str, flag: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UserError(
            f"{flag} must be numbers separated by commas, got '{text}'", f"e.g. {flag} 0.5,1,2"
        ) from None
    if not values:
        raise UserError(f"{flag} is empty", f"e.g. {flag} 0.5,1,2")
    return values


def _ints(text: str, flag: str) -> list[int]:
    try:
        return [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UserError(
            f"{flag} must be integers separated by commas, got '{text}'", f"e.g. {flag} 8,15"
        ) from None


# What steer / eval-steering write: --overwrite deletes these and nothing else.
OUTPUTS = {
    "steering.json": ("vector.safetensors", "control.safetensors", "steering.json", "figures"),
    "eval.json": ("eval.json", "figures"),
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
        for name in OUTPUTS[marker]:
            target = out / name
            if target.is_dir():
                shutil.rmtree(target)
            elif target.exists():
                target.unlink()
    return out


def _load_run_model(run_ds, spec: str | None):
    from tokenfield.models.load import load_model

    model_cfg = run_ds.attrs["run"]["config"].get("model", {})
    name = spec or model_cfg.get("name")
    if not name:
        raise UserError("the run does not say which model made it", "pass --model")
    return load_model(
        name,
        random_weights=bool(model_cfg.get("random_weights")) and spec is None,
        seed=int(model_cfg.get("seed") or 0),
    )


@app.command(
    "steer",
    epilog=(
        "Example: tokenfield steer --run runs/demo/seed-spectrum --from 'Word Problems' "
        "--to 'Pure Math' --layer 15 --alpha 0.5,1,2 --out runs/steer"
    ),
)
def steer_command(
    run: Annotated[
        Path, typer.Option("--run", help="A traced run with categories (the reference).")
    ],
    source: Annotated[str, typer.Option("--from", help="Category to steer.")],
    target: Annotated[str, typer.Option("--to", help="Category whose region to steer toward.")],
    layer: Annotated[
        int,
        typer.Option(
            "--layer", help="Where to add the vector: 0 = embedding, i = output of block i-1."
        ),
    ],
    out: Annotated[
        Path, typer.Option("--out", "-o", help="Directory for the vector, results and figures.")
    ],
    alpha: Annotated[
        str, typer.Option("--alpha", help="Comma-separated multiples of the vector.")
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
    model: Annotated[
        str | None, typer.Option("--model", "-m", help="Model (default: the run's).")
    ] = None,
    max_new_tokens: Annotated[
        int, typer.Option("--max-new-tokens", help="Length of the continuation.")
    ] = 12,
    control_seed: Annotated[
        int, typer.Option("--control-seed", help="Seed of the random control direction.")
    ] = 0,
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="Replace an earlier steer output.")
    ] = False,
) -> None:
    """Steer one category's prompts toward another's region and measure the change.

    Writes vector.safetensors (with provenance), control.safetensors,
    steering.json (progress toward the target, KL of the next-token distribution,
    top-5 tokens, continuations, paths in the run's frozen PCA frame) and
    figures/steered_paths.png.
    """
    from rich.table import Table

    from tokenfield._progress import console as make_console
    from tokenfield.runs import open_run, write_json_atomic
    from tokenfield.steering.closed_loop import closed_loop
    from tokenfield.steering.vectors import SteeringVector, steering_vector

    alphas = _floats(alpha, "--alpha")
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
    console = make_console(stderr=True)  # progress; the table goes to stdout
    with console.status("loading model"):
        loaded = _load_run_model(ds, model)
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
    save(plot_steered_paths(result), out / "figures" / "steered_paths")
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
    make_console().print(f"wrote {out / 'steering.json'} and {out / 'figures'}")


@app.command(
    "eval-steering",
    epilog="Example: tokenfield eval-steering --model smollm2 --n 100 --layers 8,15,22 --alphas 0.5,1,2 --out runs/eval",
)
def eval_steering_command(
    out: Annotated[Path, typer.Option("--out", "-o", help="Directory for eval.json and figures.")],
    model: Annotated[str, typer.Option("--model", "-m", help="A causal model.")] = "smollm2",
    n: Annotated[int, typer.Option("--n", help="Test problems.")] = 100,
    fit: Annotated[
        int, typer.Option("--fit", help="Problems used only to build the vectors.")
    ] = 32,
    shots: Annotated[
        int, typer.Option("--shots", help="Solved examples before each question.")
    ] = 3,
    seed: Annotated[int, typer.Option(help="Seed of the problem set.")] = 0,
    max_operand: Annotated[
        int, typer.Option("--max-operand", help="Largest operand (difficulty).")
    ] = 9,
    templates: Annotated[str, typer.Option(help="Any of add,sub,mul,mul_add.")] = "add,sub",
    layers: Annotated[
        str | None, typer.Option(help="Comma-separated layers (default: 1/4, 1/2, 3/4 depth).")
    ] = None,
    alphas: Annotated[
        str, typer.Option(help="Comma-separated multiples of the vector.")
    ] = "0.5,1,2",
    positions: Annotated[str, typer.Option(help="'last' or 'all'.")] = "last",
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens")] = 5,
    overwrite: Annotated[bool, typer.Option("--overwrite")] = False,
) -> None:
    """Does steering word problems toward the math region make the model solve them better?

    Greedy accuracy (95 % Wilson interval) on generated arithmetic word problems,
    their pure-math forms, and the word forms steered toward the math region over
    a layer x alpha grid, with a random direction of the same norm as control.
    """
    from rich.console import Console
    from rich.table import Table

    from tokenfield.models.load import load_model
    from tokenfield.runs import write_json_atomic
    from tokenfield.steering.evaluate import evaluate_steering

    alpha_list = _floats(alphas, "--alphas")
    layer_list = _ints(layers, "--layers") if layers else None
    template_list = [t.strip() for t in templates.split(",") if t.strip()]
    from tokenfield.steering.problems import make_problems

    make_problems(1, templates=template_list)  # validates the names before any loading
    if positions not in ("last", "all"):
        raise UserError(f"unknown --positions '{positions}'", "use 'last' or 'all'")
    console = Console(stderr=True)
    with console.status(f"loading {model}"):
        loaded = load_model(model)
    from tokenfield.steering.generate import _require_causal

    _require_causal(loaded)  # an encoder fails here, before --out is created
    if layer_list:
        from tokenfield.steering.vectors import check_layer

        for layer in layer_list:
            check_layer(layer, loaded.n_layers)
    out = _prepare_out(out, overwrite, "eval.json")
    result = evaluate_steering(
        loaded, n=n, fit=fit, shots=shots, seed=seed, max_operand=max_operand, templates=template_list,
        layers=layer_list, alphas=alpha_list, positions=positions, max_new_tokens=max_new_tokens, progress=True,
    )  # fmt: skip
    write_json_atomic(out / "eval.json", result)
    from tokenfield.viz.steering import plot_accuracy, save

    (out / "figures").mkdir(exist_ok=True)
    save(plot_accuracy(result), out / "figures" / "accuracy_vs_alpha")
    table = Table(title=f"word problems, {model}, n={n}")
    for col in ("condition", "layer", "alpha", "accuracy", "95% CI", "progress@final"):
        table.add_column(col)
    for r in result["rows"]:
        table.add_row(
            r["condition"], "" if r["layer"] is None else str(r["layer"]),
            "" if r["alpha"] is None else f"{r['alpha']:g}", f"{r['accuracy']:.2f}",
            f"[{r['ci95'][0]:.2f}, {r['ci95'][1]:.2f}]",
            f"{r['progress_final']:.2f}" if "progress_final" in r else "",
        )  # fmt: skip
    Console().print(table)
    console.print(f"wrote {out / 'eval.json'}")

"""``tokenfield demo``: the seed experiment on the bundled model, end to end."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tokenfield.cli._app import app

SEED_SETS = ("seed-categories", "seed-spectrum")


@app.command("demo")
def demo_command(
    out: Annotated[Path, typer.Option("--out", "-o", help="Where the demo runs go.")] = Path(
        "runs/demo"
    ),
    model: Annotated[str, typer.Option("--model", "-m", help="Model to trace.")] = "smollm2",
    baseline: Annotated[
        bool,
        typer.Option(
            "--baseline/--no-baseline",
            help="Also trace a random-weight copy and analyse it side by side.",
        ),
    ] = True,
) -> None:
    """The seed experiment: trace both seed prompt sets, analyse them, write the report.

    For each set (seed-categories, seed-spectrum) it traces the last token of
    every prompt through every layer of the model, does the same with a
    random-weight copy of the architecture (the baseline), measures the
    trajectories (PCA paths, depth ordering, speed, separation with its null,
    bifurcations, centroid distances), draws the figures and writes one offline
    HTML report. Runs already complete are reused, so a second demo is quick.
    """
    import time

    from tokenfield._progress import console as make_console
    from tokenfield.analysis.run_analysis import analyze_run
    from tokenfield.models.load import load_model
    from tokenfield.models.trace import trace
    from tokenfield.report import write_report

    console = make_console(stderr=True)  # progress; the report's path goes to stdout
    started = time.perf_counter()
    with console.status(f"loading {model}"):
        loaded = load_model(model)
        random_copy = load_model(model, random_weights=True, seed=0) if baseline else None
    runs = []
    for name in SEED_SETS:
        run = out / name
        trace(loaded, name, out=run, progress=True)
        base_run = None
        if random_copy is not None:
            base_run = out / f"{name}-random"
            trace(random_copy, name, out=base_run, progress=True)
        with console.status(f"analysing {name}"):
            analyze_run(run, baseline=base_run)
        console.print(f"[green]analysed[/green] {name}: {run}/metrics.json, {run}/figures/")
        runs.append(run)
    with console.status("writing the report"):
        report = write_report(
            runs, out / "report.html", title=f"tokenfield: the seed experiment on {model}"
        )
    console.print(f"done in {time.perf_counter() - started:.1f} s")
    typer.echo(f"report: {report}")

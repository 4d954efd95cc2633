"""``tokenfield demo``: the seed experiment on the bundled model, end to end."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tokenfield.cli._app import app, command
from tokenfield.cli._options import Device, model_option, out_option, overwrite_option

SEED_SETS = ("seed-categories", "seed-spectrum")


@command(app, "demo")
def demo_command(
    out: Annotated[Path, out_option(help="Where the demo runs go.")] = Path("runs/demo"),
    model: Annotated[str, model_option(help="Model to trace.")] = "smollm2",
    baseline: Annotated[
        bool,
        typer.Option(
            "--random-baseline/--no-random-baseline",
            "--baseline/--no-baseline",
            help="Also trace a random-weight copy and analyse it side by side.",
        ),
    ] = True,
    logit_lens: Annotated[
        bool,
        typer.Option(
            "--logit-lens/--no-logit-lens",
            help="Read every layer through the unembedding (the report's hover then shows "
            "the top-5 tokens at each layer); adds about 2 s per prompt set on one CPU core.",
        ),
    ] = True,
    device: Device = "cpu",
    overwrite: Annotated[
        bool,
        overwrite_option(
            help="Trace every run again (replacing the runs in --out) instead of reusing "
            "the complete ones."
        ),
    ] = False,
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
    from tokenfield.models.load import ModelSpec
    from tokenfield.pipelines.analyze import analyze_run
    from tokenfield.pipelines.report import write_report
    from tokenfield.pipelines.trace import trace

    console = make_console(stderr=True)  # progress; the report's path goes to stdout
    started = time.perf_counter()
    with console.status(f"loading {model}"):
        loaded = ModelSpec(model, device=device).load()
        random_copy = (
            ModelSpec(model, random_weights=True, seed=0, device=device).load()
            if baseline
            else None
        )
    runs = []
    for name in SEED_SETS:
        run = out / name
        lens = logit_lens and loaded.causal
        retrace = _adds_lens(run, lens, loaded.run_config())
        if retrace:
            console.print(
                f"note: {run} was traced without the logit lens: tracing it again with it"
            )
        trace(loaded, name, out=run, progress=True, logit_lens=lens, overwrite=retrace or overwrite)
        base_run = None
        if random_copy is not None:
            base_run = out / f"{name}-random"
            trace(random_copy, name, out=base_run, progress=True, overwrite=overwrite)
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


def _adds_lens(run: Path, lens: bool, model: dict) -> bool:
    """Whether ``run`` is this model's demo trace made without the logit lens (an
    earlier demo), which the demo then traces again with it; anything else is left
    to the usual refusal of a run made with another config."""
    from tokenfield.runs import canonical_config, is_run, read_run_info

    if not lens or not is_run(run):
        return False
    info = read_run_info(run)
    same_model = info.config.get("model") == canonical_config({"m": model})["m"]
    return info.kind == "trace" and same_model and "logit_lens" not in info.config

"""``tokenfield report``: one self-contained HTML report for one or more runs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tokenfield.cli._app import app, command
from tokenfield.cli._options import out_option


@command(
    app,
    "report",
    epilog=(
        "Example: tokenfield report runs/categories runs/spectrum --out runs/report.html\n\n"
        "Overlay: tokenfield report runs/demo/seed-categories "
        "--overlay runs/demo/seed-categories-random:random --out runs/overlay.html"
    ),
)
def report_command(
    runs: Annotated[list[Path] | None, typer.Argument(help="Run directories.")] = None,
    out: Annotated[Path, out_option(help="HTML file to write.")] = Path("report.html"),
    title: Annotated[str, typer.Option(help="Page title.")] = "tokenfield report",
    section: Annotated[
        list[Path] | None,
        typer.Option(
            "--section",
            help="An HTML fragment to append (repeatable), e.g. the meanfield.html of "
            "scripts/meanfield_tables.py or RUN/theory.html of 'tokenfield lens'.",
        ),
    ] = None,
    overwrite: Annotated[
        bool,
        typer.Option(
            "--overwrite",
            help="Replace --out even if it is not a tokenfield report (a report is always replaced).",
        ),
    ] = False,
    overlay: Annotated[
        list[str] | None,
        typer.Option(
            "--overlay",
            help="Another run (RUN or RUN:LABEL, repeatable) drawn in the first run's "
            "interactive trajectories, in its frozen PCA frame: its random-weight "
            "baseline, a trace of a steered model, or another model traced on the same "
            "prompts (rotated onto the first model's states layer by layer by an "
            "orthogonal Procrustes fit). The legend toggles each run.",
        ),
    ] = None,
) -> None:
    """Write an offline HTML report: interactive trajectories, figures and tables.

    Uses each run's metrics.json and figures/ from 'tokenfield analyze' when
    present (and analyses the others in memory, without writing to them, saying
    so). The figures of 'tokenfield lens' (RUN/figures/theory_*.png) are shown
    with their run; add RUN/theory.html with --section for the lens's table.

    The interactive trajectories: hover a point for its prompt, token, layer,
    norm and (runs traced with --logit-lens) the top-5 tokens at that layer;
    switch 2-D / 3-D and raw / unit-sphere PCA; a layer slider and play button;
    tokens of 'trace --generate' continue their prompt's path. A simulate run
    also shows its particles on the circle or sphere, its energy and clusters.
    """
    import time

    from tokenfield._progress import Stages
    from tokenfield._progress import console as make_console
    from tokenfield.pipelines.report import parse_overlay, unanalysed_runs, write_report
    from tokenfield.runs import read_run_info

    started = time.perf_counter()

    for run in [*(runs or []), *(parse_overlay(o)[0] for o in overlay or [])]:
        read_run_info(run)  # a clear error before any work
    in_memory = unanalysed_runs(runs or [])
    with Stages("report"):
        path = write_report(
            runs or [],
            out,
            title=title,
            sections=section or [],
            overwrite=overwrite,
            overlays=overlay or [],
        )
    for run in in_memory:
        make_console(stderr=True).print(
            f"note: {run} has no metrics.json: analysed in memory for the report, "
            f"nothing saved (run 'tokenfield analyze {run}' to keep the analysis)"
        )
    size = path.stat().st_size / 1e6
    make_console().print(f"wrote {path} ({size:.1f} MB) in {time.perf_counter() - started:.1f} s")

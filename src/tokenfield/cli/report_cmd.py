"""``tokenfield report``: one self-contained HTML report for one or more runs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tokenfield.cli._app import app


@app.command(
    "report",
    epilog="Example: tokenfield report runs/categories runs/spectrum --out report.html",
)
def report_command(
    runs: Annotated[list[Path] | None, typer.Argument(help="Run directories.")] = None,
    out: Annotated[Path, typer.Option("--out", "-o", help="HTML file to write.")] = Path(
        "report.html"
    ),
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
) -> None:
    """Write an offline HTML report: interactive trajectories, figures and tables.

    Uses each run's metrics.json and figures/ from 'tokenfield analyze' when
    present (and analyses the others in memory, without writing to them).
    """
    import time

    from rich.console import Console

    from tokenfield.report.html import write_report

    console = Console(stderr=True)
    started = time.perf_counter()
    with console.status("writing the report"):
        path = write_report(
            runs or [], out, title=title, sections=section or [], overwrite=overwrite
        )
    size = path.stat().st_size / 1e6
    console.print(f"wrote {path} ({size:.1f} MB) in {time.perf_counter() - started:.1f} s")

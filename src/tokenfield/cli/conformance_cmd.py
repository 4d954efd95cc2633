"""``tokenfield theory conformance``: published results as a test suite with a verdict each.

Writes ``OUT/conformance.json`` (``items``: ``name``, ``reference``, ``measured``,
``tolerance``, ``status`` PASS/FAIL, ``seconds``, and ``details``), one PNG per item
in ``OUT/figures/`` and ``OUT/conformance.html`` (self-contained, offline). Exit
status 1 when an item fails.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from tokenfield.cli._app import theory_command
from tokenfield.cli._options import (
    Json,
    echo_json,
    out_option,
    overwrite_option,
    refuse_existing,
)
from tokenfield.errors import UserError


@theory_command(
    "conformance",
    epilog=(
        "Examples: tokenfield theory conformance --quick --out conf/;  "
        "tokenfield theory conformance --only circle-synchronisation --out conf/\n\n"
        "Items, in order: equiangular, phase-diagram, circle-synchronisation, "
        "linear-stability, metastable-staircase, mean-field-pde, causal-renyi-centres, "
        "periodic-clusters. See docs/conformance.md."
    ),
)
def conformance_command(
    out: Annotated[Path, out_option(help="Directory for conformance.json, .html, figures/.")],
    only: Annotated[str | None, typer.Option("--only", help="Run this item only.")] = None,
    quick: Annotated[
        bool,
        typer.Option(
            "--quick",
            help="Small sizes for CI: about 1 min of CPU time (measured: docs/conformance.md; "
            "the wall clock is longer on a busy machine).",
        ),
    ] = False,
    workers: Annotated[
        int,
        typer.Option(
            "--workers",
            help="Run the items in N processes at once (each on one torch thread; the "
            "numbers equal a sequential run's).",
        ),
    ] = 1,
    overwrite: Annotated[
        bool,
        overwrite_option(help="Replace an earlier conformance.json, .html and figures in --out."),
    ] = False,
    as_json: Json = False,
) -> None:
    """Check the simulator and the theory against published results.

    Each item is a small experiment with its published reference, a tolerance or a
    qualitative criterion, a figure, and PASS/FAIL (exit status 1 if any fails).
    """
    from rich.console import Console
    from rich.table import Table

    from tokenfield._progress import TaskLines
    from tokenfield.pipelines.conformance import ITEMS, run_suite, write_conformance
    from tokenfield.runs import check_writable_dir

    if only is not None and only not in ITEMS:
        raise UserError(f"unknown conformance item '{only}'", f"use one of {', '.join(ITEMS)}")
    if workers < 1:
        raise UserError(f"--workers {workers} must be >= 1", "pass --workers 1 or more")
    if out.exists() and not out.is_dir():
        raise UserError(f"--out '{out}' is a file", "pass a directory")
    check_writable_dir(out)
    refuse_existing([out / "conformance.json", out / "conformance.html"], overwrite)
    console = Console(stderr=True)
    started = time.perf_counter()
    names = list(ITEMS) if only is None else [only]
    with TaskLines(names, title="conformance" + (" --quick" if quick else "")) as lines:
        results = run_suite(
            only=only,
            quick=quick,
            progress=lines.start,
            workers=workers,
            finished=lambda r: lines.finish(
                r.name, f"[{'green' if r.passed else 'red'}]{r.status}[/] in {r.seconds:.0f} s"
            ),
        )
    items = write_conformance(out, results, quick=quick, only=only, started=started)
    failed = any(item["status"] != "PASS" for item in items)
    if as_json:
        echo_json(json.loads((out / "conformance.json").read_text()))
        console.print(f"wrote {out / 'conformance.json'} and {out / 'conformance.html'}")
        if failed:
            sys.exit(1)
        return
    table = Table(title="conformance" + (" (quick)" if quick else ""))
    for column in ("item", "measured", "status", "seconds"):
        table.add_column(column, overflow="fold")
    for item in items:
        colour = "green" if item["status"] == "PASS" else "red"
        table.add_row(
            item["name"],
            item["measured"],
            f"[{colour}]{item['status']}[/{colour}]",
            f"{item['seconds']:.1f}",
        )
    Console().print(table)
    Console().print(f"wrote {out / 'conformance.json'} and {out / 'conformance.html'}")
    if failed:
        sys.exit(1)

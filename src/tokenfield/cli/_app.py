"""The typer application that every command module registers on."""

from __future__ import annotations

import typer

app = typer.Typer(
    name="tokenfield",
    help=(
        "Transformers as dynamical systems: depth is time, tokens are particles.\n\n"
        "Trace a model's residual stream layer by layer, simulate self-attention "
        "particle dynamics, and measure both the same way. Start with "
        "'tokenfield demo' or 'tokenfield trace --help'."
    ),
    no_args_is_help=True,
    add_completion=False,
    # Plain click help: rich markup would turn "A:B:N" into an emoji (":B:") and
    # typer's rich panels print boolean flags as "<bool>" options that take a value.
    rich_markup_mode=None,
    context_settings={"max_content_width": 120},
    pretty_exceptions_enable=False,
)

"""The typer application that every command module registers on, and its groups.

``tokenfield theory ...`` holds the mean-field and conformance commands and
``tokenfield steer ...`` the steering ones; the most used verbs (``trace``,
``analyze``, ``report``, ``simulate``, ``lens``, ``demo``, ``models``) stay at
the top. Every older spelling keeps working, hidden from ``--help``: the flat
commands (``tokenfield pde`` = ``tokenfield theory pde``) through
:func:`command`'s ``old`` names, and renamed options as extra long names of the
same option (:class:`Command` shows only the first long name in ``--help``).
docs/cli-renames.md lists every old spelling beside its new one.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import typer
from typer.core import TyperCommand, TyperGroup

HELP_SETTINGS = {"max_content_width": 120}


class Command(TyperCommand):
    """A command whose ``--help`` shows one long name per option.

    An option declared as ``typer.Option("--n-particles", "-n", "--n")`` answers
    to all three; the help lists ``-n, --n-particles`` only. Further long names
    are the old spellings kept as hidden aliases (same option, same meaning)."""

    def format_help(self, ctx: Any, formatter: Any) -> None:
        with _visible_names_only(self.params):
            super().format_help(ctx, formatter)


@contextlib.contextmanager
def _visible_names_only(params: list[Any]) -> Iterator[None]:
    saved = []
    for param in params:
        if getattr(param, "param_type_name", "") != "option":
            continue
        saved.append((param, param.opts, param.secondary_opts))
        param.opts = _first_long(param.opts)
        param.secondary_opts = _first_long(param.secondary_opts)
    try:
        yield
    finally:
        for param, opts, secondary in saved:
            param.opts, param.secondary_opts = opts, secondary


def _first_long(names: list[str]) -> list[str]:
    longs = [n for n in names if n.startswith("--")]
    return [n for n in names if not n.startswith("--")] + longs[:1]


def aliases(params: list[Any]) -> dict[str, str]:
    """``{old long name: new long name}`` of a command's options (for tests and docs)."""
    out = {}
    for param in params:
        if getattr(param, "param_type_name", "") != "option":
            continue
        for names in (param.opts, param.secondary_opts):
            longs = [n for n in names if n.startswith("--")]
            out.update({old: longs[0] for old in longs[1:]})
    return out


# The order of the commands in ``--help``: the verbs people use most, then the
# groups; in each group, as below.
ORDER = (
    *("trace", "analyze", "report", "simulate", "lens", "demo", "models", "theory", "steer"),
    *("stability", "clusters", "pde", "phase-diagram", "metastability", "conformance"),
    *("vector", "eval"),
)


class Group(TyperGroup):
    """A group whose commands are listed in :data:`ORDER`."""

    def list_commands(self, ctx: Any) -> list[str]:
        rank = {name: i for i, name in enumerate(ORDER)}
        return sorted(super().list_commands(ctx), key=lambda n: rank.get(n, len(ORDER)))


class DefaultGroup(Group):
    """A group that runs its ``default`` subcommand when the first argument is not
    one of its subcommands: ``tokenfield steer RUN --from A ...`` (the spelling from
    before the group) is ``tokenfield steer vector RUN --from A ...``."""

    default = "vector"

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h"):
            args = [self.default, *args]
        return super().parse_args(ctx, args)


# What the top level and each group share: help when called bare, no shell
# completion, and plain click help (rich markup would turn "A:B:N" into an emoji
# (":B:") and typer's rich panels print boolean flags as "<bool>" options that take
# a value).
GROUP_SETTINGS: dict[str, Any] = {
    "no_args_is_help": True,
    "add_completion": False,
    "rich_markup_mode": None,
    "context_settings": HELP_SETTINGS,
}

app = typer.Typer(
    name="tokenfield",
    cls=Group,
    help=(
        "Transformers as dynamical systems: depth is time, tokens are particles.\n\n"
        "Trace a model's residual stream layer by layer, simulate self-attention "
        "particle dynamics, and measure both the same way. Start with "
        "'tokenfield demo' or 'tokenfield trace --help'. The theory checks are under "
        "'tokenfield theory', the steering commands under 'tokenfield steer'; the "
        "older flat names (tokenfield pde, tokenfield eval-steering, ...) still work "
        "(docs/cli-renames.md)."
    ),
    pretty_exceptions_enable=False,
    **GROUP_SETTINGS,
)

theory_app = typer.Typer(
    name="theory",
    cls=Group,
    help=(
        "The theory side: linear stability, cluster counts, the mean-field PDE, the "
        "phase diagram, metastability, and the conformance checks against published results."
    ),
    **GROUP_SETTINGS,
)

steer_app = typer.Typer(
    name="steer",
    cls=DefaultGroup,
    help=(
        "Steering: 'steer vector' builds a vector from a traced run and steers its "
        "prompts; 'steer eval' measures steering on arithmetic word problems against "
        "null directions. 'tokenfield steer RUN --from A --to B ...' (no subcommand) "
        "is 'steer vector'."
    ),
    **GROUP_SETTINGS,
)

app.add_typer(theory_app)
app.add_typer(steer_app)


def command(
    where: typer.Typer, name: str, *, old: tuple[str, ...] = (), **kwargs: Any
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register a command as ``name`` on ``where``, and under each ``old`` name
    on the top level, hidden (the flat spelling from before the groups)."""

    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        where.command(name, cls=Command, **kwargs)(fn)
        for spelling in old:
            app.command(spelling, cls=Command, hidden=True, **kwargs)(fn)
        return fn

    return register


def theory_command(
    name: str, *, old: tuple[str, ...] | None = None, **kwargs: Any
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register a command of the ``theory`` group; its flat spelling from before
    the group (``old``, by default the same name) stays on the top level, hidden."""
    return command(theory_app, name, old=(name,) if old is None else old, **kwargs)

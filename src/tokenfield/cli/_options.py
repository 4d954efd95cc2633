"""What the commands share, written once: the common options, the number-list
parser, the thread limiter, JSON output and the library-parameter -> flag rule.

Options: :func:`out_option` (``--out/-o``), :func:`overwrite_option`,
:func:`seed_option` (each with the command's own help text), and one typer
``Annotated`` type per option that means the same in several commands (one
flag, one help text): :data:`Device`, :data:`Json`, :data:`Figures`,
:data:`TraceRun`, :data:`RunOut`, :data:`OutInsteadOfRun`, :data:`Baseline`, :data:`Seed`, :data:`MaxNewTokens`,
:data:`BatchSize`, :data:`ControlSeed`, :data:`Dim`, :data:`TMax`, :data:`Beta`,
:data:`Betas`, :data:`Seeds`, :data:`Time`, :data:`Positions`, :data:`Alphas`,
:data:`Bootstrap`;
:func:`one_run` for commands that read one run (positional, with a hidden
``--run`` alias where a command used to take ``--run``).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer

from tokenfield._device import DEVICES_HELP
from tokenfield._io import dumps
from tokenfield.errors import ParameterError, UserError

__all__ = [
    "ALPHAS_HELP",
    "Alphas",
    "BASELINE_HELP",
    "BETA_HELP",
    "Beta",
    "Betas",
    "Bootstrap",
    "Baseline",
    "BatchSize",
    "ControlSeed",
    "DIM",
    "DIM_HELP",
    "Device",
    "Dim",
    "MaxNewTokens",
    "OutInsteadOfRun",
    "Positions",
    "RunOut",
    "Seed",
    "Seeds",
    "TMax",
    "Time",
    "TraceRun",
    "Figures",
    "Json",
    "echo_json",
    "flag_for",
    "limit_threads",
    "model_option",
    "numbers",
    "one_run",
    "refuse_existing",
    "out_option",
    "overwrite_option",
    "seed_option",
    "user_error",
]


def out_option(help: str = "Directory to write.") -> Any:
    """``--out/-o``: where a command writes."""
    return typer.Option("--out", "-o", help=help)


def overwrite_option(help: str = "Replace an earlier output of this command.") -> Any:
    """``--overwrite``: replace what this command wrote there before."""
    return typer.Option("--overwrite", help=help)


def refuse_existing(paths: list[Path], overwrite: bool) -> None:
    """``--overwrite`` for commands that write named files into ``--out``: an
    earlier output there is refused (nothing is computed or written) unless
    ``overwrite``; with it, the files are replaced (each written atomically).

    Raises:
        UserError: naming the first file found and the two ways out.
    """
    if overwrite:
        return
    for path in paths:
        if path.exists():
            raise UserError(
                f"'{path}' holds an earlier result",
                "pass --overwrite to replace it, or choose another --out",
            )


def seed_option(help: str = "Random seed.") -> Any:
    """``--seed``."""
    return typer.Option("--seed", help=help)


Device = Annotated[str, typer.Option("--device", help=f"{DEVICES_HELP}.")]
Json = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
Figures = Annotated[bool, typer.Option("--figures/--no-figures", help="Draw the figures.")]

# One vocabulary, one meaning: each option below is the same concept wherever
# a command takes it, so it is written once, with one help text.
TraceRun = Annotated[Path, typer.Argument(help="A run written by 'tokenfield trace'.")]
RunOut = Annotated[Path, out_option(help="Run directory to write.")]
OutInsteadOfRun = Annotated[
    Path | None, out_option(help="Directory to write into instead of RUN [default: RUN].")
]
BASELINE_HELP = "A trace of the same prompts by a random-weight copy (--random-weights)."
Baseline = Annotated[Path | None, typer.Option("--baseline", help=BASELINE_HELP)]
Seed = Annotated[int, seed_option()]
MaxNewTokens = Annotated[
    int, typer.Option("--max-new-tokens", help="Longest continuation (tokens) after each prompt.")
]
BatchSize = Annotated[
    int,
    typer.Option(
        "--batch-size", help="Sequences (prompts, or prompt x condition rows) per forward pass."
    ),
]
ControlSeed = Annotated[
    int,
    typer.Option(
        "--control-seed",
        help="Seed of the random control direction (of the first; the next ones +1, +2, ...).",
    ),
]
DIM = ("--dim", "-d")
DIM_HELP = "Dimension d (particles on the sphere S^{d-1})."
Dim = Annotated[int, typer.Option(*DIM, help=DIM_HELP)]
TMax = Annotated[float, typer.Option("--t-max", help="Final time T.")]
BETA_HELP = "Inverse temperature beta."
Beta = Annotated[float, typer.Option("--beta", help=BETA_HELP)]
Betas = Annotated[str, typer.Option("--betas", help="Betas: a list 1,4,16, or A:B or A:B:N.")]
Seeds = Annotated[int, typer.Option("--seeds", help="Independent starts, batched.")]
Time = Annotated[
    str,
    typer.Option("--time", help="paper, or rescaled: USA weights exp(beta(<x,y> - 1)) / n."),
]
Positions = Annotated[
    str,
    typer.Option(
        "--positions",
        help="'last': the last token of each prompt (and each generated one); 'all': every token.",
    ),
]
ALPHAS_HELP = "Comma-separated multiples of the vector."
Alphas = Annotated[str, typer.Option("--alphas", help=ALPHAS_HELP)]
Bootstrap = Annotated[
    int, typer.Option("--bootstrap", help="Bootstrap resamples of prompts (for the intervals).")
]


def model_option(
    help: str = "Model: a bundled name, a local directory, a .gguf file or a hub id.",
) -> Any:
    """``--model/-m``: the model a command loads."""
    return typer.Option("--model", "-m", help=help)


def flag_for(param: str) -> str:
    """The command-line flag that sets the library parameter ``param``: the same
    name with dashes (``n_particles`` -> ``--n-particles``), as every flag is named
    after the library parameter it sets."""
    return "--" + param.replace("_", "-")


def user_error(exc: UserError) -> UserError:
    """A library error as the command line should say it: parameters named by
    their flags (``beta must be finite`` -> ``--beta must be finite``)."""
    if isinstance(exc, ParameterError):
        return exc.named(flag_for(exc.param))
    if exc.cli_fix:
        return UserError(exc.problem, exc.cli_fix)
    return exc


def numbers(
    text: str, flag: str, *, integer: bool = False, ranges: bool = True, example: str = "1,2,4"
) -> list[Any]:
    """The one number-list parser: ``1,2,4``, and with ``ranges`` also ``A:B``
    (integers A..B) or ``A:B:N`` (N points from A to B).

    Raises:
        UserError: not a list of finite numbers (or integers), or an empty one.
    """
    example = f"e.g. {flag} {example}" + (f" or {flag} 1:100" if ranges else "")
    try:
        if ranges and ":" in text:
            parts = [float(p) for p in text.split(":")]
            if len(parts) == 2:
                values = list(range(math.ceil(parts[0]), math.floor(parts[1]) + 1))
            elif len(parts) == 3 and parts[2] >= 1 and parts[2] == int(parts[2]):
                values = [float(v) for v in linspace(parts[0], parts[1], int(parts[2]))]
            else:
                raise ValueError
        else:
            values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        what = (
            "a list like 1,2,4 or a range A:B or A:B:N" if ranges else "numbers separated by commas"
        )
        raise UserError(f"{flag} must be {what}, got '{text}'", example) from None
    if not values or not all(math.isfinite(v) for v in values):
        raise UserError(f"{flag} has no finite values: '{text}'", example)
    if integer:
        if any(v != int(v) for v in values):
            raise UserError(f"{flag} must be integers, got '{text}'", example)
        return [int(v) for v in values]
    return [float(v) for v in values]


def linspace(start: float, stop: float, count: int) -> list[float]:
    """``count`` evenly spaced numbers from ``start`` to ``stop`` (both included)."""
    if count == 1:
        return [start]
    return [start + (stop - start) * i / (count - 1) for i in range(count)]


@contextlib.contextmanager
def limit_threads(n: int = 1) -> Iterator[None]:
    """Run the block with ``n`` torch threads (many small systems are faster on
    one thread each); the previous count comes back on exit, even on error."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def echo_json(data: Any) -> None:
    """Print ``data`` as JSON on stdout (numpy scalars and arrays as numbers and
    lists: :func:`tokenfield._io.dumps`)."""
    typer.echo(dumps(data))


def one_run(positional: Path | None, option: Path | None, *, what: str = "RUN") -> Path:
    """The run a command reads, given positionally or with the hidden ``--run`` alias.

    Raises:
        UserError: neither or both (and different) given.
    """
    if positional is not None and option is not None and positional != option:
        raise UserError(
            f"two runs given ('{positional}' and --run '{option}')", f"pass the {what} once"
        )
    run = positional if positional is not None else option
    if run is None:
        raise UserError(f"no {what} given", "pass the run directory as the first argument")
    return run

"""The ``tokenfield`` command.

Each command group lives in its own module and registers itself on the shared
:data:`app`; importing the module is what adds the command. User errors become
one line on stderr and exit status 2, with no traceback.
"""

from __future__ import annotations

import sys

from tokenfield.cli._app import app
from tokenfield.errors import UserError

# Importing these registers their commands on `app`.
from tokenfield.cli import (  # noqa: E402,F401  isort: skip
    analyze_cmd,
    conformance_cmd,
    demo_cmd,
    lens_cmd,
    meanfield_cmd,
    models_cmd,
    report_cmd,
    simulate_cmd,
    steer_cmd,
    trace_cmd,
)

__all__ = ["app", "main"]


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point."""
    try:
        app(args=argv, standalone_mode=False, prog_name="tokenfield")
    except UserError as exc:
        print(f"tokenfield: error: {exc.one_line()}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print(
            "tokenfield: interrupted; run the same command again to resume.",
            file=sys.stderr,
        )
        sys.exit(130)
    except SystemExit:
        raise
    except Exception as exc:
        # Usage errors (unknown option, bad value) from click or typer's vendored copy
        # of it: both have show() and exit_code. Anything else is a bug: re-raise.
        message = getattr(exc, "format_message", None)
        if callable(message) and isinstance(getattr(exc, "exit_code", None), int):
            ctx = getattr(exc, "ctx", None)
            if type(exc).__name__ == "NoArgsIsHelpError" and ctx is not None:
                print(ctx.get_help(), file=sys.stderr)  # bare `tokenfield`: show the help
                sys.exit(2)
            where = ctx.command_path if ctx is not None else "tokenfield"
            text = " ".join(str(message()).split()).rstrip(".")
            print(f"tokenfield: error: {text}; see '{where} --help'.", file=sys.stderr)
            sys.exit(exc.exit_code or 2)
        if type(exc).__name__ == "Abort":
            print("tokenfield: aborted.", file=sys.stderr)
            sys.exit(130)
        raise

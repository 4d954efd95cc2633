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
    demo_cmd,
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
        app(args=argv, standalone_mode=False)
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
    except Exception as exc:  # click usage errors arrive here in non-standalone mode
        import click

        if isinstance(exc, click.exceptions.ClickException):
            exc.show()
            sys.exit(2)
        if isinstance(exc, click.exceptions.Abort):
            print("tokenfield: aborted.", file=sys.stderr)
            sys.exit(130)
        raise

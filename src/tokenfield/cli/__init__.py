"""The ``tokenfield`` command.

Each command group lives in its own module and registers itself on the shared
:data:`app`; importing the module is what adds the command. User errors become
one line on stderr and exit status 2, with no traceback.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading

from tokenfield._threads import configure_threads
from tokenfield.cli._app import app
from tokenfield.cli._options import user_error
from tokenfield.errors import UserError

# Importing these registers their commands on `app`.
from tokenfield.cli import (  # noqa: E402,F401  isort: skip
    analyze_cmd,
    attractors_cmd,
    conformance_cmd,
    demo_cmd,
    hypotheses_cmd,
    lens_cmd,
    meanfield_cmd,
    models_cmd,
    report_cmd,
    simulate_cmd,
    steer_cmd,
    trace_cmd,
)

__all__ = ["app", "main"]


class Interrupted(BaseException):
    """Raised by the signal handlers that :func:`main` installs (SIGINT, SIGTERM).

    A ``BaseException`` that is not ``KeyboardInterrupt``, so that neither typer
    (which turns ``KeyboardInterrupt`` into a bare return code) nor library code
    swallows it; ``finally`` blocks and context managers still run, so a run
    is left ``partial`` with its progress recorded and resumable."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


RESUME_LINE = "tokenfield: interrupted; run the same command again to resume."


def _raise_interrupted(signum: int, _frame: object) -> None:
    raise Interrupted(signum)


def _install_signal_handlers() -> dict[int, object]:
    previous: dict[int, object] = {}
    if threading.current_thread() is not threading.main_thread():
        return previous
    for signum in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(ValueError, OSError):
            previous[signum] = signal.signal(signum, _raise_interrupted)
    return previous


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point.

    Exit status: 0 done, 2 a user error (one line on stderr), 130 / 143
    interrupted by SIGINT (Ctrl-C) / SIGTERM (one line saying how to resume).
    """
    from tokenfield import runs
    from tokenfield._lock import release_all

    runs.reset_write_log()
    previous = _install_signal_handlers()
    threads_before = os.environ.get("OMP_NUM_THREADS")
    try:
        if "torch" not in sys.modules:
            # Before torch loads: as many threads as there are idle cores, not
            # torch's one per core, which collapses on a busy machine (README,
            # "Threads"). OMP_NUM_THREADS or TOKENFIELD_THREADS override it.
            configure_threads()
        code = app(args=argv, standalone_mode=False, prog_name="tokenfield")
        if isinstance(code, int) and not isinstance(code, bool) and code == 130:
            # typer's own KeyboardInterrupt path (an interrupt outside our handler).
            print(runs.interrupted_line(), file=sys.stderr)
            sys.exit(130)
    except Interrupted as exc:
        print(runs.interrupted_line(), file=sys.stderr)
        sys.exit(128 + exc.signum)
    except KeyboardInterrupt:
        print(runs.interrupted_line(), file=sys.stderr)
        sys.exit(130)
    except UserError as exc:
        # A library error names its parameter ("beta"); here it names the flag ("--beta").
        print(f"tokenfield: error: {user_error(exc).one_line()}", file=sys.stderr)
        sys.exit(2)
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
    finally:
        # torch has read it by now; callers in this process see their own value.
        if threads_before is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = threads_before
        release_all()
        for signum, handler in previous.items():
            with contextlib.suppress(ValueError, OSError, TypeError):
                signal.signal(signum, handler)  # type: ignore[arg-type]

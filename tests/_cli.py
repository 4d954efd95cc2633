"""Run the ``tokenfield`` command in process, for tests of every tier."""

from __future__ import annotations

from tokenfield.cli import main


def run_cli(args, capsys=None) -> tuple[int, str, str]:
    """Run ``tokenfield ARGS`` (arguments turned into strings); return its exit status
    and, when ``capsys`` is given, what it printed on stdout and stderr."""
    try:
        main([str(a) for a in args])
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    if capsys is None:
        return code, "", ""
    captured = capsys.readouterr()
    return code, captured.out, captured.err

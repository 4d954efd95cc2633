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


def one_error_line(err: str) -> str:
    """The one line a refused command prints (``tokenfield: error: ...``, no
    traceback); fails the test when stderr holds anything else."""
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("tokenfield: error: "), err
    assert "Traceback" not in err
    return lines[0]


def tree(path) -> dict[str, bytes]:
    """Every file under ``path`` with its bytes: what must stay untouched."""
    from pathlib import Path

    root = Path(path)
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}

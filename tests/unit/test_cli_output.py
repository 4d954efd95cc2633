"""What the commands print: help text, where results and progress go, table widths."""

from __future__ import annotations

import re

import pytest
import typer.main

from tokenfield.cli import app, main

EMOJI = re.compile("[\U0001f000-\U0001faff\u2600-\u27bf\u2b00-\u2bff\ufe0f]")


def run_cli(args, capsys):
    """Run the CLI in process; returns (exit status, stdout, stderr)."""
    try:
        main([str(a) for a in args])
        status = 0
    except SystemExit as exc:
        status = exc.code
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def _commands() -> dict:
    return typer.main.get_command(app).commands  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", sorted(_commands()))
def test_help_has_no_emoji_and_shows_flags_as_flags(name, capsys):
    status, out, err = run_cli([name, "--help"], capsys)
    assert status == 0, err
    assert not EMOJI.search(out), EMOJI.findall(out)
    assert "<bool>" not in out  # a boolean flag takes no value
    command = _commands()[name]
    for param in command.params:
        if getattr(param, "is_flag", False) and param.opts[0] != "--help":
            # shown as a flag: '--json' or '--figures / --no-figures', never with a type
            spelled = " / ".join([param.opts[0], *param.secondary_opts])
            line = next(line for line in out.splitlines() if spelled in line)
            assert "<" not in line.split(spelled, 1)[1].split("  ")[0], line


def test_range_syntax_is_printed_literally(capsys):
    for name in ("stability", "predict-clusters", "phase-diagram", "metastability"):
        _, out, _ = run_cli([name, "--help"], capsys)
        assert "A:B:N" in out, name


def test_a_flag_still_works_as_documented(capsys, tmp_path):
    status, out, err = run_cli(["stability", "--beta", "4", "--json"], capsys)
    assert status == 0, err
    assert out.lstrip().startswith("{")

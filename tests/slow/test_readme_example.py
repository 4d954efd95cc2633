"""The README's worked example, run top to bottom in an empty directory.

The command lines are read from README.md (every ``$`` line of the console
blocks between "## A worked example" and "### Python"), so the test follows the
doc: a command added there is run here. A command shown with a
``tokenfield: error:`` line under it must fail with exit status 2 and that
error; every other one must succeed. The wall time of each is printed (and
appended, command by command, to the file ``$TOKENFIELD_README_TIMINGS`` names).

Nothing is prepared beforehand: no ``make demo``, no runs. The models come from
the bundled offline cache, as for the rest of the slow tier.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
COMMAND = ".venv/bin/tokenfield"

pytestmark = pytest.mark.slow


def worked_example(text: str) -> list[tuple[list[str], str | None]]:
    """``(argv after 'tokenfield', expected error line or None)`` for every command of
    the worked example, in order."""
    start = text.index("## A worked example")
    end = text.index("### Python", start)
    section = text[start:end]
    commands: list[tuple[list[str], str | None]] = []
    for block in re.findall(r"```console\n(.*?)```", section, flags=re.S):
        lines = block.splitlines()
        i = 0
        while i < len(lines):
            line = lines[i]
            i += 1
            if not line.startswith("$ "):
                continue
            command = line[2:]
            while command.rstrip().endswith("\\") and i < len(lines):
                command = command.rstrip()[:-1] + " " + lines[i].strip()
                i += 1
            argv = shlex.split(command, comments=True)
            assert argv[0] == COMMAND, f"README command does not start with {COMMAND}: {line}"
            error = None
            if i < len(lines) and lines[i].startswith("tokenfield: error:"):
                error = lines[i]
            commands.append((argv[1:], error))
    return commands


def test_the_worked_example_is_parsed_whole():
    """The parser sees every command, the continued lines included (a guard on
    the parser itself, which the run below trusts)."""
    commands = worked_example(README.read_text(encoding="utf-8"))
    names = [argv[0] for argv, _ in commands]
    assert names[0] == "models"
    assert "steer" in names and "simulate" in names and "lens" in names
    overlay = next(argv for argv, _ in commands if "--overlay" in argv)
    assert overlay.count("--overlay") == 2 and overlay[-2:] == ["--out", "runs/overlay.html"]
    errors = [(argv, error) for argv, error in commands if error]
    assert len(errors) == 1 and errors[0][0][:3] == ["trace", "--model", "foo"]
    # no command reads a run that the example itself does not write first
    for argv, _ in commands:
        assert not any("runs/demo" in a for a in argv), argv


def test_the_readme_worked_example_runs_top_to_bottom(tmp_path):
    commands = worked_example(README.read_text(encoding="utf-8"))
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    launcher = [sys.executable, "-c", "from tokenfield.cli import main; main()"]
    timings: list[tuple[float, str]] = []
    for argv, error in commands:
        started = time.perf_counter()
        result = subprocess.run(
            [*launcher, *argv], cwd=tmp_path, env=env, capture_output=True, text=True
        )
        seconds = time.perf_counter() - started
        timings.append((seconds, "tokenfield " + shlex.join(argv)))
        if os.environ.get("TOKENFIELD_README_TIMINGS"):  # as it goes: a long run can be watched
            with open(os.environ["TOKENFIELD_README_TIMINGS"], "a", encoding="utf-8") as log:
                log.write(f"{seconds:8.1f} s  rc {result.returncode}  {timings[-1][1]}\n")
        if error is None:
            assert result.returncode == 0, (argv, result.stderr[-3000:])
        else:
            assert result.returncode == 2, (argv, result.stderr[-3000:])
            lines = [line for line in result.stderr.splitlines() if line.strip()]
            assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
            # the README's line up to its first comma (the hub part depends on the network)
            assert lines[0].split(",")[0] == error.split(",")[0], (lines[0], error)
    report = "\n".join(f"{s:8.1f} s  {c}" for s, c in timings)
    report += f"\n{sum(s for s, _ in timings):8.1f} s  in all (load {os.getloadavg()[0]:.1f})"
    print("\nREADME worked example, wall time per command:\n" + report)
    if os.environ.get("TOKENFIELD_README_TIMINGS"):
        with open(os.environ["TOKENFIELD_README_TIMINGS"], "a", encoding="utf-8") as log:
            log.write(report.splitlines()[-1] + "\n")
    for name in ("spectrum", "spectrum-random", "cat-gen", "cat-random", "cat-gemma", "s", "steer"):
        assert (tmp_path / "runs" / name).is_dir(), name
    assert (tmp_path / "runs" / "overlay.html").stat().st_size > 0
    assert (tmp_path / "runs" / "s" / "report.html").stat().st_size > 0

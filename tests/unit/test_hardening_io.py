"""Issue 21, items 1-6 and 8: no write or read through a symlink that leaves the run,
a cache memo and a store that cannot lie, a ``run.json`` checked against its store,
and ``--overwrite`` that deletes only tokenfield's own files.

Each attack test plants the attacker's file and checks afterwards that it is
byte-for-byte untouched.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests._cli import run_cli
from tokenfield import _lock
from tokenfield.errors import UserError
from tokenfield.runs import RunWriter

SECRET = b"the attacker's target: must stay exactly as it is\n"


def one_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("tokenfield: error: "), err
    assert "Traceback" not in err
    return lines[0]


@pytest.fixture
def target(tmp_path) -> Path:
    path = tmp_path / "elsewhere" / "victim.txt"
    path.parent.mkdir()
    path.write_bytes(SECRET)
    return path


# --- item 1: the lock never follows a symlink -------------------------------------

WRITERS = {
    "simulate": ["simulate", "--n", "4", "--dim", "3", "--t-max", "0.1"],
    "trace": ["trace", "-m", "smollm2", "--prompts", "{prompts}"],
    "phase-diagram": ["phase-diagram", "--dims", "2", "--betas", "1"],
    "predict-clusters": ["predict-clusters", "--betas", "1", "--n", "8", "--seeds", "1"],
    "pde": ["pde", "--n", "8", "--times", "0", "--cells", "16"],
    "metastability": ["metastability", "--betas", "2", "--caps", "2", "--seeds", "1"],
}


@pytest.mark.parametrize("planted", ["symlink", "hardlink", "fifo"])
@pytest.mark.parametrize("command", sorted(WRITERS))
def test_a_planted_lock_file_is_refused_and_its_target_untouched(
    tmp_path, target, command, planted, capsys
):
    out = tmp_path / "out"
    out.mkdir()
    lock = out / _lock.LOCK_NAME
    if planted == "symlink":
        lock.symlink_to(target)
    elif planted == "hardlink":
        os.link(target, lock)
    else:
        os.mkfifo(lock)
    prompts = tmp_path / "p.txt"
    prompts.write_text("one prompt\n")
    args = [a.replace("{prompts}", str(prompts)) for a in WRITERS[command]]
    code, _out, err = run_cli([*args, "--out", out], capsys)
    assert code == 2, err
    line = one_error_line(err)
    assert "not tokenfield's lock" in line and f"remove '{lock}'" in line
    assert target.read_bytes() == SECRET
    assert sorted(p.name for p in out.iterdir()) == [_lock.LOCK_NAME]  # nothing written
    assert lock.is_symlink() == (planted == "symlink")


def test_the_library_writer_refuses_a_symlinked_lock(tmp_path, target):
    out = tmp_path / "run"
    out.mkdir()
    (out / _lock.LOCK_NAME).symlink_to(target)
    with pytest.raises(UserError, match="is a symbolic link"):
        RunWriter(out, "trace", {"a": 1}, append_dim="particle")
    assert target.read_bytes() == SECRET
    # a dangling symlink is not created through either
    (out / _lock.LOCK_NAME).unlink()
    (out / _lock.LOCK_NAME).symlink_to(tmp_path / "elsewhere" / "new-file")
    with pytest.raises(UserError, match="is a symbolic link"):
        _lock.acquire(out)
    assert not (tmp_path / "elsewhere" / "new-file").exists()

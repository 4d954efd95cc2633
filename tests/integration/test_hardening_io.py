"""Issue 21, items 1 and 3 for the commands that need a model: ``steer`` and
``eval-steering`` never follow a symlinked lock file, and ``lens`` reports a
damaged chunk of the store in one line (tiny random-weight models, no download)."""

from __future__ import annotations

import pytest

import tokenfield as tf
from tests._cli import run_cli
from tests.integration.tiny import PROMPTS, save_tiny
from tokenfield import _lock

SECRET = b"the attacker's target: must stay exactly as it is\n"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    base = tmp_path_factory.mktemp("hardening-io")
    directory = save_tiny("llama", base / "tiny-llama")
    model = tf.load_model(str(directory))
    prompts = [tf.Prompt(p, "A" if i % 2 else "B") for i, p in enumerate(PROMPTS)]
    tf.trace(model, prompts, out=base / "run")
    return base


def one_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


@pytest.mark.parametrize("command", ["steer", "eval-steering"])
def test_steer_commands_refuse_a_symlinked_lock_and_leave_its_target(
    tiny, tmp_path, command, capsys
):
    target = tmp_path / "victim.txt"
    target.write_bytes(SECRET)
    out = tmp_path / "out"
    out.mkdir()
    (out / _lock.LOCK_NAME).symlink_to(target)
    args = {
        "steer": ["steer", "--run", tiny / "run", "--from", "A", "--to", "B", "--layer", "1",
                  "--alpha", "1", "--max-new-tokens", "2"],
        "eval-steering": ["eval-steering", "--model", tiny / "tiny-llama", "--n", "6",
                          "--fit", "4", "--validation", "5", "--shots", "1", "--layers", "1",
                          "--alphas", "0,1", "--controls", "1", "--shuffles", "1", "--halves", "1",
                          "--max-new-tokens", "2",
                          "--max-operand", "6", "--templates", "add"],
    }[command]  # fmt: skip
    code, _out, err = run_cli([*args, "--out", out], capsys)
    assert code == 2, err
    assert "is a symbolic link, not tokenfield's lock" in one_error_line(err)
    assert target.read_bytes() == SECRET
    assert sorted(p.name for p in out.iterdir()) == [_lock.LOCK_NAME]


def test_lens_on_a_damaged_chunk_is_one_line(tiny, tmp_path, capsys):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(tiny / "run", run)
    chunk = next(p for p in (run / "trajectory.zarr" / "states").rglob("*") if p.is_file()
                 and p.name != "zarr.json")  # fmt: skip
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2] ^= 0x5A
    chunk.write_bytes(bytes(data))
    code, _out, err = run_cli(["lens", run], capsys)
    assert code == 2, err
    assert "Traceback" not in err
    # (the lens's progress bar, drawn before the states are read, may precede it)
    (line,) = [line for line in err.splitlines() if line.startswith("tokenfield:")]
    assert f"run '{run}' has a damaged chunk in trajectory.zarr" in line and "--overwrite" in line

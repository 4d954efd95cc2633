"""One writer per run and interrupts that say so, with real `tokenfield` processes.

Each test starts the console entry point in subprocesses (a tiny local model, so
no download), then compares the resulting run with a clean run of the same
command.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import xarray as xr

from tests.integration.tiny import WORDS, save_tiny

ROOT = Path(__file__).resolve().parents[2]
N_PROMPTS = 60


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    return save_tiny("llama", tmp_path_factory.mktemp("models") / "tiny-llama")


@pytest.fixture(scope="module")
def prompt_file(tmp_path_factory) -> Path:
    # Many short prompts in batches of 2: long enough (thirty appends)
    # for a second process or a signal to arrive mid-trace.
    lines = [
        " ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(3 + i % 5))
        for i in range(N_PROMPTS)
    ]
    path = tmp_path_factory.mktemp("prompts") / "many.txt"
    path.write_text("\n".join(lines) + "\n")
    return path


def command(model: Path, prompts: Path, out: Path) -> list[str]:
    return [
        sys.executable,
        "-c",
        "from tokenfield.cli import main; main()",
        "trace",
        "--model",
        str(model),
        "--prompts",
        str(prompts),
        "--batch-size",
        "2",
        "--out",
        str(out),
    ]


def environment(flush_seconds: str = "0") -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT), env.get("PYTHONPATH", "")])
    env["OMP_NUM_THREADS"] = "1"
    # write every batch at once, so progress shows mid-trace however fast the machine
    env["TOKENFIELD_FLUSH_SECONDS"] = flush_seconds
    env["COLUMNS"] = "200"
    return env


def start(args: list[str], flush_seconds: str = "0") -> subprocess.Popen:
    return subprocess.Popen(
        args,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=environment(flush_seconds),
    )


def finish(proc: subprocess.Popen, timeout: float = 300) -> tuple[int, str]:
    _out, err = proc.communicate(timeout=timeout)
    return proc.returncode, err


def error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("tokenfield:")]


def load(run: Path) -> xr.Dataset:
    ds = xr.open_zarr(run / "trajectory.zarr").load()
    ds.attrs = {}
    return ds


@pytest.fixture(scope="module")
def clean_run(tiny_dir, prompt_file, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("clean") / "run"
    code, err = finish(start(command(tiny_dir, prompt_file, out)))
    assert code == 0, err
    return out


def progress_done(run: Path) -> int:
    try:
        return int(json.loads((run / "run.json").read_text())["progress"]["done"])
    except (OSError, ValueError, KeyError):
        return 0


def wait_for(predicate, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for the trace to start")
        time.sleep(0.02)


def test_two_traces_on_one_out_one_wins_and_the_run_is_clean(
    tiny_dir, prompt_file, clean_run, tmp_path
):
    out = tmp_path / "shared"
    first = start(command(tiny_dir, prompt_file, out))
    second = start(command(tiny_dir, prompt_file, out))
    results = [finish(first), finish(second)]
    codes = sorted(code for code, _ in results)
    assert codes == [0, 2], results
    loser_err = next(err for code, err in results if code == 2)
    lines = error_lines(loser_err)
    assert len(lines) == 1, loser_err
    assert "Traceback" not in loser_err
    winner_pid = next(
        p.pid for p, (code, _) in zip((first, second), results, strict=True) if code == 0
    )
    assert f"is being written by process {winner_pid}" in lines[0]
    info = json.loads((out / "run.json").read_text())
    assert info["status"] == "complete" and info["progress"]["done"] == N_PROMPTS
    assert info["progress"]["batch_size"] == 2  # recorded, so a resume can check it
    xr.testing.assert_identical(load(out), load(clean_run))
    assert not (out / ".tokenfield.lock").exists()


@pytest.mark.parametrize(
    ("signum", "code", "flush_seconds"),
    [
        (signal.SIGINT, 130, "0"),
        (signal.SIGTERM, 143, "0"),
        # buffered: the background writer thread is busy or holds pieces when the signal comes
        (signal.SIGINT, 130, "0.01"),
    ],
)
def test_interrupt_exits_with_the_resume_line_and_the_rerun_is_clean(
    tiny_dir, prompt_file, clean_run, tmp_path, signum, code, flush_seconds
):
    out = tmp_path / "interrupted"
    proc = start(command(tiny_dir, prompt_file, out), flush_seconds)
    wait_for(lambda: progress_done(out) >= 6)
    proc.send_signal(signum)
    rc, err = finish(proc)
    assert rc == code, err
    assert "Traceback" not in err
    assert error_lines(err) == ["tokenfield: interrupted; run the same command again to resume."], (
        err
    )
    info = json.loads((out / "run.json").read_text())
    assert info["status"] == "partial"
    assert 6 <= info["progress"]["done"] < N_PROMPTS
    assert not (out / ".tokenfield.lock").exists()
    rc, err = finish(start(command(tiny_dir, prompt_file, out), flush_seconds))
    assert rc == 0, err
    assert json.loads((out / "run.json").read_text())["status"] == "complete"
    xr.testing.assert_identical(load(out), load(clean_run))


def test_a_killed_writer_leaves_no_stale_lock(tiny_dir, prompt_file, clean_run, tmp_path):
    out = tmp_path / "killed"
    proc = start(command(tiny_dir, prompt_file, out))
    wait_for(lambda: progress_done(out) >= 4)
    proc.kill()  # SIGKILL: no handler runs; the OS drops the flock
    proc.communicate(timeout=60)
    assert (out / ".tokenfield.lock").exists()  # the file stays, the lock does not
    rc, err = finish(start(command(tiny_dir, prompt_file, out)))
    assert rc == 0, err
    xr.testing.assert_identical(load(out), load(clean_run))

"""`tokenfield trace` end to end on a tiny local model, and every bad input."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import xarray as xr

from tests._cli import run_cli
from tests.integration.tiny import save_tiny


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    return save_tiny("llama", tmp_path_factory.mktemp("models") / "tiny-llama")


def snapshot(path: Path) -> dict[str, int]:
    if not path.exists():
        return {}
    return {str(p.relative_to(path)): p.stat().st_mtime_ns for p in path.rglob("*")}


def test_trace_writes_a_plain_zarr_run(tiny_dir, tmp_path, capsys):
    prompts = tmp_path / "p.txt"
    prompts.write_text("the capital of France is\n1 + 2 =\n")
    code, _out, err = run_cli(
        [
            "trace",
            "--model",
            str(tiny_dir),
            "--prompts",
            str(prompts),
            "--out",
            str(tmp_path / "r"),
            "--positions",
            "all",
        ],
        capsys,
    )
    assert code == 0, err
    ds = xr.open_zarr(tmp_path / "r" / "trajectory.zarr")
    assert ds.states.shape[0] == 4 and ds.sizes["particle"] == 5 + 4
    # the result on stdout, the progress bar on stderr
    assert "traced 9 particles" in _out and "traced" not in err
    assert "2/2" in err and "prompts" in err and "prompts" not in _out


@pytest.mark.parametrize(
    ("make_args", "message"),
    [
        (
            lambda d, t: ["--model", "no-such-model"],
            "not a bundled model.*smollm2.*local model directory",
        ),
        (lambda d, t: ["--model", str(t / "missing.gguf")], "GGUF file .* does not exist"),
        (lambda d, t: ["--model", "./missing/dir"], "does not exist"),
        (lambda d, t: ["--model", d, "--prompts", str(t / "empty.txt")], "no prompts in"),
        (lambda d, t: ["--model", d, "--prompts", str(t / "nothere.txt")], "does not exist"),
        (
            lambda d, t: ["--model", d, "--prompts", str(t / "long.txt")],
            "more than the model's context.*--truncate",
        ),
        (lambda d, t: ["--model", d, "--chat", "--prompts", str(t / "ok.txt")], "no chat template"),
        (lambda d, t: ["--model", d, "--positions", "middle"], "unknown --positions"),
        (lambda d, t: ["--model", d, "--device", "cuda"], "CUDA"),
        (lambda d, t: ["--model", d, "--dtype", "int8"], "unknown dtype"),
    ],
)
def test_bad_input_one_line_exit_2_nothing_touched(
    tiny_dir, tmp_path, capsys, make_args, message, monkeypatch
):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # hub ids must fail fast here
    (tmp_path / "empty.txt").write_text("\n")
    (tmp_path / "ok.txt").write_text("the a of\n")
    (tmp_path / "long.txt").write_text(" ".join(["the"] * 100) + "\n")
    out = tmp_path / "run"
    out.mkdir()
    (out / "keep.txt").write_text("existing data")
    before = snapshot(out)
    code, _stdout, err = run_cli(
        ["trace", *make_args(str(tiny_dir), tmp_path), "--out", str(out)], capsys
    )
    if "CUDA" in message and code == 0:
        pytest.skip("this machine has CUDA")
    assert code == 2
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("tokenfield: error:"), err
    import re

    assert re.search(message, lines[0]), lines[0]
    assert snapshot(out) == before


def test_output_inside_a_file_is_refused(tiny_dir, tmp_path, capsys):
    (tmp_path / "afile").write_text("x")
    code, _o, err = run_cli(
        ["trace", "--model", str(tiny_dir), "--out", str(tmp_path / "afile" / "run")], capsys
    )
    assert code == 2 and "inside a file" in err and (tmp_path / "afile").read_text() == "x"


def test_existing_non_run_directory_is_refused(tiny_dir, tmp_path, capsys):
    out = tmp_path / "notrun"
    out.mkdir()
    (out / "data.csv").write_text("1,2")
    code, _o, err = run_cli(["trace", "--model", str(tiny_dir), "--out", str(out)], capsys)
    assert code == 2 and "not a tokenfield run" in err
    assert (out / "data.csv").read_text() == "1,2"


def test_hub_id_fails_fast_without_hub(tmp_path):
    """The real console script: one line, exit 2, no traceback, no hang."""
    env = {**os.environ, "HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_OFFLINE": "0"}
    script = Path(sys.executable).with_name("tokenfield")
    result = subprocess.run(
        [str(script), "trace", "--model", "someorg/some-model", "--out", str(tmp_path / "r")],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "hub cannot be reached" in result.stderr and "local model directory" in result.stderr
    assert not (tmp_path / "r").exists()


def test_help_explains(capsys):
    code, out, _err = run_cli(["trace", "--help"], capsys)
    assert code == 0
    for flag in ("--model", "--prompts", "--positions", "--batch-size", "--chat", "--out"):
        assert flag in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["trace", "--no-such-flag"],
            "No such option: --no-such-flag; see 'tokenfield trace --help'.",
        ),
        (["trace", "--out", "x", "--batch-size", "abc"], "Invalid value for '--batch-size'"),
        (["trace"], "Missing option '--out'"),
        (["trace", "--out", "x", "--generate", "-1"], "--generate must be 0 or more"),
        (
            ["trace", "--out", "x", "--generate", "2", "--steer", "v.safetensors"],
            "pass --steer-positions all",
        ),
        (["no-such-command"], "No such command"),
    ],
)
def test_usage_errors_are_one_line(capsys, args, message):
    code, _out, err = run_cli(args, capsys)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1, err
    assert lines[0].startswith("tokenfield: error:") and message in lines[0]

"""The shared CLI pieces end to end: one device parser for every command, library
errors named by their flags, --json on the commands that print a table."""

from __future__ import annotations

import json

import pytest

from tests._cli import run_cli


def test_simulate_accepts_device_auto_like_trace(tmp_path, capsys):
    out = tmp_path / "sim"
    code, stdout, err = run_cli(
        ["simulate", "--n", "4", "--dim", "2", "--t-max", "0.2", "--dt", "0.1",
         "--device", "auto", "--out", out], capsys,
    )  # fmt: skip
    assert code == 0, err
    assert "wrote 3 states of 4 particles" in stdout
    code, _out, err = run_cli(["simulate", "--device", "tpu", "--out", tmp_path / "x"], capsys)
    assert code == 2 and "unknown --device 'tpu'; use cpu, cuda, cuda:N or auto" in err
    assert not (tmp_path / "x").exists()


def test_trace_refuses_the_same_devices_as_simulate(tmp_path, capsys):
    code, _out, err = run_cli(["trace", "--device", "tpu", "--out", tmp_path / "t"], capsys)
    assert code == 2 and "unknown --device 'tpu'; use cpu, cuda, cuda:N or auto" in err
    assert not (tmp_path / "t").exists()


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["simulate", "--beta", "nan"], "--beta must be finite, not nan; pass a finite --beta."),
        (["simulate", "--dt", "0"], "the step must be --dt > 0, not 0; pass a positive --dt."),
        (["simulate", "--t-max", "0"], "--t-max must be greater than t0 = 0, not 0"),
        (["simulate", "--noise", "-1"], "--noise must be a finite number >= 0, not -1.0"),
        (["stability", "--beta", "inf"], "--beta must be a finite number, not inf"),
        (["stability", "--beta", "4", "--max-mode", "0"], "--max-mode must be >= 1, not 0"),
        (["phase-diagram", "--dims", "1", "--out", "{tmp}/p"], "--dims must be a non-empty list"),
    ],
)
def test_the_cli_names_the_flag(tmp_path, capsys, args, line):
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    if args[0] == "simulate":
        args += ["--out", str(tmp_path / "sim")]
    code, _out, err = run_cli(args, capsys)
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("tokenfield: error: ")
    assert line in err, err
    assert not (tmp_path / "sim").exists()


def test_json_on_table_commands(tmp_path, capsys):
    run = tmp_path / "sim"
    code, _out, err = run_cli(
        ["simulate", "--n", "6", "--dim", "3", "--t-max", "0.4", "--dt", "0.1", "--out", run],
        capsys,
    )
    assert code == 0, err
    code, out, err = run_cli(
        ["analyze", run, "--json", "--no-figures", "--permutations", "5"], capsys
    )
    assert code == 0, err
    data = json.loads(out)  # stdout is only JSON
    assert data["kind"] == "simulation" and data["rows"][0]["measure"]
    assert "wrote" in err and "wrote" not in out
    code, out, _err = run_cli(["stability", "--beta", "4", "--json"], capsys)
    assert code == 0 and json.loads(out)["k_max"] >= 1


def test_conformance_json_is_the_written_json(tmp_path, capsys):
    out = tmp_path / "c"
    code, stdout, err = run_cli(
        ["conformance", "--only", "equiangular", "--quick", "--out", out, "--json"], capsys
    )
    assert code == 0, err
    printed = json.loads(stdout)
    assert printed == json.loads((out / "conformance.json").read_text())
    assert printed["items"][0]["name"] == "equiangular" and "wrote" in err

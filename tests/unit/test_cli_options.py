"""What the commands share (cli/_options.py), the one device parser, and library
errors that name parameters while the CLI names flags."""

from __future__ import annotations

import json

import pytest
import torch

from tokenfield._device import parse_device
from tokenfield.cli import main
from tokenfield.cli._options import flag_for, limit_threads, numbers, user_error
from tokenfield.errors import ParameterError, UserError


def run_cli(args, capsys):
    try:
        main([str(a) for a in args])
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# --- the number-list parser ------------------------------------------------------


def test_numbers_lists_and_ranges():
    assert numbers("1,2,4", "--betas") == [1.0, 2.0, 4.0]
    assert numbers("1:4", "--betas") == [1.0, 2.0, 3.0, 4.0]
    assert numbers("0:1:3", "--betas") == [0.0, 0.5, 1.0]
    assert numbers("8, 15", "--layers", integer=True, ranges=False) == [8, 15]
    with pytest.raises(UserError, match="--alpha must be numbers separated by commas"):
        numbers("1:2", "--alpha", ranges=False)
    with pytest.raises(UserError, match="--n must be integers"):
        numbers("1.5,2", "--n", integer=True)
    with pytest.raises(UserError, match="no finite values"):
        numbers("nan", "--betas")


def test_limit_threads_restores_the_count_even_on_error():
    before = torch.get_num_threads()
    inside = 2 if before != 2 else 1  # a count other than the current one
    with pytest.raises(RuntimeError), limit_threads(inside):
        assert torch.get_num_threads() == inside
        raise RuntimeError("boom")
    assert torch.get_num_threads() == before


# --- one device parser -----------------------------------------------------------


def test_one_device_parser_for_models_and_the_simulator():
    assert parse_device("cpu") == torch.device("cpu")
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert parse_device("auto").type == expected
    assert parse_device("AUTO").type == expected
    for bad in ("tpu", "cuda:x", "mps", ""):
        with pytest.raises(ParameterError, match="unknown device"):
            parse_device(bad)


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


# --- library errors name parameters, the CLI names flags -------------------------


def test_library_errors_name_the_parameter():
    from tokenfield.meanfield.stability import stability_spectrum
    from tokenfield.particles import Dynamics, simulate
    from tokenfield.particles.init import initial_condition

    with pytest.raises(ParameterError, match=r"^beta must be finite, not nan; pass a finite beta"):
        Dynamics(beta=float("nan"))
    x0 = initial_condition("uniform", 4, 2)
    with pytest.raises(ParameterError, match=r"the step must be dt > 0.*pass a positive dt\."):
        simulate(Dynamics(beta=1.0), x0, t_max=1.0, dt=0.0)
    with pytest.raises(ParameterError, match=r"^t_max must be greater than t0"):
        simulate(Dynamics(beta=1.0), x0, t_max=-1.0, dt=0.1)
    with pytest.raises(ParameterError, match=r"^noise must be a finite number >= 0"):
        initial_condition("uniform", 4, 2, noise=-1.0)
    with pytest.raises(ParameterError, match=r"^beta must be a finite number"):
        stability_spectrum(float("inf"), dim=2)
    error = ParameterError("n_particles", "{name} must be >= 1, not 0", "pass {name} 1")
    assert str(error) == "n_particles must be >= 1, not 0; pass n_particles 1."
    assert user_error(error).one_line() == "--n must be >= 1, not 0; pass --n 1."
    assert flag_for("t_max") == "--t-max" and flag_for("normalization") == "--dynamics"


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


# --- --json on commands that print a table ---------------------------------------


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


def test_trace_options_are_checked_once_in_the_library(tmp_path, capsys):
    from tokenfield.models.trace import check_trace_options

    with pytest.raises(ParameterError, match=r"^unknown positions 'middle'; use 'last' or 'all'"):
        check_trace_options(positions="middle")
    with pytest.raises(ParameterError, match=r"^batch_size must be at least 1, got 0"):
        check_trace_options(batch_size=0)
    with pytest.raises(ParameterError, match="steer all positions: pass steer_positions all"):
        check_trace_options(generate=2, steer_positions="last")
    code, _out, err = run_cli(["trace", "--batch-size", "0", "--out", tmp_path / "t"], capsys)
    assert code == 2 and "--batch-size must be at least 1, got 0; pass e.g. --batch-size 8" in err
    assert not (tmp_path / "t").exists()  # refused before the model is loaded

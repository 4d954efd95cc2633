"""What the commands share (cli/_options.py), the one device parser, and library
errors that name parameters while the CLI names flags."""

from __future__ import annotations

import pytest
import torch

from tests._cli import run_cli
from tokenfield._device import parse_device
from tokenfield.cli._options import flag_for, limit_threads, numbers, user_error
from tokenfield.errors import ParameterError, UserError

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
    assert (
        user_error(error).one_line() == "--n-particles must be >= 1, not 0; pass --n-particles 1."
    )
    assert flag_for("t_max") == "--t-max" and flag_for("normalization") == "--normalization"


# --- --json on commands that print a table ---------------------------------------


def test_trace_options_are_checked_once_in_the_library(tmp_path, capsys):
    from tokenfield.models.trace_config import TraceConfig

    with pytest.raises(ParameterError, match=r"^unknown positions 'middle'; use 'last' or 'all'"):
        TraceConfig(["x"], positions="middle")
    with pytest.raises(ParameterError, match=r"^batch_size must be at least 1, got 0"):
        TraceConfig(["x"], batch_size=0)
    with pytest.raises(ParameterError, match="steer all positions: pass steer_positions all"):
        TraceConfig(["x"], generate=2, steer=(object(), 1.0, "last"))
    code, _out, err = run_cli(["trace", "--batch-size", "0", "--out", tmp_path / "t"], capsys)
    assert code == 2 and "--batch-size must be at least 1, got 0; pass e.g. --batch-size 8" in err
    assert not (tmp_path / "t").exists()  # refused before the model is loaded

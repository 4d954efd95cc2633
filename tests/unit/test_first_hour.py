"""Issue 21, "the first hour": what a newcomer running the docs trips on.

Each test drives the real command (``tokenfield.cli.main``) and checks what the
reader sees: the message, the numbers printed, the files written. No model is
loaded.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from tests._cli import run_cli
from tests.unit.synthetic_trajectories import trace_dataset, write_run
from tokenfield.meanfield.stability import k_max_curve, stability_spectrum


def one_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("tokenfield: error: "), err
    return lines[0]


# --- docs/simulator.md: --init run:... --dim on a last-token run -------------------


def test_init_dim_on_a_last_token_run_says_trace_with_positions_all(tmp_path, capsys):
    """The run of docs/simulator.md's old example (one token per prompt): the fix
    must be one that works (trace with --positions all), never "--dim 1 or less"."""
    states = np.random.default_rng(0).normal(size=(4, 3, 32))
    ds = trace_dataset(states, ["a", "b", "c"])  # prompt_index 0, 1, 2: one token each
    ds.attrs["run"]["config"]["positions"] = "last"
    run = write_run(tmp_path / "spectrum", ds)
    code, _out, err = run_cli(
        ["simulate", "--init", f"run:{run}@3", "--dim", "16", "--out", tmp_path / "s"], capsys
    )
    assert code == 2
    line = one_error_line(err)
    assert "has one token" in line and "--positions last" in line
    assert "--positions all" in line
    assert "or less" not in line
    assert not (tmp_path / "s").exists()


# --- docs/meanfield.md: stability --out DIR, and l_max for d >= 3 -----------------


def test_stability_out_dir_writes_name_json_and_figures(tmp_path, capsys):
    out = tmp_path / "mf"
    code, stdout, err = run_cli(
        ["stability", "--dim", "3", "--beta", "25", "--out", f"{out}/"], capsys
    )
    assert code == 0, err
    data = json.loads((out / "stability.json").read_text())
    assert data["beta"] == 25 and data["dim"] == 3
    assert sorted(p.name for p in (out / "figures").iterdir()) == [
        "growth_rates.png",
        "growth_rates.svg",
    ]
    # the figure-file form still works
    code, _stdout, err = run_cli(
        ["stability", "--beta-range", "1:9", "--out", tmp_path / "k.png"], capsys
    )
    assert code == 0, err
    assert (tmp_path / "k.png").stat().st_size > 0


@pytest.mark.parametrize("dim", [3, 8])
def test_stability_prints_l_max_and_the_sphere_law_for_d_at_least_3(dim, capsys):
    beta = 25.0
    code, stdout, err = run_cli(["stability", "--dim", dim, "--beta", beta], capsys)
    assert code == 0, err
    last = stdout.strip().splitlines()[-1]
    nu = dim / 2 - 1
    law = math.sqrt(2 * beta + nu * nu) - nu
    spectrum = stability_spectrum(beta, dim=dim)
    assert last.startswith(f"l_max = {spectrum.k_max} "), last
    assert f"sqrt(2 beta + nu^2) - nu = {law:.3f}" in last
    assert "k_max" not in stdout and "sqrt(2 beta) =" not in stdout


def test_stability_on_the_circle_still_says_k_max(capsys):
    code, stdout, err = run_cli(["stability", "--dim", "2", "--beta", "25"], capsys)
    assert code == 0, err
    assert stdout.strip().splitlines()[-1] == f"k_max = 7   sqrt(2 beta) = {math.sqrt(50):.3f}"


def test_the_sphere_law_is_within_one_of_the_exact_l_max():
    """The docs' formula, checked against the exact maximiser (for d >= 3 the
    circle's sqrt(2 beta) is off by up to nu)."""
    betas = np.array([4.0, 16.0, 64.0, 100.0, 400.0])
    for dim in (3, 8, 32):
        curve = k_max_curve(betas, dim=dim)
        assert np.all(np.abs(curve.k_max - curve.large_beta_mode) <= 1), (dim, curve.to_dict())
    # where the simpler law is wrong, the printed one is right
    curve = k_max_curve([100.0], dim=32)
    assert abs(curve.k_max[0] - curve.sqrt_2beta[0]) > 5


def test_multiplicities_never_overflow(capsys):
    """d = 32, beta = 100 printed a multiplicity of -9223372036854775808 (int64 overflow)."""
    from tokenfield.meanfield.stability import harmonic_dimension

    assert harmonic_dimension([0, 1, 2, 3], 3).tolist() == [1, 3, 5, 7]  # 2l + 1
    assert harmonic_dimension([0, 1, 2, 3], 4).tolist() == [1, 4, 9, 16]  # (l + 1)^2
    big = harmonic_dimension([69], 32).tolist()[0]
    assert big == math.comb(69 + 31, 69) - math.comb(69 + 29, 67) > 2**63
    code, stdout, err = run_cli(["stability", "--dim", "32", "--beta", "100"], capsys)
    assert code == 0, err
    assert "-9223372036854775808" not in stdout and "RuntimeWarning" not in err


# --- torch threads on a busy machine -----------------------------------------------


def test_threads_follow_the_idle_cores():
    from tokenfield._threads import idle_cores

    assert idle_cores(16, 0.2) == 16  # an idle machine: torch's own default
    assert idle_cores(16, 8.6) == 7
    assert idle_cores(2, 0.4) == 2
    assert idle_cores(2, 0.6) == 1  # another job on one core: do not share it
    assert idle_cores(2, 6.0) == 1  # never fewer than one
    assert idle_cores(4, float("nan")) == 4


def test_configure_threads_respects_explicit_settings():
    from tokenfield._threads import configure_threads
    from tokenfield.errors import UserError

    env = {}
    assert configure_threads(env, cores=2, load=5.0) == 1
    assert env["OMP_NUM_THREADS"] == "1"
    env = {}
    assert configure_threads(env, cores=8, load=0.0) == 8
    env = {"OMP_NUM_THREADS": "3"}
    assert configure_threads(env, cores=2, load=5.0) is None
    assert env == {"OMP_NUM_THREADS": "3"}  # the user's choice, untouched
    env = {"TOKENFIELD_THREADS": "4", "OMP_NUM_THREADS": "3"}
    assert configure_threads(env, cores=2, load=5.0) == 4  # tokenfield's own setting wins
    assert env["OMP_NUM_THREADS"] == "4"
    env = {"TOKENFIELD_THREADS": "auto"}
    assert configure_threads(env, cores=4, load=1.0) == 3
    for bad in ("0", "-2", "many"):
        with pytest.raises(UserError, match="TOKENFIELD_THREADS"):
            configure_threads({"TOKENFIELD_THREADS": bad}, cores=2, load=0.0)


THREADS_PROBE = """
from tokenfield.cli import main
from tokenfield.cli._app import app

@app.command("probe-threads")
def probe():
    import torch
    print("threads", torch.get_num_threads())

main(["probe-threads"])
"""


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"TOKENFIELD_THREADS": "1"}, 1),
        ({"TOKENFIELD_THREADS": "2"}, 2),
        ({"OMP_NUM_THREADS": "2", "TOKENFIELD_THREADS": "auto"}, 2),
        ({"OMP_NUM_THREADS": "2", "TOKENFIELD_THREADS": "1"}, 1),
    ],
)
def test_the_command_sets_torch_threads_before_torch_loads(env, expected):
    """The real start-up path, in a fresh interpreter: torch sees the choice."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    src = Path(__file__).resolve().parents[2] / "src"
    clean = {
        k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "TOKENFIELD_THREADS")
    }
    result = subprocess.run(
        [sys.executable, "-c", THREADS_PROBE],
        env={**clean, **env, "PYTHONPATH": str(src)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["threads", str(expected)]


def test_a_bad_threads_setting_is_one_line():
    import os
    import subprocess
    import sys
    from pathlib import Path

    src = Path(__file__).resolve().parents[2] / "src"
    clean = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    result = subprocess.run(
        [sys.executable, "-c", "from tokenfield.cli import main; main(['models'])"],
        env={**clean, "TOKENFIELD_THREADS": "lots", "PYTHONPATH": str(src)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert "TOKENFIELD_THREADS='lots' is not a number of threads" in one_error_line(result.stderr)

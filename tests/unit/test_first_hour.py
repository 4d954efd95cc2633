"""Issue 21, "the first hour": what a newcomer running the docs trips on.

Each test drives the real command (``tokenfield.cli.main``) and checks what the
reader sees: the message, the numbers printed, the files written. No model is
loaded.
"""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest

from tests._cli import one_error_line, run_cli
from tests.unit.synthetic_trajectories import trace_dataset, write_run
from tokenfield.meanfield.stability import k_max_curve, stability_spectrum

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
    # every *_NUM_THREADS removed: torch also obeys MKL_NUM_THREADS, which was 1 in a
    # full-suite run's environment and capped the probe at 1 thread
    clean = {
        k: v
        for k, v in os.environ.items()
        if not k.endswith("_NUM_THREADS") and k != "TOKENFIELD_THREADS"
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


# --- figures: steered paths draw the run's layers, in colours that show on white -----


def _contrast_with_white(colour) -> float:
    """WCAG contrast ratio of an RGB(A) colour against white."""

    def channel(c: float) -> float:
        return c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4

    r, g, b = (channel(float(c)) for c in colour[:3])
    luminance = 0.2126 * r + 0.7152 * g + 0.0722 * b
    return 1.05 / (luminance + 0.05)


def _loop(n_time: int = 31):
    rng = np.random.default_rng(0)
    paths = np.cumsum(rng.normal(size=(n_time, 4, 2)), axis=0)
    return {
        "reference": {"paths": paths.tolist(), "category": ["A", "A", "B", "B"]},
        "unsteered": {"paths": paths[:, :1].tolist()},
        "paths": {
            "steer": {a: (paths[:, :1] + i).tolist() for i, a in enumerate(["0.5", "1.0", "2.0"])}
        },
        "explained_variance_ratio": [0.5, 0.2],
        "source": "A",
        "target": "B",
        "layer": 15,
    }


@pytest.mark.parametrize(("times", "drawn"), [("seed", 30), ("all", 31)])
def test_steered_paths_draw_the_layers_the_runs_figures_draw(times, drawn):
    from tokenfield.viz.steering import plot_steered_paths

    ax = plot_steered_paths(_loop(31), times=times)
    lengths = {len(line.get_xdata()) for line in ax.lines if len(line.get_xdata()) > 2}
    assert lengths == {drawn}
    assert f"layers 0..{drawn - 1}" in ax.get_title()


def test_steer_reads_the_runs_time_convention(tmp_path):
    from tokenfield.pipelines.steer import time_convention

    assert time_convention(tmp_path) == "seed"  # not analysed yet: analyze's default
    (tmp_path / "metrics.json").write_text(json.dumps({"options": {"times": "all"}}))
    assert time_convention(tmp_path) == "all"


def test_lines_on_white_are_never_yellow():
    import xarray as xr

    from tokenfield.viz._common import particle_colors
    from tokenfield.viz.steering import plot_steered_paths

    ax = plot_steered_paths(_loop())
    steered = [line for line in ax.lines if str(line.get_label()).startswith("alpha=")]
    assert len(steered) == 3
    for line in steered:
        assert _contrast_with_white(line.get_color()) > 2.5, line.get_label()
    pcs = xr.DataArray(np.zeros((2, 12, 2)), dims=("time", "particle", "component"))
    colours, _legend = particle_colors(pcs)  # a simulation: no categories
    assert min(_contrast_with_white(c) for c in colours) > 2.5


# --- progress of analyze, report --overlay and metastability ------------------------


def test_long_commands_report_their_stages(tmp_path):
    """What the progress line shows, stage by stage (the line itself is drawn only
    on a terminal; here the stages are collected)."""
    from tests.unit.synthetic_trajectories import clustered
    from tokenfield._progress import Stages
    from tokenfield.meanfield.metastability import metastability
    from tokenfield.pipelines.analyze import analyze_run
    from tokenfield.pipelines.report import write_report

    states, labels = clustered(n_per_category=2, n_time=6, n_feature=16)
    run = write_run(tmp_path / "run", trace_dataset(states, labels))
    other = write_run(tmp_path / "other", trace_dataset(states[::-1].copy(), labels))
    with Stages("analysing", enabled=False) as stages:
        analyze_run(run, n_permutations=5)
    assert stages.seen[0] == "measuring" and "figures" in stages.seen
    assert stages.seen[-1] == "writing metrics.json"
    assert any("thought_evolution.gif" in s for s in stages.seen)
    with Stages("report", enabled=False) as stages:
        write_report([run], tmp_path / "r.html", overlays=[f"{other}:mirror"])
    assert stages.seen == [
        "run: reading",
        "run: trajectory views",
        "overlay mirror: projecting into run's frame",
        "writing the page",
    ]
    with Stages("simulating", total=2, enabled=False) as stages:
        metastability([2.0, 3.0], k=2, dim=2, per_cap=2, seeds=1, t_cap=5.0)
    assert stages.seen == ["beta = 2", "beta = 3"]


def test_stages_are_silent_outside_a_command_and_off_a_terminal(tmp_path, capsys):
    from tokenfield._progress import stage

    stage("nobody listens")  # the library alone: no error, no output
    states = np.random.default_rng(0).normal(size=(4, 4, 8))
    run = write_run(tmp_path / "run", trace_dataset(states, ["a", "a", "b", "b"]))
    code, out, err = run_cli(["analyze", run, "--permutations", "5"], capsys)
    assert code == 0, err
    assert "measuring" not in err and "measuring" not in out  # stderr is not a terminal here


# --- cosmetics: slider labels, figure names, the steer table's progress ---------------


def test_time_slider_labels_are_evenly_spaced():
    from tokenfield.report.interactive import even_steps
    from tokenfield.report.simulation import simulation_figures

    times = np.arange(201) * 0.02  # 0 .. 4, saved every 0.02
    states = np.random.default_rng(0).normal(size=(201, 6, 3))
    states /= np.linalg.norm(states, axis=-1, keepdims=True)
    figure = simulation_figures(states, times, None)[0]
    labels = [float(step["label"]) for step in figure["layout"]["sliders"][0]["steps"]]
    assert labels[0] == 0 and labels[-1] == 4 and len(labels) <= 80
    gaps = np.round(np.diff(labels), 9)
    assert len(set(gaps[:-1].tolist())) == 1  # one stride; only the last step may be shorter
    assert gaps[-1] <= gaps[0]
    assert even_steps(10, 60) == list(range(10))
    assert even_steps(31, 4) == [0, 10, 20, 30]


def test_growth_fit_figures_say_which_beta(tmp_path, capsys):
    args = ["predict-clusters", "--betas", "1,4", "--n", "32", "--seeds", "1", "--growth-rates"]
    code, _out, err = run_cli([*args, "--out", tmp_path], capsys)
    assert code == 0, err
    names = sorted(p.stem for p in (tmp_path / "figures").glob("growth_fit_*.png"))
    assert names and all(re.fullmatch(r"growth_fit_(sa|usa)_beta(1|4)", n) for n in names), names
    assert not any(re.fullmatch(r"growth_fit_\d+", n) for n in names)


def test_steer_explains_progress_under_its_table():
    from tokenfield.cli.steer_cmd import PROGRESS_NOTE

    assert "At alpha = 1" in PROGRESS_NOTE and "below 1" in PROGRESS_NOTE
    assert "1 - d(steered, target centroid) / d(unsteered, target centroid)" in PROGRESS_NOTE

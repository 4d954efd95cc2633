"""``tokenfield simulate``: a tiny run end to end, and bad input."""

from __future__ import annotations

import json

import numpy as np
import pytest
import xarray as xr

from tokenfield.cli import main


def _run(argv):
    try:
        main(argv)
    except SystemExit as exc:
        return exc.code
    return 0


def test_simulate_writes_a_plain_xarray_run(tmp_path, capsys):
    out = tmp_path / "sim"
    argv = [
        "simulate", "--dynamics", "usa", "--dim", "3", "--n", "12", "--beta", "2",
        "--t-max", "1", "--dt", "0.1", "--integrator", "rk4", "--init", "uniform",
        "--seed", "5", "--save-every", "2", "--out", str(out),
    ]  # fmt: skip
    assert _run(argv) == 0
    ds = xr.open_zarr(out / "trajectory.zarr")
    assert ds.states.dims == ("time", "particle", "feature")
    assert ds.states.shape == (6, 12, 3)
    assert np.allclose(ds.time.values, [0, 0.2, 0.4, 0.6, 0.8, 1.0])
    assert ds.particle.values.tolist() == list(range(12))
    assert np.abs(np.linalg.norm(ds.states.values, axis=-1) - 1).max() < 1e-12
    info = json.loads((out / "run.json").read_text())
    assert info["kind"] == "simulation" and info["status"] == "complete"
    assert info["config"]["dynamics"]["normalization"] == "usa"
    assert info["config"]["dynamics"]["time"] == "paper"
    assert info["config"]["init"]["spec"] == "uniform"
    # the same command again: nothing to do, same data
    before = ds.states.values.copy()
    assert _run(argv) == 0
    assert np.array_equal(xr.open_zarr(out / "trajectory.zarr").states.values, before)


def test_simulate_float32_and_options(tmp_path):
    out = tmp_path / "f32"
    argv = [
        "simulate", "--dim", "4", "--n", "4", "--init", "orthogonal", "--dtype", "float32",
        "--t-max", "0.5", "--dt", "0.25", "--causal", "--time", "rescaled", "--matrices",
        "gaussian", "--heads", "2", "--out", str(out),
    ]  # fmt: skip
    assert _run(argv) == 0
    ds = xr.open_zarr(out / "trajectory.zarr")
    assert ds.states.dtype == np.float32 and ds.states.shape == (3, 4, 4)
    config = json.loads((out / "run.json").read_text())["config"]
    assert config["dynamics"]["heads"] == 2 and config["dynamics"]["causal"] is True


@pytest.mark.parametrize(
    "bad",
    [
        ["--beta", "nan"],
        ["--beta", "inf"],
        ["--n", "0"],
        ["--dim", "1"],
        ["--dt", "0"],
        ["--dt", "-0.1"],
        ["--t-max", "0"],
        ["--init", "orthogonal", "--n", "5", "--dim", "3"],
        ["--init", "spiral"],
        ["--init", "run:/nonexistent/run"],
        ["--integrator", "leapfrog"],
        ["--dynamics", "softmax"],
        ["--dtype", "float16"],
        ["--device", "cuda:7"],
        ["--save-every", "0"],
        ["--noise", "-1"],
    ],
)
def test_bad_input_exits_2_with_one_line_and_writes_nothing(tmp_path, capsys, bad):
    out = tmp_path / "never"
    code = _run(["simulate", "--t-max", "0.2", "--dt", "0.1", "--out", str(out), *bad])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1 and err.startswith("tokenfield: error:"), err
    assert not out.exists()

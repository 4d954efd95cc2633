"""Integrators: measured order, the equiangular reference solution, saving, runs."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import xarray as xr
from scipy.integrate import solve_ivp

from tokenfield.particles import Adaptive, Dynamics, SaveAt, simulate
from tokenfield.particles import integrate as integrate_module
from tokenfield.particles.init import orthogonal, uniform
from tokenfield.runs import open_run, read_run_info

TOL = {
    "euler_order": (0.9, 1.15),
    "rk4_order": (3.7, 4.3),
    "adaptive": 1e-7,  # vs the fine reference, rtol = 1e-9
    "equiangular_spread": 1e-12,  # spread of the pairwise inner products
    "equiangular_ode": 1e-9,  # rho(t) from the particles vs solve_ivp of the scalar ODE
    "derivation": 1e-13,  # d<x_i, x_k>/dt from the field vs the scalar ODE's right side
}


def _final(dyn, x0, dt, solver, t_max=1.0):
    ds = simulate(dyn, x0, t_max=t_max, dt=dt, solver=solver, saveat=SaveAt(times=[t_max]))
    return ds.states.values[-1]


def _slope(dts, errors):
    return float(np.polyfit(np.log(dts), np.log(errors), 1)[0])


@pytest.mark.parametrize(
    ("solver", "dts", "band"),
    [
        ("euler", [1 / 10, 1 / 20, 1 / 40, 1 / 80], TOL["euler_order"]),
        ("rk4", [1 / 5, 1 / 10, 1 / 20, 1 / 40], TOL["rk4_order"]),
    ],
)
@pytest.mark.parametrize("normalization", ["sa", "usa"])
def test_measured_convergence_order(solver, dts, band, normalization):
    dyn = Dynamics(beta=1.5, normalization=normalization)
    x0 = uniform(8, 3, seed=4)
    reference = _final(dyn, x0, 1 / 1024, "rk4")
    errors = [np.abs(_final(dyn, x0, dt, solver) - reference).max() for dt in dts]
    slope = _slope(dts, errors)
    assert band[0] < slope < band[1], (errors, slope)


def test_adaptive_matches_the_fine_reference():
    dyn = Dynamics(beta=2.0, normalization="sa")
    x0 = uniform(8, 3, seed=5)
    reference = _final(dyn, x0, 1 / 1024, "rk4", t_max=2.0)
    adaptive = _final(dyn, x0, 0.3, Adaptive(rtol=1e-9, atol=1e-12), t_max=2.0)
    assert np.abs(adaptive - reference).max() < TOL["adaptive"]


def equiangular_rate(rho, beta, n, normalization):
    """d rho / dt for n equiangular unit vectors with <x_i, x_j> = rho (i != j), Q = K = V = I.

    From dx_i/dt = sum_j w_ij (x_j - <x_i, x_j> x_i):
        <dx_i/dt, x_k> = sum_j w_ij (<x_j, x_k> - <x_i, x_j> <x_i, x_k>)
    j = i contributes 0, j = k gives w (1 - rho^2), each of the n - 2 others w (rho - rho^2),
    with w = exp(beta rho) / Z. Adding the symmetric term <x_i, dx_k/dt>:
        rho' = 2 exp(beta rho) (1 - rho) (1 + (n - 1) rho) / Z,
        Z = n (USA),   Z = e^beta + (n - 1) e^{beta rho} (SA).
    """
    z = n if normalization == "usa" else math.exp(beta) + (n - 1) * math.exp(beta * rho)
    return 2 * math.exp(beta * rho) * (1 - rho) * (1 + (n - 1) * rho) / z


@pytest.mark.parametrize("normalization", ["sa", "usa"])
def test_equiangular_derivation_against_the_field(normalization):
    """The scalar ODE's right side equals d<x_i, x_k>/dt computed from the particle field."""
    n, beta = 5, 1.3
    for rho in (0.0, 0.2, 0.7):
        x = torch.zeros(n, n + 1, dtype=torch.float64)
        x[:, :n] = math.sqrt(1 - rho) * torch.eye(n, dtype=torch.float64)
        x[:, n] = math.sqrt(rho)
        f = Dynamics(beta=beta, normalization=normalization).vector_field(0, x)
        rate = f @ x.T + x @ f.T  # (n, n): d<x_i, x_k>/dt
        off = rate[~torch.eye(n, dtype=torch.bool)]
        expected = equiangular_rate(rho, beta, n, normalization)
        assert (off - expected).abs().max() < TOL["derivation"]


@pytest.mark.parametrize("normalization", ["sa", "usa"])
def test_equiangular_solution_follows_the_scalar_ode(normalization):
    """Theorem 6.8 of Geshkovski-Letrouit-Polyanskiy-Rigollet (arXiv 2312.10794): from
    orthogonal tokens the particles stay equiangular, rho(t) solving the scalar ODE."""
    n, d, beta, t_max = 5, 7, 2.0, 3.0
    times = np.linspace(0, t_max, 7)
    ds = simulate(
        Dynamics(beta=beta, normalization=normalization),
        orthogonal(n, d, seed=1),
        t_max=t_max,
        dt=0.005,
        solver="rk4",
        saveat=SaveAt(times=times),
    )
    x = ds.states.values  # (time, n, d)
    gram = np.einsum("tid,tjd->tij", x, x)
    off = gram[:, ~np.eye(n, dtype=bool)]  # (time, n(n-1))
    assert np.ptp(off, axis=1).max() < TOL["equiangular_spread"]
    ode = solve_ivp(
        lambda t, r: [equiangular_rate(r[0], beta, n, normalization)],
        (0, t_max),
        [0.0],
        t_eval=times,
        rtol=1e-12,
        atol=1e-14,
        method="DOP853",
    )
    assert np.abs(off.mean(axis=1) - ode.y[0]).max() < TOL["equiangular_ode"]
    assert off.mean(axis=1)[-1] > 0.5  # the particles did cluster


def test_saveat_every_and_times():
    dyn = Dynamics(beta=1.0)
    x0 = uniform(6, 3, seed=0)
    every = simulate(dyn, x0, t_max=1.0, dt=0.1, saveat=SaveAt(every=3))
    assert np.allclose(every.time.values, [0, 0.3, 0.6, 0.9, 1.0])
    times = simulate(
        dyn, x0, t_max=1.0, dt=0.1, solver="rk4", saveat=SaveAt(times=[0.25, 0.5, 1.0])
    )
    assert np.allclose(times.time.values, [0.25, 0.5, 1.0])
    adaptive = simulate(
        dyn, x0, t_max=1.0, dt=0.1, solver="adaptive", saveat=SaveAt(times=[0.33, 1.0])
    )
    assert np.allclose(adaptive.time.values, [0.33, 1.0])
    assert list(every.states.dims) == ["time", "particle", "feature"]
    assert every.particle.values.tolist() == list(range(6))


def test_batch_equals_systems_one_by_one():
    dyn = Dynamics(beta=2.0, normalization="usa")
    x0 = uniform(7, 3, seed=2, batch=3)
    together = simulate(dyn, x0, t_max=1.0, dt=0.1, solver="rk4")
    assert together.states.dims == ("system", "time", "particle", "feature")
    for s in range(3):
        alone = simulate(dyn, x0[s], t_max=1.0, dt=0.1, solver="rk4")
        assert np.abs(together.states.values[s] - alone.states.values).max() < 1e-14


def test_streamed_run_resumes_exactly(tmp_path, monkeypatch):
    monkeypatch.setattr(integrate_module, "FLUSH_BYTES", 1)  # append every saved frame
    dyn = Dynamics(beta=3.0, normalization="sa")
    x0 = uniform(10, 3, seed=3)
    kwargs = {"t_max": 2.0, "dt": 0.05, "solver": "rk4", "saveat": SaveAt(every=4)}
    whole = simulate(dyn, x0, **kwargs)

    class Stop(Exception):
        pass

    def interrupt(t):
        if t > 1.0:
            raise Stop

    out = tmp_path / "run"
    with pytest.raises(Stop):
        simulate(dyn, x0, out=out, progress=interrupt, **kwargs)
    assert read_run_info(out).status == "partial"
    resumed = simulate(dyn, x0, out=out, **kwargs)
    assert read_run_info(out).status == "complete"
    plain = xr.open_zarr(out / "trajectory.zarr")
    assert np.array_equal(plain.time.values, whole.time.values)
    assert np.array_equal(plain.states.values, whole.states.values)
    assert np.array_equal(resumed.states.values, whole.states.values)
    assert open_run(out).attrs["run"]["kind"] == "simulation"


def test_adaptive_run_resumes_exactly(tmp_path, monkeypatch):
    monkeypatch.setattr(integrate_module, "FLUSH_BYTES", 1)
    dyn = Dynamics(beta=2.0, normalization="usa")
    x0 = uniform(6, 3, seed=1)
    kwargs = {"t_max": 3.0, "dt": 0.1, "solver": Adaptive(rtol=1e-7), "saveat": SaveAt(every=2)}
    whole = simulate(dyn, x0, **kwargs)
    calls = []

    def interrupt(t):
        calls.append(t)
        if len(calls) == 5:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        simulate(dyn, x0, out=tmp_path / "a", progress=interrupt, **kwargs)
    resumed = simulate(dyn, x0, out=tmp_path / "a", **kwargs)
    assert np.array_equal(resumed.time.values, whole.time.values)
    assert np.array_equal(resumed.states.values, whole.states.values)


def test_unstable_step_is_reported():
    from tokenfield.errors import UserError

    dyn = Dynamics(beta=5.0, normalization="usa", state="free")
    with pytest.raises(UserError, match="non-finite"):
        simulate(dyn, uniform(8, 3), t_max=200.0, dt=1.0)

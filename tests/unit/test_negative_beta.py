"""Negative beta (repulsive attention weights) in the simulator, the stability
formulas and the sweeps."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.integrate import solve_ivp

from tokenfield.meanfield.stability import discrete_growth_rates, growth_rates
from tokenfield.particles import Dynamics, SaveAt, simulate


def _circle(theta):
    theta = np.asarray(theta, dtype=np.float64)
    return np.stack([np.cos(theta), np.sin(theta)], axis=-1)


def _angle(x):
    return np.arctan2(x[..., 1], x[..., 0])


@pytest.mark.parametrize("normalization", ["usa", "sa"])
@pytest.mark.parametrize("beta", [-3.0, -0.5])
def test_two_particles_follow_their_scalar_ode_for_negative_beta(normalization, beta):
    """Two tokens on the circle at angle theta apart: each moves toward the other at
    e^{beta cos theta} sin theta / Z (Z = 2 USA, e^beta + e^{beta cos theta} SA), so
    theta' = -2 e^{beta cos theta} sin theta / Z. The simulator (RK4) must follow the
    independent scipy solution of this ODE for beta < 0."""

    def rhs(_t, y):
        theta = y[0]
        z = 2.0 if normalization == "usa" else math.exp(beta) + math.exp(beta * math.cos(theta))
        return [-2 * math.exp(beta * math.cos(theta)) * math.sin(theta) / z]

    theta0, t_max = 2.6, 4.0
    times = np.linspace(0, t_max, 9)
    ref = solve_ivp(rhs, (0, t_max), [theta0], t_eval=times, rtol=1e-12, atol=1e-12).y[0]
    ds = simulate(
        Dynamics(beta=beta, normalization=normalization),
        _circle([0.0, theta0]),
        t_max=t_max,
        dt=0.005,
        solver="rk4",
        saveat=SaveAt(times=tuple(times)),
    )
    x = ds.states.values
    gap = np.abs(np.angle(np.exp(1j * (_angle(x[:, 1]) - _angle(x[:, 0])))))
    assert np.abs(gap - ref).max() < 1e-8
    assert ref[-1] < 0.5 * theta0  # the pair really moved (the check can fail)


@pytest.mark.parametrize(("beta", "stable"), [(-1.0, True), (-3.0, True), (-0.5, False)])
def test_the_equilateral_triangle_is_stable_below_minus_two_thirds(beta, stable):
    """n = 3 equispaced on the circle: the only non-trivial mode k = 1 has rate
    lambda_1^(3)(beta) < 0 exactly when beta < -2/3 (Polyanskiy-Rigollet-Yao's threshold
    for the failure of synchronisation). A perturbed triangle simulated with the same
    beta relaxes back (stable) or collapses to one cluster (unstable), as the rate says."""
    rate = discrete_growth_rates([1], beta, 3)[0]
    assert (rate < 0) == stable
    rng = np.random.default_rng(0)
    theta = 2 * np.pi * np.arange(3) / 3 + 0.05 * rng.standard_normal(3)
    ds = simulate(
        Dynamics(beta=beta, normalization="usa"),
        _circle(theta),
        t_max=40.0,
        dt=0.02,
        solver="rk4",
        saveat=SaveAt(times=(0.0, 40.0)),
    )
    final = ds.states.values[-1]
    gram = final @ final.T
    off = gram[np.triu_indices(3, 1)]
    if stable:
        assert np.abs(off + 0.5).max() < 1e-3  # back at the equilateral triangle
    else:
        assert off.min() > 0.999  # one cluster


def test_rates_for_negative_beta_have_the_parity_sign():
    """mu_l(-beta) = (-1)^l mu_l(beta): for beta < 0 the odd modes grow and the even
    ones decay, USA and SA, on the circle and on S^2."""
    for dim in (2, 3):
        for normalization in ("usa", "sa"):
            rates = growth_rates(range(1, 9), -4.0, dim=dim, normalization=normalization)
            positive = growth_rates(range(1, 9), 4.0, dim=dim, normalization=normalization)
            sign = np.array([1.0 if k % 2 else -1.0 for k in range(1, 9)])
            assert np.all(np.sign(rates) == sign)
            assert np.allclose(np.abs(rates), np.abs(positive), rtol=1e-12)


def test_the_phase_sweep_runs_negative_beta():
    """The phase-diagram sweep takes beta < 0 (repulsive); at beta = -3 the 3-token
    systems stop short of one cluster (some start in the stable triangle's basin), at
    beta = 1 every system synchronises."""
    from tokenfield.meanfield.phase import PhaseDiagramConfig, phase_diagram

    config = PhaseDiagramConfig(
        dims=(2,), betas=(-3.0, 1.0), t_max=30.0, frames=3, n_particles=3, n_systems=24,
        delta=0.001, dt=0.1,
    )  # fmt: skip
    ds = phase_diagram(config)
    final = ds["merged_probability"].sel(dim=2).values[:, -1]
    assert final[1] > 0.95
    assert final[0] < 0.95

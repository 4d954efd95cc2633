"""The PDE against particle runs as ``n`` grows: ``W1(mu_n(t), rho(t))`` and its rate.

``n`` particles are placed from the PDE's initial density (by quantiles, or
i.i.d. with a seed), simulated with :func:`tokenfield.simulate` (RK4, float64),
and compared with the finite-volume solution at the same times by the exact
circle ``W1`` (:func:`~tokenfield.meanfield.pde.circle_w1`). An empirical
measure of particles is itself a solution of the continuity equation, so the
distance can only come from the start (``W1(mu_n(0), rho_0)``: ``O(1/n)`` for
quantiles, ``O(n^{-1/2})`` i.i.d.), carried forward with a Lipschitz constant,
plus the PDE's own discretisation error (reported as ``W1`` between ``M`` and
``2M`` cells). The fitted rate is the least-squares slope of ``log W1`` against
``log n``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tokenfield.errors import UserError
from tokenfield.meanfield.pde import (
    CirclePDE,
    circle_w1,
    density_w1,
    particles_from_density,
    von_mises_density,
)
from tokenfield.particles import Dynamics, SaveAt, simulate


@dataclass(frozen=True)
class PDEComparison:
    """``W1`` between the PDE and ``n``-particle runs.

    Attributes:
        times: ``(T,)``; ns: ``(N,)``.
        w1: ``(N, T)`` distance (mean over seeds for random sampling).
        w1_spread: ``(N, T)`` standard deviation over seeds (0 for quantiles).
        pde_error: ``(T,)`` ``W1`` between the PDE on ``M`` and ``2M`` cells.
        displacement: ``(T,)`` ``W1(rho(t), rho(0))``: how far the density moved
            (the comparison means something when this is much larger than ``w1``).
        rate: slope of ``log W1`` against ``log n`` at each time ``(T,)``.
        mass_error, min_density: of the ``M``-cell PDE solution.
        config: the settings.
    """

    times: np.ndarray
    ns: np.ndarray
    w1: np.ndarray
    w1_spread: np.ndarray
    pde_error: np.ndarray
    displacement: np.ndarray
    rate: np.ndarray
    mass_error: float
    min_density: float
    config: dict[str, Any]
    density: np.ndarray = field(repr=False)
    centres: np.ndarray = field(repr=False)
    particles: np.ndarray = field(repr=False)  # (T, n_max) angles of the largest run
    w1_per_seed: np.ndarray | None = field(default=None, repr=False)  # (N, seeds, T)

    @property
    def final_rate(self) -> float:
        return float(self.rate[-1])

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.config,
            "times": self.times.tolist(),
            "n": self.ns.tolist(),
            "w1": self.w1.tolist(),
            "w1_spread": self.w1_spread.tolist(),
            "pde_error": self.pde_error.tolist(),
            "displacement": self.displacement.tolist(),
            "rate": self.rate.tolist(),
            "final_rate": self.final_rate,
            "mass_error": self.mass_error,
            "min_density": self.min_density,
        }


def _simulate_angles(
    theta0: np.ndarray, beta: float, normalization: str, time: str, times: np.ndarray, dt: float
) -> np.ndarray:
    """``(systems, T, n)`` angles of particle runs started at ``theta0`` ``(systems, n)``."""
    import torch

    x0 = torch.from_numpy(np.stack([np.cos(theta0), np.sin(theta0)], axis=-1))
    ds = simulate(
        Dynamics(beta=beta, normalization=normalization, time=time),
        x0,
        t_max=float(times[-1]),
        dt=dt,
        solver="rk4",
        saveat=SaveAt(times=times),
    )
    states = ds.states.values  # (systems, T, n, 2)
    return np.mod(np.arctan2(states[..., 1], states[..., 0]), 2 * math.pi)


def pde_vs_particles(
    beta: float = 4.0,
    *,
    normalization: str = "sa",
    time: str = "paper",
    ns: Any = (64, 128, 256, 512, 1024),
    times: Any = (0.0, 1.0, 2.0, 3.0),
    kappa: float = 1.0,
    cells: int = 2048,
    sampling: str = "quantile",
    seeds: int = 1,
    dt: float = 0.01,
) -> PDEComparison:
    """Solve the PDE from a von Mises bump and compare it with particle runs.

    Args:
        beta: the dynamics' inverse temperature.
        normalization: the dynamics' normalisation (``"sa"`` or ``"usa"``).
        time: the dynamics' time convention.
        ns: particle counts.
        times: comparison times (from 0).
        kappa: concentration of the starting bump ``e^{kappa cos(theta - pi)}``.
        cells: PDE grid (the error is estimated against ``2 * cells``).
        sampling: ``"quantile"`` or ``"random"`` (then ``seeds`` runs per ``n``).
        seeds: particle runs per ``n`` with ``"random"`` sampling.
        dt: particle RK4 step.

    Returns:
        A ``PDEComparison``: the PDE density at ``times``, the Wasserstein-1
        distance ``w1`` ``(N, T)`` of the particle runs to it (mean over
        seeds), the PDE's own error ``pde_error`` and the slope ``rate`` of
        ``log W1`` against ``log n`` at each time.

    Raises:
        UserError: fewer than two particle counts, or bad times.

    Example:
        >>> cmp = tf.pde_vs_particles(4.0, ns=(16, 32), times=(0.0, 0.5), cells=128, dt=0.05)
        >>> cmp.w1.shape
        (2, 2)
    """
    ns = np.asarray(sorted({int(n) for n in np.atleast_1d(ns)}), dtype=np.int64)
    times = np.asarray(sorted({float(t) for t in np.atleast_1d(times)}), dtype=np.float64)
    if ns.size < 2 or ns[0] < 2:
        raise UserError("pass at least two particle counts n >= 2", "e.g. --n-particles 64,128,256")
    if times[0] < 0 or times[-1] <= 0:
        raise UserError("comparison times must be >= 0 and not all 0")
    if sampling == "quantile":
        seeds = 1
    pde = CirclePDE(beta, normalization, time=time, cells=cells)
    rho0 = von_mises_density(cells, kappa, centre=math.pi)
    solution = pde.solve(rho0, times)
    fine = CirclePDE(beta, normalization, time=time, cells=2 * cells)
    fine_solution = fine.solve(von_mises_density(2 * cells, kappa, centre=math.pi), times)
    pde_error = np.array(
        [density_w1(a, b) for a, b in zip(solution.density, fine_solution.density, strict=True)]
    )
    w1 = np.empty((ns.size, seeds, times.size))
    last = None
    for i, n in enumerate(ns):
        theta0 = np.stack(
            [particles_from_density(rho0, int(n), sampling=sampling, seed=s) for s in range(seeds)]
        )  # (seeds, n)
        angles = _simulate_angles(theta0, beta, normalization, time, times, dt)
        for s in range(seeds):
            for j in range(times.size):
                w1[i, s, j] = circle_w1(solution.density[j], angles[s, j])
        last = angles[0]
    mean = w1.mean(axis=1)
    rate = np.array([np.polyfit(np.log(ns), np.log(mean[:, j]), 1)[0] for j in range(times.size)])
    return PDEComparison(
        times=times,
        ns=ns,
        w1=mean,
        w1_spread=w1.std(axis=1),
        pde_error=pde_error,
        displacement=np.array([density_w1(rho0, frame) for frame in solution.density]),
        rate=rate,
        mass_error=solution.mass_error,
        min_density=float(solution.min_density.min()),
        config={
            "beta": float(beta),
            "normalization": normalization,
            "time": time,
            "kappa": float(kappa),
            "sampling": sampling,
            "seeds": int(seeds),
            "pde": pde.to_dict(),
            "particles": {"solver": "rk4", "dt": float(dt), "dtype": "float64"},
        },
        density=solution.density,
        centres=solution.centres,
        particles=last,
        w1_per_seed=w1,
    )

"""The mean-field PDE on the circle, solved with conservative finite volumes.

With ``rho(theta, t)`` a probability density on the circle (``int rho dtheta = 1``)::

    d_t rho + d_theta (rho v[rho]) = 0,
    Phi[rho](theta) = int e^{beta cos(phi - theta)} rho(phi) dphi,
    USA: v = Phi' / beta = int e^{beta cos(phi - theta)} sin(phi - theta) rho(phi) dphi,
    SA:  v = Phi' / (beta Phi),

the large-``n`` limit of the particle system on the circle (``Q = K = V = I``).
``Phi`` is a convolution, so it is computed with the FFT: ``Phi_k = 2 pi I_k(beta) rho_k``
(``rho_k`` the Fourier coefficients of the density, recovered from the cell
averages by dividing by ``sinc(k h / 2)``, so the velocity is spectrally
accurate), evaluated at the cell faces by a half-cell phase shift.

Finite volumes: ``M`` cells of width ``h = 2 pi / M``, cell averages ``rho_j``;
face fluxes ``F = v^+ rho_L + v^- rho_R`` with a limited (MC or van Leer, TVD)
linear reconstruction, and the update ``rho_j -= dt (F_{j+1/2} - F_{j-1/2}) / h``
telescopes, so ``h sum_j rho_j`` stays 1 to round-off (recorded per saved
frame). Time: SSP-RK3 (Shu-Osher), a convex combination of forward Euler steps,
so with ``CFL = dt max|v| / h <= 1/4`` the reconstruction (``rho_L <= 2 rho_j``)
keeps the density non-negative; the minimum is recorded too.

Comparison with particles uses the 1-Wasserstein distance on the circle,
``W1 = min_c int |F(theta) - G(theta) - c| dtheta`` (``F``, ``G`` the CDFs from 0),
computed exactly for an empirical measure against the piecewise-constant
density (:func:`circle_w1`; cross-checked against POT's
:func:`ot.wasserstein_circle` in the tests, :func:`circle_w1_atoms`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from scipy.special import ive

from tokenfield.errors import ParameterError, UserError
from tokenfield.meanfield.stability import stability_spectrum

Limiter = Literal["mc", "vanleer", "minmod"]
TWO_PI = 2 * math.pi


@dataclass(frozen=True)
class CirclePDE:
    """The continuity equation on the circle and its finite-volume solver.

    Args:
        beta: inverse temperature.
        normalization: ``"usa"`` or ``"sa"``.
        time: ``"paper"`` or ``"rescaled"`` (USA velocity times ``e^{-beta}``, as
            the simulator's option).
        cells: ``M``.
        cfl: ``dt max|v| / h`` (at most 1/4 keeps the density non-negative).
        limiter: slope limiter of the reconstruction.
        max_dt: the largest step, for time accuracy where the velocity is small
            (near the uniform state the CFL bound allows huge steps); default
            ``0.05 / lambda_max``, the fastest linear growth rate of the uniform
            state, so a growing mode's rate is off by ``~(lambda dt)^3 / 24``.

    Example:
        >>> from tokenfield.meanfield.pde import von_mises_density
        >>> pde = tf.CirclePDE(4.0, cells=256)
        >>> solution = pde.solve(von_mises_density(256, 1.0), [0.0, 1.0])
        >>> solution.density.shape, bool(solution.mass_error < 1e-9)
        ((2, 256), True)
    """

    beta: float
    normalization: str = "usa"
    time: str = "paper"
    cells: int = 2048
    cfl: float = 0.25
    limiter: Limiter = "mc"
    max_dt: float | None = None

    def __post_init__(self) -> None:
        if not math.isfinite(float(self.beta)):
            raise UserError(f"beta must be finite, not {self.beta}")
        object.__setattr__(self, "beta", float(self.beta))
        if self.normalization not in ("sa", "usa"):
            raise UserError(f"unknown normalization {self.normalization!r}", "use sa or usa")
        if self.time not in ("paper", "rescaled"):
            raise UserError(f"unknown time convention {self.time!r}", "use paper or rescaled")
        if int(self.cells) < 8:
            raise ParameterError(
                "cells", f"{{name}} must be >= 8, not {self.cells}", "pass e.g. {name} 2048"
            )
        if not (0 < self.cfl <= 0.5):
            raise UserError(f"cfl must be in (0, 0.5], not {self.cfl}")
        if self.limiter not in ("mc", "vanleer", "minmod"):
            raise UserError(f"unknown limiter {self.limiter!r}", "use mc, vanleer or minmod")
        if self.max_dt is None:
            top = stability_spectrum(
                self.beta,
                normalization=self.normalization,
                time=self.time,  # type: ignore[arg-type]
            ).top_rate
            object.__setattr__(
                self, "max_dt", 0.05 / top if top > 0 and math.isfinite(top) else 0.05
            )
        elif not (math.isfinite(self.max_dt) and self.max_dt > 0):
            raise UserError(f"max_dt must be > 0, not {self.max_dt}")

    # -- grid ---------------------------------------------------------------------
    @property
    def h(self) -> float:
        return TWO_PI / self.cells

    @property
    def centres(self) -> np.ndarray:
        return (np.arange(self.cells) + 0.5) * self.h

    def _multipliers(self) -> tuple[np.ndarray, np.ndarray]:
        """Per-wavenumber factors taking cell averages to ``Phi`` and ``Phi'`` at the
        faces, both times ``e^{-|beta|}`` (``ive``) to stay finite."""
        k = np.arange(self.cells // 2 + 1, dtype=np.float64)
        half = 0.5 * k * self.h
        sinc = np.where(k == 0, 1.0, np.sin(half) / np.where(k == 0, 1.0, half))
        bessel = TWO_PI * ive(k, abs(self.beta))
        if self.beta < 0:
            bessel = bessel * np.where(k % 2 == 1, -1.0, 1.0)
        shift = np.exp(1j * half)  # centres -> right faces
        phi = bessel / sinc * shift
        dphi = 1j * k * phi
        if self.cells % 2 == 0:
            dphi[-1] = 0.0  # the Nyquist mode has no derivative
        return phi, dphi

    def face_velocity(self, density: np.ndarray) -> np.ndarray:
        """``v`` at the right face of every cell, ``(M,)``."""
        phi_k, dphi_k = self._multiplier_cache
        rho_k = np.fft.rfft(density) / self.cells
        dphi = np.fft.irfft(dphi_k * rho_k, n=self.cells) * self.cells  # Phi' e^{-|beta|}
        if self.normalization == "sa":
            phi = np.fft.irfft(phi_k * rho_k, n=self.cells) * self.cells
            return dphi / (self.beta * phi) if self.beta != 0 else _beta0_velocity(self, rho_k)
        if self.beta == 0:
            return _beta0_velocity(self, rho_k)
        scale = math.exp(abs(self.beta) - (self.beta if self.time == "rescaled" else 0.0))
        return dphi * (scale / self.beta)

    @functools.cached_property
    def _multiplier_cache(self) -> tuple[np.ndarray, np.ndarray]:
        return self._multipliers()

    # -- fluxes ---------------------------------------------------------------------
    def _slopes(self, rho: np.ndarray) -> np.ndarray:
        back = rho - np.roll(rho, 1)
        fwd = np.roll(rho, -1) - rho
        same = back * fwd > 0
        if self.limiter == "minmod":
            slope = np.where(same, np.sign(back) * np.minimum(abs(back), abs(fwd)), 0.0)
        elif self.limiter == "vanleer":
            slope = np.where(same, 2 * back * fwd / np.where(same, back + fwd, 1.0), 0.0)
        else:  # monotonized central
            mag = np.minimum(np.minimum(2 * abs(back), 2 * abs(fwd)), 0.5 * abs(back + fwd))
            slope = np.where(same, np.sign(back) * mag, 0.0)
        return slope

    def rate(self, rho: np.ndarray, velocity: np.ndarray | None = None) -> np.ndarray:
        """``-(F_{j+1/2} - F_{j-1/2}) / h``, ``(M,)``."""
        v = self.face_velocity(rho) if velocity is None else velocity
        slope = self._slopes(rho)
        left = rho + 0.5 * slope  # reconstruction at the right face of cell j
        right = np.roll(rho - 0.5 * slope, -1)  # of cell j + 1 at the same face
        flux = np.maximum(v, 0.0) * left + np.minimum(v, 0.0) * right
        return -(flux - np.roll(flux, 1)) / self.h

    def step(self, rho: np.ndarray, dt: float) -> np.ndarray:
        """One SSP-RK3 step."""
        u1 = rho + dt * self.rate(rho)
        u2 = 0.75 * rho + 0.25 * (u1 + dt * self.rate(u1))
        return rho / 3.0 + (2.0 / 3.0) * (u2 + dt * self.rate(u2))

    def solve(
        self,
        density: np.ndarray,
        times: Any,
        *,
        max_steps: int = 2_000_000,
    ) -> PDESolution:
        """Integrate from the cell averages ``density`` (``(M,)``, mass 1) and keep
        the states at ``times`` (sorted, from 0)."""
        rho = np.asarray(density, dtype=np.float64).copy()
        if rho.shape != (self.cells,):
            raise UserError(f"the density must have {self.cells} cells, got shape {rho.shape}")
        if not np.isfinite(rho).all() or rho.min() < 0:
            raise UserError("the initial density must be finite and non-negative")
        mass = rho.sum() * self.h
        if abs(mass - 1) > 1e-9:
            raise UserError(f"the initial density has mass {mass:.12g}, not 1", "normalise it")
        times = np.asarray(sorted(float(t) for t in np.atleast_1d(times)))
        if times[0] < 0:
            raise UserError("save times must be >= 0")
        frames, t, steps = [], 0.0, 0
        for target in times:
            while t < target - 1e-14 * max(1.0, target):
                vmax = float(np.abs(self.face_velocity(rho)).max())
                dt = self.cfl * self.h / vmax if vmax > 0 else math.inf
                dt = min(dt, self.max_dt, target - t)
                rho = self.step(rho, dt)
                t = target if dt == target - t else t + dt
                steps += 1
                if steps > max_steps:
                    raise UserError(f"the PDE took more than {max_steps} steps", "use fewer cells")
            frames.append(rho.copy())
        states = np.stack(frames)  # (T, M)
        return PDESolution(
            times=times,
            centres=self.centres,
            density=states,
            mass=states.sum(axis=1) * self.h,
            min_density=states.min(axis=1),
            steps=steps,
            config=self.to_dict(),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "beta": self.beta,
            "normalization": self.normalization,
            "time": self.time,
            "cells": int(self.cells),
            "cfl": self.cfl,
            "limiter": self.limiter,
            "max_dt": self.max_dt,
            "scheme": "finite volume, limited linear reconstruction, upwind flux, SSP-RK3",
        }


def _beta0_velocity(pde: CirclePDE, rho_k: np.ndarray) -> np.ndarray:
    """``beta = 0``: ``v(theta) = int sin(phi - theta) rho(phi) dphi`` (SA: over ``int rho = 1``)."""
    faces = pde.centres + 0.5 * pde.h
    # the coefficient of e^{i theta} (rfft is phased from the first centre, h/2)
    first = rho_k[1] * np.exp(-0.5j * pde.h) / np.sinc(pde.h / TWO_PI)
    # int sin(phi - theta) e^{i phi} dphi = pi i e^{i theta}; the real density adds the conjugate
    return np.real(2 * math.pi * 1j * first * np.exp(1j * faces))


@dataclass(frozen=True)
class PDESolution:
    """Saved states of :meth:`CirclePDE.solve`.

    Attributes:
        times: ``(T,)``; centres: ``(M,)`` cell centres; density: ``(T, M)`` cell
        averages; mass: ``(T,)`` ``h sum rho``; min_density: ``(T,)``; steps: RK
        steps taken; config: the solver's settings.
    """

    times: np.ndarray
    centres: np.ndarray
    density: np.ndarray = field(repr=False)
    mass: np.ndarray
    min_density: np.ndarray
    steps: int
    config: dict[str, Any]

    @property
    def mass_error(self) -> float:
        return float(np.abs(self.mass - 1).max())

    def to_dataset(self):
        import json

        import xarray as xr

        return xr.Dataset(
            {
                "density": (("time", "theta"), self.density),
                "mass": (("time",), self.mass),
                "min_density": (("time",), self.min_density),
            },
            coords={"time": self.times, "theta": self.centres},
            attrs={"tokenfield_config": json.dumps(self.config), "kind": "meanfield-pde"},
        )


# -- densities and particles ------------------------------------------------------


def cell_averages(func: Callable[[np.ndarray], np.ndarray], cells: int) -> np.ndarray:
    """Cell averages of ``func`` (8-point Gauss-Legendre per cell), scaled to mass 1."""
    h = TWO_PI / cells
    nodes, weights = np.polynomial.legendre.leggauss(8)
    left = np.arange(cells)[:, None] * h
    values = func(left + 0.5 * h * (nodes + 1))  # (M, 8)
    averages = 0.5 * (values * weights).sum(axis=1)
    if not np.isfinite(averages).all() or averages.min() < 0:
        raise UserError("the density must be finite and non-negative")
    return averages / (averages.sum() * h)


def von_mises_density(cells: int, kappa: float = 1.0, centre: float = 0.0) -> np.ndarray:
    """A single bump ``e^{kappa cos(theta - centre)} / (2 pi I_0(kappa))`` as cell averages."""
    if not math.isfinite(kappa) or kappa < 0:
        raise UserError(f"kappa must be a finite number >= 0, not {kappa}")
    return cell_averages(lambda t: np.exp(kappa * (np.cos(t - centre) - 1)), cells)


def _cdf_edges(density: np.ndarray) -> np.ndarray:
    h = TWO_PI / density.size
    return np.concatenate([[0.0], np.cumsum(density) * h])  # (M + 1,)


def density_quantiles(density: np.ndarray, probabilities: np.ndarray) -> np.ndarray:
    """Angles in ``[0, 2 pi)`` at which the (piecewise-linear) CDF reaches ``probabilities``."""
    cdf = _cdf_edges(np.asarray(density, dtype=np.float64))
    edges = np.linspace(0.0, TWO_PI, cdf.size)
    # np.interp on a CDF with flat parts picks the first edge; fine for sampling
    return np.interp(probabilities, cdf / cdf[-1], edges) % TWO_PI


def particles_from_density(
    density: np.ndarray, n: int, *, sampling: str = "quantile", seed: int = 0
) -> np.ndarray:
    """``n`` angles drawn from the density: ``"quantile"`` (deterministic, at the
    probabilities ``(i + 1/2) / n``; ``W1 = O(1/n)``) or ``"random"`` (i.i.d.,
    seeded; ``W1 = O(n^{-1/2})``)."""
    if int(n) < 1:
        raise UserError(f"n must be >= 1, not {n}")
    if sampling == "quantile":
        probabilities = (np.arange(n) + 0.5) / n
    elif sampling == "random":
        probabilities = np.sort(np.random.default_rng(seed).random(n))
    else:
        raise UserError(f"unknown sampling {sampling!r}", "use quantile or random")
    return density_quantiles(density, probabilities)


# -- Wasserstein distance on the circle ----------------------------------------------


def _piece_abs_integral(a: np.ndarray, b: np.ndarray, length: np.ndarray) -> np.ndarray:
    """``int |D|`` over pieces where ``D`` runs linearly from ``a`` to ``b``."""
    same = a * b >= 0
    safe = np.where(same, 1.0, np.abs(a - b))
    return length * np.where(same, 0.5 * np.abs(a + b), 0.5 * (a * a + b * b) / safe)


def _w1_linear_pieces(a: np.ndarray, b: np.ndarray, length: np.ndarray) -> float:
    """``min_c sum int |D - c|`` for ``D`` linear from ``a`` to ``b`` on each piece;
    the minimiser is the median of ``D`` under the length measure (bisection)."""
    low, high = float(min(a.min(), b.min())), float(max(a.max(), b.max()))
    lo_ab, hi_ab = np.minimum(a, b), np.maximum(a, b)
    spread = np.where(hi_ab > lo_ab, hi_ab - lo_ab, 1.0)
    half = 0.5 * length.sum()
    for _ in range(100):
        c = 0.5 * (low + high)
        below = length * np.clip((c - lo_ab) / spread, 0.0, 1.0)
        below = np.where(hi_ab > lo_ab, below, length * (lo_ab < c))
        if below.sum() < half:
            low = c
        else:
            high = c
        if high - low <= 1e-16 * max(1.0, abs(c)):
            break
    c = 0.5 * (low + high)
    return float(_piece_abs_integral(a - c, b - c, length).sum())


def circle_w1(density: np.ndarray, angles: np.ndarray, weights: np.ndarray | None = None) -> float:
    """Exact ``W1`` (radians) between a piecewise-constant density on ``M`` equal
    cells of ``[0, 2 pi)`` and the empirical measure of ``angles`` (weights ``1/n``
    unless given)."""
    density = np.asarray(density, dtype=np.float64)
    cells = density.size
    angles = np.mod(np.asarray(angles, dtype=np.float64).reshape(-1), TWO_PI)
    w = np.full(angles.size, 1.0 / angles.size) if weights is None else np.asarray(weights, float)
    order = np.argsort(angles)
    angles, w = angles[order], w[order] / w.sum()
    edges = np.linspace(0.0, TWO_PI, cells + 1)
    breaks = np.union1d(edges, angles)  # sorted, from 0 to 2 pi
    left, right = breaks[:-1], breaks[1:]
    cdf_edges = _cdf_edges(density)
    cdf_edges = cdf_edges / cdf_edges[-1]
    f_left = np.interp(left, edges, cdf_edges)
    f_right = np.interp(right, edges, cdf_edges)
    # particle CDF on (left, right): mass of the atoms at or before `left`
    g = np.concatenate([[0.0], np.cumsum(w)])[np.searchsorted(angles, left, side="right")]
    keep = right > left
    return _w1_linear_pieces(f_left[keep] - g[keep], f_right[keep] - g[keep], (right - left)[keep])


def density_w1(first: np.ndarray, second: np.ndarray) -> float:
    """Exact ``W1`` between two piecewise-constant densities whose cell counts
    divide one another (e.g. a PDE solved on ``M`` and on ``2M`` cells)."""
    first, second = np.asarray(first, float), np.asarray(second, float)
    if first.size > second.size:
        first, second = second, first
    if second.size % first.size:
        raise UserError("the cell counts must divide one another")
    fine = np.repeat(first, second.size // first.size)
    a = _cdf_edges(fine) / _cdf_edges(fine)[-1] - _cdf_edges(second) / _cdf_edges(second)[-1]
    length = np.full(second.size, TWO_PI / second.size)
    return _w1_linear_pieces(a[:-1], a[1:], length)


def circle_w1_atoms(
    first: np.ndarray,
    second: np.ndarray,
    first_weights: np.ndarray | None = None,
    second_weights: np.ndarray | None = None,
) -> float:
    """``W1`` (radians) between two discrete measures of angles, by POT's
    :func:`ot.wasserstein_circle` (which works on the circle of length 1)."""
    import ot

    def unit(values: np.ndarray) -> np.ndarray:
        return np.mod(np.asarray(values, dtype=np.float64), TWO_PI) / TWO_PI

    distance = ot.wasserstein_circle(unit(first), unit(second), first_weights, second_weights, p=1)
    return float(np.asarray(distance).reshape(-1)[0]) * TWO_PI

"""Linear stability against the particle simulator on the circle.

Two experiments from ``n`` equally spaced particles on the circle plus a small
seeded noise (:func:`tokenfield.initial_condition` ``"equispaced"``), batched
over seeds in one tensor:

- :func:`first_plateau_experiment`: the number of clusters that first forms.
  The cluster count (:func:`tokenfield.cluster_count`) is followed in time; the
  first plateau (:func:`tokenfield.plateaus`) other than the starting count that
  lasts at least ``min_duration`` is the count that formed. It is set beside
  ``k_max(beta)`` (:func:`~tokenfield.meanfield.stability.most_unstable_mode`).
- :func:`growth_rate_experiment`: the Fourier amplitudes of the empirical
  measure, ``rho_k(t) = (1/n) sum_j e^{-i k theta_j(t)}``. In the linear phase
  ``rho_k`` follows the displacement mode ``k`` (``rho_k ~ -i k delta_k`` for
  ``0 < k < n``), which grows like ``e^{lambda_k t}``; the slope of
  ``log |rho_k|`` fitted over the window where every amplitude is still small is
  set beside the discrete ``lambda_k^(n)`` and the continuum ``lambda_k``.

The time horizon is set from the theory: the linear phase lasts about
``T_lin = log(1 / noise) / lambda_max``; runs go to ``horizon * T_lin``. USA is
run in the simulator's rescaled time (weights ``exp(beta (<x,y> - 1)) / n``, rates
``e^{-beta}`` smaller) so that ``beta = 100`` takes ``O(100)`` time units rather
than ``O(e^{-100})``; SA needs no rescaling (its rates stay below ``2 / e``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from tokenfield.analysis.clusters import cluster_count, plateaus
from tokenfield.errors import UserError
from tokenfield.meanfield.stability import (
    Normalization,
    discrete_growth_rates,
    growth_rates,
    stability_spectrum,
)
from tokenfield.particles import Dynamics, SaveAt, simulate
from tokenfield.particles.init import add_noise, equispaced

# USA runs in rescaled time; SA is the same in both conventions.
TIME = "rescaled"


def _equispaced_start(n: int, noise: float, seeds: int, seed: int):
    import torch

    starts = [add_noise(equispaced(n, 2), noise, seed=seed + s) for s in range(seeds)]
    return torch.stack(starts)  # (seeds, n, 2)


def _circle_run(beta: float, c: Any, t_max: float, step: float) -> Any:
    """RK4 from ``c.seeds`` near-equispaced starts (``c``: a :class:`PlateauConfig`
    or :class:`GrowthConfig`) to ``t_max``, ``c.frames + 1`` evenly spaced saves."""
    x0 = _equispaced_start(c.n_particles, c.noise, c.seeds, c.seed)
    return simulate(
        Dynamics(beta=beta, normalization=c.normalization, time=TIME),
        x0,
        t_max=t_max,
        dt=step,
        solver="rk4",
        saveat=SaveAt(times=np.linspace(0.0, t_max, c.frames + 1)),
    )


def linear_time(beta: float, noise: float, normalization: Normalization = "usa") -> float:
    """``log(1 / noise) / lambda_max``: how long the linear phase lasts (rescaled time)."""
    top = stability_spectrum(beta, normalization=normalization, time=TIME).top_rate
    return math.log(1.0 / noise) / top


@dataclass(frozen=True)
class FirstPlateau:
    """The first cluster count that forms, per seed, beside ``k_max``.

    Attributes:
        beta, normalization, n_particles, noise, eps: the setting.
        k_max: the most unstable mode (the prediction).
        counts: ``(seeds,)`` first-plateau cluster count of each seed (-1: none found).
        starts, ends: ``(seeds,)`` when that plateau began and ended.
        t_max, dt: the horizon and step (RK4, float64).
        times: ``(T,)`` saved times; count_series: ``(seeds, T)`` cluster counts.
    """

    beta: float
    normalization: str
    n_particles: int
    noise: float
    eps: float
    k_max: int
    counts: np.ndarray
    starts: np.ndarray
    ends: np.ndarray
    t_max: float
    dt: float
    times: np.ndarray = field(repr=False)
    count_series: np.ndarray = field(repr=False)

    @property
    def median_count(self) -> float:
        found = self.counts[self.counts > 0]
        return float(np.median(found)) if found.size else math.nan

    def to_dict(self, series: bool = False) -> dict[str, Any]:
        out = {
            "beta": self.beta,
            "normalization": self.normalization,
            "time": TIME if self.normalization == "usa" else "paper",
            "n_particles": self.n_particles,
            "noise": self.noise,
            "eps": self.eps,
            "k_max": self.k_max,
            "sqrt_2beta": math.sqrt(2 * abs(self.beta)),
            "first_plateau_counts": self.counts.tolist(),
            "median_count": self.median_count,
            "plateau_starts": self.starts.tolist(),
            "plateau_ends": self.ends.tolist(),
            "t_max": self.t_max,
            "dt": self.dt,
            "solver": "rk4",
        }
        if series:
            out["times"] = self.times.tolist()
            out["count_series"] = self.count_series.tolist()
        return out


def first_plateau(counts: np.ndarray, times: np.ndarray, min_duration: float):
    """The first :func:`~tokenfield.analysis.clusters.plateaus` entry lasting at
    least ``min_duration`` whose count differs from the starting count, or ``None``."""
    start_count = int(counts[0])
    for plateau in plateaus(counts, times, min_duration=min_duration):
        if plateau.count != start_count:
            return plateau
    return None


class _Settings:
    """``of`` and ``to_dict`` for the frozen config dataclasses below."""

    @classmethod
    def of(cls, config: Any = None, **overrides: Any) -> Any:
        """``config`` (default: the defaults) with ``overrides`` replaced."""
        return replace(config or cls(), **overrides)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)  # type: ignore[call-overload]


@dataclass(frozen=True)
class _Starts(_Settings):
    """The batch of near-equispaced starts both experiments run (their first fields).

    Attributes:
        normalization: ``"usa"`` (run in rescaled time) or ``"sa"``.
        n_particles: ``n``.
        noise: angular noise scale of the start (``add_noise``).
        seeds: systems in the batch (seeds ``seed .. seed + seeds - 1``).
        seed: the first seed.
    """

    normalization: Normalization = "usa"
    n_particles: int = 256
    noise: float = 1e-3
    seeds: int = 4
    seed: int = 0


@dataclass(frozen=True)
class PlateauConfig(_Starts):
    """The settings of :func:`first_plateau_experiment` (and :func:`cluster_prediction`).

    Attributes:
        normalization, n_particles, noise, seeds, seed: the starts (:class:`_Starts`).
        eps: cluster threshold (default: a quarter of ``1 - cos`` of the starting
            spacing, so that no two starting neighbours are linked and the start
            counts ``n`` clusters).
        horizon: run to ``horizon * linear_time`` (see the module docstring).
        min_efolds: a plateau counts when it lasts ``min_efolds / lambda_max``
            (a few linear e-folding times: transient counts while the clusters
            gather are shorter).
        frames: cluster counts are taken at this many evenly spaced times.
        dt: RK4 step (default ``min(0.25, 0.1 / lambda_max)``).

    Example:
        >>> config = tf.PlateauConfig(n_particles=64, seeds=2)
        >>> config.normalization, config.n_particles
        ('usa', 64)
    """

    eps: float | None = None
    horizon: float = 4.0
    min_efolds: float = 3.0
    frames: int = 200
    dt: float | None = None


@dataclass(frozen=True)
class GrowthConfig(_Starts):
    """The settings of :func:`growth_rate_experiment`.

    Attributes:
        normalization, n_particles, noise, seeds, seed, frames: as in
            :class:`PlateauConfig` (other defaults: the linear phase needs a
            smaller start).
        max_mode: fit modes ``1..max_mode`` (default ``2 k_max``, at most ``n/2 - 1``).
        amplitude_limit: the fit stops where the largest amplitude reaches this.
        dt: RK4 step (default ``0.05 / lambda_max``; the RK4 error in a rate is
            ``O(lambda^5 dt^4)``).

    Example:
        >>> config = tf.GrowthConfig(normalization="sa", n_particles=64)
        >>> config.noise, config.amplitude_limit
        (1e-08, 1e-05)
    """

    noise: float = 1e-8  # a smaller start: the linear phase (the fields keep their order)
    seeds: int = 2
    max_mode: int | None = None
    amplitude_limit: float = 1e-5
    frames: int = 60
    dt: float | None = None


def first_plateau_experiment(
    beta: float, config: PlateauConfig | None = None, **overrides: Any
) -> FirstPlateau:
    """Simulate ``seeds`` near-equispaced starts and find their first plateau.

    ``config`` (a :class:`PlateauConfig`, whose fields are documented there) or its
    fields as keywords (``n_particles=64, seeds=2``).
    """
    c = PlateauConfig.of(config, **overrides)
    normalization, n_particles, noise, seeds = c.normalization, c.n_particles, c.noise, c.seeds
    eps, horizon, min_efolds, dt = c.eps, c.horizon, c.min_efolds, c.dt
    import torch

    if n_particles < 2 or seeds < 1:
        raise UserError("first_plateau_experiment needs n_particles >= 2 and seeds >= 1")
    if not (0 < noise < 1):
        raise UserError(f"noise must be in (0, 1), not {noise}")
    spectrum = stability_spectrum(beta, normalization=normalization, time=TIME)
    if spectrum.top_rate <= 0:
        raise UserError(f"no mode grows at beta = {beta}", "pass beta > 0")
    t_max = horizon * math.log(1.0 / noise) / spectrum.top_rate
    step = min(0.25, 0.1 / spectrum.top_rate) if dt is None else float(dt)
    if eps is None:
        eps = 0.25 * (1 - math.cos(2 * math.pi / n_particles))
    ds = _circle_run(beta, c, t_max, step)
    with torch.no_grad():
        series = np.asarray(cluster_count(ds.states.values, eps=eps))  # (seeds, T)
    counts, starts, ends = [], [], []
    for row in series:
        found = first_plateau(row, ds.time.values, min_efolds / spectrum.top_rate)
        counts.append(-1 if found is None else found.count)
        starts.append(math.nan if found is None else found.start)
        ends.append(math.nan if found is None else found.end)
    return FirstPlateau(
        beta=float(beta),
        normalization=normalization,
        n_particles=int(n_particles),
        noise=float(noise),
        eps=float(eps),
        k_max=spectrum.k_max,
        counts=np.asarray(counts, dtype=np.int64),
        starts=np.asarray(starts),
        ends=np.asarray(ends),
        t_max=float(t_max),
        dt=step,
        times=np.asarray(ds.time.values),
        count_series=series,
    )


def fourier_amplitudes(states: np.ndarray, modes: Any) -> np.ndarray:
    """``|rho_k| = |(1/n) sum_j e^{-i k theta_j}|`` of circle states.

    Args:
        states: ``(..., n, 2)`` (or ``(..., n, d)``: the first two coordinates).
        modes: ``(m,)`` mode numbers.

    Returns:
        ``(..., m)``.
    """
    states = np.asarray(states, dtype=np.float64)
    theta = np.arctan2(states[..., 1], states[..., 0])  # (..., n)
    modes = np.asarray(modes, dtype=np.float64)
    phases = np.exp(-1j * theta[..., None] * modes)  # (..., n, m)
    return np.abs(phases.mean(axis=-2))


@dataclass(frozen=True)
class GrowthRateFit:
    """Fitted growth rates of the Fourier amplitudes beside the theory.

    Attributes:
        beta, normalization, n_particles, noise: the setting (USA in rescaled time).
        modes: ``(m,)``; fitted: ``(m,)`` slope of ``log |rho_k|`` (mean over seeds);
        fitted_spread: ``(m,)`` standard deviation over seeds;
        discrete: ``(m,)`` ``lambda_k^(n)``; continuum: ``(m,)`` ``lambda_k``;
        window: ``(start, end)`` of the fit; dt: RK4 step.
    """

    beta: float
    normalization: str
    n_particles: int
    noise: float
    modes: np.ndarray
    fitted: np.ndarray
    fitted_spread: np.ndarray
    discrete: np.ndarray
    continuum: np.ndarray
    window: tuple[float, float]
    dt: float

    @property
    def relative_error(self) -> np.ndarray:
        """``|fitted - lambda^(n)| / max_k |lambda^(n)|`` per mode."""
        return np.abs(self.fitted - self.discrete) / np.abs(self.discrete).max()

    def to_dict(self) -> dict[str, Any]:
        return {
            "beta": self.beta,
            "normalization": self.normalization,
            "time": TIME if self.normalization == "usa" else "paper",
            "n_particles": self.n_particles,
            "noise": self.noise,
            "modes": self.modes.tolist(),
            "fitted": self.fitted.tolist(),
            "fitted_spread": self.fitted_spread.tolist(),
            "lambda_discrete": self.discrete.tolist(),
            "lambda_continuum": self.continuum.tolist(),
            "relative_error": self.relative_error.tolist(),
            "window": list(self.window),
            "dt": self.dt,
            "solver": "rk4",
        }


def growth_rate_experiment(
    beta: float, config: GrowthConfig | None = None, **overrides: Any
) -> GrowthRateFit:
    """Fit the growth rate of each Fourier amplitude in the linear phase.

    The run starts from equispaced particles with angular noise ``noise`` and
    stops when the largest amplitude reaches ``amplitude_limit`` (estimated from
    ``lambda_max``); the slope of ``log |rho_k|`` is fitted by least squares over
    the frames before any amplitude passes ``amplitude_limit``.

    ``config`` (a :class:`GrowthConfig`, whose fields are documented there) or its
    fields as keywords (``normalization="sa", n_particles=64``).

    Args:
        beta: inverse temperature.
        config: the settings (default :class:`GrowthConfig`).
        **overrides: :class:`GrowthConfig` fields overriding ``config``.

    Returns:
        A ``GrowthRateFit``: the fitted rate of each mode beside the discrete
        and continuum theory.

    Example:
        >>> fit = tf.growth_rate_experiment(4.0, n_particles=32, seeds=1)  # doctest: +SKIP
        >>> fit.modes, fit.fitted.round(2)                                 # doctest: +SKIP
        (array([1, 2, 3, 4, 5, 6]), array([0.04, 0.12, 0.14, 0.1 , 0.06, 0.03]))
    """
    c = GrowthConfig.of(config, **overrides)
    normalization, n_particles, noise = c.normalization, c.n_particles, c.noise
    max_mode, amplitude_limit, dt = c.max_mode, c.amplitude_limit, c.dt
    spectrum = stability_spectrum(beta, normalization=normalization, time=TIME)
    top = spectrum.top_rate
    if top <= 0:
        raise UserError(f"no mode grows at beta = {beta}", "pass beta > 0")
    k_top = min(2 * spectrum.k_max if max_mode is None else int(max_mode), n_particles // 2 - 1)
    modes = np.arange(1, max(k_top, 1) + 1)
    start_amplitude = noise / math.sqrt(n_particles)
    t_max = math.log(amplitude_limit / start_amplitude) / top
    step = 0.05 / top if dt is None else float(dt)
    ds = _circle_run(beta, c, t_max, step)
    amplitudes = fourier_amplitudes(ds.states.values, modes)  # (seeds, T, m)
    keep = amplitudes.max(axis=(0, 2)) <= amplitude_limit
    keep[0] = True
    t = ds.time.values[keep]
    slopes = np.empty((amplitudes.shape[0], modes.size))
    for s in range(amplitudes.shape[0]):
        logs = np.log(amplitudes[s][keep])  # (T', m)
        slopes[s] = np.polyfit(t, logs, 1)[0]
    return GrowthRateFit(
        beta=float(beta),
        normalization=normalization,
        n_particles=int(n_particles),
        noise=float(noise),
        modes=modes,
        fitted=slopes.mean(axis=0),
        fitted_spread=slopes.std(axis=0),
        discrete=discrete_growth_rates(
            modes, beta, n_particles, normalization=normalization, time=TIME
        ),
        continuum=growth_rates(modes, beta, normalization=normalization, time=TIME),
        window=(float(t[0]), float(t[-1])),
        dt=step,
    )


@dataclass(frozen=True)
class ClusterPrediction:
    """The first-plateau experiment over a grid of ``beta`` (one per normalization)."""

    results: tuple[FirstPlateau, ...]

    def rows(self) -> list[dict[str, Any]]:
        return [r.to_dict() for r in self.results]

    def to_dict(self) -> dict[str, Any]:
        return {"rows": self.rows()}


def cluster_prediction(
    betas: Any,
    config: PlateauConfig | None = None,
    *,
    normalizations: tuple[str, ...] = ("usa", "sa"),
    progress: Callable[[], Any] | None = None,
    **options: Any,
) -> ClusterPrediction:
    """:func:`first_plateau_experiment` for every ``beta`` and normalization
    (``progress()`` is called after each); ``config`` or ``options`` as there.

    Args:
        betas: inverse temperatures.
        config: a :class:`PlateauConfig` (default settings when ``None``).
        normalizations: run each ``beta`` with each of these.
        progress: called with no arguments after each experiment.
        **options: :class:`PlateauConfig` fields overriding ``config``.

    Returns:
        A ``ClusterPrediction``; ``rows()`` gives one dict per (normalization,
        beta) with ``k_max``, ``sqrt_2beta`` and the ``first_plateau_counts``.

    Example:
        >>> pred = tf.cluster_prediction([4.0, 9.0], n_particles=64, seeds=2)  # doctest: +SKIP
        >>> [(r["beta"], r["k_max"], r["median_count"]) for r in pred.rows()]   # doctest: +SKIP
    """
    betas = [float(b) for b in np.atleast_1d(np.asarray(betas, dtype=float))]
    results = []
    for norm in normalizations:
        for beta in betas:
            results.append(first_plateau_experiment(beta, config, normalization=norm, **options))
            if progress is not None:
                progress()
    return ClusterPrediction(tuple(results))

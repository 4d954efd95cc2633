"""Dynamic metastability: how long separated clusters survive as beta grows.

Start from ``k`` well separated caps (:func:`tokenfield.initial_condition`
``"caps"``: centres ``e_1, -e_1, e_2, -e_2, ...``, each particle in a cap of
angular radius ``cap_radius``), batched over seeds. The caps contract into
``k`` clusters within ``O(1)`` time; the first merge is the first time the
cluster count (:func:`tokenfield.cluster_count`, the project's counter)
drops below ``k`` (a merge in :func:`tokenfield.analysis.clusters.count_changes`).

Two clusters at angle ``Delta`` pull on each other with weight
``e^{beta (cos Delta - 1)}`` relative to their self-attention (SA, or USA in the
rescaled time ``exp(beta (<x,y> - 1)) / n``), so they take a time
``T ~ e^{beta (1 - cos Delta_0)} / (c beta)`` to meet, ``Delta_0`` the closest pair of
centres (``pi/2`` for the default layout: slope 1):

    log T = s beta - log beta + O(1),   s = 1 - cos Delta_0.

(Geshkovski-Koubbi-Polyanskiy-Rigollet, "Dynamic metastability in the
self-attention model", arXiv 2410.06833: clusters that form fast persist for
times exponential in ``beta``.) In USA's paper time the weights carry an extra
``e^beta`` and ``s = -cos Delta_0`` (0 at ``pi/2``): no exponential metastability there.

:func:`metastability` fits ``log T`` against ``beta`` (least squares over the
``beta`` values where every seed merged before ``t_cap``) and reports the slope
beside ``s``; also the slope of ``log(T beta)``, which removes the ``-log beta``
term and should be closer to ``s`` at moderate ``beta``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np

from tokenfield._io import to_jsonable
from tokenfield._progress import stage
from tokenfield.analysis.clusters import cluster_count, count_changes
from tokenfield.errors import UserError
from tokenfield.particles import Adaptive, SaveAt, simulate
from tokenfield.particles.dynamics import DynamicsSpec
from tokenfield.particles.init import caps


def cap_centres(k: int, dim: int) -> np.ndarray:
    """The ``k`` cap centres :func:`tokenfield.particles.init.caps` uses (``k <= 2d``)."""
    if k > 2 * dim:
        raise UserError(f"at most 2d = {2 * dim} caps have fixed centres, not {k}")
    eye = np.eye(dim)
    return np.stack([s * eye[i] for i in range(dim) for s in (1.0, -1.0)])[:k]


def predicted_slope(k: int, dim: int, normalization: str = "sa", time: str = "paper") -> float:
    """``s = 1 - cos Delta_0`` (SA, USA rescaled) or ``-cos Delta_0`` (USA paper time)."""
    centres = cap_centres(k, dim)
    inner = centres @ centres.T
    closest = float(inner[~np.eye(k, dtype=bool)].max())  # cos Delta_0
    if normalization == "usa" and time == "paper":
        return -closest
    return 1.0 - closest


@dataclass(frozen=True)
class MetastabilityConfig(DynamicsSpec):
    """The settings of :func:`first_merge_times` and :func:`metastability`.

    Attributes:
        k: caps (centres ``e_1, -e_1, e_2, ...``; ``2 <= k <= 2 d``).
        dim: ``d``.
        per_cap: particles per cap.
        cap_radius: the caps' angular radius.
        normalization, time: the dynamics (``Q = K = V = I``).
        seeds: systems in the batch (seeds ``seed .. seed + seeds - 1``).
        seed: the first seed.
        eps: cluster threshold (linked at ``cos >= 1 - eps``).
        t_cap: give up at this time (the merge time is then ``inf``).
        rtol: the adaptive solver's tolerance (``atol = rtol / 100``).

    Example:
        >>> config = tf.MetastabilityConfig(k=3, dim=2, seeds=2)
        >>> config.per_cap, config.normalization
        (4, 'sa')
    """

    k: int = 3
    dim: int = 2
    per_cap: int = 4
    cap_radius: float = 0.1
    seeds: int = 4
    seed: int = 0
    eps: float = 1e-2
    t_cap: float = 5000.0
    rtol: float = 1e-8

    @classmethod
    def of(cls, config: MetastabilityConfig | None = None, **overrides: Any):
        """``config`` (default: the defaults) with ``overrides`` replaced."""
        return replace(config or cls(), **overrides)

    def to_dict(self) -> dict[str, Any]:
        """The fields, in metastability.json's order (the caps, then the dynamics)."""
        data = asdict(self)
        caps = {key: data.pop(key) for key in ("k", "dim", "per_cap", "cap_radius")}
        return {**caps, **data}


def first_merge_times(
    beta: float,
    config: MetastabilityConfig | None = None,
    *,
    frames_per_segment: int = 64,
    **overrides: Any,
) -> np.ndarray:
    """First merge time of each seed (``inf`` if none before ``t_cap``), ``(seeds,)``.

    Integrated with the adaptive Dormand-Prince solver (``rtol``, ``atol = rtol/100``,
    float64) over segments ``[t, 2t]`` (``t`` from 1), with ``frames_per_segment``
    log-spaced cluster counts in each, so the time is resolved to about
    ``1 %``; stops when every seed has merged. ``config`` (a
    :class:`MetastabilityConfig`) or its fields as keywords (``seeds=2``) set the rest.
    """
    import torch

    c = MetastabilityConfig.of(config, **overrides)
    k, dim, per_cap, cap_radius, seeds, seed = c.k, c.dim, c.per_cap, c.cap_radius, c.seeds, c.seed
    eps, t_cap, rtol = c.eps, c.t_cap, c.rtol
    if k < 2:
        raise UserError(f"metastability needs k >= 2 caps, not {k}")
    cap_centres(k, dim)  # validates k <= 2d
    x = torch.stack(
        [caps(k * per_cap, dim, k=k, cap_radius=cap_radius, seed=seed + s) for s in range(seeds)]
    )  # (seeds, n, d)
    dynamics = c.dynamics_at(beta)
    solver = Adaptive(rtol=rtol, atol=rtol / 100)
    merged = np.full(seeds, np.inf)
    t0, t1 = 0.0, 1.0
    while t0 < t_cap and np.isinf(merged).any():
        t1 = min(t1, t_cap)
        times = np.geomspace(max(t0, 1e-3), t1, frames_per_segment)
        times = times[times > t0] if t0 > 0 else np.concatenate([[0.0], times])
        ds = simulate(
            dynamics, x, t0=t0, t_max=t1, dt=min(0.1, t1 - t0), solver=solver,
            saveat=SaveAt(times=times),
        )  # fmt: skip
        counts = np.asarray(cluster_count(ds.states.values, eps=eps))  # (seeds, T)
        for s in np.flatnonzero(np.isinf(merged)):
            # the caps only link up (count -> k) before two clusters can meet, so
            # the first merge is the first change of the count to below k
            drops = [c.time for c in count_changes(counts[s], ds.time.values) if c.after < k]
            if counts[s][0] < k:
                drops.insert(0, float(ds.time.values[0]))
            if drops:
                merged[s] = drops[0]
        x = torch.from_numpy(ds.states.values[:, -1].copy())
        t0, t1 = t1, 2 * t1
    return merged


@dataclass(frozen=True)
class MetastabilityResult:
    """First-merge times against ``beta`` and the fitted slope of ``log T``.

    Attributes:
        betas: ``(b,)``; merge_times: ``(b, seeds)`` (``inf``: survived ``t_cap``).
        slope, intercept: least-squares fit of ``log(median T)`` against ``beta``
            over the betas where every seed merged (and ``beta >= fit_min_beta``).
        slope_corrected: the same fit for ``log(T beta)``.
        predicted_slope: ``s`` (module docstring).
        config: the settings.
    """

    betas: np.ndarray
    merge_times: np.ndarray
    slope: float
    intercept: float
    slope_corrected: float
    predicted_slope: float
    config: dict[str, Any]

    @property
    def median_times(self) -> np.ndarray:
        return np.median(self.merge_times, axis=1)

    def to_dict(self) -> dict[str, Any]:
        def finite(values: np.ndarray) -> list[Any]:
            return to_jsonable(np.ravel(values).astype(float))

        return {
            **self.config,
            "beta": self.betas.tolist(),
            "merge_times": [finite(row) for row in self.merge_times],
            "median_time": finite(self.median_times),
            "slope": self.slope,
            "intercept": self.intercept,
            "slope_corrected": self.slope_corrected,
            "predicted_slope": self.predicted_slope,
        }


def metastability(
    betas: Any,
    config: MetastabilityConfig | None = None,
    *,
    fit_min_beta: float | None = None,
    **overrides: Any,
) -> MetastabilityResult:
    """:func:`first_merge_times` for every ``beta`` and the fit of ``log T`` in ``beta``
    (over ``beta >= fit_min_beta`` when given: the asymptotic regime). ``config`` (a
    :class:`MetastabilityConfig`) or its fields as keywords (``k=3, dim=2``).

    Args:
        betas: inverse temperatures.
        config: the settings (default :class:`MetastabilityConfig`).
        fit_min_beta: fit the slope over ``beta >= fit_min_beta`` only.
        **overrides: :class:`MetastabilityConfig` fields overriding ``config``.

    Returns:
        A ``MetastabilityResult``: ``merge_times`` (beta, seed), the fitted
        ``slope`` of ``log T`` against ``beta`` and the ``predicted_slope``.

    Example:
        >>> result = tf.metastability([2.0, 3.0, 4.0], k=3, dim=2, seeds=2)  # doctest: +SKIP
        >>> result.slope, result.predicted_slope                             # doctest: +SKIP
    """
    config = MetastabilityConfig.of(config, **overrides)
    betas = np.asarray(sorted(float(b) for b in np.atleast_1d(betas)), dtype=np.float64)
    rows = []
    for b in betas:
        stage(f"beta = {b:g}")  # progress, when the command line shows it
        rows.append(first_merge_times(float(b), config))
    times = np.stack(rows)  # (b, seeds)
    usable = np.isfinite(times).all(axis=1)
    if fit_min_beta is not None:
        usable &= betas >= fit_min_beta
    slope = intercept = corrected = math.nan
    if usable.sum() >= 2:
        log_t = np.log(np.median(times[usable], axis=1))
        slope, intercept = (float(v) for v in np.polyfit(betas[usable], log_t, 1))
        corrected = float(np.polyfit(betas[usable], log_t + np.log(betas[usable]), 1)[0])
    return MetastabilityResult(
        betas=betas,
        merge_times=times,
        slope=slope,
        intercept=intercept,
        slope_corrected=corrected,
        predicted_slope=predicted_slope(config.k, config.dim, config.normalization, config.time),
        config={
            **config.to_dict(),
            "fit_min_beta": fit_min_beta,
            "solver": {"name": "adaptive", "rtol": config.rtol, "atol": config.rtol / 100},
            "dtype": "float64",
        },
    )

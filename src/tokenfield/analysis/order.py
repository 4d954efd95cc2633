"""The depth "order" panel: does a token cloud organise at a linear pace?

The source material claims that each layer turns the input into an organised
structure "at a linear, controllable pace": some free energy of the token cloud
whose logarithm changes linearly with depth. This module measures four
candidates per time (layer) and fits ``log(quantity)`` against depth:

- the interaction energy on the sphere (the normalisation of the metastable
  staircase, 1 for one cluster, ``sum_k w_k^2 / n^2`` for tight clusters)::

      E_beta = (1/n^2) sum_{i,j} exp(beta (<y_i, y_j> - 1)),   y_i = x_i / |x_i|;

- the matrix entropy of the normalised Gram matrix (Skean et al. 2025,
  arXiv 2502.02013, with ``alpha = 1``)::

      K = Y Y^T / n   (trace 1),   S = - sum_k lambda_k log lambda_k;

- the TwoNN intrinsic dimension (Facco et al. 2017) of the unit vectors:
  ``mu_i = r2_i / r1_i`` from each point's first two neighbours, and the
  maximum-likelihood estimate ``d = (N - 1) / sum_i log mu_i`` (points with a
  duplicate, ``r1 = 0``, are dropped);
- He and Su's separation fuzziness (arXiv 2210.17020) of the last-token states
  by category: ``D = Tr(SS_w SS_b^+)``, the within-class covariance against the
  pseudo-inverse of the between-class covariance (smaller: better separated).

:func:`pace` turns a ``(prompts, times)`` matrix of one quantity into the slope
of ``log(mean over prompts)`` against time, a bootstrap interval over prompts
(the exchangeable unit), the ``R^2`` of the fit, the fraction of prompts whose
curve is monotone (in the direction of the slope) and the verdict of
:data:`LINEAR_PACE_RULE`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tokenfield.errors import ParameterError, UserError

__all__ = [
    "BETAS",
    "LINEAR_PACE_RULE",
    "Pace",
    "fuzziness",
    "matrix_entropy",
    "order_panel",
    "monotone",
    "pace",
    "pace_of_cloud",
    "sphere_energy",
    "twonn_dimension",
    "verdict",
]

# The fixed grid of beta for E_beta (besides the fitted one).
BETAS = (1.0, 4.0, 16.0)

# The rule, written before any run (docs/theory-lens.md repeats it).
R2_MIN = 0.9
LINEAR_PACE_RULE = (
    f"linear pace: supported only if R^2 >= {R2_MIN:g} and the slope's 95 % bootstrap "
    "interval over prompts excludes 0; otherwise not supported"
)

# Values at or below this are "zero" for the log fit (floored, and counted).
LOG_FLOOR = 1e-12


def _unit(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    norm = np.linalg.norm(x, axis=-1, keepdims=True)
    if np.any(norm == 0):
        raise UserError("a state has norm 0 and has no direction on the sphere")
    return x / norm


def sphere_energy(x: np.ndarray, beta: float) -> float:
    """``E_beta = (1/n^2) sum_ij exp(beta (<y_i, y_j> - 1))`` of the unit vectors of ``x (n, d)``."""
    if not math.isfinite(beta) or beta < 0:
        raise ParameterError(
            "beta", f"{{name}} must be finite and >= 0, not {beta}", "pass {name} >= 0"
        )
    y = _unit(x)
    gram = np.clip(y @ y.T, -1.0, 1.0)  # (n, n)
    return float(np.exp(beta * (gram - 1.0)).mean())


def matrix_entropy(x: np.ndarray) -> float:
    """Von Neumann entropy of ``K = Y Y^T / n`` (``Y`` the unit rows of ``x (n, d)``).

    0 for one direction, ``log n`` for ``n`` orthogonal directions.
    """
    y = _unit(x)
    kernel = y @ y.T / y.shape[0]  # (n, n), trace 1
    lam = np.clip(np.linalg.eigvalsh(kernel), 0.0, None)
    lam = lam[lam > 1e-15]
    lam = lam / lam.sum()
    return float(-(lam * np.log(lam)).sum())


def twonn_dimension(x: np.ndarray, *, unit: bool = True) -> float:
    """TwoNN maximum-likelihood intrinsic dimension of the points ``x (n, d)``.

    ``d = (N - 1) / sum_i log(r2_i / r1_i)`` over the ``N`` points whose nearest
    neighbour is at a positive distance (duplicates are dropped first). NaN
    with fewer than 3 distinct points.

    Args:
        x: points ``(n, d)``.
        unit: put them on the unit sphere first (the default, as the other
            quantities of the panel).
    """
    from sklearn.neighbors import NearestNeighbors

    points = _unit(x) if unit else np.asarray(x, dtype=np.float64)
    points = np.unique(points, axis=0)
    if points.shape[0] < 3:
        return float("nan")
    dist, _ = NearestNeighbors(n_neighbors=3).fit(points).kneighbors(points)
    r1, r2 = dist[:, 1], dist[:, 2]
    keep = r1 > 0
    mu = r2[keep] / r1[keep]
    logs = np.log(mu)
    total = float(logs.sum())
    if keep.sum() < 3 or total <= 0:
        return float("nan")
    return (int(keep.sum()) - 1) / total


def fuzziness(x: np.ndarray, labels: Sequence[Any] | np.ndarray) -> float:
    """He-Su separation fuzziness ``Tr(SS_w SS_b^+)`` of points ``x (n, d)`` by ``labels``.

    ``SS_w = (1/n) sum_i (x_i - m_{c(i)})(x_i - m_{c(i)})^T`` and
    ``SS_b = (1/K) sum_k (m_k - m)(m_k - m)^T``, computed in the span of the
    points (an ``n x n`` problem, never ``d x d``).
    """
    x = np.asarray(x, dtype=np.float64)
    labels = np.asarray(labels)
    classes = np.unique(labels)
    if classes.size < 2:
        raise UserError("separation fuzziness needs at least two categories")
    mean = x.mean(axis=0)
    centres = np.stack([x[labels == c].mean(axis=0) for c in classes])  # (K, d)
    within = x - centres[np.searchsorted(classes, labels)]  # (n, d)
    between = centres - mean  # (K, d)
    # Tr(W^T W / n (B^T B / K)^+) with W (n, d), B (K, d): B^T B's pseudo-inverse
    # through B's SVD, B = P s Q^T  ->  (B^T B)^+ = Q s^-2 Q^T.
    _, s, qt = np.linalg.svd(between, full_matrices=False)
    keep = s > s.max() * 1e-10
    proj = within @ qt[keep].T  # (n, r)
    return float(((proj**2) / s[keep] ** 2).sum() / x.shape[0] * classes.size)


def monotone(curve: np.ndarray, direction: float, rtol: float = 1e-9) -> bool:
    """Every step of ``curve`` goes in ``direction``'s sign (ties within ``rtol`` allowed)."""
    curve = np.asarray(curve, dtype=np.float64)
    steps = np.diff(curve)
    slack = rtol * np.maximum(np.abs(curve[1:]), np.abs(curve[:-1]))
    if direction >= 0:
        return bool(np.all(steps >= -slack))
    return bool(np.all(steps <= slack))


def _fit(times: np.ndarray, values: np.ndarray) -> tuple[float, float]:
    """OLS slope of ``log(values)`` on ``times`` and its ``R^2``."""
    logs = np.log(np.maximum(values, LOG_FLOOR))
    slope, intercept = np.polyfit(times, logs, 1)
    resid = logs - (slope * times + intercept)
    total = float(((logs - logs.mean()) ** 2).sum())
    r2 = 1.0 - float((resid**2).sum()) / total if total > 0 else float("nan")
    return float(slope), r2


def verdict(r2: float, slope_ci: tuple[float, float]) -> str:
    """The verdict of :data:`LINEAR_PACE_RULE`."""
    low, high = slope_ci
    if not (math.isfinite(r2) and math.isfinite(low) and math.isfinite(high)):
        return "not supported (undefined)"
    excludes = low > 0 or high < 0
    if r2 >= R2_MIN and excludes:
        return "supported"
    if not excludes:
        return "not supported (slope interval contains 0)"
    return f"not supported (R^2 {r2:.2f} < {R2_MIN:g})"


@dataclass(frozen=True)
class Pace:
    """One quantity's depth curve and its log-linear fit.

    Attributes:
        per_layer: ``(T,)`` the mean over prompts at each time.
        slope: slope of ``log(per_layer)`` against time (per layer).
        slope_ci: 95 % percentile bootstrap interval over prompts.
        r2: ``R^2`` of the log-linear fit of ``per_layer``.
        monotone_fraction: share of prompts whose curve is monotone in the
            slope's direction (one curve: 1.0 or 0.0).
        verdict: :func:`verdict`.
        n_prompts: prompts behind the curve.
        floored: values at or below ``LOG_FLOOR`` (floored for the log).
    """

    per_layer: np.ndarray
    slope: float
    slope_ci: tuple[float, float]
    r2: float
    monotone_fraction: float
    verdict: str
    n_prompts: int
    floored: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "per_layer": [float(v) for v in self.per_layer],
            "slope": self.slope,
            "slope_ci": [float(v) for v in self.slope_ci],
            "r2": self.r2,
            "monotone_fraction": self.monotone_fraction,
            "verdict": self.verdict,
            "n_prompts": self.n_prompts,
            "floored": self.floored,
            **self.extra,
        }


def pace(values: np.ndarray, *, n_boot: int = 1000, seed: int = 0) -> Pace:
    """Fit ``log(mean over prompts)`` against time for ``values (prompts, T)``.

    Prompts with a non-finite value anywhere are left out (counted in ``n_prompts``'s
    absence). The bootstrap resamples prompts with replacement ``n_boot`` times.
    """
    values = np.asarray(values, dtype=np.float64)
    if values.ndim != 2 or values.shape[1] < 3:
        raise UserError(f"need values (prompts, times >= 3), got shape {values.shape}")
    values = values[np.all(np.isfinite(values), axis=1)]
    if values.shape[0] == 0:
        raise UserError("no prompt has a finite curve")
    times = np.arange(values.shape[1], dtype=np.float64)
    curve = values.mean(axis=0)
    slope, r2 = _fit(times, curve)
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, values.shape[0], size=(n_boot, values.shape[0]))
    boots = np.array([_fit(times, values[p].mean(axis=0))[0] for p in picks])
    ci = (float(np.quantile(boots, 0.025)), float(np.quantile(boots, 0.975)))
    mono = float(np.mean([monotone(row, slope) for row in values]))
    return Pace(
        per_layer=curve,
        slope=slope,
        slope_ci=ci,
        r2=r2,
        monotone_fraction=mono,
        verdict=verdict(r2, ci),
        n_prompts=int(values.shape[0]),
        floored=int((values <= LOG_FLOOR).sum()),
    )


def _undefined(table: np.ndarray) -> Pace:
    nan = float("nan")
    with np.errstate(all="ignore"):
        curve = np.nanmean(np.where(np.isfinite(table), table, np.nan), axis=0)
    return Pace(curve, nan, (nan, nan), nan, nan, "not supported (undefined)", 0)


def pace_of_cloud(
    states: np.ndarray,
    measure: Callable[[np.ndarray, np.ndarray], float],
    labels: np.ndarray | None = None,
    *,
    n_boot: int = 200,
    seed: int = 0,
) -> Pace:
    """:func:`pace` for one cloud across prompts (e.g. the last tokens), ``states (T, n, d)``.

    ``measure(x, labels)`` gives the quantity of the cloud ``x (n, d)``. The bootstrap
    resamples prompts (within each label when labels are given) and measures again;
    the monotone fraction is 1.0 or 0.0 for the one observed curve.
    """
    states = np.asarray(states, dtype=np.float64)
    n = states.shape[1]
    labels = np.zeros(n, dtype=np.int64) if labels is None else np.asarray(labels)
    curve = np.array([measure(frame, labels) for frame in states])
    times = np.arange(states.shape[0], dtype=np.float64)
    slope, r2 = _fit(times, curve)
    rng = np.random.default_rng(seed)
    groups = [np.flatnonzero(labels == c) for c in np.unique(labels)]
    boots = []
    for _ in range(n_boot):
        pick = np.concatenate([rng.choice(g, size=g.size, replace=True) for g in groups])
        boot = np.array([measure(frame[pick], labels[pick]) for frame in states])
        if np.all(np.isfinite(boot)):
            boots.append(_fit(times, boot)[0])
    nan2 = (float("nan"), float("nan"))
    ci = (float(np.quantile(boots, 0.025)), float(np.quantile(boots, 0.975))) if boots else nan2
    finite = bool(np.all(np.isfinite(curve)))
    return Pace(
        per_layer=curve,
        slope=slope,
        slope_ci=ci,
        r2=r2,
        monotone_fraction=float(monotone(curve, slope)) if finite else float("nan"),
        verdict=verdict(r2, ci),
        n_prompts=int(n),
        floored=int((curve <= LOG_FLOOR).sum()),
    )


def _energy_key(beta: float) -> str:
    return f"energy_beta_{beta:g}"


def order_panel(
    clouds: Sequence[np.ndarray],
    *,
    last: np.ndarray | None = None,
    labels: Sequence[Any] | np.ndarray | None = None,
    betas: Sequence[float] = BETAS,
    fitted_beta: float | None = None,
    n_boot: int = 1000,
    seed: int = 0,
) -> dict[str, Pace]:
    """The whole panel.

    Args:
        clouds: per prompt, its token states ``(T, n_p, d)`` (every position).
        last: ``(T, P, d)`` the last-token states across prompts (optional).
        labels: ``(P,)`` each prompt's category (fuzziness needs two or more).
        betas: the fixed grid of ``E_beta``.
        fitted_beta: also ``E_beta`` at this beta (key ``energy_beta_fitted``).
        n_boot: bootstrap resamples (the across-prompt clouds use a fifth of them).
        seed: seeds the bootstrap.

    Returns:
        ``{quantity: Pace}``: ``energy_beta_<b>``, ``matrix_entropy``,
        ``intrinsic_dimension`` of the prompts' token clouds; with ``last``, the
        same on the last-token cloud prefixed ``last_token_``, and ``fuzziness``
        when ``labels`` has two or more categories.

    Example:
        >>> sim = tf.simulate(tf.Dynamics(beta=4.0), tf.initial_condition("uniform", n=8, d=3),
        ...                   t_max=1.0, dt=0.1)
        >>> states = sim.states.values                 # two "prompts" of 4 tokens
        >>> panel = tf.order_panel([states[:, :4], states[:, 4:]], n_boot=50)
        >>> sorted(panel)[:3], panel["matrix_entropy"].per_layer.shape
        (['energy_beta_1', 'energy_beta_16', 'energy_beta_4'], (11,))
    """
    measures: dict[str, Callable[[np.ndarray], float]] = {}
    for beta in betas:
        measures[_energy_key(beta)] = lambda x, b=float(beta): sphere_energy(x, b)
    if fitted_beta is not None and math.isfinite(fitted_beta):
        measures["energy_beta_fitted"] = lambda x, b=float(fitted_beta): sphere_energy(x, b)
    measures["matrix_entropy"] = matrix_entropy
    measures["intrinsic_dimension"] = twonn_dimension
    panel: dict[str, Pace] = {}
    for name, measure in measures.items():
        table = np.array([[measure(frame) for frame in cloud] for cloud in clouds])
        try:
            result = pace(table, n_boot=n_boot, seed=seed)
        except UserError:  # no prompt has a finite curve (e.g. TwoNN on collapsed clusters)
            result = _undefined(table)
        if name == "energy_beta_fitted":
            result.extra["beta"] = float(fitted_beta)  # type: ignore[arg-type]
        panel[name] = result
    if last is not None:
        few = max(50, n_boot // 5)
        for name, measure in measures.items():
            result = pace_of_cloud(
                last, lambda x, _l, m=measure: m(x), labels, n_boot=few, seed=seed
            )
            if name == "energy_beta_fitted":
                result.extra["beta"] = float(fitted_beta)  # type: ignore[arg-type]
            panel[f"last_token_{name}"] = result
        if labels is not None and np.unique(np.asarray(labels)).size >= 2:
            panel["fuzziness"] = pace_of_cloud(last, fuzziness, labels, n_boot=few, seed=seed)
    return panel

"""Statistics and verdicts of the attractor analysis (``tokenfield attractors``).

Pure numpy on the arrays that :mod:`tokenfield.models.jacobian` measures; the
rules are the ones fixed in ``docs/attractors.md``:

- :func:`bootstrap_mean`: the mean over prompts with a percentile interval from
  resampling prompts (the exchangeable unit).
- :func:`basin_radius`: per prompt, the largest grid angle up to which the top-1
  token is kept for at least ``keep`` of the random directions (every smaller
  grid angle passes too).
- :func:`switch_fraction` and :func:`logistic_slope`: how far along the way from
  A's final state to B's each great-circle point ends, and the slope ``s`` of
  the logistic ``1 / (1 + exp(-s (lambda - lambda_0)))`` fitted to it. The
  identity map gives a straight line, whose best logistic has
  :data:`LINEAR_SLOPE`.
- :func:`ftle_verdicts`: consecutive start blocks whose mean top FTLE interval
  lies below 0 ("contract"), above 0 ("expand") or contains 0 ("neutral").
- :func:`basin_verdict`: the category regions act as basins from block ``l`` on
  when, at ``l`` and every later tested block, different-category switches are
  sharper than a straight line and sharper than in the random-weight copy (both
  intervals exclude it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = [
    "LINEAR_SLOPE",
    "basin_radius",
    "basin_verdict",
    "bootstrap_mean",
    "ftle_verdicts",
    "linear_slope",
    "logistic_slope",
    "switch_fraction",
    "switch_point",
]

CONFIDENCE = 0.95
MAX_SLOPE = 200.0


def bootstrap_mean(
    values: np.ndarray, *, n_boot: int = 1000, seed: int = 0, confidence: float = CONFIDENCE
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean over axis 0 (prompts or pairs) and its percentile bootstrap interval.

    ``values`` ``(P, ...)``; NaN entries are left out of each mean. Returns
    ``(mean, low, high)``, each of shape ``values.shape[1:]``.
    """
    values = np.asarray(values, dtype=float)
    count = values.shape[0]
    mean = np.nanmean(values, axis=0)
    if count < 2:
        return mean, np.full_like(mean, np.nan), np.full_like(mean, np.nan)
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, count, size=(n_boot, count))
    boot = np.nanmean(values[draws], axis=1)  # (n_boot, ...)
    alpha = (1 - confidence) / 2
    low, high = np.nanquantile(boot, [alpha, 1 - alpha], axis=0)
    return mean, low, high


def basin_radius(flipped: np.ndarray, thetas: Sequence[float], keep: float = 0.9) -> np.ndarray:
    """Basin radius per prompt from ``flipped`` ``(n_theta, n_dir, P)`` (random
    directions only) on the increasing grid ``thetas``.

    The largest grid angle ``theta_j`` such that the top-1 token is kept for at
    least ``keep`` of the directions at every ``theta_i <= theta_j``; 0 when it
    fails at the smallest angle.
    """
    thetas = np.asarray(thetas, dtype=float)
    if np.any(np.diff(thetas) <= 0):
        raise ValueError("thetas must increase")
    kept = (1 - np.asarray(flipped, dtype=float).mean(axis=1)) >= keep  # (n_theta, P)
    passing = np.cumprod(kept, axis=0).astype(bool)
    count = passing.sum(axis=0)
    return np.where(count > 0, thetas[np.maximum(count - 1, 0)], 0.0)


def switch_fraction(final: np.ndarray, final_a: np.ndarray, final_b: np.ndarray) -> np.ndarray:
    """How far along from A's final state to B's each run ended.

    ``u = angle(x, x_A) / (angle(x, x_A) + angle(x, x_B))`` with ``final``
    ``(n_lambda, P, d)`` and the ends ``(P, d)``: 0 at A's state, 1 at B's.
    """

    def unit(x: np.ndarray) -> np.ndarray:
        return x / np.linalg.norm(x, axis=-1, keepdims=True)

    def angle(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        ux, uy = unit(x), unit(y)
        return 2 * np.arctan2(np.linalg.norm(ux - uy, axis=-1), np.linalg.norm(ux + uy, axis=-1))

    to_a, to_b = angle(final, final_a[None]), angle(final, final_b[None])
    total = to_a + to_b
    return np.where(total > 0, to_a / np.where(total > 0, total, 1), 0.5)


def switch_point(is_b: np.ndarray, lambdas: Sequence[float]) -> np.ndarray:
    """Per pair, the first ``lambda`` from which an indicator ``(n_lambda, P)`` (the
    nearest centroid is B's, or the top-1 token is B's) holds up to ``lambda = 1``;
    NaN where it does not hold at ``lambda = 1`` (the run never switched)."""
    lam = np.asarray(lambdas, dtype=float)
    held = np.asarray(is_b, dtype=float) > 0.5
    tail = np.flip(np.cumprod(np.flip(held, axis=0), axis=0), axis=0).astype(bool)
    count = tail.sum(axis=0)  # how many trailing points hold
    first = lam.size - count
    return np.where(count > 0, lam[np.minimum(first, lam.size - 1)], np.nan)


def _logistic(lam: np.ndarray, slope: float, mid: float) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.clip(slope * (lam - mid), -60, 60)))


def _fit_one(lam: np.ndarray, u: np.ndarray) -> tuple[float, float]:
    """Least squares over a (slope, midpoint) grid, then refined by Nelder-Mead."""
    from scipy.optimize import minimize

    slopes = np.geomspace(0.5, MAX_SLOPE, 48)
    mids = np.linspace(-0.25, 1.25, 61)
    pred = _logistic(lam[None, None, :], slopes[:, None, None], mids[None, :, None])
    loss = ((pred - u[None, None, :]) ** 2).sum(-1)
    i, j = np.unravel_index(np.argmin(loss), loss.shape)

    def objective(p: np.ndarray) -> float:
        slope = float(np.clip(np.exp(p[0]), 1e-3, MAX_SLOPE))
        return float(((_logistic(lam, slope, p[1]) - u) ** 2).sum())

    best = minimize(objective, [np.log(slopes[i]), mids[j]], method="Nelder-Mead",
                    options={"xatol": 1e-4, "fatol": 1e-10})  # fmt: skip
    return float(np.clip(np.exp(best.x[0]), 1e-3, MAX_SLOPE)), float(best.x[1])


def logistic_slope(lambdas: Sequence[float], fraction: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Fit ``u(lambda) ~ 1 / (1 + exp(-s (lambda - lambda_0)))`` per pair.

    ``fraction`` ``(n_lambda, P)``. Returns ``(slope, midpoint)``, each ``(P,)``;
    the slope is capped at :data:`MAX_SLOPE` (a step)."""
    lam = np.asarray(lambdas, dtype=float)
    fraction = np.asarray(fraction, dtype=float)
    fits = [_fit_one(lam, fraction[:, p]) for p in range(fraction.shape[1])]
    slope = np.array([f[0] for f in fits])
    mid = np.array([f[1] for f in fits])
    return slope, mid


def linear_slope(lambdas: Sequence[float] = tuple(np.linspace(0, 1, 11))) -> float:
    """The slope of the logistic fitted to a straight line ``u = lambda``."""
    lam = np.asarray(lambdas, dtype=float)
    return _fit_one(lam, lam)[0]


# linear_slope() on the default 11-point grid (tests/unit/test_attractors.py checks it)
LINEAR_SLOPE = 5.118


def _sign_word(low: float, high: float) -> str:
    if not (np.isfinite(low) and np.isfinite(high)):
        return "no interval"
    if high < 0:
        return "contract"
    if low > 0:
        return "expand"
    return "neutral"


def ftle_verdicts(
    blocks: Sequence[int], mean: np.ndarray, low: np.ndarray, high: np.ndarray
) -> list[dict[str, Any]]:
    """Group consecutive start blocks by the sign of the mean top FTLE's interval.

    Returns ``[{"blocks": [first, last], "verdict": "contract" | "neutral" |
    "expand", "text": ...}]``."""
    ranges: list[dict[str, Any]] = []
    for block, lo, hi in zip(blocks, low, high, strict=True):
        word = _sign_word(float(lo), float(hi))
        if ranges and ranges[-1]["verdict"] == word:
            ranges[-1]["blocks"][1] = int(block)
        else:
            ranges.append({"blocks": [int(block), int(block)], "verdict": word})
    for item in ranges:
        first, last = item["blocks"]
        where = f"block {first}" if first == last else f"blocks {first}-{last}"
        item["text"] = {
            "contract": f"{where}: directions contract toward the output",
            "expand": f"{where}: directions expand toward the output",
            "neutral": f"{where}: neutral (the interval of the mean top FTLE contains 0)",
            "no interval": f"{where}: no interval (too few prompts)",
        }[item["verdict"]]
    return ranges


def basin_verdict(
    blocks: Sequence[int],
    trained: tuple[np.ndarray, np.ndarray, np.ndarray],
    difference: tuple[np.ndarray, np.ndarray, np.ndarray] | None,
    line_slope: float = LINEAR_SLOPE,
) -> dict[str, Any]:
    """ "The category regions act as basins from block l on: supported / not supported".

    ``trained``: ``(mean, low, high)`` of the mean log10 switch slope of
    different-category pairs per tested block; ``difference``: the same for
    trained minus random-weight copy (``None``: no copy, never supported).
    Block ``l`` passes when ``low > log10(line_slope)`` (the straight line's
    slope on the same lambda grid, :func:`linear_slope`) and the difference's
    ``low > 0``; the verdict names the earliest block from which every later
    tested block passes.
    """
    blocks = [int(b) for b in blocks]
    line = float(np.log10(line_slope))
    passes = []
    for i in range(len(blocks)):
        ok = bool(trained[1][i] > line)
        ok = ok and difference is not None and bool(difference[1][i] > 0)
        passes.append(ok)
    first = None
    for i in range(len(blocks) - 1, -1, -1):
        if not passes[i]:
            break
        first = blocks[i]
    if first is None:
        text = "the category regions act as basins: not supported at any tested block"
        if difference is None:
            text += " (no random-weight copy to compare with)"
    else:
        text = f"the category regions act as basins from block {first} on: supported"
    return {"from_block": first, "passes": passes, "supported": first is not None,
            "text": text}  # fmt: skip

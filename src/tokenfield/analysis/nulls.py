"""Permutation p-values that know a number was picked as the best of a grid.

A score measured at every layer (or over layers x alphas, heads, probe
layers...) and reported at the layer where it is largest is biased upward: with
31 layers of pure noise, the best one often looks significant. The pointwise
permutation p-value at the selected layer ignores that selection. The fix is
the *max-statistic* null (Westfall and Young's single-step maxT): shuffle the
labels once, recompute the score at every grid point, and keep the **maximum
over the grid**; the corrected p-value of an observed score is the share of
shuffles whose grid maximum reaches it:

    p_corrected(g) = (1 + #{b : max_g' null[b, g'] >= observed[g]}) / (1 + B)

computed from the same ``B`` shuffles as the pointwise

    p(g) = (1 + #{b : null[b, g] >= observed[g]}) / (1 + B).

``p_corrected(g) >= p(g)`` always (tested, NaNs included), and the corrected
p-value at the grid's maximum controls the family-wise error rate: under the
null, ``P(p_corrected <= alpha) <= alpha`` for the best grid point, whichever
it is. NaN null values (a score undefined for one shuffle) are left out of both
counts at that grid point: ``p(g)`` and ``p_corrected(g)`` are counted over the
same shuffles, those whose score at ``g`` is finite (their grid maximum taking
NaNs elsewhere as ``-inf``), so that every shuffle counted in ``p(g)`` is
counted in ``p_corrected(g)`` with a maximum at least as large. Where no
shuffle has a finite score at ``g`` both are NaN.

Every "best layer" statistic in tokenfield (the silhouette and the distance
ratio of :func:`tokenfield.analysis.separation.separation`, the probes of
:func:`tokenfield.analysis.probes.probe_accuracy`, the seed-findings script)
uses :func:`max_null_pvalues`, and a claim is stated as holding only when its
corrected p-value is below :data:`ALPHA`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["ALPHA", "MaxNull", "max_null_pvalues", "best_of_grid", "claim_status"]

#: the level at which tokenfield states a claim as holding (on a corrected p-value)
ALPHA = 0.05


@dataclass(frozen=True)
class MaxNull:
    """Pointwise and selection-corrected p-values over a grid.

    Attributes:
        p: ``(G,)`` pointwise permutation p-values.
        p_corrected: ``(G,)`` max-statistic (family-wise) p-values.
        null_max: ``(B,)`` the grid maximum of each shuffle.
        n_permutations: ``B``.
    """

    p: np.ndarray
    p_corrected: np.ndarray
    null_max: np.ndarray
    n_permutations: int


def max_null_pvalues(observed: Any, null: Any) -> MaxNull:
    """Pointwise and max-statistic p-values of ``observed`` against ``null``.

    Args:
        observed: ``(G,)`` the score at each grid point (larger = stronger).
            Any grid shape is flattened.
        null: ``(B, G)`` the same score for ``B`` label shuffles (the same
            shuffle in a row at every grid point).

    Returns:
        :class:`MaxNull`; p-values are NaN where ``observed`` is NaN or no
        shuffle's score is finite, and NaN everywhere when ``B == 0``.
        ``p_corrected >= p`` wherever both are defined.
    """
    obs = np.asarray(observed, dtype=np.float64).reshape(-1)
    null = np.asarray(null, dtype=np.float64)
    rows = null.shape[0] if null.ndim else 0
    null = null.reshape(rows, -1) if null.size else np.zeros((rows, obs.size))
    if null.shape[1] != obs.size:
        raise ValueError(f"null has {null.shape[1]} grid points, observed has {obs.size}")
    b = null.shape[0]
    p = np.full(obs.size, np.nan)
    p_corrected = np.full(obs.size, np.nan)
    finite = np.isfinite(null)
    with np.errstate(invalid="ignore"):
        null_max = (
            np.max(np.where(finite, null, -np.inf), axis=1) if obs.size else np.full(b, -np.inf)
        )
    if b == 0:
        return MaxNull(p, p_corrected, null_max, 0)
    for g in np.flatnonzero(np.isfinite(obs)):
        rows = finite[:, g]  # the shuffles whose score at g is defined: both counts
        if rows.any():
            p[g] = (1 + np.sum(null[rows, g] >= obs[g])) / (1 + rows.sum())
            p_corrected[g] = (1 + np.sum(null_max[rows] >= obs[g])) / (1 + rows.sum())
    return MaxNull(p, p_corrected, null_max, b)


def best_of_grid(observed: Any, null: Any) -> dict[str, Any]:
    """The grid point with the largest observed score, with both p-values.

    Returns:
        ``{"index", "value", "p", "p_corrected"}``; ``index`` is None when no
        observed value is finite.
    """
    obs = np.asarray(observed, dtype=np.float64).reshape(-1)
    result = max_null_pvalues(obs, null)
    if not np.isfinite(obs).any():
        return {"index": None, "value": None, "p": None, "p_corrected": None}
    index = int(np.nanargmax(obs))
    return {
        "index": index,
        "value": float(obs[index]),
        "p": float(result.p[index]),
        "p_corrected": float(result.p_corrected[index]),
    }


def claim_status(p_corrected: float | None, alpha: float = ALPHA) -> str:
    """``"holds"`` on a corrected p-value below ``alpha``, else ``"not supported"``."""
    if p_corrected is None or not np.isfinite(p_corrected):
        return "not supported"
    return "holds" if p_corrected < alpha else "not supported"

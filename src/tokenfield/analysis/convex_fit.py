"""Attention as a convex fit on the simplex.

A row ``S_t`` of a causal attention matrix lies on the simplex over ``j <= t``,
so a head's output at ``t`` is a convex combination of its vertices
``u_j = O_h v_j`` (the head's contribution to the residual stream, ``d_model``
dimensional): ``Y_t = U^T S_t``. The claim to test is that a trained head picks
weights close to the best convex fit of a target ``y_t``:

    A_t, c_t = argmin_{a in simplex(t), c >= 0} |c U_t^T a - y_t|^2.

The scale ``c`` absorbs the mismatch of norms between the head's vertices and
the target. With ``b = c a`` the problem is exactly non-negative least squares,
``min_{b >= 0} |U_t^T b - y_t|^2`` (any ``b >= 0`` is ``c a`` with
``c = sum b``), which :func:`nnls_gram` solves exactly by the Lawson-Hanson
active-set method in the ``t x t`` Gram space (``G = U U^T``, ``c = U y``), so
the cost does not depend on ``d_model``. When the best ``b`` is 0 (the target
points away from every vertex) ``A_t`` is undefined and ``t`` is left out.

Per position the gap and the hull residual are

    Q_t = (S_t - A_t)^T G (S_t - A_t) / |y_t|^2,
    hull_t = min_{b >= 0} |U_t^T b - y_t|^2 / |y_t|^2.

Nulls (per head, over a set of prompts):

- **uniform**: the same ``Q_t`` with uniform causal weights ``1 / (t + 1)``;
  one-sided sign-flip test over prompts of the per-prompt difference of medians;
- **shuffled targets**: the head's own weights against targets shuffled across
  the positions of each prompt (``A_t`` refitted to ``y_{pi(t)}`` over the
  vertices ``j <= t``); the statistic is the median ``Q_t`` over all positions.

A head passes when it beats both (the larger p-value) at a Holm-corrected
``p < 0.05`` over the heads of its layer. The same test is run with the
norm-weighted attention ``S~_tj = S_tj |u_j| / sum_k S_tk |u_k|``, since a large
weight on a small vector does little.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tokenfield.errors import UserError

__all__ = [
    "ALPHA",
    "HeadTest",
    "PromptGaps",
    "convex_fit",
    "holm",
    "nnls_gram",
    "prompt_gaps",
    "head_test",
    "layer_summary",
]

ALPHA = 0.05


def nnls_gram(gram: np.ndarray, cross: np.ndarray) -> np.ndarray:
    """Exact ``argmin_{b >= 0} b^T G b - 2 b^T c`` for one or several ``c``.

    This is ``argmin_{b >= 0} |U^T b - y|^2`` for ``G = U U^T``, ``c = U y``. With
    ``G = V diag(lambda) V^T`` and ``F = diag(sqrt(lambda)) V^T`` (positive
    ``lambda`` only) the objective is ``|F b - z|^2 + const`` with
    ``z = diag(lambda^-1/2) V^T c`` (``c`` lies in the range of ``G``), solved by
    SciPy's Lawson-Hanson active-set NNLS in ``m`` dimensions, whatever ``d`` is.

    Args:
        gram: ``(m, m)`` symmetric positive semi-definite.
        cross: ``(m,)`` or ``(m, k)`` (``k`` problems sharing ``G``).

    Returns:
        ``b`` shaped like ``cross``.
    """
    from scipy.optimize import nnls

    gram = np.asarray(gram, dtype=np.float64)
    cross = np.asarray(cross, dtype=np.float64)
    lam, vec = np.linalg.eigh(gram)
    keep = lam > max(float(lam.max(initial=0.0)), 1e-300) * 1e-12
    if not keep.any():
        return np.zeros_like(cross)
    root = np.sqrt(lam[keep])
    factor = root[:, None] * vec[:, keep].T  # (r, m)
    rhs = (vec[:, keep].T @ cross) / (root[:, None] if cross.ndim == 2 else root)
    if cross.ndim == 1:
        return nnls(factor, rhs, maxiter=50 * gram.shape[0] + 50)[0]
    columns = [
        nnls(factor, rhs[:, k], maxiter=50 * gram.shape[0] + 50)[0] for k in range(rhs.shape[1])
    ]
    return np.stack(columns, axis=1)


@dataclass(frozen=True)
class ConvexFit:
    """The best scaled convex combination: ``weights`` on the simplex, ``scale`` ``c >= 0``,
    and ``residual`` ``|c U^T a - y|^2 / |y|^2``; ``weights`` is NaN when ``c = 0``."""

    weights: np.ndarray
    scale: float
    residual: float


def convex_fit(vertices: np.ndarray, target: np.ndarray) -> ConvexFit:
    """``argmin_{a in simplex, c >= 0} |c vertices^T a - target|^2``.

    Args:
        vertices: ``(m, d)`` the vertices ``u_j`` as rows.
        target: ``(d,)``.

    Returns:
        A ``ConvexFit``: ``weights`` on the simplex, ``scale`` ``c`` and the
        relative ``residual``.

    Example:
        >>> tf.convex_fit(np.eye(3), np.array([0.2, 0.3, 0.5]))
        ConvexFit(weights=array([0.2, 0.3, 0.5]), scale=1.0, residual=0.0)
    """
    u = np.asarray(vertices, dtype=np.float64)
    y = np.asarray(target, dtype=np.float64)
    b = nnls_gram(u @ u.T, u @ y)
    return _fit_of(b, u @ u.T, u @ y, float(y @ y))


def _fit_of(b: np.ndarray, gram: np.ndarray, cross: np.ndarray, yy: float) -> ConvexFit:
    scale = float(b.sum())
    resid = max(0.0, float(b @ gram @ b - 2 * b @ cross + yy)) / yy if yy > 0 else float("nan")
    weights = b / scale if scale > 0 else np.full_like(b, np.nan)
    return ConvexFit(weights, scale, resid)


@dataclass(frozen=True)
class PromptGaps:
    """One head on one prompt: per query position ``t`` with a target (``m`` of them).

    Attributes:
        q: ``(m,)`` ``Q_t`` of the head's weights (NaN where ``A_t`` is undefined).
        q_uniform: ``(m,)`` ``Q_t`` of uniform causal weights.
        q_norm: ``(m,)`` ``Q_t`` of the norm-weighted weights.
        q_table: ``(m, m)`` ``Q`` of the head's weights at ``t`` against the fit
            to the target of position ``s`` (the shuffle null's lookup; the
            diagonal is ``q``).
        q_norm_table: the same for the norm-weighted weights.
        hull: ``(m,)`` the convex-hull residual ``|c U^T A_t - y_t|^2 / |y_t|^2``.
        scale: ``(m,)`` the fitted ``c``.
    """

    q: np.ndarray
    q_uniform: np.ndarray
    q_norm: np.ndarray
    q_table: np.ndarray
    q_norm_table: np.ndarray
    hull: np.ndarray
    scale: np.ndarray


def _quad(diff: np.ndarray, gram: np.ndarray) -> float:
    return float(diff @ gram @ diff)


def prompt_gaps(vertices: np.ndarray, weights: np.ndarray, targets: np.ndarray) -> PromptGaps:
    """The gaps of one head on one prompt.

    Args:
        vertices: ``(n, d)`` ``u_j = O_h v_j``.
        weights: ``(n, n)`` the head's causal attention (row ``t`` over ``j <= t``).
        targets: ``(m, d)`` the target of each query position ``t = 0 .. m-1``
            (``m <= n``; e.g. the next token's embedding, ``m = n - 1``).
    """
    u = np.asarray(vertices, dtype=np.float64)
    s_all = np.asarray(weights, dtype=np.float64)
    y = np.asarray(targets, dtype=np.float64)
    n, m = u.shape[0], y.shape[0]
    if s_all.shape != (n, n) or m > n or y.shape[1] != u.shape[1]:
        raise UserError(
            f"shapes do not fit: vertices {u.shape}, weights {s_all.shape}, targets {y.shape}"
        )
    gram = u @ u.T  # (n, n)
    cross = u @ y.T  # (n, m)
    yy = np.einsum("sd,sd->s", y, y)  # (m,)
    norms = np.sqrt(np.clip(np.diag(gram), 0.0, None))
    nan = np.full(m, np.nan)
    q, q_uni, q_norm, hull, scale = nan.copy(), nan.copy(), nan.copy(), nan.copy(), nan.copy()
    q_table = np.full((m, m), np.nan)
    q_norm_table = np.full((m, m), np.nan)
    for t in range(m):
        k = t + 1
        g = gram[:k, :k]
        row = s_all[t, :k]
        row = row / row.sum()
        mass = row * norms[:k]
        normed = mass / mass.sum() if mass.sum() > 0 else row
        uniform = np.full(k, 1.0 / k)
        solutions = nnls_gram(g, cross[:k])  # (k, m): one fit per target
        for s in range(m):
            if yy[s] <= 0:
                continue
            fit = _fit_of(solutions[:, s], g, cross[:k, s], float(yy[s]))
            if fit.scale <= 0:
                continue
            q_table[t, s] = _quad(row - fit.weights, g) / yy[s]
            q_norm_table[t, s] = _quad(normed - fit.weights, g) / yy[s]
            if s == t:
                q[t] = q_table[t, s]
                q_norm[t] = q_norm_table[t, s]
                q_uni[t] = _quad(uniform - fit.weights, g) / yy[s]
                hull[t] = fit.residual
                scale[t] = fit.scale
    return PromptGaps(q, q_uni, q_norm, q_table, q_norm_table, hull, scale)


@dataclass(frozen=True)
class HeadTest:
    """One head over a set of prompts (medians over every prompt's valid positions)."""

    median_q: float
    median_uniform: float
    median_shuffled: float
    p_uniform: float
    p_shuffled: float
    median_q_norm: float
    p_norm: float
    median_hull: float
    median_scale: float
    n_positions: int

    @property
    def p(self) -> float:
        """Beats both nulls: the larger of the two p-values (intersection-union test)."""
        return max(self.p_uniform, self.p_shuffled)

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "p": self.p}


def _nanmedian(values: Sequence[np.ndarray]) -> float:
    flat = np.concatenate([np.asarray(v).ravel() for v in values]) if values else np.array([])
    flat = flat[np.isfinite(flat)]
    return float(np.median(flat)) if flat.size else float("nan")


def _sign_flip_p(diffs: np.ndarray, n_flips: int, rng: np.random.Generator) -> float:
    """One-sided ``P(mean(eps d) <= mean(d))`` under random signs (small: ``d`` below 0)."""
    diffs = diffs[np.isfinite(diffs)]
    if diffs.size == 0:
        return 1.0
    observed = diffs.mean()
    signs = rng.choice((-1.0, 1.0), size=(n_flips, diffs.size))
    null = (signs * diffs).mean(axis=1)
    return float((1 + np.sum(null <= observed + 1e-15 * abs(observed))) / (n_flips + 1))


def _shuffle_p(
    tables: Sequence[np.ndarray], observed: float, n_shuffles: int, rng: np.random.Generator
) -> tuple[float, float]:
    """``P(median Q under shuffled targets <= observed)`` and the null's median."""
    if not np.isfinite(observed):
        return 1.0, float("nan")
    picked = []
    for table in tables:
        m = table.shape[0]
        perms = np.argsort(rng.random((n_shuffles, m)), axis=1)  # (K, m) a permutation per row
        picked.append(table[np.arange(m)[None, :], perms])  # (K, m): Q at t against y_pi(t)
    with warnings.catch_warnings():  # a shuffle whose every position is undefined: NaN
        warnings.simplefilter("ignore", RuntimeWarning)
        null = np.nanmedian(np.concatenate(picked, axis=1), axis=1)  # (K,)
    finite = null[np.isfinite(null)]
    count = int(np.sum(finite <= observed))
    return (1 + count) / (n_shuffles + 1), float(np.median(finite)) if finite.size else np.nan


def head_test(
    prompts: Sequence[PromptGaps], *, n_shuffles: int = 199, n_flips: int = 999, seed: int = 0
) -> HeadTest:
    """Test one head against both nulls over ``prompts`` (see the module docstring)."""
    if not prompts:
        raise UserError("no prompts to test the head on")
    rng = np.random.default_rng(seed)
    median_q = _nanmedian([g.q for g in prompts])
    median_q_norm = _nanmedian([g.q_norm for g in prompts])
    with np.errstate(all="ignore"):
        diffs = np.array(
            [_nanmedian([g.q]) - _nanmedian([g.q_uniform]) for g in prompts], dtype=np.float64
        )
        diffs_norm = np.array([_nanmedian([g.q_norm]) - _nanmedian([g.q_uniform]) for g in prompts])
    p_uniform = _sign_flip_p(diffs, n_flips, rng)
    p_shuffled, median_shuffled = _shuffle_p(
        [g.q_table for g in prompts], median_q, n_shuffles, rng
    )
    p_norm_uniform = _sign_flip_p(diffs_norm, n_flips, rng)
    p_norm_shuffled, _ = _shuffle_p(
        [g.q_norm_table for g in prompts], median_q_norm, n_shuffles, rng
    )
    return HeadTest(
        median_q=median_q,
        median_uniform=_nanmedian([g.q_uniform for g in prompts]),
        median_shuffled=median_shuffled,
        p_uniform=p_uniform,
        p_shuffled=p_shuffled,
        median_q_norm=median_q_norm,
        p_norm=max(p_norm_uniform, p_norm_shuffled),
        median_hull=_nanmedian([g.hull for g in prompts]),
        median_scale=_nanmedian([g.scale for g in prompts]),
        n_positions=int(sum(np.isfinite(g.q).sum() for g in prompts)),
    )


def holm(p_values: Sequence[float], alpha: float = ALPHA) -> np.ndarray:
    """Holm's step-down rejections (family-wise error ``alpha``) as a boolean array."""
    p = np.asarray(p_values, dtype=np.float64)
    order = np.argsort(p, kind="stable")
    reject = np.zeros(p.size, dtype=bool)
    for rank, index in enumerate(order):
        if p[index] <= alpha / (p.size - rank):
            reject[index] = True
        else:
            break
    return reject


def layer_summary(tests: Sequence[HeadTest], alpha: float = ALPHA) -> dict[str, Any]:
    """One layer's heads: the share passing (Holm over the layer's heads), gaps and nulls."""
    passing = holm([t.p for t in tests], alpha)
    passing_norm = holm([t.p_norm for t in tests], alpha)

    def med(name: str) -> float:
        values = np.array([getattr(t, name) for t in tests], dtype=np.float64)
        values = values[np.isfinite(values)]
        return float(np.median(values)) if values.size else float("nan")

    return {
        "share_passing": float(passing.mean()),
        "share_passing_norm": float(passing_norm.mean()),
        "heads_passing": np.flatnonzero(passing).tolist(),
        "median_gap": med("median_q"),
        "median_gap_uniform": med("median_uniform"),
        "median_gap_shuffled": med("median_shuffled"),
        "median_gap_norm": med("median_q_norm"),
        "median_hull_residual": med("median_hull"),
        "median_scale": med("median_scale"),
        "heads": [t.to_dict() for t in tests],
    }

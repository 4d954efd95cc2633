"""Attention matrices read as Markov chains (seed 003): the per-matrix reduction.

A row of an attention matrix ``A`` (``A_ij >= 0``, ``sum_j A_ij = 1``) is a
probability distribution over the tokens ``j`` that token ``i`` reads, so ``A``
is the transition matrix of a random walk on the tokens. Its stationary
distribution ``pi`` (``pi A = pi``) ranks tokens by the attention mass that
flows into them, and its second eigenvalue modulus ``|lambda_2|`` says how fast
the walk forgets where it started: the spectral gap ``1 - |lambda_2|`` is large
when attention mixes all tokens (the mean-field regime of the theory) and near
0 when the tokens split into groups that barely read each other (clusters).

**The causal problem.** In a causal model ``A`` is lower triangular: its
eigenvalues are its diagonal ``A_ii`` and token 0 is absorbing (row 0 is
``e_0``), so the raw chain's stationary distribution is ``e_0`` for every
prompt and every head, and its "spectrum" is just the self-attention weights.
That is a property of the mask, not of the model. Real models add to it an
*attention sink*: most heads park most of their mass on token 0.

What tokenfield does (every number is reported, so nothing is hidden):

- ``sink_mass``: the mean over queries ``i >= 1`` of ``A_i0``, per head.
- The **symmetrised chain** (:func:`symmetrized`): the random walk on the
  undirected graph with edge weights ``W = A + A^T``, ``P = D^-1 W`` with
  ``D = diag(W 1)``. It is reversible, its eigenvalues are real (those of the
  symmetric ``D^-1/2 W D^-1/2``), and its stationary distribution has a closed
  form, ``pi_i = d_i / sum_k d_k`` with ``d_i = 1 + sum_j A_ji`` (one for the row
  ``i`` sends, plus the attention it receives). This is the chain reported as
  ``lambda2`` / ``gap`` / ``stationary``.
- The same **without the sink** (:func:`without_sink`): row and column 0
  dropped, rows renormalised, then symmetrised: ``lambda2_nosink``,
  ``gap_nosink``, ``stationary_nosink`` (NaN at token 0). Dropping the column
  alone would not help: the renormalised matrix is still lower triangular and
  token 1 becomes the new absorbing state. With the sink kept, token 0 links
  every token to every other and hides groups among the rest; with it dropped,
  two groups that only read themselves (and the sink) give ``lambda2_nosink = 1``.
- ``raw_lambda2``: the second eigenvalue modulus of ``A`` itself (for a causal
  matrix the second largest ``|A_ii|``), the naive reading, for comparison.

Everything here is numpy in, numpy out (it lives with the models engine because
the tracer uses it). :func:`summarize_attention` is what the tracer's attention
hook calls on each prompt's ``(heads, n, n)`` block, so the
``n x n`` matrices are reduced as they are produced and never stored.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from tokenfield.errors import UserError

__all__ = [
    "DENSE_LIMIT",
    "PER_HEAD",
    "PER_TOKEN",
    "STOCHASTIC_TOL",
    "AttentionSummary",
    "eigenvalue_moduli",
    "row_entropy",
    "second_eigenvalue_modulus",
    "spectral_gap",
    "stationary_distribution",
    "summarize_attention",
    "symmetrized",
    "symmetrized_spectrum",
    "without_sink",
]

# Above this many tokens the symmetrised chain's |lambda_2| comes from a Lanczos
# solve on the deflated matrix instead of a dense eigendecomposition.
DENSE_LIMIT = 384
STOCHASTIC_TOL = 1e-4


def _check_square(matrix: np.ndarray) -> np.ndarray:
    matrix = np.asarray(matrix, dtype=np.float64)
    if matrix.ndim != 2 or matrix.shape[0] != matrix.shape[1] or matrix.shape[0] < 1:
        raise UserError(f"expected a square (n, n) matrix, got shape {matrix.shape}")
    if not np.isfinite(matrix).all():
        raise UserError("the matrix has non-finite entries")
    return matrix


def _check_stochastic(matrix: np.ndarray) -> np.ndarray:
    matrix = _check_square(matrix)
    if (matrix < -STOCHASTIC_TOL).any() or not np.allclose(
        matrix.sum(axis=1), 1.0, atol=STOCHASTIC_TOL
    ):
        raise UserError(
            "the matrix is not row-stochastic (entries >= 0, rows summing to 1)",
            "pass attention weights (after the softmax)",
        )
    return matrix


def row_entropy(matrix: np.ndarray) -> np.ndarray:
    """Entropy of each row in nats: ``H_i = -sum_j P_ij log P_ij`` (``0 log 0 = 0``).

    Args:
        matrix: ``(..., n, n)`` row-stochastic.

    Returns:
        ``(..., n)``.
    """
    p = np.clip(np.asarray(matrix, dtype=np.float64), 0.0, None)
    logs = np.log(np.where(p > 0, p, 1.0))
    return -(p * logs).sum(axis=-1)


def eigenvalue_moduli(matrix: np.ndarray) -> np.ndarray:
    """``|lambda_k|`` of a square matrix, in descending order: ``(n,)``."""
    matrix = _check_square(matrix)
    return np.sort(np.abs(np.linalg.eigvals(matrix)))[::-1]


def second_eigenvalue_modulus(matrix: np.ndarray) -> float:
    """The second largest ``|lambda|`` (counted with multiplicity; NaN for ``n = 1``).

    For a row-stochastic matrix the largest is 1; a repeated eigenvalue 1 (a
    chain that splits into closed classes) gives 1.
    """
    moduli = eigenvalue_moduli(matrix)
    return float(moduli[1]) if moduli.size > 1 else float("nan")


def spectral_gap(matrix: np.ndarray) -> float:
    """``1 - |lambda_2|``: 0 for a chain that never mixes, 1 for one that mixes in one step."""
    return 1.0 - second_eigenvalue_modulus(matrix)


def stationary_distribution(matrix: np.ndarray) -> np.ndarray:
    """The stationary distribution ``pi`` of a row-stochastic ``P``: ``pi P = pi``.

    It is the left eigenvector for the eigenvalue closest to 1, made
    non-negative and summing to 1. When 1 is a repeated eigenvalue (several
    closed classes) the stationary distribution is not unique and this returns
    one of them.

    Args:
        matrix: ``(n, n)`` row-stochastic.

    Returns:
        ``(n,)``.

    Example:
        >>> tf.stationary_distribution(np.array([[0.5, 0.5], [0.25, 0.75]]))
        array([0.33333333, 0.66666667])
    """
    p = _check_stochastic(matrix)
    values, vectors = np.linalg.eig(p.T)
    pick = int(np.argmin(np.abs(values - 1.0)))
    pi = np.real(vectors[:, pick])
    pi = pi * np.sign(pi.sum()) if pi.sum() != 0 else np.abs(pi)
    pi = np.clip(pi, 0.0, None)
    return pi / pi.sum()


def symmetrized(matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The reversible chain of ``A``: ``P = D^-1 (A + A^T)`` and its stationary ``pi``.

    ``pi_i = d_i / sum_k d_k`` with ``d = (A + A^T) 1`` (detailed balance:
    ``pi_i P_ij = W_ij / sum d`` is symmetric).

    Returns:
        ``(P, pi)``: ``(n, n)`` and ``(n,)``.
    """
    a = _check_square(matrix)
    w = a + a.T
    degree = w.sum(axis=1)
    degree = np.where(degree > 0, degree, 1.0)
    return w / degree[:, None], degree / degree.sum()


def without_sink(matrix: np.ndarray, sink: int = 0) -> np.ndarray:
    """Drop the sink's row and column and renormalise the remaining rows.

    A row that put all its mass on the sink becomes a self-loop.

    Returns:
        ``(n - 1, n - 1)`` row-stochastic.
    """
    a = _check_square(matrix)
    keep = np.delete(np.arange(a.shape[0]), sink)
    b = a[np.ix_(keep, keep)]
    sums = b.sum(axis=1)
    empty = sums <= 0
    if empty.any():
        b = b.copy()
        b[empty, np.flatnonzero(empty)] = 1.0
        sums = b.sum(axis=1)
    return b / sums[:, None]


def symmetrized_spectrum(matrix: np.ndarray) -> tuple[float, np.ndarray]:
    """``|lambda_2|`` and ``pi`` of the symmetrised chain of ``A`` (see :func:`symmetrized`).

    The eigenvalues of ``P = D^-1 W`` are those of ``S = D^-1/2 W D^-1/2``, whose
    top eigenvector is ``sqrt(pi)`` with eigenvalue 1. Small ``n``: dense
    ``eigvalsh``; large ``n``: the largest ``|eigenvalue|`` of the deflated
    ``S - sqrt(pi) sqrt(pi)^T`` by Lanczos. NaN for ``n = 1``.
    """
    a = _check_square(matrix)
    n = a.shape[0]
    w = a + a.T
    degree = w.sum(axis=1)
    degree = np.where(degree > 0, degree, 1.0)
    pi = degree / degree.sum()
    if n == 1:
        return float("nan"), pi
    root = 1.0 / np.sqrt(degree)
    s = w * root[:, None] * root[None, :]  # (n, n) symmetric
    if n <= DENSE_LIMIT:
        values = np.linalg.eigvalsh(s)  # ascending; values[-1] = 1
        return float(min(1.0, max(abs(values[0]), abs(values[-2])))), pi
    from scipy.sparse.linalg import eigsh

    top = np.sqrt(pi)
    s -= np.outer(top, top)
    value = eigsh(s, k=1, which="LM", return_eigenvectors=False, tol=1e-8)
    return float(min(1.0, abs(value[0]))), pi


def _raw_lambda2(a: np.ndarray, causal: bool) -> float:
    if a.shape[0] == 1:
        return float("nan")
    if causal:  # triangular: the eigenvalues are the diagonal
        return float(np.sort(np.abs(np.diag(a)))[::-1][1])
    return second_eigenvalue_modulus(a)


@dataclass(frozen=True)
class AttentionSummary:
    """Markov-chain statistics of one prompt's attention in one layer, per head.

    Per-head arrays are ``(heads,)``; per-token arrays ``(heads, n)``.

    Attributes:
        entropy: mean over queries ``i >= 1`` of the row entropy divided by its
            maximum ``log k_i`` (``k_i`` = keys row ``i`` may read: ``i + 1``
            causal, ``n`` otherwise): 1 = uniform attention, 0 = one key.
        sink_mass: mean over queries ``i >= 1`` of ``A_i0``.
        lambda2: ``|lambda_2|`` of the symmetrised chain (sink kept).
        lambda2_nosink: the same after :func:`without_sink` (NaN for ``n < 3``).
        raw_lambda2: ``|lambda_2|`` of ``A`` itself (causal: second largest ``A_ii``).
        stationary: ``pi`` of the symmetrised chain.
        stationary_nosink: ``pi`` of the sink-free chain, NaN at token 0.
    """

    entropy: np.ndarray
    sink_mass: np.ndarray
    lambda2: np.ndarray
    lambda2_nosink: np.ndarray
    raw_lambda2: np.ndarray
    stationary: np.ndarray
    stationary_nosink: np.ndarray

    @property
    def gap(self) -> np.ndarray:
        return 1.0 - self.lambda2

    @property
    def gap_nosink(self) -> np.ndarray:
        return 1.0 - self.lambda2_nosink

    def to_dict(self) -> dict[str, list]:
        return {f.name: getattr(self, f.name).tolist() for f in fields(self)}


PER_HEAD = ("entropy", "sink_mass", "lambda2", "lambda2_nosink", "raw_lambda2")
PER_TOKEN = ("stationary", "stationary_nosink")


def summarize_attention(weights: np.ndarray, *, causal: bool) -> AttentionSummary:
    """Reduce one prompt's attention weights to :class:`AttentionSummary`.

    Args:
        weights: ``(heads, n, n)`` (or ``(n, n)``) attention of one prompt in one
            layer, rows summing to 1 (padding already cut away).
        causal: the model is causal (sets the entropy's maximum and the raw
            spectrum's shortcut).

    Returns:
        The summary; nothing of size ``n x n`` is kept.

    Example:
        >>> weights = np.tril(np.ones((4, 4)))
        >>> weights /= weights.sum(axis=1, keepdims=True)   # causal, uniform rows
        >>> summary = tf.summarize_attention(weights, causal=True)
        >>> summary.entropy, summary.sink_mass.round(4)
        (array([1.]), array([0.3611]))
    """
    w = np.asarray(weights)  # kept in its own dtype; one head at a time in float64
    if w.ndim == 2:
        w = w[None]
    if w.ndim != 3 or w.shape[1] != w.shape[2]:
        raise UserError(f"attention weights must be (heads, n, n), got shape {w.shape}")
    heads, n = w.shape[0], w.shape[1]
    nan = np.full(heads, np.nan)
    entropy, sink, lam, lam_ns, raw = nan.copy(), nan.copy(), nan.copy(), nan.copy(), nan.copy()
    pi = np.zeros((heads, n))
    pi_ns = np.full((heads, n), np.nan)
    keys = np.arange(1, n + 1, dtype=np.float64) if causal else np.full(n, float(n))
    for h in range(heads):
        a = np.clip(np.asarray(w[h], dtype=np.float64), 0.0, None)  # (n, n)
        sums = a.sum(-1, keepdims=True)
        a = a / np.where(sums > 0, sums, 1.0)
        if n > 1:
            ent = row_entropy(a)[1:] / np.log(keys[1:])
            entropy[h] = float(ent.mean())
            sink[h] = float(a[1:, 0].mean())
        lam[h], pi[h] = symmetrized_spectrum(a)
        raw[h] = _raw_lambda2(a, causal)
        if n >= 2:
            lam_value, pi_rest = symmetrized_spectrum(without_sink(a))
            lam_ns[h] = lam_value if n >= 3 else np.nan
            pi_ns[h, 1:] = pi_rest
    return AttentionSummary(entropy, sink, lam, lam_ns, raw, pi, pi_ns)

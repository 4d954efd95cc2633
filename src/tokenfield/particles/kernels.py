"""Attention kernels: the interaction term of the particle system, computed fast.

For queries ``q_i = Q x_i``, keys ``k_j = K x_j`` and values ``v_j = V x_j``::

    SA:   out_i = sum_j exp(beta <q_i, k_j>) v_j / Z_i,   Z_i = sum_k exp(beta <q_i, k_k>)
    USA:  out_i = sum_j exp(beta <q_i, k_j>) v_j / n   = SA_i * Z_i / n

SA is exactly softmax attention with ``scale = beta``, so it goes through
:func:`torch.nn.functional.scaled_dot_product_attention`, a fused kernel (flash
attention on CPU and CUDA) that never holds the ``n x n`` weight matrix. USA
reuses it and multiplies by ``Z_i / n``; ``log Z_i`` is a log-sum-exp over the
keys computed a block of queries at a time, so memory stays ``O(chunk * n)``.

With a causal mask token ``i`` attends to ``j <= i`` only (``Z_i`` sums over
``j <= i``; the USA weights are still divided by ``n``, the number of tokens).

:func:`attention_dense` is the naive reference that builds every ``n x n``
matrix; the tests check the fast kernel against it.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

# Memory for one block of USA scores; the query block shrinks as n grows.
CHUNK_BYTES = 64 * 2**20


def _chunk_rows(q: torch.Tensor, n_keys: int, chunk_size: int | None) -> int:
    if chunk_size is not None:
        return max(1, int(chunk_size))
    batch = math.prod(q.shape[:-2]) or 1
    per_row = max(1, batch * n_keys * q.element_size())
    return max(1, min(q.shape[-2], CHUNK_BYTES // per_row))


def log_partition(
    q: torch.Tensor,
    k: torch.Tensor,
    beta: float,
    *,
    causal: bool = False,
    chunk_size: int | None = None,
) -> torch.Tensor:
    """``log Z_i = logsumexp_j beta <q_i, k_j>`` without the full score matrix.

    Args:
        q, k: ``(..., n, e)`` queries and keys (same leading shape).
        beta: inverse temperature.
        causal: sum over ``j <= i`` only.
        chunk_size: queries per block (default: as many as fit in ``CHUNK_BYTES``).

    Returns:
        ``(..., n)``.
    """
    n = q.shape[-2]
    rows = _chunk_rows(q, k.shape[-2], chunk_size)
    out = q.new_empty(q.shape[:-1])
    key_t = k.transpose(-1, -2)  # (..., e, n)
    for start in range(0, n, rows):
        stop = min(n, start + rows)
        stop_key = stop if causal else k.shape[-2]
        scores = torch.matmul(q[..., start:stop, :], key_t[..., :stop_key])  # (..., c, m)
        scores.mul_(beta)
        if causal:
            i = torch.arange(start, stop, device=q.device).unsqueeze(-1)
            j = torch.arange(stop_key, device=q.device)
            scores.masked_fill_(j > i, float("-inf"))
        out[..., start:stop] = torch.logsumexp(scores, dim=-1)
    return out


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    beta: float,
    normalization: str = "sa",
    causal: bool = False,
    log_scale: float = 0.0,
    chunk_size: int | None = None,
) -> torch.Tensor:
    """The attention term, fused; no ``n x n`` matrix is held.

    Args:
        q, k, v: ``(..., n, e)`` queries, keys and values (any leading dims,
            e.g. ``(batch, heads)``).
        beta: inverse temperature (the softmax scale).
        normalization: ``"sa"`` (divide by ``Z_i``) or ``"usa"`` (divide by ``n``).
        causal: token ``i`` attends to ``j <= i``.
        log_scale: USA only: the weights are multiplied by ``exp(log_scale)``
            (``-beta`` gives the rescaled time ``exp(beta(<q,k> - 1))``). SA is
            unchanged by any constant factor, which cancels in ``Z_i``.
        chunk_size: USA only: queries per block of the log-sum-exp.

    Returns:
        ``(..., n, e)``, dtype and device of ``q``.
    """
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=float(beta))
    if normalization == "sa":
        return out
    if normalization != "usa":
        raise ValueError(f"normalization must be 'sa' or 'usa', not {normalization!r}")
    n = q.shape[-2]
    log_z = log_partition(q, k, beta, causal=causal, chunk_size=chunk_size)  # (..., n)
    factor = torch.exp(log_z + (log_scale - math.log(n)))  # Z_i / n
    return out * factor.unsqueeze(-1)


def attention_dense(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    beta: float,
    normalization: str = "sa",
    causal: bool = False,
    log_scale: float = 0.0,
) -> torch.Tensor:
    """The naive reference: builds ``W_ij = exp(beta <q_i, k_j>)`` in full.

    Same arguments and result as :func:`attention`; ``O(n^2)`` memory. Kept
    deliberately plain (no max-subtraction) so that it shares nothing with the
    fast path; use it with moderate ``beta`` only.
    """
    n = q.shape[-2]
    weights = torch.exp(beta * torch.matmul(q, k.transpose(-1, -2)))  # (..., n, n)
    if causal:
        mask = torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1)
        weights = weights.masked_fill(mask, 0.0)
    if normalization == "sa":
        weights = weights / weights.sum(dim=-1, keepdim=True)
    else:
        weights = weights * (math.exp(log_scale) / n)
    return torch.matmul(weights, v)

"""Attention kernels: the interaction term of the particle system, computed fast.

For queries ``q_i = Q x_i``, keys ``k_j = K x_j`` and values ``v_j = V x_j``::

    SA:   out_i = sum_j exp(beta <q_i, k_j>) v_j / Z_i,   Z_i = sum_k exp(beta <q_i, k_k>)
    USA:  out_i = sum_j exp(beta <q_i, k_j>) v_j / n   = SA_i * Z_i / n

SA is exactly softmax attention with ``scale = beta``, so it goes through
:func:`torch.nn.functional.scaled_dot_product_attention`, a fused kernel (flash
attention on CPU, memory-efficient attention on CUDA) that never holds the
``n x n`` weight matrix. USA is the SA output times ``Z_i / n``. Two ways to
get ``Z_i``, both exact and ``O(n)`` in memory:

- ``"logsumexp"``: ``log Z_i`` as a log-sum-exp over the keys, a block of
  queries at a time (memory ``O(chunk * n)``); a second pass over all pairs.
- ``"phantom"`` (the default): the same fused call with one extra key. Append
  a column ``c_i = <q_i, k_i>`` to each query, a 0 column to the keys and the
  values, and one phantom key ``e_{extra}`` with value ``e_{extra}``. The
  phantom's weight is ``exp(beta c_i)``, so the output's extra column is
  ``o_i = e^{beta c_i} / (Z_i + e^{beta c_i})`` and the other columns are
  ``sum_j e^{beta <q_i,k_j>} v_j / (Z_i + e^{beta c_i})``; multiplying them by
  ``e^{beta c_i} / (o_i n)`` gives USA with no cancellation. ``beta c_i <= log Z_i``
  (the ``j = i`` term), so ``o_i <= 1/2``; if it underflowed (extreme
  ``beta |Q||K|``) the log-sum-exp path is used instead. One pass instead of
  two, and one fused call instead of many small ones (the block loop is
  measured 2x slower on an idle 2-core CPU and 10x or worse on a busy one).
  With a causal mask a dummy query is put first so that real query ``i`` sees
  the phantom and keys ``0..i``.

Where no fused kernel exists (float64 on CUDA, whose SDPA falls back to a
kernel that materialises the weights), :func:`attention_chunked` computes both
forms a block of queries at a time instead. The head dimension is zero-padded
to a multiple of 8 for the fused kernels (zeros change no score).

With a causal mask token ``i`` attends to ``j <= i`` only (``Z_i`` sums over
``j <= i``; the USA weights are still divided by ``n``, the number of tokens).

:func:`attention_dense` is the naive reference that builds every ``n x n``
matrix; the tests check the fast kernel against it.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
import torch.nn.functional as F

# Memory for one block of scores; the query block shrinks as n grows. On CPU a
# block that stays in cache is fastest (measured: 1-4 MiB beats 64 MiB by 2-3x);
# GPUs get big blocks (fewer Python-level iterations for n ~ 1e6).
CHUNK_BYTES = {"cpu": 2 * 2**20, "cuda": 1024 * 2**20}


def _chunk_rows(q: torch.Tensor, n_keys: int, chunk_size: int | None) -> int:
    if chunk_size is not None:
        return max(1, int(chunk_size))
    batch = math.prod(q.shape[:-2]) or 1
    per_row = max(1, batch * n_keys * q.element_size())
    budget = CHUNK_BYTES.get(q.device.type, CHUNK_BYTES["cpu"])
    return max(1, min(q.shape[-2], budget // per_row))


def _fused_available(q: torch.Tensor) -> bool:
    """Whether scaled_dot_product_attention has a fused (no n x n) kernel here:
    always on CPU; on CUDA only in float32/16 (float64 falls back to the math
    kernel, which materialises the weights)."""
    return q.device.type == "cpu" or q.dtype in (torch.float32, torch.float16, torch.bfloat16)


def _as_4d(t: torch.Tensor) -> torch.Tensor:
    """``(..., n, e) -> (batch, heads, n, e)``: the fused CPU kernel only takes 4-D
    input (3-D input silently takes the slow path that builds the weights)."""
    if t.ndim >= 3:
        return t.reshape(-1, *t.shape[-3:])
    return t.reshape(1, 1, *t.shape[-2:])


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: float, causal: bool):
    shape = (*q.shape[:-1], v.shape[-1])
    width = v.shape[-1]
    q, k, v = (_as_4d(t) for t in (q, k, v))
    # fused kernels want head dims in multiples of 8 (CUDA), and run faster so on
    # CPU too (measured ~15% at d = 3); zero columns change no score and no value
    pad_qk, pad_v = (-q.shape[-1]) % 8, (-width) % 8
    if pad_qk:
        q, k = F.pad(q, (0, pad_qk)), F.pad(k, (0, pad_qk))
    if pad_v:
        v = F.pad(v, (0, pad_v))
    scale = float(beta)
    if scale == 0.0:
        # torch's fused kernel returns NaN for scale = 0 with a causal mask; zero
        # queries with scale 1 give the same (uniform over allowed keys) weights.
        q, scale = torch.zeros_like(q), 1.0
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
    return out[..., :width].reshape(shape)


def _score_blocks(
    q: torch.Tensor, k: torch.Tensor, beta: float, causal: bool, chunk_size: int | None
) -> Iterator[tuple[int, int, int, torch.Tensor]]:
    """Blocks of query rows with their scores ``beta <q_i, k_j>`` (masked ``-inf``
    for ``j > i`` when causal): ``(start, stop, stop_key, scores (..., c, m))``.
    Memory ``O(chunk * n)``; no full score matrix."""
    n = q.shape[-2]
    rows = _chunk_rows(q, k.shape[-2], chunk_size)
    key_t = k.transpose(-1, -2)  # (..., e, n)
    for start in range(0, n, rows):
        stop = min(n, start + rows)
        stop_key = stop if causal else k.shape[-2]  # causal rows never see later keys
        scores = torch.matmul(q[..., start:stop, :], key_t[..., :stop_key])  # (..., c, m)
        scores.mul_(beta)
        if causal:
            i = torch.arange(start, stop, device=q.device).unsqueeze(-1)
            j = torch.arange(stop_key, device=q.device)
            scores.masked_fill_(j > i, float("-inf"))
        yield start, stop, stop_key, scores


def attention_chunked(
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
    """The same as :func:`attention`, one block of queries at a time in plain torch
    (memory ``O(chunk * n)``); the fallback where no fused kernel exists."""
    n = q.shape[-2]
    out = q.new_empty((*q.shape[:-1], v.shape[-1]))  # (..., n, e)
    for start, stop, stop_key, scores in _score_blocks(q, k, beta, causal, chunk_size):
        if normalization == "sa":
            weights = torch.softmax(scores, dim=-1)
        else:
            weights = torch.exp(scores.add_(log_scale - math.log(n)))
        out[..., start:stop, :] = torch.matmul(weights, v[..., :stop_key, :])
    return out


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
    out = q.new_empty(q.shape[:-1])
    for start, stop, _stop_key, scores in _score_blocks(q, k, beta, causal, chunk_size):
        # in place: max, shift, exp, sum (faster than torch.logsumexp's copies);
        # the row max is finite because j = i is never masked
        peak = scores.amax(dim=-1, keepdim=True)  # (..., c, 1)
        total = scores.sub_(peak).exp_().sum(dim=-1)  # (..., c)
        out[..., start:stop] = total.log_().add_(peak.squeeze(-1))
    return out


def _usa_phantom(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: float,
    causal: bool,
    log_scale: float,
) -> torch.Tensor:
    """USA from one fused call with a phantom key (see the module docstring)."""
    n, e, width = q.shape[-2], q.shape[-1], v.shape[-1]
    lead = q.shape[:-2]
    self_score = (q * k).sum(-1, keepdim=True)  # (..., n, 1): c_i = <q_i, k_i>
    # one zero-filled buffer each, padded to a multiple of 8 columns (see _sdpa):
    # row 0 is the phantom key / value (and, causal, a dummy query)
    cols_qk, cols_v = -(-(e + 1) // 8) * 8, -(-(width + 1) // 8) * 8
    first = 1 if causal else 0
    query = q.new_zeros((*lead, n + first, cols_qk))
    query[..., first:, :e] = q
    query[..., first:, e : e + 1] = self_score
    key = q.new_zeros((*lead, n + 1, cols_qk))
    key[..., 1:, :e] = k
    key[..., 0, e] = 1.0
    value = q.new_zeros((*lead, n + 1, cols_v))
    value[..., 1:, :width] = v
    value[..., 0, width] = 1.0
    shape = (*lead, n + first, cols_v)
    out = F.scaled_dot_product_attention(
        _as_4d(query), _as_4d(key), _as_4d(value), is_causal=causal, scale=float(beta)
    ).reshape(shape)[..., first:, :]  # (..., n, cols_v)
    share = out[..., width : width + 1]  # o_i = e^{beta c_i} / (Z_i + e^{beta c_i})
    scale = torch.exp(beta * self_score + (log_scale - math.log(n))) / share
    return out[..., :width] * scale


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
    usa_method: str = "phantom",
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
        usa_method: USA only: ``"phantom"`` or ``"logsumexp"`` (see the module
            docstring); both give the same numbers.

    Returns:
        ``(..., n, e)``, dtype and device of ``q``.
    """
    if normalization not in ("sa", "usa"):
        raise ValueError(f"normalization must be 'sa' or 'usa', not {normalization!r}")
    if usa_method not in ("phantom", "logsumexp"):
        raise ValueError(f"usa_method must be 'phantom' or 'logsumexp', not {usa_method!r}")
    if not _fused_available(q):
        return attention_chunked(
            q, k, v, beta=beta, normalization=normalization, causal=causal,
            log_scale=log_scale, chunk_size=chunk_size,
        )  # fmt: skip
    if normalization == "usa" and usa_method == "phantom":
        out = _usa_phantom(q, k, v, beta, causal, log_scale)
        if bool(torch.isfinite(out).all()):
            return out
    out = _sdpa(q, k, v, beta, causal)
    if normalization == "sa":
        return out
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

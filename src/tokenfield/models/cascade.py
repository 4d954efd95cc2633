"""Attention over a shared prefix without copying it ("cascade" attention).

Many rows that start with the same tokens (a few-shot prefix shared by every
prompt, then each prompt's own question shared by every steering condition) need
the same keys and values at those positions. A plain KV cache holds one copy per
row, so decoding ``c`` conditions of ``b`` prompts copies the prefix ``c * b``
times and reads all the copies at every step. Here the keys and values live at
three levels and are never replicated:

- ``prefix``: ``(1, kv_heads, P, head_dim)``, seen by every row;
- ``middle``: ``(b, kv_heads, M, head_dim)`` with a key mask ``(b, M)``, seen by
  the ``c`` rows of each prompt (rows are ordered condition-major: row ``j * b + i``
  is condition ``j`` of prompt ``i``);
- ``own``: the rows' own tokens, in an ordinary cache, causal among themselves.

Attention is computed per level and the levels are merged exactly with their
log-sum-exp (softmax over the concatenation = weighted sum of per-level softmaxes),
so the result equals attention over the concatenated keys up to float rounding.

Use :func:`cascade` around a model call: it switches the model's attention to
this function for the duration and back afterwards, even on error. Inside, the
model's own mask is not built (every mask is applied here).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["SharedKV", "cascade"]

_NAME = "tokenfield_cascade"
_active: list[SharedKV] = []


@dataclass
class SharedKV:
    """The shared levels of one cascade call.

    Attributes:
        prefix: per layer ``(keys, values)`` of shape ``(1, kv_heads, P, head_dim)``,
            or ``None``.
        middle: per layer ``(keys, values)`` of shape ``(b, kv_heads, M, head_dim)``,
            or ``None``.
        middle_mask: ``(b, M)`` bool, True where a middle key is a real token.
        conditions: ``c``, how many rows share each prompt's middle (rows = c * b).
        own_mask: ``(rows, T)`` bool key mask of the rows' own tokens, or ``None``
            (all real); used while the own cache holds exactly ``T`` tokens.
        middle_positions: ``(b, M)`` positions of the middle keys (needed only by
            sliding-window layers; the prefix is at ``0 .. P-1``).

    The positions of the rows' own keys are collected here, per layer, from the
    ``position_ids`` of each call (sliding-window layers need them).
    """

    prefix: list[tuple[torch.Tensor, torch.Tensor]] | None = None
    middle: list[tuple[torch.Tensor, torch.Tensor]] | None = None
    middle_mask: torch.Tensor | None = None
    conditions: int = 1
    own_mask: torch.Tensor | None = None
    middle_positions: torch.Tensor | None = None
    own_positions: dict[int, torch.Tensor] = field(default_factory=dict)


def _level(
    scores: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax-weighted values of one level and their log-sum-exp.

    ``scores`` ``(..., queries, keys)``, ``values`` ``(..., keys, head_dim)``,
    ``mask`` broadcastable to ``scores`` (True = visible). Returns the normalised
    output ``(..., queries, head_dim)`` and ``lse`` ``(..., queries)`` (``-inf``
    where a query sees no key of this level; its output is then 0)."""
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    top = scores.amax(-1, keepdim=True)
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    weights = torch.exp(scores - top)
    total = weights.sum(-1, keepdim=True)
    out = (weights @ values) / total.clamp_min(torch.finfo(total.dtype).tiny)
    return out, (top + torch.log(total)).squeeze(-1)


def _attention(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Any,
    *,
    scaling: float | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """The attention interface (Hugging Face's signature): ``query`` ``(rows, heads,
    q, head_dim)``, ``key``/``value`` the rows' own tokens ``(rows, kv_heads, T,
    head_dim)``. Returns ``(rows, q, heads, head_dim)`` as the interface expects."""
    if not _active:
        raise RuntimeError("cascade attention called outside tokenfield.models.cascade.cascade()")
    shared = _active[-1]
    layer = module.layer_idx
    rows, heads, q, dim = query.shape
    kv_heads, own_len = key.shape[1], key.shape[2]
    group = heads // kv_heads
    scale = scaling if scaling is not None else 1 / math.sqrt(dim)
    prefix = shared.prefix[layer] if shared.prefix is not None else None
    middle = shared.middle[layer] if shared.middle is not None else None
    # sliding-window layers: a key is visible when query position - key position < window
    window = None
    if sliding_window is not None:
        query_pos = kwargs.get("position_ids")
        if query_pos is None:
            raise ValueError("cascade attention with a sliding window needs position_ids")
        query_pos = query_pos.to(query.device).expand(rows, q)
        seen = shared.own_positions.get(layer)
        own_pos = query_pos if seen is None else torch.cat([seen, query_pos], 1)
        shared.own_positions[layer] = own_pos
        # (rows, g*q): the position of each grouped query (index g * q + i)
        window = (query_pos.repeat(1, group), int(sliding_window))

    def capped(scores: torch.Tensor) -> torch.Tensor:
        scores = scores * scale
        return softcap * torch.tanh(scores / softcap) if softcap else scores

    # heads h = kv * group + g (Hugging Face's repeat_kv order)
    grouped = query.reshape(rows, kv_heads, group * q, dim)  # (rows, kv, g*q, d)
    levels = []

    # own tokens: causal among themselves, queries are the last q of the T tokens
    position = torch.arange(q, device=query.device).repeat(group)  # (g*q,)
    causal = torch.arange(own_len, device=query.device)[None, :] <= (
        own_len - q + position[:, None]
    )  # (g*q, T)
    own_mask = causal[None, None]
    if window is not None:
        grouped_pos, size = window
        own_mask = (
            own_mask & ((grouped_pos[:, :, None] - own_pos[:, None, :]) < size)[:, None]
        )  # (rows, 1, g*q, T)
    if shared.own_mask is not None and shared.own_mask.shape[1] == own_len:
        own_mask = own_mask & shared.own_mask[:, None, None, :].to(query.device)
    levels.append(_level(capped(grouped @ key.transpose(-1, -2)), value, own_mask))

    if middle is not None:
        keys, values = middle  # (b, kv, M, d)
        b, c = keys.shape[0], shared.conditions
        per_prompt = (
            grouped.reshape(c, b, kv_heads, group * q, dim)
            .permute(1, 2, 0, 3, 4)
            .reshape(b, kv_heads, c * group * q, dim)
        )
        mask = shared.middle_mask[:, None, None, :].to(query.device)
        if window is not None:
            grouped_pos, size = window
            per_prompt_pos = (
                grouped_pos.reshape(c, b, group * q).permute(1, 0, 2).reshape(b, c * group * q)
            )
            middle_pos = shared.middle_positions.to(query.device)  # (b, M)
            mask = (
                mask & ((per_prompt_pos[:, :, None] - middle_pos[:, None, :]) < size)[:, None]
            )  # (b, 1, c*g*q, M)
        out, lse = _level(capped(per_prompt @ keys.transpose(-1, -2)), values, mask)
        out = out.reshape(b, kv_heads, c, group * q, dim).permute(2, 0, 1, 3, 4)
        lse = lse.reshape(b, kv_heads, c, group * q).permute(2, 0, 1, 3)
        levels.append(
            (out.reshape(rows, kv_heads, group * q, dim), lse.reshape(rows, kv_heads, group * q))
        )

    if prefix is not None:
        keys, values = prefix  # (1, kv, P, d)
        flat = grouped.transpose(0, 1).reshape(kv_heads, rows * group * q, dim)
        mask = None
        if window is not None:
            grouped_pos, size = window
            prefix_pos = torch.arange(keys.shape[2], device=query.device)
            mask = (grouped_pos.reshape(-1)[:, None] - prefix_pos[None, :] < size)[None]
        out, lse = _level(capped(flat @ keys[0].transpose(-1, -2)), values[0], mask)
        levels.append(
            (
                out.reshape(kv_heads, rows, group * q, dim).transpose(0, 1),
                lse.reshape(kv_heads, rows, group * q).transpose(0, 1),
            )
        )

    lses = torch.stack([lse for _, lse in levels])  # (levels, rows, kv, g*q)
    # exact merge of the per-level softmaxes; a padding query that sees no key at all
    # (no prefix) gets 0 rather than NaN, so no NaN reaches a cached key or value
    weights = torch.softmax(lses, dim=0).nan_to_num(0.0)
    merged = sum(w[..., None] * out for w, (out, _) in zip(weights, levels, strict=True))
    merged = merged.reshape(rows, heads, q, dim).transpose(1, 2).contiguous()
    return merged, None


def _no_mask(*args: Any, **kwargs: Any) -> None:
    """The mask builder for this implementation: every mask is applied in :func:`_attention`."""
    return None


@contextlib.contextmanager
def cascade(hf_model: Any, shared: SharedKV) -> Iterator[None]:
    """Run ``hf_model`` with cascade attention over ``shared`` inside the block.

    Pass only the rows' own tokens to the model, with a plain cache for them and
    explicit ``position_ids`` (counted over all levels); the attention mask
    argument is ignored (use ``shared.middle_mask`` and ``shared.own_mask``).
    """
    from tokenfield.models.attention_impl import attention_implementation

    with attention_implementation(hf_model, _NAME, _attention, _no_mask):
        _active.append(shared)
        try:
            yield
        finally:
            _active.pop()

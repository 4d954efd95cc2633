"""The last token's layer map: one block at a time, on the last token only, and runs onward.

Depth is time: block ``l`` maps the last token's raw residual state ``x_l`` (its
input) to ``x_{l+1}``. The other tokens of the prompt are held at their traced
states; attention is causal, so they do not depend on the last token and the
map is a function of ``x_l`` alone::

    F_l(x) = block_l(H_l[:-1] with x appended)[-1]

:class:`LayerMap` captures, in one forward pass, every block's call (mask,
rotary angles, position ids) and the prefix keys and values of every block,
then evaluates ``F_l`` on the last token only: the block is called on one
column with a cache that hands it the prefix's keys and values (the
Hugging Face decoding path), so evaluating the map costs one token, not the
whole prompt. Rows are independent: a batch of ``m * B`` rows is ``m`` copies of
the ``B`` prompts (row ``r`` belongs to prompt ``r % B``).

The Jacobians and singular values of these maps are in
:mod:`tokenfield.models.jacobian`; the perturbation runs (:func:`perturbation_recovery`,
:func:`great_circle_runs`) run the map onward from perturbed states.
"""

from __future__ import annotations

import contextlib
import contextvars
import inspect
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from tokenfield.errors import UserError
from tokenfield.models.jacobian import Map, _unit, angle_between

__all__ = ["PREFIX_ATTENTION", "LayerMap", "layer_map_attention"]


class _PrefixCache:
    """Hands a block the prefix's keys and values (held fixed) before the new column's."""

    def __init__(self, keys: dict[int, torch.Tensor], values: dict[int, torch.Tensor]):
        self.keys, self.values = keys, values

    def update(self, key, value, layer_idx, *args, **kwargs):  # noqa: D401
        reps = key.shape[0] // self.keys[layer_idx].shape[0]
        pk, pv = self.keys[layer_idx], self.values[layer_idx]
        if reps > 1:
            pk, pv = pk.repeat(reps, 1, 1, 1), pv.repeat(reps, 1, 1, 1)
        return torch.cat([pk, key], dim=-2), torch.cat([pv, value], dim=-2)


class _NewColumnCache:
    """Hands the attention the new column's keys and values alone: with
    :data:`PREFIX_ATTENTION` the prefix is read by the attention itself, never
    repeated per copy of the batch."""

    def update(self, key, value, layer_idx, *args, **kwargs):  # noqa: D401
        return key, value


_NEW_COLUMN = _NewColumnCache()
_ACTIVE: contextvars.ContextVar[_PrefixCache | None] = contextvars.ContextVar(
    "tokenfield_layer_map_prefix", default=None
)

PREFIX_ATTENTION = "tokenfield_prefix"
"""The attention implementation :func:`layer_map_attention` sets: the last column's
attention over the prefix's cached keys and values, computed per prompt and
key/value head for every copy of the batch at once.

The eager path (what Hugging Face runs with ``attn_implementation="eager"``) repeats
the prefix's keys and values for every copy of the batch and every query head of
a group (``repeat_kv``) before two matmuls; those copies took about a third of a
block call's time for 37 copies of 7 prompts. This one gives the same numbers (the
same operations: scores scaled, soft-capped, masked, a float32 softmax, the
weighted sum; ``tests/integration/test_attractors.py`` compares the two on tiny
models of three families, gradients included) with the prefix read once per prompt.
"""


def _family_eager(module: torch.nn.Module) -> Callable[..., Any] | None:
    return getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", None)


_STANDARD = {"module", "query", "key", "value", "attention_mask", "scaling", "dropout",
             "softcap", "kwargs"}  # fmt: skip


def _attention_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    return [m for m in model.modules()
            if hasattr(m, "num_key_value_groups") and hasattr(m, "layer_idx")]  # fmt: skip


def supports_prefix_attention(model: torch.nn.Module) -> bool:
    """Whether ``model``'s attention is the standard form that :data:`PREFIX_ATTENTION`
    reproduces: its family's eager function takes exactly the standard arguments
    (scaling, dropout, an optional soft cap; no attention sinks), as Llama, Qwen,
    Gemma, Mistral and most decoders do. Others keep the eager path."""
    modules = _attention_modules(model)
    if not modules or any(hasattr(m, "sinks") for m in modules):
        return False
    eager = _family_eager(modules[0])
    if eager is None:
        return False
    params = set(inspect.signature(eager).parameters)
    return "scaling" in params and params <= _STANDARD


def _prefix_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    softcap: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """The last column's attention (``query``, ``key``, ``value``: ``(m*B, heads, 1,
    head_dim)``, the new column only) over the active map's prefix and itself.

    Row ``r`` of the ``m*B`` rows is copy ``r // B`` of prompt ``r % B``; the
    prefix's keys and values ``(B, kv_heads, T, head_dim)`` are used as they are.
    Returns what the eager function does: ``(m*B, 1, heads, head_dim)``.
    """
    cache = _ACTIVE.get()
    if cache is None:
        raise RuntimeError("the prefix attention runs only inside LayerMap.block")
    if dropout:
        raise RuntimeError("the prefix attention has no dropout: put the model in eval mode")
    prefix_k, prefix_v = cache.keys[module.layer_idx], cache.values[module.layer_idx]
    batch, kv_heads, length, dim = prefix_k.shape
    rows, heads = query.shape[0], query.shape[1]
    reps, group = rows // batch, heads // kv_heads
    if scaling is None:
        scaling = dim**-0.5
    q = query.reshape(reps, batch, kv_heads, group, dim)
    q_prompt = q.permute(1, 2, 0, 3, 4).reshape(batch, kv_heads, reps * group, dim)
    scores_prefix = q_prompt @ prefix_k.transpose(-1, -2)  # (B, kv, m*g, T)
    k_new = key.reshape(reps, batch, kv_heads, 1, dim)
    scores_self = (q * k_new).sum(-1).permute(1, 2, 0, 3).reshape(batch, kv_heads, -1, 1)
    scores = torch.cat([scores_prefix, scores_self], dim=-1) * scaling
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if attention_mask is not None:
        mask = attention_mask[..., -(length + 1) :]
        if mask.dtype == torch.bool:
            mask = torch.zeros_like(mask, dtype=scores.dtype).masked_fill(
                ~mask, torch.finfo(scores.dtype).min
            )
        scores = scores + mask[:batch]  # (B or 1, 1, 1, T + 1): one row per prompt
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    out = weights[..., :length] @ prefix_v  # (B, kv, m*g, dim)
    v_new = value.reshape(reps, batch, kv_heads, 1, dim).permute(1, 2, 0, 3, 4)
    out = out.reshape(batch, kv_heads, reps, group, dim)
    out = out + weights[..., length:].reshape(batch, kv_heads, reps, group, 1) * v_new
    return out.permute(2, 0, 1, 3, 4).reshape(rows, 1, heads, dim), None


def _no_mask(*args: Any, **kwargs: Any) -> None:
    """No model-level mask under :data:`PREFIX_ATTENTION`: the blocks are called with
    the masks captured from the whole prompt (a full forward pass of the model
    there fails in :func:`_prefix_attention`, which needs a layer map)."""
    return None


@contextlib.contextmanager
def layer_map_attention(model: torch.nn.Module) -> Iterator[str]:
    """The attention for evaluating :class:`LayerMap` maps many times: :data:`PREFIX_ATTENTION`
    where :func:`supports_prefix_attention`, else eager. Set once around a whole
    measurement (switching to eager walks every module of the model); restored on
    exit. Yields the implementation set."""
    from tokenfield.models.attention import eager_attention
    from tokenfield.models.attention_impl import attention_implementation

    if not supports_prefix_attention(model):
        with eager_attention(model):
            yield "eager"
        return
    with attention_implementation(model, PREFIX_ATTENTION, _prefix_attention, _no_mask):
        yield PREFIX_ATTENTION


class _RecordingCache:
    """Records each block's keys and values of the whole prompt; changes nothing."""

    def __init__(self):
        self.keys: dict[int, torch.Tensor] = {}
        self.values: dict[int, torch.Tensor] = {}

    def update(self, key, value, layer_idx, *args, **kwargs):  # noqa: D401
        self.keys[layer_idx], self.values[layer_idx] = key, value
        return key, value


def _cache_name(block: torch.nn.Module) -> str:
    params = inspect.signature(block.forward).parameters
    for name in ("cache", "past_key_values", "past_key_value"):
        if name in params:
            return name
    raise UserError(
        f"the block {type(block).__name__} takes no key/value cache",
        "the attractor analysis supports decoder models with a Hugging Face cache",
    )


def _hidden(value: Any) -> torch.Tensor:
    return value[0] if isinstance(value, tuple) else value


def _last_column(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The captured block kwargs of a full prompt, cut to its last query column."""
    out = dict(kwargs)
    mask = out.get("attention_mask")
    if isinstance(mask, torch.Tensor) and mask.dim() == 4:
        out["attention_mask"] = mask[:, :, -1:, :]
    pe = out.get("position_embeddings")
    if isinstance(pe, tuple):
        out["position_embeddings"] = tuple(t[:, -1:] for t in pe)
    for name in ("position_ids", "cache_position"):
        value = out.get(name)
        if isinstance(value, torch.Tensor):
            out[name] = value[..., -1:]
    out["use_cache"] = False
    return out


def _repeat_kwargs(kwargs: dict[str, Any], reps: int, repeat_mask: bool = True) -> dict[str, Any]:
    """The block kwargs for ``reps`` copies of the batch (the mask kept per prompt
    without ``repeat_mask``: :data:`PREFIX_ATTENTION` reads it so)."""
    if reps == 1:
        return kwargs
    out = dict(kwargs)
    mask = out.get("attention_mask") if repeat_mask else None
    if isinstance(mask, torch.Tensor) and mask.shape[0] > 1:
        out["attention_mask"] = mask.repeat(reps, *([1] * (mask.dim() - 1)))
    pe = out.get("position_embeddings")
    if isinstance(pe, tuple):
        out["position_embeddings"] = tuple(
            t.repeat(reps, *([1] * (t.dim() - 1))) if t.shape[0] > 1 else t for t in pe
        )
    value = out.get("position_ids")
    if isinstance(value, torch.Tensor) and value.shape[0] > 1:
        out["position_ids"] = value.repeat(reps, 1)
    return out


@contextlib.contextmanager
def _eager(model: torch.nn.Module) -> Iterator[None]:
    """Eager attention (plain matmul and softmax: forward-mode AD goes through it)."""
    from tokenfield.models.attention import eager_attention

    with eager_attention(model):
        yield


class LayerMap:
    """The last token's block maps of a batch of prompts (module docstring).

    Args:
        model: a loaded causal model (:func:`tokenfield.load_model`).
        token_ids: one list of token ids per prompt.

    Attributes:
        states: ``(B, L + 1, d)`` the last token's raw states ``x_0 .. x_L``
            (block inputs, then the last block's output before the final norm).
        n_blocks: ``L``.
    """

    def __init__(self, model: Any, token_ids: Sequence[Sequence[int]]):
        if not model.causal:
            raise UserError(
                f"model '{model.name}' is not causal",
                "the attractor analysis needs a decoder (the other tokens must not see the last)",
            )
        if min(len(ids) for ids in token_ids) < 2:
            raise UserError(
                "a prompt encodes to one token: the last token has no prompt to attend to",
                "give every prompt at least two tokens",
            )
        self.model = model
        self.blocks = model.sites.blocks
        self.n_blocks = len(self.blocks)
        self._cache_arg = _cache_name(self.blocks[0])
        self._capture(token_ids)

    def _capture(self, token_ids: Sequence[Sequence[int]]) -> None:
        from tokenfield.models.batching import Encoded, pad_batch
        from tokenfield.prompts import Prompt

        model = self.model
        batch = [Encoded(Prompt("?"), list(ids)) for ids in token_ids]
        inputs = {
            k: v.to(model.device) for k, v in pad_batch(batch, model, "last")["inputs"].items()
        }
        calls: list[tuple[torch.Tensor, dict[str, Any]]] = []

        def grab(_module, args, kwargs):
            # Eager attention leaves NaN in fully masked (left-padding) rows; they
            # are masked for every real token, so zeros change nothing but keep
            # 0 * NaN out of the real rows.
            hidden = torch.nan_to_num(args[0] if args else kwargs.pop("hidden_states"))
            rest = {k: v for k, v in kwargs.items() if k != "hidden_states"}
            calls.append((hidden.detach(), rest))
            return (hidden, *args[1:]), kwargs

        handles = [block.register_forward_pre_hook(grab, with_kwargs=True) for block in self.blocks]
        try:
            with _eager(model.model), torch.no_grad():
                model.model(**inputs, use_cache=False, logits_to_keep=1)
        finally:
            for handle in handles:
                handle.remove()
        if len(calls) != self.n_blocks:
            raise RuntimeError(f"captured {len(calls)} block calls, expected {self.n_blocks}")
        self._kwargs: list[dict[str, Any]] = []
        keys: dict[int, torch.Tensor] = {}
        values: dict[int, torch.Tensor] = {}
        states = [calls[0][0][:, -1]]
        with _eager(model.model), torch.no_grad():
            for index, (block, (hidden, kwargs)) in enumerate(zip(self.blocks, calls, strict=True)):
                recorder = _RecordingCache()
                full = dict(kwargs, use_cache=False)
                full[self._cache_arg] = recorder
                out = _hidden(block(hidden, **full))
                if len(recorder.keys) != 1:
                    raise UserError(
                        f"block {index} did not hand its keys and values to the cache",
                        "the attractor analysis supports Hugging Face decoder blocks",
                    )
                (layer_idx,) = recorder.keys
                keys[layer_idx] = recorder.keys[layer_idx][..., :-1, :]
                values[layer_idx] = recorder.values[layer_idx][..., :-1, :]
                self._kwargs.append(_last_column(kwargs))
                out = torch.nan_to_num(out)
                expected = calls[index + 1][0] if index + 1 < len(calls) else out
                gap = (out - expected)[:, -1].abs().max() / expected[:, -1].abs().max()
                if not bool(gap <= 1e-4):
                    raise RuntimeError(f"block {index} replayed with relative gap {float(gap):.1e}")
                states.append(out[:, -1])
        self._cache = _PrefixCache(keys, values)
        self.batch = len(token_ids)
        self.states = torch.stack(states, dim=1)  # (B, L + 1, d)

    @property
    def dtype(self) -> torch.dtype:
        return self.states.dtype

    def block(self, index: int, x: torch.Tensor) -> torch.Tensor:
        """``F_index`` on rows ``(m*B, d)`` (``m`` copies of the prompts)."""
        reps = x.shape[0] // self.batch
        if reps * self.batch != x.shape[0]:
            raise ValueError(f"{x.shape[0]} rows are not copies of {self.batch} prompts")
        if getattr(self.model.model.config, "_attn_implementation", None) == PREFIX_ATTENTION:
            kwargs = _repeat_kwargs(self._kwargs[index], reps, repeat_mask=False)
            kwargs[self._cache_arg] = _NEW_COLUMN
            token = _ACTIVE.set(self._cache)
            try:
                return _hidden(self.blocks[index](x.unsqueeze(1), **kwargs))[:, 0]
            finally:
                _ACTIVE.reset(token)
        kwargs = _repeat_kwargs(self._kwargs[index], reps)
        kwargs[self._cache_arg] = self._cache
        with _eager(self.model.model):
            return _hidden(self.blocks[index](x.unsqueeze(1), **kwargs))[:, 0]

    def onward(self, start: int, x: torch.Tensor, stop: int | None = None) -> torch.Tensor:
        """``F_{stop-1} o ... o F_start`` (``stop`` defaults to ``L``): ``x_start -> x_stop``."""
        stop = self.n_blocks if stop is None else stop
        for index in range(start, stop):
            x = self.block(index, x)
        return x

    def block_fn(self, index: int) -> Map:
        def fn(x: torch.Tensor) -> torch.Tensor:
            return self.block(index, x)

        fn.layer_map, fn.block_index = self, index  # type: ignore[attr-defined]
        return fn

    def onward_fn(self, start: int, stop: int | None = None) -> Map:
        return lambda x: self.onward(start, x, stop)

    @property
    def vocab_size(self) -> int:
        """The number of logits :meth:`logits` gives per row."""
        return int(self.model.model.get_output_embeddings().weight.shape[0])

    def logits(self, x_last: torch.Tensor) -> torch.Tensor:
        """Next-token logits from raw final states ``(N, d)``: final norm then the head."""
        norm = self.model.sites.final_norm
        hidden = norm(x_last.unsqueeze(1)) if norm is not None else x_last.unsqueeze(1)
        head = self.model.model.get_output_embeddings()
        logits = head(hidden)[:, 0]
        softcap = getattr(self.model.model.config, "final_logit_softcapping", None)
        if softcap:
            logits = torch.tanh(logits / softcap) * softcap
        return logits.float()

    def select(self, rows: torch.Tensor) -> LayerMap:
        """A map over a subset of the prompts (rows of this batch), sharing tensors."""
        other = object.__new__(LayerMap)
        other.__dict__.update(self.__dict__)
        rows = rows.to(self.states.device)
        other.batch = int(rows.numel())
        other.states = self.states[rows]
        other._cache = _PrefixCache(
            {i: t[rows] for i, t in self._cache.keys.items()},
            {i: t[rows] for i, t in self._cache.values.items()},
        )
        other._kwargs = [_select_kwargs(kw, rows, self.batch) for kw in self._kwargs]
        return other


def _select_kwargs(kwargs: dict[str, Any], rows: torch.Tensor, batch: int) -> dict[str, Any]:
    out = dict(kwargs)
    for name in ("attention_mask", "position_ids"):
        value = out.get(name)
        if isinstance(value, torch.Tensor) and value.shape[0] == batch:
            out[name] = value[rows]
    pe = out.get("position_embeddings")
    if isinstance(pe, tuple):
        out["position_embeddings"] = tuple(t[rows] if t.shape[0] == batch else t for t in pe)
    return out


# ---------------------------------------------------------------- beyond the linear regime


LOGITS_BYTES = 768 << 20
"""The most bytes of float32 logits one chunk of perturbed rows reads out at once
(its KL takes about three more of that size; the great circles' runs read their
top-1 tokens within it too): 4,096 rows of SmolLM2's 49,152-token
vocabulary, 768 of Gemma 3's 262,144, so that a large vocabulary does not run the
machine out of memory."""


def _rows_for(max_rows: int, vocab: int) -> int:
    """``max_rows``, lowered so that the rows' logits fit :data:`LOGITS_BYTES`."""
    return max(1, min(max_rows, LOGITS_BYTES // (4 * max(1, vocab))))


def _chunks(copies: int, batch: int, max_rows: int) -> Iterator[slice]:
    step = max(1, max_rows // max(1, batch))
    for first in range(0, copies, step):
        yield slice(first, min(copies, first + step))


def _final_readout(
    layer_map: LayerMap, x_final: torch.Tensor, ref_logits: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """KL(p_ref || p) and the top-1 token of raw final states ``(m*B, d)``.

    With ``delta = z - z_ref`` (logits minus the prompt's reference logits),
    ``KL = log sum p_ref e^delta - sum p_ref delta``: exact, one log-normaliser and
    one cross term per row, ``p_ref`` computed once per prompt and broadcast (never
    repeated per row), and small terms for small perturbations (no cancellation
    of two log-probabilities of size ``log V``).
    """
    logits = layer_map.logits(x_final)  # (m*B, V)
    top = logits.argmax(-1)
    batch = ref_logits.shape[0]
    reps = x_final.shape[0] // batch
    ref_logp = torch.log_softmax(ref_logits, dim=-1)  # (B, V)
    # in place: the logits become delta, then delta + log p_ref (no other (m*B, V) array)
    delta = logits.reshape(reps, batch, -1).sub_(ref_logits)  # (m, B, V)
    cross = torch.einsum("rbv,bv->rb", delta, ref_logp.exp())
    kl = torch.logsumexp(delta.add_(ref_logp), dim=-1) - cross
    return kl.reshape(-1).clamp_min(0), top


@torch.no_grad()
def perturbation_recovery(
    layer_map: LayerMap,
    start: int,
    thetas: Sequence[float],
    directions: torch.Tensor,
    *,
    max_rows: int = 4096,
) -> dict[str, torch.Tensor]:
    """Rotate the last token's state at block ``start`` and run the model onward.

    ``x' = |x_l| (cos(theta) y_l + sin(theta) t)`` for each unit tangent ``t`` of
    ``directions`` ``(n_dir, B, d)`` and each ``theta``.

    Returns ``(n_theta, n_dir, B)`` arrays: ``angle_ratio`` (``angle(x_L', x_L) /
    theta``), ``kl`` (``KL(p || p')`` of the next-token distributions, nats) and
    ``flipped`` (the top-1 token changed).
    """
    batch = layer_map.batch
    x = layer_map.states[:, start]  # (B, d)
    norm, y = x.norm(dim=-1, keepdim=True), _unit(x)
    final = layer_map.states[:, -1]
    ref_logits = layer_map.logits(final)  # (B, V)
    ref_top = ref_logits.argmax(-1)
    max_rows = _rows_for(max_rows, layer_map.vocab_size)
    theta = torch.as_tensor(list(thetas), dtype=x.dtype, device=x.device)
    n_theta, n_dir = theta.numel(), directions.shape[0]
    # (n_theta, n_dir, B, d) starting states, flattened to copies of the batch
    start_states = norm * (
        torch.cos(theta)[:, None, None, None] * y
        + torch.sin(theta)[:, None, None, None] * directions
    )
    start_states = start_states.reshape(n_theta * n_dir * batch, -1)
    copies = n_theta * n_dir
    angle = torch.empty(copies * batch, dtype=x.dtype, device=x.device)
    kl = torch.empty_like(angle)
    top = torch.empty(copies * batch, dtype=torch.long, device=x.device)
    for part in _chunks(copies, batch, max_rows):
        rows = slice(part.start * batch, part.stop * batch)
        out = layer_map.onward(start, start_states[rows])
        angle[rows] = angle_between(out, final.repeat(part.stop - part.start, 1))
        kl[rows], top[rows] = _final_readout(layer_map, out, ref_logits)
    shape = (n_theta, n_dir, batch)
    return {
        "angle_ratio": angle.reshape(shape) / theta[:, None, None],
        "kl": kl.reshape(shape),
        "flipped": top.reshape(shape) != ref_top,
    }


def great_circle(a: torch.Tensor, b: torch.Tensor, lambdas: torch.Tensor) -> torch.Tensor:
    """Points from ``a`` toward ``b`` ``(P, d)`` along the great circle of their
    directions, the norm interpolated linearly: ``(n_lambda, P, d)``."""
    ya, yb = _unit(a), _unit(b)
    omega = angle_between(a, b)[None, :, None]  # (1, P, 1)
    lam = lambdas[:, None, None]
    safe = torch.sin(omega).clamp_min(1e-12)
    direction = (torch.sin((1 - lam) * omega) * ya + torch.sin(lam * omega) * yb) / safe
    na, nb = a.norm(dim=-1, keepdim=True), b.norm(dim=-1, keepdim=True)
    return _unit(direction) * ((1 - lam) * na + lam * nb)


@torch.no_grad()
def great_circle_runs(
    layer_map: LayerMap,
    start: int,
    pairs: torch.Tensor,
    lambdas: Sequence[float],
    *,
    max_rows: int = 4096,
) -> dict[str, torch.Tensor]:
    """Move prompt A's state at block ``start`` toward prompt B's along the great
    circle and run A's prompt onward from each point.

    Args:
        pairs: ``(P, 2)`` prompt indices ``(A, B)``.

    Returns:
        ``final``: ``(n_lambda, P, d)`` raw final states; ``top``: ``(n_lambda, P)``
        top-1 tokens. The prompt context (other tokens, positions) is A's.
    """
    a_rows, b_rows = pairs[:, 0], pairs[:, 1]
    sub = layer_map.select(a_rows)
    lam = torch.as_tensor(list(lambdas), dtype=layer_map.dtype, device=layer_map.states.device)
    points = great_circle(
        layer_map.states[a_rows, start], layer_map.states[b_rows, start], lam
    )  # (n_lambda, P, d)
    n_pairs = pairs.shape[0]
    flat = points.reshape(lam.numel() * n_pairs, -1)
    final = torch.empty_like(flat)
    top = torch.empty(flat.shape[0], dtype=torch.long, device=flat.device)
    for part in _chunks(lam.numel(), n_pairs, _rows_for(max_rows, layer_map.vocab_size)):
        rows = slice(part.start * n_pairs, part.stop * n_pairs)
        final[rows] = sub.onward(start, flat[rows])
        top[rows] = sub.logits(final[rows]).argmax(-1)
    return {
        "final": final.reshape(lam.numel(), n_pairs, -1),
        "top": top.reshape(lam.numel(), n_pairs),
    }

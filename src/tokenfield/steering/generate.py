"""Batched greedy continuations and next-token distributions for causal models,
and the steering evaluation's shared-prefix decoding (:func:`answer_conditions`).

All use the tracer's encoding and left padding (with mask-derived positions),
so a prompt gives the same result alone or in a batch, steered or not. The one
call to Hugging Face ``generate`` is :func:`tokenfield.models.generate.greedy_generate`.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from tokenfield.errors import UserError
from tokenfield.models.batching import encode_prompts, forward_last, pad_batch
from tokenfield.models.cascade import SharedKV, cascade
from tokenfield.models.generate import greedy_generate, pad_token_id
from tokenfield.models.hooks import Order, add_to_residual, hooks
from tokenfield.models.sites import site_names
from tokenfield.prompts import as_prompts

__all__ = [
    "greedy_continuations",
    "next_token_logprobs",
    "answer_conditions",
    "Condition",
    "count_answers",
    "require_causal",
]


def require_causal(model: Any) -> None:
    """Refuse a model without a language-model head (one line, exit 2)."""
    if not model.causal:
        raise UserError(
            f"model '{model.name}' has no language-model head",
            "use a causal model (smollm2, gemma3-270m)",
        )


def next_token_logprobs(
    model: Any, prompts: Sequence[str], *, chat: bool = False, batch_size: int = 16
) -> torch.Tensor:
    """Log-probabilities of the next token after each prompt: ``(n_prompts, vocab)``."""
    require_causal(model)
    encoded = encode_prompts(model, as_prompts(prompts), chat=chat)
    rows = []
    with torch.inference_mode():
        for first in range(0, len(encoded), batch_size):
            padded = pad_batch(encoded[first : first + batch_size], model, "last")
            logits = forward_last(model, padded["inputs"])
            assert logits is not None
            rows.append(logits.float().log_softmax(-1).cpu())
    return torch.cat(rows)


@contextlib.contextmanager
def _prefill_last_states(model: Any, store: list[list[torch.Tensor]]) -> Iterator[None]:
    """Record each prompt's last-token state at every site during the first (prefill)
    forward pass of one batch: ``store[time]`` gets one ``(batch, d)`` tensor.

    With left padding the last column is every prompt's last real token; the
    decoding steps that follow (one new column each) are ignored.
    """
    seen = [False] * (model.n_layers + 1)

    def keep(time: int, hidden: torch.Tensor) -> None:
        if not seen[time]:
            seen[time] = True
            store[time].append(hidden[:, -1].detach().to("cpu", torch.float32))

    def read(time: int):
        return lambda hidden: keep(time, hidden)

    pairs = [(site, read(time)) for time, site in enumerate(site_names(model.n_layers))]
    with hooks(model, pairs, order=Order.READ):
        yield


def greedy_continuations(
    model: Any,
    prompts: Sequence[str],
    *,
    max_new_tokens: int = 8,
    chat: bool = False,
    batch_size: int = 16,
    states: list[list[torch.Tensor]] | None = None,
) -> list[str]:
    """Greedy (deterministic) continuations of each prompt, decoded.

    Args:
        states: if given, one empty list per time (``n_layers + 1``); it receives the
            prompts' last-token states from the prefill pass, so a caller that needs
            both the answers and the states pays for one forward pass, not two.
    """
    require_causal(model)
    encoded = encode_prompts(model, as_prompts(prompts), chat=chat)
    texts: list[str] = []
    with torch.inference_mode():
        for first in range(0, len(encoded), batch_size):
            recorder = (
                _prefill_last_states(model, states)
                if states is not None
                else contextlib.nullcontext()
            )
            with recorder:
                new = greedy_generate(model, encoded[first : first + batch_size], max_new_tokens)
            texts.extend(model.tokenizer.decode(row, skip_special_tokens=True) for row in new)
    return texts


def _eos_ids(model: Any) -> set[int]:
    """Every token id that ends generation (the tokenizer's and the generation config's)."""
    ids: set[int] = set()
    config = getattr(model.model, "generation_config", None)
    for value in (model.tokenizer.eos_token_id, getattr(config, "eos_token_id", None)):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(int(v) for v in value)
    return ids


@dataclass(frozen=True)
class Condition:
    """One way of answering: unsteered (``vector=None``) or steered by ``alpha * vector``.

    Attributes:
        name: the key of the result.
        vector: the steering vector (its ``layer`` says where), or ``None``.
        alpha: the multiple of the vector to add.
        record: keep the last prompt token's states at every time (for progress).
    """

    name: str
    vector: Any = None
    alpha: float = 0.0
    record: bool = False


def _kv(cache: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(layer.keys, layer.values) for layer in cache.layers]


def _common_prefix(token_lists: Sequence[Sequence[int]]) -> int:
    """Length of the longest common token prefix, leaving every list at least one token."""
    shortest = min(len(t) for t in token_lists)
    first = token_lists[0]
    length = 0
    while length < shortest - 1 and all(t[length] == first[length] for t in token_lists):
        length += 1
    return length


def answer_conditions(
    model: Any,
    prompts: Sequence[str],
    conditions: Sequence[Condition],
    *,
    max_new_tokens: int = 8,
    batch_size: int = 256,
    positions: str = "last",
    bar: Any = None,
) -> dict[str, dict[str, Any]]:
    """Greedy continuations of every prompt under every condition, sharing the work.

    With ``positions="last"`` steering only ever touches a prompt's last token and
    the tokens generated after it, so everything before the last token is the same
    under every condition. It is computed once into a KV cache:

    - the longest token prefix all prompts share (the few-shot examples) once, for
      the whole call;
    - each prompt's own middle part once per batch of prompts (sorted by length, so
      little padding; padding sits between the shared prefix and the middle part,
      masked, with positions counted from the mask).

    A group of conditions is then decoded in one batch of ``batch_size`` rows
    (prompt x condition), each row with its own steering vector added at its own
    layer. The shared prefix and the middle parts are never copied per row: the
    attention reads them in place (:mod:`tokenfield.models.cascade`), and each row
    keeps only its own tokens (the last prompt token and what it generates). Decoding stops once every row is finished (a
    newline, the end of its first integer, or an end-of-sequence token; see
    :func:`~tokenfield.steering.problems.answer_finished`) or has
    ``max_new_tokens`` tokens. ``positions="all"`` changes every position, so nothing
    is shared: each condition runs its prompts from scratch.

    Args:
        bar: a :class:`~tokenfield._progress.ProgressBar`; advanced by the number of
            (prompt, condition) answers as they are done.

    Returns:
        ``{condition.name: {"texts": [...], "states": (time, prompt, d) array or None}}``
        in the order of ``prompts``; states (of the last prompt token, at every time)
        are kept for conditions with ``record=True``.
    """
    from transformers import DynamicCache

    from tokenfield.steering.hooks import steering
    from tokenfield.steering.problems import answer_finished

    require_causal(model)
    if positions not in ("last", "all"):
        raise UserError(f"unknown steering positions '{positions}'", "use 'last' or 'all'")
    names = [c.name for c in conditions]
    if len(set(names)) != len(names):
        raise ValueError(f"condition names must be distinct: {names}")
    encoded = encode_prompts(model, as_prompts(prompts))
    n, times, d = len(encoded), model.n_layers + 1, model.d_model
    texts: dict[str, list[str]] = {c.name: [""] * n for c in conditions}
    states: dict[str, Any] = {
        c.name: (np.zeros((times, n, d), np.float32) if c.record else None) for c in conditions
    }
    if n == 0:
        return {c.name: {"texts": [], "states": states[c.name]} for c in conditions}
    tokenizer = model.tokenizer
    stops = _eos_ids(model)
    pad_id = pad_token_id(tokenizer)
    device = model.device

    def cut(raw: list[int]) -> list[int]:
        for i, t in enumerate(raw):
            if t in stops:
                return raw[:i]
        return raw

    # transformers renamed ``past_key_values`` to ``cache`` (the old name warns)
    cache_kwarg = (
        "cache"
        if "cache" in inspect.signature(model.model.forward).parameters
        else "past_key_values"
    )

    def forward(ids, mask, position_ids, cache):
        return model.model(
            input_ids=ids.to(device),
            attention_mask=None if mask is None else mask.to(device),
            position_ids=position_ids.to(device),
            **{cache_kwarg: cache},
            use_cache=True,
            logits_to_keep=1,
        )

    def decode(cache, mask, chunk, position_ids, store) -> list[str]:
        """Greedy decoding from ``chunk`` (the tokens not yet in ``cache``)."""
        rows = chunk.shape[0]
        step_ids, new = chunk, []
        for step in range(max_new_tokens):
            record = _prefill_last_states(model, store) if step == 0 and store is not None else None
            with record or contextlib.nullcontext():
                out = forward(step_ids, mask, position_ids, cache)
            token = out.logits[:, -1].argmax(-1).cpu()
            new.append(token)
            raws = torch.stack(new, 1).tolist()
            decoded = [tokenizer.decode(cut(r), skip_special_tokens=True) for r in raws]
            if all(
                answer_finished(text) or len(cut(raw)) < len(raw)
                for text, raw in zip(decoded, raws, strict=True)
            ):
                break
            step_ids = token[:, None]
            if mask is not None:  # None: cascade attention, which needs no mask
                mask = torch.cat([mask, torch.ones((rows, 1), dtype=mask.dtype)], 1)
            position_ids = position_ids[:, -1:] + 1
        return decoded

    def keep(condition: Condition, rows: list[int], out: list[str], store, select) -> None:
        for row, text in zip(rows, out, strict=True):
            texts[condition.name][row] = text
        if store is not None and condition.record:
            got = np.stack([torch.cat(parts).numpy() for parts in store])  # (time, rows, d)
            states[condition.name][:, rows] = got[:, select]
        if bar is not None:
            bar.advance(len(rows))

    with torch.inference_mode():
        if positions == "all":  # nothing can be shared
            order = sorted(range(n), key=lambda i: len(encoded[i].ids))
            for condition in conditions:
                for first in range(0, n, batch_size):
                    rows = order[first : first + batch_size]
                    padded = pad_batch([encoded[i] for i in rows], model, "last")
                    ids, mask = padded["inputs"]["input_ids"], padded["inputs"]["attention_mask"]
                    store = [[] for _ in range(times)] if condition.record else None
                    context = (
                        steering(model, condition.vector, float(condition.alpha),
                                 positions="all", check=False)
                        if condition.vector is not None
                        else contextlib.nullcontext()
                    )  # fmt: skip
                    with context:
                        out = decode(
                            DynamicCache(), mask, ids, (mask.cumsum(-1) - 1).clamp(min=0), store
                        )
                    keep(condition, rows, out, store, slice(None))
            return {c.name: {"texts": texts[c.name], "states": states[c.name]} for c in conditions}

        shared = _common_prefix([e.ids for e in encoded])
        prefix = None
        if shared:
            prefix_cache = DynamicCache()
            ids = torch.tensor([encoded[0].ids[:shared]])
            forward(ids, torch.ones_like(ids), torch.arange(shared)[None], prefix_cache)
            prefix = _kv(prefix_cache)  # (1, kv_heads, shared, head_dim) per layer
        order = sorted(range(n), key=lambda i: len(encoded[i].ids))
        per_group = max(1, min(len(conditions), batch_size))
        groups = [conditions[i : i + per_group] for i in range(0, len(conditions), per_group)]
        items = max(1, batch_size // per_group)
        for first in range(0, n, items):
            rows = order[first : first + items]
            b = len(rows)
            middles = [encoded[i].ids[shared:-1] for i in rows]
            width = max(len(m) for m in middles)
            mid_ids = torch.full((b, width), pad_id, dtype=torch.long)
            mid_mask = torch.zeros((b, width), dtype=torch.long)
            for r, middle in enumerate(middles):
                if middle:
                    mid_ids[r, width - len(middle) :] = torch.tensor(middle)
                    mid_mask[r, width - len(middle) :] = 1
            # each prompt's own part once, over the shared prefix (never copied)
            middle_kv = mid_positions = None
            if width:
                mid_cache = DynamicCache()
                mid_positions = shared + (mid_mask.cumsum(-1) - 1).clamp(min=0)
                mid_levels = SharedKV(prefix=prefix, own_mask=mid_mask.bool())
                with cascade(model.model, mid_levels):
                    forward(mid_ids, None, mid_positions, mid_cache)
                middle_kv = _kv(mid_cache)  # (b, kv_heads, width, head_dim) per layer
            last_ids = torch.tensor([[encoded[i].ids[-1]] for i in rows])
            last_positions = shared + mid_mask.sum(-1, keepdim=True)  # (b, 1)
            for group in groups:
                c = len(group)
                deltas: dict[int, torch.Tensor] = {}
                for j, condition in enumerate(group):
                    if condition.vector is None or condition.alpha == 0:
                        continue
                    layer = int(condition.vector.layer)
                    if layer not in deltas:
                        deltas[layer] = torch.zeros((c * b, d), dtype=torch.float32)
                    vec = torch.from_numpy(np.asarray(condition.vector.vector, np.float32))
                    deltas[layer][j * b : (j + 1) * b] = float(condition.alpha) * vec
                recording = any(cond.record for cond in group)
                store = [[] for _ in range(times)] if recording else None
                levels = SharedKV(
                    prefix=prefix,
                    middle=middle_kv,
                    middle_mask=mid_mask.bool() if middle_kv is not None else None,
                    middle_positions=mid_positions if middle_kv is not None else None,
                    conditions=c,
                )
                with (
                    cascade(model.model, levels),
                    add_to_residual(model, deltas),
                ):  # row by row, last column
                    out = decode(
                        DynamicCache(), None, last_ids.repeat(c, 1), last_positions.repeat(c, 1),
                        store,
                    )  # fmt: skip
                for j, condition in enumerate(group):
                    keep(condition, rows, out[j * b : (j + 1) * b], store,
                         slice(j * b, (j + 1) * b))  # fmt: skip
    return {c.name: {"texts": texts[c.name], "states": states[c.name]} for c in conditions}


def count_answers(n_prompts: int, n_conditions: int) -> int:
    """How many (prompt, condition) answers :func:`answer_conditions` gives: its bar's total."""
    return n_prompts * n_conditions

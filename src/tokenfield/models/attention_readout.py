"""The attention read-out without eager attention: statistics from queries and keys.

``trace(..., attention=True)`` reduces every block's attention to Markov-chain
statistics (:mod:`tokenfield.models.attention`). Eager attention hands those
weights over, but only after building every ``(batch, heads, seq, seq)`` matrix
in the forward pass. This module leaves the model's own kernel (SDPA) running
the forward pass and reads the queries and keys instead:

- :func:`capture_queries_keys` registers one attention function with Hugging
  Face's ``AttentionInterface`` and points the model's config at it for the
  duration. The function calls the model's SDPA function unchanged (so the
  outputs are those of a plain forward, bit for bit) and hands the read-out the
  exact ``query``/``key`` SDPA receives: after the projections, the ``q_norm`` /
  ``k_norm`` of the families that have them and the rotary embedding at the
  row's positions, with the ``scaling`` the module passes. The attention mask is
  the model's own (``sdpa_mask``: causal, padding, and the sliding window of the
  layers that have one); where Hugging Face passes none, SDPA's own rule applies
  (causal when the module is causal and there is more than one query, else full).
- :func:`reduce_queries_keys` then, for each prompt of the batch (its real
  tokens only, padding cut away), repeats the key heads for grouped-query
  attention (Hugging Face's ``repeat_kv`` order), and builds that prompt's
  ``(heads, n, n)`` weights a block of rows at a time as eager attention does:
  ``softmax(q k^T * scaling (+ soft cap) + mask)`` in float32, cast to the
  model's dtype (where no query sees a key past its own position, a block's keys
  stop at its last row: about half the work of whole rows, :func:`_softmax_rows`).
  The statistics are those of the eager path's own reduction, on the same inputs:
  prompts of at most
  :func:`~tokenfield.models.attention.batched_limit` tokens several at once
  (:func:`tokenfield.models.attention._reduce_padded`, in float32
  (:data:`~tokenfield.models.attention.REDUCE_DTYPE`; within about 5e-7 of the
  float64 reference): ``|lambda_2|`` by batched ``eigvalsh``, or from
  :data:`~tokenfield.models.attention.COMPILED_FROM` tokens on the CPU by the
  compiled Lanczos of :mod:`tokenfield.models._lanczos_cpu`, on a GPU from 33 tokens
  by the batched torch Lanczos in fixed rounds,
  :func:`~tokenfield.models.attention._lanczos_rounds`),
  longer ones one at a time (:func:`~tokenfield.models.attention.reduce_long_row`:
  the same reduction a few heads at a time on the CPU, the reference
  :func:`~tokenfield.models.markov.summarize_attention` on a GPU): row entropy, sink
  mass, ``|lambda_2|`` of the symmetrised chain with and without the sink, raw
  ``|lambda_2|``, the two stationary distributions.

What is kept, while one block's statistics are computed: short prompts several
at once, each in the corner of a ``(prompts, heads, m, m)`` array of at
most :data:`CHUNK_ELEMENTS` elements (32 MB in float32, 64 MB in float64; the eager
path's reduction works on the same array); a longer prompt alone, its ``(heads, n, n)``
float32 weights and a copy of as many heads as fit in ``CHUNK_ELEMENTS`` (one at
least; on a GPU one head's float64 copy for the reference); the logits a block of rows at a time
(:data:`ROW_ELEMENTS`). Then only the ``O(heads * n)`` statistics: no block's
weights outlive its reduction, nothing of size ``n x n`` is kept across blocks.
The eager path holds, besides the same arrays, the whole batch's ``(batch, heads,
seq, seq)`` weights of a block that eager attention builds in the forward pass.

Which path a trace takes (:func:`readout_path`): this one when the model's
family is in :data:`READOUT_FAMILIES` and it runs SDPA (Hugging Face's default);
the eager path otherwise (a model loaded with ``attn_implementation="eager"``,
flash attention, a model with logit soft-capping, which SDPA refuses), or when
``attention_readout="eager"`` asks for it. The run records which
(``run.json``: ``config.attention.attn_implementation``, ``"sdpa"`` or ``"eager"``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from tokenfield.errors import ParameterError
from tokenfield.models.attention import (
    _reduce_padded,
    batched_limit,
    blank_reduction,
    device_ints,
    fill_rows,
    reduce_dtype,
    reduce_long_row,
)
from tokenfield.models.sites import ModelSites, attention_modules

__all__ = [
    "READOUTS",
    "READOUT_FAMILIES",
    "capture_queries_keys",
    "readout_path",
    "reduce_queries_keys",
    "short_weights",
]

# Families whose attention modules call Hugging Face's AttentionInterface with the
# queries and keys SDPA receives (each tested against the eager path).
READOUT_FAMILIES = ("llama", "gpt2", "gpt_neox", "bert")
READOUTS = ("auto", "sdpa", "eager")
# Elements of one (prompts, heads, m, m) array of short prompts (as the eager path's
# reduction, float32).
CHUNK_ELEMENTS = 1 << 23
# Elements of one block of float32 logits (heads, rows, n).
ROW_ELEMENTS = 1 << 20
# Rows of a block of a causal prompt's logits at most (n // 4 rows, 16 at least): its
# keys stop at its last row, so the shorter the blocks, the nearer the products come to
# the triangle's half. 2 SmolLM2 prompts of 512 tokens, 1 thread: 16 to 21 ms a block's
# weights with 32 to 128 rows (noisy), 30 ms with every row at once.
LOWER_ROWS = 64
# Devices on which the short prompts' weights of every block wait to be reduced
# together (AttentionCapture.defer): a GPU, where the reduction is bound by kernel
# launches. On a CPU each block is reduced at once, its arrays still in the cache.
DEFER_ON = ("cuda",)

_NAME = "tokenfield_sdpa_readout"
# id(attention module) -> the read-out of its block, while a capture is active
_readers: dict[int, Any] = {}


def readout_path(model: Any, requested: str = "auto") -> str:
    """Which attention read-out a trace of ``model`` uses: ``"sdpa"`` or ``"eager"``.

    ``"auto"``: ``"sdpa"`` when the family is in :data:`READOUT_FAMILIES` and the
    model runs SDPA, else ``"eager"``. ``"eager"``: always the eager path.
    ``"sdpa"``: this path, or an error when the model cannot take it.

    Args:
        model: a :class:`~tokenfield.models.load.LoadedModel`.
        requested: one of :data:`READOUTS`.

    Raises:
        ParameterError: ``attention_readout="sdpa"`` for a model that cannot take it.
    """
    if requested == "eager":
        return "eager"
    spec = model.extra.get("spec") if isinstance(getattr(model, "extra", None), dict) else None
    implementation = getattr(spec, "attn_implementation", None) or getattr(
        model.model.config, "_attn_implementation", None
    )
    supported = model.family.name in READOUT_FAMILIES and implementation == "sdpa"
    if requested == "sdpa" and not supported:
        raise ParameterError(
            "attention_readout",
            f"{{name}} sdpa needs a model of the {', '.join(READOUT_FAMILIES)} families "
            f"running SDPA; '{model.name}' is a {model.family.name} model running "
            f"{implementation or 'eager'} attention",
            "pass {name} auto (the eager read-out for this model)",
        )
    return "sdpa" if supported else "eager"


def _readout_attention(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """The registered attention function: SDPA unchanged, then the read-out of
    ``module``'s block (if one is active) on the very ``query``/``key`` SDPA saw."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    out = sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    reader = _readers.get(id(module))
    if reader is not None:
        reader(module, query, key, attention_mask, kwargs)
    return out


@contextlib.contextmanager
def capture_queries_keys(sites: ModelSites, hf_model: Any, capture: Any) -> Iterator[Any]:
    """Run ``hf_model`` with SDPA plus the read-out of every block's queries and
    keys into ``capture`` (an :class:`~tokenfield.models.attention.AttentionCapture`)
    inside the block; the model's attention implementation is restored on exit,
    even on error."""
    modules = attention_modules(sites)  # a family without an entry fails here, in one line
    config = hf_model.config
    before = config._attn_implementation
    if before != "sdpa":
        raise RuntimeError(f"the queries-and-keys read-out needs SDPA, the model runs {before}")

    def reader(block: int):
        def read(module: Any, query, key, mask, kwargs: dict[str, Any]) -> None:
            if capture.paused:
                return
            is_causal = kwargs.get("is_causal")
            causal_kernel = bool(
                getattr(module, "is_causal", True) if is_causal is None else is_causal
            )
            # on a GPU the short prompts of every block are reduced together
            work: list[Any] | None = [] if query.device.type in DEFER_ON else None
            reduced = reduce_queries_keys(
                query.detach(),
                key.detach(),
                mask,
                capture.spans,
                causal=capture.causal,
                causal_kernel=causal_kernel,
                scaling=kwargs.get("scaling"),
                softcap=kwargs.get("softcap"),
                deferred=work,
            )
            if work is None:
                capture.store(block, reduced, int(query.shape[1]))
            else:
                clean = normalised_weights(query)
                capture.defer(block, reduced, int(query.shape[1]), work, normalised=clean)

        return read

    from transformers.masking_utils import sdpa_mask

    from tokenfield.models.attention_impl import attention_implementation

    ids = [id(module) for module in modules]
    for block, key in enumerate(ids):
        _readers[key] = reader(block)
    try:
        # the masks SDPA gets, and SDPA itself inside _readout_attention
        with attention_implementation(hf_model, _NAME, _readout_attention, sdpa_mask):
            yield capture
    finally:
        for key in ids:
            _readers.pop(key, None)


def normalised_weights(query: torch.Tensor) -> bool:
    """Whether :func:`short_weights` of ``query`` are rows of a float32 softmax as they
    stand (a float32 model, float32 work arrays), nonnegative and summing to 1: then the
    reduction need not clamp and renormalise them (``_reduce_padded``'s ``normalised``).
    A model in half precision rounds its weights, which the reduction renormalises, as
    the eager path's."""
    return query.dtype == torch.float32 and reduce_dtype(query.device) == torch.float32


def _as_visible(mask: torch.Tensor) -> torch.Tensor:
    """A cut of the model's attention mask as bool, True where visible (an additive
    mask is 0 there)."""
    if mask.dtype != torch.bool:
        return mask > torch.finfo(mask.dtype).min / 2
    return mask


def _visible(
    mask: torch.Tensor | None, row: int, offset: int, n: int, causal_kernel: bool, device: Any
) -> torch.Tensor | str | None:
    """``(n, n)`` bool, True where query ``i`` may read key ``j`` of one prompt (its
    real tokens ``offset .. offset + n - 1``); ``"causal"``: ``j <= i``; ``None``:
    every key."""
    if mask is not None:
        cut = mask[row if mask.shape[0] > 1 else 0, 0, offset : offset + n, offset : offset + n]
        return _as_visible(cut).to(device)
    if causal_kernel and n > 1:  # SDPA's is_causal: key j <= query i
        return "causal"
    return None


def _block_rows(n: int, row: int, total: int, lower: bool, device: str) -> int:
    """Rows of one block of :func:`_softmax_rows` (``row`` logits a row of the block,
    ``total`` in all): at most :data:`ROW_ELEMENTS` logits, and when ``lower`` (causal)
    on the CPU at most :data:`LOWER_ROWS` rows (``n // 4``, 16 at least); on a GPU all
    ``n`` rows where ``total`` is at most :data:`CHUNK_ELEMENTS`."""
    if device != "cpu" and total <= CHUNK_ELEMENTS:  # a GPU: short prompts' rows at once
        return n
    step = ROW_ELEMENTS // max(1, row)
    if lower and device == "cpu":  # short blocks: the triangle's share of the products
        step = min(step, max(LOWER_ROWS // 4, min(LOWER_ROWS, n // 4)))
    return max(1, min(step, n))


def _softmax_rows(
    q: torch.Tensor,
    k: torch.Tensor,
    visible: torch.Tensor | str | None,
    scaling: float,
    softcap: float | None,
    dtype: torch.dtype,
    out: torch.Tensor,
    corner: torch.Tensor | None = None,
) -> torch.Tensor:
    """``out[..., i, :] = softmax(q_i k^T * scaling + mask)`` as eager attention makes it
    (the soft cap, the mask: ``-inf`` where not visible, the softmax in float32, cast
    to the model's ``dtype``), a block of rows at a time: at most :data:`ROW_ELEMENTS`
    logits a block (and :data:`LOWER_ROWS` rows when causal, on the CPU), but on a GPU
    every row at once where ``out`` has at most :data:`CHUNK_ELEMENTS` elements (short
    prompts: the read-out there is bound by kernel launches).

    Where no key past a query's own position is visible (causal: ``visible`` lower
    triangular), the block of rows ``s .. e - 1`` reads the keys ``0 .. e - 1`` only
    and the rest of its rows is set to zero: about half the products, exponentials and
    writes of the full rows (the softmax of a row is the same: the masked keys add
    ``exp(-inf) = 0``).

    Args:
        q: ``(..., heads, n, head_dim)``; ``k`` the same.
        visible: ``(..., 1, n, n)`` bool (True: visible; broadcast over the batch and
            the heads), ``None``: every key, or ``"causal"``: the keys ``j <= i``.
        out: ``(..., heads, n, n)``, written in full.
        corner: ``(..., 1, n, n)`` bool, or ``None``: the weights outside it set to
            zero (a padded prompt's rows and columns past its end; its rows may be all
            ``-inf``, so ``where``, not a product).

    Returns:
        ``out``.
    """
    n = int(q.shape[-2])
    cpu = q.device.type == "cpu"
    causal = isinstance(visible, str)  # "causal": j <= i visible, nothing else masked
    # (on a GPU no host wait to find out: every key, as before, unless "causal")
    lower = causal or (cpu and visible is not None and not bool(visible.triu(1).any()))
    step = _block_rows(n, out[..., 0, :].numel(), out.numel(), lower, q.device.type)
    # the mask as 0 / -inf added to the logits (a broadcast masked_fill_ took 3x as long);
    # causal: one (step, step) triangle, added on each block's diagonal
    bias = None
    if causal:
        bias = torch.full((step, step), float("-inf"), device=q.device).triu_(1)
    elif visible is not None:
        bias = torch.zeros(visible.shape, dtype=torch.float32, device=q.device)
        bias.masked_fill_(~visible, float("-inf"))
    q = q.contiguous()  # one copy each, not one a block inside matmul
    keys = k.transpose(-1, -2).contiguous()  # (..., head_dim, n)
    for start in range(0, n, step):
        stop = min(n, start + step)
        end = stop if lower else n
        logits = torch.matmul(q[..., start:stop, :], keys[..., :end]).mul_(scaling)
        if softcap is not None:
            logits = torch.tanh(logits / softcap) * softcap
        if causal:
            logits[..., start:stop].add_(bias[: stop - start, : stop - start])
        elif bias is not None:  # from the block's first column some row cannot see (CPU)
            first = 0
            if cpu:
                seen = visible[..., start:stop, :end].all(-2).reshape(-1, end).all(0)
                first = end if bool(seen.all()) else int(seen.logical_not().nonzero()[0, 0])
            if first < end:
                logits[..., first:].add_(bias[..., start:stop, first:end])
        # the softmax in float32, cast to the model's dtype, as eager attention
        weights = torch.softmax(logits, dim=-1, dtype=torch.float32).to(dtype).float()
        if corner is not None:
            weights = torch.where(corner[..., start:stop, :end], weights, 0.0)
        out[..., start:stop, :end] = weights
        if end < n:
            out[..., start:stop, end:] = 0.0
    return out


def prompt_weights(
    query: torch.Tensor,
    key: torch.Tensor,
    visible: torch.Tensor | str | None,
    scaling: float,
    softcap: float | None,
) -> torch.Tensor:
    """One prompt's attention weights, built a block of rows at a time as eager
    attention does (:func:`_softmax_rows`): ``softmax(q k^T * scaling + mask)`` in
    float32, cast to the model's dtype.

    Args:
        query: ``(heads, n, head_dim)``.
        key: ``(heads, n, head_dim)`` (key heads already repeated).
        visible: ``(n, n)`` bool, ``"causal"`` (``j <= i``) or ``None`` (every key).

    Returns:
        ``(heads, n, n)`` float32 (the model-dtype weights, as the eager path hands
        them to its reduction), rows summing to 1.
    """
    heads, n = int(query.shape[0]), int(query.shape[1])
    out = torch.empty((heads, n, n), dtype=torch.float32, device=query.device)
    rows = visible if visible is None or isinstance(visible, str) else visible[None]
    return _softmax_rows(query, key, rows, scaling, softcap, query.dtype, out)


def short_weights(
    query: torch.Tensor,
    key: torch.Tensor,
    mask: torch.Tensor | None,
    spans: Sequence[tuple[int, int]],
    rows: Sequence[int],
    m: int,
    causal_kernel: bool,
    scaling: float,
    softcap: float | None,
) -> torch.Tensor:
    """The weights of the batch rows ``rows`` (each at most ``m`` tokens) at once:
    :func:`prompt_weights` of each row's real tokens, in the top-left corner of a
    zero ``(len(rows), heads, m, m)`` array (:func:`reduce_dtype`).

    One batched product for all the rows instead of one per row (on a GPU the
    read-out of short prompts is bound by kernel launches). A row shorter than
    ``m`` gets ``-inf`` logits for the keys past its end, which add nothing to its
    softmax (``exp(-inf) = 0``: the same maximum, the same sum), and its rows and
    columns past the end are zeroed.

    Args:
        query: ``(batch, heads, seq, head_dim)``; ``key`` the same (heads repeated).
        mask, spans, causal_kernel, scaling, softcap: as :func:`reduce_queries_keys`.
    """
    device = query.device
    index = device_ints(rows, device)
    offsets = device_ints([spans[r][0] for r in rows], device)
    lengths = device_ints([spans[r][1] for r in rows], device)
    steps = torch.arange(m, device=device)
    cols = (offsets[:, None] + steps).clamp(max=query.shape[2] - 1)  # (rows, m)
    inside = steps[None, :] < lengths[:, None]  # (rows, m)
    firsts = {spans[r][0] for r in rows}
    if len(firsts) == 1 and min(firsts) + m <= query.shape[2]:  # one offset: a slice
        first = min(firsts)
        q = query.index_select(0, index)[:, :, first : first + m]
        k = key.index_select(0, index)[:, :, first : first + m]
    else:  # (rows, m, heads, head_dim) -> (rows, heads, m, head_dim)
        q = query[index[:, None], :, cols].transpose(1, 2)
        k = key[index[:, None], :, cols].transpose(1, 2)
    padded = not all(spans[r][1] == m for r in rows)
    corner = None
    if padded:  # zero past each row's end
        corner = (inside[:, :, None] & inside[:, None, :])[:, None]  # (rows, 1, m, m)
    if mask is None and causal_kernel and not padded:
        visible = "causal"
    elif mask is not None:
        source = mask[index if mask.shape[0] > 1 else index.new_zeros(len(rows)), 0]
        visible = source[torch.arange(len(rows), device=device)[:, None, None],
                         cols[:, :, None], cols[:, None, :]]  # fmt: skip
        visible = (_as_visible(visible) & inside[:, None, :])[:, None]
    elif causal_kernel:
        visible = torch.ones(m, m, dtype=torch.bool, device=device).tril()[None]
        visible = (visible & inside[:, None, :])[:, None]
    else:
        visible = torch.ones(1, m, m, dtype=torch.bool, device=device) & inside[:, None, :]
        visible = visible[:, None]  # (rows, 1, m, m): no key past the row's end
    out = torch.empty((len(rows), *q.shape[1:3], m), dtype=reduce_dtype(device), device=device)
    return _softmax_rows(q, k, visible, scaling, softcap, query.dtype, out, corner)


def reduce_queries_keys(
    query: torch.Tensor,
    key: torch.Tensor,
    mask: torch.Tensor | None,
    spans: Sequence[tuple[int, int]],
    *,
    causal: bool,
    causal_kernel: bool,
    scaling: float | None = None,
    softcap: float | None = None,
    deferred: list[tuple[list[int], torch.Tensor, torch.Tensor]] | None = None,
) -> dict[str, torch.Tensor]:
    """The statistics of :func:`~tokenfield.models.attention.reduce_attention_batch`
    for one block of a padded batch, from the queries and keys SDPA received.

    Args:
        query: ``(batch, heads, seq, head_dim)`` after the rotary embedding.
        key: ``(batch, kv_heads, seq, head_dim)``; ``heads`` a multiple of ``kv_heads``.
        mask: the model's attention mask for SDPA, ``(batch or 1, 1, seq, seq)``
            (bool: True = visible), or ``None`` (SDPA's own ``is_causal`` rule).
        spans: per batch row ``(offset, n)``: its real tokens.
        causal: the model is causal (the statistics' conventions, as the eager path).
        causal_kernel: what SDPA does without a mask (the module's ``is_causal``).
        scaling: the logit scale (``head_dim ** -0.5`` when ``None``, as SDPA).
        softcap: a logit soft cap (``cap * tanh(logits / cap)``), or ``None``.
        deferred: a list to hand the short prompts' weights to, unreduced, as
            ``(rows, weights, lengths)`` (what :func:`_reduce_padded` takes; see
            :meth:`~tokenfield.models.attention.AttentionCapture.defer`); their
            statistics are then left blank (NaN) here. ``None``: reduced here.

    Returns:
        Statistic -> ``(batch, heads)`` float64 for ``PER_HEAD``, ``(batch, heads,
        width)`` for ``PER_TOKEN`` (``width`` the longest span).
    """
    batch, heads, _seq, head_dim = query.shape
    groups = heads // int(key.shape[1])
    if groups > 1:  # repeat_kv: query head h reads key head h // groups
        key = key.repeat_interleave(groups, dim=1)
    scale = float(scaling) if scaling is not None else head_dim**-0.5
    on = query.device if query.device.type in ("cpu", "cuda") else torch.device("cpu")
    width = max(n for _offset, n in spans)
    out = blank_reduction(batch, heads, width, on)

    def weights_of(row: int) -> torch.Tensor:
        offset, n = spans[row]
        visible = _visible(mask, row, offset, n, causal_kernel, query.device)
        part = slice(offset, offset + n)
        return prompt_weights(query[row, :, part], key[row, :, part], visible, scale, softcap)

    # Short prompts, as the eager path reduces them: several at once, each in the
    # top-left corner of a (rows, heads, m, m) float64 array, |lambda_2| batched;
    # with ``deferred``, the arrays are handed over unreduced.
    short = [row for row, (_offset, n) in enumerate(spans) if n <= batched_limit(on)]
    if short:
        m = max(spans[row][1] for row in short)
        step = max(1, CHUNK_ELEMENTS // (heads * m * m))
        for begin in range(0, len(short), step):
            chosen = short[begin : begin + step]
            cut = short_weights(query, key, mask, spans, chosen, m, causal_kernel, scale, softcap)
            lengths = device_ints([spans[row][1] for row in chosen], on)
            if deferred is not None:
                deferred.append((chosen, cut.to(on), lengths))
            else:
                clean = normalised_weights(query)
                reduced = _reduce_padded(cut.to(on), lengths, causal, normalised=clean)
                fill_rows(out, reduced, chosen)
    # Long prompts one at a time, as the eager path (reduce_long_row).
    for row, (_offset, n) in enumerate(spans):
        if n > batched_limit(on):
            reduce_long_row(out, row, weights_of(row), causal)
    return out

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
  model's dtype. The statistics are those of the eager path's own reduction,
  on the same inputs: prompts of at most
  :func:`~tokenfield.models.attention.batched_limit` tokens several at once
  (:func:`tokenfield.models.attention._reduce_padded`, in float32 on the CPU and
  float64 on a GPU (:data:`~tokenfield.models.attention.REDUCE_DTYPE`; float32
  within about 5e-7 of the float64 reference): ``|lambda_2|`` by batched
  ``eigvalsh``, or from :data:`~tokenfield.models.attention.COMPILED_FROM` tokens on
  the CPU by the compiled Lanczos of :mod:`tokenfield.models._lanczos_cpu`, on a GPU
  by the batched torch Lanczos),
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
least; on a GPU one head's float64 copy); the logits a block of rows at a time
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
# reduction; float32 on the CPU, float64 on a GPU).
CHUNK_ELEMENTS = 1 << 23
# Elements of one block of float32 logits (heads, rows, n).
ROW_ELEMENTS = 1 << 20
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
                capture.defer(block, reduced, int(query.shape[1]), work)

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


def _as_visible(mask: torch.Tensor) -> torch.Tensor:
    """A cut of the model's attention mask as bool, True where visible (an additive
    mask is 0 there)."""
    if mask.dtype != torch.bool:
        return mask > torch.finfo(mask.dtype).min / 2
    return mask


def _weights(
    logits: torch.Tensor, visible: torch.Tensor | None, softcap: float | None, dtype: torch.dtype
) -> torch.Tensor:
    """Scaled logits to attention weights as eager attention makes them: the soft cap,
    the mask (``visible`` False: ``-inf``), the softmax in float32, cast to the model's
    ``dtype``; returned as float32. ``logits`` (the caller's own) is overwritten."""
    if softcap is not None:
        logits = torch.tanh(logits / softcap) * softcap
    if visible is not None:
        logits = logits.masked_fill_(~visible, float("-inf"))
    return torch.softmax(logits, dim=-1, dtype=torch.float32).to(dtype).float()


def _visible(
    mask: torch.Tensor | None, row: int, offset: int, n: int, causal_kernel: bool, device: Any
) -> torch.Tensor | None:
    """``(n, n)`` bool, True where query ``i`` may read key ``j`` of one prompt (its
    real tokens ``offset .. offset + n - 1``); ``None``: every key."""
    if mask is not None:
        cut = mask[row if mask.shape[0] > 1 else 0, 0, offset : offset + n, offset : offset + n]
        return _as_visible(cut).to(device)
    if causal_kernel and n > 1:  # SDPA's is_causal: key j <= query i
        return torch.ones(n, n, dtype=torch.bool, device=device).tril()
    return None


def prompt_weights(
    query: torch.Tensor,
    key: torch.Tensor,
    visible: torch.Tensor | None,
    scaling: float,
    softcap: float | None,
) -> torch.Tensor:
    """One prompt's attention weights, built a block of rows at a time as eager
    attention does: ``softmax(q k^T * scaling + mask)`` in float32, cast to the
    model's dtype.

    Args:
        query: ``(heads, n, head_dim)``.
        key: ``(heads, n, head_dim)`` (key heads already repeated).
        visible: ``(n, n)`` bool or ``None`` (every key).

    Returns:
        ``(heads, n, n)`` float32 (the model-dtype weights, as the eager path hands
        them to its reduction), rows summing to 1.
    """
    heads, n = int(query.shape[0]), int(query.shape[1])
    out = torch.empty((heads, n, n), dtype=torch.float32, device=query.device)
    step = max(1, ROW_ELEMENTS // max(1, heads * n))
    keys = key.transpose(-1, -2)  # (heads, head_dim, n)
    for start in range(0, n, step):
        stop = min(n, start + step)
        logits = torch.matmul(query[:, start:stop], keys).mul_(scaling)  # (heads, rows, n)
        rows = None if visible is None else visible[start:stop]
        out[:, start:stop] = _weights(logits, rows, softcap, query.dtype)
    return out


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
    zero ``(len(rows), heads, m, m)`` float64 array.

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
    index = torch.tensor(list(rows), device=device)
    offsets = torch.tensor([spans[r][0] for r in rows], device=device)
    lengths = torch.tensor([spans[r][1] for r in rows], device=device)
    steps = torch.arange(m, device=device)
    cols = (offsets[:, None] + steps).clamp(max=query.shape[2] - 1)  # (rows, m)
    inside = steps[None, :] < lengths[:, None]  # (rows, m)
    # (rows, m, heads, head_dim) -> (rows, heads, m, head_dim)
    q = query[index[:, None], :, cols].transpose(1, 2)
    k = key[index[:, None], :, cols].transpose(1, 2)
    logits = torch.matmul(q, k.transpose(-1, -2)).mul_(scaling)  # (rows, heads, m, m)
    if mask is not None:
        source = mask[index if mask.shape[0] > 1 else index.new_zeros(len(rows)), 0]
        visible = source[torch.arange(len(rows), device=device)[:, None, None],
                         cols[:, :, None], cols[:, None, :]]  # fmt: skip
        visible = _as_visible(visible)
    elif causal_kernel:
        visible = torch.ones(m, m, dtype=torch.bool, device=device).tril()[None]
    else:
        visible = torch.ones(1, m, m, dtype=torch.bool, device=device)
    visible = visible & inside[:, None, :]  # (rows, m, m): no key past the row's end
    weights = _weights(logits, visible[:, None], softcap, query.dtype)
    weights = weights.to(reduce_dtype(device))
    if all(spans[r][1] == m for r in rows):  # no padding: nothing to zero
        return weights
    corner = (inside[:, :, None] & inside[:, None, :])[:, None]  # (rows, 1, m, m)
    # where, not a product: a padded query row may be all -inf (NaN after softmax)
    return torch.where(corner, weights, 0.0)


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
            lengths = torch.tensor([spans[row][1] for row in chosen], device=on)
            if deferred is not None:
                deferred.append((chosen, cut.to(on), lengths))
            else:
                fill_rows(out, _reduce_padded(cut.to(on), lengths, causal), chosen)
    # Long prompts one at a time, as the eager path (reduce_long_row).
    for row, (_offset, n) in enumerate(spans):
        if n > batched_limit(on):
            reduce_long_row(out, row, weights_of(row), causal)
    return out

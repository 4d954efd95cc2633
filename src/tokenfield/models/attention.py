"""Attention weights as Markov chains, reduced inside the forward pass.

With ``trace(..., attention=True)`` a forward hook sits on every block's
self-attention module. Under eager attention that module returns
``(attn_output, attn_weights)`` with weights ``(batch, heads, seq, seq)``; the
hook cuts each prompt's real ``n x n`` block out of the padded batch, reduces it
with :func:`tokenfield.models.markov.summarize_attention` (row entropy, sink
mass, ``|lambda_2|`` of the symmetrised chain with and without the sink, the
stationary distribution) and lets the matrix go. What is kept per prompt and
layer is ``O(heads * n)``, never ``O(heads * n^2)``: the only ``n x n`` tensors
alive are the one layer's weights the model itself computes (eager attention
materialises them anyway) and one head's float64 copy while it is reduced.

The default SDPA kernel returns no weights, so :func:`eager_attention` switches
the model to eager attention for the duration of the trace and restores it
after. Hooks return ``None``: they never change what the model computes. This
is the fallback path: a trace reads the queries and keys instead, SDPA left
running, wherever the model allows it (:mod:`tokenfield.models.attention_readout`,
which reduces with this module's :func:`_reduce_padded` and
:func:`~tokenfield.models.markov.summarize_attention`, as here).

:func:`attention_matrices` returns the full matrices of one prompt, for when
they are really wanted. :func:`head_inputs` gives the logits and values of a
block's own heads for the effective-beta fit
(:mod:`tokenfield.analysis.effective_beta`).
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from tokenfield.errors import UserError
from tokenfield.models import _omp
from tokenfield.models.hooks import Order, hooks
from tokenfield.models.markov import (
    DENSE_LIMIT,
    PER_HEAD,
    PER_TOKEN,
    AttentionSummary,
    summarize_attention,
    symmetrized_spectrum,
    without_sink,
)
from tokenfield.models.sites import ATTENTION_PATHS, ModelSites, attention_modules

__all__ = [
    "ATTENTION_PATHS",
    "AttentionCapture",
    "attention_matrices",
    "attention_modules",
    "capture_attention",
    "eager_attention",
    "head_inputs",
]

# Variable names in a traced run (dims: particle, block, head).
VARIABLES = {name: f"attn_{name}" for name in (*PER_HEAD, *PER_TOKEN)}


@contextlib.contextmanager
def eager_attention(model: torch.nn.Module) -> Iterator[str]:
    """Run ``model`` with eager attention inside the block; restore it on exit.

    Yields the implementation that was set before (``"eager"`` if nothing changed).
    """
    config = model.config
    before = getattr(config, "_attn_implementation", None) or "eager"
    if before == "eager":
        yield before
        return
    try:
        model.set_attn_implementation("eager")
    except (AttributeError, ValueError) as exc:
        raise UserError(
            f"cannot switch this model to eager attention ({exc})",
            "load it with attn_implementation='eager'",
        ) from None
    try:
        yield before
    finally:
        model.set_attn_implementation(before)


@dataclass
class AttentionCapture:
    """Per-prompt attention summaries of the current batch.

    Call :meth:`reset` with the batch's attention mask before each forward pass.
    Each block's weights are reduced as they are produced, every prompt and head
    at once (:func:`reduce_attention_batch`, on the weights' device), and only
    the ``O(heads * n)`` statistics are kept. After the pass,
    ``summaries[block][row]`` is the :class:`AttentionSummary` of batch row
    ``row`` in block ``block`` (built on demand; :meth:`variables` reads the
    batched arrays directly).
    """

    causal: bool
    spans: list[tuple[int, int]] = field(default_factory=list)
    heads: int = 0
    # per block: statistic -> (batch, heads) or (batch, heads, width) float64 tensor;
    # token i of row b at index i (its column minus the row's offset).
    reduced: list[dict[str, torch.Tensor] | None] = field(default_factory=list)
    paused: bool = False
    # short prompts' weights not yet reduced (:meth:`defer`): (block, rows, weights,
    # lengths, normalised)
    deferred: list[tuple[int, list[int], torch.Tensor, torch.Tensor, bool]] = field(
        default_factory=list
    )

    @contextlib.contextmanager
    def pause(self) -> Iterator[None]:
        """Ignore the attention modules while the model runs for something else
        (``generate``: its steps are not the traced pass)."""
        self.paused = True
        try:
            yield
        finally:
            self.paused = False

    def reset(self, n_blocks: int, attention_mask: torch.Tensor) -> None:
        spans = []
        for row in attention_mask.bool():
            real = torch.nonzero(row).flatten()
            spans.append((int(real[0]), int(real.numel())))  # contiguous: (offset, n)
        self.spans = spans
        self.reduced = [None] * n_blocks
        self.deferred = []

    def store(self, block: int, reduced: dict[str, torch.Tensor], heads: int) -> None:
        """Keep one block's reduced statistics (the queries-and-keys read-out,
        :mod:`tokenfield.models.attention_readout`)."""
        self.heads = heads
        self.reduced[block] = reduced

    def defer(
        self,
        block: int,
        reduced: dict[str, torch.Tensor],
        heads: int,
        work: list[tuple[list[int], torch.Tensor, torch.Tensor]],
        *,
        normalised: bool = False,
    ) -> None:
        """Keep one block's statistics with the short prompts' weights still to
        reduce (``work``: ``(rows, weights, lengths)`` as :func:`_reduce_padded`
        takes them, with its ``normalised``); they are reduced together with other
        blocks' (:meth:`settle`), once more than :data:`DEFER_ELEMENTS` wait or when
        the statistics are read.

        On a GPU the reduction of short prompts is bound by kernel launches and the
        host's waits (the small eigensolves), not by arithmetic: one reduction for
        all the blocks of a batch costs about what one block's did."""
        self.store(block, reduced, heads)
        for rows, weights, lengths in work:
            if self._deferred_elements() + weights.numel() > DEFER_ELEMENTS:
                self.settle()
            self.deferred.append((block, rows, weights, lengths, normalised))

    def _deferred_elements(self) -> int:
        return sum(item[2].numel() for item in self.deferred)

    def settle(self) -> None:
        """Reduce the deferred weights (:meth:`defer`), those of the same width,
        device and ``normalised`` at once, and put their statistics into their blocks."""
        groups: dict[tuple[Any, ...], list[tuple[Any, ...]]] = {}
        for item in self.deferred:  # a model spread over several GPUs: each device apart
            groups.setdefault((item[2].device, *item[2].shape[1:], item[4]), []).append(item)
        self.deferred = []
        for key, items in groups.items():
            places = [(item[0], item[1]) for item in items]
            lengths = torch.cat([item[3] for item in items])
            parts = [item[2] for item in items]
            items.clear()
            weights = torch.cat(parts) if len(parts) > 1 else parts[0]
            parts.clear()  # the concatenation is the only copy kept
            reduced = _reduce_padded(weights, lengths, self.causal, normalised=key[-1])
            del weights
            start = 0
            for block, rows in places:
                part = {name: value[start : start + len(rows)] for name, value in reduced.items()}
                target = self.reduced[block]
                if target is None:
                    raise RuntimeError(f"attention of block {block} was deferred but not stored")
                fill_rows(target, part, rows)
                start += len(rows)

    def reduce(self, block: int, weights: torch.Tensor) -> None:
        """Reduce ``weights`` ``(batch, heads, seq, seq)`` of one block, all prompts at once."""
        self.heads = int(weights.shape[1])
        self.reduced[block] = reduce_attention_batch(weights.detach(), self.spans, self.causal)

    @property
    def summaries(self) -> list[list[AttentionSummary | None]]:
        """``summaries[block][row]``: one :class:`AttentionSummary` per prompt (numpy)."""
        self.settle()
        out: list[list[AttentionSummary | None]] = []
        for reduced in self.reduced:
            if reduced is None:
                out.append([None] * len(self.spans))
                continue
            arrays = {name: value.cpu().numpy() for name, value in reduced.items()}
            out.append(
                [
                    AttentionSummary(
                        **{name: arrays[name][row] for name in PER_HEAD},
                        **{name: arrays[name][row, :, :n] for name in PER_TOKEN},
                    )
                    for row, (_offset, n) in enumerate(self.spans)
                ]
            )
        return out

    def variables(self, keep: torch.Tensor, last: torch.Tensor) -> dict[str, Any]:
        """Dataset variables for the kept particles of this batch.

        Per-head statistics sit on each prompt's last-token particle (NaN on the
        others); the stationary distributions are per token.

        Args:
            keep: ``(batch, seq)`` kept positions (row-major = particle order).
            last: ``(batch, seq)`` last real token of each row.
        """
        self.settle()
        rows, cols = keep.nonzero(as_tuple=True)
        n_blocks = len(self.reduced)
        shape = (int(rows.numel()), n_blocks, self.heads)
        out = {name: np.full(shape, np.nan, dtype=np.float32) for name in VARIABLES.values()}
        offsets = torch.tensor([offset for offset, _ in self.spans], dtype=torch.long)
        local = (cols - offsets[rows]).numpy()  # token index inside its prompt
        at = rows.numpy()
        flags = last[rows, cols].numpy().astype(bool)
        for block, reduced in enumerate(self.reduced):
            if reduced is None:
                raise RuntimeError(f"attention of block {block} was not captured")

        # one copy to the host per statistic, all the blocks at once (on a GPU each copy
        # is a wait): (blocks, batch, heads, width) and (blocks, batch, heads)
        def gathered(name: str) -> np.ndarray:  # blocks on several devices: onto the first's
            first = self.reduced[0][name].device
            return torch.stack([r[name].to(first) for r in self.reduced]).cpu().numpy()

        for name in PER_TOKEN:
            out[VARIABLES[name]][:] = gathered(name)[:, at, :, local]  # (particle, block, head)
        for name in PER_HEAD:
            out[VARIABLES[name]][flags] = gathered(name)[:, at[flags]].transpose(1, 0, 2)
        dims = ("particle", "block", "head")
        return {name: (dims, values) for name, values in out.items()}


@functools.lru_cache(maxsize=64)
def _device_ints_cached(values: tuple[int, ...], device: torch.device) -> torch.Tensor:
    with torch.inference_mode(False):  # usable outside a trace's inference mode too
        return torch.tensor(values, dtype=torch.long, device=device)


def device_ints(values: Sequence[int], device: torch.device | str) -> torch.Tensor:
    """``values`` as an int64 tensor on ``device``, not to be written to. On a GPU it
    is kept for the next call with the same values (the blocks of a batch ask for the
    same rows and lengths): copying a list to a GPU makes the host wait for the GPU's
    queue, and the read-out of each block asked for several."""
    device = torch.device(device)
    if device.type == "cpu":
        return torch.tensor(list(values), dtype=torch.long)
    return _device_ints_cached(tuple(int(v) for v in values), device)


# The precision of the batched reduction's work array (_reduce_padded: the weights, the
# two chains and their Lanczos) on each device; the statistics come out in float64 and are
# stored in float32. On the CPU float32: the reduction's passes over (rows, heads, n, n)
# and the Lanczos's matrix-vector products, bound by memory traffic, take about half the
# time of float64's, and every statistic stays within 1e-6 of the float64 reference
# (:func:`~tokenfield.models.markov.summarize_attention`; |lambda_2| to LANCZOS_TOL_FLOAT32
# at most, about 5e-7 measured). On a GPU float32 too (since session 16; float64 before):
# half the bytes of every pass, and with the Lanczos in rounds (_lanczos_rounds) an
# H200 took 0.376 s for an --attention trace of 16 random-weight SmolLM2 prompts of 256
# tokens against 0.558 s with float64 and the adaptive Lanczos (statistics within 2.4e-7
# of the eager path's float64 either way).
REDUCE_DTYPE = {"cpu": torch.float32, "cuda": torch.float32}


def reduce_dtype(device: torch.device | str) -> torch.dtype:
    """The work array's precision on ``device`` (:data:`REDUCE_DTYPE`; float64 elsewhere)."""
    return REDUCE_DTYPE.get(torch.device(device).type, torch.float64)


# Elements of one (rows, heads, n, n) work array; more rows are split.
_CHUNK_ELEMENTS = 1 << 23
# Elements of weights a capture defers at most (AttentionCapture.defer): 512 MiB in float32
# (REDUCE_DTYPE), and a few times as much while they are reduced. On an H100 (SmolLM2's
# random-weight copy, 16 prompts of 256 tokens) --attention took 1.66x a plain trace at
# 1 << 26 and 1.58x at 1 << 28 (float32, the Lanczos in rounds).
DEFER_ELEMENTS = 1 << 27


def reduce_attention_batch(
    weights: torch.Tensor, spans: Sequence[tuple[int, int]], causal: bool
) -> dict[str, torch.Tensor]:
    """:func:`~tokenfield.models.markov.summarize_attention` of every prompt of a
    padded batch at once, on the weights' device, in :func:`reduce_dtype` (float32 on
    the CPU), batched over prompts and heads (``|lambda_2|`` by :func:`_reduce_padded`'s
    solvers: dense ``eigvalsh`` on short prompts; from :data:`COMPILED_FROM` tokens the
    compiled Lanczos on the CPU, one matrix after another, its two chains in lockstep; the
    batched torch Lanczos on a GPU), no Python loop over either.

    Args:
        weights: ``(batch, heads, seq, seq)`` one block's attention of a padded batch.
        spans: per batch row ``(offset, n)``: its real tokens are the columns
            ``offset .. offset + n - 1``.
        causal: as in :func:`summarize_attention`.

    Returns:
        Statistic -> ``(batch, heads)`` for each of ``PER_HEAD``, ``(batch, heads,
        width)`` for each of ``PER_TOKEN`` (token ``i`` of a row at index ``i``,
        ``width`` its longest span), float64. A row of more than
        :func:`batched_limit` tokens is reduced alone (:func:`reduce_long_row`).
    """
    on = weights.device if weights.device.type in ("cpu", "cuda") else torch.device("cpu")
    batch, heads = int(weights.shape[0]), int(weights.shape[1])
    width = max(n for _offset, n in spans)
    out = blank_reduction(batch, heads, width, on)
    for row, (offset, n) in enumerate(spans):
        if n > batched_limit(on):  # long: one prompt at a time
            part = slice(offset, offset + n)
            reduce_long_row(out, row, weights[row, :, part, part], causal)
    short = [row for row, (_offset, n) in enumerate(spans) if n <= batched_limit(on)]
    if not short:
        return out
    m = max(spans[row][1] for row in short)
    step = max(1, _CHUNK_ELEMENTS // (heads * m * m))
    for begin in range(0, len(short), step):
        chosen = short[begin : begin + step]
        lengths = device_ints([spans[r][1] for r in chosen], on)
        # token i of each row at index i, zero past its end: the one copy, a slice a row
        # (a gather over four indices took twice as long)
        cut = torch.zeros((len(chosen), heads, m, m), dtype=reduce_dtype(on), device=on)
        for place, row in enumerate(chosen):
            offset, n = spans[row]
            cut[place, :, :n, :n] = weights[row, :, offset : offset + n, offset : offset + n]
        fill_rows(out, _reduce_padded(cut, lengths, causal), chosen)
    return out


# Prompts of at most this many tokens are reduced several at once, each in the corner of
# one padded array (reduce_attention_batch, attention_readout.short_weights); longer ones
# alone, a few heads at a time (reduce_long_row). On the CPU 512: SmolLM2, 2 prompts of
# 512 tokens, the queries-and-keys read-out took 5.57 s alone against 5.16 s for the eager
# path (whose weights come from the forward pass); a 512-token batch's work array is
# (2, 9, 512, 512) float32, 19 MB. On a GPU the reference's switch to ARPACK.
BATCHED_LIMIT_CPU = 512


def batched_limit(device: torch.device | str) -> int:
    """The longest prompt reduced in a padded batch on ``device`` (:data:`BATCHED_LIMIT_CPU`
    on the CPU, :data:`~tokenfield.models.markov.DENSE_LIMIT` elsewhere)."""
    return BATCHED_LIMIT_CPU if torch.device(device).type == "cpu" else DENSE_LIMIT


def reduce_long_row(
    out: dict[str, torch.Tensor], row: int, weights: torch.Tensor, causal: bool
) -> None:
    """Put the statistics of one prompt's ``weights`` ``(heads, n, n)`` (one longer than
    :func:`batched_limit`, reduced alone) into row ``row`` of
    :func:`blank_reduction`'s ``out``. On the CPU by :func:`_reduce_padded` (float32, the
    compiled Lanczos), as many heads at a time as :data:`_CHUNK_ELEMENTS` allows (one at
    least); elsewhere by the reference :func:`summarize_attention`, one head at a time in
    float64 on the host, ``|lambda_2|`` by ARPACK."""
    on = out["stationary"].device
    heads, n = int(weights.shape[0]), int(weights.shape[-1])
    if on.type == "cpu":
        step = max(1, _CHUNK_ELEMENTS // (n * n))
        length = torch.tensor([n], device=on)
        for first in range(0, heads, step):
            chunk = weights[first : first + step].to(on, reduce_dtype(on), copy=True)[None]
            reduced = _reduce_padded(chunk, length, causal)
            for name, value in reduced.items():
                if name in PER_TOKEN:
                    out[name][row, first : first + step, :n] = value[0]
                else:
                    out[name][row, first : first + step] = value[0]
        return
    summary = summarize_attention(weights.to("cpu").float().numpy(), causal=causal)
    for name in PER_HEAD:
        out[name][row] = torch.as_tensor(getattr(summary, name), device=on)
    for name in PER_TOKEN:
        out[name][row, :, :n] = torch.as_tensor(getattr(summary, name), device=on)


def fill_rows(
    out: dict[str, torch.Tensor], reduced: dict[str, torch.Tensor], rows: list[int]
) -> None:
    """Put the statistics of ``reduced`` (prompts in the order of ``rows``, tokens
    padded to their longest) into the rows ``rows`` of :func:`blank_reduction`'s ``out``."""
    at = device_ints(rows, out["stationary"].device)
    for name, value in reduced.items():
        if name in PER_TOKEN:
            out[name][at, :, : value.shape[-1]] = value
        else:
            out[name][at] = value


def _chain_spectrum(a: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``|lambda_2|`` and ``pi`` of the symmetrised chains of ``a`` ``(..., m, m)``
    (zero outside ``valid`` ``(..., m)``), as :func:`symmetrized_spectrum`.

    On the CPU in float32, from :data:`COMPILED_FROM` tokens, by the compiled Lanczos
    of :mod:`tokenfield.models._lanczos_cpu` (:func:`_compiled_spectrum`) where numba
    is installed: one matrix at a time while it sits in the core's cache, ``S`` never
    formed. Otherwise as follows.

    ``S = D^-1/2 W D^-1/2`` has top eigenvalue 1 with eigenvector ``sqrt(pi)``, and
    ``|lambda_2| = max(|lambda_min|, |lambda_(n-1)|)``: the largest ``|eigenvalue|``
    of the deflated ``S - sqrt(pi) sqrt(pi)^T``. Below :data:`LANCZOS_FROM` tokens
    (:data:`LANCZOS_FROM_FLOAT32` for a float32 ``a``, :data:`LANCZOS_FROM_CUDA` on a
    GPU) every matrix is solved densely (batched ``torch.linalg.eigvalsh`` in float64);
    from it on by the batched Lanczos of :func:`_lanczos_lambda2` on the deflated
    matrix, in ``a``'s precision, which agrees with the dense solve to about ``1e-13``
    in float64 and to the rounding of ``S`` in float32 (at most 5.2e-7 on SmolLM2's
    chains; dense ``eigvalsh`` for the few matrices it does not certify within
    :data:`LANCZOS_STEPS` steps), at half to a third of its cost from 256 tokens on in
    float64, a quarter to a sixth in float32; on a GPU (:data:`FIXED_ON`) by its rounds
    of fixed steps instead (:func:`_lanczos_rounds`: no wait for the host within a
    round). ``|lambda_2|`` comes back in float64, ``pi`` in ``a``'s precision.

    Zero rows and columns (padding) add zero eigenvalues to ``S``, which leave
    ``max(|lambda_min|, |lambda_(n-1)|)`` unchanged.
    """
    m = a.shape[-1]
    if a.device.type == "cpu" and a.dtype == torch.float32 and m >= COMPILED_FROM:
        kernel = _compiled()
        if kernel is not None:
            return _compiled_spectrum(kernel, a, valid)
    s, pi = _symmetrised(a, valid)
    if m < 2:
        return torch.full(s.shape[:-2], float("nan"), dtype=s.dtype, device=s.device), pi
    if m >= _lanczos_from(s):
        top = torch.nan_to_num(pi.sqrt())  # NaN where no token is valid: nothing to deflate
        shape = s.shape[:-2]
        solve = _lanczos_rounds if s.device.type in FIXED_ON else _lanczos_lambda2
        lam = solve(
            s.reshape(-1, m, m),
            top.reshape(-1, m),
            valid.to(s.dtype).expand(*shape, m).reshape(-1, m),
        ).reshape(shape)
    else:
        lam = _dense_lambda2(s)
    return lam.clamp(max=1.0), pi


def _dense_lambda2(s: torch.Tensor) -> torch.Tensor:
    """``|lambda_2| = max(|lambda_min|, |lambda_(n-1)|)`` of each symmetrised ``S``
    ``(..., m, m)`` (top eigenvalue 1) by dense ``eigvalsh``, in float64 whatever the
    precision of ``s`` (float32: off by up to 5e-6)."""
    values = torch.linalg.eigvalsh(s.double())  # ascending; the last is 1
    return torch.maximum(values[..., 0].abs(), values[..., -2].abs())


def _row_entropy(a: torch.Tensor) -> torch.Tensor:
    """``-sum_j a_ij log a_ij`` of every row of ``a`` ``(..., m, m)`` (``0 log 0 = 0``), in
    ``a``'s dtype. On the CPU in float32 by the compiled kernel where numba is installed
    (:func:`tokenfield.models._lanczos_cpu.row_entropy`: vectorised float32 logarithms, a
    causal row read to its diagonal; 0.2 ms a 512-token SmolLM2 chain, against 0.8 ms with
    libm's ``log`` one entry at a time and 4.5 ms with ``xlogy``; on one thread: split
    over two, it took longer in a trace, being too short to pay for the hand-over), else
    ``xlogy``."""
    kernel = _compiled() if a.device.type == "cpu" and a.dtype == torch.float32 else None
    if kernel is None:
        return -torch.special.xlogy(a, a).sum(-1)
    m = a.shape[-1]
    out = np.empty(a.shape[:-1], dtype=np.float32)
    kernel.row_entropy(a.reshape(-1, m, m).contiguous().numpy(), out.reshape(-1, m))
    return torch.from_numpy(out)


_POOLS: dict[int, ThreadPoolExecutor] = {}
_POOLS_LOCK = threading.Lock()


def _in_threads(call: Callable[[int, int], Any], count: int) -> None:
    """``call(lo, hi)`` on the chains ``lo .. hi - 1``, the ``count`` chains split in
    ``torch.get_num_threads()`` equal runs done at once, the first on this thread and
    the others on a pool's (the compiled kernels release the interpreter lock; the
    forward pass's own threads are idle meanwhile). One thread: one call, here."""
    workers = min(torch.get_num_threads(), count)
    if workers <= 1:
        call(0, count)
        return
    with _POOLS_LOCK:
        pool = _POOLS.get(workers - 1)
        if pool is None:
            pool = _POOLS[workers - 1] = ThreadPoolExecutor(workers - 1, "tokenfield-chains")
    bounds = np.linspace(0, count, workers + 1).round().astype(int).tolist()
    runs = list(zip(bounds[:-1], bounds[1:], strict=True))
    others = [pool.submit(call, lo, hi) for lo, hi in runs[1:]]
    call(*runs[0])  # the first run on this thread, the others beside it
    for done in others:
        done.result()


def _sink_free(
    a: torch.Tensor, rest: torch.Tensor, out: torch.Tensor | None = None
) -> torch.Tensor:
    """The chains of ``a`` ``(..., m, m)`` without the sink, as
    :func:`~tokenfield.models.markov.without_sink` (token 0 dropped, the rows renormalised,
    a row left empty a self-loop) but kept at width ``m`` (row and column 0 zero):
    ``rest`` ``(..., m)`` the valid tokens but 0. Into ``out`` when given."""
    b = torch.mul(a, rest[..., :, None] * rest[..., None, :], out=out)
    sums = b.sum(-1)
    empty = (sums <= 0) & (rest > 0)
    b.diagonal(dim1=-2, dim2=-1).add_(empty.to(b.dtype))
    sums = b.sum(-1, keepdim=True)
    return b.div_(torch.where(sums > 0, sums, torch.ones_like(sums)))


def _symmetrised(a: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``S = D^-1/2 (a + a^T) D^-1/2`` (``D`` the degrees, 1 where 0) and ``pi`` (the
    valid degrees, normalised) of the chains ``a`` ``(..., m, m)``."""
    w = a + a.transpose(-1, -2)
    degree = w.sum(-1)
    degree = torch.where(degree > 0, degree, torch.ones_like(degree))
    real = degree * valid
    pi = real / real.sum(-1, keepdim=True)
    root = degree.rsqrt()
    return w.mul_(root[..., :, None]).mul_(root[..., None, :]), pi  # w is not needed after


def _compiled() -> Any:
    """:mod:`tokenfield.models._lanczos_cpu`, or ``None`` where numba is not installed."""
    try:
        from tokenfield.models import _lanczos_cpu
    except ImportError:  # pragma: no cover - numba is a dependency
        return None
    return _lanczos_cpu


def _compiled_spectrum(
    kernel: Any, a: torch.Tensor, valid: torch.Tensor, skip: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`_chain_spectrum` of float32 chains on the CPU by the compiled Lanczos
    (:func:`tokenfield.models._lanczos_cpu.chain_lambda2`; same tolerance and start
    vector as :func:`_lanczos_lambda2` in float32, at most :data:`COMPILED_STEPS` steps,
    and besides the residual bounds Temple's bound :data:`COMPILED_TEMPLE`): of ``a``
    itself (``skip = 0``) or of ``a`` without the sink (``skip = 1``, ``valid`` 0 at
    token 0; read from ``a``, never formed). :func:`_compiled_chains` does the work."""
    lam, pi = _compiled_chains(kernel, a, valid, skip)
    return lam[..., 0], pi[..., 0, :]


def _compiled_pair(
    kernel: Any, a: torch.Tensor, valid: torch.Tensor
) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """``((lam, pi), (lam_ns, pi_ns))``: :func:`_compiled_spectrum` of ``a`` and of ``a``
    without the sink at once, their two Lanczos runs in lockstep so that each pass over a
    matrix serves both products, and their degrees come from one pass (causal chains; on
    512-token SmolLM2 chains, 1 thread, about 1.15 ms a matrix, against 1.8 to 2.0 ms for
    the two apart with residual bounds only, as before, and 1.5 to 1.6 ms apart with
    Temple's bound)."""
    lam, pi = _compiled_chains(kernel, a, valid, 2)
    return (lam[..., 0], pi[..., 0, :]), (lam[..., 1], pi[..., 1, :])


def _compiled_chains(
    kernel: Any, a: torch.Tensor, valid: torch.Tensor, skip: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``lam`` ``(..., chains)`` and ``pi`` ``(..., chains, m)`` of :func:`_compiled_spectrum`
    (``skip`` 0 or 1: one chain) and :func:`_compiled_pair` (``skip = 2``: both), the
    matrices split over the torch threads: on torch's own OpenMP team
    (:func:`tokenfield.models._omp.chains_in_team`), else on a pool's threads
    (:func:`_in_threads`). What it does not certify: dense float64 ``eigvalsh``, or for
    a long prompt the reference's ARPACK."""
    shape, m = a.shape[:-2], a.shape[-1]
    chains = a.reshape(-1, m, m).contiguous()
    masks = valid.to(a.dtype).expand(*shape, m).reshape(-1, m).contiguous()
    count, width = chains.shape[0], 2 if skip == 2 else 1
    lam = np.empty((count, width))
    pi = np.empty((count, width, m), dtype=np.float32)
    taken = np.empty((count, width), dtype=np.int64)
    start = _start_vector(m, torch.device("cpu")).to(torch.float32).numpy()
    weights, inside = chains.numpy(), masks.numpy()

    settings = (skip, start, LANCZOS_TOL_FLOAT32, COMPILED_TEMPLE, COMPILED_STEPS,
                _FIRST_CHECK_COMPILED, _BREAKDOWN_FLOAT32)  # fmt: skip

    def solve(lo: int, hi: int) -> None:
        chosen = (weights[lo:hi], inside[lo:hi], *settings, lam[lo:hi], pi[lo:hi], taken[lo:hi])
        kernel.chain_lambda2(*chosen)

    threads = min(torch.get_num_threads(), count)
    every = (weights, inside, *settings, lam, pi, taken)
    if threads <= 1 or not _omp.chains_in_team(threads, *every):
        _in_threads(solve, count)  # one thread, or no torch libgomp: a pool's threads
    for j in range(width):  # not certified: dense eigvalsh on those alone
        drop = 1 if skip == 1 or j == 1 else 0
        late = np.flatnonzero(lam[:, j] < 0)
        if late.size and m > BATCHED_LIMIT_CPU:  # a long prompt (unpadded): the reference's ARPACK
            for chain in late.tolist():
                matrix = chains[chain].double().numpy()
                lam[chain, j] = symmetrized_spectrum(without_sink(matrix) if drop else matrix)[0]
        elif late.size:
            index = torch.from_numpy(late)
            late_chains, late_masks = chains[index].double(), masks[index].double()
            if drop:
                late_masks[:, 0] = 0.0
                late_chains = _sink_free(late_chains, late_masks)
            s, _pi = _symmetrised(late_chains, late_masks)
            lam[late, j] = _dense_lambda2(s).numpy()
    out = torch.from_numpy(lam).clamp(max=1.0).reshape(*shape, width)
    return out, torch.from_numpy(pi).reshape(*shape, width, m)


# The compiled Lanczos (_compiled_spectrum) from this many tokens on, dense float64
# eigvalsh below: _reduce_padded of one block of two SmolLM2 prompts (18 heads, both
# chains), dense / compiled, ms: m = 24: 1.42 / 1.97; 32: 1.95 / 2.29; 48: 4.30 / 2.90;
# 64: 5.59 / 3.51; 96: 13.7 / 4.9 (256: 12.8 against the batched float32 Lanczos's 32).
# Its first check: step 16, then 4 steps on, then as the residual falls (2 to 8 steps;
# no lockstep group to wait for).
COMPILED_FROM = 40
_FIRST_CHECK_COMPILED = 16
# Its steps at most (and at most m - 1): more than the batched version's LANCZOS_STEPS, as
# a step costs 7 us against 3.5 ms for the dense fallback at 256 tokens. On SmolLM2's
# 1080 chains at 256 tokens 7 were not certified in 100 steps, 2 in 150, none in 255
# (the mean stays at 33 steps).
COMPILED_STEPS = 250
# The compiled Lanczos also certifies the end that gives |lambda_2| where Temple's bound
# r^2 / delta (r its residual bound, delta the distance to the next Ritz value less that
# one's bound) is below this, and the other end where it cannot be the answer
# (_lanczos_cpu._excess). On 90 SmolLM2 chains at 512 tokens (with the sink, without),
# against dense float64 eigvalsh: 30.8 and 30.4 steps on average with residual bounds
# alone, 24.1 and 23.5 with these (27.8 and 27.2 without Temple's bound); the largest
# error 1.8e-7 and 3.3e-7 before, 2.9e-7 and 3.9e-7 now (float32's rounding).
# A tenth of LANCZOS_TOL_FLOAT32: an error of at most 1e-6 where the residual bound
# alone allows 1e-5.
COMPILED_TEMPLE = 1e-6
# |lambda_2| by Lanczos (_chain_spectrum) from this many tokens (the padded width m) on,
# dense eigvalsh below. CPU time per matrix on SmolLM2's chains (1 thread; dense /
# Lanczos, all of them in one call | 18 a call, two prompts' heads as in a trace):
# m = 128: 0.65 / 0.65 | 0.65 / 0.79 ms; 160: 0.96 / 0.77 (18 a call; 9 a call: even);
# 192: 1.6 / 1.0 | 1.4 / 1.1; 256: 3.5 / 1.5 | 3.2 / 1.7; 384: 9.9 / 3.4 | 9.4 / 3.3.
LANCZOS_FROM = 160
# The same for float32 work arrays (the CPU's, REDUCE_DTYPE), dense eigvalsh still in
# float64: _reduce_padded of one block of two SmolLM2 prompts (18 heads, both chains),
# dense / Lanczos, ms: m = 48: 3.8 / 7.1; 64: 7.6 / 8.6; 96: 14.7 / 11.1; 128: 29.4 /
# 15.6; 160: 43.2 / 20.3; 192: 71.3 / 24.1 (the two within 4.2e-7).
LANCZOS_FROM_FLOAT32 = 80
# On a GPU, from this many tokens: cuSOLVER's batched eigensolver stops at 32 x 32, and
# dense eigvalsh of larger matrices took 94 % of the read-out of 64-token prompts on an
# H100 (27.7x a plain trace), while the batched Lanczos ran 256-token ones at 5.1x.
LANCZOS_FROM_CUDA = 33
# Stop a matrix once the residual bounds ``beta_k |y_k|`` of both extreme Ritz pairs are
# below this. A Ritz value's error is about residual^2 / gap. Against dense eigvalsh on
# SmolLM2's chains (1080 each at 160, 192 and 256 tokens, 540 at 384): 1e-6 left at
# most 1.2e-11, 1e-7 at most 8e-14, for 3 more steps (median 34 at 256 tokens, 31 at
# 1e-6; 1e-5 left 1.8e-9): 1e-7, far inside 1e-9 even where the gap is 100x smaller.
LANCZOS_TOL = 1e-7
# The same in float32 (REDUCE_DTYPE on the CPU), where rounding alone moves the values by
# up to about 5e-7: a residual of 1e-5 bounds the error by 1e-5 whatever the gap, and on
# SmolLM2's chains at 256 tokens left the rounding as the only error (5.4e-7 at 1e-4, 1e-5
# and 1e-7 alike), for a median of 26 steps instead of 30.5 at 1e-7.
LANCZOS_TOL_FLOAT32 = 1e-5
# Steps at most (and at most m - 1); the matrices not certified by then are solved
# densely: 0.4 % of those chains at 160 tokens, 1.8 % at 256, 3.1 % at 384.
LANCZOS_STEPS = 100
_FIRST_CHECK = 20  # the first Ritz check (5 % of the chains at 256 tokens are done by then)
_FIRST_WAIT = 16
_CHECK_GRID = 4  # later checks on multiples of this step
_SLOWEST = 0.15  # decades per step the residual is assumed to fall at least
_BREAKDOWN = 1e-12  # beta below this: the Krylov space is invariant (exhausted)
# In float32 a spent Krylov space leaves rounding noise of about 1e-7 to 1e-6, not 1e-16:
# beta below this counts as a breakdown there (dropping a coupling beta moves the Ritz
# values by at most beta), and a start vector this small against its norm as none.
_BREAKDOWN_FLOAT32 = 1e-5
# _ritz_extremes: all the matrices of a call at once (_ritz_batched) from this many on, one
# at a time by dstemr (_ritz_dstemr) below. Time per call on Lanczos tridiagonals of
# attention-like chains, dstemr / batched, ms, k = 24 | 100. CPU (1 thread, the
# recurrence): n = 157: 3.6 / 5.5 | 11.9 / 23; 256: 5.8 / 5.9 | 19.5 / 27; 350: 8.1 / 6.4
# | 27 / 30; 440: 10.0 / 6.9 | 33 / 30; 2000: 45 / 17 | 155 / 81 (k = 40, 64: even at
# 350, 440).
RITZ_BATCHED_FROM = 400
# H100 (the CUDA graphs; dstemr after one copy to the host): n = 8: 0.41 / 0.87 | 1.07 /
# 1.89; 32: 1.21 / 0.89 | 3.4 / 2.2; 64: 2.2 / 0.89 | 6.9 / 2.3; 157: 4.7 / 1.2 | 16.0 /
# 3.1; 440: 13.2 / 1.4 | 42 / 4.7; 2000: 60 / 3.1 | 183 / 13.9 (the same kernels not
# replayed: 7 to 14 ms up to 440, 28 ms at 2000).
RITZ_BATCHED_FROM_CUDA = 24
# Laguerre steps at most; a matrix still open then goes to dstemr. On 350 Lanczos
# tridiagonals at k = 24, 40, 64, 100 a call of them all took 7, 8, 10, 10 steps.
_RITZ_PASSES = 12
_RITZ_FIRST_STOP = 5  # steps before the first check (a host sync on a GPU): 4 at least
_RITZ_TOL = 1e-14  # an end is done when its root is bracketed this tightly (scaled T)
# The next root closer than this (scaled T): dstemr. The tree's roots drift as eps / gap
# (1e-14 at a gap of 3e-4, 1e-13 where three roots fall within 1e-4); 1 in 470 of the
# Lanczos tridiagonals of attention-like chains goes to dstemr (a third of near-uniform
# random ones, whose ends are dense).
_RITZ_GAP = 1e-3
# The same for a float32 Lanczos's checks (_lanczos_rounds: certified at
# LANCZOS_TOL_FLOAT32, the values themselves good to the rounding of S, about 5e-7), where
# a root drifting by eps / gap (1e-10 at 1e-6) changes nothing. At 1e-3, a fifth of the
# tridiagonals of SmolLM2's random-weight copy (dense ends) went to dstemr, one at a
# time on the host (35 ms a check on an H100); at any gap down to 0 the batched bounds of
# those tridiagonals (k = 32, 48) were within 2e-12 of dstemr's, their values within 1e-15.
_RITZ_GAP_FLOAT32 = 1e-6
# float64 elements of the product tree's largest temporary (a level's 6 x 6 x 6 products,
# 64 MB): more matrices are done in turn.
_TREE_ELEMENTS = 1 << 23
# On a GPU, _ritz_batched replays CUDA graphs (_RitzGraphs) for these many matrices (a
# call takes the smallest that holds it; more: in turn) and rows padded to a power of two
# from _GRAPH_ROWS: 20 sets at most (rows up to 512: the Lanczos rounds of a GPU check at
# m - 1 steps, m up to DENSE_LIMIT), each captured on first use (15 to 35 ms) and kept
# (with six sets in use, 480 MB reserved on the GPU in all; more with the larger rows).
_RITZ_GRAPHED = True
_GRAPH_COUNTS = (64, 256, 512, 1024)
_GRAPH_ROWS = 32
# On a GPU (FIXED_ON), |lambda_2| by _lanczos_rounds: every matrix takes the first round's
# steps, the ones not certified then go on to the next round's (then to m - 1). Fraction
# certified (float32, LANCZOS_TOL_FLOAT32) after k steps, SmolLM2's chains at 256 tokens
# (360, both chains): k = 24: 44 %, 32: 68 %, 48: 91 %, 64: 98 %; the largest error
# against dense eigvalsh of those certified 5.9e-7 at every k; its random-weight copy's
# (180): 51 %, 88 %, 100 % at 24, 32, 48.
LANCZOS_ROUNDS_CUDA = (48, 96)
FIXED_ON = ("cuda",)
# On a GPU, the float32 chains of prompts of COMPILED_FROM tokens to fewer than this many
# (the padded width) are copied to the host and solved there by the compiled Lanczos
# (_compiled_pair, on torch's threads) instead of by _lanczos_rounds on the GPU: 0, off,
# until measured on a GPU. Its case for short prompts: at 64 tokens the GPU's rounds
# take the whole space (63 steps of about 0.4 ms each, bound by launches and the host,
# whatever the number of matrices) and a Ritz check of 18 ms, about 42 ms for a batch of
# eight SmolLM2-135M prompts (4,320 chains, both kinds) on an H100 in session 17; the
# compiled pair takes 136 us a matrix on one core of the 2-core machine (both chains;
# 2,160 matrices: 0.29 s, or about 20 ms on 16 cores), and the copy 35 MB.
# benchmarks/attention_variants.py measures it ("chains on the host ...").
HOST_CHAINS_UNTIL_CUDA = 0
# Bytes of S per lockstep group: 10 MB (20 float64 or 40 float32 matrices of 256 x 256),
# which the matrix-vector products reread from the CPU's cache; on a GPU one group takes
# everything.
_GROUP_BYTES = {"cpu": 10 << 20, "cuda": 1 << 30}


def _lanczos_from(s: torch.Tensor) -> int:
    """The width from which :func:`_chain_spectrum` solves ``s`` by Lanczos."""
    if s.device.type == "cuda":
        return LANCZOS_FROM_CUDA
    return LANCZOS_FROM_FLOAT32 if s.dtype == torch.float32 else LANCZOS_FROM


def _start_vector(m: int, device: torch.device) -> torch.Tensor:
    """The Lanczos start vector of length ``m``: fixed pseudo-random numbers (its own
    generator, seeded 0, blocks of 4096), the same prefix for every ``m``, whatever the
    global random state."""
    device = torch.device(device)
    if device.type == "cpu":
        return _start_blocks(-(-m // 4096))[:m].clone()
    return _start_on(m, device)


@functools.lru_cache(maxsize=16)
def _start_on(m: int, device: torch.device) -> torch.Tensor:
    """:func:`_start_vector` on a GPU, kept (a copy from the host makes it wait); the
    callers only read it."""
    with torch.inference_mode(False):
        return _start_blocks(-(-m // 4096))[:m].to(device, copy=True)


@functools.lru_cache(maxsize=4)
def _start_blocks(count: int) -> torch.Tensor:
    """:func:`_start_vector`'s numbers, ``count`` blocks of 4096 (kept: the same every call)."""
    parts = [
        torch.randn(4096, generator=torch.Generator().manual_seed(k), dtype=torch.float64)
        for k in range(count)
    ]
    return torch.cat(parts)


def _lanczos_lambda2(
    s: torch.Tensor,
    top: torch.Tensor,
    valid: torch.Tensor,
    *,
    tol: float | None = None,
    steps: int | None = None,
) -> torch.Tensor:
    """The largest ``|eigenvalue|`` of ``s - top top^T`` for each of ``s`` ``(count, m, m)``
    (symmetric float64 or float32, ``top`` ``(count, m)`` a unit eigenvector of it), by
    Lanczos; returned in float64.

    Groups of matrices (:data:`_GROUP_BYTES`) run in lockstep, one batched
    matrix-vector product a step, ``S`` read in place (no copies). Each new vector
    is orthogonalised twice (Gram-Schmidt): against the two before it (the
    three-term recurrence, which gives ``alpha_k``), then against ``top`` and every
    vector so far (full reorthogonalisation). The Krylov space so stays orthogonal
    to ``top``: the deflation costs nothing more. The start vector
    (:func:`_start_vector`, zero outside ``valid``) does not depend on the global
    random state: the numbers are the same from run to run.

    A matrix is checked now and then (first at step :data:`_FIRST_CHECK`, then when
    its residual should reach ``tol`` at the rate it fell, on multiples of
    :data:`_CHECK_GRID`): the two extreme eigenpairs ``(theta, y)`` of its
    tridiagonal ``T_k`` (:func:`_ritz_extremes`) give the residual bounds
    ``beta_k |y_k|``; both below ``tol`` (default :data:`LANCZOS_TOL`, in float32
    :data:`LANCZOS_TOL_FLOAT32`), it is done with ``max(|theta_min|, |theta_max|)``.
    A breakdown (``beta`` below :data:`_BREAKDOWN`, in float32
    :data:`_BREAKDOWN_FLOAT32`: the Krylov space is invariant, its Ritz values eigenvalues)
    is done too. A finished matrix's slot takes the last running one (a copy), and
    the group shrinks. What is not done after ``steps`` steps (default
    :data:`LANCZOS_STEPS`) is solved by dense ``eigvalsh``, those matrices alone.
    ``s`` is overwritten (its matrices move within it).
    """
    single = s.dtype == torch.float32
    tol = (LANCZOS_TOL_FLOAT32 if single else LANCZOS_TOL) if tol is None else tol
    steps = LANCZOS_STEPS if steps is None else steps
    count, m = s.shape[0], s.shape[-1]
    out = torch.empty(count, dtype=torch.float64, device=s.device)
    steps = max(1, min(steps, m - 1))
    per = m * m * s.element_size()
    size = max(1, _GROUP_BYTES.get(s.device.type, _GROUP_BYTES["cpu"]) // per)
    size = -(-count // -(-count // size)) if count else 1  # groups of even size
    start = _start_vector(m, s.device).to(s.dtype)
    for begin in range(0, count, size):
        part = slice(begin, begin + size)
        out[part] = _lanczos_group(s[part], top[part], valid[part] * start, tol, steps)
    return out


def _lanczos_group(
    s: torch.Tensor, top: torch.Tensor, start: torch.Tensor, tol: float, steps: int
) -> torch.Tensor:
    """:func:`_lanczos_lambda2` of one lockstep group (``s`` overwritten)."""
    g = s.shape[0]
    on = s.device
    single = s.dtype == torch.float32
    basis = _first_vectors(top, start, steps)
    # per step, (live, 1, 2) projections of S q_k on q_(k-1), q_k (alpha_k the second)
    # and (live, 1, 1) norms beta_k; concatenated only at checks
    projections: list[torch.Tensor] = []
    norms: list[torch.Tensor] = []
    result = torch.zeros(g, dtype=torch.float64)
    lane = np.arange(g)  # the group's matrix in each slot
    due = np.full(g, min(_FIRST_CHECK, steps))  # each slot's next check (step)
    next_check = int(due[0])
    before = np.full((g, 2), np.nan)  # each slot's last check: step, log10 residual
    for k in range(1, steps + 1):
        c, b = _lanczos_step(s, basis, k)
        projections.append(c)
        norms.append(b)
        if k < next_check:
            continue
        projections, norms = [torch.cat(projections, 1)], [torch.cat(norms, 1)]
        alpha, beta = projections[0][..., 1], norms[0][..., 0]  # (live, k)
        check = np.flatnonzero(due <= k)
        at = torch.as_tensor(check, device=on)
        value, residual = _ritz_extremes(*_ritz_inputs(alpha[at], beta[at], single))
        done = residual < tol
        result[lane[check[done]]] = value[torch.from_numpy(done)]
        late = check[~done]
        if k == steps:  # not certified: dense eigvalsh on those alone
            if late.size:
                result[lane[late]] = _dense_lambda2(s[torch.as_tensor(late, device=on)]).cpu()
            break
        # the next check of the others: when their residual reaches tol at the rate it
        # fell since their last check (_SLOWEST at least), 2 to 16 steps on
        now = np.log10(np.maximum(residual[~done], 1e-300))
        rate = (before[late, 1] - now) / (k - before[late, 0])
        known = np.isfinite(rate)
        rate = np.where(known, np.maximum(rate, _SLOWEST), _SLOWEST)
        wait = np.clip(np.ceil((now - np.log10(tol)) / rate), 2, 16).astype(int)
        wait = np.where(known, wait, np.minimum(wait, _FIRST_WAIT))
        due[late] = np.minimum(k + wait, steps)
        before[late, 0], before[late, 1] = k, now
        if done.any():  # refill the finished slots with the last running ones, then shrink
            finished = np.zeros(len(lane), dtype=bool)
            finished[check[done]] = True
            live = int((~finished).sum())
            if live == 0:
                break
            holes = np.flatnonzero(finished[:live])
            movers = live + np.flatnonzero(~finished[live:])
            if holes.size:  # one gather and one scatter per array (on a GPU: two kernels)
                into = torch.as_tensor(holes, device=on)
                out_of = torch.as_tensor(movers, device=on)
                for array in (s, basis[:, : k + 2], projections[0], norms[0]):
                    array[into] = array[out_of]
            for array in (lane, due, before):
                array[holes] = array[movers]
            s, basis = s[:live], basis[:live]
            projections, norms = [projections[0][:live]], [norms[0][:live]]
            lane, due, before = lane[:live], due[:live], before[:live]
        # checks on a grid of _CHECK_GRID steps: fewer, fuller rounds of small solves
        next_check = min(-(-int(due.min()) // _CHECK_GRID) * _CHECK_GRID, steps)
    return result.to(on)


def _lanczos_rounds(
    s: torch.Tensor,
    top: torch.Tensor,
    valid: torch.Tensor,
    *,
    rounds: Sequence[int] | None = None,
    tol: float | None = None,
) -> torch.Tensor:
    """:func:`_lanczos_lambda2` in rounds of a fixed number of steps, for a GPU: every
    matrix takes the first round's steps (``rounds``, default
    :data:`LANCZOS_ROUNDS_CUDA`) with no wait for the host, then one Ritz check of
    them all (:func:`_ritz_extremes`, one wait); those not certified (residual bound
    below ``tol``) go on together to the next round's step, and so on, the last round
    at ``m - 1`` steps (the whole space: the Ritz values are the eigenvalues; a round
    past two thirds of it is skipped). What
    is still not certified there is solved by dense ``eigvalsh``.

    The adaptive schedule of :func:`_lanczos_lambda2` checks each matrix when its
    residual should be small enough: a wait for the host every few steps, which on a
    GPU cost more than the steps it saved. The same steps (:func:`_lanczos_step`),
    start vector and tolerance, so the values agree to it; but no cap of
    :data:`LANCZOS_STEPS` (the rounds go on to the whole space), and in float32 the
    Ritz check keeps close ends batched (:data:`_RITZ_GAP_FLOAT32`). ``s`` is not
    written.
    """
    single = s.dtype == torch.float32
    tol = (LANCZOS_TOL_FLOAT32 if single else LANCZOS_TOL) if tol is None else tol
    rounds = LANCZOS_ROUNDS_CUDA if rounds is None else rounds
    count, m = s.shape[0], s.shape[-1]
    on = s.device
    result = torch.zeros(count, dtype=torch.float64)
    if count == 0 or m < 2:
        return result.to(on)
    # a round past two thirds of the whole space costs more in its check than the steps
    # it saves: then straight on to the whole space
    targets = sorted({max(1, r) for r in rounds if 3 * r <= 2 * (m - 1)} | {m - 1})
    start = _start_vector(m, on).to(s.dtype) * valid
    basis = _first_vectors(top, start, targets[0])
    alpha = torch.empty((count, targets[-1]), dtype=s.dtype, device=on)
    beta = torch.empty_like(alpha)
    lane = np.arange(count)  # the matrix in each slot
    k = 0
    for target in targets:
        if basis.shape[1] < target + 2:  # room for this round's vectors
            grown = basis.new_empty((basis.shape[0], target + 2, m))
            grown[:, : k + 2] = basis[:, : k + 2]
            basis = grown
        graph = _round_graph(basis.shape[0], m, k, target, s.dtype, on)
        if graph is not None:
            graph(s, basis, alpha, beta)
        else:
            _round_steps(s, basis, alpha, beta, k, target)
        k = target
        gap = _RITZ_GAP_FLOAT32 if single else _RITZ_GAP
        value, residual = _ritz_extremes(*_ritz_inputs(alpha[:, :k], beta[:, :k], single), gap=gap)
        done = residual < tol
        result[lane[done]] = value[torch.from_numpy(done)]
        late = np.flatnonzero(~done)
        if not late.size:
            break
        at = torch.as_tensor(late, device=on)
        if k == targets[-1]:  # not certified on the whole space: dense eigvalsh
            result[lane[late]] = _dense_lambda2(s[at]).cpu()
            break
        s, basis, alpha, beta, lane = s[at], basis[at], alpha[at], beta[at], lane[late]
    return result.to(on)


def _round_steps(
    s: torch.Tensor,
    basis: torch.Tensor,
    alpha: torch.Tensor,
    beta: torch.Tensor,
    first: int,
    last: int,
) -> None:
    """Steps ``first + 1 .. last`` of :func:`_lanczos_rounds` (:func:`_lanczos_step`):
    ``basis`` rows ``first + 2 .. last + 1``, ``alpha`` and ``beta`` columns ``first ..
    last - 1`` written."""
    for step in range(first + 1, last + 1):
        c, b = _lanczos_step(s, basis, step)
        alpha[:, step - 1] = c[:, 0, 1]
        beta[:, step - 1] = b[:, 0, 0]


class _RoundGraph:
    """:func:`_round_steps` for at most ``count`` matrices of width ``m`` on fixed tensors,
    replayed as one CUDA graph (on a GPU; elsewhere run as it is, which tests the
    copies): a call copies its matrices and their basis so far in, replays, and copies
    the new basis rows, ``alpha`` and ``beta`` out. The rows past a call's matrices hold
    an earlier call's (each matrix's steps are its own: they change nothing else)."""

    def __init__(
        self, count: int, m: int, first: int, last: int, dtype: torch.dtype, device: torch.device
    ) -> None:
        self.count, self.first, self.last = count, first, last
        self.s = torch.zeros((count, m, m), dtype=dtype, device=device)
        self.basis = torch.zeros((count, last + 2, m), dtype=dtype, device=device)
        self.alpha = torch.zeros((count, last), dtype=dtype, device=device)
        self.beta = torch.zeros((count, last), dtype=dtype, device=device)

        def steps() -> None:
            _round_steps(self.s, self.basis, self.alpha, self.beta, first, last)

        self.device = device
        (self.replay,) = _captured((steps,), device)

    def __call__(
        self, s: torch.Tensor, basis: torch.Tensor, alpha: torch.Tensor, beta: torch.Tensor
    ) -> None:
        """:func:`_round_steps` of ``s`` (at most ``count`` matrices) from this graph's
        ``first`` to its ``last`` step, into ``basis``, ``alpha`` and ``beta``."""
        n, a, b = s.shape[0], self.first, self.last
        with _GRAPH_LOCK, torch.no_grad(), _on(self.device):  # one call at a time
            self.s[:n] = s
            self.basis[:n, : a + 2] = basis[:, : a + 2]
            self.replay()
            basis[:, a + 2 : b + 2] = self.basis[:n, a + 2 : b + 2]
            alpha[:, a:b] = self.alpha[:n, a:b]
            beta[:, a:b] = self.beta[:n, a:b]


# _lanczos_rounds replays each round's steps as a CUDA graph (_RoundGraph): off (False)
# until measured on a GPU (benchmarks/attention_variants.py: "Lanczos rounds as CUDA
# graphs"). Its case: at 64 tokens a round is 63 steps of about ten small kernels each,
# about 0.4 ms a step on an H100 in session 17 whatever the number of matrices (the
# launches and the host), about 25 ms a batch of eight prompts. Graphs for matrices of
# _ROUND_GRAPH_WIDTH tokens at most, their count rounded up to a multiple of
# _ROUND_GRAPH_STEP, each made the _ROUND_GRAPH_AFTER-th time its round is seen (a
# capture costs about two rounds: the warm-up and the capture; widths seen once, as
# with prompts of many lengths, stay eager), holding at most _ROUND_GRAPH_BYTES of
# fixed tensors (a copy of the matrices, the basis, alpha and beta), the last
# _ROUND_GRAPHS_KEPT kept.
_ROUNDS_GRAPHED = False
_ROUND_GRAPH_WIDTH = 320
_ROUND_GRAPH_STEP = 256
_ROUND_GRAPH_AFTER = 2
_ROUND_GRAPH_BYTES = 1 << 29
_ROUND_GRAPHS_KEPT = 6
_ROUND_GRAPHS: dict[tuple[Any, ...], _RoundGraph | None] = {}
_ROUNDS_SEEN: dict[tuple[Any, ...], int] = {}


def _round_graph(
    n: int, m: int, first: int, last: int, dtype: torch.dtype, device: torch.device
) -> _RoundGraph | None:
    """The :class:`_RoundGraph` for ``n`` matrices of width ``m`` from step ``first`` to
    ``last`` (made the :data:`_ROUND_GRAPH_AFTER`-th time it is asked for, the least
    recently used dropped past :data:`_ROUND_GRAPHS_KEPT`), or None: graphs off
    (:data:`_ROUNDS_GRAPHED`), too wide or too large, not asked for often enough yet, or
    the capture refused (the steps then run as they are)."""
    if not _ROUNDS_GRAPHED or m > _ROUND_GRAPH_WIDTH:  # (off: nothing else to work out)
        return None
    count = -(-n // _ROUND_GRAPH_STEP) * _ROUND_GRAPH_STEP
    elements = count * (m * m + (last + 2) * m + 2 * last)
    if elements * dtype.itemsize > _ROUND_GRAPH_BYTES:
        return None
    key = (device, count, m, first, last, dtype)
    with _GRAPH_LOCK:
        if key in _ROUND_GRAPHS:
            _ROUND_GRAPHS[key] = _ROUND_GRAPHS.pop(key)  # the most recently used last
            return _ROUND_GRAPHS[key]
        seen = _ROUNDS_SEEN.pop(key, 0) + 1
        if seen < _ROUND_GRAPH_AFTER:  # not yet: eager this time
            if len(_ROUNDS_SEEN) >= 1024:
                _ROUNDS_SEEN.clear()
            _ROUNDS_SEEN[key] = seen
            return None
        while len(_ROUND_GRAPHS) >= _ROUND_GRAPHS_KEPT:
            _ROUND_GRAPHS.pop(next(iter(_ROUND_GRAPHS)))
        try:  # normal tensors, which a later call may update outside inference mode too
            with torch.inference_mode(False), torch.no_grad():
                made: _RoundGraph | None = _RoundGraph(count, m, first, last, dtype, device)
        except RuntimeError:  # capture refused (or out of memory): the steps as they are
            made = None
        _ROUND_GRAPHS[key] = made
        return made


def _first_vectors(top: torch.Tensor, start: torch.Tensor, steps: int) -> torch.Tensor:
    """The Lanczos basis ``(count, steps + 2, m)`` of :func:`_lanczos_lambda2` before
    its first step: row 0 ``top``, row 1 ``start`` orthogonalised against it (twice)
    and normalised, the others not yet written. A start with nothing left but
    rounding noise gives a zero vector (a breakdown at step 1)."""
    q = start - top * (top * start).sum(-1, keepdim=True)
    q = q - top * (top * q).sum(-1, keepdim=True)
    norm = q.norm(dim=-1, keepdim=True)
    small = _BREAKDOWN_FLOAT32 if top.dtype == torch.float32 else 1e-8
    norm = torch.where(norm > small * start.norm(dim=-1, keepdim=True), norm, torch.inf)
    basis = torch.empty(
        (top.shape[0], steps + 2, top.shape[-1]), dtype=top.dtype, device=top.device
    )
    basis[:, 0] = top
    basis[:, 1] = q / norm
    return basis


def _lanczos_step(
    s: torch.Tensor, basis: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Lanczos step ``k`` (from 1) of every matrix of ``s`` ``(count, m, m)``: ``basis``
    row ``k + 1`` written, ``(c, b)`` returned: ``c`` ``(count, 1, 2)`` the projections of
    ``S q_k`` on ``q_(k-1)`` and ``q_k`` (``alpha_k`` the second), ``b`` ``(count, 1, 1)``
    the norm ``beta_k``. The new vector is orthogonalised twice (Gram-Schmidt): against
    the two before it (the three-term recurrence), then against ``top`` and every vector
    so far (full reorthogonalisation). A zero vector stays zero (no division by 0)."""
    w = torch.bmm(basis[:, k : k + 1], s)  # (count, 1, m): q_k^T S = (S q_k)^T
    pair = basis[:, k - 1 : k + 1]  # top and q_1 at k = 1
    c = torch.bmm(w, pair.mT)
    w = torch.baddbmm(w, c, pair, alpha=-1)
    so_far = basis[:, : k + 1]
    w = torch.baddbmm(w, torch.bmm(w, so_far.mT), so_far, alpha=-1)
    b = torch.linalg.vector_norm(w, dim=-1, keepdim=True)
    torch.div(w, b.clamp(min=torch.finfo(b.dtype).tiny), out=basis[:, k + 1 : k + 2])
    return c, b


def _ritz_inputs(
    alpha: torch.Tensor, beta: torch.Tensor, single: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """``alpha`` and ``beta`` of Lanczos runs as :func:`_ritz_extremes` takes them
    (float64; in float32 a ``beta`` below :data:`_BREAKDOWN_FLOAT32` is rounding noise,
    not a coupling: a breakdown)."""
    alpha, beta = alpha.double(), beta.double()
    if single:
        beta = torch.where(beta > _BREAKDOWN_FLOAT32, beta, 0.0)
    return alpha, beta


def _ritz_extremes(
    alpha: torch.Tensor, beta: torch.Tensor, *, gap: float = _RITZ_GAP
) -> tuple[torch.Tensor, np.ndarray]:
    """The largest ``|Ritz value|`` of each Lanczos tridiagonal ``T_k`` (diagonal
    ``alpha`` ``(n, k)``, off-diagonal ``beta[:, :-1]``, last coupling ``beta[:, -1]``)
    and the larger residual bound ``beta_k |y_k|`` of its two extreme Ritz pairs.

    At the first ``beta`` below :data:`_BREAKDOWN` (or not finite) the Krylov space is
    invariant: ``T`` ends there, its Ritz values are eigenvalues, the residual bound
    is 0. Not finite entries of ``alpha`` count as 0. From :data:`RITZ_BATCHED_FROM`
    matrices a call on (:data:`RITZ_BATCHED_FROM_CUDA` on a GPU) all the matrices at
    once, on their device (:func:`_ritz_batched`); below it one at a time on the host
    (:func:`_ritz_dstemr`). The values come back on the CPU (a tensor), the bounds as
    an array.
    """
    on_cpu = alpha.device.type == "cpu"
    if alpha.shape[0] >= (RITZ_BATCHED_FROM if on_cpu else RITZ_BATCHED_FROM_CUDA):
        return _ritz_batched(alpha, beta, gap=gap)
    return _ritz_dstemr(alpha, beta)


def _ritz_dstemr(alpha: torch.Tensor, beta: torch.Tensor) -> tuple[torch.Tensor, np.ndarray]:
    """:func:`_ritz_extremes` one matrix at a time: LAPACK's ``dstemr`` (MRRR) for just
    the two extreme eigenpairs of the tridiagonal, several times cheaper than a dense
    ``eigh`` of ``T_k`` (20 to 45 us a matrix for ``k`` = 24 to 64)."""
    from scipy.linalg import lapack

    alphas, betas = alpha.cpu().numpy(), beta.cpu().numpy()
    k = alphas.shape[1]
    good = np.isfinite(betas) & (betas > _BREAKDOWN)
    sizes = np.where(good.all(-1), k, good.argmin(-1) + 1)  # T up to the first breakdown
    couplings = np.where(good.all(-1), betas[:, -1], 0.0)
    diagonals = np.nan_to_num(alphas, nan=0.0, posinf=0.0, neginf=0.0)
    offdiagonals = np.nan_to_num(betas, nan=0.0, posinf=0.0, neginf=0.0)
    value = np.abs(diagonals[:, 0])  # T of size 1
    residual = couplings.copy()
    for i in np.flatnonzero(sizes > 1).tolist():
        size = int(sizes[i])
        d = diagonals[i, :size]
        e = offdiagonals[i, :size].copy()
        e[-1] = 0.0  # dstemr's off-diagonal has room for one more (and is overwritten)
        low, high = (lapack.dstemr(d, e.copy(), 2, 0.0, 0.0, j, j) for j in (1, size))
        if low[3] == 0 and high[3] == 0:
            theta, last = (low[1][0], high[1][0]), (low[2][size - 1, 0], high[2][size - 1, 0])
        else:  # MRRR failed (rare): a dense solve of the small tridiagonal
            w, z = np.linalg.eigh(np.diag(d) + np.diag(e[:-1], 1) + np.diag(e[:-1], -1))
            theta, last = (w[0], w[-1]), (z[-1, 0], z[-1, -1])
        value[i] = max(abs(theta[0]), abs(theta[1]))
        residual[i] = couplings[i] * max(abs(last[0]), abs(last[1]))
    return torch.from_numpy(value), residual


def _ritz_batched(
    alpha: torch.Tensor, beta: torch.Tensor, *, tree: bool | None = None, gap: float = _RITZ_GAP
) -> tuple[torch.Tensor, np.ndarray]:
    """:func:`_ritz_extremes` of all the matrices at once, on their device: Laguerre's
    method on the characteristic polynomials ``chi(x) = det(x I - T)``, then the last
    eigenvector components from the leading and trailing minors (:class:`_RitzState`;
    on a GPU replayed as CUDA graphs, :class:`_RitzGraphs`).

    ``T`` is shifted and scaled, ``(T - c) / r``, so that its Gershgorin interval is
    ``[-1, 1]`` (eigenvectors unchanged, eigenvalues mapped back at the end). From
    outside the spectrum Laguerre's step ``N chi / (chi' +- sqrt((N - 1)((N - 1)
    chi'^2 - N chi chi'')))`` (``N`` the size of ``T``, the sign that of ``chi'``)
    never passes the nearest root of a polynomial with real roots and converges to it
    monotonically, cubically once it is isolated: started at ``-1`` and ``1`` it
    finds ``theta_min`` and ``theta_max``, both ends in one batch. With ``u_i =
    1 / (x - lambda_i)``, ``chi'/chi = sum u_i`` and ``(chi'^2 - chi chi'')/chi^2 =
    sum u_i^2``, so ``chi chi' / (chi'^2 - chi chi'') = sum u_i / sum u_i^2`` is at
    least the distance to the nearest root as Laguerre's step is at most: an end is
    done once the two agree within :data:`_RITZ_TOL`. The polynomial and its first two
    derivatives come from :func:`_characteristic`. On the Lanczos tridiagonals of
    attention-like chains a matrix takes 4 to 7 steps (``k`` 24 to 100; 1 in 50: 8 to
    10), a call as many as its slowest matrix.

    The last components (:func:`_last_components`): ``y_j^2 = chi_(1..j-1)(theta)
    chi_(j+1..k)(theta) / chi'(theta)`` (the residue of the resolvent's ``(j, j)``
    entry: a leading and a trailing minor; ``chi'`` is the sum of these products), and
    ``y_j y_k = beta_j ... beta_(k-1) chi_(1..j-1)(theta) / chi'(theta)`` (the ``(j,
    k)`` entry's), so ``y_k^2 = (beta_j ... beta_(k-1))^2 chi_(1..j-1)(theta) /
    (chi'(theta) chi_(j+1..k)(theta))`` for every ``j``. Taken at the ``j`` of the
    largest ``y_j`` (MRRR's twist index), where the minors are far from their roots,
    it keeps its relative accuracy however small ``y_k`` is (``1e-9`` once
    converged): within ``1e-12`` of dstemr's bounds. ``j = k`` alone,
    ``chi_(k-1)(theta) / chi'(theta)``, leaves an absolute error of ``eps / gap``
    (``theta`` is a root of ``chi_(k-1)`` too, to ``1e-18``): relative errors up to
    ``1e4`` on such chains; ``j = 1`` alone fails where the start vector's share
    ``y_1`` is small (``1e-4`` in one of 300).

    A matrix goes to :func:`_ritz_dstemr` where an end is still open after
    :data:`_RITZ_PASSES` steps (a cluster at an end, where Laguerre converges only
    linearly), where the next root is closer than ``gap`` (:data:`_RITZ_GAP`; ``chi' / chi''``
    at the root bounds the gap from below; there the components are ill determined
    and the product tree's roots less accurate), or where anything came out not
    finite. ``tree`` (default: on a GPU) picks :func:`_characteristic`'s product
    tree over the recurrence.
    """
    n, k = alpha.shape
    on = alpha.device
    if n == 0:
        return torch.zeros(0, dtype=torch.float64), np.zeros(0)
    tree = on.type != "cpu" if tree is None else tree
    graphs = _ritz_graphs(n, k, on) if tree and on.type == "cuda" else None
    if graphs is not None:  # in chunks of the graphs' size
        out = torch.cat(
            [
                graphs(alpha[i : i + graphs.count], beta[i : i + graphs.count])
                for i in range(0, n, graphs.count)
            ],
            1,
        )
    else:
        state = _RitzState(alpha, beta[:, :-1], beta[:, -1], k, tree)
        for _ in range(_RITZ_FIRST_STOP, _RITZ_PASSES):
            if bool(state.done.all()):
                break
            state.step()
        out = state.finish()
    out = out.cpu()
    value, residual = out[0], out[1].numpy()
    redo = np.flatnonzero(((out[2] > 0) | (out[3] < gap)).numpy())
    if redo.size:  # clusters at an end: one at a time
        at = torch.from_numpy(redo).to(on)
        value[redo], residual[redo] = _ritz_dstemr(alpha[at], beta[at])
    return value, residual


class _RitzState:
    """:func:`_ritz_batched`'s work on fixed tensors, in three parts that a CUDA graph
    can each capture: the set-up and the first :data:`_RITZ_FIRST_STOP` Laguerre steps
    (the constructor), one more step (:meth:`step`, in place) and the values, bounds
    and open flags (:meth:`finish`). ``alpha`` ``(n, m)``, ``inner`` ``(n, m - 1)``
    the couplings within, ``last`` ``(n,)`` the coupling after row ``length``."""

    def __init__(
        self,
        alpha: torch.Tensor,
        inner: torch.Tensor,
        last: torch.Tensor,
        length: int | torch.Tensor,
        tree: bool,
    ) -> None:
        dtype = torch.float64
        a = torch.nan_to_num(alpha.to(dtype), nan=0.0, posinf=0.0, neginf=0.0)
        good = torch.isfinite(inner) & (inner > _BREAKDOWN)
        kept = good.cumprod(-1).bool()  # every coupling up to this one good
        inside = torch.nn.functional.pad(kept, (1, 0), value=True)  # the rows of T
        slope = inside.to(dtype)
        order = slope.sum(-1)  # the size of T
        whole = (order >= length) & torch.isfinite(last) & (last > _BREAKDOWN)
        self.coupling = torch.where(whole, last.to(dtype), 0.0)
        within = torch.where(kept, inner.to(dtype), 0.0)
        before = torch.nn.functional.pad(within, (1, 0))  # to the row before (0: none)
        radius = before + torch.nn.functional.pad(within, (0, 1))
        low = torch.where(inside, a - radius, torch.inf).amin(-1)
        high = torch.where(inside, a + radius, -torch.inf).amax(-1)
        self.centre = (low + high) / 2
        self.scale = ((high - low) / 2).clamp(min=torch.finfo(dtype).tiny)  # size 1: any
        self.shift = torch.where(inside, (a - self.centre[:, None]) / self.scale[:, None], -1.0)
        self.slope = slope
        self.couple = (before / self.scale[:, None]) ** 2
        self.tree = tree
        if tree:
            self.rows = _transfer_rows(self.shift, slope, self.couple)
        else:  # the recurrence reads one row of all the matrices a step
            self.rows = (
                self.shift.T.contiguous(),
                slope.T.contiguous(),
                self.couple.T.contiguous(),
            )
        self.order = order
        self.x = torch.stack([-slope[:, 0], slope[:, 0]])  # the Gershgorin bounds
        self.done = torch.zeros(self.x.shape, dtype=torch.bool, device=a.device)
        self.gap = torch.zeros_like(self.x)
        for _ in range(_RITZ_FIRST_STOP):
            self.step()

    def step(self) -> None:
        """One Laguerre step from ``x`` (the ends not yet done)."""
        x, order = self.x, self.order
        chi, slope1, half2 = _characteristic(x, self.rows, self.tree)
        square = slope1 * slope1
        curve = torch.addcmul(square, chi, half2, value=-2.0)  # chi'^2 - chi chi'' >= 0
        root = (order * curve).sub_(square).mul_(order - 1).clamp_(min=0.0).sqrt_()
        step = (order * chi).div_(root.copysign_(slope1).add_(slope1))  # the near side
        far = (chi * slope1).div_(curve)  # the far side
        settled = far.sub_(step).abs_() <= _RITZ_TOL
        torch.div(slope1, half2, out=self.gap).abs_()  # the next root at least this far
        x.copy_(torch.where(self.done, x, x - step))
        self.done |= settled

    def finish(self) -> torch.Tensor:
        """``(4, n)``: the largest ``|Ritz value|``, the residual bound, 1 where the
        matrix is to be done again by :func:`_ritz_dstemr` (an end not done, anything
        not finite), and the lower bound on the distance from an end to the next root
        (``inf`` where the coupling is 0: the components are not needed), which the
        caller compares with its :data:`_RITZ_GAP` (outside the CUDA graphs)."""
        y2 = _last_components(self.x, self.shift, self.slope, self.couple, self.tree)
        value = (self.centre + self.scale * self.x).abs().amax(0)
        coupled = self.coupling > 0
        residual = torch.where(coupled, self.coupling * y2.amax(0).sqrt(), 0.0)
        again = ~self.done.all(0) | ~torch.isfinite(value) | ~torch.isfinite(residual)
        gap = torch.where(coupled, self.gap.amin(0), torch.inf)
        return torch.stack([value, residual, again.to(value.dtype), gap])


class _RitzGraphs:
    """CUDA graphs of a :class:`_RitzState` for ``count`` matrices of ``rows`` rows:
    the set-up with the first steps, one step, the finish. A call copies its matrices
    in (the rest: matrices of size 1 and rows passed through, done at once), replays
    the first, the second until every end is done, the third. Eager, a call launches
    300 to 500 small kernels, 15 to 25 us each on an H100 (7 to 14 ms a call for ``n``
    up to 440, 28 ms for 2000); replayed, the GPU's own time is left (0.9 to 3 ms up to
    256 matrices, 1.4 to 4.7 ms for 440, 3 to 14 ms for 2000). All the graphs share one
    memory pool (they never run at once); a set is captured in 15 to 35 ms."""

    def __init__(self, count: int, rows: int, device: torch.device) -> None:
        self.count = count
        dtype = torch.float64
        self.alpha = torch.zeros((count, rows), dtype=dtype, device=device)
        self.inner = torch.zeros((count, rows - 1), dtype=dtype, device=device)
        self.last = torch.zeros(count, dtype=dtype, device=device)
        self.length = torch.ones(count, dtype=dtype, device=device)
        self.state: _RitzState
        self.out: torch.Tensor

        def start() -> None:
            self.state = _RitzState(self.alpha, self.inner, self.last, self.length, True)

        def more() -> None:
            self.state.step()

        def end() -> None:
            self.out = self.state.finish()

        self.device = device
        self.parts: tuple[Callable[[], Any], ...] = _captured((start, more, end), device)

    def __call__(self, alpha: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
        """:meth:`_RitzState.finish` of ``alpha``, ``beta`` (at most ``count`` rows)."""
        n, k = alpha.shape
        # one call at a time: the graphs read and write the same buffers (threads
        # tracing at once in one process wait here instead of mixing their matrices)
        with _GRAPH_LOCK, torch.no_grad(), _on(self.device):
            for buffer in (self.alpha, self.inner, self.last):
                buffer.zero_()
            self.alpha[:n, :k] = alpha
            self.inner[:n, : k - 1] = beta[:, :-1]
            self.last[:n] = beta[:, -1]
            self.length.fill_(k)
            start, more, end = self.parts
            start()
            for _ in range(_RITZ_FIRST_STOP, _RITZ_PASSES):
                if bool(self.state.done[:, :n].all()):
                    break
                more()
            end()
            return self.out[:, :n].clone()  # the next call overwrites it


_GRAPH_LOCK = threading.Lock()
# One memory pool for all the CUDA graphs of a device (_RitzGraphs, _RoundGraph): they
# never run at once (_GRAPH_LOCK), and none leaves an output in the pool that another
# graph's replay could overwrite (their outputs are fixed tensors made before the
# capture, or cloned under the lock); a graph that kept one there would break this.
_GRAPH_POOLS: dict[torch.device, Any] = {}
_SIDE_STREAMS: dict[torch.device, Any] = {}


def _on(device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """``device`` made the current CUDA device (a graph captures and replays on the
    current device's streams), nothing elsewhere."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def _captured(
    parts: tuple[Callable[[], Any], ...], device: torch.device
) -> tuple[Callable[[], Any], ...]:
    """``parts`` (functions on fixed tensors) as the replays of CUDA graphs captured now,
    one each, in the device's shared pool, after a warm-up on the device's side stream
    (one per device: each stream that runs cuBLAS keeps a workspace); on the CPU,
    ``parts`` as they are."""
    if device.type != "cuda":
        return parts
    with _on(device):
        side = _SIDE_STREAMS.get(device)
        if side is None:
            side = _SIDE_STREAMS[device] = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):  # warm up outside the capture
            for part in parts:
                part()
        torch.cuda.current_stream(device).wait_stream(side)
        pool = _GRAPH_POOLS.setdefault(device, torch.cuda.graph_pool_handle())
        graphs = []
        for part in parts:
            graphs.append(torch.cuda.CUDAGraph())
            with torch.cuda.graph(graphs[-1], pool=pool):
                part()
    return tuple(graph.replay for graph in graphs)


_GRAPHS: dict[tuple[torch.device, int, int], _RitzGraphs | None] = {}


def _ritz_graphs(n: int, k: int, device: torch.device) -> _RitzGraphs | None:
    """The CUDA graphs for ``n`` matrices of ``k`` rows (:data:`_GRAPH_COUNTS`, rows a
    power of two from :data:`_GRAPH_ROWS`), made on first use; None where they cannot
    be (the eager path then)."""
    if not _RITZ_GRAPHED:
        return None
    count = next((size for size in _GRAPH_COUNTS if n <= size), _GRAPH_COUNTS[-1])
    rows = max(_GRAPH_ROWS, 1 << (k - 1).bit_length())
    key = (device, count, rows)
    with _GRAPH_LOCK:
        if key not in _GRAPHS:
            _GRAPHS[key] = _new_graphs(count, rows, device)
    return _GRAPHS[key]


def _new_graphs(count: int, rows: int, device: torch.device) -> _RitzGraphs | None:
    """:class:`_RitzGraphs` captured now, or None where the capture is refused."""
    try:  # normal tensors, which a later call may update outside inference mode too
        with torch.inference_mode(False), torch.no_grad():
            return _RitzGraphs(count, rows, device)
    except RuntimeError:  # capture refused (or out of memory): stay eager
        return None


def _transfer_rows(
    shift: torch.Tensor, slope: torch.Tensor, couple: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The rows of :func:`_characteristic`'s tree, in pairs: ``S_0``, ``S_1``, ``S_2``
    ``(n, K / 2, 6, 6)`` with the product of rows ``2 i + 1`` and ``2 i`` at ``x``
    ``S_0 + x S_1 + x^2 S_2``.

    A row's transfer matrix over the truncated power series is ``A_0 + A_1 h + A_2
    h^2`` with ``A_0 = [[slope x - shift, -couple], [1, 0]]``, ``A_1 = [[slope, 0],
    [0, 0]]``, ``A_2 = 0``; as the block lower-triangular Toeplitz matrix ``[[A_0, 0,
    0], [A_1, A_0, 0], [A_2, A_1, A_0]]`` (the product of two is their product's) it is
    ``C + x D``, and a pair's product ``C' C + x (C' D + D' C) + x^2 D' D``: the first
    level of the tree set up once, its largest temporaries gone from every step. The
    rows are padded in front to ``K``, a power of two, with rows passed through."""
    shift, slope, couple = _padded(shift, slope, couple)
    zero, one = torch.zeros_like(shift), torch.ones_like(shift)
    value = torch.stack([-shift, -couple, one, zero], -1).unflatten(-1, (2, 2))
    first = torch.stack([slope, zero, zero, zero], -1).unflatten(-1, (2, 2))
    nothing = torch.zeros_like(value)

    def toeplitz(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        rows = ([a, nothing, nothing], [b, a, nothing], [nothing, b, a])
        return torch.cat([torch.cat(row, -1) for row in rows], -2)

    constant, linear = toeplitz(value, first), toeplitz(first, nothing)
    (c1, c0), (d1, d0) = (constant[:, 1::2], constant[:, 0::2]), (linear[:, 1::2], linear[:, 0::2])
    return _products(c1, c0), _products(c1, d0) + _products(d1, c0), _products(d1, d0)


def _products(left: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
    """``left @ right`` of ``(..., 6, 6)`` batches: a broadcast product and a sum over
    the last axis (cuBLAS's batched products of matrices this small took about ten
    times as long on an H100)."""
    return (left[..., :, None, :] * right.transpose(-1, -2)[..., None, :, :]).sum(-1)


def _padded(*rows: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``shift``, ``slope`` and ``couple`` with rows passed through (-1, 0, 0) in front,
    up to a power of two (2 at least)."""
    k = rows[0].shape[-1]
    extra = max(2, 1 << (k - 1).bit_length()) - k
    if not extra:
        return rows
    pad = torch.nn.functional.pad
    return tuple(pad(row, (extra, 0), value=-1.0 if i == 0 else 0.0) for i, row in enumerate(rows))


def _characteristic(
    x: torch.Tensor, rows: tuple[torch.Tensor, ...], tree: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``chi(x)``, ``chi'(x)`` and ``chi''(x) / 2`` at ``x`` ``(2, n)``.

    The three-term recurrence ``chi_j = (x - alpha_j) chi_(j-1) - beta_(j-1)^2
    chi_(j-2)`` is ``[chi_j, chi_(j-1)] = P_j [chi_(j-1), chi_(j-2)]`` with the
    transfer matrix ``P_j = [[slope x - shift, -couple], [1, 0]]`` (a row of ``T``:
    ``slope`` 1, ``shift`` its scaled ``alpha``, ``couple`` its scaled ``beta^2`` to
    the row before, 0 for the first; a row past a breakdown: 0, -1, 0, which keeps
    ``chi`` and its derivatives). The scaled entries are at most 1 and ``|x| <= 1``:
    every value stays below ``3^k``, no rescaling needed (an underflow in a tight
    cluster ends at :func:`_ritz_dstemr`). On a GPU (``tree``) the product ``P_k ...
    P_1`` over the truncated power series by a pairwise tree: the pairs from their
    polynomials in ``x`` (:func:`_transfer_rows`), then ``log2 k - 1`` levels of
    :func:`_products`, some 15 kernels whatever ``n`` and ``k``. On the CPU the
    recurrence, ``k`` steps of three operations on all the matrices at once: a tenth
    of the tree's arithmetic, which the CPU is bound by.
    """
    if tree:
        pair0, pair1, pair2 = rows
        n = x.shape[-1]
        size = max(1, _TREE_ELEMENTS // (216 * pair0.shape[1]))  # matrices a chunk
        parts = []
        for begin in range(0, n, size):
            part = slice(begin, begin + size)
            at = x[:, part, None, None, None]
            m = torch.addcmul(pair0[part], at, pair1[part]).addcmul_(at * at, pair2[part])
            m = m.flatten(0, 1)
            while m.shape[1] > 1:  # later rows on the left
                m = _products(m[:, 1::2], m[:, 0::2])
            parts.append(m[:, 0, :, 0].unflatten(0, (2, -1)))  # M e_1 over the series
        column = torch.cat(parts, 1) if len(parts) > 1 else parts[0]
        return column[..., 0], column[..., 2], column[..., 4]
    shift, slope, couple = rows  # (k, n) each
    t = torch.addcmul(-shift[:, None], slope[:, None], x)  # (k, 2, n)
    v = x.new_zeros((3, *x.shape))  # chi_j and its first two Taylor coefficients
    v[0] = 1.0
    w = torch.zeros_like(v)  # chi_(j-1)
    new = torch.empty_like(v)
    for j in range(t.shape[0]):
        torch.mul(v, t[j], out=new)
        new[1:].addcmul_(v[:-1], slope[j])
        new.addcmul_(w, couple[j], value=-1.0)
        v, w, new = new, v, w
    return v[0], v[1], v[2]


def _last_components(
    x: torch.Tensor, shift: torch.Tensor, slope: torch.Tensor, couple: torch.Tensor, tree: bool
) -> torch.Tensor:
    """``y_k^2`` of the eigenvectors at the roots ``x`` ``(2, n)`` of the scaled
    tridiagonals (rows as in :func:`_characteristic`), by the twisted formula of
    :func:`_ritz_batched` from the leading and trailing minors of :func:`_minors`."""
    lead, trail = _minors(x, shift, slope, couple, tree)  # (2, n, k + 1) each
    weight = (lead[..., :-1] * trail[..., 1:]).abs()  # chi' y_j^2 of each row j
    twist = weight.argmax(-1, keepdim=True)
    # log (beta_j ... beta_(k-1))^2 (scaled, as the minors): the couplings after the twist
    logs = torch.where(couple > 0, couple, 1.0).log()
    after = logs.flip(-1).cumsum(-1).flip(-1) - logs
    log_y2 = (
        after.expand_as(weight).gather(-1, twist)
        + lead.gather(-1, twist).abs().log()
        - trail.gather(-1, twist + 1).abs().log()
        - weight.sum(-1, keepdim=True).log()
    )
    return log_y2[..., 0].exp().clamp(max=1.0)


def _minors(
    x: torch.Tensor, shift: torch.Tensor, slope: torch.Tensor, couple: torch.Tensor, tree: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """The leading minors ``chi_(1..j)(x)``, ``j = 0..k``, and the trailing ones
    ``chi_(j+1..k)(x)``, ``j = 0..k`` (the empty ones 1), at ``x`` ``(2, n)``: each
    computed in the direction it grows in, from the top and from the bottom. On a GPU
    (``tree``) by a scan (Hillis-Steele: ``log2 k`` levels of three kernels) of the
    ``2 x 2`` transfer matrices, the trailing ones as the transposed matrices in
    reverse order; on the CPU by the recurrences themselves."""
    k = shift.shape[-1]
    if tree:
        pad_shift, pad_slope, pad_couple = _padded(shift, slope, couple)
        t = pad_slope * x[..., None] - pad_shift
        one = torch.ones_like(t)
        m = torch.stack([t, -pad_couple.expand_as(t), one, one - 1], -1).unflatten(-1, (2, 2))
        m = torch.stack([m, m.flip(-3).mT]).flatten(0, 2)  # (2 * 2 * n, K, 2, 2)
        size = m.shape[1]
        reach = 1
        while reach < size:  # m[i] = m[i] m[i - reach]: the rows i - 2 reach + 1 .. i
            product = (m[:, reach:, :, :, None] * m[:, :-reach, None, :, :]).sum(-2)
            m = torch.cat([m[:, :reach], product], 1)
            reach *= 2
        first = m[..., 0, 0].unflatten(0, (2, *x.shape))
        ones = torch.ones_like(first[0, ..., :1])
        lead = torch.cat([ones, first[0, ..., size - k :]], -1)
        trail = torch.cat([first[1, ..., :k].flip(-1), ones], -1)
        return lead, trail
    t = torch.addcmul(-shift.T[:, None], slope.T[:, None], x)  # (k, 2, n)
    couple = torch.nn.functional.pad(couple, (0, 1)).T.contiguous()  # (k + 1, n)
    lead = x.new_empty((k + 1, *x.shape))
    trail = torch.empty_like(lead)
    lead[0] = 1.0
    trail[k] = 1.0
    before = torch.zeros_like(x)
    for j in range(k):  # chi_(1..j+1) = t_j chi_(1..j) - couple_j chi_(1..j-1)
        torch.addcmul(t[j] * lead[j], couple[j], before, value=-1.0, out=lead[j + 1])
        before = lead[j]
    before = torch.zeros_like(x)
    for j in range(k - 1, -1, -1):  # chi_(j+1..k) = t_j chi_(j+2..k) - couple_(j+1) chi_(j+3..k)
        torch.addcmul(t[j] * trail[j + 1], couple[j + 1], before, value=-1.0, out=trail[j])
        before = trail[j + 1]
    return lead.movedim(0, -1), trail.movedim(0, -1)


def blank_reduction(batch: int, heads: int, width: int, device: Any) -> dict[str, torch.Tensor]:
    """The reduced statistics of ``batch`` prompts before any is filled in:
    ``PER_HEAD`` ``(batch, heads)`` NaN, ``stationary`` ``(batch, heads, width)``
    zeros (a padded token has no mass), ``stationary_nosink`` NaN; float64."""
    out = {
        name: torch.full((batch, heads), float("nan"), dtype=torch.float64, device=device)
        for name in PER_HEAD
    }
    out["stationary"] = torch.zeros((batch, heads, width), dtype=torch.float64, device=device)
    out["stationary_nosink"] = torch.full(
        (batch, heads, width), float("nan"), dtype=torch.float64, device=device
    )
    return out


def _reduce_padded(
    a: torch.Tensor, lengths: torch.Tensor, causal: bool, *, normalised: bool = False
) -> dict[str, torch.Tensor]:
    """The statistics of :func:`summarize_attention` for ``a`` ``(rows, heads, m, m)``
    (float32 or float64, :func:`reduce_dtype`; worked in that precision, returned in
    float64), row ``r``'s matrix in its top-left ``lengths[r]`` corner. ``a`` is
    overwritten (the callers hand over their own copy). ``normalised``: ``a`` is
    already nonnegative, zero outside each corner, its rows summing to 1 (a float32
    softmax's own, as the read-out from queries and keys makes them): the clamp, the
    mask and the renormalisation are skipped (three passes over ``a``, 0.13 s a trace
    of two 512-token SmolLM2 prompts)."""
    m = a.shape[-1]
    i = torch.arange(m, device=a.device)
    valid = (i[None, :] < lengths[:, None])[:, None, :].to(a.dtype)  # (rows, 1, m)
    # in place (the read-out's own passes over (rows, heads, m, m) cost as much as the
    # forward pass on long prompts); the masks are 0 or 1, so the products are those of
    # multiplying by each mask in turn, bit for bit. The compiled Lanczos reads both
    # chains from a itself; else both chains share one work array, [0] the attention
    # and [1] without the sink, and one batched solve (half the Lanczos steps).
    on_cpu = a.device.type == "cpu" and a.dtype == torch.float32
    host = _on_host(a)  # a GPU's chains solved by the compiled Lanczos on the host
    kernel = _compiled() if (on_cpu or host) and m >= COMPILED_FROM else None
    pair = None
    if kernel is None:
        pair = torch.empty((2, *a.shape), dtype=a.dtype, device=a.device)
        a = torch.clamp(a, min=0.0, out=pair[0]) if not normalised else pair[0].copy_(a)
    elif not normalised:
        a = a.clamp_(min=0.0)
    if not normalised:
        if a.device.type != "cpu" or int(lengths.min()) < m:  # padding (a GPU: no host wait)
            a.mul_(valid[..., :, None] * valid[..., None, :])
        sums = a.sum(-1, keepdim=True)
        a.div_(torch.where(sums > 0, sums, torch.ones_like(sums)))
    nan = torch.full((), float("nan"), dtype=a.dtype, device=a.device)  # no host wait
    several = (lengths > 1)[:, None]  # (rows, 1)
    queries = valid * (i >= 1).to(a.dtype)  # (rows, 1, m): i >= 1
    count = (lengths - 1).clamp(min=1).to(a.dtype)[:, None]  # (rows, 1)
    entropy_rows = _row_entropy(a)  # (rows, heads, m); 0 log 0 = 0
    if causal:
        keys = (i + 1).to(a.dtype)[None, None, :].expand_as(queries)
    else:
        keys = lengths.to(a.dtype)[:, None, None].expand_as(queries)
    scale = torch.where(queries > 0, torch.log(keys), torch.ones_like(keys))
    entropy = (entropy_rows / scale * queries).sum(-1) / count
    sink = (a[..., :, 0] * queries).sum(-1) / count
    # causal: triangular, so the eigenvalues are the diagonal (else float64: a general
    # eigenproblem, whose rounding float32 would magnify)
    moduli = (a.diagonal(dim1=-2, dim2=-1) if causal else torch.linalg.eigvals(a.double())).abs()
    raw = moduli.topk(min(2, m), dim=-1).values[..., -1]
    # without the sink: token 0 dropped, rows renormalised, an empty row a self-loop
    rest = valid * (i >= 1).to(a.dtype)
    if pair is None and host:  # one copy to the host and the results back
        solved = _compiled_pair(kernel, a.cpu(), valid.cpu())
        (lam, pi), (lam_ns, pi_ns) = ((x.to(a.device), y.to(a.device)) for x, y in solved)
    elif pair is None:
        (lam, pi), (lam_ns, pi_ns) = _compiled_pair(kernel, a, valid)
    else:
        _sink_free(a, rest, out=pair[1])
        (lam, lam_ns), (pi, pi_ns) = _chain_spectrum(pair, torch.stack([valid, rest]))
    del pair, a
    pi_ns = torch.where(rest > 0, pi_ns, nan)
    out = {
        "entropy": torch.where(several, entropy, nan),
        "sink_mass": torch.where(several, sink, nan),
        "lambda2": torch.where(several, lam, float("nan")),
        "lambda2_nosink": torch.where((lengths > 2)[:, None], lam_ns, float("nan")),
        "raw_lambda2": torch.where(several, raw, float("nan")),
        "stationary": pi,
        "stationary_nosink": torch.where(several[..., None], pi_ns, nan),
    }
    return {name: value.double() for name, value in out.items()}


def _on_host(a: torch.Tensor) -> bool:
    """Whether :func:`_reduce_padded` solves the chains of ``a`` (a GPU's float32
    weights) on the host by the compiled Lanczos (:data:`HOST_CHAINS_UNTIL_CUDA`)."""
    m = a.shape[-1]
    return (
        a.device.type == "cuda"
        and a.dtype == torch.float32
        and COMPILED_FROM <= m < HOST_CHAINS_UNTIL_CUDA
    )


def _weights_of(output: Any) -> torch.Tensor | None:
    if (
        isinstance(output, (tuple, list))
        and len(output) > 1
        and isinstance(output[1], torch.Tensor)
    ):
        return output[1]
    return None


@contextlib.contextmanager
def capture_attention(sites: ModelSites, *, causal: bool) -> Iterator[AttentionCapture]:
    """Hook every block's attention (site ``attn.{i}``, a read-out); reduce its
    weights as they are produced."""
    capture = AttentionCapture(causal=causal)

    def on_attention(block: int):
        def read(output: Any) -> None:
            if capture.paused:
                return
            weights = _weights_of(output)
            if weights is None:
                raise UserError(
                    "the attention module returned no weights (SDPA or flash attention)",
                    "trace with attention=True, which switches the model to eager attention",
                )
            capture.reduce(block, weights)

        return read

    attention_modules(sites)  # a family without an entry fails here, in one line
    pairs = [(f"attn.{block}", on_attention(block)) for block in range(sites.n_blocks)]
    with hooks(sites, pairs, order=Order.READ):
        yield capture


def attention_matrices(model: Any, prompt: str | Sequence[int]) -> np.ndarray:
    """The full attention matrices of one prompt: ``(blocks, heads, n, n)`` float32.

    This keeps ``O(blocks * heads * n^2)`` numbers; use it for one prompt you
    want to look at, not for tracing a prompt set.

    Args:
        model: a :class:`tokenfield.models.load.LoadedModel`.
        prompt: text (tokenized like :func:`tokenfield.trace` does) or token ids.

    Returns:
        ``(blocks, heads, n, n)`` float32, rows summing to 1.

    Example:
        >>> model = tf.load_model("smollm2")                                 # doctest: +SKIP
        >>> tf.attention_matrices(model, "The capital of France is").shape[:2]  # doctest: +SKIP
        (30, 9)
    """
    ids = model.tokenizer(prompt)["input_ids"] if isinstance(prompt, str) else list(prompt)
    if not ids:
        raise UserError("the prompt encodes to no tokens", "give it some text")
    found: list[np.ndarray | None] = [None] * model.n_layers

    def on_attention(block: int):
        def read(output: Any) -> None:
            weights = _weights_of(output)
            if weights is None:
                raise UserError("the attention module returned no weights")
            found[block] = weights[0].detach().to("cpu").float().numpy().copy()

        return read

    attention_modules(model.sites)
    pairs = [(f"attn.{block}", on_attention(block)) for block in range(model.n_layers)]
    with eager_attention(model.model), torch.inference_mode(), hooks(model, pairs):
        inputs = torch.tensor([ids], device=model.device)
        extra = {"use_cache": False} if model.causal else {}
        model.model(input_ids=inputs, attention_mask=torch.ones_like(inputs), **extra)
    return np.stack(found)  # type: ignore[arg-type]


def head_inputs(model: Any, block: int, states: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A block's own attention for one prompt, positions ignored.

    With ``h = norm(x)`` the block's input norm, per head ``h``:

        G^h_ij = s <q^h_i, k^h_j>,   z^h_j = O_h v^h_j,

    ``q, k, v`` from the block's projections (and its ``q_norm``/``k_norm`` when it
    has them), ``s`` its logit scale, ``O_h`` the head's slice of the output
    projection. Rotary position codes, sliding windows and output biases are
    left out, so ``sum_j softmax_j(G^h_ij) z^h_j`` summed over heads is the
    block's attention output for tokens that all sit at position 0. A block
    with a norm on the attention output (Gemma's sandwich norm) contributes its
    diagonal gain ``g = norm(1)`` to ``O_h`` (``z^h_j -> g * O_h v^h_j``); its
    per-token ``1 / rms`` factor, which depends on the attention weights, is
    left out.

    Args:
        model: a :class:`~tokenfield.models.load.LoadedModel` of the llama family
            (Llama, Qwen, Gemma, Mistral, ...).
        block: block index.
        states: ``(n, d)`` the raw residual states entering the block.

    Returns:
        ``(logits (H, n, n), values (H, n, d))`` in float64.
    """
    if model.family.name != "llama":
        raise UserError(
            f"the layer's own attention is read for llama-family models, not '{model.family.name}'",
            "use the identity field (the default)",
        )
    layer = model.sites.blocks[block]
    attn, norm = layer.self_attn, layer.input_layernorm
    param = next(attn.parameters())
    x = torch.as_tensor(np.asarray(states), dtype=param.dtype, device=param.device)
    n, head_dim = x.shape[0], int(attn.head_dim)
    with torch.inference_mode():
        h = norm(x)  # (n, d)
        q = attn.q_proj(h).view(n, -1, head_dim)  # (n, H, d_h)
        k = attn.k_proj(h).view(n, -1, head_dim)  # (n, H_kv, d_h)
        v = attn.v_proj(h).view(n, -1, head_dim)
        if getattr(attn, "q_norm", None) is not None:
            q, k = attn.q_norm(q), attn.k_norm(k)
        groups = q.shape[1] // k.shape[1]  # grouped-query attention: kv head per group
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        logits = torch.einsum("ihe,jhe->hij", q, k) * float(attn.scaling)  # (H, n, n)
        out = attn.o_proj.weight.view(-1, q.shape[1], head_dim)  # (d, H, d_h)
        values = torch.einsum("jhe,dhe->hjd", v, out)  # (H, n, d)
        if hasattr(layer, "pre_feedforward_layernorm"):  # sandwich: post-attention norm
            gain = layer.post_attention_layernorm(torch.ones_like(x[:1]))[0]  # (d,)
            values = values * gain
    return logits.double().cpu().numpy(), values.double().cpu().numpy()

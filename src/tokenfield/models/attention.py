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
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from tokenfield.errors import UserError
from tokenfield.models.hooks import Order, hooks
from tokenfield.models.markov import PER_HEAD, PER_TOKEN, AttentionSummary, summarize_attention
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
    # short prompts' weights not yet reduced (:meth:`defer`): (block, rows, weights, lengths)
    deferred: list[tuple[int, list[int], torch.Tensor, torch.Tensor]] = field(default_factory=list)

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
    ) -> None:
        """Keep one block's statistics with the short prompts' weights still to
        reduce (``work``: ``(rows, weights, lengths)`` as :func:`_reduce_padded`
        takes them); they are reduced together with other blocks' (:meth:`settle`),
        once more than :data:`DEFER_ELEMENTS` wait or when the statistics are read.

        On a GPU the reduction of short prompts is bound by kernel launches and the
        host's waits (the small eigensolves), not by arithmetic: one reduction for
        all the blocks of a batch costs about what one block's did."""
        self.store(block, reduced, heads)
        for rows, weights, lengths in work:
            if self._deferred_elements() + weights.numel() > DEFER_ELEMENTS:
                self.settle()
            self.deferred.append((block, rows, weights, lengths))

    def _deferred_elements(self) -> int:
        return sum(weights.numel() for _block, _rows, weights, _lengths in self.deferred)

    def settle(self) -> None:
        """Reduce the deferred weights (:meth:`defer`), those of the same width
        at once, and put their statistics into their blocks."""
        groups: dict[tuple[int, ...], list[tuple[int, list[int], torch.Tensor, torch.Tensor]]] = {}
        for item in self.deferred:
            groups.setdefault(tuple(item[2].shape[1:]), []).append(item)
        self.deferred = []
        for items in groups.values():
            places = [(block, rows) for block, rows, _weights, _lengths in items]
            lengths = torch.cat([lengths for _block, _rows, _weights, lengths in items])
            parts = [weights for _block, _rows, weights, _lengths in items]
            items.clear()
            weights = torch.cat(parts) if len(parts) > 1 else parts[0]
            parts.clear()  # the concatenation is the only copy kept
            reduced = _reduce_padded(weights, lengths, self.causal)
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
            for name in PER_TOKEN:
                values = reduced[name].cpu().numpy()  # (batch, heads, width)
                out[VARIABLES[name]][:, block] = values[at, :, local]
            for name in PER_HEAD:
                values = reduced[name].cpu().numpy()  # (batch, heads)
                out[VARIABLES[name]][flags, block] = values[at[flags]]
        dims = ("particle", "block", "head")
        return {name: (dims, values) for name, values in out.items()}


# Elements of one float64 (rows, heads, n, n) work array; more rows are split.
_CHUNK_ELEMENTS = 1 << 23
# Elements of float64 weights a capture defers at most (AttentionCapture.defer): 512 MiB,
# and as much again while they are reduced.
DEFER_ELEMENTS = 1 << 26


def reduce_attention_batch(
    weights: torch.Tensor, spans: Sequence[tuple[int, int]], causal: bool
) -> dict[str, torch.Tensor]:
    """:func:`~tokenfield.models.markov.summarize_attention` of every prompt of a
    padded batch at once, on the weights' device: float64, batched over prompts
    and heads (``|lambda_2|`` by :func:`_chain_spectrum`: batched dense
    ``eigvalsh``, or batched Lanczos from :data:`LANCZOS_FROM` tokens), no Python
    loop over either.

    Args:
        weights: ``(batch, heads, seq, seq)`` one block's attention of a padded batch.
        spans: per batch row ``(offset, n)``: its real tokens are the columns
            ``offset .. offset + n - 1``.
        causal: as in :func:`summarize_attention`.

    Returns:
        Statistic -> ``(batch, heads)`` for each of ``PER_HEAD``, ``(batch, heads,
        width)`` for each of ``PER_TOKEN`` (token ``i`` of a row at index ``i``,
        ``width`` its longest span), float64. A row of more than
        :data:`~tokenfield.models.markov.DENSE_LIMIT` tokens, where the
        reference solves by Lanczos, is reduced alone with :func:`summarize_attention`.
    """
    from tokenfield.models.markov import DENSE_LIMIT

    on = weights.device if weights.device.type in ("cpu", "cuda") else torch.device("cpu")
    batch, heads = int(weights.shape[0]), int(weights.shape[1])
    width = max(n for _offset, n in spans)
    long = {
        row: summarize_attention(
            weights[row, :, offset : offset + n, offset : offset + n].to("cpu").float().numpy(),
            causal=causal,
        )
        for row, (offset, n) in enumerate(spans)
        if n > DENSE_LIMIT  # long: one prompt at a time, as the reference (Lanczos)
    }
    out = blank_reduction(batch, heads, width, on)
    for row, summary in long.items():
        n = spans[row][1]
        for name in PER_HEAD:
            out[name][row] = torch.tensor(getattr(summary, name), device=on)
        for name in PER_TOKEN:
            out[name][row, :, :n] = torch.tensor(getattr(summary, name), device=on)
    short = [row for row, (_offset, n) in enumerate(spans) if n <= DENSE_LIMIT]
    if not short:
        return out
    m = max(spans[row][1] for row in short)
    step = max(1, _CHUNK_ELEMENTS // (heads * m * m))
    for begin in range(0, len(short), step):
        chosen = short[begin : begin + step]
        index = torch.tensor(chosen, device=weights.device)
        offsets = torch.tensor([spans[r][0] for r in chosen], device=weights.device)
        lengths = torch.tensor([spans[r][1] for r in chosen], device=on)
        # token i of each row at index i: (rows, m) source columns (clamped past the end)
        cols = (offsets[:, None] + torch.arange(m, device=weights.device)).clamp(
            max=weights.shape[-1] - 1
        )
        cut = weights[
            index[:, None, None, None],
            torch.arange(heads, device=weights.device)[None, :, None, None],
            cols[:, None, :, None],
            cols[:, None, None, :],
        ]  # (rows, heads, m, m): the one copy
        fill_rows(out, _reduce_padded(cut.to(on, torch.float64), lengths, causal), chosen)
    return out


def fill_rows(
    out: dict[str, torch.Tensor], reduced: dict[str, torch.Tensor], rows: list[int]
) -> None:
    """Put the statistics of ``reduced`` (prompts in the order of ``rows``, tokens
    padded to their longest) into the rows ``rows`` of :func:`blank_reduction`'s ``out``."""
    at = torch.tensor(rows, device=out["stationary"].device)
    for name, value in reduced.items():
        if name in PER_TOKEN:
            out[name][at, :, : value.shape[-1]] = value
        else:
            out[name][at] = value


def _chain_spectrum(a: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``|lambda_2|`` and ``pi`` of the symmetrised chains of ``a`` ``(..., m, m)``
    (zero outside ``valid`` ``(..., m)``), as :func:`symmetrized_spectrum`.

    ``S = D^-1/2 W D^-1/2`` has top eigenvalue 1 with eigenvector ``sqrt(pi)``, and
    ``|lambda_2| = max(|lambda_min|, |lambda_(n-1)|)``: the largest ``|eigenvalue|``
    of the deflated ``S - sqrt(pi) sqrt(pi)^T``. Below :data:`LANCZOS_FROM` tokens
    (:data:`LANCZOS_FROM_CUDA` on a GPU)
    every matrix is solved densely (batched ``torch.linalg.eigvalsh``); from it on by
    the batched Lanczos of :func:`_lanczos_lambda2` on the deflated matrix, which
    agrees with the dense solve to about ``1e-13`` (dense ``eigvalsh`` for the few
    matrices it does not certify within :data:`LANCZOS_STEPS` steps), at half to a
    third of its cost from 256 tokens on.

    Zero rows and columns (padding) add zero eigenvalues to ``S``, which leave
    ``max(|lambda_min|, |lambda_(n-1)|)`` unchanged.
    """
    w = a + a.transpose(-1, -2)
    degree = w.sum(-1)
    degree = torch.where(degree > 0, degree, torch.ones_like(degree))
    real = degree * valid
    pi = real / real.sum(-1, keepdim=True)
    root = degree.rsqrt()
    s = w.mul_(root[..., :, None]).mul_(root[..., None, :])  # w is not needed after
    m = s.shape[-1]
    if m < 2:
        return torch.full(s.shape[:-2], float("nan"), dtype=s.dtype, device=s.device), pi
    if m >= (LANCZOS_FROM_CUDA if s.device.type == "cuda" else LANCZOS_FROM):
        top = torch.nan_to_num(pi.sqrt())  # NaN where no token is valid: nothing to deflate
        shape = s.shape[:-2]
        lam = _lanczos_lambda2(
            s.reshape(-1, m, m),
            top.reshape(-1, m),
            valid.to(s.dtype).expand(*shape, m).reshape(-1, m),
        ).reshape(shape)
    else:
        values = torch.linalg.eigvalsh(s)  # ascending; the last is 1
        lam = torch.maximum(values[..., 0].abs(), values[..., -2].abs())
    return lam.clamp(max=1.0), pi


# |lambda_2| by Lanczos (_chain_spectrum) from this many tokens (the padded width m) on,
# dense eigvalsh below. CPU time per matrix on SmolLM2's chains (1 thread; dense /
# Lanczos, all of them in one call | 18 a call, two prompts' heads as in a trace):
# m = 128: 0.65 / 0.65 | 0.65 / 0.79 ms; 160: 0.96 / 0.77 (18 a call; 9 a call: even);
# 192: 1.6 / 1.0 | 1.4 / 1.1; 256: 3.5 / 1.5 | 3.2 / 1.7; 384: 9.9 / 3.4 | 9.4 / 3.3.
LANCZOS_FROM = 160
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
# Steps at most (and at most m - 1); the matrices not certified by then are solved
# densely: 0.4 % of those chains at 160 tokens, 1.8 % at 256, 3.1 % at 384.
LANCZOS_STEPS = 100
_FIRST_CHECK = 20  # the first Ritz check (5 % of the chains at 256 tokens are done by then)
_CHECK_GRID = 4  # later checks on multiples of this step
_SLOWEST = 0.15  # decades per step the residual is assumed to fall at least
_BREAKDOWN = 1e-12  # beta below this: the Krylov space is invariant (exhausted)
# float64 elements of S per lockstep group: 10 MB, which the matrix-vector products
# reread from the CPU's cache; on a GPU one group takes everything.
_GROUP_ELEMENTS = {"cpu": 5 << 18, "cuda": 1 << 27}


def _start_vector(m: int, device: torch.device) -> torch.Tensor:
    """The Lanczos start vector of length ``m``: fixed pseudo-random numbers (its own
    generator, seeded 0, blocks of 4096), the same prefix for every ``m``, whatever the
    global random state."""
    block = 4096
    parts = [
        torch.randn(block, generator=torch.Generator().manual_seed(k), dtype=torch.float64)
        for k in range(-(-m // block))
    ]
    return torch.cat(parts)[:m].to(device)


def _lanczos_lambda2(
    s: torch.Tensor,
    top: torch.Tensor,
    valid: torch.Tensor,
    *,
    tol: float | None = None,
    steps: int | None = None,
) -> torch.Tensor:
    """The largest ``|eigenvalue|`` of ``s - top top^T`` for each of ``s`` ``(count, m, m)``
    (symmetric float64, ``top`` ``(count, m)`` a unit eigenvector of it), by Lanczos.

    Groups of matrices (:data:`_GROUP_ELEMENTS`) run in lockstep, one batched
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
    ``beta_k |y_k|``; both below ``tol`` (default :data:`LANCZOS_TOL`), it is done
    with ``max(|theta_min|, |theta_max|)``. A breakdown (``beta`` below
    :data:`_BREAKDOWN`: the Krylov space is invariant, its Ritz values eigenvalues)
    is done too. A finished matrix's slot takes the last running one (a copy), and
    the group shrinks. What is not done after ``steps`` steps (default
    :data:`LANCZOS_STEPS`) is solved by dense ``eigvalsh``, those matrices alone.
    ``s`` is overwritten (its matrices move within it).
    """
    tol = LANCZOS_TOL if tol is None else tol
    steps = LANCZOS_STEPS if steps is None else steps
    count, m = s.shape[0], s.shape[-1]
    out = torch.empty(count, dtype=s.dtype, device=s.device)
    steps = max(1, min(steps, m - 1))
    size = max(1, _GROUP_ELEMENTS.get(s.device.type, _GROUP_ELEMENTS["cpu"]) // (m * m))
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
    g, m = s.shape[0], s.shape[-1]
    on = s.device
    q = start - top * (top * start).sum(-1, keepdim=True)
    q = q - top * (top * q).sum(-1, keepdim=True)
    norm = q.norm(dim=-1, keepdim=True)
    # nothing valid but top (rounding noise left): a zero vector, a breakdown at step 1
    norm = torch.where(norm > 1e-8 * start.norm(dim=-1, keepdim=True), norm, torch.inf)
    basis = torch.zeros((g, steps + 2, m), dtype=s.dtype, device=on)
    basis[:, 0] = top
    basis[:, 1] = q / norm
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
        w = torch.bmm(basis[:, k : k + 1], s)  # (live, 1, m): q_k^T S = (S q_k)^T
        # Gram-Schmidt twice: against q_(k-1) and q_k (the recurrence), then against
        # top and every q so far
        pair = basis[:, k - 1 : k + 1]  # top and q_1 at k = 1
        c = torch.bmm(w, pair.mT)
        w = torch.baddbmm(w, c, pair, alpha=-1)
        so_far = basis[:, : k + 1]
        w = torch.baddbmm(w, torch.bmm(w, so_far.mT), so_far, alpha=-1)
        b = torch.linalg.vector_norm(w, dim=-1, keepdim=True)
        torch.div(w, b, out=basis[:, k + 1 : k + 2])
        projections.append(c)
        norms.append(b)
        if k < next_check:
            continue
        projections, norms = [torch.cat(projections, 1)], [torch.cat(norms, 1)]
        alpha, beta = projections[0][..., 1], norms[0][..., 0]  # (live, k)
        check = np.flatnonzero(due <= k)
        at = torch.as_tensor(check, device=on)
        value, residual = _ritz_extremes(alpha[at], beta[at])
        done = residual < tol
        result[lane[check[done]]] = value[torch.from_numpy(done)]
        late = check[~done]
        if k == steps:  # not certified: dense eigvalsh on those alone
            if late.size:
                values = torch.linalg.eigvalsh(s[torch.as_tensor(late, device=on)]).cpu()
                result[lane[late]] = torch.maximum(values[:, 0].abs(), values[:, -2].abs())
            break
        # the next check of the others: when their residual reaches tol at the rate it
        # fell since their last check (_SLOWEST at least), 2 to 16 steps on
        now = np.log10(np.maximum(residual[~done], 1e-300))
        rate = (before[late, 1] - now) / (k - before[late, 0])
        rate = np.where(np.isfinite(rate), np.maximum(rate, _SLOWEST), _SLOWEST)
        wait = np.clip(np.ceil((now - np.log10(tol)) / rate), 2, 16).astype(int)
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


def _ritz_extremes(alpha: torch.Tensor, beta: torch.Tensor) -> tuple[torch.Tensor, np.ndarray]:
    """The largest ``|Ritz value|`` of each Lanczos tridiagonal ``T_k`` (diagonal
    ``alpha`` ``(n, k)``, off-diagonal ``beta[:, :-1]``, last coupling ``beta[:, -1]``)
    and the larger residual bound ``beta_k |y_k|`` of its two extreme Ritz pairs.

    On the CPU, one matrix at a time: LAPACK's ``dstemr`` (MRRR) for just the two
    extreme eigenpairs of the tridiagonal, several times cheaper than a dense
    ``eigh`` of ``T_k``. At the first ``beta`` below :data:`_BREAKDOWN` (or not
    finite) the Krylov space is invariant: ``T`` ends there, its Ritz values are
    eigenvalues, the residual bound is 0.
    """
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


def _reduce_padded(a: torch.Tensor, lengths: torch.Tensor, causal: bool) -> dict[str, torch.Tensor]:
    """The statistics of :func:`summarize_attention` for ``a`` ``(rows, heads, m, m)``
    float64, row ``r``'s matrix in its top-left ``lengths[r]`` corner."""
    m = a.shape[-1]
    i = torch.arange(m, device=a.device)
    valid = (i[None, :] < lengths[:, None])[:, None, :].to(a.dtype)  # (rows, 1, m)
    # in place on one copy (the read-out's own float64 passes over (rows, heads, m, m)
    # cost as much as the forward pass on long prompts); the masks are 0 or 1, so the
    # products are those of multiplying by each mask in turn, bit for bit
    a = a.clamp(min=0.0).mul_(valid[..., :, None] * valid[..., None, :])
    sums = a.sum(-1, keepdim=True)
    a.div_(torch.where(sums > 0, sums, torch.ones_like(sums)))
    nan = torch.tensor(float("nan"), dtype=a.dtype, device=a.device)
    several = (lengths > 1)[:, None]  # (rows, 1)
    queries = valid * (i >= 1).to(a.dtype)  # (rows, 1, m): i >= 1
    count = (lengths - 1).clamp(min=1).to(a.dtype)[:, None]  # (rows, 1)
    entropy_rows = -torch.special.xlogy(a, a).sum(-1)  # (rows, heads, m); 0 log 0 = 0
    if causal:
        keys = (i + 1).to(a.dtype)[None, None, :].expand_as(queries)
    else:
        keys = lengths.to(a.dtype)[:, None, None].expand_as(queries)
    scale = torch.where(queries > 0, torch.log(keys), torch.ones_like(keys))
    entropy = (entropy_rows / scale * queries).sum(-1) / count
    sink = (a[..., :, 0] * queries).sum(-1) / count
    lam, pi = _chain_spectrum(a, valid)
    # causal: triangular, so the eigenvalues are the diagonal
    moduli = (a.diagonal(dim1=-2, dim2=-1) if causal else torch.linalg.eigvals(a)).abs()
    raw = moduli.topk(min(2, m), dim=-1).values[..., -1]
    # without the sink: token 0 dropped, rows renormalised, an empty row a self-loop
    rest = valid * (i >= 1).to(a.dtype)
    b = a * (rest[..., :, None] * rest[..., None, :])
    sums = b.sum(-1)
    empty = (sums <= 0) & (rest > 0)
    b.diagonal(dim1=-2, dim2=-1).add_(empty.to(a.dtype))
    sums = b.sum(-1, keepdim=True)
    b.div_(torch.where(sums > 0, sums, torch.ones_like(sums)))
    lam_ns, pi_ns = _chain_spectrum(b, rest)
    pi_ns = torch.where(rest > 0, pi_ns, nan)
    return {
        "entropy": torch.where(several, entropy, nan),
        "sink_mass": torch.where(several, sink, nan),
        "lambda2": torch.where(several, lam, nan),
        "lambda2_nosink": torch.where((lengths > 2)[:, None], lam_ns, nan),
        "raw_lambda2": torch.where(several, raw, nan),
        "stationary": pi,
        "stationary_nosink": torch.where(several[..., None], pi_ns, nan),
    }


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

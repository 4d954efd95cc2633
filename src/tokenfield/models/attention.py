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

    def store(self, block: int, reduced: dict[str, torch.Tensor], heads: int) -> None:
        """Keep one block's reduced statistics (the queries-and-keys read-out,
        :mod:`tokenfield.models.attention_readout`)."""
        self.heads = heads
        self.reduced[block] = reduced

    def reduce(self, block: int, weights: torch.Tensor) -> None:
        """Reduce ``weights`` ``(batch, heads, seq, seq)`` of one block, all prompts at once."""
        self.heads = int(weights.shape[1])
        self.reduced[block] = reduce_attention_batch(weights.detach(), self.spans, self.causal)

    @property
    def summaries(self) -> list[list[AttentionSummary | None]]:
        """``summaries[block][row]``: one :class:`AttentionSummary` per prompt (numpy)."""
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


def reduce_attention_batch(
    weights: torch.Tensor, spans: Sequence[tuple[int, int]], causal: bool
) -> dict[str, torch.Tensor]:
    """:func:`~tokenfield.models.markov.summarize_attention` of every prompt of a
    padded batch at once, on the weights' device: float64, batched over prompts
    and heads (``torch.linalg.eigvalsh`` on a batch), no Python loop over either.

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

    Zero rows and columns (padding) add zero eigenvalues to ``D^-1/2 W D^-1/2``,
    which leave ``max(|lambda_min|, |lambda_(n-1)|)`` unchanged.
    """
    w = a + a.transpose(-1, -2)
    degree = w.sum(-1)
    degree = torch.where(degree > 0, degree, torch.ones_like(degree))
    real = degree * valid
    pi = real / real.sum(-1, keepdim=True)
    root = degree.rsqrt()
    s = w * root[..., :, None] * root[..., None, :]
    if s.shape[-1] < 2:
        return torch.full(s.shape[:-2], float("nan"), dtype=s.dtype, device=s.device), pi
    values = torch.linalg.eigvalsh(s)  # ascending; the last is 1
    lam = torch.maximum(values[..., 0].abs(), values[..., -2].abs()).clamp(max=1.0)
    return lam, pi


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
    a = a.clamp(min=0.0) * valid[..., :, None] * valid[..., None, :]
    sums = a.sum(-1, keepdim=True)
    a = a / torch.where(sums > 0, sums, torch.ones_like(sums))
    nan = torch.tensor(float("nan"), dtype=a.dtype, device=a.device)
    several = (lengths > 1)[:, None]  # (rows, 1)
    queries = valid * (i >= 1).to(a.dtype)  # (rows, 1, m): i >= 1
    count = (lengths - 1).clamp(min=1).to(a.dtype)[:, None]  # (rows, 1)
    logs = torch.log(torch.where(a > 0, a, torch.ones_like(a)))
    entropy_rows = -(a * logs).sum(-1)  # (rows, heads, m)
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
    b = a * rest[..., :, None] * rest[..., None, :]
    sums = b.sum(-1)
    empty = (sums <= 0) & (rest > 0)
    b = b + torch.diag_embed(empty.to(a.dtype))
    sums = b.sum(-1, keepdim=True)
    b = b / torch.where(sums > 0, sums, torch.ones_like(sums))
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

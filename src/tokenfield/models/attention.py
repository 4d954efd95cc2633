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
after. Hooks return ``None``: they never change what the model computes.

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
from torch import nn

from tokenfield.errors import UserError
from tokenfield.models.markov import PER_HEAD, PER_TOKEN, AttentionSummary, summarize_attention
from tokenfield.models.sites import ModelSites

__all__ = [
    "ATTENTION_PATHS",
    "AttentionCapture",
    "attention_matrices",
    "attention_modules",
    "capture_attention",
    "eager_attention",
    "head_inputs",
]

# Where a block's self-attention module lives, per family in models/sites.py.
ATTENTION_PATHS: dict[str, str] = {
    "llama": "self_attn",
    "gpt2": "attn",
    "gpt_neox": "attention",
    "bert": "attention.self",
}

# Variable names in a traced run (dims: particle, block, head).
VARIABLES = {name: f"attn_{name}" for name in (*PER_HEAD, *PER_TOKEN)}


def attention_modules(sites: ModelSites) -> tuple[nn.Module, ...]:
    """The self-attention module of every block (the registry above).

    Raises:
        UserError: the family has no entry, or a block lacks the module.
    """
    path = ATTENTION_PATHS.get(sites.family.name)
    if path is None:
        raise UserError(
            f"attention tracing does not know the '{sites.family.name}' family",
            "add it to ATTENTION_PATHS in tokenfield/models/attention.py",
        )
    modules = []
    for index, block in enumerate(sites.blocks):
        try:
            modules.append(block.get_submodule(path))
        except AttributeError:
            raise UserError(
                f"block {index} has no attention module at '{path}'",
                "fix ATTENTION_PATHS in tokenfield/models/attention.py for this model",
            ) from None
    return tuple(modules)


@contextlib.contextmanager
def eager_attention(model: nn.Module) -> Iterator[str]:
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
    After it, ``summaries[block][row]`` is the :class:`AttentionSummary` of batch
    row ``row`` in block ``block``.
    """

    causal: bool
    spans: list[tuple[int, int]] = field(default_factory=list)
    summaries: list[list[AttentionSummary | None]] = field(default_factory=list)
    heads: int = 0

    def reset(self, n_blocks: int, attention_mask: torch.Tensor) -> None:
        spans = []
        for row in attention_mask.bool():
            real = torch.nonzero(row).flatten()
            spans.append((int(real[0]), int(real.numel())))  # contiguous: (offset, n)
        self.spans = spans
        self.summaries = [[None] * len(spans) for _ in range(n_blocks)]

    def reduce(self, block: int, weights: torch.Tensor) -> None:
        """Reduce ``weights`` ``(batch, heads, seq, seq)`` of one block, prompt by prompt."""
        self.heads = int(weights.shape[1])
        for row, (offset, n) in enumerate(self.spans):
            cut = weights[row, :, offset : offset + n, offset : offset + n]  # (heads, n, n) view
            matrix = cut.detach().to("cpu").float().numpy()
            self.summaries[block][row] = summarize_attention(matrix, causal=self.causal)

    def variables(self, keep: torch.Tensor, last: torch.Tensor) -> dict[str, Any]:
        """Dataset variables for the kept particles of this batch.

        Per-head statistics sit on each prompt's last-token particle (NaN on the
        others); the stationary distributions are per token.

        Args:
            keep: ``(batch, seq)`` kept positions (row-major = particle order).
            last: ``(batch, seq)`` last real token of each row.
        """
        rows, cols = keep.nonzero(as_tuple=True)
        n_blocks = len(self.summaries)
        shape = (int(rows.numel()), n_blocks, self.heads)
        out = {name: np.full(shape, np.nan, dtype=np.float32) for name in VARIABLES.values()}
        for particle, (row, col) in enumerate(zip(rows.tolist(), cols.tolist(), strict=True)):
            offset, _ = self.spans[row]
            for block in range(n_blocks):
                summary = self.summaries[block][row]
                if summary is None:
                    raise RuntimeError(f"attention of block {block} was not captured")
                for name in PER_TOKEN:
                    out[VARIABLES[name]][particle, block] = getattr(summary, name)[:, col - offset]
                if bool(last[row, col]):
                    for name in PER_HEAD:
                        out[VARIABLES[name]][particle, block] = getattr(summary, name)
        dims = ("particle", "block", "head")
        return {name: (dims, values) for name, values in out.items()}


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
    """Hook every block's attention; reduce its weights as they are produced."""
    capture = AttentionCapture(causal=causal)
    handles = []

    def on_attention(block: int):
        def hook(_module, _args, output):
            weights = _weights_of(output)
            if weights is None:
                raise UserError(
                    "the attention module returned no weights (SDPA or flash attention)",
                    "trace with attention=True, which switches the model to eager attention",
                )
            capture.reduce(block, weights)

        return hook

    try:
        for block, module in enumerate(attention_modules(sites)):
            handles.append(module.register_forward_hook(on_attention(block)))
        yield capture
    finally:
        for handle in handles:
            handle.remove()


def attention_matrices(model: Any, prompt: str | Sequence[int]) -> np.ndarray:
    """The full attention matrices of one prompt: ``(blocks, heads, n, n)`` float32.

    This keeps ``O(blocks * heads * n^2)`` numbers; use it for one prompt you
    want to look at, not for tracing a prompt set.

    Args:
        model: a :class:`tokenfield.models.load.LoadedModel`.
        prompt: text (tokenized like :func:`tokenfield.trace` does) or token ids.
    """
    ids = model.tokenizer(prompt)["input_ids"] if isinstance(prompt, str) else list(prompt)
    if not ids:
        raise UserError("the prompt encodes to no tokens", "give it some text")
    found: list[np.ndarray | None] = [None] * model.n_layers

    def on_attention(block: int):
        def hook(_module, _args, output):
            weights = _weights_of(output)
            if weights is None:
                raise UserError("the attention module returned no weights")
            found[block] = weights[0].detach().to("cpu").float().numpy().copy()

        return hook

    handles = []
    with eager_attention(model.model), torch.inference_mode():
        try:
            for block, module in enumerate(attention_modules(model.sites)):
                handles.append(module.register_forward_hook(on_attention(block)))
            inputs = torch.tensor([ids], device=model.device)
            extra = {"use_cache": False} if model.causal else {}
            model.model(input_ids=inputs, attention_mask=torch.ones_like(inputs), **extra)
        finally:
            for handle in handles:
                handle.remove()
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

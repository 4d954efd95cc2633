"""One prompt's residual states, attention weights and head vertices, for the hypotheses.

:func:`prompt_internals` runs one prompt (no padding) under eager attention and
keeps, for every block ``l`` and head ``h``, the causal attention ``S^h`` the model
actually used (rotary codes, masks and all) and the head's vertices
``u^h_j = O_h v^h_j`` (:func:`tokenfield.models.attention.head_inputs`: the
block's input norm, ``v_proj``, the head's slice of ``o_proj``; a Gemma block's
post-attention norm contributes its gain only), and the residual states at every
time (``embed`` = the input of block 0, then every block's output).
:func:`embedding_rows` gives token embeddings as the model's first block sees
them (Gemma's ``sqrt(d)`` scale included), and :func:`tied_embeddings` whether
the unembedding is the same matrix.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from tokenfield.errors import UserError
from tokenfield.models.attention import _weights_of, eager_attention, head_inputs
from tokenfield.models.hooks import hooks

__all__ = ["PromptInternals", "embedding_rows", "prompt_internals", "tied_embeddings"]


@dataclass(frozen=True)
class PromptInternals:
    """Attributes:
    ids: ``(n,)`` token ids.
    states: ``(T, n, d)`` float64 residual states, ``T = blocks + 1``.
    attention: ``(blocks, H, n, n)`` float64 attention weights.
    vertices: ``(blocks, H, n, d)`` float64 ``u^h_j = O_h v^h_j`` (``None`` if not asked).
    """

    ids: np.ndarray
    states: np.ndarray
    attention: np.ndarray
    vertices: np.ndarray | None


def prompt_internals(
    model: Any, prompt: str | Sequence[int], *, vertices: bool = True
) -> PromptInternals:
    """Run one prompt and keep its states, attention and (optionally) head vertices.

    Args:
        model: a causal llama-family :class:`~tokenfield.models.load.LoadedModel`.
        prompt: text (tokenized as the tracer does) or token ids.
        vertices: also compute ``u_j = O_h v_j`` for every block and head.
    """
    if not model.causal:
        raise UserError(
            "the hypotheses need a causal model", "trace a decoder (smollm2, gemma3-270m)"
        )
    ids = model.tokenizer(prompt)["input_ids"] if isinstance(prompt, str) else list(prompt)
    if len(ids) < 2:
        raise UserError(f"the prompt {prompt!r} has fewer than 2 tokens", "give longer prompts")
    blocks = model.n_layers
    states: list[np.ndarray | None] = [None] * (blocks + 1)
    weights: list[np.ndarray | None] = [None] * blocks

    def keep(time: int):
        def read(hidden: torch.Tensor) -> None:
            states[time] = hidden[0].detach().to("cpu").double().numpy().copy()

        return read

    def on_attention(block: int):
        def read(output: Any) -> None:
            found = _weights_of(output)
            if found is None:
                raise UserError("the attention module returned no weights")
            weights[block] = found[0].detach().to("cpu").double().numpy().copy()

        return read

    pairs = [("embed", keep(0))] + [(f"block.{b}", keep(b + 1)) for b in range(blocks)]
    pairs += [(f"attn.{b}", on_attention(b)) for b in range(blocks)]
    with eager_attention(model.model), torch.inference_mode(), hooks(model, pairs):
        inputs = torch.tensor([ids], device=model.device)
        model.model(input_ids=inputs, attention_mask=torch.ones_like(inputs), use_cache=False)
    x = np.stack(states)  # type: ignore[arg-type]
    found = None
    if vertices:
        found = np.stack([head_inputs(model, b, x[b])[1] for b in range(blocks)])
    return PromptInternals(np.asarray(ids), x, np.stack(weights), found)  # type: ignore[arg-type]


def embedding_rows(model: Any, ids: Sequence[int] | np.ndarray) -> np.ndarray:
    """``(k, d)`` float64 input embeddings of ``ids`` as block 0 receives them."""
    module = model.sites.embed_tokens
    param = next(module.parameters())
    with torch.inference_mode():
        rows = module(torch.as_tensor(np.asarray(ids), dtype=torch.long, device=param.device))
    return rows.detach().to("cpu").double().numpy()


def tied_embeddings(model: Any) -> bool:
    """Whether the unembedding matrix is the input embedding matrix (same storage or values)."""
    hf = model.model
    output = hf.get_output_embeddings() if hasattr(hf, "get_output_embeddings") else None
    if output is None:
        return False
    a, b = hf.get_input_embeddings().weight, output.weight
    if a.data_ptr() == b.data_ptr():
        return True
    return bool(a.shape == b.shape and torch.equal(a, b))

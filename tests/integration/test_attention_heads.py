"""The layer's own heads for the effective-beta fit: at beta = 1 they are the model's attention."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tokenfield as tf
from tests.integration.tiny import PROMPTS, tiny_loaded
from tokenfield.analysis.effective_beta import _softmax_heads, effective_beta
from tokenfield.errors import UserError
from tokenfield.models.attention import eager_attention, head_inputs


@pytest.mark.parametrize("kind", ["llama", "qwen3", "gemma3"])
def test_heads_at_beta_one_reproduce_the_attention_module(kind):
    model = tiny_loaded(kind)
    ds = tf.trace(model, [PROMPTS[3]], positions="all")
    block = 1
    x = ds.states.values[block]  # (n, d) entering block 1
    logits, values = head_inputs(model, block, x)
    ours = np.einsum("hij,hjd->id", _softmax_heads(logits, 1.0, causal=True), values)
    layer = model.sites.blocks[block]
    n = x.shape[0]
    head_dim = layer.self_attn.head_dim
    position = (torch.ones(1, n, head_dim), torch.zeros(1, n, head_dim))  # RoPE at angle 0
    mask = torch.full((n, n), float("-inf")).triu(1)[None, None]
    with torch.no_grad(), eager_attention(model.model):
        hidden = layer.input_layernorm(torch.from_numpy(x)[None])
        theirs, _ = layer.self_attn(hidden, position_embeddings=position, attention_mask=mask)
    theirs = theirs[0]
    if hasattr(layer, "pre_feedforward_layernorm"):  # Gemma: normed output, same direction
        with torch.no_grad():
            theirs = layer.post_attention_layernorm(theirs)
        theirs = theirs / theirs.norm(dim=-1, keepdim=True)
        ours = ours / np.linalg.norm(ours, axis=-1, keepdims=True)
    np.testing.assert_allclose(ours, theirs.numpy(), atol=1e-5)


def test_head_fit_runs_on_a_trace_and_other_families_are_refused():
    model = tiny_loaded("llama")
    ds = tf.trace(model, PROMPTS, positions="all")
    fits = effective_beta(ds, causal=True, heads=lambda t, x: head_inputs(model, t, x))
    assert fits.field == "heads" and len(fits.fits) == model.n_layers
    assert all(0.0 <= fit.r2 <= 1.0 for fit in fits.fits)
    with pytest.raises(UserError):
        head_inputs(tiny_loaded("gpt2"), 0, np.ones((3, 32)))

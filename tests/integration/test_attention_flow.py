"""The attention-only flow of a (tiny) real model: llama and gemma3 families."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from tests.integration.tiny import PROMPTS, tiny_loaded
from tokenfield.analysis.flow import VARIANTS
from tokenfield.errors import UserError
from tokenfield.models.load import wrap_model
from tokenfield.models.surgery import mlps_removed
from tokenfield.pipelines.flow import attention_flow, flow_states
from tokenfield.pipelines.trace import trace

FAMILIES = ("llama", "gemma3")


def _states(ds):
    return ds["states"].transpose("time", "particle", "feature").values.astype(np.float64)


@pytest.mark.parametrize("kind", FAMILIES)
def test_flow_with_the_mlp_put_back_is_the_trace(kind):
    """keep_mlp=True swaps in a module that calls the original MLP (the swap path of
    the attention-only flow, exercised): it reproduces the model's own trace exactly,
    and every original MLP ran while the swapped module sat in its place; without
    the MLP it differs."""
    model = tiny_loaded(kind)
    real = _states(trace(model, PROMPTS, positions="all"))
    originals = [block.mlp for block in model.sites.blocks]
    swapped_calls = []

    def record(block, mlp):
        def hook(_module, _args):
            swapped_calls.append(block._modules["mlp"] is not mlp)

        return mlp.register_forward_pre_hook(hook)

    handles = [record(b, m) for b, m in zip(model.sites.blocks, originals, strict=True)]
    try:
        back = _states(flow_states(model, PROMPTS, "attention", keep_mlp=True))
    finally:
        for handle in handles:
            handle.remove()
    assert np.array_equal(back, real)
    # each block's MLP ran at least once, and always from inside the swapped module
    assert len(swapped_calls) >= len(originals) and all(swapped_calls)
    assert [block.mlp for block in model.sites.blocks] == originals  # swap undone
    alone = _states(flow_states(model, PROMPTS, "attention"))
    assert np.array_equal(alone[0], real[0])  # the same layer-0 cloud
    assert np.abs(alone[1:] - real[1:]).max() > 1e-3  # the MLP matters
    # the swap is undone: tracing again gives the real trajectories
    assert np.array_equal(_states(trace(model, PROMPTS, positions="all")), real)


@pytest.mark.parametrize("kind", FAMILIES)
def test_attention_only_equals_a_model_with_zero_mlp_weights(kind):
    """Removing the MLP by swapping the module equals removing it by zeroing its
    output projection in a copy of the weights (an independent construction):
    attention sub-layer + residual + the model's own norms."""
    model = tiny_loaded(kind)
    alone = _states(flow_states(model, PROMPTS, "attention"))
    hf = copy.deepcopy(model.model)
    for block in hf.model.layers:
        with torch.no_grad():
            block.mlp.down_proj.weight.zero_()
    zeroed = _states(trace(wrap_model(hf, model.tokenizer, "zeroed"), PROMPTS, positions="all"))
    assert np.abs(alone - zeroed).max() <= 1e-6 * np.abs(zeroed).max()


def test_mlps_removed_restores_the_modules_after_an_error():
    model = tiny_loaded("llama")
    before = [block.mlp for block in model.sites.blocks]
    with pytest.raises(RuntimeError), mlps_removed(model):
        raise RuntimeError("boom")
    assert [block.mlp for block in model.sites.blocks] == before


@pytest.mark.parametrize("kind", FAMILIES)
def test_attention_flow_measures(kind):
    """The four flows start from the same cloud; the full flow is at distance 0 from
    the trace; the identity flow's first step is N(y + h f(y; beta)) with the fit."""
    from tokenfield.analysis.effective_beta import attention_field, effective_beta

    model = tiny_loaded(kind)
    real = trace(model, PROMPTS, positions="all")
    flow = attention_flow(model, real=real, eps=0.1)
    assert flow.variants == VARIANTS
    full = VARIANTS.index("full")
    assert np.all(flow.distance[full] < 1e-6)  # arccos of a rounded 1
    assert np.all(flow.distance[:, 0] < 1e-6)  # every flow starts at the real cloud
    assert np.all(flow.distance[VARIANTS.index("attention"), 1:] > 0)
    assert np.all(flow.mean_cosine <= 1 + 1e-9) and np.all(flow.gram_rank >= 1)
    ident = _states(flow_states(model, PROMPTS, "identity", real=real))
    fit = effective_beta(real, causal=True).fits[0]
    groups = real["prompt_index"].values
    index = np.flatnonzero(groups == groups[0])
    y = _states(real)[0, index]
    y = y / np.linalg.norm(y, axis=1, keepdims=True)
    if np.isfinite(fit.beta) and fit.step > 0:
        y = y + fit.step * attention_field(y, fit.beta, causal=True)
        y = y / np.linalg.norm(y, axis=1, keepdims=True)
    assert np.abs(ident[1, index] - y).max() < 1e-5
    data = flow.to_dict()
    assert set(data["variants"]) == set(VARIANTS)


def test_flow_refuses_runs_without_all_positions_and_other_families():
    model = tiny_loaded("llama")
    last = trace(model, PROMPTS, positions="last")
    with pytest.raises(UserError):
        attention_flow(model, real=last)
    with pytest.raises(UserError):
        attention_flow(tiny_loaded("bert"), prompts=PROMPTS)

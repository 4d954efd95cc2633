"""The batched attention reduction equals the per-head reference (summarize_attention)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tokenfield.models import attention
from tokenfield.models.attention import reduce_attention_batch
from tokenfield.models.markov import DENSE_LIMIT, PER_HEAD, PER_TOKEN, summarize_attention

TOL = 1e-10  # both float64 from the same float32 weights: eigensolver rounding only
# the CPU's float32 work array (REDUCE_DTYPE) against the float64 reference: rounding
# (measured on SmolLM2's chains: at most 5.2e-7, on |lambda_2|)
TOL_FLOAT32 = 2e-6


def padded_batch(lengths, heads, causal, seed=0, left=True):
    """Random attention of prompts of ``lengths`` padded into one batch, plus spans."""
    rng = np.random.default_rng(seed)
    width = max(lengths)
    weights = np.zeros((len(lengths), heads, width, width), dtype=np.float32)
    spans = []
    for row, n in enumerate(lengths):
        logits = rng.normal(size=(heads, n, n)) * 3
        if causal:
            logits = np.where(np.tril(np.ones((n, n))) > 0, logits, -np.inf)
        a = np.exp(logits - logits.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        if n > 2:
            a[0, 2] = 0.0  # a head that puts everything on the sink
            a[0, 2, 0] = 1.0
        offset = width - n if left else 0
        weights[row, :, offset : offset + n, offset : offset + n] = a
        spans.append((offset, n))
    return torch.from_numpy(weights), spans


@pytest.mark.parametrize(("dtype", "tol"), [(torch.float64, TOL), (torch.float32, TOL_FLOAT32)])
@pytest.mark.parametrize("causal", [True, False])
def test_batched_reduction_equals_the_reference_per_prompt_and_head(
    monkeypatch, causal, dtype, tol
):
    monkeypatch.setitem(attention.REDUCE_DTYPE, "cpu", dtype)
    lengths = [1, 2, 3, 7, 12, 5]
    weights, spans = padded_batch(lengths, heads=4, causal=causal, left=causal)
    got = reduce_attention_batch(weights, spans, causal)
    assert_every_prompt_as_the_reference(got, weights, spans, causal, tol)


def assert_every_prompt_as_the_reference(got, weights, spans, causal, tol):
    """Every statistic of every prompt of ``got`` within ``tol`` of
    :func:`summarize_attention` of that prompt's block alone."""
    for row, (offset, n) in enumerate(spans):
        cut = weights[row, :, offset : offset + n, offset : offset + n].numpy()
        expected = summarize_attention(cut, causal=causal)
        for name in PER_HEAD:
            np.testing.assert_allclose(
                got[name][row].numpy(), getattr(expected, name), atol=tol, err_msg=name
            )
        for name in PER_TOKEN:
            np.testing.assert_allclose(
                got[name][row, :, :n].numpy(), getattr(expected, name), atol=tol, err_msg=name
            )


def test_padding_junk_does_not_leak_into_the_statistics():
    weights, spans = padded_batch([3, 9], heads=2, causal=True)
    clean = reduce_attention_batch(weights, spans, True)
    dirty = weights.clone()
    dirty[0, :, :6, :] = 0.5  # the padded rows and columns of the short prompt
    dirty[0, :, :, :6] = 0.5
    noisy = reduce_attention_batch(dirty, spans, True)
    for name in (*PER_HEAD, *PER_TOKEN):
        np.testing.assert_allclose(noisy[name].numpy(), clean[name].numpy(), atol=TOL)


def test_a_prompt_past_the_batched_limit_is_reduced_alone_as_the_reference(monkeypatch):
    """The long prompt alone, a few heads at a time (float32 on the CPU), the short one
    in the batch; every statistic of both as the reference. The heads in two chunks."""
    monkeypatch.setattr(attention, "_CHUNK_ELEMENTS", 2 * (DENSE_LIMIT + 2) ** 2)
    monkeypatch.setattr(attention, "BATCHED_LIMIT_CPU", DENSE_LIMIT)
    n = DENSE_LIMIT + 2
    weights, spans = padded_batch([n, 4], heads=3, causal=True)
    got = reduce_attention_batch(weights, spans, True)
    assert_every_prompt_as_the_reference(got, weights, spans, True, TOL_FLOAT32)


def test_rows_that_give_the_sink_nearly_everything_keep_the_sink_free_chain_exact():
    """Rows with all but about 1e-10 of their mass on the sink: without the sink they are
    renormalised by about 1e10 (the compiled path must not take that mass as the row's
    sum minus its sink entry, which cancels in float32)."""
    rng = np.random.default_rng(3)
    n = 120
    logits = rng.normal(size=(3, n, n))
    logits[:, ::3, 0] += 26.0  # every third row: the sink holds 1 - 1e-10 of it
    logits = np.where(np.tril(np.ones((n, n))) > 0, logits, -np.inf)
    a = np.exp(logits - logits.max(-1, keepdims=True))
    weights = (a / a.sum(-1, keepdims=True)).astype(np.float32)[None]
    got = reduce_attention_batch(torch.from_numpy(weights), [(0, n)], True)
    expected = summarize_attention(weights[0], causal=True)
    for name in ("lambda2", "lambda2_nosink", "stationary_nosink"):
        np.testing.assert_allclose(
            got[name][0].numpy(), getattr(expected, name), atol=TOL_FLOAT32, err_msg=name
        )


def test_settle_reduces_each_device_apart(monkeypatch):
    """A model spread over several devices defers weights on each: the deferred arrays
    of one width are joined per device (one reduction each), never across devices."""
    from tokenfield.models.attention import AttentionCapture, blank_reduction

    seen = []

    def reduce(weights, lengths, causal, **_options):
        seen.append((weights.device.type, weights.shape[0]))
        out = blank_reduction(weights.shape[0], weights.shape[1], weights.shape[-1], weights.device)
        return {name: value.nan_to_num(0.0) for name, value in out.items()}

    monkeypatch.setattr(attention, "_reduce_padded", reduce)
    capture = AttentionCapture(causal=True)
    capture.spans = [(0, 4), (0, 4)]
    capture.reduced = [None] * 4
    for block, device in enumerate(("cpu", "meta", "cpu", "meta")):
        work = [([0, 1], torch.zeros((2, 3, 4, 4), device=device),
                 torch.tensor([4, 4], device=device))]  # fmt: skip
        capture.defer(block, blank_reduction(2, 3, 4, device), 3, work)
    capture.settle()
    assert sorted(seen) == [("cpu", 4), ("meta", 4)]
    assert not capture.deferred

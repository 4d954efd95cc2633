"""The read-out's attention weights, built a block of rows at a time (``_softmax_rows``),
equal eager attention's ``softmax(q k^T * scaling + mask)`` computed whole: causal
(the keys of a block cut at its last row), padded, left-padded with a sliding window
in the model's mask, an additive mask, bidirectional, soft-capped; blocks made small
here so every prompt takes several."""

from __future__ import annotations

import pytest
import torch

from tokenfield.models import attention_readout as readout

HEADS, DIM, SEQ = 3, 8, 40
TOL = 2e-7  # float32 softmax: the same terms, summed over a shorter or longer row


def reference(query, key, visible, span, m, scaling, softcap=None) -> torch.Tensor:
    """One row's ``(heads, m, m)`` weights, whole: its real tokens in the corner."""
    offset, n = span
    q, k = query[:, offset : offset + n], key[:, offset : offset + n]
    logits = q @ k.transpose(-1, -2) * scaling
    if softcap is not None:
        logits = torch.tanh(logits / softcap) * softcap
    if visible is not None:
        logits = logits.masked_fill(~visible, float("-inf"))
    out = torch.zeros((q.shape[0], m, m))
    out[:, :n, :n] = torch.softmax(logits, dim=-1)
    return out


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch):
    monkeypatch.setattr(readout, "LOWER_ROWS", 8)  # causal: blocks of 8 rows
    monkeypatch.setattr(readout, "ROW_ELEMENTS", 2 * HEADS * 13 * SEQ)  # else of 13


def qk(batch: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    shape = (batch, HEADS, SEQ, DIM)
    return torch.randn(shape, generator=generator) * 2, torch.randn(shape, generator=generator)


def window(seq: int, size: int) -> torch.Tensor:
    i = torch.arange(seq)
    return (i[None, :] <= i[:, None]) & (i[:, None] - i[None, :] < size)


CASES = {
    # name: spans, mask builder (None: SDPA's rule), causal kernel, softcap
    "causal": ([(0, SEQ), (0, SEQ)], None, True, None),
    "causal padded": ([(0, SEQ), (0, 29), (0, 3)], None, True, None),
    "left padded, sliding window": ([(0, SEQ), (11, 29)], "window", True, None),
    "additive mask": ([(0, SEQ), (5, 35)], "additive", True, None),
    "bidirectional": ([(0, SEQ), (0, 17)], None, False, None),
    "soft cap": ([(0, SEQ), (0, 33)], None, True, 5.0),
}


@pytest.mark.parametrize("case", list(CASES))
def test_short_weights_equal_whole_rows(case):
    spans, kind, causal_kernel, softcap = CASES[case]
    query, key = qk(len(spans), seed=len(case))
    mask = None
    if kind is not None:  # the model's (batch, 1, seq, seq) mask: window 6, padding on the left
        rows = []
        for offset, _n in spans:
            visible = window(SEQ, 6)
            visible[:, :offset] = False
            rows.append(visible)
        mask = torch.stack(rows)[:, None]
        if kind == "additive":
            mask = torch.zeros(mask.shape).masked_fill(~mask, torch.finfo(torch.float32).min)
    m = max(n for _offset, n in spans)
    rows = list(range(len(spans)))
    got = readout.short_weights(query, key, mask, spans, rows, m, causal_kernel, 0.3, softcap)
    assert got.shape == (len(spans), HEADS, m, m)
    for row, (offset, n) in enumerate(spans):
        if mask is not None:
            visible = readout._as_visible(mask[row, 0, offset : offset + n, offset : offset + n])
        elif causal_kernel:
            visible = torch.ones(n, n, dtype=torch.bool).tril()
        else:
            visible = None
        expected = reference(query[row], key[row], visible, (offset, n), m, 0.3, softcap)
        torch.testing.assert_close(got[row].float(), expected, rtol=0, atol=TOL)


@pytest.mark.parametrize("causal", [True, False])
def test_prompt_weights_equal_whole_rows(causal):
    """A long prompt's weights (reduced alone): SDPA's causal rule (``"causal"``) and a
    bidirectional one."""
    query, key = qk(1, seed=3)
    visible = readout._visible(None, 0, 0, SEQ, causal, query.device)
    assert visible == ("causal" if causal else None)
    got = readout.prompt_weights(query[0], key[0], visible, 0.3, None)
    rule = torch.ones(SEQ, SEQ, dtype=torch.bool).tril() if causal else None
    expected = reference(query[0], key[0], rule, (0, SEQ), SEQ, 0.3)
    torch.testing.assert_close(got, expected, rtol=0, atol=TOL)
    if causal:
        assert not got.triu(1).any()  # above the diagonal: zero, never computed


def test_block_rows(monkeypatch):
    """How many rows a block takes: on the CPU at most ROW_ELEMENTS logits and, causal,
    LOWER_ROWS rows; on a GPU the short prompts' rows at once (launch-bound) but a long
    prompt's in ROW_ELEMENTS blocks (its logits never all at once)."""
    monkeypatch.setattr(readout, "LOWER_ROWS", 64)
    monkeypatch.setattr(readout, "ROW_ELEMENTS", 1 << 20)
    row = 2 * 9 * 512  # two prompts, nine heads, 512 keys
    total = row * 512
    assert readout._block_rows(512, row, total, True, "cpu") == 64
    assert readout._block_rows(40, 2 * 9 * 40, 2 * 9 * 40 * 40, True, "cpu") == 16
    assert readout._block_rows(512, row, total, False, "cpu") == (1 << 20) // row
    assert readout._block_rows(512, row, total, True, "cuda") == 512
    long_row = 32 * 8192  # one prompt of 8192 tokens, 32 heads
    assert readout._block_rows(8192, long_row, long_row * 8192, True, "cuda") == 4

"""The batched Lanczos ``|lambda_2|`` of the symmetrised chains equals dense ``eigvalsh``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tokenfield.models import attention
from tokenfield.models.attention import (
    LANCZOS_FROM,
    _chain_spectrum,
    _lanczos_lambda2,
    reduce_attention_batch,
)
from tokenfield.models.markov import summarize_attention

TOL = 1e-9  # the promise of LANCZOS_TOL (measured: about 1e-13)


def causal_attention(n: int, rng: np.random.Generator, heads: int = 1) -> np.ndarray:
    """``(heads, n, n)`` random causal softmax attention, some of it on the sink."""
    logits = rng.normal(size=(heads, n, n)) * 3
    logits[..., 0] += rng.uniform(0, 4, size=(heads, 1))  # sink-heavy heads
    logits = np.where(np.tril(np.ones((n, n))) > 0, logits, -np.inf)
    a = np.exp(logits - logits.max(-1, keepdims=True))
    return a / a.sum(-1, keepdims=True)


def symmetrised(a: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """``S = D^-1/2 (a + a^T) D^-1/2`` of one ``(n, n)`` chain and its top eigenvector."""
    w = a + a.T
    degree = w.sum(1)
    s = w / np.sqrt(degree)[:, None] / np.sqrt(degree)[None, :]
    return torch.from_numpy(s), torch.from_numpy(np.sqrt(degree / degree.sum()))


def dense(a: np.ndarray) -> float:
    """``|lambda_2|`` of the symmetrised chain of ``a`` by dense ``eigvalsh``."""
    s, _top = symmetrised(a)
    values = np.linalg.eigvalsh(s.numpy())
    return min(1.0, max(abs(values[0]), abs(values[-2])))


def padded(chains: list[np.ndarray], width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rows, 1, width, width)`` float64 with each chain in its top-left corner, and the
    ``(rows, 1, width)`` valid mask."""
    a = torch.zeros((len(chains), 1, width, width), dtype=torch.float64)
    valid = torch.zeros((len(chains), 1, width), dtype=torch.float64)
    for row, chain in enumerate(chains):
        n = chain.shape[0]
        a[row, 0, :n, :n] = torch.from_numpy(chain)
        valid[row, 0, :n] = 1.0
    return a, valid


def test_lanczos_equals_dense_on_padded_causal_chains(monkeypatch):
    rng = np.random.default_rng(0)
    width = LANCZOS_FROM + 40
    lengths = (width, width - 7, LANCZOS_FROM, 60, 3, 2)
    chains = [causal_attention(n, rng)[0] for n in lengths]
    calls = []
    solve = attention._lanczos_lambda2
    monkeypatch.setattr(
        attention, "_lanczos_lambda2", lambda *a, **k: calls.append(1) or solve(*a, **k)
    )
    lam, _pi = _chain_spectrum(*padded(chains, width))
    assert calls  # the Lanczos path, not the dense one
    expected = [dense(chain) for chain in chains]
    np.testing.assert_allclose(lam[:, 0].numpy(), expected, rtol=0, atol=TOL)


def test_a_disconnected_chain_has_lambda2_one():
    rng = np.random.default_rng(1)
    n, cut = LANCZOS_FROM + 20, 70
    a = np.zeros((n, n))
    a[:cut, :cut] = causal_attention(cut, rng)[0]  # two blocks that never read each other
    a[cut:, cut:] = causal_attention(n - cut, rng)[0]
    s, top = symmetrised(a)
    got = _lanczos_lambda2(s[None].clone(), top[None], torch.ones((1, n), dtype=torch.float64))
    assert dense(a) == pytest.approx(1.0, abs=1e-12)
    assert float(got[0]) == pytest.approx(1.0, abs=TOL)


def test_the_most_negative_eigenvalue_wins_on_a_bipartite_like_chain():
    rng = np.random.default_rng(2)
    n = LANCZOS_FROM + 20
    i = np.arange(n)
    # every token reads the earlier tokens of the other parity, and a little of its own
    weight = np.where((i[:, None] + i[None, :]) % 2 == 1, 1.0, 0.02) * rng.uniform(size=(n, n))
    a = np.tril(weight)
    a /= a.sum(1, keepdims=True)
    s, top = symmetrised(a)
    values = np.linalg.eigvalsh(s.numpy())
    assert abs(values[0]) > abs(values[-2]) + 0.1  # the negative end wins by far
    got = _lanczos_lambda2(s[None].clone(), top[None], torch.ones((1, n), dtype=torch.float64))
    assert float(got[0]) == pytest.approx(abs(values[0]), abs=TOL)


def test_matrices_lanczos_does_not_certify_are_solved_densely(monkeypatch):
    rng = np.random.default_rng(3)
    n = LANCZOS_FROM + 10
    pairs = [symmetrised(a) for a in causal_attention(n, rng, heads=4)]
    s = torch.stack([p[0] for p in pairs])
    top = torch.stack([p[1] for p in pairs])
    solved = []
    eigvalsh = torch.linalg.eigvalsh
    monkeypatch.setattr(
        torch.linalg, "eigvalsh", lambda x: solved.append(x.shape[0]) or eigvalsh(x)
    )
    got = _lanczos_lambda2(s.clone(), top, torch.ones((4, n), dtype=torch.float64), steps=3)
    assert solved == [4]  # three steps certify nothing: all four fall back
    values = eigvalsh(s)
    expected = torch.maximum(values[:, 0].abs(), values[:, -2].abs())
    np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=0, atol=1e-12)


def test_the_numbers_do_not_depend_on_the_global_random_state():
    rng = np.random.default_rng(4)
    a, valid = padded(list(causal_attention(LANCZOS_FROM + 5, rng, heads=3)), LANCZOS_FROM + 5)
    torch.manual_seed(1)
    first, _ = _chain_spectrum(a, valid)
    torch.manual_seed(2)
    torch.randn(10)
    second, _ = _chain_spectrum(a, valid)
    assert torch.equal(first, second)


def test_the_batched_reduction_above_the_crossover_equals_the_reference():
    rng = np.random.default_rng(5)
    lengths = [LANCZOS_FROM + 30, LANCZOS_FROM + 1, 40]
    width = max(lengths)
    weights = np.zeros((len(lengths), 2, width, width), dtype=np.float32)
    spans = []
    for row, n in enumerate(lengths):
        weights[row, :, width - n :, width - n :] = causal_attention(n, rng, heads=2)
        spans.append((width - n, n))
    got = reduce_attention_batch(torch.from_numpy(weights), spans, causal=True)
    for row, (offset, n) in enumerate(spans):
        cut = weights[row, :, offset : offset + n, offset : offset + n]
        expected = summarize_attention(cut, causal=True)
        for name in ("lambda2", "lambda2_nosink"):
            np.testing.assert_allclose(
                got[name][row].numpy(), getattr(expected, name), rtol=0, atol=TOL, err_msg=name
            )


def test_the_ritz_check_bounds_both_ends_and_stops_at_a_breakdown():
    rng = np.random.default_rng(6)
    k = 30
    alpha = rng.normal(size=(3, k)) * 0.3
    beta = rng.uniform(0.05, 0.5, size=(3, k))
    alpha[1, 0] = -5.0  # row 1: a far lower end, its eigenvector's last entry tiny
    beta[2, 11] = 0.0  # row 2: a breakdown after step 12
    value, residual = attention._ritz_extremes(torch.from_numpy(alpha), torch.from_numpy(beta))
    for row in range(3):
        size = 12 if row == 2 else k
        t = np.diag(alpha[row, :size])
        t += np.diag(beta[row, : size - 1], 1) + np.diag(beta[row, : size - 1], -1)
        theta, y = np.linalg.eigh(t)
        assert float(value[row]) == pytest.approx(max(abs(theta[0]), abs(theta[-1])), abs=1e-12)
        bound = 0.0 if row == 2 else beta[row, -1] * max(abs(y[-1, 0]), abs(y[-1, -1]))
        assert residual[row] == pytest.approx(bound, rel=1e-6, abs=1e-300)


def test_a_chain_with_nothing_but_its_top_vector_has_lambda2_zero():
    n = LANCZOS_FROM
    s = torch.zeros((1, n, n), dtype=torch.float64)
    s[0, 5, 5] = 1.0  # one valid token with a self-loop: S = [1] on it, zero elsewhere
    top = torch.zeros((1, n), dtype=torch.float64)
    top[0, 5] = 1.0
    valid = top.clone()
    assert float(_lanczos_lambda2(s, top, valid)[0]) == 0.0

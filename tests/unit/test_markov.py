"""Attention as a Markov chain: hand-built chains with known answers."""

from __future__ import annotations

import numpy as np
import pytest

from tokenfield.analysis.markov import (
    eigenvalue_moduli,
    row_entropy,
    second_eigenvalue_modulus,
    spectral_gap,
    stationary_distribution,
    summarize_attention,
    symmetrized,
    symmetrized_spectrum,
    without_sink,
)
from tokenfield.errors import UserError
from tokenfield.models import markov

TOL = 1e-10


def lazy_path() -> np.ndarray:
    """The lazy walk on a path of 3 nodes: pi = (1/4, 1/2, 1/4), spectrum {1, 1/2, 0}."""
    return np.array([[0.5, 0.5, 0.0], [0.25, 0.5, 0.25], [0.0, 0.5, 0.5]])


def test_known_stationary_vector_and_spectrum():
    p = lazy_path()
    np.testing.assert_allclose(stationary_distribution(p), [0.25, 0.5, 0.25], atol=TOL)
    np.testing.assert_allclose(eigenvalue_moduli(p), [1.0, 0.5, 0.0], atol=TOL)
    assert second_eigenvalue_modulus(p) == pytest.approx(0.5, abs=TOL)
    assert spectral_gap(p) == pytest.approx(0.5, abs=TOL)


def test_circulant_chain_spectrum_is_its_fourier_transform():
    n, a = 5, 0.3
    p = (1 - a) * np.eye(n) + a * np.roll(np.eye(n), 1, axis=1)  # stay or step right
    k = np.arange(n)
    expected = np.sort(np.abs((1 - a) + a * np.exp(2j * np.pi * k / n)))[::-1]
    np.testing.assert_allclose(eigenvalue_moduli(p), expected, atol=TOL)
    np.testing.assert_allclose(stationary_distribution(p), np.full(n, 1 / n), atol=TOL)
    # not reversible: the symmetrised chain is the lazy walk on the cycle, moduli
    # |(1 - a) + a cos(2 pi k / n)|
    lam, pi = symmetrized_spectrum(p)
    sym = np.abs((1 - a) + a * np.cos(2 * np.pi * k / n))
    assert lam == pytest.approx(np.sort(sym)[::-1][1], abs=TOL)
    np.testing.assert_allclose(pi, np.full(n, 1 / n), atol=TOL)


def test_symmetrized_chain_is_reversible_with_closed_form_stationary():
    rng = np.random.default_rng(0)
    a = rng.random((7, 7))
    a /= a.sum(1, keepdims=True)
    p, pi = symmetrized(a)
    np.testing.assert_allclose(p.sum(1), 1.0, atol=TOL)
    np.testing.assert_allclose(pi @ p, pi, atol=TOL)  # stationary
    flow = pi[:, None] * p
    np.testing.assert_allclose(flow, flow.T, atol=TOL)  # detailed balance
    np.testing.assert_allclose(pi, (1 + a.sum(0)) / (2 * 7), atol=TOL)  # d_i = 1 + received
    lam, pi2 = symmetrized_spectrum(a)
    assert lam == pytest.approx(second_eigenvalue_modulus(p), abs=1e-9)
    np.testing.assert_allclose(pi2, pi, atol=TOL)


def test_symmetric_doubly_stochastic_matrix_is_its_own_symmetrisation():
    q = np.array([[0.6, 0.3, 0.1], [0.3, 0.4, 0.3], [0.1, 0.3, 0.6]])
    sym, pi = symmetrized(q)
    np.testing.assert_allclose(sym, q, atol=TOL)
    np.testing.assert_allclose(pi, np.full(3, 1 / 3), atol=TOL)


def test_lanczos_branch_matches_dense(monkeypatch):
    rng = np.random.default_rng(1)
    n = 60
    a = np.tril(rng.random((n, n)) ** 4)
    a /= a.sum(1, keepdims=True)
    dense, pi_dense = symmetrized_spectrum(a)
    monkeypatch.setattr(markov, "DENSE_LIMIT", 10)  # the reduction lives in models.markov
    sparse, pi_sparse = symmetrized_spectrum(a)
    assert sparse == pytest.approx(dense, abs=1e-7)
    np.testing.assert_allclose(pi_sparse, pi_dense, atol=TOL)


def sink_and_two_groups(sink: float = 0.8) -> np.ndarray:
    """A causal matrix: every query puts ``sink`` on token 0 and spreads the rest
    uniformly over the earlier tokens of its own group (1..4 or 5..8, itself included)."""
    n = 9
    a = np.zeros((n, n))
    a[0, 0] = 1.0
    for i in range(1, n):
        group = range(1, i + 1) if i <= 4 else range(5, i + 1)
        a[i, 0] = sink
        for j in group:
            a[i, j] = (1 - sink) / len(group)
    return a


def test_causal_raw_chain_is_absorbed_by_the_first_token():
    a = sink_and_two_groups()
    np.testing.assert_allclose(np.tril(a), a)
    # raw chain: token 0 is absorbing and the eigenvalues are the diagonal
    np.testing.assert_allclose(stationary_distribution(a), np.eye(9)[0], atol=1e-8)
    np.testing.assert_allclose(eigenvalue_moduli(a), np.sort(np.diag(a))[::-1], atol=1e-8)
    # dropping the sink's column alone keeps it triangular: token 1 is absorbing now
    b = without_sink(a)
    np.testing.assert_allclose(np.tril(b), b)
    np.testing.assert_allclose(stationary_distribution(b), np.eye(8)[0], atol=1e-8)


def test_sink_handling_changes_the_result_as_documented():
    a = sink_and_two_groups(sink=0.8)
    summary = summarize_attention(a, causal=True)
    assert summary.sink_mass[0] == pytest.approx(0.8)
    # sink kept (symmetrised): token 0 ranks first, and it links the two groups
    assert int(np.argmax(summary.stationary[0])) == 0
    assert summary.stationary[0, 0] == pytest.approx((1 + 1 + 8 * 0.8) / 18)
    assert summary.lambda2[0] < 0.9
    # sink dropped: the two groups never read each other, so lambda2 = 1 (gap 0)
    assert summary.lambda2_nosink[0] == pytest.approx(1.0, abs=1e-9)
    assert summary.gap_nosink[0] == pytest.approx(0.0, abs=1e-9)
    assert np.isnan(summary.stationary_nosink[0, 0])
    assert np.nansum(summary.stationary_nosink[0]) == pytest.approx(1.0)
    # raw reading: the second largest diagonal entry
    assert summary.raw_lambda2[0] == pytest.approx(np.sort(np.diag(a))[::-1][1])
    # a bridge between the groups (without the sink) closes the gap below 1
    bridged = a.copy()
    bridged[6, 2] = 0.05
    bridged[6] /= bridged[6].sum()
    assert summarize_attention(bridged, causal=True).lambda2_nosink[0] < 1 - 1e-3


def test_entropy_and_sink_mass_limits():
    n = 6
    uniform = np.tril(np.ones((n, n)))
    uniform /= uniform.sum(1, keepdims=True)
    identity = np.eye(n)
    on_sink = np.zeros((n, n))
    on_sink[:, 0] = 1.0
    s = summarize_attention(np.stack([uniform, identity, on_sink]), causal=True)
    np.testing.assert_allclose(s.entropy, [1.0, 0.0, 0.0], atol=TOL)
    np.testing.assert_allclose(s.sink_mass, [np.mean(1 / np.arange(2, n + 1)), 0.0, 1.0])
    np.testing.assert_allclose(row_entropy(uniform), np.log(np.arange(1, n + 1)), atol=TOL)
    # identity: every token is its own closed class
    assert s.lambda2[1] == pytest.approx(1.0)
    assert s.stationary.shape == (3, n) and s.stationary_nosink.shape == (3, n)
    np.testing.assert_allclose(s.stationary.sum(1), 1.0)


def test_non_causal_entropy_uses_all_keys():
    n = 4
    s = summarize_attention(np.full((n, n), 1 / n), causal=False)
    assert s.entropy[0] == pytest.approx(1.0)
    assert s.raw_lambda2[0] == pytest.approx(0.0, abs=1e-9)
    assert s.lambda2[0] == pytest.approx(0.0, abs=1e-9)


def test_single_token_gives_nan_spectra():
    s = summarize_attention(np.ones((2, 1, 1)), causal=True)
    assert np.isnan(s.lambda2).all() and np.isnan(s.sink_mass).all()
    np.testing.assert_allclose(s.stationary, 1.0)


def test_bad_input_is_a_user_error():
    with pytest.raises(UserError):
        stationary_distribution(np.array([[0.5, 0.2], [0.1, 0.9]]))
    with pytest.raises(UserError):
        summarize_attention(np.ones((2, 3, 4)), causal=True)

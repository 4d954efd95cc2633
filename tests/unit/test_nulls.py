"""Selection-aware permutation nulls: the maximum over the grid (Westfall-Young maxT)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.unit.synthetic_trajectories import trace_dataset
from tokenfield.analysis.nulls import best_of_grid, claim_status, max_null_pvalues
from tokenfield.analysis.separation import separation


def test_known_counts():
    observed = np.array([0.5, 2.0, 1.0])
    null = np.array(
        [
            [0.1, 0.2, 0.3],  # max 0.3
            [0.6, 0.1, 0.0],  # max 0.6
            [0.0, 2.5, 0.2],  # max 2.5
            [1.5, 0.1, 0.9],  # max 1.5
        ]
    )
    result = max_null_pvalues(observed, null)
    # pointwise: column-wise counts of null >= observed
    np.testing.assert_allclose(result.p, [(1 + 2) / 5, (1 + 1) / 5, (1 + 0) / 5])
    # corrected: counts of the row maxima (0.3, 0.6, 2.5, 1.5) >= observed
    np.testing.assert_allclose(result.p_corrected, [(1 + 3) / 5, (1 + 1) / 5, (1 + 2) / 5])
    assert np.all(result.p_corrected >= result.p)
    best = best_of_grid(observed, null)
    assert best == {"index": 1, "value": 2.0, "p": 0.4, "p_corrected": 0.4}


def test_nan_scores_are_skipped_in_counts_and_maxima():
    observed = np.array([np.nan, 1.0])
    null = np.array([[np.nan, 0.5], [3.0, np.nan], [np.nan, np.nan]])
    result = max_null_pvalues(observed, null)
    assert np.isnan(result.p[0]) and np.isnan(result.p_corrected[0])
    assert result.p[1] == pytest.approx(1 / 2)  # one finite null value, below 1.0
    assert result.p_corrected[1] == pytest.approx(2 / 4)  # maxima 0.5, 3.0, -inf
    assert max_null_pvalues([1.0], np.zeros((0, 1))).n_permutations == 0


def test_claim_status_words():
    assert claim_status(0.01) == "holds"
    assert claim_status(0.05) == "not supported"
    assert claim_status(None) == "not supported"
    assert claim_status(float("nan")) == "not supported"


def _noise_trajectories(rng, n_time=16, n_per=5, n_categories=4, n_feature=12):
    states = rng.normal(size=(n_time, n_per * n_categories, n_feature))
    labels = [f"c{k}" for k in range(n_categories) for _ in range(n_per)]
    return states, labels


def test_a_planted_effect_at_one_layer_is_found_with_a_small_corrected_p():
    rng = np.random.default_rng(1)
    states, labels = _noise_trajectories(rng)
    codes = np.unique(labels, return_inverse=True)[1]
    means = rng.normal(size=(4, states.shape[-1])) * 3.0
    states[9] += means[codes]  # the categories separate at layer 9 only
    sep = separation(trace_dataset(states, labels), n_permutations=199, seed=0)
    sil = sep["silhouette"].values
    assert int(np.nanargmax(sil)) == 9
    assert sep["silhouette_p_corrected"].values[9] <= 0.01
    assert sep["ratio_p_corrected"].values[9] <= 0.01
    # elsewhere nothing is claimed
    others = np.delete(sep["silhouette_p_corrected"].values, 9)
    assert np.all(others > 0.05)


def test_the_corrected_false_positive_rate_holds_on_200_null_datasets():
    """Labels independent of the states: the best layer's pointwise p falls under 0.05
    far more often than 5 %; the corrected p does so at most 8 % of the time."""
    rng = np.random.default_rng(2026)
    pointwise, corrected = [], []
    for i in range(200):
        states, labels = _noise_trajectories(rng)
        sep = separation(trace_dataset(states, labels), n_permutations=99, seed=i)
        best = int(np.nanargmax(sep["silhouette"].values))
        pointwise.append(sep["silhouette_p"].values[best] <= 0.05)
        corrected.append(sep["silhouette_p_corrected"].values[best] <= 0.05)
    rate, rate_corrected = np.mean(pointwise), np.mean(corrected)
    assert rate_corrected <= 0.08
    assert rate >= 0.3  # the uncorrected best-layer rate: about 1 - 0.95^16 for 16 layers
    assert rate > 3 * max(rate_corrected, 0.01)


def test_the_summary_and_the_report_state_the_claim_on_the_corrected_p():
    from tokenfield.analysis import analyze, summary_rows
    from tokenfield.report.html import _separation_table

    rng = np.random.default_rng(5)
    states, labels = _noise_trajectories(rng)
    null_metrics = analyze(trace_dataset(states, labels), n_permutations=99).to_metrics()
    codes = np.unique(labels, return_inverse=True)[1]
    planted = states.copy()
    planted[6] += 3.0 * rng.normal(size=(4, states.shape[-1]))[codes]
    effect_metrics = analyze(trace_dataset(planted, labels), n_permutations=99).to_metrics()
    for metrics, claim in ((null_metrics, "not supported"), (effect_metrics, "holds")):
        best = metrics["separation"]["best"]
        assert best["claim"] == claim
        assert best["silhouette_p_corrected"] >= best["silhouette_p"]
        assert set(best) >= {"silhouette_p_corrected", "ratio_p_corrected"}
        text = " ".join(f"{name} {value}" for name, value, _ in summary_rows(metrics))
        assert f"categories separate: {claim}" in text
        assert f"Categories separate: {claim}" in _separation_table(metrics)
    assert effect_metrics["separation"]["best"]["time"] == 6

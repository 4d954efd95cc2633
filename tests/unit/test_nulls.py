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
    from tokenfield.analysis import Metrics, analyze, summary_rows
    from tokenfield.report.tables import separation_table

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
        assert f"Categories separate: {claim}" in separation_table(Metrics.from_dict(metrics))
    assert effect_metrics["separation"]["best"]["time"] == 6


def test_p_corrected_is_never_below_p_when_the_null_has_nans():
    # a shuffle undefined at g but large elsewhere used to count in the corrected
    # denominator only: p = 2/2 but p_corrected = 2/4
    result = max_null_pvalues([1.0, 1.0], [[2.0, np.nan], [np.nan, 0.5], [np.nan, 0.2]])
    assert result.p[0] == pytest.approx(1.0)
    assert result.p_corrected[0] == pytest.approx(1.0)
    # no finite null value at a grid point: no p-value there
    result = max_null_pvalues([1.0, 1.0], [[np.nan, 0.5], [np.nan, 2.0]])
    assert np.isnan(result.p[0]) and np.isnan(result.p_corrected[0])
    assert claim_status(result.p_corrected[0]) == "not supported"
    rng = np.random.default_rng(0)
    for _ in range(300):
        null = rng.normal(size=(int(rng.integers(1, 12)), int(rng.integers(1, 6))))
        null[rng.random(null.shape) < 0.3] = np.nan
        observed = rng.normal(size=null.shape[1]) + 0.5
        result = max_null_pvalues(observed, null)
        both = np.isfinite(result.p) & np.isfinite(result.p_corrected)
        assert np.array_equal(both, np.isfinite(result.p))
        assert np.all(result.p_corrected[both] >= result.p[both])


def _prompt_tokens(rng, n_time=8, n_per=5, n_categories=4, tokens=6, n_feature=12):
    """Prompts of several tokens, each prompt's tokens near its own random offset
    (the same at every layer), and no category signal at all."""
    n_prompts = n_per * n_categories
    offset = 2.0 * rng.normal(size=(n_prompts, n_feature))
    prompt = np.repeat(np.arange(n_prompts), tokens)
    states = offset[prompt][None] + rng.normal(size=(n_time, prompt.size, n_feature))
    labels = [f"c{k}" for k in range(n_categories) for _ in range(n_per)]
    ds = trace_dataset(states, [labels[p] for p in prompt])
    return ds.assign_coords(prompt_index=("particle", prompt))


def test_tokens_of_one_prompt_are_shuffled_together_and_the_false_positive_rate_holds():
    """``--particles all``: tokens share their prompt's label and offset. Shuffling
    the prompt -> category map keeps the corrected "holds" rate at most 8 %;
    shuffling single tokens (``groups=None``, the old null) claims it nearly always."""
    rng = np.random.default_rng(7)
    corrected, tokenwise = [], []
    for i in range(40):
        ds = _prompt_tokens(rng)
        sep = separation(ds, n_permutations=99, seed=i)
        assert sep.attrs["shuffle_unit"] == "prompt" and sep.attrs["shuffled_units"] == 20
        best = int(np.nanargmax(sep["silhouette"].values))
        corrected.append(sep["silhouette_p_corrected"].values[best] < 0.05)
        old = separation(ds, n_permutations=99, seed=i, groups=None)
        assert old.attrs["shuffle_unit"] == "particle"
        tokenwise.append(old["silhouette_p_corrected"].values[best] < 0.05)
    assert np.mean(corrected) <= 0.08
    assert np.mean(tokenwise) >= 0.5


def test_a_prompt_level_shuffle_moves_whole_prompts():
    from tokenfield.analysis.separation import shuffle_units, shuffled_labellings

    ds = _prompt_tokens(np.random.default_rng(0), n_time=1, tokens=3)
    names = np.asarray(ds["category"].values).astype(str)
    unit, name = shuffle_units(ds, names)
    assert name == "prompt" and unit.max() == 19
    codes = np.unique(names, return_inverse=True)[1]
    shuffled = shuffled_labellings(codes, unit, 50, seed=0)
    for row in shuffled:  # each prompt's tokens keep one label; class sizes kept
        assert all(np.unique(row[unit == u]).size == 1 for u in range(20))
        np.testing.assert_array_equal(np.bincount(row), np.bincount(codes))
    assert len({tuple(r) for r in shuffled}) > 40
    # one particle per prompt: the same draws as shuffling the particles
    last = np.arange(20)
    rng = np.random.default_rng(3)
    expected = [rng.permutation(codes[::3])[last] for _ in range(5)]
    np.testing.assert_array_equal(shuffled_labellings(codes[::3], last, 5, seed=3), expected)


def test_tokens_of_one_prompt_with_different_labels_are_refused_when_grouped_explicitly():
    from tokenfield.analysis.separation import shuffle_units
    from tokenfield.errors import UserError

    ds = _prompt_tokens(np.random.default_rng(0), n_time=1, tokens=2)
    mixed = np.asarray(ds["category"].values).astype(str).copy()
    mixed[0] = "c3"  # prompt 0's first token relabelled
    with pytest.raises(UserError, match="different labels"):
        shuffle_units(ds, mixed, "prompt_index")
    # the default falls back to single particles (no prompt shares one label)
    assert shuffle_units(ds, mixed)[1] == "particle"


@pytest.mark.parametrize("tokens", [1, 4])
def test_identical_layers_give_a_corrected_p_equal_to_the_pointwise_p(tokens):
    """The same shuffle at every layer: on identical copies of one layer every shuffle's
    maximum over layers is its score at that layer, so ``p_corrected == p``. A fresh
    shuffle per layer would give a larger maximum and a larger ``p_corrected``."""
    rng = np.random.default_rng(3)
    one = _prompt_tokens(rng, n_time=1, tokens=tokens)
    codes = np.unique(one["category"].values, return_inverse=True)[1]
    shift = 0.25 * rng.normal(size=(4, 12))[codes]  # a weak category signal: p inside (0, 1)
    states = np.repeat(one["states"].values + shift, 6, axis=0)
    ds = trace_dataset(states, list(one["category"].values)).assign_coords(
        prompt_index=("particle", one["prompt_index"].values)
    )
    sep = separation(ds, n_permutations=199, seed=0)
    for score in ("silhouette", "ratio"):
        p, corrected = sep[f"{score}_p"].values, sep[f"{score}_p_corrected"].values
        np.testing.assert_array_equal(corrected, p)
        assert 1 / 200 < p[0] < 0.9  # some shuffles reach the score: a plant would show

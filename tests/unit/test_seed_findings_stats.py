"""The statistics of scripts/seed_findings.py's replication, on synthetic data (no model):
its fast helpers equal the reference computations, its confirmatory nulls are
calibrated, and "PC1 is depth" is called learned only beyond the random copy."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr
from scipy.stats import spearmanr
from sklearn.metrics import roc_auc_score

from tests._scripts import load_script
from tokenfield.analysis import centroid_distances


@pytest.fixture(scope="module")
def script():
    return load_script("seed_findings")


def spectrum_like(rng, n_per=10, n_time=3, d=12, shift=0.0) -> xr.Dataset:
    """Unit-ish random states for the spectrum groups the claims use; ``shift`` moves
    pseudocode with numerals toward the Pure Math mean at every time."""
    groups = ["Pure Math", "Pure Story", "Word Problems", "Pseudocode"]
    cats = np.repeat(groups, n_per)
    texts = np.array(
        [
            f"SET x TO {i}" if (c == "Pseudocode" and i % 2) else f"{c} prompt number {chr(97 + i)}"
            for c in groups
            for i in range(n_per)
        ]
    )
    states = rng.normal(size=(n_time, cats.size, d)) + 3.0  # a common direction, like a model
    math_mean = states[:, cats == "Pure Math"].mean(1, keepdims=True)
    numeral = np.array([any(ch.isdigit() for ch in t) for t in texts])
    states[:, numeral] += shift * (math_mean - states[:, numeral])
    return xr.Dataset(
        {"states": (("time", "particle", "feature"), states)},
        coords={
            "time": np.arange(n_time),
            "category": ("particle", cats),
            "prompt": ("particle", texts),
        },
    )


def test_pooled_spearman_equals_scipy_on_the_expanded_resample(script):
    rng = np.random.default_rng(1)
    pc1 = rng.normal(size=(7, 9)) + np.arange(7)[:, None] * 0.3  # (time, prompt)
    full = spearmanr(np.repeat(np.arange(7), 9), pc1.ravel()).statistic
    assert script.pooled_spearman(pc1)[0] == pytest.approx(full)
    idx = rng.integers(0, 9, size=(3, 9))
    for row, value in zip(idx, script.pooled_spearman(pc1, idx), strict=True):
        expanded = pc1[:, row]
        expected = spearmanr(np.repeat(np.arange(7), 9), expanded.ravel()).statistic
        assert value == pytest.approx(expected)


def test_auc_equals_scikit_learn_with_ties_and_batches(script):
    rng = np.random.default_rng(2)
    scores = rng.integers(0, 5, size=(4, 20)).astype(float)  # ties
    positive = np.arange(20) < 8
    for row, value in zip(scores, script.auc(scores, positive), strict=True):
        assert value == pytest.approx(roc_auc_score(positive, row))


def test_bootstrap_resamples_within_each_group(script):
    groups = np.array(list("aaabbbbcc"))
    idx = script.bootstrap_indices(groups, n_boot=50, seed=3)
    assert idx.shape == (50, 9)
    assert (groups[idx] == groups).all()  # every draw keeps each group's size and place
    assert len(np.unique(idx[:, 0])) > 1  # and does resample


def test_centroid_margin_equals_the_package_centroid_distances(script):
    rng = np.random.default_rng(4)
    ds = spectrum_like(rng)
    dist = centroid_distances(ds)
    expected = (
        dist.sel(category="Word Problems", other="Pure Math")
        - dist.sel(category="Word Problems", other="Pure Story")
    ).values
    for t in range(ds.sizes["time"]):
        got = script.confirm_word_problems(ds, t)["value"]
        assert got == pytest.approx(expected[t])


@pytest.mark.parametrize("name", ["confirm_word_problems", "confirm_numerals"])
def test_confirmatory_tests_are_calibrated_on_data_without_the_effect(script, name, monkeypatch):
    """On data with no effect the confirmatory 'holds' rate at 0.05 stays near 0.05."""
    monkeypatch.setattr(script, "PERMUTATIONS", 199)
    monkeypatch.setattr(script, "BOOTSTRAP", 20)
    rng = np.random.default_rng(5)
    test = getattr(script, name)
    p = [test(spectrum_like(rng, n_time=4), 0)["p"] for _ in range(150)]
    rate = np.mean(np.array(p) < 0.05)
    assert rate <= 0.1, rate


def test_confirm_numerals_finds_a_real_effect(script, monkeypatch):
    monkeypatch.setattr(script, "PERMUTATIONS", 199)
    r = script.confirm_numerals(spectrum_like(np.random.default_rng(6), shift=0.6), 0)
    assert r["value"] > 0 and r["p"] < 0.05 and r["ci"][0] > 0
    assert script.confirmatory_status(r) == "holds"


def test_pc1_is_learned_only_beyond_the_random_copy(script):
    base = {"model": 0.94, "random": 0.94, "p": 0.001}
    same = script.depth_verdict({**base, "difference_ci": [-0.01, 0.01]})
    assert same.startswith("**not supported**") and "random copy orders the layers" in same
    better = script.depth_verdict({**base, "model": 0.88, "random": 0.07,
                                   "difference_ci": [0.7, 0.9]})  # fmt: skip
    assert better.startswith("**holds, learned**")
    unordered = script.depth_verdict({**base, "p": 0.4, "difference_ci": [0.1, 0.3]})
    assert unordered.startswith("**not supported**")


def test_a_confirmatory_verdict_needs_p_below_alpha_and_names_the_opposite(script):
    assert script.confirmatory_status({"p": 0.01, "ci": [0.1, 0.3]}) == "holds"
    assert script.confirmatory_status({"p": 0.3, "ci": [-0.1, 0.3]}) == "not supported"
    assert script.confirmatory_status({"p": 0.99, "ci": [-0.3, -0.1]}) == "does not hold"


def test_an_effect_the_random_copy_also_shows_is_not_called_learned(script):
    trained = {"value": 0.73, "ci": [0.63, 0.83], "p": 0.002}
    overlapping = {"value": 0.69, "ci": [0.58, 0.80], "p": 0.008}
    below = {"value": 0.10, "ci": [0.02, 0.20], "p": 0.01}
    silent = {"value": 0.5, "ci": [0.4, 0.6], "p": 0.5}
    assert script.judged(trained, overlapping, "AUC", neutral=0.5).startswith(
        "**holds, but not shown to be learned**"
    )
    assert script.judged(trained, below, "AUC", neutral=0.5).startswith("**holds**: AUC; its")
    assert script.judged(trained, silent, "AUC", neutral=0.5) == "**holds**: AUC"

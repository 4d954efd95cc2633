"""Separation with its permutation null, bifurcation layers, centroid distances."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import silhouette_score

from tests.unit.synthetic_trajectories import split_groups, trace_dataset
from tokenfield.analysis import bifurcation, centroid_distances, separation, silhouette_batch
from tokenfield.analysis.separation import cosine_distance_matrix, distance_ratio_batch
from tokenfield.errors import UserError


def well_separated(n_time: int = 4, n_per: int = 6, n_feature: int = 32, seed: int = 0):
    """Three tight clusters around orthogonal directions."""
    rng = np.random.default_rng(seed)
    centres = np.eye(n_feature)[:3] * 10.0
    labels = ["x"] * n_per + ["y"] * n_per + ["z"] * n_per
    code = np.repeat(np.arange(3), n_per)
    states = centres[code][None] + 0.05 * rng.normal(size=(n_time, 3 * n_per, n_feature))
    return states, labels


def test_well_separated_groups_score_near_one_far_above_the_null():
    states, labels = well_separated()
    sep = separation(trace_dataset(states, labels), n_permutations=100, seed=1)
    assert (sep["silhouette"].values > 0.95).all()
    assert (sep["silhouette_null_high"].values < 0.2).all()
    np.testing.assert_allclose(sep["silhouette_p"].values, 1 / 101)
    assert (sep["ratio"].values > 20).all()
    assert (sep["ratio_null_high"].values < 1.5).all()
    assert sep.attrs["categories"] == ["x", "y", "z"]


def test_shuffled_labels_score_at_chance():
    rng = np.random.default_rng(5)
    states = rng.normal(size=(40, 24, 16)) + 3.0  # no structure at all
    labels = list(rng.permutation(["a", "b", "c"] * 8))
    sep = separation(trace_dataset(states, labels), n_permutations=200, seed=2)
    inside = (sep["silhouette"] >= sep["silhouette_null_low"]) & (
        sep["silhouette"] <= sep["silhouette_null_high"]
    )
    assert inside.mean() >= 0.85  # a 95% band holds the observed score most of the time
    gap = np.abs(sep["silhouette"] - sep["silhouette_null_mean"]).mean()
    width = (sep["silhouette_null_high"] - sep["silhouette_null_low"]).mean()
    assert gap < 0.5 * width
    assert (sep["silhouette_p"] > 0.01).mean() > 0.85
    assert np.abs(sep["ratio"] - 1.0).max() < 0.2


def test_null_is_seeded():
    states, labels = well_separated(seed=4)
    ds = trace_dataset(states + np.random.default_rng(0).normal(size=states.shape) * 5, labels)
    a = separation(ds, n_permutations=30, seed=7)
    b = separation(ds, n_permutations=30, seed=7)
    c = separation(ds, n_permutations=30, seed=8)
    np.testing.assert_array_equal(a["silhouette_null_mean"], b["silhouette_null_mean"])
    assert not np.array_equal(a["silhouette_null_mean"], c["silhouette_null_mean"])


def test_batched_silhouette_matches_scikit_learn():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(15, 6))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    dist = cosine_distance_matrix(x)
    codes = np.stack([rng.integers(0, 4, size=15) for _ in range(20)])
    codes[0] = [0] * 7 + [1] * 7 + [2]  # a category of one
    ours = silhouette_batch(dist, codes, 4)
    for labels, value in zip(codes, ours, strict=True):
        if 2 <= len(set(labels)) <= 14:
            expected = silhouette_score(dist, labels, metric="precomputed")
            assert value == pytest.approx(expected, abs=1e-12)


def test_distance_ratio_on_constructed_points():
    # within-category distances 1 and 1; between-category pairs: four at distance 2
    dist = np.array([[0, 1, 2, 2], [1, 0, 2, 2], [2, 2, 0, 1], [2, 2, 1, 0]], dtype=float)
    assert distance_ratio_batch(dist, np.array([[0, 0, 1, 1]]), 2)[0] == pytest.approx(2.0)


def test_centroid_distance_table_on_constructed_points():
    e = np.eye(3)
    # story along e0, math along e1, word problems between them, nearer story
    word = np.cos(0.3) * e[0] + np.sin(0.3) * e[1]
    points = np.stack([e[0], 2 * e[0], e[1], 3 * e[1], word, 4 * word])[None]  # (1, 6, 3)
    labels = ["story", "story", "math", "math", "word problems", "word problems"]
    table = centroid_distances(trace_dataset(points, labels))
    assert table.dims == ("time", "category", "other")
    assert list(table["category"].values) == ["math", "story", "word problems"]
    at = table.isel(time=0)
    assert at.sel(category="story", other="math") == pytest.approx(1.0)
    assert at.sel(category="word problems", other="story") == pytest.approx(1 - np.cos(0.3))
    assert at.sel(category="word problems", other="math") == pytest.approx(1 - np.sin(0.3))
    np.testing.assert_allclose(at.values, at.values.T)
    np.testing.assert_allclose(np.diag(at.values), 0.0)


@pytest.mark.parametrize("split_at", [3, 7, 10])
def test_two_groups_that_split_at_a_step_give_that_split_layer(split_at):
    states, labels = split_groups(split_at=split_at)
    result = bifurcation(trace_dataset(states, labels))
    np.testing.assert_array_equal(result["split_layer"].values, split_at)
    assert np.isnan(result["bifurcation_layer"].values).all()  # nobody changes sides
    assert (result["joined"].values == "").all()


def test_a_prompt_that_leaves_its_category_at_step_7():
    states, labels = split_groups(split_at=2, n_time=14)
    # particle 0 ("a") follows its own group up to step 6, then group "b" from step 7
    jitter = 0.02 * np.random.default_rng(1).normal(size=states[7:, 0].shape)
    states[7:, 0] = states[7:, 9] + jitter
    result = bifurcation(trace_dataset(states, labels))
    assert result["bifurcation_layer"].values[0] == 7
    assert result["joined"].values[0] == "b"
    assert np.isnan(result["bifurcation_layer"].values[1:]).all()
    assert np.isnan(result["split_layer"].values[0])  # not with its own at the end
    np.testing.assert_array_equal(result["split_layer"].values[1:], 2)


def test_identical_particles_never_split():
    states = np.ones((5, 6, 8))
    result = bifurcation(trace_dataset(states, ["a", "a", "a", "b", "b", "b"]))
    assert np.isnan(result["split_layer"].values).all()
    assert np.isnan(result["bifurcation_layer"].values).all()


def test_separation_needs_categories():
    with pytest.raises(UserError):
        separation(trace_dataset(np.ones((2, 3, 4)), ["a", "a", "a"]))
    with pytest.raises(UserError, match="no 'category'"):
        separation(trace_dataset(np.ones((2, 3, 4)), None))

"""Token clouds on hand-built configurations with known answers."""

from __future__ import annotations

import numpy as np
import pytest

import tokenfield as tf
from tokenfield.analysis.clouds import cloud_measures, token_clouds
from tokenfield.particles.init import uniform


def three_clusters(noise: float = 0.0, seed: int = 0) -> np.ndarray:
    """5, 3 and 2 tokens on three orthogonal directions (norms vary: they do not matter)."""
    rng = np.random.default_rng(seed)
    directions = np.eye(6)[[0] * 5 + [1] * 3 + [2] * 2]
    x = directions + noise * rng.standard_normal(directions.shape)
    return x * rng.uniform(0.5, 50.0, size=(10, 1))


def test_orthogonal_clusters_have_known_measures():
    found = cloud_measures(three_clusters(noise=1e-4))
    assert found["cluster_count"] == 3
    np.testing.assert_allclose(found["masses"], [0.5, 0.3, 0.2])
    assert found["largest_mass"] == pytest.approx(0.5)
    assert found["mean_cos"] == pytest.approx((5 * 4 + 3 * 2 + 2 * 1) / (10 * 9), abs=1e-4)
    assert found["effective_dim"] == pytest.approx(1 / (0.5**2 + 0.3**2 + 0.2**2), abs=1e-3)
    masses = np.array([0.5, 0.3, 0.2])
    angles = np.arccos(masses / np.linalg.norm(masses))  # each cluster to the mean direction
    assert found["spread"] == pytest.approx(np.sqrt((masses * angles**2).sum()), abs=1e-3)


def test_collapsed_and_spread_clouds():
    collapsed = cloud_measures(np.tile([[0.0, 3.0, 4.0]], (7, 1)))
    assert collapsed["cluster_count"] == 1 and collapsed["mean_cos"] == pytest.approx(1.0)
    assert collapsed["spread"] == pytest.approx(0.0, abs=1e-6)
    assert collapsed["effective_dim"] == pytest.approx(1.0)
    frame = np.eye(8)  # orthonormal: every token its own cluster, d directions
    spread = cloud_measures(frame)
    assert spread["cluster_count"] == 8 and spread["mean_cos"] == pytest.approx(0.0)
    assert spread["effective_dim"] == pytest.approx(8.0)


def test_groups_are_separate_clouds_and_coarser_eps_merges_more():
    a = three_clusters(noise=0.05, seed=1)
    b = np.tile([[1.0, 0, 0, 0, 0, 0]], (4, 1))
    states = np.concatenate([a, b])[None].repeat(2, axis=0)  # (time, 14, 6)
    clouds = token_clouds(states, groups=[0] * 10 + [1] * 4, eps=1e-6, more_eps=(0.1,))
    assert clouds.values["cluster_count"].shape == (2, 2)
    assert clouds.values["cluster_count"][0, 1] == 1  # group 1 collapsed
    assert clouds.values["cluster_count"][0, 0] == 10  # noise > eps: all apart
    assert clouds.values["cluster_count@0.1"][0, 0] == 3  # the three clusters again
    data = clouds.to_dict()
    assert data["mean"]["cluster_count@0.1"] == [2.0, 2.0]


def test_the_simulator_clusters_and_the_counter_sees_it():
    run = tf.simulate(
        tf.Dynamics(beta=1.0),
        uniform(32, 3, seed=0),
        t_max=30.0,
        dt=0.1,
        solver="euler",
        saveat=tf.SaveAt(every=50),
    )
    clouds = token_clouds(run)
    mean_cos = clouds.mean("mean_cos")
    assert mean_cos[0] < 0.2 and mean_cos[-1] > 0.999
    assert clouds.mean("cluster_count")[-1] == 1
    assert clouds.mean("effective_dim")[-1] == pytest.approx(1.0, abs=1e-3)
    np.testing.assert_allclose(clouds.time, run.time.values)

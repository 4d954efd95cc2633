"""Linear probes: separable classes are found, shuffled ones are not."""

from __future__ import annotations

import numpy as np
import pytest

from tokenfield.analysis.probes import _prepare, probe_accuracy


def clustered(n_per: int, classes: int, d: int, separation: float, seed: int):
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((classes, d)) * separation
    labels = np.repeat(np.arange(classes), n_per)
    x = centres[labels] + rng.standard_normal((labels.size, d)) + 10.0  # off-centre cloud
    return x, labels.astype(str)


def test_separable_classes_get_perfect_accuracy_and_noise_gets_chance():
    separable, labels = clustered(5, 5, 64, separation=3.0, seed=0)
    rng = np.random.default_rng(1)
    noise = rng.standard_normal(separable.shape)
    curve = probe_accuracy(np.stack([noise, separable]), labels, permutations=30)
    assert curve.cv == "5-fold"
    assert curve.accuracy[1] == 1.0
    assert curve.p_value[1] == pytest.approx(1 / 31)
    assert curve.accuracy[0] < 0.5
    assert curve.null_mean[1] < 0.4 and curve.null_high[1] < 0.6
    assert curve.chance == pytest.approx(0.2)


def test_small_classes_fall_back_to_leave_one_out():
    x, labels = clustered(3, 3, 16, separation=4.0, seed=2)
    curve = probe_accuracy(x[None], labels, permutations=5)
    assert curve.cv == "leave-one-out"
    assert curve.accuracy[0] == 1.0


def test_span_rotation_keeps_inner_products_of_the_standardised_sphere():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((12, 40))
    z = _prepare(x)
    unit = x / np.linalg.norm(x, axis=1, keepdims=True)
    std = (unit - unit.mean(0)) / unit.std(0)
    np.testing.assert_allclose(z @ z.T, std @ std.T, atol=1e-9)
    assert z.shape[1] <= 12

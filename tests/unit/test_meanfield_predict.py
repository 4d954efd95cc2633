"""Linear stability against the particle simulator: first plateaus and growth rates."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tokenfield.meanfield.predict import (
    first_plateau,
    first_plateau_experiment,
    fourier_amplitudes,
    growth_rate_experiment,
)
from tokenfield.particles.init import equispaced

TOL = {
    # fitted slope of log|rho_k| vs lambda_k^(n), relative to max lambda, for the modes
    # with lambda_k >= lambda_max / 2 (the rest are later swamped by harmonics of the
    # growing modes, which grow at twice the top rate)
    "growth_rate": 1e-4,
}


def test_fourier_amplitudes_of_equispaced_points():
    x = equispaced(16, 2).numpy()
    amplitudes = fourier_amplitudes(x, [0, 1, 5, 15, 16, 32])
    assert np.allclose(amplitudes, [1, 0, 0, 0, 1, 1], atol=1e-14)


def test_fourier_amplitudes_closed_form_rotation_invariance_and_batching():
    rng = np.random.default_rng(0)
    theta = rng.uniform(-math.pi, math.pi, size=9)
    x = np.stack([np.cos(theta), np.sin(theta)], axis=1)
    modes = [0, 1, 2, 3, 7]
    expected = [abs(np.mean(np.exp(-1j * k * theta))) for k in modes]
    np.testing.assert_allclose(fourier_amplitudes(x, modes), expected, atol=1e-14)
    # a rotation by phi multiplies rho_k by e^{-i k phi}: the moduli do not change
    phi = 0.3
    rotation = np.array([[math.cos(phi), math.sin(phi)], [-math.sin(phi), math.cos(phi)]])
    rotated = x @ rotation
    assert not np.allclose(rotated, x, atol=1e-3)  # it really moved every point
    np.testing.assert_allclose(fourier_amplitudes(rotated, modes), expected, atol=1e-13)
    # a reflection keeps them too; moving one point changes them
    np.testing.assert_allclose(fourier_amplitudes(x * [1, -1], modes), expected, atol=1e-13)
    moved = x.copy()
    moved[0] = [math.cos(theta[0] + 0.5), math.sin(theta[0] + 0.5)]
    assert np.abs(fourier_amplitudes(moved, modes[1:]) - expected[1:]).max() > 1e-3
    # batched equals one by one
    batch = np.stack([x, rotated, moved])
    np.testing.assert_array_equal(
        fourier_amplitudes(batch, modes), np.stack([fourier_amplitudes(b, modes) for b in batch])
    )


def test_first_plateau_skips_the_start_and_short_transients():
    times = np.arange(10.0)
    counts = np.array([64, 64, 64, 9, 7, 7, 7, 7, 6, 6])
    found = first_plateau(counts, times, min_duration=3.0)
    assert found is not None and (found.count, found.start, found.end) == (7, 4.0, 8.0)
    assert first_plateau(np.full(10, 64), times, 1.0) is None


@pytest.mark.parametrize("normalization", ["sa", "usa"])
def test_the_first_plateau_is_near_k_max(normalization):
    result = first_plateau_experiment(
        4.0, normalization=normalization, n_particles=64, seeds=2, noise=1e-3
    )
    assert result.k_max == 3
    assert (result.count_series[:, 0] == 64).all()  # eps leaves the start unlinked
    assert np.all(np.abs(result.counts - result.k_max) <= 1), result.counts
    assert np.all(result.starts < result.ends)
    data = result.to_dict(series=True)
    assert data["k_max"] == 3 and len(data["count_series"]) == 2


@pytest.mark.parametrize("normalization", ["sa", "usa"])
def test_fitted_growth_rates_match_lambda_k(normalization):
    fit = growth_rate_experiment(9.0, normalization=normalization, n_particles=64, seeds=1)
    strong = fit.discrete >= 0.5 * fit.discrete.max()
    assert strong.sum() >= 3
    assert fit.relative_error[strong].max() <= TOL["growth_rate"], fit.relative_error
    # the fit is over a window that ends before any amplitude is large
    assert fit.window[1] > 5 / fit.discrete.max()
    assert set(fit.to_dict()) >= {"fitted", "lambda_discrete", "lambda_continuum"}

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
    rotated = np.stack([np.cos(0.3), np.sin(0.3)])[None] * 0 + x @ np.array(
        [[math.cos(0.3), math.sin(0.3)], [-math.sin(0.3), math.cos(0.3)]]
    )
    noisy = rotated + 1e-3 * np.random.default_rng(0).normal(size=x.shape)
    assert np.allclose(
        fourier_amplitudes(noisy, [16]), fourier_amplitudes(noisy[None], [16])[0], atol=0
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

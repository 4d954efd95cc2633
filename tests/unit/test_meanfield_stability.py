"""Linear stability of the uniform measure: closed forms against the particle Jacobian."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.integrate import quad
from scipy.special import eval_gegenbauer, iv

from tokenfield.errors import UserError
from tokenfield.meanfield.stability import (
    circulant_mode_eigenvalues,
    discrete_growth_rates,
    equispaced_jacobian,
    funk_hecke_eigenvalue,
    growth_rates,
    harmonic_dimension,
    k_max_curve,
    most_unstable_mode,
    seed_growth_rates,
    sphere_quadrature,
    stability_spectrum,
    weighted_linearization,
)

TOL = {
    # Jacobian mode eigenvalues vs the formulas, relative to max_k |lambda_k|
    "jacobian": 1e-8,
    "symmetric": 1e-12,  # |J - J^T| / max |lambda|
    "identity": 1e-12,  # algebraic identities between the closed forms
    "funk_hecke": 1e-10,  # closed form vs 1-D quadrature
    "quadrature_jacobian": 1e-10,  # J grad Y_l = lambda_l grad Y_l on an exact sphere quadrature
}


@pytest.mark.parametrize("normalization", ["usa", "sa"])
@pytest.mark.parametrize("beta", [0.5, 2.0, 9.0, 16.0, -0.16, -2.0, -9.0])
def test_jacobian_eigenvalues_match_the_closed_forms_at_n64(normalization, beta):
    """The exact autograd Jacobian of 64 equispaced particles (through the simulator's
    field) has, for Fourier mode k, eigenvalue lambda_k^(64) (the aliasing sum, exact for
    every n) and, since the aliases I_{64-k}(beta) are negligible here, the continuum
    k^2 I_k(beta) / beta (SA: / I_0(beta)) too, both to 1e-8 relative to max |lambda|."""
    n = 64
    jacobian = equispaced_jacobian(n, beta, normalization=normalization)
    modes = circulant_mode_eigenvalues(jacobian)  # (n,)
    k = np.arange(n)
    scale = np.abs(modes).max()
    discrete = discrete_growth_rates(k, beta, n, normalization=normalization)
    assert np.abs(modes - discrete).max() <= TOL["jacobian"] * scale
    half = k[: n // 2 + 1]
    continuum = growth_rates(half, beta, normalization=normalization)
    assert np.abs(modes[half] - continuum).max() <= TOL["jacobian"] * scale
    # the circulant's mode eigenvalues are all its eigenvalues (symmetric: real)
    assert np.abs(jacobian - jacobian.T).max() <= TOL["symmetric"] * scale
    eig = np.sort(np.linalg.eigvalsh(0.5 * (jacobian + jacobian.T)))
    assert np.abs(eig - np.sort(modes)).max() <= TOL["jacobian"] * scale
    assert abs(modes[0]) <= TOL["jacobian"] * scale  # rotations are neutral


@pytest.mark.parametrize("normalization", ["usa", "sa"])
def test_the_discrete_rates_capture_aliasing_that_the_continuum_misses(normalization):
    """n = 16 at beta = 25: the aliases matter (the continuum is off by ~40 %), the
    discrete formula still equals the Jacobian; as n grows it tends to the continuum."""
    n, beta = 16, 25.0
    modes = circulant_mode_eigenvalues(equispaced_jacobian(n, beta, normalization=normalization))
    k = np.arange(n)
    scale = np.abs(modes).max()
    discrete = discrete_growth_rates(k, beta, n, normalization=normalization)
    continuum = growth_rates(k[: n // 2 + 1], beta, normalization=normalization)
    assert np.abs(modes - discrete).max() <= TOL["jacobian"] * scale
    assert np.abs(modes[: n // 2 + 1] - continuum).max() > 0.1 * scale
    gaps = [
        np.abs(
            discrete_growth_rates(range(6), beta, m, normalization=normalization)
            - growth_rates(range(6), beta, normalization=normalization)
        ).max()
        / scale
        for m in (16, 24, 32, 48)
    ]
    assert all(a > b for a, b in zip(gaps, gaps[1:], strict=False)) and gaps[-1] < 1e-6


def test_closed_form_identities():
    k = np.arange(1, 12)
    for beta in (0.3, 4.0, 30.0):
        usa = growth_rates(k, beta)
        recurrence = 0.5 * k * (iv(k - 1, beta) - iv(k + 1, beta))
        assert np.allclose(usa, recurrence, rtol=TOL["identity"], atol=0)
        assert np.allclose(usa, k**2 * iv(k, beta) / beta, rtol=TOL["identity"], atol=0)
        sa = growth_rates(k, beta, normalization="sa")
        assert np.allclose(sa, usa / iv(0, beta), rtol=TOL["identity"], atol=0)
        rescaled = growth_rates(k, beta, time="rescaled")
        assert np.allclose(rescaled, usa * math.exp(-beta), rtol=TOL["identity"], atol=0)
        assert np.allclose(growth_rates(k, beta, normalization="sa", time="rescaled"), sa)
    # beta -> 0: only the first harmonic grows, at (d - 1) / d
    for dim in (2, 3, 5):
        small = growth_rates(range(4), 1e-7, dim=dim)
        assert np.allclose(small, growth_rates(range(4), 0.0, dim=dim), atol=1e-6)
        assert growth_rates([1], 0.0, dim=dim)[0] == pytest.approx((dim - 1) / dim)
    # large beta stays finite in rescaled time
    assert np.isfinite(growth_rates(range(40), 2000.0, time="rescaled")).all()


def test_k_max_follows_sqrt_2beta_and_the_seed_formula_cannot():
    curve = k_max_curve(np.arange(1, 401))
    assert np.all(np.diff(curve.k_max) >= 0)
    assert np.abs(curve.k_max - curve.sqrt_2beta).max() <= 1.0
    for beta in (1, 2, 4, 9, 16, 25, 36, 49, 64, 81, 100):
        assert most_unstable_mode(beta) == most_unstable_mode(beta, normalization="sa")
        seed = seed_growth_rates(np.arange(1, 30), beta)
        assert int(np.argmax(seed)) + 1 == 1  # always k = 1
    assert most_unstable_mode(100) == 14 and most_unstable_mode(1) == 1
    spectrum = stability_spectrum(25.0)
    assert spectrum.k_max == 7 and spectrum.multiplicity[1:].tolist() == [2] * 25


@pytest.mark.filterwarnings("ignore::scipy.integrate.IntegrationWarning")
@pytest.mark.parametrize("dim", [3, 4, 5])
@pytest.mark.parametrize("beta", [0.7, 3.0, -2.0])
def test_funk_hecke_closed_form_matches_quadrature(dim, beta):
    alpha = (dim - 2) / 2
    weight = lambda t: (1 - t * t) ** ((dim - 3) / 2)  # noqa: E731
    norm = quad(weight, -1, 1, epsabs=0, epsrel=1e-13)[0]
    for degree in range(6):

        def integrand(t, degree=degree):
            legendre = eval_gegenbauer(degree, alpha, t) / eval_gegenbauer(degree, alpha, 1.0)
            return math.exp(beta * t) * legendre * weight(t)

        expected = quad(integrand, -1, 1, epsabs=0, epsrel=1e-13, limit=200)[0] / norm
        value = funk_hecke_eigenvalue(degree, beta, dim)[0]
        assert abs(value - expected) <= TOL["funk_hecke"] * max(1.0, abs(expected))


def _sectoral_gradient(points: np.ndarray, degree: int) -> np.ndarray:
    """grad_S of the harmonic Y = Re (x_1 + i x_2)^l (harmonic in every d)."""
    z = points[:, 0] + 1j * points[:, 1]
    derivative = degree * z ** (degree - 1)
    grad = np.zeros_like(points)
    grad[:, 0], grad[:, 1] = np.real(derivative), np.real(1j * derivative)
    return grad - (grad * points).sum(1, keepdims=True) * points


def _weighted_field(points, weights, beta, normalization, project=True):
    """The weighted particle field v_i = P_{x_i} sum_j w_j e^{beta <x_i, x_j>} x_j / Z_i,
    written here independently of the library (numpy, float64)."""
    kernel = np.exp(beta * points @ points.T) * weights[None, :]
    drift = kernel @ points
    if normalization == "sa":
        drift = drift / kernel.sum(axis=1, keepdims=True)
    if not project:
        return drift
    return drift - (drift * points).sum(axis=1, keepdims=True) * points


@pytest.mark.parametrize(
    ("dim", "order", "beta"), [(3, 40, 4.0), (4, 20, 1.5), (3, 40, -3.0), (4, 20, -1.5)]
)
@pytest.mark.parametrize("normalization", ["usa", "sa"])
def test_sphere_growth_rates_against_a_quadrature_particle_jacobian(
    dim, order, beta, normalization
):
    """d >= 3: particles on an exact quadrature of S^{d-1} (weights w_j) are a fixed
    point; displacing them by grad_S Y_l moves the density by l (l + d - 2) Y_l, and the
    linearised field must return lambda_l grad_S Y_l (half-integer Bessel orders in
    d = 3, integer in d = 4)."""
    points, weights = sphere_quadrature(dim, order)
    assert abs(weights.sum() - 1) < 1e-14
    # the quadrature is a fixed point: the weighted field itself (not its derivative) vanishes
    field = _weighted_field(points, weights, beta, normalization)
    scale = np.abs(_weighted_field(points, weights, beta, normalization, project=False)).max()
    assert np.abs(field).max() <= TOL["quadrature_jacobian"] * scale
    # ... and the check can fail: the same points with one moved are not a fixed point
    moved_points = points.copy()
    moved_points[0] = moved_points[0] + 0.05 * _sectoral_gradient(points, 1)[0]
    moved_points[0] /= np.linalg.norm(moved_points[0])
    bound = TOL["quadrature_jacobian"] * scale
    assert np.abs(_weighted_field(moved_points, weights, beta, normalization)).max() > 100 * bound
    rates = growth_rates(range(5), beta, dim=dim, normalization=normalization)
    for degree in (1, 2, 3, 4):
        xi = _sectoral_gradient(points, degree)
        moved = weighted_linearization(points, weights, xi, beta, normalization=normalization)
        residual = np.abs(moved - rates[degree] * xi).max() / np.abs(xi).max()
        assert residual <= TOL["quadrature_jacobian"] * rates.max()


def test_l_max_follows_sqrt_2beta_plus_nu2_minus_nu_on_every_sphere():
    """The maximiser of lambda_l on S^{d-1} is within 1 of sqrt(2 beta + nu^2) - nu,
    nu = d/2 - 1, where the large-beta form sqrt(2 beta) - nu is far off when d is large."""
    degrees = np.arange(0, 80)
    for dim in (2, 3, 4, 8, 16, 32, 64, 128):
        nu = dim / 2 - 1
        for beta in (0.5, 1.0, 4.0, 9.0, 25.0, 100.0, 400.0):
            l_max = degrees[np.argmax(growth_rates(degrees, beta, dim=dim))]
            assert abs(l_max - (math.sqrt(2 * beta + nu * nu) - nu)) <= 1.0, (dim, beta, l_max)
    l_max = degrees[np.argmax(growth_rates(degrees, 100.0, dim=32))]
    assert l_max == 6 and math.sqrt(200) - 15 < 0  # the old docs' formula: -0.86


def test_harmonic_dimensions():
    assert harmonic_dimension(range(5), 3).tolist() == [1, 3, 5, 7, 9]
    assert harmonic_dimension(range(5), 4).tolist() == [1, 4, 9, 16, 25]
    assert harmonic_dimension(range(4), 2).tolist() == [1, 2, 2, 2]
    assert harmonic_dimension([2], 10).tolist() == [54]  # (d + 2)(d - 1) / 2


def test_bad_input_raises():
    with pytest.raises(UserError):
        growth_rates([1], float("nan"))
    with pytest.raises(UserError):
        growth_rates([1], 1.0, dim=1)
    with pytest.raises(UserError):
        growth_rates([-1], 1.0)
    with pytest.raises(UserError):
        growth_rates([1], 1.0, normalization="softmax")
    with pytest.raises(UserError):
        stability_spectrum(1.0, dim=3, n_particles=10)

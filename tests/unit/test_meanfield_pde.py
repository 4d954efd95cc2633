"""The mean-field PDE on the circle: velocity, invariants, order, and particles."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tokenfield.errors import UserError
from tokenfield.meanfield.convergence import pde_vs_particles
from tokenfield.meanfield.pde import (
    CirclePDE,
    cell_averages,
    circle_w1,
    circle_w1_atoms,
    density_w1,
    particles_from_density,
    von_mises_density,
)
from tokenfield.meanfield.stability import growth_rates

TOL = {
    "velocity": 1e-11,  # FFT face velocity vs direct quadrature (spectral)
    "mass": 1e-12,  # |h sum rho - 1| over a whole run
    "w1_exact": 1e-12,  # W1 with a closed form
    "w1_pot": 1e-6,  # exact W1 vs POT on atoms splitting each cell in 512
    "linear_rate": 2e-5,  # PDE growth of a small mode vs lambda_k (relative; SSP-RK3 error)
}
TWO_PI = 2 * math.pi


def _density(t):
    return 0.7 * np.exp(1.3 * np.cos(t - 0.4)) / (TWO_PI * np.i0(1.3)) + 0.3 / TWO_PI


@pytest.mark.parametrize("normalization", ["usa", "sa"])
@pytest.mark.parametrize("beta", [0.0, 2.0, -1.5, 9.0])
def test_face_velocity_matches_direct_quadrature(normalization, beta):
    pde = CirclePDE(beta, normalization, cells=256)
    v = pde.face_velocity(cell_averages(_density, 256))
    faces = pde.centres + 0.5 * pde.h
    phi = np.linspace(0, TWO_PI, 4001)[:-1]
    kernel = np.exp(beta * np.cos(phi[None] - faces[:, None])) * _density(phi)[None]
    numerator = (kernel * np.sin(phi[None] - faces[:, None])).sum(1) * (phi[1] - phi[0])
    expected = (
        numerator if normalization == "usa" else numerator / kernel.sum(1) / (phi[1] - phi[0])
    )
    assert np.abs(v - expected).max() <= TOL["velocity"] * max(1.0, np.abs(expected).max())


def test_uniform_density_is_a_fixed_point():
    for normalization in ("usa", "sa"):
        pde = CirclePDE(5.0, normalization, cells=64)
        assert np.abs(pde.face_velocity(np.full(64, 1 / TWO_PI))).max() < 1e-13


@pytest.mark.parametrize("normalization", ["usa", "sa"])
def test_mass_is_kept_and_the_density_stays_positive_while_it_concentrates(normalization):
    pde = CirclePDE(9.0, normalization, time="rescaled", cells=256)
    solution = pde.solve(von_mises_density(256, 0.5), np.linspace(0, 40, 5))
    assert solution.mass_error <= TOL["mass"]
    assert solution.min_density.min() >= 0.0
    assert solution.density[-1].max() > 5 * solution.density[0].max()  # it did concentrate
    ds = solution.to_dataset()
    assert ds.density.dims == ("time", "theta") and ds.sizes["theta"] == 256


@pytest.mark.parametrize("normalization", ["usa", "sa"])
def test_a_small_mode_grows_at_lambda_k(normalization):
    beta, k, eps, t = 9.0, 4, 1e-7, 2.0
    cells = 512
    pde = CirclePDE(beta, normalization, time="rescaled", cells=cells)
    rho0 = cell_averages(lambda th: 1 + eps * np.cos(k * th), cells)
    solution = pde.solve(rho0, [0.0, t])
    amplitude = [abs(np.fft.rfft(frame)[k]) for frame in solution.density]
    rate = math.log(amplitude[1] / amplitude[0]) / t
    expected = growth_rates([k], beta, normalization=normalization, time="rescaled")[0]
    assert abs(rate - expected) <= TOL["linear_rate"] * expected


def test_second_order_convergence_in_the_grid():
    errors = []
    for cells in (128, 256, 512):
        coarse = CirclePDE(4.0, "sa", cells=cells).solve(von_mises_density(cells, 1.0), [2.0])
        fine = CirclePDE(4.0, "sa", cells=2 * cells).solve(von_mises_density(2 * cells, 1.0), [2.0])
        errors.append(density_w1(coarse.density[-1], fine.density[-1]))
    ratios = np.array(errors[:-1]) / np.array(errors[1:])
    assert np.all((ratios > 3.0) & (ratios < 5.0)), errors


def test_w1_closed_form_and_pot():
    n = 37
    uniform = np.full(64, 1 / TWO_PI)
    midpoints = (np.arange(n) + 0.5) * TWO_PI / n
    assert abs(circle_w1(uniform, midpoints) - math.pi / (2 * n)) <= TOL["w1_exact"]
    assert circle_w1(uniform, midpoints + 0.01) == pytest.approx(math.pi / (2 * n), abs=1e-12)
    density = von_mises_density(64, 2.0)
    angles = np.random.default_rng(0).random(50) * TWO_PI
    split = 512
    atoms = (np.arange(64 * split) + 0.5) * TWO_PI / (64 * split)
    weights = np.repeat(density, split)
    pot = circle_w1_atoms(angles, atoms, None, weights / weights.sum())
    assert abs(circle_w1(density, angles) - pot) <= TOL["w1_pot"]
    # two discrete measures: POT against the same distance by the density path
    assert circle_w1_atoms(midpoints, midpoints) == pytest.approx(0.0, abs=1e-12)
    assert density_w1(density, np.repeat(density, 4)) == 0.0


def test_particles_from_density():
    density = von_mises_density(128, 1.0)
    quantile = particles_from_density(density, 200)
    random = particles_from_density(density, 200, sampling="random", seed=3)
    assert quantile.shape == random.shape == (200,)
    assert np.array_equal(random, particles_from_density(density, 200, sampling="random", seed=3))
    assert circle_w1(density, quantile) < circle_w1(density, random)
    with pytest.raises(UserError):
        particles_from_density(density, 10, sampling="sobol")


def test_pde_stays_close_to_particle_runs_and_the_distance_falls_with_n():
    """A single bump under SA at beta = 4: the particles stay within O(1/n) of the PDE
    (quantile starts), far below how far the density itself moved."""
    result = pde_vs_particles(
        4.0, normalization="sa", ns=(32, 64, 128), times=(0.0, 2.0), cells=512, dt=0.02
    )
    assert result.mass_error <= TOL["mass"] and result.min_density > 0
    assert np.all(np.diff(result.w1[:, -1]) < 0)
    assert -1.1 < result.final_rate < -0.9, result.rate
    assert result.w1[-1, -1] < 0.02
    assert result.displacement[-1] > 10 * result.w1[-1, -1]
    assert result.pde_error[-1] < 1e-3 * result.w1[-1, -1] * 10


def test_bad_pde_input():
    with pytest.raises(UserError):
        CirclePDE(1.0, "usa", cells=4)
    with pytest.raises(UserError):
        CirclePDE(1.0, "usa", cfl=0.9)
    with pytest.raises(UserError):
        CirclePDE(1.0, "usa", cells=64).solve(np.full(64, 1.0), [1.0])  # mass 2 pi

"""The attractor analysis without a language model: the Jacobian code on the particle
simulator's own vector field, and the statistics and verdict rules."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tokenfield.analysis import attractors as stats
from tokenfield.meanfield.stability import discrete_growth_rates
from tokenfield.models.jacobian import product_spectra, radial_project, top_singular
from tokenfield.models.layer_map import great_circle
from tokenfield.particles.dynamics import Dynamics
from tokenfield.particles.integrate import Euler

DT = 1e-3
STEPS = 20


def _flow_map(dynamics: Dynamics, steps: int = STEPS, dt: float = DT):
    """The simulator's own Euler step ``x + dt v(x)``, ``steps`` times. Without the
    retraction: it would remove radial perturbations by itself and hide a missing
    radial projection in the Jacobian code."""
    solver = Euler()

    def step(x: torch.Tensor) -> torch.Tensor:
        for _ in range(steps):
            x = solver.step(lambda z: dynamics.vector_field(0.0, z), x, dt)
        return x

    return step


@pytest.fixture(autouse=True)
def _unfused(monkeypatch):
    """The simulator's unfused attention kernel (its CUDA float64 path): forward-mode
    AD has no rule for the fused CPU kernel. Same field, plain tensor ops."""
    from tokenfield.particles import kernels

    monkeypatch.setattr(kernels, "_fused_available", lambda q: False)


def _exponents(dynamics: Dynamics, x0: torch.Tensor, k: int) -> np.ndarray:
    spec = top_singular(_flow_map(dynamics), x0, k, angular=True, oversample=x0[0].numel(),
                        tol=1e-9, max_iter=6)  # fmt: skip
    return np.log(spec.values[0].numpy()) / (STEPS * DT)


def test_synchronised_state_contracts_at_the_linear_rate():
    """All n particles at one point of the circle: the linearised field is
    ``a_i' = mean(a) - a_i`` (SA), so one neutral mode (the common rotation) and
    n - 1 modes contracting at rate 1, for every beta. The FTLEs of the Euler
    flow map equal ``log(1 - dt) / dt`` there: -1 within 1e-3."""
    n = 5
    x0 = torch.zeros(1, n, 2, dtype=torch.float64)
    x0[..., 0] = 1.0
    for beta in (4.0,):  # the rate does not depend on beta
        rates = _exponents(Dynamics(beta=beta), x0, k=3)
        assert abs(rates[0]) < 1e-3
        np.testing.assert_allclose(rates[1:], -1.0, atol=1e-3)


def test_equispaced_state_gives_the_discrete_growth_rates():
    """n equally spaced particles on the circle (a fixed point): the FTLEs of the
    simulator's flow map are the eigenvalues of the circulant Jacobian that
    ``meanfield.stability.discrete_growth_rates`` gives in closed form."""
    n, beta = 6, 1.0
    angles = torch.arange(n, dtype=torch.float64) * 2 * math.pi / n
    x0 = torch.stack([torch.cos(angles), torch.sin(angles)], -1)[None]
    dynamics = Dynamics(beta=beta, normalization="sa")
    exact = discrete_growth_rates(np.arange(n), beta, n, normalization="sa")
    expected = np.sort(exact)[::-1][:4]
    rates = _exponents(dynamics, x0, k=4)
    # Euler's log(1 + dt lambda) / dt differs from lambda by dt lambda^2 / 2 < 1e-4
    np.testing.assert_allclose(rates, expected, atol=1e-3)


def _sweep_exponents(dynamics: Dynamics, x0: torch.Tensor, k: int, starts) -> np.ndarray:
    """The FTLEs from every start step by :func:`product_spectra`: each Euler step
    is a block, the trajectory the states. ``(len(starts), k)`` rates."""
    step = _flow_map(dynamics, steps=1)
    states = [x0]
    for _ in range(STEPS):
        states.append(step(states[-1]))
    spec = product_spectra([step] * STEPS, torch.stack(states, 1), starts, k,
                           oversample=x0[0].numel(), tol=1e-9, max_iter=20)  # fmt: skip
    lengths = np.asarray([STEPS - s for s in spec.starts], dtype=float)[:, None]
    return np.log(spec.values[0].numpy()) / (lengths * DT)


def test_sweep_over_start_steps_gives_the_linear_rates():
    """The one-sweep FTLEs from every start block, on the simulator's own Euler steps
    as blocks: at the synchronised state one neutral mode and rate -1 from every
    start; at the equispaced state the closed-form rates (both fixed points, so every
    start gives the same rates). A skipped block or a missing radial projection
    moves them by far more than 1e-3."""
    n = 5
    x0 = torch.zeros(1, n, 2, dtype=torch.float64)
    x0[..., 0] = 1.0
    rates = _sweep_exponents(Dynamics(beta=4.0), x0, 3, starts=(0, 5, STEPS - 2))
    np.testing.assert_allclose(rates[:, 0], 0.0, atol=1e-3)
    np.testing.assert_allclose(rates[:, 1:], -1.0, atol=1e-3)
    n, beta = 6, 1.0
    angles = torch.arange(n, dtype=torch.float64) * 2 * math.pi / n
    x0 = torch.stack([torch.cos(angles), torch.sin(angles)], -1)[None]
    exact = discrete_growth_rates(np.arange(n), beta, n, normalization="sa")
    expected = np.sort(exact)[::-1][:4]
    rates = _sweep_exponents(Dynamics(beta=beta, normalization="sa"), x0, 4, starts=(0, 10))
    np.testing.assert_allclose(rates, np.broadcast_to(expected, rates.shape), atol=1e-3)


def test_radial_projection_is_orthogonal():
    y = torch.nn.functional.normalize(torch.randn(3, 5, dtype=torch.float64), dim=-1)
    v = torch.randn(3, 5, dtype=torch.float64)
    out = radial_project(y, v)
    assert torch.allclose((out * y).sum(-1), torch.zeros(3, dtype=torch.float64), atol=1e-14)


def test_great_circle_ends_and_stays_on_the_circle():
    a = torch.tensor([[2.0, 0.0, 0.0]], dtype=torch.float64)
    b = torch.tensor([[0.0, 4.0, 0.0]], dtype=torch.float64)
    lam = torch.linspace(0, 1, 5, dtype=torch.float64)
    points = great_circle(a, b, lam)
    assert torch.allclose(points[0], a) and torch.allclose(points[-1], b)
    angles = torch.atan2(points[:, 0, 1], points[:, 0, 0])
    assert torch.allclose(angles, lam * math.pi / 2)
    assert torch.allclose(points[:, 0].norm(dim=-1), 2 + 2 * lam)


def test_basin_radius_is_the_last_angle_before_the_first_failure():
    thetas = [0.001, 0.01, 0.1, 1.0]
    flipped = np.zeros((4, 10, 3), dtype=bool)
    flipped[2, :2, 0] = True  # prompt 0: 80 % kept at 0.1 -> radius 0.01
    flipped[3, :1, 1] = True  # prompt 1: 90 % kept at 1.0 -> radius 1.0
    flipped[0, :5, 2] = True  # prompt 2: fails at once
    flipped[3, :, 2] = False
    np.testing.assert_array_equal(stats.basin_radius(flipped, thetas), [0.01, 1.0, 0.0])


def test_logistic_slope_recovers_a_planted_slope_and_the_line():
    lam = np.linspace(0, 1, 11)
    u = 1 / (1 + np.exp(-30 * (lam - 0.4)))
    slope, mid = stats.logistic_slope(lam, np.stack([u, lam], 1))
    assert abs(slope[0] - 30) < 0.5 and abs(mid[0] - 0.4) < 1e-3
    assert abs(slope[1] - stats.LINEAR_SLOPE) < 1e-2
    assert abs(stats.linear_slope() - stats.LINEAR_SLOPE) < 1e-3


def test_switch_fraction_is_zero_at_a_and_one_at_b():
    a = np.array([[1.0, 0.0]])
    b = np.array([[0.0, 1.0]])
    final = np.stack([a, b, np.array([[1.0, 1.0]])])
    np.testing.assert_allclose(stats.switch_fraction(final, a, b)[:, 0], [0, 1, 0.5])


def test_bootstrap_interval_covers_the_mean_and_resamples_prompts():
    rng = np.random.default_rng(0)
    values = rng.normal(1.0, 1.0, size=(200, 2))
    mean, low, high = stats.bootstrap_mean(values, n_boot=400)
    assert np.all(low < mean) and np.all(mean < high)
    # the half-width is about 1.96 / sqrt(200)
    assert np.all(np.abs((high - low) / 2 - 1.96 / np.sqrt(200)) < 0.05)


def test_ftle_verdicts_follow_the_sign_of_the_interval():
    ranges = stats.ftle_verdicts(
        [0, 1, 2, 3], np.zeros(4), np.array([-2, -1, -0.1, 0.1]), np.array([-1, -0.5, 0.1, 1])
    )
    assert [r["verdict"] for r in ranges] == ["contract", "neutral", "expand"]
    assert ranges[0]["blocks"] == [0, 1]
    assert "contract toward the output" in ranges[0]["text"]


def test_basin_verdict_needs_every_later_block_and_the_random_copy():
    line = math.log10(stats.LINEAR_SLOPE)
    blocks = [0, 5, 10]
    mean = np.array([2.0, 2.0, 2.0])
    trained = (mean, np.array([line - 0.1, line + 0.1, line + 0.2]), mean + 1)
    better = (np.ones(3), np.full(3, 0.1), np.full(3, 2.0))
    verdict = stats.basin_verdict(blocks, trained, better)
    assert verdict["supported"] and verdict["from_block"] == 5
    assert verdict["text"].endswith("from block 5 on: supported")
    worse = (np.ones(3), np.array([0.1, 0.1, -0.1]), np.full(3, 2.0))
    assert not stats.basin_verdict(blocks, trained, worse)["supported"]
    assert not stats.basin_verdict(blocks, trained, None)["supported"]


@pytest.mark.parametrize("bad", [[0.1, 0.01], [0.0, 0.1], [0.1, 2.0]])
def test_config_refuses_bad_theta_grids(bad):
    from tokenfield.errors import ParameterError
    from tokenfield.pipelines.attractors import AttractorConfig

    with pytest.raises(ParameterError):
        AttractorConfig(thetas=tuple(bad))


def _summary(ftle_mean):
    n = len(ftle_mean)
    iv = {
        "mean": ftle_mean,
        "low": [m - 0.1 for m in ftle_mean],
        "high": [m + 0.1 for m in ftle_mean],
    }
    return {"model": "m", "ftle_blocks": list(range(n)), "ftle_top": iv, "blocks": [0, 1],
            "angle_ratio_median": [[0.5, 0.6], [2.0, 1.0]], "basin_radius_median": [0.3, 0.01],
            "basin_different": {"log10_slope": {"mean": [0.5, 0.7], "low": [0.4, 0.6],
                                                "high": [0.6, 0.8]}}}  # fmt: skip


def test_report_fragment_and_figure_show_both_models():
    import matplotlib

    matplotlib.use("Agg")
    from tokenfield.viz.attractors import attractors_html_section, plot_attractors

    data = {"trained": _summary([0.1, -0.2, 0.3]), "random": _summary([0.0, 0.0, 0.05]),
            "verdicts": {"ftle": [{"text": "blocks 0-2: x"}], "ftle_random": [{"text": "r"}],
                         "basins": {"text": "the category regions act as basins: not supported"}}}  # fmt: skip
    section = attractors_html_section(data)
    assert "-0.200 [-0.300, -0.100]" in section and "random copy: r" in section
    assert section.count("<tr>") == 1 + 3 + 1 + 2  # two tables: header + rows each
    fig = plot_attractors({"m": data})
    assert len(fig.axes[0].lines) >= 2 and len(fig.axes[1].lines) >= 2


def test_switch_point_is_where_b_holds_to_the_end():
    lam = [0.0, 0.25, 0.5, 0.75, 1.0]
    is_b = np.array([[0, 0, 1, 1, 1], [0, 1, 0, 1, 1], [1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]).T
    out = stats.switch_point(is_b, lam)
    np.testing.assert_array_equal(out[:2], [0.5, 0.75])
    assert np.isnan(out[2]) and out[3] == 0.0


def test_the_verdicts_false_positive_rate_on_data_without_an_effect():
    """No effect, prompts (or pairs) the exchangeable unit that the bootstrap
    resamples:

    - per-prompt top FTLEs with mean 0 at 30 blocks: a block is called "contract" or
      "expand" at about the interval's nominal 5 % (a rate per block, reported block
      by block, not a maximum chosen over blocks);
    - log switch slopes at the straight line's in both models (same pairs): "basins
      supported" at most at 5 %, since it needs every later block above the line and
      above the random copy.
    """
    rng = np.random.default_rng(0)
    calls, runs = 0, 40
    for run in range(runs):
        values = rng.normal(0.0, 1.0, size=(64, 30))
        mean, low, high = stats.bootstrap_mean(values, n_boot=300, seed=run)
        ranges = stats.ftle_verdicts(list(range(30)), mean, low, high)
        calls += sum(
            r["blocks"][1] - r["blocks"][0] + 1 for r in ranges if r["verdict"] != "neutral"
        )
    rate = calls / (30 * runs)
    assert 0.02 <= rate <= 0.08, rate
    line = math.log10(stats.LINEAR_SLOPE)
    blocks = [0, 6, 12, 17, 23, 29]
    supported = 0
    for run in range(runs):
        trained = line + rng.normal(0.0, 0.3, size=(48, len(blocks)))
        random = line + rng.normal(0.0, 0.3, size=(48, len(blocks)))
        interval = stats.bootstrap_mean(trained, n_boot=300, seed=run)
        difference = stats.bootstrap_mean(trained - random, n_boot=300, seed=run)
        supported += stats.basin_verdict(blocks, interval, difference)["supported"]
    assert supported / runs <= 0.05, supported

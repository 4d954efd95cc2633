"""The hypotheses' measurements on synthetic data with known answers (issue 24)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.optimize import nnls

from tokenfield.analysis.convex_fit import (
    convex_fit,
    head_test,
    holm,
    layer_summary,
    nnls_gram,
    prompt_gaps,
)
from tokenfield.analysis.next_embedding import next_embedding_curve
from tokenfield.analysis.order import (
    fuzziness,
    matrix_entropy,
    monotone,
    order_panel,
    pace,
    sphere_energy,
    twonn_dimension,
    verdict,
)
from tokenfield.errors import ParameterError, UserError


def _orthonormal(k: int, d: int, seed: int = 0) -> np.ndarray:
    q, _ = np.linalg.qr(np.random.default_rng(seed).normal(size=(d, k)))
    return q.T  # (k, d) orthonormal rows


# --- the order panel's quantities --------------------------------------------------


def test_sphere_energy_is_one_for_one_cluster_and_sum_w2_for_tight_clusters():
    centres = _orthonormal(3, 8)
    assert sphere_energy(np.repeat(centres[:1] * 7.0, 5, axis=0), 4.0) == pytest.approx(1.0)
    sizes = (5, 3, 2)
    x = np.concatenate(
        [
            np.repeat(c[None] * (i + 1.0), w, axis=0)
            for i, (c, w) in enumerate(zip(centres, sizes, strict=True))
        ]
    )
    expected = sum(w * w for w in sizes) / 10**2
    # orthogonal centres: the cross terms are exp(-beta), negligible at beta = 60
    assert sphere_energy(x, 60.0) == pytest.approx(expected, abs=1e-12)
    assert sphere_energy(x, 0.0) == pytest.approx(1.0)
    with pytest.raises(ParameterError):
        sphere_energy(x, -1.0)


def test_matrix_entropy_counts_equal_orthogonal_directions():
    centres = _orthonormal(4, 10)
    norms = np.random.default_rng(1).uniform(1.0, 5.0, size=(12, 1))  # directions only count
    x = np.repeat(centres, 3, axis=0) * norms
    assert matrix_entropy(x) == pytest.approx(math.log(4), abs=1e-10)
    assert matrix_entropy(np.repeat(centres[:1], 6, axis=0)) == pytest.approx(0.0, abs=1e-10)


@pytest.mark.parametrize("dim", [1, 4])
def test_twonn_recovers_the_dimension_of_a_sphere_embedded_in_high_dimension(dim):
    rng = np.random.default_rng(dim)
    basis = _orthonormal(dim + 1, 40, seed=dim)
    x = rng.normal(size=(1500, dim + 1)) @ basis  # S^dim after normalisation
    assert twonn_dimension(x) == pytest.approx(dim, rel=0.12)
    assert math.isnan(twonn_dimension(x[:2]))


def test_twonn_drops_duplicate_points():
    x = np.random.default_rng(0).normal(size=(400, 3))
    once = twonn_dimension(x, unit=False)
    assert twonn_dimension(np.concatenate([x, x[:50]]), unit=False) == pytest.approx(once)


def test_fuzziness_equals_within_over_between_variance():
    # 1-D: classes at +-a with points a +- s: SS_w = s^2, SS_b = a^2 -> D = s^2 / a^2
    a, s = 2.0, 0.5
    line = np.array([a - s, a + s, -a - s, -a + s])
    direction = _orthonormal(1, 6)[0]
    x = line[:, None] * direction[None] + 3.0 * _orthonormal(2, 6, seed=1)[1]  # shifted
    labels = ["p", "p", "n", "n"]
    assert fuzziness(x, labels) == pytest.approx(s**2 / a**2, rel=1e-10)
    with pytest.raises(UserError):
        fuzziness(x, ["p"] * 4)


def test_pace_recovers_a_geometric_decay_and_refuses_noise():
    rng = np.random.default_rng(0)
    t = np.arange(12)
    values = rng.uniform(0.5, 2.0, size=(30, 1)) * np.exp(-0.3 * t)[None]
    fit = pace(values, n_boot=200)
    assert fit.slope == pytest.approx(-0.3, abs=1e-12)
    assert fit.r2 == pytest.approx(1.0)
    assert fit.slope_ci[0] == pytest.approx(-0.3) and fit.slope_ci[1] == pytest.approx(-0.3)
    assert fit.monotone_fraction == 1.0 and fit.verdict == "supported"
    # prompts with their own rates: the interval over prompts has a width near the
    # rates' spread / sqrt(prompts) and contains the fitted slope
    rates = rng.uniform(-0.4, -0.2, size=(30, 1))
    spread = pace(np.exp(rates * t[None]), n_boot=400)
    low, high = spread.slope_ci
    assert low < spread.slope < high < 0
    assert 0.5 * 3.92 * rates.std() / math.sqrt(30) < high - low < 2 * 3.92 * rates.std()
    noise = rng.uniform(1.0, 2.0, size=(30, 12))
    flat = pace(noise, n_boot=200)
    assert flat.verdict.startswith("not supported")
    assert flat.monotone_fraction == 0.0


def test_verdict_rule():
    assert verdict(0.95, (0.1, 0.2)) == "supported"
    assert verdict(0.95, (-0.1, 0.2)).startswith("not supported (slope interval")
    assert verdict(0.5, (0.1, 0.2)).startswith("not supported (R^2")
    assert monotone(np.array([1.0, 2.0, 2.0, 3.0]), +1) and not monotone(np.array([1.0, 0.5]), +1)
    assert monotone(np.array([3.0, 2.0, 1.0]), -1)


def test_panel_on_a_clustering_glpr_run_has_monotone_energy_in_every_run():
    """USA dynamics is the gradient ascent of E_beta on the sphere: E_beta(t) never falls."""
    import torch

    from tokenfield.particles import Dynamics, SaveAt, simulate
    from tokenfield.particles.init import uniform

    beta = 4.0
    x0 = uniform(12, 3, seed=3, batch=6).double()
    run = simulate(
        Dynamics(beta=beta, normalization="usa", time="rescaled"),  # paper time: RK4 unstable
        x0,
        t_max=30.0,
        dt=0.05,
        solver="rk4",
        saveat=SaveAt(times=tuple(np.linspace(0, 30.0, 13))),
        dtype=torch.float64,
    )
    states = run.states.values  # (system, time, n, d)
    clouds = list(states)
    panel = order_panel(clouds, betas=(beta,), n_boot=50)
    energy = panel["energy_beta_4"]
    assert energy.monotone_fraction == 1.0
    assert energy.slope > 0 and energy.per_layer[-1] > energy.per_layer[0]
    assert panel["matrix_entropy"].slope < 0  # the cloud concentrates


# --- the convex fit ----------------------------------------------------------------


def test_nnls_gram_equals_scipy_nnls():
    rng = np.random.default_rng(1)
    for _ in range(30):
        m = int(rng.integers(1, 12))
        u, y = rng.normal(size=(m, 20)), rng.normal(size=20)
        expected, _ = nnls(u.T, y)
        np.testing.assert_allclose(nnls_gram(u @ u.T, u @ y), expected, atol=1e-10)
    u = rng.normal(size=(5, 9))
    both = nnls_gram(u @ u.T, u @ rng.normal(size=(9, 3)))
    assert both.shape == (5, 3) and np.all(both >= 0)


def test_an_exact_convex_target_is_recovered():
    rng = np.random.default_rng(2)
    u = rng.normal(size=(8, 30))
    weights = rng.dirichlet(np.ones(8))
    weights[[1, 4]] = 0.0
    weights /= weights.sum()
    fit = convex_fit(u, 2.5 * u.T @ weights)
    assert np.abs(fit.weights - weights).max() < 1e-6
    assert fit.scale == pytest.approx(2.5, abs=1e-6)
    assert fit.residual < 1e-12
    away = convex_fit(u, -(u.sum(axis=0)) - 5 * np.abs(u).sum(axis=0) * 0)  # not in the cone
    assert away.residual > 0


def _planted_prompt(rng: np.random.Generator, n: int = 9, d: int = 24):
    u = rng.normal(size=(n, d))
    targets = rng.normal(size=(n - 1, d))
    s = np.zeros((n, n))
    for t in range(n):
        if t < n - 1:
            fit = convex_fit(u[: t + 1], targets[t])
            s[t, : t + 1] = fit.weights if fit.scale > 0 else 1.0 / (t + 1)
        else:
            s[t, : t + 1] = 1.0 / (t + 1)
    return u, s, targets


def test_a_planted_head_whose_weights_are_the_best_fit_has_zero_gap_and_passes():
    rng = np.random.default_rng(3)
    gaps = [prompt_gaps(*_planted_prompt(rng)) for _ in range(8)]
    finite = np.concatenate([g.q[np.isfinite(g.q)] for g in gaps])
    assert finite.size > 40 and np.abs(finite).max() < 1e-10
    test = head_test(gaps, n_shuffles=99, n_flips=499)
    assert test.median_q < 1e-10 < test.median_uniform
    assert test.median_shuffled > 1e-6
    assert test.p_uniform <= 0.01 and test.p_shuffled <= 0.01
    summary = layer_summary([test])
    assert summary["share_passing"] == 1.0


def test_the_convex_fit_nulls_keep_their_false_positive_rate_without_an_effect():
    """Weights independent of the targets: the shuffle null's p < 0.05 about 5 % of
    the time, and heads passing both (Holm over a layer) at most about 5 %."""
    rng = np.random.default_rng(4)
    p_shuffled, passing = [], []
    for _layer in range(15):
        tests = []
        for _head in range(6):
            gaps = []
            for _prompt in range(4):
                n, d = 6, 10
                u = rng.normal(size=(n, d))
                s = np.tril(rng.dirichlet(np.ones(n), size=n))
                s /= s.sum(axis=1, keepdims=True)
                gaps.append(prompt_gaps(u, s, rng.normal(size=(n - 1, d))))
            tests.append(
                head_test(gaps, n_shuffles=39, n_flips=99, seed=int(rng.integers(1 << 30)))
            )
        p_shuffled.extend(t.p_shuffled for t in tests)
        passing.append(layer_summary(tests)["share_passing"])
    rate = np.mean(np.array(p_shuffled) <= 0.05)
    assert 0.0 < rate < 0.12  # 90 heads: 0.05 +- 2.5 sd
    assert np.mean(passing) <= 0.05


def test_holm():
    assert holm([0.001, 0.02, 0.04, 0.5]).tolist() == [True, False, False, False]
    assert holm([0.01, 0.02, 0.03]).tolist() == [True, True, True]
    assert holm([0.2, 0.001]).tolist() == [False, True]


def test_prompt_gaps_refuses_mismatched_shapes():
    with pytest.raises(UserError):
        prompt_gaps(np.ones((3, 4)), np.ones((2, 2)), np.ones((2, 4)))


# --- the next token's embedding ------------------------------------------------------


def test_next_embedding_finds_a_planted_last_layer():
    rng = np.random.default_rng(5)
    vocab, d, n = 300, 16, 7
    table = rng.normal(size=(vocab, d))
    states, next_ids = [], []
    for _ in range(5):
        ids = rng.integers(0, vocab, size=n)
        x = rng.normal(size=(3, n, d))
        x[2, : n - 1] = 3.0 * table[ids[1:]]  # the last layer sits on e_{t+1}
        states.append(x)
        next_ids.append(ids[1:])
    curve = next_embedding_curve(
        states, next_ids, lambda ids: table[np.asarray(ids)], np.arange(200)
    )
    assert curve.cosine[2] == pytest.approx(1.0)
    assert curve.median_rank_cosine[2] == 1.0 and curve.top1_cosine[2] == 1.0
    assert curve.median_rank_distance[1] > 20 and curve.median_rank_cosine[1] > 20
    assert curve.z[2] > 3 > abs(curve.z[1])
    assert curve.distance[2] > 0  # 3 e, not e: far in distance, aligned in cosine


# --- the causal conformance item's centres ------------------------------------------


def test_renyi_centres_and_strong_centres_in_token_order():
    from tokenfield.pipelines.conformance_causal import renyi_centres

    def circle(angles):
        a = np.asarray(angles)
        return np.stack([np.cos(a), np.sin(a)], axis=1)

    centres, strong = renyi_centres(circle([0.0, 0.4, 0.8, 2.0, 2.1]), 0.5)
    assert centres.tolist() == [True, False, True, True, False]
    assert strong.tolist() == [True, False, False, True, False]  # 0.8 is 0.4 from token 2


def test_the_report_section_renders_the_json_escaped():
    from tokenfield.viz.hypotheses import hypotheses_html_section

    order = {"slope": 0.1, "slope_ci": [0.05, 0.2], "r2": 0.95, "monotone_fraction": 1.0,
             "verdict": "supported"}  # fmt: skip
    layer = {"share_passing": 0.5, "median_gap": 0.1, "median_gap_uniform": 0.3}
    data = {
        "rule": "R^2 >= 0.9 <and> interval excludes 0",
        "order": {"energy_beta_4": order},
        "convex_fit": {"targets": {"next_embedding": [layer, layer]}},
        "next_embedding": {"cosine": [0.1, 0.2, 0.9], "median_rank_cosine": [500, 100, 1]},
        "baseline": {"order": {"energy_beta_4": {**order, "verdict": "not supported (<x>)"}}},
    }
    page = hypotheses_html_section(data)
    assert "&lt;and&gt;" in page and "<and>" not in page
    assert "supported" in page and "not supported (&lt;x&gt;)" in page
    assert page.count("<tr>") == 1 + 1 + 1 + 2 and "0.900" in page


def test_the_command_refuses_bad_input_in_one_line_before_loading_a_model(tmp_path, capsys):
    import json

    from tests._cli import one_error_line, run_cli

    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"kind": "trace", "status": "complete", "config": {}}))
    code, _out, err = run_cli(["hypotheses", tmp_path / "nothing"], capsys)
    assert code == 2 and "not a tokenfield run" in one_error_line(err)
    code, _out, err = run_cli(["hypotheses", run, "--shuffles", "0"], capsys)
    assert code == 2 and "--shuffles must be a positive integer" in one_error_line(err)
    (tmp_path / "file").write_text("x")
    code, _out, err = run_cli(["hypotheses", run, "--out", tmp_path / "file"], capsys)
    assert code == 2 and "is a file, not a directory" in one_error_line(err)
    code, _out, err = run_cli(["hypotheses", run], capsys)  # no prompts: before any model
    assert code == 2 and "fewer than 2 prompts" in one_error_line(err)


def test_the_written_fragment_is_a_report_section(tmp_path):
    """write_hypotheses writes RUN/hypotheses.html beside the JSON, and
    ``tokenfield report --section`` puts its tables into the page."""
    from tokenfield.pipelines.hypotheses import write_hypotheses
    from tokenfield.pipelines.report import write_report

    order = {"slope": -0.0847, "slope_ci": [-0.09, -0.05], "r2": 0.92, "monotone_fraction": 0.0,
             "verdict": "supported"}  # fmt: skip
    layer = {"share_passing": 0.25, "median_gap": 0.1, "median_gap_uniform": 0.3}
    data = {
        "rule": "R^2 >= 0.9",
        "order": {"fuzziness": order},
        "convex_fit": {"targets": {"next_embedding": [layer]}},
        "next_embedding": {"cosine": [0.1, 0.9], "median_rank_cosine": [500, 1]},
    }
    write_hypotheses(data, tmp_path)
    fragment = tmp_path / "hypotheses.html"
    assert "-0.0847" in fragment.read_text()
    page = write_report([], tmp_path / "report.html", sections=[fragment]).read_text()
    assert "hypotheses-order" in page and "-0.0847" in page and "0.25" in page

"""Figures and tables in Jupyter: ``tokenfield.plot`` and the results' ``_repr_html_``.

No model: synthetic trajectories whose answers are known (tests/unit/synthetic_trajectories).
"""

from __future__ import annotations

import base64

import numpy as np
import pytest

import tokenfield as tf
from tests.unit.synthetic_trajectories import clustered, trace_dataset
from tokenfield.errors import UserError
from tokenfield.meanfield.conformance import ItemResult
from tokenfield.steering.evaluate import SteeringEvaluation


@pytest.fixture(scope="module")
def categorised():
    states, categories = clustered(n_per_category=3, n_time=6, n_feature=8, seed=1)
    return trace_dataset(states, categories)


def test_paths_is_the_report_figure_with_one_path_per_particle(categorised):
    result = tf.analyze(categorised, n_permutations=10)
    fig = tf.plot.paths(result, title="t")
    n = categorised.sizes["particle"]
    paths = [trace for trace in fig.data if trace.mode == "lines+markers"]
    assert len(paths) == n
    # each path is the particle's PC1/PC2 coordinates in the analysis frame, every layer
    pc1 = result.pcs.sel(component=1).transpose("time", "particle").values
    np.testing.assert_allclose(paths[0].x, pc1[:, 0], rtol=1e-5)
    assert {trace.legendgroup for trace in paths} == set(categorised["category"].values.tolist())
    assert fig.layout.xaxis.title.text.startswith("PC1 (")
    assert fig.layout.sliders[0].currentvalue.prefix == "layer: "
    # a Dataset is analysed first: the same figure
    again = tf.plot.paths(categorised)
    np.testing.assert_allclose(again.data[0].x, paths[0].x, rtol=1e-5)


def test_energy_is_the_simulation_analysis_against_time():
    sim = tf.simulate(
        tf.Dynamics(beta=4.0), tf.initial_condition("uniform", n=12, d=2, seed=0),
        t_max=1.0, dt=0.05,
    )  # fmt: skip
    analysis = tf.analyze_simulation(sim)
    fig = tf.plot.energy(sim)
    energy, count = fig.data
    np.testing.assert_allclose(energy.x, analysis["time"])
    np.testing.assert_allclose(energy.y, analysis["energy"])
    assert list(count.y) == analysis["cluster_count"]
    assert tf.plot.energy(analysis).data[0].y == energy.y  # the dict itself works too


def test_energy_refuses_a_trace(categorised):
    with pytest.raises(UserError, match="no interaction energy"):
        tf.plot.energy(categorised)


def test_separation_draws_the_measured_silhouette(categorised):
    result = tf.analyze(categorised, n_permutations=10)
    fig = tf.plot.separation(result)
    lines = {line.get_label(): line for line in fig.axes[0].get_lines()}
    np.testing.assert_allclose(lines["run"].get_ydata(), result.separation["silhouette"].values)


def test_separation_and_attention_say_what_is_missing():
    rng = np.random.default_rng(0)
    one_category = trace_dataset(rng.normal(size=(4, 6, 5)), ["a"] * 6)
    with pytest.raises(UserError, match="no category separation"):
        tf.plot.separation(one_category)
    with pytest.raises(UserError, match="no attention statistics"):
        tf.plot.attention(one_category)
    with pytest.raises(UserError, match="expected a run directory or a trajectory Dataset"):
        tf.plot.paths(42)


def test_run_analysis_html_is_the_summary_table(categorised):
    result = tf.analyze(categorised, baseline=categorised, n_permutations=10)
    page = result._repr_html_()
    assert '<table class="tokenfield"><caption>RunAnalysis: trace of synthetic,' in page
    categorised.attrs["run"]["config"]["model"] = {"name": "smollm2", "source_hash": "sha256:ab"}
    try:  # a real trace records its model as a dict: the caption names it
        named = tf.analyze(categorised, n_permutations=10)._repr_html_()
    finally:
        categorised.attrs["run"]["config"]["model"] = "synthetic"
    assert "<caption>RunAnalysis: trace of smollm2, 15 particles" in named
    assert "source_hash" not in named
    assert "<th>baseline</th>" in page
    best = result.to_dict()["separation"]["best"]["silhouette"]
    assert f"<td>{best:.3f} (" in page  # the best silhouette, as in the report's table
    assert page.count("<tr>") == 1 + len(tf.analysis.summary_rows(result.to_dict()))


def test_conformance_item_html_escapes_and_shows_the_verdict():
    item = ItemResult("pde", "rate < 1", "rate <b>0.5</b>", "10%", passed=False, seconds=1.25)
    page = item._repr_html_()
    assert "<td>FAIL</td>" in page and "&lt;b&gt;0.5&lt;/b&gt;" in page and "<td>1.2" in page


def test_steering_evaluation_html_names_the_controls_and_the_verdict():
    result = SteeringEvaluation(
        word={"accuracy": 0.1, "n": 10, "ci95": [0.02, 0.4]},
        math={"accuracy": 0.5, "n": 10, "ci95": [0.2, 0.8]},
        steered={"layer": 3, "alpha": 2.0, "accuracy": 0.3, "n": 10, "ci95": [0.1, 0.6]},
        control_summary={"k": 4, "max": 0.35, "p_empirical": 0.4},
        label_shuffle={"accuracies": [0.1, 0.2]},
        centroid_halves={"accuracies": [0.25]},
        mcnemar_p=0.5,
        verdict="does not support",
        verdict_reasons=["steered accuracy 0.3 does not beat the 4 random-direction controls"],
    )
    page = result._repr_html_()
    assert "the claim is does not support" in page
    assert "0.300 [0.100, 0.600] (n = 10)" in page
    assert "max 0.350, empirical p = 0.4" in page and "max 0.200 over 2" in page
    assert "max 0.250 over 1" in page and "does not beat the 4 random-direction" in page
    import json

    assert json.loads(json.dumps(result))["verdict"] == "does not support"  # still a plain dict


def test_matplotlib_figures_display_as_png_in_ipython(categorised):
    interactive = pytest.importorskip("IPython.core.interactiveshell")
    shell = interactive.InteractiveShell.instance()
    try:
        fig = tf.plot.separation(tf.analyze(categorised, n_permutations=10))
        data, _metadata = shell.display_formatter.format(fig)
    finally:
        interactive.InteractiveShell.clear_instance()
    png = data["image/png"]  # base64 text in recent IPython, bytes in older ones
    raw = base64.b64decode(png) if isinstance(png, str) else png
    assert raw[:4] == b"\x89PNG"

"""The whole analysis of a run: traces, simulations, baselines, particle selection."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.unit.synthetic_trajectories import (
    clustered,
    split_groups,
    straight_lines,
    trace_dataset,
)
from tokenfield.analysis import analyze, select_particles, summary_rows


def small_seed_like(seed: int = 0):
    states, labels = clustered(n_per_category=3, n_time=9, n_feature=48, seed=seed)
    return trace_dataset(states, labels)


def test_metrics_are_strict_json_with_every_section():
    result = analyze(small_seed_like(), n_permutations=20)
    metrics = result.to_metrics()
    text = json.dumps(metrics, allow_nan=False)  # NaN became null
    assert json.loads(text)["info"]["n_particles"] == 15
    for key in (
        "projection",
        "depth_ordering",
        "kinematics",
        "separation",
        "centroid_distances",
        "bifurcation",
        "particles",
    ):
        assert key in metrics
    assert len(metrics["particles"]) == 15
    assert metrics["particles"][0]["label"] == "1"
    assert metrics["separation"]["n_permutations"] == 20
    # the seed's convention (default): times 0..L-1, the raw last block (time 8) left out
    assert set(metrics["centroid_distances"]["by_time"]) >= {"0", "7"}
    assert metrics["projection"]["times"] == list(range(8))
    assert metrics["info"]["categories"] == {c: 3 for c in sorted(set(result.pcs.category.values))}


def test_known_answers_survive_the_pipeline():
    states, labels = split_groups(split_at=7)
    metrics = analyze(trace_dataset(states, labels), n_permutations=50).to_metrics()
    assert {row["split_layer"] for row in metrics["particles"]} == {7}
    assert metrics["bifurcation"]["category_split_layer"] == {"a": 7, "b": 7}
    best = metrics["separation"]["best"]
    assert best["silhouette"] > 0.9 > best["silhouette_null_high"]


def test_simulation_like_runs_skip_category_measures():
    ds = trace_dataset(straight_lines(n_particle=5), None, time=np.linspace(0.0, 2.2, 12))
    result = analyze(ds)
    assert result.info["kind"] == "simulation"
    assert result.separation is None and result.bifurcation is None and result.centroids is None
    metrics = result.to_metrics()
    assert "separation" not in metrics
    assert metrics["depth_ordering"]["median_spearman"] == pytest.approx(1.0)
    assert metrics["kinematics"]["step"][0] == pytest.approx(0.2)
    velocity = metrics["kinematics"]["median_velocity_dpc2_dpc1"]
    # the paths run along PC1: no slope in the PC plane
    assert len(velocity) == 11 and max(abs(v) for v in velocity) < 1e-3


def test_a_batch_of_simulated_systems_uses_the_first():
    one = trace_dataset(straight_lines(n_particle=4), None)
    batch = one.expand_dims(system=2).transpose("system", "time", "particle", "feature")
    result = analyze(batch)
    assert result.info["system"] == 0
    np.testing.assert_allclose(result.pcs.values, analyze(one).pcs.values, atol=1e-4)


def test_baseline_is_reported_side_by_side():
    result = analyze(small_seed_like(), baseline=small_seed_like(seed=3), n_permutations=10)
    metrics = result.to_metrics()
    assert "baseline" in metrics and "baseline" not in metrics["baseline"]
    rows = summary_rows(metrics)
    assert rows and all(base is not None for _, _, base in rows)


def test_sphere_and_per_layer_options():
    result = analyze(small_seed_like(), sphere=True, per_layer=True, n_permutations=5)
    assert result.frame.sphere and result.to_metrics()["projection"]["sphere"]
    assert result.per_layer_pcs.sizes["time"] == 8  # times 0..L-1 (the seed convention)
    assert len(result.to_metrics()["per_layer_projection"]["explained_variance_ratio_pc1"]) == 8


def test_last_token_selection():
    states, labels = clustered(n_per_category=2, n_time=4, n_feature=8)
    ds = trace_dataset(states, labels)
    is_last = np.array([i % 2 == 1 for i in range(ds.sizes["particle"])])
    ds = ds.assign_coords(is_last=("particle", is_last))
    assert select_particles(ds).sizes["particle"] == is_last.sum()
    assert select_particles(ds, "all").sizes["particle"] == ds.sizes["particle"]
    assert analyze(ds, n_permutations=0).info["n_particles"] == is_last.sum()


def test_time_conventions_are_named_recorded_and_both_reported():
    ds = small_seed_like()
    seed = analyze(ds, n_permutations=0).to_metrics()
    every = analyze(ds, n_permutations=0, times="all").to_metrics()
    assert seed["options"]["times"] == "seed" and every["options"]["times"] == "all"
    assert seed["projection"]["times"] == list(range(8))
    assert every["projection"]["times"] == list(range(9))
    assert seed["info"]["time_last"] == 7 and every["info"]["time_last"] == 8
    # PC1-vs-depth under both conventions, whichever one the analysis uses
    for metrics in (seed, every):
        by_times = metrics["depth_ordering"]["by_times"]
        assert set(by_times) == {"seed", "all"}
    assert seed["depth_ordering"]["by_times"] == every["depth_ordering"]["by_times"]
    own = seed["depth_ordering"]["by_times"]["seed"]["overall_spearman"]
    assert own == seed["depth_ordering"]["overall_spearman"]
    assert (
        every["depth_ordering"]["by_times"]["all"]["overall_spearman"]
        == (every["depth_ordering"]["overall_spearman"])
    )


def test_the_last_block_changes_the_depth_ordering_when_it_jumps():
    """A last block that throws every path back (as a real final block's norm jump
    can) lowers Spearman(PC1, layer) only under the 'all' convention."""
    states, labels = clustered(n_per_category=3, n_time=9, n_feature=48, seed=0)
    ramp = np.linspace(0.0, 40.0, 9)
    states = states.copy()
    states[..., 0] += ramp[:, None]
    states[-1, :, 0] = -60.0  # the raw last block: far back along the depth axis
    metrics = analyze(trace_dataset(states, labels), n_permutations=0).to_metrics()
    by = metrics["depth_ordering"]["by_times"]
    assert by["seed"]["overall_spearman"] > 0.95
    assert by["all"]["overall_spearman"] < by["seed"]["overall_spearman"] - 0.1


def test_simulations_use_every_time_whatever_the_convention():
    ds = trace_dataset(straight_lines(n_particle=5), None, time=np.linspace(0.0, 2.2, 12))
    metrics = analyze(ds, times="seed").to_metrics()
    assert metrics["options"]["times"] == "all"
    assert len(metrics["projection"]["times"]) == 12
    assert metrics["depth_ordering"]["by_times"] == {}


def test_unknown_time_convention_is_a_user_error():
    from tokenfield.errors import UserError

    with pytest.raises(UserError, match="time convention"):
        analyze(small_seed_like(), times="last")

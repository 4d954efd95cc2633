"""The PCA frame: fit, save/load, project, options, and PC1 as time."""

from __future__ import annotations

import numpy as np
import pytest

from tests.unit.synthetic_trajectories import clustered, straight_lines, trace_dataset
from tokenfield.analysis import depth_ordering, fit_projection, load_projection, project
from tokenfield.errors import UserError


def test_straight_line_flow_pc1_is_time():
    ds = trace_dataset(straight_lines(), ["a", "a", "a", "b", "b", "b"])
    frame = fit_projection(ds)
    assert frame.explained_variance_ratio[0] > 0.99
    pcs = project(ds, frame)
    assert pcs.dims == ("time", "particle", "component")
    assert np.all(np.diff(pcs.sel(component=1).values, axis=0) > 0)  # oriented: time flows right
    depth = depth_ordering(pcs)
    np.testing.assert_allclose(depth.per_particle.values, 1.0)
    # pooled over particles, ties in time against small offsets in PC1 keep it just below 1
    assert depth.overall > 0.99
    assert depth.median == pytest.approx(1.0)


def test_pc1_orientation_follows_time_even_for_a_reversed_flow():
    ds = trace_dataset(-straight_lines(), ["a"] * 6)
    depth = depth_ordering(project(ds, fit_projection(ds)))
    np.testing.assert_allclose(depth.per_particle.values, 1.0)


def test_no_ordering_gives_spearman_near_zero():
    rng = np.random.default_rng(3)
    ds = trace_dataset(rng.normal(size=(30, 20, 8)), ["a"] * 20)
    assert abs(depth_ordering(project(ds, fit_projection(ds))).overall) < 0.1


def test_save_load_roundtrip_and_reuse_in_another_run(tmp_path):
    states, labels = clustered(n_time=6, n_feature=32, n_per_category=3)
    ds = trace_dataset(states, labels)
    frame = fit_projection(ds, sphere=True, n_components=4)
    frame.save(tmp_path / "projection.npz")
    loaded = load_projection(tmp_path)  # a run directory works too
    assert loaded.sphere and not loaded.per_layer and loaded.n_components == 4
    np.testing.assert_array_equal(loaded.components, frame.components)
    np.testing.assert_allclose(project(ds, loaded).values, project(ds, frame).values)
    # a "steered" run is drawn in the reference frame, not its own
    other = trace_dataset(states * 1.5 + 0.1, labels)
    assert project(other, loaded).shape == (6, 15, 4)


def test_projection_is_linear_in_the_states():
    states, labels = clustered(n_time=5, n_feature=24, n_per_category=2)
    ds = trace_dataset(states, labels)
    frame = fit_projection(ds)
    shift = np.random.default_rng(0).normal(size=24)
    moved = project(trace_dataset(states + shift, labels), frame)
    expected = project(ds, frame).values + frame.components @ shift
    np.testing.assert_allclose(moved.values, expected, rtol=1e-4, atol=1e-3)


def test_sphere_option_ignores_norms():
    states, labels = clustered(n_time=8, n_feature=32, n_per_category=3)
    scale = np.random.default_rng(1).uniform(0.1, 100, size=states.shape[:2])[..., None]
    a = project(
        trace_dataset(states, labels), fit_projection(trace_dataset(states, labels), sphere=True)
    )
    scaled = trace_dataset(states * scale, labels)
    b = project(scaled, fit_projection(scaled, sphere=True))
    np.testing.assert_allclose(np.abs(a.values), np.abs(b.values), atol=1e-4)


def test_final_norm_is_excluded_by_default_and_optional():
    states, labels = clustered(n_time=7, n_feature=16, n_per_category=2)
    ds = trace_dataset(states, labels)
    default = project(ds, fit_projection(ds))
    assert default.sizes["time"] == 7 and not default["is_final_norm"].values.any()
    frame = fit_projection(ds, include_final_norm=True)
    with_final = project(ds, frame)
    assert with_final.sizes["time"] == 8
    assert with_final["is_final_norm"].values.tolist() == [False] * 7 + [True]


def test_the_final_norm_step_is_left_out_of_the_depth_ordering():
    states, labels = clustered(n_time=7, n_feature=16, n_per_category=2)
    states = states.copy()
    states[..., 0] += np.linspace(0.0, 300.0, 7)[:, None]  # PC1 orders the layers
    ds = trace_dataset(states, labels)  # final norm = last state / rms: back near the origin
    with_final = project(ds, fit_projection(ds, include_final_norm=True))
    blocks = with_final.isel(time=~with_final["is_final_norm"].values)
    d_with, d_blocks = depth_ordering(with_final), depth_ordering(blocks)
    assert d_with.overall == d_blocks.overall > 0.9
    np.testing.assert_array_equal(d_with.per_particle.values, d_blocks.per_particle.values)
    # counted as one more time step it would spoil the ordering: the exclusion is what matters
    counted = with_final.drop_vars("is_final_norm").assign_coords(time=np.arange(8))
    assert depth_ordering(counted).overall < d_blocks.overall - 0.05


def test_per_layer_frames():
    states, labels = clustered(n_time=5, n_feature=16, n_per_category=4)
    ds = trace_dataset(states, labels)
    frame = fit_projection(ds, per_layer=True, n_components=3)
    assert frame.components.shape == (5, 3, 16)
    assert frame.explained_variance_ratio.shape == (5, 3)
    pcs = project(ds, frame)
    for t in range(5):
        layer = pcs.isel(time=t).values
        np.testing.assert_allclose(layer.mean(axis=0), 0.0, atol=1e-3 * np.abs(layer).max())
        assert np.var(layer[:, 0]) >= np.var(layer[:, 1]) >= np.var(layer[:, 2])
    assert np.isnan(depth_ordering(pcs).overall)  # frames unrelated across layers


def test_bad_inputs_raise_user_errors(tmp_path):
    states, labels = clustered(n_time=4, n_feature=16, n_per_category=2)
    frame = fit_projection(trace_dataset(states, labels))
    other = trace_dataset(np.zeros((4, 3, 8)), ["a", "b", "b"])
    with pytest.raises(UserError, match="features"):
        project(other, frame)
    with pytest.raises(UserError, match="no saved projection"):
        load_projection(tmp_path)

"""Observables on any trajectory: energy, clusters, diameter, plateaus, merges."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import xarray as xr

from tokenfield.analysis import _frames
from tokenfield.analysis.clusters import (
    cluster_count,
    cluster_masses,
    clusters,
    count_changes,
    diameter,
    merge_times,
    min_inner_product,
    plateaus,
)
from tokenfield.analysis.energy import energy
from tokenfield.analysis.simulation import analyze_simulation
from tokenfield.errors import UserError
from tokenfield.particles import Dynamics, SaveAt, simulate
from tokenfield.particles.init import caps, uniform


def _dense_energy(x, beta):
    x = x / np.linalg.norm(x, axis=-1, keepdims=True)
    return np.exp(beta * x @ x.T).sum()


def test_energy_normalizations_agree_with_the_formulas():
    x = uniform(9, 4, seed=1).numpy()
    beta, n = 1.7, 9
    total = _dense_energy(x, beta)
    assert math.isclose(energy(x, beta), total / (2 * beta * n * n), rel_tol=1e-13)
    assert math.isclose(energy(x, beta, normalization="mean"), total / (2 * n * n), rel_tol=1e-13)
    assert math.isclose(
        energy(x, beta, normalization="normalized"), total * math.exp(-beta) / n**2, rel_tol=1e-13
    )
    sq = ((x[:, None] - x[None]) ** 2).sum(-1)
    assert math.isclose(
        energy(x, beta, normalization="gaussian"), 0.5 * np.exp(-beta * sq / 2).sum(), rel_tol=1e-12
    )
    # one point: normalized energy is 1; scaling the states changes nothing
    assert math.isclose(energy(np.tile(x[:1], (5, 1)), 3.0, normalization="normalized"), 1.0)
    assert math.isclose(energy(7 * x, beta), energy(x, beta), rel_tol=1e-13)
    a = np.diag([1.0, 0.5, 2.0, 0.1])
    assert math.isclose(
        energy(x, beta, bilinear=a),
        np.exp(beta * x @ a @ x.T).sum() / (2 * beta * n * n),
        rel_tol=1e-13,
    )


def test_energy_blocks_large_beta_and_leading_dims(monkeypatch):
    x = uniform(50, 3, seed=2, batch=4).numpy()  # (4, 50, 3)
    whole = energy(x, 2.0)
    monkeypatch.setattr(_frames, "BLOCK_BYTES", 8 * 50 * 7)  # 7 rows per block
    assert whole.shape == (4,)
    assert np.allclose(energy(x, 2.0), whole, rtol=1e-13)
    big = energy(x[0], 600.0, normalization="normalized")  # exp(600) alone overflows nothing here
    assert 0 < big <= 1
    with pytest.raises(UserError):
        energy(x, 0.0)
    with pytest.raises(UserError):
        energy(x, float("nan"))


def test_cluster_count_on_constructed_configurations():
    x = caps(40, 3, k=4, cap_radius=0.05, seed=0).numpy()
    assert cluster_count(x, eps=1e-2) == 4
    assert cluster_count(x, eps=0.0) == 40  # nothing is linked at eps = 0 but identical points
    assert cluster_count(x, eps=2.0) == 1  # everything is linked
    result = clusters(x, eps=1e-2)
    assert result.count == 4 and np.allclose(result.masses, 0.25)
    assert np.array_equal(np.bincount(result.labels), [10, 10, 10, 10])
    uneven = np.concatenate([x[:1].repeat(5, 0), x[1:2].repeat(2, 0), x[2:3]])
    assert np.allclose(cluster_masses(uneven), [5 / 8, 2 / 8, 1 / 8])
    assert clusters(uneven).labels.tolist() == [0] * 5 + [1] * 2 + [2]
    assert cluster_count(13.0 * x, eps=1e-2) == 4  # scale-free: real states are not unit


def test_cluster_count_threshold_is_the_inner_product():
    angle = 0.1
    chain = np.array([[math.cos(k * angle), math.sin(k * angle), 0.0] for k in range(6)])
    eps_link = 1 - math.cos(angle)
    assert cluster_count(chain, eps=eps_link * 1.001) == 1  # a chain links transitively
    assert cluster_count(chain, eps=eps_link * 0.999) == 6


def test_cluster_count_blocked_equals_dense(monkeypatch):
    x = uniform(300, 3, seed=4).numpy()
    expected = [cluster_count(x, eps) for eps in (0.001, 0.01, 0.05, 0.2)]
    monkeypatch.setattr(_frames, "BLOCK_BYTES", 8 * 300 * 13)  # 13 rows per block
    assert [cluster_count(x, eps) for eps in (0.001, 0.01, 0.05, 0.2)] == expected
    assert len(set(expected)) > 1


def test_works_on_dataarrays_over_time():
    dyn = Dynamics(beta=9.0, normalization="usa", time="rescaled")
    ds = simulate(dyn, uniform(32, 2, seed=1), t_max=20.0, dt=0.1, saveat=SaveAt(every=20))
    counts = cluster_count(ds.states, eps=1e-4)
    assert counts.dims == ("time",) and counts.sizes["time"] == ds.sizes["time"]
    assert counts.values[0] == 32 and counts.values[-1] < 32
    assert np.allclose(counts.time.values, ds.time.values)
    energies = energy(ds, 9.0)
    assert energies.dims == ("time",) and np.all(np.diff(energies.values) >= 0)
    inner = min_inner_product(ds.states)
    assert np.allclose(diameter(ds.states), np.sqrt(2 - 2 * inner), atol=1e-12)


def test_diameter_and_min_inner_product():
    x = np.array([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]])
    assert min_inner_product(x) == -1.0
    assert math.isclose(diameter(x), 2.0)
    assert min_inner_product(x[:1]) == 1.0 and diameter(x[:1]) == 0.0


def test_plateaus_and_merges():
    counts = [8, 8, 5, 5, 5, 5, 3, 3, 3, 1]
    times = np.arange(10) * 0.5
    found = plateaus(counts, times)
    assert [(p.count, p.start, p.end) for p in found] == [
        (8, 0.0, 1.0),
        (5, 1.0, 3.0),
        (3, 3.0, 4.5),
        (1, 4.5, 4.5),
    ]
    assert [p.count for p in plateaus(counts, times, min_duration=1.5)] == [5, 3]
    assert merge_times(counts, times).tolist() == [1.0, 3.0, 4.5]
    changes = count_changes([3, 4, 2], [0.0, 1.0, 2.0])
    assert [(c.before, c.after, c.is_merge) for c in changes] == [(3, 4, False), (4, 2, True)]
    as_array = xr.DataArray(np.array(counts), dims="time", coords={"time": times})
    assert plateaus(as_array) == found
    with pytest.raises(UserError):
        plateaus([1, 2], [0.0, 0.0])


def test_analyze_simulation_is_json_and_sees_metastability():
    ds = simulate(
        Dynamics(beta=9.0, normalization="sa"),
        uniform(48, 2, seed=3),
        t_max=40.0,
        dt=0.1,
        solver="rk4",
        saveat=SaveAt(every=10),
    )
    result = analyze_simulation(ds, eps=1e-3)
    json.dumps(result, allow_nan=False)
    assert result["beta"] == 9.0 and result["energy_normalization"] == "glpr"
    assert result["energy_nondecreasing"] is True
    assert result["final"]["cluster_count"] < result["cluster_count"][0] / 4
    assert math.isclose(sum(result["final"]["cluster_masses"]), 1.0)
    # d = 2, beta = 9: a few clusters that then sit still for a long time
    longest = max(result["metastable"], key=lambda p: p["duration"])
    assert longest["duration"] > 0.5 * 40.0 and 2 <= longest["count"] <= 6
    assert all(m["time"] > 0 for m in result["merges"])
    batched = simulate(Dynamics(beta=1.0), uniform(6, 3, seed=0, batch=2), t_max=0.5, dt=0.1)
    both = analyze_simulation(batched)
    assert len(both["systems"]) == 2


def test_simulation_figures(tmp_path):
    ds = simulate(
        Dynamics(beta=4.0, normalization="usa"),
        uniform(16, 3, seed=0),
        t_max=2.0,
        dt=0.1,
        saveat=SaveAt(every=4),
    )
    from tokenfield.viz.simulation import write_simulation_figures

    paths = write_simulation_figures(
        analyze_simulation(ds), ds, tmp_path / "figures", formats=("png",)
    )
    names = sorted(p.name for p in paths)
    assert names == [
        "simulation_clusters_energy.png",
        "simulation_particles.gif",
        "simulation_particles.png",
    ]
    assert all(p.stat().st_size > 0 for p in paths)
    for d in (2, 5):
        sim = simulate(Dynamics(beta=1.0), uniform(10, d, seed=1), t_max=0.3, dt=0.1)
        write_simulation_figures(
            analyze_simulation(sim), sim, tmp_path / f"d{d}", formats=("png",), gif=d == 5
        )

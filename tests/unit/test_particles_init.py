"""Initial conditions: seeded clouds on the sphere and a real run's tokens."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import xarray as xr

from tokenfield.analysis.clusters import cluster_count
from tokenfield.errors import UserError
from tokenfield.particles.init import caps, equispaced, initial_condition, orthogonal, uniform
from tokenfield.runs import RunWriter


@pytest.mark.parametrize("spec", ["uniform", "equispaced", "orthogonal", "caps"])
def test_synthetic_inits_are_unit_seeded_and_shaped(spec):
    a = initial_condition(spec, 6, 8, seed=3, noise=0.01)
    b = initial_condition(spec, 6, 8, seed=3, noise=0.01)
    c = initial_condition(spec, 6, 8, seed=4, noise=0.01)
    assert a.shape == (6, 8) and a.dtype == torch.float64
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert (a.norm(dim=-1) - 1).abs().max() < 1e-14
    batch = initial_condition(spec, 6, 8, seed=3, batch=2, dtype=torch.float32)
    assert batch.shape == (2, 6, 8) and batch.dtype == torch.float32


def test_shapes_of_each_kind():
    x = equispaced(8, 3)
    angles = np.angle(x[:, 0].numpy() + 1j * x[:, 1].numpy())
    assert np.allclose(np.diff(np.unwrap(angles)), 2 * math.pi / 8)
    assert x[:, 2].abs().max() == 0
    o = orthogonal(4, 6, seed=0)
    assert torch.allclose(o @ o.T, torch.eye(4, dtype=torch.float64), atol=1e-14)
    c = caps(30, 3, k=3, cap_radius=0.1, seed=0)
    assert cluster_count(c.numpy(), eps=1 - math.cos(0.25)) == 3
    u = uniform(4000, 3, seed=0)
    assert u.mean(0).abs().max() < 0.05  # roughly uniform


def test_bad_inits_raise():
    with pytest.raises(UserError, match="orthogonal"):
        orthogonal(5, 3)
    for make in (
        lambda: initial_condition("uniform", 0, 3),
        lambda: initial_condition("uniform", 4, 1),
        lambda: initial_condition("spiral", 4, 3),
        lambda: initial_condition("uniform", 4, 3, noise=-1.0),
        lambda: caps(4, 3, k=0),
        lambda: initial_condition("run:", None, None),
    ):
        with pytest.raises(UserError):
            make()


@pytest.fixture
def trace_run(tmp_path):
    """A tiny run in the trace layout: 2 prompts (3 and 4 tokens), 3 layers, 10 features."""
    rng = np.random.default_rng(0)
    states = rng.standard_normal((3, 7, 10)).astype(np.float32) * 5
    ds = xr.Dataset(
        {"states": (("time", "particle", "feature"), states)},
        coords={
            "time": np.arange(3),
            "particle": np.arange(7),
            "prompt_index": ("particle", np.array([0, 0, 0, 1, 1, 1, 1])),
        },
    )
    writer = RunWriter(tmp_path / "trace", "trace", {"model": "toy"}, append_dim="particle")
    writer.append(ds, done=2)
    writer.finish()
    return tmp_path / "trace", states


def test_init_from_a_traced_run(trace_run):
    path, states = trace_run
    x = initial_condition(f"run:{path}@2", None, None, prompt_index=1)
    expected = states[2, 3:].astype(np.float64)
    expected /= np.linalg.norm(expected, axis=1, keepdims=True)
    assert x.shape == (4, 10)
    assert np.allclose(x.numpy(), expected, atol=1e-7)
    first = initial_condition(f"run:{path}", None, None)  # layer 0, prompt 0
    assert first.shape == (3, 10)
    last = initial_condition(f"run:{path}@-1", None, None)
    assert np.allclose(last.numpy()[0], states[2, 0] / np.linalg.norm(states[2, 0]), atol=1e-6)


def test_init_from_a_run_projected_to_fewer_dimensions(trace_run):
    path, states = trace_run
    x = initial_condition(f"run:{path}@1", None, 3, prompt_index=1)
    assert x.shape == (4, 3)
    assert (x.norm(dim=-1) - 1).abs().max() < 1e-14
    # with d = rank, the projection keeps every inner product
    full = initial_condition(f"run:{path}@1", None, None, prompt_index=1).numpy()
    kept = initial_condition(f"run:{path}@1", None, 4, prompt_index=1).numpy()
    assert np.allclose(full @ full.T, kept @ kept.T, atol=1e-12)


@pytest.mark.parametrize(
    ("spec", "kwargs"),
    [
        ("run:{path}@7", {}),
        ("run:{path}@x", {}),
        ("run:{path}", {"prompt_index": 9}),
        ("run:{path}", {"n": 5}),
        ("run:{path}", {"d": 11}),
        ("run:{path}/missing", {}),
    ],
)
def test_bad_run_inits_raise(trace_run, spec, kwargs):
    path, _ = trace_run
    n, d = kwargs.pop("n", None), kwargs.pop("d", None)
    with pytest.raises(UserError):
        initial_condition(spec.format(path=path), n, d, **kwargs)

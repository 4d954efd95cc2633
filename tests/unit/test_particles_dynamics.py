"""The vector field: fast kernel vs a dense reference, gradient structure, symmetries."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tokenfield.analysis.energy import energy
from tokenfield.errors import UserError
from tokenfield.particles import Dynamics, Mlp, SaveAt, random_matrices, simulate
from tokenfield.particles.init import uniform
from tokenfield.particles.kernels import (
    _usa_phantom,
    attention,
    attention_chunked,
    attention_dense,
)

# Tolerances in one table.
TOL = {
    "kernel": 1e-12,  # fused kernel vs dense n x n reference (float64)
    "gradient": 1e-12,  # USA velocity vs n * projected autograd gradient
    "sphere": 1e-10,  # | |x_i| - 1 | over a long run
    "energy_step": 1e-12,  # allowed relative decrease of a monotone energy per saved step
    "equivariance": 1e-12,
    "beta0": 1e-14,
}


def dense_field(x, beta, normalization, q=None, k=None, v=None, causal=False, log_scale=0.0):
    """Naive numpy reference: every n x n matrix built explicitly, heads averaged."""
    x = np.asarray(x, dtype=np.float64)
    n, d = x.shape[-2:]
    eye = np.eye(d)[None]
    q = eye if q is None else np.asarray(q).reshape(-1, d, d)
    k = eye if k is None else np.asarray(k).reshape(-1, d, d)
    v = eye if v is None else np.asarray(v).reshape(-1, d, d)
    heads = max(len(q), len(k), len(v))
    total = np.zeros_like(x)
    for h in range(heads):
        qh, kh, vh = (m[h % len(m)] for m in (q, k, v))
        weights = np.exp(beta * (x @ qh.T) @ (x @ kh.T).swapaxes(-1, -2))  # (..., n, n)
        if causal:
            weights = weights * np.tril(np.ones((n, n)))
        if normalization == "sa":
            weights = weights / weights.sum(-1, keepdims=True)
        else:
            weights = weights * math.exp(log_scale) / n
        total += weights @ (x @ vh.T)
    total /= heads
    return total - (total * x).sum(-1, keepdims=True) * x


CASES = [
    pytest.param({}, id="identity"),
    pytest.param({"causal": True}, id="causal"),
    pytest.param({"matrices": 1}, id="qkv"),
    pytest.param({"matrices": 3}, id="multihead"),
    pytest.param({"matrices": 3, "causal": True}, id="multihead-causal"),
]


@pytest.mark.parametrize("normalization", ["sa", "usa"])
@pytest.mark.parametrize("case", CASES)
def test_fast_field_matches_dense_reference(normalization, case):
    d, n = 4, 13
    x = uniform(n, d, seed=3, batch=2)  # (2, n, d): a batch too
    q = k = v = None
    if case.get("matrices"):
        q, k, v = (random_matrices(d, heads=case["matrices"], seed=s, scale=1.3) for s in (1, 2, 3))
    causal = case.get("causal", False)
    dyn = Dynamics(beta=1.7, normalization=normalization, query=q, key=k, value=v, causal=causal)
    fast = dyn.vector_field(0.0, x).numpy()
    ref = dense_field(x.numpy(), 1.7, normalization, q, k, v, causal)
    assert np.abs(fast - ref).max() < TOL["kernel"]


@pytest.mark.parametrize("usa_method", ["phantom", "logsumexp"])
def test_both_usa_methods_match_dense(usa_method):
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 37, 5, dtype=torch.float64, generator=gen) for _ in range(3))
    for causal in (False, True):
        dense = attention_dense(q, k, v, beta=0.8, normalization="usa", causal=causal)
        for chunk in (1, 5, 64):
            fast = attention(
                q, k, v, beta=0.8, normalization="usa", causal=causal, chunk_size=chunk,
                usa_method=usa_method,
            )  # fmt: skip
            # unnormalised Gaussian q, k: outputs reach ~1e2, so compare relatively
            assert (fast - dense).abs().max() < TOL["kernel"] * dense.abs().max()


def test_phantom_underflow_falls_back_to_logsumexp():
    """Query 0 is far from its own key and close to key 1: its phantom share
    e^{beta c_0} / Z_0 = e^{-600 sqrt 2} underflows float64."""
    r = 1 / math.sqrt(2)
    q = torch.tensor([[[r, r], [0.0, 1.0]]], dtype=torch.float64)
    k = torch.tensor([[[-1.0, 0.0], [0.0, 1.0]]], dtype=torch.float64)
    v = torch.randn(1, 2, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    beta = 600.0
    assert not torch.isfinite(_usa_phantom(q, k, v, beta, False, -beta)).all()
    out = attention(q, k, v, beta=beta, normalization="usa", log_scale=-beta)
    expected = attention(
        q, k, v, beta=beta, normalization="usa", log_scale=-beta, usa_method="logsumexp"
    )
    assert torch.isfinite(out).all() and torch.equal(out, expected)


def test_chunked_fallback_matches_dense():
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 29, 4, dtype=torch.float64, generator=gen) * 0.5 for _ in range(3))
    for normalization in ("sa", "usa"):
        for causal in (False, True):
            dense = attention_dense(
                q, k, v, beta=1.1, normalization=normalization, causal=causal, log_scale=-0.3
            )
            for chunk in (1, 4, None):
                fast = attention_chunked(
                    q,
                    k,
                    v,
                    beta=1.1,
                    normalization=normalization,
                    causal=causal,
                    log_scale=-0.3,
                    chunk_size=chunk,
                )
                assert (fast - dense).abs().max() < TOL["kernel"]


def test_rescaled_time_scales_usa_only():
    x = uniform(9, 3, seed=0)
    for normalization, factor in (("usa", math.exp(-2.5)), ("sa", 1.0)):
        paper = Dynamics(beta=2.5, normalization=normalization).vector_field(0, x)
        rescaled = Dynamics(beta=2.5, normalization=normalization, time="rescaled").vector_field(
            0, x
        )
        assert torch.allclose(rescaled, factor * paper, rtol=1e-13, atol=0)


def test_beta_zero_sa_equals_usa():
    x = uniform(11, 5, seed=4)
    q, k, v = (random_matrices(5, heads=2, seed=s) for s in (7, 8, 9))
    for matrices in ({}, {"query": q, "key": k, "value": v}):
        sa = Dynamics(beta=0.0, normalization="sa", **matrices).vector_field(0, x)
        usa = Dynamics(beta=0.0, normalization="usa", **matrices).vector_field(0, x)
        assert (sa - usa).abs().max() < TOL["beta0"]
    x0 = uniform(11, 3, seed=1)
    runs = [
        simulate(Dynamics(beta=0.0, normalization=m), x0, t_max=2.0, dt=0.1, solver="rk4")
        for m in ("sa", "usa")
    ]
    assert np.abs(runs[0].states.values - runs[1].states.values).max() < 1e-13


def _energy_torch(x, beta, bilinear=None):
    n = x.shape[-2]
    a = torch.eye(x.shape[-1], dtype=x.dtype) if bilinear is None else bilinear
    return torch.exp(beta * x @ a @ x.T).sum() / (2 * beta * n * n)


@pytest.mark.parametrize("symmetric", [False, True])
def test_usa_velocity_is_n_times_projected_gradient(symmetric):
    n, d, beta = 10, 4, 1.9
    x = uniform(n, d, seed=5).requires_grad_(True)
    if symmetric:
        m = random_matrices(d, seed=11)[0]
        dyn = Dynamics(beta=beta, normalization="usa", query=m, key=m, value=m.T @ m)
        bilinear = m.T @ m
    else:
        dyn, bilinear = Dynamics(beta=beta, normalization="usa"), None
    (grad,) = torch.autograd.grad(_energy_torch(x, beta, bilinear), x)
    x = x.detach()
    projected = grad - (grad * x).sum(-1, keepdim=True) * x
    assert (dyn.vector_field(0, x) - n * projected).abs().max() < TOL["gradient"]


def _monotone(values, sign):
    diffs = sign * np.diff(values)
    return bool(np.all(diffs >= -TOL["energy_step"] * np.abs(values[:-1])))


@pytest.mark.parametrize("normalization", ["sa", "usa"])
def test_energy_monotone_along_the_flow(normalization):
    n, d, beta = 24, 3, 2.0
    x0 = uniform(n, d, seed=2)
    m = random_matrices(d, seed=21)[0]
    m = m / torch.linalg.matrix_norm(m, ord=2)  # |Q^T K| <= 1 keeps the field moderate
    a = (m.T @ m).numpy()
    cases = [
        (Dynamics(beta=beta, normalization=normalization), None, +1),
        (Dynamics(beta=beta, normalization=normalization, query=m, key=m, value=m.T @ m), a, +1),
        (Dynamics(beta=beta, normalization=normalization, value=-torch.eye(d)), None, -1),
    ]
    for dyn, bilinear, sign in cases:
        ds = simulate(dyn, x0, t_max=6.0, dt=0.02, solver="rk4", saveat=SaveAt(every=5))
        values = energy(ds.states, beta, bilinear=bilinear).values
        assert _monotone(values, sign), (dyn.to_config(), np.diff(values).min())
        assert abs(values[-1] - values[0]) > 1e-6 * abs(values[0])  # it did move


@pytest.mark.parametrize("solver", ["euler", "rk4", "adaptive"])
def test_particles_stay_on_the_sphere(solver):
    dyn = Dynamics(beta=4.0, normalization="usa")
    ds = simulate(
        dyn, uniform(16, 3, seed=9), t_max=100.0, dt=0.05, solver=solver, saveat=SaveAt(every=50)
    )
    norms = np.linalg.norm(ds.states.values, axis=-1)
    assert np.abs(norms - 1).max() < TOL["sphere"]


@pytest.mark.parametrize("normalization", ["sa", "usa"])
def test_rotation_equivariance(normalization):
    d = 4
    x0 = uniform(12, d, seed=6)
    rotation = random_matrices(d, ensemble="orthogonal", seed=3)[0]
    dyn = Dynamics(beta=3.0, normalization=normalization)
    plain = simulate(dyn, x0, t_max=3.0, dt=0.05, solver="rk4").states.values
    turned = simulate(dyn, x0 @ rotation.T, t_max=3.0, dt=0.05, solver="rk4").states.values
    assert np.abs(turned - plain @ rotation.numpy().T).max() < TOL["equivariance"]


def test_piecewise_constant_layers_match_a_layer_loop():
    d, n, dt = 3, 7, 0.25
    q = random_matrices(d, layers=3, seed=1)  # (L, 1, d, d)
    dyn = Dynamics(beta=1.0, query=q, layer_time=dt)
    x0 = uniform(n, d, seed=2)
    ds = simulate(dyn, x0, t_max=4 * dt, dt=dt)
    x = x0.clone()
    for layer in range(4):  # the last layer continues past the end
        x = x + dt * Dynamics(beta=1.0, query=q[min(layer, 2)]).vector_field(0, x)
        x = x / x.norm(dim=-1, keepdim=True)
    assert np.abs(ds.states.values[-1] - x.numpy()).max() < 1e-14
    # a step that would straddle a boundary is split at it
    split = simulate(dyn, x0, t_max=0.5, dt=0.2, saveat=SaveAt(every=1))
    assert np.allclose(split.time.values, [0, 0.2, 0.25, 0.4, 0.5])


def test_mlp_term_and_state_spaces():
    d, n = 3, 6
    x = uniform(n, d, seed=3) * 2.0  # off the sphere on purpose
    mlp = Mlp(
        w_in=torch.randn(5, d, dtype=torch.float64),
        w_out=torch.randn(d, 5, dtype=torch.float64),
        activation="tanh",
    )
    base = Dynamics(beta=1.0)
    attn = base.attention_term(0, x)
    ff = mlp(x)
    free = Dynamics(beta=1.0, mlp=mlp, state="free").vector_field(0, x)
    assert torch.allclose(free, attn + ff, atol=1e-14)
    sphere = Dynamics(beta=1.0, mlp=mlp, state="sphere").vector_field(0, x)
    assert torch.allclose(
        sphere, (attn + ff) - ((attn + ff) * x).sum(-1, keepdim=True) * x, atol=1e-13
    )
    y = x / x.norm(dim=-1, keepdim=True)
    pre = Dynamics(beta=1.0, mlp=mlp, state="prenorm").vector_field(0, x)
    assert torch.allclose(pre, base.attention_term(0, y) + mlp(y), atol=1e-14)


def test_dtype_and_device_follow_the_input():
    x = uniform(8, 3, seed=0).to(torch.float32)
    q = random_matrices(3, seed=0)
    out = Dynamics(beta=1.0, query=q).vector_field(0, x)
    assert out.dtype == torch.float32 and out.device == x.device
    ds = simulate(Dynamics(beta=1.0), x, t_max=0.2, dt=0.1)
    assert ds.states.dtype == np.float32


@pytest.mark.parametrize(
    "make",
    [
        lambda: Dynamics(beta=float("nan")),
        lambda: Dynamics(beta=float("inf")),
        lambda: Dynamics(beta="1"),
        lambda: Dynamics(normalization="softmax"),
        lambda: Dynamics(query=np.ones((3, 4))),
        lambda: Dynamics(query=np.eye(3), key=np.eye(4)),
        lambda: Dynamics(query=np.full((2, 2), np.nan)),
        lambda: Dynamics(query=random_matrices(3, heads=2), key=random_matrices(3, heads=3)),
        lambda: Dynamics(state="torus"),
        lambda: Dynamics(layer_time=0.0),
        lambda: Mlp(w_in=np.ones((4, 3)), w_out=np.ones((4, 3))),
        lambda: Dynamics(query=np.eye(3)).check_state(torch.zeros(5, 4)),
        lambda: Dynamics().check_state(torch.zeros(0, 3)),
        lambda: Dynamics().check_state(torch.zeros(5, 1)),
        lambda: simulate(Dynamics(), uniform(4, 3), t_max=1.0, dt=0.0),
        lambda: simulate(Dynamics(), uniform(4, 3), t_max=1.0, dt=-0.1),
        lambda: simulate(Dynamics(), uniform(4, 3), t_max=0.0, dt=0.1),
        lambda: simulate(Dynamics(), uniform(4, 3), t_max=1.0, dt=0.1, solver="leapfrog"),
        lambda: simulate(Dynamics(), torch.zeros(4, 3), t_max=1.0, dt=0.1),
        lambda: SaveAt(every=0),
        lambda: random_matrices(3, ensemble="wishart"),
    ],
)
def test_bad_input_raises_user_error(make):
    with pytest.raises(UserError):
        make()

"""The GPU paths, where a CUDA device exists: a model spread over the GPU, the CPU
and the disk, reduced precision on the GPU, the attention read-out reduced on the
device, Dask workers sharing a GPU, and the particle simulator on the GPU.

Every test here is skipped with the stated reason on a machine without CUDA (CI);
the CPU versions of the same paths are tested elsewhere (test_trace_placement,
test_trace_parallel, test_particles_integrate).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tokenfield as tf
from tests.integration.tiny import PROMPTS, save_tiny

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="no CUDA device on this machine: the GPU paths are tested only where "
    "torch.cuda.is_available()",
)

# float32 on the GPU against float32 on the CPU: other kernels, other summation order
GPU_RTOL, GPU_ATOL = 1e-4, 1e-5


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    return save_tiny("llama", tmp_path_factory.mktemp("models") / "llama")


def test_spread_over_gpu_cpu_and_disk_equals_whole_gpu(llama_dir, tmp_path):
    whole = tf.load_model(str(llama_dir), device="cuda")
    spread = tf.load_model(
        str(llama_dir),
        device_map="sequential",
        max_memory={"cuda:0": "60KB", "cpu": "60KB"},  # the embedding and a block; the rest off
        offload_folder=tmp_path / "offload",
    )
    places = {str(p) for p in spread.model.hf_device_map.values()}
    # accelerate keeps the blocks it executes on the GPU together with their weights
    # on the CPU or the disk (seen: embedding and block 0 on the GPU, the rest on disk)
    assert "0" in places and places & {"cpu", "disk"}, spread.model.hf_device_map
    a = tf.trace(whole, PROMPTS, positions="all", batch_size=3)
    b = tf.trace(spread, PROMPTS, positions="all", batch_size=3)
    np.testing.assert_allclose(b.states.values, a.states.values, rtol=GPU_RTOL, atol=GPU_ATOL)
    np.testing.assert_array_equal(a.next_token_top.values, b.next_token_top.values)


def test_bfloat16_on_gpu_within_tolerance(llama_dir):
    from tests.integration.test_trace_placement import BF16_TOLERANCE

    full = tf.trace(tf.load_model(str(llama_dir), device="cuda"), PROMPTS, positions="all")
    half = tf.trace(
        tf.load_model(str(llama_dir), device="cuda", dtype="bfloat16"), PROMPTS, positions="all"
    )
    assert half.states.dtype == np.float32
    a, b = full.states.values, half.states.values
    per_layer = np.abs(a - b).max(axis=(1, 2)) / np.abs(a).max(axis=(1, 2))
    assert (per_layer < BF16_TOLERANCE).all(), per_layer
    assert per_layer[1:].max() > 1e-4  # it really computed in bfloat16


def test_attention_read_out_on_gpu_equals_cpu(llama_dir):
    cpu = tf.trace(tf.load_model(str(llama_dir)), PROMPTS, attention=True)
    gpu = tf.trace(tf.load_model(str(llama_dir), device="cuda"), PROMPTS, attention=True)
    names = [name for name in cpu.data_vars if name.startswith("attn_")]
    assert len(names) >= 5
    for name in names:
        np.testing.assert_allclose(
            gpu[name].values, cpu[name].values, rtol=1e-3, atol=1e-4, err_msg=name
        )


def test_two_workers_sharing_the_gpu_equal_one_process(llama_dir, tmp_path):
    model = tf.load_model(str(llama_dir), device="cuda")
    prompts = PROMPTS * 3
    single = tf.trace(model, prompts, positions="all", batch_size=2)
    # each worker loads the model the way the client did: on the GPU
    parallel = tf.trace(
        model, prompts, positions="all", batch_size=2, out=tmp_path / "run", workers=2
    )
    np.testing.assert_allclose(
        parallel.states.values, single.states.values, rtol=GPU_RTOL, atol=GPU_ATOL
    )
    assert list(parallel.prompt.values) == list(single.prompt.values)


def test_simulation_on_gpu_equals_cpu():
    from tokenfield.particles import Dynamics, simulate

    rng = np.random.default_rng(0)
    x0 = rng.standard_normal((64, 8))
    dynamics = Dynamics(beta=4.0)
    common = {"t_max": 2.0, "dt": 0.05, "solver": "rk4", "dtype": torch.float64}
    cpu = simulate(dynamics, x0, device="cpu", **common)
    gpu = simulate(dynamics, x0, device="cuda", **common)
    np.testing.assert_allclose(gpu.states.values, cpu.states.values, rtol=1e-9, atol=1e-11)


def test_attractors_on_gpu_equal_cpu(llama_dir):
    """The attractor analysis (layer map, spectra, FTLEs, perturbations) on the GPU
    gives the CPU's numbers: the same seeded directions and start vectors. The FTLE
    spectra are converged (max_iter 200: residuals about 1e-6; at 30 they were 3.5e-3,
    and the GPU's fourth exponent then differed from the CPU's by 6e-3). The angle
    ratios are compared along the seeded random directions. Along the most sensitive
    direction (found by an iteration, the last of the ``direction`` axis) the H100's
    ratios differed from the CPU's by up to 0.12 for this tiny random model, whose
    top singular values are close (the direction is ill defined there); every
    mismatch listed was along it. (This version of the test has not yet run on a GPU.)"""
    from tokenfield.pipelines.attractors import AttractorConfig, measure_attractors
    from tokenfield.prompts import Prompt

    prompts = [Prompt(p, category="ab"[i % 2]) for i, p in enumerate(PROMPTS) if " " in p]
    config = AttractorConfig(directions=4, thetas=(0.01, 0.1, 1.0), pairs=2, max_iter=200,
                             tol=1e-6, n_boot=50)  # fmt: skip
    results = {}
    for device in ("cpu", "cuda"):
        model = tf.load_model(str(llama_dir), device=device)
        results[device] = measure_attractors(model, prompts, config)["arrays"]
        assert np.nanmax(results[device]["ftle_residual"]) < 1e-4, device
    for name in ("jacobian_sv", "angular_sv", "ftle"):
        np.testing.assert_allclose(results["cuda"][name], results["cpu"][name], rtol=1e-3,
                                   atol=1e-4, err_msg=name)  # fmt: skip
    # (start_block, theta, direction, prompt): the seeded random directions, not the last
    gpu, cpu = results["cuda"]["angle_ratio"], results["cpu"]["angle_ratio"]
    np.testing.assert_allclose(gpu[:, :, :-1], cpu[:, :, :-1], rtol=1e-3, atol=1e-4)


def test_lanczos_spectrum_on_gpu_equals_cpu():
    """``|lambda_2|`` of chains long enough for the batched Lanczos (padded rows
    included) and the dense solve below it: the GPU gives the CPU's numbers."""
    from tokenfield.models.attention import LANCZOS_FROM, _chain_spectrum

    generator = torch.Generator().manual_seed(0)
    for m in (LANCZOS_FROM - 32, LANCZOS_FROM + 40):
        logits = torch.randn(6, m, m, generator=generator, dtype=torch.float64) * 3
        causal = torch.ones(m, m, dtype=torch.bool).tril()
        weights = logits.masked_fill(~causal, -torch.inf).softmax(-1)
        valid = torch.ones(6, m, dtype=torch.float64)
        valid[1, m - 17 :] = 0  # one chain padded: its rows and columns zero
        weights[1, m - 17 :] = 0
        weights[1, :, m - 17 :] = 0
        lam_cpu, pi_cpu = _chain_spectrum(weights.clone(), valid)
        lam_gpu, pi_gpu = _chain_spectrum(weights.cuda(), valid.cuda())
        assert lam_gpu.device.type == "cuda"
        np.testing.assert_allclose(lam_gpu.cpu().numpy(), lam_cpu.numpy(), rtol=0, atol=1e-9)
        np.testing.assert_allclose(pi_gpu.cpu().numpy(), pi_cpu.numpy(), rtol=0, atol=1e-12)
        assert (lam_cpu > 0).all() and (lam_cpu <= 1).all()


def test_short_chains_solved_on_the_host_equal_the_gpus_rounds(monkeypatch):
    """:data:`HOST_CHAINS_UNTIL_CUDA`: a GPU's float32 chains of 64 tokens (one prompt
    padded) solved by the host's compiled Lanczos give the GPU rounds' statistics, and
    come back on the GPU."""
    from tokenfield.models import attention

    generator = torch.Generator().manual_seed(3)
    m = 64
    logits = torch.randn(2, 4, m, m, generator=generator) * 3
    causal = torch.ones(m, m, dtype=torch.bool).tril()
    a = logits.masked_fill(~causal, -torch.inf).softmax(-1)
    a[1, :, m - 9 :] = 0
    a[1, :, :, m - 9 :] = 0
    lengths = torch.tensor([m, m - 9])
    on_gpu = attention._reduce_padded(a.cuda(), lengths.cuda(), True)
    monkeypatch.setattr(attention, "HOST_CHAINS_UNTIL_CUDA", 128)
    assert attention._on_host(a.cuda())
    solved = []
    chains = attention._compiled_chains

    def spied(kernel, weights, valid, skip):
        solved.append((weights.device.type, valid.device.type))
        return chains(kernel, weights, valid, skip)

    monkeypatch.setattr(attention, "_compiled_chains", spied)
    hosted = attention._reduce_padded(a.cuda(), lengths.cuda(), True)
    assert solved == [("cpu", "cpu")]
    for name, value in on_gpu.items():
        assert hosted[name].device.type == "cuda", name
        np.testing.assert_allclose(
            hosted[name].cpu().numpy(), value.cpu().numpy(), rtol=0, atol=1e-5, err_msg=name
        )


def test_lanczos_rounds_replayed_as_cuda_graphs_equal_the_rounds_launched_one_by_one(
    monkeypatch,
):
    """``_ROUNDS_GRAPHED``: each round's steps (three rounds: the later ones on the
    matrices not yet certified, their basis grown) captured once as a CUDA graph, the
    first time inside inference mode as in a trace, and replayed for other matrices
    (fewer of them: the padding holds the earlier call's) give the values of the same
    steps launched one by one."""
    from tokenfield.models import attention

    monkeypatch.setattr(attention, "_ROUND_GRAPHS", {})
    monkeypatch.setattr(attention, "_ROUNDS_SEEN", {})
    monkeypatch.setattr(attention, "_ROUND_GRAPH_AFTER", 1)
    generator = torch.Generator().manual_seed(4)
    m = 64
    causal = torch.ones(m, m, dtype=torch.bool).tril()
    made = []
    for count, inference in ((300, True), (260, False)):
        logits = torch.randn(count, m, m, generator=generator) * 3
        a = logits.masked_fill(~causal, -torch.inf).softmax(-1).cuda()
        valid = torch.ones(count, m, device="cuda")
        s, pi = attention._symmetrised(a, valid)
        monkeypatch.setattr(attention, "_ROUNDS_GRAPHED", False)
        eager = attention._lanczos_rounds(s, pi.sqrt(), valid, rounds=(8, 24))
        monkeypatch.setattr(attention, "_ROUNDS_GRAPHED", True)
        with torch.inference_mode(inference):
            got = attention._lanczos_rounds(s, pi.sqrt(), valid, rounds=(8, 24))
        made.append(dict(attention._ROUND_GRAPHS))
        np.testing.assert_allclose(got.cpu().numpy(), eager.cpu().numpy(), rtol=0, atol=2e-6)
    assert made[0] and all(graph is not None for graph in made[0].values())
    assert {key[3:5] for key in made[0]} >= {(0, 8)}
    assert all(made[1][key] is graph for key, graph in made[0].items() if key[1] == 512)

"""Model-parallel tracing on the CPU: a tiny model forced over ``cpu`` and ``disk``
by a small --max-memory traces the same states as the model in one piece; and
reduced precision against float32."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tokenfield as tf
from tests._cli import run_cli
from tests.integration.tiny import PROMPTS, save_tiny


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    return save_tiny("llama", tmp_path_factory.mktemp("models") / "llama")


def test_spread_over_cpu_and_disk_equals_unsharded(llama_dir, tmp_path):
    whole = tf.load_model(str(llama_dir))
    spread = tf.load_model(
        str(llama_dir),
        device_map="auto",
        max_memory={"cpu": "100KB"},  # the embedding and a block or so; the rest on disk
        offload_folder=tmp_path / "offload",
    )
    places = set(spread.model.hf_device_map.values())
    assert places == {"cpu", "disk"}, spread.model.hf_device_map
    # (weights offloaded from a safetensors file are read from it, not copied)
    a = tf.trace(whole, PROMPTS, positions="all", batch_size=3)
    b = tf.trace(spread, PROMPTS, positions="all", batch_size=3)
    np.testing.assert_array_equal(a.states.values, b.states.values)
    np.testing.assert_array_equal(a.final_norm_states.values, b.final_norm_states.values)
    np.testing.assert_array_equal(a.next_token_top.values, b.next_token_top.values)


def test_cli_device_map_and_bad_values(llama_dir, tmp_path, capsys):
    common = ["trace", "--model", str(llama_dir), "--prompts", "seed-categories"]
    assert run_cli([*common, "--out", str(tmp_path / "whole")])[0] == 0
    spread = [
        "--device-map",
        "sequential",
        "--max-memory",
        "cpu=100KB",
        "--offload-folder",
        str(tmp_path / "off"),
    ]
    assert run_cli([*common, "--out", str(tmp_path / "spread"), *spread])[0] == 0
    a, b = tf.open_run(tmp_path / "whole"), tf.open_run(tmp_path / "spread")
    np.testing.assert_array_equal(a.states.values, b.states.values)
    capsys.readouterr()
    for bad, said in (
        (["--device-map", "everywhere"], "unknown --device-map"),
        (["--max-memory", "cpu=1GB"], "--max-memory needs --device-map"),
        (["--device-map", "auto", "--max-memory", "cpu=much"], "bad size"),
        (["--device-map", "auto", "--max-memory", "cuda:7=1GB"], "names GPU 7"),
        (["--store-dtype", "int8"], "unknown --store-dtype"),
        (["--dtype", "float8"], "unknown dtype"),
    ):
        assert run_cli([*common, "--out", str(tmp_path / "bad"), *bad])[0] == 2, bad
        err = capsys.readouterr().err
        assert said in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


# bfloat16 keeps 8 bits of mantissa (relative rounding 2^-8 = 3.9e-3 per operation);
# through a few tiny blocks the states stay within 5% of the layer's largest |state|.
BF16_TOLERANCE = 0.05


def test_bfloat16_trace_within_tolerance_of_float32(llama_dir):
    full = tf.trace(tf.load_model(str(llama_dir)), PROMPTS, positions="all")
    half = tf.trace(tf.load_model(str(llama_dir), dtype="bfloat16"), PROMPTS, positions="all")
    assert half.states.dtype == np.float32  # computed in bfloat16, stored as float32
    assert half.attrs["run"]["config"]["model"]["dtype"] == "bfloat16"
    a, b = full.states.values, half.states.values
    per_layer = np.abs(a - b).max(axis=(1, 2)) / np.abs(a).max(axis=(1, 2))
    assert (per_layer < BF16_TOLERANCE).all(), per_layer
    assert per_layer[1:].max() > 1e-4  # it really computed in bfloat16


def test_store_dtype_float16(llama_dir, tmp_path):
    model = tf.load_model(str(llama_dir))
    run = tf.trace(model, PROMPTS, out=tmp_path / "r", store_dtype="float16")
    assert run.states.dtype == np.float16 and run.final_norm_states.dtype == np.float16
    assert run.attrs["run"]["config"]["store_dtype"] == "float16"
    full = tf.trace(model, PROMPTS)
    np.testing.assert_allclose(run.states.values, full.states.values, rtol=1e-3, atol=1e-3)


def test_cuda_path_equals_cpu(llama_dir):
    """The CUDA path of the tracer: the same states on the GPU as on the CPU."""
    if not torch.cuda.is_available():
        pytest.skip(
            "no CUDA device on this machine: the CUDA path (--device cuda, --device-map over "
            "GPUs) is tested only where torch.cuda.is_available()"
        )
    cpu = tf.trace(tf.load_model(str(llama_dir)), PROMPTS, positions="all")
    gpu = tf.trace(tf.load_model(str(llama_dir), device="cuda"), PROMPTS, positions="all")
    np.testing.assert_allclose(gpu.states.values, cpu.states.values, rtol=1e-4, atol=1e-5)


def test_trace_takes_a_spec_string(llama_dir):
    by_name = tf.trace(str(llama_dir), PROMPTS)
    loaded = tf.trace(tf.load_model(str(llama_dir)), PROMPTS)
    np.testing.assert_array_equal(by_name.states.values, loaded.states.values)
    assert by_name.attrs["run"]["config"] == loaded.attrs["run"]["config"]


def test_benchmark_cuda_mode_says_why_it_cannot_run():
    """Without a GPU the CUDA benchmark stops with one stated reason, not silently."""
    import subprocess
    import sys
    from pathlib import Path

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: the refusal is for machines without one")
    script = Path(__file__).parents[2] / "benchmarks" / "trace_scale.py"
    done = subprocess.run(
        [sys.executable, str(script), "--device", "cuda"], capture_output=True, text=True
    )
    assert done.returncode == 2
    assert "torch.cuda.is_available() is False" in done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "name", ["attention_readout.py", "attention_variants.py", "trace_host_time.py"]
)
def test_the_attention_benchmarks_refuse_cuda_without_a_gpu_in_one_line(name):
    import subprocess
    import sys
    from pathlib import Path

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: the refusal is for machines without one")
    script = Path(__file__).parents[2] / "benchmarks" / name
    done = subprocess.run(
        [sys.executable, str(script), "--device", "cuda"], capture_output=True, text=True
    )
    assert done.returncode == 2
    assert "no CUDA device on this machine" in done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1

"""--workers 2 on SmolLM2 equals the single-process trace (seed-categories)."""

from __future__ import annotations

import os

import pytest
import torch
import xarray as xr

import tokenfield as tf

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("positions", ["last", "all"])
def test_smollm2_two_workers_equal_single_process(smollm2, tmp_path, positions):
    options = {"positions": positions, "batch_size": 8}
    # Two workers on two cores run torch with one thread each; a float32 matmul
    # rounds differently with another thread count, so the reference uses one too.
    threads = torch.get_num_threads()
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // 2))
    try:
        single = tf.trace(smollm2, "seed-categories", out=tmp_path / "single", **options)
    finally:
        torch.set_num_threads(threads)
    parallel = tf.trace(smollm2, "seed-categories", out=tmp_path / "par", workers=2, **options)
    a, b = single.load(), parallel.load()
    run_a, run_b = a.attrs.pop("run"), b.attrs.pop("run")
    assert run_b["status"] == "complete"
    assert run_a["config"] == run_b["config"]
    assert run_a["weights_sha256"] == run_b["weights_sha256"]
    xr.testing.assert_identical(a, b)

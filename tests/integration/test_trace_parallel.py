"""Data-parallel tracing (tokenfield.pipelines.shards): prompts sharded over Dask
worker processes into regions of one Zarr store equal a single-process trace.

Worker processes start slowly on a small machine, so one cluster of two
processes serves the module (through ``scheduler=``, the ``--scheduler`` path),
and one CLI test starts its own (``--workers 2``).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

import tokenfield as tf
from tests._cli import run_cli
from tests.integration.tiny import PROMPTS, save_tiny
from tokenfield.errors import UserError
from tokenfield.models.trace_config import TraceConfig
from tokenfield.pipelines.shards import ParallelReport, plan_shards, trace_parallel

MANY = [f"{text} {word}" for word in ("one", "two", "more") for text in PROMPTS]  # 18 prompts


@pytest.fixture(scope="module")
def cluster():
    from dask.distributed import LocalCluster

    with LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
    ) as local:
        yield local.scheduler_address


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("models")
    return {kind: save_tiny(kind, root / kind) for kind in ("llama", "gpt2")}


def same_run(a: xr.Dataset, b: xr.Dataset) -> None:
    """Every variable and coordinate identical, and the same run.json but for progress."""
    a, b = a.load(), b.load()
    run_a, run_b = a.attrs.pop("run"), b.attrs.pop("run")
    assert run_b["status"] == "complete"
    for key in ("kind", "config", "weights_sha256"):
        assert run_a.get(key) == run_b.get(key), key
    xr.testing.assert_identical(a, b)


@pytest.mark.parametrize(("kind", "positions"), [("llama", "last"), ("gpt2", "all")])
def test_workers_equal_single_process(cluster, models, tmp_path, kind, positions):
    spec = str(models[kind])
    options = {"positions": positions, "batch_size": 2}
    single = tf.trace(tf.load_model(spec), MANY, out=tmp_path / "single", **options)
    report = ParallelReport()
    config = TraceConfig(MANY, scheduler=cluster, **options)
    parallel = trace_parallel(spec, config, out=tmp_path / "par", n_shards=4, report=report)
    assert report.shards >= 3 and sorted(report.shards_run) == list(range(report.shards))
    assert len(report.workers) == 2
    same_run(single, parallel)
    assert parallel.sizes["particle"] == single.sizes["particle"] > len(MANY) - 1
    # float arrays stored as a trace without workers stores them: raw bytes and a
    # CRC-32C per chunk (the coordinates' layouts differ: sharded there, not here)
    floats = _float_codecs(tmp_path / "par")
    assert floats == _float_codecs(tmp_path / "single")
    assert floats["states"] == ["bytes", "crc32c"]
    # Each worker loaded the model once, however many shards it ran.
    from dask.distributed import Client

    with Client(cluster) as client:
        loads = client.run(_loads_of, spec)
    assert all(count <= 1 for count in loads.values()), loads
    assert sum(loads.values()) >= 1


def _float_codecs(run: Path) -> dict[str, list[str]]:
    metas = {
        m.parent.name: json.loads(m.read_text()) for m in run.glob("trajectory.zarr/*/zarr.json")
    }
    return {
        name: [c["name"] for c in meta["codecs"]]
        for name, meta in metas.items()
        if str(meta.get("data_type", "")).startswith(("float", "bfloat"))
    }


def _loads_of(spec: str) -> int:
    from tokenfield.pipelines.shards import LOADS

    return sum(count for key, count in LOADS.items() if key.name == spec)


def test_read_outs_and_public_api(cluster, models, tmp_path):
    """tokenfield.trace(..., scheduler=) with attention, logit lens and float16 storage."""
    spec = str(models["llama"])
    options = {
        "positions": "all",
        "batch_size": 3,
        "attention": True,
        "logit_lens": True,
        "store_dtype": "float16",
    }
    loaded = tf.load_model(spec, attn_implementation="eager")
    single = tf.trace(loaded, PROMPTS, out=tmp_path / "single", **options)
    parallel = tf.trace(loaded, PROMPTS, out=tmp_path / "par", scheduler=cluster, **options)
    assert parallel.states.dtype == np.float16
    assert "attn_lambda2" in parallel and "lens_rank" in parallel
    same_run(single, parallel)


def test_workers_spread_their_model(cluster, models, tmp_path):
    """--workers with --device-map: each worker loads its copy over cpu and disk."""
    spec = str(models["llama"])
    spread = tf.load_model(
        spec, device_map="sequential", max_memory="cpu=100KB", offload_folder=tmp_path / "off"
    )
    assert set(spread.model.hf_device_map.values()) == {"cpu", "disk"}
    single = tf.trace(tf.load_model(spec), MANY, positions="all", batch_size=2)
    parallel = tf.trace(
        spread, MANY, out=tmp_path / "par", scheduler=cluster, positions="all", batch_size=2
    )
    np.testing.assert_array_equal(single.states.values, parallel.states.values)


class Killed(Exception):
    pass


def test_killed_client_resumes_only_missing_shards(cluster, models, tmp_path):
    spec = str(models["llama"])
    options = {"positions": "all", "batch_size": 2}
    single = tf.trace(tf.load_model(spec), MANY, **options)  # in memory
    out = tmp_path / "run"
    recorded: list[int] = []

    def die_after_two(index: int) -> None:
        recorded.append(index)
        if len(recorded) == 2:
            raise Killed

    with pytest.raises(Killed):
        config = TraceConfig(MANY, scheduler=cluster, **options)
        trace_parallel(spec, config, out=out, n_shards=5, on_shard=die_after_two)
    info = json.loads((out / "run.json").read_text())
    assert info["status"] == "partial"
    assert sorted(info["progress"]["shards"]["done"]) == sorted(recorded)
    assert not (out / ".tokenfield.lock").exists()  # the client let go of the lock
    report = ParallelReport()
    config = TraceConfig(MANY, scheduler=cluster, **options)
    resumed = trace_parallel(spec, config, out=out, report=report)
    assert sorted(report.shards_run) == sorted(set(range(5)) - set(recorded))
    a, b = single.load(), resumed.load()
    assert b.attrs["run"]["status"] == "complete"
    a.attrs, b.attrs = {}, {}
    xr.testing.assert_identical(a, b)


def test_single_process_resumes_a_sharded_run(models, tmp_path):
    """A run begun with workers, resumed without: its shards, in this process."""
    spec = str(models["gpt2"])
    loaded = tf.load_model(spec)
    options = {"positions": "last", "batch_size": 2}
    out = tmp_path / "run"

    def die(index: int) -> None:
        raise Killed

    with pytest.raises(Killed):
        config = TraceConfig(MANY, **options)
        trace_parallel(loaded, config, out=out, local=True, n_shards=3, on_shard=die)
    resumed = tf.trace(loaded, MANY, out=out, **options)
    same_run(tf.trace(loaded, MANY, out=tmp_path / "single", **options), resumed)


def test_refusals(models, tmp_path):
    loaded = tf.load_model(str(models["llama"]))
    with pytest.raises(UserError, match="generat"):
        tf.trace(loaded, PROMPTS, out=tmp_path / "g", workers=2, generate=2)
    with pytest.raises(UserError, match="run directory"):
        tf.trace(loaded, PROMPTS, workers=2)
    with pytest.raises(UserError, match="at least 1"):
        tf.trace(loaded, PROMPTS, out=tmp_path / "w", workers=0)
    in_memory = tf.wrap_model(loaded.model, loaded.tokenizer)
    with pytest.raises(UserError, match="built in memory"):
        tf.trace(in_memory, PROMPTS, out=tmp_path / "m", workers=1)
    tf.trace(loaded, PROMPTS[:3], out=tmp_path / "s", batch_size=1)  # single, complete
    tf.trace(loaded, PROMPTS[:3], out=tmp_path / "s", batch_size=1, workers=1)  # reopened


def test_plan_shards_layout():
    # positions=last: regions are whole batches, none traced twice
    last = plan_shards([1] * 10, batch_size=2, n_shards=3)
    assert [(s.start, s.stop) for s in last] == [(0, 4), (4, 8), (8, 10)]
    assert all(s.first_prompt == s.start and s.stop_prompt == s.stop for s in last)
    # positions=all: equal regions; a batch cut by an edge is traced by both sides
    counts = [3, 1, 4, 1, 5, 9, 2]  # first particles 0 3 4 8 9 14 23; 25 in all
    shards = plan_shards(counts, batch_size=2, n_shards=3)
    assert [(s.start, s.stop) for s in shards] == [(0, 9), (9, 18), (18, 25)]
    assert [(s.first_prompt, s.stop_prompt, s.offset) for s in shards] == [
        (0, 4, 0),
        (4, 6, 9),
        (4, 7, 9),
    ]
    assert sum(s.prompts for s in shards) == len(counts)


def test_cli_workers(models, tmp_path, capsys):
    spec = str(models["llama"])
    prompts = tmp_path / "p.txt"
    prompts.write_text("\n".join(MANY) + "\n")
    common = ["trace", "--model", spec, "--prompts", str(prompts), "--positions", "all"]
    assert run_cli([*common, "--out", str(tmp_path / "single")])[0] == 0
    assert run_cli([*common, "--out", str(tmp_path / "par"), "--workers", "2"])[0] == 0
    assert "traced" in capsys.readouterr().out
    same_run(tf.open_run(tmp_path / "single"), tf.open_run(tmp_path / "par"))
    for bad, said in (
        (["--workers", "0"], "--workers must be at least 1"),
        (["--workers", "2", "--scheduler", "tcp://x:1"], "pass one of them"),
        (["--workers", "2", "--generate", "2"], "--generate"),
    ):
        assert run_cli([*common, "--out", str(tmp_path / "bad"), *bad])[0] == 2
        err = capsys.readouterr().err
        assert said in err and "Traceback" not in err and len(err.strip().splitlines()) == 1

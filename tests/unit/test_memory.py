"""The writer's two measures for a flat resident memory (``tokenfield._memory``):
one thread in Zarr's codec pool unless the user chose, and glibc's free pages handed
back after each background write."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import xarray as xr
import zarr

from tokenfield import _memory
from tokenfield.runs import RunWriter, open_run


@pytest.fixture
def zarr_threads(monkeypatch):
    """Zarr's thread setting and environment as they were, restored after."""
    monkeypatch.delenv(_memory.ZARR_THREADS_ENV, raising=False)
    before = zarr.config.get("threading.max_workers", None)
    yield
    zarr.config.set({"threading.max_workers": before})


def test_zarr_gets_one_codec_thread_when_nobody_chose(zarr_threads):
    zarr.config.set({"threading.max_workers": None})
    _memory.limit_zarr_threads()
    assert zarr.config.get("threading.max_workers") == 1


def test_a_users_zarr_threads_are_kept(zarr_threads, monkeypatch):
    zarr.config.set({"threading.max_workers": 4})
    _memory.limit_zarr_threads()
    assert zarr.config.get("threading.max_workers") == 4
    zarr.config.set({"threading.max_workers": None})
    monkeypatch.setenv(_memory.ZARR_THREADS_ENV, "3")
    _memory.limit_zarr_threads()
    assert zarr.config.get("threading.max_workers") is None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_free_memory_is_handed_back_on_linux():
    assert _memory.release_free_memory() is True


def test_each_background_write_hands_memory_back(tmp_path, monkeypatch, zarr_threads):
    """A buffered background writer trims after every write it makes, and what it
    wrote reads back whole."""
    calls = []
    monkeypatch.setattr(
        "tokenfield.runs.writer.release_free_memory", lambda: calls.append(1) or True
    )
    writer = RunWriter(
        tmp_path / "run",
        "simulation",
        {"seed": 0},
        append_dim="time",
        flush_seconds=3600,
        flush_pieces=2,
        background=True,
    )
    pieces = [
        xr.Dataset({"states": (("time", "particle"), np.full((1, 3), float(t)))}, {"time": [t]})
        for t in range(6)
    ]
    for t, piece in enumerate(pieces):
        writer.append(piece, done=t + 1)
    writer.finish()
    assert len(calls) == 3  # one per background write of two pieces
    assert open_run(tmp_path / "run")["states"].values[:, 0].tolist() == [0, 1, 2, 3, 4, 5]


def test_run_json_is_written_as_before_with_the_config_serialised_once(tmp_path):
    """``RunWriter._record`` splices a config serialised once into run.json: the bytes
    are those of ``write_json_atomic(path, info.to_dict())`` (nested values, empty
    containers, strings with newlines and quotes, numpy scalars), flush after flush."""
    from tokenfield._io import dumps
    from tokenfield.runs.layout import RUN_JSON

    config = {
        "prompts": [{"text": 'a "quoted"\nline', "n": np.int64(3)}, {"text": "b"}],
        "empty": {"list": [], "dict": {}},
        "nested": {"deep": {"deeper": [1, 2.5, None, True]}},
    }
    writer = RunWriter(tmp_path / "run", "simulation", config, append_dim="time", flush_seconds=0)
    for t in range(3):
        writer.append(
            xr.Dataset({"states": (("time", "particle"), np.zeros((1, 2)))}, {"time": [t]}),
            done=t + 1,
        )
        text = (tmp_path / "run" / RUN_JSON).read_text()
        assert text == dumps(writer.info.to_dict()) + "\n"
    writer.finish()
    text = (tmp_path / "run" / RUN_JSON).read_text()
    assert text == dumps(writer.info.to_dict()) + "\n"
    assert '"status": "complete"' in text

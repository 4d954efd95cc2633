import json
import os

import numpy as np
import pytest
import xarray as xr

from tokenfield.errors import UserError
from tokenfield.runs import RunWriter, open_run, read_run_info, strings, write_json_atomic


def piece(start: int, n: int, text: str = "p") -> xr.Dataset:
    return xr.Dataset(
        {"states": (("time", "particle", "feature"), np.full((3, n, 2), start, np.float32))},
        coords={
            "time": np.arange(3),
            "particle": np.arange(start, start + n),
            "prompt": (
                "particle",
                strings(f"{text}{i}" * (i + 1) for i in range(start, start + n)),
            ),
        },
    )


def test_stream_and_open(tmp_path):
    writer = RunWriter(tmp_path / "r", "trace", {"a": 1}, append_dim="particle")
    writer.append(piece(0, 2), done=1)
    writer.append(piece(2, 3), done=2)
    with pytest.raises(UserError, match="partial"):
        open_run(tmp_path / "r")
    writer.finish()
    ds = open_run(tmp_path / "r")
    assert ds.states.shape == (3, 5, 2)
    assert list(ds.prompt.values) == ["p0", "p1p1", "p2p2p2", "p3p3p3p3", "p4p4p4p4p4"]
    plain = xr.open_zarr(tmp_path / "r" / "trajectory.zarr")  # no tokenfield needed
    assert json.loads(plain.attrs["tokenfield_config"]) == {"a": 1}
    assert read_run_info(tmp_path / "r").complete


def test_resume_reports_progress_and_trims(tmp_path):
    run = tmp_path / "r"
    writer = RunWriter(run, "trace", {"a": 1}, append_dim="particle")
    writer.append(piece(0, 2), done=1, rng="state")
    # simulate a kill after the store grew but before run.json recorded it
    piece(2, 3).to_zarr(writer.store, append_dim="particle", consolidated=False)
    resumed = RunWriter(run, "trace", {"a": 1}, append_dim="particle")
    assert resumed.done == 1 and resumed.info.progress["rng"] == "state"
    assert xr.open_zarr(resumed.store, consolidated=False).sizes["particle"] == 2


def test_config_mismatch_refused_without_touching(tmp_path):
    run = tmp_path / "r"
    RunWriter(run, "trace", {"a": 1, "b": 2}, append_dim="particle").append(piece(0, 1), done=1)
    before = {p.name: p.stat().st_mtime_ns for p in run.iterdir()}
    with pytest.raises(UserError, match=r"differs in: b.*--overwrite"):
        RunWriter(run, "trace", {"a": 1, "b": 3}, append_dim="particle")
    assert {p.name: p.stat().st_mtime_ns for p in run.iterdir()} == before
    fresh = RunWriter(run, "trace", {"a": 1, "b": 3}, append_dim="particle", overwrite=True)
    assert fresh.done == 0 and not fresh.store.exists()


def test_refuses_non_run_directories_and_files(tmp_path):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "precious.txt").write_text("keep me")
    with pytest.raises(UserError, match="not a tokenfield run"):
        RunWriter(tmp_path / "full", "trace", {}, append_dim="particle")
    assert (tmp_path / "full" / "precious.txt").read_text() == "keep me"
    (tmp_path / "file").write_text("x")
    with pytest.raises(UserError, match="is a file|inside a file"):
        RunWriter(tmp_path / "file", "trace", {}, append_dim="particle")
    with pytest.raises(UserError, match="not a tokenfield run"):
        read_run_info(tmp_path / "full")


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write anywhere")
def test_unwritable_directory(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    with pytest.raises(UserError, match="not writable"):
        RunWriter(locked / "r", "trace", {}, append_dim="particle")


def test_unwritable_directory_by_permission_check(tmp_path, monkeypatch):
    # root ignores file modes, so check the decision itself through os.access
    monkeypatch.setattr(os, "access", lambda *_a, **_k: False)
    with pytest.raises(UserError, match="not writable"):
        RunWriter(tmp_path / "r", "trace", {}, append_dim="particle")
    assert not (tmp_path / "r").exists()


def test_atomic_json_never_half_written(tmp_path, monkeypatch):
    target = tmp_path / "x.json"
    write_json_atomic(target, {"v": 1})

    def broken_fsync(*_a, **_k):  # the disk fills up before the data is down
        raise RuntimeError("disk full")

    monkeypatch.setattr(os, "fsync", broken_fsync)
    with pytest.raises(RuntimeError):
        write_json_atomic(target, {"v": 2})
    monkeypatch.undo()
    assert json.loads(target.read_text()) == {"v": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["x.json"]


def test_atomic_json_has_the_usual_mode(tmp_path):
    previous = os.umask(0o022)
    try:
        write_json_atomic(tmp_path / "m.json", {"a": 1})
    finally:
        os.umask(previous)
    assert (tmp_path / "m.json").stat().st_mode & 0o777 == 0o644


def test_overwrite_removes_derived_files_and_keeps_the_users(tmp_path):
    run = tmp_path / "r"
    with RunWriter(run, "trace", {"a": 1}, append_dim="particle") as writer:
        writer.append(piece(0, 1), done=1)
    for name in ("metrics.json", "theory.json", "theory.html", "projection.npz"):
        (run / name).write_text("stale")
    (run / "figures").mkdir()
    (run / "notes.txt").write_text("mine")
    RunWriter(run, "trace", {"a": 2}, append_dim="particle", overwrite=True).close()
    assert sorted(p.name for p in run.iterdir()) == ["notes.txt", "run.json"]


def test_overwrite_refuses_a_directory_that_is_not_a_run(tmp_path):
    mine = tmp_path / "mine"
    (mine / "figures").mkdir(parents=True)
    (mine / "figures" / "plot.png").write_text("user's figure")
    (mine / "metrics.json").write_text("{}")
    with pytest.raises(UserError, match="not a tokenfield run.*only replaces runs"):
        RunWriter(mine, "trace", {}, append_dim="particle", overwrite=True)
    assert (mine / "figures" / "plot.png").read_text() == "user's figure"
    assert sorted(p.name for p in mine.iterdir()) == ["figures", "metrics.json"]

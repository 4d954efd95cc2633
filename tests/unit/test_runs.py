import json
import os

import numpy as np
import pytest
import xarray as xr

from tokenfield._io import write_json_atomic
from tokenfield.errors import UserError
from tokenfield.runs import RunWriter, open_run, read_run_info, strings


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


def buffered_piece(start: int, n: int) -> xr.Dataset:
    """A piece with the variable kinds a trace streams (float NaN, strings, bools, ints)."""
    ds = piece(start, n)
    values = np.where(np.arange(n) % 2, np.nan, np.arange(start, start + n)).astype(np.float32)
    return ds.assign(
        attn=(("particle",), values),
        token=(("particle",), strings("" for _ in range(n))),  # all fill value
        is_last=(("particle",), np.arange(n) == n - 1),
    )


def test_buffered_flushes_equal_piece_by_piece_writes(tmp_path):
    sizes = [2, 3, 1, 4, 2]
    starts = np.cumsum([0, *sizes[:-1]])
    one = RunWriter(tmp_path / "one", "trace", {"a": 1}, append_dim="particle")
    many = RunWriter(tmp_path / "many", "trace", {"a": 1}, append_dim="particle", flush_seconds=1e9)
    for done, (start, n) in enumerate(zip(starts, sizes, strict=True), start=1):
        one.append(buffered_piece(int(start), n), done=done)
        many.append(buffered_piece(int(start), n), done=done)
        if done == 2:
            many.flush()  # a second flush appends to the existing store
            assert read_run_info(tmp_path / "many").progress == {"done": 2, "size": 5}
    assert read_run_info(tmp_path / "many").progress["done"] == 2  # 3..5 still pending
    one.finish()
    many.finish()
    xr.testing.assert_identical(
        open_run(tmp_path / "many").load(), open_run(tmp_path / "one").load()
    )


def test_a_writer_keeps_at_most_flush_pieces_in_memory(tmp_path):
    writer = RunWriter(
        tmp_path / "r", "trace", {"a": 1}, append_dim="particle", flush_seconds=1e9, flush_pieces=3
    )
    for done, start in enumerate(range(0, 12, 2), start=1):
        writer.append(buffered_piece(start, 2), done=done)
        assert len(writer._pending) == done % 3
    assert read_run_info(tmp_path / "r").progress == {"done": 6, "size": 12}
    writer.finish()


def background_writer(path, flush_bytes: int = 1) -> RunWriter:
    """A writer that hands pieces to its thread once they hold ``flush_bytes``."""
    return RunWriter(
        path,
        "trace",
        {"a": 1},
        append_dim="particle",
        flush_seconds=1e9,
        flush_bytes=flush_bytes,
        background=True,
    )


def test_background_writes_equal_piece_by_piece_writes(tmp_path):
    """flush_bytes=1: every append hands the pending piece to the writer thread."""
    one = RunWriter(tmp_path / "one", "trace", {"a": 1}, append_dim="particle")
    bg = background_writer(tmp_path / "bg")
    assert bg.background
    for done, start in enumerate(range(0, 15, 3), start=1):
        one.append(buffered_piece(start, 3), done=done)
        bg.append(buffered_piece(start, 3), done=done)
    assert bg._executor is not None  # the writes really went to the thread
    one.finish()
    bg.finish()
    assert read_run_info(tmp_path / "bg").progress["done"] == 5
    xr.testing.assert_identical(open_run(tmp_path / "bg").load(), open_run(tmp_path / "one").load())


def test_a_background_write_error_is_raised_by_the_next_call(tmp_path, monkeypatch):
    import tokenfield.runs as runs

    run = tmp_path / "r"
    writer = background_writer(run)
    writer.append(buffered_piece(0, 3), done=1)
    writer.flush()

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(runs.writer, "_write_at", full)
    writer.append(buffered_piece(3, 3), done=2)  # fails in the thread
    with pytest.raises(UserError, match="No space left"):
        writer.append(buffered_piece(6, 3), done=3)
    writer.close()
    info = read_run_info(run)
    assert info.status == "partial" and info.progress == {"done": 1, "size": 3}


def test_an_interrupt_keeps_the_background_write_and_the_pending_pieces(tmp_path):
    run = tmp_path / "r"
    with pytest.raises(KeyboardInterrupt), background_writer(run, flush_bytes=40) as writer:
        for done, start in enumerate(range(0, 12, 3), start=1):
            writer.append(buffered_piece(start, 3), done=done)
        raise KeyboardInterrupt
    info = read_run_info(run)
    assert info.status == "partial" and info.progress["done"] == 4
    assert list(open_run(run, allow_partial=True).particle.values) == list(range(12))


def test_an_interrupt_while_waiting_for_the_writer_thread_keeps_every_piece(tmp_path, monkeypatch):
    """Ctrl-C lands while the caller waits for a background write still running:
    close() must wait for that write before writing the pending pieces, or both
    write at the same recorded size (rows lost, a CI failure of the real CLI;
    `test_one_writer.py` sends real signals to a real trace)."""
    import threading

    import tokenfield.runs as runs

    run = tmp_path / "r"
    real = runs.writer._write_at
    proceed = threading.Event()

    def slow(*args, **kwargs):
        written = real(*args, **kwargs)
        proceed.wait(timeout=10)  # rows written, progress not yet recorded
        return written

    class InterruptedWait:
        """The future, except that the first wait for it is interrupted."""

        def __init__(self, future):
            self.future, self.interrupted = future, False

        def result(self):
            if not self.interrupted:
                self.interrupted = True
                threading.Timer(1.0, proceed.set).start()  # the write goes on meanwhile
                raise KeyboardInterrupt
            return self.future.result()

        def done(self):
            return self.future.done()

    with pytest.raises(KeyboardInterrupt), background_writer(run) as writer:
        writer.append(buffered_piece(0, 3), done=1)  # creates the store, in the thread
        writer._wait()
        monkeypatch.setattr(runs.writer, "_write_at", slow)
        writer.append(buffered_piece(3, 3), done=2)  # the slow write starts
        writer._writing = InterruptedWait(writer._writing)
        writer.append(buffered_piece(6, 3), done=3)  # waits for it: interrupted
    info = read_run_info(run)
    ds = open_run(run, allow_partial=True)
    assert info.progress == {"done": 3, "size": 9}
    assert list(ds.particle.values) == list(range(9))


def test_a_failed_background_write_is_retried_before_later_pieces(tmp_path, monkeypatch):
    import tokenfield.runs as runs

    run = tmp_path / "r"
    real = runs.writer._write_at
    failures = [OSError(28, "No space left on device")]

    def once(*args, **kwargs):
        if failures:
            raise failures.pop()
        return real(*args, **kwargs)

    writer = background_writer(run)
    writer.append(buffered_piece(0, 3), done=1)
    writer._wait()
    monkeypatch.setattr(runs.writer, "_write_at", once)
    writer.append(buffered_piece(3, 3), done=2)  # fails in the thread
    with pytest.raises(UserError, match="No space left"):
        writer.append(buffered_piece(6, 3), done=3)
    writer.close()  # the space is back: the failed piece is written, then the later one
    info = read_run_info(run)
    assert info.progress == {"done": 3, "size": 9}
    assert list(open_run(run, allow_partial=True).particle.values) == list(range(9))


def test_a_kill_between_a_flushs_write_and_its_record_resumes_to_the_same_run(
    tmp_path, monkeypatch
):
    import tokenfield.runs as runs

    clean = RunWriter(tmp_path / "clean", "trace", {"a": 1}, append_dim="particle")
    for done, start in enumerate(range(0, 12, 3), start=1):
        clean.append(buffered_piece(start, 3), done=done)
    clean.finish()

    run = tmp_path / "killed"
    writer = RunWriter(run, "trace", {"a": 1}, append_dim="particle", flush_seconds=1e9)
    writer.append(buffered_piece(0, 3), done=1)
    writer.flush()
    writer.append(buffered_piece(3, 3), done=2)
    writer.append(buffered_piece(6, 3), done=3)
    real = runs.writer.write_atomic  # run.json's record (RunWriter._record)

    def killed(path, content, **_options):
        raise KeyboardInterrupt  # the rows of pieces 2-3 are in the store, run.json not

    monkeypatch.setattr(runs.writer, "write_atomic", killed)
    with pytest.raises(KeyboardInterrupt):
        writer.flush()
    monkeypatch.setattr(runs.writer, "write_atomic", real)
    writer._pending = []  # the process died: nothing more is written
    writer.close()
    resumed = RunWriter(run, "trace", {"a": 1}, append_dim="particle", flush_seconds=1e9)
    assert resumed.done == 1
    for done, start in enumerate(range(3, 12, 3), start=2):
        resumed.append(buffered_piece(start, 3), done=done)
    resumed.finish()
    xr.testing.assert_identical(open_run(run).load(), open_run(tmp_path / "clean").load())


def test_close_while_an_error_unwinds_keeps_the_pending_work(tmp_path):
    run = tmp_path / "r"
    with (
        pytest.raises(RuntimeError),
        RunWriter(run, "trace", {"a": 1}, append_dim="particle", flush_seconds=1e9) as writer,
    ):
        writer.append(buffered_piece(0, 2), done=1)
        writer.append(buffered_piece(2, 2), done=2)
        raise RuntimeError("the model blew up")
    info = read_run_info(run)
    assert info.status == "partial" and info.progress["done"] == 2
    assert open_run(run, allow_partial=True).sizes["particle"] == 4


def test_a_flush_retried_after_an_interrupted_record_writes_at_the_recorded_size(
    tmp_path, monkeypatch
):
    """An interrupt between a flush's Zarr write and its run.json: close() writes
    the pending rows again, over the unrecorded ones, not after them."""
    import tokenfield.runs as runs

    run = tmp_path / "r"
    writer = RunWriter(run, "trace", {"a": 1}, append_dim="particle", flush_seconds=1e9)
    writer.append(buffered_piece(0, 3), done=1)
    writer.flush()
    writer.append(buffered_piece(3, 2), done=2)
    real, calls = runs.writer.write_atomic, {"n": 0}  # run.json's record

    def once(path, content, **options):
        calls["n"] += 1
        if calls["n"] == 1:
            raise KeyboardInterrupt
        real(path, content, **options)

    monkeypatch.setattr(runs.writer, "write_atomic", once)
    with pytest.raises(KeyboardInterrupt):
        writer.flush()
    writer.close()  # as the trace's clean-up does
    info = read_run_info(run)
    assert info.progress["done"] == 2 and info.progress["size"] == 5
    ds = open_run(run, allow_partial=True)
    assert ds.sizes["particle"] == 5
    assert list(ds.particle.values) == [0, 1, 2, 3, 4]


def test_pending_pieces_share_one_copy_of_a_large_config(tmp_path):
    """Every piece carries the run's config in its attrs, and a trace's config lists
    its prompts: a copy per pending piece made the memory of a streamed trace grow
    with the prompts times the pieces (issue 25: 20,000 prompts, 1.58x the RSS of 200)."""
    import tracemalloc

    def held_per_piece(prompts: int) -> float:
        config = {"prompts": [{"text": f"prompt number {i}"} for i in range(prompts)]}
        writer = RunWriter(
            tmp_path / f"r{prompts}",
            "trace",
            config,
            append_dim="particle",
            flush_seconds=1e9,
            flush_pieces=1000,
        )
        pieces = [piece(2 * i, 2) for i in range(21)]
        tracemalloc.start()
        try:
            writer.append(pieces[0], done=1)
            before = tracemalloc.get_traced_memory()[0]
            for i in range(1, 21):
                writer.append(pieces[i], done=i + 1)
            held = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
            writer.abandon()
        return held / 20

    small, large = held_per_piece(10), held_per_piece(20_000)
    # the config's JSON at 20,000 prompts is about 0.6 MB; a piece's own objects a few kB
    assert large < small + 4096, (small, large)


def test_a_size_hint_fits_the_coordinate_chunks_to_a_small_run(tmp_path):
    """A buffered run's 1-D coordinates are chunked by the size hint (at least a
    piece, at most COORD_CHUNK rows), so that a small run does not encode and read
    back chunks padded to COORD_CHUNK rows; the data are the same. Without a hint,
    a shard holds COORD_CHUNK rows, or COORD_CHUNKS_PER_SHARD chunks if fewer."""
    import zarr

    from tokenfield.runs import COORD_CHUNK, COORD_CHUNKS_PER_SHARD

    def run(name: str, hint: int | None) -> tuple[int, xr.Dataset]:
        writer = RunWriter(
            tmp_path / name, "trace", {"a": 1}, append_dim="particle", flush_seconds=1e9,
            size_hint=hint,
        )  # fmt: skip
        writer.append(buffered_piece(0, 4), done=1)
        writer.append(buffered_piece(4, 3), done=2)
        writer.finish()
        store = tmp_path / name / "trajectory.zarr"
        array = zarr.open_group(str(store), mode="r")["prompt"]
        files = array.shards or array.chunks  # the rows of one file on disk
        return files[0], xr.open_zarr(store).load()  # plain xarray reads it

    rows = {hint: run(f"r{hint}", hint) for hint in (7, 2, None)}
    assert rows[7][0] == 7
    assert rows[2][0] == 7  # never less than one chunk (the first write's 7 rows)
    assert rows[None][0] == min(-(-COORD_CHUNK // 7), COORD_CHUNKS_PER_SHARD) * 7
    for _rows, ds in rows.values():
        xr.testing.assert_identical(ds, rows[None][1])

"""The store writer of issue 25: float states uncompressed with a CRC-32C, whole chunks
written straight from the rows, rows held back to a chunk boundary, arrays pre-sized
from a size hint and written by region. What it writes must read back bit-identical
(plain xarray too) to what the former writer wrote, and a write killed half-way must
resume to the uninterrupted result."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import xarray as xr

from tokenfield import runs
from tokenfield.errors import UserError
from tokenfield.runs import RunWriter, open_run, read_run_info

LAYERS, D = 3, 8


def trace_piece(start: int, n: int) -> xr.Dataset:
    prompt = [int(x) for x in STARTS].index(start) if start in STARTS else 0
    """Trace-shaped rows of one prompt: float32 states (NaN and -0.0 included:
    compared by bits), a 2-D float, strings, bools and ints along ``particle``."""
    rng = np.random.default_rng(start)
    states = rng.standard_normal((LAYERS, n, D)).astype(np.float32)
    states[0, 0, 0] = np.nan
    states[-1, -1, -1] = -0.0
    return xr.Dataset(
        {
            "states": (("time", "particle", "feature"), states),
            "final_norm_states": (("particle", "feature"), states[-1] * 2),
        },
        coords={
            "time": np.arange(LAYERS),
            "particle": np.arange(start, start + n),
            "prompt_index": ("particle", np.full(n, prompt)),
            "prompt": ("particle", runs.strings(f"prompt {prompt}" for _ in range(n))),
            "is_last": ("particle", np.arange(n) == n - 1),
        },
    )


SIZES = [5, 3, 6, 2, 7, 4, 5]
STARTS = list(np.cumsum([0, *SIZES[:-1]]))


def small_chunks(monkeypatch) -> None:
    """Chunks of 4 rows of states (and so of every variable along particle)."""
    monkeypatch.setattr(runs.writer, "CHUNK_BYTES", 4 * LAYERS * D * 4)


def new_writer(path: Path, **options) -> RunWriter:
    """As ``tokenfield trace --out`` writes: buffered, in a background thread; each
    append holds enough bytes for a flush of whole chunks."""
    return RunWriter(
        path,
        "trace",
        {"a": 1},
        append_dim="particle",
        flush_seconds=1e9,
        flush_bytes=1,
        background=True,
        **options,
    )


def write_all(writer: RunWriter, pieces=None) -> None:
    for done, (start, n) in enumerate(zip(STARTS, SIZES, strict=True), start=1):
        if pieces is None or done in pieces:
            writer.append(trace_piece(int(start), n), done=done)
    writer.finish()


def bits(values: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(values).view(np.uint32)


def test_the_new_writer_reads_back_bit_identical_to_the_former_one_in_plain_xarray(
    tmp_path, monkeypatch
):
    small_chunks(monkeypatch)
    write_all(new_writer(tmp_path / "new"))
    # the former writer: Zstandard, one chunk per piece, every piece written at once
    write_all(
        RunWriter(tmp_path / "old", "trace", {"a": 1}, append_dim="particle", compressor="zstd")
    )
    new = xr.open_zarr(tmp_path / "new" / "trajectory.zarr").load()
    old = xr.open_zarr(tmp_path / "old" / "trajectory.zarr").load()
    assert new.sizes["particle"] == sum(SIZES)
    for name in ("states", "final_norm_states"):
        np.testing.assert_array_equal(bits(new[name].values), bits(old[name].values))
    expected = xr.concat(
        [trace_piece(int(s), n) for s, n in zip(STARTS, SIZES, strict=True)], "particle"
    )
    np.testing.assert_array_equal(bits(new["states"].values), bits(expected["states"].values))
    for name in ("prompt", "prompt_index", "is_last", "particle"):
        assert list(new[name].values) == list(expected[name].values), name
    # the layout: states in whole 4-row chunks, uncompressed with a checksum
    meta = new["states"].encoding
    assert meta["chunks"] == (LAYERS, 4, D)
    xr.testing.assert_identical(
        open_run(tmp_path / "new").load(), open_run(tmp_path / "old").load()
    )


def test_chunk_files_written_straight_equal_zarrs_own(tmp_path):
    """_write_whole_chunks writes the files Zarr itself writes (bytes + crc32c)."""
    import zarr
    from zarr.codecs import Crc32cCodec

    values = np.random.default_rng(1).standard_normal((LAYERS, 12, D)).astype(np.float32)
    made = {}
    for how in ("zarr", "straight", "blocks"):
        path = tmp_path / f"{how}.zarr"
        array = zarr.create_array(
            str(path), shape=(LAYERS, 12, D), chunks=(LAYERS, 4, D), dtype="f4",
            compressors=(Crc32cCodec(),), dimension_names=("time", "particle", "feature"),
        )  # fmt: skip
        if how == "zarr":
            array[:] = values
        elif how == "straight":
            assert runs.store._write_whole_chunks(path, array, 1, values[:, 4:], 4) == 8
            array[:, :4] = values[:, :4]
        else:  # rows in blocks that straddle the chunks (a flush's pieces), and a tail
            blocks = [values[:, 0:3], values[:, 3:5], values[:, 5:10]]
            assert runs.store._write_whole_chunks(path, array, 1, blocks, 0) == 8
            assert runs.store._write_whole_chunks(path, array, 1, values[:, 8:], 9) == 0
            array[:, 8:] = values[:, 8:]
        made[how] = {
            p.relative_to(path): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()
        }
        np.testing.assert_array_equal(zarr.open_array(str(path))[:], values)
    assert made["zarr"] == made["straight"] == made["blocks"]
    assert len([k for k in made["zarr"] if k.parts[0] == "c"]) == 3


def killed_run(tmp_path: Path, monkeypatch, **options) -> tuple[Path, Any]:
    """A clean run at ``tmp_path / "clean"``, and one at ``tmp_path / "killed"``
    (``options`` for its writer) whose process dies half-way with one chunk file left
    torn; returns the killed run and its recorded info."""
    small_chunks(monkeypatch)
    write_all(new_writer(tmp_path / "clean"))
    # the progress recorded every third write at least (these writers never flush for time)
    monkeypatch.setattr(runs.writer, "LAG_WRITES", 2)

    run = tmp_path / "killed"
    real = runs.store._write_whole_chunks
    calls = {"n": 0}

    def torn(store, array, axis, values, at):
        written = real(store, array, axis, values, at)
        calls["n"] += bool(written)
        recorded = read_run_info(run).progress.get("done", 0)
        # once some progress is recorded (and rows past it written: the states run
        # ahead of the coordinates), one chunk file left torn, then the process dies
        if calls["n"] >= 6 and recorded and written:
            chunk = max(p for p in Path(store, array.path, "c").rglob("*") if p.is_file())
            chunk.write_bytes(chunk.read_bytes()[:7])
            raise KeyboardInterrupt
        return written

    for module in (runs.store, runs.writer):  # through Zarr's writes and the lagging ones
        monkeypatch.setattr(module, "_write_whole_chunks", torn)
    writer = new_writer(run, **options)
    with pytest.raises(KeyboardInterrupt):
        for done, (start, n) in enumerate(zip(STARTS, SIZES, strict=True), start=1):
            writer.append(trace_piece(int(start), n), done=done)
        writer._wait()
    for module in (runs.store, runs.writer):
        monkeypatch.setattr(module, "_write_whole_chunks", real)
    writer._pending = []  # the process died: nothing more is written
    writer._writing = None
    writer.close()
    info = read_run_info(run)
    assert info.status == "partial" and 0 < info.progress["done"] < len(SIZES)
    return run, info


def test_a_write_killed_half_way_resumes_to_the_uninterrupted_run(tmp_path, monkeypatch):
    run, info = killed_run(tmp_path, monkeypatch)

    resumed = new_writer(run)
    assert resumed.done == info.progress["done"]
    write_all(resumed, pieces=range(resumed.done + 1, len(SIZES) + 1))
    xr.testing.assert_identical(open_run(run).load(), open_run(tmp_path / "clean").load())


def test_rows_held_back_are_recorded_only_once_written(tmp_path, monkeypatch):
    """A flush for the bytes held writes whole chunks only; run.json records the
    last piece written in full, and the store may hold more rows (a resume trims)."""
    small_chunks(monkeypatch)
    writer = RunWriter(
        tmp_path / "r", "trace", {"a": 1}, append_dim="particle", flush_seconds=1e9, flush_bytes=1
    )
    writer.append(trace_piece(0, 5), done=1)  # creates the store: rows 0-3 written
    assert read_run_info(tmp_path / "r").progress["done"] == 0
    writer.append(trace_piece(5, 6), done=2)  # rows 4-7 written: piece 1 recorded
    info = read_run_info(tmp_path / "r")
    assert info.progress["done"] == 1 and info.progress["size"] == 5
    writer.close()  # writes the rest
    assert read_run_info(tmp_path / "r").progress == {"done": 2, "size": 11}
    assert list(open_run(tmp_path / "r", allow_partial=True).particle.values) == list(range(11))


def test_an_unknown_store_compressor_is_one_line(tmp_path, monkeypatch):
    with pytest.raises(UserError, match="'lz4' is not a store compressor.*none, zstd"):
        RunWriter(tmp_path / "r", "trace", {"a": 1}, append_dim="particle", compressor="lz4")
    monkeypatch.setenv("TOKENFIELD_STORE_COMPRESSOR", "gzip")
    with pytest.raises(UserError, match="TOKENFIELD_STORE_COMPRESSOR='gzip'"):
        RunWriter(tmp_path / "r", "trace", {"a": 1}, append_dim="particle")
    monkeypatch.setenv("TOKENFIELD_STORE_COMPRESSOR", "zstd")
    write_all(RunWriter(tmp_path / "z", "trace", {"a": 1}, append_dim="particle"))
    codecs = xr.open_zarr(tmp_path / "z" / "trajectory.zarr")["states"].encoding["compressors"]
    assert [type(c).__name__ for c in codecs] == ["ZstdCodec"]


# Pre-sized stores: with a size hint (a trace passes its particle count), the arrays
# along particle are created at the run's size and every flush writes into its region,
# with no resize; finish() cuts them to the rows written.

TOTAL = sum(SIZES)


def stored(path: Path) -> dict[str, tuple[str, object]]:
    """Every variable of a run's store read with plain xarray: its dtype and its
    bytes (strings as a list)."""
    ds = xr.open_zarr(path / "trajectory.zarr").load()
    out = {}
    for name, var in ds.variables.items():
        values = np.asarray(var.values)
        data = values.tobytes() if values.dtype.kind in "fiub" else [str(v) for v in values.flat]
        out[name] = (str(values.dtype), var.dims, values.shape, data)
    return out


def lengths(path: Path) -> set[int]:
    """The rows along particle of every array of the store that has that dimension."""
    import zarr

    group = zarr.open_group(str(path / "trajectory.zarr"), mode="r")
    found = set()
    for _name, array in group.arrays():
        dims = list(array.metadata.dimension_names or ())
        if "particle" in dims:
            found.add(int(array.shape[dims.index("particle")]))
    return found


def count_resizes(monkeypatch) -> list[tuple[int, ...]]:
    """Record, from now on, the shape of every array along particle as a store is
    created, and every Zarr resize (each one a new zarr.json)."""
    from zarr.core.array import AsyncArray

    from tokenfield.runs import writer as runs_writer

    calls: list[tuple[int, ...]] = []
    real = AsyncArray.resize
    real_create = runs_writer.create_store

    async def resize(self, new_shape, *args, **kwargs):
        calls.append(tuple(new_shape))
        return await real(self, new_shape, *args, **kwargs)

    def create_store(*args, **kwargs):
        arrays = real_create(*args, **kwargs)
        for array in arrays.values():
            if "particle" in (array.metadata.dimension_names or ()):
                calls.append(tuple(array.shape))
        return arrays

    monkeypatch.setattr(AsyncArray, "resize", resize)
    monkeypatch.setattr(runs_writer, "create_store", create_store)
    return calls


def test_a_presized_store_written_in_several_flushes_equals_the_one_written_without_a_hint(
    tmp_path, monkeypatch
):
    small_chunks(monkeypatch)
    write_all(new_writer(tmp_path / "grown"))
    resizes = count_resizes(monkeypatch)
    write_all(new_writer(tmp_path / "presized", size_hint=TOTAL))
    growing = len(resizes)  # each array is created once at the whole run's size, never resized
    assert growing and set(resizes) <= {(LAYERS, TOTAL, D), (TOTAL, D), (TOTAL,)}
    assert stored(tmp_path / "presized") == stored(tmp_path / "grown")
    assert lengths(tmp_path / "presized") == {TOTAL}
    xr.testing.assert_identical(
        open_run(tmp_path / "presized").load(), open_run(tmp_path / "grown").load()
    )
    resizes.clear()
    write_all(new_writer(tmp_path / "again"))  # without the hint: a resize per array and flush
    assert len(resizes) > 3 * growing


@pytest.mark.parametrize("hint", [1, 9, TOTAL - 1, TOTAL + 1, 5 * TOTAL])
def test_a_wrong_size_hint_ends_at_the_rows_written(tmp_path, monkeypatch, hint):
    """A hint above the real size (rows left as fill values) or below it (a trace with
    --generate: the arrays grow) ends at exactly the rows written."""
    small_chunks(monkeypatch)
    write_all(new_writer(tmp_path / "grown"))
    resizes = count_resizes(monkeypatch)
    write_all(new_writer(tmp_path / "hinted", size_hint=hint))
    assert lengths(tmp_path / "hinted") == {TOTAL}
    assert stored(tmp_path / "hinted") == stored(tmp_path / "grown")
    info = read_run_info(tmp_path / "hinted")
    assert info.complete and info.progress["size"] == TOTAL
    xr.testing.assert_identical(
        open_run(tmp_path / "hinted").load(), open_run(tmp_path / "grown").load()
    )
    # the coordinates' lengths, in the order they were set: the hint (or the first
    # write's rows, if more) as the store is created, grown by half again at least
    # when the rows do not fit, then cut to the rows written
    sizes = list(dict.fromkeys(shape[0] for shape in resizes if len(shape) == 1))
    assert sizes[0] >= hint and sizes[-1] == TOTAL
    grown = [(a, b) for a, b in pairwise(sizes) if b > a]
    assert all(b >= a + a // 2 for a, b in grown[:-1]), sizes
    if hint >= TOTAL:
        assert not grown and sizes[0] == hint


def test_an_unbuffered_writer_with_a_hint_writes_the_same_run(tmp_path):
    for name, hint in (("plain", None), ("hinted", TOTAL + 3)):
        write_all(
            RunWriter(tmp_path / name, "trace", {"a": 1}, append_dim="particle", size_hint=hint)
        )
    assert lengths(tmp_path / "hinted") == {TOTAL}
    assert stored(tmp_path / "hinted") == stored(tmp_path / "plain")


def test_a_partial_presized_run_reads_back_its_recorded_rows_only(tmp_path, monkeypatch):
    small_chunks(monkeypatch)
    run = tmp_path / "r"
    writer = new_writer(run, size_hint=5 * TOTAL)
    for done, (start, n) in enumerate(zip(STARTS[:3], SIZES[:3], strict=True), start=1):
        writer.append(trace_piece(int(start), n), done=done)
    writer.close()  # interrupted: partial, its arrays still at the hinted size
    info = read_run_info(run)
    assert info.status == "partial" and info.progress["done"] == 3
    assert lengths(run) == {5 * TOTAL}
    ds = open_run(run, allow_partial=True)
    size = info.progress["size"]
    assert size == sum(SIZES[:3]) and ds.sizes["particle"] == size
    assert list(ds.particle.values) == list(range(size))
    assert not np.isnan(ds.final_norm_states.values).any()
    first = zip(STARTS[:3], SIZES[:3], strict=True)
    whole = xr.concat([trace_piece(int(s), n) for s, n in first], "particle")
    np.testing.assert_array_equal(bits(ds.states.values), bits(whole.states.values))


@pytest.mark.parametrize("resume_hint", [TOTAL, None])
def test_a_presized_run_killed_half_way_resumes_to_the_uninterrupted_run(
    tmp_path, monkeypatch, resume_hint
):
    """As test_a_write_killed_half_way_resumes_to_the_uninterrupted_run, pre-sized: the
    resume cuts the store to its recorded progress, then pre-sizes it again (with a
    hint; without one it grows with every write, as before)."""
    run, info = killed_run(tmp_path, monkeypatch, size_hint=TOTAL)
    assert lengths(run) == {TOTAL}  # pre-sized: rows past the progress are not the run's
    assert open_run(run, allow_partial=True).sizes["particle"] == info.progress["size"]

    resumed = new_writer(run, size_hint=resume_hint)
    assert resumed.done == info.progress["done"]
    assert lengths(run) == {TOTAL if resume_hint else info.progress["size"]}
    write_all(resumed, pieces=range(resumed.done + 1, len(SIZES) + 1))
    assert lengths(run) == {TOTAL}
    assert stored(run) == stored(tmp_path / "clean")
    xr.testing.assert_identical(open_run(run).load(), open_run(tmp_path / "clean").load())


def test_the_coordinates_lag_behind_the_states_and_catch_up(tmp_path, monkeypatch):
    """A pre-sized buffered run writes its states' whole chunks at every flush, and its
    coordinates, strings and progress only every LAG_WRITES + 1 flushes (and at the
    end; and every flush_seconds, which these writers never reach): the progress never counts rows whose coordinates are not written, and the run
    equals one written with no lag, byte for byte."""
    small_chunks(monkeypatch)
    events, records = [], []  # L: the states alone, W: everything
    lag_only, write_at, record = (
        RunWriter._write_large_only,
        runs.writer._write_at,
        RunWriter._record,
    )

    def counted_lag(self, pending, at, start, stop):
        held = lag_only(self, pending, at, start, stop)
        events.append("L" if held is not None else "-")
        return held

    def counted_write_at(store, merged, dim, at, *args, **kwargs):
        events.append("W")
        # what is recorded never runs ahead of the coordinates written
        assert int(read_run_info(store.parent).progress.get("size", 0)) <= at
        return write_at(store, merged, dim, at, *args, **kwargs)

    def counted_record(self, info):
        records.append(int(info.progress.get("size", 0)))
        return record(self, info)

    monkeypatch.setattr(runs.writer, "LAG_WRITES", 2)  # these writers never flush for time
    monkeypatch.setattr(RunWriter, "_write_large_only", counted_lag)
    monkeypatch.setattr(runs.writer, "_write_at", counted_write_at)
    monkeypatch.setattr(RunWriter, "_record", counted_record)
    write_all(new_writer(tmp_path / "lag", size_hint=TOTAL))
    order = "".join(events)
    assert order.count("L") >= 2  # the states went alone
    # at most LAG_WRITES of them in a row between two writes of everything
    assert order.startswith("W") and "L" * (runs.writer.LAG_WRITES + 1) not in order, order
    assert records == sorted(records) and records[-1] == TOTAL

    monkeypatch.setattr(runs.writer, "LAG_WRITES", 0)
    events.clear()
    write_all(new_writer(tmp_path / "no-lag", size_hint=TOTAL))
    assert "L" not in events
    assert stored(tmp_path / "lag") == stored(tmp_path / "no-lag")
    xr.testing.assert_identical(
        open_run(tmp_path / "lag").load(), open_run(tmp_path / "no-lag").load()
    )

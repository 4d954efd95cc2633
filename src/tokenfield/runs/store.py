"""A run's Zarr store as files: the codecs tokenfield writes with (checksummed
chunks; float states uncompressed with a CRC-32C by default), the encoding of a new
store, and the writes of a flush (:func:`_write_at`): the arrays' resizes (none in a
pre-sized store while its rows fit) and Zarr's writes in one trip through its event
loop, and whole chunk files written straight from the rows
(:func:`_write_whole_chunks`, byte for byte the files Zarr writes).

:class:`~tokenfield.runs.writer.RunWriter` decides what to write and when (buffering,
resume, the lock, the progress); this module only writes it.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from tokenfield.errors import UserError

COMPRESSORS = ("none", "zstd")
COMPRESSOR_ENV = "TOKENFIELD_STORE_COMPRESSOR"


def store_compressor(value: str | None = None) -> str:
    """``value``, or the ``TOKENFIELD_STORE_COMPRESSOR`` environment variable, or
    ``"none"``; checked against :data:`COMPRESSORS`.

    Raises:
        UserError: an unknown compressor.
    """
    source = "compressor"
    if value is None:
        value, source = os.environ.get(COMPRESSOR_ENV, "").strip() or "none", COMPRESSOR_ENV
    if value not in COMPRESSORS:
        raise UserError(
            f"{source}={value!r} is not a store compressor",
            f"use one of: {', '.join(COMPRESSORS)}",
        )
    return value


def checksummed() -> tuple[Any, ...]:
    """The compressors of every array tokenfield writes into a run's store: Zstandard
    with its frame checksum (an xxHash64 of each chunk's content, checked on every
    read), so a damaged chunk is an error instead of silently wrong numbers. A
    standard Zarr v3 codec: plain ``xarray.open_zarr`` reads it."""
    from zarr.codecs import ZstdCodec

    return (ZstdCodec(level=0, checksum=True),)


def float_codecs(compressor: str = "none") -> tuple[Any, ...]:
    """The bytes-to-bytes codecs of a float array (see :data:`COMPRESSORS`): a
    CRC-32C checksum of each chunk (``"none"``; a standard Zarr v3 codec, checked
    on every read) or :func:`checksummed` (``"zstd"``)."""
    if store_compressor(compressor) == "zstd":
        return checksummed()
    from zarr.codecs import Crc32cCodec

    return (Crc32cCodec(),)


def store_encoding(ds: xr.Dataset, compressor: str | None = None) -> dict[str, dict[str, Any]]:
    """Zarr encoding for every variable of ``ds``, to pass to ``to_zarr`` when the
    arrays are created: every chunk checksummed; float variables stored as
    ``compressor`` says (:func:`float_codecs`), the others with :func:`checksummed`."""
    compressor = store_compressor(compressor)
    return {
        name: {"compressors": float_codecs(compressor) if var.dtype.kind == "f" else checksummed()}
        for name, var in ds.variables.items()
    }


def concat_pieces(
    pieces: list[xr.Dataset], dim: str, skip: set[str] | frozenset[str] = frozenset()
) -> xr.Dataset:
    """Pieces of one layout joined along ``dim``: numpy concatenation of every
    variable that has ``dim``, the others taken from the first piece (they are
    the same in every piece: times, sites, blocks). The data variables named in
    ``skip`` are left out (pieces may lack them)."""
    first = pieces[0]
    if skip:
        first = first.drop_vars(sorted(skip), errors="ignore")
    if len(pieces) == 1:
        return first

    def joined(name: str) -> Any:
        var = first.variables[name]
        if dim not in var.dims:
            return var
        axis = var.dims.index(dim)
        values = np.concatenate([p.variables[name].values for p in pieces], axis=axis)
        return (var.dims, values, var.attrs)

    data_vars = {name: joined(name) for name in first.data_vars}
    coords = {name: joined(name) for name in first.coords}
    return xr.Dataset(data_vars, coords=coords, attrs=first.attrs)


def _rows(
    pieces: list[xr.Dataset], name: str, dim: str, lo: int, hi: int
) -> tuple[tuple[str, ...], list[np.ndarray]]:
    """Rows ``lo .. hi`` (counted over the joined pieces) of variable ``name``: its
    dims and the pieces' arrays cut to those rows (views, nothing copied). A piece
    without ``name`` (its rows of it already written, see
    :class:`~tokenfield.runs.writer.RunWriter`) counts its rows and gives none;
    ``((), [])`` when no piece has it."""
    having = [piece for piece in pieces if name in piece.variables]
    if not having:
        return (), []
    dims = tuple(having[0].variables[name].dims)
    axis = dims.index(dim)
    parts, offset = [], 0
    for piece in pieces:
        if name not in piece.variables:
            n = int(piece.sizes[dim])
            if max(lo, offset) < min(hi, offset + n):
                raise ValueError(f"rows {lo}..{hi} of '{name}' include a piece without them")
            offset += n
            continue
        values = piece.variables[name].transpose(*dims).values
        n = values.shape[axis]
        a, b = max(lo, offset), min(hi, offset + n)
        if a < b:
            index = [slice(None)] * values.ndim
            index[axis] = slice(a - offset, b - offset)
            parts.append(values[tuple(index)])
        offset += n
    if not parts:  # no rows (a retried write): none of the first piece's, for the shape
        values = having[0].variables[name].transpose(*dims).values
        index = [slice(None)] * values.ndim
        index[axis] = slice(0, 0)
        parts.append(values[tuple(index)])
    return dims, parts


def create_store(
    store: Path, ds: xr.Dataset, dim: str, rows: int, encoding: Mapping[str, Any]
) -> dict[str, Any]:
    """Create ``store`` (replacing any) for ``ds``'s variables, its arrays along
    ``dim`` sized ``rows`` and not written (their fill values), the others written
    whole; return its arrays opened for writing, as :func:`open_arrays` does.

    Every array is what ``xarray.Dataset.to_zarr`` (mode ``"w"``, ``encoding``)
    makes, then resized to ``rows``, byte for byte: xarray encodes and lays out
    every array in a Zarr store in memory, and its files are then written here in
    one pass, each once. Written by xarray into a directory, each array cost about
    3 ms (its metadata written twice, each write a trip through Zarr's event loop
    and its thread), and its metadata was read back to open it (about 1 ms)."""
    import shutil

    from zarr.core.array import Array, AsyncArray
    from zarr.core.buffer import default_buffer_prototype
    from zarr.storage import LocalStore, MemoryStore, StorePath

    files: dict[str, Any] = {}
    _empty(ds, dim).to_zarr(
        MemoryStore(files), mode="w", consolidated=False, write_empty_chunks=True, encoding=encoding
    )
    if store.exists():
        shutil.rmtree(store)
    local = LocalStore(str(store))
    arrays: dict[str, Any] = {}
    for key, value in files.items():
        content = value.to_bytes()
        name, _slash, leaf = key.rpartition("/")
        if leaf == "zarr.json" and name:  # an array's metadata (the group's is "zarr.json")
            meta = json.loads(content)
            dims = list(meta.get("dimension_names") or ())
            if dim in dims:
                meta["shape"][dims.index(dim)] = rows
            array = AsyncArray(meta, StorePath(local, name), config={"write_empty_chunks": True})
            content = array.metadata.to_buffer_dict(default_buffer_prototype())[leaf].to_bytes()
            arrays[name] = Array(array)
        path = store / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
    return arrays


def open_arrays(store: Path, cache: dict[str, Any] | None = None) -> dict[str, Any]:
    """The store's arrays by name, opened for writing (every chunk written, even one
    that holds only fill values): ``cache``'s when it holds them (an earlier call's:
    only their writer changes the store meanwhile, and Zarr updates an open array's
    metadata when it resizes it), else opened (one read of each array's metadata)
    and put in ``cache``."""
    if cache:
        return dict(cache)
    import zarr

    with zarr.config.set({"array.write_empty_chunks": True}):  # read when an array opens
        group = zarr.open_group(str(store), mode="r+")
        arrays = {name: group[name] for name in group.array_keys()}
    if cache is not None:
        cache.update(arrays)
    return arrays


def consolidate(store: Path, arrays: Mapping[str, Any]) -> None:
    """Consolidate the store's metadata (what ``zarr.consolidate_metadata`` writes, so
    that plain ``xarray.open_zarr`` opens it with one read): from ``arrays``, the
    store's open arrays (:func:`open_arrays`), when they are all its arrays; their
    metadata is not read again (about 0.6 ms an array). Else Zarr reads it."""
    import zarr

    names = {
        entry.name
        for entry in os.scandir(store)
        if entry.is_dir() and os.path.isfile(os.path.join(entry.path, "zarr.json"))
    }
    if not arrays or names != set(arrays):
        zarr.consolidate_metadata(str(store))
        return
    from zarr.core.group import ConsolidatedMetadata, GroupMetadata
    from zarr.core.metadata.io import save_metadata
    from zarr.core.sync import sync
    from zarr.storage import LocalStore, StorePath

    root = json.loads((store / "zarr.json").read_bytes())
    metadata = {name: array.metadata for name, array in arrays.items()}
    group = GroupMetadata(
        attributes=root.get("attributes", {}),
        consolidated_metadata=ConsolidatedMetadata(metadata=metadata),
    )
    sync(save_metadata(StorePath(LocalStore(store)), group))


def growing_arrays(arrays: Mapping[str, Any], dim: str) -> set[str]:
    """The names of the arrays that grow along ``dim``."""
    return {name for name, array in arrays.items() if dim in (array.metadata.dimension_names or ())}


def _write_at(
    store: Path,
    merged: xr.Dataset,
    dim: str,
    at: int,
    rows: Mapping[str, tuple[tuple[str, ...], list[np.ndarray]]] | None = None,
    cache: dict[str, Any] | None = None,
    grow_to: int | None = None,
    rows_at: int | None = None,
) -> bool:
    """Write ``merged``'s rows at ``at .. at + n`` of the existing arrays along
    ``dim`` with plain Zarr writes: no re-reading of the store's data, a cost
    independent of its size. Each array is resized to ``at + n`` rows (a new
    ``zarr.json``), or, with ``grow_to`` (a pre-sized store, see
    :class:`~tokenfield.runs.writer.RunWriter`'s ``size_hint``), never shrunk and
    grown only where it holds fewer than ``max(at + n, grow_to)`` rows: the rows
    are written into their region, with no metadata written at all while they
    fit. ``rows``: more variables, each as its dims and consecutive blocks of its
    rows (:func:`_rows`), not joined, written at ``rows_at`` (default ``at``; the
    large variables may be ahead of the others, see
    :class:`~tokenfield.runs.writer.RunWriter`); one with no blocks has nothing to
    write. ``cache``: as :func:`open_arrays`. False (nothing written) when the
    store's arrays do not match the variables one to one."""
    rows = dict(rows or {})
    rows_at = at if rows_at is None else rows_at
    import zarr

    arrays = open_arrays(store, cache)
    growing = growing_arrays(arrays, dim)
    wanted = {name for name, var in merged.variables.items() if dim in var.dims} | set(rows)
    if growing != wanted:
        return False
    plan: list[tuple[Any, int, Any, int]] = []
    for name in sorted(wanted):
        array = arrays[name]
        dims = tuple(array.metadata.dimension_names)
        where = rows_at if name in rows else at
        if name in rows:
            var_dims, parts = rows[name]
            if not parts:
                continue
            if var_dims != dims:
                var = xr.Variable(var_dims, np.concatenate(parts, axis=var_dims.index(dim)))
            else:
                first = parts[0]
                axis = dims.index(dim)
                same = all(p.dtype == array.dtype for p in parts) and all(
                    size == first.shape[i] for i, size in enumerate(array.shape) if i != axis
                )
                if not same:
                    return False
                plan.append((array, axis, parts, where))
                continue
        else:
            var = merged.variables[name]
        if set(dims) != set(var.dims) or len(dims) != var.ndim:
            return False
        values = var.transpose(*dims).values
        text = values.dtype.kind in "OUT"
        if text != (array.dtype.kind in "OUT") or (not text and values.dtype != array.dtype):
            return False
        axis = dims.index(dim)
        if any(size != values.shape[i] for i, size in enumerate(array.shape) if i != axis):
            return False  # another feature size, heads, k, ...
        plan.append((array, axis, values, where))
    resizes, writes, straight = [], [], []
    for array, axis, values, begin in plan:  # begin: each variable's own first row
        n = _count(values, axis)
        shape = list(array.shape)
        if grow_to is None:
            shape[axis] = begin + n
        else:
            shape[axis] = max(shape[axis], begin + n, grow_to)
        if tuple(shape) != tuple(array.shape):
            resizes.append((array, "resize", (tuple(shape),)))
        done = _whole_rows(array, axis, n, begin)
        if done:
            straight.append((array, axis, values, begin))
        if done < n:
            if isinstance(values, list):
                values = np.concatenate(values, axis=axis) if len(values) > 1 else values[0]
            index = [slice(None)] * values.ndim
            index[axis] = slice(begin + done, begin + n)
            rest = values if done == 0 else np.take(values, range(done, n), axis=axis)
            writes.append((array, "setitem", (tuple(index), rest)))
    # Zarr's part (every array's new shape, then the partial chunks, the sharded
    # coordinates, the strings: each step for all arrays at once, in one trip
    # through Zarr's event loop) runs while this thread writes the whole chunks
    # straight to their files (other files than Zarr's).
    with zarr.config.set({"array.write_empty_chunks": True}):
        zarr_part = _gather([resizes, writes])
        try:
            for array, axis, values, where in straight:
                _write_whole_chunks(store, array, axis, values, where)
        finally:
            zarr_part()
    return True


def _gather(steps: list[list[tuple[Any, str, tuple[Any, ...]]]]) -> Any:
    """Start ``array.<method>(*args)`` for every call of each step, the calls of a
    step concurrently and the steps one after the other, on Zarr's event loop (its
    async arrays); return the function that waits for them (and raises their
    error). Where that API is missing, everything is done here, one by one."""
    try:
        import asyncio

        from zarr.core.sync import _get_loop

        bound = [[(getattr(a._async_array, m), args) for a, m, args in step] for step in steps]
        loop = _get_loop()
    except (ImportError, AttributeError):
        for step in steps:
            for array, method, args in step:
                if method == "setitem":
                    array[args[0]] = args[1]
                else:
                    getattr(array, method)(*args)
        return lambda: None

    async def run() -> None:
        for step in bound:
            await asyncio.gather(*(call(*args) for call, args in step))

    future = asyncio.run_coroutine_threadsafe(run(), loop)
    return future.result


def _whole_rows(array: Any, axis: int, n: int, at: int) -> int:
    """The rows of ``n`` written at ``at`` that :func:`_write_whole_chunks` writes."""
    rows = int(array.chunks[axis])
    if at % rows or n < rows or not _plain_chunks(array, axis):
        return 0
    return n // rows * rows


def _empty(ds: xr.Dataset, dim: str) -> xr.Dataset:
    """``ds`` with no rows along ``dim``; its strings kept strings (an empty object
    array would be stored as floats)."""
    empty = ds.isel({dim: slice(0, 0)})
    for name, var in empty.variables.items():
        if var.dtype != object:
            continue
        if dim in var.dims:
            strings = np.empty(var.shape, dtype=np.dtypes.StringDType())
        else:  # written whole now: as strings, not left to xarray's dtype inference
            strings = np.asarray(var.values, dtype=np.dtypes.StringDType())
        empty[name] = xr.Variable(var.dims, strings, var.attrs)
    return empty


def _plain_chunks(array: Any, axis: int) -> bool:
    """Whether ``array``'s chunk files are its raw little-endian C-order bytes and
    a CRC-32C (codecs ``bytes``, ``crc32c``; no sharding), one chunk across every
    axis but ``axis``, under the default ``c/i/j/k`` keys: then a whole chunk's file
    can be written straight from the rows (:func:`_write_whole_chunks`)."""
    meta = array.metadata.to_dict()
    codecs = [c.get("name") for c in meta.get("codecs", ())]
    bytes_codec = (meta.get("codecs") or [{}])[0]
    keys = meta.get("chunk_key_encoding", {})
    grid = meta.get("chunk_grid", {})
    return (
        codecs == ["bytes", "crc32c"]
        and (bytes_codec.get("configuration") or {}).get("endian", "little") == "little"
        and keys.get("name") == "default"
        and (keys.get("configuration") or {}).get("separator", "/") == "/"
        and grid.get("name") == "regular"
        and array.dtype.kind in "fiub"
        and (array.dtype.itemsize == 1 or array.dtype.byteorder in "<=")
        and all(
            c == s
            for i, (c, s) in enumerate(zip(array.chunks, array.shape, strict=True))
            if i != axis
        )
    )


def _count(values: np.ndarray | list[np.ndarray], axis: int) -> int:
    """Rows along ``axis`` of an array or of consecutive blocks of rows."""
    if isinstance(values, list):
        return sum(int(v.shape[axis]) for v in values)
    return int(values.shape[axis])


def _write_whole_chunks(
    store: Path, array: Any, axis: int, values: np.ndarray | list[np.ndarray], at: int
) -> int:
    """Write the whole chunks of ``values`` (rows ``at ..`` along ``axis``; an array,
    or consecutive blocks of rows, e.g. the pieces of a flush) as the chunk files
    Zarr writes for :func:`_plain_chunks` arrays (the Zarr v3 ``bytes`` and
    ``crc32c`` codecs: the chunk's bytes, then their CRC-32C, little-endian),
    straight from the rows: no joined copy of the pieces, no copy of the chunk and
    no trip through Zarr's codec pipeline, the writer's largest costs besides the
    disk. Returns the rows written: 0 unless ``at`` is on a chunk boundary and the
    array qualifies; the rest is for Zarr (a partial chunk is padded to the
    chunk's shape, as Zarr does)."""
    rows = int(array.chunks[axis])
    blocks = values if isinstance(values, list) else [values]
    whole = _whole_rows(array, axis, _count(blocks, axis), at) // rows
    if not whole:
        return 0
    import google_crc32c

    shape = blocks[0].shape
    lead = int(np.prod(shape[:axis], dtype=np.int64))
    flats, starts, offset = [], [], 0
    for block in blocks:  # C order: leading dims, rows, trailing dims
        # a view where it can be (a piece cut at a chunk boundary along ``axis`` is
        # not contiguous, but each of its (row, trailing) segments is): no copy
        block = block.astype(array.dtype, copy=False)
        flats.append(block.reshape(lead, block.shape[axis], -1))
        starts.append(offset)
        offset += block.shape[axis]
    folder = Path(store) / array.path / "c"
    for k in range(whole):
        index = ["0"] * len(shape)
        index[axis] = str(at // rows + k)
        path = folder.joinpath(*index)
        path.parent.mkdir(parents=True, exist_ok=True)
        lo, hi = k * rows, (k + 1) * rows
        crc = 0
        with open(path, "wb") as f:
            for i in range(lead):
                for flat, begin in zip(flats, starts, strict=True):
                    a, b = max(lo, begin), min(hi, begin + flat.shape[1])
                    if a < b:
                        segment = flat[i, a - begin : b - begin]
                        if not segment.flags.c_contiguous:
                            segment = np.ascontiguousarray(segment)
                        crc = google_crc32c.extend(crc, segment)
                        f.write(segment)
            f.write(np.array([crc], dtype="<u4").tobytes())  # little-endian on any host
    return whole * rows


@contextlib.contextmanager
def _write_errors(store: Path):
    """An OS error while writing the store (read-only, disk full) becomes one line;
    the run stays partial and resumes once the cause is fixed."""
    try:
        yield
    except OSError as exc:
        raise UserError(
            f"cannot write '{store}' ({exc.strerror or exc})",
            "fix the cause (permissions, free space), then run the same command again",
        ) from None

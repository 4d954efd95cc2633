"""Reading a run back: open_run, and the checks that a store is whole (chunk
checksums, codecs, a baseline that matches its run)."""

from __future__ import annotations

import contextlib
import json
import os
import warnings
from pathlib import Path
from typing import Any

import xarray as xr

from tokenfield.errors import UserError
from tokenfield.runs.info import RunInfo, check_against_store, read_run_info
from tokenfield.runs.layout import TRAJECTORY


def open_run(path: str | Path, *, allow_partial: bool = False) -> xr.Dataset:
    """Open a run's trajectory as a lazily loaded :class:`xarray.Dataset`.

    The run's ``run.json`` contents are in ``ds.attrs["run"]``. A partial run is
    refused unless ``allow_partial``; it is then read up to its recorded progress
    (``progress.size`` rows in ``run.json``): rows past it are not trustworthy
    (written by a flush whose record was interrupted, or not written at all: a
    store pre-sized to the run's expected size holds fill values there). A
    partial parallel trace (``--workers``) allocates every row up front and is
    read whole: its shards not yet traced hold fill values.

    Args:
        path: the run directory (written by :func:`tokenfield.trace` or
            :func:`tokenfield.simulate`).
        allow_partial: open a run that did not finish.

    Returns:
        The run's Dataset (``states`` and its coordinates), read lazily.

    Raises:
        UserError: ``path`` is not a run, or the run is partial and
            ``allow_partial`` is false.

    Example:
        >>> ds = tf.open_run("runs/spectrum")             # doctest: +SKIP
        >>> ds.states.dims                                # doctest: +SKIP
        ('time', 'particle', 'feature')
    """
    return _open_run(path, allow_partial=allow_partial, written=False)


def _open_run(path: str | Path, *, allow_partial: bool, written: bool) -> xr.Dataset:
    """:func:`open_run`; ``written``: the run was written whole by this process just
    now (:func:`tokenfield.trace`'s return value), so the checks for damage at rest
    (missing chunk files, another tool's codecs) are skipped; each chunk read is
    still checked against its checksum."""
    info = read_run_info(path)
    if not info.complete and not allow_partial:
        raise UserError(
            f"run '{path}' is partial (interrupted)",
            "re-run the command that made it to resume, or pass allow_partial=True",
            cli_fix="run the command that made it (tokenfield trace or simulate with the "
            "same arguments) again to finish it",
        )
    store = Path(path) / TRAJECTORY
    if not store.exists():
        raise UserError(f"run '{path}' has no {TRAJECTORY}", "re-create it with --overwrite")
    if not written:
        check_object_codecs(path)  # a Zarr v2 pickle (or other object) codec: one line
    if info.complete and info.all_chunks and not written:
        check_chunks(path)
    from dask.base import tokenize

    # Opened unchunked (lazily indexed, no dask), as plain xarray.open_zarr opens it
    # with chunks=None; not kept in memory by xarray once read (cache=False).
    opening = {"engine": "zarr", "chunks": None, "cache": False}
    with warnings.catch_warnings(), _read_errors(path):
        warnings.simplefilter("ignore")
        ds = None
        if info.complete:  # finish() consolidated the metadata: one read instead of one per array
            with contextlib.suppress(Exception):
                ds = xr.open_dataset(store, consolidated=True, **opening)
        if ds is None:
            ds = xr.open_dataset(store, consolidated=False, **opening)
        ds = _recorded_rows(info, ds)
        # Coordinates (labels, prompts, tokens) are small: load them so that they are
        # plain numpy arrays, each in place (no re-alignment per coordinate), one
        # after the other (a large run's decoded chunks are not all held at once),
        # in this thread, straight from Zarr: through dask, each cost a graph, its
        # optimisation and a scheduler's run (about 2 ms a coordinate).
        for name in list(ds.coords):
            ds.variables[name].load()
        # The data variables (the states) stay lazy: dask arrays in the store's
        # chunks, as xarray.open_zarr makes them, named after the store and its
        # modification time. Every chunk read goes through _ChunkGetter: a chunk
        # whose checksum does not match (or that does not decode) is one line naming
        # the run, whenever they are read (analyze, report, lens, .load()).
        token = tokenize(str(store), os.path.getmtime(store))
        for name in list(ds.data_vars):
            variable = ds.variables[name]
            if variable.ndim:
                reading = {"getitem": _ChunkGetter(str(path)), "name": f"open_run-{name}-{token}"}
                chunks = variable.encoding.get("preferred_chunks", {})
                variable.data = variable.chunk(chunks, from_array_kwargs=reading).data
    check_against_store(info, ds)
    ds.attrs["run"] = info.to_dict()
    return ds


def _recorded_rows(info: RunInfo, ds: xr.Dataset) -> xr.Dataset:
    """A partial run's rows up to its recorded progress (lazily: nothing is read).
    A complete run, a parallel trace (every row allocated by its plan) or a store
    holding fewer rows than recorded (refused by ``check_against_store``) is
    returned as it is."""
    size = info.progress.get("size")
    dim = "particle" if info.kind == "trace" else "time"
    if info.complete or "shards" in info.progress or not isinstance(size, int):
        return ds
    if dim not in ds.sizes or int(ds.sizes[dim]) <= size:
        return ds
    return ds.isel({dim: slice(0, size)})


def damaged_error(
    path: str | Path, exc: BaseException, what: str = "a damaged chunk in"
) -> UserError:
    detail = str(exc).splitlines()[0] if str(exc) else ""
    return UserError(
        f"run '{path}' has {what} {TRAJECTORY} ({type(exc).__name__}: {detail})",
        "re-create the run with the same command (trace or simulate) and --overwrite",
    )


class _ChunkGetter:
    """``dask.array.from_array``'s ``getitem`` for a run's arrays: the usual getter,
    with a chunk that fails to read or decode (checksum mismatch, garbage,
    truncation) turned into :class:`UserError` naming the run. A class, not a
    closure, so that a dask graph holding it can be pickled."""

    def __init__(self, path: str):
        self.path = path

    def __call__(self, a: Any, b: Any, asarray: bool = True, lock: Any = None) -> Any:
        from dask.array.core import getter

        try:
            return getter(a, b, asarray=asarray, lock=lock)
        except (UserError, MemoryError):
            raise
        except Exception as exc:  # noqa: BLE001 - codecs report damage in many types
            raise damaged_error(self.path, exc) from None


@contextlib.contextmanager
def _read_errors(path: str | Path):
    """Damage found while opening the store (its index coordinates are read at
    once, not through the getter) is one line too."""
    try:
        yield
    except (UserError, MemoryError):
        raise
    except Exception as exc:  # noqa: BLE001
        raise damaged_error(path, exc, "a damaged") from None


def _feature_dim(info: RunInfo) -> int | None:
    import zarr

    with contextlib.suppress(Exception), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        array = zarr.open_group(str(info.path / TRAJECTORY), mode="r")["states"]
        return int(array.shape[-1])
    return None


def _prompt_texts(info: RunInfo) -> list[str] | None:
    prompts = info.config.get("prompts")
    if not isinstance(prompts, list):
        return None
    return [p.get("text") if isinstance(p, dict) else p for p in prompts]


def check_baseline(run: str | Path, baseline: str | Path) -> None:
    """Refuse a baseline that cannot be compared with ``run``: another kind,
    another feature dimension, or (traces) other prompts or another order.

    Raises:
        UserError: one line naming the difference.
    """
    info, base = read_run_info(run), read_run_info(baseline)
    fix = "pass a baseline made the same way (e.g. the same trace with --random-weights)"
    if info.kind != base.kind:
        raise UserError(f"baseline '{baseline}' is a {base.kind} run, '{run}' a {info.kind}", fix)
    d_run, d_base = _feature_dim(info), _feature_dim(base)
    if d_run is not None and d_base is not None and d_run != d_base:
        raise UserError(
            f"baseline '{baseline}' has d = {d_base} features, '{run}' has d = {d_run}", fix
        )
    texts, base_texts = _prompt_texts(info), _prompt_texts(base)
    if texts is not None and base_texts is not None and texts != base_texts:
        if sorted(map(str, texts)) == sorted(map(str, base_texts)):
            what = "the same prompts in another order"
        else:
            what = "other prompts" + (
                f" ({len(base_texts)} vs {len(texts)})" if len(texts) != len(base_texts) else ""
            )
        raise UserError(f"baseline '{baseline}' holds {what} than '{run}'", fix)


def _chunk_files(array: Any) -> tuple[int, int]:
    """The chunk files an array should have and those stored: for a sharded array
    (a buffered run's coordinates) its shards, one file each (zarr's
    ``nchunks_initialized`` counts inner chunks there)."""
    if getattr(array, "shards", None) is None:
        return int(array.nchunks), int(array.nchunks_initialized)
    return int(array._nshards), int(array._nshards_initialized)


def check_chunks(path: str | Path) -> None:
    """Raise :class:`UserError` when a chunk file of the run's store is missing
    (a deleted chunk would otherwise read back as NaN, silently)."""
    import zarr

    store = Path(path) / TRAJECTORY
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            group = zarr.open_group(str(store), mode="r")
            for name, array in group.arrays():
                files, stored = _chunk_files(array)
                missing = files - stored
                if missing:
                    raise UserError(
                        f"run '{path}' is damaged: {missing} of the {files} chunk "
                        f"files of '{name}' in {TRAJECTORY} are missing",
                        "re-create the run with the same command and --overwrite",
                    )
    except UserError:
        raise
    except Exception as exc:  # noqa: BLE001 - zarr reports damage in many types
        raise UserError(
            f"run '{path}' has a damaged {TRAJECTORY} ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''})",
            "re-create the run with the same command and --overwrite",
        ) from None


#: Zarr v2 object codecs that zarr 3 reads (strings and bytes); any other (pickle,
#: json2, msgpack2, ...) is refused before zarr meets it.
READABLE_OBJECT_CODECS = ("vlen-utf8", "vlen-bytes")


def check_object_codecs(path: str | Path) -> None:
    """Refuse a Zarr v2 store with an array of Python objects in a codec zarr 3 cannot
    read (another tool's store, or an old one), from the arrays' ``.zarray`` files
    alone. Without it, zarr fails with a traceback (or a misleading "damaged").

    Raises:
        UserError: naming the array, the codec and what to do.
    """

    store = Path(path) / TRAJECTORY
    for meta in sorted(store.glob("*/.zarray")):
        try:
            array = json.loads(meta.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue  # a damaged file: check_chunks and zarr report it
        if not isinstance(array, dict) or "O" not in str(array.get("dtype", "")):
            continue
        codecs = [c for c in (array.get("filters") or []) if isinstance(c, dict)]
        codec = str(codecs[0].get("id")) if codecs else "none"
        if codec not in READABLE_OBJECT_CODECS:
            raise UserError(
                f"run '{path}' stores '{meta.parent.name}' as Python objects with the Zarr v2 "
                f"codec '{codec}', which tokenfield cannot read (it writes text as UTF-8)",
                "re-create the run with the same command and --overwrite",
            )

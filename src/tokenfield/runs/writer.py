"""The streamed, resumable writer of a run (RunWriter), the checks before writing,
and the Zarr encoding (checksummed chunks) it writes with."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
import warnings
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from tokenfield._io import write_json_atomic
from tokenfield._lock import WriterLock
from tokenfield._lock import acquire as acquire_lock
from tokenfield._version import __version__
from tokenfield.errors import UserError
from tokenfield.runs.info import (
    CONFIG_ATTR,
    RunInfo,
    RunKind,
    canonical_config,
    check_prefix,
    is_run,
    log_write,
    looks_like_run,
    overwrite_plan,
    read_run_info,
    user_files,
)
from tokenfield.runs.layout import FIGURES, RUN_JSON, TRAJECTORY, figures_dir
from tokenfield.runs.read import damaged_error


def check_results_writable(run: str | Path, command: str) -> None:
    """Refuse, before any work, a run directory that ``command`` cannot write its
    results into (a read-only filesystem or mount, no permission): one file is
    created and removed in the run and in its ``figures/``. ``os.access`` is not
    enough: it says yes to root on a read-only mount's files in some setups, and
    the whole analysis would run before the first write failed.

    Raises:
        UserError: naming the directory and the cause.
    """
    import tempfile

    run = Path(run)
    figures = figures_dir(run, create=False)  # a symlinked figures/ is refused, not probed
    for directory in (run, figures):
        if not directory.is_dir():
            continue  # figures/ is made later, in the run checked first
        try:
            fd, probe = tempfile.mkstemp(prefix=".tokenfield-probe.", dir=directory)
        except OSError as exc:
            raise UserError(
                f"'{command}' cannot write its results into '{directory}' "
                f"({exc.strerror or type(exc).__name__})",
                "make it writable (chmod u+w, or remount read-write), or copy the run "
                "somewhere writable",
            ) from None
        os.close(fd)
        os.unlink(probe)


def check_writable_dir(path: Path) -> None:
    """Raise :class:`UserError` unless ``path`` can be created and written."""
    probe = path
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise UserError(
            f"output path '{path}' is inside a file ('{probe}')", "choose another --out"
        )
    if not os.access(probe, os.W_OK | os.X_OK):
        raise UserError(f"output directory '{probe}' is not writable", "choose another --out")


# rows per chunk of a buffered run's 1-D coordinates along its growing dimension
COORD_CHUNK = 1 << 16
# bytes per chunk of a buffered run's larger variables (e.g. a trace's states)
CHUNK_BYTES = 4 << 20


class RunWriter:
    """Create or resume a run directory and stream pieces of a Dataset into it.

    Args:
        path: the run directory.
        kind: ``"trace"`` or ``"simulation"``.
        config: everything that determines the run's content (JSON-able). A
            directory holding a run with a different config is refused unless
            ``overwrite``.
        append_dim: the dimension that grows as pieces arrive.
        overwrite: replace the run at ``path`` (only tokenfield's own files are
            deleted; a directory that is not a run is refused).
        batch_size: recorded in ``run.json`` (progress); a partial run started
            with another batch size is refused (its states would mix two
            roundings; see :func:`tokenfield.trace`).
        weights_sha256: the hash of the model weights used, recorded in
            ``run.json``; a partial run started with other weights is refused.
        flush_seconds: keep appended pieces in memory and write them together
            once this many seconds passed since the last write (0: write every
            piece at once). Pending pieces are also written by :meth:`finish`,
            by :meth:`close` (an interrupt keeps the finished work) and once
            they hold ``flush_bytes`` or number ``flush_pieces``.
        flush_bytes: the most bytes of pieces kept in memory.
        flush_pieces: the most pieces kept in memory (a piece's Python objects and
            indexes take far more memory than its ``nbytes`` when it is small:
            measured about 0.7 MiB of resident memory per 150 kB piece).
        size_hint: how many rows the run will hold, when the caller knows
            (a trace: its particles): a buffered run's 1-D coordinates are
            chunked by at most this many rows, so that a small run does not
            encode, write and read back chunks padded to :data:`COORD_CHUNK` rows.
        background: with ``flush_seconds``, write the pieces in a background
            thread while the caller computes the next ones (one write at a
            time; at most ``flush_bytes`` more wait in memory meanwhile). An
            error of that write is raised by the next :meth:`append`,
            :meth:`flush` or :meth:`finish`.

    The writer holds the directory's lock (:mod:`tokenfield._lock`) from
    construction until :meth:`finish` or :meth:`close`; a second writer fails
    with :class:`UserError`.

    After construction, :attr:`done` says how many units of work (prompts,
    saved steps, ...) are already stored, so the caller skips them.

    Raises:
        UserError: ``path`` holds another run (and not ``overwrite``), a
            directory that is not a run, or is locked by another writer.

    Example:
        >>> writer = tf.RunWriter("runs/mine", "simulation", {"seed": 0},
        ...                       append_dim="time")          # doctest: +SKIP
        >>> writer.append(piece, done=1)                      # doctest: +SKIP
        >>> writer.finish()                                   # doctest: +SKIP
    """

    def __init__(
        self,
        path: str | Path,
        kind: RunKind,
        config: Mapping[str, Any],
        *,
        append_dim: str,
        overwrite: bool = False,
        batch_size: int | None = None,
        weights_sha256: str | None = None,
        flush_seconds: float = 0.0,
        flush_bytes: int = 64 << 20,
        flush_pieces: int = 64,
        background: bool = False,
        size_hint: int | None = None,
    ):
        self.path = Path(path)
        self.size_hint = int(size_hint) if size_hint else None
        self._executor: ThreadPoolExecutor | None = None
        self._writing: Future[None] | None = None
        self._inflight: list[tuple[xr.Dataset, int, dict[str, Any]]] = []  # what it writes
        self.background = bool(background) and float(flush_seconds) > 0
        self.append_dim = append_dim
        self.flush_seconds = float(flush_seconds)
        self.flush_bytes = int(flush_bytes)
        self.flush_pieces = max(1, int(flush_pieces))
        self._pending: list[tuple[xr.Dataset, int, dict[str, Any]]] = []
        self._pending_bytes = 0
        self._last_flush = time.monotonic()
        self.config = canonical_config(config)
        # every piece carries these attrs: one string, made once (a trace's config
        # lists its prompts, so a string per piece grew with the prompts twice over)
        self._attrs = {CONFIG_ATTR: json.dumps(self.config), "kind": kind}
        check_writable_dir(self.path)
        if self.path.exists() and not self.path.is_dir():
            raise UserError(f"output path '{self.path}' is a file", "choose a directory for --out")
        # One writer per run: the lock comes before anything in the directory is read
        # or touched, and is held until finish() or close().
        self._created = False
        self._lock: WriterLock | None = acquire_lock(self.path, what="run")
        try:
            self._open(kind, overwrite, batch_size, weights_sha256)
        except BaseException:
            self.close()
            raise

    def _open(
        self, kind: RunKind, overwrite: bool, batch_size: int | None, weights: str | None
    ) -> None:
        replaced = False
        if overwrite and (is_run(self.path) or looks_like_run(self.path)):
            # --overwrite replaces tokenfield's run even when its run.json is
            # damaged or missing (nothing else could repair it)
            try:
                read_run_info(self.path)
            except UserError:
                if not looks_like_run(self.path):
                    raise
                self._clear()
                replaced = True
        existing = read_run_info(self.path) if is_run(self.path) else None
        if existing is not None and not overwrite and existing.config != self.config:
            changed = sorted(
                k
                for k in set(existing.config) | set(self.config)
                if existing.config.get(k) != self.config.get(k)
            )
            raise UserError(
                f"'{self.path}' holds a run made with a different config "
                f"(differs in: {', '.join(changed)})",
                "pass --overwrite to replace it, or choose another --out",
            )
        if existing is not None and not overwrite and existing.kind != kind:
            raise UserError(f"'{self.path}' holds a {existing.kind} run", "choose another --out")
        if existing is None and not replaced and looks_like_run(self.path):
            raise UserError(
                f"'{self.path}' holds a tokenfield run without its {RUN_JSON} (damaged)",
                "pass --overwrite to replace it, or choose another --out",
            )
        if existing is None and not replaced and user_files(self.path):
            raise UserError(
                f"output directory '{self.path}' exists and is not a tokenfield run"
                + (" (--overwrite only replaces runs)" if overwrite else ""),
                "choose an empty or new directory",
            )
        if (
            existing is not None
            and not overwrite
            and not existing.complete
            and batch_size is not None
            and existing.progress.get("batch_size", batch_size) != batch_size
        ):
            before = existing.progress["batch_size"]
            raise UserError(
                f"'{self.path}' was started with --batch-size {before}, not {batch_size}; "
                "a resume with another batch size would mix differently rounded states",
                f"pass --batch-size {before} to resume, or --overwrite to start again",
            )
        if (
            existing is not None
            and not overwrite
            and not existing.complete
            and weights
            and existing.weights_sha256
            and existing.weights_sha256 != weights
        ):
            raise UserError(
                f"'{self.path}' was started with other model weights "
                f"({existing.weights_sha256[:19]}..., now {weights[:19]}...)",
                "pass --overwrite to start again with these weights, or choose another --out",
            )
        if overwrite and existing is not None:
            self._clear()
            existing = None
        self.path.mkdir(parents=True, exist_ok=True)
        self.batch_size = batch_size
        self._created = existing is None
        if existing is None:
            progress: dict[str, Any] = {"done": 0, "size": 0}
            if batch_size is not None:
                progress["batch_size"] = batch_size
            self.info = RunInfo(
                self.path,
                kind,
                self.config,
                "partial",
                progress,
                __version__,
                all_chunks=True,
                weights_sha256=weights,
            )
            write_json_atomic(self.path / RUN_JSON, self.info.to_dict())
        else:
            self.info = existing
            if not existing.complete:
                self._check_store_writable()
                self._check_resume()
                self._trim_to_progress()

    def close(self) -> None:
        """Write pending pieces, release the writer lock (finish() does it too);
        safe to call twice. Called while an error unwinds, it keeps the work
        done before it; a failure to write then leaves the run at its last
        recorded progress (resumable), and the first error is the one raised."""
        with contextlib.suppress(Exception):
            self._wait()
        if self._pending and self._lock is not None:
            with contextlib.suppress(Exception):
                self.flush()
        self._pending = []
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        lock, self._lock = self._lock, None
        if lock is not None:
            lock.release()
            info = getattr(self, "info", None)  # None: refused before opening the run
            if info is not None and not getattr(self, "_abandoned", False):
                log_write(self.path, "finished" if info.complete else "partial")

    def __enter__(self) -> RunWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def store(self) -> Path:
        return self.path / TRAJECTORY

    @property
    def done(self) -> int:
        """Units of work already stored."""
        return int(self.info.progress.get("done", 0))

    @property
    def complete(self) -> bool:
        return self.info.complete

    def _clear(self) -> None:
        """Delete this run's files, by name: everything is checked before anything is
        deleted, and run.json goes last (an interrupted clear leaves a run that
        ``--overwrite`` clears again, not a directory it refuses)."""
        plan = overwrite_plan(self.path)
        for target in plan:
            if target.is_dir() and not target.is_symlink():
                if target.name == FIGURES:
                    with contextlib.suppress(OSError):  # kept when the user's files remain
                        target.rmdir()
                else:
                    shutil.rmtree(target)
            elif target.exists() or target.is_symlink():
                target.unlink()

    def _check_store_writable(self) -> None:
        """A resume rewrites the store: refuse a read-only one up front."""
        if not self.store.exists():
            return
        for folder, _dirs, files in os.walk(self.store):
            for entry in [folder, *(os.path.join(folder, f) for f in files)]:
                if not os.access(entry, os.W_OK):
                    raise UserError(
                        f"cannot resume '{self.path}': '{entry}' is read-only",
                        "make the run writable again (chmod -R u+w), or choose another --out",
                    )

    def _check_resume(self) -> None:
        """Refuse to resume when run.json's progress disagrees with the store: a
        resume trusts ``done`` (the prompts to skip) and ``size`` (the rows to keep)."""
        import zarr

        size, done = self.info.progress.get("size", 0), self.info.progress.get("done", 0)
        if not self.store.exists() or "shards" in self.info.progress or not size:
            return
        meta = self.path / RUN_JSON

        def refuse(what: str) -> None:
            raise UserError(
                f"'{meta}' does not match its store: {what}",
                "pass --overwrite to start again, or choose another --out",
            )

        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                group = zarr.open_group(str(self.store), mode="r")
                rows = int(group["states"].shape[0 if self.append_dim == "time" else 1])
                index = (
                    np.asarray(group["prompt_index"][:size])
                    if self.info.kind == "trace" and "prompt_index" in group
                    else None
                )
        except UserError:
            raise
        except Exception as exc:  # noqa: BLE001 - a store damaged in any way
            raise damaged_error(self.path, exc, "a damaged") from None
        if size > rows:
            refuse(f"progress size = {size}, but {TRAJECTORY} holds {rows} rows")
        if index is not None:
            check_prefix(index, done, refuse)
        elif self.info.kind == "simulation" and done != size:
            refuse(f"progress done = {done} saved times, size = {size}")

    def _trim_to_progress(self) -> None:
        """Drop rows written after the last recorded progress (a kill mid-append)."""
        if not self.store.exists():
            self.info.progress = {"done": 0, "size": 0}
            return
        size = int(self.info.progress.get("size", 0))
        if size == 0:
            shutil.rmtree(self.store)
            self.info.progress = {"done": 0, "size": 0}
            return
        self._trim_store(size)

    def append(self, piece: xr.Dataset, done: int, **progress: Any) -> None:
        """Append ``piece`` along the growing dimension, then record ``done`` units.

        ``progress`` holds any extra state needed to resume (e.g. an RNG state).
        With ``flush_seconds`` the piece may wait in memory for the next
        :meth:`flush`; ``done`` is recorded when it is written.
        """
        piece = piece.copy()
        piece.attrs = dict(self._attrs)
        self._pending.append((piece, int(done), progress))
        self._pending_bytes += int(piece.nbytes)
        if (
            self.flush_seconds <= 0
            or self._pending_bytes >= self.flush_bytes
            or len(self._pending) >= self.flush_pieces
            or time.monotonic() - self._last_flush >= self.flush_seconds
        ):
            if not self.background:
                self.flush()
                return
            self._wait()  # one write at a time, and its error (if any) raised here
            pending, self._pending, self._pending_bytes = self._pending, [], 0
            self._last_flush = time.monotonic()
            if self._executor is None:
                self._executor = ThreadPoolExecutor(1, thread_name_prefix="tokenfield-writer")
            self._inflight = pending
            self._writing = self._executor.submit(self._write, pending)

    def _wait(self) -> None:
        """Wait for the background write, if one runs; raise its error.

        The write is forgotten only once it has ended: an interrupt while
        waiting leaves it to :meth:`close`, which waits again before it writes
        anything else (two writes at once would both write at the same
        recorded size). A failed write's pieces go back in front of the
        pending ones, so that nothing after them is recorded without them."""
        writing = self._writing
        if writing is None:
            return
        try:
            writing.result()
        except Exception:
            self._pending = self._inflight + self._pending
            self._pending_bytes += sum(int(piece.nbytes) for piece, _d, _p in self._inflight)
            raise
        finally:
            if writing.done():
                self._writing, self._inflight = None, []

    def flush(self) -> None:
        """Write the pending pieces at the recorded size, then record the progress
        (after any background write)."""
        self._wait()
        self._write(self._pending)  # kept until written: close() retries an interrupted one
        self._pending, self._pending_bytes = [], 0
        self._last_flush = time.monotonic()

    def _write(self, pending: list[tuple[xr.Dataset, int, dict[str, Any]]]) -> None:
        if not pending:
            return
        pieces = [piece for piece, _done, _progress in pending]
        _piece, done, progress = pending[-1]
        merged = concat_pieces(pieces, self.append_dim)
        at = int(self.info.progress.get("size", 0))
        with _write_errors(self.store), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if at == 0 or not self.store.exists():
                chunk = int(pieces[0].sizes[self.append_dim])  # one piece per chunk, as before
                buffered = self.flush_seconds > 0
                # Buffered writers (few, large writes) keep 1-D coordinates (tokens,
                # prompts, ...) in long chunks: a few files to read back instead of
                # one per piece; each write rewrites at most one partial chunk. Their
                # large variables get chunks of about CHUNK_BYTES, which Zarr encodes
                # and writes fastest (measured: 590 MB/s at 4 MB, 300 MB/s at 40 MB).

                def rows(var: xr.Variable) -> int:
                    if not buffered:
                        return chunk
                    if var.ndim == 1:
                        hint = COORD_CHUNK if self.size_hint is None else self.size_hint
                        return max(chunk, min(COORD_CHUNK, hint))
                    row_bytes = var.dtype.itemsize * var.size // max(1, var.sizes[self.append_dim])
                    return max(1, min(chunk, CHUNK_BYTES // max(1, row_bytes)))

                encoding = store_encoding(merged)
                for name, var in merged.variables.items():
                    if self.append_dim in var.dims:
                        encoding[name]["chunks"] = tuple(
                            rows(var) if dim == self.append_dim else size
                            for dim, size in zip(var.dims, var.shape, strict=True)
                        )
                merged.to_zarr(
                    self.store,
                    mode="w",
                    consolidated=False,
                    write_empty_chunks=True,
                    encoding=encoding,
                )
            elif not _write_at(self.store, merged, self.append_dim, at):
                self._trim_store(at)  # layouts differ: let xarray append (and complain)
                merged.to_zarr(
                    self.store,
                    append_dim=self.append_dim,
                    consolidated=False,
                    write_empty_chunks=True,
                )
        size = at + int(merged.sizes[self.append_dim])
        keep = {"batch_size": self.batch_size} if self.batch_size is not None else {}
        # recorded only once run.json says so: an interrupted record is written again
        info = replace(self.info, progress={**progress, **keep, "done": int(done), "size": size})
        write_json_atomic(self.path / RUN_JSON, info.to_dict())
        self.info = info

    def _trim_store(self, size: int) -> None:
        """Cut every array growing along the append dimension back to ``size``."""
        import zarr

        group = zarr.open_group(str(self.store), mode="r+")
        for name in group.array_keys():
            array = group[name]
            dims = list(array.metadata.dimension_names or [])
            if self.append_dim in dims:
                axis = dims.index(self.append_dim)
                if array.shape[axis] != size:
                    shape = list(array.shape)
                    shape[axis] = size
                    array.resize(tuple(shape))

    def write_variables(self, variables: xr.Dataset) -> None:
        """Add variables that do not grow (e.g. computed at the end) to the store."""
        self._wait()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            variables.to_zarr(
                self.store,
                mode="a",
                consolidated=False,
                write_empty_chunks=True,
                encoding=store_encoding(variables),
            )
        if self.complete:
            self._consolidate()

    def _consolidate(self) -> None:
        """Consolidate Zarr metadata so plain ``xarray.open_zarr`` opens the store
        quickly and without warnings."""
        import zarr

        with _write_errors(self.store), warnings.catch_warnings():  # disk full: one line
            warnings.simplefilter("ignore")
            zarr.consolidate_metadata(str(self.store))

    def finish(self, **progress: Any) -> None:
        """Write pending pieces, mark the run complete (and consolidate the store's
        metadata)."""
        self.flush()
        if self.store.exists():
            self._consolidate()
        self.info.status = "complete"
        self.info.progress = {**self.info.progress, **progress}
        write_json_atomic(self.path / RUN_JSON, self.info.to_dict())
        log_write(self.path, "finished")
        self.close()

    def abandon(self) -> None:
        """Remove the run this writer created (e.g. after a numerical blow-up), so
        that a retry with other settings needs no --overwrite; then release.

        A run that existed before this writer (a resume) is left as it was."""
        with contextlib.suppress(Exception):
            self._wait()
        self._pending = []
        if self._created:
            self._clear()
        self._abandoned = True
        self.close()


def checksummed() -> tuple[Any, ...]:
    """The compressors of every array tokenfield writes into a run's store: Zstandard
    with its frame checksum (an xxHash64 of each chunk's content, checked on every
    read), so a damaged chunk is an error instead of silently wrong numbers. A
    standard Zarr v3 codec: plain ``xarray.open_zarr`` reads it."""
    from zarr.codecs import ZstdCodec

    return (ZstdCodec(level=0, checksum=True),)


def store_encoding(ds: xr.Dataset) -> dict[str, dict[str, Any]]:
    """Zarr encoding for every variable of ``ds`` (its compressors; see
    :func:`checksummed`), to pass to ``to_zarr`` when the arrays are created."""
    return {name: {"compressors": checksummed()} for name in ds.variables}


def concat_pieces(pieces: list[xr.Dataset], dim: str) -> xr.Dataset:
    """Pieces of one layout joined along ``dim``: numpy concatenation of every
    variable that has ``dim``, the others taken from the first piece (they are
    the same in every piece: times, sites, blocks)."""
    first = pieces[0]
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


def _write_at(store: Path, merged: xr.Dataset, dim: str, at: int) -> bool:
    """Write ``merged``'s rows at ``at .. at + n`` of the existing arrays along
    ``dim`` (each resized to ``at + n``) with plain Zarr writes: no re-reading of
    the store's data, a cost independent of its size. False (nothing written)
    when the store's arrays do not match the merged variables one to one."""
    import zarr

    with zarr.config.set({"array.write_empty_chunks": True}):  # read when an array opens
        group = zarr.open_group(str(store), mode="r+")
        arrays = {name: group[name] for name in group.array_keys()}
    growing = {
        name for name, array in arrays.items() if dim in (array.metadata.dimension_names or ())
    }
    wanted = {name for name, var in merged.variables.items() if dim in var.dims}
    if growing != wanted:
        return False
    plan = []
    for name in sorted(wanted):
        array, var = arrays[name], merged.variables[name]
        dims = tuple(array.metadata.dimension_names)
        if set(dims) != set(var.dims) or len(dims) != var.ndim:
            return False
        values = var.transpose(*dims).values
        text = values.dtype.kind in "OUT"
        if text != (array.dtype.kind in "OUT") or (not text and values.dtype != array.dtype):
            return False
        axis = dims.index(dim)
        if any(size != values.shape[i] for i, size in enumerate(array.shape) if i != axis):
            return False  # another feature size, heads, k, ...
        plan.append((array, axis, values))
    with zarr.config.set({"array.write_empty_chunks": True}):
        for array, axis, values in plan:
            n = values.shape[axis]
            shape = list(array.shape)
            shape[axis] = at + n
            array.resize(tuple(shape))
            index = [slice(None)] * values.ndim
            index[axis] = slice(at, at + n)
            array[tuple(index)] = values
    return True


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

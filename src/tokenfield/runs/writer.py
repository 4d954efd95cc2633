"""The streamed, resumable writer of a run (RunWriter) and the checks before writing:
what to write and when. How it lands on disk (codecs, encoding, chunk files) is
:mod:`tokenfield.runs.store`."""

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

from tokenfield._io import dumps, write_atomic
from tokenfield._lock import WriterLock
from tokenfield._lock import acquire as acquire_lock
from tokenfield._memory import limit_zarr_threads, release_free_memory
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
from tokenfield.runs.store import (
    _count,
    _rows,
    _whole_rows,
    _write_at,
    _write_errors,
    _write_whole_chunks,
    concat_pieces,
    consolidate,
    create_store,
    growing_arrays,
    open_arrays,
    store_compressor,
    store_encoding,
)


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
CHUNK_BYTES = 32 << 20
# the most chunks in one shard of a buffered run's 1-D coordinates: Zarr reads a
# shard back and writes it again whole at every flush, at a cost that grows with its
# chunks (measured per write of one coordinate: about 2.5 ms at 64 chunks a shard,
# 5 ms on average and 8 ms at the end at the 1,058 chunks of 62 rows that COORD_CHUNK
# rows make for a 7B model's states); 64 makes one file per 2 GiB of states
COORD_CHUNKS_PER_SHARD = 64
# the most writes of whole chunks of a buffered run's large variables (the states) in a
# row that leave the other variables (coordinates, strings) and the progress for later
# (RunWriter._write_large_only). Those are written, and the progress recorded, at least
# every flush_seconds (what a kill can cost, as for the pieces waiting in memory), at the
# end, and, where flush_seconds is long, every LAG_WRITES + 1 writes (about 1 GiB of states
# at the default flush_bytes). Each write of them cost about as much as writing 64 MiB of
# states (a dozen small sharded arrays through Zarr).
LAG_WRITES = 15
# Stands for the config in run.json's outline while the rest is serialised (_record).
_CONFIG_SLOT = "\x00tokenfield: the run's config\x00"


# How float arrays are stored: "none" (the default: raw little-endian bytes and a
# CRC-32C checksum per chunk) or "zstd" (Zstandard level 0 with its frame checksum,
# the former default). Float states barely compress (measured: 1.08x on synthetic
# states, 1.10x on SmolLM2's), and compressing them was most of the writer's time.
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
            they hold ``flush_bytes`` or number ``flush_pieces``. A pre-sized
            writer (``size_hint``) flushing for the bytes held writes the large
            float variables only; their coordinates, strings and the recorded
            progress follow at least every ``flush_seconds`` (and every
            :data:`LAG_WRITES` + 1 such flushes, and at :meth:`finish`).
        flush_bytes: the most bytes of pieces kept in memory.
        flush_pieces: the most pieces kept in memory (a piece's Python objects and
            indexes take far more memory than its ``nbytes`` when it is small:
            measured about 0.7 MiB of resident memory per 150 kB piece). With
            ``background``, as many more are being written meanwhile. 32: a
            20,000-prompt streamed trace of a tiny model peaked at 1.14x the
            resident memory of a 200-prompt one (64: 1.23x), for 8 % more time.
        size_hint: how many rows the run will hold, when the caller knows
            (a trace: its particles). The store's arrays along ``append_dim``
            are then created at this size (pre-sized) and every write goes into
            its region: no array is resized (no ``zarr.json`` rewritten) while
            the rows fit. Rows beyond it grow the arrays (by at least half
            again, so that an undercount, e.g. a trace with ``generate``, costs
            a few resizes, not one per write); :meth:`finish` cuts the arrays
            to the rows written, so a complete run never holds rows it did not
            write, whatever the hint. A resumed run is cut to its recorded
            progress, then pre-sized again. Also, a buffered run's 1-D
            coordinates are chunked by at most this many rows, so that a small
            run does not encode, write and read back chunks padded to
            :data:`COORD_CHUNK` rows. Without it, every write resizes the
            arrays to the rows written so far.
        background: with ``flush_seconds``, write the pieces in a background
            thread while the caller computes the next ones (one write at a
            time; at most ``flush_bytes`` more wait in memory meanwhile). An
            error of that write is raised by the next :meth:`append`,
            :meth:`flush` or :meth:`finish`.
        compressor: how float arrays are stored when the store is created:
            ``"none"`` (raw bytes with a CRC-32C checksum per chunk, the
            default) or ``"zstd"`` (Zstandard with its frame checksum); default:
            the ``TOKENFIELD_STORE_COMPRESSOR`` environment variable, else
            ``"none"``. Either reads back bit-identical, with plain
            ``xarray.open_zarr``; other dtypes (strings, integers) are always
            Zstandard-compressed.

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
        flush_pieces: int = 32,
        background: bool = False,
        compressor: str | None = None,
        size_hint: int | None = None,
    ):
        self.path = Path(path)
        self.compressor = store_compressor(compressor)
        limit_zarr_threads()  # one arena for Zarr's codecs, not cores + 4 (see _memory)
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
        # rows per chunk of the store's larger variables (a buffered writer's; None:
        # unknown, e.g. a resumed store) and the rows written so far (None: the
        # recorded size); see _write
        self._align: int | None = None
        self._written: int | None = None
        # the rows of the other variables (coordinates, strings) written so far, when
        # they lag behind the large float ones (see _write_large_only); None: _written
        self._others_written: int | None = None
        self._large: frozenset[str] = frozenset()  # the variables written straight (_write)
        self._recorded_at = time.monotonic()  # when progress was last recorded
        self._lagged = 0  # writes of the large variables alone since then
        self._arrays: dict[str, Any] = {}  # the store's open arrays (see _write_at)
        self._config_text: tuple[Any, str] | None = None  # see _record
        # the rows the store's arrays along append_dim hold as this writer sized
        # them (pre-sized from size_hint, see _capacity_for); None: not pre-sized,
        # every write resizes them to the rows written so far
        self._capacity: int | None = None
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
            self._record(self.info)
        else:
            self.info = existing
            if not existing.complete:
                self._check_store_writable()
                self._check_resume()
                self._trim_to_progress()
                self._align = self._store_align()
                self._presize_resumed()

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

    def _presize_resumed(self) -> None:
        """After the trim to the recorded progress, grow a resumed store's arrays
        to the size hint again (one resize each, as when it was created), so
        that the resumed writes go into their regions as before the kill.
        Nothing without a hint, with a hint not above the recorded size, or for
        a parallel trace's store (allocated whole by its plan)."""
        if not self.size_hint or "shards" in self.info.progress or not self.store.exists():
            return
        size = int(self.info.progress.get("size", 0))
        if size <= 0:
            return
        capacity = max(size, self.size_hint)
        with _write_errors(self.store), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self._resize_store(capacity, grow=True)
        self._capacity = capacity

    def _capacity_for(self, stop: int) -> int | None:
        """The rows the arrays of a pre-sized store should hold for a write up to
        ``stop``: the current capacity while the rows fit, else at least half as
        much again (a hint that undercounts costs a few resizes); None when the
        store is not pre-sized."""
        if self._capacity is None:
            return None
        if stop > self._capacity:
            self._capacity = max(stop, self._capacity + self._capacity // 2)
        return self._capacity

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
        full = self._pending_bytes >= self.flush_bytes
        if (
            self.flush_seconds <= 0
            or full
            or len(self._pending) >= self.flush_pieces
            or time.monotonic() - self._last_flush >= self.flush_seconds
        ):
            # A flush for the bytes held writes whole chunks only (see _write);
            # one for the time or the number of pieces writes everything.
            whole = not full
            if not self.background:
                self._flush(whole)
                return
            self._wait()  # one write at a time, and its error (if any) raised here
            pending, self._pending, self._pending_bytes = self._pending, [], 0
            self._last_flush = time.monotonic()
            if self._executor is None:
                self._executor = ThreadPoolExecutor(1, thread_name_prefix="tokenfield-writer")
            self._inflight = pending
            self._writing = self._executor.submit(self._write_released, pending, whole)

    def _wait(self) -> None:
        """Wait for the background write, if one runs; raise its error.

        The write is forgotten only once it has ended: an interrupt while
        waiting leaves it to :meth:`close`, which waits again before it writes
        anything else (two writes at once would both write at the same
        recorded size). A failed write's pieces go back in front of the
        pending ones, so that nothing after them is recorded without them; so
        do the pieces a write held back (not yet recorded)."""
        writing = self._writing
        if writing is None:
            return
        try:
            held = writing.result()
        except Exception:
            self._pending = self._inflight + self._pending
            self._pending_bytes += sum(int(piece.nbytes) for piece, _d, _p in self._inflight)
            raise
        else:
            if held:
                self._pending = list(held) + self._pending
                self._pending_bytes += sum(int(piece.nbytes) for piece, _d, _p in held)
        finally:
            if writing.done():
                self._writing, self._inflight = None, []

    def flush(self) -> None:
        """Write the pending pieces at the recorded size, then record the progress
        (after any background write)."""
        self._flush(whole=True)

    def _flush(self, whole: bool) -> None:
        self._wait()
        # kept until written: close() retries an interrupted one
        held = self._write(self._pending, whole)
        self._pending = held
        self._pending_bytes = sum(int(piece.nbytes) for piece, _d, _p in held)
        self._last_flush = time.monotonic()

    def _layout(self, merged: xr.Dataset, first: int) -> dict[str, dict[str, Any]]:
        """The encoding of a new store (codecs and chunks), and :attr:`_align`.

        A buffered writer (few, large writes) keeps its 1-D coordinates (tokens,
        prompts, ...) in long chunks: a few files to read back instead of one per
        piece. Its larger variables share one number of rows per chunk, about
        CHUNK_BYTES of the largest (but no more than this first write holds, so
        a small run is one chunk, not a padded one), so that a write of whole
        chunks of one is whole chunks of all: Zarr then writes each chunk's
        bytes without reading anything back (see _write). An unbuffered writer
        keeps one piece (``first`` rows) per chunk, as before."""
        dim = self.append_dim
        encoding = store_encoding(merged, self.compressor)
        growing = [var for var in merged.variables.values() if dim in var.dims]
        rows_now = int(merged.sizes[dim])
        self._align = None
        if self.flush_seconds > 0:
            row_bytes = max(
                (v.dtype.itemsize * v.size // max(1, rows_now) for v in growing if v.ndim > 1),
                default=0,
            )
            if row_bytes:
                self._align = max(1, min(rows_now, CHUNK_BYTES // row_bytes))

        # 1-D coordinates: chunks (or shards) of COORD_CHUNK rows, or of the run's
        # size when the caller knows it is smaller (a small run is not padded)
        coord_rows = min(COORD_CHUNK, self.size_hint or COORD_CHUNK)

        def rows(var: xr.Variable) -> int:
            if self._align is None and self.flush_seconds <= 0:
                return first
            if var.ndim == 1 and self._align is None:
                return max(first, coord_rows)
            return self._align or first

        for name, var in merged.variables.items():
            if dim not in var.dims:
                continue
            encoding[name]["chunks"] = tuple(
                rows(var) if d == dim else size for d, size in zip(var.dims, var.shape, strict=True)
            )
            if var.ndim == 1 and self._align is not None:
                # a coordinate's chunks of _align rows, in shards of about
                # COORD_CHUNK rows (few files): a write of whole chunks encodes
                # only its own rows (a long plain chunk was read, decoded and
                # encoded again at every flush: most of the writer's time on
                # string coordinates), and of at most COORD_CHUNKS_PER_SHARD chunks
                chunks = min(-(-coord_rows // self._align), COORD_CHUNKS_PER_SHARD)
                encoding[name]["shards"] = (chunks * self._align,)
        return encoding

    def _write_released(
        self, pending: list[tuple[xr.Dataset, int, dict[str, Any]]], whole: bool
    ) -> list[tuple[xr.Dataset, int, dict[str, Any]]]:
        """A background write (:meth:`_write`), then the free memory of the
        threads' heaps handed back (:func:`tokenfield._memory.release_free_memory`):
        without it a long streamed run's resident memory keeps what the writer's
        and Zarr's threads freed."""
        try:
            return self._write(pending, whole)
        finally:
            release_free_memory()

    def _write(
        self, pending: list[tuple[xr.Dataset, int, dict[str, Any]]], whole: bool = True
    ) -> list[tuple[xr.Dataset, int, dict[str, Any]]]:
        """Write ``pending`` from the recorded size on, then record the progress of
        the last piece written in full; return the pieces held back.

        With ``whole`` everything is written. Without, a buffered writer writes
        only up to the last boundary of its chunks (:attr:`_align` rows), so that
        every chunk is written once and in full (never read back and merged);
        the rows after it stay in memory with their pieces, which are written
        (from that boundary) by the next flush. Rows written beyond the
        recorded size are rows of pieces not yet recorded: a kill leaves them to
        the resume's trim. A pre-sized store (``size_hint``) is written into its
        region, its arrays grown only when the rows do not fit
        (:meth:`_capacity_for`); its rows past the recorded size hold fill values
        until written, and are cut by the resume's trim or by :meth:`finish`."""
        if not pending:
            return []
        dim = self.append_dim
        pieces = [piece for piece, _done, _progress in pending]
        at = int(self.info.progress.get("size", 0))
        ends = list(np.cumsum([int(piece.sizes[dim]) for piece in pieces]) + at)
        total = int(ends[-1])
        creating = not self.store.exists() or (at == 0 and self._written is None)
        start = at if creating or self._written is None else self._written
        if not at <= start <= total:
            start = at
        others = start if self._others_written is None else self._others_written
        if not at <= others <= start:
            others = start = at
        stop = total
        if not whole and self._align and not creating:
            stop = total // self._align * self._align
            if stop <= start:
                return pending  # no whole chunk yet
        # Large float variables (the states) are not joined into one array when
        # appending: their whole chunks go to disk straight from the pieces.
        straight: frozenset[str] = frozenset()
        if not creating and self._align:
            if not self._large:
                self._large = frozenset(
                    name
                    for name, var in pieces[-1].data_vars.items()
                    if dim in var.dims and var.ndim > 1 and var.dtype.kind == "f"
                )
            straight = self._large
        if straight and not whole and self._lagging(stop):
            held = self._write_large_only(pending, at, start, stop)
            if held is not None:
                return held
        merged = concat_pieces(pieces, dim, skip=straight)
        with self._forget_arrays_on_error(), _write_errors(self.store), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if creating:
                encoding = self._layout(merged, int(pieces[0].sizes[dim]))
                if not whole and self._align:  # at least one chunk: align <= these rows
                    stop = total // self._align * self._align
                # the arrays are created at their size (with a size hint, the whole
                # run's), then filled as every later write is (whole chunk files
                # written straight from the rows, see _write_at)
                first_rows = merged.isel({dim: slice(0, stop - at)})
                self._capacity = max(self.size_hint, stop) if self.size_hint else None
                self._arrays = create_store(
                    self.store, merged, dim, self._capacity or stop - at, encoding
                )
                if not _write_at(
                    self.store, first_rows, dim, 0, cache=self._arrays, grow_to=self._capacity
                ):
                    raise RuntimeError(f"'{self.store}' does not match the rows it was made for")
            else:
                part = merged.isel({dim: slice(others - at, stop - at)})
                rows = {name: _rows(pieces, name, dim, start - at, stop - at) for name in straight}
                grow_to = self._capacity_for(stop)
                if not _write_at(
                    self.store,
                    part,
                    dim,
                    others,
                    rows,
                    cache=self._arrays,
                    grow_to=grow_to,
                    rows_at=start,
                ):
                    self._trim_store(at)  # layouts differ: let xarray append (and complain)
                    self._capacity = None  # the store grows with every write from now on
                    stop = total
                    merged = concat_pieces(pieces, dim)
                    merged.to_zarr(
                        self.store,
                        append_dim=dim,
                        consolidated=False,
                        write_empty_chunks=True,
                    )
                    self._arrays = {}  # resized by xarray: opened again by the next write
        self._written = self._others_written = stop
        self._lagged = 0
        written = sum(1 for end in ends if end <= stop)
        if written:
            _piece, done, progress = pending[written - 1]
            keep = {"batch_size": self.batch_size} if self.batch_size is not None else {}
            size = int(ends[written - 1])
            # recorded only once run.json says so: an interrupted record is written again
            info = replace(
                self.info, progress={**progress, **keep, "done": int(done), "size": size}
            )
            self._record(info)
            self.info = info
            self._recorded_at = time.monotonic()
        return pending[written:]

    def _lagging(self, stop: int) -> bool:
        """Whether a write of whole chunks up to ``stop`` may leave the other
        variables (coordinates, strings) for a later write: the store is
        pre-sized and holds ``stop`` rows (no array changes its shape), fewer than
        :data:`LAG_WRITES` writes left them since the progress was last recorded,
        and that was less than ``flush_seconds`` ago."""
        return (
            self._capacity is not None
            and stop <= self._capacity
            and self._lagged < LAG_WRITES
            and time.monotonic() - self._recorded_at < self.flush_seconds
        )

    def _write_large_only(
        self,
        pending: list[tuple[xr.Dataset, int, dict[str, Any]]],
        at: int,
        start: int,
        stop: int,
    ) -> list[tuple[xr.Dataset, int, dict[str, Any]]] | None:
        """Write only the whole chunks of the large variables (:attr:`_large`: the
        states), rows ``start .. stop`` (``at``: the recorded size, where
        ``pending`` begins), straight to their files; the other variables
        wait for a later write (:meth:`_write`, once :meth:`_lagging` says no,
        and always on :meth:`flush` and :meth:`finish`). Nothing is recorded:
        the recorded progress needs every variable's rows, and a kill leaves
        these rows to the resume's trim, as any rows past the recorded size.

        Through Zarr, each write of the coordinates and strings (a dozen small
        sharded arrays, each read back and written again whole) cost about as much
        as writing 64 MiB of states; now they are written once every
        ``flush_seconds``. The pieces whose rows of the large variables are all
        written are held without them (their memory goes). None (nothing
        written) where a chunk cannot be written straight: :meth:`_write` then
        writes everything."""
        dim, large = self.append_dim, self._large
        pieces = [piece for piece, _done, _progress in pending]
        arrays = open_arrays(self.store, self._arrays)
        if growing_arrays(arrays, dim) != {
            name for name, var in pieces[-1].variables.items() if dim in var.dims
        }:
            return None  # another layout: _write's own checks decide
        plan = []
        for name in sorted(large):
            array = arrays.get(name)
            if array is None:
                return None
            dims, parts = _rows(pieces, name, dim, start - at, stop - at)
            axis = dims.index(dim)
            if tuple(array.metadata.dimension_names or ()) != dims or array.shape[axis] < stop:
                return None
            n = _count(parts, axis)
            if n != stop - start or _whole_rows(array, axis, n, start) != n:
                return None
            plan.append((array, axis, parts))
        for array, axis, parts in plan:
            _write_whole_chunks(self.store, array, axis, parts, start)
        self._written = stop
        self._lagged += 1
        if self._others_written is None:  # nothing written since the resume: start is at
            self._others_written = start
        held, end = [], at
        for piece, done, progress in pending:
            end += int(piece.sizes[dim])
            if end <= stop and any(name in piece.variables for name in large):
                piece = piece.drop_vars(sorted(large), errors="ignore")
            held.append((piece, done, progress))
        return held

    def _record(self, info: RunInfo) -> None:
        """Write ``info`` to run.json, atomically: the bytes of
        ``write_json_atomic(path, info.to_dict())``, with the config serialised once
        per writer and spliced in. A trace's config lists every prompt: at 20,000
        prompts it is 2.4 MB of indented JSON, and serialising it again at every flush
        took 85 ms a flush (the time grew with the square of the prompts)."""
        config = info.config
        if self._config_text is None or self._config_text[0] is not config:
            # the config at depth 1 of run.json: its lines after the first indented by
            # one more level (JSON strings hold no raw newline)
            self._config_text = (config, dumps(config).replace("\n", "\n  "))
        outline = info.to_dict()
        outline["config"] = _CONFIG_SLOT
        text = dumps(outline)
        slot = json.dumps(_CONFIG_SLOT)
        if text.count(slot) != 1:  # cannot happen: the slot is no value a run holds
            raise RuntimeError("run.json's config slot is not unique")
        write_atomic(self.path / RUN_JSON, text.replace(slot, self._config_text[1], 1) + "\n")

    def _store_align(self) -> int | None:
        """A resumed buffered store's rows per chunk, when all its larger variables
        share them (see :meth:`_layout`); None otherwise."""
        if self.flush_seconds <= 0 or not self.store.exists():
            return None
        import zarr

        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                group = zarr.open_group(str(self.store), mode="r")
                found = set()
                for _name, array in group.arrays():
                    dims = list(array.metadata.dimension_names or ())
                    if self.append_dim in dims and len(dims) > 1:
                        found.add(int(array.chunks[dims.index(self.append_dim)]))
        except Exception:  # noqa: BLE001 - then every flush writes everything, as before
            return None
        return found.pop() if len(found) == 1 else None

    @contextlib.contextmanager
    def _forget_arrays_on_error(self):
        """A write that fails leaves the cached arrays (see _write_at) to be opened again."""
        try:
            yield
        except BaseException:
            self._arrays = {}
            raise

    def _trim_store(self, size: int) -> None:
        """Cut every array growing along the append dimension back to ``size``."""
        self._resize_store(size)

    def _resize_store(self, size: int, grow: bool = False) -> None:
        """Set every array growing along the append dimension to ``size`` rows
        (with ``grow``, only those holding fewer). A shrink deletes the chunk
        files past the new end. The writer's open arrays are used (and opened when
        there are none): a pre-sized store whose rows all got written is not read
        again to find nothing to cut."""
        for array in open_arrays(self.store, self._arrays).values():
            dims = list(array.metadata.dimension_names or [])
            if self.append_dim in dims:
                axis = dims.index(self.append_dim)
                if array.shape[axis] != size and (not grow or array.shape[axis] < size):
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
                encoding=store_encoding(variables, self.compressor),
            )
        if self.complete:
            self._consolidate()

    def _consolidate(self) -> None:
        """Consolidate Zarr metadata so plain ``xarray.open_zarr`` opens the store
        quickly and without warnings."""
        with _write_errors(self.store), warnings.catch_warnings():  # disk full: one line
            warnings.simplefilter("ignore")
            consolidate(self.store, self._arrays)

    def finish(self, **progress: Any) -> None:
        """Write pending pieces, cut a pre-sized store to the rows written (see
        ``size_hint``), mark the run complete (and consolidate the store's
        metadata)."""
        self.flush()
        if self._capacity is not None and self.store.exists():
            with _write_errors(self.store), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self._trim_store(int(self.info.progress.get("size", 0)))
            self._capacity = None
        if self.store.exists():
            self._consolidate()
        self.info.status = "complete"
        self.info.progress = {**self.info.progress, **progress}
        self._record(self.info)
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

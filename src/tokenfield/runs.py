"""Run directories: the on-disk contract between tracing, simulation and analysis.

A run is a directory::

    RUN/
      run.json          kind, config, tokenfield version, status, progress
      trajectory.zarr/  an xarray Dataset stored with Zarr (format 3)
      metrics.json      written by analyses
      figures/          written by analyses and plots

``states`` has dims ``(time, particle, feature)``. Anyone can read a run with
``xarray.open_zarr(RUN / "trajectory.zarr")``.

Writes are streamed and resumable. :class:`RunWriter` appends pieces along a
growing dimension (``particle`` for traces, ``time`` for simulations) and then
records progress in ``run.json`` with an atomic rename. With ``flush_seconds``
it keeps pieces in memory and writes them together (one Zarr write per array
and one ``run.json`` per flush, at the recorded size, so the cost of a flush does
not grow with what is already stored). A process killed between the two leaves
extra rows in the Zarr store (or loses the pieces not yet flushed); on resume
they are trimmed back to what ``run.json`` recorded, so every unit of work lands
exactly once.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
import warnings
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np
import xarray as xr

from tokenfield._io import _json_default, write_json_atomic
from tokenfield._lock import LOCK_NAME, WriterLock
from tokenfield._lock import acquire as acquire_lock
from tokenfield._version import __version__
from tokenfield.errors import UserError

RUN_JSON = "run.json"
TRAJECTORY = "trajectory.zarr"
METRICS_JSON = "metrics.json"
FIGURES = "figures"
# The files analyses derive from a run and keep inside it. The modules that write
# them import these names from here, so that DERIVED cannot miss one.
PROJECTION_NPZ = "projection.npz"  # tokenfield analyze (analysis.projection)
THEORY_JSON = "theory.json"  # tokenfield lens (analysis.theory)
THEORY_HTML = "theory.html"
FLOW_JSON = "flow.json"  # tokenfield lens --flow (analysis.flow)
FLOW_HTML = "flow.html"
# Everything tokenfield derives from a run and keeps inside it: --overwrite removes
# these (and only these, so a user's own files in the directory are never touched;
# in FIGURES only the figures tokenfield draws, see is_figure).
DERIVED = (METRICS_JSON, FIGURES, PROJECTION_NPZ, THEORY_JSON, THEORY_HTML, FLOW_JSON, FLOW_HTML)
# The figures tokenfield draws into RUN/figures, by name: each stem as .png and .svg
# (tokenfield.viz.run_figures, tokenfield.viz.simulation), the animations, and the
# lens's theory_<section>.png/.svg (tokenfield.viz.theory, tokenfield.viz.flow).
FIGURE_STEMS = (
    "trajectories",
    "pcs_vs_layer",
    "speed",
    "separation",
    "centroid_distances",
    "trajectories_per_layer",
    "trajectories_baseline",
    "simulation_clusters_energy",
    "simulation_particles",
)
FIGURE_ANIMATIONS = ("thought_evolution.gif", "simulation_particles.gif")
LENS_FIGURE_PREFIX = "theory_"


def is_figure(name: str) -> bool:
    """Whether ``name`` (a file in RUN/figures) is a figure tokenfield draws."""
    if name in FIGURE_ANIMATIONS:
        return True
    stem, _dot, suffix = name.rpartition(".")
    if suffix not in ("png", "svg"):
        return False
    lens = stem.removeprefix(LENS_FIGURE_PREFIX)
    return stem in FIGURE_STEMS or (
        stem.startswith(LENS_FIGURE_PREFIX) and lens.replace("_", "").isalnum()
    )


def figures_dir(run: str | Path, *, create: bool = True) -> Path:
    """``RUN/figures``, checked to be a real directory inside the run (created when
    missing, with ``create``): figures are never written through a symbolic link
    into another directory.

    Raises:
        UserError: it is a symbolic link, or something other than a directory.
    """
    folder = Path(run) / FIGURES
    if folder.is_symlink():
        raise UserError(
            f"'{folder}' is a symbolic link (to '{os.readlink(folder)}'); tokenfield "
            "writes figures only inside the run, never through a link",
            f"remove the link '{folder}' (its target is left alone), then run again",
        )
    if folder.exists() and not folder.is_dir():
        raise UserError(f"'{folder}' is not a directory", "remove or rename it, then run again")
    if create:
        folder.mkdir(exist_ok=True)
    return folder


CONFIG_ATTR = "tokenfield_config"

# The layout of run.json and the store. A run written with a newer format (by a
# newer tokenfield) is refused rather than misread.
RUN_FORMAT = 1

# What this process's writers did, for the line an interrupted command prints
# (tokenfield.cli): runs finished, and runs left partial (resumable).
_WRITE_LOG: dict[str, list[Path]] = {"finished": [], "partial": []}


def reset_write_log() -> None:
    for paths in _WRITE_LOG.values():
        paths.clear()


def _log_write(path: Path, state: str) -> None:
    for paths in _WRITE_LOG.values():
        if path in paths:
            paths.remove(path)
    _WRITE_LOG[state].append(path)


def interrupted_line() -> str:
    """What to tell a user whose command was interrupted: resume, unless every run
    it wrote was already complete (then there is nothing to resume)."""
    if _WRITE_LOG["finished"] and not _WRITE_LOG["partial"]:
        shown = ", ".join(f"'{p}'" for p in _WRITE_LOG["finished"])
        return f"tokenfield: interrupted after {shown} was complete; nothing to resume."
    return "tokenfield: interrupted; run the same command again to resume."


RunKind = Literal["trace", "simulation"]
KINDS = ("trace", "simulation")
Status = Literal["partial", "complete"]


def _version() -> str:
    return __version__


def canonical_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The config as plain JSON data (round-tripped), for comparison and storage."""
    return json.loads(json.dumps(dict(config), default=_json_default, sort_keys=True))


@dataclass
class RunInfo:
    """The contents of ``run.json``."""

    path: Path
    kind: RunKind
    config: dict[str, Any]
    status: Status = "partial"
    progress: dict[str, Any] = field(default_factory=dict)
    version: str = ""
    # Every chunk of the store is written, even one holding only the fill value,
    # so a missing chunk file means damage (runs from before this was recorded
    # may legitimately lack all-NaN chunks and are not checked).
    all_chunks: bool = False
    # SHA-256 of the model weights a trace used (tokenfield.models.load), if known.
    weights_sha256: str | None = None

    @property
    def complete(self) -> bool:
        return self.status == "complete"

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "status": self.status,
            "tokenfield_version": self.version,
            "format": RUN_FORMAT,
            "config": self.config,
            "progress": self.progress,
            **({"all_chunks_written": True} if self.all_chunks else {}),
            **({"weights_sha256": self.weights_sha256} if self.weights_sha256 else {}),
        }

    to_json = to_dict  # the old name of the one serialisation verb


def overwrite_plan(path: Path) -> list[Path]:
    """What ``--overwrite`` deletes in the run directory ``path``, in order: the
    figures tokenfield drew (by name), the derived files, the store, then
    run.json. Nothing else (a user's files stay, in ``figures/`` too).

    Raises:
        UserError: before anything is deleted, when one of those names is a
            symbolic link (it is never followed out of the run) or cannot be
            deleted.
    """
    plan: list[Path] = []
    for name in (*DERIVED, TRAJECTORY, RUN_JSON):
        target = path / name
        if target.is_symlink():
            raise UserError(
                f"'{target}' is a symbolic link; --overwrite deletes only tokenfield's own "
                "files and never follows a link out of the run (nothing was deleted)",
                f"remove the link '{target}' (its target is left alone), then run again",
            )
        if not target.exists():
            continue
        if name == FIGURES and target.is_dir():
            plan += [f for f in sorted(target.iterdir()) if is_figure(f.name) and not f.is_dir()]
        elif name != TRAJECTORY and target.is_dir():
            raise UserError(
                f"'{target}' is a directory, not the file tokenfield writes there "
                "(nothing was deleted)",
                "move it out of the run, then run again",
            )
        plan.append(target)
    for folder in {p.parent for p in plan}:
        if not os.access(folder, os.W_OK | os.X_OK):
            raise UserError(
                f"cannot delete files in '{folder}' (not writable; nothing was deleted)",
                "make it writable (chmod u+w), or choose another --out",
            )
    return plan


def _looks_like_run(path: Path) -> bool:
    """A directory tokenfield wrote, even with run.json damaged or missing: its
    store is there, or its run.json and nothing but tokenfield's names."""
    names = set(_user_files(path))
    return TRAJECTORY in names or (RUN_JSON in names and names <= {TRAJECTORY, RUN_JSON, *DERIVED})


def _user_files(path: Path) -> list[str]:
    """Names in ``path`` other than tokenfield's lock file (none if it is missing)."""
    if not path.is_dir():
        return []
    return sorted(p.name for p in path.iterdir() if p.name != LOCK_NAME)


def is_run(path: str | Path) -> bool:
    return (Path(path) / RUN_JSON).is_file()


def read_run_info(path: str | Path) -> RunInfo:
    """Read ``run.json``; raise :class:`UserError` when ``path`` is not a run."""
    path = Path(path)
    meta = path / RUN_JSON
    if not meta.is_file():
        inside = _runs_inside(path)
        if inside:
            shown = ", ".join(inside[:8]) + (", ..." if len(inside) > 8 else "")
            raise UserError(
                f"'{path}' is not a tokenfield run but holds runs: {shown}",
                f"pass one of them, e.g. '{path / inside[0]}'",
            )
        raise UserError(
            f"'{path}' is not a tokenfield run (no {RUN_JSON})",
            "pass a directory written by 'tokenfield trace' or 'tokenfield simulate'",
        )
    fix = "re-create the run with --overwrite (run.json is written by tokenfield only)"
    try:
        data = json.loads(meta.read_bytes().decode("utf-8"))
    except UnicodeDecodeError:
        raise UserError(f"'{meta}' is damaged (not UTF-8 text)", fix) from None
    except json.JSONDecodeError as exc:
        raise UserError(f"'{meta}' is damaged ({exc})", fix) from None
    except OSError as exc:
        raise UserError(f"cannot read '{meta}' ({exc.strerror})", "check its permissions") from None
    if not isinstance(data, dict):
        raise UserError(f"'{meta}' is damaged (a JSON {type(data).__name__}, not an object)", fix)
    problems = []
    if "kind" not in data or "config" not in data:
        problems.append("no " + " or ".join(k for k in ("kind", "config") if k not in data))
    elif not isinstance(data["config"], dict):
        problems.append(f"'config' is a {type(data['config']).__name__}, not an object")
    elif data["kind"] not in KINDS:
        raise UserError(
            f"'{meta}' has an unknown kind {data['kind']!r}",
            f"tokenfield reads runs of kind {' or '.join(KINDS)}; re-create it with --overwrite",
        )
    status = data.get("status", "partial")
    if status not in ("partial", "complete"):
        problems.append(f"unknown status {status!r}")
    progress = data.get("progress", {})
    if not isinstance(progress, dict):
        problems.append(f"'progress' is a {type(progress).__name__}, not an object")
    else:
        for key in ("done", "size", "batch_size"):
            value = progress.get(key)
            if key in progress and (
                not isinstance(value, int) or isinstance(value, bool) or value < 0
            ):
                problems.append(f"progress '{key}' is {value!r}, not a count")
    if problems:
        raise UserError(f"'{meta}' is damaged ({'; '.join(problems)})", fix)
    _check_format(meta, data)
    return RunInfo(
        path=path,
        kind=data["kind"],
        config=data["config"],
        status=status,
        progress=progress,
        version=str(data.get("tokenfield_version", "")),
        all_chunks=data.get("all_chunks_written") is True,
        weights_sha256=data.get("weights_sha256") or None,
    )


def _version_tuple(text: str) -> tuple[int, ...] | None:
    import re

    match = re.match(r"^(\d+)\.(\d+)(?:\.(\d+))?", text.strip())
    return tuple(int(g or 0) for g in match.groups()) if match else None


def _check_format(meta: Path, data: dict[str, Any]) -> None:
    """Refuse a run.json from the future: a format newer than this tokenfield's, or
    (runs without the field predate it) a tokenfield version newer than this one."""
    fix = (
        f"read it with the tokenfield that wrote it (this is {__version__}), "
        "or re-create the run with --overwrite"
    )
    fmt = data.get("format")
    if fmt is not None:
        if not isinstance(fmt, int) or isinstance(fmt, bool) or fmt < 1:
            raise UserError(
                f"'{meta}' is damaged (format {fmt!r})",
                "re-create the run with --overwrite (run.json is written by tokenfield only)",
            )
        if fmt > RUN_FORMAT:
            raise UserError(
                f"'{meta}' has run format {fmt}, newer than this tokenfield reads ({RUN_FORMAT})",
                fix,
            )
        return
    written, ours = (
        _version_tuple(str(data.get("tokenfield_version", ""))),
        _version_tuple(__version__),
    )
    if written is not None and ours is not None and written > ours:
        raise UserError(
            f"'{meta}' was written by tokenfield {data['tokenfield_version']}, newer than this one",
            fix,
        )


def check_against_store(info: RunInfo, ds: xr.Dataset) -> None:
    """Raise :class:`UserError` when ``run.json`` disagrees with the store it
    describes: its progress (``size`` against the stored rows; a trace's ``done``
    against its prompts), its status (a complete trace holds every prompt of its
    config) or its model (``d_model`` against the states' features).

    ``run.json`` is only written by tokenfield, so a disagreement means it was
    edited or damaged; believing it would give silently wrong results.
    """
    meta = info.path / RUN_JSON
    fix = "re-create the run with the same command and --overwrite"
    dim = "particle" if info.kind == "trace" else "time"
    if "states" not in ds or dim not in ds.sizes:
        return
    rows = int(ds.sizes[dim])
    size, done = info.progress.get("size"), info.progress.get("done")
    parallel = "shards" in info.progress  # a parallel trace allocates every row up front

    def refuse(what: str) -> None:
        raise UserError(f"'{meta}' does not match its store: {what}", fix)

    if size is not None and (size != rows if info.complete else size > rows):
        refuse(f"progress size = {size}, but {TRAJECTORY} holds {rows} {dim}s")
    model = info.config.get("model")
    d_model = model.get("d_model") if isinstance(model, dict) else None
    features = int(ds.sizes.get("feature", -1))
    if info.kind == "trace" and isinstance(d_model, int) and features not in (-1, d_model):
        refuse(f"the model has d = {d_model}, the states have {features} features")
    if info.kind != "trace" or "prompt_index" not in ds.coords:
        if info.kind == "simulation" and info.complete and done is not None and done != rows:
            refuse(f"progress done = {done} saved times, but {TRAJECTORY} holds {rows}")
        return
    index = np.asarray(ds["prompt_index"].values)
    prompts = info.config.get("prompts")
    if info.complete:
        stored = int(np.unique(index).size)
        if isinstance(prompts, list) and stored != len(prompts):
            refuse(f"it is marked complete, but holds {stored} of its {len(prompts)} prompts")
        if done is not None and done != stored:
            refuse(f"progress done = {done} prompts, but {TRAJECTORY} holds {stored}")
    if not parallel and size is not None and done is not None:
        _check_prefix(index[:size], done, refuse)


def _check_prefix(index: np.ndarray, done: int, refuse: Any) -> None:
    """A trace's first ``size`` rows hold exactly prompts ``0 .. done - 1``, in order."""
    ok = index.size == 0 and done == 0
    if index.size:
        ok = (
            bool(np.all(np.diff(index) >= 0))
            and int(index[0]) == 0
            and int(index[-1]) == done - 1
            and np.unique(index).size == done
        )
    if not ok:
        held = int(np.unique(index).size)
        refuse(f"progress says {done} prompts in {index.size} rows; those rows hold {held}")


def _runs_inside(path: Path) -> list[str]:
    """Names of the runs directly inside ``path`` (e.g. ``runs/demo``), sorted."""
    try:
        return sorted(p.name for p in path.iterdir() if (p / RUN_JSON).is_file())
    except OSError:  # not a directory, or unreadable
        return []


def open_run(path: str | Path, *, allow_partial: bool = False) -> xr.Dataset:
    """Open a run's trajectory as a lazily loaded :class:`xarray.Dataset`.

    The run's ``run.json`` contents are in ``ds.attrs["run"]``. A partial run is
    refused unless ``allow_partial`` (its rows past the recorded progress, if
    any, are not trustworthy).

    Example:
        >>> ds = tf.open_run("runs/spectrum")             # doctest: +SKIP
        >>> ds.states.dims                                # doctest: +SKIP
        ('time', 'particle', 'feature')
    """
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
    check_object_codecs(path)  # a Zarr v2 pickle (or other object) codec: one line
    if info.complete and info.all_chunks:
        check_chunks(path)
    # Every chunk read goes through this getter: a chunk whose checksum does not
    # match (or that does not decode) is one line naming the run, whenever the lazy
    # states are read (analyze, report, lens, a library caller's .load()).
    reading = {"from_array_kwargs": {"getitem": _ChunkGetter(str(path))}}
    with warnings.catch_warnings(), _read_errors(path):
        warnings.simplefilter("ignore")
        ds = None
        if info.complete:  # finish() consolidated the metadata: one read instead of one per array
            with contextlib.suppress(Exception):
                ds = xr.open_zarr(store, consolidated=True, **reading)
        if ds is None:
            ds = xr.open_zarr(store, consolidated=False, **reading)
        # Coordinates (labels, prompts, tokens) are small: load them so that they are
        # plain numpy arrays; the states stay lazy.
        # One dask compute for all of them, set in place (no re-alignment per coordinate).
        lazy = [name for name in ds.coords if not isinstance(ds.variables[name].data, np.ndarray)]
        if lazy:
            import dask

            values = dask.compute(*(ds.variables[name].data for name in lazy))
            for name, value in zip(lazy, values, strict=True):
                ds.variables[name].data = np.asarray(value)
    check_against_store(info, ds)
    ds.attrs["run"] = info.to_dict()
    return ds


def _damaged(path: str | Path, exc: BaseException, what: str = "a damaged chunk in") -> UserError:
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
            raise _damaged(self.path, exc) from None


@contextlib.contextmanager
def _read_errors(path: str | Path):
    """Damage found while opening the store (its index coordinates are read at
    once, not through the getter) is one line too."""
    try:
        yield
    except (UserError, MemoryError):
        raise
    except Exception as exc:  # noqa: BLE001
        raise _damaged(path, exc, "a damaged") from None


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
                missing = array.nchunks - array.nchunks_initialized
                if missing:
                    raise UserError(
                        f"run '{path}' is damaged: {missing} of the {array.nchunks} chunk "
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
    import json

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
    ):
        self.path = Path(path)
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
        if overwrite and (is_run(self.path) or _looks_like_run(self.path)):
            # --overwrite replaces tokenfield's run even when its run.json is
            # damaged or missing (nothing else could repair it)
            try:
                read_run_info(self.path)
            except UserError:
                if not _looks_like_run(self.path):
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
        if existing is None and not replaced and _looks_like_run(self.path):
            raise UserError(
                f"'{self.path}' holds a tokenfield run without its {RUN_JSON} (damaged)",
                "pass --overwrite to replace it, or choose another --out",
            )
        if existing is None and not replaced and _user_files(self.path):
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
                _version(),
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
                _log_write(self.path, "finished" if info.complete else "partial")

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
            raise _damaged(self.path, exc, "a damaged") from None
        if size > rows:
            refuse(f"progress size = {size}, but {TRAJECTORY} holds {rows} rows")
        if index is not None:
            _check_prefix(index, done, refuse)
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
        piece.attrs = {CONFIG_ATTR: json.dumps(self.config), "kind": self.info.kind}
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
                        return max(chunk, COORD_CHUNK)
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
        _log_write(self.path, "finished")
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


def strings(values: Any) -> np.ndarray:
    """An object array of Python strings: Zarr stores it as variable-length UTF-8,
    so pieces with longer strings can be appended later."""
    return np.array([str(v) for v in values], dtype=object)

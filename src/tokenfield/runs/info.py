"""run.json: a run's kind, config, format, status and progress, read and checked
against its store; what --overwrite may remove."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import xarray as xr

from tokenfield._io import dumps
from tokenfield._lock import LOCK_NAME
from tokenfield._version import __version__
from tokenfield.errors import UserError
from tokenfield.runs.layout import DERIVED, DERIVED_STORES, FIGURES, RUN_JSON, TRAJECTORY, is_figure

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


def log_write(path: Path, state: str) -> None:
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


def canonical_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The config as plain JSON data (round-tripped), for comparison and storage."""
    return json.loads(dumps(dict(config), indent=None, sort_keys=True))


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
        elif name != TRAJECTORY and name not in DERIVED_STORES and target.is_dir():
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


def looks_like_run(path: Path) -> bool:
    """A directory tokenfield wrote, even with run.json damaged or missing: its
    store is there, or its run.json and nothing but tokenfield's names."""
    names = set(user_files(path))
    return TRAJECTORY in names or (RUN_JSON in names and names <= {TRAJECTORY, RUN_JSON, *DERIVED})


def user_files(path: Path) -> list[str]:
    """Names in ``path`` other than tokenfield's lock file (none if it is missing)."""
    if not path.is_dir():
        return []
    return sorted(p.name for p in path.iterdir() if p.name != LOCK_NAME)


def is_run(path: str | Path) -> bool:
    return (Path(path) / RUN_JSON).is_file()


def read_run_info(path: str | Path) -> RunInfo:
    """Read a run's ``run.json``.

    Args:
        path: the run directory.

    Returns:
        The run's kind, config, status (``"partial"`` or ``"complete"``),
        progress and the tokenfield version that wrote it.

    Raises:
        UserError: ``path`` is not a run (naming the runs inside it, if any),
            or its ``run.json`` is unreadable.

    Example:
        >>> info = tf.read_run_info("runs/spectrum")     # doctest: +SKIP
        >>> info.kind, info.status                       # doctest: +SKIP
        ('trace', 'complete')
    """
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
        check_prefix(index[:size], done, refuse)


def check_prefix(index: np.ndarray, done: int, refuse: Any) -> None:
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

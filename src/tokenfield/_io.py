"""The ground floor's file helpers: one atomic writer and one JSON converter.

Every file tokenfield writes goes through :func:`write_atomic` (a temporary file in
the same directory, flushed and fsynced, then one ``os.replace``), so a crash or a
Ctrl-C never leaves a half-written file where a good one was. Every value that goes
to JSON goes through :func:`to_jsonable` (numpy to Python, NaN/inf to ``null``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from tokenfield.errors import UserError

__all__ = [
    "atomic_path",
    "dumps",
    "make_dirs",
    "to_jsonable",
    "umask",
    "write_atomic",
    "write_json_atomic",
]


def make_dirs(path: Path, what: str, fix: str) -> None:
    """``mkdir -p path``; a failure is one line: ``cannot create {what} (reason); {fix}``."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot create {what} ({exc.strerror})", fix) from None


def umask() -> int:
    """The process umask (read without changing it)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_atomic(path: str | Path, content: str | bytes, *, encoding: str = "utf-8") -> Path:
    """Write ``content`` (text or bytes) to ``path`` through a temporary file in the
    same directory and an atomic rename; the file gets the usual mode (0666 & ~umask).
    """
    path = Path(path)
    data = content.encode(encoding) if isinstance(content, str) else bytes(content)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~umask())  # mkstemp makes 0600; give the usual mode
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return path


@contextlib.contextmanager
def atomic_path(path: str | Path, suffix: str = "") -> Iterator[Path]:
    """For a library that writes a file itself (``np.savez``, a GIF writer,
    safetensors): yields a temporary path beside ``path`` (ending in ``suffix``, so
    the format is inferred as for ``path``) and renames it onto ``path`` when the
    block ends without an error; on an error the temporary file is removed and
    ``path`` is untouched."""
    path = Path(path)
    # a new file of our own (O_EXCL): a link planted at a predictable name is never
    # written through
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=f".tmp{suffix}", dir=path.parent)
    tmp = Path(name)
    try:
        os.fchmod(fd, 0o666 & ~umask())  # mkstemp makes 0600; give the usual mode
        os.close(fd)
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _json_default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"cannot serialise {type(value).__name__} to JSON")


def dumps(obj: Any, *, indent: int | None = 2, sort_keys: bool = False) -> str:
    """``json.dumps`` that also takes numpy scalars, arrays and paths."""
    return json.dumps(obj, indent=indent, sort_keys=sort_keys, default=_json_default)


def write_json_atomic(path: str | Path, obj: Any) -> Path:
    """Write ``obj`` as indented JSON (plus a newline) to ``path``, atomically."""
    return write_atomic(path, dumps(obj) + "\n")


def to_jsonable(value: Any, default: Callable[[Any], Any] | None = None) -> Any:
    """Plain JSON data: arrays to lists, numpy scalars to Python, NaN/inf to ``None``,
    keys to strings, tuples to lists, xarray objects to their values, paths to strings,
    dataclasses to dicts. Anything else goes through ``default`` (as it is when
    ``default`` is ``None``: ``json`` then decides).
    """
    if isinstance(value, dict):
        return {str(k): to_jsonable(v, default) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v, default) for v in value]
    if isinstance(value, np.ndarray):
        return to_jsonable(value.tolist(), default)
    if hasattr(value, "data_vars"):  # an xarray Dataset
        return {name: to_jsonable(value[name].values, default) for name in value.data_vars}
    if hasattr(value, "dims") and hasattr(value, "values"):  # an xarray DataArray
        return to_jsonable(value.values, default)
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, (str, int, bool)) or value is None:
        return value
    if isinstance(value, Path):
        return str(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return to_jsonable(dataclasses.asdict(value), default)
    return value if default is None else default(value)

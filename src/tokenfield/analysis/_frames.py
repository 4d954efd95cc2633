"""Shared plumbing for per-snapshot measurements: iterate ``(n, d)`` frames of
an array or DataArray with any leading dims, and put the results back."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import xarray as xr

from tokenfield.errors import UserError

# Rows of the pairwise block computed at once: block memory ~ rows * n * 8 bytes.
BLOCK_BYTES = 32 * 2**20


def block_rows(n: int) -> int:
    return max(1, min(n, BLOCK_BYTES // (8 * max(1, n))))


def trajectory_arrays(
    states: Any, groups: Any = None
) -> tuple[np.ndarray, Any, np.ndarray | None, np.ndarray | None]:
    """``states`` as plain arrays: ``(x, groups, time, position)``.

    ``states`` is an array ``(time, particle, feature)``, a DataArray with those
    dims (any order) or a Dataset with ``states``. From a DataArray, ``groups``
    defaults to its ``prompt_index``, and ``time`` and ``position`` are its
    coordinates (``None`` when absent, and always for an array).
    """
    time = position = None
    if isinstance(states, xr.Dataset):
        states = states["states"]
    if isinstance(states, xr.DataArray):
        if groups is None and "prompt_index" in states.coords:
            groups = states["prompt_index"].values
        if "position" in states.coords:
            position = states["position"].values
        time = states["time"].values if "time" in states.coords else None
        states = states.transpose("time", "particle", "feature").values
    return np.asarray(states), groups, time, position


def normalize_rows(x: np.ndarray) -> np.ndarray:
    """``x / |x|`` row-wise; zero rows stay zero (they have no direction), NaN stays NaN."""
    norms = np.linalg.norm(x, axis=-1, keepdims=True)
    return x / np.where(norms == 0, 1.0, norms)


def map_frames(states: Any, func: Callable[[np.ndarray], Any], dtype: Any = float) -> Any:
    """Apply ``func((n, d) float64 array) -> scalar`` to every snapshot.

    ``states``: an array ``(..., n, d)`` (result: a scalar for ``(n, d)``, else
    an array of the leading shape), an :class:`xarray.DataArray` with
    ``particle`` and ``feature`` dims (result: a DataArray over the other dims,
    evaluated one frame at a time, so lazily opened runs are fine) or a Dataset
    with ``states``.
    """
    if isinstance(states, xr.Dataset):
        if "states" not in states:
            raise UserError("the Dataset has no 'states' variable")
        states = states["states"]
    if isinstance(states, xr.DataArray):
        missing = {"particle", "feature"} - set(states.dims)
        if missing:
            raise UserError(
                f"states need dims 'particle' and 'feature' (missing {sorted(missing)})"
            )
        outer = [d for d in states.dims if d not in ("particle", "feature")]
        arranged = states.transpose(*outer, "particle", "feature")
        shape = tuple(arranged.sizes[d] for d in outer)
        out = np.empty(shape, dtype=dtype)
        for index in np.ndindex(*shape):
            frame = arranged[index] if index else arranged
            out[index] = func(np.asarray(frame.values, dtype=np.float64))
        coords = {d: states.coords[d] for d in outer if d in states.coords}
        return xr.DataArray(out, dims=outer, coords=coords)
    array = np.asarray(states, dtype=np.float64)
    if array.ndim < 2:
        raise UserError(f"states must be (..., n, d), got shape {array.shape}")
    if array.ndim == 2:
        return func(array)
    flat = array.reshape(-1, *array.shape[-2:])
    out = np.array([func(frame) for frame in flat], dtype=dtype)
    return out.reshape(array.shape[:-2])


def iter_blocks(x: np.ndarray, other: np.ndarray | None = None) -> Iterator[tuple[int, np.ndarray]]:
    """``(start, x[start:stop] @ other.T)`` blocks of the ``(n, m)`` product."""
    other = x if other is None else other
    rows = block_rows(other.shape[0])
    for start in range(0, x.shape[0], rows):
        yield start, x[start : start + rows] @ other.T  # (c, m)

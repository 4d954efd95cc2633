"""Clusters of particles on the sphere: THE cluster counter of tokenfield.

Two particles are linked when ``<x_i, x_j> >= 1 - eps`` (an angle below
``arccos(1 - eps)``, about ``sqrt(2 eps)`` radians); clusters are the connected
components of that graph (``scipy.sparse.csgraph``). States are put on the unit
sphere first, so the same function measures simulated particles and a real
model's residual stream alike.

The pairwise inner products are computed a block of rows at a time, and after
each block only a spanning forest (each particle linked to its component's
first member) is kept, so memory stays ``O(block * n)`` for any ``n``.

Also here: the diameter and the smallest pairwise inner product, and the time
structure of a cluster-count series: plateaus (metastable intervals of constant
count) and the times at which clusters merge.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import xarray as xr
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from tokenfield.analysis._frames import iter_blocks, map_frames, normalize_rows
from tokenfield.errors import UserError

DEFAULT_EPS = 1e-2


def check_eps(eps: float) -> float:
    """``eps`` as a float in ``[0, 2]`` (the merge threshold on ``1 - cos``), or a UserError."""
    if isinstance(eps, bool) or not (math.isfinite(float(eps)) and 0 <= float(eps) <= 2):
        raise UserError(f"eps must be a number in [0, 2], not {eps}", "pass e.g. eps=1e-2")
    return float(eps)


def _components(x: np.ndarray, eps: float) -> np.ndarray:
    """Component labels ``(n,)`` (each particle's component's first member)."""
    n = x.shape[0]
    x = normalize_rows(x)
    nodes = np.arange(n)
    representative = nodes.copy()
    for start, block in iter_blocks(x):
        rows, cols = np.nonzero(block >= 1.0 - eps)  # (c, n) links of this block
        graph = coo_matrix(
            (
                np.ones(rows.size + n, dtype=np.int8),
                (np.concatenate([rows + start, nodes]), np.concatenate([cols, representative])),
            ),
            shape=(n, n),
        )
        count, labels = connected_components(graph, directed=False)
        first = np.full(count, n, dtype=np.int64)
        np.minimum.at(first, labels, nodes)
        representative = first[labels]
    return representative


@dataclass(frozen=True)
class Clusters:
    """The clusters of one configuration.

    Attributes:
        labels: ``(n,)`` cluster of each particle; 0 is the largest cluster
            (ties broken by the first particle).
        masses: ``(count,)`` fraction of the particles in each cluster, descending.
        eps: the threshold used.

    Example:
        >>> c = tf.clusters(np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]]), eps=0.01)
        >>> c.labels.tolist(), c.masses.size, c.eps
        ([0, 0, 1], 2, 0.01)
    """

    labels: np.ndarray
    masses: np.ndarray
    eps: float

    @property
    def count(self) -> int:
        return int(self.masses.size)

    def to_dict(self) -> dict[str, Any]:
        return {"count": self.count, "masses": self.masses.tolist(), "eps": self.eps}


def clusters(states: Any, eps: float = DEFAULT_EPS) -> Clusters:
    """Cluster one configuration ``(n, d)`` (array, or DataArray ``(particle, feature)``).

    Particles are linked when ``<x_i, x_j> >= 1 - eps`` (unit vectors) and the
    clusters are the connected components of the links.

    Args:
        states: one configuration ``(n, d)``.
        eps: the link threshold.

    Returns:
        A :class:`Clusters`: each particle's cluster (0 the largest) and the
        clusters' masses.

    Raises:
        UserError: ``states`` is not one ``(n, d)`` configuration.

    Example:
        >>> c = tf.clusters(np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]]))
        >>> c.labels, c.masses
        (array([0, 0, 1]), array([0.66666667, 0.33333333]))
    """
    eps = check_eps(eps)
    if isinstance(states, xr.DataArray):
        states = states.transpose("particle", "feature").values
    x = np.asarray(states, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] < 1:
        raise UserError(f"clusters() takes one (n, d) configuration, got shape {x.shape}")
    representative = _components(x, eps)
    reps, first_index, sizes = np.unique(representative, return_index=True, return_counts=True)
    order = np.lexsort((first_index, -sizes))  # largest first, then by first particle
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    labels = rank[np.searchsorted(reps, representative)]
    masses = sizes[order] / x.shape[0]
    return Clusters(labels=labels, masses=masses, eps=eps)


def cluster_count(states: Any, eps: float = DEFAULT_EPS) -> Any:
    """Number of clusters at threshold ``eps`` (see the module docstring).

    Args:
        states: ``(..., n, d)`` array, or a DataArray / Dataset with ``particle``
            and ``feature`` dims (e.g. a run's ``states``, one count per time).
        eps: link particles with ``<x_i, x_j> >= 1 - eps``.

    Returns:
        An int for one configuration, else an int array / DataArray of the
        leading shape.

    Example:
        >>> tf.cluster_count(np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]]), eps=1e-3)
        2
    """
    eps = check_eps(eps)

    def frame(x: np.ndarray) -> int:
        return int(np.unique(_components(x, eps)).size)

    return map_frames(states, frame, dtype=np.int64)


def cluster_masses(states: Any, eps: float = DEFAULT_EPS) -> np.ndarray:
    """Fractions of the particles in each cluster of one configuration, descending.

    Args:
        states: one configuration ``(n, d)`` (see :func:`clusters`).
        eps: the link threshold.

    Returns:
        ``(count,)`` masses summing to 1, the largest first.

    Example:
        >>> tf.cluster_masses(np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]]))
        array([0.66666667, 0.33333333])
    """
    return clusters(states, eps).masses


def min_inner_product(states: Any, *, normalize: bool = True) -> Any:
    """``min_ij <x_i, x_j>`` per configuration (1 for a single particle).

    Args:
        states: ``(..., n, d)`` states, or a DataArray with ``particle`` and
            ``feature`` dims (e.g. a run's ``states``, one value per time).
        normalize: put the states on the unit sphere first.

    Returns:
        A float for one configuration, else an array / DataArray of the
        leading shape.

    Example:
        >>> tf.min_inner_product(np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]]))
        0.0
    """

    def frame(x: np.ndarray) -> float:
        x = normalize_rows(x) if normalize else x
        return float(min(block.min() for _, block in iter_blocks(x)))

    return map_frames(states, frame)


def diameter(states: Any) -> Any:
    """``max_ij |x_i - x_j|`` of the normalised states (chord length, in [0, 2]).

    Args:
        states: ``(..., n, d)`` states, or a DataArray with ``particle`` and
            ``feature`` dims.

    Returns:
        One diameter per configuration, of the leading shape.

    Example:
        >>> round(float(tf.diameter(np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]]))), 4)
        1.4142
    """
    inner = min_inner_product(states)
    return np.sqrt(np.maximum(0.0, 2.0 - 2.0 * inner))


@dataclass(frozen=True)
class Plateau:
    """An interval ``[start, end)`` on which the cluster count stays ``count``.

    ``end`` is the time of the first frame with another count (the last time
    for the final plateau)."""

    count: int
    start: float
    end: float

    @property
    def duration(self) -> float:
        return self.end - self.start

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "duration": self.duration}


@dataclass(frozen=True)
class CountChange:
    """The count went from ``before`` to ``after`` at ``time`` (first frame of the new count)."""

    time: float
    before: int
    after: int

    @property
    def is_merge(self) -> bool:
        return self.after < self.before

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _series(counts: Any, times: Any) -> tuple[np.ndarray, np.ndarray]:
    if isinstance(counts, xr.DataArray) and times is None:
        if counts.ndim != 1 or counts.dims[0] not in counts.coords:
            raise UserError("a count DataArray needs one dim with a coordinate (e.g. time)")
        times = counts[counts.dims[0]].values
    values = np.asarray(counts).reshape(-1)
    times = np.arange(values.size, dtype=np.float64) if times is None else np.asarray(times)
    times = times.astype(np.float64).reshape(-1)
    if times.size != values.size:
        raise UserError(f"{values.size} counts but {times.size} times")
    if times.size > 1 and np.any(np.diff(times) <= 0):
        raise UserError("times must be strictly increasing")
    return values.astype(np.int64), times


def plateaus(counts: Any, times: Any = None, *, min_duration: float = 0.0) -> list[Plateau]:
    """Maximal intervals of constant cluster count lasting at least ``min_duration``.

    Args:
        counts: ``(T,)`` cluster counts (array, or a DataArray over ``time``).
        times: ``(T,)`` times (default: the DataArray's coordinate, or 0..T-1).
        min_duration: keep plateaus at least this long (metastable states).

    Returns:
        The plateaus in time order, each with ``count``, ``start`` and ``end``
        (the time of the first frame with another count; the last time for the
        final plateau).

    Example:
        >>> tf.plateaus(np.array([4, 4, 3, 3, 3, 1]), min_duration=2)
        [Plateau(count=4, start=0.0, end=2.0), Plateau(count=3, start=2.0, end=5.0)]
    """
    values, times = _series(counts, times)
    if values.size == 0:
        return []
    breaks = np.flatnonzero(np.diff(values) != 0) + 1
    starts = np.concatenate([[0], breaks])
    ends = np.concatenate([breaks, [values.size - 1]])
    found = [
        Plateau(int(values[s]), float(times[s]), float(times[e]))
        for s, e in zip(starts, ends, strict=True)
    ]
    return [p for p in found if p.duration >= min_duration]


def count_changes(counts: Any, times: Any = None) -> list[CountChange]:
    """Every change of the cluster count, in time order."""
    values, times = _series(counts, times)
    idx = np.flatnonzero(np.diff(values) != 0) + 1
    return [CountChange(float(times[i]), int(values[i - 1]), int(values[i])) for i in idx]


def merge_times(counts: Any, times: Any = None) -> np.ndarray:
    """Times at which the cluster count drops (clusters merge).

    Args:
        counts: ``(T,)`` cluster counts (array, or a DataArray over ``time``).
        times: ``(T,)`` times (default: the DataArray's coordinate, or 0..T-1).

    Returns:
        The times of the first frame after each drop, float64.

    Example:
        >>> tf.merge_times(np.array([4, 4, 3, 3, 3, 1]), times=np.linspace(0.0, 1.0, 6))
        array([0.4, 1. ])
    """
    return np.array([c.time for c in count_changes(counts, times) if c.is_merge], dtype=np.float64)

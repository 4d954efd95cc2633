"""Token clouds: how the tokens of one prompt gather on the sphere, layer by layer.

The theory (seeds 002/004) says the tokens of a self-attention flow cluster
with depth: first into a few metastable groups, eventually into one point.
For each prompt (its own particle system) and each time, with ``y_i = x_i / |x_i|``
and ``G_ij = <y_i, y_j>``:

- ``mean_cos``: the mean pairwise cosine ``sum_{i != j} G_ij / (n (n - 1))``
  (1 = collapsed, about 0 = spread over the sphere).
- ``cluster_count`` and ``largest_mass``: from
  :func:`tokenfield.analysis.clusters.clusters`, the counter used on simulated
  particles (link ``G_ij >= 1 - eps``, connected components).
- ``spread``: the intrinsic (geodesic) spread, the root-mean-square angle in
  radians between each token and the cloud's mean direction ``m / |m|``,
  ``m = mean_i y_i`` (0 = collapsed).
- ``effective_dim``: the participation ratio of the uncentred second moment
  ``M = (1/n) sum_i y_i y_i^T`` (trace 1): ``1 / sum_k lambda_k^2 = n^2 / sum_ij G_ij^2``.
  1 for a collapsed cloud, ``1 / sum_c m_c^2`` for orthogonal clusters of
  masses ``m_c``, ``d`` for a cloud spread evenly over ``d`` directions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tokenfield.analysis._frames import trajectory_arrays
from tokenfield.analysis.clusters import DEFAULT_EPS, clusters
from tokenfield.errors import UserError

__all__ = ["CLOUD_MEASURES", "TokenClouds", "cloud_measures", "token_clouds"]

CLOUD_MEASURES = ("mean_cos", "cluster_count", "largest_mass", "spread", "effective_dim")


def _unit(x: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(x, axis=-1, keepdims=True)
    return x / np.where(norms > 0, norms, 1.0)


def cloud_measures(states: np.ndarray, eps: float = DEFAULT_EPS) -> dict[str, Any]:
    """The measures above for one configuration ``(n, d)``; ``masses`` too."""
    x = np.asarray(states, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] < 1:
        raise UserError(f"a token cloud is (n, d), got shape {x.shape}")
    y = _unit(x)
    n = y.shape[0]
    gram = y @ y.T  # (n, n)
    found = clusters(y, eps)
    mean = y.mean(axis=0)
    norm = np.linalg.norm(mean)
    if norm > 1e-12:
        angles = np.arccos(np.clip(y @ (mean / norm), -1.0, 1.0))
        spread = float(np.sqrt(np.mean(angles**2)))
    else:
        spread = float("nan")
    return {
        "mean_cos": float((gram.sum() - np.trace(gram)) / (n * (n - 1))) if n > 1 else 1.0,
        "cluster_count": found.count,
        "largest_mass": float(found.masses[0]),
        "spread": spread,
        "effective_dim": float(n * n / np.square(gram).sum()),
        "masses": found.masses,
    }


@dataclass(frozen=True)
class TokenClouds:
    """Cloud measures per time and group (prompt).

    Attributes:
        time: ``(T,)`` the time coordinate (layer index, or ODE time).
        groups: ``(P,)`` the group ids (prompt indices; ``[0]`` for one cloud).
        values: measure name -> ``(T, P)`` array.
        masses: ``[time][group]`` cluster masses, descending.
        eps: the cluster threshold.
    """

    time: np.ndarray
    groups: np.ndarray
    values: dict[str, np.ndarray]
    masses: list[list[np.ndarray]]
    eps: float

    def mean(self, name: str) -> np.ndarray:
        """``(T,)`` the measure averaged over groups (NaN-aware)."""
        return np.nanmean(self.values[name], axis=1)

    def to_dict(self) -> dict[str, Any]:
        return {
            "eps": self.eps,
            "time": self.time.tolist(),
            "groups": self.groups.tolist(),
            "mean": {name: self.mean(name).tolist() for name in self.values},
            "per_group": {name: self.values[name].T.tolist() for name in self.values},
        }


def token_clouds(
    states: Any,
    groups: Sequence[int] | np.ndarray | None = None,
    *,
    eps: float = DEFAULT_EPS,
    more_eps: Sequence[float] = (),
) -> TokenClouds:
    """Cloud measures of every group at every time.

    Args:
        states: a Dataset / DataArray with ``states`` ``(time, particle,
            feature)`` (a trace run: groups default to ``prompt_index``), or an
            array ``(time, n, d)``.
        groups: ``(n,)`` group of each particle (default: ``prompt_index`` when
            there is one, else one group).
        eps: cluster threshold (see :mod:`tokenfield.analysis.clusters`).
        more_eps: further thresholds; each adds ``cluster_count@{eps}`` (real
            tokens rarely come within ``eps = 0.01`` of each other, so coarser
            thresholds say more about them).

    Returns:
        A ``TokenClouds``: ``values`` maps each measure (``cluster_count``,
        ``largest_mass``, ``mean_cos``, ``spread``, ``effective_dim``) to a
        ``(T, P)`` array, with the cluster ``masses`` per time and group.

    Example:
        >>> sim = tf.simulate(tf.Dynamics(beta=4.0), tf.initial_condition("uniform", n=8, d=3),
        ...                   t_max=1.0, dt=0.1)
        >>> clouds = tf.token_clouds(sim.states.values)
        >>> sorted(clouds.values), clouds.values["cluster_count"].shape
        (['cluster_count', 'effective_dim', 'largest_mass', 'mean_cos', 'spread'], (11, 1))
    """
    x, groups, time, _position = trajectory_arrays(states, groups)
    if x.ndim != 3:
        raise UserError(f"states must be (time, particle, feature), got shape {x.shape}")
    time = np.arange(x.shape[0]) if time is None else np.asarray(time)
    labels = np.zeros(x.shape[1], dtype=np.int64) if groups is None else np.asarray(groups)
    ids = np.unique(labels)
    names = [*CLOUD_MEASURES, *(f"cluster_count@{e:g}" for e in more_eps)]
    values = {name: np.full((x.shape[0], ids.size), np.nan) for name in names}
    masses: list[list[np.ndarray]] = [[] for _ in range(x.shape[0])]
    for column, group in enumerate(ids):
        members = np.flatnonzero(labels == group)
        for t in range(x.shape[0]):
            found = cloud_measures(x[t, members], eps)
            for name in CLOUD_MEASURES:
                values[name][t, column] = found[name]
            for e in more_eps:
                values[f"cluster_count@{e:g}"][t, column] = clusters(x[t, members], e).count
            masses[t].append(found["masses"])
    return TokenClouds(time, ids, values, masses, float(eps))

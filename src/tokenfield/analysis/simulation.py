"""The standard measurements of a simulated run: energy, clusters, plateaus.

:func:`analyze_simulation` takes a simulation Dataset (from
:func:`tokenfield.simulate` or ``open_run``) and returns plain JSON data; the
``tokenfield analyze`` command stores it in ``metrics.json`` and hands it to
:func:`tokenfield.viz.simulation.write_simulation_figures`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import xarray as xr

from tokenfield._io import to_jsonable
from tokenfield.analysis.clusters import (
    DEFAULT_EPS,
    clusters,
    count_changes,
    min_inner_product,
    plateaus,
)
from tokenfield.analysis.energy import energy
from tokenfield.errors import UserError


def run_config(ds: xr.Dataset) -> dict[str, Any]:
    """The config that made ``ds`` (from ``open_run``'s ``attrs["run"]`` or the
    Zarr attribute), or ``{}``."""
    run = ds.attrs.get("run")
    if isinstance(run, dict) and isinstance(run.get("config"), dict):
        return run["config"]
    raw = ds.attrs.get("tokenfield_config")
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except json.JSONDecodeError:
            return {}
    return raw if isinstance(raw, dict) else {}


def _bilinear(dynamics: dict[str, Any]) -> np.ndarray | None:
    """``Q^T K`` when the config lists one head's matrices in full, else ``None`` (identity)."""
    query, key = dynamics.get("query"), dynamics.get("key")
    if query is None and key is None:
        return None
    if isinstance(query, dict) or isinstance(key, dict):
        return None  # stored by digest only
    arrays = [None if m is None else np.asarray(m, dtype=np.float64) for m in (query, key)]
    d = next(a.shape[-1] for a in arrays if a is not None)
    q, k = (np.eye(d) if a is None else a for a in arrays)
    if q.reshape(-1, d, d).shape[0] != 1 or k.reshape(-1, d, d).shape[0] != 1:
        return None  # several heads or layers: no single energy
    return q.reshape(d, d).T @ k.reshape(d, d)


def _finite(values: np.ndarray) -> list[float | None]:
    return to_jsonable(np.asarray(values, dtype=float))


def _frame_indices(size: int, max_frames: int | None) -> np.ndarray:
    if max_frames is None or size <= max_frames:
        return np.arange(size)
    return np.unique(np.linspace(0, size - 1, max_frames).round().astype(int))


def analyze_simulation(
    ds: xr.Dataset,
    *,
    eps: float = DEFAULT_EPS,
    beta: float | None = None,
    max_frames: int | None = 500,
    min_plateau: float = 0.1,
) -> dict[str, Any]:
    """Energy, cluster count and metastable plateaus over time (JSON-able).

    Args:
        ds: a Dataset with ``states`` ``(time, particle, feature)`` (a leading
            ``system`` dim is analysed system by system).
        eps: cluster threshold, see :func:`~tokenfield.analysis.clusters.cluster_count`.
        beta: inverse temperature for the energy (default: the run config's).
        max_frames: analyse at most this many evenly spaced frames (first and
            last included); ``None`` for all.
        min_plateau: report as metastable the plateaus lasting at least this
            fraction of the simulated time span.

    Returns:
        ``{"beta", "eps", "energy_normalization", "energy_form", "time",
        "energy", "cluster_count", "min_inner_product", "plateaus",
        "metastable", "merges", "final", "energy_nondecreasing"}``; with a
        batch, the same for system 0 plus ``"systems"`` (one dict per system).

    Example:
        >>> x0 = tf.initial_condition("uniform", n=8, d=3, seed=0)
        >>> sim = tf.simulate(tf.Dynamics(beta=4.0), x0, t_max=1.0, dt=0.1)
        >>> summary = tf.analyze_simulation(sim)
        >>> final = summary["final"]
        >>> final["time"], len(summary["cluster_count"])
        (1.0, 11)
    """
    if "states" not in ds:
        raise UserError("the Dataset has no 'states' variable", "pass a simulation run")
    config = run_config(ds)
    dynamics = config.get("dynamics", {}) if isinstance(config, dict) else {}
    if beta is None:
        beta = dynamics.get("beta")
    if beta is None:
        raise UserError("cannot find beta in the run config", "pass beta=...")
    states = ds["states"]
    if "system" in states.dims:
        per_system = [
            _analyze_one(states.isel(system=s), float(beta), eps, dynamics, max_frames, min_plateau)
            for s in range(states.sizes["system"])
        ]
        return {**per_system[0], "systems": per_system}
    return _analyze_one(states, float(beta), eps, dynamics, max_frames, min_plateau)


def _analyze_one(
    states: xr.DataArray,
    beta: float,
    eps: float,
    dynamics: dict[str, Any],
    max_frames: int | None,
    min_plateau: float,
) -> dict[str, Any]:
    states = states.isel(time=_frame_indices(states.sizes["time"], max_frames))
    times = np.asarray(states["time"].values, dtype=np.float64)
    normalization = "glpr" if beta != 0 else "mean"
    bilinear = _bilinear(dynamics)
    energies = np.empty(times.size)
    counts = np.empty(times.size, dtype=np.int64)
    inner = np.empty(times.size)
    last = None
    for i in range(times.size):
        frame = np.asarray(states.isel(time=i).transpose("particle", "feature").values, dtype=float)
        energies[i] = energy(frame, beta, normalization=normalization, bilinear=bilinear)
        last = clusters(frame, eps)
        counts[i] = last.count
        inner[i] = min_inner_product(frame)
    span = float(times[-1] - times[0]) if times.size else 0.0
    found = plateaus(counts, times)
    finite = energies[np.isfinite(energies)]
    scale = np.abs(finite).max() if finite.size else 1.0
    return {
        "beta": beta,
        "eps": eps,
        "energy_normalization": normalization,
        "energy_form": "<x, y>" if bilinear is None else "<x, Q^T K y>",
        "time": _finite(times),
        "energy": _finite(energies),
        "cluster_count": counts.tolist(),
        "min_inner_product": _finite(inner),
        "plateaus": [p.to_dict() for p in found],
        "metastable": [p.to_dict() for p in found if span > 0 and p.duration >= min_plateau * span],
        "merges": [c.to_dict() for c in count_changes(counts, times) if c.is_merge],
        "final": {
            "time": float(times[-1]),
            "cluster_count": int(counts[-1]),
            "cluster_masses": last.masses.tolist() if last is not None else [],
            "energy": _finite(energies[-1:])[0],
        },
        "energy_nondecreasing": bool(np.all(np.diff(finite) >= -1e-9 * max(scale, 1e-300))),
    }


# At most this many particles are drawn (a fixed, evenly spaced subset).
MAX_DRAWN = 4000


@dataclass(frozen=True)
class ParticleFrames:
    """What the particle figures draw, computed here so drawing computes nothing.

    Attributes:
        time: ``(frames,)`` the saved times drawn.
        points: ``(frames, n, d)`` the drawn particles (at most :data:`MAX_DRAWN`,
            evenly spaced), scaled to unit norm.
        labels: ``(frames, n)`` cluster labels at ``cos >= 1 - eps``.
        basis: ``(2, d)`` the first two principal directions of the drawn states
            (20 evenly spaced times) when ``d > 3``, else ``None``.
    """

    time: np.ndarray
    points: np.ndarray
    labels: np.ndarray
    basis: np.ndarray | None

    @property
    def dim(self) -> int:
        return int(self.points.shape[-1])


def _drawn_states(ds: xr.Dataset | xr.DataArray, system: int = 0) -> xr.DataArray:
    states = ds["states"] if isinstance(ds, xr.Dataset) else ds
    if "system" in states.dims:
        states = states.isel(system=system)
    n = states.sizes["particle"]
    if n > MAX_DRAWN:
        states = states.isel(particle=np.linspace(0, n - 1, MAX_DRAWN).astype(int))
    return states.transpose("time", "particle", "feature")


def _unit_frame(states: xr.DataArray, index: int) -> np.ndarray:
    x = np.asarray(states.isel(time=index).values, dtype=float)
    norms = np.linalg.norm(x, axis=-1, keepdims=True)
    return x / np.where(norms > 0, norms, 1.0)


def pca_basis(sample: np.ndarray) -> np.ndarray:
    """``(2, d)``: the first two principal directions of the rows of ``sample``
    ``(m, d)`` (centred SVD)."""
    sample = sample - sample.mean(axis=0)
    _, _, vt = np.linalg.svd(sample, full_matrices=False)
    return vt[:2]


def particle_frames(
    ds: xr.Dataset | xr.DataArray,
    indices: Any,
    *,
    eps: float | None = None,
    system: int = 0,
) -> ParticleFrames:
    """The particles of one system at the saved-time ``indices`` (ints, negative
    allowed), unit-scaled, with their cluster labels and, for ``d > 3``, the PCA
    basis of the whole run (see :class:`ParticleFrames`)."""
    states = _drawn_states(ds, system)
    eps = eps or DEFAULT_EPS
    basis = None
    if states.sizes["feature"] > 3:
        picks = np.unique(np.linspace(0, states.sizes["time"] - 1, 20).astype(int))
        basis = pca_basis(np.concatenate([_unit_frame(states, int(i)) for i in picks]))
    indices = [int(i) for i in np.atleast_1d(indices)]
    points = np.stack([_unit_frame(states, i) for i in indices])
    labels = np.stack([clusters(x, eps).labels for x in points])
    time = np.asarray(states["time"].values)[indices]
    return ParticleFrames(time, points, labels, basis)

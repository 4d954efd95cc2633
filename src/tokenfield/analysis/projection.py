"""Linear projections of trajectories: the PCA frame of the seed experiment.

The seed fitted one PCA on every (time, particle) state at once and drew each
particle's path in the first two components. :func:`fit_projection` does that,
and returns the fitted frame as data (:class:`Projection`) so that a later run
(a steered model, a random-weight baseline) can be drawn in the same frame with
:func:`project`.

Options:

- ``sphere``: fit on ``x / ||x||``. The raw residual norm grows by about two
  orders of magnitude with depth, so raw PC1 is largely norm growth; the theory
  (self-attention as particles on the sphere) lives on the unit sphere.
- ``per_layer``: one PCA per time step, fitted on that step's particles only.
  Components are sign-aligned with the previous step's so paths do not flip.
- ``include_final_norm``: also fit on ``final_norm_states`` (off by default, as
  in the seed: the final norm rescales everything and confuses the picture).

Sign convention (so that pictures are comparable between runs): PC1 is oriented
so that the mean projection at the last time step is larger than at the first
("time flows to the right"); other components follow scikit-learn's
deterministic SVD sign.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from tokenfield._io import atomic_path
from tokenfield.errors import UserError
from tokenfield.runs import PROJECTION_NPZ


@dataclass(frozen=True)
class Projection:
    """A fitted linear frame: ``pcs = (normalise(x) - mean) @ components.T``.

    Attributes:
        mean: ``(feature,)``, or ``(time, feature)`` when ``per_layer``.
        components: ``(component, feature)``, or ``(time, component, feature)``.
        explained_variance_ratio: ``(component,)`` or ``(time, component)``.
        sphere: states were normalised to unit norm before the fit.
        per_layer: one frame per time step (``times`` gives which).
        include_final_norm: the fit included ``final_norm_states``.
        times: the time coordinate the per-layer frames belong to (else None).
        source: free-form provenance (the run path, kind, model).

    Example:
        >>> sim = tf.simulate(tf.Dynamics(beta=4.0), tf.initial_condition("uniform", n=8, d=3),
        ...                   t_max=1.0, dt=0.1)
        >>> frame = tf.fit_projection(sim)
        >>> frame.components.shape, frame.per_layer
        ((3, 3), False)
    """

    mean: np.ndarray
    components: np.ndarray
    explained_variance_ratio: np.ndarray
    sphere: bool = False
    per_layer: bool = False
    include_final_norm: bool = False
    times: np.ndarray | None = None
    source: dict[str, Any] = field(default_factory=dict)

    @property
    def n_components(self) -> int:
        return int(self.components.shape[-2])

    @property
    def n_features(self) -> int:
        return int(self.components.shape[-1])

    def options(self) -> dict[str, Any]:
        """The options as JSON data (for metrics.json)."""
        return {
            "sphere": self.sphere,
            "per_layer": self.per_layer,
            "include_final_norm": self.include_final_norm,
            "n_components": self.n_components,
        }

    def save(self, path: str | Path) -> Path:
        """Write the frame to an ``.npz`` file (arrays plus the options as JSON)."""
        path = Path(path)
        meta = {**self.options(), "source": self.source}
        arrays: dict[str, np.ndarray] = {
            "mean": self.mean,
            "components": self.components,
            "explained_variance_ratio": self.explained_variance_ratio,
            "meta_json": np.array(json.dumps(meta, default=str)),
        }
        if self.times is not None:
            arrays["times"] = np.asarray(self.times)
        with atomic_path(path, ".npz") as tmp:
            np.savez(tmp, **arrays)
        return path


def load_projection(path: str | Path) -> Projection:
    """Read a frame written by :meth:`Projection.save` (a file or a run directory).

    Args:
        path: an ``.npz`` file, or a run directory holding the
            ``projection.npz`` that :func:`tokenfield.analyze_run` wrote.

    Returns:
        The :class:`Projection`, ready for :func:`project`.

    Raises:
        UserError: no frame at ``path``.

    Example:
        >>> frame = tf.load_projection("runs/spectrum")   # doctest: +SKIP
        >>> pcs = tf.project(tf.open_run("runs/spectrum-steered"), frame)  # doctest: +SKIP
    """
    path = Path(path)
    if path.is_dir():
        path = path / PROJECTION_NPZ
    if not path.is_file():
        raise UserError(
            f"no saved projection at '{path}'",
            "run 'tokenfield analyze' on the reference run first",
        )
    try:
        with np.load(path, allow_pickle=False) as data:
            meta = json.loads(str(data["meta_json"]))
            return Projection(
                mean=data["mean"],
                components=data["components"],
                explained_variance_ratio=data["explained_variance_ratio"],
                sphere=bool(meta["sphere"]),
                per_layer=bool(meta["per_layer"]),
                include_final_norm=bool(meta["include_final_norm"]),
                times=data.get("times", None),
                source=meta.get("source", {}),
            )
    except (KeyError, ValueError, OSError) as exc:
        raise UserError(
            f"'{path}' is not a saved projection ({exc})", "re-run the analysis"
        ) from None


def _unit(x: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(x, axis=-1, keepdims=True)
    return x / np.where(norms > 0, norms, 1.0)


def _states(ds: xr.Dataset) -> np.ndarray:
    if "states" not in ds:
        raise UserError("the trajectory has no 'states' variable", "pass a tokenfield run")
    states = ds["states"].transpose("time", "particle", "feature")
    return np.asarray(states.values, dtype=np.float64)  # (time, particle, feature)


def _pca(x: np.ndarray, n_components: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """PCA of the rows of ``x``: (mean, components, explained variance ratio)."""
    from sklearn.decomposition import PCA

    k = max(1, min(n_components, x.shape[0] - 1 if x.shape[0] > 1 else 1, x.shape[1]))
    pca = PCA(n_components=k, svd_solver="full" if min(x.shape) <= 2000 else "auto")
    pca.fit(x)
    return pca.mean_, pca.components_, pca.explained_variance_ratio_


def fit_projection(
    ds: xr.Dataset,
    *,
    n_components: int = 10,
    sphere: bool = False,
    per_layer: bool = False,
    include_final_norm: bool = False,
) -> Projection:
    """Fit the PCA frame on a trajectory.

    Args:
        ds: a trajectory Dataset with ``states`` (time, particle, feature).
            Select particles first (e.g. the last tokens) if only those matter.
        n_components: how many components to keep (at most the data allows).
        sphere: normalise every state to unit norm before fitting.
        per_layer: fit one PCA per time step instead of one for all.
        include_final_norm: add ``final_norm_states`` to the global fit.

    Returns:
        The fitted :class:`Projection`.

    Example:
        >>> sim = tf.simulate(tf.Dynamics(beta=4.0), tf.initial_condition("uniform", n=8, d=3),
        ...                   t_max=1.0, dt=0.1)
        >>> frame = tf.fit_projection(sim)
        >>> tf.project(sim, frame).shape                  # (time, particle, component)
        (11, 8, 3)
    """
    states = _states(ds)
    if sphere:
        states = _unit(states)
    n_time, n_particle, n_feature = states.shape
    if n_particle == 0 or n_time == 0:
        raise UserError("the trajectory is empty", "trace or simulate at least one particle")
    source = dict(ds.attrs.get("run", {}).get("config", {}) or {})
    source = {k: source[k] for k in ("model", "kind") if k in source}
    source["kind"] = ds.attrs.get("run", {}).get("kind", source.get("kind", ""))
    if per_layer:
        if n_particle < 2:
            raise UserError(
                "per-layer PCA needs at least 2 particles", "trace more prompts or drop per_layer"
            )
        if include_final_norm:
            raise UserError(
                "per-layer PCA cannot include the final-norm states",
                "drop include_final_norm or per_layer",
            )
        k = max(1, min(n_components, n_particle - 1 if n_particle > 1 else 1, n_feature))
        means = np.zeros((n_time, n_feature))
        comps = np.zeros((n_time, k, n_feature))
        ratios = np.zeros((n_time, k))
        for t in range(n_time):
            mean, comp, ratio = _pca(states[t], k)
            kk = comp.shape[0]
            if t > 0:
                # keep paths continuous: flip a component that points against the last frame's
                signs = np.sign(np.sum(comp * comps[t - 1, :kk], axis=1))
                comp = comp * np.where(signs == 0, 1.0, signs)[:, None]
            means[t], comps[t, :kk], ratios[t, :kk] = mean, comp, ratio
        return Projection(
            means,
            comps,
            ratios,
            sphere=sphere,
            per_layer=True,
            times=np.asarray(ds["time"].values),
            source=source,
        )
    rows = states.reshape(n_time * n_particle, n_feature)
    if include_final_norm:
        if "final_norm_states" not in ds:
            raise UserError("the run has no 'final_norm_states'", "fit without include_final_norm")
        final = np.asarray(
            ds["final_norm_states"].transpose("particle", "feature").values, dtype=np.float64
        )
        rows = np.concatenate([rows, _unit(final) if sphere else final])
    mean, comp, ratio = _pca(rows, n_components)
    pc1 = (states - mean) @ comp[0]  # (time, particle)
    if pc1[-1].mean() < pc1[0].mean():
        comp = comp.copy()
        comp[0] = -comp[0]
    return Projection(
        mean,
        comp,
        ratio,
        sphere=sphere,
        include_final_norm=include_final_norm,
        source=source,
    )


def project(ds: xr.Dataset, frame: Projection) -> xr.DataArray:
    """Project a trajectory's states into a fitted frame.

    Args:
        ds: any trajectory with ``states`` (time, particle, feature) of the
            frame's feature size (a per-layer frame also needs the same times).
        frame: a :class:`Projection` (fitted here or loaded with
            :func:`load_projection`).

    Returns:
        ``pcs`` with dims (time, particle, component), components named 1, 2, ...
        When the frame included the final norm and ``ds`` has
        ``final_norm_states``, they are appended as one more time step whose
        ``is_final_norm`` coordinate is True.

    Example:
        >>> sim = tf.simulate(tf.Dynamics(beta=4.0), tf.initial_condition("uniform", n=8, d=3),
        ...                   t_max=1.0, dt=0.1)
        >>> pcs = tf.project(sim, tf.fit_projection(sim))
        >>> pcs.dims, pcs.shape
        (('time', 'particle', 'component'), (11, 8, 3))
    """
    states = _states(ds)
    if states.shape[-1] != frame.n_features:
        raise UserError(
            f"the trajectory has {states.shape[-1]} features but the projection was fitted "
            f"on {frame.n_features}",
            "project runs of the same model only",
        )
    if frame.sphere:
        states = _unit(states)
    times = np.asarray(ds["time"].values)
    if frame.per_layer:
        if frame.times is None or len(frame.times) != len(times):
            raise UserError(
                "a per-layer projection needs the same time steps as the run it was fitted on",
                "use a global projection (per_layer=False) for this run",
            )
        pcs = np.einsum("tpf,tcf->tpc", states - frame.mean[:, None, :], frame.components)
    else:
        pcs = (states - frame.mean) @ frame.components.T
    is_final = np.zeros(len(times), dtype=bool)
    if frame.include_final_norm and "final_norm_states" in ds:
        final = np.asarray(
            ds["final_norm_states"].transpose("particle", "feature").values, dtype=np.float64
        )
        if frame.sphere:
            final = _unit(final)
        pcs = np.concatenate([pcs, ((final - frame.mean) @ frame.components.T)[None]])
        step = times[-1] - times[-2] if len(times) > 1 else 1
        times = np.append(times, times[-1] + step)
        is_final = np.append(is_final, True)
    coords: dict[str, Any] = {
        "time": times,
        "component": np.arange(1, pcs.shape[-1] + 1),
        "is_final_norm": ("time", is_final),
    }
    particle_coords = {
        name: coord for name, coord in ds["states"].coords.items() if coord.dims == ("particle",)
    }
    out = xr.DataArray(
        pcs, dims=("time", "particle", "component"), coords=coords, name="pcs"
    ).assign_coords(particle_coords)
    out.attrs = {"sphere": frame.sphere, "per_layer": frame.per_layer}
    return out


@dataclass(frozen=True)
class DepthOrdering:
    """How well PC1 orders the time steps ("depth is time").

    Attributes:
        per_particle: Spearman rank correlation between PC1 and the time
            coordinate along each particle's path, dims (particle,).
        overall: the same over every (time, particle) pair pooled.
        component: which component was tested (1 = PC1).

    Example:
        >>> sim = tf.simulate(tf.Dynamics(beta=4.0), tf.initial_condition("uniform", n=8, d=3),
        ...                   t_max=1.0, dt=0.1)
        >>> order = tf.depth_ordering(tf.project(sim, tf.fit_projection(sim)))
        >>> type(order).__name__, order.component
        ('DepthOrdering', 1)
    """

    per_particle: xr.DataArray
    overall: float
    component: int = 1

    @property
    def median(self) -> float:
        values = self.per_particle.values
        return float(np.nanmedian(values)) if np.isfinite(values).any() else float("nan")


def depth_ordering(pcs: xr.DataArray, component: int = 1) -> DepthOrdering:
    """Spearman correlation of one principal component with the time coordinate.

    ``rho = 1`` means the component increases strictly with depth for every
    particle (PC1 *is* time); ``rho = 0`` means it does not order the layers.
    Final-norm steps (``is_final_norm``) are left out.

    Args:
        pcs: (time, particle, component) from :func:`project` with a global frame
            (with a per-layer frame every correlation is NaN).
        component: the component number (1-based).

    Returns:
        A ``DepthOrdering``: ``per_particle`` (particle,) and ``overall``
        correlations and the ``component`` tested.

    Example:
        >>> sim = tf.simulate(tf.Dynamics(beta=4.0), tf.initial_condition("uniform", n=8, d=3),
        ...                   t_max=1.0, dt=0.1)
        >>> order = tf.depth_ordering(tf.project(sim, tf.fit_projection(sim)))
        >>> order.per_particle.dims, -1.0 <= order.overall <= 1.0
        (('particle',), True)
    """
    from scipy.stats import spearmanr

    if "is_final_norm" in pcs.coords:
        pcs = pcs.isel(time=~pcs["is_final_norm"].values)
    values = np.asarray(pcs.sel(component=component).transpose("time", "particle").values)
    times = np.asarray(pcs["time"].values, dtype=np.float64)
    per = np.full(values.shape[1], np.nan)
    # per-layer frames are unrelated across time: no ordering to measure
    comparable = len(times) >= 2 and not pcs.attrs.get("per_layer", False)
    if comparable:
        for p in range(values.shape[1]):
            column = values[:, p]
            if np.ptp(column) > 0:
                per[p] = spearmanr(times, column).statistic
    overall = float("nan")
    if comparable and np.ptp(values) > 0:
        overall = float(spearmanr(np.repeat(times, values.shape[1]), values.ravel()).statistic)
    particle_coords = {k: v for k, v in pcs.coords.items() if v.dims == ("particle",)}
    per_particle = xr.DataArray(per, dims=("particle",), coords=particle_coords, name="spearman")
    return DepthOrdering(per_particle, overall, component)

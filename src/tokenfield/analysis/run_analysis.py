"""The standard analysis of one run: projection, depth ordering, kinematics,
separation, bifurcation and centroid distances, on a trace or a simulation.

:func:`analyze` computes (Dataset in, :class:`RunAnalysis` out, nothing
written); :func:`tokenfield.pipelines.analyze.analyze_run` opens a run directory, analyses it and writes
``metrics.json``, ``projection.npz`` and ``figures/`` into it.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import xarray as xr

from tokenfield._io import to_jsonable
from tokenfield.analysis.kinematics import kinematics
from tokenfield.analysis.nulls import ALPHA, claim_status
from tokenfield.analysis.projection import (
    PROJECTION_NPZ,
    DepthOrdering,
    Projection,
    depth_ordering,
    fit_projection,
    project,
)
from tokenfield.analysis.separation import (
    bifurcation,
    can_separate,
    category_labels,
    centroid_distances,
    separation,
)
from tokenfield.errors import UserError


def select_particles(ds: xr.Dataset, which: str = "last") -> xr.Dataset:
    """The particles an analysis uses.

    ``"last"``: each prompt's last real token when the run has ``is_last``
    (the seed followed the last token, the one that predicts the next);
    otherwise every particle. ``"all"``: every particle.

    Args:
        ds: a trajectory Dataset.
        which: ``"last"`` or ``"all"``.

    Returns:
        ``ds`` restricted to those particles.

    Example:
        >>> from tokenfield.analysis import select_particles
        >>> sim = tf.simulate(tf.Dynamics(beta=4.0), tf.initial_condition("uniform", n=8, d=3),
        ...                   t_max=1.0, dt=0.1)
        >>> select_particles(sim, "last").sizes["particle"]   # no is_last: every particle
        8
    """
    if which not in ("last", "all"):
        raise UserError(f"unknown particle selection '{which}'", "use 'last' or 'all'")
    if which == "last" and "is_last" in ds.coords:
        mask = np.asarray(ds["is_last"].values, dtype=bool)
        if mask.any() and not mask.all():
            return ds.isel(particle=np.flatnonzero(mask))
    return ds


TIME_CONVENTIONS = ("seed", "all")


def is_trace(ds: xr.Dataset) -> bool:
    """Whether a trajectory is a traced model (its time axis is depth), not a simulation."""
    kind = (ds.attrs.get("run", {}) or {}).get("kind")
    return kind == "trace" if kind else "prompt" in ds.coords


def select_times(ds: xr.Dataset, times: str = "seed") -> xr.Dataset:
    """The time steps an analysis uses: a named choice, recorded in metrics.json.

    A trace holds times ``0 .. L``: the input of block 0 (the embedding) and the
    raw output of each of the ``L`` blocks (the final norm is kept apart).

    - ``"seed"``: times ``0 .. L-1``, exactly the seed experiment's
      ``hidden_states[:-1]``. In Hugging Face transformers the last entry of
      ``hidden_states`` is the *final-normed* output of the last block, so
      dropping it also dropped the raw output of the last block (time ``L``).
    - ``"all"``: times ``0 .. L``.

    Simulations have no such convention: every saved time is used either way.
    """
    if times not in TIME_CONVENTIONS:
        raise UserError(f"unknown time convention '{times}'", "use 'seed' or 'all'")
    if times == "seed" and is_trace(ds) and ds.sizes.get("time", 0) > 2:
        return ds.isel(time=slice(0, -1))
    return ds


def display_labels(obj: xr.Dataset | xr.DataArray) -> list[str]:
    """A short name per particle: its ``label`` (e.g. the seed's prompt number),
    else its prompt index, else its particle id.

    Args:
        obj: a Dataset or DataArray with a ``particle`` dim.

    Returns:
        One string per particle.

    Example:
        >>> from tokenfield.analysis import display_labels
        >>> sim = tf.simulate(tf.Dynamics(beta=4.0), tf.initial_condition("uniform", n=8, d=3),
        ...                   t_max=1.0, dt=0.1)
        >>> ", ".join(display_labels(sim)[:3])
        '0, 1, 2'"""
    n = obj.sizes["particle"]
    for name in ("label", "prompt_index", "particle"):
        if name in obj.coords:
            values = [str(v) for v in np.asarray(obj[name].values).tolist()]
            if name != "label" or all(values):
                return values
    return [str(i) for i in range(n)]


def pick_layers(times: np.ndarray, n: int = 4) -> list[Any]:
    """``n`` evenly spaced time coordinates, first and last included."""
    if len(times) == 0:
        return []
    index = np.unique(np.round(np.linspace(0, len(times) - 1, min(n, len(times)))).astype(int))
    return [times[i].item() for i in index]


@dataclass
class RunAnalysis:
    """Everything :func:`analyze` measured on one run (arrays, not yet JSON).

    Attributes:
        info: what was analysed (kind, model, sizes, categories).
        options: the analysis options.
        frame: the global PCA frame.
        pcs: the particles in it (time, particle, component).
        depth: PC1 against time.
        depth_by_times: the depth ordering under each times convention
            (``"seed"``, ``"all"``).
        kinematics: see :func:`tokenfield.analysis.kinematics.kinematics`.
        separation, bifurcation, centroids: None when the run has no categories.
        layers: the time steps chosen for tables and heatmaps.
        per_layer_frame, per_layer_pcs: the per-layer PCA, when asked for.
        baseline: the same analysis of a baseline run (e.g. random weights).
        simulation: the simulation analysis, for simulated runs.

    Example:
        >>> sim = tf.simulate(tf.Dynamics(beta=4.0), tf.initial_condition("uniform", n=8, d=3),
        ...                   t_max=1.0, dt=0.1)
        >>> result = tf.analyze(sim)
        >>> type(result).__name__, result.pcs.dims
        ('RunAnalysis', ('time', 'particle', 'component'))
        >>> "depth_ordering" in result.to_dict()
        True
    """

    info: dict[str, Any]
    options: dict[str, Any]
    frame: Projection
    pcs: xr.DataArray
    depth: DepthOrdering
    kinematics: xr.Dataset
    depth_by_times: dict[str, DepthOrdering] = field(default_factory=dict)
    separation: xr.Dataset | None = None
    bifurcation: xr.Dataset | None = None
    centroids: xr.DataArray | None = None
    layers: list[Any] = field(default_factory=list)
    per_layer_frame: Projection | None = None
    per_layer_pcs: xr.DataArray | None = None
    baseline: RunAnalysis | None = None
    simulation: Any = None

    def to_dict(self) -> dict[str, Any]:
        """The analysis as JSON data (NaN becomes null), the content of metrics.json."""
        return to_jsonable(_metrics(self), default=str)

    to_metrics = to_dict  # the old name of the one serialisation verb

    def _repr_html_(self) -> str:
        """The summary table of the report (and of ``tokenfield analyze``), for Jupyter."""
        from tokenfield._html import html_table
        from tokenfield.analysis.metrics import summary_rows

        rows = summary_rows(self.to_dict())
        has_baseline = self.baseline is not None
        headers = ["measure", "run", "baseline"] if has_baseline else ["measure", "run"]
        cells = [row if has_baseline else row[:2] for row in rows]
        info = self.info
        model = info.get("model")
        model = model.get("name", "") if isinstance(model, dict) else model  # a trace: its config
        what = f"{info.get('kind', 'run')} of {model}" if model else str(info.get("kind", "run"))
        caption = (
            f"RunAnalysis: {what}, {info.get('n_particles')} particles x "
            f"{info.get('n_time')} time steps x {info.get('n_features')} features"
        )
        return html_table(caption, headers, cells)


def analyze(
    ds: xr.Dataset,
    *,
    baseline: xr.Dataset | None = None,
    sphere: bool = False,
    per_layer: bool = False,
    seed: int = 0,
    n_permutations: int = 200,
    particles: str = "last",
    margin: float = 0.25,
    frame: Projection | None = None,
    n_layers_shown: int = 4,
    times: str = "seed",
) -> RunAnalysis:
    """Analyse a trajectory (a trace or a simulation) without writing anything.

    Args:
        ds: a trajectory Dataset (e.g. from :func:`tokenfield.open_run`).
        baseline: the same kind of trajectory from a baseline model (a
            random-weight copy); analysed the same way, in its own frame.
        sphere: fit the PCA on unit-normalised states.
        per_layer: also fit one PCA per time step.
        seed: seeds the permutation null.
        n_permutations: shuffled labelings per time step for the null.
        particles: ``"last"`` (each prompt's last token, when the run knows
            which) or ``"all"``.
        margin: the bifurcation margin (see :func:`bifurcation`).
        frame: project into this frame instead of fitting one (e.g. a
            reference run's ``projection.npz``).
        n_layers_shown: how many time steps the centroid tables show.
        times: which time steps enter the analysis, ``"seed"`` (a trace's
            times ``0 .. L-1``, as the seed experiment) or ``"all"``
            (``0 .. L``); see :func:`select_times`. The depth ordering is also
            reported under the other convention (``depth_by_times``).

    Returns:
        A :class:`RunAnalysis` (``to_dict()`` is the content of ``metrics.json``;
        in Jupyter it shows as the summary table).

    Example:
        >>> sim = tf.simulate(tf.Dynamics(beta=4.0), tf.initial_condition("uniform", n=8, d=3),
        ...                   t_max=1.0, dt=0.1)
        >>> result = tf.analyze(sim)
        >>> result.info["kind"], result.pcs.dims
        ('simulation', ('time', 'particle', 'component'))
    """
    if "states" not in ds:
        raise UserError("the trajectory has no 'states' variable", "pass a tokenfield run")
    run = ds.attrs.get("run", {}) or {}
    system = None
    if "system" in ds["states"].dims:
        # a batch of simulated systems: the trajectory measures describe the first
        system = 0
        ds = ds.isel(system=0)
    # read the selected particles once: every measure below walks the states again
    every_time = select_particles(ds, particles).load()
    selected = select_times(every_time, times)
    fitted_here = frame is None
    if frame is None:
        frame = fit_projection(selected, sphere=sphere)
    pcs = project(selected, frame)
    depth = depth_ordering(pcs)
    depth_by_times: dict[str, DepthOrdering] = {}
    time_convention = times if is_trace(ds) else "all"
    if is_trace(ds):
        depth_by_times[times] = depth
        for other in TIME_CONVENTIONS:
            if other != times and fitted_here:
                subset = select_times(every_time, other)
                depth_by_times[other] = depth_ordering(
                    project(subset, fit_projection(subset, sphere=sphere))
                )
    times = np.asarray(selected["time"].values)
    options = {
        "times": time_convention,
        "sphere": frame.sphere,
        "per_layer": per_layer,
        "seed": seed,
        "n_permutations": n_permutations,
        "particles": particles,
        "bifurcation_margin": margin,
    }
    info: dict[str, Any] = {
        "kind": run.get("kind", "trace" if "prompt" in ds.coords else "simulation"),
        "model": (run.get("config") or {}).get("model", ""),
        "n_particles": int(selected.sizes["particle"]),
        "n_particles_in_run": int(ds.sizes["particle"]),
        "n_time": int(selected.sizes["time"]),
        "n_features": int(selected.sizes["feature"]),
        "time_first": times[0].item() if len(times) else None,
        "time_last": times[-1].item() if len(times) else None,
    }
    if system is not None:
        info["system"] = system
    result = RunAnalysis(
        info=info,
        options=options,
        frame=frame,
        pcs=pcs,
        depth=depth,
        depth_by_times=depth_by_times,
        kinematics=kinematics(selected, pcs if not frame.per_layer else None),
        layers=pick_layers(times, n_layers_shown),
    )
    if "category" in selected.coords:
        labels = category_labels(selected)
        info["categories"] = dict(sorted(Counter(labels.tolist()).items()))
        if can_separate(labels):
            result.separation = separation(
                selected, labels, n_permutations=n_permutations, seed=seed
            )
            result.bifurcation = bifurcation(selected, labels, margin=margin)
            best = int(
                np.argmax(np.nan_to_num(result.separation["silhouette"].values, nan=-np.inf))
            )
            best_time = times[best].item()
            if best_time not in result.layers:
                result.layers = sorted([*result.layers, best_time])
        if len(set(labels.tolist())) >= 2:
            result.centroids = centroid_distances(selected, labels)
    if per_layer:
        result.per_layer_frame = fit_projection(selected, sphere=sphere, per_layer=True)
        result.per_layer_pcs = project(selected, result.per_layer_frame)
    if baseline is not None:
        result.baseline = analyze(
            baseline,
            sphere=sphere,
            per_layer=per_layer,
            seed=seed,
            n_permutations=n_permutations,
            particles=particles,
            margin=margin,
            n_layers_shown=n_layers_shown,
            times=time_convention,
        )
    return result


def _nanmean(values: np.ndarray, axis: int) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        counts = np.isfinite(values).sum(axis=axis)
        sums = np.nansum(values, axis=axis)
        return np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)


def _metrics(result: RunAnalysis) -> dict[str, Any]:
    kin = result.kinematics
    steps = kin["step"].values
    metrics: dict[str, Any] = {
        "info": result.info,
        "options": result.options,
        "projection": {
            **result.frame.options(),
            "explained_variance_ratio": result.frame.explained_variance_ratio,
            "file": PROJECTION_NPZ,
            "time_convention": result.options.get("times", "all"),
            "times": result.pcs["time"].values,
        },
        "depth_ordering": {
            "component": result.depth.component,
            "overall_spearman": result.depth.overall,
            "median_spearman": result.depth.median,
            "by_times": {
                name: {"overall_spearman": d.overall, "median_spearman": d.median}
                for name, d in result.depth_by_times.items()
            },
        },
        "kinematics": {
            "step": steps,
            "mean_step_length": _nanmean(kin["step_length"].values, 1),
            "mean_relative_step": _nanmean(kin["relative_step"].values, 1),
            "mean_angular_step_deg": np.degrees(_nanmean(kin["angular_step"].values, 1)),
            "mean_turning_angle_deg": np.degrees(_nanmean(kin["turning_angle"].values, 1)),
            "mean_norm": _nanmean(kin["norm"].values, 1),
            "most_common_fastest_relative_step": _mode(kin["fastest_relative_step"].values),
        },
    }
    if "velocity" in kin:
        # the seed's dPC2/dPC1 blows up where PC1 stalls: the median is the robust summary
        velocity = kin["velocity"].values
        with np.errstate(all="ignore"):
            finite = np.where(np.isfinite(velocity), velocity, np.nan)
            has = np.isfinite(finite).any(axis=1)
            median = np.full(len(steps), np.nan)
            if has.any():
                median[has] = np.nanmedian(finite[has], axis=1)
        metrics["kinematics"]["median_velocity_dpc2_dpc1"] = median
    if result.per_layer_frame is not None:
        ratio = result.per_layer_frame.explained_variance_ratio
        metrics["per_layer_projection"] = {
            "time": result.per_layer_frame.times,
            "explained_variance_ratio_pc1": ratio[:, 0],
            "explained_variance_ratio_pc2": ratio[:, 1] if ratio.shape[1] > 1 else None,
        }
    sep = result.separation
    if sep is not None:
        best = int(np.argmax(np.nan_to_num(sep["silhouette"].values, nan=-np.inf)))
        names = ("silhouette", "silhouette_null_high", "silhouette_p", "silhouette_p_corrected")
        names += ("ratio", "ratio_p", "ratio_p_corrected")
        corrected = sep["silhouette_p_corrected"].values[best]
        metrics["separation"] = {
            **sep.attrs,
            "time": sep["time"].values,
            **{name: sep[name].values for name in sep.data_vars},
            "best": {name: sep[name].values[best] for name in names}
            | {
                "time": sep["time"].values[best],
                "claim": claim_status(float(corrected)),
                "alpha": ALPHA,
            },
        }
    if result.centroids is not None:
        cent = result.centroids
        metrics["centroid_distances"] = {
            "metric": "cosine",
            "categories": list(cent["category"].values),
            "by_time": {str(layer): cent.sel(time=layer).values for layer in result.layers},
        }
    if result.bifurcation is not None:
        bif = result.bifurcation
        split = {}
        for category in bif.attrs["categories"]:
            members = bif["split_layer"].values[category_labels(bif) == category]
            split[category] = (
                _time_value(np.median(members)) if np.isfinite(members).all() else None
            )
        metrics["bifurcation"] = {
            "margin": bif.attrs["margin"],
            "category_split_layer": split,
            "n_left_category": int(np.isfinite(bif["bifurcation_layer"].values).sum()),
        }
    metrics["particles"] = _particle_rows(result)
    if result.simulation is not None:
        metrics["simulation"] = result.simulation
    if result.baseline is not None:
        metrics["baseline"] = _metrics(result.baseline)
    return metrics


def _mode(values: np.ndarray) -> Any:
    """The most common finite value (a layer index as int), or None."""
    finite = [v for v in values.tolist() if v == v]
    return _time_value(Counter(finite).most_common(1)[0][0]) if finite else None


def _time_value(value: Any) -> Any:
    """A time coordinate held as float (for NaN) back to int when it is a layer index."""
    value = float(value)
    if math.isfinite(value) and value.is_integer():
        return int(value)
    return value


def _particle_rows(result: RunAnalysis) -> list[dict[str, Any]]:
    pcs = result.pcs
    integral = np.issubdtype(np.asarray(pcs["time"].values).dtype, np.integer)
    as_time = _time_value if integral else float
    labels = display_labels(pcs)
    rows = []
    for p in range(pcs.sizes["particle"]):
        row: dict[str, Any] = {"particle": pcs["particle"].values[p].item(), "label": labels[p]}
        for name in ("prompt_index", "category", "prompt", "token"):
            if name in pcs.coords:
                row[name] = pcs[name].values[p]
        row["spearman_pc1_time"] = result.depth.per_particle.values[p]
        row["fastest_step"] = as_time(result.kinematics["fastest_step"].values[p])
        row["fastest_relative_step"] = as_time(result.kinematics["fastest_relative_step"].values[p])
        if result.bifurcation is not None:
            bif = result.bifurcation
            row["split_layer"] = as_time(bif["split_layer"].values[p])
            row["bifurcation_layer"] = as_time(bif["bifurcation_layer"].values[p])
            row["joined"] = bif["joined"].values[p]
        rows.append(row)
    return rows

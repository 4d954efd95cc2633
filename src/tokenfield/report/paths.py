"""The paths a run's interactive view draws: its particles in its PCA frames, the
tokens it generated, and other runs overlaid in the same frames.

Data in (the opened runs, the run's frame), :class:`~tokenfield.report.views.PathSet`
out; :func:`interactive` turns them into the view's HTML. Another model's states
are rotated onto the run's with :mod:`tokenfield.analysis.alignment`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from tokenfield._progress import stage
from tokenfield.analysis.alignment import (
    fit_alignment,
    match_times,
    shared_rows,
    unit_rows,
)
from tokenfield.analysis.projection import Projection, fit_projection
from tokenfield.analysis.run_analysis import display_labels, select_particles, select_times
from tokenfield.errors import UserError
from tokenfield.report.interactive import MAX_PARTICLES, evenly
from tokenfield.report.views import PathSet, hover_lines, trajectory_views, views_html

Transform = Callable[[np.ndarray], dict[str, np.ndarray]]


@dataclass(frozen=True)
class Overlay:
    """Another run drawn in a run's view: its path, legend label and opened Dataset."""

    path: Path
    label: str
    ds: xr.Dataset


def time_label(value: Any) -> str:
    """A layer as it is; an ODE time with 4 significant digits (not 9.200000000000001)."""
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def project3(states: np.ndarray, frame: Projection) -> np.ndarray:
    """(time, particle, feature) -> (time, particle, 3) in a global frame (zeros past
    the frame's components)."""
    if frame.sphere:
        states = unit_rows(states)
    comps = frame.components[:3]
    out = np.zeros((*states.shape[:2], 3))
    out[..., : comps.shape[0]] = (states - frame.mean) @ comps.T
    return out


def states_of(ds: xr.Dataset) -> np.ndarray:
    return np.asarray(ds["states"].transpose("time", "particle", "feature").values, np.float64)


def _tokens(ds: xr.Dataset) -> list[str]:
    for name in ("token_piece", "token"):
        if name in ds.coords:
            return [str(t) for t in ds[name].values]
    return [""] * ds.sizes["particle"]


def _lens(ds: xr.Dataset) -> tuple[np.ndarray | None, np.ndarray | None]:
    if "lens_top" not in ds or "lens_prob" not in ds:
        return None, None
    top = np.asarray(ds["lens_top"].transpose("time", "particle", "lens_k").values)
    prob = np.asarray(ds["lens_prob"].transpose("time", "particle", "lens_k").values)
    return top, prob


def _frames(
    selected: xr.Dataset, frame: Projection, *, trace: bool, times_option: str
) -> dict[str, Projection]:
    """The frames offered: the analysis's (first) and, for a trace, the other of
    raw / unit-sphere, fitted here the same way (joint PCA over the analysis's times)."""
    fitted_on = select_times(selected, times_option)
    if frame.per_layer or frame.n_components < 1:
        frame = fit_projection(fitted_on, sphere=frame.sphere)
    frames = {"sphere" if frame.sphere else "raw": frame}
    if trace:
        other = fit_projection(fitted_on, sphere=not frame.sphere)
        frames["raw" if frame.sphere else "sphere"] = other
    return frames


def _drawn(ds: xr.Dataset, times_option: str) -> tuple[xr.Dataset, xr.Dataset]:
    """The run as drawn (first system, the analysis's times) and its last tokens,
    subsampled evenly to at most MAX_PARTICLES."""
    if "system" in ds["states"].dims:
        ds = ds.isel(system=0)
    # the layers the analysis used (by default the seed's 0..L-1), for paths and overlays alike
    ds = select_times(ds, times_option)
    selected = select_particles(ds, "last")
    return ds, selected.isel(particle=evenly(selected.sizes["particle"], MAX_PARTICLES)).load()


def _path_set(
    ds: xr.Dataset,
    selected: xr.Dataset,
    states: np.ndarray,
    transform: Transform,
    time_index: np.ndarray,
    *,
    name: str,
    time_name: str,
    note: str = "",
) -> PathSet:
    """One run's paths (``states`` of the ``selected`` particles) through ``transform``."""
    n = selected.sizes["particle"]
    top, prob = _lens(selected)
    times = [time_label(t) for t in np.asarray(selected["time"].values).tolist()]
    result = PathSet(
        name=name,
        xyz=transform(states),
        categories=[str(c) for c in selected["category"].values]
        if "category" in selected.coords
        else ["particles"] * n,
        labels=display_labels(selected),
        prompts=[str(p) for p in selected["prompt"].values]
        if "prompt" in selected.coords
        else [""] * n,
        text=hover_lines(
            _tokens(selected),
            times,
            np.linalg.norm(states, axis=-1),
            top,
            prob,
            time_name=time_name,
        ),
        note=note,
    )
    if "prompt_index" in selected.coords:
        result.generated = _generated_paths(ds, selected, transform, time_index, time_name)
    return result


def _generated_paths(
    ds: xr.Dataset,
    selected: xr.Dataset,
    transform: Transform,
    time_index: np.ndarray,
    time_name: str,
) -> dict[int, tuple[dict[str, np.ndarray], list[list[str]]]]:
    """Each prompt's generated tokens: per frame key (time, n, 3), and hover lines (time, n)."""
    if "is_generated" not in ds.coords or "prompt_index" not in ds.coords:
        return {}
    flags = np.asarray(ds["is_generated"].values, dtype=bool)
    if not flags.any():
        return {}
    gen = ds.isel(particle=np.flatnonzero(flags)).isel(time=time_index).load()
    owner = np.asarray(gen["prompt_index"].values)
    position = np.asarray(gen["position"].values)
    times = [time_label(t) for t in np.asarray(gen["time"].values).tolist()]
    out = {}
    for p, prompt in enumerate(np.asarray(selected["prompt_index"].values).tolist()):
        mine = np.flatnonzero(owner == prompt)
        if mine.size == 0:
            continue
        mine = mine[np.argsort(position[mine], kind="stable")]
        part = gen.isel(particle=mine)
        states = states_of(part)
        norms = np.linalg.norm(states, axis=-1)
        top, prob = _lens(part)
        rows = hover_lines(
            _tokens(part), times, norms, top, prob, time_name=time_name, prefix="generated "
        )
        rows = [[f"#{j + 1} {rows[j][t]}" for j in range(len(mine))] for t in range(len(times))]
        out[p] = (transform(states), rows)
    return out


def interactive(
    ds: xr.Dataset,
    frame: Projection,
    index: int,
    *,
    name: str,
    trace: bool,
    times_option: str,
    overlays: Sequence[Overlay] = (),
) -> str:
    """The interactive trajectories of one run: 2-D / 3-D, both frames, hover with the
    token, its norm and the logit lens, the generated continuations and the overlays."""
    ds, selected = _drawn(ds, times_option)
    frames = _frames(selected, frame, trace=trace, times_option=times_option)
    time_name = "layer" if trace else "time"
    times = np.asarray(selected["time"].values)
    states = states_of(selected)
    main = _path_set(
        ds,
        selected,
        states,
        lambda x: {key: project3(x, f) for key, f in frames.items()},
        np.arange(len(times)),
        name="",
        time_name=time_name,
    )
    stage(f"{name}: trajectory views")
    others = []
    for overlay in overlays:
        stage(f"overlay {overlay.label or overlay.path}: projecting into {name}'s frame")
        others.append(
            _overlay_set(
                selected,
                states,
                frames,
                overlay,
                time_name=time_name,
                base_name=name,
                times_option=times_option,
            )
        )
    payload = trajectory_views(
        main,
        others,
        times=[time_label(t) for t in times.tolist()],
        explained={key: list(f.explained_variance_ratio[:3]) for key, f in frames.items()},
        time_name=time_name,
        title=f"{name}: trajectories",
    )
    return views_html(payload, f"trajectories-{index}")


def model_name(ds: xr.Dataset) -> str:
    """The name of the model a run traced ("" for a simulation)."""
    model = ((ds.attrs.get("run") or {}).get("config") or {}).get("model")
    if isinstance(model, dict):
        return str(model.get("name", ""))
    return str(model or "")


def _overlay_set(
    base: xr.Dataset,
    base_states: np.ndarray,
    frames: dict[str, Projection],
    overlay: Overlay,
    *,
    time_name: str,
    base_name: str = "",
    times_option: str = "seed",
) -> PathSet:
    """Another run drawn in this run's frames (over the same time convention).

    The same model (its baseline or a steered copy) is projected as it is. Another
    model (another name or width) is first rotated onto this run's states, layer
    by layer, by an orthogonal Procrustes fit over the prompts both runs share
    (:func:`tokenfield.analysis.alignment.fit_alignment`). Runs of different depth
    are matched by relative depth.
    """
    ds, selected = _drawn(overlay.ds, times_option)
    n_base, n_other = base_states.shape[0], selected.sizes["time"]
    # the other run's time for each of this run's times (relative depth when they differ)
    index = match_times(n_base, n_other)
    selected = selected.isel(time=index)
    states = states_of(selected)
    align = states.shape[-1] != base_states.shape[-1] or model_name(ds) != model_name(base)
    notes = []
    if align:
        if "prompt" not in selected.coords or "prompt" not in base.coords:
            raise UserError(
                f"overlay '{overlay.path}' is another model and has no prompts to align it by",
                "overlay a trace of the same prompts",
            )
        pairs = shared_rows(selected["prompt"].values, base["prompt"].values)
        if len(pairs) < 2:
            raise UserError(
                f"overlay '{overlay.path}' shares {len(pairs)} prompt(s) with '{base_name}'; "
                "aligning another model needs the same prompts",
                "trace both models with the same --prompts",
            )
        mine, theirs = (np.array(v) for v in zip(*pairs, strict=True))
        alignments = {
            key: fit_alignment(states[:, mine], base_states[:, theirs], sphere=frame.sphere)
            for key, frame in frames.items()
        }
        notes.append(
            f"another model: rotated onto {base_name} layer by layer (orthogonal Procrustes "
            f"over {len(pairs)} shared prompts)"
        )
    if n_other != n_base:
        notes.append(f"{n_other} {time_name}s matched to {n_base} by relative depth")

    def transform(x: np.ndarray) -> dict[str, np.ndarray]:
        return {
            key: project3(alignments[key].apply(x) if align else x, frame)
            for key, frame in frames.items()
        }

    return _path_set(
        ds,
        selected,
        states,
        transform,
        index,
        name=overlay.label,
        time_name=time_name,
        note="; ".join(notes),
    )

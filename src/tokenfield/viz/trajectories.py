"""Trajectories in the PCA plane: the seed's picture, its components against
depth, per-layer snapshots, and the animated "thought evolution"."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from tokenfield._io import atomic_path
from tokenfield.analysis.run_analysis import display_labels
from tokenfield.viz._common import (
    figure_for,
    figure_for_axes,
    finite_limits,
    new_figure,
    particle_colors,
)

# beyond this many particles, end labels and per-particle legends are noise
MAX_LABELLED = 40


def _plane(pcs: xr.DataArray) -> np.ndarray:
    if pcs.sizes.get("component", 0) < 2:
        extra = xr.zeros_like(pcs.isel(component=[0])).assign_coords(component=[2])
        pcs = xr.concat([pcs, extra], dim="component")
    return np.asarray(pcs.sel(component=[1, 2]).transpose("time", "particle", "component"))


def _axis_titles(ax: Any, explained: Sequence[float] | None) -> None:
    for axis, i in ((ax.set_xlabel, 0), (ax.set_ylabel, 1)):
        share = f" ({explained[i]:.1%})" if explained is not None and len(explained) > i else ""
        axis(f"PC{i + 1}{share}")


def plot_trajectories(
    pcs: xr.DataArray,
    ax: Any = None,
    *,
    explained: Sequence[float] | None = None,
    upto: int | None = None,
    labels: bool | None = None,
    title: str | None = "Trajectories in the PCA plane",
) -> Any:
    """The seed's plot: each particle's path in (PC1, PC2), coloured by category,
    a circle at the start, a square at the end and the prompt's label beside it.

    Args:
        pcs: (time, particle, component) from :func:`tokenfield.analysis.project`.
        ax: axes to draw on (a new figure when None).
        explained: explained variance ratios, for the axis titles.
        upto: draw the paths up to this time index only (for animations).
        labels: write the labels at the ends (default: when few particles).
        title: the axes title.

    Returns:
        The figure.

    Example:
        >>> from tokenfield.viz import plot_trajectories
        >>> result = tf.analyze(tf.open_run("runs/categories"))             # doctest: +SKIP
        >>> fig = plot_trajectories(result.pcs, explained=result.frame.explained_variance_ratio)  # doctest: +SKIP
    """
    fig, ax = figure_for(ax, (8.0, 6.0))
    plane = _plane(pcs)
    stop = plane.shape[0] if upto is None else upto + 1
    colours, legend = particle_colors(pcs)
    names = display_labels(pcs)
    n = plane.shape[1]
    labels = n <= MAX_LABELLED if labels is None else labels
    width = 1.2 if n <= 200 else 0.5
    for p in range(n):
        path = plane[:stop, p]
        ax.plot(path[:, 0], path[:, 1], color=colours[p], lw=width, alpha=0.8)
        ax.plot(*path[0], "o", color=colours[p], ms=4, mfc="white")
        ax.plot(*path[-1], "s", color=colours[p], ms=5)
        if labels:
            ax.annotate(
                names[p],
                path[-1],
                xytext=(3, 3),
                textcoords="offset points",
                fontsize=7,
                color=colours[p],
            )
    ax.set_xlim(*finite_limits(plane[..., 0]))
    ax.set_ylim(*finite_limits(plane[..., 1]))
    if legend:
        from matplotlib.lines import Line2D

        handles = [Line2D([], [], color=c, lw=2, label=name) for name, c in legend.items()]
        handles += [
            Line2D([], [], marker="o", ls="", color="gray", mfc="white", label="start"),
            Line2D([], [], marker="s", ls="", color="gray", label="end"),
        ]
        # outside the axes: never over a path, and no costly "best" placement search
        ax.legend(
            handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False
        )
    _axis_titles(ax, explained)
    if title:
        ax.set_title(title)
    return fig


def plot_pcs_vs_time(
    pcs: xr.DataArray,
    axes: Sequence[Any] | None = None,
    *,
    time_name: str = "layer",
    components: Sequence[int] = (1, 2),
) -> Any:
    """PC1 and PC2 (one panel each) against the time coordinate, per particle.

    Args:
        pcs: (time, particle, component) from :func:`tokenfield.project`.
        axes: one axes per component (a new figure when None).
        time_name: ``"layer"`` for a trace, ``"time"`` for a simulation.
        components: the components to draw (1-based).

    Returns:
        The figure.

    Example:
        >>> from tokenfield.viz import plot_pcs_vs_time
        >>> fig = plot_pcs_vs_time(tf.analyze(tf.open_run("runs/spectrum")).pcs)  # doctest: +SKIP
    """
    fig, axes = figure_for_axes(axes, (6.0 * len(components), 4.0), ncols=len(components))
    colours, legend = particle_colors(pcs)
    times = np.asarray(pcs["time"].values, dtype=np.float64)
    for ax, component in zip(axes, components, strict=False):
        if component not in pcs["component"].values:
            ax.set_visible(False)
            continue
        values = np.asarray(pcs.sel(component=component).transpose("time", "particle"))
        for p in range(values.shape[1]):
            ax.plot(times, values[:, p], color=colours[p], lw=1, alpha=0.8)
        ax.set_xlabel(time_name)
        ax.set_ylabel(f"PC{component}")
        ax.set_title(f"PC{component} against {time_name}")
    if legend:
        from matplotlib.lines import Line2D

        handles = [Line2D([], [], color=c, lw=2, label=name) for name, c in legend.items()]
        axes[-1].legend(handles=handles, fontsize=8, frameon=False)
    return fig


def plot_per_layer_snapshots(
    pcs: xr.DataArray,
    layers: Sequence[Any],
    *,
    explained: np.ndarray | None = None,
    time_name: str = "layer",
) -> Any:
    """The particles at a few time steps, each in its own per-layer PCA plane.

    Args:
        pcs: (time, particle, component) in a per-layer frame.
        layers: the time steps to show.
        explained: ``(time, component)`` explained variance ratios, for the titles.
        time_name: ``"layer"`` for a trace, ``"time"`` for a simulation.

    Returns:
        The figure.

    Example:
        >>> from tokenfield.viz import plot_per_layer_snapshots
        >>> result = tf.analyze(tf.open_run("runs/spectrum"), per_layer=True)   # doctest: +SKIP
        >>> fig = plot_per_layer_snapshots(result.per_layer_pcs, [0, 12, 24])   # doctest: +SKIP
    """
    fig, axes = new_figure((3.6 * len(layers), 3.4), ncols=len(layers))
    axes = np.atleast_1d(axes)
    colours, legend = particle_colors(pcs)
    times = list(np.asarray(pcs["time"].values).tolist())
    for ax, layer in zip(axes, layers, strict=False):
        index = times.index(layer)
        plane = _plane(pcs.isel(time=[index]))[0]
        ax.scatter(plane[:, 0], plane[:, 1], c=colours, s=18)
        ax.set_title(f"{time_name} {layer}", fontsize=10)
        share = explained[index] if explained is not None else None
        _axis_titles(ax, share)
    if legend:
        from matplotlib.lines import Line2D

        handles = [
            Line2D([], [], marker="o", ls="", color=c, label=name) for name, c in legend.items()
        ]
        axes[-1].legend(handles=handles, fontsize=7, frameon=False)
    return fig


def animate_trajectories(
    pcs: xr.DataArray,
    path: str | Path,
    *,
    explained: Sequence[float] | None = None,
    fps: int = 4,
    max_frames: int = 60,
    time_name: str = "layer",
) -> Path:
    """An animated GIF of the paths growing one time step per frame (the seed's
    "thought evolution"), written with matplotlib's PillowWriter.

    Args:
        pcs: (time, particle, component).
        path: the ``.gif`` to write.
        explained: explained variance ratios, for the axis titles.
        fps: frames per second.
        max_frames: long runs are subsampled to at most this many frames.
        time_name: ``"layer"`` for a trace, ``"time"`` for a simulation.

    Returns:
        ``path``.

    Example:
        >>> from tokenfield.viz import animate_trajectories
        >>> analysis = tf.analyze(tf.open_run("runs/categories"))         # doctest: +SKIP
        >>> animate_trajectories(analysis.pcs, "runs/categories/thought.gif")  # doctest: +SKIP
        PosixPath('runs/categories/thought.gif')
    """
    from matplotlib.animation import PillowWriter

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    n_time = pcs.sizes["time"]
    frames = np.unique(np.round(np.linspace(0, n_time - 1, min(n_time, max_frames))).astype(int))
    fig, ax = new_figure((7.0, 5.25))
    times = np.asarray(pcs["time"].values).tolist()
    plane = _plane(pcs)
    # draw the full picture once, then only move the artists: redrawing from
    # scratch every frame costs ~10x more
    plot_trajectories(pcs, ax, explained=explained, title=f"{time_name} {times[-1]}")
    fig.canvas.draw()
    fig.set_layout_engine("none")
    n = plane.shape[1]
    lines = ax.lines[: 3 * n]  # per particle: path, start marker, end marker
    texts = list(ax.texts)

    def draw(frame: int) -> None:
        frame = int(frame)
        for p in range(n):
            path_line, _, end_marker = lines[3 * p : 3 * p + 3]
            path_line.set_data(plane[: frame + 1, p, 0], plane[: frame + 1, p, 1])
            end_marker.set_data([plane[frame, p, 0]], [plane[frame, p, 1]])
            if p < len(texts):
                texts[p].xy = (plane[frame, p, 0], plane[frame, p, 1])
        ax.set_title(f"{time_name} {times[frame]}")

    writer = PillowWriter(fps=fps)
    # drive the writer directly: FuncAnimation would draw every frame twice
    with atomic_path(path, ".gif") as tmp, writer.saving(fig, str(tmp), dpi=80):
        for frame in frames:
            draw(frame)
            writer.grab_frame()
    return path

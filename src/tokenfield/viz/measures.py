"""Measurements against depth: speed, separation with its null band, and the
category-centroid distance heatmaps."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import xarray as xr

from tokenfield.viz._common import figure_for, figure_for_axes, new_figure, particle_colors

SPEED_PANELS = {
    "relative_step": ("relative step  ||dh|| / ||h||", 1.0),
    "angular_step": ("angular step (degrees)", 180 / np.pi),
    "turning_angle": ("turning angle (degrees)", 180 / np.pi),
}


def _category_means(values: np.ndarray, categories: np.ndarray | None) -> dict[str, np.ndarray]:
    if categories is None:
        return {}
    out = {}
    for name in sorted(set(categories.tolist())):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN steps stay NaN
            out[name] = np.nanmean(values[:, categories == name], axis=1)
    return out


def plot_speed(
    kin: xr.Dataset,
    axes: Sequence[Any] | None = None,
    *,
    quantities: Sequence[str] = ("relative_step", "angular_step", "turning_angle"),
    time_name: str = "layer",
) -> Any:
    """Speed against depth: thin lines per particle, thick lines per category mean.

    Args:
        kin: from :func:`tokenfield.analysis.kinematics`.
        axes: one axes per quantity (a new figure when None).
        quantities: which of the kinematic quantities to draw.
        time_name: ``"layer"`` for a trace, ``"time"`` for a simulation.

    Returns:
        The figure.

    Example:
        >>> from tokenfield.viz import plot_speed
        >>> fig = plot_speed(tf.kinematics(tf.open_run("runs/spectrum")))  # doctest: +SKIP
    """
    fig, axes = figure_for_axes(axes, (4.8 * len(quantities), 3.8), ncols=len(quantities))
    colours, legend = particle_colors(kin)
    categories = (
        np.array([str(c) for c in kin["category"].values]) if "category" in kin.coords else None
    )
    steps = np.asarray(kin["step"].values, dtype=np.float64)
    for ax, name in zip(axes, quantities, strict=False):
        label, scale = SPEED_PANELS.get(name, (name, 1.0))
        values = np.asarray(kin[name].transpose("step", "particle")) * scale
        thin = 0.6 if legend else 1.0
        for p in range(values.shape[1]):
            ax.plot(steps, values[:, p], color=colours[p], lw=thin, alpha=0.35 if legend else 0.8)
        for category, mean in _category_means(values, categories).items():
            ax.plot(steps, mean, color=legend[category], lw=2.2, label=category)
        ax.set_xlabel(time_name)
        ax.set_ylabel(label)
        ax.set_title(label.split("  ")[0].split(" (")[0])
    if legend:
        axes[0].legend(fontsize=7, frameon=False)
    return fig


def plot_separation(
    sep: xr.Dataset,
    axes: Sequence[Any] | None = None,
    *,
    baseline: xr.Dataset | None = None,
    time_name: str = "layer",
) -> Any:
    """Silhouette and between/within distance ratio against depth, each with the
    shuffled-label null band (its quantiles) and, if given, a baseline run's.

    Args:
        sep: from :func:`tokenfield.separation`.
        axes: two axes (a new figure when None).
        baseline: the baseline run's separation, drawn beside it.
        time_name: ``"layer"`` for a trace, ``"time"`` for a simulation.

    Returns:
        The figure.

    Example:
        >>> from tokenfield.viz import plot_separation
        >>> sep = tf.separation(tf.open_run("runs/categories"))            # doctest: +SKIP
        >>> base = tf.separation(tf.open_run("runs/categories-random"))    # doctest: +SKIP
        >>> fig = plot_separation(sep, baseline=base)                      # doctest: +SKIP"""
    fig, axes = figure_for_axes(axes, (10.0, 3.8), ncols=2)
    quantiles = sep.attrs.get("null_quantiles", [0.025, 0.975])
    band = f"shuffled-label null, {quantiles[0]:.1%}-{quantiles[1]:.1%}"
    for ax, score, title, ylabel in (
        (axes[0], "silhouette", "silhouette (cosine)", "silhouette score (cosine)"),
        (axes[1], "ratio", "between / within distance", "mean distance between / within"),
    ):
        runs = [("run", sep, "C0", "-")]
        if baseline is not None:
            runs.append(("baseline", baseline, "C7", "--"))
        for name, data, colour, style in runs:
            times = np.asarray(data["time"].values, dtype=np.float64)
            ax.fill_between(
                times,
                data[f"{score}_null_low"].values,
                data[f"{score}_null_high"].values,
                color=colour,
                alpha=0.15,
                lw=0,
                label=f"{name} {band}",
            )
            ax.plot(times, data[f"{score}_null_mean"].values, color=colour, lw=0.8, ls=":",
                    label=f"{name} null mean")  # fmt: skip
            ax.plot(times, data[score].values, color=colour, lw=2, ls=style, label=name)
        if score == "ratio":
            ax.axhline(1.0, color="gray", lw=0.6)
        ax.set_xlabel(time_name)
        ax.set_ylabel(ylabel)
        ax.set_title(title)
    # One legend for both panels, below them: it names the null bands and never
    # covers the curves.
    handles, labels = axes[0].get_legend_handles_labels()
    from matplotlib.layout_engine import ConstrainedLayoutEngine

    if isinstance(fig.get_layout_engine(), ConstrainedLayoutEngine):
        fig.legend(handles, labels, loc="outside lower center", ncol=3, fontsize=8, frameon=False)
    else:  # axes given by the caller: keep the legend in the first panel
        axes[0].legend(handles, labels, fontsize=7, frameon=False)
    return fig


def plot_centroid_heatmap(
    centroids: xr.DataArray,
    layer: Any,
    ax: Any = None,
    *,
    vmax: float | None = None,
    time_name: str = "layer",
    annotate: bool = True,
    colorbar: bool = True,
) -> Any:
    """Cosine distances between category centroids at one time step, as a heatmap.

    Args:
        centroids: (time, category, other) from :func:`tokenfield.centroid_distances`.
        layer: the time step to show.
        ax: axes to draw on (a new figure when None).
        vmax: the top of the colour scale (default: the largest distance shown).
        time_name: ``"layer"`` for a trace, ``"time"`` for a simulation.
        annotate: write each distance in its cell.
        colorbar: draw the colour bar.

    Returns:
        The figure.

    Example:
        >>> from tokenfield.viz import plot_centroid_heatmap
        >>> dist = tf.centroid_distances(tf.open_run("runs/categories"))  # doctest: +SKIP
        >>> fig = plot_centroid_heatmap(dist, layer=12)                   # doctest: +SKIP
    """
    fig, ax = figure_for(ax, (4.5, 4.0))
    matrix = np.asarray(centroids.sel(time=layer).values)
    names = [str(c) for c in centroids["category"].values]
    image = ax.imshow(matrix, cmap="viridis", vmin=0.0, vmax=vmax)
    ax.set_xticks(range(len(names)), names, rotation=45, ha="right", fontsize=7)
    ax.set_yticks(range(len(names)), names, fontsize=7)
    ax.set_title(f"{time_name} {layer}", fontsize=10)
    if annotate and len(names) <= 12:
        size = 9 if len(names) <= 6 else 7
        for i in range(len(names)):
            for j in range(len(names)):
                if not np.isfinite(matrix[i, j]):
                    continue
                # black on light cells, white on dark ones (the cell's own luminance)
                r, g, b, _ = image.cmap(image.norm(matrix[i, j]))
                light = 0.299 * r + 0.587 * g + 0.114 * b > 0.5
                ax.text(
                    j,
                    i,
                    f"{matrix[i, j]:.2f}",
                    ha="center",
                    va="center",
                    fontsize=size,
                    fontweight="bold",
                    color="black" if light else "white",
                )
    if colorbar:
        fig.colorbar(image, ax=ax, shrink=0.8, label="cosine distance")
    return fig


def plot_centroid_heatmaps(
    centroids: xr.DataArray, layers: Sequence[Any], *, time_name: str = "layer"
) -> Any:
    """One centroid-distance heatmap per chosen time step, on a shared colour scale.

    Args:
        centroids: (time, category, other) from :func:`tokenfield.centroid_distances`.
        layers: the time steps to show.
        time_name: ``"layer"`` for a trace, ``"time"`` for a simulation.

    Returns:
        The figure.

    Example:
        Two halves of a simulated cloud, at its first, middle and last time:

        >>> from tokenfield.viz import plot_centroid_heatmaps
        >>> sim = tf.simulate(tf.Dynamics(beta=4.0), tf.initial_condition("uniform", n=8, d=3),
        ...                   t_max=1.0, dt=0.1)
        >>> dist = tf.centroid_distances(sim, ["a"] * 4 + ["b"] * 4)
        >>> fig = plot_centroid_heatmaps(dist, dist.time.values[::5], time_name="time")
        >>> len(fig.axes)  # three heatmaps and their colour bar
        4
    """
    layers = list(layers)
    fig, axes = new_figure((4.2 * len(layers), 4.0), ncols=len(layers))
    axes = np.atleast_1d(axes)
    chosen = centroids.sel(time=layers)
    vmax = float(np.nanmax(chosen.values)) or 1.0
    for ax, layer in zip(axes, layers, strict=False):
        plot_centroid_heatmap(centroids, layer, ax, vmax=vmax, time_name=time_name, colorbar=False)
    fig.colorbar(axes[0].images[0], ax=list(axes), shrink=0.8, label="cosine distance")
    return fig

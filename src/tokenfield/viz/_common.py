"""Shared plotting helpers: headless figures, category colours, saving.

Figures are built with :class:`matplotlib.figure.Figure` on an Agg canvas, never
through ``pyplot``: no global state, no GUI backend, safe in a server.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

FORMATS = ("png", "svg")
DPI = 100


def new_figure(figsize: tuple[float, float], ncols: int = 1, nrows: int = 1, **kwargs: Any):
    """A figure on an Agg canvas and its axes (an array when more than one)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize, dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, squeeze=True, **kwargs)
    return fig, axes


def figure_for(ax: Any, figsize: tuple[float, float]):
    """``(fig, ax)``: the given axes' figure, or a new one."""
    if ax is not None:
        return ax.figure, ax
    return new_figure(figsize)


def figure_for_axes(axes: Any, figsize: tuple[float, float], ncols: int = 1, nrows: int = 1):
    """``(fig, axes)``: the given axes (a sequence, one per panel) and their figure,
    or a new figure's ``nrows x ncols`` axes as a flat array."""
    if axes is not None:
        return axes[0].figure, axes
    fig, axes = new_figure(figsize, ncols=ncols, nrows=nrows)
    return fig, np.atleast_1d(axes).ravel()


def category_colors(categories: Sequence[str]) -> dict[str, Any]:
    """One colour per category (tab10, then tab20), stable for a sorted set.

    Args:
        categories: category names (repeats allowed).

    Returns:
        Category -> RGBA colour, the categories sorted.

    Example:
        >>> from tokenfield.viz import category_colors
        >>> sorted(category_colors(["Math", "Code", "Math"]))
        ['Code', 'Math']
    """
    from matplotlib import colormaps

    names = sorted(set(categories))
    cmap = colormaps["tab10" if len(names) <= 10 else "tab20"]
    return {name: cmap(i % cmap.N) for i, name in enumerate(names)}


def line_colors(n: int, cmap: str = "plasma", start: float = 0.0, stop: float = 0.7) -> list[Any]:
    """``n`` colours along a colormap, cut before its light end: lines drawn on
    white stay visible (viridis, plasma and autumn all end in yellow)."""
    from matplotlib import colormaps

    colormap = colormaps[cmap]
    return [colormap(start + (stop - start) * i / max(n - 1, 1)) for i in range(n)]


def particle_colors(pcs: Any) -> tuple[list[Any], dict[str, Any]]:
    """A colour per particle: by category when there is one, else along a colormap.

    Returns the colours and the legend mapping (empty without categories).
    """
    n = pcs.sizes["particle"]
    if "category" in pcs.coords:
        names = [str(c) for c in pcs["category"].values]
        legend = category_colors(names)
        return [legend[c] for c in names], legend
    return line_colors(n), {}


def time_label(kind: str) -> str:
    return "layer" if kind == "trace" else "time"


def save_figure(fig: Any, out_dir: str | Path, name: str, formats: Sequence[str] = FORMATS):
    """Save ``fig`` as ``out_dir/name.<fmt>`` for each format; returns the paths.

    Args:
        fig: a matplotlib figure.
        out_dir: the directory (created if missing).
        name: the file name without its extension.
        formats: the extensions to write.

    Returns:
        paths (list[Path]): the paths written.

    Example:
        >>> from tokenfield.viz import plot_trajectories, save_figure
        >>> fig = plot_trajectories(tf.analyze(tf.open_run("runs/categories")).pcs)  # doctest: +SKIP
        >>> save_figure(fig, "runs/categories/figures", "trajectories")            # doctest: +SKIP
    """
    from tokenfield._io import atomic_path
    from tokenfield.errors import UserError

    out_dir = Path(out_dir)
    if out_dir.is_symlink():  # never write through a link into another directory
        raise UserError(
            f"'{out_dir}' is a symbolic link; tokenfield does not write figures through it",
            f"remove the link '{out_dir}' (its target is left alone), then run again",
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for fmt in formats:
        path = out_dir / f"{name}.{fmt}"
        # through a new temporary file and a rename: a symlink at the figure's name
        # is replaced, never written through, and a crash leaves no half figure
        with atomic_path(path, f".{fmt}") as tmp:
            fig.savefig(tmp, format=fmt, dpi=DPI)
        paths.append(path)
    return paths


def finite_limits(values: np.ndarray, pad: float = 0.05) -> tuple[float, float]:
    """Axis limits covering the finite values with a margin."""
    finite = values[np.isfinite(values)]
    if finite.size == 0:
        return (-1.0, 1.0)
    low, high = float(finite.min()), float(finite.max())
    span = high - low or max(abs(high), 1.0)
    return low - pad * span, high + pad * span

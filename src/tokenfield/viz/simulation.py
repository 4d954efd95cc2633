"""Figures of a simulated run: cluster count and energy against time, the
particles on the circle / sphere / first two principal components, and an
animated GIF.

Computation lives in :mod:`tokenfield.analysis.simulation`; these functions
only draw what it returns (and the run's states). matplotlib is imported
inside the functions, on the Agg canvas, so importing this module is cheap.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from tokenfield.analysis.simulation import particle_frames
from tokenfield.viz._common import FORMATS, figure_for, new_figure, save_figure


def plot_cluster_count(analysis: dict[str, Any], ax: Any = None):
    """Cluster count against time, metastable plateaus shaded."""
    fig, ax = figure_for(ax, (6, 3))
    ax.step(analysis["time"], analysis["cluster_count"], where="post", color="C0")
    for plateau in analysis.get("metastable", []):
        ax.axvspan(plateau["start"], plateau["end"], color="C0", alpha=0.08, lw=0)
    ax.set_xlabel("time")
    ax.set_ylabel(f"clusters (eps={analysis['eps']:g})")
    ax.set_ylim(bottom=0)
    return fig


def plot_energy(analysis: dict[str, Any], ax: Any = None):
    """The energy against time."""
    fig, ax = figure_for(ax, (6, 3))
    energies = np.array([np.nan if e is None else e for e in analysis["energy"]], dtype=float)
    ax.plot(analysis["time"], energies, color="C3")
    ax.set_xlabel("time")
    ax.set_ylabel(f"energy ({analysis['energy_normalization']}, beta={analysis['beta']:g})")
    return fig


def plot_cluster_energy(analysis: dict[str, Any]):
    """Cluster count (top) and energy (bottom) against time, one figure."""
    fig, axes = new_figure((6.5, 5), nrows=2, sharex=True)
    plot_cluster_count(analysis, axes[0])
    plot_energy(analysis, axes[1])
    axes[0].set_xlabel("")
    return fig


def _draw(ax: Any, x: np.ndarray, labels: np.ndarray, basis: np.ndarray | None) -> None:
    color = [f"C{c}" for c in labels % 10]
    dim = x.shape[-1]
    if dim == 2:
        theta = np.linspace(0, 2 * np.pi, 200)
        ax.plot(np.cos(theta), np.sin(theta), color="0.8", lw=0.8)
        ax.scatter(x[:, 0], x[:, 1], s=12, c=color)
        ax.set_aspect("equal")
        ax.set_xlim(-1.1, 1.1)
        ax.set_ylim(-1.1, 1.1)
    elif dim == 3:
        u, v = np.meshgrid(np.linspace(0, 2 * np.pi, 25), np.linspace(0, np.pi, 13))
        sphere = (np.cos(u) * np.sin(v), np.sin(u) * np.sin(v), np.cos(v))
        ax.plot_wireframe(*sphere, color="0.85", linewidth=0.4)
        ax.scatter(x[:, 0], x[:, 1], x[:, 2], s=10, c=color, depthshade=False)
        for setter in (ax.set_xlim, ax.set_ylim, ax.set_zlim):
            setter(-1, 1)
    else:
        pcs = x @ basis.T
        ax.scatter(pcs[:, 0], pcs[:, 1], s=12, c=color)
        ax.set_xlabel("PC1")
        ax.set_ylabel("PC2")


def plot_particles(
    ds: xr.Dataset | xr.DataArray,
    time_index: int = -1,
    *,
    ax: Any = None,
    eps: float | None = None,
    system: int = 0,
):
    """The particles at one saved time, coloured by cluster: on the circle
    (``d = 2``), on the sphere (``d = 3``, 3D scatter) or in the first two
    principal components of the run otherwise. The positions, labels and basis
    come from :func:`tokenfield.analysis.simulation.particle_frames`."""
    frames = particle_frames(ds, [time_index], eps=eps, system=system)
    dim = frames.dim
    if ax is None:
        fig, ax = new_figure((5, 5), subplot_kw={"projection": "3d"} if dim == 3 else None)
    fig = ax.figure
    _draw(ax, frames.points[0], frames.labels[0], frames.basis)
    t = float(frames.time[0])
    ax.set_title(f"t = {t:.3g}")
    return fig


def animate_particles(
    ds: xr.Dataset | xr.DataArray,
    path: str | Path,
    *,
    fps: int = 10,
    max_frames: int = 60,
    eps: float | None = None,
    system: int = 0,
) -> Path:
    """Write an animated GIF of the particles (at most ``max_frames`` frames)."""
    from matplotlib.animation import FuncAnimation, PillowWriter

    size = (ds["states"] if isinstance(ds, xr.Dataset) else ds).sizes["time"]
    picks = np.unique(np.linspace(0, size - 1, max_frames).astype(int))
    drawn = particle_frames(ds, picks, eps=eps, system=system)
    dim, basis, times = drawn.dim, drawn.basis, drawn.time
    fig, ax = new_figure((4, 4), subplot_kw={"projection": "3d"} if dim == 3 else None)
    fig.set_layout_engine("none")
    frames = list(drawn.points)
    limits = None
    if basis is not None:
        pcs = np.concatenate([f @ basis.T for f in frames])
        limits = (pcs.min(axis=0) - 0.05, pcs.max(axis=0) + 0.05)

    def update(k: int):
        ax.clear()
        _draw(ax, frames[k], drawn.labels[k], basis)
        if limits is not None:
            ax.set_xlim(limits[0][0], limits[1][0])
            ax.set_ylim(limits[0][1], limits[1][1])
        ax.set_title(f"t = {float(times[k]):.3g}")
        return []

    from tokenfield._io import atomic_path

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    animation = FuncAnimation(fig, update, frames=len(frames), blit=False)
    with atomic_path(path, ".gif") as tmp:
        animation.save(tmp, writer=PillowWriter(fps=fps), dpi=80)
    return path


def write_simulation_figures(
    analysis: dict[str, Any],
    ds: xr.Dataset,
    out_dir: str | Path,
    *,
    formats: tuple[str, ...] = FORMATS,
    gif: bool = True,
) -> list[Path]:
    """Write the simulation figures into ``out_dir``; returns the paths.

    ``simulation_clusters_energy.*``, ``simulation_particles.*`` (the last
    saved time) and ``simulation_particles.gif``.
    """
    out_dir = Path(out_dir)
    eps = analysis.get("eps")
    paths = list(
        save_figure(plot_cluster_energy(analysis), out_dir, "simulation_clusters_energy", formats)
    )
    paths += save_figure(plot_particles(ds, -1, eps=eps), out_dir, "simulation_particles", formats)
    if gif:
        paths.append(animate_particles(ds, out_dir / "simulation_particles.gif", eps=eps))
    return paths

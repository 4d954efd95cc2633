"""All the standard figures of one analysed run, written to a directory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tokenfield._progress import stage
from tokenfield.viz._common import save_figure, time_label
from tokenfield.viz.measures import plot_centroid_heatmaps, plot_separation, plot_speed
from tokenfield.viz.trajectories import (
    animate_trajectories,
    plot_pcs_vs_time,
    plot_per_layer_snapshots,
    plot_trajectories,
)

GIF_NAME = "thought_evolution.gif"


def write_figures(result: Any, out_dir: str | Path, *, animation: bool = True) -> list[Path]:
    """Draw a :class:`~tokenfield.analysis.RunAnalysis` into ``out_dir``.

    Writes PNG and SVG of: ``trajectories`` (the seed's PCA plot), ``pcs_vs_layer``,
    ``speed``, and when the run has categories ``separation`` and
    ``centroid_distances``; ``trajectories_per_layer`` for a per-layer PCA;
    ``trajectories_baseline`` for a baseline; and the animated
    ``thought_evolution.gif``.

    Args:
        result: a :class:`~tokenfield.analysis.RunAnalysis` from :func:`tokenfield.analyze`.
        out_dir: the directory to write into.
        animation: also write ``thought_evolution.gif``.

    Returns:
        The paths written.

    Example:
        >>> from tokenfield.viz import write_figures
        >>> result = tf.analyze(tf.open_run("runs/categories"))         # doctest: +SKIP
        >>> write_figures(result, "runs/categories/figures", animation=False)  # doctest: +SKIP
    """
    out_dir = Path(out_dir)
    when = time_label(result.info.get("kind", "trace"))
    explained = result.frame.explained_variance_ratio
    written: list[Path] = []

    def keep(fig: Any, name: str) -> None:
        written.extend(save_figure(fig, out_dir, name))

    space = "unit-sphere " if result.frame.sphere else ""
    keep(
        plot_trajectories(
            result.pcs, explained=explained, title=f"Trajectories in the {space}PCA plane"
        ),
        "trajectories",
    )
    keep(plot_pcs_vs_time(result.pcs, time_name=when), "pcs_vs_layer")
    keep(plot_speed(result.kinematics, time_name=when), "speed")
    if result.separation is not None:
        base = result.baseline.separation if result.baseline is not None else None
        keep(plot_separation(result.separation, baseline=base, time_name=when), "separation")
    if result.centroids is not None and result.layers:
        keep(
            plot_centroid_heatmaps(result.centroids, result.layers, time_name=when),
            "centroid_distances",
        )
    if result.per_layer_pcs is not None and result.layers:
        keep(
            plot_per_layer_snapshots(
                result.per_layer_pcs,
                result.layers,
                explained=result.per_layer_frame.explained_variance_ratio,
                time_name=when,
            ),
            "trajectories_per_layer",
        )
    if result.baseline is not None:
        keep(
            plot_trajectories(
                result.baseline.pcs,
                explained=result.baseline.frame.explained_variance_ratio,
                title="Baseline: trajectories in its own PCA plane",
            ),
            "trajectories_baseline",
        )
    if animation:
        stage("figures: thought_evolution.gif")
        written.append(
            animate_trajectories(
                result.pcs, out_dir / GIF_NAME, explained=explained, time_name=when
            )
        )
    return written

"""Figures: matplotlib, drawn from the data that :mod:`tokenfield.analysis` returns.

Nothing outside ``viz`` and ``report`` imports this package. matplotlib itself
is imported inside the plotting functions, on a headless Agg canvas.
"""

from __future__ import annotations

from tokenfield.viz._common import category_colors, save_figure
from tokenfield.viz.measures import (
    plot_centroid_heatmap,
    plot_centroid_heatmaps,
    plot_separation,
    plot_speed,
)
from tokenfield.viz.run_figures import GIF_NAME, write_figures
from tokenfield.viz.trajectories import (
    animate_trajectories,
    plot_pcs_vs_time,
    plot_per_layer_snapshots,
    plot_trajectories,
)

__all__ = [
    "GIF_NAME",
    "animate_trajectories",
    "category_colors",
    "plot_centroid_heatmap",
    "plot_centroid_heatmaps",
    "plot_pcs_vs_time",
    "plot_per_layer_snapshots",
    "plot_separation",
    "plot_speed",
    "plot_trajectories",
    "save_figure",
    "write_figures",
]

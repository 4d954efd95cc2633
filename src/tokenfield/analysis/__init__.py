"""Measurements on any trajectory (a traced run or a simulated one): data in, data out.

- :mod:`~tokenfield.analysis.projection`: the PCA frame, saved and reused; PC1 as time.
- :mod:`~tokenfield.analysis.kinematics`: step lengths, turning, the seed's velocity.
- :mod:`~tokenfield.analysis.separation`: category separation with a permutation
  null, bifurcation layers, centroid distances.
- :mod:`~tokenfield.analysis.run_analysis`: all of it on one run (``analyze``).
- :mod:`~tokenfield.analysis.metrics`: ``metrics.json`` read back, typed (``Metrics.from_dict``).
- :mod:`~tokenfield.analysis.alignment`: one model's states rotated onto another's.

Nothing here opens or writes files, loads a model or draws: the workflows that do
(``analyze_run`` writes ``metrics.json`` and the figures) are :mod:`tokenfield.pipelines`.
"""

from __future__ import annotations

from tokenfield.analysis.kinematics import kinematics, vector_angle
from tokenfield.analysis.metrics import Metrics, summary_rows
from tokenfield.analysis.projection import (
    PROJECTION_NPZ,
    DepthOrdering,
    Projection,
    depth_ordering,
    fit_projection,
    load_projection,
    project,
)
from tokenfield.analysis.run_analysis import (
    RunAnalysis,
    analyze,
    display_labels,
    select_particles,
)
from tokenfield.analysis.separation import (
    bifurcation,
    centroid_distances,
    separation,
    silhouette_batch,
)

__all__ = [
    "PROJECTION_NPZ",
    "DepthOrdering",
    "Metrics",
    "Projection",
    "RunAnalysis",
    "analyze",
    "bifurcation",
    "centroid_distances",
    "depth_ordering",
    "display_labels",
    "fit_projection",
    "kinematics",
    "load_projection",
    "project",
    "select_particles",
    "separation",
    "silhouette_batch",
    "summary_rows",
    "vector_angle",
]

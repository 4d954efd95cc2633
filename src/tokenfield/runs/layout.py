"""The names of a run's files (the store, run.json, what analyses derive: DERIVED,
the figures) and the string arrays a store keeps."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from tokenfield.errors import UserError

RUN_JSON = "run.json"
TRAJECTORY = "trajectory.zarr"
METRICS_JSON = "metrics.json"
FIGURES = "figures"
# The files analyses derive from a run and keep inside it. The modules that write
# them import these names from here, so that DERIVED cannot miss one.
PROJECTION_NPZ = "projection.npz"  # tokenfield analyze (analysis.projection)
THEORY_JSON = "theory.json"  # tokenfield lens (analysis.theory)
THEORY_HTML = "theory.html"
FLOW_JSON = "flow.json"  # tokenfield lens --flow (analysis.flow)
FLOW_HTML = "flow.html"
# Everything tokenfield derives from a run and keeps inside it: --overwrite removes
# these (and only these, so a user's own files in the directory are never touched;
# in FIGURES only the figures tokenfield draws, see is_figure).
HYPOTHESES_JSON = "hypotheses.json"  # tokenfield hypotheses (pipelines.hypotheses)
HYPOTHESES_HTML = "hypotheses.html"
ATTRACTORS_JSON = "attractors.json"  # tokenfield attractors (pipelines.attractors)
ATTRACTORS_ZARR = "attractors.zarr"  # a directory store, like TRAJECTORY
ATTRACTORS_HTML = "attractors.html"
# The derived entries that are Zarr directory stores (every other one is a file).
DERIVED_STORES = (ATTRACTORS_ZARR,)
DERIVED = (
    METRICS_JSON,
    FIGURES,
    PROJECTION_NPZ,
    THEORY_JSON,
    THEORY_HTML,
    FLOW_JSON,
    FLOW_HTML,
    HYPOTHESES_JSON,
    HYPOTHESES_HTML,
    ATTRACTORS_JSON,
    ATTRACTORS_ZARR,
    ATTRACTORS_HTML,
)
# The figures tokenfield draws into RUN/figures, by name: each stem as .png and .svg
# (tokenfield.viz.run_figures, tokenfield.viz.simulation), the animations, and the
# lens's theory_<section>.png/.svg (tokenfield.viz.theory, tokenfield.viz.flow).
FIGURE_STEMS = (
    "trajectories",
    "pcs_vs_layer",
    "speed",
    "separation",
    "centroid_distances",
    "trajectories_per_layer",
    "trajectories_baseline",
    "simulation_clusters_energy",
    "simulation_particles",
)
FIGURE_ANIMATIONS = ("thought_evolution.gif", "simulation_particles.gif")
LENS_FIGURE_PREFIX = "theory_"


def is_figure(name: str) -> bool:
    """Whether ``name`` (a file in RUN/figures) is a figure tokenfield draws."""
    if name in FIGURE_ANIMATIONS:
        return True
    stem, _dot, suffix = name.rpartition(".")
    if suffix not in ("png", "svg"):
        return False
    lens = stem.removeprefix(LENS_FIGURE_PREFIX)
    return stem in FIGURE_STEMS or (
        stem.startswith(LENS_FIGURE_PREFIX) and lens.replace("_", "").isalnum()
    )


def figures_dir(run: str | Path, *, create: bool = True) -> Path:
    """``RUN/figures``, checked to be a real directory inside the run (created when
    missing, with ``create``): figures are never written through a symbolic link
    into another directory.

    Raises:
        UserError: it is a symbolic link, or something other than a directory.
    """
    folder = Path(run) / FIGURES
    if folder.is_symlink():
        raise UserError(
            f"'{folder}' is a symbolic link (to '{os.readlink(folder)}'); tokenfield "
            "writes figures only inside the run, never through a link",
            f"remove the link '{folder}' (its target is left alone), then run again",
        )
    if folder.exists() and not folder.is_dir():
        raise UserError(f"'{folder}' is not a directory", "remove or rename it, then run again")
    if create:
        folder.mkdir(exist_ok=True)
    return folder


def strings(values: Any) -> np.ndarray:
    """An object array of Python strings: Zarr stores it as variable-length UTF-8,
    so pieces with longer strings can be appended later."""
    return np.array([str(v) for v in values], dtype=object)

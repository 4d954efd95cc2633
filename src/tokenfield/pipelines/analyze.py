"""The analyze workflow: open a run, measure it, draw, write ``metrics.json``,
``projection.npz`` and ``figures/`` into it (``tokenfield analyze``).

The measurements are :func:`tokenfield.analysis.run_analysis.analyze` (pure); the
figures are :mod:`tokenfield.viz` (drawing only). This module is the glue.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import xarray as xr

from tokenfield._io import write_json_atomic
from tokenfield._progress import stage
from tokenfield.analysis.projection import PROJECTION_NPZ
from tokenfield.analysis.run_analysis import analyze
from tokenfield.analysis.simulation import analyze_simulation
from tokenfield.errors import UserError
from tokenfield.runs import METRICS_JSON, figures_dir, open_run
from tokenfield.viz import simulation as simulation_viz
from tokenfield.viz import write_figures

__all__ = ["analyze_run"]


def analyze_run(
    path: str | Path,
    baseline: str | Path | xr.Dataset | None = None,
    *,
    sphere: bool = False,
    per_layer: bool = False,
    seed: int = 0,
    n_permutations: int = 200,
    particles: str = "last",
    figures: bool = True,
    times: str = "seed",
) -> dict[str, Any]:
    """Analyse a run directory and write ``metrics.json``, ``projection.npz`` and
    ``figures/`` into it. Simulated runs also get the simulation analysis.

    Args:
        path: the run directory.
        baseline: a baseline run (directory or Dataset), analysed side by side.
        sphere: as in :func:`tokenfield.analyze`.
        per_layer: as in :func:`tokenfield.analyze`.
        seed: as in :func:`tokenfield.analyze`.
        n_permutations: as in :func:`tokenfield.analyze`.
        particles: as in :func:`tokenfield.analyze`.
        times: as in :func:`tokenfield.analyze`.
        figures: also draw the figures (PNG and SVG, and an animated GIF).

    Returns:
        The metrics written to ``metrics.json``.

    Example:
        >>> metrics = tf.analyze_run("runs/spectrum", baseline="runs/spectrum-random")  # doctest: +SKIP
        >>> depth = metrics["depth_ordering"]                                          # doctest: +SKIP
        >>> depth["overall_spearman"]                                                  # doctest: +SKIP
        0.92...
    """
    path = Path(path)
    ds = open_run(path)
    if figures:
        figures_dir(path, create=False)  # a symlinked figures/ is refused before the work
    base_ds = open_run(baseline) if isinstance(baseline, (str, Path)) else baseline
    if n_permutations < 0:
        raise UserError(f"--permutations must be >= 0, got {n_permutations}", "use e.g. 200")
    stage("measuring" + (" (and the baseline)" if base_ds is not None else ""))
    result = analyze(
        ds,
        baseline=base_ds,
        sphere=sphere,
        per_layer=per_layer,
        seed=seed,
        n_permutations=n_permutations,
        particles=particles,
        times=times,
    )
    if result.info["kind"] == "simulation":
        stage("clusters and energy of the simulation")
        result.simulation = analyze_simulation(ds)
    metrics = result.to_dict()
    metrics["run"] = str(path)
    if isinstance(baseline, (str, Path)):
        metrics["baseline_run"] = str(baseline)
    written: list[str] = []
    if figures:
        folder = figures_dir(path)
        stage("figures")
        written = [str(p.relative_to(path)) for p in write_figures(result, folder)]
        if result.simulation is not None:
            written += [
                str(Path(p).relative_to(path))
                for p in simulation_viz.write_simulation_figures(result.simulation, ds, folder)
            ]
    metrics["figures"] = written
    stage("writing metrics.json")
    result.frame.save(path / PROJECTION_NPZ)
    write_json_atomic(path / METRICS_JSON, metrics)
    return metrics

"""Figures in Jupyter: the report's own figures, returned instead of written.

Each function takes what you already hold in a notebook (a run's path, a
trajectory Dataset, a :class:`~tokenfield.RunAnalysis`) and returns a figure
that displays inline: the interactive ones are the report's plotly figures
(built by :mod:`tokenfield.report.interactive`), the others its matplotlib
figures (built by :mod:`tokenfield.viz`), so a notebook and the report show the
same picture. Nothing is written to disk.

Example:
    >>> import tokenfield as tf
    >>> sim = tf.simulate(tf.Dynamics(beta=4.0), tf.initial_condition("uniform", n=16, d=2, seed=0),
    ...                   t_max=2.0, dt=0.05)
    >>> tf.plot.energy(sim).layout.title.text
    'Energy and cluster count against time'
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from tokenfield.errors import UserError

__all__ = ["attention", "energy", "paths", "separation"]

# ``TOKENFIELD_PLOTLY_JS=URL``: the figures shown in Jupyter carry their HTML with a
# ``<script src=URL>`` for plotly.js, beside plotly's own mimetype. The documentation
# build sets it (to the site's copy of plotly.js), so the tutorial pages draw their
# figures offline; plotly's own renderers would need a CDN or require.js.
PLOTLY_JS_ENV = "TOKENFIELD_PLOTLY_JS"


def _offline_renderer() -> None:
    src = os.environ.get(PLOTLY_JS_ENV)
    if not src:
        return
    import plotly.io as pio
    from plotly.io._base_renderers import MimetypeRenderer

    class ScriptSrcRenderer(MimetypeRenderer):
        def to_mimebundle(self, fig_dict: dict) -> dict:
            html = pio.to_html(fig_dict, include_plotlyjs=src, full_html=False, auto_play=False)
            return {"text/html": html}

    pio.renderers["tokenfield_script_src"] = ScriptSrcRenderer()
    pio.renderers.default = "tokenfield_script_src"


_offline_renderer()


def _shown(fig: Any) -> Any:
    """A matplotlib figure that displays in Jupyter: tokenfield draws on Agg canvases
    without pyplot, for which IPython registers no image formatter until pyplot is
    imported; register PNG for figures in a running IPython (nothing else changes)."""
    try:
        from IPython import get_ipython
        from IPython.core.pylabtools import select_figure_formats
    except ImportError:
        return fig
    shell = get_ipython()
    if shell is not None:
        select_figure_formats(shell, {"png"}, bbox_inches="tight")
    return fig


def _dataset(run: Any) -> xr.Dataset:
    if isinstance(run, xr.Dataset):
        return run
    if isinstance(run, (str, Path)):
        from tokenfield.runs import open_run

        return open_run(run)
    raise UserError(
        f"expected a run directory or a trajectory Dataset, got {type(run).__name__}",
        "pass a path, tokenfield.open_run(path) or the Dataset that trace/simulate returned",
    )


def _analysis(run: Any) -> Any:
    from tokenfield.analysis.run_analysis import RunAnalysis, analyze

    if isinstance(run, RunAnalysis):
        return run
    return analyze(_dataset(run), n_permutations=50)


def paths(run: Any, *, title: str = "") -> Any:
    """The report's interactive PCA paths: one line per particle, a layer slider.

    Args:
        run: a :class:`~tokenfield.RunAnalysis` (its frame is reused), a
            trajectory Dataset (from :func:`tokenfield.trace` or
            :func:`tokenfield.simulate`) or a run directory. A Dataset or a path
            is analysed first with :func:`tokenfield.analyze` (last tokens, the
            seed's times, a joint PCA over all of them).
        title: the figure's title.

    Returns:
        A ``plotly.graph_objects.Figure``: PC1 against PC2, categories in the
        legend (click to toggle), the prompt in hover, and a slider and play
        button over depth (or time, for a simulation).

    Example:
        >>> fig = tf.plot.paths(tf.analyze(ds))      # doctest: +SKIP
        >>> fig                                     # doctest: +SKIP
    """
    from tokenfield.report.interactive import trajectory_figure

    result = _analysis(run)
    explained = np.asarray(result.frame.explained_variance_ratio)
    if explained.ndim > 1:  # a per-layer frame: no single share per axis
        explained = None
    time_name = "layer" if result.info.get("kind") == "trace" else "time"
    return trajectory_figure(result.pcs, explained=explained, time_name=time_name, title=title)


def energy(sim: Any, *, eps: float | None = None) -> Any:
    """The report's energy and cluster count against time, for a simulated run.

    Args:
        sim: a simulation (the Dataset :func:`tokenfield.simulate` returns, or
            its run directory), or the dict :func:`tokenfield.analyze_simulation`
            returned for it.
        eps: the cluster threshold (default: the simulator's), for a Dataset.

    Returns:
        A ``plotly.graph_objects.Figure`` with two panels: the interaction
        energy and the cluster count, against time.

    Raises:
        UserError: ``sim`` is a traced run (it has no energy) or has no beta.

    Example:
        >>> fig = tf.plot.energy(tf.simulate(tf.Dynamics(beta=4.0), x0, t_max=5.0, dt=0.05))  # doctest: +SKIP
    """
    import plotly.graph_objects as go

    from tokenfield.analysis.simulation import analyze_simulation
    from tokenfield.report.simulation import energy_figure

    if isinstance(sim, dict):
        analysis = sim
    else:
        ds = _dataset(sim)
        if "prompt" in ds.coords:
            raise UserError(
                "a traced run has no interaction energy",
                "pass a simulation (tokenfield.simulate or a 'tokenfield simulate' run)",
            )
        if "system" in ds["states"].dims:
            ds = ds.isel(system=0)
        options = {} if eps is None else {"eps": eps}
        analysis = analyze_simulation(ds, max_frames=200, **options)
    figure = energy_figure(analysis)
    if figure is None:
        raise UserError(
            "the simulation's analysis has no times to draw",
            "pass a simulation with at least one saved step",
        )
    return go.Figure(figure)


def separation(analysis: Any) -> Any:
    """The report's separation figure: silhouette and the between/within ratio
    against depth, each beside its shuffled-label null band (and the baseline's).

    Args:
        analysis: a :class:`~tokenfield.RunAnalysis` of a run with categories
            (or a Dataset / run directory, analysed first).

    Returns:
        A matplotlib ``Figure`` (the report's own, drawn by
        :func:`tokenfield.viz.plot_separation`); it displays inline in Jupyter.

    Raises:
        UserError: the run has fewer than two categories with two prompts each.

    Example:
        >>> tf.plot.separation(tf.analyze(ds))       # doctest: +SKIP
    """
    from tokenfield.viz.measures import plot_separation

    result = _analysis(analysis)
    if result.separation is None:
        raise UserError(
            "this run has no category separation (it needs two categories of two prompts)",
            "trace a prompt set with categories, e.g. seed-categories",
        )
    baseline = result.baseline.separation if result.baseline is not None else None
    time_name = "layer" if result.info.get("kind") == "trace" else "time"
    return _shown(plot_separation(result.separation, baseline=baseline, time_name=time_name))


def attention(run: Any) -> Any:
    """The theory lens's attention figure: sink mass, row entropy and spectral gap
    per layer and head, and their means over heads.

    Args:
        run: a run traced with ``attention=True`` (``tokenfield trace
            --attention``): its directory or its Dataset.

    Returns:
        A matplotlib ``Figure`` (drawn by :func:`tokenfield.viz.theory.plot_attention`,
        as in the theory section of the report).

    Raises:
        UserError: the run has no attention statistics.

    Example:
        >>> tf.plot.attention(tf.trace(model, "seed-categories", attention=True))  # doctest: +SKIP
    """
    from tokenfield.analysis.markov import attention_by_layer
    from tokenfield.viz.theory import plot_attention

    return _shown(plot_attention(attention_by_layer(_dataset(run))))

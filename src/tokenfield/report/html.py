"""The report page: one self-contained HTML document for one or more runs.

Rendering only: :func:`render_page` takes what :mod:`tokenfield.pipelines.report`
gathered (each run opened, its metrics read back and typed, its figures read)
and returns the page. It works offline: plotly.js is inlined once at the end of
the page, figures are embedded as base64 data URIs, and nothing is fetched from
the network. Per run it shows the summary table (side by side with the baseline,
if the analysis had one), the interactive PCA trajectories (hover for the
prompt, a layer slider, categories toggled from the legend), the static figures
and the metrics tables.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from tokenfield._progress import stage
from tokenfield.analysis.metrics import Metrics
from tokenfield.analysis.projection import Projection
from tokenfield.report.paths import Overlay, interactive, states_of
from tokenfield.report.simulation import figure_html, simulation_figures
from tokenfield.report.tables import (
    centroid_tables,
    describe_model,
    particle_table,
    separation_table,
    simulation_table,
    summary_table,
)
from tokenfield.report.views import page_script
from tokenfield.runs import FIGURE_ANIMATIONS, FIGURE_STEMS, LENS_FIGURE_PREFIX
from tokenfield.viz.theory import CAPTIONS as THEORY_CAPTIONS

#: A figure: (MIME type, the file's bytes).
Image = tuple[str, bytes]

# The analysis's figures in the order run directories name them, the animation right
# after the paths it grows; a figure not named here comes after them, by name.
FIGURE_ORDER = (FIGURE_STEMS[0], FIGURE_ANIMATIONS[0].removesuffix(".gif"), *FIGURE_STEMS[1:])
CAPTIONS = {
    "trajectories": "Paths in the PCA plane (circle: first time step, square: last).",
    "thought_evolution": "The paths growing one time step per frame.",
    "pcs_vs_layer": "PC1 and PC2 against depth.",
    "speed": "Step length relative to the current norm, angular step, turning angle.",
    "separation": "Category separation against depth; shaded: the shuffled-label null band.",
    "centroid_distances": "Cosine distances between category centroids at chosen layers.",
    "trajectories_per_layer": "Each layer in its own PCA plane.",
    "trajectories_baseline": "The baseline run in its own PCA plane.",
}
THEORY_PREFIX = LENS_FIGURE_PREFIX
NOTES = """
<p class="note"><b>How to read the numbers.</b> Distances are cosine distances.
<i>Spearman(PC1, layer)</i>: rank correlation of PC1 with the layer index (1: PC1 is depth).
<i>Silhouette</i> (cosine) and <i>between/within</i> (mean distance between categories over mean
distance within) come with a permutation null: the same score with the category labels
shuffled (its 2.5&ndash;97.5% band and p-value). The layer with the best silhouette is picked
from all layers, so its claim is judged on the <i>corrected</i> p-value: the same shuffles, each
scored by its best layer (the maximum over layers); a claim is stated as holding only when the
corrected p is below 0.05, and as "not supported" otherwise. <i>Times</i>: by default layers
0&hellip;L&minus;1 (the embedding and blocks 1&hellip;L&minus;1, what the seed experiment read from
<code>hidden_states[:-1]</code>); PC1-vs-depth is shown for 0&hellip;L too. <i>Split layer</i>: the first layer from which a
prompt stays clearly closer (by the margin) to its own category's centroid (leave-one-out)
than to any other category's. <i>Bifurcation layer</i>: the first layer from which a prompt
stays clearly closer to another category's centroid than to its own; <i>joined</i> names it.</p>
"""
STYLE = """
body { font-family: system-ui, -apple-system, Segoe UI, Roboto, sans-serif; margin: 2em auto;
       max-width: 1200px; padding: 0 1em; color: #222; }
h1 { font-size: 1.6em; } h2 { border-bottom: 1px solid #ccc; padding-bottom: .2em; }
table { border-collapse: collapse; margin: .5em 0 1.5em; font-size: .85em; }
th, td { border: 1px solid #ddd; padding: .25em .5em; text-align: left; vertical-align: top; }
th { background: #f4f4f4; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
figure { margin: 1em 0; } figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { font-size: .85em; color: #555; } .note { font-size: .85em; color: #444; }
nav a { margin-right: 1em; } .scroll { max-height: 28em; overflow: auto; }
.views { font-size: .9em; margin: .3em 0; } .views label { margin-right: 1em; }
.views .sep { margin-right: 1em; color: #aaa; }
"""


# In every report's <head>: how `report --out` knows a file it may replace.
REPORT_MARKER = "<meta name='generator' content='tokenfield report'>"


@dataclass
class RunPage:
    """What the page shows of one run (gathered by ``pipelines.report``).

    Attributes:
        path: the run directory (shown; its name heads the section).
        ds: the opened run.
        metrics: its metrics (read from ``metrics.json`` or analysed in memory).
        frame: the analysis's PCA frame.
        images: figure name -> image, in the order shown.
        simulation: a simulated run's energy and cluster count against time
            (:func:`~tokenfield.analysis.simulation.analyze_simulation`), or None.
        overlays: other runs drawn in this run's trajectories.

    Example:
        >>> from pathlib import Path
        >>> from tokenfield.pipelines.report import read_metrics
        >>> from tokenfield.report import RunPage, render_page
        >>> page = RunPage(Path("runs/categories"), tf.open_run("runs/categories"),
        ...                read_metrics("runs/categories"),
        ...                tf.load_projection("runs/categories"))  # doctest: +SKIP
        >>> html = render_page([page], title="categories", generated="today")  # doctest: +SKIP
    """

    path: Path
    ds: xr.Dataset
    metrics: Metrics
    frame: Projection
    images: dict[str, Image] = field(default_factory=dict)
    simulation: dict[str, Any] | None = None
    overlays: Sequence[Overlay] = ()


@dataclass(frozen=True)
class Section:
    """An HTML fragment appended to the page, with figures to put at its end.

    Attributes:
        html: the fragment.
        images: figure name -> ``(mime type, bytes)``, shown at its end.

    Example:
        >>> from tokenfield.report import Section, render_page
        >>> page = render_page([], title="notes", generated="today",
        ...                    sections=[Section("<h2>Notes</h2>")])
        >>> "<h2>Notes</h2>" in page
        True
    """

    html: str
    images: dict[str, Image] = field(default_factory=dict)


def render_page(
    runs: Sequence[RunPage],
    *,
    title: str,
    generated: str,
    sections: Sequence[Section] = (),
    plotly_js: str = "",
) -> str:
    """The whole report page.

    Args:
        runs: the runs, in order (the first one carries the overlays).
        title: the page title.
        generated: when it was made (shown under the title).
        sections: fragments appended after the runs.
        plotly_js: plotly.js, inlined once at the end of the page.

    Returns:
        The HTML document, self-contained.

    Example:
        >>> from tokenfield.report import Section, render_page
        >>> page = render_page([], title="notes", generated="today",
        ...                    sections=[Section("<h2>Notes</h2>")])
        >>> page.startswith("<!DOCTYPE html>")
        True
    """
    run_sections = [_run_section(run, i) for i, run in enumerate(runs)]
    nav = "".join(
        f'<a href="#run-{i}">{html.escape(run.path.name or str(run.path))}</a>'
        for i, run in enumerate(runs)
    )
    stage("writing the page")
    return (
        f"<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>{REPORT_MARKER}"
        f"<title>{html.escape(title)}</title>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<style>{STYLE}</style>"
        "</head><body>"
        f"<h1>{html.escape(title)}</h1><p>Generated {generated} for {len(runs)} run(s).</p>"
        f"<nav>{nav}</nav>{NOTES if runs else ''}{''.join(run_sections)}"
        f"{''.join(_section(s) for s in sections)}"
        # plotly.js once, last: the page's text paints before the 4.6 MB script is parsed
        f'<script type="text/javascript">{plotly_js}</script>'
        f"<script>{page_script()}</script>"
        "</body></html>\n"
    )


def _run_section(run: RunPage, index: int) -> str:
    metrics = run.metrics
    kind = metrics.info.kind
    time_name = "layer" if kind == "trace" else "time"
    name = run.path.name or str(run.path)
    plot = interactive(
        run.ds,
        run.frame,
        index,
        name=name,
        trace=kind == "trace",
        times_option=metrics.options.times,
        overlays=run.overlays,
    )
    model = describe_model(metrics.info.model)
    heading = f"{html.escape(name)} <small>({html.escape(kind)}{', ' + html.escape(model) if model else ''})</small>"
    parts = [f'<section id="run-{index}"><h2>{heading}</h2>']
    parts.append(f"<p class='note'>{html.escape(str(run.path))}</p>")
    parts.append("<h3>Summary</h3>" + summary_table(metrics))
    parts.append("<h3>Trajectories (interactive)</h3>" + plot)
    if kind == "simulation":
        parts.append(_simulation_views(run.ds, run.simulation, index))
    if run.images:
        parts.append("<h3>Figures</h3>" + figures_html(run.images))
    parts.append(separation_table(metrics))
    parts.append(centroid_tables(metrics, time_name))
    parts.append(particle_table(metrics, time_name))
    parts.append(simulation_table(metrics))
    parts.append("</section>")
    return "".join(parts)


def _simulation_views(ds: xr.Dataset, analysis: dict[str, Any] | None, index: int) -> str:
    """A simulated run on its sphere (d = 2: angles against time; d = 3: the sphere in
    3-D with a time slider), and its energy and cluster count against time."""
    if "system" in ds["states"].dims:
        ds = ds.isel(system=0)
    states = states_of(ds.load())
    figures = simulation_figures(states, np.asarray(ds["time"].values), analysis)
    if not figures:
        return ""
    d = states.shape[-1]
    note = (
        ""
        if d in (2, 3)
        else f"<p class='note'>d = {d}: the sphere is shown for d = 2 and 3 only.</p>"
    )
    body = "".join(figure_html(f, f"simulation-{index}-{i}") for i, f in enumerate(figures))
    return f"<h3>Simulation (interactive)</h3>{note}{body}"


def _section(section: Section) -> str:
    if not section.images:
        return section.html
    figures = "<h3>Figures</h3>" + figures_html(section.images)
    end = section.html.rfind("</section>")
    if end < 0:
        return section.html + figures
    return section.html[:end] + figures + section.html[end:]


def figures_html(images: dict[str, Image]) -> str:
    """The figures as ``<figure>`` elements with their captions (images inlined)."""
    out = []
    for name, (mime, content) in images.items():
        data = base64.b64encode(content).decode("ascii")
        caption = CAPTIONS.get(name) or _theory_caption(name) or name.replace("_", " ")
        out.append(
            f'<figure><img alt="{html.escape(name)}" src="data:{mime};base64,{data}">'
            f"<figcaption>{html.escape(caption)}</figcaption></figure>"
        )
    return "".join(out)


def _theory_caption(name: str) -> str | None:
    if not name.startswith(THEORY_PREFIX):
        return None
    return THEORY_CAPTIONS.get(name)

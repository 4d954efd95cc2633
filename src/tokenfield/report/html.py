"""``write_report``: one self-contained HTML file for one or more runs.

The file works offline: plotly.js is inlined once in the page head, figures are
embedded as base64 data URIs, and nothing is fetched from the network. Per run
it shows the summary table (side by side with the baseline, if the analysis
had one), the interactive PCA trajectories (hover for the prompt, a layer
slider, categories toggled from the legend), the static figures and the
metrics tables.

A run analysed with ``tokenfield analyze`` contributes its ``metrics.json``,
``projection.npz`` and ``figures/``; a run that was not analysed is analysed
in memory (its directory is left untouched; :func:`unanalysed_runs` names them
so that the command can say so). The theory-lens figures that ``tokenfield lens``
wrote (``RUN/figures/theory_*.png``) are shown either way.
"""

from __future__ import annotations

import base64
import datetime as _dt
import html
import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from tokenfield._io import write_atomic
from tokenfield._progress import stage
from tokenfield.analysis.projection import (
    PROJECTION_NPZ,
    Projection,
    fit_projection,
    load_projection,
)
from tokenfield.analysis.run_analysis import (
    analyze,
    display_labels,
    select_particles,
    select_times,
    summary_rows,
)
from tokenfield.analysis.simulation import analyze_simulation
from tokenfield.errors import UserError
from tokenfield.report.interactive import (
    MAX_PARTICLES,
    START_JS,
    VIEW_JS,
    PathSet,
    _evenly,
    figure_html,
    hover_lines,
    simulation_figures,
    trajectory_views,
    views_html,
)
from tokenfield.runs import FIGURES, METRICS_JSON, check_writable_dir, open_run, read_run_info
from tokenfield.viz import write_figures
from tokenfield.viz.theory import CAPTIONS as THEORY_CAPTIONS

FIGURE_ORDER = (
    "trajectories",
    "thought_evolution",
    "pcs_vs_layer",
    "speed",
    "separation",
    "centroid_distances",
    "trajectories_per_layer",
    "trajectories_baseline",
)
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
THEORY_PREFIX = "theory_"
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


def is_report(path: str | Path) -> bool:
    """Whether ``path`` is a report written by tokenfield (it carries the marker)."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(4096)
    except OSError:
        return False
    # reports written before the marker existed start exactly like this
    legacy = b"<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'><title>tokenfield"
    return REPORT_MARKER.encode() in head or head.startswith(legacy)


def write_report(
    run_paths: Sequence[str | Path] | str | Path,
    out: str | Path,
    *,
    title: str = "tokenfield report",
    sections: Sequence[str | Path] = (),
    overwrite: bool = False,
    overlays: Sequence[str | Path | tuple[str | Path, str]] = (),
) -> Path:
    """Write one self-contained, offline HTML report for the given runs.

    Args:
        run_paths: run directories (may be empty when ``sections`` are given).
        out: the HTML file to write (its directory is created).
        title: the page title.
        sections: HTML fragments to append, e.g. the ``meanfield.html`` written by
            ``scripts/meanfield_tables.py`` or the theory-lens section.
        overwrite: replace ``out`` even when it is not a tokenfield report (an
            earlier report is always replaced; any other file is refused).
        overlays: other runs (``path`` or ``(path, label)``, or ``"path:label"``)
            drawn in the first run's interactive trajectories, in its frozen PCA
            frames; another model is first aligned layer by layer by an
            orthogonal Procrustes rotation over the shared prompts.

    Returns:
        The path written.
    """
    if isinstance(run_paths, (str, Path)):
        run_paths = [run_paths]
    paths = [Path(p) for p in run_paths]
    fragments = []
    reported = {p.resolve() for p in paths}
    for section in sections:
        section = Path(section)
        if not section.is_file():
            raise UserError(f"section file '{section}' does not exist", "check the path")
        try:
            fragment = section.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            if isinstance(exc, UnicodeDecodeError):
                reason = f"not UTF-8 text: byte {exc.start} {exc.reason}"
            else:
                reason = exc.strerror or type(exc).__name__
            raise UserError(
                f"cannot read section file '{section}' ({reason})",
                "pass an HTML fragment in UTF-8, such as RUN/theory.html from 'tokenfield lens'",
            ) from None
        if section.name == "theory.html" and section.parent.resolve() not in reported:
            # RUN/theory.html alone: its figures come with it (with RUN, in RUN's section).
            fragment = _with_theory_figures(fragment, section.parent / FIGURES)
        fragments.append(fragment)
    if not paths and not fragments:
        raise UserError("no runs given", "pass one or more run directories")
    out = Path(out)
    if out.is_dir():
        raise UserError(f"--out '{out}' is a directory", "give a file name such as report.html")
    check_writable_dir(out.parent)
    if out.exists() and not overwrite and not is_report(out):
        raise UserError(
            f"--out '{out}' exists and is not a tokenfield report; refusing to replace it",
            "choose another --out, or pass --overwrite to replace it",
        )
    for path in paths:
        read_run_info(path)  # a clear error before any work
    overlay_list = [parse_overlay(o) for o in overlays]
    if overlay_list and not paths:
        raise UserError("--overlay needs a run to draw on", "give the reference run first")
    for other, _label in overlay_list:
        read_run_info(other)
    from plotly.offline import get_plotlyjs

    run_sections = [
        _run_section(path, i, overlay_list if i == 0 else ()) for i, path in enumerate(paths)
    ]
    nav = "".join(
        f'<a href="#run-{i}">{html.escape(path.name or str(path))}</a>'
        for i, path in enumerate(paths)
    )
    stage("writing the page")
    now = _dt.datetime.now().strftime("%Y-%m-%d %H:%M")
    page = (
        f"<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>{REPORT_MARKER}"
        f"<title>{html.escape(title)}</title>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<style>{STYLE}</style>"
        "</head><body>"
        f"<h1>{html.escape(title)}</h1><p>Generated {now} for {len(paths)} run(s).</p>"
        f"<nav>{nav}</nav>{NOTES if paths else ''}{''.join(run_sections)}"
        f"{''.join(fragments)}"
        # plotly.js once, last: the page's text paints before the 4.6 MB script is parsed
        f'<script type="text/javascript">{get_plotlyjs()}</script>'
        f"<script>{VIEW_JS}{START_JS}</script>"
        "</body></html>\n"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(out, page)  # the usual mode: a report is for sharing
    return out


def _run_section(path: Path, index: int, overlays: Sequence[tuple[Path, str]] = ()) -> str:
    stage(f"{path.name or path}: reading")
    ds = open_run(path)
    metrics_file = path / METRICS_JSON
    images: dict[str, tuple[str, bytes]] = {}
    if metrics_file.is_file():
        metrics = json.loads(metrics_file.read_text())
        options = metrics.get("options", {})
        if (path / PROJECTION_NPZ).is_file():
            frame = load_projection(path)
        else:
            selected = select_particles(ds, options.get("particles", "last")).load()
            frame = fit_projection(selected, sphere=bool(options.get("sphere", False)))
        images = _read_images(path / FIGURES)
    else:
        options = {}
        stage(f"{path.name or path}: analysing in memory (no metrics.json)")
        result = analyze(ds)
        metrics = result.to_dict()
        frame = result.frame

        with tempfile.TemporaryDirectory() as tmp:
            write_figures(result, tmp, animation=False)
            images = _read_images(Path(tmp))
        # The lens's figures live in the run whether or not it was analysed.
        theory = _read_images(path / FIGURES)
        images.update({k: v for k, v in theory.items() if k.startswith(THEORY_PREFIX)})
    info = metrics.get("info", {})
    kind = info.get("kind", "trace")
    time_name = "layer" if kind == "trace" else "time"
    name = path.name or str(path)
    plot = _interactive(
        ds,
        frame,
        index,
        name=name,
        trace=kind == "trace",
        times_option=str(options.get("times", "seed")) if metrics_file.is_file() else "seed",
        overlays=overlays,
    )
    model = _describe_model(info.get("model"))
    heading = f"{html.escape(name)} <small>({html.escape(kind)}{', ' + html.escape(model) if model else ''})</small>"
    parts = [f'<section id="run-{index}"><h2>{heading}</h2>']
    parts.append(f"<p class='note'>{html.escape(str(path))}</p>")
    parts.append("<h3>Summary</h3>" + _summary_table(metrics))
    parts.append("<h3>Trajectories (interactive)</h3>" + plot)
    if kind == "simulation":
        parts.append(_simulation_views(ds, metrics, index))
    if images:
        parts.append("<h3>Figures</h3>" + _figures(images))
    parts.append(_separation_table(metrics))
    parts.append(_centroid_tables(metrics, time_name))
    parts.append(_particle_table(metrics, time_name))
    parts.append(_simulation_table(metrics))
    parts.append("</section>")
    return "".join(parts)


def _simulation_views(ds: xr.Dataset, metrics: dict[str, Any], index: int) -> str:
    """A simulated run on its sphere (d = 2: angles against time; d = 3: the sphere in
    3-D with a time slider), and its energy and cluster count against time."""
    if "system" in ds["states"].dims:
        ds = ds.isel(system=0)
    analysis = metrics.get("simulation")
    if not isinstance(analysis, dict):
        try:
            analysis = analyze_simulation(ds, max_frames=200)
        except UserError:
            analysis = None  # no beta in the config: no energy
    states = _states_of(ds.load())
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


def _time_label(value: Any) -> str:
    """A layer as it is; an ODE time with 4 significant digits (not 9.200000000000001)."""
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _project3(states: np.ndarray, frame: Projection) -> np.ndarray:
    """(time, particle, feature) -> (time, particle, 3) in a global frame (zeros past
    the frame's components)."""
    if frame.sphere:
        norms = np.linalg.norm(states, axis=-1, keepdims=True)
        states = states / np.where(norms > 0, norms, 1.0)
    comps = frame.components[:3]
    out = np.zeros((*states.shape[:2], 3))
    out[..., : comps.shape[0]] = (states - frame.mean) @ comps.T
    return out


def _states_of(ds: xr.Dataset) -> np.ndarray:
    return np.asarray(ds["states"].transpose("time", "particle", "feature").values, np.float64)


def _tokens(ds: xr.Dataset) -> list[str]:
    for name in ("token_piece", "token"):
        if name in ds.coords:
            return [str(t) for t in ds[name].values]
    return [""] * ds.sizes["particle"]


def _lens(ds: xr.Dataset) -> tuple[np.ndarray | None, np.ndarray | None]:
    if "lens_top" not in ds or "lens_prob" not in ds:
        return None, None
    top = np.asarray(ds["lens_top"].transpose("time", "particle", "lens_k").values)
    prob = np.asarray(ds["lens_prob"].transpose("time", "particle", "lens_k").values)
    return top, prob


def _frames(
    selected: xr.Dataset, frame: Projection, *, trace: bool, times_option: str
) -> dict[str, Projection]:
    """The frames offered: the analysis's (first) and, for a trace, the other of
    raw / unit-sphere, fitted here the same way (joint PCA over the analysis's times)."""
    fitted_on = select_times(selected, times_option)
    if frame.per_layer or frame.n_components < 1:
        frame = fit_projection(fitted_on, sphere=frame.sphere)
    frames = {"sphere" if frame.sphere else "raw": frame}
    if trace:
        other = fit_projection(fitted_on, sphere=not frame.sphere)
        frames["raw" if frame.sphere else "sphere"] = other
    return frames


def _generated_paths(
    ds: xr.Dataset,
    selected: xr.Dataset,
    transform: Any,
    time_index: np.ndarray,
    time_name: str,
) -> dict[int, tuple[dict[str, np.ndarray], list[list[str]]]]:
    """Each prompt's generated tokens: per frame key (time, n, 3), and hover lines (time, n)."""
    if "is_generated" not in ds.coords or "prompt_index" not in ds.coords:
        return {}
    flags = np.asarray(ds["is_generated"].values, dtype=bool)
    if not flags.any():
        return {}
    gen = ds.isel(particle=np.flatnonzero(flags)).isel(time=time_index).load()
    owner = np.asarray(gen["prompt_index"].values)
    position = np.asarray(gen["position"].values)
    times = [_time_label(t) for t in np.asarray(gen["time"].values).tolist()]
    out = {}
    for p, prompt in enumerate(np.asarray(selected["prompt_index"].values).tolist()):
        mine = np.flatnonzero(owner == prompt)
        if mine.size == 0:
            continue
        mine = mine[np.argsort(position[mine], kind="stable")]
        part = gen.isel(particle=mine)
        states = _states_of(part)
        norms = np.linalg.norm(states, axis=-1)
        top, prob = _lens(part)
        rows = hover_lines(
            _tokens(part), times, norms, top, prob, time_name=time_name, prefix="generated "
        )
        rows = [[f"#{j + 1} {rows[j][t]}" for j in range(len(mine))] for t in range(len(times))]
        out[p] = (transform(states), rows)
    return out


def _interactive(
    ds: xr.Dataset,
    frame: Projection,
    index: int,
    *,
    name: str,
    trace: bool,
    times_option: str,
    overlays: Sequence[tuple[Path, str]] = (),
) -> str:
    """The interactive trajectories of one run: 2-D / 3-D, both frames, hover with the
    token, its norm and the logit lens, the generated continuations and the overlays."""
    if "system" in ds["states"].dims:
        ds = ds.isel(system=0)
    # the layers the analysis used (by default the seed's 0..L-1), for paths and overlays alike
    ds = select_times(ds, times_option)
    selected = select_particles(ds, "last")
    selected = selected.isel(particle=_evenly(selected.sizes["particle"], MAX_PARTICLES)).load()
    frames = _frames(selected, frame, trace=trace, times_option=times_option)
    time_name = "layer" if trace else "time"
    times = np.asarray(selected["time"].values)
    states = _states_of(selected)
    top, prob = _lens(selected)
    time_text = [_time_label(t) for t in times.tolist()]
    main = PathSet(
        name="",
        xyz={key: _project3(states, f) for key, f in frames.items()},
        categories=[str(c) for c in selected["category"].values]
        if "category" in selected.coords
        else ["particles"] * selected.sizes["particle"],
        labels=display_labels(selected),
        prompts=[str(p) for p in selected["prompt"].values]
        if "prompt" in selected.coords
        else [""] * selected.sizes["particle"],
        text=hover_lines(
            _tokens(selected),
            time_text,
            np.linalg.norm(states, axis=-1),
            top,
            prob,
            time_name=time_name,
        ),
    )
    main.generated = (
        _generated_paths(
            ds,
            selected,
            lambda x: {key: _project3(x, f) for key, f in frames.items()},
            np.arange(len(times)),
            time_name,
        )
        if "prompt_index" in selected.coords
        else {}
    )
    stage(f"{name}: trajectory views")
    others = []
    for other, label in overlays:
        stage(f"overlay {label or other}: projecting into {name}'s frame")
        others.append(
            _overlay_set(
                selected,
                states,
                frames,
                other,
                label,
                time_name=time_name,
                base_name=name,
                times_option=times_option,
            )
        )
    payload = trajectory_views(
        main,
        others,
        times=time_text,
        explained={key: list(f.explained_variance_ratio[:3]) for key, f in frames.items()},
        time_name=time_name,
        title=f"{name}: trajectories",
    )
    return views_html(payload, f"trajectories-{index}")


def _model_name(ds: xr.Dataset) -> str:
    model = ((ds.attrs.get("run") or {}).get("config") or {}).get("model")
    if isinstance(model, dict):
        return str(model.get("name", ""))
    return str(model or "")


def _overlay_set(
    base: xr.Dataset,
    base_states: np.ndarray,
    frames: dict[str, Projection],
    other: Path,
    label: str,
    *,
    time_name: str,
    base_name: str = "",
    times_option: str = "seed",
) -> Any:
    """Another run drawn in this run's frames (over the same time convention).

    The same model (its baseline or a steered copy) is projected as it is. Another
    model (another name or width) is first rotated onto this run's states, layer
    by layer, by an orthogonal Procrustes fit over the prompts both runs share
    (``scipy.linalg.orthogonal_procrustes``; the narrower states are padded with
    zeros, the wider truncated after the rotation). Runs of different depth are
    matched by relative depth.
    """
    from scipy.linalg import orthogonal_procrustes

    ds = open_run(other)
    if "system" in ds["states"].dims:
        ds = ds.isel(system=0)
    # the layers the analysis used (by default the seed's 0..L-1), for paths and overlays alike
    ds = select_times(ds, times_option)
    selected = select_particles(ds, "last")
    selected = selected.isel(particle=_evenly(selected.sizes["particle"], MAX_PARTICLES)).load()
    n_base, n_other = base_states.shape[0], selected.sizes["time"]
    # the other run's time for each of this run's times (relative depth when they differ)
    if n_other == n_base or n_base < 2:
        index = np.minimum(np.arange(n_base), n_other - 1)
    else:
        index = np.floor(np.arange(n_base) * (n_other - 1) / (n_base - 1) + 0.5).astype(int)
    selected = selected.isel(time=index)
    states = _states_of(selected)
    d_base, d_other = base_states.shape[-1], states.shape[-1]
    align = d_other != d_base or _model_name(ds) != _model_name(base)
    notes = []
    rotations: dict[str, list[np.ndarray]] = {}
    if align:
        if "prompt" not in selected.coords or "prompt" not in base.coords:
            raise UserError(
                f"overlay '{other}' is another model and has no prompts to align it by",
                "overlay a trace of the same prompts",
            )
        base_prompts = {str(p): i for i, p in enumerate(base["prompt"].values)}
        pairs = [
            (i, base_prompts[str(p)])
            for i, p in enumerate(selected["prompt"].values)
            if str(p) in base_prompts
        ]
        if len(pairs) < 2:
            raise UserError(
                f"overlay '{other}' shares {len(pairs)} prompt(s) with '{base_name}'; "
                "aligning another model needs the same prompts",
                "trace both models with the same --prompts",
            )
        mine, theirs = (np.array(v) for v in zip(*pairs, strict=True))
        width = max(d_base, d_other)
        for key, frame in frames.items():
            rotations[key] = []
            for t in range(n_base):
                a = _padded(_unit_if(states[t, mine], frame.sphere), width)
                b = _padded(_unit_if(base_states[t, theirs], frame.sphere), width)
                rotation, _ = orthogonal_procrustes(a, b)
                rotations[key].append(rotation)
        notes.append(
            f"another model: rotated onto {base_name} layer by layer (orthogonal Procrustes "
            f"over {len(pairs)} shared prompts)"
        )
    if n_other != n_base:
        notes.append(f"{n_other} {time_name}s matched to {n_base} by relative depth")

    def transform(x: np.ndarray) -> dict[str, np.ndarray]:
        out = {}
        for key, frame in frames.items():
            if align:
                width = rotations[key][0].shape[0]
                x_key = _unit_if(x, frame.sphere)
                x_key = np.stack(
                    [
                        (_padded(x_key[t], width) @ rotations[key][t])[:, :d_base]
                        for t in range(n_base)
                    ]
                )
            else:
                x_key = x
            out[key] = _project3(x_key, frame)
        return out

    own_times = [_time_label(t) for t in np.asarray(selected["time"].values).tolist()]
    top, prob = _lens(selected)
    result = PathSet(
        name=label,
        xyz=transform(states),
        categories=[str(c) for c in selected["category"].values]
        if "category" in selected.coords
        else ["particles"] * selected.sizes["particle"],
        labels=display_labels(selected),
        prompts=[str(p) for p in selected["prompt"].values]
        if "prompt" in selected.coords
        else [""] * selected.sizes["particle"],
        text=hover_lines(
            _tokens(selected),
            own_times,
            np.linalg.norm(states, axis=-1),
            top,
            prob,
            time_name=time_name,
        ),
        note="; ".join(notes),
    )
    if "prompt_index" in selected.coords:
        result.generated = _generated_paths(ds, selected, transform, index, time_name)
    return result


def _unit_if(x: np.ndarray, sphere: bool) -> np.ndarray:
    if not sphere:
        return x
    norms = np.linalg.norm(x, axis=-1, keepdims=True)
    return x / np.where(norms > 0, norms, 1.0)


def _padded(x: np.ndarray, width: int) -> np.ndarray:
    """Zero-pad the feature (last) axis to ``width``."""
    if x.shape[-1] == width:
        return x
    pad = np.zeros((*x.shape[:-1], width - x.shape[-1]))
    return np.concatenate([x, pad], axis=-1)


def _with_theory_figures(fragment: str, directory: Path) -> str:
    images = {k: v for k, v in _read_images(directory).items() if k.startswith(THEORY_PREFIX)}
    if not images:
        return fragment
    figures = "<h3>Figures</h3>" + _figures(images)
    end = fragment.rfind("</section>")
    return fragment[:end] + figures + fragment[end:] if end >= 0 else fragment + figures


def parse_overlay(spec: str | Path | tuple[str | Path, str]) -> tuple[Path, str]:
    """``RUN`` or ``RUN:LABEL`` (a path that exists is taken whole) -> (path, label)."""
    if isinstance(spec, tuple):
        path, label = Path(spec[0]), str(spec[1])
        return path, label or path.name
    text = str(spec)
    if not Path(text).exists() and ":" in text:
        head, label = text.rsplit(":", 1)
        return Path(head), label or Path(head).name
    return Path(text), Path(text).name or text


def unanalysed_runs(run_paths: Sequence[str | Path]) -> list[Path]:
    """The runs without ``metrics.json``: the report analyses them in memory."""
    return [Path(p) for p in run_paths if not (Path(p) / METRICS_JSON).is_file()]


def _read_images(directory: Path) -> dict[str, tuple[str, bytes]]:
    """The figures in ``directory`` (a run's ``figures/``), never one reached
    through a symbolic link (the directory itself or a file in it): the report
    embeds only what lies inside the run."""
    if directory.is_symlink() or not directory.is_dir():
        return {}
    found = {}
    for file in sorted(directory.iterdir()):
        if file.suffix in (".png", ".gif") and not file.name.startswith("."):
            content = _read_regular(file)
            if content is not None:
                found[file.stem] = ("image/png" if file.suffix == ".png" else "image/gif", content)
    order = {name: i for i, name in enumerate(FIGURE_ORDER)}

    def rank(name: str) -> tuple[int, int, str]:  # the analysis's, then others, then the lens's
        return (name.startswith(THEORY_PREFIX), order.get(name, len(order)), name)

    return dict(sorted(found.items(), key=lambda item: rank(item[0])))


def _read_regular(file: Path) -> bytes | None:
    """The bytes of ``file`` if it is a regular file and not a symbolic link
    (opened with ``O_NOFOLLOW``, so a link swapped in meanwhile is not followed)."""
    import stat

    try:
        fd = os.open(file, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            return None
        return handle.read()


def _figures(images: dict[str, tuple[str, bytes]]) -> str:
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


def _cell(value: Any) -> str:
    if value is None:
        return "<td class='num'>&ndash;</td>"
    if isinstance(value, bool):
        return f"<td>{value}</td>"
    if isinstance(value, int):
        return f"<td class='num'>{value}</td>"
    if isinstance(value, float):
        text = f"{value:.4g}" if abs(value) < 1e4 else f"{value:.3e}"
        return f"<td class='num'>{text}</td>"
    return f"<td>{html.escape(str(value))}</td>"


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]], scroll: bool = False) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(_cell(v) for v in row) + "</tr>" for row in rows)
    table = f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
    return f"<div class='scroll'>{table}</div>" if scroll else table


def _summary_table(metrics: dict[str, Any]) -> str:
    rows = summary_rows(metrics)
    if metrics.get("baseline"):
        return _table(["measure", "run", "baseline"], rows)
    return _table(["measure", "value"], [row[:2] for row in rows])


def _separation_table(metrics: dict[str, Any]) -> str:
    sep = metrics.get("separation")
    if not sep:
        return ""
    base = (metrics.get("baseline") or {}).get("separation")
    headers = [
        "time",
        "silhouette",
        "null mean",
        "null 2.5%",
        "null 97.5%",
        "p",
        "p corrected (best of all layers)",
        "between/within",
        "ratio null 97.5%",
    ]
    if base:
        headers += ["baseline silhouette", "baseline null 97.5%"]
    rows = []
    for i, t in enumerate(sep["time"]):
        row = [
            t,
            sep["silhouette"][i],
            sep["silhouette_null_mean"][i],
            sep["silhouette_null_low"][i],
            sep["silhouette_null_high"][i],
            sep["silhouette_p"][i],
            (sep.get("silhouette_p_corrected") or [None] * len(sep["time"]))[i],
            sep["ratio"][i],
            sep["ratio_null_high"][i],
        ]
        if base:
            same = i < len(base["silhouette"])
            row += [
                base["silhouette"][i] if same else None,
                base["silhouette_null_high"][i] if same else None,
            ]
        rows.append(row)
    permutations = sep.get("n_permutations")
    best = sep.get("best") or {}
    verdict = ""
    if best.get("silhouette_p_corrected") is not None:
        verdict = (
            f"<p><b>Categories separate: {html.escape(str(best.get('claim')))}</b> (best silhouette "
            f"{best['silhouette']:.3f} at {html.escape(str(best['time']))}; p = "
            f"{best['silhouette_p']:.3g} there, {best['silhouette_p_corrected']:.3g} corrected for "
            f"choosing the best of {len(sep['time'])} layers).</p>"
        )
    return (
        f"<h3>Separation by layer</h3>{verdict}<p class='note'>{permutations} label permutations, "
        f"seed {sep.get('seed')}.</p>" + _table(headers, rows, scroll=True)
    )


def _centroid_tables(metrics: dict[str, Any], time_name: str) -> str:
    cent = metrics.get("centroid_distances")
    if not cent:
        return ""
    names = cent["categories"]
    parts = ["<h3>Distances between category centroids</h3>"]
    for layer, matrix in cent["by_time"].items():
        rows = [[name, *values] for name, values in zip(names, matrix, strict=False)]
        parts.append(f"<p><b>{time_name} {html.escape(layer)}</b></p>" + _table(["", *names], rows))
    return "".join(parts)


def _particle_table(metrics: dict[str, Any], time_name: str) -> str:
    rows = metrics.get("particles") or []
    if not rows:
        return ""
    columns = [
        ("label", "label"),
        ("category", "category"),
        ("prompt", "prompt"),
        ("token", "last token"),
        ("spearman_pc1_time", f"Spearman(PC1, {time_name})"),
        ("fastest_relative_step", f"fastest {time_name} (relative)"),
        ("fastest_step", f"fastest {time_name} (absolute)"),
        ("split_layer", "split layer"),
        ("bifurcation_layer", "bifurcation layer"),
        ("joined", "joined"),
    ]
    present = [(key, title) for key, title in columns if any(key in row for row in rows)]
    table = _table(
        [title for _, title in present],
        [[row.get(key) for key, _ in present] for row in rows],
        scroll=True,
    )
    return f"<h3>Per prompt</h3>{table}"


def _simulation_table(metrics: dict[str, Any]) -> str:
    sim = metrics.get("simulation")
    if not isinstance(sim, dict):
        return ""
    rows = [
        [key, value if not isinstance(value, dict) else json.dumps(value)]
        for key, value in sim.items()
        if not isinstance(value, list)
    ]
    return "<h3>Simulation</h3>" + _table(["measure", "value"], rows) if rows else ""


def _describe_model(model: object) -> str:
    """``smollm2 (llama, 30 layers, d=576)`` from a run's model config."""
    if not isinstance(model, dict):
        return str(model or "")
    parts = [str(model.get(k)) for k in ("model_type",) if model.get(k)]
    if model.get("n_layers"):
        parts.append(f"{model['n_layers']} layers")
    if model.get("d_model"):
        parts.append(f"d={model['d_model']}")
    if model.get("random_weights"):
        parts.append(f"random weights, seed {model.get('seed')}")
    name = str(model.get("name", ""))
    return f"{name} ({', '.join(parts)})" if parts else name

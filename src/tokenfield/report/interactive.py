"""The interactive PCA-trajectory figure of the report (plotly).

One trace per particle (its path, hover shows the prompt), one trace of start
markers and one of labelled end points per category. Categories share a
``legendgroup``, so clicking a category in the legend hides or shows all its
prompts. A slider (and a play button) shows the paths growing up to the chosen
time step, through plotly animation frames that carry only the x/y data.
"""

from __future__ import annotations

import html
import json
import textwrap
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import xarray as xr

from tokenfield.analysis.run_analysis import display_labels

# keep the report light: beyond these, particles and frames are subsampled evenly
MAX_PARTICLES = 300
MAX_FRAMES = 60
PALETTE = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
)


def _evenly(size: int, most: int) -> np.ndarray:
    if size <= most:
        return np.arange(size)
    return np.unique(np.round(np.linspace(0, size - 1, most)).astype(int))


def even_steps(size: int, most: int) -> list[int]:
    """At most ``most`` indices of ``0 .. size-1`` one stride apart, the last one
    included: the slider's frames. Evenly saved times then get evenly spaced
    labels (0, 0.04, 0.08, ...), where rounding ``linspace`` gave uneven ones
    (0, 0.04, 0.1, 0.14, ...); only the step to the last time may be shorter."""
    if size <= most:
        return list(range(size))
    stride = -(-(size - 1) // (most - 1))  # ceil: at most `most` frames
    index = list(range(0, size, stride))
    if index[-1] != size - 1:
        index.append(size - 1)
    return index


def _padded_range(values: np.ndarray) -> list[float]:
    finite = values[np.isfinite(values)]
    if finite.size == 0:
        return [-1.0, 1.0]
    low, high = float(finite.min()), float(finite.max())
    margin = 0.05 * (high - low) or 1.0
    return [low - margin, high + margin]


#: A point is outside the bulk when it lies this many interquartile ranges beyond
#: the quartiles of the points at its own time (Tukey's "far out" fence).
FENCE = 3.0


def bulk_ranges(
    points: np.ndarray, groups: Sequence[Any] | None = None, *, fence: float = FENCE
) -> tuple[list[list[float]], np.ndarray]:
    """Axis ranges that show the bulk of the points, and which points they leave out.

    Each run drawn (``groups``: the report's run and each overlay, each with its
    generated tokens) and each time step is judged on its own: a point is an
    outlier on an axis when it lies more than ``fence`` interquartile ranges beyond
    the quartiles of its run's points at that time. So a whole run that moves
    together (the norm growing with depth, an overlay of another model elsewhere)
    stays inside the axes, while one prompt thrown far out at one layer, or two
    generated tokens, no longer squash everything else into a corner.

    Args:
        points: (time, n, axes) coordinates; NaN for missing points.
        groups: (n,) which run each point belongs to; one run when ``None``.

    Returns:
        ``(ranges, outside)``: per axis ``[low, high]`` (the bulk padded by 5%),
        and a (time, n) boolean mask of the points outside the ranges on some axis.
    """
    points = np.asarray(points, dtype=np.float64)
    finite = np.isfinite(points)
    labels = np.zeros(points.shape[1], dtype=int) if groups is None else np.asarray(groups)
    outside_axis = np.zeros(points.shape, dtype=bool)  # (time, n, axes)
    for group in np.unique(labels):
        members = labels == group
        mine = points[:, members]
        with np.errstate(invalid="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN times
            q1 = np.nanquantile(mine, 0.25, axis=1, keepdims=True)  # (time, 1, axes)
            q3 = np.nanquantile(mine, 0.75, axis=1, keepdims=True)
            # a floor, so that a time where (nearly) every point sits in one place
            # does not call its neighbours outliers
            overall = np.nanquantile(mine, 0.75, axis=(0, 1)) - np.nanquantile(
                mine, 0.25, axis=(0, 1)
            )
        floor = 0.05 * np.where(np.isfinite(overall) & (overall > 0), overall, 1.0)
        spread = np.maximum(np.nan_to_num(q3 - q1, nan=0.0), floor)
        with np.errstate(invalid="ignore"):
            far = (mine < q1 - fence * spread) | (mine > q3 + fence * spread)
        outside_axis[:, members] = finite[:, members] & far
    ranges = []
    for i in range(points.shape[-1]):
        kept = points[..., i][finite[..., i] & ~outside_axis[..., i]]
        ranges.append(_padded_range(kept if kept.size else points[..., i]))
    # a point is marked when it falls outside the final ranges on some axis
    with np.errstate(invalid="ignore"):
        outside = np.zeros(points.shape[:2], dtype=bool)
        for i, (low, high) in enumerate(ranges):
            outside |= finite[..., i] & ((points[..., i] < low) | (points[..., i] > high))
    return ranges, outside


def _hover_text(text: str, width: int = 60) -> str:
    """Prompt text made safe for a plotly hovertemplate (HTML-escaped, wrapped)."""
    text = " ".join(str(text).split())
    lines = textwrap.wrap(text, width) or [""]
    lines = [html.escape(line).replace("%{", "% {") for line in lines[:6]]
    return "<br>".join(lines)


def trajectory_figure(
    pcs: xr.DataArray,
    *,
    explained: Sequence[float] | None = None,
    time_name: str = "layer",
    title: str = "",
) -> Any:
    """Build the interactive figure.

    Args:
        pcs: (time, particle, component) with the particle coordinates
            (``category``, ``prompt``, ``label``, ``token``) when the run has them.
        explained: explained variance ratios, for the axis titles.
        time_name: "layer" for a trace, "time" for a simulation.
        title: the figure title.

    Returns:
        A ``plotly.graph_objects.Figure`` with frames and a slider.
    """
    import plotly.graph_objects as go

    if "is_final_norm" in pcs.coords:
        pcs = pcs.isel(time=~pcs["is_final_norm"].values)
    pcs = pcs.isel(particle=_evenly(pcs.sizes["particle"], MAX_PARTICLES))
    times = np.asarray(pcs["time"].values)
    frame_index = even_steps(len(times), MAX_FRAMES)
    n_components = pcs.sizes["component"]
    x = np.asarray(pcs.sel(component=1).transpose("time", "particle"), dtype=np.float32)
    y = (
        np.asarray(pcs.sel(component=2).transpose("time", "particle"), dtype=np.float32)
        if n_components > 1
        else np.zeros_like(x)
    )
    n = x.shape[1]
    labels = display_labels(pcs)
    has_category = "category" in pcs.coords
    categories = [str(c) for c in pcs["category"].values] if has_category else ["particles"] * n
    groups = sorted(set(categories))
    colour = {g: PALETTE[i % len(PALETTE)] for i, g in enumerate(groups)}
    prompts = [str(p) for p in pcs["prompt"].values] if "prompt" in pcs.coords else [""] * n
    tokens = [str(t) for t in pcs["token"].values] if "token" in pcs.coords else [""] * n
    time_text = [str(t) for t in times.tolist()]

    data = []
    seen: set[str] = set()
    for p in range(n):
        group = categories[p]
        prompt = _hover_text(prompts[p])
        token = f" (token {html.escape(repr(tokens[p]))})" if tokens[p] else ""
        hover = (
            f"<b>{html.escape(labels[p])}</b> · {html.escape(group)}{token}<br>{prompt}"
            f"<br>{time_name} %{{customdata}}<br>PC1 %{{x:.4g}}, PC2 %{{y:.4g}}<extra></extra>"
        )
        data.append(
            go.Scatter(
                x=x[:, p],
                y=y[:, p],
                customdata=time_text,
                mode="lines+markers",
                line={"color": colour[group], "width": 1.5},
                marker={"size": 3, "color": colour[group]},
                name=group,
                legendgroup=group,
                showlegend=group not in seen,
                hovertemplate=hover,
            )
        )
        seen.add(group)
    members = {g: [p for p in range(n) if categories[p] == g] for g in groups}
    for g in groups:
        data.append(
            go.Scatter(
                x=x[0, members[g]],
                y=y[0, members[g]],
                mode="markers",
                marker={"symbol": "circle-open", "size": 8, "color": colour[g]},
                legendgroup=g,
                showlegend=False,
                hoverinfo="skip",
                name=f"{g} start",
            )
        )
    end_traces = []
    for g in groups:
        end_traces.append(len(data))
        data.append(
            go.Scatter(
                x=x[-1, members[g]],
                y=y[-1, members[g]],
                mode="markers+text" if n <= 60 else "markers",
                text=[labels[p] for p in members[g]],
                textposition="top right",
                textfont={"size": 10, "color": colour[g]},
                marker={"symbol": "square", "size": 8, "color": colour[g]},
                legendgroup=g,
                showlegend=False,
                hoverinfo="skip",
                name=f"{g} end",
            )
        )
    moving = list(range(n)) + end_traces
    frames = []
    for k in frame_index:
        frame_data = [go.Scatter(x=x[: k + 1, p], y=y[: k + 1, p]) for p in range(n)]
        frame_data += [go.Scatter(x=x[k, members[g]], y=y[k, members[g]]) for g in groups]
        frames.append(go.Frame(data=frame_data, traces=moving, name=f"t{k}"))
    animate = {"mode": "immediate", "frame": {"duration": 0, "redraw": False}}
    steps = [
        {
            "method": "animate",
            "label": time_text[k],
            "args": [[f"t{k}"], {**animate, "transition": {"duration": 0}}],
        }
        for k in frame_index
    ]
    share = [f" ({r:.1%})" for r in explained[:2]] if explained is not None else ["", ""]
    share += [""] * (2 - len(share))
    layout = go.Layout(
        title={"text": html.escape(title)},
        xaxis={"title": {"text": f"PC1{share[0]}"}, "range": _padded_range(x), "zeroline": False},
        yaxis={"title": {"text": f"PC2{share[1]}"}, "range": _padded_range(y), "zeroline": False},
        hovermode="closest",
        height=620,
        legend={"title": {"text": "category (click to toggle)" if has_category else ""}},
        sliders=[
            {
                "active": len(steps) - 1,
                "currentvalue": {"prefix": f"{time_name}: "},
                "x": 0.12,
                "len": 0.88,
                "y": 0,
                "pad": {"t": 50, "b": 10},
                "steps": steps,
            }
        ],
        updatemenus=[
            {
                "type": "buttons",
                "direction": "left",
                "x": 0.11,
                "y": 0,
                "xanchor": "right",
                "yanchor": "top",
                "pad": {"t": 87, "r": 10},
                "buttons": [
                    {
                        "label": "play",
                        "method": "animate",
                        "args": [None, {**animate, "frame": {"duration": 250, "redraw": False}}],
                    },
                    {"label": "pause", "method": "animate", "args": [[None], animate]},
                ],
            }
        ],
        template="plotly_white",
    )
    return go.Figure(data=data, layout=layout, frames=frames)


# ---------------------------------------------------------------------------
# The report's trajectory views: 2-D / 3-D, two frames, overlays, generated tokens.
#
# The page carries, per run, one compact JSON payload: the hover texts once
# (shared by every view) and, per view, the traces at their last time step. A
# small script (VIEW_JS) turns a view into a plotly figure when it is shown:
# it fills the hover texts in and builds the animation frames (each path's
# prefix up to the slider's time) in the browser, so the file does not grow
# with the square of the number of layers. Only the first view is drawn when
# the page opens; the others on their first toggle.


@dataclass
class PathSet:
    """One run's paths, already in the reference frame(s).

    Attributes:
        name: legend name ("" for the report's own run: categories in the legend).
        xyz: frame key -> (time, particle, 3) coordinates.
        categories, labels, prompts: one per particle.
        text: (particle, time) hover lines (token, layer, norm, logit lens).
        generated: prompt particle -> (frame key -> (time, n_generated, 3),
            (time, n_generated) hover lines).
        note: shown in hover (e.g. "aligned by orthogonal Procrustes").
    """

    name: str
    xyz: dict[str, np.ndarray]
    categories: list[str]
    labels: list[str]
    prompts: list[str]
    text: list[list[str]]
    generated: dict[int, tuple[dict[str, np.ndarray], list[list[str]]]] = field(
        default_factory=dict
    )
    note: str = ""


def _decimals(values: np.ndarray) -> int:
    """Decimals that keep about 4 significant digits of the largest value."""
    finite = np.abs(values[np.isfinite(values)])
    scale = float(finite.max()) if finite.size else 0.0
    return int(max(0, 3 - np.floor(np.log10(scale)))) if scale > 0 else 3


def _rounded(values: np.ndarray, decimals: int) -> list[Any]:
    """Coordinates as (nested) JSON lists rounded to ``decimals``, NaN as null."""
    out = np.round(np.asarray(values, dtype=np.float64), decimals)
    if np.isfinite(out).all():
        return out.tolist()
    return np.where(np.isfinite(out), out, None).tolist()


def hover_lines(
    tokens: Sequence[str],
    times: Sequence[Any],
    norms: np.ndarray,
    lens_top: np.ndarray | None,
    lens_prob: np.ndarray | None,
    *,
    time_name: str = "layer",
    prefix: str = "",
) -> list[list[str]]:
    """The per-point hover lines: (particle, time) strings.

    ``norms`` (time, particle); ``lens_top``/``lens_prob`` (time, particle, k)
    or None.
    """
    out = []
    for p, token in enumerate(tokens):
        tok = f"token <b>{html.escape(repr(str(token)))}</b> · " if token != "" else ""
        rows = []
        for t, time in enumerate(times):
            line = f"{prefix}{tok}{time_name} {html.escape(str(time))} · norm {norms[t, p]:.4g}"
            if lens_top is not None and lens_prob is not None:
                words = [
                    f"{html.escape(repr(str(w)))} {q:.2f}"
                    for w, q in zip(lens_top[t, p], lens_prob[t, p], strict=True)
                    if str(w) != "" and np.isfinite(q)
                ]
                if words:
                    line += "<br>logit lens top-5: " + ", ".join(words)
            rows.append(line.replace("%{", "% {"))
        out.append(rows)
    return out


VIEW_LABELS = {"2d": "2-D (PC1, PC2)", "3d": "3-D (PC1, PC2, PC3)"}
FRAME_LABELS = {"raw": "joint PCA of the raw states", "sphere": "joint PCA on the unit sphere"}


def trajectory_views(
    main: PathSet,
    overlays: Sequence[PathSet] = (),
    *,
    times: Sequence[Any],
    explained: dict[str, Sequence[float]],
    time_name: str = "layer",
    title: str = "",
) -> dict[str, Any]:
    """The JSON payload of one run's interactive trajectories (see VIEW_JS).

    Args:
        main: the run's own paths; its frame keys are the frames offered.
        overlays: other runs in the same frames (legend entries of their own).
        times: the time coordinate (the slider's labels).
        explained: frame key -> explained variance ratios (axis titles).
    """
    sets = [main, *overlays]
    frame_keys = list(main.xyz)
    n_time = len(times)
    frame_index = even_steps(n_time, MAX_FRAMES)
    text_table: list[list[str]] = []
    gen_table: list[list[list[str]]] = []
    hover_ids: list[list[int]] = []
    gen_ids: list[dict[int, int]] = []
    for s in sets:
        ids = []
        for rows in s.text:
            ids.append(len(text_table))
            text_table.append(rows)
        hover_ids.append(ids)
        gids = {}
        for p, (_xyz, rows) in s.generated.items():
            gids[p] = len(gen_table)
            # each point of the continuation at time t: the prompt's last token, then the generated
            gen_table.append([[s.text[p][t], *rows[t]] for t in range(n_time)])
        gen_ids.append(gids)
    groups = sorted(set(main.categories))
    colour = {g: PALETTE[i % len(PALETTE)] for i, g in enumerate(groups)}
    for s in overlays:
        for g in sorted(set(s.categories)):
            colour.setdefault(g, PALETTE[len(colour) % len(PALETTE)])
    views = {}
    for dim in ("2d", "3d"):
        for key in frame_keys:
            views[f"{dim}-{key}"] = _view(
                sets,
                key,
                dim,
                colour,
                hover_ids,
                gen_ids,
                times=times,
                frame_index=frame_index,
                explained=explained.get(key),
                time_name=time_name,
                title=title,
            )
    return {
        "H": text_table,
        "G": gen_table,
        "views": views,
        "frames": frame_index,
        "times": [str(t) for t in times],
        "default": f"2d-{frame_keys[0]}",
        "frame_labels": {k: FRAME_LABELS.get(k, k) for k in frame_keys},
    }


def _view(
    sets: Sequence[PathSet],
    key: str,
    dim: str,
    colour: dict[str, str],
    hover_ids: list[list[int]],
    gen_ids: list[dict[int, int]],
    *,
    times: Sequence[Any],
    frame_index: list[int],
    explained: Sequence[float] | None,
    time_name: str,
    title: str,
) -> dict[str, Any]:
    three = dim == "3d"
    kind = "scatter3d" if three else "scatter"
    axes = ("x", "y", "z") if three else ("x", "y")
    last = len(times) - 1
    data: list[dict[str, Any]] = []
    moving: list[int] = []
    gen_points: dict[str, list[Any]] = {}
    # The axes show the bulk of every point drawn (paths, generated tokens,
    # overlays), judged time by time; the few points beyond it are marked at the
    # edge (see bulk_ranges). who: what each pooled point is, for its hover.
    pooled, who = [], []
    for number, s in enumerate(sets):
        pooled.append(s.xyz[key])
        who += [(number, p, 0) for p in range(s.xyz[key].shape[1])]
        for p, (xyz, _rows) in s.generated.items():
            pooled.append(xyz[key])
            who += [(number, p, j + 1) for j in range(xyz[key].shape[1])]
    every_point = np.concatenate(pooled, axis=1)  # (time, all points, 3)
    n_axes = len(axes)
    ranges, outside = bulk_ranges(every_point[..., :n_axes], [run for run, _, _ in who])

    # one rounding for the whole view, so that shared points stay equal
    decimals = _decimals(every_point.ravel())

    def coords(xyz: np.ndarray) -> dict[str, Any]:
        return {a: _rounded(xyz[..., i], decimals) for i, a in enumerate(axes)}

    for number, s in enumerate(sets):
        overlay = number > 0
        group_of = [f"overlay-{number}" if overlay else c for c in s.categories]
        prompts = [_hover_text(p) for p in s.prompts]
        head = f"[{html.escape(s.name)}] " if overlay else ""
        note = f"<br><i>{html.escape(s.note)}</i>" if s.note else ""
        seen: set[str] = set()
        paths_of: dict[str, list[int]] = {}
        for p, category in enumerate(s.categories):
            group = group_of[p]
            first = group not in seen
            seen.add(group)
            index = len(data)
            paths_of.setdefault(category, []).append(index)
            line: dict[str, Any] = {"color": colour[category], "width": 4 if three else 1.5}
            if overlay:
                line["dash"] = "dash"
            data.append(
                {
                    "type": kind,
                    **coords(s.xyz[key][:, p]),
                    "mode": "lines+markers",
                    "line": line,
                    "marker": {"size": 2 if three else 3, "color": colour[category]},
                    "opacity": 0.75 if overlay else 1.0,
                    "name": s.name if overlay else category,
                    "legendgroup": group,
                    "showlegend": first,
                    "meta": {"kind": "path", "h": hover_ids[number][p]},
                    "hovertemplate": f"{head}<b>{html.escape(s.labels[p])}</b> · "
                    f"{html.escape(category)}<br>{prompts[p]}<br>%{{text}}{note}<extra></extra>",
                }
            )
            moving.append(index)
        if not overlay:  # start markers (they do not move)
            for g in sorted(paths_of):
                members = [i for i, c in enumerate(s.categories) if c == g]
                data.append(
                    {
                        "type": kind,
                        **coords(s.xyz[key][0, members]),
                        "mode": "markers",
                        "marker": {
                            "symbol": "circle-open",
                            "size": 4 if three else 8,
                            "color": colour[g],
                        },
                        "legendgroup": g,
                        "showlegend": False,
                        "hoverinfo": "skip",
                        "name": f"{g} start",
                    }
                )
        for g in sorted(paths_of):
            members = [i for i, c in enumerate(s.categories) if c == g]
            index = len(data)
            data.append(
                {
                    "type": kind,
                    **coords(s.xyz[key][last, members]),
                    "mode": "markers+text"
                    if len(s.categories) <= 60 and not overlay
                    else "markers",
                    "text": [s.labels[i] for i in members],
                    "textposition": "top right",
                    "textfont": {"size": 10, "color": colour[g]},
                    "marker": {
                        "symbol": ("diamond" if overlay else "square"),
                        "size": 4 if three else 8,
                        "color": colour[g],
                    },
                    "legendgroup": f"overlay-{number}" if overlay else g,
                    "showlegend": False,
                    "hoverinfo": "skip",
                    "name": f"{s.name or g} end",
                    "meta": {"kind": "ends", "src": paths_of[g]},
                }
            )
            moving.append(index)
        for p, (xyz, _rows) in s.generated.items():
            gi = gen_ids[number][p]
            # (time, 1 + n_generated, 3): the prompt's last token, then its continuation
            points = np.concatenate([s.xyz[key][:, p : p + 1], xyz[key]], axis=1)
            gen_points[str(gi)] = [coords(points[t]) for t in range(len(times))]
            group = f"overlay-{number}" if overlay else f"generated-{number}"
            first = group not in {d.get("legendgroup") for d in data}
            index = len(data)
            category = s.categories[p]
            data.append(
                {
                    "type": kind,
                    **coords(points[last]),
                    "mode": "lines+markers",
                    "line": {
                        "color": colour[category],
                        "width": 3 if three else 1.5,
                        "dash": "dot",
                    },
                    "marker": {
                        "size": 3 if three else 6,
                        "symbol": "diamond-open" if not three else "diamond",
                        "color": colour[category],
                    },
                    "name": s.name if overlay else "generated tokens",
                    "legendgroup": group,
                    "showlegend": first,
                    "meta": {"kind": "gen", "g": gi},
                    "hovertemplate": f"{head}<b>{html.escape(s.labels[p])}</b> · "
                    f"{html.escape(category)} · continuation<br>{prompts[p]}<br>%{{text}}"
                    f"{note}<extra></extra>",
                }
            )
            moving.append(index)
    share = ([f" ({r:.1%})" for r in list(explained)[:3]] if explained is not None else []) + [
        ""
    ] * 3
    if outside.any():
        data.append(
            _outside_trace(
                every_point[..., :n_axes], outside, ranges, who, sets, times, axes, time_name
            )
        )
    redraw = three
    animate = {"mode": "immediate", "frame": {"duration": 0, "redraw": redraw}}
    steps = [
        {
            "method": "animate",
            "label": str(times[k]),
            "args": [[f"t{k}"], {**animate, "transition": {"duration": 0}}],
        }
        for k in frame_index
    ]
    layout: dict[str, Any] = {
        "title": {"text": html.escape(title)},
        "hovermode": "closest",
        "height": 620,
        "legend": {"title": {"text": "click to toggle"}},
        "template": "plotly_white",
        "sliders": [
            {
                "active": len(steps) - 1,
                "currentvalue": {"prefix": f"{time_name}: "},
                "x": 0.12,
                "len": 0.88,
                "y": 0,
                "pad": {"t": 50, "b": 10},
                "steps": steps,
            }
        ],
        "updatemenus": [
            {
                "type": "buttons",
                "direction": "left",
                "x": 0.11,
                "y": 0,
                "xanchor": "right",
                "yanchor": "top",
                "pad": {"t": 87, "r": 10},
                "buttons": [
                    {
                        "label": "play",
                        "method": "animate",
                        "args": [None, {**animate, "frame": {"duration": 250, "redraw": redraw}}],
                    },
                    {"label": "pause", "method": "animate", "args": [[None], animate]},
                ],
            }
        ],
    }
    if three:
        layout["scene"] = {
            f"{a}axis": {"title": {"text": f"PC{i + 1}{share[i]}"}, "range": ranges[i]}
            for i, a in enumerate(axes)
        }
        layout["scene"]["aspectmode"] = "cube"
        # plotly's default camera (eye at 1.25, 1.25, 1.25) puts the box's near
        # corner and the axis titles below the scene, under the slider: step back.
        layout["scene"]["camera"] = {"eye": {"x": 1.6, "y": 1.6, "z": 1.15}}
    else:
        for i, a in enumerate(axes):
            layout[f"{a}axis"] = {
                "title": {"text": f"PC{i + 1}{share[i]}"},
                "range": ranges[i],
                "zeroline": False,
            }
    return {"data": data, "layout": layout, "moving": moving, "gen": gen_points}


def _outside_trace(
    points: np.ndarray,
    outside: np.ndarray,
    ranges: list[list[float]],
    who: list[tuple[int, int, int]],
    sets: Sequence[PathSet],
    times: Sequence[Any],
    axes: Sequence[str],
    time_name: str,
) -> dict[str, Any]:
    """The points beyond the axes, drawn as grey crosses at the edge they lie past,
    with their real coordinates in the hover; one legend entry that counts them."""
    t_index, n_index = np.nonzero(outside)
    coords = points[t_index, n_index]  # (k, axes)
    clamped = coords.copy()
    hover = []
    for i, (low, high) in enumerate(ranges):
        inset = 0.5 * 0.05 / 1.1 * (high - low)  # halfway into the padding
        clamped[:, i] = np.clip(clamped[:, i], low + inset, high - inset)
    for (t, n), xyz in zip(zip(t_index, n_index, strict=True), coords, strict=True):
        number, p, generated = who[n]
        s = sets[number]
        head = f"[{html.escape(s.name)}] " if number > 0 else ""
        what = f" · generated token {generated}" if generated else ""
        where = ", ".join(
            f"PC{i + 1} {v:.4g}" for i, v in enumerate(xyz.tolist()) if np.isfinite(v)
        )
        hover.append(
            f"{head}<b>{html.escape(s.labels[p])}</b> · {html.escape(s.categories[p])}{what}"
            f"<br>{time_name} {html.escape(str(times[t]))}: outside the axes, at {where}"
        )
    three = len(axes) == 3
    count = len(hover)
    return {
        "type": "scatter3d" if three else "scatter",
        **{a: np.round(clamped[:, i], 6).tolist() for i, a in enumerate(axes)},
        "mode": "markers",
        "marker": {"symbol": "x", "size": 4 if three else 9, "color": "#444444"},
        "name": f"{count} point{'s' if count != 1 else ''} outside the axes (x, at the edge)",
        "legendgroup": "outside",
        "showlegend": True,
        "text": hover,
        "hovertemplate": "%{text}<extra></extra>",
        "meta": {"kind": "outside"},
    }


START_JS = """
document.querySelectorAll('.tokenfield-views').forEach(function (div) { tokenfieldShow(div.id); });
document.querySelectorAll('.tokenfield-figure').forEach(function (div) {
  var fig = JSON.parse(document.getElementById(div.id + '-data').textContent);
  fig.config = {displaylogo: false, responsive: true};
  Plotly.newPlot(div, fig);
});
"""
VIEW_JS = r"""
(function () {
  function frameData(fig, view, run, j, k) {
    var t = fig.data[j], m = t.meta || {}, three = t.type === 'scatter3d', o = {};
    var axes = three ? ['x', 'y', 'z'] : ['x', 'y'];
    if (m.kind === 'path') {
      axes.forEach(function (a) { o[a] = t[a].slice(0, k + 1); });
    } else if (m.kind === 'ends') {
      axes.forEach(function (a) { o[a] = m.src.map(function (s) { return fig.data[s][a][k]; }); });
    } else if (m.kind === 'gen') {
      var pts = view.gen[String(m.g)][k];
      axes.forEach(function (a) { o[a] = pts[a]; });
      o.text = run.G[m.g][k];
    }
    return o;
  }
  function build(run, key) {
    var view = run.views[key];
    var fig = {data: JSON.parse(JSON.stringify(view.data)), layout: view.layout};
    var last = run.times.length - 1;
    fig.data.forEach(function (t) {
      var m = t.meta || {};
      if (m.kind === 'path') t.text = run.H[m.h];
      if (m.kind === 'gen') t.text = run.G[m.g][last];
    });
    fig.frames = run.frames.map(function (k) {
      return {name: 't' + k, traces: view.moving,
              data: view.moving.map(function (j) { return frameData(fig, view, run, j, k); })};
    });
    return fig;
  }
  window.tokenfieldRuns = {};
  window.tokenfieldShow = function (id) {
    var run = window.tokenfieldRuns[id];
    if (!run) {
      var source = document.getElementById(id + '-data');
      run = window.tokenfieldRuns[id] = JSON.parse(source.textContent);
    }
    var div = document.getElementById(id);
    var controls = document.querySelectorAll('[data-plot="' + id + '"]');
    var state = {dim: '2d', frame: run.default.split('-')[1]};
    controls.forEach(function (c) { if (c.checked) state[c.name.split(':')[0]] = c.value; });
    var key = state.dim + '-' + state.frame;
    if (div.dataset.view === key) return;
    if (div.dataset.view) Plotly.purge(div);
    div.dataset.view = key;
    var fig = build(run, key);
    Plotly.newPlot(div, fig.data, fig.layout, {displaylogo: false, responsive: true})
      .then(function () { return Plotly.addFrames(div, fig.frames); });
  };
})();
"""


def views_html(payload: dict[str, Any], div_id: str, *, show_frames: bool = True) -> str:
    """The controls, the plot's div and the payload of one run's trajectory views."""
    frame_labels = payload["frame_labels"]
    default_frame = payload["default"].split("-", 1)[1]
    radios = [
        f'<label><input type="radio" name="dim:{div_id}" value="{dim}" data-plot="{div_id}"'
        f"{' checked' if dim == '2d' else ''} onchange=\"tokenfieldShow('{div_id}')\"> "
        f"{label}</label>"
        for dim, label in VIEW_LABELS.items()
    ]
    if show_frames and len(frame_labels) > 1:
        radios.append("<span class='sep'>|</span>")
        radios += [
            f'<label><input type="radio" name="frame:{div_id}" value="{key}" data-plot="{div_id}"'
            f"{' checked' if key == default_frame else ''} onchange=\"tokenfieldShow('{div_id}')\"> "
            f"{html.escape(label)}</label>"
            for key, label in frame_labels.items()
        ]
    data = json.dumps(payload, separators=(",", ":"), allow_nan=False).replace("</", "<\\/")
    # drawn by the page's closing script (VIEW_JS and plotly.js come last, so the
    # text paints before the scripts are parsed)
    return (
        f"<div class='views'>{' '.join(radios)}</div>"
        f'<div id="{div_id}" class="plotly-graph-div tokenfield-views" '
        f'style="height:620px; width:100%;"></div>'
        f'<script type="application/json" id="{div_id}-data">{data}</script>'
    )


# ---------------------------------------------------------------------------
# A simulated run: its particles on the sphere, its energy and cluster count.

MAX_SIM_FRAMES = 80


def simulation_figures(
    states: np.ndarray, times: Sequence[float], analysis: dict[str, Any] | None
) -> list[dict[str, Any]]:
    """Plotly figures (as JSON data) for a simulated run.

    Args:
        states: (time, particle, d) on the unit sphere.
        times: the ODE times.
        analysis: :func:`tokenfield.analysis.simulation.analyze_simulation`'s
            result (energy and cluster count against time), or None.

    Returns:
        d = 2: each particle's angle on the circle against time; d = 3: the
        particles on the sphere in 3-D with a time slider and a play button;
        then the energy and the cluster count against time.
    """
    n_time, n, d = states.shape
    keep = _evenly(n, MAX_PARTICLES)
    states = states[:, keep]
    n = states.shape[1]
    times = np.asarray(times, dtype=np.float64)
    figures = []
    colours = [PALETTE[i % len(PALETTE)] for i in range(n)]
    if d == 2:
        angle = np.arctan2(states[..., 1], states[..., 0])  # (time, particle)
        figures.append(
            {
                "data": [
                    {
                        "type": "scatter",
                        "x": _rounded(np.repeat(times, n), 4),
                        "y": _rounded(angle.ravel(), 4),
                        "mode": "markers",
                        "marker": {
                            "size": 3,
                            "color": np.tile(np.arange(n), n_time).tolist(),
                            "colorscale": "Turbo",
                        },
                        "customdata": np.tile(np.arange(n), n_time).tolist(),
                        "hovertemplate": "particle %{customdata}<br>t %{x}<br>angle %{y:.3f}"
                        "<extra></extra>",
                        "name": "particles",
                    }
                ],
                "layout": {
                    "title": {"text": "d = 2: each particle's angle on the circle against time"},
                    "xaxis": {"title": {"text": "time t"}},
                    "yaxis": {"title": {"text": "angle (rad)"}, "range": [-3.3, 3.3]},
                    "height": 420,
                    "template": "plotly_white",
                    "showlegend": False,
                },
            }
        )
    elif d == 3:
        frame_index = even_steps(n_time, MAX_SIM_FRAMES)
        u, v = np.meshgrid(np.linspace(0, 2 * np.pi, 25), np.linspace(0, np.pi, 13))
        sphere = {
            "type": "surface",
            "x": _rounded(np.cos(u) * np.sin(v), 3),
            "y": _rounded(np.sin(u) * np.sin(v), 3),
            "z": _rounded(np.cos(v), 3),
            "opacity": 0.15,
            "showscale": False,
            "colorscale": [[0, "#bbbbbb"], [1, "#bbbbbb"]],
            "hoverinfo": "skip",
            "name": "sphere",
        }
        last = frame_index[-1]

        def points(k: int) -> dict[str, Any]:
            return {a: _rounded(states[k, :, i], 4) for i, a in enumerate("xyz")}

        animate = {"mode": "immediate", "frame": {"duration": 0, "redraw": True}}
        figures.append(
            {
                "data": [
                    sphere,
                    {
                        "type": "scatter3d",
                        **points(last),
                        "mode": "markers",
                        "marker": {"size": 4, "color": colours},
                        "customdata": list(range(n)),
                        "hovertemplate": "particle %{customdata}<extra></extra>",
                        "name": "particles",
                    },
                ],
                "frames": [
                    {"name": f"s{k}", "traces": [1], "data": [points(k)]} for k in frame_index
                ],
                "layout": {
                    "title": {"text": "d = 3: the particles on the sphere"},
                    "height": 560,
                    "showlegend": False,
                    "scene": {
                        "aspectmode": "cube",
                        **{f"{a}axis": {"range": [-1.1, 1.1]} for a in "xyz"},
                    },
                    "sliders": [
                        {
                            "active": len(frame_index) - 1,
                            "currentvalue": {"prefix": "time: "},
                            "x": 0.12,
                            "len": 0.88,
                            "steps": [
                                {
                                    "method": "animate",
                                    "label": f"{times[k]:.4g}",
                                    "args": [[f"s{k}"], {**animate, "transition": {"duration": 0}}],
                                }
                                for k in frame_index
                            ],
                        }
                    ],
                    "updatemenus": [
                        {
                            "type": "buttons",
                            "direction": "left",
                            "x": 0.11,
                            "y": 0,
                            "xanchor": "right",
                            "yanchor": "top",
                            "pad": {"t": 60, "r": 10},
                            "buttons": [
                                {
                                    "label": "play",
                                    "method": "animate",
                                    "args": [
                                        None,
                                        {**animate, "frame": {"duration": 120, "redraw": True}},
                                    ],
                                },
                                {"label": "pause", "method": "animate", "args": [[None], animate]},
                            ],
                        }
                    ],
                },
            }
        )
    if analysis and analysis.get("time"):
        t = analysis["time"]
        figures.append(
            {
                "data": [
                    {
                        "type": "scatter",
                        "x": t,
                        "y": analysis.get("energy"),
                        "mode": "lines",
                        "name": "energy",
                        "yaxis": "y",
                    },
                    {
                        "type": "scatter",
                        "x": t,
                        "y": analysis.get("cluster_count"),
                        "mode": "lines",
                        "line": {"shape": "hv"},
                        "name": "clusters",
                        "xaxis": "x2",
                        "yaxis": "y2",
                    },
                ],
                "layout": {
                    "title": {"text": "Energy and cluster count against time"},
                    "grid": {"rows": 1, "columns": 2, "pattern": "independent"},
                    "xaxis": {"title": {"text": "time t"}},
                    "yaxis": {
                        "title": {"text": f"energy ({analysis.get('energy_normalization', '')})"}
                    },
                    "xaxis2": {"title": {"text": "time t"}},
                    "yaxis2": {
                        "title": {"text": f"clusters (eps {analysis.get('eps')})"},
                        "rangemode": "tozero",
                    },
                    "height": 380,
                    "template": "plotly_white",
                    "showlegend": False,
                },
            }
        )
    return figures


def figure_html(figure: dict[str, Any], div_id: str, height: int = 420) -> str:
    """A plotly figure (JSON data) drawn by the page's closing script."""
    data = json.dumps(figure, separators=(",", ":"), allow_nan=False).replace("</", "<\\/")
    height = int(figure.get("layout", {}).get("height", height))
    return (
        f'<div id="{div_id}" class="tokenfield-figure" style="height:{height}px; width:100%;">'
        f'</div><script type="application/json" id="{div_id}-data">{data}</script>'
    )

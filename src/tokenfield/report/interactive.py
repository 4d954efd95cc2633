"""The interactive PCA-trajectory figure (plotly) and what the report's views share
with it: subsampling, axis ranges that show the bulk, hover text, the slider.

One trace per particle (its path, hover shows the prompt), one trace of start
markers and one of labelled end points per category. Categories share a
``legendgroup``, so clicking a category in the legend hides or shows all its
prompts. A slider (and a play button) shows the paths growing up to the chosen
time step, through plotly animation frames that carry only the x/y data.
"""

from __future__ import annotations

import html
import textwrap
import warnings
from collections.abc import Sequence
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


def evenly(size: int, most: int) -> np.ndarray:
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


def hover_text(text: str, width: int = 60) -> str:
    """Prompt text made safe for a plotly hovertemplate (HTML-escaped, wrapped)."""
    text = " ".join(str(text).split())
    lines = textwrap.wrap(text, width) or [""]
    lines = [html.escape(line).replace("%{", "% {") for line in lines[:6]]
    return "<br>".join(lines)


def animation_controls(
    frames: Sequence[tuple[str, str]],
    *,
    prefix: str,
    redraw: bool,
    play_ms: int,
    compact: bool = False,
) -> dict[str, list[dict[str, Any]]]:
    """The layout's ``sliders`` and ``updatemenus``: a slider over the animation
    frames (``(label, frame name)`` pairs, the last one active) and play / pause.

    ``compact``: the slider at plotly's default place (a figure without a legend
    below it), the buttons closer to the plot.
    """
    animate = {"mode": "immediate", "frame": {"duration": 0, "redraw": redraw}}
    slider: dict[str, Any] = {
        "active": len(frames) - 1,
        "currentvalue": {"prefix": prefix},
        "x": 0.12,
        "len": 0.88,
    }
    if not compact:
        slider |= {"y": 0, "pad": {"t": 50, "b": 10}}
    slider["steps"] = [
        {
            "method": "animate",
            "label": label,
            "args": [[name], {**animate, "transition": {"duration": 0}}],
        }
        for label, name in frames
    ]
    menu = {
        "type": "buttons",
        "direction": "left",
        "x": 0.11,
        "y": 0,
        "xanchor": "right",
        "yanchor": "top",
        "pad": {"t": 60 if compact else 87, "r": 10},
        "buttons": [
            {
                "label": "play",
                "method": "animate",
                "args": [None, {**animate, "frame": {"duration": play_ms, "redraw": redraw}}],
            },
            {"label": "pause", "method": "animate", "args": [[None], animate]},
        ],
    }
    return {"sliders": [slider], "updatemenus": [menu]}


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

    Example:
        >>> from tokenfield.report import trajectory_figure
        >>> analysis = tf.analyze(tf.open_run("runs/categories"))         # doctest: +SKIP
        >>> fig = trajectory_figure(analysis.pcs, title="categories")     # doctest: +SKIP
    """
    import plotly.graph_objects as go

    if "is_final_norm" in pcs.coords:
        pcs = pcs.isel(time=~pcs["is_final_norm"].values)
    pcs = pcs.isel(particle=evenly(pcs.sizes["particle"], MAX_PARTICLES))
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
        prompt = hover_text(prompts[p])
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
    share = [f" ({r:.1%})" for r in explained[:2]] if explained is not None else ["", ""]
    share += [""] * (2 - len(share))
    layout = go.Layout(
        title={"text": html.escape(title)},
        xaxis={"title": {"text": f"PC1{share[0]}"}, "range": _padded_range(x), "zeroline": False},
        yaxis={"title": {"text": f"PC2{share[1]}"}, "range": _padded_range(y), "zeroline": False},
        hovermode="closest",
        height=620,
        legend={"title": {"text": "category (click to toggle)" if has_category else ""}},
        **animation_controls(
            [(time_text[k], f"t{k}") for k in frame_index],
            prefix=f"{time_name}: ",
            redraw=False,
            play_ms=250,
        ),
        template="plotly_white",
    )
    return go.Figure(data=data, layout=layout, frames=frames)

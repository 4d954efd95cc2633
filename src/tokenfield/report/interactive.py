"""The interactive PCA-trajectory figure of the report (plotly).

One trace per particle (its path, hover shows the prompt), one trace of start
markers and one of labelled end points per category. Categories share a
``legendgroup``, so clicking a category in the legend hides or shows all its
prompts. A slider (and a play button) shows the paths growing up to the chosen
time step, through plotly animation frames that carry only the x/y data.
"""

from __future__ import annotations

import html
import textwrap
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


def _evenly(size: int, most: int) -> np.ndarray:
    if size <= most:
        return np.arange(size)
    return np.unique(np.round(np.linspace(0, size - 1, most)).astype(int))


def _padded_range(values: np.ndarray) -> list[float]:
    finite = values[np.isfinite(values)]
    if finite.size == 0:
        return [-1.0, 1.0]
    low, high = float(finite.min()), float(finite.max())
    margin = 0.05 * (high - low) or 1.0
    return [low - margin, high + margin]


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
    frame_index = _evenly(len(times), MAX_FRAMES)
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

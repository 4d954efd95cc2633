"""A simulated run in the report: its particles on the circle or the sphere, its
energy and cluster count against time (plotly figures as JSON data)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np

from tokenfield.report.interactive import (
    MAX_PARTICLES,
    PALETTE,
    animation_controls,
    even_steps,
    evenly,
)
from tokenfield.report.views import rounded

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
    keep = evenly(n, MAX_PARTICLES)
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
                        "x": rounded(np.repeat(times, n), 4),
                        "y": rounded(angle.ravel(), 4),
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
            "x": rounded(np.cos(u) * np.sin(v), 3),
            "y": rounded(np.sin(u) * np.sin(v), 3),
            "z": rounded(np.cos(v), 3),
            "opacity": 0.15,
            "showscale": False,
            "colorscale": [[0, "#bbbbbb"], [1, "#bbbbbb"]],
            "hoverinfo": "skip",
            "name": "sphere",
        }
        last = frame_index[-1]

        def points(k: int) -> dict[str, Any]:
            return {a: rounded(states[k, :, i], 4) for i, a in enumerate("xyz")}

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
                    **animation_controls(
                        [(f"{times[k]:.4g}", f"s{k}") for k in frame_index],
                        prefix="time: ",
                        redraw=True,
                        play_ms=120,
                        compact=True,
                    ),
                },
            }
        )
    energy = energy_figure(analysis)
    if energy is not None:
        figures.append(energy)
    return figures


def energy_figure(analysis: dict[str, Any] | None) -> dict[str, Any] | None:
    """The energy and the cluster count against time (plotly JSON data), from
    :func:`~tokenfield.analysis.simulation.analyze_simulation`'s result; None
    when it has no times."""
    if not analysis or not analysis.get("time"):
        return None
    t = analysis["time"]
    return {
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
            "yaxis": {"title": {"text": f"energy ({analysis.get('energy_normalization', '')})"}},
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


def figure_html(figure: dict[str, Any], div_id: str, height: int = 420) -> str:
    """A plotly figure (JSON data) drawn by the page's closing script."""
    data = json.dumps(figure, separators=(",", ":"), allow_nan=False).replace("</", "<\\/")
    height = int(figure.get("layout", {}).get("height", height))
    return (
        f'<div id="{div_id}" class="tokenfield-figure" style="height:{height}px; width:100%;">'
        f'</div><script type="application/json" id="{div_id}-data">{data}</script>'
    )

"""The report's interactive trajectory views: 2-D / 3-D, two frames, overlays,
generated tokens.

The page carries, per run, one compact JSON payload: the hover texts once
(shared by every view) and, per view, the traces at their last time step. A
small script (``assets/views.js``) turns a view into a plotly figure when it is
shown: it fills the hover texts in and builds the animation frames (each path's
prefix up to the slider's time) in the browser, so the file does not grow with
the square of the number of layers. Only the first view is drawn when the page
opens (``assets/start.js``); the others on their first toggle.
"""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import numpy as np

from tokenfield.report.interactive import (
    MAX_FRAMES,
    PALETTE,
    animation_controls,
    bulk_ranges,
    even_steps,
    hover_text,
)

#: The page's closing script, in the order it runs (files in ``report/assets``).
SCRIPTS = ("views.js", "start.js")


def page_script() -> str:
    """The JavaScript that draws the views and figures (read from the package)."""
    folder = resources.files("tokenfield.report") / "assets"
    return "".join("\n" + (folder / name).read_text(encoding="utf-8") for name in SCRIPTS)


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


def rounded(values: np.ndarray, decimals: int) -> list[Any]:
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
    """The JSON payload of one run's interactive trajectories (drawn by ``assets/views.js``).

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
        return {a: rounded(xyz[..., i], decimals) for i, a in enumerate(axes)}

    for number, s in enumerate(sets):
        overlay = number > 0
        group_of = [f"overlay-{number}" if overlay else c for c in s.categories]
        prompts = [hover_text(p) for p in s.prompts]
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
    layout: dict[str, Any] = {
        "title": {"text": html.escape(title)},
        "hovermode": "closest",
        "height": 620,
        "legend": {"title": {"text": "click to toggle"}},
        "template": "plotly_white",
        **animation_controls(
            [(str(times[k]), f"t{k}") for k in frame_index],
            prefix=f"{time_name}: ",
            redraw=three,
            play_ms=250,
        ),
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
    # drawn by the page's closing script (``views.js`` and plotly.js come last, so the
    # text paints before the scripts are parsed)
    return (
        f"<div class='views'>{' '.join(radios)}</div>"
        f'<div id="{div_id}" class="plotly-graph-div tokenfield-views" '
        f'style="height:620px; width:100%;"></div>'
        f'<script type="application/json" id="{div_id}-data">{data}</script>'
    )

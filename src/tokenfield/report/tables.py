"""The report's tables, from a run's typed metrics (:class:`~tokenfield.analysis.metrics.Metrics`)."""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from typing import Any

from tokenfield.analysis.metrics import Metrics, summary_rows


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


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], scroll: bool = False) -> str:
    """An HTML table (numbers right-aligned, None as a dash)."""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(_cell(v) for v in row) + "</tr>" for row in rows)
    out = f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
    return f"<div class='scroll'>{out}</div>" if scroll else out


def summary_table(metrics: Metrics) -> str:
    rows = summary_rows(metrics)
    if metrics.baseline:
        return table(["measure", "run", "baseline"], rows)
    return table(["measure", "value"], [row[:2] for row in rows])


def separation_table(metrics: Metrics) -> str:
    sep = metrics.separation
    if not sep:
        return ""
    base = metrics.baseline.separation if metrics.baseline else None
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
    corrected = sep.silhouette_p_corrected or [None] * len(sep.time)
    rows = []
    for i, t in enumerate(sep.time):
        row = [
            t,
            sep.silhouette[i],
            sep.silhouette_null_mean[i],
            sep.silhouette_null_low[i],
            sep.silhouette_null_high[i],
            sep.silhouette_p[i],
            corrected[i],
            sep.ratio[i],
            sep.ratio_null_high[i],
        ]
        if base:
            same = i < len(base.silhouette)
            row += [
                base.silhouette[i] if same else None,
                base.silhouette_null_high[i] if same else None,
            ]
        rows.append(row)
    best = sep.best
    verdict = ""
    if best.silhouette_p_corrected is not None:
        verdict = (
            f"<p><b>Categories separate: {html.escape(str(best.claim))}</b> (best silhouette "
            f"{best.silhouette:.3f} at {html.escape(str(best.time))}; p = "
            f"{best.silhouette_p:.3g} there, {best.silhouette_p_corrected:.3g} corrected for "
            f"choosing the best of {len(sep.time)} layers).</p>"
        )
    return (
        f"<h3>Separation by layer</h3>{verdict}<p class='note'>{sep.n_permutations} label "
        f"permutations, seed {sep.seed}.</p>" + table(headers, rows, scroll=True)
    )


def centroid_tables(metrics: Metrics, time_name: str) -> str:
    cent = metrics.centroid_distances
    if not cent:
        return ""
    names = cent.categories
    parts = ["<h3>Distances between category centroids</h3>"]
    for layer, matrix in cent.by_time.items():
        rows = [[name, *values] for name, values in zip(names, matrix, strict=False)]
        parts.append(f"<p><b>{time_name} {html.escape(layer)}</b></p>" + table(["", *names], rows))
    return "".join(parts)


PARTICLE_TITLES = (
    ("label", "label"),
    ("category", "category"),
    ("prompt", "prompt"),
    ("token", "last token"),
    ("spearman_pc1_time", "Spearman(PC1, {time})"),
    ("fastest_relative_step", "fastest {time} (relative)"),
    ("fastest_step", "fastest {time} (absolute)"),
    ("split_layer", "split layer"),
    ("bifurcation_layer", "bifurcation layer"),
    ("joined", "joined"),
)


def particle_table(metrics: Metrics, time_name: str) -> str:
    rows = metrics.particles
    if not rows:
        return ""
    present = [
        (key, title.format(time=time_name))
        for key, title in PARTICLE_TITLES
        if any(key in row for row in rows)
    ]
    out = table(
        [title for _, title in present],
        [[row.get(key) for key, _ in present] for row in rows],
        scroll=True,
    )
    return f"<h3>Per prompt</h3>{out}"


def simulation_table(metrics: Metrics) -> str:
    sim = metrics.simulation
    if not isinstance(sim, dict):
        return ""
    rows = [
        [key, value if not isinstance(value, dict) else json.dumps(value)]
        for key, value in sim.items()
        if not isinstance(value, list)
    ]
    return "<h3>Simulation</h3>" + table(["measure", "value"], rows) if rows else ""


def describe_model(model: object) -> str:
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

"""An HTML section for the report from ``hypotheses.json`` (``tokenfield hypotheses``).

:func:`hypotheses_html_section` takes the JSON data (never computes) and returns two
escaped tables: the order panel (slope, interval, R^2, monotone fraction and verdict,
with the random copy's verdict beside) and, per layer, the share of heads passing the
convex-fit test and the next-token embedding's cosine and median rank.
:func:`tokenfield.pipelines.hypotheses.write_hypotheses` writes it as
``RUN/hypotheses.html``, a fragment for ``tokenfield report --section`` (as the theory
lens's ``RUN/theory.html``).
"""

from __future__ import annotations

import html
import math
from typing import Any

__all__ = ["hypotheses_html_section"]


def _fmt(value: Any, spec: str) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    return format(value, spec)


def _table(css_class: str, head: tuple[str, ...], rows: list[tuple[Any, ...]]) -> str:
    """One escaped HTML table: a header row, then a row per tuple of cells."""
    return (
        f"<table class='{css_class}'><tr>"
        + "".join(f"<th>{html.escape(h)}</th>" for h in head)
        + "</tr>"
        + "".join(
            "<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>"
            for cells in rows
        )
        + "</table>"
    )


def hypotheses_html_section(data: dict[str, Any]) -> str:
    """Two HTML tables summarising ``hypotheses.json``."""
    base = data.get("baseline") or {}
    rows = []
    for name, row in data["order"].items():
        other = (base.get("order") or {}).get(name, {})
        low, high = row["slope_ci"]
        cells = (
            name,
            _fmt(row["slope"], "+.4f"),
            f"[{_fmt(low, '+.4f')}, {_fmt(high, '+.4f')}]",
            _fmt(row["r2"], ".2f"),
            _fmt(row["monotone_fraction"], ".2f"),
            row["verdict"],
            other.get("verdict", ""),
        )
        rows.append(cells)
    head = ("quantity", "slope", "95 % interval", "R^2", "monotone", "verdict", "random copy")
    order = _table("hypotheses-order", head, rows)
    fit = data["convex_fit"]["targets"]["next_embedding"]
    base_fit = ((base.get("convex_fit") or {}).get("targets") or {}).get("next_embedding") or []
    nxt = data["next_embedding"]
    layer_rows = []
    for layer, summary in enumerate(fit):
        cells = (
            layer,
            _fmt(summary["share_passing"], ".2f"),
            _fmt(base_fit[layer]["share_passing"], ".2f") if layer < len(base_fit) else "",
            _fmt(summary["median_gap"], ".3g"),
            _fmt(summary["median_gap_uniform"], ".3g"),
            _fmt(nxt["cosine"][layer + 1], ".3f"),
            _fmt(nxt["median_rank_cosine"][layer + 1], ".0f"),
        )
        layer_rows.append(cells)
    head2 = ("layer", "heads passing", "random copy", "median Q", "Q uniform",
             "cos(x, e_next) after", "median rank")  # fmt: skip
    layers = _table("hypotheses-layers", head2, layer_rows)
    rule = html.escape(str(data.get("rule", "")))
    return f"<section class='hypotheses'><h2>Hypotheses</h2><p>{rule}</p>{order}{layers}</section>"

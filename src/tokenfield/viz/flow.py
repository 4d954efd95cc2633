"""Drawing for the attention-only flow (:class:`tokenfield.analysis.flow.AttentionFlow`):
the four-panel figure and the report fragment. Takes data, computes nothing."""

from __future__ import annotations

import base64
import html
from typing import Any

from tokenfield.analysis.flow import AttentionFlow
from tokenfield.viz._common import new_figure

__all__ = ["flow_html_section", "plot_flow"]


def flow_html_section(data: dict[str, Any], image: bytes | None = None) -> str:
    """The report fragment: per layer, the four flows side by side."""

    variants = list(data["variants"])
    head = "".join(
        f"<th>{html.escape(v)}: {m}</th>"
        for m in ("clusters", "mean cos", "rank", "dist")
        for v in variants
    )
    body = []
    for t, layer in enumerate(data["time"]):
        cells = "".join(
            f"<td class='num'>{data['variants'][v][key][t]:.3g}</td>"
            for key in ("clusters", "mean_cosine", "gram_rank", "distance")
            for v in variants
        )
        body.append(f"<tr><td class='num'>{layer}</td>{cells}</tr>")
    img = (
        f"<figure><img alt='attention-only flow' src='data:image/png;base64,"
        f"{base64.b64encode(image).decode()}'></figure>"
        if image
        else ""
    )
    return (
        f"<h3>The attention-only flow ({html.escape(str(data['model']))})</h3>"
        "<p class='note'>From each prompt's layer-0 cloud: full = the trace; attention = the "
        "block's attention sub-layer only (MLP removed, residual and norms kept); identity = "
        "the Q = K = V = I step with the fitted beta; random_attention = a random-weight "
        f"copy's attention. Clusters at cos >= 1 - {data['eps']:g}; rank of [cos >= "
        f"{data['gram_cos']}]; dist = mean angle to the real token (rad). Means over "
        "prompts.</p>"
        f"{img}<div class='scroll'><table><thead><tr><th>layer</th>{head}</tr></thead>"
        f"<tbody>{''.join(body)}</tbody></table></div>"
    )


def plot_flow(flow: AttentionFlow):

    fig, axes = new_figure((12, 3.4), ncols=4)
    for ax, (values, label) in zip(
        axes,
        ((flow.clusters, f"clusters (eps {flow.eps:g})"), (flow.mean_cosine, "mean cosine"),
         (flow.gram_rank, "rank at cos >= 0.999"), (flow.distance, "distance to trace (rad)")),
        strict=True,
    ):  # fmt: skip
        for i, variant in enumerate(flow.variants):
            ax.plot(flow.time, values[i], marker=".", label=variant)
        ax.set_xlabel("layer")
        ax.set_title(label, fontsize=9)
    axes[0].legend(fontsize=7)
    return fig

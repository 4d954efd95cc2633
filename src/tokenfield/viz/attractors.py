"""The report fragment of ``tokenfield attractors`` (``RUN/attractors.html``).

``tokenfield report --section RUN/attractors.html`` appends it to a report.
"""

from __future__ import annotations

import html
from typing import Any

__all__ = ["attractors_html_section"]


def _iv(summary: dict[str, Any], i: int) -> str:
    return f"{summary['mean'][i]:+.3f} [{summary['low'][i]:+.3f}, {summary['high'][i]:+.3f}]"


def attractors_html_section(data: dict[str, Any]) -> str:
    """Top FTLE per start block, basin radius and switch slopes, and the verdicts,
    for the model and its random-weight copy (``attractors.json`` as ``data``)."""
    trained, random = data["trained"], data.get("random")
    sides = [("model", trained)] + ([("random copy", random)] if random else [])
    head = "".join(f"<th>{name}</th>" for name, _ in sides)
    rows = "".join(
        f"<tr><td class='num'>{block}</td>"
        + "".join(f"<td class='num'>{_iv(s['ftle_top'], i)}</td>" for _, s in sides)
        + "</tr>"
        for i, block in enumerate(trained["ftle_blocks"])
    )
    basin_rows = []
    for i, block in enumerate(trained["blocks"]):
        cells = ""
        for _, s in sides:
            slope = (s.get("basin_different") or {}).get("log10_slope")
            text = f"{10 ** slope['mean'][i]:.2f}" if slope else "-"
            cells += (
                f"<td class='num'>{s['basin_radius_median'][i]:.3g}</td><td class='num'>{text}</td>"
            )
        basin_rows.append(f"<tr><td class='num'>{block}</td>{cells}</tr>")
    basin_head = "".join(f"<th>{name}: basin radius</th><th>{name}: switch slope</th>"
                         for name, _ in sides)  # fmt: skip
    verdicts = data["verdicts"]
    items = [f"<li>model: {html.escape(v['text'])}</li>" for v in verdicts["ftle"]]
    items += [f"<li>random copy: {html.escape(v['text'])}</li>"
              for v in verdicts.get("ftle_random", [])]  # fmt: skip
    items.append(f"<li>{html.escape(verdicts['basins']['text'])}</li>")
    return (
        f"<h3>Is it an attractor? ({html.escape(str(trained['model']))})</h3>"
        "<p class='note'>The last token's layer map (docs/attractors.md): top finite-time "
        "Lyapunov exponent from each start block to the output (per layer, mean over prompts "
        "with a 95 % bootstrap interval; below 0: directions contract), median basin radius "
        "(rad) and the different-category switch slope along great circles.</p>"
        f"<table><tr><th>start block</th>{head}</tr>{rows}</table>"
        f"<table><tr><th>start block</th>{basin_head}</tr>{''.join(basin_rows)}</table>"
        f"<ul>{''.join(items)}</ul>"
    )


def plot_attractors(results: dict[str, dict[str, Any]], axes: Any = None) -> Any:
    """Two panels from ``attractors.json``-shaped summaries keyed by model name:
    the top FTLE per start block (mean and interval; the random-weight copy dashed)
    and the median angle ratio of random directions at the smallest angle.

    Returns the figure."""
    import matplotlib.pyplot as plt

    if axes is None:
        fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    else:
        fig = axes[0].figure
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for color, (name, data) in zip(colors, results.items(), strict=False):
        for side, style in (("trained", "-"), ("random", "--")):
            summary = data.get(side)
            if not summary:
                continue
            label = f"{name}{' (random copy)' if side == 'random' else ''}"
            blocks = summary["ftle_blocks"]
            ftle = summary["ftle_top"]
            axes[0].errorbar(
                blocks,
                ftle["mean"],
                yerr=[
                    [m - lo for m, lo in zip(ftle["mean"], ftle["low"], strict=True)],
                    [hi - m for m, hi in zip(ftle["mean"], ftle["high"], strict=True)],
                ],
                fmt="o" + style,
                color=color,
                label=label,
                capsize=3,
            )
            ratio = [row[0] for row in summary["angle_ratio_median"]]
            axes[1].plot(summary["blocks"], ratio, "o" + style, color=color, label=label)
    axes[0].axhline(0, color="grey", lw=0.8)
    axes[0].set(xlabel="start block l", ylabel="top FTLE to the output (per layer)",
                title="most sensitive direction")  # fmt: skip
    axes[1].axhline(1, color="grey", lw=0.8)
    axes[1].set(xlabel="start block l", ylabel="median angle(x_L', x_L) / theta", yscale="log",
                title="random directions, smallest angle")  # fmt: skip
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    return fig

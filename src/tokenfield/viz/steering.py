"""Figures for steering: accuracy against alpha, and steered paths in the frozen frame."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

from tokenfield.viz._common import line_colors, save_figure


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_accuracy(result: dict[str, Any], ax: Any = None) -> Any:
    """Accuracy (95 % Wilson interval) against alpha, one line per layer, with the
    random-direction control dashed and the unsteered word and math forms as bands."""
    plt = _plt()
    if ax is None:
        _fig, ax = plt.subplots(figsize=(7, 4.5))
    rows = result["rows"]
    base = {r["condition"]: r for r in rows if r["layer"] is None}
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for name, style in (("word", "tab:red"), ("math", "tab:blue")):
        if name in base:
            r = base[name]
            ax.axhspan(r["ci95"][0], r["ci95"][1], color=style, alpha=0.12)
            ax.axhline(r["accuracy"], color=style, lw=1, label=f"{name} form (unsteered)")
    layers = sorted({r["layer"] for r in rows if r["layer"] is not None})
    for i, layer in enumerate(layers):
        for condition, dash in (("steered", "-"), ("control", ":")):
            pts = sorted(
                (r["alpha"], r["accuracy"], r["ci95"])
                for r in rows
                if r["layer"] == layer and r["condition"] == condition
            )
            if not pts:
                continue
            xs = [p[0] for p in pts]
            ys = [p[1] for p in pts]
            err = [[p[1] - p[2][0] for p in pts], [p[2][1] - p[1] for p in pts]]
            ax.errorbar(
                xs, ys, yerr=err, ls=dash, marker="o", ms=4, capsize=2,
                color=colours[i % len(colours)],
                label=f"layer {layer} {'toward math' if condition == 'steered' else 'random control'}",
            )  # fmt: skip
    ax.set_xlabel("alpha (multiples of the word->math mean difference)")
    split = "validation " if rows and rows[0].get("split") == "validation" else ""
    ax.set_ylabel(f"{split}accuracy on word problems")
    model = result.get("config", {}).get("model", {}).get("name", "")
    ax.set_title(f"Steering word problems toward the math region ({model})")
    ax.set_ylim(-0.02, 1.02)
    ax.legend(fontsize=7, loc="best")
    return ax


def plot_test_summary(result: dict[str, Any], ax: Any = None) -> Any:
    """The test split: baselines and the selected steered condition as bars (95 %
    Wilson interval on the steered one), and every control of each family (random
    directions, label shuffles, centroid halves) as a dot, with its 95th percentile.
    Reads earlier ``eval.json`` files too (one label-shuffle draw, no halves)."""
    from tokenfield.steering.evaluate import control_families

    plt = _plt()
    if ax is None:
        _fig, ax = plt.subplots(figsize=(8, 4.5))
    names = list(result["baselines"]) + ["steered"]
    values = [result["baselines"][k] for k in result["baselines"]]
    values += [result["steered"]["accuracy"]]
    colours = ["0.6"] * len(result["baselines"]) + ["tab:red"]
    xs = list(range(len(names)))
    ax.bar(xs, values, color=colours)
    low, high = result["steered"]["ci95"]
    ax.errorbar([xs[-1]], [values[-1]], yerr=[[values[-1] - low], [high - values[-1]]],
                color="black", capsize=3)  # fmt: skip
    labels = {"random": "random directions", "label_shuffle": "label shuffles",
              "centroid_halves": "centroid halves"}  # fmt: skip
    family_colours = {"random": "tab:green", "label_shuffle": "tab:purple",
                      "centroid_halves": "tab:orange"}  # fmt: skip
    ticks = list(xs)
    for key, fam in control_families(result).items():
        x = len(ticks)
        ticks.append(x)
        names.append(labels[key])
        accs = fam["accuracies"]
        jitter = [x + 0.15 * ((i % 5) - 2) for i in range(len(accs))]
        ax.scatter(
            jitter, accs, s=10, color=family_colours[key], label=f"{labels[key]} ({len(accs)})"
        )
        ax.hlines(fam["p95"], x - 0.4, x + 0.4, color=family_colours[key], ls=":", lw=1)
    ax.axhline(result["steered"]["accuracy"], color="tab:red", ls="--", lw=0.8)
    ax.set_xticks(ticks, names, rotation=45, ha="right", fontsize=8)
    sel = result["selected"]
    model = result.get("config", {}).get("model", {}).get("name", "")
    ax.set_title(f"Test split ({model}): layer {sel['layer']}, alpha {sel['alpha']:g}, "
                 f"verdict: {result['verdict']} (dotted: each family's 95th percentile)",
                 fontsize=9)  # fmt: skip
    ax.set_ylabel("test accuracy")
    ax.legend(fontsize=7)
    return ax


def plot_steered_paths(loop: dict[str, Any], ax: Any = None, *, times: str = "seed") -> Any:
    """The reference run's last-token paths (grey, target category highlighted) and
    the steered source prompts for each alpha, in the frozen PCA frame.

    ``times``: the run's time convention (its ``metrics.json``), so that the
    figure draws the layers the run's own figures draw: ``"seed"``, times
    ``0 .. L-1`` (the last block's raw output left out, as the seed did);
    ``"all"``, times ``0 .. L``.
    """
    import numpy as np

    plt = _plt()
    if ax is None:
        _fig, ax = plt.subplots(figsize=(7, 5))
    every = np.asarray(loop["reference"]["paths"])  # (time, particle, 2)
    keep = slice(0, -1) if times == "seed" and every.shape[0] > 2 else slice(None)

    def drawn(paths: Any) -> Any:
        return np.asarray(paths)[keep]

    ref = every[keep]
    cats = loop["reference"]["category"]
    for p, cat in enumerate(cats):
        colour = "tab:blue" if cat == loop["target"] else "0.8"
        ax.plot(ref[:, p, 0], ref[:, p, 1], color=colour, lw=0.8, zorder=1)
    base = drawn(loop["unsteered"]["paths"])
    for p in range(base.shape[1]):
        ax.plot(base[:, p, 0], base[:, p, 1], color="black", lw=1.2, zorder=2,
                label="unsteered" if p == 0 else None)  # fmt: skip
    alphas = sorted(loop["paths"]["steer"], key=float)
    colours = line_colors(len(alphas), "inferno", 0.25, 0.7)  # dark red to orange: no yellow
    for i, alpha in enumerate(alphas):
        pts = drawn(loop["paths"]["steer"][alpha])
        colour = colours[i]
        for p in range(pts.shape[1]):
            ax.plot(pts[:, p, 0], pts[:, p, 1], color=colour, lw=1.2, zorder=3,
                    label=f"alpha={float(alpha):g}" if p == 0 else None)  # fmt: skip
            ax.scatter(pts[-1, p, 0], pts[-1, p, 1], color=colour, s=12, zorder=4)
    ax.axvline(np.nan)  # keeps autoscale stable when paths are empty
    evr = loop.get("explained_variance_ratio") or [0, 0]
    ax.set_xlabel(f"PC1 ({100 * evr[0]:.0f}% var)")
    ax.set_ylabel(f"PC2 ({100 * evr[1]:.0f}% var)")
    title = (
        f"'{loop['source']}' steered toward '{loop['target']}' at layer {loop['layer']}, "
        f"layers 0..{ref.shape[0] - 1}"
    )
    ax.set_title(
        "\n".join(textwrap.wrap(title, 60)) + "\n(blue: the target's prompts; grey: the others)",
        fontsize=10,
    )
    ax.legend(fontsize=7)
    return ax


# The figures each steering command draws (``figures/<stem>.png`` and ``.svg``):
# what its --overwrite deletes, by name.
FIGURES = {
    "steer": ("steered_paths",),
    "eval-steering": ("accuracy_vs_alpha", "test_summary"),
}


def save(fig_ax: Any, path: Path) -> list[Path]:
    """Save the axes' figure as PNG and SVG next to each other (``path`` without
    its suffix), each through a temporary file and a rename: never through a
    symbolic link."""
    plt = _plt()
    fig = fig_ax.figure
    fig.tight_layout()
    out = save_figure(fig, path.parent, path.name)
    plt.close(fig)
    return out

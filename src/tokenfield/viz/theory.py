"""Figures for :func:`tokenfield.pipelines.theory.theory_lens`: real against ideal.

Every function takes the data a :class:`~tokenfield.analysis.theory.TheoryLens`
holds (and optional axes) and returns the figure; :func:`write_theory_figures`
writes all that apply as ``theory_*.png`` / ``.svg``. matplotlib is imported
lazily (through :mod:`tokenfield.viz._common`).
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

import numpy as np

from tokenfield.viz._common import figure_for_axes, new_figure, save_figure

__all__ = [
    "CAPTIONS",
    "plot_attention",
    "plot_clouds",
    "plot_effective_beta",
    "plot_logit_lens",
    "plot_probes",
    "theory_html_section",
    "write_theory_figures",
]

CAPTIONS = {
    "theory_clouds": "Token clouds by layer: the model (solid), its random-weight copy "
    "(dashed) and the simulator started from the model's layer-0 tokens (dotted); "
    "cluster counts at each threshold eps (one marker each).",
    "theory_attention": "Attention as a Markov chain, per layer and head: sink mass, "
    "normalised row entropy and the spectral gap of the sink-free symmetrised chain.",
    "theory_beta": "Effective beta: the idealised attention flow (Q = K = V = I, and the "
    "layer's own heads when given) fitted to each layer's update; R^2 is the fraction of "
    "the update it explains.",
    "theory_probes": "Linear probes of the prompt category by layer (5-fold CV), with the "
    "shuffled-label null (mean and 95th percentile).",
    "theory_logit_lens": "Logit lens: rank of the model's final prediction at each layer.",
}

#: Fitted betas are shown (and drawn) only where the fit explains this much.
MIN_R2 = 0.01
NO_FIT = "n/a (R\u00b2 < 0.01)"

EPS_MARKERS = ("o", "s", "^", "D", "v")

STYLES = {
    "model": {"linestyle": "-", "color": "C0"},
    "random weights": {"linestyle": "--", "color": "C3"},
    "simulation": {"linestyle": ":", "color": "C2"},
}


def plot_clouds(model: Any, baseline: Any = None, simulated: Any = None, axes: Any = None) -> Any:
    """Mean cosine, cluster counts, spread and effective dimension against depth.

    Args:
        model, baseline, simulated: :class:`~tokenfield.analysis.clouds.TokenClouds`
            (baseline and simulated may be ``None``).
        axes: four axes, or ``None`` for a new figure.
    """
    fig, axes = figure_for_axes(axes, (11, 7), ncols=2, nrows=2)
    panels = [
        ("mean_cos", "mean pairwise cosine"),
        ("cluster_count", "clusters"),
        ("spread", "spread (rms angle to mean, rad)"),
        ("effective_dim", "effective dimension"),
    ]
    sources = [("model", model), ("random weights", baseline), ("simulation", simulated)]
    # Colour and line style tell the source; the marker tells the eps level.
    extra = sorted(
        (k for k in model.values if k.startswith("cluster_count@")),
        key=lambda k: float(k.split("@")[1]),
    )
    levels = [("cluster_count", f"eps = {model.eps:g}")]
    levels += [(k, f"eps = {k.split('@')[1]}") for k in extra]
    marks = dict(zip([k for k, _ in levels], EPS_MARKERS, strict=False))
    every = max(1, len(model.time) // 10)
    for ax, (name, label) in zip(axes, panels, strict=True):
        for source, clouds in sources:
            if clouds is None:
                continue
            style = STYLES[source]
            if name != "cluster_count":
                ax.plot(clouds.time, clouds.mean(name), label=source, **style)
                continue
            for key, _ in levels:
                if key in clouds.values:
                    ax.plot(clouds.time, clouds.mean(key), marker=marks.get(key, "x"),
                            markevery=every, markersize=5, **style)  # fmt: skip
        ax.set_xlabel("layer")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    if len(levels) > 1:
        from matplotlib.lines import Line2D

        handles = [
            Line2D([], [], color="0.3", marker=marks.get(key, "x"), markersize=5, label=text)
            for key, text in levels
        ]
        axes[1].legend(handles=handles, title="threshold (link if cos >= 1 - eps)",
                       fontsize=8, title_fontsize=8)  # fmt: skip
    axes[1].set_title("clusters at each threshold")
    axes[0].legend()
    return fig


def plot_attention(attention: Any, axes: Any = None) -> Any:
    """Heatmaps (layer x head) of sink mass, entropy and sink-free gap, and head means."""
    fig, axes = figure_for_axes(axes, (14, 4), ncols=4)
    panels = [
        ("sink_mass", "sink mass", "magma"),
        ("entropy", "row entropy / max", "viridis"),
        ("gap_nosink", "gap, sink dropped", "cividis"),
    ]
    for ax, (name, label, cmap) in zip(axes[:3], panels, strict=True):
        values = attention.values[name].T  # (heads, L)
        image = ax.imshow(values, aspect="auto", origin="lower", cmap=cmap, vmin=0, vmax=1)
        ax.set_xlabel("block")
        ax.set_ylabel("head")
        ax.set_title(label)
        fig.colorbar(image, ax=ax, shrink=0.8)
    ax = axes[3]
    for name, label in (
        ("sink_mass", "sink mass"),
        ("gap", "gap, sink kept"),
        ("gap_nosink", "gap, sink dropped"),
        ("entropy", "entropy"),
    ):
        ax.plot(attention.block, attention.head_mean(name), label=label)
    ax.set_xlabel("block")
    ax.set_ylim(0, 1)
    ax.set_title("mean over heads")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return fig


def plot_effective_beta(
    model: Any,
    baseline: Any = None,
    heads: Any = None,
    baseline_heads: Any = None,
    axes: Any = None,
) -> Any:
    """Fitted beta, step and explained fraction R^2 per layer.

    Args:
        model, baseline: :class:`~tokenfield.analysis.effective_beta.EffectiveBeta`
            with Q = K = V = I (baseline may be ``None``).
        heads, baseline_heads: the same with each layer's own heads, or ``None``.
        axes: three axes, or ``None``.

    beta and the step are drawn only where the fit explains something (R^2 >= 0.01).
    """
    fig, axes = figure_for_axes(axes, (13, 3.8), ncols=3)
    series = [
        ("model", model, "Q=K=V=I"),
        ("random weights", baseline, "Q=K=V=I"),
        ("model", heads, "own heads"),
        ("random weights", baseline_heads, "own heads"),
    ]
    for source, fits, field in series:
        if fits is None:
            continue
        style = dict(STYLES[source])
        if field == "own heads":
            style["color"] = "C1" if source == "model" else "C5"
        label = f"{source}, {field}"
        layer = fits.time[:-1]
        shown = fits.column("r2") >= MIN_R2
        axes[0].plot(layer, np.where(shown, fits.column("beta"), np.nan), marker=".", **style)
        axes[1].plot(layer, np.where(shown, fits.column("step"), np.nan), marker=".", **style)
        axes[2].plot(layer, fits.column("r2"), marker=".", label=label, **style)
    axes[0].set_yscale("symlog", linthresh=0.1)
    for ax, label in zip(axes, ("beta", "step h", "R^2 (explained)"), strict=True):
        ax.set_xlabel("layer (update from layer l to l + 1)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[2].set_ylim(bottom=0)
    axes[2].legend(fontsize=8)
    return fig


def plot_probes(probes: dict, baseline: dict | None = None, ax: Any = None) -> Any:
    """Probe accuracy by layer, with the permutation null band."""
    if ax is None:
        fig, ax = new_figure((7, 4))
    else:
        fig = ax.figure
    colors = {"last": "C0", "pooled": "C1"}
    for name, curve in probes.items():
        color = colors.get(name, "C4")
        ax.plot(
            curve.time,
            curve.accuracy,
            color=color,
            label=f"{name} token" if name == "last" else "token mean",
        )
        ax.fill_between(curve.time, curve.null_mean, curve.null_high, color=color, alpha=0.15)
    for name, curve in (baseline or {}).items():
        ax.plot(
            curve.time,
            curve.accuracy,
            color=colors.get(name, "C4"),
            linestyle="--",
            label=f"{name}, random weights",
        )
    first = next(iter(probes.values()), None)
    if first is not None:
        ax.axhline(first.chance, color="grey", linewidth=0.8)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("layer")
    ax.set_ylabel("cross-validated accuracy")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return fig


def plot_logit_lens(lens: Any, axes: Any = None) -> Any:
    """Median rank of the final prediction and the fraction already on top, by layer."""
    fig, axes = figure_for_axes(axes, (10, 3.8), ncols=2)
    for prompt in range(lens.ranks.shape[1]):
        axes[0].plot(lens.time, lens.ranks[:, prompt], color="grey", alpha=0.25, linewidth=0.7)
    axes[0].plot(lens.time, lens.median_rank, color="C0", linewidth=2, label="median")
    axes[0].set_yscale("log")
    axes[0].set_ylabel("rank of the final prediction")
    axes[1].plot(lens.time, lens.top1, color="C0")
    axes[1].set_ylim(0, 1.02)
    axes[1].set_ylabel("fraction already top-1")
    for ax in axes:
        ax.set_xlabel("layer")
        ax.grid(alpha=0.3)
    axes[0].legend()
    return fig


def write_theory_figures(result: Any, directory: str | Path) -> list[Path]:
    """Draw every section ``result`` has; returns the written paths."""
    directory = Path(directory)
    written: list[Path] = []
    jobs = []
    if result.clouds is not None:
        jobs.append(
            (
                "theory_clouds",
                lambda: plot_clouds(
                    result.clouds,
                    result.baseline_clouds,
                    None if result.simulated is None else result.simulated.clouds,
                ),
            )
        )
    if result.attention is not None:
        jobs.append(("theory_attention", lambda: plot_attention(result.attention)))
    if result.beta is not None:
        jobs.append(
            (
                "theory_beta",
                lambda: plot_effective_beta(
                    result.beta,
                    result.baseline_beta,
                    result.beta_heads,
                    result.baseline_beta_heads,
                ),
            )
        )
    if result.probes:
        jobs.append(("theory_probes", lambda: plot_probes(result.probes, result.baseline_probes)))
    if result.lens is not None:
        jobs.append(("theory_logit_lens", lambda: plot_logit_lens(result.lens)))
    for name, draw in jobs:
        written.extend(save_figure(draw(), directory, name, formats=("png",)))
    return written


def theory_html_section(theory: dict[str, Any]) -> str:
    """An HTML table block summarising ``theory.json`` (for the report).

    One row per layer: mean cosine (model / random / simulation), clusters,
    fitted beta and R^2, head-mean sink mass and sink-free gap, probe
    accuracies, the logit lens's top-1 fraction.
    """

    def col(*path: str) -> list[Any] | None:
        node: Any = theory
        for key in path:
            if not isinstance(node, dict) or node.get(key) is None:
                return None
            node = node[key]
        return node

    columns = [
        ("mean cos", col("clouds", "mean", "mean_cos")),
        ("mean cos (random)", col("baseline_clouds", "mean", "mean_cos")),
        ("mean cos (sim)", col("simulated_clouds", "mean", "mean_cos")),
        ("clusters", col("clouds", "mean", "cluster_count")),
        ("beta", col("effective_beta", "beta")),
        ("R^2", col("effective_beta", "r2")),
        ("R^2 (own heads)", col("effective_beta_heads", "r2")),
        ("sink mass", col("attention", "head_mean", "sink_mass")),
        ("gap (no sink)", col("attention", "head_mean", "gap_nosink")),
        ("probe last", col("probes", "last", "accuracy")),
        ("probe mean", col("probes", "pooled", "accuracy")),
        ("lens top-1", col("logit_lens", "top1")),
    ]
    beta, r2 = col("effective_beta", "beta"), col("effective_beta", "r2")
    if beta is not None and r2 is not None:  # beta only where its fit explains something
        columns[4] = (
            "beta",
            [
                b if (f is not None and f >= MIN_R2) else NO_FIT
                for b, f in zip(beta, r2, strict=False)
            ],
        )
    present = [(name, values) for name, values in columns if values is not None]
    if not present:
        return ""
    times = max(len(values) for _, values in present)
    head = "".join(f"<th>{html.escape(name)}</th>" for name, _ in present)
    rows = []
    for t in range(times):
        cells = []
        for _, values in present:
            value = values[t] if t < len(values) else None
            if value is None:
                cells.append("<td class='num'>&ndash;</td>")
            elif isinstance(value, str):
                cells.append(f"<td class='num'>{html.escape(value)}</td>")
            else:
                cells.append(f"<td class='num'>{value:.3g}</td>")
        rows.append(f"<tr><td>{t}</td>{''.join(cells)}</tr>")
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in theory.get("notes", []))
    claims = "".join(
        f"<li>{html.escape(probe_claim(name, curve))}</li>"
        for name, curve in (theory.get("probes") or {}).items()
    )
    return (
        "<h3>By layer</h3>"
        "<p class='note'>Rows are layers (time); beta, R^2 and the attention columns in row l "
        "describe block l, the update from time l to l + 1. beta is shown only where its "
        f"fit explains R^2 &ge; {MIN_R2:g} of the update.</p>"
        f"<div class='scroll'><table><tr><th>layer</th>{head}</tr>{''.join(rows)}</table></div>"
        + (f"<h3>Probes, corrected for the best layer</h3><ul>{claims}</ul>" if claims else "")
        + (f"<ul class='note'>{notes}</ul>" if notes else "")
    )


def probe_claim(name: str, curve: dict[str, Any]) -> str:
    """One sentence on a probe's best layer, stated as holding only on the p-value
    corrected for choosing that layer (the maximum over layers of each shuffle)."""
    best = curve.get("best") or {}
    if best.get("accuracy") is None:
        return f"probe ({name}): no accuracy"
    n = len(curve.get("time") or [])
    corrected = best.get("p_corrected")
    corrected_text = "n/a" if corrected is None else f"{corrected:.3g}"
    return (
        f"probe ({name}): best accuracy {best['accuracy']:.2f} at layer {best['time']} "
        f"(p = {best['p']:.3g} there; corrected for the best of {n} layers, p = "
        f"{corrected_text}): the category is linearly decodable: {best['claim']}"
    )

"""Figures and the offline HTML page of the conformance suite.

Every figure is a headless matplotlib Figure; the page embeds them as base64 PNGs
(no network, no scripts), beside the table of verdicts.
"""

from __future__ import annotations

import base64
import html
import io
from typing import Any

import numpy as np

from tokenfield.viz._common import new_figure


def plot_equiangular(times: np.ndarray, curves: dict[str, tuple[np.ndarray, np.ndarray]]):
    fig, ax = new_figure((5.5, 3.6))
    for label, (particles, ode) in curves.items():
        (line,) = ax.plot(times, ode, lw=1.5, label=f"ODE, {label}")
        ax.plot(times, particles, "o", ms=3, color=line.get_color())
    ax.set_xlabel("t")
    ax.set_ylabel("rho(t) = <x_i, x_j>")
    ax.set_title("Equiangular collapse: particles (dots) vs scalar ODE")
    ax.legend(fontsize=7)
    return fig


def plot_phase_rows(times: np.ndarray, betas: Any, grids: dict[str, np.ndarray]):
    fig, axes = new_figure((10, 3.4), ncols=len(grids), sharey=True)
    for ax, (label, grid) in zip(np.atleast_1d(axes), grids.items(), strict=True):
        image = ax.imshow(
            grid.T, origin="lower", aspect="auto", vmin=0, vmax=1, cmap="magma",
            extent=(-0.5, len(betas) - 0.5, times[0], times[-1]),
        )  # fmt: skip
        ax.set_xticks(range(len(betas)), [f"{b:g}" for b in betas], fontsize=7)
        ax.set_xlabel("beta")
        ax.set_title(label, fontsize=9)
    np.atleast_1d(axes)[0].set_ylabel("t")
    fig.colorbar(image, ax=axes, label="share of pairs > 0.999")
    return fig


def plot_sync(betas: Any, ns: Any, table: dict[str, dict[str, Any]], examples: list[dict]):
    fig, axes = new_figure((10, 3.6), ncols=2)
    ax = axes[0]
    for n in ns:
        ax.plot(betas, [table[f"n={n}, beta={b:g}"]["sync"] for b in betas], "o-", ms=3,
                label=f"n = {n}")  # fmt: skip
    for x, style in ((-0.16, "--"), (-2 / 3, ":")):
        ax.axvline(x, color="k", ls=style, lw=0.8)
    ax.set_xlabel("beta")
    ax.set_ylabel("fraction of starts synchronised")
    ax.set_title("Circle: synchronisation (dashed -0.16, dotted -2/3)", fontsize=9)
    ax.legend(fontsize=7, ncol=2)
    ax = axes[1]
    for i, example in enumerate(examples):
        theta = np.asarray(example["theta"])
        r = 1.0 - 0.15 * i
        ax.plot(r * np.cos(theta), r * np.sin(theta), "o",
                label=f"n={example['n']}, beta={example['beta']:g}, "
                f"max eig {example['top_eigenvalue']:.2g}")  # fmt: skip
    circle = np.linspace(0, 2 * np.pi, 200)
    ax.plot(np.cos(circle), np.sin(circle), color="0.8", lw=0.8)
    ax.set_aspect("equal")
    ax.set_title("Stable non-synchronised stationary states", fontsize=9)
    if examples:
        ax.legend(fontsize=7, loc="lower center")
    return fig


def plot_kmax(rows: list[dict[str, Any]]):
    fig, ax = new_figure((5.5, 3.6))
    for normalization, marker in (("usa", "o"), ("sa", "s")):
        sel = [r for r in rows if r["normalization"] == normalization]
        ax.plot([r["beta"] for r in sel], [r["median_count"] for r in sel], marker, ms=5,
                label=f"first plateau ({normalization}, median)")  # fmt: skip
    usa = [r for r in rows if r["normalization"] == "usa"]
    ax.plot([r["beta"] for r in usa], [r["k_max"] for r in usa], "k-", lw=1, label="k_max")
    ax.set_xscale("log")
    ax.set_xlabel("beta")
    ax.set_ylabel("clusters")
    ax.legend(fontsize=7)
    ax.set_title("k_max(beta) against the first plateau", fontsize=9)
    return fig


def plot_staircase(times: np.ndarray, series: list, meta: Any):
    fig, axes = new_figure((10, 3.6), ncols=2)
    ax = axes[0]
    for i, (energy, level, _counts) in enumerate(series):
        ax.plot(times[1:], energy[1:], lw=1.2, label=f"E(t), run {i}")
        ax.plot(times[1:], level[1:], "k:", lw=1)
    ax.set_xscale("log")
    ax.set_xlabel("t")
    ax.set_ylabel("E = (1/n^2) sum exp(beta(<x_i,x_j>-1))")
    ax.set_title("Energy staircase (dotted: sum w_k^2 / n^2)", fontsize=9)
    ax.legend(fontsize=7)
    ax = axes[1]
    median = meta.median_times
    ax.semilogy(meta.betas, median * meta.betas, "o-", label="median T * beta")
    ok = np.isfinite(median)
    if ok.sum() >= 2:
        ref = np.exp(meta.predicted_slope * (meta.betas - meta.betas[ok][0]))
        ax.semilogy(meta.betas, ref * (median * meta.betas)[ok][0], "k--",
                    label=f"slope {meta.predicted_slope:g}")  # fmt: skip
    ax.set_xlabel("beta")
    ax.set_ylabel("first-merge time * beta")
    ax.legend(fontsize=7)
    ax.set_title("Plateau length grows like e^{c beta}", fontsize=9)
    return fig


def plot_pde_rates(quantile: Any, random: Any):
    fig, ax = new_figure((5.5, 3.6))
    for result, label in ((quantile, "quantile"), (random, "i.i.d.")):
        w1 = result.w1[:, -1]
        ax.errorbar(result.ns, w1, yerr=result.w1_spread[:, -1], fmt="o-", ms=4, label=label)
    ns = np.asarray(quantile.ns, dtype=float)
    ax.loglog(ns, quantile.w1[0, -1] * ns[0] / ns, "k:", lw=1, label="n^-1")
    ns = np.asarray(random.ns, dtype=float)
    ax.loglog(ns, random.w1[0, -1] * np.sqrt(ns[0] / ns), "k--", lw=1, label="n^-1/2")
    ax.set_xlabel("n")
    ax.set_ylabel(f"W1 at t = {quantile.times[-1]:g}")
    ax.legend(fontsize=7)
    ax.set_title("PDE against particles", fontsize=9)
    return fig


def plot_renyi(angles0: np.ndarray, moved: np.ndarray, centres, strong, tol: float):
    """Causal attention on the circle: each token's displacement by the horizon against its
    starting angle, strong Renyi centres and the other centres marked, the tolerance dashed."""
    fig, ax = new_figure((5.5, 3.6))
    moved = np.maximum(moved, 1e-12)  # the first token never moves: draw it at the floor
    other = ~np.asarray(centres)
    ax.semilogy(angles0[other], moved[other], ".", ms=3, color="0.6", label="other tokens")
    weak = np.asarray(centres) & ~np.asarray(strong)
    ax.semilogy(angles0[weak], moved[weak], "s", ms=5, label="Renyi centres")
    ax.semilogy(angles0[strong], moved[strong], "o", ms=6, label="strong Renyi centres")
    ax.axhline(tol, color="k", ls="--", lw=0.8, label="tolerance (delta / 10)")
    ax.set_xlabel("starting angle")
    ax.set_ylabel("displacement by the horizon (rad, floor 1e-12)")
    ax.set_title("Causal attention: strong Renyi centres stay put", fontsize=9)
    ax.legend(fontsize=7)
    return fig


def plot_periodic(rows: list[dict[str, Any]], examples: dict[float, np.ndarray]):
    """The mean-field density at the end (first seed) per beta, and each beta's dominant
    modes over seeds against k_max."""
    fig, axes = new_figure((10, 3.6), ncols=2)
    ax = axes[0]
    for beta, density in examples.items():
        theta = (np.arange(density.size) + 0.5) * 2 * np.pi / density.size
        ax.plot(theta, density * 2 * np.pi, lw=1, label=f"beta = {beta:g}")
    ax.set(yscale="log", xlabel="theta", ylabel="density / uniform")
    ax.set_title("Mean-field density at t = 12 / lambda_max (seed 0)", fontsize=9)
    ax.legend(fontsize=7)
    ax = axes[1]
    for i, row in enumerate(rows):
        modes, counts = np.unique(row["dominant_modes"], return_counts=True)
        ax.scatter(np.full(modes.size, i), modes, s=20 + 20 * counts, alpha=0.6)
        ax.plot([i - 0.3, i + 0.3], [row["k_max"]] * 2, "k-", lw=1.5)
    ax.set_xticks(range(len(rows)), [f"{r['beta']:g}" for r in rows])
    ax.set_xlabel("beta")
    ax.set_ylabel("dominant mode (size: seeds)")
    ax.yaxis.get_major_locator().set_params(integer=True)
    ax.set_title("Dominant Fourier mode against k_max (bars)", fontsize=9)
    return fig


def figure_png(fig: Any) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90)
    return buffer.getvalue()


def conformance_html(items: list[dict[str, Any]], pngs: dict[str, bytes], meta: dict) -> str:
    """A self-contained page: the verdict table, then one section per item."""
    esc = html.escape
    rows = "".join(
        f"<tr class='{esc(i['status'].lower())}'><td><a href='#{esc(i['name'])}'>{esc(i['name'])}"
        f"</a></td><td>{esc(i['reference'])}</td><td>{esc(i['measured'])}</td>"
        f"<td>{esc(i['tolerance'])}</td><td><b>{esc(i['status'])}</b></td>"
        f"<td>{i['seconds']:.1f}</td></tr>"
        for i in items
    )
    sections = []
    for item in items:
        png = pngs.get(item["name"])
        image = (
            f"<img alt='{esc(item['name'])}' src='data:image/png;base64,"
            f"{base64.b64encode(png).decode()}'>"
            if png
            else ""
        )
        sections.append(
            f"<section id='{esc(item['name'])}'><h2>{esc(item['name'])}: {esc(item['status'])}</h2>"
            f"<p><b>Reference.</b> {esc(item['reference'])}</p><p><b>Measured.</b> "
            f"{esc(item['measured'])}</p><p><b>Tolerance.</b> {esc(item['tolerance'])}</p>"
            f"{image}</section>"
        )
    size = "quick, for CI" if meta.get("quick") else "full"
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>tokenfield conformance</title>"
        "<style>body{font-family:sans-serif;max-width:1100px;margin:auto;padding:1em}"
        "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:4px;font-size:13px;"
        "vertical-align:top}tr.pass td:nth-child(5){color:#060}tr.fail td:nth-child(5)"
        "{color:#b00}img{max-width:100%}</style></head><body>"
        f"<h1>tokenfield conformance ({esc(size)})</h1>"
        f"<p>tokenfield {esc(str(meta.get('version', '')))}; {esc(str(meta.get('created', '')))}."
        "</p><table><tr><th>item</th><th>reference</th><th>measured</th><th>tolerance</th>"
        f"<th>status</th><th>seconds</th></tr>{rows}</table>{''.join(sections)}</body></html>"
    )

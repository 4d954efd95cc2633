"""Figures of the mean-field theory beside the particle simulator.

Each function takes what :mod:`tokenfield.meanfield` returns and an optional
``ax``, and returns the figure (matplotlib imported lazily, Agg canvas).
:func:`meanfield_figures` collects the figures of a results dict,
:func:`meanfield_html` renders them with their tables as one self-contained
HTML fragment (images inlined as base64) for the report.
"""

from __future__ import annotations

import base64
import html
import io
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tokenfield.meanfield.stability import large_beta_formula
from tokenfield.viz._common import FORMATS, figure_for, new_figure, save_figure


def _label(ax: Any, xlabel: str, ylabel: str, title: str | None = None) -> None:
    """The axes' labels, its small title and its legend, in this module's sizes."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title is not None:
        ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)


def plot_growth_rates(spectrum: Any, ax: Any = None, *, show_seed: bool = True):
    """``lambda_k`` against ``k`` (a :class:`~tokenfield.meanfield.StabilitySpectrum`),
    ``k_max`` marked; the seed's ``I_k / beta`` (rescaled to the same peak) for contrast."""
    fig, ax = figure_for(ax, (6, 3.5))
    modes, rates = spectrum.modes, spectrum.growth_rates
    ax.plot(modes, rates, "o-", color="C0", ms=3, label=f"lambda_k ({spectrum.normalization})")
    ax.axvline(spectrum.k_max, color="C0", ls=":", lw=1)
    ax.annotate(f"{spectrum.mode_name} = {spectrum.k_max}", (spectrum.k_max, spectrum.top_rate),
                textcoords="offset points", xytext=(5, -12), fontsize=8)  # fmt: skip
    seed = spectrum.seed_rates if show_seed else None  # computed by meanfield, drawn here
    if seed is not None:
        top = np.nanmax(seed)
        if np.isfinite(top) and top > 0:
            ax.plot(modes, seed / top * spectrum.top_rate, "x--", color="C3", ms=3, lw=0.8,
                    label="seed I_k(beta)/beta (scaled)")  # fmt: skip
    _label(
        ax,
        "mode k" if spectrum.dim == 2 else "harmonic degree l",
        f"growth rate ({spectrum.time} time)",
        f"d = {spectrum.dim}, beta = {spectrum.beta:g}",
    )
    return fig


def plot_k_max_curve(curve: Any, ax: Any = None):
    """``k_max`` against ``beta`` with ``sqrt(2 beta)`` (a :class:`~tokenfield.meanfield.KmaxCurve`)."""
    fig, ax = figure_for(ax, (6, 3.5))
    betas = curve.betas
    ax.step(betas, curve.k_max, where="mid", color="C0",
            label=f"{curve.mode_name} (linear stability)")  # fmt: skip
    fine = np.linspace(betas.min(), betas.max(), 400)
    ax.plot(fine, np.sqrt(2 * np.abs(fine)), color="C1", lw=1, label="sqrt(2 beta)")
    if curve.dim > 2:
        nu = curve.dim / 2 - 1
        ax.plot(fine, np.sqrt(2 * np.abs(fine) + nu * nu) - nu, color="C2", lw=1, ls="--",
                label="sqrt(2 beta + nu^2) - nu, nu = d/2 - 1")  # fmt: skip
    _label(ax, "beta", "most unstable mode", f"d = {curve.dim}")
    return fig


def plot_cluster_prediction(rows: Sequence[dict[str, Any]], ax: Any = None):
    """First-plateau cluster counts (every seed) against ``beta``, beside ``k_max``.
    ``rows``: :meth:`ClusterPrediction.rows`."""
    fig, ax = figure_for(ax, (6.5, 4))
    for i, norm in enumerate(sorted({r["normalization"] for r in rows})):
        sub = sorted((r for r in rows if r["normalization"] == norm), key=lambda r: r["beta"])
        offset = (i - 0.5) * 0.03
        for r in sub:
            counts = [c for c in r["first_plateau_counts"] if c > 0]
            ax.scatter(np.full(len(counts), r["beta"]) * (1 + offset), counts, s=12,
                       color=f"C{i}", alpha=0.6, label=None)  # fmt: skip
        ax.plot([r["beta"] for r in sub], [r["median_count"] for r in sub], "o-", ms=3,
                color=f"C{i}", label=f"first plateau, {norm} (median)")  # fmt: skip
    ordered = sorted(rows, key=lambda r: r["beta"])
    ax.plot([r["beta"] for r in ordered], [r["k_max"] for r in ordered], "s", mfc="none",
            color="k", ms=7, label="k_max (linear stability)")  # fmt: skip
    betas = np.array([r["beta"] for r in ordered])
    fine = np.geomspace(max(betas.min(), 1e-3), betas.max(), 200)
    ax.plot(fine, np.sqrt(2 * fine), color="0.5", lw=0.8, ls="--", label="sqrt(2 beta)")
    ax.set_xscale("log")
    _label(ax, "beta", "clusters")
    return fig


def plot_growth_fit(fit: Any, ax: Any = None):
    """Fitted growth rates of the Fourier amplitudes against ``lambda_k``
    (a :class:`~tokenfield.meanfield.predict.GrowthRateFit`)."""
    fig, ax = figure_for(ax, (6, 3.5))
    ax.plot(fit.modes, fit.continuum, "-", color="0.6", lw=2, label="lambda_k (continuum)")
    ax.plot(fit.modes, fit.discrete, "s", mfc="none", color="C0", ms=5,
            label=f"lambda_k^(n), n = {fit.n_particles}")  # fmt: skip
    ax.errorbar(fit.modes, fit.fitted, yerr=fit.fitted_spread, fmt="x", color="C3", ms=5,
                label="fitted slope of log|rho_k|")  # fmt: skip
    _label(ax, "mode k", "growth rate", f"{fit.normalization}, beta = {fit.beta:g}")
    return fig


def plot_pde_comparison(comparison: Any):
    """Left: the PDE density at the last time with the largest particle run's
    histogram. Right: ``W1`` against ``n`` with the fitted rate and the PDE's own error."""
    fig, (left, right) = new_figure((10, 3.8), ncols=2)
    theta = comparison.centres
    left.plot(theta, comparison.density[0], color="0.6", lw=1, label="rho(0)")
    left.plot(theta, comparison.density[-1], color="C0", lw=1.5,
              label=f"PDE, t = {comparison.times[-1]:g}")  # fmt: skip
    if comparison.particles is not None:
        bins = np.linspace(0, 2 * math.pi, 97)
        left.hist(comparison.particles[-1], bins=bins, density=True, histtype="step", color="C3",
                  label=f"particles, n = {comparison.ns[-1]}")  # fmt: skip
    _label(left, "theta", "density")
    ns = comparison.ns.astype(float)
    for j, t in enumerate(comparison.times):
        right.loglog(ns, comparison.w1[:, j], "o-", ms=3, color=f"C{j}",
                     label=f"t = {t:g}: rate {comparison.rate[j]:.2f}")  # fmt: skip
        right.axhline(comparison.pde_error[j], color=f"C{j}", lw=0.6, ls=":")
    _label(
        right,
        "n particles",
        "W1(particles, PDE)",
        f"{comparison.config['sampling']} start; dotted: PDE M vs 2M",
    )
    return fig


def plot_phase_diagram(ds: Any):
    """One panel per ``d``: ``P(merged)`` over ``(beta, t)``, the equiangular curve over it."""
    dims = ds["dim"].values
    fig, axes = new_figure((3.2 * len(dims), 3.4), ncols=len(dims), sharey=True)
    axes = np.atleast_1d(axes)
    betas, times = ds["beta"].values, ds["time"].values
    curve = ds["equiangular_time"].values
    image = None
    for ax, dim in zip(axes, dims, strict=True):
        prob = ds["merged_probability"].sel(dim=dim).values  # (beta, time)
        image = ax.pcolormesh(betas, times, prob.T, vmin=0, vmax=1, cmap="viridis",
                              shading="nearest")  # fmt: skip
        shown = np.where(curve <= times[-1], curve, np.nan)
        ax.plot(betas, shown, color="w", lw=1.5, ls="--")
        ax.set_xlabel("beta")
        ax.set_title(f"d = {dim}", fontsize=9)
    axes[0].set_ylabel("time")
    axes[0].set_ylim(times[0], times[-1])
    if image is not None:
        fig.colorbar(image, ax=list(axes), label="P(<x_i, x_j> >= 1 - delta)", shrink=0.9)
    return fig


def plot_metastability(result: Any, ax: Any = None):
    """``log`` first-merge time against ``beta``, the fit, and the predicted slope."""
    fig, ax = figure_for(ax, (6, 3.5))
    betas, times = result.betas, result.merge_times
    for s in range(times.shape[1]):
        ax.semilogy(betas, times[:, s], ".", color="C0", alpha=0.5)
    ax.semilogy(betas, result.median_times, "o", color="C0", ms=4, label="median first merge")
    if math.isfinite(result.slope):
        ax.semilogy(betas, np.exp(result.intercept + result.slope * betas), color="C3", lw=1,
                    label=f"fit: slope {result.slope:.3f}")  # fmt: skip
        anchor = np.exp(result.intercept + result.slope * betas[-1])
        ax.semilogy(betas, anchor * np.exp(result.predicted_slope * (betas - betas[-1])),
                    color="0.5", ls="--", lw=1,
                    label=f"predicted slope {result.predicted_slope:.3f}")  # fmt: skip
    _label(ax, "beta", "first merge time")
    return fig


def meanfield_figures(results: dict[str, Any]) -> list[tuple[str, Any, str]]:
    """``(name, figure, caption)`` for every result present in ``results``
    (keys: ``spectrum``, ``k_max_curve``, ``cluster_prediction`` (rows),
    ``growth_fits`` (list), ``pde`` , ``phase_diagram`` (Dataset), ``metastability``)."""
    out: list[tuple[str, Any, str]] = []
    if "spectrum" in results:
        s = results["spectrum"]
        out.append(("growth_rates", plot_growth_rates(s),
                    f"Growth rates of the modes of the uniform measure, beta = {s.beta:g}; "
                    f"{s.mode_name} = {s.k_max}. Dashed: the seed's I_k/beta, whose maximiser is always 1."))  # fmt: skip
    if "k_max_curve" in results:
        out.append(("k_max", plot_k_max_curve(results["k_max_curve"]),
                    "Most unstable mode against beta, with "
                    f"{large_beta_formula(results['k_max_curve'].dim)}."))  # fmt: skip
    if "cluster_prediction" in results:
        out.append(("cluster_prediction", plot_cluster_prediction(results["cluster_prediction"]),
                    "First-plateau cluster counts of particle runs (dots: seeds) beside k_max."))  # fmt: skip
    for fit in results.get("growth_fits", []):
        # named by what it fits (growth_fit_sa_beta16), not by its place in the list
        out.append((f"growth_fit_{fit.normalization}_beta{fit.beta:g}", plot_growth_fit(fit),
                    f"Linear phase ({fit.normalization}, beta = {fit.beta:g}): fitted growth "
                    "of the Fourier amplitudes against lambda_k."))  # fmt: skip
    if "pde" in results:
        out.append(("pde_vs_particles", plot_pde_comparison(results["pde"]),
                    "The PDE on the circle against particle runs; W1 falls with n."))  # fmt: skip
    if "phase_diagram" in results:
        out.append(("phase_diagram", plot_phase_diagram(results["phase_diagram"]),
                    "Probability that two tokens have merged; dashed: the equiangular ODE."))  # fmt: skip
    if "metastability" in results:
        out.append(("metastability", plot_metastability(results["metastability"]),
                    "First merge time from separated caps grows exponentially in beta."))  # fmt: skip
    return out


def write_meanfield_figures(
    results: dict[str, Any], out_dir: str | Path, formats: Sequence[str] = FORMATS
) -> list[Path]:
    """Save every figure of :func:`meanfield_figures` to ``out_dir``."""
    paths: list[Path] = []
    for name, fig, _ in meanfield_figures(results):
        paths.extend(save_figure(fig, out_dir, name, formats))
    return paths


def _png(fig: Any) -> str:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    def cell(value: Any) -> str:
        if isinstance(value, float):
            return f'<td class="num">{value:.4g}</td>'
        return f"<td>{html.escape(str(value))}</td>"

    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(cell(v) for v in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def meanfield_html(results: dict[str, Any]) -> str:
    """An HTML fragment (``<section>``) with the figures inlined and the tables:
    ``k_max`` against first-plateau counts, growth-rate fits, the PDE rate and
    the metastability slope (whichever are in ``results``)."""
    parts = ['<section class="meanfield"><h2>Mean-field theory</h2>']
    rows = results.get("cluster_prediction")
    if rows:
        parts.append("<h3>Predicted and simulated cluster counts</h3>")
        parts.append(_table(
            ["dynamics", "beta", "k_max", "sqrt(2 beta)", "first plateau (seeds)", "median"],
            [[r["normalization"], r["beta"], r["k_max"], r["sqrt_2beta"],
              " ".join(str(c) for c in r["first_plateau_counts"]), r["median_count"]]
             for r in rows],
        ))  # fmt: skip
    for fit in results.get("growth_fits", []):
        parts.append(f"<h3>Growth rates, {fit.normalization}, beta = {fit.beta:g}</h3>")
        parts.append(_table(
            ["k", "fitted", "lambda_k^(n)", "lambda_k", "|error| / max lambda"],
            [[int(k), float(f), float(d), float(c), float(e)] for k, f, d, c, e in
             zip(fit.modes, fit.fitted, fit.discrete, fit.continuum, fit.relative_error,
                 strict=True)],
        ))  # fmt: skip
    pde = results.get("pde")
    if pde is not None:
        parts.append("<h3>PDE against particles</h3>")
        parts.append(_table(
            ["n", *[f"W1 at t = {t:g}" for t in pde.times]],
            [[int(n), *[float(v) for v in row]] for n, row in zip(pde.ns, pde.w1, strict=True)]
            + [["rate", *[float(r) for r in pde.rate]], ["PDE M vs 2M", *map(float, pde.pde_error)]],
        ))  # fmt: skip
    meta = results.get("metastability")
    if meta is not None:
        parts.append("<h3>Metastability</h3>")
        parts.append(_table(
            ["beta", "median first merge"],
            [[float(b), float(t)] for b, t in zip(meta.betas, meta.median_times, strict=True)]
            + [["slope of log T", meta.slope], ["slope of log(T beta)", meta.slope_corrected],
               ["predicted", meta.predicted_slope]],
        ))  # fmt: skip
    for name, fig, caption in meanfield_figures(results):
        parts.append(
            f'<figure id="meanfield-{html.escape(name)}"><img alt="{html.escape(name)}" '
            f'src="data:image/png;base64,{_png(fig)}"><figcaption>{html.escape(caption)}'
            "</figcaption></figure>"
        )
    parts.append("</section>")
    return "\n".join(parts)

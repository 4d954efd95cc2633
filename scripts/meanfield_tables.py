"""The closing-note tables of the mean-field theory (docs/meanfield.md).

    .venv/bin/python scripts/meanfield_tables.py --out runs/meanfield-tables

prints Markdown tables and writes OUT/tables.md, OUT/tables.json (the tables as
data), OUT/results.json, OUT/figures/ and OUT/meanfield.html (the report fragment).
docs/meanfield.md's tables are rendered from the committed copy of tables.json:

    cp runs/meanfield-tables/tables.json docs/data/meanfield/tables.json
    .venv/bin/python scripts/meanfield_tables.py --write   # rewrite the doc's tables
    .venv/bin/python scripts/meanfield_tables.py --check   # exit 1 if the doc differs

The tables:

1. the Jacobian check: closed-form growth rates against the exact n-particle
   Jacobian (circle, n = 64) and against an exact quadrature of S^2 and S^3;
2. k_max(beta) against the first plateau of the cluster count of particle runs,
   beta = 1 .. 100, USA (rescaled time) and SA;
3. fitted linear-phase growth rates of the Fourier amplitudes against lambda_k;
4. W1(particles, PDE) against n and its fitted rate;
5. the phase diagram (half-merged times beside the equiangular ODE), on Dask;
6. first-merge times from separated caps and the slope of log T in beta.

Everything is float64; the integrators and steps are printed with each table.
Takes a few minutes on two busy cores (``--quick``: well under one).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _docblock  # noqa: E402

from tokenfield.meanfield.convergence import pde_vs_particles
from tokenfield.meanfield.metastability import metastability
from tokenfield.meanfield.phase import PhaseDiagramConfig, SweepReport, phase_diagram, summarize
from tokenfield.meanfield.predict import cluster_prediction, growth_rate_experiment
from tokenfield.meanfield.stability import (
    circulant_mode_eigenvalues,
    discrete_growth_rates,
    equispaced_jacobian,
    growth_rates,
    sphere_quadrature,
    weighted_linearization,
)

BETAS = (1, 2, 4, 9, 16, 25, 36, 49, 64, 81, 100)


def table(headers, rows, note: str) -> dict:
    """A table as data (what ``tables.json`` holds); NaN is stored as None."""

    def cell(v):
        if isinstance(v, float | np.floating):
            return float(v) if math.isfinite(v) else None
        return v.item() if isinstance(v, np.generic) else v

    return {"headers": list(headers), "rows": [[cell(v) for v in r] for r in rows], "note": note}


def render(tab: dict) -> str:
    """Markdown for one table of ``tables.json``: floats to 4 significant digits, None as -."""

    def fmt(v):
        if v is None:
            return "-"
        return f"{v:.4g}" if isinstance(v, float) else str(v)

    headers = tab["headers"]
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in tab["rows"]]
    return "\n".join(lines) + f"\n\n{tab['note']}"


def jacobian_check() -> tuple[str, dict]:
    rows, data = [], []
    for norm in ("usa", "sa"):
        for beta in (0.5, 4.0, 9.0, 16.0, 25.0):
            n = 64
            modes = circulant_mode_eigenvalues(equispaced_jacobian(n, beta, normalization=norm))
            k = np.arange(n)
            scale = np.abs(modes).max()
            disc = np.abs(modes - discrete_growth_rates(k, beta, n, normalization=norm)).max()
            cont = np.abs(
                modes[: n // 2 + 1] - growth_rates(k[: n // 2 + 1], beta, normalization=norm)
            ).max()
            rows.append([norm, "circle, n = 64", beta, disc / scale, cont / scale])
            data.append({"dynamics": norm, "beta": beta, "discrete": disc / scale,
                         "continuum": cont / scale})  # fmt: skip
    for dim, order, beta in ((3, 40, 4.0), (4, 20, 1.5)):
        points, weights = sphere_quadrature(dim, order)
        for norm in ("usa", "sa"):
            rates = growth_rates(range(5), beta, dim=dim, normalization=norm)
            worst = 0.0
            for degree in (1, 2, 3, 4):
                z = points[:, 0] + 1j * points[:, 1]
                grad = np.zeros_like(points)
                deriv = degree * z ** (degree - 1)
                grad[:, 0], grad[:, 1] = np.real(deriv), np.real(1j * deriv)
                xi = grad - (grad * points).sum(1, keepdims=True) * points
                moved = weighted_linearization(points, weights, xi, beta, normalization=norm)
                worst = max(worst, np.abs(moved - rates[degree] * xi).max() / np.abs(xi).max())
            label = f"S^{dim - 1}, {points.shape[0]}-point quadrature"
            rows.append([norm, label, beta, worst / rates.max(), math.nan])
            data.append({"dynamics": norm, "dim": dim, "beta": beta, "quadrature": worst})
    tab = table(
        ["dynamics", "system", "beta", "max err vs lambda^(n) (discrete)", "max err vs continuum"],
        rows,
        "(errors relative to max |lambda|; on the sphere: |J grad Y_l - lambda_l grad Y_l|, l = 1..4)",
    )
    return tab, data


def plateau_table(betas, n, seeds) -> tuple[str, list]:
    prediction = cluster_prediction(betas, n_particles=n, seeds=seeds, noise=1e-3)
    rows = prediction.rows()
    out = []
    for beta in betas:
        usa = next(r for r in rows if r["beta"] == beta and r["normalization"] == "usa")
        sa = next(r for r in rows if r["beta"] == beta and r["normalization"] == "sa")
        out.append([
            beta, usa["k_max"], round(math.sqrt(2 * beta), 2),
            " ".join(map(str, usa["first_plateau_counts"])), usa["median_count"],
            " ".join(map(str, sa["first_plateau_counts"])), sa["median_count"],
        ])  # fmt: skip
    dts = sorted({round(r["dt"], 3) for r in rows})
    tab = table(
        ["beta", "k_max", "sqrt(2 beta)", "USA first plateau (seeds)", "USA median",
         "SA first plateau (seeds)", "SA median"], out,
        f"(n = {n}, noise 1e-3, {seeds} seeds each; RK4, float64, dt = min(0.25, 0.1 / "
        f"lambda_max) (here {dts[0]}..{dts[-1]}); USA in rescaled time; eps = a quarter of "
        "1 - cos(2 pi / n); a plateau must last 3 / lambda_max)",
    )  # fmt: skip
    return tab, rows


def growth_table(betas, n) -> tuple[str, list, list]:
    rows, fits = [], []
    for norm in ("usa", "sa"):
        for beta in betas:
            fit = growth_rate_experiment(beta, normalization=norm, n_particles=n)
            fits.append(fit)
            strong = fit.discrete >= 0.5 * fit.discrete.max()
            top = int(np.argmax(fit.discrete))
            rows.append([
                norm, beta, int(fit.modes[top]), float(fit.fitted[top]), float(fit.discrete[top]),
                float(fit.relative_error[strong].max()), float(fit.relative_error.max()),
                f"1..{fit.modes[-1]}",
            ])  # fmt: skip
    tab = table(
        ["dynamics", "beta", "k_max", "fitted rate at k_max", "lambda_kmax", "max rel err (lambda_k >= lambda_max/2)",
         "max rel err (all fitted modes)", "modes"], rows,
        f"(n = {n}, noise 1e-8, 2 seeds; RK4 float64 dt = 0.05 / lambda_max; least squares of "
        "log|rho_k| while every amplitude < 1e-5; errors relative to max lambda)",
    )  # fmt: skip
    return tab, rows, fits


def pde_table(ns, random_ns, cells) -> tuple[str, dict, object]:
    quantile = pde_vs_particles(4.0, normalization="sa", ns=ns, times=(0, 1, 2, 3), cells=cells,
                                dt=0.01)  # fmt: skip
    random = pde_vs_particles(4.0, normalization="sa", ns=random_ns, times=(0, 1, 2, 3),
                              cells=cells, sampling="random", seeds=4, dt=0.01)  # fmt: skip
    rows = [
        [int(n), *[float(v) for v in row]] for n, row in zip(quantile.ns, quantile.w1, strict=True)
    ]
    rows.append(["rate (quantile)", *map(float, quantile.rate)])
    rows += [
        [f"{int(n)} (random)", *[float(v) for v in row]]
        for n, row in zip(random.ns, random.w1, strict=True)
    ]
    rows.append(["rate (random)", *map(float, random.rate)])
    rows.append([f"PDE {cells} vs {2 * cells} cells", *map(float, quantile.pde_error)])
    rows.append(["W1(rho(t), rho(0))", *map(float, quantile.displacement)])
    tab = table(
        ["n", *[f"W1 at t = {t:g}" for t in quantile.times]],
        rows,
        f"(SA, beta = 4, start e^(cos theta) / (2 pi I_0(1)); PDE: {cells} cells, MC-limited "
        f"finite volumes, SSP-RK3, CFL 0.25; mass error {quantile.mass_error:.1e}, min density "
        f"{quantile.min_density:.3g}; particles RK4 dt = 0.01 float64; random: mean of 4 seeds)",
    )
    return tab, {"quantile": quantile.to_dict(), "random": random.to_dict()}, quantile


def phase_table(config, store) -> tuple[str, dict, object]:
    report = SweepReport(0, 0, "")
    ds = phase_diagram(config, store=store, executor="dask", n_workers=2, overwrite=True,
                       report=report)  # fmt: skip
    summary = summarize(ds)
    rows = []
    for beta in config.betas:
        row = [beta]
        for dim in config.dims:
            hit = next(r for r in summary["rows"] if r["dim"] == dim and r["beta"] == beta)
            row.append(hit["half_merged_time"] if hit["half_merged_time"] is not None else math.nan)
        eq = ds.equiangular_time.sel(beta=beta).item()
        row.append(eq)
        rows.append(row)
    tab = table(
        ["beta", *[f"d = {d}: t(P >= 1/2)" for d in config.dims], "equiangular t*"],
        rows,
        f"({config.normalization.upper()}, n = {config.n_particles}, {config.n_systems} random "
        f"starts x all pairs, delta = {config.delta}; RK4 dt = {config.dt}, saved every "
        f"{config.t_max / (config.frames - 1):g}; '-': not by t = {config.t_max:g}; "
        f"{report.tasks_run} Dask tasks on {len(report.workers)} workers, one Zarr region each)",
    )
    return tab, summary, ds


def meta_table(betas, fit_min_beta) -> tuple[str, dict, object]:
    results = {}
    rows = []
    for norm, clock in (("sa", "paper"), ("usa", "rescaled")):
        result = metastability(
            betas, normalization=norm, time=clock, seeds=4, t_cap=2e5, fit_min_beta=fit_min_beta
        )
        results[f"{norm}-{clock}"] = result
        for beta, med in zip(result.betas, result.median_times, strict=True):
            rows.append([f"{norm} ({clock})", float(beta), float(med)])
        label = f"beta >= {fit_min_beta:g}"
        rows.append([f"{norm} ({clock})", f"slope of log T, {label}", result.slope])
        rows.append([f"{norm} ({clock})", f"slope of log(T beta), {label}", result.slope_corrected])
        rows.append([f"{norm} ({clock})", "predicted 1 - cos(pi/2)", result.predicted_slope])
    tab = table(
        ["dynamics", "beta", "median first merge"],
        rows,
        "(3 caps at e_1, -e_1, e_2 on the circle, 4 particles each, radius 0.1, 4 seeds; "
        "adaptive Dormand-Prince rtol 1e-8, float64; merge: cluster count (eps = 1e-2) below 3)",
    )
    return tab, {k: v.to_dict() for k, v in results.items()}, results["sa-paper"]


KEYS = ("jacobian", "first_plateau", "growth", "pde", "phase", "metastability")
DOC = Path(__file__).resolve().parents[1] / "docs" / "meanfield.md"
DATA = DOC.parent / "data" / "meanfield" / "tables.json"


def blocks(data: Path) -> list[tuple[str, str, str]]:
    """The doc's generated blocks, one per table, rendered from ``tables.json``."""
    tables = json.loads(data.read_text())
    return [
        (f"<!-- generated by scripts/meanfield_tables.py: {key} -->",
         f"<!-- end generated: {key} -->", render(tables[key]))
        for key in KEYS
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--check" in argv or "--write" in argv:
        return _docblock.main(
            argv, "docs/meanfield.md's tables from tables.json", DOC, DATA, blocks,
            "meanfield_tables.py",
        )  # fmt: skip
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/meanfield-tables"))
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)
    quick = args.quick
    sections, tables, data, results = [], {}, {}, {}
    started = time.perf_counter()

    def section(key, title, func, *a):
        t0 = time.perf_counter()
        out = func(*a)
        tables[key] = out[0]
        sections.append(
            f"### {title}\n\n{render(out[0])}\n\n(computed in {time.perf_counter() - t0:.0f} s)"
        )
        print(sections[-1], "\n", flush=True)
        return out

    _, data["jacobian"] = section(
        "jacobian", "Closed-form growth rates against particle Jacobians", jacobian_check
    )
    _, data["first_plateau"] = section(
        "first_plateau", "k_max against the first plateau", plateau_table,
        (1, 4, 16) if quick else BETAS, 128 if quick else 256, 2 if quick else 4,
    )  # fmt: skip
    results["cluster_prediction"] = data["first_plateau"]
    _, data["growth"], fits = section(
        "growth", "Linear-phase growth rates", growth_table, (4, 16) if quick else (4, 16, 49), 256
    )
    results["growth_fits"] = [f for f in fits if f.beta == 16]
    _, data["pde"], results["pde"] = section(
        "pde", "PDE against particles", pde_table,
        (32, 64, 128) if quick else (64, 128, 256, 512, 1024, 2048),
        (32, 64) if quick else (64, 128, 256, 512, 1024), 512 if quick else 2048,
    )  # fmt: skip
    config = (
        PhaseDiagramConfig(dims=(2, 8), betas=(0.0, 2.0, 4.0), t_max=10, frames=21, n_systems=8)
        if quick
        else PhaseDiagramConfig(n_systems=32)
    )
    _, data["phase"], results["phase_diagram"] = section(
        "phase", "Phase diagram", phase_table, config, args.out / "phase_diagram.zarr"
    )
    _, data["metastability"], results["metastability"] = section(
        "metastability", "Metastability", meta_table,
        (2, 4, 6) if quick else (2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12), 4 if quick else 6,
    )  # fmt: skip
    from tokenfield._io import write_json_atomic
    from tokenfield.viz.meanfield import meanfield_html, write_meanfield_figures

    (args.out / "tables.md").write_text("\n\n".join(sections) + "\n")
    write_json_atomic(args.out / "tables.json", tables)
    write_json_atomic(args.out / "results.json", data)
    write_meanfield_figures(results, args.out / "figures")
    (args.out / "meanfield.html").write_text(meanfield_html(results))
    print(f"wrote {args.out} in {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

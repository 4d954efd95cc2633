"""The conformance suite of ``tokenfield theory conformance``: each item runs a small
experiment with the library's own functions, draws its figure, and is judged
against its published reference (the items are described in
:mod:`tokenfield.meanfield.conformance`, which keeps the pure measures);
:func:`write_conformance` writes ``conformance.json``, ``conformance.html`` and
``figures/ITEM.png``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from scipy import stats
from scipy.integrate import solve_ivp

from tokenfield._io import write_atomic, write_json_atomic
from tokenfield._progress import plural
from tokenfield._version import __version__
from tokenfield.analysis.clusters import count_changes
from tokenfield.errors import ParameterError, UserError
from tokenfield.meanfield.conformance import (
    STUCK_FIELD,
    ItemResult,
    classify_circle_states,
    polar_angles,
    sectoral_gradient,
    staircase,
    stuck_spectrum,
)
from tokenfield.meanfield.convergence import pde_vs_particles
from tokenfield.meanfield.metastability import metastability
from tokenfield.meanfield.phase import PhaseDiagramConfig, equiangular_rate, phase_diagram
from tokenfield.meanfield.phase import starts as phase_starts
from tokenfield.meanfield.predict import cluster_prediction
from tokenfield.meanfield.references import circle_angles, projected_euler_merged_fraction
from tokenfield.meanfield.stability import (
    circulant_mode_eigenvalues,
    discrete_growth_rates,
    equispaced_jacobian,
    growth_rates,
    sphere_quadrature,
    weighted_linearization,
)
from tokenfield.particles import Adaptive, Dynamics, SaveAt, simulate
from tokenfield.particles.init import orthogonal, uniform
from tokenfield.pipelines.conformance_causal import renyi_centres_item
from tokenfield.pipelines.conformance_periodic import periodic_clusters_item
from tokenfield.viz.conformance import (
    conformance_html,
    figure_png,
    plot_equiangular,
    plot_kmax,
    plot_pde_rates,
    plot_phase_rows,
    plot_staircase,
    plot_sync,
)

__all__ = ["ITEMS", "run_item", "run_suite", "write_conformance"]

# The staircase's dynamics check against the independent integration: plateau times
# within this distance in log t (saved frames are ~0.08 apart in log t), and E(t).
STAIRCASE_TIME_TOL = 0.2
STAIRCASE_ENERGY_TOL = 1e-3


def _simulate(beta, x0, *, normalization="usa", time="paper", t_max, dt, solver="rk4", times):

    return simulate(
        Dynamics(beta=beta, normalization=normalization, time=time),
        x0,
        t_max=t_max,
        dt=dt,
        solver=solver,
        saveat=SaveAt(times=tuple(float(t) for t in times)),
    ).states.values


def equiangular_item(quick: bool = False) -> ItemResult:

    n, d, t_max = 5, 7, 3.0
    times = np.linspace(0, t_max, 31)
    curves, worst, spread = {}, 0.0, 0.0
    for normalization in ("sa", "usa"):
        for beta in (0.5, 2.0) if quick else (0.5, 2.0, 5.0):
            # adaptive: USA in paper time is stiff near rho = 1 at larger beta
            # (the rate's slope is ~2 e^beta, past RK4's stability at dt = 0.01 for beta = 5)
            states = _simulate(
                beta, orthogonal(n, d, seed=0), normalization=normalization,
                t_max=t_max, dt=0.01, solver=Adaptive(rtol=1e-10, atol=1e-12), times=times,
            )  # fmt: skip
            gram = np.einsum("tid,tjd->tij", states, states)
            upper = np.triu_indices(n, 1)
            off = gram[:, upper[0], upper[1]]
            ode = solve_ivp(
                lambda _t, r, b=beta, z=normalization: [equiangular_rate(r[0], b, n, z)],
                (0, t_max), [0.0], t_eval=times, rtol=1e-12, atol=1e-13,
            ).y[0]  # fmt: skip
            worst = max(worst, float(np.abs(off.mean(1) - ode).max()))
            spread = max(spread, float(np.ptp(off, axis=1).max()))
            curves[f"{normalization}, beta = {beta:g}"] = (off.mean(1), ode)
    tol = 1e-7

    return ItemResult(
        name="equiangular",
        reference="rho' = 2 e^{beta rho} (1 - rho)(1 + (n-1) rho) / Z (GLPR 2023, Thm 6.8)",
        measured=f"max |rho_particles - rho_ODE| = {worst:.1e}; spread of <x_i,x_j> {spread:.1e}",
        tolerance=f"<= {tol:g} (Dormand-Prince, rtol 1e-10)",
        passed=worst <= tol and spread <= tol,
        details={"n": n, "dim": d, "max_error": worst, "max_spread": spread},
        figure=plot_equiangular(times, curves),
    )


def phase_diagram_item(quick: bool = False) -> ItemResult:

    betas = (0.1, 3.0, 9.0) if quick else (0.1, 0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 7.0, 9.0)
    systems = 4 if quick else 64
    grids: dict[str, np.ndarray] = {}
    reference: dict[str, np.ndarray] = {}
    for normalization, clock in (("sa", "paper"), ("usa", "rescaled")):
        for solver in ("rk4", "projected-euler"):
            config = PhaseDiagramConfig(
                dims=(2,), betas=betas, t_max=30.0, frames=31, n_particles=32,
                n_systems=systems, delta=0.001, normalization=normalization, time=clock,
                dt=0.1, solver=solver, beta_block=len(betas),
            )  # fmt: skip
            ds = phase_diagram(config)
            grids[f"{normalization}/{solver}"] = ds["merged_probability"].sel(dim=2).values
        # the published algorithm in plain NumPy (no tokenfield vector field), same starts
        x0 = phase_starts(config, 2).numpy()
        reference[normalization] = np.stack(
            [
                projected_euler_merged_fraction(
                    x0,
                    beta,
                    normalization=normalization,
                    rescaled=clock == "rescaled",
                    t_max=config.t_max,
                    dt=config.dt,
                    frames=config.frames,
                    delta=config.delta,
                )
                for beta in betas
            ]
        )  # (beta, time)
    gaps = {
        f"{z}/{solver}": float(np.abs(grids[f"{z}/{solver}"] - reference[z]).max())
        for z in ("sa", "usa")
        for solver in ("projected-euler", "rk4")
    }
    same = max(gaps[f"{z}/projected-euler"] for z in ("sa", "usa"))
    integrators = max(gaps[f"{z}/rk4"] for z in ("sa", "usa"))
    final = {k: v[:, -1] for k, v in grids.items()}
    # d = 2 clusters fully at small beta by t = 30; large beta is slower (metastable)
    merged_small = min(final[f"{z}/rk4"][0] for z in ("sa", "usa"))
    slower_large = all(final[f"{z}/rk4"][-1] < final[f"{z}/rk4"][0] for z in ("sa", "usa"))
    tol_same, tol_rk4 = 0.01, 0.1

    times = np.linspace(0, 30, 31)
    return ItemResult(
        name="phase-diagram",
        reference="GLPR 2023 Fig. (d=2, n=32, beta 0.1..9, t<=30, share of pairs > 0.999), "
        "recomputed by an independent NumPy projected Euler (the published script's "
        "algorithm) from the same starts; all pairs merge at small beta, slower at large beta",
        measured=(
            f"max |P - P_NumPy| over (beta, t): projected Euler SA {gaps['sa/projected-euler']:.3f}, "
            f"USA {gaps['usa/projected-euler']:.3f}; RK4 SA {gaps['sa/rk4']:.3f}, "
            f"USA {gaps['usa/rk4']:.3f}; P(t=30, beta=0.1) >= {merged_small:.2f}; "
            f"P(t=30) at beta=9 vs 0.1: SA {final['sa/rk4'][-1]:.2f} vs {final['sa/rk4'][0]:.2f}, "
            f"USA {final['usa/rk4'][-1]:.2f} vs {final['usa/rk4'][0]:.2f}"
        ),
        tolerance=f"projected Euler within {tol_same:g} of NumPy, RK4 within {tol_rk4:g} "
        "(the integrators' difference) at every (beta, t); P(t=30, beta=0.1) >= 0.95, "
        "decreasing to beta=9",
        passed=same <= tol_same
        and integrators <= tol_rk4
        and merged_small >= 0.95
        and slower_large,
        details={
            "betas": betas,
            "systems": systems,
            "difference_from_reference": gaps,
            "final": {k: v for k, v in final.items()},
            "reference_final": {z: v[:, -1] for z, v in reference.items()},
        },  # fmt: skip
        figure=plot_phase_rows(
            times, betas, {**grids, **{f"{z}/NumPy reference": reference[z] for z in reference}}
        ),
    )


def circle_sync_item(quick: bool = False) -> ItemResult:

    betas = (
        (-3.0, -1.0, -0.16, 0.5, 2.0)
        if quick
        else (-3.0, -2.0, -1.0, -0.8, -0.67, -0.5, -0.3, -0.16, 0.0, 0.5, 1.0, 2.0)
    )
    ns = (3, 5, 32) if quick else (3, 4, 5, 6, 7, 8, 32)
    starts = 16 if quick else 64
    t_max = 150.0 if quick else 400.0
    table: dict[str, dict[str, Any]] = {}
    stable_found, bad_high, moving_high = [], [], 0
    for n in ns:
        x0 = uniform(n, 2, seed=100 + n, batch=starts)
        for beta in betas:
            states = _simulate(
                beta, x0, t_max=t_max, dt=0.05, solver=Adaptive(rtol=1e-9, atol=1e-12),
                times=(t_max,),
            )[:, -1]  # fmt: skip
            labels, norms = classify_circle_states(states, beta)
            row = {
                "sync": float((labels == "sync").mean()),
                "stuck": int((labels == "stuck").sum()),
                "moving": int((labels == "moving").sum()),
            }
            spectra = []
            for s in np.flatnonzero(labels == "stuck")[:4]:
                top = stuck_spectrum(polar_angles(states[s]), beta)
                spectra.append(top)
                (stable_found if top < 0 else []).append(
                    {
                        "n": n,
                        "beta": beta,
                        "theta": np.sort(np.mod(polar_angles(states[s]), 2 * np.pi)),
                        "top_eigenvalue": top,
                    }  # fmt: skip
                )
            row["stuck_top_eigenvalues"] = spectra
            table[f"n={n}, beta={beta:g}"] = row
            if beta >= -0.16:
                if row["stuck"]:
                    bad_high.append((n, beta))
                moving_high += row["moving"]
    low_betas = [b for b in betas if b < -2 / 3]
    stable_low = [f for f in stable_found if f["beta"] < -2 / 3]
    sync_high = min(table[f"n={n}, beta={b:g}"]["sync"] for n in ns for b in betas if b >= -0.16)
    passed = not bad_high and sync_high >= 0.95 and (not low_betas or len(stable_low) > 0)

    example = stable_low[0] if stable_low else None
    return ItemResult(
        name="circle-synchronisation",
        reference="PRY 2025: synchronisation from almost every start for beta >= -0.16; "
        "fails for beta < -2/3 (stable non-synchronised stationary points exist)",
        measured=(
            f"beta >= -0.16: min fraction synchronised {sync_high:.2f}, stuck {len(bad_high)}, "
            f"not yet merged {moving_high}; beta < -2/3: {len(stable_low)} stable "
            f"non-synchronised stationary states found"
            + (
                f" (e.g. n={example['n']}, beta={example['beta']:g}, top eigenvalue "
                f"{example['top_eigenvalue']:.3g})"
                if example
                else ""
            )
        ),
        tolerance=f"no stuck state and >= 95 % synchronised for beta >= -0.16 (t = {t_max:g}); "
        f">= 1 stable stuck state for beta < -2/3 (field < {STUCK_FIELD:g}, Jacobian max < 0)",
        passed=passed,
        details={
            "betas": betas,
            "ns": ns,
            "starts": starts,
            "t_max": t_max,
            "table": table,
            "stable_examples": stable_low[:6],
        },  # fmt: skip
        figure=plot_sync(betas, ns, table, stable_low[:3]),
    )


def linear_stability_item(quick: bool = False) -> ItemResult:
    jac_err = 0.0
    for normalization in ("usa", "sa"):
        for beta in (-2.0, 0.5, 4.0, 16.0):
            n = 64
            modes = circulant_mode_eigenvalues(
                equispaced_jacobian(n, beta, normalization=normalization)
            )
            ref = discrete_growth_rates(np.arange(n), beta, n, normalization=normalization)
            jac_err = max(jac_err, float(np.abs(modes - ref).max() / np.abs(modes).max()))
        points, weights = sphere_quadrature(3, 40)
        for beta in (-3.0, 4.0):
            rates = growth_rates(range(5), beta, dim=3, normalization=normalization)
            for degree in (1, 2, 3, 4):
                xi = sectoral_gradient(points, degree)
                moved = weighted_linearization(
                    points, weights, xi, beta, normalization=normalization
                )
                err = np.abs(moved - rates[degree] * xi).max() / np.abs(xi).max()
                jac_err = max(jac_err, float(err / np.abs(rates).max()))
    betas = (2.0, 9.0) if quick else (1.0, 2.0, 4.0, 9.0, 16.0, 25.0, 49.0)
    prediction = cluster_prediction(
        betas, n_particles=64 if quick else 256, seeds=2 if quick else 4, noise=1e-3
    )
    rows = prediction.rows()
    gaps = [abs(r["median_count"] - r["k_max"]) for r in rows]
    gap = max(gaps) if all(math.isfinite(g) for g in gaps) else math.inf
    tol_jac, tol_gap = 1e-8, 1.5

    return ItemResult(
        name="linear-stability",
        reference="lambda_l = l(l+d-2) mu_l(beta)/beta (SA: / mu_0) vs the n-particle Jacobian; "
        "k_max(beta) = argmax lambda_k vs the first cluster plateau",
        measured=f"max rel. error of the rates {jac_err:.1e} (circle n=64, S^2 quadrature, "
        f"beta incl. < 0); max |median first plateau - k_max| = {gap:g}",
        tolerance=f"rates <= {tol_jac:g}; plateau within {tol_gap:g} of k_max",
        passed=jac_err <= tol_jac and gap <= tol_gap,
        details={"jacobian_error": jac_err, "plateau_rows": rows},
        figure=plot_kmax(rows),
    )


def staircase_item(quick: bool = False) -> ItemResult:

    n, beta = 32, 12.0
    # quick: to t = 2e3 (the first merge after the clusters form is at t ~ 40; the
    # plateau after it is long), frames ~0.08 apart in log t as in the full suite
    t_max = 2e3 if quick else 1e5
    times = np.concatenate([[0.0], np.geomspace(0.1, t_max, 120 if quick else 300)])
    runs = 1 if quick else 3
    level_err, jump_err, merges, series = 0.0, 0.0, 0, []
    time_err, energy_gap, level_times = 0.0, 0.0, []
    for seed in range(runs):
        run = staircase_dynamics(uniform(n, 2, seed=7 + seed), beta, times)
        energy, level, counts, masses = run["energy"], run["level"], run["counts"], run["masses"]
        time_err = max(time_err, run["time_error"])
        energy_gap = max(energy_gap, run["energy_gap"])
        level_times.append(run["level_times"])
        formed = times >= 20.0  # the clusters have formed (a few e-folds of the linear phase)
        # frames within a plateau: the count equals that of both neighbours
        steady = (
            formed
            & (np.r_[counts[1:], counts[-1]] == counts)
            & (np.r_[counts[0], counts[:-1]] == counts)
        )
        level_err = max(level_err, float(np.abs(energy - level)[steady].max()))
        for change in count_changes(counts, times):
            if not change.is_merge or change.time < 20.0:
                continue
            i = int(np.searchsorted(times, change.time))
            # plateau to plateau: the last steady frame before, the first one after
            pre, post = np.flatnonzero(steady[:i]), np.flatnonzero(steady[i:]) + i
            if not pre.size or not post.size:
                continue
            before, after = masses[pre[-1]] * n, masses[post[0]] * n
            if before.size != after.size + 1:
                continue
            jump = float(energy[post[0]] - energy[pre[-1]])
            # the merged pair: the sizes that left the multiset
            left = list(np.round(before).astype(int))
            for w in np.round(after).astype(int):
                if w in left:
                    left.remove(w)
            if len(left) == 2:
                predicted = 2 * left[0] * left[1] / n**2
                jump_err = max(jump_err, abs(jump - predicted))
                merges += 1
        series.append((energy, level, counts))
    meta = metastability(
        (4.0, 6.0, 8.0) if quick else (4.0, 6.0, 8.0, 10.0, 12.0),
        normalization="sa", seeds=1 if quick else 4, t_cap=2e5,
    )  # fmt: skip
    tol_level, tol_slope = 0.02, 0.25
    tol_time, tol_energy = STAIRCASE_TIME_TOL, STAIRCASE_ENERGY_TOL
    slope_ok = math.isfinite(meta.slope_corrected) and meta.slope_corrected > 0
    slope_ok &= abs(meta.slope_corrected - meta.predicted_slope) <= tol_slope
    consistent = level_err <= tol_level and jump_err <= tol_level and merges >= 1
    dynamics_ok = time_err <= tol_time and energy_gap <= tol_energy

    return ItemResult(
        name="metastable-staircase",
        reference="GKPR 2024: E on plateaus at sum_k w_k^2/n^2, jumps 2 w_i w_j/n^2 at merges; "
        "log plateau length ~ c beta (c = 1 - cos Delta_0 = 1 for caps at pi/2); plateau "
        "times and E(t) of an independent integration (NumPy angle ODE, SciPy DOP853)",
        measured=f"dynamics: max |log t_k - log t_k(ref)| over the times the count first "
        f"reaches each k {time_err:.3g}, max |E - E_ref| {energy_gap:.2g}; consistency: max "
        f"|E - sum w_k^2/n^2| on plateaus {level_err:.2g}, max jump error {jump_err:.2g} over "
        f"{plural(merges, 'merge')} (SA, n={n}, beta={beta:g}); slope of log(T beta) "
        f"{meta.slope_corrected:.3f} (log T: {meta.slope:.3f})",
        tolerance=f"dynamics: plateau times within {tol_time:g} in log t, E within "
        f"{tol_energy:g}; consistency checks (hold for any tight clusters): levels and jumps "
        f"<= {tol_level:g}, >= 1 merge; slope within {tol_slope:g} of {meta.predicted_slope:g}",
        passed=dynamics_ok and consistent and slope_ok,
        details={
            "n": n,
            "beta": beta,
            "plateau_time_error": time_err,
            "energy_gap": energy_gap,
            "level_times": level_times,
            "level_error": level_err,
            "jump_error": jump_err,
            "merges": merges,
            "metastability": meta.to_dict(),
        },  # fmt: skip
        figure=plot_staircase(times, series, meta),
    )


def staircase_dynamics(x0: torch.Tensor, beta: float, times: np.ndarray) -> dict[str, Any]:
    """One SA run from ``x0`` ``(n, 2)`` saved at ``times``, beside an independent
    integration of the same start (:func:`~tokenfield.meanfield.references.circle_angles`:
    NumPy angles, SciPy DOP853).

    Returns the run's ``energy``, ``level``, ``counts``, ``masses`` (:func:`staircase`),
    ``time_error`` (max over ``k`` of ``|log t_k - log t_k(ref)|``, ``t_k`` the first
    saved time the cluster count is ``<= k``; ``inf`` when the runs end on different
    counts), ``energy_gap`` (max ``|E - E_ref|``) and ``level_times``.
    """
    states = _simulate(
        beta, x0, normalization="sa", t_max=float(times[-1]), dt=0.1, solver="adaptive",
        times=times,
    )  # fmt: skip
    energy, level, counts, masses = staircase(states, times, beta)
    angles = circle_angles(np.arctan2(x0[:, 1].numpy(), x0[:, 0].numpy()), beta, times)
    ref_energy, _, ref_counts, _ = staircase(
        np.stack([np.cos(angles), np.sin(angles)], axis=-1), times, beta
    )
    ours, theirs = _level_times(counts, times), _level_times(ref_counts, times)
    time_error = 0.0
    if counts[-1] != ref_counts[-1] or ours.keys() != theirs.keys():
        time_error = math.inf
    else:
        for k in ours:
            time_error = max(time_error, abs(math.log(ours[k] / theirs[k])))
    return {
        "energy": energy,
        "level": level,
        "counts": counts,
        "masses": masses,
        "time_error": time_error,
        "energy_gap": float(np.abs(energy - ref_energy).max()),
        "level_times": {"tokenfield": ours, "reference": theirs},
    }


def _level_times(counts: np.ndarray, times: np.ndarray) -> dict[int, float]:
    """The first saved time at which the cluster count is ``<= k``, for every ``k``
    from the final count up to (not including) the starting count."""
    return {
        int(k): float(times[np.argmax(counts <= k)])
        for k in range(int(counts.min()), int(counts[0]))
    }


def interval_within(interval: Any, reference: float, tol: float) -> bool:
    """PASS by the interval, not the point estimate: ``[low, high]`` lies inside
    ``[reference - tol, reference + tol]`` (a NaN bound fails)."""
    low, high = (float(v) for v in interval)
    return reference - tol <= low <= high <= reference + tol


def _slope_interval(ns: np.ndarray, w1: np.ndarray) -> tuple[float, float, float]:
    """Slope of log W1 vs log n, with a 95 % interval: over seeds (``w1`` ``(N, S)``,
    one slope per seed) or, for one seed, from the regression's standard error."""

    logn = np.log(ns)
    if w1.shape[1] > 1:
        slopes = np.array([np.polyfit(logn, np.log(w1[:, s]), 1)[0] for s in range(w1.shape[1])])
        _mean, sem = float(slopes.mean()), float(slopes.std(ddof=1) / math.sqrt(slopes.size))
        half = float(stats.t.ppf(0.975, slopes.size - 1)) * sem
        # the fit of the seed-mean W1 (what PDEComparison.rate reports) is the estimate
        slope = float(np.polyfit(logn, np.log(w1.mean(axis=1)), 1)[0])
        return slope, slope - half, slope + half
    fit = stats.linregress(logn, np.log(w1[:, 0]))
    half = float(stats.t.ppf(0.975, ns.size - 2)) * fit.stderr
    return float(fit.slope), float(fit.slope) - half, float(fit.slope) + half


def pde_item(quick: bool = False) -> ItemResult:

    cells = 256 if quick else 2048
    times = (0.0, 1.0, 2.0)
    quantile = pde_vs_particles(
        4.0, normalization="sa", ns=(32, 64, 128) if quick else (64, 128, 256, 512, 1024),
        times=times, cells=cells, dt=0.01,
    )  # fmt: skip
    # i.i.d. starts: enough seeds that the whole 95 % interval, not only the estimate,
    # decides (RK4 at dt = 0.1 changes W1 by < 1e-6 here: measured against dt = 0.05)
    random = pde_vs_particles(
        4.0, normalization="sa",
        ns=(16, 32, 64, 128, 256) if quick else (64, 128, 256, 512, 1024),
        times=times, cells=cells, sampling="random", seeds=64 if quick else 32,
        dt=0.1 if quick else 0.05,
    )  # fmt: skip
    q = _slope_interval(quantile.ns, quantile.w1_per_seed[:, :, -1])
    r = _slope_interval(random.ns, random.w1_per_seed[:, :, -1])
    tol = 0.2
    passed = interval_within(q[1:], -1.0, tol) and interval_within(r[1:], -0.5, tol)

    return ItemResult(
        name="mean-field-pde",
        reference="W1(particles, PDE) ~ n^-1 (quantile starts), n^-1/2 (i.i.d. starts)",
        measured=f"rate at t = {times[-1]:g}: quantile {q[0]:.3f} [{q[1]:.3f}, {q[2]:.3f}], "
        f"i.i.d. {r[0]:.3f} [{r[1]:.3f}, {r[2]:.3f}] (95 % intervals; i.i.d. over "
        f"{random.w1_per_seed.shape[1]} seeds)",
        tolerance=f"the whole 95 % interval within {tol:g} of the reference rate",
        passed=passed,
        details={
            "quantile": quantile.to_dict(),
            "random": random.to_dict(),
            "quantile_rate": q,
            "random_rate": r,
        },  # fmt: skip
        figure=plot_pde_rates(quantile, random),
    )


ITEMS: dict[str, Callable[[bool], ItemResult]] = {
    "equiangular": equiangular_item,
    "phase-diagram": phase_diagram_item,
    "circle-synchronisation": circle_sync_item,
    "linear-stability": linear_stability_item,
    "metastable-staircase": staircase_item,
    "mean-field-pde": pde_item,
    "causal-renyi-centres": renyi_centres_item,
    "periodic-clusters": periodic_clusters_item,
}


def run_item(name: str, quick: bool = False) -> ItemResult:
    """Run one item (timed; torch on one thread, restored after)."""

    if name not in ITEMS:
        raise UserError(f"unknown conformance item {name!r}", f"use one of {', '.join(ITEMS)}")
    return _timed(ITEMS[name], quick)


def _timed(item: Callable[[bool], ItemResult], quick: bool) -> ItemResult:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    started, cpu = time.perf_counter(), time.process_time()
    try:
        result = item(quick)
    finally:
        torch.set_num_threads(threads)
    result.seconds = time.perf_counter() - started
    result.cpu_seconds = time.process_time() - cpu
    return result


def _run_in_worker(item: Callable[[bool], ItemResult], quick: bool) -> ItemResult:
    """An item in a worker process (``item`` travels by reference, so a replaced
    entry of :data:`ITEMS` runs too); the figure comes back as PNG bytes."""
    result = _timed(item, quick)
    if result.figure is not None:
        result.figure = figure_png(result.figure)
    return result


def run_suite(
    only: str | None = None,
    quick: bool = False,
    progress: Callable[[str], None] | None = None,
    finished: Callable[[ItemResult], None] | None = None,
    workers: int = 1,
) -> list[ItemResult]:
    """Run every item (or ``only`` one) in the documented order; ``progress(name)``
    is called as an item starts, ``finished(result)`` as it ends. ``workers > 1``
    runs the items in that many processes at once (each on one torch thread: the
    numbers are those of a sequential run); results come back in the documented order."""
    names = list(ITEMS) if only is None else [only]
    if only is not None and only not in ITEMS:
        raise UserError(f"unknown conformance item {only!r}", f"use one of {', '.join(ITEMS)}")
    if int(workers) < 1:
        raise ParameterError("workers", f"{{name}} must be >= 1, not {workers}", "pass {name} 1")
    progress = progress or (lambda _name: None)
    finished = finished or (lambda _result: None)
    if workers == 1 or len(names) == 1:
        results = []
        for name in names:
            progress(name)
            results.append(run_item(name, quick))
            finished(results[-1])
        return results
    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    done: dict[str, ItemResult] = {}
    context = multiprocessing.get_context("spawn")  # no forked torch thread pools
    pool = ProcessPoolExecutor(min(int(workers), len(names)), mp_context=context)
    try:
        waiting = list(names)
        running: dict[Any, str] = {}
        while waiting or running:
            while waiting and len(running) < int(workers):
                name = waiting.pop(0)
                progress(name)
                running[pool.submit(_run_in_worker, ITEMS[name], quick)] = name
            ready, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in ready:
                result = future.result()
                done[running.pop(future)] = result
                finished(result)
    except BaseException:
        # an interrupt or a failed item: stop the other workers now, do not wait for them
        for process in list(getattr(pool, "_processes", {}).values()):
            process.terminate()
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()
    return [done[name] for name in names]


def write_conformance(
    out: str | Path, results: list[ItemResult], *, quick: bool, only: str | None, started: float
) -> list[dict[str, Any]]:
    """Write ``OUT/conformance.json``, ``OUT/conformance.html`` and each item's figure
    ``OUT/figures/ITEM.png`` (atomically); ``started`` is the suite's
    ``time.perf_counter()`` at its start. Returns the items as JSON data."""
    out = Path(out)
    (out / "figures").mkdir(parents=True, exist_ok=True)
    pngs = {}
    for result in results:
        if result.figure is not None:
            figure = result.figure  # a Figure, or PNG bytes from a worker process
            pngs[result.name] = figure if isinstance(figure, bytes) else figure_png(figure)
            write_atomic(out / "figures" / f"{result.name}.png", pngs[result.name])
    items = [r.to_dict() for r in results]
    meta = {
        "version": __version__,
        "quick": quick,
        "only": only,
        "created": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "seconds": round(time.perf_counter() - started, 3),
        # the process's CPU time (all threads, imports included): on shared machines
        # the wall clock says more about the neighbours than about the suite
        "cpu_seconds": round(time.process_time(), 1),
    }
    write_json_atomic(out / "conformance.json", {**meta, "items": items})
    write_atomic(out / "conformance.html", conformance_html(items, pngs, meta).encode())
    return items

"""The mean-field commands: ``tokenfield theory stability``, ``clusters``, ``pde``,
``phase-diagram`` and ``metastability`` (also under their older flat names,
hidden: ``tokenfield stability``, ``predict-clusters``, ...).

Each computes with :mod:`tokenfield.meanfield`, prints a table (or JSON with
``--json``), and with ``--out`` writes its JSON and figures. Bad input fails
before anything is computed or written.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated, Any

import typer

from tokenfield.cli._app import theory_command
from tokenfield.cli._options import (
    BETA_HELP,
    Beta,
    Betas,
    Dim,
    Json,
    Seeds,
    Time,
    TMax,
    echo_json,
    limit_threads,
    out_option,
    overwrite_option,
    refuse_existing,
    seed_option,
)
from tokenfield.cli._options import linspace as _linspace
from tokenfield.cli._options import numbers as _numbers
from tokenfield.errors import ParameterError, UserError

DYNAMICS_HELP = "sa: softmax attention; usa: unnormalised (weights / n)."
# --normalization is the library's parameter name; --dynamics its older spelling.
NORMALIZATION = ("--normalization", "--dynamics")
N_PARTICLES = ("--n-particles", "--n")
OVERWRITE_HELP = "Replace this command's earlier JSON and figures in --out."
# --out and --overwrite of the commands that write JSON + figures into a directory
ResultsOut = Annotated[Path | None, out_option(help="Directory for JSON + figures.")]
Overwrite = Annotated[bool, overwrite_option(help=OVERWRITE_HELP)]


def _dynamics(value: str) -> str:
    if value not in ("sa", "usa"):
        raise UserError(f"unknown --normalization '{value}'", "use sa or usa")
    return value


def _time(value: str) -> str:
    if value not in ("paper", "rescaled"):
        raise UserError(f"unknown --time '{value}'", "use paper or rescaled")
    return value


def _out_dir(out: Path | None, *, lock: bool = True) -> Path | None:
    if out is None:
        return None
    from tokenfield.runs import check_writable_dir

    if out.exists() and not out.is_dir():
        raise UserError(f"--out '{out}' is a file", "pass a directory")
    check_writable_dir(out)
    from tokenfield._lock import hold_for_command

    if lock:
        hold_for_command(out)  # one writer per output directory, until the command ends
    return out


def dask_workers(dask: bool, workers: int | None) -> int | None:
    """The local Dask cluster's size for ``--workers`` (and the old ``--dask``,
    alone two workers), or None to run in this process."""
    if workers is not None and workers < 1:
        raise UserError(f"--workers {workers} must be >= 1", "pass --workers 2 or more for Dask")
    if dask:
        return workers or 2
    return workers if workers is not None and workers > 1 else None


def _refuse(out: Path | None, name: str, overwrite: bool) -> None:
    if out is not None:
        refuse_existing([out / f"{name}.json"], overwrite)


def _emit(data: dict[str, Any], out: Path | None, name: str, as_json: bool) -> None:
    from tokenfield.pipelines.meanfield import write_result

    if out is not None:
        write_result(data, out, name)
    if as_json:
        echo_json(data)


def _figures(results: dict[str, Any], out: Path | None, console: Any) -> None:
    if out is None:
        return
    from tokenfield.pipelines.meanfield import write_figures

    paths = write_figures(results, out)
    console.print(f"wrote {out} ({len(paths)} figure files)")


@theory_command(
    "stability",
    epilog=(
        "Examples: tokenfield theory stability --dim 2 --beta 25;  "
        "tokenfield theory stability --dim 3 --betas 1:100 --out kmax.png"
    ),
)
def stability_command(
    dim: Dim = 2,
    beta: Annotated[float | None, typer.Option("--beta", help=BETA_HELP)] = None,
    beta_range: Annotated[
        str | None,
        typer.Option(
            "--betas",
            "--beta-range",
            help="A:B or A:B:N (or a list): draw k_max against beta over these betas.",
        ),
    ] = None,
    dynamics: Annotated[str, typer.Option(*NORMALIZATION, help=DYNAMICS_HELP)] = "usa",
    time: Time = "paper",
    max_mode: Annotated[
        int | None, typer.Option("--max-mode", help="Last mode listed (default ~2 sqrt(2 beta)).")
    ] = None,
    n: Annotated[
        int | None,
        typer.Option(*N_PARTICLES, help="Discrete rates of n equispaced particles (circle only)."),
    ] = None,
    out: Annotated[
        Path | None,
        out_option(
            help="A figure file (.png or .svg), or a directory for stability.json and "
            "figures/ (like the other mean-field commands)."
        ),
    ] = None,
    overwrite: Annotated[
        bool, overwrite_option(help="Replace an earlier figure or stability.json at --out.")
    ] = False,
    as_json: Json = False,
) -> None:
    """Growth rates of the modes of the uniform measure and k_max(beta).

    lambda_l = l (l + d - 2) mu_l(beta) / beta (USA), mu_l = Gamma(d/2) (2/beta)^{d/2-1}
    I_{l+d/2-1}(beta); SA divides by mu_0. On the circle: k^2 I_k(beta) / beta.
    """
    from rich.table import Table

    from tokenfield._progress import console as make_console
    from tokenfield.meanfield.stability import (
        k_max_curve,
        large_beta_formula,
        stability_spectrum,
    )

    dynamics, time = _dynamics(dynamics), _time(time)
    if (beta is None) == (beta_range is None):
        raise UserError("pass exactly one of --beta and --betas", "e.g. --beta 9")
    # --out FILE.png|svg writes that one figure; --out DIR (no suffix, or a directory)
    # writes DIR/stability.json and DIR/figures/*.png|svg, like every mean-field command.
    figure_file = out is not None and out.suffix.lower() in (".png", ".svg") and not out.is_dir()
    out_dir = None
    if figure_file:
        _out_dir(out.parent if str(out.parent) else Path("."), lock=False)  # type: ignore[union-attr]
    elif out is not None and out.suffix and not out.is_dir():
        raise UserError(
            f"--out '{out}' must end in .png or .svg, or name a directory",
            "e.g. --out kmax.png or --out mf/",
        )
    elif out is not None:
        out_dir = _out_dir(out)
    if figure_file:
        refuse_existing([out], overwrite)  # type: ignore[list-item]
    _refuse(out_dir, "stability", overwrite)
    console = make_console(stderr=as_json)  # stdout holds the JSON
    if beta is not None:
        spectrum = stability_spectrum(
            beta, dim=dim, normalization=dynamics, time=time, max_mode=max_mode, n_particles=n
        )
        data = spectrum.to_dict()
        if as_json:
            typer.echo(json.dumps(data, indent=2))
        else:
            label = "k" if dim == 2 else "l"
            table = Table(
                title=f"d = {dim}, beta = {beta:g}, {dynamics}, {time} time"
                + (f", n = {n}" if n else "")
            )
            for column in (label, "growth rate", "multiplicity"):
                table.add_column(column, justify="right")
            for k, rate, mult in zip(
                spectrum.modes, spectrum.growth_rates, spectrum.multiplicity, strict=True
            ):
                mark = f" <- {spectrum.mode_name}" if k == spectrum.k_max else ""
                table.add_row(str(k), f"{rate:.6g}{mark}", str(mult))
            console.print(table)
            nu = "" if dim == 2 else f" (nu = d/2 - 1 = {dim / 2 - 1:g})"
            console.print(
                f"{spectrum.mode_name} = {spectrum.k_max}   {large_beta_formula(dim)} = "
                f"{spectrum.large_beta_mode:.3f}{nu}"
            )
        if out_dir is not None:
            _emit(data, out_dir, "stability", as_json=False)
            _figures({"spectrum": spectrum}, out_dir, console)
        if figure_file:
            from tokenfield.viz.meanfield import plot_growth_rates

            plot_growth_rates(spectrum).savefig(out)
        return
    betas = _numbers(beta_range, "--betas")  # type: ignore[arg-type]
    if ":" in beta_range and len(beta_range.split(":")) == 2:  # type: ignore[union-attr]
        low, high = (float(v) for v in beta_range.split(":"))  # type: ignore[union-attr]
        betas = _linspace(low, high, max(2, min(400, int(round((high - low) * 4)) + 1)))
    curve = k_max_curve(betas, dim=dim, normalization=dynamics, time=time)
    if as_json:
        typer.echo(json.dumps(curve.to_dict(), indent=2))
    elif out is None:
        table = Table(title=f"{curve.mode_name} against beta, d = {dim}")
        for column in ("beta", curve.mode_name, large_beta_formula(dim)):
            table.add_column(column, justify="right")
        for b, k, s in zip(curve.betas, curve.k_max, curve.large_beta_mode, strict=True):
            table.add_row(f"{b:g}", str(k), f"{s:.3f}")
        console.print(table)
    if out_dir is not None:
        _emit(curve.to_dict(), out_dir, "stability", as_json=False)
        _figures({"k_max_curve": curve}, out_dir, console)
    if figure_file:
        from tokenfield.viz.meanfield import plot_k_max_curve

        plot_k_max_curve(curve).savefig(out)
        if not as_json:
            console.print(f"wrote {out}")


@theory_command(
    "clusters",
    old=("predict-clusters",),
    epilog=(
        "Example: tokenfield theory clusters --betas 1,4,16,49 --n-particles 256 --seeds 4 "
        "--out mf/"
    ),
)
def predict_clusters_command(
    betas: Betas = "1,4,9,16,25",
    dynamics: Annotated[
        str, typer.Option(*NORMALIZATION, help="sa, usa or both as 'usa,sa'.")
    ] = "usa,sa",
    n: Annotated[int, typer.Option(*N_PARTICLES, help="Particles on the circle.")] = 256,
    noise: Annotated[float, typer.Option(help="Angular noise of the equispaced start.")] = 1e-3,
    seeds: Seeds = 4,
    seed: Annotated[int, seed_option(help="First seed.")] = 0,
    growth_rates: Annotated[
        bool,
        typer.Option("--growth-rates", help="Also fit the linear-phase Fourier growth rates."),
    ] = False,
    out: ResultsOut = None,
    overwrite: Overwrite = False,
    as_json: Json = False,
) -> None:
    """Simulate near-equispaced starts on the circle and set the first plateau of the
    cluster count beside k_max(beta) (USA in rescaled time)."""
    from rich.table import Table

    from tokenfield._progress import ProgressBar
    from tokenfield._progress import console as make_console
    from tokenfield.meanfield.predict import cluster_prediction, growth_rate_experiment

    values = _numbers(betas, "--betas")
    norms = tuple(_dynamics(v.strip()) for v in dynamics.split(",") if v.strip())
    if not norms or any(b == 0 for b in values):
        raise UserError("--normalization must name sa and/or usa, and --betas must be != 0")
    if n < 4 or seeds < 1 or not (0 < noise < 1):
        raise UserError("need --n-particles >= 4, --seeds >= 1 and --noise in (0, 1)")
    out = _out_dir(out)
    _refuse(out, "cluster_prediction", overwrite)
    console = make_console(stderr=as_json)  # stdout holds the JSON
    steps = len(norms) * len(values) * (2 if growth_rates else 1)
    with limit_threads(1), ProgressBar("simulating", total=steps, unit="experiments") as bar:
        prediction = cluster_prediction(
            values, normalizations=norms, n_particles=n, noise=noise, seeds=seeds, seed=seed,
            progress=bar.advance,
        )  # fmt: skip
        fits = []
        if growth_rates:
            bar.update(label="growth rates")
        for m in norms if growth_rates else ():
            for b in values:
                fits.append(growth_rate_experiment(b, normalization=m, n_particles=n))
                bar.advance()
    rows = prediction.rows()
    data = {"rows": rows, "growth_rates": [f.to_dict() for f in fits]}
    if not as_json:
        table = Table(title=f"k_max against the first plateau, n = {n}, noise = {noise:g}")
        for column in ("dynamics", "beta", "k_max", "sqrt(2 beta)", "first plateau", "median"):
            table.add_column(column, justify="right")
        for r in rows:
            table.add_row(r["normalization"], f"{r['beta']:g}", str(r["k_max"]),
                          f"{r['sqrt_2beta']:.2f}",
                          " ".join(str(c) for c in r["first_plateau_counts"]),
                          f"{r['median_count']:g}")  # fmt: skip
        console.print(table)
        for fit in fits:
            worst = float(fit.relative_error.max())
            console.print(
                f"{fit.normalization} beta = {fit.beta:g}: fitted growth rates of modes 1..{fit.modes[-1]} "
                f"match lambda_k^(n) to {worst:.1e} (relative to max lambda)"
            )
    _emit(data, out, "cluster_prediction", as_json)
    _figures({"cluster_prediction": rows, "growth_fits": fits}, out, console)


@theory_command(
    "pde",
    epilog=(
        "Example: tokenfield theory pde --beta 4 --normalization sa --n-particles 64,128,256,512 "
        "--times 0,1,2,3 --out mf/"
    ),
)
def pde_command(
    beta: Beta = 4.0,
    dynamics: Annotated[str, typer.Option(*NORMALIZATION, help=DYNAMICS_HELP)] = "sa",
    time: Time = "paper",
    n: Annotated[
        str, typer.Option(*N_PARTICLES, help="Particle counts to compare, e.g. 64,128,256.")
    ] = "64,128,256,512",
    times: Annotated[str, typer.Option(help="Comparison times.")] = "0,1,2,3",
    cells: Annotated[int, typer.Option(help="Finite-volume cells.")] = 2048,
    kappa: Annotated[float, typer.Option(help="Start: the bump e^{kappa cos theta}.")] = 1.0,
    sampling: Annotated[str, typer.Option(help="quantile or random particle starts.")] = "quantile",
    seeds: Annotated[int, typer.Option(help="Random starts per n (sampling random).")] = 4,
    dt: Annotated[float, typer.Option(help="Particle RK4 step.")] = 0.01,
    out: ResultsOut = None,
    overwrite: Overwrite = False,
    as_json: Json = False,
) -> None:
    """Solve the mean-field PDE on the circle and compare it with n-particle runs (W1)."""
    from rich.table import Table

    from tokenfield._progress import console as make_console
    from tokenfield.meanfield.convergence import pde_vs_particles

    dynamics, time = _dynamics(dynamics), _time(time)
    ns = _numbers(n, "--n-particles", integer=True)
    moments = _numbers(times, "--times")
    if sampling not in ("quantile", "random"):
        raise UserError(f"unknown --sampling '{sampling}'", "use quantile or random")
    if not (math.isfinite(dt) and dt > 0) or seeds < 1:
        raise UserError("--dt must be > 0 and --seeds >= 1")
    out = _out_dir(out)
    _refuse(out, "pde_vs_particles", overwrite)
    console = make_console(stderr=as_json)  # stdout holds the JSON
    with limit_threads(1), make_console(stderr=True).status("solving"):
        result = pde_vs_particles(
            beta, normalization=dynamics, time=time, ns=ns, times=moments, kappa=kappa,
            cells=cells, sampling=sampling, seeds=seeds, dt=dt,
        )  # fmt: skip
    if not as_json:
        table = Table(title=f"W1(particles, PDE), {dynamics}, beta = {beta:g}, {sampling} start")
        table.add_column("n", justify="right")
        for t in result.times:
            table.add_column(f"t = {t:g}", justify="right")
        for count, row in zip(result.ns, result.w1, strict=True):
            table.add_row(str(count), *[f"{v:.3e}" for v in row])
        table.add_row("rate", *[f"{r:.3f}" for r in result.rate])
        table.add_row("PDE M vs 2M", *[f"{e:.1e}" for e in result.pde_error])
        console.print(table)
        console.print(f"mass error {result.mass_error:.1e}, min density {result.min_density:.3g}")
    _emit(result.to_dict(), out, "pde_vs_particles", as_json)
    _figures({"pde": result}, out, console)


@theory_command(
    "phase-diagram",
    epilog=(
        "Example: tokenfield theory phase-diagram --dims 2,8,32,128 --betas 0:9 --out mf/phase "
        "--workers 2\n\n"
        "Every task writes its own region of OUT/phase_diagram.zarr; run the same "
        "command again to resume. --workers N (N >= 2) starts a local Dask cluster; "
        "--scheduler tcp://host:8786 uses an existing one (OUT must be on a filesystem "
        "its workers share)."
    ),
)
def phase_diagram_command(
    out: Annotated[Path, out_option(help="Directory for the Zarr store, JSON, figure.")],
    dims: Annotated[str, typer.Option(help="Dimensions d.")] = "2,8,32,128",
    betas: Betas = "0:9",
    t_max: TMax = 30.0,
    frames: Annotated[int, typer.Option(help="Saved times.")] = 61,
    n: Annotated[int, typer.Option(*N_PARTICLES, help="Tokens per system.")] = 32,
    systems: Annotated[
        int, typer.Option("--seeds", "--systems", help="Random starts per (d, beta), batched.")
    ] = 32,
    delta: Annotated[
        float,
        typer.Option(
            "--eps",
            "--delta",
            help="Merged: <x_i, x_j> >= 1 - eps (0.001 is the statistic of the published "
            "figure: the share of pairs with <x_i, x_j> > 0.999).",
        ),
    ] = 0.1,
    dynamics: Annotated[str, typer.Option(*NORMALIZATION, help=DYNAMICS_HELP)] = "sa",
    time: Annotated[
        str | None,
        typer.Option(
            help="paper or rescaled (default: paper; rescaled for usa with projected-euler, "
            "the published script's step normalisation)."
        ),
    ] = None,
    dt: Annotated[float, typer.Option(help="Integrator step.")] = 0.1,
    integrator: Annotated[
        str,
        typer.Option(
            "--solver",
            "--integrator",
            help="rk4, or projected-euler (Euler step then renormalise: the published "
            "script's integrator), or euler.",
        ),
    ] = "rk4",
    pairs: Annotated[str, typer.Option(help="all pairs, or the first pair only.")] = "all",
    seed: Annotated[int, seed_option(help="Base seed.")] = 0,
    beta_block: Annotated[int, typer.Option("--beta-block", help="Betas per task.")] = 2,
    dask: Annotated[
        bool,
        typer.Option(
            "--dask",
            hidden=True,
            help="Old spelling: a local Dask cluster (2 workers unless --workers).",
        ),
    ] = False,
    scheduler: Annotated[
        str | None, typer.Option(help="Address of an existing Dask scheduler.")
    ] = None,
    workers: Annotated[
        int | None,
        typer.Option(
            help="Run the tasks on a local Dask cluster of N worker processes (N >= 2; "
            "default: in this process)."
        ),
    ] = None,
    overwrite: Annotated[bool, overwrite_option(help="Replace another sweep.")] = False,
    as_json: Json = False,
) -> None:
    """P(two tokens merged) over time, beta and d, with the equiangular ODE curve."""
    from tokenfield._progress import ProgressBar
    from tokenfield._progress import console as make_console
    from tokenfield.meanfield.phase import PhaseDiagramConfig, SweepReport, phase_diagram, summarize
    from tokenfield.runs import check_writable_dir

    if integrator not in ("rk4", "projected-euler", "euler"):
        raise UserError(f"unknown --solver '{integrator}'", "use rk4, projected-euler or euler")
    workers = dask_workers(dask, workers)
    use_dask = scheduler is not None or workers is not None
    if time is None:
        usa_script = integrator == "projected-euler" and _dynamics(dynamics) == "usa"
        time = "rescaled" if usa_script else "paper"
    try:
        config = PhaseDiagramConfig(
            dims=tuple(_numbers(dims, "--dims", integer=True)),
            betas=tuple(_numbers(betas, "--betas")),
            t_max=t_max, frames=frames, n_particles=n, n_systems=systems, delta=delta,
            normalization=_dynamics(dynamics), time=_time(time), dt=dt, solver=integrator,
            pairs=pairs,  # type: ignore[arg-type]
            seed=seed, beta_block=beta_block,
        )  # fmt: skip
    except ParameterError as exc:
        # The sweep's stored config names the merge threshold delta (a resumed
        # store compares it); on the command line it is --eps, as everywhere.
        raise exc.named("--eps") if exc.param == "delta" else exc from None
    if out.exists() and not out.is_dir():
        raise UserError(f"--out '{out}' is a file", "pass a directory")
    if scheduler is not None:
        from tokenfield._dask import reach_scheduler

        reach_scheduler(scheduler)  # a bad or silent address: one line, before any work
    check_writable_dir(out)
    from tokenfield._lock import hold_for_command

    # The client holds the lock for the whole sweep; Dask workers write their own
    # regions of the store under it.
    hold_for_command(out)
    console = make_console(stderr=as_json)  # stdout holds the JSON
    report = SweepReport(0, 0, "")
    out.mkdir(parents=True, exist_ok=True)
    with ProgressBar("sweeping", total=None, unit="tasks") as bar:
        ds = phase_diagram(
            config, store=out / "phase_diagram.zarr",
            executor="dask" if use_dask else "inprocess",
            scheduler=scheduler, n_workers=workers or 2, overwrite=overwrite, report=report,
            progress=lambda done, total: bar.update(total=total, completed=done),
        )  # fmt: skip
    summary = summarize(ds)
    summary["sweep"] = {
        "tasks_run": report.tasks_run,
        "tasks_skipped": report.tasks_skipped,
        "executor": report.executor,
        "scheduler": report.scheduler,
        "workers": len(report.workers),
    }
    if not as_json:
        console.print(
            f"{report.tasks_run} tasks run, {report.tasks_skipped} resumed, on {report.executor}"
        )
    _emit(summary, out, "phase_diagram", as_json)
    _figures({"phase_diagram": ds}, out, console)


@theory_command(
    "metastability",
    epilog=(
        "Example: tokenfield theory metastability --betas 2:12 --caps 3 --dim 2 --t-max 2e5 "
        "--fit-from 6 --out mf/\n\n"
        "A time shown as inf means no merge before --t-max: raise --t-max (T grows like "
        "e^beta) or fit over fewer betas."
    ),
)
def metastability_command(
    betas: Betas = "2:10",
    caps: Annotated[int, typer.Option(help="Number of separated caps k.")] = 3,
    dim: Dim = 2,
    per_cap: Annotated[int, typer.Option("--per-cap", help="Particles per cap.")] = 4,
    cap_radius: Annotated[float, typer.Option("--cap-radius", help="Cap radius (rad).")] = 0.1,
    dynamics: Annotated[str, typer.Option(*NORMALIZATION, help=DYNAMICS_HELP)] = "sa",
    time: Time = "paper",
    seeds: Seeds = 4,
    t_cap: Annotated[
        float, typer.Option("--t-max", "--t-cap", help="Give up after this time.")
    ] = 5000.0,
    fit_from: Annotated[
        float | None,
        typer.Option(
            "--fit-from",
            help="Fit the slope of log T over beta >= this value only (the asymptotic "
            "regime); default: every beta where all seeds merged.",
        ),
    ] = None,
    eps: Annotated[float, typer.Option(help="Cluster threshold.")] = 1e-2,
    out: ResultsOut = None,
    overwrite: Overwrite = False,
    as_json: Json = False,
) -> None:
    """First-merge times of k separated clusters against beta, and the slope of log T."""
    from rich.table import Table

    from tokenfield._progress import Stages
    from tokenfield._progress import console as make_console
    from tokenfield.meanfield.metastability import cap_centres, metastability

    values = _numbers(betas, "--betas")
    dynamics, time = _dynamics(dynamics), _time(time)
    if caps < 2 or per_cap < 1 or seeds < 1 or not (t_cap > 0):
        raise UserError("need --caps >= 2, --per-cap >= 1, --seeds >= 1 and --t-max > 0")
    cap_centres(caps, dim)
    out = _out_dir(out)
    _refuse(out, "metastability", overwrite)
    console = make_console(stderr=as_json)  # stdout holds the JSON
    with limit_threads(1), Stages("simulating", total=len(values)):
        result = metastability(
            values, k=caps, dim=dim, per_cap=per_cap, cap_radius=cap_radius,
            normalization=dynamics, time=time, seeds=seeds, eps=eps, t_cap=t_cap,
            fit_min_beta=fit_from,
        )  # fmt: skip
    if not as_json:
        table = Table(title=f"first merge of {caps} caps, d = {dim}, {dynamics} ({time} time)")
        for column in ("beta", "first merge (seeds)", "median"):
            table.add_column(column, justify="right")
        for b, row, med in zip(result.betas, result.merge_times, result.median_times, strict=True):
            table.add_row(f"{b:g}", " ".join(f"{t:.3g}" for t in row), f"{med:.4g}")
        console.print(table)
        fitted = "" if fit_from is None else f" over beta >= {fit_from:g}"
        console.print(
            f"slope of log T in beta{fitted}: {result.slope:.3f} "
            f"(log(T beta): {result.slope_corrected:.3f}); "
            f"predicted {result.predicted_slope:.3f}"
        )
    unmerged = [float(b) for b, row in zip(result.betas, result.merge_times, strict=True)
                if not all(math.isfinite(float(t)) for t in row)]  # fmt: skip
    if unmerged:
        # A hint, on stderr, also with --json.
        make_console(stderr=True).print(
            f"hint: no merge before --t-max {t_cap:g} at beta = "
            f"{', '.join(f'{b:g}' for b in unmerged)} (shown as inf, left out of the fit); "
            f"raise --t-max, e.g. --t-max {t_cap * 40:g}"
        )
    _emit(result.to_dict(), out, "metastability", as_json)
    _figures({"metastability": result}, out, console)

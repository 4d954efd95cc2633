"""``tokenfield simulate``: integrate the self-attention particle system into a run."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from tokenfield.cli._app import app, command
from tokenfield.cli._options import Device, out_option, overwrite_option, seed_option
from tokenfield.errors import UserError

DTYPES = ("float64", "float32")
ENSEMBLES = ("identity", "gaussian", "orthogonal", "symmetric")


@command(
    app,
    "simulate",
    epilog=(
        "Example: tokenfield simulate --normalization usa --dim 2 --n-particles 64 --beta 9 "
        "--t-max 30 --dt 0.05 --solver rk4 --init uniform --seed 1 --save-every 10 --out runs/circle\n\n"
        "Read it back with xarray.open_zarr('runs/circle/trajectory.zarr'), or run "
        "'tokenfield analyze runs/circle' for the energy, cluster count and figures. "
        "An interrupted simulation resumes when the same command is run again."
    ),
)
def simulate_command(
    out: Annotated[Path, out_option(help="Run directory to write.")],
    dynamics: Annotated[
        str,
        typer.Option(
            "--normalization",
            "--dynamics",
            help="sa: softmax attention (weights / Z_i); usa: unnormalised (weights / n).",
        ),
    ] = "sa",
    dim: Annotated[
        int | None,
        typer.Option(
            "--dim", "-d", help="Dimension d (particles on S^{d-1}). Default 3, or the run's."
        ),
    ] = None,
    n: Annotated[
        int | None,
        typer.Option(
            "--n-particles", "-n", "--n", help="Number of particles. Default 32, or the prompt's."
        ),
    ] = None,
    beta: Annotated[float, typer.Option(help="Inverse temperature beta.")] = 1.0,
    t_max: Annotated[float, typer.Option("--t-max", help="Final time T.")] = 10.0,
    dt: Annotated[
        float, typer.Option(help="Step (Euler: one residual layer); adaptive: first step tried.")
    ] = 0.1,
    integrator: Annotated[
        str,
        typer.Option("--solver", "--integrator", help="euler, projected-euler, rk4 or adaptive."),
    ] = "euler",
    init: Annotated[
        str,
        typer.Option(
            help="uniform, equispaced, orthogonal (needs d >= n), caps, or run:PATH or run:PATH@LAYER "
            "(a traced run's normalised tokens at that layer, default 0)."
        ),
    ] = "uniform",
    noise: Annotated[
        float, typer.Option(help="Gaussian noise added to the start, then renormalised.")
    ] = 0.0,
    seed: Annotated[int, seed_option(help="Seed for the start and the random matrices.")] = 0,
    save_every: Annotated[int, typer.Option("--save-every", help="Keep every K-th step.")] = 1,
    overwrite: Annotated[
        bool, overwrite_option(help="Replace a run made with another config.")
    ] = False,
    dtype: Annotated[str, typer.Option(help="float64 or float32.")] = "float64",
    device: Device = "cpu",
    causal: Annotated[
        bool, typer.Option("--causal", help="Token i attends to j <= i only.")
    ] = False,
    time: Annotated[
        str, typer.Option(help="paper, or rescaled: USA weights exp(beta(<x,y> - 1)) / n.")
    ] = "paper",
    state: Annotated[
        str,
        typer.Option(help="sphere (post-norm), prenorm (attention reads x/|x|) or free (R^d)."),
    ] = "sphere",
    matrices: Annotated[
        str,
        typer.Option(
            help="Q, K, V: identity, or random gaussian, orthogonal or symmetric (seeded)."
        ),
    ] = "identity",
    heads: Annotated[
        int, typer.Option(help="Attention heads (averaged); with random --matrices.")
    ] = 1,
    caps: Annotated[int, typer.Option(help="Number of caps for --init caps.")] = 2,
    cap_radius: Annotated[float, typer.Option("--cap-radius", help="Cap radius (radians).")] = 0.2,
    prompt_index: Annotated[
        int, typer.Option("--prompt-index", help="Which prompt of a run: init.")
    ] = 0,
    batch: Annotated[
        int | None,
        typer.Option(
            "--seeds", "--batch", help="Simulate this many independent systems at once (batched)."
        ),
    ] = None,
    rtol: Annotated[float, typer.Option(help="Adaptive: relative tolerance.")] = 1e-6,
    atol: Annotated[float, typer.Option(help="Adaptive: absolute tolerance.")] = 1e-9,
) -> None:
    """Simulate self-attention as interacting particles on the sphere.

    dx_i/dt = P_{x_i}^perp( sum_j exp(beta <Q x_i, K x_j>) V x_j / Z_i ), with
    Z_i the softmax normaliser (sa) or n (usa). States are saved as a run:
    states (time, particle, feature), time = ODE time.
    """
    import torch

    from tokenfield._device import parse_device
    from tokenfield._progress import ProgressBar
    from tokenfield.particles import Adaptive, Dynamics, SaveAt, random_matrices, simulate
    from tokenfield.particles.init import initial_condition
    from tokenfield.particles.integrate import check_times, get_solver

    if dtype not in DTYPES:
        raise UserError(f"unknown --dtype '{dtype}'", "use float64 or float32")
    if matrices not in ENSEMBLES:
        raise UserError(f"unknown --matrices '{matrices}'", f"use one of {', '.join(ENSEMBLES)}")
    if heads < 1:
        raise UserError(f"--heads must be >= 1, not {heads}")
    check_times(t_max, dt)  # beta, noise, n and dim are checked where they are used
    torch_device = parse_device(device)
    torch_dtype = getattr(torch, dtype)
    solver = Adaptive(rtol=rtol, atol=atol) if integrator == "adaptive" else get_solver(integrator)
    from_run = init.startswith("run:")
    if not from_run:
        _check_memory(n if n is not None else 32, dim if dim is not None else 3, batch, dtype)
    x0 = initial_condition(
        init,
        n if (n is not None or from_run) else 32,
        dim if (dim is not None or from_run) else 3,
        seed=seed,
        noise=noise,
        batch=batch,
        caps_count=caps,
        cap_radius=cap_radius,
        prompt_index=prompt_index,
    )
    d = int(x0.shape[-1])
    query = key = value = None
    if matrices != "identity" or heads > 1:
        query, key, value = (
            random_matrices(d, heads=heads, ensemble=matrices, seed=seed + 1000 * (i + 1))
            for i in range(3)
        )
    model = Dynamics(
        beta=beta,
        normalization=dynamics,
        query=query,
        key=key,
        value=value,
        causal=causal,
        state=state,
        time=time,
    )
    extra = {
        "init": {
            "spec": init,
            "noise": noise,
            "seed": seed,
            "caps": caps if init == "caps" else None,
            "cap_radius": cap_radius if init == "caps" else None,
            "prompt_index": prompt_index if from_run else None,
        },
        "matrices": {"ensemble": matrices, "heads": heads, "seed": seed},
    }
    from tokenfield._lock import hold_for_command
    from tokenfield._progress import console as make_console

    console = make_console(stderr=True)  # warnings and the bar; the result goes to stdout
    hold_for_command(out, what="run")
    if integrator != "adaptive":
        _warn_large_step(console, model, x0, dt)
    counter = "t = {task.completed:.3g} / {task.total:.3g}"
    saveat = SaveAt(every=save_every)
    with ProgressBar("simulate", total=t_max, counter=counter, transient=True) as bar:
        ds = simulate(
            model,
            x0,
            t_max=t_max,
            dt=dt,
            solver=solver,
            saveat=saveat,
            dtype=torch_dtype,
            device=torch_device,
            out=out,
            overwrite=overwrite,
            extra_config=extra,
            progress=lambda t: bar.update(completed=t),
        )
    make_console().print(
        f"wrote {ds.sizes['time']} states of {ds.sizes['particle']} particles in d = {d} to {out}"
    )


# Copies of the state a step holds at once (start, RK4 stages, the retraction,
# the frame kept for saving), with room to spare.
STATE_COPIES = 12


def _available_memory() -> int | None:
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _check_memory(n: int, dim: int, batch: int | None, dtype: str) -> None:
    """Refuse, before allocating anything, a system too large for this machine."""
    if n < 1 or dim < 1 or (batch is not None and batch < 1):
        return  # the initial condition reports these
    itemsize = 8 if dtype == "float64" else 4
    state = (batch or 1) * n * dim * itemsize
    need = state * STATE_COPIES
    available = _available_memory()
    if available is not None and need > available:
        raise UserError(
            f"--n {n} in d = {dim}{f' x {batch} systems' if batch else ''} needs about "
            f"{_size(need)} of memory ({_size(state)} per copy of the states); "
            f"{_size(available)} is available",
            "use a smaller --n, --dim or --batch",
        )


def _size(count: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if count < 1000 or unit == "TB":
            return f"{count:.3g} {unit}"
        count /= 1000
    return f"{count:.3g} TB"


def _warn_large_step(console, model, x0, dt: float) -> None:
    """Warn when one fixed step moves particles by a large angle (unstable integration).

    In the papers' time the USA velocity scales like exp(beta) / n, so at large beta a
    step that looks small can move a particle by radians. The check uses the
    velocity at the start and at a random configuration of the same size (a start
    near a fixed point, like equally spaced particles, has almost none); 0.1 rad
    per step is where Euler stops tracking the flow well.
    """
    import torch

    x = torch.as_tensor(x0, dtype=torch.float64)
    if x.ndim == 3:
        x = x[0]
    generator = torch.Generator().manual_seed(0)
    probe = torch.randn(x.shape, generator=generator, dtype=torch.float64)
    probe = probe / probe.norm(dim=-1, keepdim=True)
    field = model.to(torch.float64)
    speed = max(float(field.vector_field(0.0, y).norm(dim=-1).max()) for y in (x, probe))
    angle = speed * dt
    if angle > 0.1:
        suggestion = 0.05 / speed
        console.print(
            f"[yellow]warning:[/yellow] at t = 0 the fastest particle moves {angle:.2g} rad per "
            f"step; the fixed-step integration is likely inaccurate or unstable. Use --dt "
            f"{suggestion:.2g} or smaller, --solver adaptive, or --time rescaled."
        )

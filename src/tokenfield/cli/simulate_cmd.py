"""``tokenfield simulate``: integrate the self-attention particle system into a run."""

from __future__ import annotations

from typing import Annotated

import typer

from tokenfield.cli._app import app, command
from tokenfield.cli._options import (
    DIM,
    DIM_HELP,
    Beta,
    Device,
    RunOut,
    Time,
    TMax,
    overwrite_option,
    seed_option,
)


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
    out: RunOut,
    dynamics: Annotated[
        str,
        typer.Option(
            "--normalization",
            "--dynamics",
            help="sa: softmax attention (weights / Z_i); usa: unnormalised (weights / n).",
        ),
    ] = "sa",
    dim: Annotated[
        int | None, typer.Option(*DIM, help=f"{DIM_HELP} Default 3, or the run's.")
    ] = None,
    n: Annotated[
        int | None,
        typer.Option(
            "--n-particles", "-n", "--n", help="Number of particles. Default 32, or the prompt's."
        ),
    ] = None,
    beta: Beta = 1.0,
    t_max: TMax = 10.0,
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
    time: Time = "paper",
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
    from tokenfield._progress import console as make_console
    from tokenfield.pipelines.simulate import SimulationRecipe, simulate_run

    recipe = SimulationRecipe(
        normalization=dynamics, dim=dim, n_particles=n, beta=beta, t_max=t_max, dt=dt,
        solver=integrator, init=init, noise=noise, seed=seed, save_every=save_every,
        dtype=dtype, device=device, causal=causal, time=time, state=state,
        matrices=matrices, heads=heads, caps=caps, cap_radius=cap_radius,
        prompt_index=prompt_index, batch=batch, rtol=rtol, atol=atol,
    )  # fmt: skip
    console = make_console(stderr=True)  # warnings and the bar; the result goes to stdout
    ds = simulate_run(
        recipe, out, overwrite=overwrite, progress=True,
        warn=lambda message: console.print(f"[yellow]warning:[/yellow] {message}"),
    )  # fmt: skip
    make_console().print(
        f"wrote {ds.sizes['time']} states of {ds.sizes['particle']} particles in "
        f"d = {ds.sizes['feature']} to {out}"
    )

"""``tokenfield attractors``: is the layer map an attractor? (``docs/attractors.md``)"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tokenfield.cli._app import app
from tokenfield.cli._options import (
    Baseline,
    Bootstrap,
    Device,
    Json,
    OutInsteadOfRun,
    Seed,
    TraceRun,
    echo_json,
    numbers,
)


@app.command(
    "attractors",
    epilog=(
        "Example:\n\n"
        "tokenfield trace -m smollm2 -p replication-categories -o runs/r\n\n"
        "tokenfield attractors runs/r\n\n"
        "Writes RUN/attractors.json (summary and verdicts, the random-weight copy beside "
        "the model) and RUN/attractors.zarr (the arrays). Without --baseline, the "
        "random-weight copy is a seeded copy of the run's model. See docs/attractors.md."
    ),
)
def attractors_command(
    run: TraceRun,
    baseline: Baseline = None,
    out: OutInsteadOfRun = None,
    k: Annotated[int, typer.Option("--k", min=1, help="Singular values / FTLEs per block.")] = 4,
    thetas: Annotated[
        str | None,
        typer.Option(help="Perturbation angles in radians, increasing, e.g. 0.001,0.01,0.1,1."),
    ] = None,
    directions: Annotated[
        int, typer.Option(help="Random tangent directions per angle (16 or more).")
    ] = 16,
    blocks: Annotated[
        str | None,
        typer.Option(help="Start blocks of the perturbations and basins [default: ~6 spread]."),
    ] = None,
    ftle_stride: Annotated[
        int, typer.Option("--ftle-stride", help="FTLEs from every S-th start block.")
    ] = 1,
    pairs: Annotated[int, typer.Option(help="Prompt pairs per kind (same/different).")] = 48,
    lambdas: Annotated[int, typer.Option(help="Points on each great circle.")] = 11,
    max_iter: Annotated[
        int, typer.Option("--max-iter", help="Subspace iterations at most per spectrum.")
    ] = 40,
    tol: Annotated[float, typer.Option(help="Relative residual of the top singular pair.")] = 1e-3,
    spectra_prompts: Annotated[
        int | None,
        typer.Option("--spectra-prompts", help="Spectra and FTLEs on the first N prompts only."),
    ] = None,
    bootstrap: Bootstrap = 1000,
    random_copy: Annotated[
        bool, typer.Option("--random-copy/--no-random-copy", help="Measure a random copy too.")
    ] = True,
    device: Device = "cpu",
    workers: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Threads that measure at once, each on its own prompts and blocks (the "
            "numbers do not depend on it) [default: the command's torch threads (the idle "
            "cores) on a CPU, 1 on a GPU].",
            show_default=False,
        ),
    ] = None,
    seed: Seed = 0,
    as_json: Json = False,
) -> None:
    """Jacobian spectra, Lyapunov exponents, perturbation recovery and category basins
    of the last token's layer map, with verdicts in words."""
    import json

    import numpy as np

    from tokenfield.pipelines.attractors import attractors

    settings = dict(k=k, directions=directions, ftle_stride=ftle_stride, pairs=pairs,
                    lambdas=tuple(float(x) for x in np.linspace(0, 1, max(2, lambdas))),
                    max_iter=max_iter, tol=tol, spectra_prompts=spectra_prompts,
                    n_boot=bootstrap, random_copy=random_copy, device=device,
                    workers=workers, seed=seed)  # fmt: skip
    if thetas is not None:
        settings["thetas"] = tuple(numbers(thetas, "--thetas", ranges=False))
    if blocks is not None:
        settings["blocks"] = tuple(numbers(blocks, "--blocks", integer=True))
    path = attractors(run, baseline, out, progress=not as_json, **settings)
    data = json.loads(Path(path).read_text())
    if as_json:
        echo_json(data["verdicts"])
        return
    typer.echo(f"wrote {path}")
    for side in ("ftle", "ftle_random"):
        for item in data["verdicts"].get(side, []):
            typer.echo(f"{'random copy' if side.endswith('random') else 'model'}: {item['text']}")
    typer.echo(data["verdicts"]["basins"]["text"])

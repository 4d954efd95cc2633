"""``tokenfield lens``: a traced run measured against the mean-field theory."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tokenfield.cli._app import app, command
from tokenfield.cli._options import (
    Baseline,
    Device,
    Figures,
    Json,
    TraceRun,
    echo_json,
    numbers,
    overwrite_option,
    seed_option,
)


@command(
    app,
    "lens",
    epilog=(
        "Example:\n\n"
        "tokenfield trace -m smollm2 --positions all --attention --logit-lens -o runs/s\n\n"
        "tokenfield trace -m smollm2 --positions all --attention --random-weights -o runs/s-rw\n\n"
        "tokenfield lens runs/s --baseline runs/s-rw --simulate\n\n"
        "tokenfield lens runs/s --flow   (adds flow.json; theory.json is kept)\n\n"
        "Writes RUN/theory.json and RUN/figures/theory_*.png; 'tokenfield report' shows them. "
        "A later lens adds to theory.json: its sections and settings are kept unless "
        "--overwrite."
    ),
)
def lens_command(
    run: TraceRun,
    baseline: Baseline = None,
    simulate: Annotated[
        bool,
        typer.Option(
            "--simulate",
            help="Also simulate the particle system from the run's layer-0 tokens.",
        ),
    ] = False,
    eps: Annotated[
        float | None,
        typer.Option(
            help="Cluster threshold: link tokens with cos >= 1 - eps [default: 0.01, or "
            "the one theory.json was measured with]."
        ),
    ] = None,
    more_eps: Annotated[
        str | None,
        typer.Option(
            "--more-eps",
            help="Comma-separated coarser thresholds, or '' [default: 0.1,0.3, or theory.json's].",
        ),
    ] = None,
    permutations: Annotated[
        int | None,
        typer.Option(
            help="Label shuffles in the probes' permutation null [default: 20, or theory.json's]."
        ),
    ] = None,
    sim_beta: Annotated[
        float | None, typer.Option("--sim-beta", help="Simulation beta (default: fitted).")
    ] = None,
    sim_dt: Annotated[
        float | None, typer.Option("--sim-dt", help="Simulation step per layer (default: fitted).")
    ] = None,
    heads: Annotated[
        bool,
        typer.Option(
            "--fit-heads",
            "--heads",
            help="Also fit the effective beta with each layer's own heads (loads the "
            "model named in the run; llama-family models).",
        ),
    ] = False,
    flow: Annotated[
        bool,
        typer.Option(
            "--flow",
            help="Also run the attention-only flow (loads the model named in the run; needs "
            "--positions all): the full block, the attention sub-layer only, the identity "
            "step with the fitted beta and a random-weight copy's attention, from each "
            "prompt's layer-0 cloud. Writes RUN/flow.json and RUN/flow.html.",
        ),
    ] = False,
    flow_eps: Annotated[
        float, typer.Option("--flow-eps", help="Cluster threshold of the flow table.")
    ] = 0.1,
    seed: Annotated[
        int | None,
        seed_option(help="Seed of the probes' folds and shuffles [default: 0, or theory.json's]."),
    ] = None,
    figures: Figures = True,
    overwrite: Annotated[
        bool,
        overwrite_option(
            help="Measure theory.json afresh with only the options given (without it, lens "
            "adds to theory.json: its sections and settings are kept)."
        ),
    ] = False,
    device: Device = "cpu",
    as_json: Json = False,
) -> None:
    """Token clouds, attention as Markov chains, effective beta, probes, logit lens.

    Measures a traced run the way the self-attention particle theory would and
    writes RUN/theory.json (and figures). Sections the run cannot support are
    skipped with a note: clouds and beta need --positions all, the attention
    section needs --attention, the lens needs --logit-lens.
    """
    from tokenfield._progress import console as make_console
    from tokenfield.errors import UserError
    from tokenfield.pipelines.theory import lens_settings, model_of_run
    from tokenfield.runs import check_results_writable, read_run_info

    info = read_run_info(run)  # a clear error before any work
    if baseline is not None:
        read_run_info(baseline)
    extra = None
    if more_eps is not None:
        extra = (
            tuple(numbers(more_eps, "--more-eps", ranges=False, example="0.1,0.3"))
            if more_eps.strip()
            else ()
        )
    if permutations is not None and permutations < 0:
        raise UserError(f"--permutations must be >= 0, got {permutations}")
    if flow and info.kind == "trace" and info.config.get("positions") != "all":
        raise UserError(  # before theory.json is written, not after
            "the attention-only flow needs a run traced with --positions all",
            "trace it again with --positions all, or drop --flow",
        )
    settings = lens_settings(
        run, eps=eps, more_eps=extra, permutations=permutations, seed=seed,
        baseline=baseline, simulate=simulate, sim_beta=sim_beta, sim_dt=sim_dt,
        heads=heads, flow=flow, overwrite=overwrite,
    )  # fmt: skip
    if settings.baseline is not None and baseline is None:
        read_run_info(settings.baseline)  # the recorded baseline must still be there
    check_results_writable(run, "lens")  # a read-only run fails now, not after the work
    console = make_console(stderr=True)  # progress and notes; results go to stdout
    results = None if as_json else make_console()
    model = baseline_model = None
    if settings.heads and settings.measure:
        with console.status("loading the models"):
            model = model_of_run(run, device=device)
            baseline_model = (
                None
                if settings.baseline is None
                else model_of_run(settings.baseline, device=device)
            )
    data: dict = {}
    if settings.measure:
        path, result = _measure(run, settings, model, baseline_model, figures)
        for note in result.notes:
            console.print(f"[yellow]note:[/yellow] {note}")
        if results is not None:
            _summary(results, result)
    else:
        from tokenfield.analysis.theory import THEORY_JSON

        path = run / THEORY_JSON
        console.print(
            f"[yellow]note:[/yellow] kept {path} as it was (pass --overwrite to measure it again)"
        )
    if settings.kept and settings.measure:
        console.print(
            f"[yellow]note:[/yellow] added to the earlier {path.name}: kept "
            f"{', '.join(settings.kept)} (pass --overwrite to measure only what is given)"
        )
    if as_json:  # stdout holds the JSON: theory.json (and flow.json), the rest on stderr
        import json

        data["theory"] = json.loads(path.read_text())
        if settings.measure:
            console.print(f"[green]wrote[/green] {path}")
        if flow:
            flow_path = _flow(console, None, run, model, flow_eps, settings.seed, device)
            data["flow"] = json.loads(flow_path.read_text())
        echo_json(data)
        return
    if settings.measure:
        results.print(f"[green]wrote[/green] {path}")
    if flow:
        _flow(console, results, run, model, flow_eps, settings.seed, device)


def _measure(run: Path, settings, model, baseline_model, figures: bool):
    """Measure and write theory.json with a progress bar; returns (path, result)."""
    from tokenfield._progress import ProgressBar
    from tokenfield.pipelines.theory import theory_lens, write_theory

    with ProgressBar(f"lens {run}", total=None, unit="steps") as bar:
        steps = {"total": 0, "started": False}

        def step(label: str, total: int | None = None) -> None:
            if steps["started"]:
                bar.advance()  # the previous step is done
            steps["started"] = True
            if total is not None:
                steps["total"] = total + int(figures)  # figures: one more step
            bar.update(total=steps["total"], label=label)

        result = theory_lens(
            run,
            **settings.lens_arguments(),
            model=model,
            baseline_model=baseline_model,
            progress=step,
        )
        if figures:
            step("figures")
        path = write_theory(run, result, figures=figures)
        bar.advance()
    return path, result


def _flow(console, results, run: Path, model, eps: float, seed: int, device: str = "cpu") -> Path:
    """The attention-only flow: RUN/flow.json, RUN/flow.html and a table (on
    ``results``; none when it is ``None``). Returns the path of flow.json."""
    from rich.table import Table

    from tokenfield.pipelines.flow import attention_flow, write_flow
    from tokenfield.pipelines.theory import model_of_run
    from tokenfield.runs import open_run

    ds = open_run(run).load()
    if model is None:
        with console.status("loading the model"):
            model = model_of_run(run, device=device)
    with console.status("attention-only flow") as status:
        result = attention_flow(
            model, real=ds, eps=eps, seed=seed,
            progress=lambda v: status.update(f"attention-only flow: {v}"),
        )  # fmt: skip
    path = write_flow(run, result)
    if results is None:
        console.print(f"[green]wrote[/green] {path}")
        return path
    table = Table(title=f"attention-only flow ({result.model})")
    for column in ("layer", "flow", f"clusters@{eps:g}", "mean cos", "rank@0.999", "dist (rad)"):
        table.add_column(column, justify="right")
    last = result.time.size - 1
    for row in result.rows(sorted({0, 1, last // 2, last})):
        table.add_row(str(row[0]), row[1], *(f"{v:.3g}" for v in row[2:]))
    results.print(table)
    results.print(f"[green]wrote[/green] {path}")
    return path


def _summary(console, result) -> None:
    """A few headline numbers."""
    import numpy as np
    from rich.table import Table

    from tokenfield.viz.theory import MIN_R2, NO_FIT  # betas only where R^2 >= 0.01

    table = Table(title="through the lens of the theory", show_lines=False)
    table.add_column("measure")
    table.add_column("first layer", justify="right")
    table.add_column("middle", justify="right")
    table.add_column("last layer", justify="right")

    def row(label: str, values, r2=None) -> None:
        if values is None:
            return
        values = np.asarray(values, dtype=float)
        where = [0, len(values) // 2, len(values) - 1]
        cells = [f"{values[i]:.3g}" for i in where]
        if r2 is not None:  # a fit that explains nothing has no meaningful beta
            r2 = np.asarray(r2, dtype=float)
            cells = [c if r2[i] >= MIN_R2 else NO_FIT for c, i in zip(cells, where, strict=True)]
        table.add_row(label, *cells)

    if result.clouds is not None:
        row("mean cosine", result.clouds.mean("mean_cos"))
        row("clusters", result.clouds.mean("cluster_count"))
    if result.baseline_clouds is not None:
        row("mean cosine, random weights", result.baseline_clouds.mean("mean_cos"))
    if result.simulated is not None:
        row("mean cosine, simulation", result.simulated.clouds.mean("mean_cos"))
    if result.beta is not None:
        row("effective beta", result.beta.column("beta"), result.beta.column("r2"))
        row("R^2 explained", result.beta.column("r2"))
    if result.beta_heads is not None:
        row("R^2 explained, own heads", result.beta_heads.column("r2"))
    if result.attention is not None:
        row("sink mass", result.attention.head_mean("sink_mass"))
        row("gap, sink dropped", result.attention.head_mean("gap_nosink"))
    for name, curve in result.probes.items():
        row(f"probe accuracy ({name})", curve.accuracy)
    if result.lens is not None:
        row("logit lens top-1", result.lens.top1)
    console.print(table)
    from tokenfield.viz.theory import probe_claim

    for name, curve in result.probes.items():
        console.print(probe_claim(name, curve.to_dict()))

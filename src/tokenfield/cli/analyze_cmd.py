"""``tokenfield analyze``: measure a run and draw its figures."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tokenfield.cli._app import app, command
from tokenfield.cli._options import Figures, Json, echo_json, overwrite_option, seed_option

# The flag of each analysis option that metrics.json records.
OPTION_FLAGS = {"times": "--times", "sphere": "--sphere", "per_layer": "--per-layer",
                "seed": "--seed", "n_permutations": "--permutations",
                "particles": "--particles"}  # fmt: skip


@command(
    app,
    "analyze",
    epilog=(
        "Example: tokenfield analyze runs/spectrum --baseline runs/spectrum-random\n\n"
        "Writes RUN/metrics.json, RUN/projection.npz (the PCA frame, reusable for "
        "later runs) and RUN/figures/. Analysing again with the same options replaces "
        "them; with other options (or another --baseline) it needs --overwrite."
    ),
)
def analyze_command(
    run: Annotated[Path, typer.Argument(help="Run directory (from trace or simulate).")],
    baseline: Annotated[
        Path | None,
        typer.Option(
            "--baseline",
            "-b",
            help="A baseline run (e.g. traced with --random-weights), analysed side by side.",
        ),
    ] = None,
    sphere: Annotated[
        bool, typer.Option("--sphere", help="PCA of the states normalised to the unit sphere.")
    ] = False,
    per_layer: Annotated[
        bool, typer.Option("--per-layer", help="Also fit one PCA per layer.")
    ] = False,
    seed: Annotated[int, seed_option(help="Seed of the permutation null.")] = 0,
    permutations: Annotated[
        int, typer.Option("--permutations", help="Shuffled labelings for the null.")
    ] = 200,
    particles: Annotated[
        str,
        typer.Option(help="'last': each prompt's last token (as the seed); 'all': every token."),
    ] = "last",
    figures: Figures = True,
    times: Annotated[
        str,
        typer.Option(
            "--times",
            help=(
                "Which layers of a trace enter the analysis. 'seed': times 0..L-1 (the embedding "
                "and blocks 1..L-1), exactly what the seed experiment's hidden_states[:-1] held; "
                "'all': times 0..L (also the raw output of the last block). PC1-vs-depth is "
                "reported under both either way."
            ),
        ),
    ] = "seed",
    overwrite: Annotated[
        bool,
        overwrite_option(
            help="Replace an analysis made with other options: metrics.json, projection.npz "
            "and analyze's figures are deleted first (lens's theory.json and figures stay)."
        ),
    ] = False,
    as_json: Json = False,
) -> None:
    """Measure a run: PCA paths, depth ordering, speed, separation, bifurcations.

    Works on traced and simulated runs; category measures need a traced run
    with categories. Prints a short summary and writes metrics.json and figures/.
    """
    import time

    from rich.table import Table

    from tokenfield._progress import Stages
    from tokenfield._progress import console as make_console
    from tokenfield.analysis.metrics import summary_rows
    from tokenfield.errors import UserError
    from tokenfield.pipelines.analyze import analyze_run
    from tokenfield.runs import read_run_info

    if times not in ("seed", "all"):
        raise UserError(f"unknown --times '{times}'", "use --times seed or --times all")
    read_run_info(run)  # a missing or damaged run fails here, before any work
    from tokenfield.runs import check_results_writable

    check_results_writable(run, "analyze")  # read-only: one line now, not after the analysis
    if baseline is not None:
        from tokenfield.runs import check_baseline

        check_baseline(run, baseline)  # same kind, dimension and prompts, or one line
    asked = {"times": times, "sphere": sphere, "per_layer": per_layer, "seed": seed,
             "n_permutations": permutations, "particles": particles}  # fmt: skip
    _earlier_analysis(run, asked, baseline, overwrite)
    console = make_console()  # the table and "wrote": the spinner is on stderr
    started = time.perf_counter()
    with Stages(f"analysing {run}"):
        metrics = analyze_run(
            run,
            baseline=baseline,
            sphere=sphere,
            per_layer=per_layer,
            seed=seed,
            n_permutations=permutations,
            particles=particles,
            figures=figures,
            times=times,
        )
    rows = summary_rows(metrics)
    has_baseline = bool(metrics.get("baseline"))
    wrote = (
        f"wrote {run / 'metrics.json'} and {len(metrics.get('figures', []))} figure files "
        f"in {time.perf_counter() - started:.1f} s"
    )
    if as_json:
        keys = ("measure", "run", "baseline") if has_baseline else ("measure", "run")
        echo_json({"run": str(run), "kind": metrics["info"]["kind"],
                   "rows": [dict(zip(keys, row, strict=False)) for row in rows]})  # fmt: skip
        make_console(stderr=True).print(wrote)
        return
    table = Table(title=f"{run}  ({metrics['info']['kind']})")
    table.add_column("measure")
    table.add_column("run", justify="right")
    if has_baseline:
        table.add_column("baseline", justify="right")
    for name, value, base in rows:
        table.add_row(name, value, *([base or ""] if has_baseline else []))
    console.print(table)
    console.print(wrote)


def _earlier_analysis(run: Path, asked: dict, baseline: Path | None, overwrite: bool) -> None:
    """Refuse to replace an analysis made with other options unless ``overwrite``;
    with it, delete analyze's own outputs first (so no figure of the earlier
    options is left behind). The same options: the analysis is simply redone."""
    import json

    from tokenfield.errors import UserError
    from tokenfield.runs import (
        LENS_FIGURE_PREFIX,
        METRICS_JSON,
        PROJECTION_NPZ,
        figures_dir,
        is_figure,
    )

    path = run / METRICS_JSON
    if not path.is_file():
        return
    if overwrite:
        figures = figures_dir(run, create=False)
        mine = [f for f in sorted(figures.iterdir()) if is_figure(f.name)
                and not f.name.startswith(LENS_FIGURE_PREFIX)] if figures.is_dir() else []  # fmt: skip
        for target in (*mine, run / PROJECTION_NPZ, path):  # metrics.json last
            if target.is_file() and not target.is_symlink():
                target.unlink()
        return
    try:
        earlier = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return  # a damaged metrics.json is simply replaced
    options = earlier.get("options") or {}
    if (earlier.get("info") or {}).get("kind") != "trace":
        asked = {k: v for k, v in asked.items() if k != "times"}  # recorded as "all"
    differ = [OPTION_FLAGS[k] for k, v in asked.items() if k in options and options[k] != v]
    if earlier.get("baseline_run", None) != (None if baseline is None else str(baseline)):
        differ.append("--baseline")
    if differ:
        raise UserError(
            f"'{path}' holds an analysis made with another {', '.join(differ)}",
            "pass --overwrite to replace it, or analyse a copy of the run",
        )

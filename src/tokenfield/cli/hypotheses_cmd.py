"""``tokenfield hypotheses``: the source material's other claims, measured on a traced run.

Writes ``OUT/hypotheses.json`` (``OUT`` defaults to the run): ``order`` (the depth
"order" panel), ``convex_fit`` (attention as a convex fit, per layer), and
``next_embedding`` (the next token's embedding along depth), and the same under
``baseline`` for ``--baseline``. See docs/theory-lens.md.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from tokenfield.cli._app import app
from tokenfield.cli._options import (
    Baseline,
    Bootstrap,
    Json,
    OutInsteadOfRun,
    Seed,
    TraceRun,
    echo_json,
)


@app.command(
    "hypotheses",
    epilog=(
        "Example:\n\n"
        "tokenfield trace -m smollm2 -p replication-categories -o runs/s\n\n"
        "tokenfield trace -m smollm2 -p replication-categories --random-weights -o runs/s-rw\n\n"
        "tokenfield hypotheses runs/s --baseline runs/s-rw\n\n"
        "Loads the run's model and runs every prompt again on its own (the run's "
        "positions do not matter). Writes RUN/hypotheses.json (or --out DIR/hypotheses.json)."
    ),
)
def hypotheses_command(
    run: TraceRun,
    baseline: Baseline = None,
    out: OutInsteadOfRun = None,
    max_prompts: Annotated[
        int | None,
        typer.Option("--max-prompts", help="Use at most N prompts, evenly across categories."),
    ] = None,
    convex_prompts: Annotated[
        int,
        typer.Option(
            "--convex-prompts",
            help="Prompts for the convex fit (its cost: one exact NNLS per position pair, "
            "layer and head).",
        ),
    ] = 40,
    shuffles: Annotated[
        int, typer.Option("--shuffles", help="Target shuffles per head (the shuffle null).")
    ] = 199,
    bootstrap: Bootstrap = 1000,
    seed: Seed = 0,
    as_json: Json = False,
) -> None:
    """Measure the order panel, attention as a convex fit and the next-token embedding."""
    from tokenfield.pipelines.hypotheses import (
        HypothesesSettings,
        check_out,
        hypotheses,
        write_hypotheses,
    )
    from tokenfield.runs import read_run_info

    settings = HypothesesSettings(
        max_prompts=max_prompts,
        convex_prompts=convex_prompts,
        bootstrap=bootstrap,
        shuffles=shuffles,
        seed=seed,
    )
    read_run_info(run)  # a bad RUN, BASELINE or --out fails before any model loads
    if baseline is not None:
        read_run_info(baseline)
    check_out(out if out is not None else run)
    result = hypotheses(
        run,
        baseline=baseline,
        settings=settings,
        progress=lambda m: print(f"tokenfield: {m}", file=sys.stderr, flush=True),
    )
    path = write_hypotheses(result, out if out is not None else run)
    if as_json:
        echo_json(result)
        return
    typer.echo(f"wrote {path}")
    from tokenfield.runs.layout import HYPOTHESES_HTML

    section = path.parent / HYPOTHESES_HTML
    typer.echo(f"wrote {section} (a report section: tokenfield report RUN --section {section})")
    for key in ("", "baseline"):
        part = result if not key else result.get(key)
        if part is None:
            continue
        typer.echo(f"{'trained' if not key else 'baseline'} ({part['model']['name']}):")
        for name, row in part["order"].items():
            typer.echo(
                f"  {name:34s} slope {row['slope']:+.4f}  R^2 {row['r2']:.2f}  "
                f"monotone {row['monotone_fraction']:.2f}  {row['verdict']}"
            )
        shares = [
            layer["share_passing"] for layer in part["convex_fit"]["targets"]["next_embedding"]
        ]
        typer.echo(f"  convex fit (next embedding): heads passing by layer {shares}")

"""``--overwrite`` removes every file an analysis derived from a run.

The derived files are found by running the writers themselves (``analyze``, the
theory lens, the attention-only flow) on a synthetic trace, never from a list kept
here; a re-trace of the run with ``overwrite`` must leave none of them behind
(``tokenfield.runs.DERIVED`` and ``is_figure`` are what it deletes). That every figure
``analyze`` draws is one ``is_figure`` names is
``tests/unit/test_hardening_io.py::test_every_figure_tokenfield_draws_is_one_overwrite_deletes``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.unit.synthetic_trajectories import clustered, trace_dataset, write_run


@pytest.fixture
def analysed_run(tmp_path) -> tuple[Path, set[str]]:
    """A synthetic trace with every derived file written by its writer, and the
    names (relative paths) those writers added."""
    from tokenfield.analysis.flow import VARIANTS, AttentionFlow
    from tokenfield.analysis.theory import TheoryLens
    from tokenfield.pipelines.analyze import analyze_run
    from tokenfield.pipelines.flow import write_flow
    from tokenfield.pipelines.hypotheses import write_hypotheses
    from tokenfield.pipelines.theory import write_theory

    states, labels = clustered(n_per_category=3, n_time=4, n_feature=8)
    ds = trace_dataset(states, labels)
    ds.attrs["run"]["config"]["model"] = {"name": "synthetic", "d_model": 8}
    run = write_run(tmp_path / "run", ds)
    before = _files(run)
    analyze_run(run, n_permutations=0, figures=False)  # its figures: test_hardening_io
    write_theory(run, TheoryLens(info={"run": str(run)}, notes=["synthetic"]))
    grid = np.linspace(0.0, 1.0, len(VARIANTS) * 4).reshape(len(VARIANTS), 4)
    flow = AttentionFlow(time=np.arange(4), variants=VARIANTS, clusters=grid + 1,
                         mean_cosine=grid, gram_rank=grid + 1, distance=grid, eps=0.1,
                         model="synthetic", tokens=3.0)  # fmt: skip
    write_flow(run, flow)
    write_hypotheses(_HYPOTHESES, run)
    return run, _files(run) - before


_ORDER = {"slope": 0.1, "slope_ci": [0.05, 0.2], "r2": 0.95, "monotone_fraction": 1.0,
          "verdict": "supported"}  # fmt: skip
_HYPOTHESES = {
    "rule": "R^2 >= 0.9",
    "order": {"energy_beta_4": _ORDER},
    "convex_fit": {
        "targets": {
            "next_embedding": [{"share_passing": 0.5, "median_gap": 0.1, "median_gap_uniform": 0.3}]
        }
    },
    "next_embedding": {"cosine": [0.1, 0.9], "median_rank_cosine": [500, 1]},
}


def _files(run: Path) -> set[str]:
    store = run / "trajectory.zarr"
    return {
        str(p.relative_to(run))
        for p in run.rglob("*")
        if p.is_file() and store not in p.parents and p.name != ".tokenfield.lock"
    }


def test_an_overwrite_retrace_removes_every_derived_file(analysed_run):
    from tokenfield.runs import RUN_JSON, RunWriter

    run, derived = analysed_run
    for name in ("metrics.json", "projection.npz", "theory.json", "theory.html", "flow.json",
                 "flow.html", "figures/theory_flow.png", "hypotheses.json",
                 "hypotheses.html"):  # fmt: skip
        assert name in derived, name  # each writer ran
    (run / "notes.md").write_text("mine")
    writer = RunWriter(run, "trace", {"retraced": True}, append_dim="particle", overwrite=True)
    writer.close()
    left = derived & _files(run)
    assert left == set(), f"--overwrite left these derived files stale: {sorted(left)}"
    assert (run / "notes.md").read_text() == "mine"  # a user's file stays
    assert (run / RUN_JSON).is_file()

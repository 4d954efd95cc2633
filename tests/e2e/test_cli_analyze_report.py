"""`tokenfield analyze` and `tokenfield report` on synthetic runs written with RunWriter."""

from __future__ import annotations

import json
from html.parser import HTMLParser

import numpy as np
import pytest

from tests.unit.synthetic_trajectories import clustered, trace_dataset, write_run
from tokenfield.analysis import load_projection, project
from tokenfield.pipelines.report import write_report
from tokenfield.runs import open_run


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    states, labels = clustered(n_per_category=3, n_time=7, n_feature=24)
    baseline, _ = clustered(n_per_category=3, n_time=7, n_feature=24, seed=5)
    return {
        "run": write_run(root / "run", trace_dataset(states, labels)),
        "baseline": write_run(root / "baseline", trace_dataset(baseline, labels)),
        "root": root,
    }


class _Resources(HTMLParser):
    """Collects src/href attributes of tags (script bodies are not parsed as HTML)."""

    def __init__(self):
        super().__init__()
        self.found: list[str] = []

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            if name in ("src", "href") and value and not value.startswith(("data:", "#")):
                self.found.append(f"{tag} {name}={value}")


def external_resources(text: str) -> list[str]:
    parser = _Resources()
    parser.feed(text)
    return parser.found


def test_analyze_writes_metrics_projection_and_figures(runs, cli):
    run = runs["run"]
    status, out, err = cli(
        ["analyze", run, "--baseline", runs["baseline"], "--seed", 3, "--permutations", 20]
    )
    assert status == 0, err
    assert "Spearman(PC1, layer)" in out and "baseline" in out
    assert "wrote" in out and "Spearman" not in err and "wrote" not in err  # results: stdout
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["options"]["seed"] == 3 and metrics["options"]["n_permutations"] == 20
    assert metrics["baseline"]["info"]["n_particles"] == 15
    assert metrics["baseline_run"] == str(runs["baseline"])
    for name in metrics["figures"]:
        assert (run / name).stat().st_size > 0
    assert "figures/trajectories.png" in metrics["figures"]
    # the saved frame reproduces the analysed projection, for later runs
    pcs = project(open_run(run), load_projection(run))
    assert pcs.sizes["component"] == len(metrics["projection"]["explained_variance_ratio"])
    assert np.isfinite(pcs.values).all()


def test_analyze_options_sphere_per_layer(runs, tmp_path, cli):
    states, labels = clustered(n_per_category=2, n_time=5, n_feature=16)
    run = write_run(tmp_path / "r", trace_dataset(states, labels))
    status, _, err = cli(
        ["analyze", run, "--sphere", "--per-layer", "--permutations", 5, "--no-figures"]
    )
    assert status == 0, err
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["projection"]["sphere"] is True
    assert "per_layer_projection" in metrics and metrics["figures"] == []


@pytest.mark.parametrize(
    "args",
    [
        ["analyze", "{root}/missing"],
        ["analyze", "{run}", "--baseline", "{root}/missing"],
        ["analyze", "{run}", "--particles", "some"],
        ["report", "{root}/missing", "--out", "{root}/r.html"],
        ["report", "{run}", "--out", "{root}"],
    ],
)
def test_bad_input_exits_2_with_one_line(runs, capsys, args, cli):
    before = {p: p.stat().st_mtime_ns for p in runs["root"].rglob("*") if p.is_file()}
    args = [a.format(root=runs["root"], run=runs["run"]) for a in args]
    status, out, err = cli(args)
    assert status == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tokenfield: error:"), err
    after = {p: p.stat().st_mtime_ns for p in runs["root"].rglob("*") if p.is_file()}
    assert after == before  # nothing written or changed


def test_report_is_self_contained(runs, capsys, tmp_path, cli):
    out = tmp_path / "report.html"
    status, _, err = cli(["report", runs["run"], runs["baseline"], "--out", out])
    assert status == 0, err
    text = out.read_text()
    assert text.count("data:image/png;base64,") >= 4
    assert external_resources(text) == []  # plotly.js and the images are inlined
    assert "Plotly.newPlot" in text and "trajectories-0" in text and "trajectories-1" in text
    assert "prompt 0 about code" in text  # hover text and the per-prompt table
    assert "Separation by layer" in text and "Distances between category centroids" in text


def test_report_of_an_unanalysed_run_leaves_it_untouched(tmp_path):
    states, labels = clustered(n_per_category=2, n_time=5, n_feature=16)
    run = write_run(tmp_path / "fresh", trace_dataset(states, labels))
    before = sorted(p.name for p in run.iterdir())
    path = write_report([run], tmp_path / "out" / "fresh.html")
    assert path.is_file() and "data:image/png;base64," in path.read_text()
    assert sorted(p.name for p in run.iterdir()) == before

"""The report's trajectory axes show the bulk of the points; the few far outside
it are marked at the edge (issue 21: one prompt at PC2 = 535 squashed the rest)."""

from __future__ import annotations

import json
import re

import numpy as np

from tests.unit.synthetic_trajectories import clustered, trace_dataset, write_run
from tokenfield.pipelines.report import write_report
from tokenfield.report.interactive import bulk_ranges


def payload(path) -> dict:
    text = path.read_text(encoding="utf-8")
    body = re.search(
        r'<script type="application/json" id="trajectories-0-data">(.*?)</script>', text, re.S
    ).group(1)
    return json.loads(body.replace("<\\/", "</"))


def test_one_far_point_is_left_out_and_marked():
    rng = np.random.default_rng(0)
    points = rng.normal(size=(10, 20, 2))
    points[3, 5, 1] = 100.0
    ranges, outside = bulk_ranges(points)
    assert outside.sum() == 1 and outside[3, 5]
    assert ranges[1][1] < 10  # the bulk, not the outlier
    kept = np.delete(points.reshape(-1, 2), 3 * 20 + 5, axis=0)
    for i in range(2):
        assert ranges[i][0] <= kept[:, i].min() and kept[:, i].max() <= ranges[i][1]


def test_what_moves_together_stays_inside():
    """The norm growing with depth (every point far out at the last layers) and a
    whole overlay elsewhere are the picture, not outliers."""
    rng = np.random.default_rng(1)
    points = rng.normal(size=(12, 40, 3))
    points[-3:] += 50.0  # every particle at the last three times
    points[:, 20:] += np.array([30.0, -30.0, 0.0])  # an overlay of 20 paths
    ranges, outside = bulk_ranges(points)
    assert not outside.any()
    assert ranges[0][1] > 80 and ranges[1][0] < -30


def test_nan_points_and_a_collapsed_time_are_not_outliers():
    points = np.random.default_rng(2).normal(size=(5, 10, 2))
    points[0] = 0.0  # every particle in one place at time 0
    points[0, 0] = 1e-9
    points[2, 3] = np.nan
    ranges, outside = bulk_ranges(points)
    assert not outside.any()
    assert all(np.isfinite(r).all() for r in np.array(ranges))


def test_the_report_keeps_its_axes_on_the_bulk(tmp_path):
    states, labels = clustered(n_per_category=3, n_time=10, n_feature=24)
    states = states.copy()
    scale = np.abs(states).max()
    states[4:7, 7] += 60 * scale  # prompt 8 thrown far out at layers 4..6
    run = write_run(tmp_path / "run", trace_dataset(states, labels))
    data = payload(write_report([run], tmp_path / "report.html"))
    for key in ("2d-raw", "3d-raw"):
        view = data["views"][key]
        marks = [t for t in view["data"] if (t.get("meta") or {}).get("kind") == "outside"]
        assert len(marks) == 1, key
        mark = marks[0]
        assert mark["name"].startswith("3 points outside the axes")
        assert all("<b>8</b>" in text for text in mark["text"])
        assert [re.search(r"layer (\d+)", t).group(1) for t in mark["text"]] == ["4", "5", "6"]
        layout = view["layout"]
        axes = ("x", "y") if key.startswith("2d") else ("x", "y", "z")
        ranges = (
            [layout[f"{a}axis"]["range"] for a in axes]
            if key.startswith("2d")
            else [layout["scene"][f"{a}axis"]["range"] for a in axes]
        )
        # every other point of every path lies inside the axes, and the marks too
        for trace in view["data"]:
            if (trace.get("meta") or {}).get("kind") != "path":
                continue
            for i, a in enumerate(axes):
                values = np.array(trace[a], dtype=float)
                if trace["name"] == labels[7] and trace["hovertemplate"].startswith("<b>8<"):
                    values = np.delete(values, [4, 5, 6])
                assert ranges[i][0] <= values.min() and values.max() <= ranges[i][1], (key, a)
            for i, a in enumerate(axes):
                assert all(ranges[i][0] <= v <= ranges[i][1] for v in mark[a])
    # without the outlier: no marks
    clean = write_run(
        tmp_path / "clean",
        trace_dataset(clustered(n_per_category=3, n_time=10, n_feature=24)[0], labels),
    )
    data = payload(write_report([clean], tmp_path / "clean.html"))
    assert not any(
        (t.get("meta") or {}).get("kind") == "outside" for t in data["views"]["2d-raw"]["data"]
    )


def test_generated_tokens_far_out_are_marked_not_stretching_the_axes(tmp_path):
    """Two generated tokens thrown far out stretched the demo's axis to -4000."""
    from tests.e2e.test_report_browser import _with_lens_and_generation

    states, labels = clustered(n_per_category=3, n_time=10, n_feature=24)
    ds = _with_lens_and_generation(states, labels, n_gen=2)
    far = ds["states"].values.copy()
    far[:, -1] -= 80 * np.abs(states).max()  # the last generated token, at every layer
    ds["states"] = (ds["states"].dims, far)
    data = payload(write_report([write_run(tmp_path / "gen", ds)], tmp_path / "gen.html"))
    view = data["views"]["2d-raw"]
    marks = [t for t in view["data"] if (t.get("meta") or {}).get("kind") == "outside"]
    assert len(marks) == 1 and all("generated token 2" in t for t in marks[0]["text"])
    gen = [t for t in view["data"] if (t.get("meta") or {}).get("kind") == "gen"]
    assert len(gen) == 2
    near = [v for t in view["data"] if (t.get("meta") or {}).get("kind") == "path" for v in t["y"]]
    low, high = view["layout"]["yaxis"]["range"]
    assert low <= min(near) and max(near) <= high
    assert high - low < 3 * (max(near) - min(near))  # the bulk fills the axis


def test_a_small_overlay_elsewhere_is_shown_not_marked():
    """Another model's overlay (few paths, far from the run) ran off the plot; judged
    as its own run, its bulk is inside the axes."""
    rng = np.random.default_rng(3)
    points = rng.normal(size=(8, 45, 2))
    points[:, 40:] += np.array([40.0, 25.0])  # 5 overlay paths against 40 of the run
    groups = [0] * 40 + [1] * 5
    ranges, outside = bulk_ranges(points, groups)
    assert not outside.any()
    assert ranges[0][1] > 40 and ranges[1][1] > 25
    _, pooled = bulk_ranges(points)  # judged together, the overlay would be "outliers"
    assert pooled[:, 40:].all()

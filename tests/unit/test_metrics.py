"""metrics.json read back through the typed Metrics.from_dict (analysis/metrics.py).

tests/unit/data/metrics_v0.json was written by the code before the typed reader
(a synthetic trace with a baseline); metrics_v0_summary.json holds the summary
rows that code printed for it.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest

from tests._cli import one_error_line, run_cli
from tests.unit.synthetic_trajectories import clustered, trace_dataset, write_run
from tokenfield.analysis import Metrics, analyze, summary_rows
from tokenfield.analysis.metrics import BestSeparation
from tokenfield.errors import UserError
from tokenfield.pipelines.report import read_metrics

DATA = Path(__file__).parent / "data"


def fixture() -> dict:
    return json.loads((DATA / "metrics_v0.json").read_text())


def extras(m: Metrics | object) -> list[str]:
    """The keys nothing in the schema read, at every level (with their path)."""
    found = []

    def walk(obj: object, where: str) -> None:
        extra = getattr(obj, "extra", None)
        if extra:
            found.extend(f"{where}.{k}" for k in extra)
        for name in getattr(obj, "__dataclass_fields__", {}):
            value = getattr(obj, name)
            if hasattr(value, "__dataclass_fields__"):
                walk(value, f"{where}.{name}")
            elif isinstance(value, dict):
                for key, item in value.items():
                    if hasattr(item, "__dataclass_fields__"):
                        walk(item, f"{where}.{name}.{key}")

    walk(m, "")
    return found


def test_the_previous_versions_file_loads_with_its_values() -> None:
    m = Metrics.from_dict(fixture())
    assert m.info.kind == "trace" and m.is_trace
    assert (m.info.n_particles, m.info.n_time) == (9, 5)
    assert m.info.categories == {"A": 3, "B": 3, "C": 3}
    assert m.options.times == "seed" and m.options.n_permutations == 9
    assert m.separation is not None and m.separation.best.time == 4
    assert m.separation.best.claim == "not supported"  # 9 shuffles cannot reach p < 0.05
    assert len(m.separation.time) == 5 and m.separation.n_permutations == 9
    assert m.centroid_distances is not None and m.centroid_distances.categories == ["A", "B", "C"]
    assert set(m.depth_ordering.by_times) == {"seed", "all"}
    assert m.baseline is not None and m.baseline.baseline is None
    assert m.baseline.info.n_particles == 9
    assert m.run == "runs/synthetic" and m.figures == ["figures/trajectories.png"]
    assert len(m.particles) == 9 and m.particles[0]["category"] == "A"
    assert extras(m) == []  # every key of the file has its place in the schema


def test_the_summary_is_the_one_the_previous_version_printed() -> None:
    expected = [tuple(row) for row in json.loads((DATA / "metrics_v0_summary.json").read_text())]
    assert summary_rows(Metrics.from_dict(fixture())) == expected
    assert summary_rows(fixture()) == expected  # a plain dict is read through from_dict


def test_a_fresh_analysis_fills_the_schema_exactly() -> None:
    # what analyze writes today is read back with no key left over, at every level
    states, labels = clustered(categories=("A", "B"), n_per_category=3, n_time=5, n_feature=6)
    ds = trace_dataset(states, labels)
    data = analyze(ds, baseline=ds, n_permutations=5, per_layer=True).to_dict()
    m = Metrics.from_dict(data)
    assert extras(m) == []
    assert m.per_layer_projection is not None
    assert len(m.per_layer_projection.explained_variance_ratio_pc1) == 4
    assert m.kinematics.median_velocity_dpc2_dpc1 is not None
    assert m.separation is not None and m.separation.silhouette == data["separation"]["silhouette"]


def test_an_older_file_without_the_later_keys_takes_the_old_defaults() -> None:
    data = fixture()
    for m in (data, data["baseline"]):
        del m["options"]["times"], m["depth_ordering"]["by_times"]
        for key in ("silhouette_p_corrected", "claim", "alpha", "ratio_p_corrected"):
            del m["separation"]["best"][key]
        del m["separation"]["silhouette_p_corrected"]
    m = Metrics.from_dict(data)
    assert m.options.times == "seed"
    assert m.depth_ordering.by_times == {}
    assert m.separation is not None and m.separation.silhouette_p_corrected is None
    assert m.separation.best.claim is None
    rows = dict((name, value) for name, value, _ in summary_rows(m))
    assert "Spearman(PC1, layer) overall" in rows  # the one-convention rows of the old files
    assert not any("p corrected" in name for name in rows)


def test_an_unknown_key_is_kept_not_refused() -> None:
    data = fixture()
    data["info"]["new_field"] = [1, 2]
    data["something_new"] = {"a": 1}
    m = Metrics.from_dict(data)
    assert m.info.extra == {"new_field": [1, 2]}
    assert m.extra == {"something_new": {"a": 1}}


def test_the_verdict_of_a_file_without_claim_is_judged_on_the_corrected_p() -> None:
    best = BestSeparation(
        silhouette=0.3, silhouette_null_high=0.1, silhouette_p=0.01, time=3,
        silhouette_p_corrected=0.02,
    )  # fmt: skip
    assert best.verdict == "holds"
    assert BestSeparation(0.3, 0.1, 0.01, 3, silhouette_p_corrected=0.2).verdict == "not supported"
    # a claim the file states is taken as written (its alpha may not be today's)
    written = BestSeparation(0.3, 0.1, 0.01, 3, silhouette_p_corrected=0.07, claim="holds")
    assert written.verdict == "holds"


def _set(data: dict, path: str, value: object) -> dict:
    data = copy.deepcopy(data)
    *head, last = path.split(".")
    target = data
    for key in head:
        target = target[int(key)] if isinstance(target, list) else target[key]
    target[last] = value
    return data


@pytest.mark.parametrize(
    ("path", "value", "named"),
    [
        ("info", 5, "'info' should be a JSON object, got int"),
        ("info.n_time", "30", "'info.n_time' should be an integer, got str"),
        ("options.sphere", "yes", "'options.sphere' should be true or false, got str"),
        ("options.seed", True, "'options.seed' should be an integer, got bool"),
        ("separation.time", 3, "'separation.time' should be a list, got int"),
        ("separation.silhouette", [0.1, "x"], "'separation.silhouette[1]'"),
        ("separation.best.time", None, "'separation.best.time'"),
        ("baseline.depth_ordering.by_times.seed", [], "'baseline.depth_ordering.by_times.seed'"),
        ("centroid_distances.by_time", [], "'centroid_distances.by_time' should be an object"),
        ("particles", {}, "'particles' should be a list"),
        ("particles.0.label", 7, "'particles[0].label' should be a string, got int"),
        ("simulation", [1], "'simulation' should be an object"),
    ],
)
def test_a_malformed_value_is_one_error_naming_its_key(path: str, value: object, named: str):
    with pytest.raises(UserError) as caught:
        Metrics.from_dict(_set(fixture(), path, value), source="RUN/metrics.json")
    text = str(caught.value)
    assert "\n" not in text
    assert text.startswith("RUN/metrics.json is malformed: ")
    assert named in text


def test_a_missing_required_key_is_named() -> None:
    data = fixture()
    del data["separation"]["best"]
    with pytest.raises(UserError, match="'separation.best' is missing"):
        Metrics.from_dict(data)


def test_not_an_object_is_refused() -> None:
    with pytest.raises(UserError, match="the file should be a JSON object, got list"):
        Metrics.from_dict([1, 2])


@pytest.mark.parametrize(
    "content",
    ["{not json", '{"info": {"n_time": "many"}}', "[]"],
    ids=["not-json", "wrong-type", "not-an-object"],
)
def test_the_report_of_a_run_with_a_malformed_metrics_json_exits_2(tmp_path, capsys, content):
    states, labels = clustered(categories=("A", "B"), n_per_category=2, n_time=4, n_feature=5)
    run = write_run(tmp_path / "run", trace_dataset(states, labels))
    (run / "metrics.json").write_text(content)
    with pytest.raises(UserError):
        read_metrics(run)
    code, _, err = run_cli(["report", run, "--out", tmp_path / "r.html"], capsys)
    assert code == 2
    line = one_error_line(err)
    assert str(run / "metrics.json") in line
    assert f"run 'tokenfield analyze {run}' again" in line
    assert not (tmp_path / "r.html").exists()


def test_the_summary_mean_turning_angle_skips_nulls() -> None:
    data = _set(fixture(), "kinematics.mean_turning_angle_deg", [None, 10.0, 20.0, None])
    rows = {name: value for name, value, _ in summary_rows(data)}
    assert rows["mean turning angle (deg)"] == f"{np.mean([10.0, 20.0]):.1f}"

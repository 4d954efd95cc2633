"""The report's trajectory data: overlays (frozen frame, Procrustes), one plotly.js,
data that grows linearly with depth, and the errors of --overlay."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from tests.unit.synthetic_trajectories import clustered, trace_dataset, write_run
from tokenfield.cli import main
from tokenfield.errors import UserError
from tokenfield.pipelines.report import parse_overlay, write_report


def payloads(path) -> dict[str, dict]:
    text = path.read_text(encoding="utf-8")
    found = re.findall(
        r'<script type="application/json" id="([^"]+)-data">(.*?)</script>', text, re.S
    )
    return {name: json.loads(body.replace("<\\/", "</")) for name, body in found}


def paths_of(view: dict, group_prefix: str | None) -> list[np.ndarray]:
    """The (time, 2) paths of the run (None) or of an overlay group."""
    out = []
    for trace in view["data"]:
        if (trace.get("meta") or {}).get("kind") != "path":
            continue
        group = trace.get("legendgroup", "")
        if (group_prefix is None) == group.startswith("overlay"):
            continue
        if group_prefix is not None and group != group_prefix:
            continue
        out.append(np.array([trace["x"], trace["y"]], dtype=float).T)
    return out


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    root = tmp_path_factory.mktemp("overlay")
    states, labels = clustered(n_per_category=3, n_time=9, n_feature=24)
    return root, states, labels, write_run(root / "run", trace_dataset(states, labels))


def test_the_same_model_is_drawn_in_the_frozen_frame_unaligned(base, tmp_path):
    root, states, labels, run = base
    shifted = write_run(tmp_path / "shifted", trace_dataset(states + 40.0, labels))
    data = payloads(write_report([run], tmp_path / "r.html", overlays=[f"{shifted}:moved"]))
    view = data["trajectories-0"]["views"]["2d-raw"]
    mine, theirs = paths_of(view, None), paths_of(view, "overlay-1")
    assert len(mine) == len(theirs) == 15
    # the frame is the run's own (frozen): a uniform shift moves every point by the
    # same projected offset, so the overlay is not re-fitted or re-centred
    offsets = np.concatenate([b - a for a, b in zip(mine, theirs, strict=True)])
    assert np.ptp(offsets, axis=0).max() < 0.02 * np.abs(offsets).max()
    assert np.abs(offsets).max() > 1.0
    names = [t["name"] for t in view["data"] if t.get("showlegend")]
    assert "moved" in names
    assert not any("Procrustes" in t.get("hovertemplate", "") for t in view["data"])


def test_another_model_is_rotated_onto_the_run_layer_by_layer(base, tmp_path):
    root, states, labels, run = base
    rng = np.random.default_rng(3)
    # another width and a different random rotation at every layer
    wide = np.concatenate([states, np.zeros((*states.shape[:2], 6))], axis=-1)
    rotated = np.stack([wide[t] @ np.linalg.qr(rng.normal(size=(30, 30)))[0] for t in range(9)])
    other = write_run(tmp_path / "other", trace_dataset(rotated, labels, model="other"))
    data = payloads(write_report([run], tmp_path / "r.html", overlays=[(other, "other")]))
    for key in ("2d-raw", "2d-sphere"):
        view = data["trajectories-0"]["views"][key]
        mine, theirs = paths_of(view, None), paths_of(view, "overlay-1")
        scale = max(np.abs(p).max() for p in mine)
        assert max(np.abs(a - b).max() for a, b in zip(mine, theirs, strict=True)) < 2e-3 * scale
    assert any("orthogonal Procrustes" in t.get("hovertemplate", "") for t in view["data"])
    # without the alignment the rotated states would be far off: the test can fail
    unaligned = np.einsum("tpf,tpf->tp", rotated[..., :24], states)
    assert np.abs(unaligned).max() < 0.9 * np.einsum("tpf,tpf->tp", states, states).max()


def test_runs_of_different_depth_are_matched_by_relative_depth(base, tmp_path):
    root, states, labels, run = base
    rng = np.random.default_rng(4)
    rotation = np.linalg.qr(rng.normal(size=(24, 24)))[0]
    shallow = write_run(
        tmp_path / "shallow", trace_dataset(states[::2] @ rotation, labels, model="shallow")
    )  # layers 0, 2, 4, 6 of the run (and 8, left out by the seed convention)
    data = payloads(write_report([run], tmp_path / "r.html", overlays=[shallow]))
    view = data["trajectories-0"]["views"]["2d-raw"]
    mine, theirs = paths_of(view, None), paths_of(view, "overlay-1")
    scale = max(np.abs(p).max() for p in mine)
    for a, b in zip(mine, theirs, strict=True):
        assert len(b) == 8  # on the run's slider: layers 0..L-1 (seed convention)
        assert np.abs(a[::2] - b[::2]).max() < 2e-3 * scale  # even layers: the same states
    hover = data["trajectories-0"]["H"][15]  # the overlay's first prompt, its own layers
    assert [h.split(" · ")[1] for h in hover] == [f"layer {t}" for t in (0, 0, 1, 1, 2, 2, 3, 3)]


def test_plotly_js_is_inlined_once_and_the_data_grows_linearly_with_depth(tmp_path):
    from plotly.offline import get_plotlyjs

    sizes = {}
    for n_time in (16, 32):
        states, labels = clustered(n_per_category=3, n_time=n_time, n_feature=24)
        run = write_run(tmp_path / f"run{n_time}", trace_dataset(states, labels))
        other = write_run(tmp_path / f"other{n_time}", trace_dataset(states * 2, labels))
        fragment = tmp_path / "section.html"
        fragment.write_text("<section><h2>more</h2></section>")
        page = write_report(
            [run, other], tmp_path / f"r{n_time}.html", overlays=[other], sections=[fragment]
        )
        text = page.read_text(encoding="utf-8")
        assert text.count(get_plotlyjs()[:300]) == 1  # plotly.js once, however many plots
        sizes[n_time] = sum(len(json.dumps(p)) for p in payloads(page).values())
    # frames are built in the browser: twice the layers, about twice the data (not 4x)
    assert 1.2 < sizes[32] / sizes[16] < 2.4


def test_overlay_errors_are_one_line_and_write_nothing(base, tmp_path, capsys):
    root, states, labels, run = base
    other_prompts = trace_dataset(states, labels)
    other_prompts = other_prompts.assign_coords(
        prompt=("particle", np.array([f"something else {i}" for i in range(15)], dtype=object))
    )
    strange = write_run(
        tmp_path / "strange",
        other_prompts.assign_attrs(run={"kind": "trace", "config": {"model": "another"}}),
    )
    with pytest.raises(UserError, match="shares 0 prompt"):
        write_report([run], tmp_path / "r.html", overlays=[strange])
    assert not (tmp_path / "r.html").exists()
    for args in (
        [
            "report",
            str(run),
            "--overlay",
            str(tmp_path / "missing"),
            "--out",
            str(tmp_path / "x.html"),
        ],
        ["report", "--overlay", str(run), "--out", str(tmp_path / "x.html")],
    ):
        with pytest.raises(SystemExit) as exit_info:
            main(args)
        assert exit_info.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("tokenfield: error:")
        assert not (tmp_path / "x.html").exists()


def test_overlay_labels(tmp_path):
    assert parse_overlay("runs/a:steered") == (tmp_path.__class__("runs/a"), "steered")
    assert parse_overlay("runs/a") == (tmp_path.__class__("runs/a"), "a")
    odd = tmp_path / "x:y"
    odd.mkdir()
    assert parse_overlay(str(odd)) == (odd, "x:y")  # an existing path is taken whole

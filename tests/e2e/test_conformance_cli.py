"""``tokenfield conformance``: one cheap item end to end, the JSON's keys, bad input."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tokenfield.cli import main
from tokenfield.errors import UserError
from tokenfield.meanfield.conformance import (
    ItemResult,
    classify_circle_states,
    interaction_energy,
    stuck_spectrum,
)


def _run(argv):
    try:
        main(argv)
    except SystemExit as exc:
        return exc.code
    return 0


def test_only_one_item_writes_json_html_and_figure(tmp_path, capsys):
    out = tmp_path / "c"
    assert _run(["conformance", "--only", "equiangular", "--quick", "--out", str(out)]) == 0
    # progress: one line per item on stderr (a plain line when stderr is not a terminal)
    assert "conformance --quick: equiangular PASS in " in capsys.readouterr().err
    data = json.loads((out / "conformance.json").read_text())
    (item,) = data["items"]
    assert {"name", "reference", "measured", "tolerance", "status", "seconds"} <= set(item)
    assert item["name"] == "equiangular" and item["status"] == "PASS"
    assert (out / "figures" / "equiangular.png").is_file()
    assert "equiangular" in (out / "conformance.html").read_text()


@pytest.mark.parametrize(
    "argv", [["conformance", "--only", "nonsense", "--out", "X"], ["conformance", "--out", "F"]]
)
def test_bad_input_is_one_line_and_status_2(tmp_path, capsys, argv):
    (tmp_path / "F").write_text("a file")
    argv = [str(tmp_path / a) if a in ("X", "F") else a for a in argv]
    assert _run(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("tokenfield: error:") and "Traceback" not in err
    assert not (tmp_path / "X").exists()


def test_a_failing_item_is_reported_with_status_1(tmp_path, monkeypatch, capsys):
    import tokenfield.pipelines.conformance as conformance

    def failing(quick):
        return ItemResult("equiangular", "ref", "measured", "tol", passed=False)

    monkeypatch.setitem(conformance.ITEMS, "equiangular", failing)
    assert _run(["conformance", "--only", "equiangular", "--out", str(tmp_path / "o")]) == 1
    assert "conformance: equiangular FAIL in " in capsys.readouterr().err
    data = json.loads((tmp_path / "o" / "conformance.json").read_text())
    assert data["items"][0]["status"] == "FAIL"


def test_staircase_energy_and_circle_classification():
    """Tight clusters of sizes 3 and 1 (of n = 4): E = (9 + 1) / 16; the equilateral
    triangle at beta = -1 is stuck and stable, at beta = -0.5 it is stationary but
    unstable (the top Jacobian eigenvalue is lambda_1^(3) > 0)."""
    from tokenfield.meanfield.stability import discrete_growth_rates

    x = np.array([[1.0, 0.0], [1.0, 0.0], [1.0, 0.0], [-1.0, 0.0]])
    assert interaction_energy(x, 50.0) == pytest.approx(10 / 16, abs=1e-12)
    theta = 2 * np.pi * np.arange(3) / 3
    tri = np.stack([np.cos(theta), np.sin(theta)], -1)[None]
    labels, norms = classify_circle_states(tri, -1.0)
    assert labels[0] == "stuck" and norms[0] < 1e-12
    for beta in (-1.0, -0.5):
        top = stuck_spectrum(theta, beta)
        assert top == pytest.approx(discrete_growth_rates([1], beta, 3)[0], rel=1e-9)
    assert stuck_spectrum(theta, -1.0) < 0 < stuck_spectrum(theta, -0.5)
    near = np.stack([np.cos([0, 1e-4, 2e-4]), np.sin([0, 1e-4, 2e-4])], -1)[None]
    assert classify_circle_states(near, 1.0)[0][0] == "sync"


def _cheap_pass(quick):
    from tokenfield.viz._common import new_figure

    fig, ax = new_figure((2, 2))
    ax.plot([0, 1], [0, 1])
    return ItemResult("cheap-pass", "ref", "measured", "tol", passed=True, figure=fig)


def _cheap_fail(quick):
    return ItemResult("cheap-fail", "ref", "measured", "tol", passed=False)


def test_workers_run_the_items_in_processes_and_keep_the_order(tmp_path, monkeypatch):
    """--workers 2: each item in its own spawned process; the results come back in the
    documented order with their verdicts, times and figures (as PNG bytes)."""
    import time

    import tokenfield.pipelines.conformance as pipeline

    monkeypatch.setattr(pipeline, "ITEMS", {"cheap-pass": _cheap_pass, "cheap-fail": _cheap_fail})
    started, finished = [], []
    results = pipeline.run_suite(
        workers=2, progress=started.append, finished=lambda r: finished.append(r.name)
    )
    assert [r.name for r in results] == ["cheap-pass", "cheap-fail"] == started
    assert sorted(finished) == sorted(started)
    assert [r.status for r in results] == ["PASS", "FAIL"]
    assert all(r.seconds > 0 and r.cpu_seconds is not None for r in results)
    assert isinstance(results[0].figure, bytes) and results[0].figure[:4] == b"\x89PNG"
    pipeline.write_conformance(
        tmp_path, results, quick=True, only=None, started=time.perf_counter()
    )
    assert (tmp_path / "figures" / "cheap-pass.png").read_bytes() == results[0].figure
    with pytest.raises(UserError):
        pipeline.run_suite(workers=0)

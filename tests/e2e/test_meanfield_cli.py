"""The mean-field commands: tiny runs end to end, and bad input."""

from __future__ import annotations

import json

import pytest
import xarray as xr

from tokenfield.cli import main


def _run(argv):
    try:
        main(argv)
    except SystemExit as exc:
        return exc.code
    return 0


def test_stability_table_json_and_figure(tmp_path, capsys):
    assert _run(["stability", "--dim", "2", "--beta", "25"]) == 0
    assert "k_max = 7" in capsys.readouterr().out
    assert _run(["stability", "--dim", "3", "--beta", "9", "--dynamics", "sa", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["dim"] == 3 and data["k_max"] == 4 and data["multiplicity"][:3] == [1, 3, 5]
    figure = tmp_path / "kmax.svg"
    assert _run(["stability", "--beta-range", "1:100", "--out", str(figure)]) == 0
    assert figure.read_text().startswith("<?xml")
    assert "wrote" in capsys.readouterr().out
    assert _run(["stability", "--beta-range", "1:50:6", "--json"]) == 0
    curve = json.loads(capsys.readouterr().out)
    assert curve["beta"] == [1.0, 10.8, 20.6, 30.4, 40.2, 50.0] and curve["k_max"][0] == 1


@pytest.mark.parametrize(
    "argv",
    [
        ["stability"],
        ["stability", "--beta", "1", "--beta-range", "1:3"],
        ["stability", "--beta", "nan"],
        ["stability", "--beta", "1", "--dim", "1"],
        ["stability", "--beta", "1", "--dynamics", "softmax"],
        ["stability", "--beta-range", "a:b"],
        ["stability", "--beta", "2", "--out", "x.pdf"],
        ["predict-clusters", "--betas", "0"],
        ["predict-clusters", "--dynamics", "xx"],
        ["pde", "--n", "64"],
        ["pde", "--sampling", "sobol"],
        ["metastability", "--caps", "7", "--dim", "2"],
        ["phase-diagram", "--dims", "1"],
    ],
)
def test_bad_input_exits_2_and_writes_nothing(argv, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = ["--out", str(tmp_path / "out")] if argv[0] != "stability" else []
    assert _run([*argv, *out]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("tokenfield: error:")
    assert not (tmp_path / "out").exists()
    assert not any(tmp_path.iterdir())


def test_pde_metastability_and_phase_diagram_commands(tmp_path, capsys):
    pde = tmp_path / "pde"
    assert _run([
        "pde", "--n", "16,32", "--times", "0,1", "--cells", "128", "--dt", "0.05",
        "--out", str(pde),
    ]) == 0  # fmt: skip
    data = json.loads((pde / "pde_vs_particles.json").read_text())
    assert data["n"] == [16, 32] and data["mass_error"] < 1e-12
    assert (pde / "figures" / "pde_vs_particles.png").exists()
    meta = tmp_path / "meta"
    assert _run([
        "metastability", "--betas", "2,3", "--seeds", "1", "--per-cap", "2", "--out", str(meta),
    ]) == 0  # fmt: skip
    result = json.loads((meta / "metastability.json").read_text())
    assert result["predicted_slope"] == 1.0 and len(result["merge_times"]) == 2
    phase = tmp_path / "phase"
    argv = [
        "phase-diagram", "--dims", "2,4", "--betas", "0,2", "--t-max", "2", "--frames", "5",
        "--n", "4", "--systems", "2", "--out", str(phase),
    ]  # fmt: skip
    assert _run(argv) == 0
    ds = xr.open_zarr(phase / "phase_diagram.zarr")
    assert ds.merged_probability.shape == (2, 2, 5) and bool(ds.completed.all())
    summary = json.loads((phase / "phase_diagram.json").read_text())
    assert summary["sweep"]["tasks_run"] == 2 and len(summary["rows"]) == 4
    assert _run(argv) == 0
    assert json.loads((phase / "phase_diagram.json").read_text())["sweep"]["tasks_skipped"] == 2
    assert (phase / "figures" / "phase_diagram.png").exists()


def test_predict_clusters_command(tmp_path, capsys):
    out = tmp_path / "pred"
    assert _run([
        "predict-clusters", "--betas", "4", "--dynamics", "sa", "--n", "48", "--seeds", "1",
        "--json", "--out", str(out),
    ]) == 0  # fmt: skip
    data = json.loads(capsys.readouterr().out)
    assert data["rows"][0]["k_max"] == 3 and abs(data["rows"][0]["median_count"] - 3) <= 1
    assert (out / "cluster_prediction.json").exists()
    assert (out / "figures" / "cluster_prediction.svg").exists()

"""``--overwrite`` on the commands that write into ``--out`` (an earlier result is
refused without it, replaced with it) and ``--device`` on the commands that load
a model (a bad device fails before any model is loaded). No model is loaded."""

from __future__ import annotations

import json

from tests.unit.synthetic_trajectories import clustered, trace_dataset, write_run


def test_theory_stability_refuses_an_earlier_result_without_overwrite(cli, tmp_path):
    out = tmp_path / "mf"
    first = cli(["theory", "stability", "--beta", "4", "--out", out])
    assert first.code == 0, first.err
    written = (out / "stability.json").read_text()
    again = cli(["theory", "stability", "--beta", "9", "--out", out])
    assert again.code == 2
    assert "stability.json' holds an earlier result; pass --overwrite" in again.err
    assert (out / "stability.json").read_text() == written  # untouched
    replaced = cli(["theory", "stability", "--beta", "9", "--out", out, "--overwrite"])
    assert replaced.code == 0, replaced.err
    assert json.loads((out / "stability.json").read_text())["beta"] == 9


def test_a_figure_file_is_not_clobbered_either(cli, tmp_path):
    figure = tmp_path / "kmax.png"
    figure.write_bytes(b"mine")
    refused = cli(["theory", "stability", "--betas", "1:4", "--out", figure])
    assert refused.code == 2 and figure.read_bytes() == b"mine"
    assert cli(["theory", "stability", "--betas", "1:4", "--out", figure, "--overwrite"]).code == 0
    assert figure.read_bytes() != b"mine"


def test_the_old_flat_spelling_refuses_the_same_way(cli, tmp_path):
    out = tmp_path / "mf"
    (out).mkdir()
    (out / "metastability.json").write_text("{}")
    refused = cli(["metastability", "--betas", "2", "--caps", "2", "--seeds", "1", "--out", out])
    assert refused.code == 2 and "pass --overwrite" in refused.err
    assert (out / "metastability.json").read_text() == "{}"


def test_conformance_refuses_before_running_anything(cli, tmp_path):
    (tmp_path / "conformance.json").write_text("{}")
    refused = cli(["theory", "conformance", "--only", "equiangular", "--out", tmp_path])
    assert refused.code == 2 and "conformance.json' holds an earlier result" in refused.err
    assert (tmp_path / "conformance.json").read_text() == "{}"


def test_analyze_redoes_the_same_options_and_refuses_others(cli, tmp_path):
    states, labels = clustered(n_per_category=2, n_time=5, n_feature=16)
    run = write_run(tmp_path / "r", trace_dataset(states, labels))
    base = ["analyze", run, "--permutations", "5", "--no-figures"]
    assert cli(base).code == 0
    assert cli([*base, "--per-layer"]).code == 2  # other options: refused
    again = cli(base)  # the same options: simply redone
    assert again.code == 0, again.err
    refused = cli([*base, "--seed", "7"])
    assert refused.code == 2
    assert "made with another --seed; pass --overwrite" in refused.err
    assert json.loads((run / "metrics.json").read_text())["options"]["seed"] == 0
    figures = run / "figures"
    figures.mkdir(exist_ok=True)
    (figures / "trajectories.png").write_bytes(b"analyze")  # an earlier analysis's figure
    (figures / "theory_clouds.png").write_bytes(b"lens")  # another command's figure
    (run / "notes.txt").write_text("mine")
    assert cli([*base, "--per-layer", "--overwrite"]).code == 0
    assert json.loads((run / "metrics.json").read_text())["options"]["per_layer"] is True
    assert not (figures / "trajectories.png").exists()  # analyze's own: deleted
    assert (figures / "theory_clouds.png").read_bytes() == b"lens"  # lens's: kept
    assert (run / "notes.txt").read_text() == "mine"


def test_device_is_checked_before_a_model_is_loaded(cli, tmp_path):
    for argv in (
        ["demo", "--device", "tpu", "--out", tmp_path / "d"],
        ["steer", "eval", "--device", "tpu", "--out", tmp_path / "e"],
        ["eval-steering", "--device", "tpu", "--out", tmp_path / "e"],
    ):
        result = cli(argv)
        assert result.code == 2, argv
        assert "unknown --device 'tpu'" in result.err, (argv, result.err)
        assert "Traceback" not in result.err

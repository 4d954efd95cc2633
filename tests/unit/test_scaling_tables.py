"""docs/scaling.md cannot go stale: its generated GPU and 16-core tables equal what
the committed benchmark JSON files render to."""

from __future__ import annotations

from tests._scripts import ROOT
from tests._scripts import load_script as _load


def load_script():
    return _load("scaling_tables")


def test_committed_doc_matches_the_committed_data():
    assert load_script().main(["--check"]) == 0


def test_a_changed_measurement_is_caught(tmp_path, capsys):
    import json
    import shutil

    script = load_script()
    data = tmp_path / "scale"
    shutil.copytree(ROOT / "docs" / "data" / "scale", data)
    path = data / "h100-1.7b-all.json"
    result = json.loads(path.read_text())
    result["streamed"]["seconds"] = 4.0  # a streamed trace that got faster
    path.write_text(json.dumps(result))
    assert script.main(["--check", "--data", str(data)]) == 1
    assert "4.00 s" in capsys.readouterr().err


def test_a_changed_writer_measurement_is_caught(tmp_path, capsys):
    import json
    import shutil

    script = load_script()
    data = tmp_path / "scale"
    shutil.copytree(ROOT / "docs" / "data" / "scale", data)
    path = data / "cpu2-writer.json"
    result = json.loads(path.read_text())
    result["ratio_median"] = 0.93  # a writer that got faster
    path.write_text(json.dumps(result))
    assert script.main(["--check", "--data", str(data)]) == 1
    assert "0.93x" in capsys.readouterr().err

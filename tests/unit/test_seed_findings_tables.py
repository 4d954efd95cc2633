"""docs/seed-reproduction.md's block equals what the committed per-model JSON renders to
(no model needed), and an edited number in that data is caught."""

from __future__ import annotations

import json
import shutil

from tests._scripts import ROOT, load_script

DATA = ROOT / "docs" / "data"


def test_committed_doc_matches_the_committed_data():
    script = load_script("seed_findings")
    models = script.committed(DATA)
    assert list(models) == ["smollm2", "gemma3-270m"]
    assert script.main(["--check"]) == 0


def test_an_edited_number_in_the_data_makes_check_fail(tmp_path, capsys):
    script = load_script("seed_findings")
    data = tmp_path / "data"
    data.mkdir()
    for path in DATA.glob("seed-findings-*.json"):
        shutil.copy(path, data / path.name)
    doc = tmp_path / "seed-reproduction.md"
    shutil.copy(ROOT / "docs" / "seed-reproduction.md", doc)
    path = data / "seed-findings-gemma3-270m.json"
    m = json.loads(path.read_text())
    m["replication"]["wp/model"]["value"] += 0.5  # the confirmatory margin
    path.write_text(json.dumps(m))
    assert script.main(["--check", str(doc), "--data", str(data)]) == 1
    assert "is stale" in capsys.readouterr().err
    assert script.main(["--write", str(doc), "--data", str(data)]) == 0
    assert script.main(["--check", str(doc), "--data", str(data)]) == 0
    assert doc.read_text() != (ROOT / "docs" / "seed-reproduction.md").read_text()

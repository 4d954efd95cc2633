"""docs/conformance.md cannot go stale: its measured tables equal what the committed
conformance.json files (full and quick) render to, and an edited number is caught."""

from __future__ import annotations

from tests._scripts import ROOT
from tests._scripts import load_script as _load


def load_script():
    return _load("conformance_tables")


def test_committed_doc_matches_the_committed_data():
    assert load_script().main(["--check"]) == 0


def test_an_edited_number_in_the_doc_is_caught(tmp_path, capsys):
    script = load_script()
    text = (ROOT / "docs" / "conformance.md").read_text()
    begin, end = script.markers("quick")
    block = script._docblock.block_of(text, begin, end)
    row = next(line for line in block.splitlines() if line.startswith("| `mean-field-pde`"))
    edited = row.replace("-0.", "-0.9", 1)  # one digit of a measured rate
    assert edited != row
    doc = tmp_path / "conformance.md"
    doc.write_text(text.replace(row, edited))
    assert script.main(["--check", "--doc", str(doc)]) == 1
    assert "-0.9" in capsys.readouterr().err
    assert script.main(["--write", "--doc", str(doc)]) == 0
    assert script.main(["--check", "--doc", str(doc)]) == 0


def test_a_changed_measurement_in_the_data_is_caught(tmp_path, capsys):
    import json
    import shutil

    script = load_script()
    data = tmp_path / "conformance"
    shutil.copytree(ROOT / "docs" / "data" / "conformance", data)
    path = data / "quick" / "conformance.json"
    result = json.loads(path.read_text())
    result["items"][0]["status"] = "FAIL"
    path.write_text(json.dumps(result))
    assert script.main(["--check", "--data", str(data)]) == 1
    assert "7 of 8 items PASS" in capsys.readouterr().err

"""docs/steering.md cannot go stale: its generated tables equal what the committed
eval.json files render to, and a doc that differs is caught."""

from __future__ import annotations

from tests._scripts import ROOT
from tests._scripts import load_script as _load


def load_script():
    return _load("steering_tables")


def test_committed_doc_matches_the_committed_data():
    assert load_script().main(["--check"]) == 0


def test_check_names_the_difference_of_a_stale_doc(tmp_path, capsys):
    script = load_script()
    text = (ROOT / "docs" / "steering.md").read_text()
    block = script.block_of(text)
    lines = block.splitlines()
    stale = "\n".join([*lines[:2], "| a number that changed |", *lines[3:]])
    doc = tmp_path / "steering.md"
    doc.write_text(text.replace(block, stale))
    assert script.main(["--check", "--doc", str(doc)]) == 1
    err = capsys.readouterr().err
    assert "line 3" in err and "a number that changed" in err
    assert script.main(["--write", "--doc", str(doc)]) == 0
    assert script.main(["--check", "--doc", str(doc)]) == 0

"""docs/theory-lens.md cannot go stale: its generated tables (clouds, effective beta,
attention, probes, logit lens, attention-only flow) equal what the committed excerpts
of theory.json and flow.json render to, and a doc that differs is caught."""

from __future__ import annotations

import json

import pytest

from tests._scripts import ROOT
from tests._scripts import load_script as _load


def load_script():
    return _load("theory_lens_tables")


def test_committed_doc_matches_the_committed_data():
    assert load_script().main(["--check"]) == 0


@pytest.mark.parametrize("name", ["smollm2", "flow gemma3-270m"])
def test_check_names_the_difference_of_a_stale_doc(tmp_path, capsys, name):
    script = load_script()
    text = (ROOT / "docs" / "theory-lens.md").read_text()
    block = script.block_of(text, name)
    lines = block.splitlines()
    # one number in the middle of a table row changed
    row = next(i for i, line in enumerate(lines) if line.startswith("| 2 |"))
    cells = lines[row].split(" | ")
    cells[2] = "9.99"
    stale = "\n".join([*lines[:row], " | ".join(cells), *lines[row + 1 :]])
    doc = tmp_path / "theory-lens.md"
    doc.write_text(text.replace(block, stale))
    assert script.main(["--check", "--doc", str(doc)]) == 1
    err = capsys.readouterr().err
    assert f"line {row + 1}" in err and "9.99" in err
    assert script.main(["--write", "--doc", str(doc)]) == 0
    assert script.main(["--check", "--doc", str(doc)]) == 0
    assert doc.read_text() == text


def test_an_edited_number_in_the_data_is_caught(tmp_path):
    script = load_script()
    data = tmp_path / "data"
    data.mkdir()
    for path in (ROOT / "docs" / "data" / "theory-lens").glob("*.json"):
        (data / path.name).write_text(path.read_text())
    assert script.main(["--check", "--data", str(data)]) == 0
    edited = json.loads((data / "gemma3-270m.json").read_text())
    edited["theory"]["probes"]["last"]["accuracy"][3] += 0.04  # one prompt more at layer 3
    (data / "gemma3-270m.json").write_text(json.dumps(edited))
    assert script.main(["--check", "--data", str(data)]) == 1


def test_the_excerpt_keeps_theory_json_keys_and_values(tmp_path):
    script = load_script()
    run = tmp_path / "run"
    run.mkdir()
    theory = {
        "info": {"model": {"name": "m"}, "prompts": 2, "permutations": 5, "extra": 1},
        "probes": {"last": {"accuracy": [0.5, 0.75], "cv": "5-fold", "null": [[0.1]]}},
        "logit_lens": {"time": [0, 1], "top1": [0.0, 1.0], "top": [["a"]]},
    }
    (run / "theory.json").write_text(json.dumps(theory))
    path = script.extract(run, "smollm2", tmp_path / "out")
    data = json.loads(path.read_text())
    assert data["theory"]["probes"]["last"] == {"accuracy": [0.5, 0.75], "cv": "5-fold"}
    assert data["theory"]["logit_lens"] == {"time": [0, 1], "top1": [0.0, 1.0]}
    assert "extra" not in data["theory"]["info"] and data["flow"] is None

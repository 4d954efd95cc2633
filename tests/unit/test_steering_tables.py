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


OLD = ROOT / "tests" / "unit" / "data" / "eval-gemma3-270m-v1.json"


def test_an_earlier_eval_json_still_renders_with_ties_counted():
    """An eval.json written before the control families (Gemma-3's committed file then:
    one label-shuffle draw, no centroid halves, ``rank`` 1 while 4 controls tied)."""
    import json

    from tokenfield.cli.steer_cmd import summary_text

    result = json.loads(OLD.read_text())
    assert result["control_summary"]["rank"] == 1  # what the file says (strictly above)
    text = load_script().render_model("Gemma", result)
    assert "| random directions (isotropic) | 32 | 0.0 % | 2.0 % | 2.0 % | 5 of 33 " in text
    assert "(4 at or above, 4 tied) | 0.152 |" in text
    assert "| label shuffles (pooled fit states, random halves) | 1 | 1.7 %" in text
    assert "centroid halves (fit problems, random halves, both forms) | not in this" in text
    assert "An earlier eval.json" in text
    words = summary_text(result)
    assert "32 random-direction controls" in words and "steered ranks 5 of 33" in words
    assert "1 label-shuffle controls" in words


def test_control_families_render_from_an_eval_json_of_this_version():
    import json

    result = json.loads(OLD.read_text())
    result["steered"]["accuracy"] = 0.02
    result["label_shuffle"] = {"accuracies": [0.01] * 30 + [0.02, 0.03], "seeds": list(range(32))}
    result["centroid_halves"] = {"accuracies": [0.0] * 32, "seeds": list(range(32))}
    text = load_script().render_model("Gemma", result)
    assert "| 32 | 1.0 % | 1.4 % | 3.0 % | 3 of 33 (2 at or above, 1 tied) | 0.091 |" in text
    assert "| 32 | 0.0 % | 0.0 % | 0.0 % | 1 of 33 (0 at or above) | 0.030 |" in text
    assert "An earlier eval.json" not in text


def test_the_test_summary_figure_reads_old_and_new_files(tmp_path):
    import json

    from tokenfield.viz.steering import plot_test_summary, save

    result = json.loads(OLD.read_text())
    ax = plot_test_summary(result)
    labels = [t.get_text() for t in ax.get_xticklabels()]
    assert labels[-2:] == ["random directions", "label shuffles"]
    save(ax, tmp_path / "old")
    result["centroid_halves"] = {"accuracies": [0.0] * 32, "seeds": list(range(32))}
    ax = plot_test_summary(result)
    assert [t.get_text() for t in ax.get_xticklabels()][-1] == "centroid halves"
    save(ax, tmp_path / "new")
    assert (tmp_path / "new.png").stat().st_size > 0

"""What the commands print: help text, where results and progress go, table widths."""

from __future__ import annotations

import re

import pytest
import typer.main

from tokenfield.cli import app

EMOJI = re.compile("[\U0001f000-\U0001faff\u2600-\u27bf\u2b00-\u2bff\ufe0f]")


def _commands() -> dict:
    """Every command by its path ("trace", "theory pde", ...), the hidden old names too."""
    found = {}

    def walk(group, path):
        for name, command in group.commands.items():
            found[" ".join((*path, name))] = command
            if hasattr(command, "commands"):
                walk(command, (*path, name))

    walk(typer.main.get_command(app), ())
    return found


@pytest.mark.parametrize("name", sorted(_commands()))
def test_help_has_no_emoji_and_shows_flags_as_flags(name, capsys, cli):
    status, out, err = cli([*name.split(), "--help"])
    assert status == 0, err
    assert not EMOJI.search(out), EMOJI.findall(out)
    assert "<bool>" not in out  # a boolean flag takes no value
    command = _commands()[name]
    for param in getattr(command, "params", []):
        if getattr(param, "is_flag", False) and param.opts[0] != "--help" and not param.hidden:
            # shown as a flag: '--json' or '--figures / --no-figures', never with a type
            # (and by its first long name only: the others are hidden old spellings)
            longs = [n for n in param.opts if n.startswith("--")][:1]
            spelled = " / ".join([*longs, *param.secondary_opts[:1]])
            line = next(line for line in out.splitlines() if spelled in line)
            assert "<" not in line.split(spelled, 1)[1].split("  ")[0], line


def test_range_syntax_is_printed_literally(capsys, cli):
    for name in ("stability", "predict-clusters", "phase-diagram", "metastability"):
        _, out, _ = cli([name, "--help"])
        assert "A:B:N" in out, name


def test_a_flag_still_works_as_documented(capsys, tmp_path, cli):
    status, out, err = cli(["stability", "--beta", "4", "--json"])
    assert status == 0, err
    assert out.lstrip().startswith("{")


# --- where output goes: results on stdout, progress and notes on stderr ---------------


def test_predict_clusters_prints_a_progress_bar_on_stderr(capsys, cli):
    args = ["predict-clusters", "--betas", "1,2", "--dynamics", "usa", "--n", "8", "--seeds", "1"]
    status, out, err = cli(args)
    assert status == 0, err
    assert "first plateau" in out and "experiments" not in out  # the table
    assert "2/2 experiments" in err and "first plateau" not in err  # the finished bar


def test_phase_diagram_prints_a_progress_bar_on_stderr(capsys, tmp_path, cli):
    args = ["phase-diagram", "--dims", "2", "--betas", "1,2", "--t-max", "1", "--frames", "3",
            "--n", "4", "--systems", "2", "--beta-block", "1", "--out", tmp_path / "pd"]  # fmt: skip
    status, out, err = cli(args)
    assert status == 0, err
    assert "2 tasks run" in out and "wrote" in out
    assert "2/2 tasks" in err and "tasks run" not in err
    # resumed: nothing to do, the bar says 0/0 and the result says so
    status, out, err = cli(args)
    assert status == 0 and "0 tasks run, 2 resumed" in out


def test_json_output_stays_parseable_with_a_progress_bar(capsys, cli):
    import json

    args = ["predict-clusters", "--betas", "1", "--dynamics", "usa", "--n", "8", "--seeds", "1"]
    status, out, err = cli([*args, "--json"])
    assert status == 0, err
    assert json.loads(out)["rows"][0]["beta"] == 1.0
    assert "1/1 experiments" in err


def test_metastability_hints_at_t_max_when_a_time_is_inf(capsys, cli):
    args = ["metastability", "--betas", "2,9", "--seeds", "1", "--t-cap", "50"]  # old spelling
    status, out, err = cli(args)
    assert status == 0, err
    assert "inf" in out
    assert "raise --t-max" in err and "beta = 9" in err and "hint" not in out
    status, out, err = cli(["metastability", "--betas", "2,3", "--seeds", "1"])
    assert status == 0 and "hint" not in err  # every seed merged: no hint


def test_metastability_fit_from_restricts_the_fit(capsys, cli):
    args = ["metastability", "--betas", "2,3,4", "--seeds", "1", "--json"]
    _, everything, _ = cli(args)
    _, tail, err = cli([*args, "--fit-from", "3"])
    import json

    everything, tail = json.loads(everything), json.loads(tail)
    assert tail["fit_min_beta"] == 3.0 and everything["fit_min_beta"] is None
    times = tail["median_time"]
    import numpy as np

    expected = np.polyfit([3.0, 4.0], np.log(times[1:]), 1)[0]
    assert tail["slope"] == pytest.approx(expected, rel=1e-9)
    assert everything["slope"] != pytest.approx(expected, rel=1e-6)


# --- tables are not cut when the output is not a terminal -----------------------------


def test_tables_are_printed_whole_when_not_a_terminal(capsys):
    from rich.table import Table

    from tokenfield._progress import console

    header = "progress@layer " + "x" * 150
    table = Table()
    table.add_column(header)
    table.add_column("another column")
    table.add_row("1.0", "2.0")
    console().print(table)
    console(stderr=True).print("a note " + "y" * 200)
    captured = capsys.readouterr()
    assert header in captured.out and "…" not in captured.out
    assert "a note " + "y" * 200 in captured.err


def test_a_long_hint_is_one_line(cli):
    status, _, err = cli(["metastability", "--betas", "9", "--seeds", "1", "--t-cap", "5"])
    assert status == 0
    hint = [line for line in err.splitlines() if "hint" in line]
    assert len(hint) == 1 and hint[0].rstrip().endswith("--t-max 200"), err


# --- fitted betas only where the fit explains something (R^2 >= 0.01) ----------------


def _theory(beta, r2):
    return {"effective_beta": {"beta": beta, "r2": r2}, "notes": []}


def test_report_table_hides_betas_of_fits_that_explain_nothing():
    from tokenfield.viz.theory import theory_html_section

    text = theory_html_section(_theory([86.7, 2.5, 127.0], [1e-5, 0.4, 0.0099]))
    assert "86.7" not in text and "127" not in text
    assert "2.5" in text and text.count("n/a (R\u00b2 &lt; 0.01)") == 2


def test_lens_summary_hides_betas_of_fits_that_explain_nothing(capsys):
    from types import SimpleNamespace

    import numpy as np

    from tokenfield._progress import console
    from tokenfield.cli.lens_cmd import _summary

    columns = {"beta": np.array([86.7, 2.5, 127.0]), "r2": np.array([1e-5, 0.4, 0.5])}
    beta = SimpleNamespace(column=lambda name: columns[name])
    result = SimpleNamespace(
        clouds=None, baseline_clouds=None, simulated=None, beta=beta, beta_heads=None,
        attention=None, probes={}, lens=None,
    )  # fmt: skip
    _summary(console(), result)
    row = next(line for line in capsys.readouterr().out.splitlines() if "effective beta" in line)
    assert "86.7" not in row and "n/a" in row and "2.5" in row and "127" in row


# --- the first hour: a directory of runs, the README's examples ------------------------


def test_a_directory_of_runs_names_the_runs_inside(capsys, tmp_path, cli):
    from tests.unit.synthetic_trajectories import clustered, trace_dataset, write_run

    states, labels = clustered(n_per_category=2, n_time=3, n_feature=8)
    for name in ("seed-spectrum", "seed-categories"):
        write_run(tmp_path / "demo" / name, trace_dataset(states, labels))
    (tmp_path / "demo" / "report.html").write_text("<html></html>")
    for command in (["analyze"], ["report", "--out", tmp_path / "r.html"], ["lens"]):
        status, out, err = cli([command[0], tmp_path / "demo", *command[1:]])
        assert status == 2 and out == ""
        lines = err.strip().splitlines()
        assert len(lines) == 1, err
        assert "holds runs: seed-categories, seed-spectrum" in lines[0]
        assert "pass one of them" in lines[0]
    status, _, err = cli(["analyze", tmp_path / "demo" / "seed-spectrum" / "figures"])
    assert status == 2 and "not a tokenfield run" in err and "holds" not in err


def test_readme_and_docs_report_examples_write_under_runs():
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    found = 0
    for doc in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
        for line in doc.read_text(encoding="utf-8").splitlines():
            if "tokenfield report" in line and "--out" in line:
                found += 1
                target = line.split("--out", 1)[1].split()[0]
                assert target.startswith("runs/"), f"{doc.name}: {line}"
    assert found >= 2

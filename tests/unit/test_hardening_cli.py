"""Issue 21, the command-line items: prompts read as written, one line (exit 2)
where a traceback was, bounded waits, no partial run left by a failure found
before any work, and ``lens`` adding to a run instead of replacing it.

Each test drives the real command (``tokenfield.cli.main``) or the real library
function and checks the outcome (on disk where there is one). No model is loaded.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests._cli import run_cli
from tokenfield.errors import UserError
from tokenfield.prompts import load_prompts


def one_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("tokenfield: error: "), err
    assert "Traceback" not in err
    return lines[0]


def tree(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in path.rglob("*") if p.is_file()}


# --- prompts: read as written ----------------------------------------------------


@pytest.mark.parametrize("suffix", [".jsonl", ".yaml", ".csv"])
def test_a_category_or_label_of_zero_is_kept(tmp_path, suffix):
    path = tmp_path / f"p{suffix}"
    if suffix == ".jsonl":
        path.write_text('{"text": "a", "category": 0, "label": 0}\n{"text": "b"}\n')
    elif suffix == ".yaml":
        path.write_text("- {text: a, category: 0, label: 0}\n- {text: b}\n")
    else:
        path.write_text("text,category,label\na,0,0\nb,,\n")
    first, second = load_prompts(path)
    assert (first.category, first.label) == ("0", "0")
    assert (second.category, second.label) == ("", "")


@pytest.mark.parametrize("separator", ["\u2028", "\u2029", "\x85", "\x0c", "\x1e", "\r"])
def test_a_line_separator_inside_a_txt_prompt_keeps_it_one_prompt(tmp_path, separator):
    path = tmp_path / "p.txt"
    path.write_bytes(f"one{separator}two\r\nthree\n".encode())
    prompts = load_prompts(path)
    assert [p.text for p in prompts] == [f"one{separator}two", "three"]


def test_a_line_separator_inside_a_jsonl_string_keeps_the_line_whole(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"text": "one\u2028two"}\n{"text": "three"}\n', encoding="utf-8")
    assert [p.text for p in load_prompts(path)] == ["one\u2028two", "three"]


def test_a_quoted_newline_in_a_csv_field_is_kept(tmp_path):
    path = tmp_path / "p.csv"
    path.write_text('text,category\n"first line\nsecond line",a\nplain,b\n', newline="")
    prompts = load_prompts(path)
    assert [p.text for p in prompts] == ["first line\nsecond line", "plain"]
    assert [p.category for p in prompts] == ["a", "b"]


def test_a_csv_row_with_an_extra_field_is_an_error(tmp_path, capsys):
    path = tmp_path / "p.csv"
    path.write_text("text,category\nhello,a,oops\n")
    with pytest.raises(UserError, match="row 1 .* more fields than the header"):
        load_prompts(path)
    code, _out, err = run_cli(["trace", "-p", path, "-o", tmp_path / "r"], capsys)
    assert code == 2
    assert "more fields than the header" in one_error_line(err)
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize(
    "name, content",
    [("p.jsonl", '{"text": "bad \\ud800 text"}\n'), ("p.yaml", '- "bad \\ud800 text"\n')],
)
def test_a_lone_surrogate_in_a_prompt_is_one_line(tmp_path, name, content, capsys):
    path = tmp_path / name
    path.write_text(content)
    code, _out, err = run_cli(["trace", "-p", path, "-o", tmp_path / "r"], capsys)
    assert code == 2
    assert "lone surrogate (U+D800)" in one_error_line(err)
    assert not (tmp_path / "r").exists()

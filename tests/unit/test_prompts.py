import json

import pytest

from tokenfield.errors import UserError
from tokenfield.prompts import Prompt, as_prompts, load_prompts


def test_seed_sets_match_the_seed_post():
    categories = load_prompts("seed-categories")
    assert len(categories) == 25
    assert [p.category for p in categories[::5]] == [
        "Math",
        "Code",
        "History/Facts",
        "Creative/Poetry",
        "Logic/Syllogism",
    ]
    assert categories[10].text == "The capital of France is"
    spectrum = load_prompts("seed-spectrum")
    assert len(spectrum) == 21
    assert [p.label for p in spectrum] == [str(i) for i in range(1, 22)]
    assert len({p.category for p in spectrum}) == 7
    assert spectrum[14] == Prompt(
        "''' This class handles user authentication '''", "Docstrings", "15"
    )
    assert spectrum[18].text == "class Love(Emotion): def __init__(self):"
    assert spectrum[16].text == "REPEAT until x is greater than 10:"


def test_file_formats(tmp_path):
    (tmp_path / "a.txt").write_text("# comment\nfirst prompt\n\nsecond prompt\n")
    assert [p.text for p in load_prompts(tmp_path / "a.txt")] == ["first prompt", "second prompt"]
    rows = [{"text": "x = 1", "category": "Code"}, {"text": "Once upon", "label": "7"}]
    (tmp_path / "b.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert load_prompts(tmp_path / "b.jsonl") == [
        Prompt("x = 1", "Code"),
        Prompt("Once upon", "", "7"),
    ]
    (tmp_path / "c.csv").write_text('text,category\n"a, b",X\nc,Y\n')
    assert load_prompts(str(tmp_path / "c.csv")) == [Prompt("a, b", "X"), Prompt("c", "Y")]
    (tmp_path / "d.yaml").write_text("Math:\n  - 1 + 1 =\nStory:\n  - Once\n")
    assert load_prompts(tmp_path / "d.yaml") == [Prompt("1 + 1 =", "Math"), Prompt("Once", "Story")]
    (tmp_path / "e.yml").write_text("- plain\n- text: mapped\n  category: C\n")
    assert load_prompts(tmp_path / "e.yml") == [Prompt("plain"), Prompt("mapped", "C")]
    assert as_prompts(["s", {"text": "t", "category": "k"}]) == [Prompt("s"), Prompt("t", "k")]


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("empty.txt", "", "no prompts"),
        ("comments.txt", "# only a comment\n\n", "no prompts"),
        ("bad.jsonl", '{"text": "ok"}\nnot json\n', "line 2 .* not valid JSON"),
        ("notext.jsonl", '{"prompt": "x"}\n', "has no 'text'"),
        ("nocol.csv", "prompt\nx\n", "no 'text' column"),
        ("bad.yaml", "a: [b\n", "not valid YAML"),
        ("x.docx", "hello", "unknown extension"),
        ("binary.txt", b"\xff\xfe\x00bad", "cannot read"),
    ],
)
def test_bad_files_raise_one_line_errors(tmp_path, name, content, message):
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    with pytest.raises(UserError, match=message) as info:
        load_prompts(path)
    assert "\n" not in str(info.value) and str(info.value).endswith(".")


def test_missing_file_names_the_bundled_sets(tmp_path):
    with pytest.raises(UserError, match="does not exist.*seed-categories, seed-spectrum"):
        load_prompts(tmp_path / "nope.txt")


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("typo.csv", "text,catgory\nhello,code\n"),
        ("typo.jsonl", '{"text": "hello", "category": "a"}\n{"text": "x", "catgory": "b"}\n'),
        ("typo.yaml", "- text: hello\n  catgory: code\n"),
    ],
)
def test_a_misspelled_column_is_an_error_naming_the_known_ones(tmp_path, name, content):
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(UserError, match="unknown (field|column) 'catgory'") as info:
        load_prompts(path)
    message = str(info.value)
    assert "\n" not in message and "text, category, label" in message


def test_known_columns_in_any_order_still_load(tmp_path):
    path = tmp_path / "ok.csv"
    path.write_text("label,category,text\n1,code,hello\n")
    assert load_prompts(path) == [Prompt("hello", "code", "1")]

"""Every number table in docs/ is generated from committed data by a script with
``--check``, and that check catches an edited number.

Each table script in ``TABLE_SCRIPTS`` defines ``DOC`` (the Markdown file),
``DATA`` (the committed data it renders) and ``blocks(data)`` (``(begin, end,
text)`` for each generated block), and takes ``--check``/``--write``/``--doc``
through ``scripts/_docblock.py``. ``scripts/seed_findings.py`` regenerates its
doc from the bundled models, so its check runs in the slow tier
(``tests/slow/test_seed_findings.py``).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests._scripts import ROOT, load_script

TABLE_SCRIPTS = (
    "steering_tables",
    "scaling_tables",
    "meanfield_tables",
    "theory_lens_tables",
    "conformance_tables",
    "simulator_tables",
    "hypotheses_tables",
    "attractors_tables",
)


# Blocks written by a script that regenerates them from the models (slow tier).
SLOW_GENERATED = {"seed-reproduction.md": "scripts/seed_findings.py"}

# Tables of settings, not measurements (their numbers are defaults).
SETTINGS_TABLES = {"| parameter | meaning | default |"}

NUMBER = re.compile(r"^[-+−~≈<>≤≥]*\s*\d[\d,]*(\.\d+)?(e[-+]?\d+)?\s*(x|×|%|s|ms|MiB|GiB|MB|GB)?$")


@pytest.mark.parametrize("name", TABLE_SCRIPTS)
def test_the_committed_doc_equals_what_its_data_renders(name):
    assert load_script(name).main(["--check"]) == 0


def _edited(block: str) -> str:
    """The block with the first number of its first table row changed."""
    lines = block.splitlines()
    for i, line in enumerate(lines):
        cells = line.split("|")
        if not line.startswith("|") or set(line) <= set("|-: "):
            continue
        for j, cell in enumerate(cells):
            if re.search(r"\d", cell) and i > 1:
                cells[j] = re.sub(r"\d", lambda m: str((int(m.group()) + 1) % 10), cell, count=1)
                lines[i] = "|".join(cells)
                return "\n".join(lines)
    raise AssertionError("the generated block has no number in a table row")


@pytest.mark.parametrize("name", TABLE_SCRIPTS)
def test_an_edited_number_in_any_generated_block_fails_the_check(name, tmp_path, capsys):
    script = load_script(name)
    text = Path(script.DOC).read_text()
    for begin, _end, fresh in script.blocks(Path(script.DATA)):
        if not any(line.startswith("|") for line in fresh.splitlines()):
            continue
        doc = tmp_path / Path(script.DOC).name
        doc.write_text(text.replace(fresh, _edited(fresh), 1))
        assert doc.read_text() != text, f"{name}: block {begin} not found verbatim in the doc"
        assert script.main(["--check", "--doc", str(doc)]) == 1, begin
        assert "differs" in capsys.readouterr().err
        assert script.main(["--write", "--doc", str(doc)]) == 0
        assert doc.read_text() == text  # --write puts the committed numbers back


def _tables(text: str):
    """(first line number, lines) of each Markdown table outside generated blocks."""
    inside, table, start = False, [], 0
    for number, line in enumerate(text.splitlines(), 1):
        if re.match(r"<!-- (BEGIN )?generated", line):
            inside = True
        elif re.match(r"<!-- (END|end) generated", line):
            inside = False
        elif line.startswith("|") and not inside:
            if not table:
                start = number
            table.append(line)
            continue
        if table:
            yield start, table
            table = []
    if table:
        yield start, table


def _numeric_cells(table: list[str]) -> list[str]:
    cells = []
    for line in table[2:]:  # header and rule excluded
        for cell in line.strip().strip("|").split("|"):
            value = cell.strip().strip("*`").strip()
            if NUMBER.match(value):
                cells.append(value)
    return cells


def test_no_hand_pasted_number_table_in_the_docs():
    """A table whose cells hold measured numbers must sit in a generated block."""
    pasted = []
    for doc in sorted((ROOT / "docs").glob("*.md")):
        for start, table in _tables(doc.read_text()):
            if table[0].strip() in SETTINGS_TABLES:
                continue
            cells = _numeric_cells(table)
            if len(cells) >= 2:
                pasted.append(f"docs/{doc.name}:{start} ({', '.join(cells[:3])}, ...)")
    assert not pasted, "number tables outside generated blocks:\n" + "\n".join(pasted)

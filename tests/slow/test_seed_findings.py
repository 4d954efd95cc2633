"""docs/seed-reproduction.md cannot go stale: its tables are regenerated from fresh traces
of a bundled model (seed and replication sets) and compared with the committed text."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def test_seed_reproduction_doc_matches_what_the_script_measures(tmp_path):
    """SmolLM2 end to end: trace the seed and replication sets and their random copies,
    measure, and compare with the doc (Gemma's rows come from its committed data,
    checked against the doc by tests/unit/test_seed_findings_tables.py)."""
    doc = ROOT / "docs" / "seed-reproduction.md"
    data = sorted((ROOT / "docs" / "data").glob("seed-findings-*.json"))
    before = [doc.read_text(), *(path.read_text() for path in data)]
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "seed_findings.py"),
            f"smollm2={tmp_path / 'demo'}",
            "--trace",
            "--check",
            str(doc),
        ],
        capture_output=True,
        text=True,
        timeout=1500,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert "up to date" in done.stderr
    assert {p.name for p in (tmp_path / "demo").iterdir()} >= {
        "seed-categories",
        "replication-spectrum-random",
    }
    assert [doc.read_text(), *(path.read_text() for path in data)] == before  # --check never writes


def test_check_fails_on_a_stale_doc(tmp_path):
    """The comparison itself: a doc whose generated block differs is reported, exit 1."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import seed_findings
    finally:
        sys.path.pop(0)
    doc = (ROOT / "docs" / "seed-reproduction.md").read_text()
    head, rest = doc.split(seed_findings.BEGIN, 1)
    block, tail = rest.split(seed_findings.END, 1)
    assert block.strip(), "the doc's generated block is empty"
    changed = seed_findings.splice(doc, block.lstrip("\n").replace("0.", "9.", 1))
    assert changed != doc
    assert seed_findings.splice(doc, block.lstrip("\n")) == doc

"""The quick conformance suite, end to end through the command (as CI runs it)."""

from __future__ import annotations

import json

from tokenfield.cli import main
from tokenfield.pipelines.conformance import ITEMS

KEYS = {"name", "reference", "measured", "tolerance", "status", "seconds"}


def test_quick_conformance_suite_passes(tmp_path):
    out = tmp_path / "conf"
    try:
        main(["conformance", "--quick", "--out", str(out)])
        code = 0
    except SystemExit as exc:
        code = exc.code
    data = json.loads((out / "conformance.json").read_text())
    items = data["items"]
    assert [item["name"] for item in items] == list(ITEMS)
    for item in items:
        assert set(item) >= KEYS, item
        assert item["status"] == "PASS", item
        assert item["seconds"] > 0
        assert (out / "figures" / f"{item['name']}.png").stat().st_size > 1000
    assert code == 0
    page = (out / "conformance.html").read_text()
    assert "data:image/png;base64," in page
    assert "http://" not in page and "https://" not in page  # offline

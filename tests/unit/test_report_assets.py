"""The report's JavaScript lives in package files (report/assets), and a wheel carries them."""

from __future__ import annotations

import ast
import fnmatch
import re
from importlib import resources
from pathlib import Path

from tokenfield.report.views import SCRIPTS, page_script

ROOT = Path(__file__).resolve().parents[2]


def test_the_page_script_is_read_from_the_package() -> None:
    folder = resources.files("tokenfield.report") / "assets"
    script = page_script()
    for name in SCRIPTS:
        text = (folder / name).read_text(encoding="utf-8")
        assert text.strip() and text in script
    assert script.index("window.tokenfieldShow = function") < script.index("tokenfieldShow(div.id)")
    assert "</script" not in script.lower()  # it is inlined in a <script> element


def test_package_data_includes_every_asset() -> None:
    # (tomllib is Python 3.11+; the package supports 3.10)
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    section = text.split("[tool.setuptools.package-data]", 1)[1].split("\n[", 1)[0]
    patterns = ast.literal_eval(re.search(r"^tokenfield\s*=\s*(\[.*?\])", section, re.M | re.S)[1])
    package = ROOT / "src" / "tokenfield"
    assets = sorted(p for p in (package / "report" / "assets").iterdir() if p.is_file())
    assert {p.name for p in assets} >= set(SCRIPTS)
    for asset in assets:
        relative = asset.relative_to(package).as_posix()
        assert any(fnmatch.fnmatch(relative, pattern) for pattern in patterns), relative

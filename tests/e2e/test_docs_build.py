"""The documentation site builds in strict mode and documents every public name.

``mkdocs build --strict`` (a warning is an error: a broken link or anchor, a
docstring that names a parameter the function does not have) into a temporary
directory, without running the notebooks (``tests/slow/test_tutorials.py`` runs them).
Then every name of ``tokenfield.__all__`` and of each floor's ``__all__`` must have its
entry, by its defining path, on its floor's page of the built API reference.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import docs_api  # noqa: E402

if importlib.util.find_spec("mkdocs") is None:
    if os.environ.get("CI"):
        raise RuntimeError("mkdocs is missing in CI: make setup installs the 'docs' extra")
    pytest.skip(
        "mkdocs is not installed (pip install -e '.[docs]', or make setup)",
        allow_module_level=True,
    )


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = {
        **os.environ,
        "TOKENFIELD_DOCS_EXECUTE": "false",
        "NO_MKDOCS_2_WARNING": "1",
        "PYTHONPATH": str(ROOT / "src"),
    }
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert "WARNING" not in done.stderr, done.stderr[-4000:]
    return out


def test_every_public_name_has_its_entry_on_its_floor_page(site: Path) -> None:
    import tokenfield

    entries = docs_api.reference()
    titles = {entry.title for entry in entries}
    missing = [f"tokenfield.{n}" for n in tokenfield.__all__ if n != "__version__"]
    assert not [name for name in missing if name not in titles]
    pages = {floor: (site / "api" / f"{floor}.html").read_text() for floor in docs_api.FLOORS}
    absent = [
        f"{entry.title} ({entry.path}) not on api/{entry.floor}.html"
        for entry in entries
        if f'id="{entry.path}"' not in pages[entry.floor]
    ]
    assert not absent, absent
    index = (site / "api" / "index.html").read_text()
    assert all(f"<code>{entry.title}</code>" in index for entry in entries)


def test_the_pages_and_tutorials_are_in_the_site(site: Path) -> None:
    for page in sorted((ROOT / "docs").glob("*.md")):
        assert (site / page.with_suffix(".html").name).is_file(), page.name
    for notebook in sorted((ROOT / "docs" / "tutorials").glob("*.ipynb")):
        html = (site / "tutorials" / notebook.with_suffix(".html").name).read_text()
        cells = json.loads(notebook.read_text())["cells"]
        title = "".join(cells[0]["source"]).splitlines()[0].lstrip("# ")
        assert title in html, notebook.name
        assert "jp-Notebook" in html  # rendered by mkdocs-jupyter, not copied as a file
    # the site reads offline: no web fonts, no script or style from another host
    for page in ("index.html", "api/trace.html", "tutorials/01-trace.html"):
        html = (site / page).read_text()
        assert "fonts.googleapis" not in html, page
        assert not re.findall(r'<script[^>]+src="https?://', html), page
        assert not re.findall(r'<link[^>]+rel="stylesheet"[^>]+href="https?://', html), page

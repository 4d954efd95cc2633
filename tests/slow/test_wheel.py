"""The wheel, installed the way a user installs it: outside the Makefile, not from source.

The tracked files are copied to a temporary directory (as a fresh clone has them),
the wheel is built there (``pip wheel --no-deps``, build isolation on: setuptools
comes from the package index, as for any user) and installed into a fresh virtual
environment. That environment then runs the installed ``tokenfield`` entry point:
``--help``, ``models``, a trace of a tiny local model directory on a bundled prompt set
(package data), ``analyze`` and ``report``.

What it costs and what it proves. Installing the dependencies from the index (torch
first, then transformers and the rest) takes minutes, too long for CI. So the fresh
environment sees the test's own environment's third-party packages through a
directory of links that leaves every ``tokenfield`` entry out (its editable install,
its metadata): the wheel is installed with ``pip install`` (its dependencies checked
against what is present, nothing downloaded) and ``import tokenfield`` can only find
the wheel's files (asserted). This proves the wheel's contents (modules, package data,
entry point) and that its declared dependencies are satisfied by the versions CI uses;
it does not prove that a resolver picks working versions from the index.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def _run(args: list[str | Path], cwd: Path, env: dict[str, str], timeout: int = 600):
    done = subprocess.run(
        [str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, f"{args}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def _tracked_copy(target: Path) -> Path:
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    if listed.returncode != 0:
        pytest.skip("not a git checkout: the wheel test copies the tracked files")
    for name in filter(None, listed.stdout.split("\0")):
        source = ROOT / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    return target


def _linked_site_packages(target: Path) -> Path:
    """Links to this environment's packages, every tokenfield entry left out."""
    target.mkdir()
    site = Path(sysconfig.get_paths()["purelib"])
    for entry in site.iterdir():
        if "tokenfield" in entry.name.lower() or entry.suffix == ".pth":
            continue
        (target / entry.name).symlink_to(entry)
    return target


@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    work = tmp_path_factory.mktemp("wheel")
    clone = _tracked_copy(work / "clone")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", work / "dist", clone],
         cwd=work, env=env)  # fmt: skip
    (wheel,) = (work / "dist").glob("tokenfield-*.whl")
    venv = work / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=work, env=env)
    venv_site = Path(
        _run([venv / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
             cwd=work, env=env).stdout.strip()
    )  # fmt: skip
    links = _linked_site_packages(work / "links")
    (venv_site / "zz_ci_packages.pth").write_text(f"{links}\n")
    # pip itself comes from the links; it installs into the fresh venv (its sys.prefix)
    _run([venv / "bin" / "python", "-m", "pip", "install", "-q", "--no-index", wheel],
         cwd=work, env=env)  # fmt: skip
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return venv, env


def test_the_wheel_is_what_gets_imported(fresh, tmp_path: Path) -> None:
    venv, env = fresh
    where = _run([venv / "bin" / "python", "-c", "import tokenfield; print(tokenfield.__file__)"],
                 cwd=tmp_path, env=env).stdout.strip()  # fmt: skip
    assert where.startswith(str(venv)), where
    assert str(ROOT / "src") not in where


def test_the_entry_point_traces_analyses_and_reports(fresh, tmp_path: Path) -> None:
    venv, env = fresh
    tokenfield = venv / "bin" / "tokenfield"
    assert "trace" in _run([tokenfield, "--help"], cwd=tmp_path, env=env).stdout
    models = _run([tokenfield, "models", "--json"], cwd=tmp_path, env=env).stdout
    assert '"name": "smollm2"' in models
    sys.path.insert(0, str(ROOT))
    from tests.integration.tiny import save_tiny

    model_dir = save_tiny("llama", tmp_path / "tiny-llama")
    run = tmp_path / "run"
    traced = _run([tokenfield, "trace", "--model", model_dir, "--prompts", "seed-categories",
                   "--out", run], cwd=tmp_path, env=env)  # fmt: skip
    assert "traced 25 particles" in traced.stdout + traced.stderr  # the bundled prompt set
    _run([tokenfield, "analyze", run], cwd=tmp_path, env=env)
    assert (run / "metrics.json").is_file()
    report = tmp_path / "report.html"
    _run([tokenfield, "report", run, "--out", report], cwd=tmp_path, env=env)
    page = report.read_text()
    assert "Plotly" in page and "The capital of France" in page  # plotly.js inlined, prompts shown

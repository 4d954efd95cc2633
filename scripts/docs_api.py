"""The API reference of the documentation site, generated from the package itself.

A mkdocs hook (``hooks:`` in ``mkdocs.yml``): at build time it writes ``api/*.md``,
one page per floor (trace, runs, analysis, particles, meanfield, steering, report).
Each page lists the names of ``tokenfield.__all__`` whose defining module is on that
floor, then the other names in the floor packages' own ``__all__``. Every entry is
a mkdocstrings block on the name's *defining* module, read from the object itself
(``obj.__module__``), so a function that moves to another module moves in the
reference too; a name whose module is on no floor stops the build with its name.

``python scripts/docs_api.py`` prints the reference (floor, name, path), which is
what ``tests/unit/test_docs_site.py`` checks against ``tokenfield.__all__``.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PLOTLY_JS = "assets/plotly.min.js"  # in the site, beside Material's assets

# floor -> (page title, one line on what it holds, module prefixes on that floor).
# A module belongs to the floor with the longest matching prefix.
FLOORS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "trace": (
        "Trace",
        "Load a real model (bundled, local, GGUF or from the hub) and trace its residual stream.",
        ("tokenfield.models", "tokenfield.pipelines.trace"),
    ),
    "runs": (
        "Runs and prompts",
        "Runs on disk (run.json + trajectory.zarr), prompt sets, and the error type.",
        ("tokenfield.runs", "tokenfield.prompts", "tokenfield.errors"),
    ),
    "analysis": (
        "Analysis",
        "Measurements on any trajectory, traced or simulated: data in, data out.",
        (
            "tokenfield.analysis",
            "tokenfield.pipelines.analyze",
            "tokenfield.pipelines.theory",
            "tokenfield.pipelines.flow",
            "tokenfield.pipelines.attractors",
            "tokenfield.pipelines.hypotheses",
        ),
    ),
    "particles": (
        "Particles",
        "Self-attention as interacting particles on the sphere: dynamics, solvers, initial states.",
        ("tokenfield.particles", "tokenfield.pipelines.simulate"),
    ),
    "meanfield": (
        "Mean field",
        "Linear stability, the mean-field PDE, cluster predictions, the phase diagram.",
        (
            "tokenfield.meanfield",
            "tokenfield.pipelines.meanfield",
            "tokenfield.pipelines.conformance",
            "tokenfield.pipelines.conformance_causal",
        ),
    ),
    "steering": (
        "Steering",
        "Steering vectors, their evaluation with controls, and closed-loop steering.",
        ("tokenfield.steering", "tokenfield.pipelines.steer"),
    ),
    "report": (
        "Report and figures",
        "The HTML report, the figures it draws, and `tokenfield.plot` for notebooks.",
        ("tokenfield.report", "tokenfield.viz", "tokenfield.plot", "tokenfield.pipelines.report"),
    ),
}

# The packages whose own ``__all__`` is part of the public reference, by floor.
FLOOR_PACKAGES: dict[str, tuple[str, ...]] = {
    "trace": ("tokenfield.models",),
    "runs": ("tokenfield.prompts",),
    "analysis": ("tokenfield.analysis",),
    "particles": ("tokenfield.particles",),
    "meanfield": ("tokenfield.meanfield",),
    "steering": ("tokenfield.steering",),
    "report": (
        "tokenfield.report",
        "tokenfield.viz",
        "tokenfield.plot",
        "tokenfield.pipelines.report",
    ),
}


@dataclass(frozen=True)
class Entry:
    """One documented name: ``title`` as users write it, ``path`` where it is defined."""

    floor: str
    title: str
    path: str


def floor_of(module: str) -> str:
    """The floor of a module (the longest matching prefix); ValueError if none."""
    best, length = None, -1
    for floor, (_title, _blurb, prefixes) in FLOORS.items():
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > length:
                best, length = floor, len(prefix)
    if best is None:
        raise ValueError(
            f"module {module!r} is on no floor of the API reference; "
            "add its package to FLOORS in scripts/docs_api.py"
        )
    return best


def _path_of(obj: object, name: str, fallback: str) -> str:
    module = getattr(obj, "__module__", None)
    if isinstance(module, str) and module.startswith("tokenfield") and hasattr(obj, "__qualname__"):
        return f"{module}.{obj.__qualname__}"
    return f"{fallback}.{name}"


def reference() -> list[Entry]:
    """Every documented name, facade names first, in the order of their ``__all__``."""
    if str(ROOT / "src") not in sys.path:
        sys.path.insert(0, str(ROOT / "src"))
    import tokenfield

    entries: list[Entry] = []
    seen: set[str] = set()
    for name in tokenfield.__all__:
        if name == "__version__":
            continue
        obj = getattr(tokenfield, name)
        path = _path_of(obj, name, tokenfield._EXPORTS[name])
        entries.append(Entry(floor_of(path.rsplit(".", 1)[0]), f"tokenfield.{name}", path))
        seen.add(path)
    for floor, packages in FLOOR_PACKAGES.items():
        for package in packages:
            if importlib.util.find_spec(package) is None:
                continue
            module = importlib.import_module(package)
            for name in getattr(module, "__all__", ()):
                obj = getattr(module, name)
                path = _path_of(obj, name, package)
                if path not in seen:
                    entries.append(Entry(floor, f"{package}.{name}", path))
                    seen.add(path)
    return entries


def page(floor: str, entries: list[Entry]) -> str:
    """The Markdown of one floor's page."""
    title, blurb, _prefixes = FLOORS[floor]
    facade = [e for e in entries if e.floor == floor and e.title.count(".") == 1]
    rest = [e for e in entries if e.floor == floor and e.title.count(".") > 1]
    lines = [f"# {title}", "", blurb, ""]
    for heading, group in (("From `import tokenfield`", facade), ("More of this floor", rest)):
        if not group:
            continue
        lines += [f"## {heading}", ""]
        for entry in group:
            lines += [
                f"::: {entry.path}",
                "    options:",
                f'      heading: "{entry.title}"',
                f'      toc_label: "{entry.title.rsplit(".", 1)[1]}"',
                "",
            ]
    return "\n".join(lines)


def index(entries: list[Entry]) -> str:
    """The reference's front page: every name, with its floor and definition."""
    lines = [
        "# API reference",
        "",
        "Every public name, by floor. The names in the first column are what you",
        "import; the second says where each is defined (the page shows its docstring).",
        "Docstrings follow the Google style (Args, Returns, Example).",
        "",
        "| name | defined in | floor |",
        "|---|---|---|",
    ]
    for entry in entries:
        floor_title = FLOORS[entry.floor][0]
        lines.append(f"| [`{entry.title}`]({entry.floor}.md) | `{entry.path}` | {floor_title} |")
    return "\n".join(lines) + "\n"


def on_config(config):  # mkdocs hook
    # The notebooks run in kernels started by the build: their plotly figures load
    # the site's own copy of plotly.js (tokenfield.plot, TOKENFIELD_PLOTLY_JS), and
    # tqdm's note that ipywidgets is missing stays out of the pages.
    os.environ.setdefault("TOKENFIELD_PLOTLY_JS", "../" + PLOTLY_JS)
    os.environ.setdefault("PYTHONWARNINGS", "ignore:IProgress not found")
    return config


def on_post_build(config):  # mkdocs hook
    import plotly

    source = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    target = Path(config["site_dir"]) / PLOTLY_JS
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target)


def on_files(files, config):  # mkdocs hook
    from mkdocs.structure.files import File

    entries = reference()
    generated = {"api/index.md": index(entries)}
    generated.update({f"api/{floor}.md": page(floor, entries) for floor in FLOORS})
    for uri, content in generated.items():
        files.append(File.generated(config, uri, content=content))
    return files


if __name__ == "__main__":
    for entry in reference():
        print(entry.floor, entry.title, entry.path, sep="\t")

"""The floors of the package: imports only go down, and packages form no cycle.

Every module under ``src/tokenfield`` is parsed (``ast``, function-local imports
included) and each ``tokenfield`` import becomes an arrow between two packages.
An arrow may stay on its floor or go down; it may never go up, and the arrows
between packages may not close a cycle. Inside one package the arrows between its
modules (function-local imports included) may not close a cycle either: an import
hidden in a function is still a dependency, and two modules that need each other
are one concern in two files. The floors are written once, here, and drawn in
``docs/architecture.md``.

Every import is an arrow, those inside a module-level ``__getattr__`` included; the
entries of ``PENDING`` are excused, and each must still exist (a fixed one must be
removed). Only the public facade (``tokenfield/__init__.py``) may define a
module-level ``__getattr__``: a name is imported from the module that defines it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "tokenfield"

# Top to bottom. "tokenfield" is the public facade (tokenfield/__init__.py).
FLOORS: tuple[tuple[str, ...], ...] = (
    ("cli",),
    ("tokenfield",),
    ("pipelines", "plot"),
    ("viz", "report"),
    ("analysis", "meanfield", "steering"),
    ("models", "particles"),
    (
        "runs",
        "prompts",
        "_io",
        "_html",
        "errors",
        "_lock",
        "_progress",
        "_threads",
        "_memory",
        "_version",
        "_device",
        "_dask",
    ),  # fmt: skip
)
LEVEL = {package: len(FLOORS) - i for i, floor in enumerate(FLOORS) for package in floor}

# Known arrows that break the floors, each with the change that removes it.
PENDING: dict[tuple[str, str], str] = {}

# The one module that may define a module-level __getattr__: the lazy public facade.
FACADE = "tokenfield"


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "tokenfield"


def _is_module(name: str) -> bool:
    rel = Path(*name.split("."))
    return (SRC.parent / rel).with_suffix(".py").is_file() or (SRC.parent / rel).is_dir()


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        anchor = module.split(".")
        anchor = anchor if is_package else anchor[:-1]
        anchor = anchor[: len(anchor) - node.level + 1]
        base = ".".join([*anchor, node.module] if node.module else anchor)
    # "from tokenfield import viz" names a module; "from tokenfield.runs import x" does not
    return [
        f"{base}.{alias.name}" if _is_module(f"{base}.{alias.name}") else base
        for alias in node.names
    ]


def imports_of(path: Path, module: str | None = None) -> list[tuple[str, int]]:
    """``(imported tokenfield module, line)`` for every import in the file (the
    module ``module``, by default the one at ``path``), function-local ones and
    those in a module-level ``__getattr__`` included."""
    module = module or module_name(path)
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for target in _targets(node, module, path.name == "__init__.py"):
                if target == "tokenfield" or target.startswith("tokenfield."):
                    found.append((target, node.lineno))
    return found


def arrows(root: Path = SRC) -> list[tuple[str, str, int]]:
    """``(from module, to module, line)`` for every tokenfield import in the package."""
    out = []
    for path in sorted(root.rglob("*.py")):
        source = module_name(path)
        out += [(source, target, line) for target, line in imports_of(path)]
    return out


def _violations(edges: list[tuple[str, str, int]]) -> list[str]:
    bad = []
    for source, target, line in edges:
        a, b = package_of(source), package_of(target)
        if a not in LEVEL or b not in LEVEL:
            bad.append(f"{source}:{line} -> {target}: package not on a floor (add it to FLOORS)")
        elif LEVEL[b] > LEVEL[a] and (source, target) not in PENDING:
            bad.append(f"{source}:{line} -> {target}: up from '{a}' to '{b}'")
    return bad


def _package_cycle(edges: list[tuple[str, str, int]]) -> list[str]:
    """One cycle between packages (as a list of packages), or ``[]``."""
    graph: dict[str, set[str]] = {}
    for source, target, _ in edges:
        a, b = package_of(source), package_of(target)
        if a != b and (source, target) not in PENDING:
            graph.setdefault(a, set()).add(b)
    return _cycle(graph)


def _module_cycle(edges: list[tuple[str, str, int]]) -> list[str]:
    """One cycle between the modules of one package (function-local imports
    included), as a list of modules, or ``[]``."""
    graph: dict[str, set[str]] = {}
    for source, target, _ in edges:
        if source != target and package_of(source) == package_of(target):
            graph.setdefault(source, set()).add(target)
    return _cycle(graph)


def defines_getattr(path: Path) -> bool:
    """Whether the file defines a module-level ``__getattr__`` (a lazy re-export)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return any(
        isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == "__getattr__"
        for node in tree.body
    )


def getattr_modules(root: Path = SRC) -> list[str]:
    """The modules that define a module-level ``__getattr__``."""
    return sorted(module_name(p) for p in root.rglob("*.py") if defines_getattr(p))


def _cycle(graph: dict[str, set[str]]) -> list[str]:
    """One cycle of ``graph`` (``node -> successors``) as a list of nodes, or ``[]``."""
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return []

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return []


def test_every_package_is_on_a_floor():
    packages = {package_of(module_name(p)) for p in SRC.rglob("*.py")}
    assert packages - set(LEVEL) == set(), "put the new package on a floor in FLOORS"


def test_no_import_goes_up_a_floor():
    assert _violations(arrows()) == []


def test_no_cycle_between_packages():
    assert _package_cycle(arrows()) == []


def test_no_cycle_between_modules_of_a_package():
    """E.g. models/trace.py importing models/parallel.py inside a function while
    parallel.py imports trace.py: the two are one concern, or one of them is in
    the wrong place."""
    assert _module_cycle(arrows()) == []


@pytest.mark.parametrize("pending", sorted(PENDING))
def test_pending_exceptions_still_exist(pending):
    """A PENDING arrow that is gone must leave the list (so the floors tighten)."""
    assert pending in {(s, t) for s, t, _ in arrows()}, f"{pending} is fixed: remove it"


def test_the_checker_sees_function_local_imports_and_cycles(tmp_path):
    """The checker itself: a function-local import up a floor (in ``__getattr__``
    too) and a two-package cycle are both found."""
    source = (
        "def f():\n    from tokenfield.cli import main\n\n"
        "def __getattr__(name):\n    from tokenfield.pipelines import analyze\n"
    )
    probe = tmp_path / "probe.py"
    probe.write_text(source)
    found = imports_of(probe, "tokenfield.analysis.probe")
    assert found == [("tokenfield.cli", 2), ("tokenfield.pipelines.analyze", 5)]
    up = [("tokenfield.analysis.x", "tokenfield.cli", 2)]
    assert _violations(up) and "up from 'analysis' to 'cli'" in _violations(up)[0]
    loop = [("tokenfield.analysis.a", "tokenfield.meanfield.b", 1),
            ("tokenfield.meanfield.b", "tokenfield.analysis.a", 1)]  # fmt: skip
    assert _package_cycle(loop) in (
        ["analysis", "meanfield", "analysis"],
        ["meanfield", "analysis", "meanfield"],
    )
    # a cycle inside one package through a function-local import (the old
    # models/trace.py <-> models/parallel.py), and none across packages
    inside = [("tokenfield.models.trace", "tokenfield.models.parallel", 640),
              ("tokenfield.models.parallel", "tokenfield.models.trace", 262),
              ("tokenfield.models.trace", "tokenfield.runs", 58)]  # fmt: skip
    assert _module_cycle(inside) in (
        ["tokenfield.models.parallel", "tokenfield.models.trace", "tokenfield.models.parallel"],
        ["tokenfield.models.trace", "tokenfield.models.parallel", "tokenfield.models.trace"],
    )
    assert _package_cycle(inside) == [] and _module_cycle(loop) == []


def test_the_checker_sees_getattr_reexports(tmp_path):
    """A module-level __getattr__ is found; one inside a class or function is not."""
    shim = tmp_path / "shim.py"
    shim.write_text("def __getattr__(name):\n    from tokenfield.pipelines import analyze\n")
    plain = tmp_path / "plain.py"
    plain.write_text("class A:\n    def __getattr__(self, name):\n        return 1\n")
    assert defines_getattr(shim) and not defines_getattr(plain)


def test_only_the_facade_defines_a_module_getattr():
    """No re-export shims: "go to definition" lands where the name is defined."""
    assert getattr_modules() == [FACADE]


# Old import paths of functions that moved up to pipelines/, viz/ or models/: gone (the
# shims were deleted), each name imported from its one home.
GONE = {
    "tokenfield.analysis:analyze_run": "tokenfield.pipelines.analyze:analyze_run",
    "tokenfield.analysis.run_analysis:analyze_run": "tokenfield.pipelines.analyze:analyze_run",
    "tokenfield.analysis.theory:theory_lens": "tokenfield.pipelines.theory:theory_lens",
    "tokenfield.analysis.flow:attention_flow": "tokenfield.pipelines.flow:attention_flow",
    "tokenfield.analysis.flow:mlps_removed": "tokenfield.models.surgery:mlps_removed",
    "tokenfield.analysis.flow:plot_flow": "tokenfield.viz.flow:plot_flow",
    "tokenfield.meanfield.conformance:run_suite": "tokenfield.pipelines.conformance:run_suite",
    "tokenfield.meanfield.conformance:ITEMS": "tokenfield.pipelines.conformance:ITEMS",
    "tokenfield.steering.closed_loop:closed_loop": "tokenfield.pipelines.steer:closed_loop",
}


def _resolve(spec: str):
    import importlib

    module, name = spec.split(":")
    return getattr(importlib.import_module(module), name)


@pytest.mark.parametrize("old", sorted(GONE))
def test_old_import_paths_are_gone_and_the_name_has_one_home(old):
    with pytest.raises(AttributeError):
        _resolve(old)
    home = _resolve(GONE[old])
    if callable(home):  # defined there, not re-exported
        assert f"{home.__module__}:{home.__name__}" == GONE[old]


@pytest.mark.parametrize("name", ["analyze_run", "theory_lens"])
def test_the_facade_still_resolves_to_the_home(name):
    import tokenfield

    home = _resolve(f"tokenfield:{name}")
    assert home.__module__.startswith("tokenfield.pipelines.")
    assert home is getattr(tokenfield, name)

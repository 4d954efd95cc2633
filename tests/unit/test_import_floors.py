"""The floors of the package: imports only go down, and packages form no cycle.

Every module under ``src/tokenfield`` is parsed (``ast``, function-local imports
included) and each ``tokenfield`` import becomes an arrow between two packages.
An arrow may stay on its floor or go down; it may never go up, and the arrows
between packages may not close a cycle. The floors are written once, here, and
drawn in ``docs/architecture.md``.

Two things are not arrows: a module-level ``__getattr__`` (the lazy alias that keeps
an old import path working after a function moved up to ``pipelines``), and the
entries of ``PENDING``, each of which must still exist (a fixed one must be removed).
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
        "_version",
        "_device",
        "_dask",
    ),  # fmt: skip
)
LEVEL = {package: len(FLOORS) - i for i, floor in enumerate(FLOORS) for package in floor}

# Known arrows that break the floors, each with the change that removes it.
PENDING: dict[tuple[str, str], str] = {}


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
    module ``module``, by default the one at ``path``), function-local ones
    included, aliases in a module-level ``__getattr__`` not."""
    module = module or module_name(path)
    tree = ast.parse(path.read_text(encoding="utf-8"))
    aliases = {
        id(inner)
        for node in tree.body
        if isinstance(node, ast.FunctionDef) and node.name == "__getattr__"
        for inner in ast.walk(node)
    }
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in aliases:
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


@pytest.mark.parametrize("pending", sorted(PENDING))
def test_pending_exceptions_still_exist(pending):
    """A PENDING arrow that is gone must leave the list (so the floors tighten)."""
    assert pending in {(s, t) for s, t, _ in arrows()}, f"{pending} is fixed: remove it"


def test_the_checker_sees_function_local_imports_and_cycles(tmp_path):
    """The checker itself: a function-local import up a floor and a two-package
    cycle are both found; an alias in ``__getattr__`` is not an arrow."""
    source = (
        "def f():\n    from tokenfield.cli import main\n\n"
        "def __getattr__(name):\n    from tokenfield.pipelines import analyze\n"
    )
    probe = tmp_path / "probe.py"
    probe.write_text(source)
    found = imports_of(probe, "tokenfield.analysis.probe")
    assert found == [("tokenfield.cli", 2)]
    up = [("tokenfield.analysis.x", "tokenfield.cli", 2)]
    assert _violations(up) and "up from 'analysis' to 'cli'" in _violations(up)[0]
    loop = [("tokenfield.analysis.a", "tokenfield.meanfield.b", 1),
            ("tokenfield.meanfield.b", "tokenfield.analysis.a", 1)]  # fmt: skip
    assert _package_cycle(loop) in (
        ["analysis", "meanfield", "analysis"],
        ["meanfield", "analysis", "meanfield"],
    )


# Old import paths of functions that moved up to pipelines/ or viz/, and where they live now.
MOVED = {
    "tokenfield.analysis:analyze_run": "tokenfield.pipelines.analyze:analyze_run",
    "tokenfield.analysis.run_analysis:analyze_run": "tokenfield.pipelines.analyze:analyze_run",
    "tokenfield.analysis.theory:theory_lens": "tokenfield.pipelines.theory:theory_lens",
    "tokenfield.analysis.theory:write_theory": "tokenfield.pipelines.theory:write_theory",
    "tokenfield.analysis.theory:model_of_run": "tokenfield.pipelines.theory:model_of_run",
    "tokenfield.analysis.flow:attention_flow": "tokenfield.pipelines.flow:attention_flow",
    "tokenfield.analysis.flow:flow_states": "tokenfield.pipelines.flow:flow_states",
    "tokenfield.analysis.flow:plot_flow": "tokenfield.viz.flow:plot_flow",
    "tokenfield.meanfield.conformance:run_suite": "tokenfield.pipelines.conformance:run_suite",
    "tokenfield.meanfield.conformance:ITEMS": "tokenfield.pipelines.conformance:ITEMS",
    "tokenfield.meanfield.conformance:equiangular_item": (
        "tokenfield.pipelines.conformance:equiangular_item"
    ),
    "tokenfield.steering.closed_loop:closed_loop": "tokenfield.pipelines.steer:closed_loop",
    "tokenfield:analyze_run": "tokenfield.pipelines.analyze:analyze_run",
    "tokenfield:theory_lens": "tokenfield.pipelines.theory:theory_lens",
}


@pytest.mark.parametrize("old", sorted(MOVED))
def test_old_import_paths_still_work(old):
    import importlib

    def resolve(spec: str):
        module, name = spec.split(":")
        return getattr(importlib.import_module(module), name)

    assert resolve(old) is resolve(MOVED[old])

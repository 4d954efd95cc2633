"""Every name in ``tokenfield.__all__`` has a Google-style docstring with its sections.

The same holds for the floors' own public names that the API reference lists
(scripts/docs_api.py). A function or class that takes parameters documents each of them under ``Args:``
(a dataclass may use ``Attributes:``); a function that returns something has
``Returns:`` (or ``Yields:``); every name has an ``Example:`` (run by
tests/unit/test_docstring_examples.py unless marked ``# doctest: +SKIP``).
"""

from __future__ import annotations

import importlib
import inspect
import re
import sys
from pathlib import Path
from typing import Any

import pytest

import tokenfield as tf

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import docs_api  # noqa: E402

SECTION = re.compile(r"^(\w+(?: \w+)?):\s*$", re.MULTILINE)
KNOWN = {"Args", "Attributes", "Returns", "Yields", "Raises", "Example", "Examples", "Note"}


def sections(doc: str) -> dict[str, str]:
    """The docstring's Google-style sections, name -> body (unknown headers stay in the body)."""
    found: dict[str, str] = {}
    marks = [m for m in SECTION.finditer(doc) if m.group(1) in KNOWN]
    ends = [mark.start() for mark in marks[1:]] + [len(doc)] * bool(marks)
    for mark, end in zip(marks, ends, strict=True):
        found[mark.group(1)] = doc[mark.end() : end]
    return found


def _parameters(obj: Any) -> list[str]:
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):
        return []
    return [name for name in signature.parameters if name not in ("self", "cls")]


def _returns_something(obj: Any) -> bool:
    annotation = inspect.signature(obj).return_annotation
    return annotation not in (None, "None", inspect.Signature.empty)


def missing(obj: Any) -> list[str]:
    """What the docstring of ``obj`` lacks (empty when it is complete)."""
    doc = inspect.getdoc(obj) or ""
    found = sections(doc)
    problems = []
    if "Example" not in found and "Examples" not in found:
        problems.append("Example")
    params = _parameters(obj)
    if params:
        documented = found.get("Args", "") + found.get("Attributes", "")
        if not documented:
            problems.append("Args")
        for name in params:
            typed = r"(?:\s*\([^)\n]*\))?"  # "name (type):" also documents it
            entry = rf"^\s*(?:[\w*]+,\s*)*\**{re.escape(name)}{typed}(?:,\s*[\w*]+)*:"
            if not re.search(entry, documented, re.MULTILINE):
                problems.append(f"Args: {name}")
    returns = "Returns" in found or "Yields" in found
    if not inspect.isclass(obj) and _returns_something(obj) and not returns:
        problems.append("Returns")
    return problems


NAMES = [name for name in tf.__all__ if name != "__version__"]


@pytest.mark.parametrize("name", NAMES)
def test_public_docstring_has_its_sections(name: str) -> None:
    assert missing(getattr(tf, name)) == [], f"tokenfield.{name}'s docstring lacks these"


def _floor_names() -> list[tuple[str, Any]]:
    facade = {f"tokenfield.{name}" for name in tf.__all__}
    found = []
    for entry in docs_api.reference():
        module, _, attr = entry.path.rpartition(".")
        obj = getattr(importlib.import_module(module), attr)
        if entry.title not in facade and callable(obj):  # constants have no docstring of their own
            found.append((entry.title, obj))
    return found


FLOOR = _floor_names()


@pytest.mark.parametrize("obj", [obj for _, obj in FLOOR], ids=[title for title, _ in FLOOR])
def test_floor_docstring_has_its_sections(obj: Any) -> None:
    assert missing(obj) == []


def _complete(x: int, *, scale: float = 1.0) -> float:
    """Scale ``x``.

    Args:
        x: the value.
        scale: the factor.

    Returns:
        ``x * scale``.

    Example:
        >>> _complete(2, scale=0.5)
        1.0
    """
    return x * scale


def _no_returns(x: int, scale: float = 1.0) -> float:
    """Scale ``x``.

    Args:
        x: the value.

    Example:
        >>> _no_returns(2)
        2.0
    """
    return x * scale


def test_the_check_names_what_a_docstring_lacks() -> None:
    assert missing(_complete) == []
    assert missing(_no_returns) == ["Args: scale", "Returns"]
    assert missing(lambda: None) == ["Example"]

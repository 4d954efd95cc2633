"""The docstring examples of the public names run and print what they say.

Every ``>>>`` example in the docstring of a name in ``tokenfield.__all__`` (and of
``tokenfield.plot``, and of the floors' own public names that the API reference
lists: scripts/docs_api.py) runs here with ``tf`` (tokenfield), ``np`` and
``torch`` in scope; examples that need a model or a run on disk carry
``# doctest: +SKIP``.
"""

from __future__ import annotations

import doctest
import importlib
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import tokenfield as tf

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import docs_api  # noqa: E402


def _objects() -> list[tuple[str, object]]:
    found = [(name, getattr(tf, name)) for name in tf.__all__ if name != "__version__"]
    facade = {f"tokenfield.{name}" for name in tf.__all__}
    for entry in docs_api.reference():
        if entry.title not in facade:
            module, _, attr = entry.path.rpartition(".")
            found.append(
                (
                    entry.title.removeprefix("tokenfield."),
                    getattr(importlib.import_module(module), attr),
                )
            )
    return [*found, ("plot", tf.plot)]


def _tests() -> list[doctest.DocTest]:
    finder = doctest.DocTestFinder(recurse=False)
    globs = {"tf": tf, "np": np, "torch": torch}
    tests = []
    for name, obj in _objects():
        for test in finder.find(obj, name=f"tokenfield.{name}", globs=dict(globs)):
            if test.examples:
                tests.append(test)
    return tests


TESTS = _tests()


def test_the_public_names_have_examples() -> None:
    names = {test.name for test in TESTS}
    for name in ("simulate", "analyze", "initial_condition", "load_prompts", "load_model"):
        assert f"tokenfield.{name}" in names


@pytest.mark.parametrize("test", TESTS, ids=[t.name for t in TESTS])
def test_docstring_example(test: doctest.DocTest) -> None:
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    runner.run(test, out=lambda text: pytest.fail(text, pytrace=False))
    assert runner.failures == 0

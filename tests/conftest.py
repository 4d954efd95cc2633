"""Settings and fixtures shared by every tier (unit, e2e, integration, slow)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import NamedTuple

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    """Run torch on one thread (restored after each module): the systems and models
    in the tests are tiny, and on a busy 2-core machine two threads made them
    several times slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class CliResult(NamedTuple):
    """One in-process ``tokenfield`` run: exit status, stdout, stderr."""

    code: int
    out: str
    err: str


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Callable[..., CliResult]:
    """``cli(["analyze", run, ...])`` runs the command in process (arguments are
    turned into strings) and returns its :class:`CliResult`."""
    from tokenfield.cli import main

    def run(args: list) -> CliResult:
        capsys.readouterr()  # what came before is not this command's output
        try:
            main([str(a) for a in args])
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        captured = capsys.readouterr()
        return CliResult(code, captured.out, captured.err)

    return run


# The longest test files, longest first. ``make test`` runs the suite on two workers
# (pytest-xdist, one file per worker at a time); a long file that starts last keeps
# one worker busy alone at the end, so these are collected first.
LONGEST_FIRST = (
    "tests/slow/test_readme_example.py",
    "tests/slow/test_tutorials.py",
    "tests/slow/test_seed_findings.py",
    "tests/slow/test_wheel.py",
    "tests/slow/test_cache_integrity.py",
    "tests/e2e/test_docs_build.py",
    "tests/slow/test_conformance.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}

    def key(item: pytest.Item) -> int:
        path = item.path.relative_to(config.rootpath).as_posix()
        return rank.get(path, len(rank))

    items.sort(key=key)  # stable: the rest keep their order

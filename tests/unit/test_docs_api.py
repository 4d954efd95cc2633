"""The API reference's floors (scripts/docs_api.py): every public name has one."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import docs_api  # noqa: E402


def test_every_facade_name_is_on_a_floor_by_its_defining_module() -> None:
    import tokenfield

    entries = {entry.title: entry for entry in docs_api.reference()}
    for name in tokenfield.__all__:
        if name == "__version__":
            continue
        entry = entries[f"tokenfield.{name}"]
        module = getattr(tokenfield, name).__module__
        assert entry.path.startswith(module + "."), (name, entry.path)
        assert entry.floor == docs_api.floor_of(module)
    # floor packages' own public names are there too, once each
    assert entries["tokenfield.steering.steering_vector"].floor == "steering"
    assert entries["tokenfield.plot.paths"].floor == "report"
    paths = [entry.path for entry in entries.values()]
    assert len(paths) == len(set(paths))


def test_a_module_on_no_floor_stops_the_build_with_its_name() -> None:
    assert docs_api.floor_of("tokenfield.pipelines.steer") == "steering"
    assert docs_api.floor_of("tokenfield.models.trace") == "trace"
    assert docs_api.floor_of("tokenfield.pipelines.trace") == "trace"
    with pytest.raises(ValueError, match="'tokenfield.pipelines.unplaced' is on no floor"):
        docs_api.floor_of("tokenfield.pipelines.unplaced")

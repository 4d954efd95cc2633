"""The ground floor's one atomic writer and one JSON converter (tokenfield._io)."""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenfield._io import to_jsonable, write_atomic, write_json_atomic


def test_write_atomic_text_and_bytes(tmp_path):
    assert write_atomic(tmp_path / "a.txt", "héllo").read_text(encoding="utf-8") == "héllo"
    assert write_atomic(tmp_path / "b.bin", b"\x00\x01").read_bytes() == b"\x00\x01"
    write_json_atomic(tmp_path / "c.json", {"x": np.float32(1.5), "p": Path("a/b")})
    assert (tmp_path / "c.json").read_text() == '{\n  "x": 1.5,\n  "p": "a/b"\n}\n'


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path, monkeypatch):
    target = write_atomic(tmp_path / "page.html", "old")

    def broken(*_a, **_k):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken)
    with pytest.raises(OSError, match="disk full"):
        write_atomic(target, "new")
    monkeypatch.undo()
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["page.html"]


@dataclasses.dataclass
class _Point:
    x: float
    tags: tuple[str, ...]


def test_to_jsonable_converts_numpy_nan_xarray_dataclasses():
    data = {
        1: np.array([1.0, np.nan, np.inf]),
        "scalar": np.float64(-np.inf),
        "int": np.int64(3),
        "flag": np.bool_(True),
        "tuple": (np.float32(0.5), None),
        "da": xr.DataArray(np.array([2, 3])),
        "point": _Point(math.nan, ("a",)),
    }
    assert to_jsonable(data) == {
        "1": [1.0, None, None],
        "scalar": None,
        "int": 3,
        "flag": True,
        "tuple": [0.5, None],
        "da": [2, 3],
        "point": {"x": None, "tags": ["a"]},
    }
    assert to_jsonable(object, default=str) == str(object)


finite_or_not = st.floats(allow_nan=True, allow_infinity=True, width=64)
nested = st.recursive(
    st.none() | st.booleans() | st.integers() | finite_or_not | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text(max_size=4), inner, max_size=4)
        | st.lists(finite_or_not, max_size=4).map(np.array)
    ),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(nested)
def test_to_jsonable_output_is_strict_json_and_keeps_finite_numbers(value):
    out = to_jsonable(value)
    text = json.dumps(out, allow_nan=False)  # raises on NaN/inf: there must be none left
    assert json.loads(text) == out


def test_an_output_directory_that_cannot_be_made_is_one_line(tmp_path):
    from tokenfield._lock import acquire
    from tokenfield.errors import UserError

    (tmp_path / "file").write_text("x")
    with pytest.raises(UserError) as caught:
        acquire(tmp_path / "file" / "sub")
    assert str(caught.value) == (
        f"cannot create output directory '{tmp_path / 'file' / 'sub'}' (Not a directory); "
        "choose another --out."
    )

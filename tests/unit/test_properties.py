"""Property tests (hypothesis): the run format's round trip and the problem
generator's disjoint splits, over many generated cases rather than a few chosen ones."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
import xarray as xr
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from tokenfield.errors import UserError
from tokenfield.runs import RunWriter, open_run, read_run_info, strings
from tokenfield.steering.problems import TEMPLATES, make_splits

json_scalars = st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.text(max_size=8)
configs = st.dictionaries(
    st.text(min_size=1, max_size=6),
    json_scalars | st.lists(json_scalars, max_size=3),
    max_size=4,
)


@st.composite
def traces(draw):
    """A small trace: states ``(time, particle, feature)`` with any float32 values
    (NaN and inf included), one prompt string per particle, cut into pieces."""
    time, n, d = draw(st.integers(1, 3)), draw(st.integers(1, 6)), draw(st.integers(1, 3))
    states = draw(arrays(np.float32, (time, n, d)))
    prompts = draw(st.lists(st.text(max_size=6), min_size=n, max_size=n))
    cuts = sorted(draw(st.sets(st.integers(1, n - 1), max_size=2))) if n > 1 else []
    return states, prompts, [0, *cuts, n]


@settings(max_examples=25, deadline=None)
@given(traces(), configs)
def test_a_run_reads_back_what_was_written(trace, config):
    states, prompts, bounds = trace
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "run"
        writer = RunWriter(path, "trace", config, append_dim="particle")
        for i, (a, b) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
            piece = xr.Dataset(
                {"states": (("time", "particle", "feature"), states[:, a:b])},
                coords={
                    "time": np.arange(states.shape[0]),
                    "particle": np.arange(a, b),
                    "prompt": ("particle", strings(prompts[a:b])),
                },
            )
            writer.append(piece, done=i + 1)
        writer.finish()
        ds = open_run(path)
        np.testing.assert_array_equal(ds["states"].values, states)  # NaN == NaN here
        assert [str(p) for p in ds["prompt"].values] == prompts
        assert read_run_info(path).config == json.loads(json.dumps(config, sort_keys=True))
        assert read_run_info(path).complete


sizes = st.fixed_dictionaries(
    {name: st.integers(0, 12) for name in ("shot", "fit", "validation", "test")}
)


@settings(max_examples=60, deadline=None)
@given(
    sizes,
    st.integers(0, 2**31),
    st.integers(2, 12),
    st.lists(st.sampled_from(list(TEMPLATES)), min_size=1, max_size=4, unique=True),
)
def test_splits_are_disjoint_or_refused(sizes, seed, max_operand, templates):
    try:
        splits = make_splits(sizes, seed, max_operand=max_operand, templates=templates)
    except UserError as exc:
        assert "distinct math forms" in str(exc)  # only ever for want of room
        return
    assert {k: len(v) for k, v in splits.items()} == sizes
    forms = [p.expression for items in splits.values() for p in items]
    assert len(set(forms)) == len(forms)  # no math form twice, within or across splits
    for problem in (p for items in splits.values() for p in items):
        assert problem.template in templates
        assert eval(problem.expression, {"__builtins__": {}}) == problem.answer  # noqa: S307

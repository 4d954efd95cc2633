"""TraceConfig: every trace option checked once, the prompts loaded once, and the run
config it records (what a resume compares, so it must not change shape). No model."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from tokenfield.errors import ParameterError, UserError
from tokenfield.models.trace_config import TraceConfig
from tokenfield.prompts import Prompt


@pytest.mark.parametrize(
    ("options", "param", "said"),
    [
        ({"positions": "first"}, "positions", "unknown positions 'first'"),
        ({"batch_size": 0}, "batch_size", "batch_size must be at least 1, got 0"),
        ({"generate": -1}, "generate", "generate must be 0 or more, got -1"),
        ({"logit_lens": True, "lens_k": 0}, "lens_k", "lens_k must be at least 1, got 0"),
        ({"store_dtype": "int8"}, "store_dtype", "unknown store_dtype 'int8'"),
        ({"workers": 0}, "workers", "workers must be at least 1, got 0"),
        ({"steer": (None, 1.0, "middle")}, "steer_positions", "unknown steer_positions"),
        ({"generate": 2, "steer": (None, 1.0, "last")}, "steer_positions", "steer all"),
        ({"generate": 2, "workers": 2}, "generate", "cannot be laid out for workers"),
    ],
)
def test_each_bad_option_names_its_parameter(options, param, said):
    with pytest.raises(ParameterError) as caught:
        TraceConfig(["a"], **options)
    assert caught.value.param == param and said in str(caught.value)


def test_workers_and_scheduler_are_one_or_the_other():
    with pytest.raises(UserError, match="pass one of them"):
        TraceConfig(["a"], workers=2, scheduler="tcp://127.0.0.1:8786")
    assert TraceConfig(["a"], workers=2).parallel and not TraceConfig(["a"]).parallel
    assert TraceConfig(["a"], lens_k=0).lens_k == 0  # lens_k matters only with the lens


def test_prompts_are_loaded_once():
    config = TraceConfig(["the first", Prompt("the second", "b")])
    assert config.prompts == (Prompt("the first"), Prompt("the second", "b"))
    again = config.replace(batch_size=2)
    assert again.prompts is config.prompts  # a copy does not load them again
    with pytest.raises(UserError):
        TraceConfig([])


def _model(causal: bool = True, attn: str = "sdpa", family: str = "llama") -> SimpleNamespace:
    return SimpleNamespace(
        causal=causal,
        run_config=lambda: {"name": "m"},
        name="m",
        max_positions=64,
        extra={},
        family=SimpleNamespace(name=family),
        model=SimpleNamespace(config=SimpleNamespace(_attn_implementation=attn)),
    )


def test_the_run_config_has_the_optional_keys_only_when_on():
    plain = TraceConfig(["a"], batch_size=3, workers=2).run_config(_model())
    assert plain == {
        "model": {"name": "m"},
        "positions": "last",
        "chat": False,
        "truncate": False,
        "top_k": 5,
        "prompts": [{"text": "a", "category": "", "label": ""}],
    }  # neither the batch size nor the workers: they do not change the content
    assert TraceConfig(["a"]).run_config(_model(causal=False))["top_k"] == 0
    vector = SimpleNamespace(layer=2, vector=np.ones(4, np.float32), provenance={"run": "r"})
    full = TraceConfig(
        ["a"],
        positions="all",
        attention=True,
        logit_lens=True,
        lens_k=3,
        generate=4,
        steer=(vector, 2, "all"),
        store_dtype="float16",
    ).run_config(_model())
    assert full["attention"]["attn_implementation"] == "sdpa"
    assert full["logit_lens"] == {"k": 3}
    assert full["generate"] == {"max_new_tokens": 4, "decoding": "greedy"}
    assert full["steering"]["layer"] == 2 and full["steering"]["alpha"] == 2.0
    assert full["steering"]["positions"] == "all" and len(full["steering"]["vector_sha256"]) == 64
    assert full["store_dtype"] == "float16"


def test_the_attention_readout_path_rule_and_its_record():
    """Queries and keys where the family is known and the model runs SDPA; eager
    otherwise or when asked; ``sdpa`` asked of a model without it is one error."""
    on = TraceConfig(["a"], attention=True)
    assert on.run_config(_model())["attention"]["attn_implementation"] == "sdpa"
    assert on.run_config(_model())["attention"]["readout"] == "queries and keys"
    eager = on.run_config(_model(attn="eager"))["attention"]
    assert eager == {
        "attn_implementation": "eager",
        "chain": "symmetrised (A + A^T), sink kept and sink dropped",
    }  # exactly what runs traced before this path recorded: they still resume
    assert on.run_config(_model(family="t5"))["attention"]["attn_implementation"] == "eager"
    assert (
        on.run_config(_model(attn="flash_attention_2"))["attention"]["attn_implementation"]
        == "eager"
    )
    asked = TraceConfig(["a"], attention=True, attention_readout="eager")
    assert asked.run_config(_model())["attention"]["attn_implementation"] == "eager"
    forced = TraceConfig(["a"], attention=True, attention_readout="sdpa")
    with pytest.raises(ParameterError, match="attention_readout sdpa needs"):
        forced.check_model(_model(attn="eager"))
    with pytest.raises(ParameterError, match="unknown attention_readout 'fast'"):
        TraceConfig(["a"], attention=True, attention_readout="fast")

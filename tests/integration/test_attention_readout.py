"""The attention read-out from queries and keys (SDPA left running) against the eager path.

Tiny random-weight models: llama (grouped-query attention, rotary), gpt2 (learned
positions, no rotary), gemma3 (q/k norms, rotary, sliding window 4 on layers 0 and 2,
global layer 1, prompts up to 14 tokens so the window binds), and the other families
of the fast path. Batches of 4 (left padding: the model's mask reaches the read-out)
and of 1 (no padding: SDPA's own causal rule, no mask).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import tokenfield as tf
from tests.integration.tiny import KINDS, PROMPTS, WORDS, tiny_config, tiny_tokenizer
from tokenfield.errors import ParameterError, UserError
from tokenfield.models.load import wrap_model
from tokenfield.models.trace import trace_in_memory
from tokenfield.models.trace_config import TraceConfig

EQUAL_TOL = 1e-5  # the two paths' statistics (stored as float32)
LONG = [" ".join(WORDS[(7 * i + j) % len(WORDS)] for j in range(9 + i)) for i in range(6)]
TEXTS = PROMPTS + LONG  # 1 to 14 tokens


def _loaded(kind: str, *, attn_implementation: str | None = None):
    import transformers as tr

    torch.manual_seed(0)
    config = tiny_config(kind)
    if kind == "gemma3":  # sliding, global, sliding: both kinds of layer, window 4 < prompts
        config.layer_types = ["sliding_attention", "full_attention", "sliding_attention"]
    if attn_implementation:
        config._attn_implementation = attn_implementation
    auto = tr.AutoModel if kind == "bert" else tr.AutoModelForCausalLM
    model = auto.from_config(config, dtype=torch.float32).eval()
    return wrap_model(model, tiny_tokenizer(), name=f"tiny-{kind}")


def _traced(model, readout: str, batch_size: int, positions: str = "all"):
    config = TraceConfig(
        TEXTS,
        positions=positions,
        batch_size=batch_size,
        attention=True,
        attention_readout=readout,
    )
    return trace_in_memory(model, config)


def _worst_difference(new, old) -> float:
    worst = 0.0
    names = [name for name in old.data_vars if name.startswith("attn_")]
    assert len(names) == 7
    for name in names:
        a, b = new[name].values, old[name].values
        assert a.shape == b.shape, name
        assert np.array_equal(np.isnan(a), np.isnan(b)), name
        worst = max(worst, float(np.nanmax(np.abs(a - b))))
    return worst


# batches of 4 (padding: the model's mask) for every family; of 1 (no mask) for three
CASES = [(kind, 4) for kind in KINDS] + [(kind, 1) for kind in ("llama", "gpt2", "gemma3")]


@pytest.mark.parametrize(("kind", "batch_size"), CASES)
def test_queries_keys_readout_equals_the_eager_path(kind, batch_size):
    model = _loaded(kind)
    new = _traced(model, "auto", batch_size)
    old = _traced(model, "eager", batch_size)
    assert json.loads(new.attrs["tokenfield_config"])["attention"]["attn_implementation"] == "sdpa"
    assert json.loads(old.attrs["tokenfield_config"])["attention"]["attn_implementation"] == "eager"
    assert model.model.config._attn_implementation == "sdpa"  # restored after each trace
    assert _worst_difference(new, old) <= EQUAL_TOL


def test_sliding_window_binds_in_the_tiny_gemma3():
    """The gemma3 comparison means something: its sliding layers' attention is not the
    causal one (the statistics of block 0 change when the window is lifted)."""
    model = _loaded("gemma3")
    windowed = _traced(model, "auto", 1)
    model.model.config.sliding_window = 64
    for layer in model.sites.blocks:
        if layer.self_attn.sliding_window is not None:
            layer.self_attn.sliding_window = 64
    lifted = _traced(model, "auto", 1)
    long = windowed.prompt_index.values >= len(PROMPTS)
    a = windowed.attn_stationary.values[long, 0]
    b = lifted.attn_stationary.values[long, 0]
    assert np.nanmax(np.abs(a - b)) > 1e-3
    short = windowed.prompt_index.values == PROMPTS.index("1 + 2 =")  # 4 tokens: inside
    np.testing.assert_array_equal(
        windowed.attn_stationary.values[short, 0], lifted.attn_stationary.values[short, 0]
    )


@pytest.mark.parametrize("kind", ["llama", "gemma3"])
def test_lanczos_branch_equals_the_eager_path(kind, monkeypatch):
    """Prompts longer than the batched limit (lowered here to 6): both paths reduce them
    one at a time (reduce_long_row), ``|lambda_2|`` by Lanczos."""
    import tokenfield.models.attention as attention

    monkeypatch.setattr(attention, "BATCHED_LIMIT_CPU", 6)
    model = _loaded(kind)
    assert _worst_difference(_traced(model, "auto", 4), _traced(model, "eager", 4)) <= EQUAL_TOL


@pytest.mark.parametrize(
    ("kind", "defer_elements", "dense_limit"),
    [("llama", 1 << 26, None), ("gpt2", 1 << 26, None), ("gemma3", 200, None), ("llama", 1, 6)],
)
def test_deferred_reduction_equals_the_eager_path(kind, defer_elements, dense_limit, monkeypatch):
    """The GPU's schedule on the CPU: the short prompts' weights of every block wait
    and are reduced together (DEFER_ON), all at once, in several rounds (a small
    DEFER_ELEMENTS: a round whenever the waiting weights would exceed it), or beside
    long prompts reduced at once (the batched limit lowered to 6). Same statistics as the
    eager path, and as the read-out reducing each block at once."""
    import tokenfield.models.attention as attention
    import tokenfield.models.attention_readout as readout

    if dense_limit is not None:
        monkeypatch.setattr(attention, "BATCHED_LIMIT_CPU", dense_limit)
    model = _loaded(kind)
    at_once = _traced(model, "auto", 4)
    settled = []
    settle = attention.AttentionCapture.settle

    def counted(self):
        settled.append(len(self.deferred))
        settle(self)

    monkeypatch.setattr(attention.AttentionCapture, "settle", counted)
    monkeypatch.setattr(readout, "DEFER_ON", ("cpu", "cuda"))
    monkeypatch.setattr(attention, "DEFER_ELEMENTS", defer_elements)
    deferred = _traced(model, "auto", 4)
    rounds = sum(1 for waiting in settled if waiting)
    batches = -(-len(TEXTS) // 4)
    if defer_elements == 1 << 26:
        assert max(settled) >= 2 and rounds == batches  # the blocks waited: one round a batch
    else:
        assert rounds > batches  # rounds within a batch
    assert _worst_difference(deferred, _traced(model, "eager", 4)) <= EQUAL_TOL
    assert _worst_difference(deferred, at_once) <= 1e-12


def test_forward_unchanged_by_the_readout():
    """The read-out leaves SDPA computing: states and predictions equal a plain trace
    bit for bit (the eager path changes the kernel, so it does not)."""
    model = _loaded("llama")
    plain = trace_in_memory(model, TraceConfig(TEXTS, positions="all", batch_size=4))
    read = _traced(model, "auto", 4)
    assert np.array_equal(plain.states.values, read.states.values)
    assert np.array_equal(plain.next_token_prob.values, read.next_token_prob.values, equal_nan=True)


def test_path_rule_and_record(tmp_path):
    eager_model = _loaded("llama", attn_implementation="eager")
    ds = tf.trace(eager_model, TEXTS[:2], attention=True, out=tmp_path / "run")
    assert tf.read_run_info(tmp_path / "run").config["attention"]["attn_implementation"] == (
        "eager"
    )
    assert "attn_lambda2" in ds
    with pytest.raises(ParameterError, match="attention_readout"):
        trace_in_memory(
            eager_model,
            TraceConfig(TEXTS[:2], attention=True, attention_readout="sdpa"),
        )
    with pytest.raises(UserError, match="attention_readout"):
        TraceConfig(TEXTS[:2], attention=True, attention_readout="flash")


@pytest.mark.parametrize("kind", ["llama", "gpt2", "gemma3"])
def test_bfloat16_block0_equals_the_eager_path(kind):
    """In bfloat16 eager attention rounds its weights to the model's dtype, and so does
    the read-out: block 0 (both paths read the same queries and keys there) agrees to
    float32 storage precision. Later blocks read states that SDPA and eager attention
    round differently in bfloat16 (about 1e-3 apart), so they are not compared here."""
    model = _loaded(kind)
    model.model.to(torch.bfloat16)
    new, old = _traced(model, "auto", 4), _traced(model, "eager", 4)
    for name in (name for name in old.data_vars if name.startswith("attn_")):
        np.testing.assert_allclose(
            new[name].values[:, 0], old[name].values[:, 0], atol=1e-6, err_msg=name
        )

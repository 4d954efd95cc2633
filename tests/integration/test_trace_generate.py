"""``trace(..., generate=N)``: greedy continuations kept as particles (tiny models)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import xarray as xr

import tokenfield as tf
from tests.integration.tiny import PROMPTS, tiny_loaded
from tokenfield.errors import UserError

RTOL = 1e-5
N = 4


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


@pytest.fixture(scope="module")
def tiny():
    return tiny_loaded("llama")


def _alone_greedy(loaded, text: str, n: int) -> list[int]:
    ids = torch.tensor([loaded.tokenizer(text)["input_ids"]])
    with torch.inference_mode():
        out = loaded.model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=n,
            do_sample=False,
            pad_token_id=0,
            temperature=None,
            top_p=None,
            top_k=None,
        )
    return out[0, ids.shape[1] :].tolist()


@pytest.mark.parametrize("positions", ["last", "all"])
def test_n_generated_particles_equal_a_plain_forward_over_the_text(tiny, positions):
    ds = tf.trace(tiny, PROMPTS, positions=positions, batch_size=3, generate=N, logit_lens=True)
    counts = []
    for index, text in enumerate(PROMPTS):
        mine = ds.isel(particle=ds.prompt_index.values == index)
        gen = mine.isel(particle=mine.is_generated.values)
        prompt_ids = tiny.tokenizer(text)["input_ids"]
        count = gen.sizes["particle"]
        new_ids = gen.token_id.values.tolist()
        assert new_ids == _alone_greedy(tiny, text, N)  # greedy, as generate() alone
        assert set(mine.n_generated.values.tolist()) == {count}
        eos = tiny.model.generation_config.eos_token_id
        # exactly N, fewer only when the last one is the end-of-sequence token (recorded)
        stopped = bool(mine.generation_eos.values[0])
        assert (count == N and not stopped) or (count < N and stopped and new_ids[-1] == eos)
        counts.append(count)
        assert gen.position.values.tolist() == list(range(len(prompt_ids), len(prompt_ids) + count))
        prompt_part = mine.isel(particle=~mine.is_generated.values)
        assert prompt_part.sizes["particle"] == (1 if positions == "last" else len(prompt_ids))
        assert prompt_part.is_last.values[-1] and not gen.is_last.values.any()
        # the states are those of a plain forward over prompt + generated text
        ids = torch.tensor([prompt_ids + new_ids])
        with torch.no_grad():
            out = tiny.model(ids, output_hidden_states=True)
        kept = mine.position.values
        for time in range(tiny.n_layers):
            hidden = out.hidden_states[time][0].numpy()[kept]
            assert rel_err(mine.states.values[time], hidden) < RTOL
        # the logit lens reads the generated tokens too; its target is the next token
        assert (gen.lens_rank.values >= 1).all()
        assert gen.lens_target.values[:-1].tolist() == gen.token.values[1:].tolist()
        assert prompt_part.next_token_top.values[-1, 0] == gen.token.values[0]
    assert counts.count(N) >= len(PROMPTS) - 1 and min(counts) >= 1


def test_generation_stops_at_end_of_sequence_and_says_so(tiny):
    first = tf.trace(tiny, PROMPTS[:1], generate=N)
    stop = int(first.token_id.values[first.is_generated.values][1])  # the 2nd generated token
    old = tiny.model.generation_config.eos_token_id
    tiny.model.generation_config.eos_token_id = stop
    try:
        ds = tf.trace(tiny, PROMPTS[:1], generate=N)
    finally:
        tiny.model.generation_config.eos_token_id = old
    gen = ds.isel(particle=ds.is_generated.values)
    assert gen.sizes["particle"] == 2 and int(gen.token_id.values[-1]) == stop
    assert set(ds.n_generated.values.tolist()) == {2}
    assert ds.generation_eos.values.all()


def test_generated_trace_resumes_after_a_kill(tmp_path, monkeypatch, tiny):
    whole = tf.trace(tiny, PROMPTS, batch_size=2, generate=N, out=tmp_path / "whole")
    import tokenfield.models.trace as trace_module

    real = trace_module._forward_every
    calls = {"n": 0}

    def killed(model, inputs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return real(model, inputs)

    monkeypatch.setattr(trace_module, "_forward_every", killed)
    run = tmp_path / "resumed"
    with pytest.raises(KeyboardInterrupt):
        tf.trace(tiny, PROMPTS, batch_size=2, generate=N, out=run)
    assert tf.read_run_info(run).status == "partial"
    monkeypatch.setattr(trace_module, "_forward_every", real)
    resumed = tf.trace(tiny, PROMPTS, batch_size=2, generate=N, out=run)
    xr.testing.assert_identical(resumed.drop_attrs(), whole.drop_attrs())
    assert (
        resumed.is_generated.values.sum()
        == resumed.n_generated.values[~resumed.is_generated.values].sum()
        > 0
    )
    # the config records generation; another N is another run
    with pytest.raises(UserError, match="different config"):
        tf.trace(tiny, PROMPTS, batch_size=2, generate=N + 1, out=run)


def test_generate_refused_for_an_encoder():
    encoder = tiny_loaded("bert")
    with pytest.raises(UserError, match="cannot generate"):
        tf.trace(encoder, PROMPTS, generate=2)


def test_a_steered_trace_stores_its_steered_continuations(tiny):
    from tokenfield.steering.hooks import steering
    from tokenfield.steering.vectors import SteeringVector

    rng = np.random.default_rng(0)
    vector = SteeringVector(rng.normal(size=tiny.d_model).astype(np.float32) * 3, layer=2)
    plain = tf.trace(tiny, PROMPTS, generate=N, batch_size=4)
    none = tf.trace(tiny, PROMPTS, generate=N, batch_size=4, steer=(vector, 0.0, "all"))
    np.testing.assert_array_equal(none.states.values, plain.states.values)  # alpha 0: unchanged
    ds = tf.trace(tiny, PROMPTS, generate=N, batch_size=4, steer=(vector, 2.0, "all"))
    config = json.loads(ds.attrs["tokenfield_config"])
    assert config["steering"]["alpha"] == 2.0 and config["steering"]["layer"] == 2
    assert not np.array_equal(ds.token_id.values, plain.token_id.values)  # it steers
    delta = torch.from_numpy(2.0 * vector.vector)

    def add(_module, _args, output):
        return output + delta if torch.is_tensor(output) else (output[0] + delta, *output[1:])

    for index, text in enumerate(PROMPTS):
        mine = ds.isel(particle=ds.prompt_index.values == index)
        new_ids = mine.token_id.values[mine.is_generated.values].tolist()
        with steering(tiny, vector, 2.0, positions="all"):
            assert new_ids == _alone_greedy(tiny, text, N)  # the steered model's continuation
        ids = torch.tensor([tiny.tokenizer(text)["input_ids"] + new_ids])
        with torch.no_grad():  # transformers hooks its hidden-state recorder on first use:
            tiny.model(ids, output_hidden_states=True)  # before ours, whatever ran earlier
        handle = tiny.sites.blocks[1].register_forward_hook(add)  # by hand: block 1's output
        try:
            with torch.no_grad():
                out = tiny.model(ids, output_hidden_states=True)
        finally:
            handle.remove()
        kept = mine.position.values
        for time in range(tiny.n_layers):
            hidden = out.hidden_states[time][0].numpy()[kept]
            if time == vector.layer:  # transformers records block 1's output before the hook
                hidden = hidden + delta.numpy()
            assert rel_err(mine.states.values[time], hidden) < RTOL


def test_steering_the_last_position_while_generating_is_refused(tiny):
    from tokenfield.steering.vectors import SteeringVector

    vector = SteeringVector(np.ones(tiny.d_model, dtype=np.float32), layer=1)
    with pytest.raises(UserError, match="steer all positions"):
        tf.trace(tiny, PROMPTS, generate=2, steer=(vector, 1.0, "last"))

"""The tracer on the bundled real models (the slow tier).

These check agreement with plain Hugging Face and the models' known greedy
answers (MODELS.md); they never assert what a model "should" show in analyses.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tokenfield as tf

pytestmark = pytest.mark.slow
RTOL = 1e-5


def rel_err(a, b) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


def plain(loaded, text):
    ids = torch.tensor([loaded.tokenizer(text)["input_ids"]])
    raw = {}
    handle = loaded.sites.blocks[-1].register_forward_hook(lambda _m, _a, o: raw.setdefault("h", o))
    try:
        with torch.no_grad():
            out = loaded.model(ids, output_hidden_states=True)
    finally:
        handle.remove()
    return out, raw["h"][0, -1].numpy()


@pytest.mark.parametrize("which", ["smollm2", "gemma"])
def test_states_equal_plain_forward(which, request):
    loaded = request.getfixturevalue(which)
    prompts = ["The capital of France is", "Solve: 15 * 12 + 4 =", "def fibonacci(n):"]
    ds = tf.trace(loaded, prompts, batch_size=3)  # batched with left padding
    for index, text in enumerate(prompts):
        out, raw_last = plain(loaded, text)
        hidden = np.stack([h[0, -1].numpy() for h in out.hidden_states])  # (L+1, d)
        mine = ds.states.values[:, index]
        assert rel_err(mine[:-1], hidden[:-1]) < RTOL
        assert rel_err(mine[-1], raw_last) < RTOL
        assert rel_err(ds.final_norm_states.values[index], hidden[-1]) < RTOL
        expected = out.logits[0, -1].softmax(-1).topk(5)
        np.testing.assert_allclose(
            ds.next_token_prob.values[index], expected.values.numpy(), atol=1e-5
        )


def test_smollm2_known_answer(smollm2):
    ds = tf.trace(smollm2, ["The capital of France is"])
    assert ds.next_token_top.values[0, 0] == " Paris"
    assert abs(float(ds.next_token_prob.values[0, 0]) - 0.77) < 0.01
    assert smollm2.n_layers == 30 and smollm2.d_model == 576


def test_gemma_known_answer(gemma):
    # Gemma splits numbers into digits, so check a short greedy continuation.
    ids = gemma.tokenizer("Water boils at a temperature of", return_tensors="pt")
    with torch.no_grad():
        out = gemma.model.generate(**ids, max_new_tokens=6, do_sample=False)
    text = gemma.tokenizer.decode(out[0, ids["input_ids"].shape[1] :])
    assert text.startswith(" 100 degrees"), text
    assert gemma.n_layers == 18 and gemma.d_model == 640


def test_smollm2_chat_template_and_all_positions(smollm2):
    plain_ds = tf.trace(smollm2, ["Hello there"], positions="all")
    chat_ds = tf.trace(smollm2, ["Hello there"], positions="all", chat=True)
    assert chat_ds.sizes["particle"] > plain_ds.sizes["particle"]
    tokens = "".join(chat_ds.token.values)
    assert "<|im_start|>user" in tokens and tokens.endswith("<|im_start|>assistant\n")


def test_seed_sets_batched_equal_one_by_one(smollm2):
    one = tf.trace(smollm2, "seed-spectrum", batch_size=1)
    many = tf.trace(smollm2, "seed-spectrum", batch_size=8)
    assert rel_err(many.states.values, one.states.values) < RTOL


def test_minilm_encoder_traces(minilm):
    ds = tf.trace(minilm, ["The capital of France is", "Hello"], positions="all", batch_size=2)
    assert ds.sizes["time"] == 7 and ds.sizes["feature"] == 384
    assert "next_token_top" not in ds
    last = ds.isel(particle=ds.is_last.values)
    assert list(last.token.values) == ["[SEP]", "[SEP]"]
    np.testing.assert_array_equal(ds.final_norm_states.values, ds.states.values[-1])

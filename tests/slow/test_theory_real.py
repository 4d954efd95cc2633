"""The theory lens on the bundled real models (the slow tier).

Mostly invariants that must hold on any model (the traced attention statistics
equal the reduced full matrices, eager tracing keeps the plain forward's greedy
answer,
the lens's last layer is the model's output, the heads at beta = 1 are the
model's attention), plus two facts measured in docs/theory-lens.md that are far
from their thresholds: trained heads park much more mass on the first token
than random-weight heads, and the category is linearly decodable from the
last layer well above the shuffled-label null.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tokenfield as tf
from tokenfield.analysis.markov import PER_HEAD, summarize_attention
from tokenfield.models.attention import attention_matrices
from tokenfield.pipelines.theory import theory_lens

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", params=["smollm2", "gemma"])
def traced(request, tmp_path_factory):
    model = request.getfixturevalue(request.param)
    root = tmp_path_factory.mktemp(request.param)
    options = {"positions": "all", "attention": True, "batch_size": 8}
    tf.trace(model, "seed-categories", logit_lens=True, out=root / "model", **options)
    random = tf.load_model(model.name, random_weights=True, seed=0)
    tf.trace(random, "seed-categories", out=root / "random", **options)
    return model, root


def test_attention_statistics_equal_the_full_matrices(traced):
    model, root = traced
    ds = tf.open_run(root / "model").load()
    text = str(ds.prompt.values[ds.prompt_index.values == 10][0])  # "The capital of France is"
    matrices = attention_matrices(model, text)
    assert np.allclose(np.triu(matrices, k=1), 0.0, atol=1e-7)
    row = np.flatnonzero((ds.prompt_index.values == 10) & ds.is_last.values)[0]
    for block in (0, model.n_layers // 2, model.n_layers - 1):
        expected = summarize_attention(matrices[block], causal=True)
        for name in PER_HEAD:
            got = ds[f"attn_{name}"].values[row, block]
            np.testing.assert_allclose(got, getattr(expected, name), atol=2e-4)


def test_eager_tracing_keeps_the_greedy_answer_and_the_lens_ends_on_it(traced):
    model, root = traced
    ds = tf.open_run(root / "model")
    last = ds.is_last.values
    for index in (0, 5, 10, 15, 20):  # plain forward, the model's default kernel
        row = np.flatnonzero(last & (ds.prompt_index.values == index))[0]
        ids = torch.tensor([model.tokenizer(str(ds.prompt.values[row]))["input_ids"]])
        with torch.no_grad():
            greedy = int(model.model(ids).logits[0, -1].argmax())
        assert str(ds.next_token_top.values[row, 0]) == model.tokenizer.decode([greedy])
    assert (ds.lens_rank.values[-1][last] == 1).all()
    assert (ds.lens_target.values[last] == ds.next_token_top.values[last, 0]).all()


def test_lens_sections_on_a_real_model(traced):
    model, root = traced
    result = theory_lens(root / "model", baseline=root / "random", permutations=10, model=model)
    layers = model.n_layers
    assert result.notes == [] or all("logit" in n for n in result.notes)
    assert len(result.beta.fits) == layers and len(result.beta_heads.fits) == layers
    assert all(0 <= f.r2 <= 1 for f in result.beta.fits + result.beta_heads.fits)
    # the attention sink: trained heads put far more on token 0 than random ones
    trained = np.nanmean(result.attention.head_mean("sink_mass")[2:])
    random = np.nanmean(result.baseline_attention.head_mean("sink_mass")[2:])
    assert trained > 0.4 and random < 0.35 and trained > random + 0.15
    # the category is linearly decodable at the last layer, far above the null
    last = result.probes["last"]
    assert last.accuracy[-1] >= 0.7 and last.accuracy[-1] > last.null_high[-1] + 0.3
    assert result.clouds.values["mean_cos"].shape == (layers + 1, 25)

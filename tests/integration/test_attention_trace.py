"""Attention statistics and the logit lens from the tracer, on tiny models of every family."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import xarray as xr

import tokenfield as tf
from tests.integration.tiny import KINDS, PROMPTS, save_tiny, tiny_loaded
from tokenfield.analysis.markov import PER_HEAD, PER_TOKEN, summarize_attention
from tokenfield.errors import UserError
from tokenfield.models.attention import attention_matrices, capture_attention, eager_attention

STAT_TOL = 1e-4  # float32 attention, batched vs alone


@pytest.fixture(scope="module", params=KINDS)
def tiny(request):
    return tiny_loaded(request.param)


@pytest.fixture(scope="module")
def traced(tiny):
    return tf.trace(tiny, PROMPTS, positions="all", batch_size=4, attention=True)


def test_statistics_equal_the_reduced_full_matrices(tiny, traced):
    """Padding cut away correctly: each prompt's stats equal those of its own matrices."""
    last = traced.is_last.values
    for index, text in enumerate(PROMPTS):
        matrices = attention_matrices(tiny, text)  # (blocks, heads, n, n)
        n = matrices.shape[-1]
        mine = traced.isel(particle=traced.prompt_index.values == index)
        assert mine.sizes["particle"] == n
        np.testing.assert_allclose(matrices.sum(-1), 1.0, atol=1e-5)
        row = int(np.flatnonzero(last[traced.prompt_index.values == index])[0])
        for block in range(tiny.n_layers):
            expected = summarize_attention(matrices[block], causal=tiny.causal)
            for name in PER_HEAD:
                got = mine[f"attn_{name}"].values[row, block]
                np.testing.assert_allclose(got, getattr(expected, name), atol=STAT_TOL)
            for name in PER_TOKEN:
                got = mine[f"attn_{name}"].values[:, block].T  # (heads, n)
                np.testing.assert_allclose(got, getattr(expected, name), atol=STAT_TOL)


def test_per_head_statistics_sit_on_last_tokens_only(traced):
    last = traced.is_last.values
    assert np.isnan(traced.attn_lambda2.values[~last]).all()
    single = traced.prompt_index.values[last] == PROMPTS.index("water")
    others = ~single
    assert np.isfinite(traced.attn_lambda2.values[last][others]).all()
    sums = np.nansum(traced.attn_stationary.values, axis=0)  # per block, head: over all prompts
    np.testing.assert_allclose(sums, len(PROMPTS), rtol=1e-5)


def test_batched_equals_unbatched_and_last_equals_all(tiny, traced):
    one = tf.trace(tiny, PROMPTS, positions="all", batch_size=1, attention=True)
    for name in ("attn_lambda2", "attn_sink_mass", "attn_stationary_nosink", "attn_entropy"):
        np.testing.assert_allclose(one[name].values, traced[name].values, atol=STAT_TOL)
    last = tf.trace(tiny, PROMPTS, positions="last", batch_size=3, attention=True)
    keep = traced.is_last.values
    for name in ("attn_lambda2_nosink", "attn_raw_lambda2", "attn_stationary"):
        np.testing.assert_allclose(last[name].values, traced[name].values[keep], atol=STAT_TOL)


def test_attention_tracing_leaves_outputs_unchanged_and_restores_the_kernel(tiny):
    before_impl = tiny.model.config._attn_implementation
    ids = torch.tensor([tiny.tokenizer(PROMPTS[3])["input_ids"]])
    key = "logits" if tiny.causal else "last_hidden_state"
    with torch.no_grad(), eager_attention(tiny.model):
        plain = tiny.model(ids)[key]
        with capture_attention(tiny.sites, causal=tiny.causal) as capture:
            capture.reset(tiny.n_layers, torch.ones_like(ids))
            hooked = tiny.model(ids)[key]
        assert all(s[0] is not None for s in capture.summaries)
    assert torch.equal(plain, hooked)
    assert tiny.model.config._attn_implementation == before_impl
    # eager and the default kernel agree to float precision
    with torch.no_grad():
        default = tiny.model(ids)[key]
    assert torch.allclose(plain, default, atol=1e-5)


def test_causal_sink_token_is_the_raw_chains_absorbing_state(tiny, traced):
    if not tiny.causal:
        pytest.skip("encoder")
    matrices = attention_matrices(tiny, PROMPTS[0])
    assert np.allclose(np.triu(matrices, k=1), 0.0)  # lower triangular
    assert np.allclose(matrices[:, :, 0, 0], 1.0)  # row 0 is e_0: absorbing


def test_logit_lens_matches_the_model_at_the_last_layer(tiny):
    if not tiny.causal:
        with pytest.raises(UserError):
            tf.trace(tiny, PROMPTS, logit_lens=True)
        return
    ds = tf.trace(tiny, PROMPTS, positions="all", batch_size=4, logit_lens=True, lens_k=3)
    last = ds.is_last.values
    assert ds.lens_top.shape == (tiny.n_layers + 1, ds.sizes["particle"], 3)
    assert (ds.lens_rank.values[-1, last] == 1).all()
    assert (ds.lens_rank.values[:, ~last] == -1).all()
    assert (ds.lens_top.values[-1, last, 0] == ds.next_token_top.values[last, 0]).all()
    assert (ds.lens_target.values[last] == ds.next_token_top.values[last, 0]).all()
    np.testing.assert_allclose(
        ds.lens_prob.values[-1, last], ds.next_token_prob.values[last, :3], rtol=1e-5
    )
    # an intermediate layer, by hand
    unembed = tiny.model.get_output_embeddings()
    time = 1
    with torch.no_grad():
        logits = unembed(tiny.sites.final_norm(torch.from_numpy(ds.states.values[time, last])))
        final = unembed(tiny.sites.final_norm(torch.from_numpy(ds.states.values[-1, last])))
    words = [tiny.tokenizer.decode([int(t)]) for t in logits.argmax(-1)]
    assert list(ds.lens_top.values[time, last, 0]) == words
    target = final.argmax(-1, keepdim=True)
    ranks = 1 + (logits > logits.gather(1, target)).sum(-1)
    assert ds.lens_rank.values[time, last].tolist() == ranks.tolist()


def test_run_on_disk_round_trips(tiny, tmp_path):
    if not tiny.causal:
        pytest.skip("the lens needs an unembedding")
    ds = tf.trace(
        tiny,
        PROMPTS,
        positions="all",
        batch_size=2,
        attention=True,
        logit_lens=True,
        out=tmp_path / "run",
    )
    memory = tf.trace(tiny, PROMPTS, positions="all", batch_size=2, attention=True, logit_lens=True)
    for name in ("attn_lambda2", "attn_stationary", "lens_rank", "lens_top"):
        assert ds[name].dims == memory[name].dims
        if memory[name].dtype == object:
            assert [str(v) for v in ds[name].values.ravel()] == [
                str(v) for v in memory[name].values.ravel()
            ]
        else:
            np.testing.assert_allclose(ds[name].values, memory[name].values, atol=1e-6)
    plain = xr.open_zarr(tmp_path / "run" / "trajectory.zarr")
    assert plain.attn_lambda2.dims == ("particle", "block", "head")
    assert tf.read_run_info(tmp_path / "run").config["attention"]["attn_implementation"] == "sdpa"


def test_cli_trace_with_attention_and_lens(tmp_path, capsys):
    from tokenfield.cli import main

    directory = save_tiny("gpt2", tmp_path / "tiny-gpt2")
    prompts = tmp_path / "p.txt"
    prompts.write_text("the capital of France is\n1 + 2 =\n")
    main(
        [
            "trace",
            "--model",
            str(directory),
            "--prompts",
            str(prompts),
            "--out",
            str(tmp_path / "r"),
            "--positions",
            "all",
            "--attention",
            "--logit-lens",
        ]
    )
    ds = xr.open_zarr(tmp_path / "r" / "trajectory.zarr")
    assert "attn_sink_mass" in ds and "lens_rank" in ds
    assert ds.attn_sink_mass.sizes == {"particle": 9, "block": 3, "head": 4}
    # the CLI leaves the model's SDPA running: the queries-and-keys read-out
    assert tf.read_run_info(tmp_path / "r").config["attention"]["attn_implementation"] == "sdpa"
    # --attention-readout eager: the eager path, recorded, with the same statistics
    argv = ["trace", "-m", str(directory), "-p", str(prompts), "--positions", "all"]
    main([*argv, "--out", str(tmp_path / "e"), "--attention", "--attention-readout", "eager"])
    assert tf.read_run_info(tmp_path / "e").config["attention"]["attn_implementation"] == "eager"
    eager = xr.open_zarr(tmp_path / "e" / "trajectory.zarr")
    for name in PER_HEAD + PER_TOKEN:
        np.testing.assert_allclose(eager[f"attn_{name}"], ds[f"attn_{name}"], atol=1e-5)
    capsys.readouterr()


def test_attention_with_generate_reads_the_traced_pass_only(tiny):
    """``trace --attention --generate``: the steps of ``generate`` are not read out
    (they used to reach the reducer and crash it); each token's statistics are those
    of the whole sequence, prompt and generated tokens, traced in one pass."""
    if not tiny.causal:
        pytest.skip("generation needs a causal model")
    traced = tf.trace(tiny, PROMPTS[:2], positions="all", attention=True, generate=3)
    assert traced.is_generated.values.any()
    for index in range(2):
        mine = traced.isel(particle=traced.prompt_index.values == index)
        matrices = attention_matrices(tiny, [int(i) for i in mine.token_id.values])
        assert matrices.shape[-1] == mine.sizes["particle"]
        for block in range(tiny.n_layers):
            expected = summarize_attention(matrices[block], causal=True)
            for name in PER_TOKEN:
                got = mine[f"attn_{name}"].values[:, block].T  # (heads, n)
                np.testing.assert_allclose(got, getattr(expected, name), atol=STAT_TOL)

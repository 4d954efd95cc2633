"""The tracer on tiny random-weight models of every supported architecture family."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import xarray as xr

import tokenfield as tf
from tests.integration.tiny import KINDS, PROMPTS, tiny_loaded
from tokenfield.models.batching import encode_prompts, pad_batch
from tokenfield.models.capture import capture_residual
from tokenfield.prompts import as_prompts

RTOL = 1e-5  # the tolerance: traced states vs plain Hugging Face, relative


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


@pytest.fixture(scope="module", params=KINDS)
def tiny(request):
    return tiny_loaded(request.param)


def plain_forward(loaded, text: str):
    """A plain HF forward of one prompt, plus an independent hook on the last block."""
    ids = torch.tensor([loaded.tokenizer(text)["input_ids"]])
    raw_last = {}
    handle = loaded.sites.blocks[-1].register_forward_hook(
        lambda _m, _a, out: raw_last.setdefault("h", out if torch.is_tensor(out) else out[0])
    )
    try:
        with torch.no_grad():
            out = loaded.model(ids, output_hidden_states=True)
    finally:
        handle.remove()
    return out, raw_last["h"][0].numpy(), ids


def test_states_equal_plain_forward(tiny):
    ds = tf.trace(tiny, PROMPTS, positions="all", batch_size=1)
    for index, text in enumerate(PROMPTS):
        out, raw_last, ids = plain_forward(tiny, text)
        mine = ds.isel(particle=ds.prompt_index.values == index)
        assert mine.sizes["particle"] == ids.shape[1]
        hidden = [h[0].numpy() for h in out.hidden_states]  # each (seq, d)
        for time in range(tiny.n_layers):  # embed and all blocks but the last
            assert rel_err(mine.states.values[time], hidden[time]) < RTOL
        assert rel_err(mine.states.values[-1], raw_last) < RTOL
        if tiny.sites.final_norm is not None:
            normed = tiny.sites.final_norm(torch.from_numpy(raw_last)).detach().numpy()
            assert rel_err(mine.final_norm_states.values, normed) < RTOL
            # Hugging Face's last hidden state is the final-norm output, not the raw block
            assert rel_err(hidden[-1], normed) < RTOL
        else:
            assert rel_err(mine.final_norm_states.values, raw_last) < RTOL


def test_tracing_leaves_logits_unchanged(tiny):
    ids = torch.tensor([tiny.tokenizer(PROMPTS[0])["input_ids"]])
    with torch.no_grad():
        before = tiny.model(ids)
        with capture_residual(tiny.sites) as capture:
            capture.reset(tiny.n_layers + 1, torch.ones_like(ids, dtype=torch.bool))
            during = tiny.model(ids)
        after = tiny.model(ids)
    key = "logits" if tiny.causal else "last_hidden_state"
    assert torch.equal(before[key], during[key])
    assert torch.equal(before[key], after[key])
    assert len(capture.states) == tiny.n_layers + 1 and all(s is not None for s in capture.states)


@pytest.mark.parametrize("positions", ["last", "all"])
def test_batched_equals_unbatched(tiny, positions):
    one = tf.trace(tiny, PROMPTS, positions=positions, batch_size=1)
    many = tf.trace(tiny, PROMPTS, positions=positions, batch_size=4)
    assert one.sizes == many.sizes
    assert rel_err(many.states.values, one.states.values) < RTOL
    assert rel_err(many.final_norm_states.values, one.final_norm_states.values) < RTOL
    for name in ("prompt_index", "position", "token", "is_last"):
        assert list(one[name].values) == list(many[name].values)
    if tiny.causal:
        assert np.allclose(
            many.next_token_prob.values, one.next_token_prob.values, atol=1e-5, equal_nan=True
        )


def test_last_is_the_last_of_all(tiny):
    last = tf.trace(tiny, PROMPTS, positions="last", batch_size=3)
    every = tf.trace(tiny, PROMPTS, positions="all", batch_size=3)
    picked = every.isel(particle=every.is_last.values)
    assert rel_err(picked.states.values, last.states.values) < RTOL
    lengths = [len(tiny.tokenizer(p)["input_ids"]) for p in PROMPTS]
    assert list(last.position.values) == [n - 1 for n in lengths]
    assert every.sizes["particle"] == sum(lengths)


def test_padding_masks_and_positions():
    tiny = tiny_loaded("llama")
    encoded = encode_prompts(tiny, as_prompts(["the a of", "water"]))
    padded = pad_batch(encoded, tiny, "all")
    mask = padded["inputs"]["attention_mask"]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1]]  # left padding for causal models
    assert padded["inputs"]["position_ids"].tolist() == [[0, 1, 2], [0, 0, 0]]
    assert padded["keep"].tolist() == [[True, True, True], [False, False, True]]


def test_resume_after_interruption_equals_uninterrupted(tmp_path, monkeypatch):
    tiny = tiny_loaded("llama")
    whole = tf.trace(tiny, PROMPTS, positions="all", batch_size=2, out=tmp_path / "whole")

    import tokenfield.models.trace as trace_module

    real_forward = trace_module.forward_last
    calls = {"n": 0}

    def interrupted(model, inputs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return real_forward(model, inputs)

    monkeypatch.setattr(trace_module, "forward_last", interrupted)
    run = tmp_path / "resumed"
    with pytest.raises(KeyboardInterrupt):
        tf.trace(tiny, PROMPTS, positions="all", batch_size=2, out=run)
    info = tf.read_run_info(run)
    assert info.status == "partial" and info.progress["done"] == 2
    monkeypatch.setattr(trace_module, "forward_last", real_forward)
    resumed = tf.trace(tiny, PROMPTS, positions="all", batch_size=2, out=run)
    xr.testing.assert_identical(_strip(resumed), _strip(whole))
    assert list(resumed.prompt_index.values) == sorted(resumed.prompt_index.values)


def test_resume_trims_rows_written_after_the_last_progress(tmp_path, monkeypatch):
    """A kill between the Zarr append and the run.json update leaves extra rows."""
    monkeypatch.setenv("TOKENFIELD_FLUSH_SECONDS", "0")  # every batch is an append
    tiny = tiny_loaded("gpt2")
    whole = tf.trace(tiny, PROMPTS, batch_size=2, out=tmp_path / "whole")
    from tokenfield.runs import RunWriter

    real_append = RunWriter.append
    calls = {"n": 0}

    def dies_after_zarr_write(self, piece, done, **progress):
        calls["n"] += 1
        if calls["n"] == 2:  # the store gets the rows, run.json never hears of them
            piece.to_zarr(self.store, append_dim=self.append_dim, consolidated=False)
            raise KeyboardInterrupt
        return real_append(self, piece, done, **progress)

    monkeypatch.setattr(RunWriter, "append", dies_after_zarr_write)
    run = tmp_path / "killed"
    with pytest.raises(KeyboardInterrupt):
        tf.trace(tiny, PROMPTS, batch_size=2, out=run)
    monkeypatch.setattr(RunWriter, "append", real_append)
    resumed = tf.trace(tiny, PROMPTS, batch_size=2, out=run)
    xr.testing.assert_identical(_strip(resumed), _strip(whole))


def test_complete_run_is_reused_and_other_config_refused(tmp_path):
    tiny = tiny_loaded("qwen3")
    run = tmp_path / "run"
    first = tf.trace(tiny, PROMPTS[:3], out=run)
    again = tf.trace(tiny, PROMPTS[:3], out=run)  # complete: read back, not recomputed
    xr.testing.assert_identical(_strip(first), _strip(again))
    before = (run / "run.json").read_text()
    with pytest.raises(tf.UserError, match="different config.*prompts"):
        tf.trace(tiny, PROMPTS[:4], out=run)
    assert (run / "run.json").read_text() == before  # nothing touched
    replaced = tf.trace(tiny, PROMPTS[:4], out=run, overwrite=True)
    assert replaced.sizes["particle"] == 4


def test_random_weights_differ_from_trained(tmp_path):
    from tests.integration.tiny import save_tiny

    directory = save_tiny("llama", tmp_path / "tiny-llama")
    trained = tf.load_model(str(directory))
    random = tf.load_model(str(directory), random_weights=True, seed=1)
    again = tf.load_model(str(directory), random_weights=True, seed=1)
    a = tf.trace(trained, PROMPTS[:2]).states.values
    b = tf.trace(random, PROMPTS[:2]).states.values
    c = tf.trace(again, PROMPTS[:2]).states.values
    assert a.shape == b.shape and not np.allclose(a[1:], b[1:])
    np.testing.assert_array_equal(b, c)  # seeded
    assert random.run_config()["random_weights"] and not trained.run_config()["random_weights"]


def test_over_long_prompt_is_refused_or_truncated():
    tiny = tiny_loaded("llama")
    long_prompt = " ".join(["the"] * 80)  # context is 64
    with pytest.raises(tf.UserError, match="80 tokens, more than the model's context of 64"):
        tf.trace(tiny, [long_prompt])
    kept = tf.trace(tiny, [long_prompt], truncate=True, positions="all")
    assert kept.sizes["particle"] == 64


def _strip(ds: xr.Dataset) -> xr.Dataset:
    """Drop run bookkeeping attrs; compare the data."""
    out = ds.load().copy()
    out.attrs = {}
    return out


@pytest.mark.parametrize("positions", ["last", "all"])
def test_a_small_streamed_run_is_laid_out_for_its_size_and_read_back_whole(tmp_path, positions):
    """A streamed trace knows its particles before it writes: its 1-D coordinates
    are one chunk of exactly that many rows (not COORD_CHUNK rows of padding to
    encode and decode), and the Dataset it returns (read back without the at-rest
    checks) is the run as open_run and plain xarray read it."""
    import zarr

    tiny = tiny_loaded("llama")
    ds = tf.trace(tiny, PROMPTS, positions=positions, batch_size=2, out=tmp_path / "r")
    store = tmp_path / "r" / "trajectory.zarr"
    group = zarr.open_group(str(store), mode="r")
    for name in ("prompt", "token", "position", "is_last"):
        assert group[name].chunks == (ds.sizes["particle"],), name
    xr.testing.assert_identical(ds.load(), tf.open_run(tmp_path / "r").load())
    plain = xr.open_zarr(store).load()
    xr.testing.assert_identical(ds.drop_attrs(), plain.drop_attrs())

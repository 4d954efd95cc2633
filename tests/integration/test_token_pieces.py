"""Tokens that hold part of a character (emoji, Hebrew) keep their id and a readable piece."""

from __future__ import annotations

import re

import pytest

import tokenfield as tf
from tests.integration.tiny import tiny_hf_model
from tokenfield.models.load import wrap_model
from tokenfield.models.tokens import escape_bytes, token_piece
from tokenfield.runs import open_run

TEXTS = ["a 🍕 is", "שלום a"]


def byte_level_tokenizer(texts):
    """A GPT-2 style byte-level tokenizer with no merges (one token per byte), its
    vocabulary cut to the bytes of ``texts`` so that a tiny model can embed it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from tokenfield.models.tokens import _byte_level_alphabet

    spell = {byte: char for char, byte in _byte_level_alphabet().items()}
    used = sorted({spell[b] for text in texts for b in text.encode()})
    vocab = {"[PAD]": 0, **{char: i + 1 for i, char in enumerate(used)}}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="[PAD]")


def test_escape_bytes():
    assert escape_bytes("🍕".encode()) == "🍕"
    assert escape_bytes(" \xd7".encode("latin-1")) == " <0xD7>"
    assert escape_bytes(b"\xf0\x9f") == "<0xF0><0x9F>"


def test_partial_characters_are_stored_with_id_and_piece(tmp_path):
    tokenizer = byte_level_tokenizer(TEXTS)
    model = wrap_model(tiny_hf_model("llama"), tokenizer, name="tiny-bytes")
    tf.trace(model, TEXTS, positions="all", out=tmp_path / "run", batch_size=2)
    ds = open_run(tmp_path / "run")
    for index, text in enumerate(TEXTS):
        mine = ds["prompt_index"].values == index
        ids = tokenizer(text)["input_ids"]
        assert ds["token_id"].values[mine].tolist() == ids
        pieces = ds["token_piece"].values[mine].tolist()
        tokens = ds["token"].values[mine].tolist()
        assert "\ufffd" in tokens  # the decoded token as before: kept for old readers
        assert not any("\ufffd" in p for p in pieces)
        # the pieces spell the prompt's bytes exactly
        raw = b"".join(
            bytes.fromhex(p[3:5]) if re.fullmatch(r"<0x[0-9A-F]{2}>", p) else p.encode()
            for p in pieces
        )
        assert raw == text.encode()
        for token, piece in zip(tokens, pieces, strict=True):
            if token != "\ufffd":
                assert piece == token  # whole characters are unchanged
    assert ds["token_piece"].values[ds["prompt_index"].values == 0].tolist()[2:6] == [
        "<0xF0>", "<0x9F>", "<0x8D>", "<0x95>",
    ]  # fmt: skip


def test_a_piece_the_tokenizer_spells_itself_is_kept():
    class SentencePieceLike:
        def decode(self, ids):
            return "\ufffd"

        def convert_ids_to_tokens(self, token_id):
            return "<0xf0>"

    assert token_piece(SentencePieceLike(), 7) == "<0xF0>"


@pytest.mark.slow
@pytest.mark.parametrize(("name", "splits"), [("smollm2", True), ("gemma3-270m", False)])
def test_real_tokenizers_spell_emoji_and_hebrew(name, splits):
    """SmolLM2's byte-level BPE splits the emoji and the Hebrew letters into bytes;
    Gemma's vocabulary has them whole. Either way no piece is a bare replacement
    character, and the ids are the tokenizer's."""
    loaded = tf.load_model(name)
    text = "I love 🍕 and שלום"
    ds = tf.trace(loaded, [text], positions="all")
    pieces = ds["token_piece"].values.tolist()
    assert not any("\ufffd" in p for p in pieces), pieces
    split = [p for p in pieces if re.search(r"<0x[0-9A-F]{2}>", p)]
    assert bool(split) == splits, pieces
    assert ("\ufffd" in ds["token"].values.tolist()) == splits  # what 'token' alone showed
    assert ds["token_id"].values.tolist() == loaded.tokenizer(text)["input_ids"]


def test_a_partial_run_from_before_token_ids_resumes(tmp_path, monkeypatch):
    """A run interrupted under a version that stored no token ids finishes in its
    own layout (no token_id / token_piece) instead of failing to append."""
    import xarray as xr

    import tokenfield.models.trace as trace_module
    from tests.integration.tiny import PROMPTS, tiny_loaded

    tiny = tiny_loaded("llama")
    whole = tf.trace(tiny, PROMPTS, positions="all", batch_size=2, out=tmp_path / "whole")
    real_piece, real_forward = trace_module._piece, trace_module.forward_last
    calls = {"n": 0}

    def old_piece(*args, **kwargs):
        return real_piece(*args, **kwargs).drop_vars(["token_id", "token_piece"])

    def interrupted(model, inputs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return real_forward(model, inputs)

    monkeypatch.setattr(trace_module, "_piece", old_piece)
    monkeypatch.setattr(trace_module, "forward_last", interrupted)
    with pytest.raises(KeyboardInterrupt):
        tf.trace(tiny, PROMPTS, positions="all", batch_size=2, out=tmp_path / "old")
    monkeypatch.setattr(trace_module, "_piece", real_piece)
    monkeypatch.setattr(trace_module, "forward_last", real_forward)
    resumed = tf.trace(tiny, PROMPTS, positions="all", batch_size=2, out=tmp_path / "old")
    assert "token_id" not in resumed.coords
    expected = whole.drop_vars(["token_id", "token_piece"])
    xr.testing.assert_allclose(resumed.states, expected.states)
    assert resumed["token"].values.tolist() == expected["token"].values.tolist()

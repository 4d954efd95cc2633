"""Tiny random-weight Hugging Face models built from configs, and a tiny tokenizer.

No downloads: the tokenizer is a word-level vocabulary built in memory.
"""

from __future__ import annotations

from pathlib import Path

import torch

_WORD_TEXT = (
    "the a of to and is in that it was for on are as with his they at be this from I have "
    "or by one had not but what all were when we there can an your which their said if do "
    "will each about how up out them then she many some so these would other into has more "
    "her two like him see time could no make than first been its who now people my made over "
    "did down only way find use may water long little very after words called just where most "
    "know capital France Paris + = * 1 2 3 4 5 . , : ( ) def print"
)
WORDS = tuple(_WORD_TEXT.split())


def tiny_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[PAD]": 0, "[UNK]": 1, "[BOS]": 2}
    for word in WORDS:
        vocab.setdefault(word, len(vocab))
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="[PAD]", unk_token="[UNK]", bos_token="[BOS]"
    )


VOCAB = 128
COMMON = {"vocab_size": VOCAB, "max_position_embeddings": 64}


def tiny_config(kind: str):
    import transformers as tr

    if kind == "llama":
        return tr.LlamaConfig(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=2,
            **COMMON,
        )
    if kind == "qwen3":
        return tr.Qwen3Config(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=8,
            **COMMON,
        )
    if kind == "gemma3":
        return tr.Gemma3TextConfig(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=1,
            head_dim=8,
            sliding_window=4,
            **COMMON,
        )
    if kind == "gpt2":
        return tr.GPT2Config(
            vocab_size=VOCAB, n_embd=32, n_layer=3, n_head=4, n_positions=64, n_inner=64
        )
    if kind == "gpt_neox":
        return tr.GPTNeoXConfig(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=3,
            num_attention_heads=4,
            **COMMON,
        )
    if kind == "bert":
        return tr.BertConfig(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=3,
            num_attention_heads=4,
            **COMMON,
        )
    raise ValueError(kind)


KINDS = ("llama", "qwen3", "gemma3", "gpt2", "gpt_neox", "bert")


def tiny_hf_model(kind: str, seed: int = 0):
    from transformers import AutoModel, AutoModelForCausalLM

    torch.manual_seed(seed)
    config = tiny_config(kind)
    auto = AutoModel if kind == "bert" else AutoModelForCausalLM
    model = auto.from_config(config, dtype=torch.float32)
    return model.eval()


def tiny_loaded(kind: str, seed: int = 0):
    from tokenfield.models.load import wrap_model

    return wrap_model(tiny_hf_model(kind, seed), tiny_tokenizer(), name=f"tiny-{kind}")


def save_tiny(kind: str, directory: Path) -> Path:
    """Write a tiny model + tokenizer as a local Hugging Face directory."""
    model = tiny_hf_model(kind)
    model.config.architectures = [type(model).__name__]
    model.save_pretrained(directory)
    tiny_tokenizer().save_pretrained(directory)
    return directory


PROMPTS = [
    "the capital of France is",
    "1 + 2 =",
    "def print ( a )",
    "she said that it was a long time",
    "water",
    "how many people made the first words",
]

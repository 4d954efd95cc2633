"""Where the residual stream is read, per architecture family.

Sites are named explicitly:

- ``embed``: the residual stream entering block 0 (token embedding plus whatever
  the architecture adds before the first block: Gemma's sqrt(d) scaling, GPT-2's
  position embeddings, BERT's embedding LayerNorm). It is read as the input of
  block 0, so it is the same definition for every family.
- ``block.{i}``: the raw output of block ``i`` (0-based), before any final norm.
- ``final_norm``: the output of the model's final norm, what the unembedding
  sees. Post-norm encoders (BERT) have none; their last block output is used.

Run coordinates use ``time`` = 0 for ``embed`` and ``time`` = i + 1 for
``block.{i}``.

Blocks and the final norm are found through one small registry keyed by the
Hugging Face ``model_type``. An unknown model type is an error that says how to
add it, never a guess.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from tokenfield.errors import UserError

__all__ = [
    "ATTENTION_PATHS",
    "Family",
    "FAMILIES",
    "attention_modules",
    "family_for",
    "ModelSites",
    "find_sites",
    "site_names",
]


@dataclass(frozen=True)
class Family:
    """How to find the pieces of one architecture family.

    Paths are dotted attribute paths from the Hugging Face *base* model
    (``model.base_model``: ``LlamaModel``, ``GPT2Model``, ``BertModel``, ...).
    """

    name: str
    model_types: tuple[str, ...]
    blocks: str
    final_norm: str | None
    embed_tokens: str
    causal: bool


FAMILIES: tuple[Family, ...] = (
    Family(
        "llama",
        (
            "llama",
            "mistral",
            "mixtral",
            "qwen2",
            "qwen3",
            "qwen3_moe",
            "gemma",
            "gemma2",
            "gemma3_text",
            "phi3",
            "olmo",
            "olmo2",
            "granite",
            "smollm3",
        ),
        blocks="layers",
        final_norm="norm",
        embed_tokens="embed_tokens",
        causal=True,
    ),
    Family("gpt2", ("gpt2",), blocks="h", final_norm="ln_f", embed_tokens="wte", causal=True),
    Family(
        "gpt_neox",
        ("gpt_neox",),
        blocks="layers",
        final_norm="final_layer_norm",
        embed_tokens="embed_in",
        causal=True,
    ),
    Family(
        "bert",
        ("bert", "roberta"),
        blocks="encoder.layer",
        final_norm=None,
        embed_tokens="embeddings.word_embeddings",
        causal=False,
    ),
)


def known_model_types() -> list[str]:
    return sorted(t for family in FAMILIES for t in family.model_types)


def family_for(model_type: str) -> Family:
    """The registry entry for a Hugging Face ``model_type``.

    Raises:
        UserError: the model type is not in the registry.
    """
    for family in FAMILIES:
        if model_type in family.model_types:
            return family
    raise UserError(
        f"model type '{model_type}' is not supported (known: {', '.join(known_model_types())})",
        "add a Family entry for it in tokenfield/models/sites.py",
    )


@dataclass(frozen=True)
class ModelSites:
    """The modules of one loaded model at which the residual stream is read."""

    family: Family
    blocks: tuple[nn.Module, ...]
    final_norm: nn.Module | None
    embed_tokens: nn.Module

    @property
    def n_blocks(self) -> int:
        return len(self.blocks)


def _get(root: nn.Module, path: str, what: str, model_type: str) -> nn.Module:
    node = root
    for part in path.split("."):
        if not hasattr(node, part):
            raise UserError(
                f"cannot find the {what} ('{path}') in this {model_type} model",
                "its layout differs from the registry entry in tokenfield/models/sites.py",
            )
        node = getattr(node, part)
    return node


def find_sites(model: nn.Module) -> ModelSites:
    """Locate blocks, final norm and token embedding of a Hugging Face model."""
    model_type = getattr(model.config, "model_type", type(model).__name__)
    family = family_for(model_type)
    base = getattr(model, "base_model", model)
    blocks = _get(base, family.blocks, "blocks", model_type)
    norm = _get(base, family.final_norm, "final norm", model_type) if family.final_norm else None
    embed = _get(base, family.embed_tokens, "token embedding", model_type)
    return ModelSites(family, tuple(blocks), norm, embed)


def site_names(n_blocks: int) -> list[str]:
    """Site name for each ``time``: ``embed``, ``block.0``, ..., ``block.{n-1}``."""
    return ["embed", *(f"block.{i}" for i in range(n_blocks))]


# Where a block's self-attention module lives, per family above.
ATTENTION_PATHS: dict[str, str] = {
    "llama": "self_attn",
    "gpt2": "attn",
    "gpt_neox": "attention",
    "bert": "attention.self",
}


def attention_modules(sites: ModelSites) -> tuple[nn.Module, ...]:
    """The self-attention module of every block (:data:`ATTENTION_PATHS`).

    Raises:
        UserError: the family has no entry, or a block lacks the module.
    """
    path = ATTENTION_PATHS.get(sites.family.name)
    if path is None:
        raise UserError(
            f"attention tracing does not know the '{sites.family.name}' family",
            "add it to ATTENTION_PATHS in tokenfield/models/sites.py",
        )
    modules = []
    for index, block in enumerate(sites.blocks):
        try:
            modules.append(block.get_submodule(path))
        except AttributeError:
            raise UserError(
                f"block {index} has no attention module at '{path}'",
                "fix ATTENTION_PATHS in tokenfield/models/sites.py for this model",
            ) from None
    return tuple(modules)

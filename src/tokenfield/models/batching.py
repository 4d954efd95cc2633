"""Encoding and batching prompts for a forward pass, shared by the tracer
(:mod:`tokenfield.models.trace`) and generation (:mod:`tokenfield.steering.generate`).

- :func:`encode_prompts`: token ids per prompt (chat template, context check);
- :func:`pad_batch`: a padded batch (left padding with mask-derived positions
  for causal models, right padding for encoders) and the masks of the
  positions to read;
- :func:`forward_last`: one forward pass, the last column's logits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from tokenfield.errors import ParameterError, UserError
from tokenfield.models.load import LoadedModel
from tokenfield.prompts import Prompt

__all__ = ["Encoded", "Positions", "encode_prompts", "forward_last", "pad_batch"]

Positions = Literal["last", "all"]


@dataclass(frozen=True)
class Encoded:
    """One prompt's token ids (after chat template and truncation)."""

    prompt: Prompt
    ids: list[int]


def encode_prompts(
    model: LoadedModel, prompts: Sequence[Prompt], *, chat: bool = False, truncate: bool = False
) -> list[Encoded]:
    """Tokenize prompts, applying the chat template and checking the context length.

    Raises:
        UserError: ``chat`` without a chat template; a prompt longer than the
            model's context without ``truncate`` (which keeps the last tokens).
    """
    tokenizer = model.tokenizer
    if chat and not getattr(tokenizer, "chat_template", None):
        raise ParameterError(
            "chat", f"model '{model.name}' has no chat template", "drop {name} for this model"
        )
    limit = model.max_positions
    encoded = []
    for number, prompt in enumerate(prompts, start=1):
        if chat:
            text = tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt.text}],
                add_generation_prompt=True,
                tokenize=False,
            )
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        else:
            ids = tokenizer(prompt.text)["input_ids"]
        if not ids:
            raise UserError(f"prompt #{number} encodes to no tokens", "give it some text")
        if limit and len(ids) > limit:
            if not truncate:
                raise ParameterError(
                    "truncate",
                    f"prompt #{number} has {len(ids)} tokens, more than the model's "
                    f"context of {limit}",
                    f"shorten it, or pass {{name}} to keep its last {limit} tokens",
                )
            ids = ids[-limit:]
        encoded.append(Encoded(prompt, list(ids)))
    return encoded


def pad_batch(
    batch: Sequence[Encoded], model: LoadedModel, positions: Positions
) -> dict[str, torch.Tensor]:
    """Pad a batch of encoded prompts for one forward pass.

    Causal models are left-padded (every prompt ends in the last column) with
    ``position_ids`` counted from the mask, so a prompt sees the positions it
    would see alone; encoders are right-padded.

    Returns:
        ``{"inputs": {"input_ids", "attention_mask"[, "position_ids"]}`` (each
        ``(batch, seq)``), ``"keep"``: the ``(batch, seq)`` bool mask of the
        positions to read (``positions``: each prompt's last real token, or every
        real token), ``"last"``: the ``(batch, seq)`` bool mask of each prompt's
        last real token.``}``
    """
    pad_id = model.tokenizer.pad_token_id
    if pad_id is None:
        pad_id = model.tokenizer.eos_token_id or 0
    width = max(len(item.ids) for item in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    last = torch.zeros((len(batch), width), dtype=torch.bool)
    for row, item in enumerate(batch):
        n = len(item.ids)
        if model.causal:  # left padding: every prompt ends in the last column
            ids[row, width - n :] = torch.tensor(item.ids)
            mask[row, width - n :] = 1
            last[row, width - 1] = True
        else:  # right padding
            ids[row, :n] = torch.tensor(item.ids)
            mask[row, :n] = 1
            last[row, n - 1] = True
    keep = last if positions == "last" else mask.bool()
    inputs = {"input_ids": ids, "attention_mask": mask}
    if model.causal:
        inputs["position_ids"] = (mask.cumsum(-1) - 1).clamp(min=0)
    return {"inputs": inputs, "keep": keep, "last": last}


def forward_last(model: LoadedModel, inputs: dict[str, torch.Tensor]) -> torch.Tensor | None:
    """Run the model on :func:`pad_batch` inputs (moved to its device).

    Returns:
        Causal models: the logits of the last column, ``(batch, vocab)`` float32
        (with left padding, every prompt's next-token logits; only that column
        is computed). Encoders: ``None``.
    """
    device = model.device
    inputs = {k: v.to(device) for k, v in inputs.items()}
    if not model.causal:
        model.model(**inputs)
        return None
    out = model.model(**inputs, use_cache=False, logits_to_keep=1)
    return out.logits[:, -1, :].float()

"""Batched greedy continuations and next-token distributions for causal models.

Both use the tracer's encoding and left padding (with mask-derived positions),
so a prompt gives the same result alone or in a batch, steered or not.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from tokenfield.errors import UserError
from tokenfield.models.trace import _forward, _pad_batch, encode_prompts
from tokenfield.prompts import as_prompts

__all__ = ["greedy_continuations", "next_token_logprobs"]


def _require_causal(model: Any) -> None:
    if not model.causal:
        raise UserError(
            f"model '{model.name}' has no language-model head",
            "use a causal model (smollm2, gemma3-270m)",
        )


def next_token_logprobs(
    model: Any, prompts: Sequence[str], *, chat: bool = False, batch_size: int = 16
) -> torch.Tensor:
    """Log-probabilities of the next token after each prompt: ``(n_prompts, vocab)``."""
    _require_causal(model)
    encoded = encode_prompts(model, as_prompts(prompts), chat=chat)
    rows = []
    with torch.inference_mode():
        for first in range(0, len(encoded), batch_size):
            padded = _pad_batch(encoded[first : first + batch_size], model, "last")
            logits = _forward(model, padded["inputs"])
            assert logits is not None
            rows.append(logits.float().log_softmax(-1).cpu())
    return torch.cat(rows)


def greedy_continuations(
    model: Any,
    prompts: Sequence[str],
    *,
    max_new_tokens: int = 8,
    chat: bool = False,
    batch_size: int = 16,
) -> list[str]:
    """Greedy (deterministic) continuations of each prompt, decoded."""
    _require_causal(model)
    encoded = encode_prompts(model, as_prompts(prompts), chat=chat)
    tokenizer = model.tokenizer
    pad_id = (
        tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    )
    texts: list[str] = []
    with torch.inference_mode():
        for first in range(0, len(encoded), batch_size):
            padded = _pad_batch(encoded[first : first + batch_size], model, "last")
            inputs = {k: v.to(model.device) for k, v in padded["inputs"].items()}
            inputs.pop("position_ids")  # generate() derives positions from the mask itself
            out = model.model.generate(
                **inputs,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                num_beams=1,
                pad_token_id=pad_id,
                temperature=None,
                top_p=None,
                top_k=None,
            )
            new = out[:, inputs["input_ids"].shape[1] :]
            texts.extend(tokenizer.decode(row, skip_special_tokens=True) for row in new)
    return texts

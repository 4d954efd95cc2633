"""Batched greedy continuations and next-token distributions for causal models.

Both use the tracer's encoding and left padding (with mask-derived positions),
so a prompt gives the same result alone or in a batch, steered or not.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
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


@contextlib.contextmanager
def _prefill_last_states(model: Any, store: list[list[torch.Tensor]]) -> Iterator[None]:
    """Record each prompt's last-token state at every site during the first (prefill)
    forward pass of one batch: ``store[time]`` gets one ``(batch, d)`` tensor.

    With left padding the last column is every prompt's last real token; the
    decoding steps that follow (one new column each) are ignored.
    """
    seen = [False] * (model.n_layers + 1)

    def keep(time: int, hidden: torch.Tensor) -> None:
        if not seen[time]:
            seen[time] = True
            store[time].append(hidden[:, -1].detach().to("cpu", torch.float32))

    def on_embed(_module, args, kwargs):
        keep(0, args[0] if args else kwargs["hidden_states"])

    def on_block(time: int):
        def hook(_module, _args, output):
            keep(time, output if isinstance(output, torch.Tensor) else output[0])

        return hook

    blocks = model.sites.blocks
    handles = [blocks[0].register_forward_pre_hook(on_embed, with_kwargs=True)]
    handles += [block.register_forward_hook(on_block(i + 1)) for i, block in enumerate(blocks)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def greedy_continuations(
    model: Any,
    prompts: Sequence[str],
    *,
    max_new_tokens: int = 8,
    chat: bool = False,
    batch_size: int = 16,
    states: list[list[torch.Tensor]] | None = None,
) -> list[str]:
    """Greedy (deterministic) continuations of each prompt, decoded.

    Args:
        states: if given, one empty list per time (``n_layers + 1``); it receives the
            prompts' last-token states from the prefill pass, so a caller that needs
            both the answers and the states pays for one forward pass, not two.
    """
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
            recorder = (
                _prefill_last_states(model, states)
                if states is not None
                else contextlib.nullcontext()
            )
            with recorder:
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

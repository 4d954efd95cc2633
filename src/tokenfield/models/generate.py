"""Greedy generation for causal models: the one call to Hugging Face ``generate``.

Used by the tracer (``trace --generate``: each prompt's ids extended by its
continuation, :func:`continue_greedily`) and by steering
(:func:`tokenfield.steering.generate.greedy_continuations`: the continuations
decoded). Batches use the tracer's left padding; ``generate`` derives positions
from the mask itself, so a prompt gives the same continuation alone or in a batch.
"""

from __future__ import annotations

from collections.abc import Sequence

from tokenfield.models.batching import Encoded, pad_batch
from tokenfield.models.load import LoadedModel

__all__ = ["continue_greedily", "greedy_generate", "pad_token_id"]


def pad_token_id(tokenizer: object) -> int:
    """The id that fills finished rows: the tokenizer's pad token, else its
    end-of-sequence token, else 0."""
    pad = getattr(tokenizer, "pad_token_id", None)
    if pad is not None:
        return int(pad)
    return int(getattr(tokenizer, "eos_token_id", None) or 0)


def greedy_generate(
    model: LoadedModel, batch: Sequence[Encoded], max_new_tokens: int
) -> list[list[int]]:
    """Greedy (deterministic) continuations of a batch: per prompt, the ``max_new_tokens``
    ids ``generate`` returns after it (a row that ended early is filled with the pad id)."""
    padded = pad_batch(batch, model, "last")
    inputs = {k: v.to(model.device) for k, v in padded["inputs"].items()}
    inputs.pop("position_ids")  # generate() derives positions from the mask itself
    out = model.model.generate(
        **inputs,
        max_new_tokens=max_new_tokens,
        min_new_tokens=0,
        do_sample=False,
        num_beams=1,
        pad_token_id=pad_token_id(model.tokenizer),
        temperature=None,
        top_p=None,
        top_k=None,
    )
    return out[:, inputs["input_ids"].shape[1] :].cpu().tolist()


def stop_ids(model: LoadedModel) -> set[int]:
    """The ids ``generate`` stops at: the generation config's end-of-sequence
    token(s), else the tokenizer's."""
    eos = model.model.generation_config.eos_token_id
    if eos is None:
        eos = model.tokenizer.eos_token_id
    return set(eos if isinstance(eos, (list, tuple)) else [] if eos is None else [eos])


def continue_greedily(
    model: LoadedModel, batch: Sequence[Encoded], n: int
) -> tuple[list[Encoded], list[tuple[int, bool]]]:
    """Greedy continuations: each prompt's ids extended by up to ``n`` generated ids.

    Returns the extended items and, per prompt, (how many ids were generated,
    whether the last is the end-of-sequence token: then it stopped early).
    """
    stops = stop_ids(model)
    extended, generated = [], []
    for item, row in zip(batch, greedy_generate(model, batch, n), strict=True):
        ids: list[int] = []
        stopped = False
        for token in row[:n]:
            ids.append(int(token))
            if int(token) in stops:
                stopped = True
                break
        extended.append(Encoded(item.prompt, [*item.ids, *ids]))
        generated.append((len(ids), stopped))
    return extended, generated

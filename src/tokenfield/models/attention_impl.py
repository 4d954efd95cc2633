"""Run a Hugging Face model with one of tokenfield's own attention functions.

Transformers looks attention up by name (``config._attn_implementation``) in its
``AttentionInterface``, and the mask builder in ``AttentionMaskInterface``.
:func:`attention_implementation` registers a function and its mask builder under
a name once, switches a model to it inside a ``with`` block and restores the
model's own implementation on exit, even on error. Used by the queries-and-keys
attention read-out (:mod:`tokenfield.models.attention_readout`), the cascade
attention of steered generation (:mod:`tokenfield.models.cascade`) and the last
token's layer map of the attractor measurements (:mod:`tokenfield.models.layer_map`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

_registered: set[str] = set()


@contextlib.contextmanager
def attention_implementation(
    hf_model: Any, name: str, attention: Callable[..., Any], mask: Callable[..., Any]
) -> Iterator[str]:
    """Run ``hf_model`` with ``attention`` (and the mask builder ``mask``),
    registered under ``name``, inside the block; yields the implementation it
    replaced."""
    if name not in _registered:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface

        AttentionInterface.register(name, attention)
        AttentionMaskInterface.register(name, mask)
        _registered.add(name)
    config = hf_model.config
    before = config._attn_implementation
    config._attn_implementation = name
    try:
        yield before
    finally:
        config._attn_implementation = before

"""Model surgery: a loaded model with parts swapped out, or a random-weight twin.

- :func:`mlps_swapped` / :func:`mlps_removed`: within a ``with`` block every
  block's MLP module is replaced (by zero: the attention-only flow), and put
  back on exit, even on error;
- :class:`MlpPutBack`: a replacement that calls the original MLP (the same
  swap path, which must then reproduce the plain forward pass);
- :func:`random_copy`: a seeded random-weight copy of a loaded model's
  architecture that keeps the real token embedding (so both start from the same
  layer-0 cloud).

Used by the attention-only flow (:mod:`tokenfield.pipelines.flow`). Loading a
random-weight model by name (``random_weights=True``) is
:func:`tokenfield.models.load.load_model`'s.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable
from typing import Any

import torch

from tokenfield.errors import UserError
from tokenfield.models.load import wrap_model

__all__ = ["MlpPutBack", "ZeroMlp", "mlp_owners", "mlps_removed", "mlps_swapped", "random_copy"]


def mlp_owners(model: Any) -> list[Any]:
    """Every block of ``model`` (a loaded model), each holding its ``mlp`` module.

    Raises:
        UserError: when a block has no ``mlp`` (an architecture the swap does not know).
    """
    blocks = model.sites.blocks
    owners = [block for block in blocks if hasattr(block, "mlp")]
    if len(owners) != len(blocks):
        raise UserError(
            f"model '{model.name}' has blocks without an 'mlp' module ({model.family.name} family)",
            "the attention-only flow supports llama-, gpt2- and gpt_neox-family models",
        )
    return owners


class ZeroMlp(torch.nn.Module):
    """An MLP that returns zero: the attention-only flow."""

    def forward(self, hidden, *args, **kwargs):  # noqa: D401
        return torch.zeros_like(hidden)


class MlpPutBack(torch.nn.Module):
    """Swapped in where the MLP was, calling it: the flow with the MLP put back
    goes through the same swap as the attention-only flow."""

    def __init__(self, mlp: torch.nn.Module):
        super().__init__()
        self.original = mlp

    def forward(self, hidden, *args, **kwargs):  # noqa: D401
        return self.original(hidden, *args, **kwargs)


@contextlib.contextmanager
def mlps_swapped(model: Any, replacement: Callable[[torch.nn.Module], torch.nn.Module]):
    """Within the block, every block's MLP module is ``replacement(mlp)`` (restored
    after, even on error)."""

    owners = mlp_owners(model)
    saved = [owner.mlp for owner in owners]
    try:
        for owner, mlp in zip(owners, saved, strict=True):
            owner._modules["mlp"] = replacement(mlp)
        yield
    finally:
        for owner, mlp in zip(owners, saved, strict=True):
            owner._modules["mlp"] = mlp


def mlps_removed(model: Any) -> contextlib.AbstractContextManager[None]:
    """Within the block, every block's MLP returns zero (restored after)."""
    return mlps_swapped(model, lambda _mlp: ZeroMlp())


def random_copy(model: Any, seed: int = 0) -> Any:
    """A random-weight copy of ``model``'s architecture (seeded) whose token
    embedding is the real one, so its layer-0 cloud is the real model's."""

    hf = model.model
    config = copy.deepcopy(hf.config)
    torch.manual_seed(seed)
    twin = type(hf)(config).to(dtype=next(hf.parameters()).dtype, device=model.device)
    wrapped = wrap_model(twin, model.tokenizer, f"{model.name} (random)", random_weights=True,
                         seed=seed)  # fmt: skip
    with torch.no_grad():
        wrapped.sites.embed_tokens.weight.copy_(model.sites.embed_tokens.weight)
    return wrapped

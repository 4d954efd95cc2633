"""Add ``alpha * v`` to the residual stream inside a context manager.

The hook is registered on entry and removed on exit, even when the body raises.
At ``layer`` 0 it is a pre-hook on block 0 (changing the embedding output that
block 0 reads); at ``layer`` l >= 1 a forward hook on block l-1 (changing its
output). Either way states at ``time < layer`` are untouched, and the tracer's
own hooks, registered later, read the steered values.

``positions="last"`` adds to the last column only: with tokenfield's left
padding that is every prompt's last real token, and during generation each new
token. ``positions="all"`` adds at every position.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Literal

import torch

from tokenfield.errors import UserError
from tokenfield.steering.vectors import SteeringVector

__all__ = ["steering"]


def _shift(hidden: torch.Tensor, delta: torch.Tensor, positions: str) -> torch.Tensor:
    delta = delta.to(device=hidden.device, dtype=hidden.dtype)
    if positions == "all":
        return hidden + delta
    shifted = hidden.clone()
    shifted[:, -1, :] = shifted[:, -1, :] + delta
    return shifted


@contextlib.contextmanager
def steering(
    model: Any,
    vector: SteeringVector,
    alpha: float,
    *,
    positions: Literal["last", "all"] = "last",
    check: bool = True,
) -> Iterator[None]:
    """Steer ``model`` (a :class:`~tokenfield.models.load.LoadedModel`) inside the block.

    Args:
        model: the loaded model.
        vector: the steering vector (its ``layer`` says where).
        alpha: the multiple of the vector to add; 0 leaves every output unchanged.
        positions: ``"last"`` or ``"all"``.
        check: refuse a vector made for another model (see
            :meth:`SteeringVector.check_model`); random controls pass ``check=False``
            only when their provenance is shared.

    Example:
        >>> with steering(model, vec, alpha=2.0):
        ...     ds = tokenfield.trace(model, prompts)
    """
    if positions not in ("last", "all"):
        raise UserError(f"unknown steering positions '{positions}'", "use 'last' or 'all'")
    if check:
        vector.check_model(model)
    delta = alpha * torch.from_numpy(vector.vector)
    blocks = model.sites.blocks
    if vector.layer == 0:

        def pre_hook(_module, args, kwargs):
            if args:
                return (_shift(args[0], delta, positions), *args[1:]), kwargs
            kwargs = {**kwargs, "hidden_states": _shift(kwargs["hidden_states"], delta, positions)}
            return args, kwargs

        handle = blocks[0].register_forward_pre_hook(pre_hook, with_kwargs=True)
    else:

        def hook(_module, _args, output):
            if isinstance(output, torch.Tensor):
                return _shift(output, delta, positions)
            return (_shift(output[0], delta, positions), *output[1:])

        handle = blocks[vector.layer - 1].register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()

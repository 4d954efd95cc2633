"""Add ``alpha * v`` to the residual stream inside a context manager.

The hook (:func:`tokenfield.models.hooks.hook`, order ``INTERVENE``) is
registered on entry and removed on exit, even when the body raises. It sits at
the site of run time ``layer`` (``embed`` for 0: the embedding output that block
0 reads; ``block.{l-1}`` for l >= 1: that block's output), so states at
``time < layer`` are untouched. Read-outs (the tracer's capture, the logit lens)
run after interventions at every site, so they read the steered values whether
they were registered before or after the steering.

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
from tokenfield.models.hooks import add_to_residual
from tokenfield.steering.vectors import SteeringVector

__all__ = ["steering"]


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

    Yields:
        Nothing; the model is steered until the block ends (also on error).

    Raises:
        UserError: unknown ``positions``, or (with ``check``) a vector made for
            another model.

    Example:
        >>> from tokenfield.steering import steering, steering_vector
        >>> model = tf.load_model("smollm2")                              # doctest: +SKIP
        >>> vec = steering_vector(tf.open_run("runs/spectrum"), source="Word Problems",
        ...                       target="Pure Math", layer=12)           # doctest: +SKIP
        >>> with steering(model, vec, alpha=2.0):                         # doctest: +SKIP
        ...     ds = tf.trace(model, "seed-spectrum")
    """
    if positions not in ("last", "all"):
        raise UserError(f"unknown steering positions '{positions}'", "use 'last' or 'all'")
    if check:
        vector.check_model(model)
    delta = alpha * torch.from_numpy(vector.vector)
    with add_to_residual(model, {vector.layer: delta}, positions=positions):
        yield

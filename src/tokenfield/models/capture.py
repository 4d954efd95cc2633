"""Read the residual stream with forward hooks, keeping only the asked-for positions.

The hooks exist only inside :func:`capture_residual` and are removed on exit, even
when the forward pass raises. They never change what the model computes (they
return ``None``), so logits are identical with and without tracing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from tokenfield.models.sites import ModelSites

__all__ = ["Capture", "capture_residual"]


@dataclass
class Capture:
    """Where to read and what was read.

    Set :attr:`index` before each forward pass: a ``(batch, seq)`` boolean mask of
    the positions to keep. Kept states are flattened in row-major order of the
    mask (batch first, then position) and copied to float32 on the CPU.

    After the pass, :attr:`states` holds one ``(particles, d)`` tensor per time
    (``embed`` first, then every block) and :attr:`final_norm` one for the final
    norm output (``None`` for models without a final norm).
    """

    index: torch.Tensor | None = None
    states: list[torch.Tensor | None] = field(default_factory=list)
    final_norm: torch.Tensor | None = None

    def reset(self, n_times: int, index: torch.Tensor) -> None:
        self.index = index
        self.states = [None] * n_times
        self.final_norm = None

    def take(self, hidden: torch.Tensor) -> torch.Tensor:
        assert self.index is not None, "set Capture.index before the forward pass"
        # hidden: (batch, seq, d); index: (batch, seq) bool -> (particles, d)
        return hidden[self.index.to(hidden.device)].detach().to("cpu", torch.float32)


def _hidden_of(output: object) -> torch.Tensor:
    """Blocks return a tensor (transformers 5) or a tuple whose first item it is."""
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    raise TypeError(f"cannot read hidden states from a block output of type {type(output)}")


@contextlib.contextmanager
def capture_residual(sites: ModelSites) -> Iterator[Capture]:
    """Hook ``embed`` (input of block 0), every block's output, and the final norm."""
    capture = Capture()
    handles = []

    def on_embed(_module, args, kwargs):
        hidden = args[0] if args else kwargs["hidden_states"]
        capture.states[0] = capture.take(hidden)

    def on_block(time: int):
        def hook(_module, _args, output):
            capture.states[time] = capture.take(_hidden_of(output))

        return hook

    def on_norm(_module, _args, output):
        capture.final_norm = capture.take(_hidden_of(output))

    try:
        handles.append(sites.blocks[0].register_forward_pre_hook(on_embed, with_kwargs=True))
        for i, block in enumerate(sites.blocks):
            handles.append(block.register_forward_hook(on_block(i + 1)))
        if sites.final_norm is not None:
            handles.append(sites.final_norm.register_forward_hook(on_norm))
        yield capture
    finally:
        for handle in handles:
            handle.remove()

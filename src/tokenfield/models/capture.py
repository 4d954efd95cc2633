"""Read the residual stream with forward hooks, keeping only the asked-for positions.

Also here: :func:`logit_lens`, which reads stored last-token states through the
final norm and the unembedding after the pass (no hooks).

The hooks (:mod:`tokenfield.models.hooks`, order ``READ``) exist only inside
:func:`capture_residual` and are removed on exit, even when the forward pass
raises. They never change what the model computes (they return ``None``), so
logits are identical with and without tracing; they run after any intervention
at the same site, so they see steered values.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import torch

from tokenfield.models.hooks import Order, hooks
from tokenfield.models.sites import ModelSites, site_names

__all__ = ["Capture", "LensReadout", "capture_residual", "logit_lens"]


@dataclass
class Capture:
    """Where to read and what was read.

    Set :attr:`index` before each forward pass (:meth:`reset`): a ``(batch, seq)``
    boolean mask of the positions to keep. Kept states are flattened in row-major
    order of the mask (batch first, then position) and copied to float32 on the CPU.

    After the pass and :meth:`ready`, :attr:`states` holds one ``(particles, d)``
    tensor per time (``embed`` first, then every block) and :attr:`final_norm`
    one for the final norm output (``None`` for models without a final norm).

    On a GPU nothing in the pass waits for the host: the kept rows are picked
    with precomputed indices (a boolean mask would make the host wait for the
    count of kept rows at every block) and copied into page-locked memory
    asynchronously; :meth:`ready` waits once, after the pass, for those copies.
    """

    index: torch.Tensor | None = None
    states: list[torch.Tensor | None] = field(default_factory=list)
    final_norm: torch.Tensor | None = None
    paused: bool = False
    _rows: dict[torch.device, torch.Tensor] = field(default_factory=dict)
    _pending: set[torch.device] = field(default_factory=set)

    @contextlib.contextmanager
    def pause(self) -> Iterator[None]:
        """Ignore the hooked modules while they are called for something else
        (the logit lens calls the final norm)."""
        self.paused = True
        try:
            yield
        finally:
            self.paused = False

    def reset(self, n_times: int, index: torch.Tensor) -> None:
        self.index = index
        self.states = [None] * n_times
        self.final_norm = None
        self._rows = {}

    def _rows_on(self, device: torch.device) -> torch.Tensor:
        """The flat row numbers of the kept positions, on ``device`` (made once per
        pass and device; the mask lives on the CPU, so no GPU is waited for)."""
        rows = self._rows.get(device)
        if rows is None:
            assert self.index is not None, "set Capture.index before the forward pass"
            flat = self.index.reshape(-1).nonzero().squeeze(1)
            rows = self._rows[device] = flat.to(device, non_blocking=True)
        return rows

    def take(self, hidden: torch.Tensor) -> torch.Tensor:
        # hidden: (batch, seq, d); index: (batch, seq) bool -> (particles, d)
        picked = hidden.detach().reshape(-1, hidden.shape[-1])
        picked = picked.index_select(0, self._rows_on(hidden.device)).to(torch.float32)
        if picked.device.type != "cuda":
            return picked.to("cpu")
        kept = torch.empty(picked.shape, dtype=torch.float32, pin_memory=True)
        kept.copy_(picked, non_blocking=True)
        self._pending.add(picked.device)
        return kept

    def ready(self) -> None:
        """Wait for the copies of this pass to reach the host (GPU only)."""
        for device in self._pending:
            torch.cuda.current_stream(device).synchronize()
        self._pending.clear()


@contextlib.contextmanager
def capture_residual(sites: ModelSites) -> Iterator[Capture]:
    """Read ``embed``, every block's output and the final norm
    (:func:`tokenfield.models.hooks.hooks`, as read-outs: they see steered values)."""
    capture = Capture()

    def keep(time: int):
        def read(hidden: torch.Tensor) -> None:
            if not capture.paused:
                capture.states[time] = capture.take(hidden)

        return read

    def on_norm(hidden: torch.Tensor) -> None:
        if not capture.paused:
            capture.final_norm = capture.take(hidden)

    pairs = [(site, keep(time)) for time, site in enumerate(site_names(sites.n_blocks))]
    if sites.final_norm is not None:
        pairs.append(("final_norm", on_norm))
    with hooks(sites, pairs, order=Order.READ):
        yield capture


@dataclass(frozen=True)
class LensReadout:
    """The logit lens of some last-token states at every time.

    Attributes:
        top_ids: ``(time, n, k)`` the ``k`` most likely next tokens at each time.
        top_probs: ``(time, n, k)`` their probabilities.
        rank: ``(time, n)`` the rank of ``target`` (1 = top) at each time.
    """

    top_ids: np.ndarray
    top_probs: np.ndarray
    rank: np.ndarray


def logit_lens(
    sites: ModelSites,
    unembed: torch.nn.Module,
    states: torch.Tensor,
    target: torch.Tensor,
    k: int,
) -> LensReadout:
    """Read states through the final norm and the unembedding (the logit lens).

    ``logits_t = W_U norm(h_t)`` for every time ``t``; at the last block this is
    the model's own output (up to a monotone soft cap, which changes no rank).

    Args:
        sites: the model's sites (for the final norm; none: identity).
        unembed: the output embedding (``model.get_output_embeddings()``).
        states: ``(time, n, d)`` raw residual states.
        target: ``(n,)`` token ids whose rank is reported (the model's final
            prediction).
        k: how many top tokens to keep.
    """
    param = next(unembed.parameters())
    times, n, _ = states.shape
    top_ids = np.zeros((times, n, k), dtype=np.int64)
    top_probs = np.zeros((times, n, k), dtype=np.float32)
    rank = np.zeros((times, n), dtype=np.int64)
    target = target.to(param.device)
    vocab = int(getattr(unembed, "out_features", 0) or 0) or 1
    # Several times per product: the unembedding is read once per chunk, not once per
    # time (it is the bulk of the cost), with at most ~64 MB of logits at once.
    per_chunk = max(1, min(times, (16_000_000 // vocab) // max(n, 1)))
    for start in range(0, times, per_chunk):
        stop = min(times, start + per_chunk)
        hidden = states[start:stop].reshape((stop - start) * n, -1).to(param.device, param.dtype)
        if sites.final_norm is not None:
            hidden = sites.final_norm(hidden)
        logits = unembed(hidden).float()  # (chunk * n, vocab); dropped after this chunk
        probs, ids = logits.softmax(-1).topk(k, dim=-1)
        chosen = logits.gather(1, target.repeat(stop - start)[:, None])
        top_ids[start:stop] = ids.reshape(stop - start, n, k).cpu().numpy()
        top_probs[start:stop] = probs.reshape(stop - start, n, k).cpu().numpy()
        rank[start:stop] = (1 + (logits > chosen).sum(-1)).reshape(stop - start, n).cpu().numpy()
    return LensReadout(top_ids, top_probs, rank)

"""The logit lens of a traced run, summarised by layer.

A run traced with ``logit_lens=True`` stores, for every prompt's last token
and every time ``t``, the top tokens of ``W_U norm(h_t)`` (``lens_top``) and the
rank of the model's final prediction among them (``lens_rank``, 1 = top).
:func:`logit_lens_summary` turns that into curves: the median rank by layer,
the fraction of prompts whose final answer is already the top token, and for
each prompt the layer from which it stays on top (the "decision layer").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import xarray as xr

from tokenfield.errors import UserError

__all__ = ["LogitLens", "logit_lens_summary"]


@dataclass(frozen=True)
class LogitLens:
    """Logit-lens curves.

    Attributes:
        time: ``(T,)`` layer index.
        ranks: ``(T, prompts)`` rank of the final prediction (1 = top).
        top: ``(T, prompts)`` the top token at each layer.
        target: ``(prompts,)`` the final prediction.
        decision_layer: ``(prompts,)`` the first time from which the rank stays 1.
    """

    time: np.ndarray
    ranks: np.ndarray
    top: np.ndarray
    target: np.ndarray
    decision_layer: np.ndarray

    @property
    def median_rank(self) -> np.ndarray:
        return np.median(self.ranks, axis=1)

    @property
    def top1(self) -> np.ndarray:
        """``(T,)`` fraction of prompts whose final prediction is the top token."""
        return (self.ranks == 1).mean(axis=1)

    def to_dict(self) -> dict[str, Any]:
        return {
            "time": self.time.tolist(),
            "median_rank": self.median_rank.tolist(),
            "top1": self.top1.tolist(),
            "mean_log10_rank": np.log10(self.ranks).mean(axis=1).tolist(),
            "decision_layer": self.decision_layer.tolist(),
            "target": [str(t) for t in self.target],
            "top": [[str(w) for w in row] for row in self.top.T],  # per prompt, per time
        }


def logit_lens_summary(ds: xr.Dataset) -> LogitLens:
    """Summarise ``lens_rank`` / ``lens_top`` of a run traced with ``logit_lens=True``.

    Args:
        ds: the run's Dataset.

    Returns:
        A ``LogitLens``: per layer and prompt the rank of the final prediction,
        the top token, and each prompt's ``decision_layer``.

    Raises:
        UserError: the run has no logit lens.

    Example:
        >>> ds = tf.trace("smollm2", "seed-categories", logit_lens=True)  # doctest: +SKIP
        >>> tf.logit_lens_summary(ds).decision_layer                      # doctest: +SKIP
    """
    if "lens_rank" not in ds:
        raise UserError(
            "this run has no logit lens", "trace it again with --logit-lens (causal models)"
        )
    last = np.asarray(ds["is_last"].values, dtype=bool)
    ranks = np.asarray(ds["lens_rank"].transpose("time", "particle").values)[:, last]
    top = np.asarray(ds["lens_top"].transpose("time", "particle", "lens_k").values)[:, last, 0]
    target = np.asarray(ds["lens_target"].values)[last]
    times = ranks.shape[0]
    decision = np.full(ranks.shape[1], times - 1, dtype=np.int64)
    for prompt in range(ranks.shape[1]):
        not_top = np.flatnonzero(ranks[:, prompt] != 1)
        decision[prompt] = 0 if not_top.size == 0 else min(int(not_top[-1]) + 1, times - 1)
    return LogitLens(np.asarray(ds["time"].values), ranks, top, target, decision)

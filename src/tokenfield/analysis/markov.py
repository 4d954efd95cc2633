"""Attention matrices read as Markov chains (seed 003), on a traced run.

The per-matrix reduction (entropy, sink mass, the symmetrised chain's
``|lambda_2|`` and stationary distribution; the causal problem and what
tokenfield does about it) is :mod:`tokenfield.models.markov`, next to the tracer
that calls it on each prompt; it is re-exported here. This module reads the
``attn_*`` variables of a run traced with ``attention=True``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tokenfield.errors import UserError
from tokenfield.models import markov as _reduction
from tokenfield.models.markov import *  # noqa: F403  (the per-matrix reduction, re-exported)
from tokenfield.models.markov import PER_HEAD

__all__ = [*_reduction.__all__, "AttentionByLayer", "attention_by_layer"]


@dataclass(frozen=True)
class AttentionByLayer:
    """A traced run's attention statistics, averaged over prompts.

    Attributes:
        block: ``(L,)`` block index (block ``l`` acts between time ``l`` and ``l + 1``).
        values: statistic -> ``(L, heads)`` mean over prompts (NaN-aware), for
            ``entropy``, ``sink_mass``, ``lambda2``, ``lambda2_nosink``,
            ``raw_lambda2``, ``gap``, ``gap_nosink``.
        top_tokens: per prompt, per block, the token with the largest
            head-averaged sink-free stationary mass (``positions="all"`` runs;
            empty otherwise).
        prompts: number of prompts averaged.
    """

    block: np.ndarray
    values: dict[str, np.ndarray]
    top_tokens: list[list[str]]
    prompts: int

    def head_mean(self, name: str) -> np.ndarray:
        return np.nanmean(self.values[name], axis=1)

    def to_dict(self) -> dict[str, object]:
        return {
            "block": self.block.tolist(),
            "prompts": self.prompts,
            "per_head": {k: v.tolist() for k, v in self.values.items()},
            "head_mean": {k: self.head_mean(k).tolist() for k in self.values},
            "top_tokens": self.top_tokens,
        }


def attention_by_layer(ds) -> AttentionByLayer:
    """Read the ``attn_*`` variables of a run traced with ``attention=True``.

    Args:
        ds (xarray.Dataset): the run's Dataset (:func:`tokenfield.open_run` or
            :func:`tokenfield.trace`).

    Returns:
        An ``AttentionByLayer``: each statistic's ``(L, heads)`` mean over prompts.

    Raises:
        UserError: the run has no attention statistics.

    Example:
        >>> ds = tf.trace("smollm2", "seed-categories", attention=True)  # doctest: +SKIP
        >>> tf.attention_by_layer(ds).values["sink_mass"].shape          # doctest: +SKIP
        (30, 9)
    """
    if "attn_lambda2" not in ds:
        raise UserError(
            "this run has no attention statistics",
            "trace it again with --attention (tokenfield trace --attention ...)",
        )
    last = np.asarray(ds["is_last"].values, dtype=bool)
    values = {}
    for name in PER_HEAD:
        per_prompt = np.asarray(ds[f"attn_{name}"].transpose("particle", "block", "head").values)
        values[name] = np.nanmean(per_prompt[last], axis=0)  # (L, heads)
    lam = np.asarray(ds["attn_lambda2"].transpose("particle", "block", "head").values)[last]
    lam_ns = np.asarray(ds["attn_lambda2_nosink"].transpose("particle", "block", "head").values)
    values["gap"] = np.nanmean(1.0 - lam, axis=0)
    values["gap_nosink"] = np.nanmean(1.0 - lam_ns[last], axis=0)
    top_tokens: list[list[str]] = []
    if int(last.sum()) < last.size:  # every token is there: rank them
        pi = np.asarray(ds["attn_stationary_nosink"].transpose("particle", "block", "head").values)
        pi = np.where(np.isnan(pi), 0.0, pi).mean(axis=2)  # (particle, L); token 0 -> 0
        index = np.asarray(ds["prompt_index"].values)
        tokens = np.asarray(ds["token"].values)
        for p in np.unique(index):
            rows = np.flatnonzero(index == p)
            best = pi[rows].argmax(axis=0)  # (L,)
            top_tokens.append([str(tokens[rows[b]]) for b in best])
    return AttentionByLayer(np.asarray(ds["block"].values), values, top_tokens, int(last.sum()))

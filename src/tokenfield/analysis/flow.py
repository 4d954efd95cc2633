"""The attention-only flow of a real model.

Do a real transformer's tokens follow the self-attention flow? Start from the
model's own layer-0 token cloud of each prompt (the ``embed`` site of a trace)
and apply, layer by layer:

- ``full``: the full block (attention and MLP): this is the trace itself;
- ``attention``: the block's attention sub-layer only: every block's MLP is
  replaced by zero, the residual connection and the model's own norms kept
  (Llama: ``x + attn(norm(x))``; Gemma 3: ``x + norm'(attn(norm(x)))``; the
  post-MLP norm of zero is zero);
- ``identity``: the identity-matrix step of the theory,
  ``y <- N(y + h_l f(y; beta_l))`` with ``f`` the SA field with ``Q = K = V = I``
  (causal when the model is) and ``(beta_l, h_l)`` the per-layer effective beta
  fitted to the real trace (:mod:`tokenfield.analysis.effective_beta`);
- ``random_attention``: a random-weight copy of the architecture (seeded), its
  MLPs removed the same way, fed the real model's layer-0 cloud (its token
  embedding is the real one).

Per layer and variant, averaged over prompts: the number of clusters (tokens
linked at ``cos >= 1 - eps``, :func:`tokenfield.cluster_count`), the mean
pairwise cosine, the rank of the Gram matrix at ``cos >= 0.999`` (the rank of
the 0/1 matrix ``[cos(x_i, x_j) >= 0.999]``: the number of distinct directions
once tokens closer than that are identified), and the distance to the real
trajectory (the mean angle, radians, between each token and the same token of
the trace at the same layer).

The flows are run through :func:`tokenfield.trace` itself (with the MLPs
swapped out), so the positions, masks and padding are those of the real trace;
with the MLPs kept the flow is the trace (tested on tiny models).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import xarray as xr

from tokenfield.analysis.clusters import cluster_count
from tokenfield.analysis.effective_beta import attention_field, effective_beta
from tokenfield.runs import FLOW_HTML, FLOW_JSON

__all__ = [
    "AttentionFlow",
    "FLOW_FIGURE",
    "FLOW_HTML",
    "FLOW_JSON",
    "GRAM_COS",
    "VARIANTS",
    "flow_measures",
    "identity_flow",
]


VARIANTS = ("full", "attention", "identity", "random_attention")
GRAM_COS = 0.999


def identity_flow(real: xr.Dataset, causal: bool) -> xr.Dataset:
    """The ``identity`` variant: each layer-0 cloud of ``real`` (a trace with
    ``positions="all"``) stepped by the Q = K = V = I field with that layer's fitted
    ``(beta_l, h_l)``; a Dataset shaped like ``real``."""

    fits = effective_beta(real, causal=causal)
    betas, steps = fits.column("beta"), fits.column("step")
    states = real["states"].transpose("time", "particle", "feature").values.astype(np.float64)
    out = np.empty_like(states)
    groups = real["prompt_index"].values
    positions = real["position"].values if "position" in real.coords else None
    for prompt in np.unique(groups):
        index = np.flatnonzero(groups == prompt)
        if positions is not None:
            index = index[np.argsort(positions[index], kind="stable")]
        y = states[0, index]
        y = y / np.linalg.norm(y, axis=1, keepdims=True)
        out[0, index] = y
        for layer in range(states.shape[0] - 1):
            beta, h = betas[layer], steps[layer]
            if math.isfinite(beta) and h > 0:
                y = y + h * attention_field(y, beta, causal=causal)
                y = y / np.linalg.norm(y, axis=1, keepdims=True)
            out[layer + 1, index] = y
    flow = real.copy()
    flow["states"] = (("time", "particle", "feature"), out.astype(np.float32))
    return flow


def _unit(x: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(x, axis=-1, keepdims=True)
    return x / np.where(norms > 0, norms, 1.0)


@dataclass(frozen=True)
class AttentionFlow:
    """Per-layer measures of each flow, averaged over prompts.

    Attributes:
        time: ``(T,)`` layer index (0 = the layer-0 cloud).
        variants: the flows (rows of every array).
        clusters, mean_cosine, gram_rank, distance: ``(V, T)``.
        eps: the cluster threshold; model: the model's name.
    """

    time: np.ndarray
    variants: tuple[str, ...]
    clusters: np.ndarray
    mean_cosine: np.ndarray
    gram_rank: np.ndarray
    distance: np.ndarray
    eps: float
    model: str
    tokens: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "eps": self.eps,
            "gram_cos": GRAM_COS,
            "mean_tokens_per_prompt": self.tokens,
            "time": self.time.tolist(),
            "variants": {
                v: {
                    "clusters": self.clusters[i].tolist(),
                    "mean_cosine": self.mean_cosine[i].tolist(),
                    "gram_rank": self.gram_rank[i].tolist(),
                    "distance": self.distance[i].tolist(),
                }
                for i, v in enumerate(self.variants)
            },
        }

    def rows(self, layers: Any = None) -> list[list[Any]]:
        """``[layer, variant, clusters, mean cos, rank, distance]`` rows."""
        picks = range(self.time.size) if layers is None else layers
        return [
            [
                int(self.time[t]),
                v,
                float(self.clusters[i, t]),
                float(self.mean_cosine[i, t]),
                float(self.gram_rank[i, t]),
                float(self.distance[i, t]),
            ]  # fmt: skip
            for t in picks
            for i, v in enumerate(self.variants)
        ]


def flow_measures(
    states: np.ndarray, real: np.ndarray, groups: np.ndarray, eps: float
) -> tuple[np.ndarray, ...]:
    """Per time, averaged over prompts (``groups``): the cluster count, the mean
    pairwise cosine, the Gram rank at ``GRAM_COS`` and the mean angle to ``real``
    (``states`` and ``real``: ``(time, particle, feature)``)."""
    prompts = np.unique(groups)
    shape = (prompts.size, states.shape[0])
    clusters, cosine, rank, distance = (np.empty(shape) for _ in range(4))
    for p, prompt in enumerate(prompts):
        index = np.flatnonzero(groups == prompt)
        x, r = _unit(states[:, index]), _unit(real[:, index])
        for t in range(states.shape[0]):
            gram = x[t] @ x[t].T
            n = index.size
            clusters[p, t] = cluster_count(x[t], eps)
            cosine[p, t] = (gram.sum() - n) / max(1, n * (n - 1))
            rank[p, t] = np.linalg.matrix_rank((gram >= GRAM_COS).astype(np.float64))
            distance[p, t] = np.arccos(np.clip((x[t] * r[t]).sum(-1), -1, 1)).mean()
    return clusters.mean(0), cosine.mean(0), rank.mean(0), distance.mean(0)


FLOW_FIGURE = "theory_flow.png"

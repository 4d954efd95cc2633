"""The closed loop of ``tokenfield steer``: trace the source category's prompts with
and without the steering vector (and a random control), and measure where they go
in the reference run's frame (:mod:`tokenfield.steering.closed_loop` for the pure
measures).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import xarray as xr

from tokenfield._progress import ProgressBar
from tokenfield.analysis.projection import fit_projection, project
from tokenfield.pipelines.trace import trace
from tokenfield.steering.closed_loop import _top5, category_centroids, progress_toward
from tokenfield.steering.generate import greedy_continuations, next_token_logprobs
from tokenfield.steering.hooks import steering
from tokenfield.steering.vectors import SteeringVector, random_control

__all__ = ["closed_loop"]


def closed_loop(
    model: Any,
    ds: xr.Dataset,
    vector: SteeringVector,
    alphas: Sequence[float],
    *,
    positions: str = "last",
    control_seed: int = 0,
    max_new_tokens: int = 12,
    frame: Any = None,
    progress: bool = False,
) -> dict[str, Any]:
    """Steer the source category's prompts of run ``ds`` and measure the effect.

    Returns JSON-able data: one row per (condition, alpha) plus the projected
    paths (``paths``: condition -> alpha -> (time, prompt, 2) list) and the
    reference run's projected last-token paths for drawing.
    """
    config = ds.attrs.get("run", {}).get("config", {})
    chat = bool(config.get("chat", False))
    source, target = vector.provenance["from"], vector.provenance["to"]
    last = ds.isel(particle=np.asarray(ds["is_last"].values, bool))
    picked = np.array([str(c) == source for c in last["category"].values])
    texts = [str(t) for t in last["prompt"].values[picked]]
    target_centroid = category_centroids(ds, target)
    frame = frame or fit_projection(last, n_components=2)

    def measure(alpha: float, direction: SteeringVector | None) -> dict[str, Any]:
        def run() -> tuple[xr.Dataset, torch.Tensor, list[str]]:
            traced = trace(model, texts, chat=chat)
            logp = next_token_logprobs(model, texts, chat=chat)
            conts = greedy_continuations(model, texts, max_new_tokens=max_new_tokens, chat=chat)
            return traced, logp, conts

        if direction is None:
            return dict(zip(("ds", "logp", "text"), run(), strict=True))
        with steering(model, direction, alpha, positions=positions, check=False):
            return dict(zip(("ds", "logp", "text"), run(), strict=True))

    vector.check_model(model)
    base = measure(0.0, None)
    base_states = np.asarray(base["ds"]["states"].values, dtype=np.float64)
    control = random_control(vector, control_seed)
    rows: list[dict[str, Any]] = []
    paths: dict[str, dict[str, Any]] = {"steer": {}, "control": {}}
    base_pcs = project(base["ds"], frame).values[..., :2]
    conditions = [("steer", vector), ("control", control)]
    total = len(conditions) * len(alphas)
    bar = ProgressBar("steering", total, enabled=progress, unit="conditions")
    with bar:
        for name, direction in conditions:
            for alpha in alphas:
                got = measure(float(alpha), direction)
                states = np.asarray(got["ds"]["states"].values, dtype=np.float64)
                moved = progress_toward(states, base_states, target_centroid)
                kl = (base["logp"].exp() * (base["logp"] - got["logp"])).sum(-1)  # (prompt,)
                top1_changed = (got["logp"].argmax(-1) != base["logp"].argmax(-1)).float()
                rows.append(
                    {
                        "condition": name,
                        "alpha": float(alpha),
                        "layer": vector.layer,
                        "vector_norm": direction.norm,
                        "progress_at_layer": float(moved[vector.layer]),
                        "progress_final": float(moved[-1]),
                        "progress_by_time": moved.tolist(),
                        "kl_mean": float(kl.mean()),
                        "top1_changed": float(top1_changed.mean()),
                        "top5": _top5(model, got["logp"]),
                        "continuations": got["text"],
                    }
                )
                paths[name][str(float(alpha))] = project(got["ds"], frame).values[..., :2].tolist()
                bar.advance()
    reference = project(last, frame).values[..., :2]
    return {
        "source": source,
        "target": target,
        "layer": vector.layer,
        "positions": positions,
        "prompts": texts,
        "unsteered": {
            "top5": _top5(model, base["logp"]),
            "continuations": base["text"],
            "paths": base_pcs.tolist(),
        },
        "rows": rows,
        "paths": paths,
        "reference": {
            "paths": reference.tolist(),
            "category": [str(c) for c in last["category"].values],
            "label": [str(c) for c in last["label"].values] if "label" in last else [],
        },
        "explained_variance_ratio": np.asarray(frame.explained_variance_ratio).tolist()[:2],
    }

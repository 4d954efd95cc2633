"""The closed loop: steer a category's prompts, trace them, and measure the effect.

For each alpha, and for a random control direction of the same norm:

- the steered prompts' trajectories, projected into the reference run's frozen
  PCA frame (the frame saved by ``tokenfield analyze`` when there is one, else
  fitted on the run's last-token states here);
- progress toward the target region: at each time t >= layer,
  ``1 - d_steered(t) / d_unsteered(t)``, where d is the mean distance of the
  prompts' last-token states to the target category's centroid at t
  (0 = no movement toward the target, 1 = onto the centroid; negative = away);
- the change of the next-token distribution: KL(unsteered || steered) in nats,
  the fraction of prompts whose top-1 token changed, the top-5 tokens;
- the greedy continuation.
"""

from __future__ import annotations

import numpy as np
import xarray as xr

__all__ = ["category_centroids", "progress_toward"]


def category_centroids(ds: xr.Dataset, category: str) -> np.ndarray:
    """Mean last-token state of a category at every time: ``(time, feature)``."""
    last = ds.isel(particle=np.asarray(ds["is_last"].values, bool))
    picked = np.array([str(c) == category for c in last["category"].values])
    return np.asarray(last["states"].values, dtype=np.float64)[:, picked].mean(axis=1)


def progress_toward(steered: np.ndarray, unsteered: np.ndarray, target: np.ndarray) -> np.ndarray:
    """``1 - d(steered, target) / d(unsteered, target)`` per time.

    Args:
        steered, unsteered: ``(time, prompt, feature)`` last-token states.
        target: ``(time, feature)`` centroid.
    Returns:
        ``(time,)``: 0 where nothing moved, 1 where the prompts sit on the centroid.
    """
    d_steered = np.linalg.norm(steered - target[:, None, :], axis=-1).mean(axis=1)
    d_unsteered = np.linalg.norm(unsteered - target[:, None, :], axis=-1).mean(axis=1)
    return 1.0 - d_steered / np.where(d_unsteered > 0, d_unsteered, 1.0)

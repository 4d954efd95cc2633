"""Aligning one model's states onto another's, layer by layer (orthogonal Procrustes).

Two models traced on the same prompts live in different bases (and often in
spaces of different width). To draw one in the other's PCA frame, each time
step of the source is rotated onto the target over the prompts both share:

    R_t = argmin_{R orthogonal} || A_t R - B_t ||_F = U V^T,   U S V^T = svd(A_t^T B_t)

where the rows of ``A_t`` and ``B_t`` are the two runs' states of the same
prompts at time ``t`` (``scipy.linalg.orthogonal_procrustes``). ``R`` ranges over
the whole orthogonal group, reflections included (det -1): a model's basis has no
preferred handedness. The narrower of the two is padded with zeros to the wider
width before the fit; the rotated source is cut back to the target's width.

Runs of different depth are matched by relative depth (:func:`match_times`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


def unit_rows(x: np.ndarray) -> np.ndarray:
    """``x / |x|`` along the last axis; a zero row stays zero."""
    norms = np.linalg.norm(x, axis=-1, keepdims=True)
    return x / np.where(norms > 0, norms, 1.0)


def pad_features(x: np.ndarray, width: int) -> np.ndarray:
    """Zero-pad the feature (last) axis to ``width``."""
    if x.shape[-1] == width:
        return x
    pad = np.zeros((*x.shape[:-1], width - x.shape[-1]))
    return np.concatenate([x, pad], axis=-1)


def match_times(n_target: int, n_source: int) -> np.ndarray:
    """For each of the target's ``n_target`` time steps, the source's step at the
    same relative depth (the nearest one): ``round(i (n_source - 1) / (n_target - 1))``.
    Equal depths match one to one."""
    if n_source == n_target or n_target < 2:
        return np.minimum(np.arange(n_target), n_source - 1)
    return np.floor(np.arange(n_target) * (n_source - 1) / (n_target - 1) + 0.5).astype(int)


def shared_rows(source: Sequence[object], target: Sequence[object]) -> list[tuple[int, int]]:
    """``(source index, target index)`` of the keys (e.g. prompt texts) both hold,
    in the source's order (a key repeated in the target: its last occurrence)."""
    where = {str(key): i for i, key in enumerate(target)}
    return [(i, where[str(key)]) for i, key in enumerate(source) if str(key) in where]


@dataclass(frozen=True)
class Alignment:
    """One orthogonal map per time step from a source run's space to a target's.

    Attributes:
        rotations: (time, width, width), ``width = max(d_source, d_target)``.
        d_target: the target's width (the rotated states are cut back to it).
        sphere: states are normalised to unit norm before they are rotated.
    """

    rotations: np.ndarray
    d_target: int
    sphere: bool = False

    def apply(self, x: np.ndarray) -> np.ndarray:
        """(time, n, d_source) -> (time, n, d_target): ``pad(x_t) R_t``, cut to the target."""
        width = self.rotations.shape[-1]
        if self.sphere:
            x = unit_rows(x)
        return np.stack(
            [
                (pad_features(x[t], width) @ self.rotations[t])[:, : self.d_target]
                for t in range(len(self.rotations))
            ]
        )


def fit_alignment(source: np.ndarray, target: np.ndarray, *, sphere: bool = False) -> Alignment:
    """The orthogonal map per time step that best sends ``source`` onto ``target``.

    Args:
        source: (time, n, d_source): the run to move; row ``i`` is the same prompt
            as the target's row ``i`` (see :func:`shared_rows`).
        target: (time, n, d_target): the run it is drawn with.
        sphere: fit (and later apply) on unit-normalised states.

    Returns:
        An :class:`Alignment` whose ``apply(source)`` is the least-squares
        orthogonal fit to ``target`` at each time step.
    """
    from scipy.linalg import orthogonal_procrustes

    source = np.asarray(source, dtype=np.float64)
    target = np.asarray(target, dtype=np.float64)
    if source.shape[:2] != target.shape[:2]:
        raise ValueError(
            f"source {source.shape[:2]} and target {target.shape[:2]} need the same "
            "(time, n): pair the rows first"
        )
    width = max(source.shape[-1], target.shape[-1])
    if sphere:
        source, target = unit_rows(source), unit_rows(target)
    rotations = [
        orthogonal_procrustes(pad_features(source[t], width), pad_features(target[t], width))[0]
        for t in range(source.shape[0])
    ]
    return Alignment(
        rotations=np.stack(rotations) if rotations else np.zeros((0, width, width)),
        d_target=int(target.shape[-1]),
        sphere=sphere,
    )

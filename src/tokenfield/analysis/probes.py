"""Linear probes by layer: the attractor reading of a linear head (seed 003).

Seed 003 argues that a linear classification head works because the class is
an attractor: the (time-averaged, "context-pooled") state of a prompt of class
``c`` ends up near the class's basis vector. If so, the prompt's category
should become linearly decodable with depth. Per time, a multinomial logistic
regression is cross-validated on

- ``last``: the last token's state, and
- ``pooled``: the mean over the prompt's tokens (needs ``positions="all"``),

each against a permutation null (the same cross-validation with the labels
shuffled).

Features: each state is put on the unit sphere, then standardised (per
feature, over all prompts: label-free), then rotated onto the span of the
samples (an orthonormal basis from the SVD). The last step changes nothing
for an L2-penalised linear model (the optimal weight lies in the span of the
training samples, and an orthonormal change of basis keeps the penalty), and
makes each fit cost ``O(n^2)`` instead of ``O(n d)``.

Cross-validation: stratified ``k``-fold (shuffled, seeded) when every class has
at least ``k`` members, otherwise leave-one-out.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import xarray as xr

from tokenfield.analysis.nulls import claim_status, max_null_pvalues
from tokenfield.errors import UserError

__all__ = ["ProbeCurve", "pooled_features", "last_token_features", "probe_accuracy"]


@dataclass(frozen=True)
class ProbeCurve:
    """Cross-validated probe accuracy per time.

    Attributes:
        time: ``(T,)``.
        accuracy: ``(T,)`` cross-validated accuracy.
        null_mean: ``(T,)`` mean accuracy with shuffled labels.
        null_high: ``(T,)`` its 95th percentile.
        p_value: ``(T,)`` ``(1 + #{null >= accuracy}) / (1 + permutations)``.
        p_corrected: ``(T,)`` the same against each shuffle's best accuracy over
            all times: the p-value of a probe layer chosen as the best one
            (:func:`tokenfield.analysis.nulls.max_null_pvalues`).
        chance: the majority-class rate.
        cv: ``"5-fold"`` or ``"leave-one-out"``.
        permutations: shuffles in the null.
    """

    time: np.ndarray
    accuracy: np.ndarray
    null_mean: np.ndarray
    null_high: np.ndarray
    p_value: np.ndarray
    p_corrected: np.ndarray
    chance: float
    cv: str
    permutations: int

    def best(self) -> dict[str, Any]:
        """The time with the best accuracy, its accuracy and both p-values, and
        whether "the category is decodable" holds on the corrected p-value."""
        if not np.isfinite(self.accuracy).any():
            return {"time": None, "accuracy": None, "p": None, "p_corrected": None,
                    "claim": "not supported"}  # fmt: skip
        i = int(np.nanargmax(self.accuracy))
        return {
            "time": self.time[i].item(),
            "accuracy": float(self.accuracy[i]),
            "p": float(self.p_value[i]),
            "p_corrected": float(self.p_corrected[i]),
            "claim": claim_status(float(self.p_corrected[i])),
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "time": self.time.tolist(),
            "accuracy": self.accuracy.tolist(),
            "null_mean": self.null_mean.tolist(),
            "null_high": self.null_high.tolist(),
            "p_value": self.p_value.tolist(),
            "p_corrected": self.p_corrected.tolist(),
            "best": self.best(),
            "chance": self.chance,
            "cv": self.cv,
            "permutations": self.permutations,
        }


def _prepare(x: np.ndarray) -> np.ndarray:
    """Sphere, standardise, rotate onto the sample span: ``(n, d) -> (n, r)``."""
    x = np.asarray(x, dtype=np.float64)
    x = x / np.where((norms := np.linalg.norm(x, axis=1, keepdims=True)) > 0, norms, 1.0)
    scale = x.std(axis=0)
    x = (x - x.mean(axis=0)) / np.where(scale > 1e-12, scale, 1.0)
    u, s, _ = np.linalg.svd(x, full_matrices=False)
    keep = s > s[0] * 1e-10 if s.size and s[0] > 0 else np.zeros(0, dtype=bool)
    return u[:, keep] * s[keep]  # = x V: the coordinates in the span


def _folds(
    labels: np.ndarray, folds: int, seed: int
) -> tuple[list[tuple[np.ndarray, np.ndarray]], str]:
    from sklearn.model_selection import LeaveOneOut, StratifiedKFold

    _, counts = np.unique(labels, return_counts=True)
    if counts.min() >= folds:
        splitter = StratifiedKFold(folds, shuffle=True, random_state=seed)
        return list(splitter.split(labels, labels)), f"{folds}-fold"
    return list(LeaveOneOut().split(labels)), "leave-one-out"


def _cv_accuracy(x: np.ndarray, labels: np.ndarray, splits, c: float) -> float:
    from sklearn.linear_model import LogisticRegression

    correct = 0
    for train, test in splits:
        if np.unique(labels[train]).size < 2:
            correct += int((labels[test] == labels[train][0]).sum())
            continue
        model = LogisticRegression(C=c, max_iter=2000, solver="newton-cg")  # exact, fast here
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model.fit(x[train], labels[train])
        correct += int((model.predict(x[test]) == labels[test]).sum())
    return correct / labels.size


def probe_accuracy(
    features: np.ndarray,
    labels: np.ndarray,
    *,
    time: np.ndarray | None = None,
    folds: int = 5,
    permutations: int = 50,
    c: float = 1.0,
    seed: int = 0,
) -> ProbeCurve:
    """Cross-validated accuracy of a logistic-regression probe at every time.

    Args:
        features: ``(T, n, d)`` one feature vector per sample and time.
        labels: ``(n,)`` class of each sample (at least two classes).
        time: ``(T,)`` time coordinate (default ``0..T-1``).
        folds: ``k`` of the stratified k-fold (leave-one-out when a class is smaller).
        permutations: label shuffles for the null (the same shuffles at every time).
        c: inverse L2 penalty of the logistic regression.
        seed: folds and shuffles.
    """
    x = np.asarray(features)
    labels = np.asarray(labels)
    if x.ndim != 3 or x.shape[1] != labels.size:
        raise UserError(f"features must be (time, n, d) with n = {labels.size}, got {x.shape}")
    classes, counts = np.unique(labels, return_counts=True)
    if classes.size < 2:
        raise UserError("probes need at least two categories", "trace a prompt set with categories")
    splits, cv = _folds(labels, folds, seed)
    rng = np.random.default_rng(seed)
    shuffles = [rng.permutation(labels) for _ in range(permutations)]
    accuracy, null_mean, null_high = [], [], []
    nulls = np.full((permutations, x.shape[0]), np.nan)
    for t in range(x.shape[0]):
        z = _prepare(x[t])
        score = _cv_accuracy(z, labels, splits, c)
        null = np.array([_cv_accuracy(z, shuffled, splits, c) for shuffled in shuffles])
        nulls[:, t] = null
        accuracy.append(score)
        null_mean.append(float(null.mean()) if null.size else float("nan"))
        null_high.append(float(np.quantile(null, 0.95)) if null.size else float("nan"))
    pvalues = max_null_pvalues(np.array(accuracy), nulls)
    return ProbeCurve(
        time=np.arange(x.shape[0]) if time is None else np.asarray(time),
        accuracy=np.array(accuracy),
        null_mean=np.array(null_mean),
        null_high=np.array(null_high),
        p_value=np.nan_to_num(pvalues.p, nan=1.0),
        p_corrected=pvalues.p_corrected,
        chance=float(counts.max() / labels.size),
        cv=cv,
        permutations=permutations,
    )


def _per_prompt(ds: xr.Dataset) -> tuple[np.ndarray, np.ndarray]:
    if "prompt_index" not in ds.coords or "category" not in ds.coords:
        raise UserError("probes need a traced run (prompt_index and category)")
    prompts = np.unique(ds["prompt_index"].values)
    categories = []
    for p in prompts:
        first = int(np.flatnonzero(ds["prompt_index"].values == p)[0])
        categories.append(str(ds["category"].values[first]))
    return prompts, np.array(categories, dtype=object)


def last_token_features(ds: xr.Dataset) -> tuple[np.ndarray, np.ndarray]:
    """``(time, prompts, d)`` last-token states and ``(prompts,)`` categories."""
    prompts, categories = _per_prompt(ds)
    last = ds["is_last"].values.astype(bool)
    index = ds["prompt_index"].values
    rows = [int(np.flatnonzero(last & (index == p))[0]) for p in prompts]
    states = ds["states"].transpose("time", "particle", "feature").values
    return np.asarray(states[:, rows]), categories


def pooled_features(ds: xr.Dataset) -> tuple[np.ndarray, np.ndarray]:
    """``(time, prompts, d)`` mean over each prompt's tokens (``positions="all"`` runs)."""
    prompts, categories = _per_prompt(ds)
    index = ds["prompt_index"].values
    states = ds["states"].transpose("time", "particle", "feature").values
    pooled = np.stack([states[:, index == p].mean(axis=1) for p in prompts], axis=1)
    return pooled, categories

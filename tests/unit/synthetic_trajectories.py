"""Synthetic trajectories in the trace schema, with answers known by construction.

Shared by the analysis, figure, CLI and report tests. Nothing here loads a model.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import xarray as xr

from tokenfield.runs import RunWriter, strings

SEED_CATEGORIES = ("code", "math", "story", "word problems", "pseudocode")


def trace_dataset(
    states: np.ndarray,
    categories: Sequence[str] | None = None,
    *,
    final_norm: bool = True,
    time: np.ndarray | None = None,
    model: str = "synthetic",
) -> xr.Dataset:
    """Wrap (time, particle, feature) states as a trace Dataset (one last token per prompt).

    Without ``categories`` the Dataset is simulation-like: no prompt coordinates.
    """
    n_time, n_particle, n_feature = states.shape
    coords: dict = {
        "time": np.arange(n_time) if time is None else time,
        "particle": np.arange(n_particle),
    }
    data = {"states": (("time", "particle", "feature"), states.astype(np.float32))}
    if categories is not None:
        categories = list(categories)
        coords.update(
            prompt_index=("particle", np.arange(n_particle)),
            prompt=("particle", strings(f"prompt {i} about {c}" for i, c in enumerate(categories))),
            category=("particle", strings(categories)),
            label=("particle", strings(str(i + 1) for i in range(n_particle))),
            position=("particle", np.full(n_particle, 4)),
            token=("particle", strings(f"tok{i}" for i in range(n_particle))),
            is_last=("particle", np.ones(n_particle, dtype=bool)),
        )
        if final_norm:
            last = states[-1]
            scale = np.sqrt(np.mean(last**2, axis=-1, keepdims=True))
            scale = np.where(scale > 0, scale, 1.0)
            data["final_norm_states"] = (("particle", "feature"), (last / scale).astype(np.float32))
    ds = xr.Dataset(data, coords=coords)
    ds.attrs["run"] = {
        "kind": "trace" if categories is not None else "simulation",
        "config": {"model": model},
    }
    return ds


def straight_lines(n_particle: int = 6, n_time: int = 12, n_feature: int = 16, seed: int = 0):
    """h_p(t) = a_p + t v: every particle moves along the same straight line direction
    with constant speed; the starts a_p are small, so PC1 is time."""
    rng = np.random.default_rng(seed)
    direction = rng.normal(size=n_feature)
    direction /= np.linalg.norm(direction)
    starts = 0.1 * rng.normal(size=(n_particle, n_feature))
    t = np.arange(n_time, dtype=np.float64)
    return starts[None] + 2.0 * t[:, None, None] * direction  # (time, particle, feature)


def split_groups(
    split_at: int = 7,
    n_time: int = 14,
    n_per_group: int = 8,
    n_feature: int = 256,
    noise: float = 0.02,
    seed: int = 0,
) -> tuple[np.ndarray, list[str]]:
    """Two categories that travel as one bundle up to step ``split_at - 1`` and go
    different ways from step ``split_at`` on.

    Before the split the particles differ by noise only. In ``n_feature``
    dimensions the noise's distances concentrate (relative spread about
    ``sqrt(2 / (n_per_group * n_feature))``), so the bifurcation margin of 0.25
    is many standard deviations away from a chance "split".
    """
    rng = np.random.default_rng(seed)
    base = rng.normal(size=n_feature)
    drift = rng.normal(size=n_feature)
    away_a, away_b = rng.normal(size=(2, n_feature))
    t = np.arange(n_time, dtype=np.float64)
    common = 10 * base + 0.5 * t[:, None] * drift  # (time, feature)
    n = 2 * n_per_group
    states = common[:, None, :] + noise * rng.normal(size=(n_time, n, n_feature))
    after = np.clip(t - split_at + 1, 0, None)[:, None, None]  # 0 before split_at, then 1, 2, ...
    states[:, :n_per_group] += 2.0 * after * away_a
    states[:, n_per_group:] += 2.0 * after * away_b
    return states, ["a"] * n_per_group + ["b"] * n_per_group


def clustered(
    categories: Sequence[str] = SEED_CATEGORIES,
    n_per_category: int = 5,
    n_time: int = 31,
    n_feature: int = 576,
    spread: float = 0.3,
    seed: int = 0,
) -> tuple[np.ndarray, list[str]]:
    """Seed-sized trajectories: the norm grows with depth, and each category drifts
    towards its own direction, so categories separate more and more with depth."""
    rng = np.random.default_rng(seed)
    k = len(categories)
    labels = [c for c in categories for _ in range(n_per_category)]
    n = len(labels)
    code = np.repeat(np.arange(k), n_per_category)
    shared = rng.normal(size=n_feature)
    targets = rng.normal(size=(k, n_feature))
    starts = rng.normal(size=(n, n_feature))
    t = np.linspace(0.0, 1.0, n_time)[:, None, None]
    direction = (1 - t) * starts[None] + t * (targets[code][None] + spread * starts[None])
    norm_growth = np.exp(4.0 * t)  # ~ e^4 = 55x over depth, like a real residual stream
    states = norm_growth * (direction + 0.5 * shared)
    return states + 0.01 * rng.normal(size=states.shape), labels


def write_run(path: Path, ds: xr.Dataset, kind: str = "trace") -> Path:
    """Write ``ds`` as a complete run directory with :class:`RunWriter`."""
    config = {**ds.attrs.get("run", {}).get("config", {}), "synthetic": True}
    append_dim = "particle" if kind == "trace" else "time"
    writer = RunWriter(path, kind, config, append_dim=append_dim)
    piece = ds.copy()
    piece.attrs = {}
    done = int(ds.sizes[append_dim])  # units of work: saved times, or a trace's prompts
    if kind == "trace" and "prompt_index" in ds.coords:
        index = ds["prompt_index"].values
        done = int(np.unique(index).size)
        # as a trace stores them: each prompt's particles (its generated tokens
        # included) together, in prompt order
        piece = piece.isel(particle=np.argsort(index, kind="stable"))
    writer.append(piece, done=done)
    writer.finish()
    return path

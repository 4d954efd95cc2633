"""Steering vectors computed from stored runs, with provenance.

A steering vector ``v`` at ``layer`` l is added to the residual stream at
``time`` l (l = 0: the embedding output; l = i: the raw output of block i-1), so
states at times ``< l`` are untouched and times ``>= l`` move.

Methods (both from last-token states of two categories at time l):

- ``mean``: ``v = mean(target) - mean(source)``. With ``alpha = 1`` the source
  category's mean is carried onto the target's mean at that layer.
- ``pca``: the first principal direction of all pairwise differences
  ``t_i - s_j``, oriented like the mean difference and scaled to the length of
  the mean difference's projection on it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from tokenfield._io import atomic_path
from tokenfield.errors import UserError

__all__ = ["SteeringVector", "steering_vector", "random_control", "METHODS"]

METHODS = ("mean", "pca")


@dataclass(frozen=True)
class SteeringVector:
    """A direction in the residual stream, the layer it belongs to, and where it came from.

    Attributes:
        vector: ``(d,)`` float32.
        layer: the ``time`` index at which it is added.
        provenance: JSON data: the run, the model (name, source_hash, d_model),
            the categories, the method, how many prompts each side had.

    Raises:
        UserError: ``vector`` is not a finite 1-D array.

    Example:
        >>> from tokenfield.steering import SteeringVector
        >>> vec = SteeringVector(np.array([3.0, 4.0]), layer=12, provenance={"method": "mean"})
        >>> vec.d, vec.norm, vec.vector.dtype
        (2, 5.0, dtype('float32'))
    """

    vector: np.ndarray
    layer: int
    provenance: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        vector = np.asarray(self.vector, dtype=np.float32)
        if vector.ndim != 1 or not np.all(np.isfinite(vector)):
            raise UserError("a steering vector must be a finite 1-D array", "recompute it")
        object.__setattr__(self, "vector", vector)

    @property
    def d(self) -> int:
        return int(self.vector.shape[0])

    @property
    def norm(self) -> float:
        return float(np.linalg.norm(self.vector))

    def save(self, path: str | Path) -> Path:
        """Write safetensors: the vector plus provenance in the header metadata."""
        from safetensors.numpy import save_file

        path = Path(path)
        meta = {"layer": str(self.layer), "provenance": json.dumps(self.provenance, default=str)}
        with atomic_path(path) as tmp:
            save_file({"vector": self.vector}, str(tmp), metadata=meta)
        return path

    @classmethod
    def load(cls, path: str | Path) -> SteeringVector:
        from safetensors import SafetensorError, safe_open

        path = Path(path)
        if not path.is_file():
            raise UserError(f"steering vector file '{path}' does not exist", "check the path")
        try:
            with safe_open(str(path), framework="numpy") as handle:
                meta = handle.metadata() or {}
                vector = handle.get_tensor("vector")
            return cls(vector, int(meta["layer"]), json.loads(meta.get("provenance", "{}")))
        except (KeyError, ValueError, TypeError, OSError, SafetensorError) as exc:
            # SafetensorError (not a ValueError): a file that is not safetensors at all
            reason = " ".join(str(exc).split()) or type(exc).__name__
            raise UserError(
                f"'{path}' is not a tokenfield steering vector ({reason})",
                "write one with 'tokenfield steer vector'",
            ) from None

    def check_model(self, model: Any) -> None:
        """Refuse a model this vector was not made for (hidden size, weights, depth).

        Raises:
            UserError: hidden size differs, layer out of range, or the vector's
                model hash differs from ``model``'s.
        """
        if self.d != model.d_model:
            raise UserError(
                f"the steering vector has {self.d} features but the model's hidden size is "
                f"{model.d_model}",
                "compute the vector from a run of this model",
            )
        check_layer(self.layer, model.n_layers)
        made_for = self.provenance.get("model", {}).get("source_hash")
        if made_for and made_for != model.source_hash:
            raise UserError(
                f"the steering vector was made for another model "
                f"('{self.provenance['model'].get('name')}', {made_for[:24]}...)",
                "compute the vector from a run of this model",
            )


def check_layer(layer: int, n_layers: int) -> None:
    if not 0 <= layer <= n_layers:
        raise UserError(
            f"layer {layer} is out of range for a model with {n_layers} layers",
            f"use a layer from 0 (embedding) to {n_layers} (last block)",
        )


def _category_states(ds: xr.Dataset, category: str, layer: int) -> np.ndarray:
    if "category" not in ds.coords:
        raise UserError("the run has no categories", "trace prompts that have a category")
    last = ds.isel(particle=np.asarray(ds["is_last"].values, bool)) if "is_last" in ds else ds
    categories = [str(c) for c in last["category"].values]
    if category not in categories:
        known = ", ".join(sorted(set(categories)))
        raise UserError(f"unknown category '{category}'", f"use one of: {known}")
    picked = np.array([c == category for c in categories])
    return np.asarray(last["states"].isel(time=layer).values, dtype=np.float64)[picked]


def steering_vector(
    ds: xr.Dataset,
    *,
    source: str,
    target: str,
    layer: int,
    method: str = "mean",
    run: str | None = None,
) -> SteeringVector:
    """The direction from ``source``'s region to ``target``'s at ``layer``.

    Args:
        ds: a traced run (``open_run``); its last-token states are used.
        source: the category steered away from, e.g. ``"Word Problems"``.
        target: the category steered towards, e.g. ``"Pure Math"``.
        layer: ``time`` index (0 = embedding output, i = output of block i-1).
        method: ``"mean"`` or ``"pca"`` (see the module docstring).
        run: the run's path, recorded in the provenance.

    Returns:
        A :class:`SteeringVector` at ``layer`` (``"mean"``: the difference of
        the two categories' mean last-token states), with its provenance.

    Raises:
        UserError: an unknown method or category, a layer out of range, or
            ``source == target``.

    Example:
        >>> from tokenfield.steering import steering_vector
        >>> ds = tf.open_run("runs/spectrum")                        # doctest: +SKIP
        >>> vec = steering_vector(ds, source="Word Problems", target="Pure Math",
        ...                       layer=12, run="runs/spectrum")     # doctest: +SKIP
        >>> vec.layer, vec.provenance["method"]                     # doctest: +SKIP
        (12, 'mean')
    """
    if method not in METHODS:
        raise UserError(f"unknown method '{method}'", f"use one of: {', '.join(METHODS)}")
    check_layer(layer, ds.sizes["time"] - 1)
    if source == target:
        raise UserError("--from and --to are the same category", "pick two different categories")
    from_states = _category_states(ds, source, layer)  # (n_s, d)
    to_states = _category_states(ds, target, layer)  # (n_t, d)
    mean_diff = to_states.mean(0) - from_states.mean(0)
    if method == "mean":
        vector = mean_diff
    else:
        diffs = (to_states[:, None, :] - from_states[None, :, :]).reshape(-1, mean_diff.size)
        _u, _s, vt = np.linalg.svd(diffs, full_matrices=False)  # uncentred: directions of change
        direction = vt[0] * np.sign(vt[0] @ mean_diff or 1.0)
        vector = direction * float(direction @ mean_diff)
    model = dict(ds.attrs.get("run", {}).get("config", {}).get("model", {}))
    provenance = {
        "run": run,
        "model": model,
        "from": source,
        "to": target,
        "method": method,
        "layer": layer,
        "n_from": int(from_states.shape[0]),
        "n_to": int(to_states.shape[0]),
    }
    return SteeringVector(vector.astype(np.float32), layer, provenance)


def random_control(vector: SteeringVector, seed: int = 0) -> SteeringVector:
    """A random direction with the same norm and layer: the control condition.

    Args:
        vector: the steering vector to match.
        seed: seeds the direction.

    Returns:
        A :class:`SteeringVector` of the same norm and layer, its provenance
        marked ``"random-control"`` with the seed.

    Example:
        >>> from tokenfield.steering import SteeringVector, random_control
        >>> control = random_control(SteeringVector(np.array([3.0, 4.0]), layer=12), seed=1)
        >>> round(control.norm, 4), control.layer, control.provenance["method"]
        (5.0, 12, 'random-control')
    """
    rng = np.random.default_rng(seed)
    direction = rng.standard_normal(vector.d)
    direction *= vector.norm / np.linalg.norm(direction)
    provenance = {**vector.provenance, "method": "random-control", "control_seed": seed}
    return SteeringVector(direction.astype(np.float32), vector.layer, provenance)

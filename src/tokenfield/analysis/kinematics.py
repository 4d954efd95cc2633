"""Kinematics of trajectories: how far, how fast and how sharply particles move.

With ``h(t)`` a particle's state at time step ``t`` (a layer, or a saved ODE
time), the step into time ``t`` is ``d(t) = h(t) - h(t-1)`` (for a trace,
``d(i)`` is block ``i``'s update of the residual stream). Per step and particle:

- ``step_length``   ``||d(t)||``
- ``speed``         ``||d(t)|| / (time(t) - time(t-1))`` (= step length for a trace)
- ``relative_step`` ``||d(t)|| / ||h(t-1)||``: step length in units of the current
  norm, which grows by orders of magnitude with depth in a real model
- ``angular_step``  the angle between ``h(t-1)`` and ``h(t)`` (radians): the
  geodesic step on the unit sphere, blind to norm growth
- ``turning_angle`` the angle between ``d(t-1)`` and ``d(t)`` (radians; 0 for a
  straight line, pi for a reversal); undefined at the first step
- ``velocity``      the seed's "velocity" ``dPC2/dPC1 = (PC2(t) - PC2(t-1)) /
  (PC1(t) - PC1(t-1))``, the slope of the path in the PCA plane (needs the
  projection; undefined where PC1 does not move)

All arrays share the ``step`` dimension whose coordinate is the arrival time
``time[1:]``.
"""

from __future__ import annotations

import numpy as np
import xarray as xr


def vector_angle(u: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Angle between vectors along the last axis, in radians; NaN if either is zero.

    Uses ``2 atan2(||u^ - w^||, ||u^ + w^||)``, which stays accurate for tiny
    angles where ``arccos`` of the cosine loses half its digits.

    Args:
        u: ``(..., d)`` vectors.
        w: ``(..., d)`` vectors (broadcast against ``u``).

    Returns:
        ``(...)`` angles in ``[0, pi]``.

    Example:
        >>> from tokenfield.analysis import vector_angle
        >>> vector_angle(np.array([[1.0, 0.0], [1.0, 1.0]]), np.array([[0.0, 1.0], [0.0, 0.0]]))
        array([1.57079633,        nan])
    """
    nu = np.linalg.norm(u, axis=-1, keepdims=True)
    nw = np.linalg.norm(w, axis=-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        uh = u / nu
        wh = w / nw
        angle = 2.0 * np.arctan2(np.linalg.norm(uh - wh, axis=-1), np.linalg.norm(uh + wh, axis=-1))
    return np.where((nu[..., 0] > 0) & (nw[..., 0] > 0), angle, np.nan)


def kinematics(ds: xr.Dataset, pcs: xr.DataArray | None = None) -> xr.Dataset:
    """Step lengths, turning angles and the seed's velocity for every particle.

    Args:
        ds: a trajectory with ``states`` (time, particle, feature).
        pcs: its projection (time, particle, component) in a global frame, for
            ``velocity``; leave out to skip it.

    Returns:
        A Dataset with ``step_length``, ``speed``, ``relative_step``,
        ``angular_step``, ``turning_angle`` and (with ``pcs``) ``velocity``, all
        (step, particle); ``norm`` (time, particle); and the arrival time of each
        particle's largest step, ``fastest_step`` (by step length) and
        ``fastest_relative_step`` (by relative step), both (particle,).

    Example:
        >>> sim = tf.simulate(tf.Dynamics(beta=4.0), tf.initial_condition("uniform", n=8, d=3),
        ...                   t_max=1.0, dt=0.1)
        >>> kin = tf.kinematics(sim)
        >>> kin.step_length.dims, kin.norm.dims
        (('step', 'particle'), ('time', 'particle'))
    """
    states = np.asarray(
        ds["states"].transpose("time", "particle", "feature").values, dtype=np.float64
    )  # (time, particle, feature)
    times = np.asarray(ds["time"].values)
    steps = np.diff(states, axis=0)  # (time-1, particle, feature)
    norms = np.linalg.norm(states, axis=-1)  # (time, particle)
    step_length = np.linalg.norm(steps, axis=-1)
    dt = np.diff(times.astype(np.float64))[:, None]
    with np.errstate(invalid="ignore", divide="ignore"):
        relative = np.where(norms[:-1] > 0, step_length / norms[:-1], np.nan)
        speed = np.where(dt > 0, step_length / dt, np.nan)
    angular = vector_angle(states[:-1], states[1:])
    turning = np.full_like(step_length, np.nan)
    if len(steps) > 1:
        turning[1:] = vector_angle(steps[:-1], steps[1:])

    particle_coords = {
        name: coord for name, coord in ds["states"].coords.items() if coord.dims == ("particle",)
    }
    dims = ("step", "particle")
    out = xr.Dataset(
        {
            "step_length": (dims, step_length),
            "speed": (dims, speed),
            "relative_step": (dims, relative),
            "angular_step": (dims, angular),
            "turning_angle": (dims, turning),
            "norm": (("time", "particle"), norms),
        },
        coords={"step": times[1:], "time": times, **particle_coords},
    )
    if pcs is not None and pcs.sizes.get("component", 0) >= 2:
        if "is_final_norm" in pcs.coords:
            pcs = pcs.isel(time=~pcs["is_final_norm"].values)
        plane = np.asarray(pcs.sel(component=[1, 2]).transpose("time", "particle", "component"))
        d1 = np.diff(plane[..., 0], axis=0)
        d2 = np.diff(plane[..., 1], axis=0)
        tiny = 1e-12 * max(float(np.abs(plane).max()), 1.0)
        with np.errstate(invalid="ignore", divide="ignore"):
            out["velocity"] = (dims, np.where(np.abs(d1) > tiny, d2 / d1, np.nan))
    for name, source in (("fastest_step", step_length), ("fastest_relative_step", relative)):
        fastest = np.full(source.shape[1], np.nan)
        if len(source):
            valid = np.isfinite(source).any(axis=0)
            index = np.argmax(np.where(np.isfinite(source), source, -np.inf), axis=0)
            fastest = np.where(valid, times[1:][index].astype(np.float64), np.nan)
        out[name] = ("particle", fastest)
    return out


def mean_by_step(kin: xr.Dataset, name: str) -> xr.DataArray:
    """The particle-average of one kinematic quantity per step (NaNs ignored)."""
    return kin[name].mean("particle", skipna=True)

"""Integrators and the one entry point, :func:`simulate`.

Three choices meet in ``simulate(dynamics, x0, solver=..., saveat=...)`` (the
diffrax pattern): the vector field (:class:`~tokenfield.particles.Dynamics`),
the solver, and what is saved.

Solvers (``h`` the step, ``f`` the field, ``N`` the retraction ``x -> x/|x|``
when the state lives on the sphere, the identity otherwise):

- :class:`Euler`: ``x <- N(x + h f(x))``. With ``h = dt`` this is exactly one
  post-norm residual attention layer. Order 1.
- :class:`ProjectedEuler` (``projected-euler``): the integrator of the public
  script of Geshkovski-Letrouit-Polyanskiy-Rigollet (arXiv 2312.10794): an Euler
  step in the ambient space, then renormalise each token, ``x <- N(x + h f(x))``.
  The same update as :class:`Euler`, named for that script so a run records
  which convention it follows. For USA the script normalises the step by
  ``e^beta`` (the USA weights become ``exp(beta (<x, y> - 1)) / n``, USA "in its
  own time scale"): that is ``Dynamics(time="rescaled")``, which
  ``theory phase-diagram --solver projected-euler --normalization usa`` selects unless
  ``--time`` is given. Order 1.
- :class:`RK4`: classical Runge-Kutta in the ambient space, then ``N``. The
  ambient field ``P_x^perp A(x)`` leaves ``|x| = 1`` invariant, so the retraction
  moves the RK4 point by ``O(h^5)`` and the order stays 4.
- :class:`Adaptive`: Dormand-Prince 5(4) with an error controller (``rtol``,
  ``atol``), then ``N``; one step size for the whole batch.

Saving (:class:`SaveAt`): every ``k`` steps (plus the start and the end), or
at given times (the solver lands on them exactly). Steps never straddle a
layer boundary of piecewise-constant parameters, nor a save time.

Runs: with ``out=DIR`` the saved frames are streamed into a run directory
(``RunWriter(DIR, "simulation", config, append_dim="time")``) as they are
produced, and an interrupted run resumes from its last stored frame when the
same call is made again.
"""

from __future__ import annotations

import hashlib
import json
import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
import xarray as xr

from tokenfield.errors import ParameterError, UserError
from tokenfield.particles.dynamics import Dynamics, DynamicsSpec
from tokenfield.runs import RunWriter, open_run

Field = Callable[[torch.Tensor], torch.Tensor]

# Saved frames are buffered up to this many bytes before each append to the run.
FLUSH_BYTES = 64 * 2**20
CHUNK_BYTES = 16 * 2**20


@dataclass(frozen=True)
class _FixedStep:
    """A solver with one fixed step ``h``: ``step`` is the update before the
    retraction; its name alone is its configuration."""

    name: ClassVar[str]
    order: ClassVar[int]

    def step(self, field: Field, x: torch.Tensor, h: float) -> torch.Tensor:
        raise NotImplementedError

    def to_config(self) -> dict[str, Any]:
        return {"name": self.name}


@dataclass(frozen=True)
class Euler(_FixedStep):
    """Explicit Euler with retraction: one residual layer per step.

    Takes no arguments; pass it (or ``"euler"``, the default) as
    :func:`simulate`'s ``solver``.

    Example:
        >>> x0 = tf.initial_condition("uniform", n=8, d=3, seed=0)
        >>> sim = tf.simulate(tf.Dynamics(beta=4.0), x0, t_max=1.0, dt=0.1, solver=tf.Euler())
        >>> sim.time.values[-1]
        np.float64(1.0)
    """

    name: ClassVar[str] = "euler"
    order: ClassVar[int] = 1

    def step(self, field: Field, x: torch.Tensor, h: float) -> torch.Tensor:
        return x + h * field(x)


@dataclass(frozen=True)
class ProjectedEuler(Euler):
    """Euler step then renormalise (the published phase-diagram script's scheme).

    Takes no arguments; pass it (or ``"projected-euler"``) as :func:`simulate`'s
    ``solver``.

    Example:
        >>> from tokenfield.particles import ProjectedEuler
        >>> x0 = tf.initial_condition("uniform", n=8, d=3, seed=0)
        >>> sim = tf.simulate(tf.Dynamics(beta=4.0), x0, t_max=1.0, dt=0.1, solver=ProjectedEuler())
        >>> bool(np.allclose(np.linalg.norm(sim.states.values, axis=-1), 1.0))
        True
    """

    name: ClassVar[str] = "projected-euler"
    order: ClassVar[int] = 1


@dataclass(frozen=True)
class RK4(_FixedStep):
    """Classical fourth-order Runge-Kutta in R^d, retracted after each step.

    Takes no arguments; pass it (or ``"rk4"``) as :func:`simulate`'s ``solver``.

    Example:
        At ``dt = 0.1`` its end state is far closer to a fine reference than Euler's:

        >>> x0 = tf.initial_condition("uniform", n=8, d=3, seed=0)
        >>> def end(solver, dt):
        ...     sim = tf.simulate(tf.Dynamics(beta=4.0), x0, t_max=1.0, dt=dt, solver=solver)
        ...     return sim.states.values[-1]
        >>> ref = end(tf.RK4(), 0.01)
        >>> errors = {s.name: np.abs(end(s, 0.1) - ref).max() for s in (tf.Euler(), tf.RK4())}
        >>> bool(errors["rk4"] < errors["euler"] / 100)
        True
    """

    name: ClassVar[str] = "rk4"
    order: ClassVar[int] = 4

    def step(self, field: Field, x: torch.Tensor, h: float) -> torch.Tensor:
        k1 = field(x)
        k2 = field(x + (h / 2) * k1)
        k3 = field(x + (h / 2) * k2)
        k4 = field(x + h * k3)
        return x + (h / 6) * (k1 + 2 * k2 + 2 * k3 + k4)


# Dormand-Prince 5(4) tableau.
_DP_A = (
    (),
    (1 / 5,),
    (3 / 40, 9 / 40),
    (44 / 45, -56 / 15, 32 / 9),
    (19372 / 6561, -25360 / 2187, 64448 / 6561, -212 / 729),
    (9017 / 3168, -355 / 33, 46732 / 5247, 49 / 176, -5103 / 18656),
    (35 / 384, 0.0, 500 / 1113, 125 / 192, -2187 / 6784, 11 / 84),
)
_DP_B5 = (35 / 384, 0.0, 500 / 1113, 125 / 192, -2187 / 6784, 11 / 84, 0.0)
_DP_B4 = (5179 / 57600, 0.0, 7571 / 16695, 393 / 640, -92097 / 339200, 187 / 2100, 1 / 40)


@dataclass(frozen=True)
class Adaptive:
    """Dormand-Prince 5(4) with step-size control.

    A step is accepted when ``max over systems of RMS(err / (atol + rtol |x|)) <= 1``;
    the next step is ``h * clip(0.9 err^(-1/5), 0.2, 5)``. ``simulate``'s ``dt``
    is the first step tried.

    Args:
        rtol: relative tolerance of the local error.
        atol: absolute tolerance of the local error.
        max_steps: raise :class:`UserError` after this many attempted steps.

    Example:
        >>> x0 = tf.initial_condition("uniform", n=8, d=3, seed=0)
        >>> sim = tf.simulate(tf.Dynamics(beta=4.0), x0, t_max=1.0, dt=0.1, solver=tf.Adaptive(rtol=1e-8))
        >>> sim.time.values[-1]
        np.float64(1.0)
    """

    rtol: float = 1e-6
    atol: float = 1e-9
    max_steps: int = 1_000_000

    name: ClassVar[str] = "adaptive"
    order: ClassVar[int] = 5

    def __post_init__(self) -> None:
        for label, value in (("rtol", self.rtol), ("atol", self.atol)):
            if not (math.isfinite(value) and value >= 0):
                raise ParameterError(label, f"{{name}} must be a finite number >= 0, not {value}")
        if self.rtol == 0 and self.atol == 0:
            raise UserError("rtol and atol cannot both be 0", "pass a positive tolerance")
        if self.max_steps < 1:
            raise UserError(f"max_steps must be >= 1, not {self.max_steps}")

    def attempt(self, field: Field, x: torch.Tensor, h: float) -> tuple[torch.Tensor, float]:
        """One trial step: ``(x_new, error norm)``; accept when the norm is <= 1."""
        stages: list[torch.Tensor] = []
        for row in _DP_A:
            y = x
            for coefficient, k in zip(row, stages, strict=False):
                if coefficient:
                    y = y + (h * coefficient) * k
            stages.append(field(y))
        x5 = x + h * sum(b * k for b, k in zip(_DP_B5, stages, strict=True) if b)
        err = h * sum((b5 - b4) * k for b5, b4, k in zip(_DP_B5, _DP_B4, stages, strict=True))
        scale = self.atol + self.rtol * torch.maximum(x.abs(), x5.abs())
        ratio = (err / scale).square()  # (..., n, d)
        per_system = ratio.flatten(start_dim=-2).mean(-1).sqrt()  # (...)
        return x5, float(per_system.max())

    def to_config(self) -> dict[str, Any]:
        return {"name": self.name, "rtol": self.rtol, "atol": self.atol}


Solver = Euler | ProjectedEuler | RK4 | Adaptive
SOLVERS: dict[str, type] = {
    "euler": Euler,
    "projected-euler": ProjectedEuler,
    "rk4": RK4,
    "adaptive": Adaptive,
}


def get_solver(solver: str | Solver) -> Solver:
    """A solver instance from a name (``euler``, ``projected-euler``, ``rk4``,
    ``adaptive``) or an instance."""
    if isinstance(solver, (Euler, RK4, Adaptive)):
        return solver
    if isinstance(solver, str) and solver in SOLVERS:
        return SOLVERS[solver]()
    raise UserError(f"unknown integrator {solver!r}", "use euler, projected-euler, rk4 or adaptive")


@dataclass(frozen=True)
class SimulationSpec(DynamicsSpec):
    """A :class:`~tokenfield.particles.dynamics.DynamicsSpec` integrated from 0 to
    ``t_max`` (the base of :class:`~tokenfield.PhaseDiagramConfig` and the
    simulation recipe; its fields are theirs, checked on construction).

    Attributes:
        t_max: the final time.
        dt: the step (adaptive: the first step tried).
        solver: ``euler``, ``projected-euler``, ``rk4`` or ``adaptive``.

    Raises:
        ParameterError: a bad ``normalization``, ``time``, ``t_max`` or ``dt``
            (:func:`check_times`).
        UserError: an unknown solver.
    """

    t_max: float = 10.0
    dt: float = 0.1
    solver: str = "euler"

    def __post_init__(self) -> None:
        super().__post_init__()
        check_times(self.t_max, self.dt)
        get_solver(self.solver)


@dataclass(frozen=True)
class SaveAt:
    """What :func:`simulate` keeps: ``every`` k-th step (with the first and last
    state), or the states at the given ``times`` (each within ``[t0, t_max]``).

    Args:
        every: keep every k-th step (k >= 1); the default when neither is given is 1.
        times: keep the states at these times instead (not with ``every``).

    Raises:
        UserError: both ``every`` and ``times`` given, or a time outside the span.

    Example:
        >>> x0 = tf.initial_condition("uniform", n=8, d=3, seed=0)
        >>> sim = tf.simulate(tf.Dynamics(beta=4.0), x0, t_max=1.0, dt=0.1,
        ...                   saveat=tf.SaveAt(every=5))
        >>> sim.time.values
        array([0. , 0.5, 1. ])
    """

    every: int | None = None
    times: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if self.every is not None and self.times is not None:
            raise UserError("SaveAt takes either every= or times=, not both")
        if self.every is None and self.times is None:
            object.__setattr__(self, "every", 1)
        if self.every is not None and (isinstance(self.every, bool) or int(self.every) < 1):
            raise ParameterError(
                "save_every",
                f"{{name}} (keep every k-th step) must be >= 1, not {self.every}",
                "pass {name} 1 or more",
            )
        if self.times is not None:
            times = tuple(sorted(float(t) for t in self.times))
            if not times or not all(math.isfinite(t) for t in times):
                raise UserError("save times must be a non-empty list of finite numbers")
            object.__setattr__(self, "times", times)

    def to_config(self) -> dict[str, Any]:
        return {"every": self.every, "times": None if self.times is None else list(self.times)}


def _digest(x: torch.Tensor) -> str:
    array = np.ascontiguousarray(x.detach().cpu().numpy())
    return hashlib.sha256(array.tobytes()).hexdigest()[:16]


def _prepare_x0(
    dynamics: Dynamics, x0: Any, dtype: torch.dtype | None, device: Any
) -> torch.Tensor:
    if isinstance(x0, torch.Tensor):
        x = x0.detach()
        if not x.is_floating_point():
            x = x.to(torch.float64)
    else:
        x = torch.as_tensor(np.asarray(x0, dtype=np.float64))
    x = x.to(dtype=dtype or x.dtype, device=device or x.device)
    dynamics.check_state(x)
    if x.ndim > 3:
        raise UserError(f"x0 must be (n, d) or (batch, n, d), got {tuple(x.shape)}")
    if not torch.isfinite(x).all():
        raise UserError("the initial states have non-finite entries")
    if dynamics.state != "free" and bool((x.norm(dim=-1) == 0).any()):
        raise UserError("an initial state is the zero vector; it has no direction on the sphere")
    return dynamics.retract(x)


def _fixed_grid(t0: float, t_max: float, dt: float, stops: Sequence[float]) -> np.ndarray:
    """``t0 + k dt`` up to ``t_max``, merged with ``stops`` (points within
    ``1e-9 dt`` of a stop are replaced by the stop)."""
    count = int(math.floor((t_max - t0) / dt * (1 + 1e-12)))
    grid = t0 + dt * np.arange(count + 1, dtype=np.float64)
    extra = np.asarray(sorted(set(stops) | {t_max}), dtype=np.float64)
    tol = 1e-9 * dt
    near = np.abs(grid[:, None] - extra[None, :]).min(axis=1) <= tol if extra.size else None
    if near is not None:
        near[0] = False
        grid = grid[~near]
    grid = np.union1d(grid, extra[extra > t0 + tol])
    return grid[grid <= t_max + tol]


class BlowUp(UserError):
    """The states became non-finite: the integration is unstable."""


class _Recorder:
    """Collects saved frames; streams them into a run when there is one."""

    def __init__(self, writer: Any, frame_bytes: int, batched: bool, n: int):
        self.writer = writer
        self.batched = batched
        self.n = n
        self.flush_every = max(1, min(256, FLUSH_BYTES // max(1, frame_bytes)))
        self.chunk_frames = max(1, min(256, CHUNK_BYTES // max(1, frame_bytes)))
        self.times: list[float] = []
        self.frames: list[np.ndarray] = []
        self.saved = 0 if writer is None else writer.done
        self.first_append = writer is None or writer.done == 0

    def save(self, t: float, x: torch.Tensor, state: dict[str, Any]) -> None:
        if not bool(torch.isfinite(x).all()):
            raise BlowUp(
                f"the states became non-finite by t = {t:g} (the step is unstable)",
                "reduce --dt or beta, or use --solver adaptive",
            )
        self.times.append(float(t))
        self.frames.append(x.detach().cpu().numpy().copy())
        self.saved += 1
        if self.writer is not None and len(self.frames) >= self.flush_every:
            self.flush(state)

    def dataset(self, config: dict[str, Any]) -> xr.Dataset:
        axis = 1 if self.batched else 0
        states = np.stack(self.frames, axis=axis)
        dims = ("time", "particle", "feature")
        if self.batched:
            dims = ("system", *dims)
        coords: dict[str, Any] = {
            "time": np.asarray(self.times, dtype=np.float64),
            "particle": np.arange(self.n, dtype=np.int64),
        }
        if self.batched:
            coords["system"] = np.arange(states.shape[0], dtype=np.int64)
        ds = xr.Dataset({"states": (dims, states)}, coords=coords)
        ds.attrs = {"tokenfield_config": json.dumps(config), "kind": "simulation"}
        return ds

    def flush(self, state: dict[str, Any]) -> None:
        if self.writer is None or not self.frames:
            return
        piece = self.dataset(self.writer.config)
        if self.first_append:
            shape = list(piece["states"].shape)
            shape[piece["states"].dims.index("time")] = self.chunk_frames
            piece["states"].encoding["chunks"] = tuple(shape)
            self.first_append = False
        self.writer.append(piece, done=self.saved, **state)
        self.times.clear()
        self.frames.clear()


def check_times(t_max: float, dt: float, t0: float = 0.0) -> tuple[float, float, float]:
    """Check the time span and step of :func:`simulate`: all finite, ``dt > 0``,
    ``t_max > t0``. Returns them as floats.

    Raises:
        ParameterError: naming ``t_max``, ``dt`` or ``t0``.
    """
    for label, value in (("dt", dt), ("t_max", t_max), ("t0", t0)):
        if isinstance(value, bool) or not math.isfinite(float(value)):
            raise ParameterError(label, f"{{name}} must be a finite number, not {value}")
    t0, t_max, dt = float(t0), float(t_max), float(dt)
    if dt <= 0:
        raise ParameterError(
            "dt", f"the step must be {{name}} > 0, not {dt:g}", "pass a positive {name}"
        )
    if t_max <= t0:
        raise ParameterError(
            "t_max", f"{{name}} must be greater than t0 = {t0:g}, not {t_max:g}",
            "pass a positive {name}" if t0 == 0 else "pass a later {name}",
        )  # fmt: skip
    return t_max, dt, t0


def simulate(
    dynamics: Dynamics,
    x0: Any,
    *,
    t_max: float,
    dt: float,
    solver: str | Solver = "euler",
    saveat: SaveAt | None = None,
    t0: float = 0.0,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
    out: str | Path | None = None,
    overwrite: bool = False,
    extra_config: dict[str, Any] | None = None,
    progress: Callable[[float], None] | None = None,
) -> xr.Dataset:
    """Integrate ``dx/dt = dynamics(t, x)`` from ``x0`` over ``[t0, t_max]``.

    Args:
        dynamics: the vector field and its parameters.
        x0: ``(n, d)`` or ``(batch, n, d)`` initial states (tensor or array).
            On the sphere they are normalised first.
        t_max: final time.
        dt: the step (fixed-step solvers) or the first step tried (adaptive).
        solver: ``"euler"``, ``"rk4"``, ``"adaptive"`` or a solver instance.
        saveat: what to keep (default: every step).
        t0: start time.
        dtype: the dtype to compute in (default: that of ``x0``; arrays give float64).
        device: where to compute (default: that of ``x0``; arrays: the CPU).
        out: stream the run into this directory (resumes an interrupted run
            made by the same call).
        overwrite: replace a run already at ``out``.
        extra_config: more JSON data for the run config (e.g. the init recipe).
        progress: called with the current time after every step.

    Returns:
        A Dataset with ``states`` ``(time, particle, feature)`` (or ``(system,
        time, particle, feature)`` for a batch), coordinates ``time`` (ODE time)
        and ``particle`` (int ids), and the config in ``attrs``. With ``out``,
        the run opened from disk (lazy).

    Example:
        >>> x0 = tf.initial_condition("uniform", n=8, d=3, seed=0)
        >>> sim = tf.simulate(tf.Dynamics(beta=4.0), x0, t_max=1.0, dt=0.1)
        >>> dict(sim.sizes)
        {'time': 11, 'particle': 8, 'feature': 3}
    """
    if not isinstance(dynamics, Dynamics):
        raise UserError(
            "dynamics must be a tokenfield Dynamics", "build one with Dynamics(beta=...)"
        )
    solver = get_solver(solver)
    saveat = saveat or SaveAt(every=1)
    t_max, dt, t0 = check_times(t_max, dt, t0)
    if saveat.times is not None and (saveat.times[0] < t0 or saveat.times[-1] > t_max + 1e-12):
        raise UserError(f"save times must lie in [{t0}, {t_max}]")
    x = _prepare_x0(dynamics, x0, dtype, device)
    batched = x.ndim == 3
    n, d = int(x.shape[-2]), int(x.shape[-1])
    config = {
        "dynamics": dynamics.to_config(),
        "solver": solver.to_config(),
        "saveat": saveat.to_config(),
        "t0": t0,
        "t_max": t_max,
        "dt": dt,
        "n": n,
        "dim": d,
        "batch": int(x.shape[0]) if batched else None,
        "dtype": str(x.dtype).removeprefix("torch."),
        "x0_sha256": _digest(x),
        **(extra_config or {}),
    }
    run = dynamics.to(x.dtype, x.device)
    writer = None
    if out is not None:
        writer = RunWriter(out, "simulation", config, append_dim="time", overwrite=overwrite)
        if writer.complete:
            writer.close()
            return open_run(out)
    try:
        recorder = _Recorder(writer, x.numel() * x.element_size(), batched, n)
        resume = _resume_state(writer)
        if resume is not None:
            x = resume.pop("x").to(dtype=x.dtype, device=x.device)
        layers = tuple(run.at_layer(layer) for layer in range(run.layers))
        plan = _Plan(run, layers, t0, t_max, dt, saveat, recorder, resume, progress)
        with torch.no_grad():
            if isinstance(solver, Adaptive):
                _run_adaptive(solver, plan, x)
            else:
                _run_fixed(solver, plan, x)
    except BlowUp:
        # A numerical blow-up is not resumable: remove the run this call created
        # (a retry with a smaller step then needs no --overwrite).
        if writer is not None:
            writer.abandon()
        raise
    finally:
        if writer is not None and not writer.complete:
            writer.close()
    if writer is None:
        return recorder.dataset(config)
    writer.finish()

    return open_run(out)


@dataclass(frozen=True)
class _Plan:
    """What the stepping loops share: the dynamics (in the working dtype/device),
    the time span, the save policy, where the saved states go, the state to
    resume from (``None``: start at ``t0``) and the progress callback."""

    run: Dynamics
    layers: tuple[Dynamics, ...]  # each layer's parameters, held constant
    t0: float
    t_max: float
    dt: float
    saveat: SaveAt
    recorder: _Recorder
    resume: dict[str, Any] | None
    progress: Callable[[float], None] | None

    @property
    def boundaries(self) -> list[float]:
        """Layer boundaries strictly inside ``(t0, t_max)``."""
        edges = (layer * self.run.layer_time for layer in range(1, self.run.layers))
        return [b for b in edges if self.t0 < b < self.t_max]

    def field(self, t: float) -> Field:
        """The field of the layer acting at ``t``, for a step that starts at ``t``
        (steps never cross a boundary, so the layer is constant over the step)."""
        dynamics = self.layers[self.run.layer_at(t)]
        return lambda y: dynamics.field_at_layer(0, y)


def _resume_state(writer: Any) -> dict[str, Any] | None:
    if writer is None or writer.done == 0:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        stored = xr.open_zarr(writer.store, consolidated=False)["states"]
    last = stored.isel(time=-1).values
    progress = dict(writer.info.progress)
    return {"x": torch.from_numpy(np.ascontiguousarray(last)), **progress}


def _run_fixed(solver: Euler | RK4, plan: _Plan, x: torch.Tensor) -> None:
    recorder, resume, progress = plan.recorder, plan.resume, plan.progress
    saveat = plan.saveat
    save_times = list(saveat.times or ())
    grid = _fixed_grid(plan.t0, plan.t_max, plan.dt, plan.boundaries + save_times)
    last = len(grid) - 1
    # the grid holds every save time exactly (merged in above)
    save_index = {int(np.abs(grid - s).argmin()) for s in save_times}

    def wanted(k: int) -> bool:
        if saveat.every is not None:
            return k % saveat.every == 0 or k == last
        return k in save_index

    start = 0
    if resume is not None:
        start = int(resume["step"])
    elif wanted(0):
        recorder.save(grid[0], x, {"step": 0, "t": float(grid[0])})
    for k in range(start, last):
        h = float(grid[k + 1] - grid[k])
        x = plan.run.retract(solver.step(plan.field(float(grid[k])), x, h))
        if wanted(k + 1):
            recorder.save(grid[k + 1], x, {"step": k + 1, "t": float(grid[k + 1])})
        if progress is not None:
            progress(float(grid[k + 1]))
    recorder.flush({"step": last, "t": float(grid[last])})


def _run_adaptive(solver: Adaptive, plan: _Plan, x: torch.Tensor) -> None:
    recorder, resume, progress = plan.recorder, plan.resume, plan.progress
    saveat, t0, t_max = plan.saveat, plan.t0, plan.t_max
    stops = sorted({*plan.boundaries, *(saveat.times or ()), t_max})
    stops = [s for s in stops if s > t0]
    save_times = set(saveat.times or ())
    t, h, accepted, attempts = t0, plan.dt, 0, 0

    def state() -> dict[str, Any]:
        return {"step": accepted, "t": t, "h": h}

    if resume is not None:
        t, h, accepted = float(resume["t"]), float(resume["h"]), int(resume["step"])
    elif saveat.every is not None or t0 in save_times:
        recorder.save(t, x, state())
    for stop in stops:
        while t < stop:
            span = stop - t
            trial = min(h, span)
            lands = trial >= span * (1 - 1e-12)
            x_new, error = solver.attempt(plan.field(t), x, trial)
            attempts += 1
            if attempts > solver.max_steps:
                raise UserError(
                    f"the adaptive solver took more than {solver.max_steps} steps before t = {t_max}",
                    "loosen --rtol/--atol or raise max_steps",
                )
            if not math.isfinite(error):
                error = math.inf
            factor = 5.0 if error == 0 else min(5.0, max(0.2, 0.9 * error**-0.2))
            if error > 1:
                h = trial * factor
                if h < 1e-14 * max(1.0, abs(t)):
                    raise BlowUp(
                        f"the adaptive step size underflowed at t = {t:g}",
                        "loosen --rtol/--atol, or check the dynamics for a blow-up",
                    )
                continue
            x = plan.run.retract(x_new)
            t = stop if lands else t + trial
            h = max(h, trial * factor) if lands else trial * factor
            accepted += 1
            at_end = t >= t_max
            if (saveat.every is not None and (accepted % saveat.every == 0 or at_end)) or (
                lands and stop in save_times
            ):
                recorder.save(t, x, state())
            if progress is not None:
                progress(t)
    recorder.flush(state())

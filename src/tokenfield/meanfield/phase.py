"""The phase diagram: how likely two tokens have merged, over time, beta and d.

For each dimension ``d`` and inverse temperature ``beta``, ``S`` systems of ``n``
tokens start i.i.d. uniform on ``S^{d-1}`` (the same starts for every ``beta``
of a given ``d``: common random numbers make the diagram smooth in ``beta``) and
are simulated together in one batched tensor. At each saved time the estimate
of ``P(<x_1(t), x_2(t)> >= 1 - delta)`` is the fraction of systems (and, with
``pairs="all"``, of all pairs ``i < j``, the same expectation by exchangeability,
with less variance) whose inner product passed ``1 - delta`` (the figure of
Geshkovski-Letrouit-Polyanskiy-Rigollet, arXiv 2312.10794, Section 6).

Over it goes the equiangular curve: from orthogonal tokens (``d >= n``) all inner
products stay equal to ``rho(t)`` with
``rho' = 2 e^{beta rho} (1 - rho) (1 + (n - 1) rho) / Z``, ``Z = n`` (USA) or
``e^beta + (n - 1) e^{beta rho}`` (SA), ``rho(0) = 0`` (derived in
``tests/unit/test_particles_integrate.py``); the curve is the time
``t_delta(beta)`` at which ``rho`` reaches ``1 - delta``. Random starts in high
``d`` are nearly orthogonal, so the transition should follow it as ``d`` grows.

The sweep is split into tasks (one ``d``, a block of ``beta``). Each task
computes its block and writes its own region of one Zarr store
(``merged_probability (dim, beta, time)``, ``completed (dim, beta)``), created
full-size first, so the tasks can run anywhere that sees the store: in this
process, or on a Dask cluster (a ``LocalCluster`` with ``processes=False`` by
default, or an existing scheduler's address). The starts depend only on
``(seed, d)`` and every task runs torch on one thread, so the numbers do not
depend on how the work is split or where it runs. A store made with the same
config is resumed: blocks already marked completed are skipped.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import xarray as xr

from tokenfield._io import to_jsonable
from tokenfield.errors import ParameterError, UserError
from tokenfield.particles import SaveAt, simulate
from tokenfield.particles.init import uniform
from tokenfield.particles.integrate import SimulationSpec

VARIABLE = "merged_probability"


@dataclass(frozen=True)
class PhaseDiagramConfig(SimulationSpec):
    """Settings of a phase-diagram sweep (JSON round-trip: :meth:`to_dict`).

    Attributes:
        dims: dimensions ``d``.
        betas: inverse temperatures.
        t_max, frames: saved times ``linspace(0, t_max, frames)``.
        n_particles: ``n`` tokens per system.
        n_systems: ``S`` random starts.
        delta: merged means ``<x_i, x_j> >= 1 - delta``.
        normalization, time: the dynamics (``Q = K = V = I``).
        dt, solver: the integrator (fixed step, float64): ``"rk4"``, or
            ``"projected-euler"`` (the published script's Euler step then
            renormalise; with USA pair it with ``time="rescaled"``, its step
            normalisation), or ``"euler"``.
        pairs: ``"all"`` pairs or the ``"first"`` pair ``(x_1, x_2)``.
        seed: base seed (system starts for dimension ``d`` use ``seed + d``).
        beta_block: betas per task (also the Zarr chunk along ``beta``).

    Example:
        >>> config = tf.PhaseDiagramConfig(dims=(2,), betas=(0.0, 4.0), t_max=5.0, frames=6)
        >>> config.to_dict()["dims"], config.betas
        ([2], (0.0, 4.0))
    """

    # the integration (normalization, time, dt: SimulationSpec's), with a sweep's defaults
    t_max: float = 30.0
    solver: str = "rk4"
    dims: tuple[int, ...] = (2, 8, 32, 128)
    betas: tuple[float, ...] = tuple(float(b) for b in range(10))
    frames: int = 61
    n_particles: int = 32
    n_systems: int = 32
    delta: float = 0.1
    pairs: Literal["all", "first"] = "all"
    seed: int = 0
    beta_block: int = 2

    def __post_init__(self) -> None:
        object.__setattr__(self, "dims", tuple(int(d) for d in self.dims))
        object.__setattr__(self, "betas", tuple(float(b) for b in self.betas))
        if not self.dims or min(self.dims) < 2:
            raise ParameterError(
                "dims", "{name} must be a non-empty list of d >= 2", "pass e.g. {name} 2,8,32"
            )
        if not self.betas or not all(math.isfinite(b) for b in self.betas):
            raise ParameterError("betas", "{name} must be a non-empty list of finite numbers")
        if self.frames < 2:
            raise UserError("frames must be >= 2")
        if self.n_particles < 2 or self.n_systems < 1:
            raise UserError("phase diagrams need n_particles >= 2 and n_systems >= 1")
        if not (0 < self.delta < 2):
            raise ParameterError("delta", f"{{name}} must be in (0, 2), not {self.delta}")
        if self.pairs not in ("all", "first"):
            raise UserError(f"pairs must be all or first, not {self.pairs!r}")
        if self.solver not in ("rk4", "euler", "projected-euler"):
            raise UserError(
                f"unknown phase-diagram integrator {self.solver!r}",
                "use rk4, projected-euler or euler",
            )
        if self.beta_block < 1:
            raise UserError("beta_block must be >= 1")
        super().__post_init__()  # normalization, time, t_max, dt

    @property
    def times(self) -> np.ndarray:
        return np.linspace(0.0, self.t_max, self.frames)

    def blocks(self) -> list[tuple[int, int, int]]:
        """Tasks ``(dim_index, beta_start, beta_stop)``."""
        nb = len(self.betas)
        return [
            (i, j, min(nb, j + self.beta_block))
            for i in range(len(self.dims))
            for j in range(0, nb, self.beta_block)
        ]

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["dims"], out["betas"] = list(self.dims), list(self.betas)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PhaseDiagramConfig:
        return cls(**data)


def equiangular_rate(rho: float, beta: float, n: int, normalization: str) -> float:
    """``d rho / dt`` of ``n`` equiangular tokens (see the module docstring)."""
    if normalization == "usa":
        return 2 * math.exp(beta * rho) * (1 - rho) * (1 + (n - 1) * rho) / n
    # SA, divided through by e^{beta rho} to stay finite
    return 2 * (1 - rho) * (1 + (n - 1) * rho) / (math.exp(beta * (1 - rho)) + n - 1)


def equiangular_merge_time(
    beta: float, n: int, delta: float, normalization: str = "sa", t_max: float = math.inf
) -> float:
    """The time at which the equiangular ``rho(t)`` (``rho(0) = 0``) reaches
    ``1 - delta``; ``inf`` if not before ``t_max`` (default: no limit)."""
    from scipy.integrate import quad

    # t = int_0^{1-delta} d rho / rho'(rho): rho' > 0 on [0, 1), a 1-D quadrature
    value, _ = quad(
        lambda r: 1.0 / equiangular_rate(r, beta, n, normalization),
        0.0,
        1.0 - delta,
        epsabs=0.0,
        epsrel=1e-12,
        limit=200,
    )
    return value if value <= t_max else math.inf


def merged_fraction(states: np.ndarray, delta: float, pairs: str = "all") -> np.ndarray:
    """Fraction of merged pairs per time: ``states (S, T, n, d) -> (T,)``."""
    if pairs == "first":
        inner = np.einsum("std,std->st", states[:, :, 0], states[:, :, 1])  # (S, T)
        return (inner >= 1 - delta).mean(axis=0)
    n = states.shape[2]
    gram = np.einsum("stid,stjd->stij", states, states)  # (S, T, n, n)
    upper = np.triu_indices(n, k=1)
    return (gram[:, :, upper[0], upper[1]] >= 1 - delta).mean(axis=(0, 2))


def starts(config: PhaseDiagramConfig, dim: int):
    """The ``(S, n, d)`` random starts for dimension ``dim`` (seed ``seed + d``)."""
    return uniform(config.n_particles, dim, seed=config.seed + dim, batch=config.n_systems)


def compute_block(config: PhaseDiagramConfig, dim_index: int, start: int, stop: int) -> np.ndarray:
    """``merged_probability`` for one ``d`` and ``betas[start:stop]``: ``(stop - start, T)``.

    Sets torch to one thread and leaves it so (the result must not depend on
    the worker; restoring it here would race with concurrent tasks in threaded
    workers); :func:`phase_diagram` restores the caller's setting at the end."""
    import torch

    torch.set_num_threads(1)
    dim = config.dims[dim_index]
    x0 = starts(config, dim)
    out = np.empty((stop - start, config.frames))
    for row, beta in enumerate(config.betas[start:stop]):
        ds = simulate(
            config.dynamics_at(beta),
            x0,
            t_max=config.t_max,
            dt=config.dt,
            solver=config.solver,
            saveat=SaveAt(times=config.times),
        )
        out[row] = merged_fraction(ds.states.values, config.delta, config.pairs)
    return out


def _template(config: PhaseDiagramConfig, lazy: bool) -> xr.Dataset:
    shape = (len(config.dims), len(config.betas), config.frames)
    chunks = (1, config.beta_block, config.frames)
    if lazy:
        import dask.array as da

        prob = da.full(shape, np.nan, chunks=chunks)
        done = da.zeros(shape[:2], dtype=np.int8, chunks=chunks[:2])
    else:
        prob, done = np.full(shape, np.nan), np.zeros(shape[:2], dtype=np.int8)
    curve = [
        equiangular_merge_time(b, config.n_particles, config.delta, config.normalization)
        for b in config.betas
    ]
    return xr.Dataset(
        {
            VARIABLE: (("dim", "beta", "time"), prob),
            "completed": (("dim", "beta"), done),
            "equiangular_time": (("beta",), np.asarray(curve, dtype=np.float64)),
        },
        coords={
            "dim": np.asarray(config.dims, dtype=np.int64),
            "beta": np.asarray(config.betas, dtype=np.float64),
            "time": config.times,
        },
        attrs={"tokenfield_config": json.dumps(config.to_dict()), "kind": "meanfield-phase"},
    )


def create_store(config: PhaseDiagramConfig, store: str | Path, *, overwrite: bool = False) -> bool:
    """Create the full-size store (metadata, coordinates, the equiangular curve;
    the probabilities NaN and ``completed`` 0). Returns ``False`` when a store
    made with the same config is already there (to be resumed)."""
    import zarr

    store = Path(store)
    if store.exists() and not overwrite:
        try:
            existing = xr.open_zarr(store, consolidated=False)
            same = json.loads(existing.attrs.get("tokenfield_config", "null")) == config.to_dict()
        except Exception:  # not a readable store
            same = False
        if same:
            return False
        raise UserError(
            f"'{store}' holds another sweep (or is not a phase-diagram store)",
            "pass --overwrite or another --out",
        )
    from tokenfield.runs.store import store_encoding

    template = _template(config, lazy=True)
    for name in (VARIABLE, "completed"):
        template[name].encoding["chunks"] = template[name].data.chunksize
    # every chunk checksummed (a damaged chunk is an error on read, not wrong numbers)
    for name, encoding in store_encoding(template).items():
        template[name].encoding["compressors"] = encoding["compressors"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        template.to_zarr(store, mode="w", compute=False, consolidated=False)
        template[["equiangular_time"]].to_zarr(store, mode="r+", consolidated=False)
        # region writes change no metadata, so the consolidated copy stays valid
        # and plain xarray.open_zarr(store) opens the sweep without warnings
        zarr.consolidate_metadata(str(store))
    return True


def write_block(
    config: PhaseDiagramConfig, store: str | Path, dim_index: int, start: int, stop: int
) -> tuple[int, int, int]:
    """Compute one task and write its region of ``store``."""
    values = compute_block(config, dim_index, start, stop)
    part = xr.Dataset(
        {
            VARIABLE: (("dim", "beta", "time"), values[None]),
            "completed": (("dim", "beta"), np.ones((1, stop - start), dtype=np.int8)),
        }
    )
    region = {"dim": slice(dim_index, dim_index + 1), "beta": slice(start, stop)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        part.to_zarr(store, region=region, consolidated=False)
    return dim_index, start, stop


def _pending(config: PhaseDiagramConfig, store: Path) -> list[tuple[int, int, int]]:
    done = xr.open_zarr(store, consolidated=False)["completed"].values
    return [b for b in config.blocks() if not done[b[0], b[1] : b[2]].all()]


@dataclass
class SweepReport:
    """What a sweep did: tasks run, tasks skipped (resumed), where."""

    tasks_run: int
    tasks_skipped: int
    executor: str
    scheduler: str | None = None
    workers: list[str] = field(default_factory=list)


def phase_diagram(
    config: PhaseDiagramConfig,
    *,
    store: str | Path | None = None,
    executor: Literal["inprocess", "dask"] = "inprocess",
    scheduler: str | None = None,
    n_workers: int = 2,
    overwrite: bool = False,
    report: SweepReport | None = None,
    progress: Callable[[int, int], Any] | None = None,
) -> xr.Dataset:
    """Run the sweep and return the Dataset ``merged_probability (dim, beta, time)``,
    ``completed (dim, beta)``, ``equiangular_time (beta)``.

    Args:
        config: the sweep.
        store: a Zarr store path; every task writes its region there. Needed
            for ``executor="dask"``; without it (in process) nothing is written.
        executor: ``"inprocess"`` (tasks one after another here) or ``"dask"``.
        scheduler: address of an existing Dask scheduler (``tcp://host:8786``);
            default: a ``LocalCluster(processes=False, n_workers=n_workers)``.
            The store must be reachable by every worker (a shared filesystem).
        n_workers: workers of the default local cluster.
        overwrite: replace a store holding another sweep.
        report: filled in with what ran.
        progress: called as ``progress(done, total)`` (tasks) at the start and
            after each task.

    Returns:
        The Dataset above (opened from ``store`` when given), its config in
        ``attrs["tokenfield_config"]``.

    Raises:
        UserError: an unknown executor, ``"dask"`` without ``store``, or a
            store holding another sweep (without ``overwrite``).

    Example:
        >>> config = tf.PhaseDiagramConfig(dims=(2,), betas=(0.0, 4.0), t_max=5.0,
        ...                                frames=6, n_particles=8, n_systems=2)
        >>> phase = tf.phase_diagram(config)
        >>> dict(phase.merged_probability.sizes)
        {'dim': 1, 'beta': 2, 'time': 6}
    """
    if executor not in ("inprocess", "dask"):
        raise UserError(f"unknown executor {executor!r}", "use inprocess or dask")
    import torch

    threads = torch.get_num_threads()
    try:
        return _phase_diagram(
            config, store, executor, scheduler, n_workers, overwrite, report, progress
        )
    finally:
        torch.set_num_threads(threads)


def _phase_diagram(
    config: PhaseDiagramConfig,
    store: str | Path | None,
    executor: str,
    scheduler: str | None,
    n_workers: int,
    overwrite: bool,
    report: SweepReport | None,
    progress: Callable[[int, int], Any] | None = None,
) -> xr.Dataset:
    tick = progress or (lambda done, total: None)
    if store is None:
        if executor == "dask" or scheduler is not None:
            raise UserError("a Dask sweep writes into a Zarr store", "pass --out DIR")
        ds = _template(config, lazy=False)
        blocks = config.blocks()
        tick(0, len(blocks))
        for done, (i, start, stop) in enumerate(blocks, 1):
            ds[VARIABLE][i, start:stop] = compute_block(config, i, start, stop)
            ds["completed"][i, start:stop] = 1
            tick(done, len(blocks))
        if report is not None:
            report.tasks_run, report.executor = len(config.blocks()), executor
        return ds
    store = Path(store)
    client = None
    if scheduler is not None:
        # A bad address or one that does not answer fails before the store exists.
        from tokenfield._dask import connect

        client = connect(scheduler)
    try:
        create_store(config, store, overwrite=overwrite)
    except BaseException:
        if client is not None:
            client.close()
        raise
    pending = _pending(config, store)
    if report is not None:
        report.tasks_run = len(pending)
        report.tasks_skipped = len(config.blocks()) - len(pending)
        report.executor = "dask" if (executor == "dask" or scheduler) else "inprocess"
    tick(0, len(pending))
    if executor == "dask" or scheduler is not None:
        _run_dask(config, store, pending, client, n_workers, report, tick)
    else:
        for done, task in enumerate(pending, 1):
            write_block(config, store, *task)
            tick(done, len(pending))
    return xr.open_zarr(store, consolidated=False).load()


def _run_dask(
    config: PhaseDiagramConfig,
    store: Path,
    tasks: list[tuple[int, int, int]],
    client: Any,
    n_workers: int,
    report: SweepReport | None,
    tick: Callable[[int, int], Any] = lambda done, total: None,
) -> None:
    """Run ``tasks`` on ``client`` (a connected scheduler's) or, when it is ``None``,
    on a new in-process cluster of ``n_workers`` threads (loopback, no dashboard)."""
    from tokenfield._dask import run_tasks

    done = [0]

    def finished(_result: Any) -> None:
        done[0] += 1
        tick(done[0], len(tasks))

    where = str(store.resolve())
    address, workers = run_tasks(
        [(None, write_block, (config, where, *task)) for task in tasks],
        finished,
        client=client,
        n_workers=n_workers,
        processes=False,
    )
    if report is not None:
        report.scheduler, report.workers = address, workers


def summarize(ds: xr.Dataset) -> dict[str, Any]:
    """JSON summary: per ``(d, beta)``, the first saved time at which at least
    half of the pairs have merged, beside the equiangular time."""
    times = ds["time"].values
    rows = []
    for dim in ds["dim"].values:
        for beta in ds["beta"].values:
            prob = ds[VARIABLE].sel(dim=dim, beta=beta).values
            over = np.flatnonzero(prob >= 0.5)
            rows.append(
                {
                    "dim": int(dim),
                    "beta": float(beta),
                    "half_merged_time": float(times[over[0]]) if over.size else None,
                    "equiangular_time": _finite(ds["equiangular_time"].sel(beta=beta).item()),
                    "final_probability": float(prob[-1]),
                }
            )
    return {"config": json.loads(ds.attrs["tokenfield_config"]), "rows": rows}


def _finite(value: float) -> float | None:
    return to_jsonable(float(value))

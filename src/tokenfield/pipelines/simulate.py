"""The workflow of ``tokenfield simulate``: a :class:`SimulationRecipe` (every
choice of the command, validated on construction) becomes a start, a
:class:`~tokenfield.particles.Dynamics` and a solver, and is integrated into a
run directory (:func:`simulate_run`).

The recipe's fields are the library's names (``normalization``, ``solver``,
``n_particles``, ...); ``tokenfield`` maps them to its flags when it reports an
error (``tokenfield.cli._options.PARAM_FLAGS``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import xarray as xr

from tokenfield._device import parse_device
from tokenfield._lock import writer_lock
from tokenfield._progress import ProgressBar
from tokenfield.errors import ParameterError, UserError
from tokenfield.particles import Adaptive, Dynamics, SaveAt, random_matrices, simulate
from tokenfield.particles.init import initial_condition
from tokenfield.particles.integrate import SimulationSpec, Solver, get_solver

__all__ = [
    "DTYPES",
    "ENSEMBLES",
    "STATE_COPIES",
    "SimulationRecipe",
    "available_memory",
    "check_memory",
    "large_step_warning",
    "simulate_run",
]

DTYPES = ("float64", "float32")
ENSEMBLES = ("identity", "gaussian", "orthogonal", "symmetric")
# Copies of the state a step holds at once (start, RK4 stages, the retraction,
# the frame kept for saving), with room to spare.
STATE_COPIES = 12
# The defaults of a synthetic start (a run: start takes the run's sizes).
DEFAULT_N_PARTICLES = 32
DEFAULT_DIM = 3


@dataclass(frozen=True)
class SimulationRecipe(SimulationSpec):
    """Everything one simulation is made of, checked once, on construction.

    Args:
        normalization: ``sa`` (softmax attention, weights / Z_i) or ``usa``
            (unnormalised, weights / n).
        dim: the dimension d (particles on S^{d-1}); default 3, or the run's.
        n_particles: how many particles; default 32, or the prompt's tokens.
        beta: the inverse temperature.
        t_max, dt: the final time and the step (adaptive: the first step tried).
        solver: ``euler``, ``projected-euler``, ``rk4`` or ``adaptive``.
        init: ``uniform``, ``equispaced``, ``orthogonal``, ``caps``, or
            ``run:PATH[@LAYER]`` (:func:`~tokenfield.particles.init.initial_condition`).
        noise: Gaussian noise added to the start, then renormalised.
        seed: seed of the start and of the random matrices.
        save_every: keep every k-th step.
        dtype: ``float64`` or ``float32``.
        device: ``cpu``, ``cuda``, ``cuda:N`` or ``auto``.
        causal, time, state: passed to :class:`~tokenfield.particles.Dynamics`.
        matrices: Q, K, V: ``identity``, or random ``gaussian``, ``orthogonal`` or
            ``symmetric`` (seeded ``seed + 1000 (i + 1)`` for Q, K, V).
        heads: attention heads (averaged); more than one draws random matrices.
        caps, cap_radius: the ``caps`` start.
        prompt_index: which prompt of a ``run:`` start.
        batch: how many independent systems at once (``None``: one).
        rtol, atol: the adaptive solver's tolerances.

    Raises:
        ParameterError: a bad ``dtype``, ``matrices``, ``heads``, ``t_max`` or ``dt``.
        UserError: an unknown solver or device, bad tolerances.
    """

    # normalization, time, t_max, dt and solver: SimulationSpec's
    dim: int | None = None
    n_particles: int | None = None
    beta: float = 1.0
    init: str = "uniform"
    noise: float = 0.0
    seed: int = 0
    save_every: int = 1
    dtype: str = "float64"
    device: str = "cpu"
    causal: bool = False
    state: str = "sphere"
    matrices: str = "identity"
    heads: int = 1
    caps: int = 2
    cap_radius: float = 0.2
    prompt_index: int = 0
    batch: int | None = None
    rtol: float = 1e-6
    atol: float = 1e-9

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ParameterError(
                "dtype", f"unknown {{name}} '{self.dtype}'", "use float64 or float32"
            )
        if self.matrices not in ENSEMBLES:
            raise ParameterError(
                "matrices",
                f"unknown {{name}} '{self.matrices}'",
                f"use one of {', '.join(ENSEMBLES)}",
            )
        if self.heads < 1:
            raise ParameterError("heads", f"{{name}} must be >= 1, not {self.heads}")
        super().__post_init__()  # beta, noise, n and dim are checked where they are used
        parse_device(self.device)
        self.make_solver()

    @property
    def from_run(self) -> bool:
        """Whether the start is a traced run's tokens (``init="run:..."``)."""
        return self.init.startswith("run:")

    def make_solver(self) -> Solver:
        """The solver instance (the adaptive one with the recipe's tolerances)."""
        if self.solver == "adaptive":
            return Adaptive(rtol=self.rtol, atol=self.atol)
        return get_solver(self.solver)

    def start(self) -> torch.Tensor:
        """The initial condition ``(n, d)`` or ``(batch, n, d)``; a synthetic one
        is refused before allocating when it would not fit in memory."""
        n, dim = self.n_particles, self.dim
        if not self.from_run:
            n = DEFAULT_N_PARTICLES if n is None else n
            dim = DEFAULT_DIM if dim is None else dim
            check_memory(n, dim, self.batch, self.dtype)
        return initial_condition(
            self.init,
            n,
            dim,
            seed=self.seed,
            noise=self.noise,
            batch=self.batch,
            caps_count=self.caps,
            cap_radius=self.cap_radius,
            prompt_index=self.prompt_index,
        )

    def dynamics(self, dim: int) -> Dynamics:
        """The vector field in dimension ``dim`` (random Q, K, V when asked)."""
        query = key = value = None
        if self.matrices != "identity" or self.heads > 1:
            query, key, value = (
                random_matrices(
                    dim, heads=self.heads, ensemble=self.matrices, seed=self.seed + 1000 * (i + 1)
                )
                for i in range(3)
            )
        return Dynamics(
            beta=self.beta,
            normalization=self.normalization,
            query=query,
            key=key,
            value=value,
            causal=self.causal,
            state=self.state,
            time=self.time,
        )

    def extra_config(self) -> dict[str, Any]:
        """What the run config records beyond the dynamics and the solver."""
        caps = self.init == "caps"
        return {
            "init": {
                "spec": self.init,
                "noise": self.noise,
                "seed": self.seed,
                "caps": self.caps if caps else None,
                "cap_radius": self.cap_radius if caps else None,
                "prompt_index": self.prompt_index if self.from_run else None,
            },
            "matrices": {"ensemble": self.matrices, "heads": self.heads, "seed": self.seed},
        }


def simulate_run(
    recipe: SimulationRecipe,
    out: str | Path,
    *,
    overwrite: bool = False,
    progress: bool = False,
    warn: Callable[[str], None] | None = None,
) -> xr.Dataset:
    """Integrate ``recipe`` into the run directory ``out`` (resumed when it holds an
    interrupted run of the same recipe; replaced with ``overwrite``).

    Nothing is created before the start is built (a bad ``init`` or a system too
    large leaves no directory). ``warn`` is called with one sentence when a fixed
    step moves particles by a large angle (:func:`large_step_warning`).

    Returns:
        The run, opened from disk (lazy).
    """
    solver = recipe.make_solver()
    x0 = recipe.start()
    model = recipe.dynamics(int(x0.shape[-1]))
    with writer_lock(out, what="run"):
        if recipe.solver != "adaptive" and warn is not None:
            message = large_step_warning(model, x0, recipe.dt)
            if message:
                warn(message)
        counter = "t = {task.completed:.3g} / {task.total:.3g}"
        bar = ProgressBar(
            "simulate", total=recipe.t_max, counter=counter, transient=True, enabled=progress
        )
        with bar:
            return simulate(
                model,
                x0,
                t_max=recipe.t_max,
                dt=recipe.dt,
                solver=solver,
                saveat=SaveAt(every=recipe.save_every),
                dtype=getattr(torch, recipe.dtype),
                device=parse_device(recipe.device),
                out=out,
                overwrite=overwrite,
                extra_config=recipe.extra_config(),
                progress=lambda t: bar.update(completed=t),
            )


def available_memory() -> int | None:
    """Bytes of memory available now (``MemAvailable``), or ``None`` if unknown."""
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def check_memory(n: int, dim: int, batch: int | None, dtype: str) -> None:
    """Refuse, before allocating anything, a system too large for this machine."""
    if n < 1 or dim < 1 or (batch is not None and batch < 1):
        return  # the initial condition reports these
    itemsize = 8 if dtype == "float64" else 4
    state = (batch or 1) * n * dim * itemsize
    need = state * STATE_COPIES
    available = available_memory()
    if available is not None and need > available:
        raise UserError(
            f"--n-particles {n} in d = {dim}{f' x {batch} systems' if batch else ''} needs about "
            f"{_size(need)} of memory ({_size(state)} per copy of the states); "
            f"{_size(available)} is available",
            "use a smaller --n-particles, --dim or --seeds",
        )


def _size(count: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if count < 1000 or unit == "TB":
            return f"{count:.3g} {unit}"
        count /= 1000
    return f"{count:.3g} TB"


def large_step_warning(model: Dynamics, x0: Any, dt: float) -> str | None:
    """A warning when one fixed step moves particles by a large angle (unstable
    integration), else ``None``.

    In the papers' time the USA velocity scales like exp(beta) / n, so at large beta a
    step that looks small can move a particle by radians. The check uses the
    velocity at the start and at a random configuration of the same size (a start
    near a fixed point, like equally spaced particles, has almost none); 0.1 rad
    per step is where Euler stops tracking the flow well.
    """
    x = torch.as_tensor(x0, dtype=torch.float64)
    if x.ndim == 3:
        x = x[0]
    generator = torch.Generator().manual_seed(0)
    probe = torch.randn(x.shape, generator=generator, dtype=torch.float64)
    probe = probe / probe.norm(dim=-1, keepdim=True)
    field = model.to(torch.float64)
    speed = max(float(field.vector_field(0.0, y).norm(dim=-1).max()) for y in (x, probe))
    angle = speed * dt
    if angle <= 0.1:
        return None
    suggestion = 0.05 / speed
    return (
        f"at t = 0 the fastest particle moves {angle:.2g} rad per step; the fixed-step "
        f"integration is likely inaccurate or unstable. Use --dt {suggestion:.2g} or "
        "smaller, --solver adaptive, or --time rescaled."
    )

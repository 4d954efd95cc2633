"""Initial conditions: seeded particle clouds on the sphere, or a real run's tokens.

Every function returns ``(n, d)`` (or ``(batch, n, d)``) unit vectors, drawn
on the CPU in float64 from a ``torch.Generator`` seeded with ``seed`` and then
cast, so the same seed gives the same cloud on every device and dtype.

- ``uniform``: uniform on ``S^{d-1}`` (normalised Gaussians).
- ``equispaced``: ``n`` points equally spaced on the great circle of the first
  two coordinates (then ``noise`` breaks the symmetry).
- ``orthogonal``: ``n`` random orthonormal vectors (needs ``d >= n``).
- ``caps``: ``k`` well separated caps of angular radius ``cap_radius``,
  particles dealt round-robin.
- ``run:PATH`` or ``run:PATH@LAYER``: the normalised states of one prompt of a
  traced run at time index ``LAYER`` (default 0; negative counts from the end).

``noise`` adds ``N(0, noise^2 I)`` to every particle before the final
normalisation.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from tokenfield.errors import ParameterError, UserError
from tokenfield.runs import open_run

KINDS = ("uniform", "equispaced", "orthogonal", "caps")


def _normalize(x: torch.Tensor) -> torch.Tensor:
    return x / x.norm(dim=-1, keepdim=True)


def _check_size(n: int, d: int) -> None:
    if int(n) < 1:
        raise ParameterError(
            "n_particles",
            f"the number of particles must be n >= 1, not {n}",
            "pass {name} 1 or more",
        )
    if int(d) < 2:
        raise ParameterError(
            "dim", f"the dimension must be d >= 2, not {d}", "pass {name} 2 or more"
        )


def _shape(batch: int | None, n: int, d: int) -> tuple[int, ...]:
    if batch is not None and int(batch) < 1:
        raise UserError(f"batch must be >= 1, not {batch}")
    return (n, d) if batch is None else (int(batch), n, d)


def uniform(n: int, d: int, *, seed: int = 0, batch: int | None = None) -> torch.Tensor:
    """``n`` i.i.d. uniform points on ``S^{d-1}``: ``(n, d)`` float64."""
    _check_size(n, d)
    gen = torch.Generator().manual_seed(int(seed))
    return _normalize(torch.randn(_shape(batch, n, d), generator=gen, dtype=torch.float64))


def equispaced(n: int, d: int, *, batch: int | None = None) -> torch.Tensor:
    """``x_i = (cos 2 pi i/n, sin 2 pi i/n, 0, ..., 0)``: ``(n, d)`` float64."""
    _check_size(n, d)
    angle = 2 * math.pi * torch.arange(n, dtype=torch.float64) / n
    x = torch.zeros(n, d, dtype=torch.float64)
    x[:, 0], x[:, 1] = torch.cos(angle), torch.sin(angle)
    return x if batch is None else x.expand(_shape(batch, n, d)).clone()


def orthogonal(n: int, d: int, *, seed: int = 0, batch: int | None = None) -> torch.Tensor:
    """``n`` random orthonormal vectors in ``R^d`` (Haar frame); needs ``d >= n``."""
    _check_size(n, d)
    if n > d:
        raise UserError(
            f"cannot place n = {n} orthogonal particles in d = {d} dimensions",
            "use --dim at least --n-particles, or another --init",
        )
    gen = torch.Generator().manual_seed(int(seed))
    g = torch.randn(_shape(batch, d, n), generator=gen, dtype=torch.float64)
    q, r = torch.linalg.qr(g)  # (..., d, n)
    q = q * torch.sign(torch.diagonal(r, dim1=-2, dim2=-1)).unsqueeze(-2)
    return q.transpose(-1, -2).contiguous()  # (..., n, d)


def _cap_centres(k: int, d: int, gen: torch.Generator) -> torch.Tensor:
    """``k`` well separated unit vectors: +-e_i first (pairwise angle >= 90 deg),
    then farthest-point picks from random candidates."""
    eye = torch.eye(d, dtype=torch.float64)
    basis = torch.stack([s * eye[i] for i in range(d) for s in (1.0, -1.0)])  # (2d, d)
    if k <= 2 * d:
        return basis[:k]
    candidates = _normalize(torch.randn(64 * k, d, generator=gen, dtype=torch.float64))
    centres = [c for c in basis]
    nearest = (candidates @ basis.T).max(dim=1).values  # (m,)
    while len(centres) < k:
        pick = int(torch.argmin(nearest))
        centres.append(candidates[pick])
        nearest = torch.maximum(nearest, candidates @ candidates[pick])
    return torch.stack(centres)


def caps(
    n: int,
    d: int,
    *,
    k: int = 2,
    cap_radius: float = 0.2,
    seed: int = 0,
    batch: int | None = None,
) -> torch.Tensor:
    """``n`` particles in ``k`` separated caps of angular radius ``cap_radius``.

    Particle ``i`` goes to cap ``i mod k``, at a geodesic distance
    ``cap_radius * U^(1/(d-1))`` from its centre in a uniform random direction
    (uniform in the tangent ball; close to uniform on a small cap).
    """
    _check_size(n, d)
    if int(k) < 1:
        raise ParameterError(
            "caps", f"the number of caps must be >= 1, not {k}", "pass {name} 1 or more"
        )
    if not (0.0 <= cap_radius < math.pi / 2):
        raise UserError(f"cap_radius must be in [0, pi/2), not {cap_radius}")
    gen = torch.Generator().manual_seed(int(seed))
    centres = _cap_centres(int(k), d, gen)  # (k, d)
    shape = _shape(batch, n, d)
    centre = centres[torch.arange(n) % int(k)].expand(shape)  # (..., n, d)
    direction = torch.randn(shape, generator=gen, dtype=torch.float64)
    direction = _normalize(direction - (direction * centre).sum(-1, keepdim=True) * centre)
    u = torch.rand(shape[:-1], generator=gen, dtype=torch.float64).unsqueeze(-1)
    angle = cap_radius * u ** (1.0 / (d - 1))
    return torch.cos(angle) * centre + torch.sin(angle) * direction


def add_noise(x: torch.Tensor, noise: float, *, seed: int = 0) -> torch.Tensor:
    """``normalize(x + noise * N(0, I))`` (seeded; independent of the init's stream)."""
    if not math.isfinite(noise) or noise < 0:
        raise ParameterError(
            "noise", f"{{name}} must be a finite number >= 0, not {noise}", "pass {name} 0 or more"
        )
    if noise == 0:
        return x
    gen = torch.Generator().manual_seed(int(seed) + 0x5EED)
    perturbation = torch.randn(x.shape, generator=gen, dtype=torch.float64)
    return _normalize(x + noise * perturbation)


def parse_run_spec(spec: str) -> tuple[Path, int]:
    """``run:PATH`` or ``run:PATH@LAYER`` -> ``(PATH, LAYER)``."""
    body = spec[len("run:") :]
    layer = 0
    if "@" in body:
        body, _, text = body.rpartition("@")
        try:
            layer = int(text)
        except ValueError:
            raise UserError(
                f"'{text}' in '{spec}' is not a layer index",
                "write run:PATH@LAYER, e.g. run:runs/x@3",
            ) from None
    if not body:
        raise UserError(f"'{spec}' names no run", "write run:PATH or run:PATH@LAYER")
    return Path(body), layer


def from_run(
    path: str | Path,
    *,
    layer: int = 0,
    prompt_index: int = 0,
    dim: int | None = None,
) -> torch.Tensor:
    """The normalised token states of one prompt of a run at one time index.

    Args:
        path: a traced run directory (other kinds are refused).
        layer: index along ``time`` (``0`` = the embedding output of a trace;
            negative counts from the end).
        prompt_index: which prompt, when the run has a ``prompt_index``
            coordinate; otherwise every particle is taken.
        dim: keep the full feature dimension (``None``), or project onto the
            first ``dim`` principal directions of the *uncentred* second-moment
            matrix of the normalised states (the rank-``dim`` truncation that
            best preserves the inner products ``<x_i, x_j>`` that drive the
            dynamics), then normalise again.

    Returns:
        ``(n, d)`` float64 unit vectors, ``n`` = the prompt's token count.
    """
    ds = open_run(path)
    kind = ds.attrs["run"]["kind"]
    if kind != "trace":
        raise UserError(
            f"'{path}' is a {kind} run; run: initial conditions take a traced run",
            "pass a directory written by 'tokenfield trace'",
        )
    if "states" not in ds:
        raise UserError(f"run '{path}' has no 'states' variable", "pass a trace or simulation run")
    states = ds["states"]
    if "system" in states.dims:
        states = states.isel(system=0)
    steps = states.sizes["time"]
    if not -steps <= layer < steps:
        raise UserError(
            f"layer {layer} is out of range for run '{path}' ({steps} time steps)",
            f"pick a layer in 0..{steps - 1}",
        )
    states = states.isel(time=layer)
    if "prompt_index" in states.coords:
        available = np.unique(states["prompt_index"].values)
        if prompt_index not in available:
            raise UserError(
                f"run '{path}' has no prompt_index {prompt_index}",
                f"pick one of {available[:10].tolist()}",
            )
        keep = np.flatnonzero(states["prompt_index"].values == prompt_index)
        states = states.isel(particle=keep)
    x = np.asarray(states.transpose("particle", "feature").values, dtype=np.float64)  # (n, D)
    if not np.isfinite(x).all():
        raise UserError(f"run '{path}' has non-finite states at layer {layer}")
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    if (norms == 0).any():
        raise UserError(f"run '{path}' has zero states at layer {layer}; cannot normalise them")
    x = x / norms
    full = x.shape[1]
    if dim is not None and dim != full:
        if dim < 2 or dim > full:
            raise UserError(
                f"cannot project {full}-dimensional states to d = {dim}",
                f"pass --dim between 2 and {full}, or omit it",
            )
        if dim > x.shape[0] and x.shape[0] < 2:
            # One token spans one direction: no --dim of 2 or more can hold it.
            # A run traced with --positions last keeps one token per prompt.
            positions = ds.attrs["run"].get("config", {}).get("positions")
            why = " (it was traced with --positions last)" if positions == "last" else ""
            raise UserError(
                f"prompt {prompt_index} of '{path}' has one token{why}, and --dim {dim} "
                "needs at least as many tokens as dimensions",
                "trace the prompts with --positions all to keep every token, "
                "e.g. tokenfield trace -m smollm2 -p seed-spectrum --positions all -o runs/x",
            )
        if dim > x.shape[0]:
            # n tokens span at most n principal directions.
            raise UserError(
                f"--dim {dim} exceeds the {x.shape[0]} tokens of prompt {prompt_index} in "
                f"'{path}' (n tokens span at most n directions)",
                f"pass --dim {x.shape[0]} or less, or pick a longer prompt with --prompt-index",
            )
        _, _, vt = np.linalg.svd(x, full_matrices=False)  # uncentred principal directions
        vt = vt[:dim]  # (dim, D)
        # deterministic signs: the largest entry of each direction is positive
        vt *= np.sign(vt[np.arange(dim), np.abs(vt).argmax(axis=1)])[:, None]
        x = x @ vt.T  # (n, dim)
        norms = np.linalg.norm(x, axis=1, keepdims=True)
        if (norms < 1e-12).any():
            raise UserError(
                f"a token has no component in the first {dim} principal directions",
                "pass a larger --dim",
            )
        x = x / norms
    return torch.from_numpy(np.ascontiguousarray(x))


def initial_condition(
    spec: str,
    n: int | None,
    d: int | None,
    *,
    seed: int = 0,
    noise: float = 0.0,
    batch: int | None = None,
    caps_count: int = 2,
    cap_radius: float = 0.2,
    prompt_index: int = 0,
    dtype: torch.dtype = torch.float64,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """Build the initial condition named by ``spec`` (see the module docstring).

    ``n`` and ``d`` are required for the synthetic kinds; for ``run:`` they may
    be ``None`` (taken from the run) and, when given, must match it (``d`` may be
    smaller: a principal-direction projection).

    Args:
        spec: ``"uniform"``, ``"equispaced"``, ``"orthogonal"``, ``"caps"``, or
            ``"run:PATH"`` / ``"run:PATH@LAYER"`` (a traced run's tokens).
        n: the number of particles.
        d: the dimension (points on ``S^{d-1}``).
        seed: seeds the draw (the same cloud on every device and dtype).
        noise: standard deviation of Gaussian noise added before normalising.
        batch: draw this many independent systems, ``(batch, n, d)``.
        caps_count: the number of caps (``"caps"``).
        cap_radius: the caps' angular radius (``"caps"``).
        prompt_index: which prompt of the run (``"run:"``).
        dtype: the returned dtype (drawn in float64, then cast).
        device: the returned device.

    Returns:
        ``(n, d)`` or ``(batch, n, d)`` in ``dtype`` on ``device``.

    Example:
        >>> x0 = tf.initial_condition("uniform", n=8, d=3, seed=0)
        >>> tuple(x0.shape), x0.dtype
        ((8, 3), torch.float64)
        >>> tuple(tf.initial_condition("caps", n=10, d=4, caps_count=3, batch=2).shape)
        (2, 10, 4)
    """
    if spec.startswith("run:"):
        path, layer = parse_run_spec(spec)
        x = from_run(path, layer=layer, prompt_index=prompt_index, dim=d)
        if n is not None and n != x.shape[0]:
            raise UserError(
                f"--n-particles {n} does not match the {x.shape[0]} tokens of prompt {prompt_index} in '{path}'",
                "omit --n-particles with a run: init",
            )
        if batch is not None:
            x = x.expand(int(batch), *x.shape).clone()
    else:
        if n is None or d is None:
            raise UserError(f"--init {spec} needs both --n-particles and --dim")
        if spec == "uniform":
            x = uniform(n, d, seed=seed, batch=batch)
        elif spec == "equispaced":
            x = equispaced(n, d, batch=batch)
        elif spec == "orthogonal":
            x = orthogonal(n, d, seed=seed, batch=batch)
        elif spec == "caps":
            x = caps(n, d, k=caps_count, cap_radius=cap_radius, seed=seed, batch=batch)
        else:
            raise UserError(
                f"unknown initial condition '{spec}'",
                "use uniform, equispaced, orthogonal, caps, run:PATH or run:PATH@LAYER",
            )
    x = add_noise(x, noise, seed=seed)
    return x.to(dtype=dtype, device=device)

"""The ``tokenfield attractors`` workflow: is the layer map an attractor?

Reads a traced run, loads its model (and a random-weight copy: ``baseline``'s
model, or :func:`tokenfield.pipelines.flow.random_copy`), measures with
:mod:`tokenfield.models.layer_map` and :mod:`tokenfield.models.jacobian` for each
prompt's last token

1. the top-k singular values of every block's Jacobian and of its angular part;
2. the finite-time Lyapunov exponents to the output from every start block;
3. perturbation recovery on a theta grid (random tangent directions and the
   most sensitive one) and the basin radius;
4. category basins along great circles between prompts (switch slope);

summarises with :mod:`tokenfield.analysis.attractors` (bootstrap over prompts,
verdicts on the rules of ``docs/attractors.md``) and writes ``attractors.json``
and ``attractors.zarr`` atomically into the run (or ``out``), and the report
fragment ``attractors.html`` (``tokenfield report --section RUN/attractors.html``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tokenfield.analysis import attractors as stats
from tokenfield.errors import ParameterError, UserError

__all__ = [
    "AttractorConfig",
    "attractors",
    "measure_attractors",
]

from tokenfield.runs import ATTRACTORS_HTML, ATTRACTORS_JSON, ATTRACTORS_ZARR

DEFAULT_THETAS = (0.001, 0.003, 0.01, 0.03, 0.1, 0.2, 0.4, 0.7, 1.0)
DEFAULT_LAMBDAS = tuple(float(x) for x in np.linspace(0, 1, 11))
PERTURBED_ROWS = 2048
"""Perturbed rows that one task runs onward at once (fewer for a large vocabulary:
:data:`tokenfield.models.layer_map.LOGITS_BYTES`); each worker holds its own."""
PROMPTS_PER_TASK = 32
"""Prompts per perturbation task. Fixed, like every other split, so that the
matrix shapes, and with them the numbers, do not depend on the workers."""


@dataclass(frozen=True)
class AttractorConfig:
    """Settings of one attractor analysis (saved in ``attractors.json``).

    Attributes:
        k: singular values / FTLEs kept per block.
        oversample: extra columns of the subspace iteration.
        tol: relative residual of the top singular pair at which it stops.
        max_iter: its iteration cap (the residual reached is saved); the block
            spectra's Lanczos runs up to three times as many steps.
        thetas: the perturbation angles (radians, increasing, in (0, pi/2]).
        directions: random tangent directions per angle (>= 16 by the spec).
        blocks: start blocks of the perturbations, basins and the sensitive
            directions (``None``: about six evenly spaced blocks).
        ftle_stride: FTLEs from every ``ftle_stride``-th start block (1: all).
        pairs: prompt pairs per kind (same / different category) per block.
        lambdas: the great-circle grid.
        max_prompts: use the first this many prompts (``None``: all).
        spectra_prompts: Jacobian spectra and FTLEs on the first this many
            prompts (``None``: all), the most costly part.
        chunk: prompts per batch of the block spectra (Lanczos).
        workers: threads that measure at once, each on its own prompts, blocks
            and slices (``None``: torch's thread count on a CPU, 1 on a GPU).
            torch's own threads are divided among them for the call and
            restored after; the numbers do not depend on it.
        n_boot: bootstrap resamples (of prompts, or of pairs).
        seed: directions, pairs, the bootstrap and the random-weight copy.
        device: ``cpu``, ``cuda``, ``cuda:N`` or ``auto``.
        float64: compute in float64 (small models; the tests).
    """

    k: int = 4
    oversample: int = 4
    tol: float = 1e-3
    max_iter: int = 40
    thetas: tuple[float, ...] = DEFAULT_THETAS
    directions: int = 16
    blocks: tuple[int, ...] | None = None
    ftle_stride: int = 1
    pairs: int = 48
    lambdas: tuple[float, ...] = DEFAULT_LAMBDAS
    max_prompts: int | None = None
    spectra_prompts: int | None = None
    chunk: int = 64
    workers: int | None = None
    n_boot: int = 1000
    seed: int = 0
    device: str = "cpu"
    float64: bool = False
    random_copy: bool = True

    def __post_init__(self) -> None:
        if self.k < 1:
            raise UserError(f"k must be at least 1, got {self.k}", "pass k=1 or more (--k)")
        if self.directions < 1:
            raise ParameterError(
                "directions", f"need at least one direction, got {self.directions}",
                "pass {name} 16 or more",
            )  # fmt: skip
        thetas = np.asarray(self.thetas, dtype=float)
        if (
            thetas.size < 2
            or np.any(np.diff(thetas) <= 0)
            or thetas[0] <= 0
            or thetas[-1] > np.pi / 2
        ):
            raise ParameterError(
                "thetas", f"the angles must increase within (0, pi/2], got {list(self.thetas)}",
                "pass e.g. {name} 0.001,0.01,0.1,1",
            )  # fmt: skip
        if self.ftle_stride < 1:
            raise ParameterError(
                "ftle_stride", "the FTLE stride must be 1 or more", "pass {name} 1"
            )
        if self.workers is not None and self.workers < 1:
            raise ParameterError("workers", "need at least one worker", "pass {name} 1 or more")
        if self.tol <= 0 or self.max_iter < 1:
            raise ParameterError("tol", "the tolerance must be positive", "pass {name} 1e-3")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _default_blocks(n_blocks: int) -> tuple[int, ...]:
    count = min(n_blocks, 6)
    return tuple(sorted({int(round(x)) for x in np.linspace(0, n_blocks - 1, count)}))


def _pairs(
    categories: Sequence[str], count: int, same: bool, rng: np.random.Generator
) -> np.ndarray:
    """Up to ``count`` distinct ordered prompt pairs in the same / different categories."""
    cats = np.asarray(categories)
    n = len(cats)
    candidates = [(a, b) for a in range(n) for b in range(n)
                  if a != b and (cats[a] == cats[b]) == same and cats[a] != ""]  # fmt: skip
    if not candidates:
        return np.zeros((0, 2), dtype=np.int64)
    chosen = rng.choice(len(candidates), size=min(count, len(candidates)), replace=False)
    return np.asarray([candidates[i] for i in np.sort(chosen)], dtype=np.int64)


def measure_attractors(
    model: Any,
    prompts: Sequence[Any],
    config: AttractorConfig = AttractorConfig(),
    *,
    progress: Callable[[str, float], None] | None = None,
) -> dict[str, Any]:
    """Measure one model (module docstring); returns ``{"arrays": {...}, "summary": {...}}``.

    ``progress(stage, fraction)`` is called as the work advances.
    """
    from tokenfield.models.layer_map import layer_map_attention

    # the layer map's attention for the whole measurement: switching per block call
    # walks every module of the model each time
    with layer_map_attention(model.model):
        return _measure(model, prompts, config, progress)


def _measure(
    model: Any,
    prompts: Sequence[Any],
    config: AttractorConfig,
    progress: Callable[[str, float], None] | None,
) -> dict[str, Any]:
    from tokenfield.models.batching import encode_prompts
    from tokenfield.models.jacobian import (
        lanczos_singular,
        product_slice,
        product_spectra,
        tangent_directions,
    )
    from tokenfield.models.layer_map import LayerMap, great_circle_runs, perturbation_recovery
    from tokenfield.prompts import as_prompts

    prompts = as_prompts(prompts)
    if config.max_prompts is not None:
        prompts = prompts[: config.max_prompts]
    if len(prompts) < 2:
        raise UserError("the attractor analysis needs at least 2 prompts", "trace more prompts")
    encoded = encode_prompts(model, prompts, truncate=True)
    token_ids = [item.ids for item in encoded]
    report = progress or (lambda stage, fraction: None)
    started = time.perf_counter()
    layer_map = LayerMap(model, token_ids)
    n_blocks = layer_map.n_blocks
    n_prompts = layer_map.batch
    blocks = config.blocks if config.blocks is not None else _default_blocks(n_blocks)
    if any(b < 0 or b >= n_blocks for b in blocks):
        raise ParameterError(
            "blocks", f"blocks must lie in 0..{n_blocks - 1}, got {list(blocks)}",
            "pass {name} with blocks of this model",
        )  # fmt: skip
    ftle_blocks = tuple(range(0, n_blocks, config.ftle_stride))
    starts = sorted(set(ftle_blocks) | set(blocks))
    n_spec = min(n_prompts, config.spectra_prompts or n_prompts)
    k = config.k
    d = layer_map.states.shape[-1]
    arrays: dict[str, Any] = {}
    jac = np.full((n_spec, n_blocks, k), np.nan)
    ang = np.full((n_spec, n_blocks, k), np.nan)
    ftle = np.full((n_spec, len(ftle_blocks), k), np.nan)
    ftle_residual = np.full((n_spec, len(ftle_blocks)), np.nan)
    sensitive = np.zeros((n_spec, len(blocks), d), dtype=np.float32)
    iterations: list[int] = []
    solver = dict(k=k, oversample=config.oversample, max_iter=config.max_iter, tol=config.tol,
                  seed=config.seed)  # fmt: skip
    # block Jacobians near the identity have clustered top values: a Krylov method
    krylov = dict(k=k, max_iter=3 * config.max_iter, tol=config.tol, seed=config.seed)
    workers = _workers(config, layer_map)
    pool = _Pool(workers)
    max_rows = PERTURBED_ROWS

    # 1. block spectra: a task per chunk of prompts, block and kind (plain / angular)
    def block_spectrum(rows: range, block: int, angular: bool) -> None:
        sub = layer_map.select(torch.as_tensor(list(rows)))
        spec = lanczos_singular(sub.block_fn(block), sub.states[:, block], angular=angular,
                                **krylov)  # fmt: skip
        (ang if angular else jac)[rows.start : rows.stop, block] = (
            spec.values.double().cpu().numpy()
        )

    chunks = [range(s, min(n_spec, s + config.chunk)) for s in range(0, n_spec, config.chunk)]
    tasks = [(block_spectrum, rows, block, angular)
             for rows in chunks for block in range(n_blocks) for angular in (False, True)]  # fmt: skip
    pool.run(tasks, lambda f: report("block Jacobians", f))

    # 2. FTLEs from every start block (and the sensitive directions of the perturbation
    # blocks) in one set of sweeps through the blocks, a task per slice of prompts
    def lyapunov(rows: range) -> None:
        sub = layer_map.select(torch.as_tensor(list(rows)))
        spec = product_spectra([sub.block_fn(b) for b in range(n_blocks)], sub.states, starts,
                               **solver)  # fmt: skip
        lo, hi = rows.start, rows.stop
        values = spec.values.double().cpu().numpy()  # (B, n_start, k)
        for column, block in enumerate(ftle_blocks):
            at = starts.index(block)
            ftle[lo:hi, column] = np.log(np.maximum(values[:, at], 1e-300)) / (n_blocks - block)
            ftle_residual[lo:hi, column] = spec.residual[:, at].double().cpu().numpy()
        for index, block in enumerate(blocks):
            sensitive[lo:hi, index] = spec.right[:, starts.index(block)].float().cpu().numpy()
        iterations.append(spec.iterations)

    step = product_slice(starts, k, config.oversample)
    slices = [range(s, min(n_spec, s + step)) for s in range(0, n_spec, step)]
    pool.run([(lyapunov, rows) for rows in slices], lambda f: report("Lyapunov exponents", f))
    arrays.update(jacobian_sv=jac, angular_sv=ang, ftle=ftle, ftle_residual=ftle_residual,
                  sensitive_direction=sensitive)  # fmt: skip

    # 3. perturbation recovery: random directions on every prompt, the sensitive one on
    # n_spec; the directions drawn here, in order, so no number depends on the workers
    gen = torch.Generator(device="cpu").manual_seed(config.seed)
    thetas = [float(t) for t in config.thetas]
    shape = (len(blocks), len(thetas), config.directions + 1, n_prompts)
    ratio, kl = np.full(shape, np.nan), np.full(shape, np.nan)
    flipped = np.zeros(shape, dtype=bool)
    drawn = []
    for block in blocks:
        y = layer_map.states[:, block] / layer_map.states[:, block].norm(dim=-1, keepdim=True)
        directions = tangent_directions(y, config.directions, gen)
        vec = torch.as_tensor(sensitive[:, len(drawn)], dtype=y.dtype, device=y.device)
        ys = y[:n_spec]
        vec = vec - ys * (ys * vec).sum(-1, keepdim=True)
        vec = vec / vec.norm(dim=-1, keepdim=True).clamp_min(1e-30)
        drawn.append((directions, vec))

    def perturb(index: int, rows: range) -> None:
        block = blocks[index]
        directions, vec = drawn[index]
        sub = layer_map.select(torch.as_tensor(list(rows)))
        result = perturbation_recovery(sub, block, thetas, directions[:, rows.start : rows.stop],
                                       max_rows=max_rows)  # fmt: skip
        at = slice(rows.start, rows.stop)
        ratio[index, :, :-1, at] = result["angle_ratio"].double().cpu().numpy()
        kl[index, :, :-1, at] = result["kl"].double().cpu().numpy()
        flipped[index, :, :-1, at] = result["flipped"].cpu().numpy()
        spec_rows = range(rows.start, min(rows.stop, n_spec))
        if len(spec_rows) == 0:
            return
        sub = layer_map.select(torch.as_tensor(list(spec_rows)))
        result = perturbation_recovery(sub, block, thetas, vec[None, spec_rows.start : spec_rows.stop],
                                       max_rows=max_rows)  # fmt: skip
        at = slice(spec_rows.start, spec_rows.stop)
        ratio[index, :, -1, at] = result["angle_ratio"][:, 0].double().cpu().numpy()
        kl[index, :, -1, at] = result["kl"][:, 0].double().cpu().numpy()
        flipped[index, :, -1, at] = result["flipped"][:, 0].cpu().numpy()

    parts = [range(s, min(n_prompts, s + PROMPTS_PER_TASK))
             for s in range(0, n_prompts, PROMPTS_PER_TASK)]  # fmt: skip
    pool.run([(perturb, index, rows) for index in range(len(blocks)) for rows in parts],
             lambda f: report("perturbations", f))  # fmt: skip
    radius = np.stack([stats.basin_radius(flipped[i, :, :-1], thetas) for i in range(len(blocks))])
    arrays.update(angle_ratio=ratio, kl=kl, flipped=flipped, basin_radius=radius)

    # 4. category basins along great circles, a task per kind and block
    categories = [p.category for p in prompts[:n_prompts]]
    rng = np.random.default_rng(config.seed)
    pair_sets = {"same": _pairs(categories, config.pairs, True, rng),
                 "different": _pairs(categories, config.pairs, False, rng)}  # fmt: skip
    final = layer_map.states[:, -1].double().cpu().numpy()
    unit = final / np.linalg.norm(final, axis=-1, keepdims=True)
    names = sorted({c for c in categories if c})
    centroids = (
        np.stack([unit[[c == name for c in categories]].mean(0) for name in names])
        if names
        else None
    )
    ref_top = layer_map.logits(layer_map.states[:, -1]).argmax(-1).cpu().numpy()
    basins: dict[str, Any] = {}
    for kind, pairs in pair_sets.items():
        n_pairs, n_lambda = len(pairs), len(config.lambdas)
        basins[kind] = {
            "pairs": pairs,
            "slope": np.full((len(blocks), n_pairs), np.nan),
            "midpoint": np.full((len(blocks), n_pairs), np.nan),
            "fraction": np.full((len(blocks), n_lambda, n_pairs), np.nan),
            "centroid_is_b": np.full((len(blocks), n_lambda, n_pairs), np.nan),
            "top1_is_b": np.full((len(blocks), n_lambda, n_pairs), np.nan),
        }

    def basin(kind: str, index: int) -> None:
        out, pairs = basins[kind], pair_sets[kind]
        runs = great_circle_runs(layer_map, blocks[index], torch.as_tensor(pairs),
                                 config.lambdas, max_rows=max_rows)  # fmt: skip
        ends = runs["final"].double().cpu().numpy()
        frac = stats.switch_fraction(ends, final[pairs[:, 0]], final[pairs[:, 1]])
        out["fraction"][index] = frac
        out["slope"][index], out["midpoint"][index] = stats.logistic_slope(config.lambdas, frac)
        out["top1_is_b"][index] = runs["top"].cpu().numpy() == ref_top[pairs[:, 1]][None]
        if centroids is not None:
            u = ends / np.linalg.norm(ends, axis=-1, keepdims=True)
            nearest = np.argmax(u @ centroids.T, axis=-1)  # (n_lambda, P)
            target = np.array([names.index(categories[b]) for b in pairs[:, 1]])
            out["centroid_is_b"][index] = nearest == target[None]

    tasks = [(basin, kind, index) for kind, pairs in pair_sets.items() if len(pairs)
             for index in range(len(blocks))]  # fmt: skip
    pool.run(tasks, lambda f: report("category basins", f))
    arrays["basins"] = basins
    summary = _summarise(arrays, config, blocks, ftle_blocks, n_blocks)
    summary.update(
        model=str(getattr(model, "name", "")),
        random_weights=bool(getattr(model, "random_weights", False)),
        n_prompts=n_prompts,
        spectra_prompts=n_spec,
        n_blocks=n_blocks,
        d_model=int(d),
        blocks=list(blocks),
        ftle_blocks=list(ftle_blocks),
        thetas=thetas,
        lambdas=[float(x) for x in config.lambdas],
        iterations_max=int(max(iterations)) if iterations else 0,
        workers=workers,
        seconds=round(time.perf_counter() - started, 2),
    )
    return {"arrays": arrays, "summary": summary, "categories": categories}


def _workers(config: AttractorConfig, layer_map: Any) -> int:
    """``config.workers``, or torch's thread count on a CPU and 1 on a GPU."""
    if config.workers is not None:
        return int(config.workers)
    if layer_map.states.device.type != "cpu":
        return 1
    return max(1, torch.get_num_threads())


class _Pool:
    """Runs independent tasks on ``workers`` threads (inline with one), torch's
    threads divided among them for the duration of each :meth:`run`.

    Each task writes its own rows of preallocated arrays, so the numbers do not
    depend on the order in which tasks finish; progress is reported from the
    calling thread as they do.
    """

    def __init__(self, workers: int):
        self.workers = workers

    def run(self, tasks: list[tuple[Any, ...]], report: Callable[[float], None]) -> None:
        report(0.0)  # the stage starts
        if not tasks:
            report(1.0)
            return
        if self.workers <= 1 or len(tasks) == 1:
            for count, (fn, *args) in enumerate(tasks, start=1):
                fn(*args)
                report(count / len(tasks))
            return
        from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

        before = torch.get_num_threads()
        each = max(1, before // self.workers)
        torch.set_num_threads(each)
        try:
            with ThreadPoolExecutor(
                min(self.workers, len(tasks)), initializer=torch.set_num_threads, initargs=(each,)
            ) as pool:
                pending = {pool.submit(fn, *args) for fn, *args in tasks}
                done_count = 0
                while pending:
                    done, pending = wait(pending, return_when=FIRST_COMPLETED)
                    for future in done:
                        if future.exception() is not None:
                            for other in pending:
                                other.cancel()
                            raise future.exception()  # type: ignore[misc]
                    done_count += len(done)
                    report(done_count / len(tasks))
        finally:
            torch.set_num_threads(before)


def _interval(values: np.ndarray, config: AttractorConfig) -> dict[str, list[float]]:
    mean, low, high = stats.bootstrap_mean(values, n_boot=config.n_boot, seed=config.seed)
    return {"mean": np.atleast_1d(mean).tolist(), "low": np.atleast_1d(low).tolist(),
            "high": np.atleast_1d(high).tolist()}  # fmt: skip


def _summarise(arrays, config, blocks, ftle_blocks, n_blocks) -> dict[str, Any]:
    top_ftle = arrays["ftle"][:, :, 0]
    ftle_iv = _interval(top_ftle, config)
    summary: dict[str, Any] = {
        "jacobian_sv_top": _interval(arrays["jacobian_sv"][:, :, 0], config),
        "angular_sv_top": _interval(arrays["angular_sv"][:, :, 0], config),
        "ftle_top": ftle_iv,
        "ftle_k_mean": np.nanmean(arrays["ftle"], axis=0).tolist(),
        "ftle_residual_max": float(np.nanmax(arrays["ftle_residual"])),
        "ftle_verdicts": stats.ftle_verdicts(
            ftle_blocks, *(np.asarray(ftle_iv[x]) for x in ("mean", "low", "high"))
        ),
        "basin_radius_median": np.median(arrays["basin_radius"], axis=1).tolist(),
        "basin_radius_log10": _interval(
            np.log10(np.maximum(arrays["basin_radius"], 1e-4)).T, config
        ),
        "angle_ratio_median": np.nanmedian(arrays["angle_ratio"][:, :, :-1], axis=(2, 3)).tolist(),
        "angle_ratio_sensitive_median": np.nanmedian(
            arrays["angle_ratio"][:, :, -1], axis=2
        ).tolist(),
        "flip_rate": arrays["flipped"][:, :, :-1].mean(axis=(2, 3)).tolist(),
        "kl_median": np.nanmedian(arrays["kl"][:, :, :-1], axis=(2, 3)).tolist(),
        "linear_slope": stats.linear_slope(config.lambdas),
    }
    for kind, basin in arrays["basins"].items():
        if basin["pairs"].shape[0] == 0:
            summary[f"basin_{kind}"] = None
            continue
        log_slope = np.log10(basin["slope"]).T  # (P, blocks)
        summary[f"basin_{kind}"] = {
            "n_pairs": int(basin["pairs"].shape[0]),
            "log10_slope": _interval(log_slope, config),
            "centroid_switch": np.nanmean(basin["centroid_is_b"][:, -1], axis=1).tolist(),
            "centroid_switch_lambda": [
                _nanmedian(stats.switch_point(basin["centroid_is_b"][i], config.lambdas))
                for i in range(basin["slope"].shape[0])
            ],
            "top1_switch_lambda": [
                _nanmedian(stats.switch_point(basin["top1_is_b"][i], config.lambdas))
                for i in range(basin["slope"].shape[0])
            ],
            "top1_switch": np.nanmean(basin["top1_is_b"][:, -1], axis=1).tolist(),
        }
    return summary


def _nanmedian(values: np.ndarray) -> float | None:
    """The median over pairs that switched (``None`` when none did)."""
    values = np.asarray(values, dtype=float)
    return float(np.nanmedian(values)) if np.isfinite(values).any() else None


def _pair_difference(trained: dict, random: dict, config: AttractorConfig) -> Any:
    """Trained minus random mean log10 slope per block, resampling pairs
    (the same pairs of prompts in both models)."""
    a = np.log10(trained["slope"]).T
    b = np.log10(random["slope"]).T
    if a.shape != b.shape:
        return None
    return stats.bootstrap_mean(a - b, n_boot=config.n_boot, seed=config.seed)


def compare(
    trained: dict[str, Any], random: dict[str, Any] | None, config: AttractorConfig
) -> dict[str, Any]:
    """The verdicts, with the random-weight copy beside the trained model."""
    summary = trained["summary"]
    blocks = summary["blocks"]
    verdicts: dict[str, Any] = {"ftle": summary["ftle_verdicts"]}
    if random is not None:
        verdicts["ftle_random"] = random["summary"]["ftle_verdicts"]
    different = summary.get("basin_different")
    if different is None:
        verdicts["basins"] = {"supported": False, "from_block": None, "passes": [],
                              "text": "the category regions act as basins: not supported "
                                      "(the prompts have fewer than two categories)"}  # fmt: skip
        return verdicts
    iv = different["log10_slope"]
    trained_iv = tuple(np.asarray(iv[x]) for x in ("mean", "low", "high"))
    diff = None
    if random is not None:
        diff = _pair_difference(trained["arrays"]["basins"]["different"],
                                random["arrays"]["basins"]["different"], config)  # fmt: skip
    verdicts["basins"] = stats.basin_verdict(
        blocks, trained_iv, diff, stats.linear_slope(config.lambdas)
    )
    if diff is not None:
        verdicts["basins"]["difference_log10_slope"] = {
            "mean": diff[0].tolist(), "low": diff[1].tolist(), "high": diff[2].tolist()}  # fmt: skip
    return verdicts


# ---------------------------------------------------------------- writing


def _dataset(result: dict[str, Any], prefix: str) -> dict[str, Any]:
    """Flat ``{name: (dims, array)}`` of one model's arrays."""
    arrays = result["arrays"]
    out = {
        f"{prefix}jacobian_sv": (("prompt_s", "block", "k"), arrays["jacobian_sv"]),
        f"{prefix}angular_sv": (("prompt_s", "block", "k"), arrays["angular_sv"]),
        f"{prefix}ftle": (("prompt_s", "ftle_block", "k"), arrays["ftle"]),
        f"{prefix}ftle_residual": (("prompt_s", "ftle_block"), arrays["ftle_residual"]),
        f"{prefix}sensitive_direction": (("prompt_s", "start_block", "feature"),
                                         arrays["sensitive_direction"]),
        f"{prefix}angle_ratio": (("start_block", "theta", "direction", "prompt"), arrays["angle_ratio"]),
        f"{prefix}kl": (("start_block", "theta", "direction", "prompt"), arrays["kl"]),
        f"{prefix}flipped": (("start_block", "theta", "direction", "prompt"), arrays["flipped"]),
        f"{prefix}basin_radius": (("start_block", "prompt"), arrays["basin_radius"]),
    }  # fmt: skip
    for kind, basin in arrays["basins"].items():
        dim = f"pair_{kind}"
        out[f"{prefix}{kind}_pairs"] = ((dim, "end"), basin["pairs"])
        for name in ("slope", "midpoint"):
            out[f"{prefix}{kind}_{name}"] = (("start_block", dim), basin[name])
        for name in ("fraction", "centroid_is_b", "top1_is_b"):
            out[f"{prefix}{kind}_{name}"] = (("start_block", "lambda", dim), basin[name])
    return out


def write_zarr(path: Path, variables: dict[str, Any], coords: dict[str, Any]) -> None:
    """Write the arrays as a zarr store, atomically (a temporary store renamed into place)."""
    import xarray as xr

    ds = xr.Dataset({k: xr.DataArray(v[1], dims=v[0]) for k, v in variables.items()},
                    coords=coords)  # fmt: skip
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        from tokenfield.runs.store import store_encoding

        ds.to_zarr(tmp / "store.zarr", mode="w", encoding=store_encoding(ds))  # checksummed
        old = None
        if path.exists():
            old = path.parent / f".{path.name}.old.{os.getpid()}"
            os.replace(path, old)
        os.replace(tmp / "store.zarr", path)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _load(run: Path, device: str) -> Any:
    from tokenfield.models.load import ModelSpec
    from tokenfield.runs import read_run_info

    config = read_run_info(run).config
    if not config.get("model", {}).get("name"):
        raise UserError(f"run '{run}' names no model", "trace it with tokenfield trace")
    return ModelSpec.from_run(config, device=device).load()


def _prompts_of_run(run: Path) -> list[Any]:
    from tokenfield.prompts import as_prompts
    from tokenfield.runs import read_run_info

    config = read_run_info(run).config
    if "prompts" not in config:
        raise UserError(f"run '{run}' records no prompts", "trace it with tokenfield trace")
    return as_prompts(config["prompts"])


def attractors(
    run: str | Path,
    baseline: str | Path | None = None,
    out: str | Path | None = None,
    *,
    progress: bool | Callable[[str, float], None] = False,
    **settings: Any,
) -> Path:
    """Measure whether a traced run's layer map is an attractor (module docstring).

    Args:
        run: a run written by ``tokenfield trace`` (its model is loaded).
        baseline: a run traced by a random-weight copy (``--random-weights``)
            of the same prompts; without it a seeded random-weight copy of the
            model is built (``random_copy=False`` skips the copy).
        out: the directory to write into (default: the run).
        progress: ``True`` for a progress bar on stderr, or a callback
            ``(stage, fraction)``.
        **settings: :class:`AttractorConfig` fields.

    Returns:
        The path of ``attractors.json``.

    Example:
        >>> path = tf.attractors("runs/spectrum", baseline="runs/spectrum-random")  # doctest: +SKIP
        >>> path.name                                                                # doctest: +SKIP
        'attractors.json'
    """
    from tokenfield._device import parse_device
    from tokenfield._io import write_json_atomic
    from tokenfield.runs import check_baseline, check_results_writable, read_run_info

    run = Path(run)
    read_run_info(run)
    if baseline is not None:
        read_run_info(baseline)
        check_baseline(run, baseline)
    unknown = set(settings) - set(AttractorConfig.__dataclass_fields__)
    if unknown:
        raise UserError(f"unknown setting(s): {', '.join(sorted(unknown))}",
                        f"use {', '.join(AttractorConfig.__dataclass_fields__)}")  # fmt: skip
    for name in ("thetas", "lambdas", "blocks"):
        if settings.get(name) is not None:
            settings[name] = tuple(settings[name])
    config = AttractorConfig(**settings)
    parse_device(config.device)
    target = Path(out) if out is not None else run
    target.mkdir(parents=True, exist_ok=True)
    check_results_writable(target, "attractors")  # before the model is loaded
    prompts = _prompts_of_run(run)

    with contextlib.ExitStack() as stack:
        if progress is True:
            from tokenfield._progress import ProgressBar

            bar = stack.enter_context(ProgressBar("attractors", total=100, unit="%"))

            def callback(stage: str, fraction: float) -> None:
                bar.update(completed=100 * fraction, label=f"attractors: {stage}")

        else:
            callback = progress or None
        model = _load(run, config.device)
        if config.float64:
            model.model.double()
        trained = measure_attractors(model, prompts, config, progress=callback)
        random = None
        if baseline is not None:
            copy = _load(Path(baseline), config.device)
            if not copy.random_weights:
                raise UserError(f"the baseline '{baseline}' was not traced with random weights",
                                "trace it with --random-weights")  # fmt: skip
        elif config.random_copy:
            from tokenfield.pipelines.flow import random_copy

            copy = random_copy(model, config.seed)
        else:
            copy = None
        if copy is not None:
            if config.float64:
                copy.model.double()
            random = measure_attractors(copy, prompts, config, progress=callback)
    verdicts = compare(trained, random, config)
    summary = {
        "format": 1,
        "config": config.to_dict(),
        "trained": trained["summary"],
        "random": None if random is None else random["summary"],
        "verdicts": verdicts,
    }
    variables = _dataset(trained, "")
    if random is not None:
        variables.update(_dataset(random, "random_"))
    s = trained["summary"]
    coords = {"block": np.arange(s["n_blocks"]), "ftle_block": np.asarray(s["ftle_blocks"]),
              "start_block": np.asarray(s["blocks"]), "theta": np.asarray(s["thetas"]),
              "lambda": np.asarray(s["lambdas"])}  # fmt: skip
    write_zarr(target / ATTRACTORS_ZARR, variables, coords)
    plain = json.loads(json.dumps(summary, default=_plain))
    from tokenfield._io import write_atomic
    from tokenfield.viz.attractors import attractors_html_section

    section = f"<section>{attractors_html_section(plain)}</section>\n"
    write_atomic(target / ATTRACTORS_HTML, section)
    return write_json_atomic(target / ATTRACTORS_JSON, plain)


def _plain(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(type(value).__name__)

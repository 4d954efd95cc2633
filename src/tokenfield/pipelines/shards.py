"""A trace on Dask workers: prompts sharded over workers into one Zarr store.

The client (the process that runs :func:`trace_parallel`) does everything that
fixes the layout of the run before any worker starts:

1. it tokenises every prompt, so it knows how many particles each prompt gives
   (1 for ``positions="last"``, its token count for ``positions="all"``);
2. it cuts the particle axis into shards (:func:`plan_shards`), each one Zarr
   chunk along ``particle``, so no two workers ever write the same chunk;
3. it creates the whole store: every array at its final size, with the
   ``particle``, ``time``, ``site`` (and ``block``/``head``) coordinates
   written and the rest left to the workers (:func:`template`, laid out from
   the tracer's :func:`~tokenfield.models.trace.schema_piece`);
4. it records the plan in ``run.json`` (``progress.shards``).

Each worker loads the model once (:func:`worker_model` keeps it in a
process-wide cache keyed by :class:`~tokenfield.models.load.ModelSpec`), traces
the batches that cover its shard with the tracer
(:func:`~tokenfield.models.trace.trace_in_memory`), and writes its region of the
store (``to_zarr(region=...)``). Batches are the same as in a single-process
trace (prompts ``[j * batch_size, (j + 1) * batch_size)``), so the states are the
same numbers: a shard of ``positions="all"`` whose edge falls inside a batch
traces that whole batch and keeps only its own particles.

The client keeps the run's one-writer lock, counts prompts on one progress bar
as shards finish and records each finished shard in ``run.json``; a resumed run
redoes only the shards not recorded there. The cluster's lifecycle is
:func:`tokenfield._dask.run_tasks`.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import xarray as xr

from tokenfield._io import write_json_atomic
from tokenfield._progress import ProgressBar
from tokenfield.errors import UserError
from tokenfield.models.batching import encode_prompts
from tokenfield.models.load import LoadedModel, ModelSpec
from tokenfield.models.trace import schema_piece, trace_in_memory
from tokenfield.models.trace_config import TraceConfig
from tokenfield.runs import TRAJECTORY, RunWriter, open_run, store_encoding

__all__ = [
    "LOADS",
    "ParallelReport",
    "Shard",
    "plan_shards",
    "template",
    "trace_parallel",
    "worker_model",
]

# Keep one shard's states (time x particles x feature, float32) under this many
# bytes: a worker holds its shard in memory before writing it.
SHARD_BYTES = 256 * 2**20
SHARDS_PER_WORKER = 4  # enough shards to balance load and to resume in small steps

_MODELS: dict[ModelSpec, LoadedModel] = {}
LOADS: dict[ModelSpec, int] = {}  # how often this process loaded each spec (tests: once)


def worker_model(spec: ModelSpec, threads: int | None = None) -> LoadedModel:
    """The model for ``spec``, loaded once per process (every later shard reuses it).

    ``threads`` sets ``torch.set_num_threads`` before the first load, so that
    workers sharing a machine do not oversubscribe its cores.
    """
    model = _MODELS.get(spec)
    if model is None:
        if threads:
            torch.set_num_threads(int(threads))
        model = spec.load()
        LOADS[spec] = LOADS.get(spec, 0) + 1
        _MODELS[spec] = model
    return model


@dataclass(frozen=True)
class Shard:
    """One worker task: the particles it owns and the prompts it traces.

    Attributes:
        index: position in the plan.
        start, stop: the particles it writes, ``[start, stop)`` (one Zarr chunk).
        first_prompt, stop_prompt: the prompts it traces, ``[first, stop)``: whole
            batches, so that the batches are those of a single-process trace.
        offset: the particle index of the first traced prompt's first particle.
        prompts: how many prompts have their first particle in the shard (the
            progress bar's count; the shards' counts add up to all prompts).
    """

    index: int
    start: int
    stop: int
    first_prompt: int
    stop_prompt: int
    offset: int
    prompts: int


def plan_shards(counts: Sequence[int], batch_size: int, n_shards: int) -> list[Shard]:
    """Cut the particle axis into ``n_shards`` (at most) equal chunks.

    Args:
        counts: particles per prompt, in order (all at least 1).
        batch_size: prompts per forward pass.
        n_shards: wanted number of shards.

    Every shard but the last has the same number of particles (Zarr chunks are
    regular). When every prompt gives one particle the size is a multiple of
    ``batch_size``, so no batch is traced twice; otherwise a batch cut by a
    shard edge is traced by both shards, each keeping its own particles.
    """
    counts = np.asarray(counts, dtype=np.int64)
    if counts.size == 0 or (counts < 1).any():
        raise ValueError("every prompt must give at least one particle")
    first = np.concatenate([[0], np.cumsum(counts)])  # first particle of each prompt
    total = int(first[-1])
    size = math.ceil(total / max(1, n_shards))
    if (counts == 1).all():
        size = batch_size * math.ceil(size / batch_size)
    shards = []
    for index, start in enumerate(range(0, total, size)):
        stop = min(start + size, total)
        first_owner = int(np.searchsorted(first, start, side="right") - 1)
        last_owner = int(np.searchsorted(first, stop - 1, side="right") - 1)
        batch_first = (first_owner // batch_size) * batch_size
        batch_stop = min(len(counts), (last_owner // batch_size + 1) * batch_size)
        owned = int(((first[:-1] >= start) & (first[:-1] < stop)).sum())
        shards.append(
            Shard(index, start, stop, batch_first, batch_stop, int(first[batch_first]), owned)
        )
    return shards


def default_shards(n_particles: int, n_times: int, d_model: int, workers: int) -> int:
    """Enough shards for ``SHARDS_PER_WORKER`` per worker and ``SHARD_BYTES`` each."""
    per_particle = max(1, n_times * d_model * 4)
    by_memory = math.ceil(n_particles * per_particle / SHARD_BYTES)
    return max(1, min(n_particles, max(SHARDS_PER_WORKER * max(1, workers), by_memory)))


# ----------------------------------------------------------------------------------
# The worker's side


def trace_shard(
    spec: ModelSpec | None,
    config: TraceConfig,
    shard: Shard,
    store: str,
    threads: int | None = None,
    model: LoadedModel | None = None,
) -> int:
    """Trace the prompts of ``shard`` and write its region of ``store``.

    ``config`` holds the shard's traced prompts (``first_prompt`` to
    ``stop_prompt``). Returns the shard's index.
    """
    loaded = model if model is not None else worker_model(spec, threads)  # type: ignore[arg-type]
    ds = trace_in_memory(loaded, config)
    part = ds.isel(particle=slice(shard.start - shard.offset, shard.stop - shard.offset))
    if part.sizes["particle"] != shard.stop - shard.start:
        raise RuntimeError(
            f"shard {shard.index} traced {part.sizes['particle']} particles for a region "
            f"of {shard.stop - shard.start}: the client's tokenisation differs from the worker's"
        )
    part = part.assign_coords(prompt_index=part["prompt_index"] + shard.first_prompt)
    part = part.reset_coords()
    part = part.drop_vars([n for n in part.variables if "particle" not in part[n].dims])
    part = part.drop_vars([n for n in part.indexes if n in part.variables])
    part.attrs = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        part.to_zarr(
            store,
            region={"particle": slice(shard.start, shard.stop)},
            mode="r+",
            consolidated=False,
            write_empty_chunks=True,
        )
    return shard.index


# ----------------------------------------------------------------------------------
# The client's side


def trace_writer(
    out: str | Path, model: LoadedModel, config: TraceConfig, *, overwrite: bool, **flush: Any
) -> RunWriter:
    """The run ``out`` of a trace of ``model`` with ``config``, created or reopened
    (a partial run with another config, batch size or weights is refused);
    ``flush``: :class:`~tokenfield.runs.RunWriter`'s buffering options."""
    return RunWriter(
        out,
        "trace",
        config.run_config(model),
        append_dim="particle",
        overwrite=overwrite,
        batch_size=config.batch_size,
        weights_sha256=model.weights_sha256,
        **flush,
    )


def template(piece: xr.Dataset, n_particles: int, chunk: int) -> xr.Dataset:
    """The full-size Dataset: ``piece``'s variables with ``particle`` grown to
    ``n_particles`` in chunks of ``chunk`` (lazy zeros, written by nobody: the
    workers fill them); the coordinates without ``particle`` are real."""
    import dask.array as da

    out = xr.Dataset(coords={"particle": np.arange(n_particles)})
    for name in list(piece.coords) + list(piece.data_vars):
        if name == "particle":
            continue
        var = piece[name].variable
        if "particle" not in var.dims:
            if name in piece.coords:
                out.coords[name] = var
            else:
                out[name] = var
            continue
        shape = tuple(
            n_particles if d == "particle" else s for d, s in zip(var.dims, var.shape, strict=True)
        )
        chunks = tuple(
            chunk if d == "particle" else s for d, s in zip(var.dims, var.shape, strict=True)
        )
        if var.dtype == bool:  # xarray stores a lazy bool array as float; a real one as bool
            data: Any = np.zeros(shape, dtype=bool)
        elif var.dtype == object:
            data = da.full(shape, "", dtype=object, chunks=chunks)
        else:
            data = da.zeros(shape, dtype=var.dtype, chunks=chunks)
        variable = xr.Variable(var.dims, data)
        variable.encoding["chunks"] = chunks
        if name in piece.coords:
            out.coords[name] = variable
        else:
            out[name] = variable
    return out


@dataclass
class ParallelReport:
    """What a parallel trace did (for tests and the benchmark)."""

    shards: int = 0
    shards_run: list[int] = field(default_factory=list)
    scheduler: str | None = None
    workers: list[str] = field(default_factory=list)


def trace_parallel(
    model: LoadedModel | ModelSpec | str,
    config: TraceConfig,
    *,
    out: str | Path,
    n_shards: int | None = None,
    overwrite: bool = False,
    progress: bool = False,
    report: ParallelReport | None = None,
    local: bool = False,
    on_shard: Callable[[int], Any] | None = None,
    threads: int | None = None,
) -> xr.Dataset:
    """Trace ``config``'s prompts on Dask workers into the run ``out``; see the
    module docstring.

    Args:
        model: a model from :func:`load_model` (its spec is sent to the workers),
            a :class:`~tokenfield.models.load.ModelSpec` or a spec string.
        config: what to trace; its ``workers`` start a local cluster of that many
            worker processes (each with ``torch.set_num_threads(max(1, cores //
            workers))``), its ``scheduler`` names a running one instead.
        out: the run directory (required: workers write to it).
        n_shards: how many shards (default: 4 per worker, each at most 256 MB).
        local: run the shards one after the other in this process, without
            Dask (what a single-process resume of a sharded run does).
        on_shard: called with each shard's index once it is recorded (tests).
        threads: ``torch.set_num_threads`` in each worker before it loads the
            model (default with ``workers``: ``max(1, cores // workers)``; with
            ``scheduler``: left to the cluster, e.g. ``dask worker --nthreads``).

    Returns:
        The run, opened (:func:`tokenfield.open_run`): the same Dataset as a
        single-process trace of the same prompts.
    """
    workers, scheduler = config.workers, config.scheduler
    if isinstance(model, LoadedModel):
        spec = ModelSpec.of(model) if not local else None
        client_model = model
    else:
        spec = model if isinstance(model, ModelSpec) else ModelSpec(model)
        client_model = spec.skeleton()
    config.check_model(client_model)
    encoded = encode_prompts(
        client_model, config.prompts, chat=config.chat, truncate=config.truncate
    )
    counts = [1 if config.positions == "last" else len(e.ids) for e in encoded]
    client = None
    if scheduler is not None and not local:
        # An address that is wrong or does not answer fails here, before the run
        # exists, so that it leaves nothing behind to block the retry.
        from tokenfield._dask import connect

        client = connect(scheduler)
    try:
        writer = trace_writer(out, client_model, config, overwrite=overwrite)
    except BaseException:
        if client is not None:
            client.close()
        raise
    with contextlib.ExitStack() as stack:
        if client is not None:
            stack.callback(client.close)
        stack.callback(writer.close)
        if writer.complete:
            writer.close()
            return open_run(out)
        recorded = writer.info.progress.get("shards")
        if writer.done and not recorded:
            raise UserError(
                f"'{out}' was started by a trace without workers",
                "resume it without --workers/--scheduler, or pass --overwrite",
            )
        store = Path(out) / TRAJECTORY
        if recorded:
            shards = [Shard(**s) for s in recorded["plan"]]
            finished = set(recorded["done"])
        else:
            n_times, total = client_model.n_layers + 1, int(sum(counts))
            wanted = n_shards or default_shards(
                total, n_times, client_model.d_model, workers or (4 if scheduler else 1)
            )
            shards = plan_shards(counts, config.batch_size, wanted)
            piece = schema_piece(client_model, encoded[0], config)
            laid_out = template(piece, total, shards[0].stop - shards[0].start)
            laid_out.attrs = {"tokenfield_config": json.dumps(writer.config), "kind": "trace"}
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                # every chunk checksummed; float states stored as the writer's
                # compressor says (raw bytes and a CRC-32C by default), as a trace
                # without workers stores them
                codecs = store_encoding(laid_out, writer.compressor)
                for name, variable in laid_out.variables.items():
                    variable.encoding["compressors"] = codecs[name]["compressors"]
                laid_out.to_zarr(store, mode="w", compute=False, consolidated=False)
            finished = set()
        plan = [asdict(s) for s in shards]

        def record() -> None:
            done_prompts = sum(s.prompts for s in shards if s.index in finished)
            writer.info.progress = {
                "batch_size": config.batch_size,
                "done": done_prompts,
                "size": shards[-1].stop,
                "shards": {"plan": plan, "done": sorted(finished)},
            }
            write_json_atomic(writer.path / "run.json", writer.info.to_json())

        record()
        pending = [s for s in shards if s.index not in finished]
        if report is not None:
            report.shards = len(shards)
        bar = stack.enter_context(
            ProgressBar(
                f"tracing {client_model.name}",
                len(encoded),
                enabled=progress,
                completed=sum(s.prompts for s in shards if s.index in finished),
                unit="prompts",
            )
        )
        by_index = {s.index: s for s in shards}

        def finished_shard(index: int) -> None:
            finished.add(index)
            record()
            bar.advance(by_index[index].prompts)
            if report is not None:
                report.shards_run.append(index)
            if on_shard is not None:
                on_shard(index)

        def shard_config(shard: Shard) -> TraceConfig:
            prompts = config.prompts[shard.first_prompt : shard.stop_prompt]
            return config.replace(prompts=prompts, workers=None, scheduler=None)

        where = str(store.resolve())
        if local or not pending:
            for shard in pending:
                trace_shard(spec, shard_config(shard), shard, where, model=client_model)
                finished_shard(shard.index)
        else:
            from tokenfield._dask import run_tasks

            if threads is None and workers:
                threads = max(1, (os.cpu_count() or 1) // workers)
            tasks = [
                (
                    f"tokenfield-shard-{s.index}",
                    trace_shard,
                    (spec, shard_config(s), s, where, threads),
                )
                for s in pending
            ]
            address, names = run_tasks(
                tasks,
                finished_shard,
                client=client,
                n_workers=int(workers or 1),
                processes=True,
                dashboard=True,
                silence_logs=50,  # logging.CRITICAL: the progress bar is the output
            )
            if report is not None:
                report.scheduler, report.workers = address, names
        writer.finish()
    return open_run(out)

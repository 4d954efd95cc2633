"""Data-parallel tracing: prompts sharded over Dask workers into one Zarr store.

The client (the process that runs :func:`trace_parallel`) does everything that
fixes the layout of the run before any worker starts:

1. it tokenises every prompt, so it knows how many particles each prompt gives
   (1 for ``positions="last"``, its token count for ``positions="all"``);
2. it cuts the particle axis into shards (:func:`plan_shards`), each one Zarr
   chunk along ``particle``, so no two workers ever write the same chunk;
3. it creates the whole store: every array at its final size, with the
   ``particle``, ``time``, ``site`` (and ``block``/``head``) coordinates
   written and the rest left to the workers;
4. it records the plan in ``run.json`` (``progress.shards``).

Each worker loads the model once (:func:`worker_model` keeps it in a
process-wide cache keyed by :class:`LoadSpec`), traces the batches that cover
its shard with the ordinary in-memory :func:`tokenfield.models.trace.trace`, and
writes its region of the store (``to_zarr(region=...)``). Batches are the same
as in a single-process trace (prompts ``[j * batch_size, (j + 1) * batch_size)``),
so the states are the same numbers: a shard of ``positions="all"`` whose edge
falls inside a batch traces that whole batch and keeps only its own particles.

The client keeps the run's one-writer lock, counts prompts on one progress bar
as shards finish (``distributed.as_completed``) and records each finished shard
in ``run.json``; a resumed run redoes only the shards not recorded there.
"""

from __future__ import annotations

import contextlib
import math
import os
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import xarray as xr

from tokenfield.errors import UserError
from tokenfield.models.load import LoadedModel
from tokenfield.prompts import Prompt

__all__ = [
    "LoadSpec",
    "Shard",
    "plan_shards",
    "skeleton",
    "trace_parallel",
    "worker_model",
]

# Keep one shard's states (time x particles x feature, float32) under this many
# bytes: a worker holds its shard in memory before writing it.
SHARD_BYTES = 256 * 2**20
SHARDS_PER_WORKER = 4  # enough shards to balance load and to resume in small steps


@dataclass(frozen=True)
class LoadSpec:
    """How a worker loads the model (the arguments of :func:`load_model`)."""

    spec: str
    device: str = "cpu"
    dtype: str = "float32"
    random_weights: bool = False
    seed: int = 0
    attn_implementation: str | None = None
    device_map: str | None = None
    max_memory: tuple[tuple[str, str], ...] | None = None
    offload_folder: str | None = None

    def load(self) -> LoadedModel:
        from tokenfield.models.load import load_model

        kwargs = asdict(self)
        if self.max_memory is not None:
            kwargs["max_memory"] = dict(self.max_memory)
        return load_model(**kwargs)

    @classmethod
    def from_model_spec(cls, spec: Any, **placement: Any) -> LoadSpec:
        """A :class:`~tokenfield.models.load.ModelSpec` with ``device_map``,
        ``max_memory`` (a sorted tuple of pairs) and ``offload_folder``."""
        fields = asdict(spec)
        return cls(fields.pop("name"), **fields, **placement)

    @classmethod
    def of(cls, model: LoadedModel) -> LoadSpec:
        """The spec a loaded model was loaded from.

        Raises:
            UserError: the model was built in memory (:func:`wrap_model`).
        """
        args = model.extra.get("load_args")
        if not args:
            raise UserError(
                f"model '{model.name}' was built in memory, so workers cannot load it",
                "load it with tokenfield.load_model(spec), or pass the spec string",
            )
        args = dict(args)
        if args.get("max_memory") is not None:
            args["max_memory"] = tuple(
                sorted((str(k), str(v)) for k, v in args["max_memory"].items())
            )
        return cls(**args)


_MODELS: dict[LoadSpec, LoadedModel] = {}
LOADS: dict[LoadSpec, int] = {}  # how often this process loaded each spec (tests: once)


def worker_model(spec: LoadSpec, threads: int | None = None) -> LoadedModel:
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


def skeleton(spec: LoadSpec) -> LoadedModel:
    """The model's tokenizer and architecture with no weights (``meta`` tensors):
    enough for the client to tokenise, lay out the store and write ``run.json``
    without loading the weights (a worker loads them)."""
    from accelerate import init_empty_weights

    from tokenfield.models import load as load_module
    from tokenfield.models.sites import family_for, find_sites
    from tokenfield.models.sources import (
        auto_class,
        quiet_transformers,
        resolve_source,
        weights_files_hash,
    )

    load_module._check_dtype(spec.dtype)
    directory, source_hash, name, *verified = resolve_source(spec.spec)
    with quiet_transformers(), load_module._unreadable_model(directory):
        from transformers import AutoConfig, AutoTokenizer

        config = AutoConfig.from_pretrained(directory, local_files_only=True)
        auto = auto_class(family_for(config.model_type))
        tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
        with init_empty_weights():
            model = auto.from_config(config, dtype=load_module.DTYPES[spec.dtype])
    if spec.random_weights:
        source_hash = f"random:{spec.seed}:{config.model_type}:{source_hash}"
    model.eval()
    loaded = LoadedModel(
        model,
        tokenizer,
        name,
        source_hash,
        find_sites(model),
        spec.random_weights,
        spec.seed if spec.random_weights else None,
    )
    loaded.extra["directory"] = str(directory)
    loaded.extra["skeleton"] = True
    if not spec.random_weights:
        loaded.weights_sha256 = verified[0] if verified else weights_files_hash(directory)
    return loaded


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
    spec: LoadSpec,
    prompts: Sequence[Prompt],
    shard: Shard,
    options: dict[str, Any],
    store: str,
    threads: int | None = None,
    model: LoadedModel | None = None,
) -> int:
    """Trace the prompts of ``shard`` and write its region of ``store``.

    ``prompts`` are the shard's traced prompts (``first_prompt`` to
    ``stop_prompt``). Returns the shard's index.
    """
    from tokenfield.models.trace import trace

    loaded = model if model is not None else worker_model(spec, threads)
    ds = trace(loaded, list(prompts), out=None, **options)
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


def _schema_piece(model: LoadedModel, first: Any, options: dict[str, Any]) -> xr.Dataset:
    """A one-prompt piece with zero states: every variable of the run, with its
    dims and dtype, built by the tracer's own :func:`_piece`."""
    from tokenfield.models.attention import VARIABLES
    from tokenfield.models.batching import pad_batch
    from tokenfield.models.tokens import TokenTexts
    from tokenfield.models.trace import _lens_variables, _piece, cast_states

    padded = pad_batch([first], model, options["positions"])
    keep, last = padded["keep"], padded["last"]
    n = int(keep.sum())
    states = [torch.zeros(n, model.d_model) for _ in range(model.n_layers + 1)]
    logits = torch.zeros(1, int(model.model.config.vocab_size)) if model.causal else None
    extras: dict[str, Any] = {}
    if options.get("attention"):
        heads = int(model.model.config.num_attention_heads)
        shape = (n, model.n_layers, heads)
        dims = ("particle", "block", "head")
        extras.update(
            {name: (dims, np.full(shape, np.nan, np.float32)) for name in VARIABLES.values()}
        )
    if options.get("logit_lens"):
        nobody = torch.zeros_like(last)
        extras.update(
            _lens_variables(model, states, keep, nobody, logits, options.get("lens_k", 5))
        )
    top_k = options.get("top_k", 5) if model.causal else 0
    piece = _piece(
        model,
        [first],
        0,
        0,
        states,
        states[-1],
        keep,
        last,
        logits,
        top_k,
        TokenTexts(model.tokenizer),
        extras,
    )
    return cast_states(piece, options.get("store_dtype", "float32"))


def _template(piece: xr.Dataset, n_particles: int, chunk: int) -> xr.Dataset:
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


def _client(workers: int | None, scheduler: str | None):
    """A Dask client: a new local cluster of ``workers`` processes (listening on
    loopback only, its dashboard too), or ``scheduler`` (handshake bounded)."""
    from dask.distributed import Client

    from tokenfield._dask import connect, local_cluster

    if scheduler is not None:
        return connect(scheduler), None
    cluster = local_cluster(
        int(workers or 1),
        processes=True,
        dashboard=True,
        threads_per_worker=1,
        silence_logs=50,  # logging.CRITICAL: the progress bar is the output
    )
    return Client(cluster), cluster


def check_workers(workers: int | None, scheduler: str | None) -> None:
    if workers is not None and workers < 1:
        raise UserError(f"--workers must be at least 1, got {workers}", "pass e.g. --workers 2")
    if workers is not None and scheduler is not None:
        raise UserError(
            "--workers starts a local cluster and --scheduler uses another one",
            "pass one of them",
        )
    if scheduler is not None:
        from tokenfield._dask import check_scheduler

        check_scheduler(scheduler)  # a malformed or TLS address: one line, before any work


def trace_parallel(
    model: LoadedModel | str | LoadSpec,
    prompts: str | Path | Sequence[Prompt | str],
    *,
    out: str | Path,
    workers: int | None = None,
    scheduler: str | None = None,
    n_shards: int | None = None,
    overwrite: bool = False,
    progress: bool = False,
    report: ParallelReport | None = None,
    local: bool = False,
    on_shard: Callable[[int], Any] | None = None,
    threads: int | None = None,
    **options: Any,
) -> xr.Dataset:
    """Trace ``prompts`` on Dask workers into the run ``out``; see the module docstring.

    Args:
        model: a model from :func:`load_model` (its load arguments are sent to
            the workers), a spec string, or a :class:`LoadSpec`.
        prompts: as for :func:`tokenfield.trace`.
        out: the run directory (required: workers write to it).
        workers: start a local cluster of this many worker processes, each with
            ``torch.set_num_threads(max(1, cores // workers))``.
        scheduler: the address of a running Dask scheduler to use instead.
        n_shards: how many shards (default: 4 per worker, each at most 256 MB).
        local: run the shards one after the other in this process, without
            Dask (what a single-process resume of a sharded run does).
        on_shard: called with each shard's index once it is recorded (tests).
        threads: ``torch.set_num_threads`` in each worker before it loads the
            model (default with ``workers``: ``max(1, cores // workers)``; with
            ``scheduler``: left to the cluster, e.g. ``dask worker --nthreads``).
        options: the options of :func:`tokenfield.trace` (``positions``,
            ``batch_size``, ``chat``, ``truncate``, ``top_k``, ``attention``,
            ``logit_lens``, ``lens_k``, ``steer``, ``store_dtype``).

    Returns:
        The run, opened (:func:`tokenfield.open_run`): the same Dataset as a
        single-process trace of the same prompts.
    """
    from tokenfield._progress import ProgressBar
    from tokenfield.models.trace import build_config, check_model_options, encode_prompts
    from tokenfield.prompts import load_prompts
    from tokenfield.runs import TRAJECTORY, RunWriter, checksummed, open_run, write_json_atomic

    check_workers(workers, scheduler)
    if options.get("generate"):
        raise UserError(
            "--generate makes a number of particles known only after generating, so it "
            "cannot be laid out for workers",
            "drop --workers/--scheduler with --generate",
        )
    options.pop("generate", None)
    options.setdefault("positions", "last")
    options.setdefault("batch_size", 8)
    if isinstance(model, LoadedModel):
        spec = LoadSpec.of(model) if not local else None
        client_model = model
    else:
        spec = model if isinstance(model, LoadSpec) else LoadSpec(model)
        client_model = skeleton(spec)
    check_model_options(client_model, logit_lens=bool(options.get("logit_lens")), generate=0)
    prompt_list = load_prompts(prompts)
    config = build_config(client_model, prompt_list, **options)
    encoded = encode_prompts(
        client_model,
        prompt_list,
        chat=options.get("chat", False),
        truncate=options.get("truncate", False),
    )
    counts = [1 if options["positions"] == "last" else len(e.ids) for e in encoded]
    client = None
    if scheduler is not None and not local:
        # An address that is wrong or does not answer fails here, before the run
        # exists, so that it leaves nothing behind to block the retry.
        from tokenfield._dask import connect

        client = connect(scheduler)
    try:
        writer = RunWriter(
            out,
            "trace",
            config,
            append_dim="particle",
            overwrite=overwrite,
            batch_size=options["batch_size"],
            weights_sha256=client_model.weights_sha256,
        )
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
                total, n_times, client_model.d_model, workers or _n_workers_hint(scheduler)
            )
            shards = plan_shards(counts, options["batch_size"], wanted)
            piece = _schema_piece(client_model, encoded[0], options)
            template = _template(piece, total, shards[0].stop - shards[0].start)
            template.attrs = {"tokenfield_config": writer_config_json(writer), "kind": "trace"}
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                for variable in template.variables.values():
                    variable.encoding["compressors"] = checksummed()  # chunk checksums
                template.to_zarr(store, mode="w", compute=False, consolidated=False)
            finished = set()
        plan = [asdict(s) for s in shards]

        def record() -> None:
            done_prompts = sum(s.prompts for s in shards if s.index in finished)
            writer.info.progress = {
                "batch_size": options["batch_size"],
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

        args = (options, str(store.resolve()))
        if local or not pending:
            for shard in pending:
                sub = prompt_list[shard.first_prompt : shard.stop_prompt]
                trace_shard(spec, sub, shard, *args, model=client_model)  # type: ignore[arg-type]
                finished_shard(shard.index)
        else:
            if threads is None and workers:
                threads = max(1, (os.cpu_count() or 1) // workers)
            _run_on_cluster(
                spec,  # type: ignore[arg-type]
                prompt_list,
                pending,
                args,
                workers,
                client,
                threads,
                report,
                finished_shard,
            )
        writer.finish()
    return open_run(out)


def writer_config_json(writer: Any) -> str:
    import json

    return json.dumps(writer.config)


def _n_workers_hint(scheduler: str | None) -> int:
    return 4 if scheduler else 1


def _run_on_cluster(
    spec: LoadSpec,
    prompt_list: Sequence[Prompt],
    pending: Iterable[Shard],
    args: tuple[dict[str, Any], str],
    workers: int | None,
    client: Any,
    threads: int | None,
    report: ParallelReport | None,
    finished_shard: Callable[[int], None],
) -> None:
    """Run the shards on ``client`` (a connected scheduler's) or, when it is
    ``None``, on a new local cluster of ``workers`` processes."""
    from dask.distributed import as_completed

    cluster = None
    if client is None:
        client, cluster = _client(workers, None)
    try:
        with client:
            futures = [
                client.submit(
                    trace_shard,
                    spec,
                    list(prompt_list[s.first_prompt : s.stop_prompt]),
                    s,
                    *args,
                    threads,
                    pure=False,
                    key=f"tokenfield-shard-{s.index}-{os.urandom(4).hex()}",
                )
                for s in pending
            ]
            try:
                for future in as_completed(futures):
                    finished_shard(future.result())  # a task's error surfaces here
            finally:
                for future in futures:
                    future.cancel()
            if report is not None:
                report.scheduler = client.scheduler.address
                report.workers = sorted(client.scheduler_info()["workers"])
    finally:
        if cluster is not None:
            cluster.close()

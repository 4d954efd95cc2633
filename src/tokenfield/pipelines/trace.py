"""``tokenfield trace`` and :func:`tokenfield.trace`: a trace's one workflow.

:func:`run` takes a model (loaded, or a :class:`~tokenfield.models.load.ModelSpec`
it loads) and a :class:`~tokenfield.models.trace_config.TraceConfig`, and

- in memory (no ``out``): returns the tracer's Dataset;
- into a run directory: holds the directory's one-writer lock from before the
  model loads until the run is written, streams the tracer's batches into the
  run (:class:`~tokenfield.runs.RunWriter`, buffered, see :func:`flush_seconds`),
  and resumes a partial run where it stopped (a run begun on Dask workers: its
  missing shards, here);
- with ``workers``/``scheduler``: hands the run to the Dask workers
  (:mod:`tokenfield.pipelines.shards`).

The tracer itself (:mod:`tokenfield.models.trace`) writes nothing.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import xarray as xr

from tokenfield._lock import writer_lock
from tokenfield._progress import ProgressBar
from tokenfield.errors import UserError
from tokenfield.models.batching import Encoded, Positions
from tokenfield.models.load import LoadedModel, ModelSpec, load_model
from tokenfield.models.trace import Tracer, encode, trace_in_memory
from tokenfield.models.trace_config import TraceConfig
from tokenfield.pipelines.shards import trace_parallel, trace_writer
from tokenfield.prompts import Prompt
from tokenfield.runs import TRAJECTORY, check_writable_dir, open_run
from tokenfield.runs.read import _open_run

__all__ = ["FLUSH_SECONDS", "flush_seconds", "run", "trace"]

# A streamed trace writes its batches to the run this often (and at the end, and
# when interrupted): a kill loses at most this much work. 0 writes every batch.
FLUSH_SECONDS = 5.0


def flush_seconds() -> float:
    """:data:`FLUSH_SECONDS`, or the ``TOKENFIELD_FLUSH_SECONDS`` environment variable."""
    value = os.environ.get("TOKENFIELD_FLUSH_SECONDS", "")
    try:
        return max(0.0, float(value)) if value.strip() else FLUSH_SECONDS
    except ValueError:
        raise UserError(
            f"TOKENFIELD_FLUSH_SECONDS={value!r} is not a number of seconds",
            "set it to e.g. 5, or 0 to write every batch at once",
        ) from None


def trace(
    model: LoadedModel | ModelSpec | str,
    prompts: str | Path | Sequence[Prompt | str],
    *,
    positions: Positions = "last",
    batch_size: int = 8,
    chat: bool = False,
    truncate: bool = False,
    top_k: int = 5,
    attention: bool = False,
    attention_readout: str = "auto",
    logit_lens: bool = False,
    lens_k: int = 5,
    generate: int = 0,
    steer: tuple[Any, float, str] | None = None,
    out: str | Path | None = None,
    overwrite: bool = False,
    progress: bool = False,
    store_dtype: str = "float32",
    workers: int | None = None,
    scheduler: str | None = None,
) -> xr.Dataset:
    """Trace prompts through ``model`` and return their trajectories.

    Args:
        model: from :func:`tokenfield.load_model` or :func:`tokenfield.wrap_model`,
            a :class:`~tokenfield.models.load.ModelSpec`, or a model spec string
            (``"smollm2"``, a directory), loaded with the defaults.
        prompts: a bundled set name, a prompt file, or a list of strings/prompts.
        positions: ``"last"`` (last real token per prompt) or ``"all"`` (every token).
        batch_size: prompts per forward pass. It changes the stored states only
            by float32 rounding (differently shaped matmuls), not bit for bit:
            measured on SmolLM2 (seed-categories, positions last and all,
            batch sizes 8 and 25 against 1), the largest |difference| in a
            layer is at most 1.9e-6 of that layer's largest |state| (7.8e-4
            absolute, where |states| reach 4.4e3); compare traces made with
            different batch sizes to rtol 1e-5 of the layer's scale
            (``scripts/batch_invariance.py`` measures it). A run records its
            batch size in ``run.json``, and a resume with another is refused.
        chat: wrap each prompt in the model's chat template.
        truncate: keep the last tokens of a prompt longer than the context,
            instead of raising.
        top_k: how many next-token predictions to keep per prompt (causal models).
        attention: also reduce every block's attention weights to Markov-chain
            statistics (from the queries and keys, the model's SDPA left running,
            or with eager attention where the model cannot; see
            :mod:`tokenfield.models.attention_readout`).
        attention_readout: ``"auto"``, ``"sdpa"`` or ``"eager"``: which attention
            read-out (:func:`~tokenfield.models.attention_readout.readout_path`).
        logit_lens: also read every last-token state through the final norm
            and the unembedding (causal models with an output embedding).
        lens_k: top tokens kept per time by the logit lens.
        generate: greedily generate this many tokens after each prompt (causal
            models) and keep each generated token's states at every time as a
            particle (``is_generated`` true); fewer only when the model emits
            its end-of-sequence token (kept, and recorded in ``generation_eos``).
        steer: ``(vector, alpha, positions)``: trace (and generate) with a
            :class:`~tokenfield.steering.vectors.SteeringVector` times ``alpha``
            added at its layer (:func:`tokenfield.steering.hooks.steering`);
            recorded in the config, so the steered run can be overlaid on the
            unsteered one in the report. With ``generate``, ``positions`` must be
            ``"all"`` (``"last"`` would steer a different token in the
            generation and in the trace's forward).
        out: stream into this run directory (resumable); ``None`` keeps it in memory.
        overwrite: replace a run at ``out`` made with another config.
        progress: show a progress bar.
        store_dtype: ``"float32"`` (default, whatever the model computes in) or
            ``"float16"``: the dtype ``states`` and ``final_norm_states`` are stored in.
        workers: trace on a local Dask cluster of this many worker processes,
            each writing its shards into its own region of the run's store
            (needs ``out``; :mod:`tokenfield.pipelines.shards`). ``model`` may
            then be a spec: the client never loads the weights.
        scheduler: the same on the running Dask cluster at this address.

    Returns:
        A Dataset with ``states`` (time, particle, feature), float32: ``time`` 0 is
        the embedding output, ``time`` i the raw output of block i-1; the
        ``final_norm_states`` (particle, feature); per-particle coordinates
        ``prompt_index``, ``prompt``, ``category``, ``label``, ``position``,
        ``token`` (the decoded token: ``�`` for part of a character), ``token_id``,
        ``token_piece`` (readable also for partial characters, e.g. ``<0xF0><0x9F>``:
        :func:`tokenfield.models.tokens.token_piece`), ``is_last``; and ``next_token_top``/``next_token_prob``
        (particle, k) for the last token of each prompt (causal models).

        With ``attention``: ``attn_entropy``, ``attn_sink_mass``,
        ``attn_lambda2``, ``attn_lambda2_nosink``, ``attn_raw_lambda2``
        (particle, block, head), set on each prompt's last-token particle and
        NaN elsewhere (the particle dim lets them stream with the run), and the
        per-token ``attn_stationary``, ``attn_stationary_nosink`` (particle,
        block, head). ``block`` i is the attention of block i (between ``time``
        i and i + 1).

        With ``logit_lens``: ``lens_top``/``lens_prob`` (time, particle,
        lens_k), ``lens_rank`` (time, particle; 1 = the final prediction is the
        top token, -1 = not a last token) and ``lens_target`` (particle).

    Example:
        >>> ds = tf.trace("smollm2", "seed-categories", out="runs/categories")  # doctest: +SKIP
        >>> dict(ds.states.sizes)                                               # doctest: +SKIP
        {'time': 31, 'particle': 25, 'feature': 576}
        >>> ds = tf.trace("gemma3-270m", "seed-spectrum", positions="all",
        ...               attention=True)                                       # doctest: +SKIP
    """
    config = TraceConfig(
        prompts,
        positions=positions,
        batch_size=batch_size,
        chat=chat,
        truncate=truncate,
        top_k=top_k,
        attention=attention,
        attention_readout=attention_readout,
        logit_lens=logit_lens,
        lens_k=lens_k,
        generate=generate,
        steer=steer,
        store_dtype=store_dtype,
        workers=workers,
        scheduler=scheduler,
    )
    return run(model, config, out=out, overwrite=overwrite, progress=progress)


def run(
    model: LoadedModel | ModelSpec | str,
    config: TraceConfig,
    *,
    out: str | Path | None = None,
    overwrite: bool = False,
    progress: bool = False,
) -> xr.Dataset:
    """Trace as ``config`` says: in memory, into the run ``out``, or on Dask workers.

    A spec (or spec string) is checked against the model's config, then ``out``
    is locked, and only then is the model loaded (a second writer, or a config
    the model cannot serve, fails before the weights load).

    Returns:
        The Dataset (in memory), or the run opened (:func:`tokenfield.open_run`).
    """
    if isinstance(model, ModelSpec):
        config.check_spec(model)
    if config.parallel and out is None:
        raise UserError("tracing with workers needs a run directory", "pass out=...")
    if out is None:
        loaded = _loaded(model, progress)
        config.check_model(loaded)
        return trace_in_memory(loaded, config, progress=progress)
    check_writable_dir(Path(out))
    with writer_lock(out, what="run"):  # a second writer fails here, before loading
        if config.parallel:  # the client loads no weights
            return trace_parallel(model, config, out=out, overwrite=overwrite, progress=progress)
        loaded = _loaded(model, progress)
        config.check_model(loaded)
        return _trace_into(loaded, config, out, overwrite=overwrite, progress=progress)


def _loaded(model: LoadedModel | ModelSpec | str, progress: bool) -> LoadedModel:
    if isinstance(model, LoadedModel):
        return model
    if isinstance(model, str):
        return load_model(model)
    if not progress:
        return model.load()
    from tokenfield._progress import console

    with console(stderr=True).status(f"loading {model.name}"):
        return model.load()


def particle_count(encoded: Sequence[Encoded], config: TraceConfig) -> int:
    """The particles a trace of ``encoded`` gives at least (``generate`` adds more)."""
    if config.positions == "all":
        return sum(len(item.ids) for item in encoded)
    return len(encoded)


def _trace_into(
    model: LoadedModel, config: TraceConfig, out: str | Path, *, overwrite: bool, progress: bool
) -> xr.Dataset:
    """Stream the batches into the run ``out``, from where a partial run stopped."""
    encoded = encode(model, config)
    writer = trace_writer(
        out,
        model,
        config,
        overwrite=overwrite,
        flush_seconds=flush_seconds(),
        background=True,  # the store is written while the next batches run
        size_hint=particle_count(encoded, config),
    )
    if writer.complete:
        writer.close()
        return open_run(out)
    if "shards" in writer.info.progress:  # a partial run begun with workers
        try:  # its remaining shards, one after the other, in this process
            return trace_parallel(model, config, out=out, local=True)
        finally:
            writer.close()
    start = writer.done
    fresh = start == 0  # every chunk is written below, by this process
    particles = int(writer.info.progress.get("size", 0))
    # A partial run begun by a version without token ids resumes in its own layout.
    legacy = start > 0 and not (Path(out) / TRAJECTORY / "token_id").exists()
    size = config.batch_size
    with contextlib.ExitStack() as stack:
        stack.callback(writer.close)  # the lock goes however the loop ends
        bar = stack.enter_context(
            ProgressBar(
                f"tracing {model.name}",
                len(encoded),
                enabled=progress,
                completed=start,
                unit="prompts",
            )
        )
        tracer = stack.enter_context(Tracer(model, config, legacy=legacy))
        for first in range(start, len(encoded), size):
            batch = encoded[first : first + size]
            piece = tracer.batch(batch, first, particles)
            particles += piece.sizes["particle"]
            writer.append(piece, done=first + len(batch))
            bar.advance(len(batch))
        writer.finish()
    # what the trace held (token ids, the writer's config) goes before the run is read
    # back, so that reading its coordinates reuses that memory instead of adding to it
    del encoded, writer, tracer
    return _open_run(out, allow_partial=False, written=fresh)

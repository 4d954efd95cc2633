"""Trace prompts through a model, layer by layer, into a trajectory Dataset.

For each prompt the residual stream is read at every site (``embed``, every block,
the final norm) and kept only at the asked-for positions:

- ``positions="last"``: the last real token of each prompt (the seed experiment);
- ``positions="all"``: every token (the token cloud).

Batches are padded; which positions are real comes from the attention mask.
Causal models are left-padded with ``position_ids`` derived from the mask, so a
batched prompt sees exactly the positions it would see alone (the pitfall of
nnsight #672), and ``logits_to_keep=1`` computes logits only for the last column,
which is every prompt's last real token. Encoders are right-padded.

With ``out``, pieces are streamed to a run directory batch by batch (see
:mod:`tokenfield.runs`); an interrupted trace resumes where it stopped.

Two optional read-outs cost nothing when off (no hooks, no config keys):

- ``attention=True``: each block's attention weights, reduced per prompt inside
  the forward pass to Markov-chain statistics (:mod:`tokenfield.models.attention`);
  the model runs with eager attention for the trace.
- ``logit_lens=True``: each last-token state at every time read through the
  final norm and the unembedding: its top tokens and the rank of the model's
  final prediction (:func:`tokenfield.models.capture.logit_lens`).

``generate=N`` (causal models) greedily generates N tokens after each prompt and
keeps every generated token's states as particles too (``is_generated`` true,
``position`` past the prompt): one plain forward over prompt + continuation per
batch, so the states are those of the model reading the generated text.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import xarray as xr

from tokenfield._progress import ProgressBar
from tokenfield.errors import ParameterError, UserError
from tokenfield.models.attention import AttentionCapture, capture_attention, eager_attention
from tokenfield.models.batching import (
    Encoded,
    Positions,
    encode_prompts,
    forward_last,
    pad_batch,
)
from tokenfield.models.capture import capture_residual, logit_lens
from tokenfield.models.hooks import add_to_residual
from tokenfield.models.load import LoadedModel
from tokenfield.models.sites import site_names
from tokenfield.models.tokens import TokenTexts
from tokenfield.prompts import Prompt, load_prompts
from tokenfield.runs import CONFIG_ATTR, TRAJECTORY, RunWriter, concat_pieces, open_run, strings

__all__ = [
    "trace",
    "check_trace_options",
    "encode_prompts",
    "forward_last",
    "pad_batch",
    "Positions",
]


# A streamed trace writes its batches to the run this often (and at the end, and
# when interrupted): a kill loses at most this much work. 0 writes every batch.
FLUSH_SECONDS = 5.0


def _flush_seconds() -> float:
    """:data:`FLUSH_SECONDS`, or the ``TOKENFIELD_FLUSH_SECONDS`` environment variable."""
    import os

    value = os.environ.get("TOKENFIELD_FLUSH_SECONDS", "")
    try:
        return max(0.0, float(value)) if value.strip() else FLUSH_SECONDS
    except ValueError:
        raise UserError(
            f"TOKENFIELD_FLUSH_SECONDS={value!r} is not a number of seconds",
            "set it to e.g. 5, or 0 to write every batch at once",
        ) from None


def _sha256(values: np.ndarray) -> str:
    import hashlib

    return hashlib.sha256(np.ascontiguousarray(values, dtype=np.float32).tobytes()).hexdigest()


def _continue_greedily(
    model: LoadedModel, batch: Sequence[Encoded], n: int
) -> tuple[list[Encoded], list[tuple[int, bool]]]:
    """Greedy continuations: each prompt's ids extended by up to ``n`` generated ids.

    Returns the extended items and, per prompt, (how many ids were generated,
    whether the last is the end-of-sequence token: then it stopped early).
    """
    padded = pad_batch(batch, model, "last")
    inputs = {k: v.to(model.device) for k, v in padded["inputs"].items()}
    inputs.pop("position_ids")  # generate() derives positions from the mask itself
    tokenizer = model.tokenizer
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else None
    if pad_id is None:
        pad_id = tokenizer.eos_token_id or 0
    eos = model.model.generation_config.eos_token_id
    if eos is None:
        eos = tokenizer.eos_token_id
    eos_ids = set(eos if isinstance(eos, (list, tuple)) else [] if eos is None else [eos])
    out = model.model.generate(
        **inputs,
        max_new_tokens=n,
        min_new_tokens=0,
        do_sample=False,
        num_beams=1,
        pad_token_id=pad_id,
        temperature=None,
        top_p=None,
        top_k=None,
    )
    new = out[:, inputs["input_ids"].shape[1] :].cpu().tolist()
    extended, generated = [], []
    for item, row in zip(batch, new, strict=True):
        ids: list[int] = []
        stopped = False
        for token in row[:n]:
            ids.append(int(token))
            if int(token) in eos_ids:
                stopped = True
                break
        extended.append(Encoded(item.prompt, [*item.ids, *ids]))
        generated.append((len(ids), stopped))
    return extended, generated


def _pad_generated(
    batch: Sequence[Encoded],
    generated: Sequence[tuple[int, bool]],
    model: LoadedModel,
    positions: Positions,
) -> dict[str, torch.Tensor]:
    """:func:`pad_batch` for prompt + continuation: ``last`` marks each prompt's
    own last token, ``keep`` adds every generated token, ``read`` (what the logit
    lens reads) is ``last`` and the generated tokens."""
    padded = pad_batch(batch, model, "all")
    mask = padded["inputs"]["attention_mask"].bool()
    width = mask.shape[1]
    last = torch.zeros_like(mask)
    new = torch.zeros_like(mask)
    for row, (count, _stopped) in enumerate(generated):
        last[row, width - 1 - count] = True  # causal: left padded, the sequence ends last
        new[row, width - count :] = count > 0
    keep = mask if positions == "all" else last | new
    return {"inputs": padded["inputs"], "keep": keep, "last": last, "read": last | new}


def _forward_every(model: LoadedModel, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """Run the causal model; return the logits at every column (batch, seq, vocab)."""
    inputs = {k: v.to(model.device) for k, v in inputs.items()}
    return model.model(**inputs, use_cache=False).logits.float()


def _mark_generated(
    piece: xr.Dataset,
    batch: Sequence[Encoded],
    generated: Sequence[tuple[int, bool]],
    first_prompt: int,
) -> xr.Dataset:
    """Add ``is_generated``, ``n_generated`` and ``generation_eos`` to a piece."""
    row = np.asarray(piece["prompt_index"].values) - first_prompt
    prompt_length = np.array(
        [len(item.ids) - count for item, (count, _) in zip(batch, generated, strict=True)]
    )
    counts = np.array([count for count, _ in generated], dtype=np.int64)
    eos = np.array([stopped for _, stopped in generated], dtype=bool)
    return piece.assign_coords(
        is_generated=("particle", np.asarray(piece["position"].values) >= prompt_length[row]),
        n_generated=("particle", counts[row]),
        generation_eos=("particle", eos[row]),
    )


def _piece(
    model: LoadedModel,
    batch: Sequence[Encoded],
    first_prompt: int,
    first_particle: int,
    states: list[torch.Tensor],
    final_norm: torch.Tensor,
    keep: torch.Tensor,
    last: torch.Tensor,
    logits: torch.Tensor | None,
    top_k: int,
    texts: TokenTexts,
    extras: dict[str, Any] | None = None,
) -> xr.Dataset:
    """Assemble one batch's particles into a Dataset piece (``extras``: more variables)."""
    rows, cols = keep.nonzero(as_tuple=True)  # row-major, as the hooks flattened them
    n = int(rows.numel())
    width = keep.shape[1]
    prompt_index, positions, tokens, is_last, token_ids = [], [], [], [], []
    for row, col in zip(rows.tolist(), cols.tolist(), strict=True):
        item = batch[row]
        pad = width - len(item.ids) if model.causal else 0
        pos = col - pad
        prompt_index.append(first_prompt + row)
        positions.append(pos)
        tokens.append(texts.text(item.ids[pos]))
        token_ids.append(int(item.ids[pos]))
        is_last.append(bool(last[row, col]))
    stacked = torch.stack(states).numpy()  # (time, particle, d)
    coords: dict[str, Any] = {
        "time": np.arange(len(states)),
        "site": ("time", strings(site_names(len(states) - 1))),
        "particle": np.arange(first_particle, first_particle + n),
        "prompt_index": ("particle", np.array(prompt_index, dtype=np.int64)),
        "prompt": ("particle", strings(batch[i - first_prompt].prompt.text for i in prompt_index)),
        "category": (
            "particle",
            strings(batch[i - first_prompt].prompt.category for i in prompt_index),
        ),
        "label": ("particle", strings(batch[i - first_prompt].prompt.label for i in prompt_index)),
        "position": ("particle", np.array(positions, dtype=np.int64)),
        "token": ("particle", strings(tokens)),
        "token_id": ("particle", np.array(token_ids, dtype=np.int64)),
        "token_piece": ("particle", strings(texts.piece(t) for t in token_ids)),
        "is_last": ("particle", np.array(is_last, dtype=bool)),
    }
    data_vars: dict[str, Any] = {
        "states": (("time", "particle", "feature"), stacked),
        "final_norm_states": (("particle", "feature"), final_norm.numpy()),
    }
    if logits is not None and top_k > 0:
        probs = logits.softmax(-1)
        top_prob, top_id = probs.topk(top_k, dim=-1)  # (batch, k)
        names = np.full((n, top_k), "", dtype=object)
        values = np.full((n, top_k), np.nan, dtype=np.float32)
        for particle, (row, flag) in enumerate(zip(rows.tolist(), is_last, strict=True)):
            if flag:
                names[particle] = [texts.text(t) for t in top_id[row].tolist()]
                values[particle] = top_prob[row].cpu().numpy()
        data_vars["next_token_top"] = (("particle", "k"), names)
        data_vars["next_token_prob"] = (("particle", "k"), values)
    for name, (dims, values) in (extras or {}).items():
        data_vars[name] = (dims, values)
        for dim, size in zip(dims, np.shape(values), strict=True):
            if dim in ("block", "head") and dim not in coords:
                coords[dim] = np.arange(size)
    return xr.Dataset(data_vars, coords=coords)


def _lens_variables(
    model: LoadedModel,
    states: list[torch.Tensor],
    keep: torch.Tensor,
    last: torch.Tensor,
    logits: torch.Tensor,
    k: int,
) -> dict[str, Any]:
    """Logit-lens variables: ``lens_top``/``lens_prob`` (time, particle, lens_k),
    ``lens_rank`` (time, particle; 1 = top, -1 = not a last token) and
    ``lens_target`` (particle): the model's final prediction."""
    rows, cols = keep.nonzero(as_tuple=True)
    flags = last[rows, cols]  # (particles,)
    chosen = torch.nonzero(flags).flatten()
    times, n = len(states), int(rows.numel())
    names = np.full((times, n, k), "", dtype=object)
    probs = np.full((times, n, k), np.nan, dtype=np.float32)
    ranks = np.full((times, n), -1, dtype=np.int64)
    targets = np.full(n, "", dtype=object)
    if chosen.numel():
        if logits.dim() == 3:  # (batch, seq, vocab): every position's prediction (--generate)
            target = logits[rows[chosen], cols[chosen]].argmax(-1)
        else:
            target = logits.argmax(-1)[rows[chosen]]  # (n_last,)
        stacked = torch.stack([s[chosen] for s in states])  # (time, n_last, d)
        readout = logit_lens(model.sites, model.model.get_output_embeddings(), stacked, target, k)
        words: dict[int, str] = {}

        def word(token: int) -> str:
            if token not in words:
                words[token] = model.tokenizer.decode([token])
            return words[token]

        index = chosen.numpy()
        for slot, particle in enumerate(index):
            targets[particle] = word(int(target[slot]))
            for time in range(times):
                names[time, particle] = [word(int(t)) for t in readout.top_ids[time, slot]]
        probs[:, index] = readout.top_probs
        ranks[:, index] = readout.rank
    return {
        "lens_top": (("time", "particle", "lens_k"), names),
        "lens_prob": (("time", "particle", "lens_k"), probs),
        "lens_rank": (("time", "particle"), ranks),
        "lens_target": (("particle",), targets),
    }


def check_trace_options(
    *,
    positions: str = "last",
    batch_size: int = 8,
    generate: int = 0,
    steer_positions: str | None = None,
) -> None:
    """Check the options of :func:`trace` that need no model (the CLI calls it
    before loading one; :func:`trace` calls it first thing).

    Args:
        steer_positions: the positions of the ``steer`` argument (``None``: no steering).

    Raises:
        ParameterError: naming ``positions``, ``batch_size``, ``generate`` or
            ``steer_positions``.
    """
    if positions not in ("last", "all"):
        raise ParameterError("positions", f"unknown {{name}} '{positions}'", "use 'last' or 'all'")
    if batch_size < 1:
        raise ParameterError(
            "batch_size", f"{{name}} must be at least 1, got {batch_size}", "pass e.g. {name} 8"
        )
    if generate < 0:
        raise ParameterError(
            "generate", f"{{name}} must be 0 or more, got {generate}", "pass e.g. {name} 8"
        )
    if steer_positions is not None:
        if steer_positions not in ("last", "all"):
            raise ParameterError(
                "steer_positions", f"unknown {{name}} '{steer_positions}'", "use 'last' or 'all'"
            )
        if generate and steer_positions != "all":
            raise ParameterError(
                "steer_positions",
                "steering the last position while generating would steer another token in "
                "each generation step than in the trace",
                "steer all positions: pass {name} all",
            )


def check_generate_length(
    generate: int, context: int | None, model_name: str, prompt_tokens: int = 0
) -> None:
    """Refuse ``generate`` tokens that would run past the model's ``context``
    (after a prompt of ``prompt_tokens``): the model has no positions for them, and
    a million of them would run for days.

    Raises:
        ParameterError: naming ``generate``.
    """
    if not generate or not context or prompt_tokens + generate <= context:
        return
    if prompt_tokens:
        problem = (
            f"{{name}} {generate} after a prompt of {prompt_tokens} tokens goes beyond "
            f"the context of model '{model_name}' ({context} tokens)"
        )
    else:
        problem = (
            f"{{name}} {generate} is beyond the context of model '{model_name}' ({context} tokens)"
        )
    room = max(0, context - max(prompt_tokens, 1))
    raise ParameterError("generate", problem, f"pass {{name}} {room} or less")


def check_model_options(model: LoadedModel, *, logit_lens: bool, generate: int) -> None:
    """Refuse read-outs the model cannot give (one line each).

    Raises:
        ParameterError: naming ``logit_lens`` or ``generate``.
    """
    if logit_lens and (not model.causal or model.model.get_output_embeddings() is None):
        raise ParameterError(
            "logit_lens",
            f"model '{model.name}' has no unembedding, so it has no logit lens",
            "drop {name} for this model",
        )
    if generate and not model.causal:
        raise ParameterError(
            "generate",
            f"model '{model.name}' is not a causal language model, so it cannot generate",
            "drop {name} for this model",
        )
    check_generate_length(generate, model.max_positions, model.name, prompt_tokens=1)


def build_config(
    model: LoadedModel,
    prompt_list: Sequence[Prompt],
    *,
    positions: Positions = "last",
    batch_size: int = 8,
    chat: bool = False,
    truncate: bool = False,
    top_k: int = 5,
    attention: bool = False,
    logit_lens: bool = False,
    lens_k: int = 5,
    generate: int = 0,
    steer: tuple[Any, float, str] | None = None,
    store_dtype: str = "float32",
) -> dict[str, Any]:
    """The run config of a trace (what ``run.json`` records and a resume compares)."""
    del batch_size  # recorded in progress, not in the config
    config = {
        "model": model.run_config(),
        "positions": positions,
        "chat": chat,
        "truncate": truncate,
        "top_k": top_k if model.causal else 0,
        "prompts": [p.to_json() for p in prompt_list],
    }
    # Added only when on, so runs traced without them keep their config (and resume).
    if attention:
        config["attention"] = {
            "attn_implementation": "eager",
            "chain": "symmetrised (A + A^T), sink kept and sink dropped",
        }
    if logit_lens:
        config["logit_lens"] = {"k": lens_k}
    if generate:
        config["generate"] = {"max_new_tokens": generate, "decoding": "greedy"}
    if steer is not None:
        vector, alpha, steer_positions = steer
        if generate and steer_positions != "all":
            raise UserError(
                "steering the last position while generating would steer another token in "
                "each generation step than in the trace",
                "steer all positions (--steer-positions all) with --generate",
            )
        vector.check_model(model)
        config["steering"] = {
            "layer": int(vector.layer),
            "alpha": float(alpha),
            "positions": steer_positions,
            "vector_sha256": _sha256(vector.vector),
            "provenance": vector.provenance,
        }
    if store_dtype != "float32":  # added only when not the default, as the others
        if store_dtype not in STORE_DTYPES:
            raise UserError(
                f"unknown store dtype '{store_dtype}'", f"use one of: {', '.join(STORE_DTYPES)}"
            )
        config["store_dtype"] = store_dtype
    return config


STORE_DTYPES = ("float32", "float16")


def cast_states(piece: xr.Dataset, store_dtype: str) -> xr.Dataset:
    """Store ``states`` and ``final_norm_states`` as ``store_dtype`` (default float32)."""
    if store_dtype == "float32":
        return piece
    names = [n for n in ("states", "final_norm_states") if n in piece]
    return piece.assign({n: piece[n].astype(store_dtype) for n in names})


def trace(
    model: LoadedModel | str,
    prompts: str | Path | Sequence[Prompt | str],
    *,
    positions: Positions = "last",
    batch_size: int = 8,
    chat: bool = False,
    truncate: bool = False,
    top_k: int = 5,
    attention: bool = False,
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
            or a model spec (``"smollm2"``, a directory), loaded with the defaults.
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
            statistics (runs the model with eager attention; see
            :mod:`tokenfield.models.attention`).
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
            (needs ``out``; :mod:`tokenfield.models.parallel`). ``model`` may
            then be a spec string: the client never loads the weights.
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
    """
    check_trace_options(
        positions=positions,
        batch_size=batch_size,
        generate=generate,
        steer_positions=None if steer is None else steer[2],
    )
    if logit_lens and lens_k < 1:
        raise ParameterError(
            "lens_k", f"{{name}} must be at least 1, got {lens_k}", "pass e.g. {name} 5"
        )
    options: dict[str, Any] = {
        "positions": positions,
        "batch_size": batch_size,
        "chat": chat,
        "truncate": truncate,
        "top_k": top_k,
        "attention": attention,
        "logit_lens": logit_lens,
        "lens_k": lens_k,
        "steer": steer,
        "store_dtype": store_dtype,
    }
    if workers is not None or scheduler is not None:
        from tokenfield.models.parallel import trace_parallel

        if out is None:
            raise UserError("tracing with workers needs a run directory", "pass out=...")
        if generate:
            raise UserError(
                "generate makes a number of particles known only after generating, so it "
                "cannot be laid out for workers",
                "drop workers/scheduler with generate",
            )
        return trace_parallel(
            model,
            prompts,
            out=out,
            workers=workers,
            scheduler=scheduler,
            overwrite=overwrite,
            progress=progress,
            **options,
        )
    if not isinstance(model, LoadedModel):
        from tokenfield.models.load import load_model

        model = load_model(model)
    check_model_options(model, logit_lens=logit_lens, generate=generate)
    prompt_list = load_prompts(prompts)
    encoded = encode_prompts(model, prompt_list, chat=chat, truncate=truncate)
    if generate:
        longest = max(len(item.ids) for item in encoded)
        check_generate_length(generate, model.max_positions, model.name, prompt_tokens=longest)
    config = build_config(model, prompt_list, **options, generate=generate)
    writer = None
    if out is not None:
        writer = RunWriter(
            out,
            "trace",
            config,
            append_dim="particle",
            overwrite=overwrite,
            batch_size=batch_size,
            weights_sha256=model.weights_sha256,
            flush_seconds=_flush_seconds(),
            background=True,  # the store is written while the next batches run
        )
        if writer.complete:
            writer.close()
            return open_run(out)
        if "shards" in writer.info.progress:  # a partial run begun with workers
            from tokenfield.models.parallel import trace_parallel

            try:  # its remaining shards, one after the other, in this process
                return trace_parallel(model, prompt_list, out=out, local=True, **options)
            finally:
                writer.close()
    start = writer.done if writer else 0
    particles = int(writer.info.progress.get("size", 0)) if writer else 0
    # A partial run begun by a version without token ids resumes in its own layout.
    legacy = bool(writer and start > 0 and not (Path(out) / TRAJECTORY / "token_id").exists())
    pieces: list[xr.Dataset] = []
    texts = TokenTexts(model.tokenizer)
    bar = ProgressBar(
        f"tracing {model.name}", len(encoded), enabled=progress, completed=start, unit="prompts"
    )
    with contextlib.ExitStack() as stack:
        if writer is not None:
            stack.callback(writer.close)  # the lock goes however the loop ends
        stack.enter_context(bar)
        if steer is not None:  # checked above (vector.check_model): add alpha * vector
            vector, alpha, steer_positions = steer
            delta = float(alpha) * torch.from_numpy(np.asarray(vector.vector))
            stack.enter_context(
                add_to_residual(model, {int(vector.layer): delta}, positions=steer_positions)
            )
        capture = stack.enter_context(capture_residual(model.sites))
        reducer: AttentionCapture | None = None
        if attention:
            stack.enter_context(eager_attention(model.model))
            reducer = stack.enter_context(capture_attention(model.sites, causal=model.causal))
        stack.enter_context(torch.inference_mode())
        for first in range(start, len(encoded), batch_size):
            batch = encoded[first : first + batch_size]
            generated = None
            if generate:
                with capture.pause():
                    batch, generated = _continue_greedily(model, batch, generate)
                padded = _pad_generated(batch, generated, model, positions)
                capture.reset(model.n_layers + 1, padded["keep"])
                if reducer is not None:
                    reducer.reset(model.n_layers, padded["inputs"]["attention_mask"])
                every = _forward_every(model, padded["inputs"])
                logits = every[torch.arange(len(batch)), padded["last"].float().argmax(-1)]
            else:
                padded = pad_batch(batch, model, positions)
                capture.reset(model.n_layers + 1, padded["keep"])
                if reducer is not None:
                    reducer.reset(model.n_layers, padded["inputs"]["attention_mask"])
                logits = forward_last(model, padded["inputs"])
            capture.ready()
            states = [s for s in capture.states if s is not None]
            if len(states) != model.n_layers + 1:
                raise RuntimeError("a block did not run; the site registry is wrong for this model")
            final = capture.final_norm if capture.final_norm is not None else states[-1]
            extras: dict[str, Any] = {}
            if reducer is not None:
                extras.update(reducer.variables(padded["keep"], padded["last"]))
            if logit_lens and logits is not None:
                with capture.pause():
                    extras.update(
                        _lens_variables(
                            model, states, padded["keep"], padded["last"], logits, lens_k
                        )
                        if generated is None
                        else _lens_variables(
                            model, states, padded["keep"], padded["read"], every, lens_k
                        )
                    )
            piece = _piece(
                model,
                batch,
                first,
                particles,
                states,
                final,
                padded["keep"],
                padded["last"],
                logits,
                config["top_k"],
                texts,
                extras,
            )
            if legacy:
                piece = piece.drop_vars(["token_id", "token_piece"])
            if generated is not None:
                piece = _mark_generated(piece, batch, generated, first)
            piece = cast_states(piece, store_dtype)
            particles += piece.sizes["particle"]
            if writer:
                writer.append(piece, done=first + len(batch))
            else:
                pieces.append(piece)
            bar.advance(len(batch))
        if writer:
            writer.finish()
    if writer:
        return open_run(out)  # type: ignore[arg-type]
    # one numpy concatenation per variable (the pieces share everything but particles)
    result = concat_pieces(pieces, "particle")
    result.attrs = {
        CONFIG_ATTR: json.dumps(config),
        "kind": "trace",
        "run": {
            "kind": "trace",
            "status": "complete",
            "config": config,
            **({"weights_sha256": model.weights_sha256} if model.weights_sha256 else {}),
        },
    }
    return result

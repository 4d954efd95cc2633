"""The tracer: batches of prompts in, one xarray Dataset per batch out; no files.

For each prompt the residual stream is read at every site (``embed``, every block,
the final norm) and kept only at the asked-for positions:

- ``positions="last"``: the last real token of each prompt (the seed experiment);
- ``positions="all"``: every token (the token cloud).

Batches are padded; which positions are real comes from the attention mask.
Causal models are left-padded with ``position_ids`` derived from the mask, so a
batched prompt sees exactly the positions it would see alone (the pitfall of
nnsight #672), and ``logits_to_keep=1`` computes logits only for the last column,
which is every prompt's last real token. Encoders are right-padded.

Two optional read-outs cost nothing when off (no hooks, no config keys):

- ``attention``: each block's attention weights, reduced per prompt inside
  the forward pass to Markov-chain statistics (:mod:`tokenfield.models.attention`):
  from the queries and keys SDPA receives, the model's own kernel left running
  (:mod:`tokenfield.models.attention_readout`), or, for a model that cannot take
  that path, with the model switched to eager attention for the trace
  (:func:`~tokenfield.models.attention_readout.readout_path` says which).
- ``logit_lens``: each last-token state at every time read through the
  final norm and the unembedding: its top tokens and the rank of the model's
  final prediction (:func:`tokenfield.models.capture.logit_lens`).

``generate=N`` (causal models) greedily generates N tokens after each prompt
(:mod:`tokenfield.models.generate`) and keeps every generated token's states as
particles too (``is_generated`` true, ``position`` past the prompt): one plain
forward over prompt + continuation per batch, so the states are those of the
model reading the generated text.

What to trace is a :class:`~tokenfield.models.trace_config.TraceConfig`; the
workflow around it (the run directory, its lock, resume, Dask workers) is
:mod:`tokenfield.pipelines.trace`, and the public :func:`tokenfield.trace`.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import xarray as xr

from tokenfield._progress import ProgressBar
from tokenfield.models.attention import (
    VARIABLES,
    AttentionCapture,
    capture_attention,
    eager_attention,
)
from tokenfield.models.attention_readout import capture_queries_keys, readout_path
from tokenfield.models.batching import (
    Encoded,
    Positions,
    encode_prompts,
    forward_last,
    pad_batch,
)
from tokenfield.models.capture import capture_residual, logit_lens
from tokenfield.models.generate import continue_greedily
from tokenfield.models.hooks import add_to_residual
from tokenfield.models.load import LoadedModel
from tokenfield.models.sites import site_names
from tokenfield.models.tokens import TokenTexts
from tokenfield.models.trace_config import TraceConfig, check_generate_length
from tokenfield.runs import CONFIG_ATTR, concat_pieces, strings

__all__ = ["Tracer", "cast_states", "encode", "schema_piece", "trace_in_memory"]


def encode(model: LoadedModel, config: TraceConfig) -> list[Encoded]:
    """The config's prompts as token ids (chat template, truncation), with
    ``generate`` checked against the longest prompt and the model's context."""
    encoded = encode_prompts(model, config.prompts, chat=config.chat, truncate=config.truncate)
    if config.generate and encoded:
        longest = max(len(item.ids) for item in encoded)
        check_generate_length(
            config.generate, model.max_positions, model.name, prompt_tokens=longest
        )
    return encoded


class Tracer:
    """Trace batches through ``model`` as ``config`` says, one Dataset piece each.

    The hooks (capture, steering, attention read-out) are registered on entering
    and removed on exit, even on error::

        with Tracer(model, config) as tracer:
            piece = tracer.batch(encoded[0:8], first_prompt=0, first_particle=0)

    Args:
        legacy: drop ``token_id`` and ``token_piece`` (a partial run begun by a
            version without them resumes in its own layout).
    """

    def __init__(self, model: LoadedModel, config: TraceConfig, *, legacy: bool = False):
        self.model = model
        self.config = config
        self.legacy = legacy
        self.top_k = config.kept_top_k(model)
        self.texts = TokenTexts(model.tokenizer)
        self.reducer: AttentionCapture | None = None
        self._stack: contextlib.ExitStack | None = None

    def __enter__(self) -> Tracer:
        model, config = self.model, self.config
        with contextlib.ExitStack() as stack:
            if config.steer is not None:  # checked by config.check_model: add alpha * vector
                vector, alpha, steer_positions = config.steer
                delta = float(alpha) * torch.from_numpy(np.asarray(vector.vector))
                stack.enter_context(
                    add_to_residual(model, {int(vector.layer): delta}, positions=steer_positions)
                )
            self.capture = stack.enter_context(capture_residual(model.sites))
            if config.attention and readout_path(model, config.attention_readout) == "sdpa":
                self.reducer = stack.enter_context(
                    capture_queries_keys(
                        model.sites, model.model, AttentionCapture(causal=model.causal)
                    )
                )
            elif config.attention:
                stack.enter_context(eager_attention(model.model))
                self.reducer = stack.enter_context(
                    capture_attention(model.sites, causal=model.causal)
                )
            stack.enter_context(torch.inference_mode())
            self._stack = stack.pop_all()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._stack is not None:
            self._stack.__exit__(*exc)
            self._stack = None

    def batch(self, batch: Sequence[Encoded], first_prompt: int, first_particle: int) -> xr.Dataset:
        """One batch's particles: prompts ``first_prompt ..`` (their index in the
        run), particles numbered from ``first_particle``."""
        model, config, capture, reducer = self.model, self.config, self.capture, self.reducer
        generated = None
        if config.generate:
            with capture.pause(), reducer.pause() if reducer else contextlib.nullcontext():
                batch, generated = continue_greedily(model, batch, config.generate)
            padded = _pad_generated(batch, generated, model, config.positions)
            capture.reset(model.n_layers + 1, padded["keep"])
            if reducer is not None:
                reducer.reset(model.n_layers, padded["inputs"]["attention_mask"])
            every = _forward_every(model, padded["inputs"])
            logits = every[torch.arange(len(batch)), padded["last"].float().argmax(-1)]
        else:
            padded = pad_batch(batch, model, config.positions)
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
        if config.logit_lens and logits is not None:
            with capture.pause():
                extras.update(
                    _lens_variables(
                        model, states, padded["keep"], padded["last"], logits, config.lens_k
                    )
                    if generated is None
                    else _lens_variables(
                        model, states, padded["keep"], padded["read"], every, config.lens_k
                    )
                )
        piece = _piece(
            model,
            batch,
            first_prompt,
            first_particle,
            states,
            final,
            padded["keep"],
            padded["last"],
            logits,
            self.top_k,
            self.texts,
            extras,
        )
        if self.legacy:
            piece = piece.drop_vars(["token_id", "token_piece"])
        if generated is not None:
            piece = _mark_generated(piece, batch, generated, first_prompt)
        return cast_states(piece, config.store_dtype)


def trace_in_memory(
    model: LoadedModel, config: TraceConfig, *, progress: bool = False
) -> xr.Dataset:
    """Every batch of ``config``'s prompts, as one Dataset (``progress``: a bar).

    Its ``attrs`` carry the run config, as a run's would (``run``, ``kind``).
    """
    encoded = encode(model, config)
    pieces: list[xr.Dataset] = []
    particles = 0
    bar = ProgressBar(f"tracing {model.name}", len(encoded), enabled=progress, unit="prompts")
    with bar, Tracer(model, config) as tracer:
        for first in range(0, len(encoded), config.batch_size):
            batch = encoded[first : first + config.batch_size]
            piece = tracer.batch(batch, first, particles)
            particles += piece.sizes["particle"]
            pieces.append(piece)
            bar.advance(len(batch))
    # one numpy concatenation per variable (the pieces share everything but particles)
    result = concat_pieces(pieces, "particle")
    run_config = config.run_config(model)
    result.attrs = {
        CONFIG_ATTR: json.dumps(run_config),
        "kind": "trace",
        "run": {
            "kind": "trace",
            "status": "complete",
            "config": run_config,
            **({"weights_sha256": model.weights_sha256} if model.weights_sha256 else {}),
        },
    }
    return result


def schema_piece(model: LoadedModel, first: Encoded, config: TraceConfig) -> xr.Dataset:
    """A one-prompt piece with zero states: every variable of a run traced with
    ``config``, with its dims and dtype (what a sharded run's store is laid out
    from before any worker traces), built by the tracer's own piece builder."""
    padded = pad_batch([first], model, config.positions)
    keep, last = padded["keep"], padded["last"]
    n = int(keep.sum())
    states = [torch.zeros(n, model.d_model) for _ in range(model.n_layers + 1)]
    logits = torch.zeros(1, int(model.model.config.vocab_size)) if model.causal else None
    extras: dict[str, Any] = {}
    if config.attention:
        heads = int(model.model.config.num_attention_heads)
        shape = (n, model.n_layers, heads)
        dims = ("particle", "block", "head")
        extras.update(
            {name: (dims, np.full(shape, np.nan, np.float32)) for name in VARIABLES.values()}
        )
    if config.logit_lens:
        nobody = torch.zeros_like(last)
        extras.update(_lens_variables(model, states, keep, nobody, logits, config.lens_k))
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
        config.kept_top_k(model),
        TokenTexts(model.tokenizer),
        extras,
    )
    return cast_states(piece, config.store_dtype)


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


def cast_states(piece: xr.Dataset, store_dtype: str) -> xr.Dataset:
    """Store ``states`` and ``final_norm_states`` as ``store_dtype`` (default float32)."""
    if store_dtype == "float32":
        return piece
    names = [n for n in ("states", "final_norm_states") if n in piece]
    return piece.assign({n: piece[n].astype(store_dtype) for n in names})

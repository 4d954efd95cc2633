"""What a trace computes: :class:`TraceConfig`, every option checked in one place.

A config is built once (by :func:`tokenfield.trace` from its keyword arguments,
or by ``tokenfield trace`` from its flags), checks every option on construction
(one :class:`~tokenfield.errors.ParameterError` naming the parameter; the CLI
names the flag), loads the prompts once, and gives the config a run records
(:meth:`TraceConfig.run_config`, what ``run.json`` holds and a resume compares).
The tracer (:mod:`tokenfield.models.trace`) reads it; the trace pipeline
(:mod:`tokenfield.pipelines.trace`) writes it.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from tokenfield.errors import ParameterError, UserError
from tokenfield.models.batching import Positions
from tokenfield.models.load import LoadedModel, ModelSpec
from tokenfield.prompts import Prompt, load_prompts

__all__ = ["STORE_DTYPES", "TraceConfig", "check_generate_length"]

STORE_DTYPES = ("float32", "float16")


@dataclass(frozen=True)
class TraceConfig:
    """The options of one trace (see :func:`tokenfield.trace` for each).

    Attributes:
        prompts: the prompts, loaded on construction from a bundled set name, a
            file or a list (kept as a tuple of :class:`~tokenfield.prompts.Prompt`).
        positions: ``"last"`` or ``"all"``.
        batch_size: prompts per forward pass.
        chat, truncate: how prompts are encoded.
        top_k: next-token predictions kept per prompt (causal models).
        attention, logit_lens, lens_k: the optional read-outs.
        attention_readout: how ``attention`` is read: ``"auto"`` (from the
            queries and keys, SDPA left running, where the model allows it; else
            eager attention), ``"sdpa"`` or ``"eager"`` (see
            :func:`~tokenfield.models.attention_readout.readout_path`). The run
            records the path taken.
        generate: greedy tokens generated after each prompt.
        steer: ``(vector, alpha, positions)`` or ``None``; ``vector`` is a
            :class:`~tokenfield.steering.vectors.SteeringVector` (only ``positions``
            is checked on construction: the vector is first used by
            :meth:`check_model`, so a caller may check the options before reading it).
        store_dtype: ``"float32"`` or ``"float16"``.
        workers, scheduler: trace on Dask workers (a local cluster of ``workers``
            processes, or the running scheduler at ``scheduler``); they decide
            where the work runs, not what it computes, so the run config omits them.

    Raises:
        ParameterError: a bad value, naming its parameter.
        UserError: bad prompts; ``workers`` with ``scheduler``; a bad scheduler address.

    Example:
        >>> config = tf.TraceConfig(prompts="seed-spectrum", positions="all", batch_size=4)
        >>> len(config.prompts), config.positions, config.batch_size
        (21, 'all', 4)
    """

    prompts: Any = "seed-categories"
    positions: Positions = "last"
    batch_size: int = 8
    chat: bool = False
    truncate: bool = False
    top_k: int = 5
    attention: bool = False
    attention_readout: str = "auto"
    logit_lens: bool = False
    lens_k: int = 5
    generate: int = 0
    steer: tuple[Any, float, str] | None = None
    store_dtype: str = "float32"
    workers: int | None = None
    scheduler: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.prompts, tuple) or not all(
            isinstance(p, Prompt) for p in self.prompts
        ):
            object.__setattr__(self, "prompts", tuple(load_prompts(self.prompts)))
        if self.positions not in ("last", "all"):
            raise ParameterError(
                "positions", f"unknown {{name}} '{self.positions}'", "use 'last' or 'all'"
            )
        _at_least("batch_size", self.batch_size, 1, 8)
        _at_least("generate", self.generate, 0, 8)
        if self.attention_readout not in ("auto", "sdpa", "eager"):
            raise ParameterError(
                "attention_readout",
                f"unknown {{name}} '{self.attention_readout}'",
                "use 'auto', 'sdpa' or 'eager'",
            )
        if self.logit_lens:
            _at_least("lens_k", self.lens_k, 1, 5)
        if self.steer is not None:
            steer_positions = self.steer[2]
            if steer_positions not in ("last", "all"):
                raise ParameterError(
                    "steer_positions",
                    f"unknown {{name}} '{steer_positions}'",
                    "use 'last' or 'all'",
                )
            if self.generate and steer_positions != "all":
                raise ParameterError(
                    "steer_positions",
                    "steering the last position while generating would steer another token "
                    "in each generation step than in the trace",
                    "steer all positions: pass {name} all",
                )
        if self.store_dtype not in STORE_DTYPES:
            raise ParameterError(
                "store_dtype",
                f"unknown {{name}} '{self.store_dtype}'",
                f"use one of: {', '.join(STORE_DTYPES)}",
            )
        self._check_workers()

    def _check_workers(self) -> None:
        if self.workers is not None:
            _at_least("workers", self.workers, 1, 2)
        if self.workers is not None and self.scheduler is not None:
            raise UserError(
                "--workers starts a local cluster and --scheduler uses another one",
                "pass one of them",
            )
        if self.scheduler is not None:
            from tokenfield._dask import check_scheduler

            check_scheduler(self.scheduler)  # malformed or TLS: one line, before any work
        if self.parallel and self.generate:
            raise ParameterError(
                "generate",
                "{name} makes a number of particles known only after generating, so it "
                "cannot be laid out for workers",
                "drop workers/scheduler with {name}",
            )

    @property
    def parallel(self) -> bool:
        """Whether the trace runs on Dask workers."""
        return self.workers is not None or self.scheduler is not None

    def replace(self, **changes: Any) -> TraceConfig:
        """A copy with ``changes`` (checked again)."""
        return dataclasses.replace(self, **changes)

    def check_spec(self, spec: ModelSpec) -> None:
        """What can be checked against the model's ``config.json`` alone, before
        its weights are loaded: ``generate`` within its context."""
        if self.generate:
            check_generate_length(self.generate, spec.context_length(), spec.name)

    def check_model(self, model: LoadedModel) -> None:
        """Refuse read-outs the model cannot give and a steering vector made for
        another model (one line each).

        Raises:
            ParameterError: naming ``logit_lens`` or ``generate``.
            UserError: the vector's model or dimension differ.
        """
        if self.logit_lens and (not model.causal or model.model.get_output_embeddings() is None):
            raise ParameterError(
                "logit_lens",
                f"model '{model.name}' has no unembedding, so it has no logit lens",
                "drop {name} for this model",
            )
        if self.generate and not model.causal:
            raise ParameterError(
                "generate",
                f"model '{model.name}' is not a causal language model, so it cannot generate",
                "drop {name} for this model",
            )
        check_generate_length(self.generate, model.max_positions, model.name, prompt_tokens=1)
        if self.attention:
            from tokenfield.models.attention_readout import readout_path

            readout_path(model, self.attention_readout)  # "sdpa" for a model without it
        if self.steer is not None:
            self.steer[0].check_model(model)

    def run_config(self, model: LoadedModel) -> dict[str, Any]:
        """The run config of a trace (what ``run.json`` records and a resume compares).

        The batch size is recorded in the run's progress, not here; the optional
        read-outs only when on, so runs traced without them keep their config.
        """
        config: dict[str, Any] = {
            "model": model.run_config(),
            "positions": self.positions,
            "chat": self.chat,
            "truncate": self.truncate,
            "top_k": self.kept_top_k(model),
            "prompts": [p.to_json() for p in self.prompts],
        }
        if self.attention:
            from tokenfield.models.attention_readout import readout_path

            path = readout_path(model, self.attention_readout)
            config["attention"] = {
                "attn_implementation": path,
                **({"readout": "queries and keys"} if path == "sdpa" else {}),
                "chain": "symmetrised (A + A^T), sink kept and sink dropped",
            }
        if self.logit_lens:
            config["logit_lens"] = {"k": self.lens_k}
        if self.generate:
            config["generate"] = {"max_new_tokens": self.generate, "decoding": "greedy"}
        if self.steer is not None:
            vector, alpha, steer_positions = self.steer
            config["steering"] = {
                "layer": int(vector.layer),
                "alpha": float(alpha),
                "positions": steer_positions,
                "vector_sha256": _sha256(vector.vector),
                "provenance": vector.provenance,
            }
        if self.store_dtype != "float32":  # added only when not the default, as the others
            config["store_dtype"] = self.store_dtype
        return config

    def kept_top_k(self, model: LoadedModel) -> int:
        """Next-token predictions kept per prompt: ``top_k`` for a causal model, else 0."""
        return self.top_k if model.causal else 0


def _at_least(param: str, value: int, least: int, example: int) -> None:
    if value < least:
        more = "at least 1" if least == 1 else f"{least} or more"
        raise ParameterError(
            param, f"{{name}} must be {more}, got {value}", f"pass e.g. {{name}} {example}"
        )


def _sha256(values: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(values, dtype=np.float32).tobytes()).hexdigest()


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

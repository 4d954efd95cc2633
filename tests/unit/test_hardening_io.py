"""Issue 21, items 1-6 and 8: no write or read through a symlink that leaves the run,
a cache memo and a store that cannot lie, a ``run.json`` checked against its store,
and ``--overwrite`` that deletes only tokenfield's own files.

Each attack test plants the attacker's file and checks afterwards that it is
byte-for-byte untouched.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests._cli import run_cli
from tokenfield import _lock
from tokenfield.errors import UserError
from tokenfield.runs import RunWriter

SECRET = b"the attacker's target: must stay exactly as it is\n"


def one_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("tokenfield: error: "), err
    assert "Traceback" not in err
    return lines[0]


@pytest.fixture
def target(tmp_path) -> Path:
    path = tmp_path / "elsewhere" / "victim.txt"
    path.parent.mkdir()
    path.write_bytes(SECRET)
    return path


# --- item 1: the lock never follows a symlink -------------------------------------

WRITERS = {
    "simulate": ["simulate", "--n", "4", "--dim", "3", "--t-max", "0.1"],
    "trace": ["trace", "-m", "smollm2", "--prompts", "{prompts}"],
    "phase-diagram": ["phase-diagram", "--dims", "2", "--betas", "1"],
    "predict-clusters": ["predict-clusters", "--betas", "1", "--n", "8", "--seeds", "1"],
    "pde": ["pde", "--n", "8", "--times", "0", "--cells", "16"],
    "metastability": ["metastability", "--betas", "2", "--caps", "2", "--seeds", "1"],
}


@pytest.mark.parametrize("planted", ["symlink", "hardlink", "fifo"])
@pytest.mark.parametrize("command", sorted(WRITERS))
def test_a_planted_lock_file_is_refused_and_its_target_untouched(
    tmp_path, target, command, planted, capsys
):
    out = tmp_path / "out"
    out.mkdir()
    lock = out / _lock.LOCK_NAME
    if planted == "symlink":
        lock.symlink_to(target)
    elif planted == "hardlink":
        os.link(target, lock)
    else:
        os.mkfifo(lock)
    prompts = tmp_path / "p.txt"
    prompts.write_text("one prompt\n")
    args = [a.replace("{prompts}", str(prompts)) for a in WRITERS[command]]
    code, _out, err = run_cli([*args, "--out", out], capsys)
    assert code == 2, err
    line = one_error_line(err)
    assert "not tokenfield's lock" in line and f"remove '{lock}'" in line
    assert target.read_bytes() == SECRET
    assert sorted(p.name for p in out.iterdir()) == [_lock.LOCK_NAME]  # nothing written
    assert lock.is_symlink() == (planted == "symlink")


def test_the_library_writer_refuses_a_symlinked_lock(tmp_path, target):
    out = tmp_path / "run"
    out.mkdir()
    (out / _lock.LOCK_NAME).symlink_to(target)
    with pytest.raises(UserError, match="is a symbolic link"):
        RunWriter(out, "trace", {"a": 1}, append_dim="particle")
    assert target.read_bytes() == SECRET
    # a dangling symlink is not created through either
    (out / _lock.LOCK_NAME).unlink()
    (out / _lock.LOCK_NAME).symlink_to(tmp_path / "elsewhere" / "new-file")
    with pytest.raises(UserError, match="is a symbolic link"):
        _lock.acquire(out)
    assert not (tmp_path / "elsewhere" / "new-file").exists()


# --- item 2: the cache's hash memo is checked against the entry it selects -----------


@pytest.fixture
def fake_cache(tmp_path, monkeypatch):
    """A private cache whose "dequantisation" writes the GGUF's own bytes as the
    weights (the real build's directory handling, without transformers)."""
    from tokenfield.models import sources

    monkeypatch.setenv("TOKENFIELD_CACHE", str(tmp_path / "cache"))
    builds: list[str] = []

    def build(gguf, file_hash, target):
        builds.append(gguf.name)

        def save(directory):
            (directory / "model.safetensors").write_bytes(b"weights of " + gguf.read_bytes())

        sources._install_entry(gguf, file_hash, target, save)

    monkeypatch.setattr(sources, "_build_entry", build)
    models = tmp_path / "models"
    models.mkdir()
    small = models / "small.gguf"
    other = models / "other.gguf"
    small.write_bytes(b"SMALL MODEL " * 1000)
    other.write_bytes(b"OTHER MODEL " * 2000)
    return sources, small, other, builds


def _weights(entry: Path) -> bytes:
    return (entry / "model.safetensors").read_bytes()


def test_a_memo_that_names_another_models_hash_is_never_believed(fake_cache, capsys):
    import hashlib
    import json

    sources, small, other, builds = fake_cache
    small_dir, small_hash, _ = sources._gguf_entry(small)
    other_dir, other_hash, _ = sources._gguf_entry(other)
    assert small_hash == "sha256:" + hashlib.sha256(small.read_bytes()).hexdigest()
    assert builds == ["small.gguf", "other.gguf"] and small_dir != other_dir
    capsys.readouterr()
    memo_file = sources.cache_root() / "hashes.json"
    memo = json.loads(memo_file.read_text())
    (key,) = [k for k in memo if k.startswith(str(small.resolve()))]
    memo[key] = other_hash  # the attack: small's memo entry now names other's hash
    memo_file.write_text(json.dumps(memo))
    entry, file_hash, _ = sources._gguf_entry(small)
    assert (entry, file_hash) == (small_dir, small_hash)  # its own entry, not other's
    assert _weights(entry) == b"weights of " + small.read_bytes()
    assert builds == ["small.gguf", "other.gguf"]  # nothing rebuilt: it was not needed
    assert "hash memo" in capsys.readouterr().err
    assert json.loads(memo_file.read_text())[key] == small_hash  # the memo is repaired
    # the same through resolve_source, as `trace -m PATH.gguf` calls it
    memo[key] = other_hash
    memo_file.write_text(json.dumps(memo))
    directory, weights_id, _name, weights = sources.resolve_source(str(small))
    assert (directory, weights_id) == (small_dir, small_hash)


def test_a_memo_naming_an_uncached_hash_never_labels_an_entry_with_it(fake_cache, capsys):
    import json

    sources, small, other, builds = fake_cache
    memo_file = sources.cache_root() / "hashes.json"
    sources._file_hash(other)  # memo entry for other
    memo = json.loads(memo_file.read_text())
    (key,) = list(memo)
    fake = "sha256:" + "ab" * 32
    memo[key] = fake
    memo_file.write_text(json.dumps(memo))
    entry, file_hash, _ = sources._gguf_entry(other)
    assert file_hash != fake and not sources._entry_path(fake).exists()
    assert _weights(entry) == b"weights of " + other.read_bytes()


def test_an_entry_whose_source_record_names_another_file_is_checked(fake_cache, capsys):
    """An entry built from the same content elsewhere (a copied cache, a moved file)
    is reused after one hash; one whose record names other content is rebuilt."""
    import json
    import shutil

    sources, small, other, builds = fake_cache
    entry, small_hash, _ = sources._gguf_entry(small)
    moved = small.with_name("moved.gguf")
    shutil.copy(small, moved)
    again, moved_hash, _ = sources._gguf_entry(moved)
    assert (again, moved_hash) == (entry, small_hash) and builds == ["small.gguf"]
    record = json.loads((entry / sources.SOURCE_RECORD).read_text())
    assert record["gguf"] == str(moved.resolve())  # the record now names where it is
    assert record["inode"] == moved.stat().st_ino and record["size"] == moved.stat().st_size
    assert sources.verify_entry(entry)[0] is not None  # with its manifest updated
    # an entry relabelled to claim another hash, manifest and all
    record["hash"] = "sha256:" + "cd" * 32
    (entry / sources.SOURCE_RECORD).write_text(json.dumps(record))
    sources.write_manifest(entry)
    rebuilt, _, _ = sources._gguf_entry(moved)
    assert rebuilt == entry and builds == ["small.gguf", "moved.gguf"]
    assert json.loads((entry / sources.SOURCE_RECORD).read_text())["hash"] == small_hash

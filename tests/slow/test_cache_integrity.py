"""A corrupted dequantisation cache never yields a run (issue 15, "a cache that cannot lie").

Uses a private TOKENFIELD_CACHE: the first load dequantises SmolLM2 into it,
then the cached weights are damaged in the two ways the review found (one
layer's weights scaled by 3; 4 KiB overwritten with garbage). Each damaged
entry must be detected on the next load and rebuilt from the GGUF, with one
line saying so, and the traced states must equal those of the clean cache.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

import tokenfield as tf
from tokenfield.models import load as load_module

pytestmark = pytest.mark.slow
PROMPTS = ["The capital of France is", "Solve: 15 * 12 + 4 ="]
LAYER = "model.layers.5.mlp.down_proj.weight"
# the cache the run was given, before this module's private one (a module fixture,
# still set for every later test of the module once a test has asked for it)
RUN_CACHE = os.environ.get("TOKENFIELD_CACHE")


def scale_one_layer(path):
    from safetensors.numpy import load_file, save_file

    tensors = load_file(str(path))
    flat = tensors[LAYER].reshape(-1)
    flat[:1024] *= 3  # the review's probe: 1,024 weights of one layer times 3
    save_file(tensors, str(path), metadata={"format": "pt"})


def overwrite_4k(path):
    with open(path, "r+b") as handle:
        handle.seek(path.stat().st_size // 2)
        handle.write(np.random.default_rng(0).bytes(4096))


@pytest.fixture(scope="module")
def private_cache(tmp_path_factory):
    cache = tmp_path_factory.mktemp("tokenfield-cache")
    patch = pytest.MonkeyPatch()
    patch.setenv("TOKENFIELD_CACHE", str(cache))
    yield cache
    patch.undo()


@pytest.fixture(scope="module")
def clean(private_cache):
    loaded = tf.load_model("smollm2")
    states = tf.trace(loaded, PROMPTS)["states"].values
    (entry,) = [p for p in (private_cache / "dequantised").iterdir() if p.is_dir()]
    return entry, loaded.weights_sha256, states


@pytest.mark.parametrize("damage", [scale_one_layer, overwrite_4k])
def test_a_damaged_cache_entry_is_rebuilt_never_used(clean, damage, capsys, tmp_path):
    entry, weights_sha256, clean_states = clean
    weights = entry / "model.safetensors"
    damage(weights)
    assert "sha256:" + load_module._sha256(weights) != weights_sha256
    capsys.readouterr()
    loaded = tf.load_model("smollm2")
    err = capsys.readouterr().err
    rebuilt = [line for line in err.splitlines() if "damaged" in line]
    assert len(rebuilt) == 1 and "model.safetensors does not match" in rebuilt[0], err
    assert "rebuilding them from SmolLM2" in rebuilt[0]
    assert loaded.weights_sha256 == weights_sha256
    ds = tf.trace(loaded, PROMPTS, out=tmp_path / "run")
    np.testing.assert_array_equal(ds["states"].values, clean_states)
    run_json = json.loads((tmp_path / "run" / "run.json").read_text())
    assert run_json["weights_sha256"] == weights_sha256  # the verified weights it used
    assert load_module.verify_entry(entry)[0] is not None


def test_a_memo_giving_smollm2_gemmas_hash_still_loads_smollm2(tmp_path, monkeypatch, capsys):
    """Issue 21 item 2 with the real models: in a copy of the cache (hard links, so
    cheap), SmolLM2's GGUF memo entry is set to Gemma's hash; SmolLM2 still loads
    SmolLM2 (d = 576), never Gemma's states."""
    import shutil
    import subprocess

    from tokenfield.models import sources

    # the run's own cache, where the other tests have built both models already: under
    # the private one of the tests above, Gemma was dequantised again (about 90 s)
    if RUN_CACHE is None:
        monkeypatch.delenv("TOKENFIELD_CACHE", raising=False)
    else:
        monkeypatch.setenv("TOKENFIELD_CACHE", RUN_CACHE)
    real = sources.cache_root()
    copy = tmp_path / "cache"
    if real.is_dir():
        subprocess.run(["cp", "-al", str(real), str(copy)], check=True)
    monkeypatch.setenv("TOKENFIELD_CACHE", str(copy))
    smol_dir, smol_hash, _name, smol_weights = sources.resolve_source("smollm2")
    _dir, gemma_hash, _name, _weights = sources.resolve_source("gemma3-270m")
    memo_file = copy / "hashes.json"
    memo = json.loads(memo_file.read_text())
    keys = [k for k, v in memo.items() if v == smol_hash]
    assert keys, memo
    for key in keys:
        memo[key] = gemma_hash
    memo_file.write_text(json.dumps(memo))
    capsys.readouterr()
    loaded = tf.load_model("smollm2")
    assert "hash memo" in capsys.readouterr().err
    assert loaded.d_model == 576 and loaded.model.config.model_type == "llama"
    assert loaded.weights_sha256 == smol_weights
    gguf = Path(sources._read_source(smol_dir)["gguf"])
    assert sources._file_hash(gguf) == smol_hash  # the memo is repaired
    shutil.rmtree(copy)

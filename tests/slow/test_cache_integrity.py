"""A corrupted dequantisation cache never yields a run (issue 15, "a cache that cannot lie").

Uses a private TOKENFIELD_CACHE: the first load dequantises SmolLM2 into it,
then the cached weights are damaged in the two ways the review found (one
layer's weights scaled by 3; 4 KiB overwritten with garbage). Each damaged
entry must be detected on the next load and rebuilt from the GGUF, with one
line saying so, and the traced states must equal those of the clean cache.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import tokenfield as tf
from tokenfield.models import load as load_module

pytestmark = pytest.mark.slow
PROMPTS = ["The capital of France is", "Solve: 15 * 12 + 4 ="]
LAYER = "model.layers.5.mlp.down_proj.weight"


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

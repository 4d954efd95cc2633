"""ModelSpec: every command loads the model a run was made with (name, dtype,
random weights, seed); `steer RUN` positional, `--run` kept as an alias."""

from __future__ import annotations

import json

import pytest
import torch

import tokenfield as tf
from tests.integration.tiny import PROMPTS, save_tiny
from tokenfield.cli import main
from tokenfield.models.load import ModelSpec


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("spec")
    directory = save_tiny("llama", base / "tiny-llama")
    prompts = [tf.Prompt(p, "A" if i % 2 else "B") for i, p in enumerate(PROMPTS)]
    bf16 = ModelSpec(str(directory), dtype="bfloat16").load()
    tf.trace(bf16, prompts, out=base / "bf16")
    random = ModelSpec(str(directory), random_weights=True, seed=3).load()
    tf.trace(random, prompts, out=base / "random")
    return base, directory


def cli(args, capsys):
    try:
        main([str(a) for a in args])
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    return code, capsys.readouterr()


def test_from_run_keeps_the_runs_dtype_and_weights(runs):
    base, directory = runs
    spec = ModelSpec.from_run(base / "bf16")
    assert spec == ModelSpec(str(directory), dtype="bfloat16")
    assert spec.load().dtype == torch.bfloat16
    random = ModelSpec.from_run(base / "random")
    assert (random.random_weights, random.seed, random.dtype) == (True, 3, "float32")
    loaded = random.load()
    assert (
        loaded.source_hash
        == tf.open_run(base / "random").attrs["run"]["config"]["model"]["source_hash"]
    )  # the same random weights
    other = ModelSpec.from_run(base / "random", name=str(directory))  # another model: trained
    assert not other.random_weights and other.seed == 0
    with pytest.raises(tf.UserError, match="unknown device"):
        ModelSpec("smollm2", device="tpu")
    with pytest.raises(tf.UserError, match="unknown dtype"):
        ModelSpec("smollm2", dtype="int8")


def test_steer_takes_the_run_positionally_and_honours_its_dtype(
    runs, tmp_path, capsys, monkeypatch
):
    import tokenfield.pipelines.steer as closed_loop_module

    base, _directory = runs
    seen = []
    real = closed_loop_module.closed_loop

    def recording(model, *args, **kwargs):
        seen.append(model.dtype)
        return real(model, *args, **kwargs)

    monkeypatch.setattr(closed_loop_module, "closed_loop", recording)
    out = tmp_path / "steer"
    code, captured = cli(
        ["steer", base / "bf16", "--from", "A", "--to", "B", "--layer", "1", "--alpha", "1",
         "--max-new-tokens", "2", "--out", out, "--json"],
        capsys,
    )  # fmt: skip
    assert code == 0, captured.err
    assert seen == [torch.bfloat16]  # the run was traced in bfloat16: so is the steering
    rows = json.loads(captured.out)["rows"]  # --json: stdout holds only the JSON
    assert rows == json.loads((out / "steering.json").read_text())["rows"]
    # the old spelling still works
    code, captured = cli(
        ["steer", "--run", base / "bf16", "--from", "A", "--to", "B", "--layer", "1",
         "--alpha", "1", "--max-new-tokens", "2", "--out", tmp_path / "old"],
        capsys,
    )  # fmt: skip
    assert code == 0, captured.err
    assert seen == [torch.bfloat16] * 2


@pytest.mark.parametrize(
    ("where", "message"),
    [([], "no RUN given"), (["{a}", "--run", "{b}"], "two runs given")],
)
def test_steer_needs_exactly_one_run(runs, tmp_path, capsys, where, message):
    base, _ = runs
    args = [
        w.replace("{a}", str(base / "bf16")).replace("{b}", str(base / "random")) for w in where
    ]
    out = tmp_path / "o"
    code, captured = cli(
        ["steer", *args, "--from", "A", "--to", "B", "--layer", "1", "--out", out], capsys
    )
    assert code == 2 and message in captured.err and captured.err.count("\n") == 1
    assert not out.exists()

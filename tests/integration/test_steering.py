"""Steering on tiny random-weight models: the hook's guarantees and bad input."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch

import tokenfield as tf
from tests.integration.tiny import PROMPTS, save_tiny, tiny_loaded
from tokenfield.cli import main
from tokenfield.steering import SteeringVector, random_control, steering, steering_vector


def vector_for(model, layer: int, seed: int = 0) -> SteeringVector:
    rng = np.random.default_rng(seed)
    provenance = {"model": model.run_config(), "from": "a", "to": "b"}
    return SteeringVector(rng.standard_normal(model.d_model), layer, provenance)


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_alpha_zero_leaves_logits_exactly_unchanged(kind):
    model = tiny_loaded(kind)
    ids = torch.tensor([model.tokenizer(PROMPTS[0])["input_ids"]])
    with torch.no_grad():
        plain = model.model(ids).logits
        for layer in (0, 2, model.n_layers):
            with steering(model, vector_for(model, layer), alpha=0.0, positions="all"):
                steered = model.model(ids).logits
            assert torch.equal(plain, steered)
        with steering(model, vector_for(model, 2), alpha=1.0, positions="all"):
            moved = model.model(ids).logits
    assert not torch.allclose(plain, moved)


def test_hook_is_gone_after_the_context_even_on_error():
    model = tiny_loaded("llama")

    def counts():
        return sum(len(b._forward_hooks) + len(b._forward_pre_hooks) for b in model.sites.blocks)

    before = counts()
    with pytest.raises(RuntimeError, match="boom"), steering(model, vector_for(model, 1), 1.0):
        assert counts() == before + 1
        raise RuntimeError("boom")
    assert counts() == before
    with pytest.raises(RuntimeError), steering(model, vector_for(model, 0), 1.0):
        raise RuntimeError("again")
    assert counts() == before


@pytest.mark.parametrize("kind", ["llama", "gemma3", "gpt2"])
@pytest.mark.parametrize("layer", [0, 1, 2, 3])
@pytest.mark.parametrize("positions", ["last", "all"])
def test_vector_changes_states_from_its_layer_on_and_not_before(kind, layer, positions):
    model = tiny_loaded(kind)
    plain = tf.trace(model, PROMPTS, positions="all", batch_size=3)
    vector = vector_for(model, layer)
    with steering(model, vector, alpha=3.0, positions=positions):
        steered = tf.trace(model, PROMPTS, positions="all", batch_size=3)
    diff = np.abs(steered.states.values - plain.states.values).max(axis=(1, 2))  # per time
    assert np.all(diff[:layer] == 0.0), diff
    assert np.all(diff[layer:] > 1e-3), diff
    # at the steering site itself the change is exactly alpha * v where it was added
    last = plain.is_last.values
    delta = steered.states.values[layer] - plain.states.values[layer]
    np.testing.assert_allclose(
        delta[last], np.tile(3.0 * vector.vector, (last.sum(), 1)), atol=1e-5
    )
    if positions == "last":
        # earlier tokens are untouched at the site (they can change later only via attention)
        assert np.abs(delta[~last]).max() == 0.0


def test_vector_from_a_run_and_round_trip(tmp_path):
    model = tiny_loaded("llama")
    prompts = [tf.Prompt(p, "A" if i % 2 else "B") for i, p in enumerate(PROMPTS)]
    ds = tf.trace(model, prompts)
    vec = steering_vector(ds, source="A", target="B", layer=2)
    states = ds.states.values[2]
    cats = ds.category.values
    np.testing.assert_allclose(
        vec.vector, states[cats == "B"].mean(0) - states[cats == "A"].mean(0), rtol=1e-5
    )
    pca = steering_vector(ds, source="A", target="B", layer=2, method="pca")
    assert float(pca.vector @ vec.vector) > 0
    path = vec.save(tmp_path / "v.safetensors")
    again = SteeringVector.load(path)
    np.testing.assert_array_equal(again.vector, vec.vector)
    assert again.layer == 2 and again.provenance["from"] == "A"
    with pytest.raises(tf.UserError, match="unknown category 'C'.*A, B"):
        steering_vector(ds, source="C", target="B", layer=1)
    with pytest.raises(tf.UserError, match="layer 9 is out of range.*0 \\(embedding\\) to 3"):
        steering_vector(ds, source="A", target="B", layer=9)


def test_random_control_same_norm_seeded_distinct_and_near_orthogonal():
    """The control is a random direction: the vector's norm and layer, reproducible for a
    seed, different for different seeds, and (in high dimension) nearly orthogonal to the
    vector. A control that is the vector, its negative, or the vector plus small noise
    fails the last check (|cos| is then about 1, not about 1/sqrt(d))."""
    d = 4096
    # a fixed, non-random vector (one drawn from default_rng(s) would coincide with control s)
    vec = SteeringVector(np.sin(np.arange(d) * 0.37) + 0.2, 5, {"from": "a", "to": "b"})
    unit = vec.vector / vec.norm
    directions = []
    for seed in range(20):
        control = random_control(vec, seed)
        assert control.layer == vec.layer and control.d == d
        assert control.norm == pytest.approx(vec.norm, rel=1e-5)
        np.testing.assert_array_equal(control.vector, random_control(vec, seed).vector)
        cos = float(control.vector @ unit) / control.norm
        assert abs(cos) < 5 / np.sqrt(d), (seed, cos)  # ~5 standard deviations of a random cos
        directions.append(control.vector / control.norm)
    gram = np.abs(np.stack(directions) @ np.stack(directions).T)
    np.fill_diagonal(gram, 0.0)
    assert gram.max() < 5 / np.sqrt(d)  # distinct seeds give distinct (near-orthogonal) directions


def test_vector_from_another_model_is_refused():
    llama, gpt2 = tiny_loaded("llama"), tiny_loaded("gpt2")
    other_weights = tiny_loaded("llama", seed=5)
    vec = vector_for(llama, 1)
    with (
        pytest.raises(tf.UserError, match="made for another model"),
        steering(other_weights, vec, 1.0),
    ):
        pass
    wrong_size = SteeringVector(np.ones(16), 1, {})
    message = "16 features but the model's hidden size is 32"
    with pytest.raises(tf.UserError, match=message), steering(gpt2, wrong_size, 1.0):
        pass


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    base = tmp_path_factory.mktemp("steer")
    directory = save_tiny("llama", base / "tiny-llama")
    model = tf.load_model(str(directory))
    prompts = [tf.Prompt(p, "A" if i % 2 else "B") for i, p in enumerate(PROMPTS)]
    tf.trace(model, prompts, out=base / "run")
    return base


def cli(args, capsys):
    try:
        main(args)
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    return code, capsys.readouterr()


def test_steer_cli_end_to_end(tiny_run, tmp_path, capsys):
    out = tmp_path / "steer"
    code, captured = cli(
        ["steer", "--run", str(tiny_run / "run"), "--from", "A", "--to", "B", "--layer", "2",
         "--alpha", "0,1,4", "--out", str(out), "--max-new-tokens", "3"],
        capsys,
    )  # fmt: skip
    assert code == 0, captured.err
    import json

    result = json.loads((out / "steering.json").read_text())
    rows = {(r["condition"], r["alpha"]): r for r in result["rows"]}
    assert rows[("steer", 0.0)]["kl_mean"] == pytest.approx(0.0, abs=1e-6)
    assert rows[("steer", 0.0)]["progress_final"] == pytest.approx(0.0, abs=1e-6)
    assert rows[("steer", 1.0)]["progress_at_layer"] > 0.0  # moved toward B at the site
    assert (out / "vector.safetensors").is_file() and (
        out / "figures" / "steered_paths.png"
    ).is_file()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--from", "Z", "--to", "B", "--layer", "1"], "unknown category 'Z'"),
        (["--from", "A", "--to", "B", "--layer", "7"], "layer 7 is out of range"),
        (["--from", "A", "--to", "B", "--layer", "1", "--alpha", "x"], "--alphas must be numbers"),
    ],
)
def test_steer_cli_bad_input(tiny_run, tmp_path, capsys, args, message):
    out = tmp_path / "o"
    code, captured = cli(
        ["steer", "--run", str(tiny_run / "run"), *args, "--out", str(out)], capsys
    )
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and message in lines[0], captured.err
    assert not out.exists()


def test_steer_cli_refuses_a_vector_of_another_model(tiny_run, tmp_path, capsys):
    other = tiny_loaded("llama", seed=7)
    vec = SteeringVector(np.ones(32), 1, {"model": other.run_config(), "from": "A", "to": "B"})
    path = vec.save(tmp_path / "other.safetensors")
    code, captured = cli(
        ["steer", "--run", str(tiny_run / "run"), "--from", "A", "--to", "B", "--layer", "1",
         "--vector", str(path), "--out", str(tmp_path / "o")],
        capsys,
    )  # fmt: skip
    assert code == 2 and "made for another model" in captured.err


def test_prefill_states_equal_a_trace_under_steering():
    """The evaluation reads steered states from the generation's prefill pass."""
    from tokenfield.steering.generate import greedy_continuations

    model = tiny_loaded("llama")
    vec = vector_for(model, 2)
    recorded = [[] for _ in range(model.n_layers + 1)]
    with steering(model, vec, 2.0):
        texts = greedy_continuations(
            model, PROMPTS, max_new_tokens=3, batch_size=4, states=recorded
        )
        traced = tf.trace(model, PROMPTS, batch_size=4)
    got = np.stack([torch.cat(parts).numpy() for parts in recorded])
    np.testing.assert_allclose(got, traced.states.values, rtol=1e-5, atol=1e-6)
    assert len(texts) == len(PROMPTS)


def test_shared_prefix_answers_equal_hf_generate_and_states_equal_a_trace():
    """The evaluation's decoder (shared few-shot prefix, per-row steering of many
    conditions in one batch, early stop) gives the same answers as Hugging Face's
    greedy generate under the steering hook, and the same states as a trace."""
    from tokenfield.steering.generate import Condition, answer_conditions, greedy_continuations
    from tokenfield.steering.problems import answer_finished, few_shot, make_splits, parse_answer

    splits = make_splits({"shot": 1, "test": 7}, 0, max_operand=5, templates=("add", "sub"))
    prompts = [few_shot(splits["shot"], p, "word") for p in splits["test"]]
    for kind in ("llama", "gemma3"):
        model = tiny_loaded(kind)
        v2, v0 = vector_for(model, 2, seed=1), vector_for(model, 0, seed=2)
        conditions = [Condition("plain", record=True), Condition("v2", v2, 2.0, record=True),
                      Condition("v0", v0, 1.0)]  # fmt: skip
        got = answer_conditions(model, prompts, conditions, max_new_tokens=6, batch_size=7)
        for condition in conditions:
            context = (
                steering(model, condition.vector, condition.alpha, check=False)
                if condition.vector is not None
                else contextlib.nullcontext()
            )
            with context:
                reference = greedy_continuations(model, prompts, max_new_tokens=6, batch_size=3)
                traced = tf.trace(model, prompts, batch_size=3)
            for mine, full in zip(got[condition.name]["texts"], reference, strict=True):
                assert full.startswith(mine), (kind, condition.name, mine, full)
                assert mine == full or answer_finished(mine)  # stopped early only when done
                assert parse_answer(mine) == parse_answer(full)
            if condition.record:
                np.testing.assert_allclose(
                    got[condition.name]["states"], traced.states.values, rtol=1e-4, atol=1e-5
                )
        assert got["plain"]["texts"] != got["v2"]["texts"]  # steering changed something
        assert sum(len(t) for c in got.values() for t in c["texts"]) > 0


def test_eval_steering_cli_on_a_tiny_model(tiny_run, tmp_path, capsys):
    import json

    out = tmp_path / "eval"
    code, captured = cli(
        ["eval-steering", "--model", str(tiny_run / "tiny-llama"), "--n", "6", "--fit", "4",
         "--validation", "5", "--shots", "1", "--layers", "1,2", "--alphas", "0,1",
         "--controls", "3", "--shuffles", "4", "--halves", "5", "--max-new-tokens", "2",
         "--max-operand", "6",
         "--templates", "add,sub", "--out", str(out)],
        capsys,
    )  # fmt: skip
    assert code == 0, captured.err
    result = json.loads((out / "eval.json").read_text())
    for key in ("problems", "selected", "baselines", "controls", "steered", "mcnemar_p",
                "verdict", "verdict_reasons", "config", "rows", "examples", "label_shuffle",
                "validation", "timings"):  # fmt: skip
        assert key in result, key
    splits = [p["split"] for p in result["problems"]]
    assert [splits.count(s) for s in ("shot", "fit", "validation", "test")] == [1, 4, 5, 6]
    grid = result["validation"]["grid"]
    assert [(r["layer"], r["alpha"]) for r in grid] == [(1, 0.0), (1, 1.0), (2, 0.0), (2, 1.0)]
    best = max(r["accuracy"] for r in grid)
    chosen = next(r for r in grid if r["accuracy"] == best)  # first best, on validation
    assert (result["selected"]["layer"], result["selected"]["alpha"]) == (
        chosen["layer"], chosen["alpha"],
    )  # fmt: skip
    assert len(result["controls"]) == 3
    assert len(result["label_shuffle"]["accuracies"]) == 4
    assert len(result["centroid_halves"]["accuracies"]) == 5
    assert result["verdict"] in ("supports", "does not support")
    for r in [*result["rows"], result["steered"]]:
        assert 0.0 <= r["ci95"][0] <= r["accuracy"] <= r["ci95"][1] <= 1.0
    zero = [r for r in grid if r["alpha"] == 0.0]
    assert all(abs(r["progress_final"]) < 1e-6 for r in zero)  # alpha 0 moves nothing
    steered = [r for r in grid if r["alpha"] == 1.0]
    assert all(r["progress_at_layer"] > 0 for r in steered)  # toward the math centroid
    assert (out / "figures" / "accuracy_vs_alpha.png").is_file()
    assert (out / "figures" / "test_summary.png").is_file()
    assert "verdict:" in captured.out
    code, captured = cli(["eval-steering", "--model", str(tiny_run / "tiny-llama"),
                          "--layers", "9", "--out", str(tmp_path / "bad")], capsys)  # fmt: skip
    assert code == 2 and "layer 9 is out of range" in captured.err
    assert not (tmp_path / "bad").exists()
    code, captured = cli(["eval-steering", "--model", str(tiny_run / "tiny-llama"),
                          "--max-operand", "3", "--out", str(tmp_path / "bad")], capsys)  # fmt: skip
    assert code == 2 and "distinct math forms" in captured.err
    assert not (tmp_path / "bad").exists()
    # 4 fit problems have 6 different splits into halves: 7 centroid halves cannot differ
    code, captured = cli(["eval-steering", "--model", str(tiny_run / "tiny-llama"), "--fit", "4",
                          "--halves", "7", "--out", str(tmp_path / "bad")], capsys)  # fmt: skip
    assert code == 2 and "--halves 7 asks for more distinct splits" in captured.err
    assert "Traceback" not in captured.err and not (tmp_path / "bad").exists()

"""The steering evaluation's statistics and decisions, on hand-made inputs and a fake
model (no network, no weights): baselines, McNemar, the verdict rule, selection on
validation only, and the controls."""

from __future__ import annotations

import numpy as np
import pytest

from tokenfield.steering import evaluate as ev
from tokenfield.steering.problems import Problem, few_shot, make_splits


def problem(expression: str) -> Problem:
    answer = eval(expression, {"__builtins__": {}})  # noqa: S307
    return Problem(f"word form of {expression}", expression, answer, "hand")


def test_trivial_baselines_on_a_hand_made_example():
    shots = [problem("2 + 2"), problem("3 + 4")]  # last shot's answer: 7
    validation = [problem("5 + 2"), problem("1 * 7"), problem("9 - 2"), problem("3 * 3"),
                  problem("6 - 6"), problem("0 + 4")]  # fmt: skip
    # answers 7, 7, 7, 9, 0, 4 -> constant 7; copy: first 0/6, second 1/6 (0+4? no: 4==4), last same
    test = [
        problem("3 + 4"),
        problem("7 * 1"),
        problem("2 * 5"),
        problem("8 - 1"),
        problem("0 + 9"),
    ]
    # test answers 7, 7, 10, 7, 9
    out = ev.trivial_baselines(validation, test, shots)
    acc, choices = out["accuracy"], out["choices"]
    assert choices["constant"] == 7 and acc["constant"] == pytest.approx(3 / 5)
    assert acc["last_shot"] == pytest.approx(3 / 5)  # 7 as well
    assert acc["copy_first"] == pytest.approx(1 / 5)  # 7 * 1 -> 7
    assert acc["copy_second"] == pytest.approx(1 / 5)  # 0 + 9 -> 9
    assert acc["copy_last"] == pytest.approx(1 / 5)
    # on validation: first operand right 0 times, second operand 2 times (1 * 7, 0 + 4)
    assert choices["copy_validation_accuracy"] == pytest.approx(
        {"first": 0.0, "second": 2 / 6, "last": 2 / 6}
    )
    assert choices["copy_operand"] == "second"  # ties go to the earlier position
    assert acc["copy_operand"] == acc["copy_second"]


def test_mcnemar_exact_against_hand_computed_values():
    # 8 items only the first gets right, 2 only the second, 10 both, 5 neither
    first = [1] * 8 + [0] * 2 + [1] * 10 + [0] * 5
    second = [0] * 8 + [1] * 2 + [1] * 10 + [0] * 5
    out = ev.mcnemar_exact(first, second)
    # two-sided exact binomial: 2 * P(X <= 2 | n = 10, p = 1/2) = 2 * (1 + 10 + 45) / 1024
    assert (out["b"], out["c"]) == (8, 2)
    assert out["p"] == pytest.approx(112 / 1024, rel=1e-9)
    assert ev.mcnemar_exact([1, 0], [1, 0])["p"] == 1.0  # no discordant pair
    assert ev.mcnemar_exact([1] * 6, [0] * 6)["p"] == pytest.approx(2 / 64)


GOOD = {
    "steered": 0.30,
    "word": 0.10,
    "mcnemar_p": 0.001,
    "baselines": dict.fromkeys(ev.TRIVIAL, 0.05),
    "controls": [0.10] * 31 + [0.2],
    "label_shuffle": 0.12,
}


def test_verdict_supports_only_when_every_condition_holds():
    assert ev.decide(**GOOD) == ("supports", [])


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"mcnemar_p": 0.2}, "McNemar p < 0.05"),
        ({"word": 0.35, "mcnemar_p": 0.001}, "unsteered word form"),
        ({"baselines": {**GOOD["baselines"], "constant": 0.3}}, "'constant'"),
        ({"baselines": {**GOOD["baselines"], "copy_second": 0.31}}, "'copy_second'"),
        ({"baselines": {**GOOD["baselines"], "last_shot": 0.4}}, "'last_shot'"),
        ({"controls": [0.1] * 28 + [0.3, 0.35, 0.4, 0.45]}, "95th percentile of 32"),
        ({"label_shuffle": 0.30}, "label-shuffle"),
    ],
)
def test_each_failing_condition_gives_does_not_support(change, reason):
    verdict, reasons = ev.decide(**{**GOOD, **change})
    assert verdict == "does not support"
    assert len(reasons) == 1 and reason in reasons[0], reasons


class FakeModel:
    """Just enough of a LoadedModel for evaluate_steering with a fake answerer."""

    n_layers, d_model = 4, 16

    def run_config(self):
        return {"name": "fake"}


SIZES = {"shot": 2, "fit": 6, "validation": 12, "test": 20}


def fake_answerer(calls: list, good_on_validation: tuple[int, float], good_on_test: int):
    """Answers correctly only under one steered condition: on validation prompts the
    vector at ``good_on_validation`` (layer, alpha), on test prompts any vector at layer
    ``good_on_test``; unsteered and other conditions answer -1."""
    splits = make_splits(SIZES, 0, max_operand=9, templates=("add", "sub"))
    word = {
        few_shot(splits["shot"], p, "word"): (name, p)
        for name in ("validation", "test", "fit")
        for p in splits[name]
    }

    def answer(model, prompts, conditions, *, max_new_tokens, batch_size, positions, bar):
        calls.append([(c.name, c.vector, c.alpha) for c in conditions])
        rng = np.random.default_rng(len(calls))
        out = {}
        for c in conditions:
            texts = []
            for prompt in prompts:
                split, p = word.get(prompt, ("math", None))
                ok = c.vector is not None and (
                    (split == "validation" and (c.vector.layer, c.alpha) == good_on_validation)
                    or (split == "test" and c.vector.layer == good_on_test)
                )
                texts.append(f" {p.answer}\n" if ok else " -1\n")
            states = None
            if c.record:
                shift = np.array([1.0 if p.endswith("=") else 0.0 for p in prompts])
                states = rng.standard_normal((5, len(prompts), 16)) + shift[None, :, None]
            out[c.name] = {"texts": texts, "states": states}
            if bar is not None:
                bar.advance(len(prompts))
        return out

    return answer


def run_fake(monkeypatch, controls=7, good_on_validation=(2, 0.5), good_on_test=1):
    calls: list = []
    monkeypatch.setattr(
        ev, "answer_conditions", fake_answerer(calls, good_on_validation, good_on_test)
    )
    result = ev.evaluate_steering(
        FakeModel(), n=SIZES["test"], validation=SIZES["validation"], fit=SIZES["fit"],
        shots=SIZES["shot"], max_operand=9, templates=("add", "sub"), layers=[1, 2],
        alphas=[0.5, 1.0], controls=controls, control_seed=40,
    )  # fmt: skip
    return result, calls


def test_selection_uses_the_validation_split_only(monkeypatch):
    # validation favours (layer 2, alpha 0.5); on test only layer 1 would have worked
    result, calls = run_fake(monkeypatch)
    assert result["selected"]["layer"] == 2 and result["selected"]["alpha"] == 0.5
    assert result["selected"]["validation_accuracy"] == 1.0
    assert result["steered"]["accuracy"] == 0.0  # the test split reports that condition only
    test_call = calls[-2]  # word, steered, label shuffle, controls (then the math form)
    steered = [(v.layer, a) for name, v, a in test_call if v is not None]
    assert set(steered) == {(2, 0.5)}  # every test condition is at the selected cell
    grid = {(r["layer"], r["alpha"]): r["accuracy"] for r in result["validation"]["grid"]}
    assert grid == {(1, 0.5): 0.0, (1, 1.0): 0.0, (2, 0.5): 1.0, (2, 1.0): 0.0}
    # had the test split been used to select, layer 1 would have won: check the fake
    result, _ = run_fake(monkeypatch, good_on_validation=(1, 1.0))
    assert (result["selected"]["layer"], result["steered"]["accuracy"]) == (1, 1.0)


def test_controls_count_seeds_norms_and_eval_keys(monkeypatch):
    result, calls = run_fake(monkeypatch, controls=7)
    assert len(result["controls"]) == 7 and result["control_summary"]["k"] == 7
    seeds = result["control_summary"]["seeds"]
    assert seeds == list(range(40, 47)) and len(set(seeds)) == 7
    test_call = calls[-2]
    controls = [v for name, v, _a in test_call if name.startswith("control_")]
    steered = next(v for name, v, _a in test_call if name == "steered")
    shuffle = next(v for name, v, _a in test_call if name == "label_shuffle")
    assert len(controls) == 7
    units = np.stack([c.vector / c.norm for c in controls])
    assert np.abs(units @ units.T - np.eye(7)).max() < 0.999  # distinct directions
    for vec in [*controls, shuffle]:
        assert vec.norm == pytest.approx(steered.norm, rel=1e-5) and vec.layer == steered.layer
    for key in ("problems", "selected", "baselines", "controls", "steered", "mcnemar_p",
                "verdict", "verdict_reasons", "config", "rows", "examples", "label_shuffle",
                "timings", "validation"):  # fmt: skip
        assert key in result, key
    assert {p["split"] for p in result["problems"]} == {"shot", "fit", "validation", "test"}
    assert all(set(p) >= {"split", "word", "math", "answer"} for p in result["problems"])
    assert set(result["baselines"]) >= {"constant", "copy_operand", "last_shot", "word", "math"}
    assert result["verdict"] == "does not support" and result["verdict_reasons"]
    low, high = result["steered"]["ci95"]
    assert low <= result["steered"]["accuracy"] <= high


def test_label_shuffle_vector_is_a_random_half_split_scaled_to_the_norm():
    rng = np.random.default_rng(0)
    states = rng.standard_normal((10, 8))
    vec, raw = ev.label_shuffle_vector(states, 3.0, seed=5, layer=2, provenance={})
    order = np.random.default_rng(5).permutation(10)
    expected = states[order[:5]].mean(0) - states[order[5:]].mean(0)
    assert raw == pytest.approx(np.linalg.norm(expected))
    np.testing.assert_allclose(vec.vector, expected * 3.0 / raw, rtol=1e-5)
    assert vec.layer == 2 and vec.provenance["method"] == "label-shuffle"

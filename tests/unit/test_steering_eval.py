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
    "label_shuffle": [0.12] * 31 + [0.29],
    "centroid_halves": [0.05] * 30 + [0.25, 0.29],
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
        ({"controls": [0.1] * 28 + [0.3, 0.35, 0.4, 0.45]}, "32 random-direction"),
        # one control tied with the steered accuracy is enough to fail (ties count against)
        ({"controls": [0.1] * 31 + [0.30]}, "rank 2 of 33, 1 at or above"),
        ({"label_shuffle": [0.12] * 31 + [0.30]}, "32 label-shuffle controls"),
        ({"centroid_halves": [0.05] * 31 + [0.30]}, "32 centroid-half controls"),
        # too few controls can never be beaten: (1 + 0) / (5 + 1) > 0.05
        ({"centroid_halves": [0.0] * 5}, "empirical p = 0.167"),
        ({"label_shuffle": 0.1}, "1 label-shuffle controls"),  # an old single draw
    ],
)
def test_each_failing_condition_gives_does_not_support(change, reason):
    verdict, reasons = ev.decide(**{**GOOD, **change})
    assert verdict == "does not support"
    assert len(reasons) == 1 and reason in reasons[0], reasons


def test_control_rank_counts_ties_against_the_steered_accuracy():
    controls = [0.1, 0.2, 0.2, 0.3, 0.05]
    rank = ev.control_rank(0.2, controls)
    # at or above 0.2: 0.2, 0.2, 0.3 -> rank 4 of 6 (strictly above would say 2)
    assert rank == {"rank": 4, "of": 6, "n_at_or_above": 3, "n_tied": 2, "p_empirical": 4 / 6}
    assert ev.control_rank(0.31, controls)["rank"] == 1  # above every control
    assert ev.control_rank(0.3, controls)["rank"] == 2  # tied with the top one
    assert ev.control_rank(0.0, controls)["rank"] == 6  # below every one
    # Gemma-3's committed case before this rule: steered 2.0 %, 4 controls at 2.0 %, none above
    gemma = [0.0] * 28 + [0.02] * 4
    assert ev.control_rank(0.02, gemma)["rank"] == 5
    summary = ev.family_summary(0.02, gemma, range(32))
    assert (summary["k"], summary["rank"], summary["max"]) == (32, 5, 0.02)
    assert summary["p_empirical"] == pytest.approx(5 / 33)


class FakeModel:
    """Just enough of a LoadedModel for evaluate_steering with a fake answerer."""

    n_layers, d_model = 4, 16

    def run_config(self):
        return {"name": "fake"}


SIZES = {"shot": 2, "fit": 8, "validation": 12, "test": 20}


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


def run_fake(monkeypatch, controls=7, good_on_validation=(2, 0.5), good_on_test=1, **seeds):
    calls: list = []
    monkeypatch.setattr(
        ev, "answer_conditions", fake_answerer(calls, good_on_validation, good_on_test)
    )
    result = ev.evaluate_steering(
        FakeModel(), n=SIZES["test"], validation=SIZES["validation"], fit=SIZES["fit"],
        shots=SIZES["shot"], max_operand=9, templates=("add", "sub"), layers=[1, 2],
        alphas=[0.5, 1.0], controls=controls, control_seed=40, **seeds,
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
    shuffles = [v for name, v, _a in test_call if name.startswith("shuffle_")]
    halves = [v for name, v, _a in test_call if name.startswith("halves_")]
    assert len(controls) == 7
    # the two data-shaped families default to 32 draws each, all distinct
    assert len(shuffles) == 32 and len(halves) == 32
    for family in (controls, shuffles, halves):
        units = np.stack([c.vector / c.norm for c in family])
        off_diagonal = units @ units.T - 2 * np.eye(len(family))
        assert off_diagonal.max() < 0.999  # distinct directions
    for vec in [*controls, *shuffles, *halves]:
        assert vec.norm == pytest.approx(steered.norm, rel=1e-5) and vec.layer == steered.layer
    for key in ("problems", "selected", "baselines", "controls", "steered", "mcnemar_p",
                "verdict", "verdict_reasons", "config", "rows", "examples", "label_shuffle",
                "centroid_halves", "timings", "validation"):  # fmt: skip
        assert key in result, key
    for key in ("label_shuffle", "centroid_halves"):
        family = result[key]
        assert family["k"] == 32 and len(family["accuracies"]) == 32
        assert family["seeds"] == list(range(32)) and len(family["raw_norms"]) == 32
        assert family["scaled_norm"] == pytest.approx(steered.norm, rel=1e-5)
    assert result["config"]["shuffles"] == 32 and result["config"]["halves"] == 32
    assert {p["split"] for p in result["problems"]} == {"shot", "fit", "validation", "test"}
    assert all(set(p) >= {"split", "word", "math", "answer"} for p in result["problems"])
    assert set(result["baselines"]) >= {"constant", "copy_operand", "last_shot", "word", "math"}
    assert result["verdict"] == "does not support" and result["verdict_reasons"]
    low, high = result["steered"]["ci95"]
    assert low <= result["steered"]["accuracy"] <= high


def test_every_family_is_ranked_with_ties(monkeypatch):
    # the fake answers right on test only at layer 1; selection picks layer 1, alpha 1,
    # where the steered row and every control (all at layer 1) answer everything right
    result, _ = run_fake(monkeypatch, good_on_validation=(1, 1.0), good_on_test=1)
    assert result["steered"]["accuracy"] == 1.0
    for key in ("label_shuffle", "centroid_halves"):
        family = result[key]
        assert family["accuracies"] == [1.0] * 32
        assert (family["rank"], family["of"], family["n_at_or_above"]) == (33, 33, 32)
    assert result["control_summary"]["rank"] == 8  # 7 random controls, all tied
    assert result["verdict"] == "does not support"
    assert sum("controls" in r and "at or above" in r for r in result["verdict_reasons"]) == 3


def test_label_shuffle_vector_is_a_random_half_split_scaled_to_the_norm():
    rng = np.random.default_rng(0)
    states = rng.standard_normal((10, 8))
    vec, raw = ev.label_shuffle_vector(states, 3.0, seed=5, layer=2, provenance={})
    order = np.random.default_rng(5).permutation(10)
    expected = states[order[:5]].mean(0) - states[order[5:]].mean(0)
    assert raw == pytest.approx(np.linalg.norm(expected))
    np.testing.assert_allclose(vec.vector, expected * 3.0 / raw, rtol=1e-5)
    assert vec.layer == 2 and vec.provenance["method"] == "label-shuffle"


def test_label_shuffle_family_is_32_distinct_draws_reproducible_by_seed():
    rng = np.random.default_rng(1)
    states = rng.standard_normal((20, 8))
    seeds = ev.control_seeds(0, 32)
    family = ev.label_shuffle_vectors(states, 3.0, seeds, layer=1, provenance={})
    vectors = np.stack([v.vector for v, _raw in family])
    assert vectors.shape == (32, 8)
    assert len({tuple(np.round(row, 5)) for row in vectors}) == 32  # 32 distinct draws
    assert np.allclose(np.linalg.norm(vectors, axis=1), 3.0, rtol=1e-5)
    # the same seeds give the same draws; the first is the earlier single draw (seed 0)
    again = np.stack([v.vector for v, _ in ev.label_shuffle_vectors(states, 3.0, seeds, 1, {})])
    np.testing.assert_array_equal(vectors, again)
    single, _ = ev.label_shuffle_vector(states, 3.0, seed=0, layer=1, provenance={})
    np.testing.assert_array_equal(vectors[0], single.vector)
    other = ev.label_shuffle_vectors(states, 3.0, ev.control_seeds(100, 32), 1, {})
    assert not np.allclose(vectors, np.stack([v.vector for v, _ in other]))


def test_the_evaluation_draws_the_same_families_for_the_same_seeds(monkeypatch):
    def families(**seeds):
        _, calls = run_fake(monkeypatch, **seeds)
        return {
            prefix: np.stack([v.vector for name, v, _a in calls[-2] if name.startswith(prefix)])
            for prefix in ("shuffle_", "halves_")
        }

    first, again = families(), families()
    for prefix in first:
        assert first[prefix].shape[0] == 32
        np.testing.assert_array_equal(first[prefix], again[prefix])
    moved = families(shuffle_seed=5, halves_seed=9)
    for prefix in first:
        assert not np.allclose(first[prefix], moved[prefix])


def fit_like_states(problems=12, d=64, seed=2):
    """Word and math fit states of the same problems: low-rank (d > 2 * problems, so
    the fit data spans a proper subspace), the math form shifted by a constant."""
    rng = np.random.default_rng(seed)
    word = rng.standard_normal((problems, d)) * 3.0
    math = word + 0.3 * rng.standard_normal((problems, d)) + 10.0 * rng.standard_normal(d)
    return np.stack([word, math])


def test_centroid_half_directions_have_the_norm_and_lie_in_the_span_of_the_fit_data():
    states = fit_like_states()
    family = ev.centroid_half_vectors(states, 7.5, ev.control_seeds(0, 32), 3, {"run": "x"})
    vectors = np.stack([v.vector for v, _ in family]).astype(np.float64)
    assert len({tuple(np.round(row, 4)) for row in vectors}) == 32  # distinct draws
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 7.5, rtol=1e-5)
    assert all(v.layer == 3 and v.provenance["method"] == "centroid-halves" for v, _ in family)
    # in the span of the fit states: the projection onto that span leaves nothing out
    basis, _ = np.linalg.qr(states.reshape(-1, states.shape[-1]).T)  # (d, 24)
    residual = vectors - (vectors @ basis) @ basis.T
    assert np.abs(residual).max() < 1e-4 * 7.5
    # a random direction of the same norm would not be (the check can fail)
    random = ev.random_control(family[0][0], seed=0).vector.astype(np.float64)
    assert np.abs(random - basis @ (basis.T @ random)).max() > 0.1
    # the word -> math difference cancels exactly: shifting every math state by the
    # same vector leaves the directions unchanged (a pooled, unbalanced split would not)
    shifted = states.copy()
    shifted[1] += 50.0 * np.random.default_rng(3).standard_normal(states.shape[-1])
    moved = ev.centroid_half_vectors(shifted, 7.5, ev.control_seeds(0, 32), 3, {})
    np.testing.assert_allclose(np.stack([v.vector for v, _ in moved]), vectors, atol=1e-4)


def test_centroid_half_vector_is_the_difference_of_two_halves_of_the_problems():
    states = fit_like_states(problems=9)  # odd: one problem left out
    vec, raw = ev.centroid_half_vector(states, 2.0, seed=4, layer=1, provenance={})
    order = np.random.default_rng(4).permutation(9)
    first, second = order[:4], order[4:8]
    expected = (states[:, first].mean(axis=(0, 1))) - states[:, second].mean(axis=(0, 1))
    assert raw == pytest.approx(np.linalg.norm(expected))
    np.testing.assert_allclose(vec.vector, expected * 2.0 / raw, rtol=1e-5)
    # reproducible by seed, different for another seed
    np.testing.assert_array_equal(
        vec.vector, ev.centroid_half_vector(states, 2.0, 4, 1, {})[0].vector
    )
    assert not np.allclose(vec.vector, ev.centroid_half_vector(states, 2.0, 5, 1, {})[0].vector)

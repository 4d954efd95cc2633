import pytest

from tokenfield.errors import UserError
from tokenfield.steering.evaluate import default_layers, wilson_interval
from tokenfield.steering.problems import (
    SPLITS,
    TEMPLATES,
    answer_finished,
    few_shot,
    form_capacity,
    make_problems,
    make_splits,
    parse_answer,
    parse_integer,
)


def test_problem_set_is_deterministic_for_a_seed():
    assert make_problems(50, seed=3) == make_problems(50, seed=3)
    assert make_problems(50, seed=3) != make_problems(50, seed=4)


@pytest.mark.parametrize("template", list(TEMPLATES))
def test_answers_are_correct(template):
    for problem in make_problems(200, seed=1, max_operand=12, templates=(template,)):
        # the math form, evaluated by Python, gives the stated answer
        assert eval(problem.expression, {"__builtins__": {}}) == problem.answer  # noqa: S307
        numbers = [
            int(t)
            for t in problem.expression.replace("*", " ")
            .replace("+", " ")
            .replace("-", " ")
            .split()
        ]
        for number in numbers:  # the word form states the same numbers
            assert str(number) in problem.word
        assert problem.answer >= 0


def test_forms_and_few_shot():
    shots, (problem,) = make_problems(3, seed=0), make_problems(1, seed=9)
    word = few_shot(shots, problem, "word")
    math = few_shot(shots, problem, "math")
    assert word.endswith("Answer:") and word.count("Question:") == 4
    assert math.endswith(f"{problem.expression} =") and math.count("=") == 4
    for shot in shots:
        assert f"{shot.expression} = {shot.answer}\n" in math
        assert f"Answer: {shot.answer}\n" in word


def test_parse_integer():
    assert parse_integer(" 12\n\nThe") == 12
    assert parse_integer(" -3 apples") == -3
    assert parse_integer(" no number") is None


def test_unknown_template():
    with pytest.raises(UserError, match="unknown problem template.*add, sub, mul, mul_add"):
        make_problems(3, templates=("div",))


def test_wilson_interval_reference_values():
    low, high = wilson_interval(50, 100)
    assert abs(low - 0.4038) < 1e-3 and abs(high - 0.5962) < 1e-3  # textbook values
    low, high = wilson_interval(0, 40)
    assert low == 0.0 and abs(high - 0.0876) < 1e-3
    assert default_layers(30) == [8, 15, 22]


DEFAULT_SIZES = {"shot": 4, "fit": 64, "validation": 100, "test": 300}


@pytest.mark.parametrize("seed", [0, 1, 2, 7, 123])
def test_splits_are_disjoint_and_test_math_forms_unique(seed):
    splits = make_splits(DEFAULT_SIZES, seed)
    assert list(splits) == list(SPLITS)
    assert {k: len(v) for k, v in splits.items()} == DEFAULT_SIZES
    test_forms = [p.expression for p in splits["test"]]
    assert len(set(test_forms)) == len(test_forms)  # unique within the test split
    for other in ("shot", "fit", "validation"):
        assert not set(test_forms) & {p.expression for p in splits[other]}, other
    every = [p.expression for items in splits.values() for p in items]
    assert len(set(every)) == len(every)  # in fact no math form repeats anywhere
    for problem in (p for items in splits.values() for p in items):
        assert eval(problem.expression, {"__builtins__": {}}) == problem.answer  # noqa: S307
        assert max(problem.operands) <= 2 * 20  # operands up to 20 (sub: minuend up to 40)
    # all four templates, balanced in the test split
    counts = {t: sum(p.template == t for p in splits["test"]) for t in TEMPLATES}
    assert counts == {"add": 75, "sub": 75, "mul": 75, "mul_add": 75}
    assert make_splits(DEFAULT_SIZES, seed) == splits  # seeded


def test_splits_refuse_more_problems_than_distinct_forms():
    # add with operands up to 3 has 9 distinct forms
    assert form_capacity("add", 3) == 9
    assert len(make_splits({"test": 9}, 0, max_operand=3, templates=("add",))["test"]) == 9
    with pytest.raises(UserError, match="10 'add' problems are needed but only 9 distinct"):
        make_splits({"fit": 5, "test": 5}, 0, max_operand=3, templates=("add",))


@pytest.mark.parametrize("template", list(TEMPLATES))
def test_form_capacity_counts_every_distinct_form(template):
    forms = {
        p.expression for p in make_problems(20000, seed=0, max_operand=4, templates=(template,))
    }
    assert len(forms) == form_capacity(template, 4)


def test_parse_answer_reads_the_first_line_and_answer_finished():
    assert parse_answer(" 12\n\nQuestion: 5") == 12
    assert parse_answer(" x\n7") is None
    assert parse_answer(" -4 apples") == -4
    assert not answer_finished(" 1") and not answer_finished(" ")
    assert answer_finished(" 12\n") and answer_finished(" 12 ") and answer_finished(" \n")

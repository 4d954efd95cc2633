import pytest

from tokenfield.errors import UserError
from tokenfield.steering.evaluate import default_layers, wilson_interval
from tokenfield.steering.problems import TEMPLATES, few_shot, make_problems, parse_integer


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

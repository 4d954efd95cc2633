"""The seed's open question, measured: does steering math word problems toward
the pure-math region make the model solve them better?

Protocol (all seeded, all recorded in ``eval.json``; see ``docs/steering.md``):

1. Four disjoint splits from :func:`~tokenfield.steering.problems.make_splits`:
   ``shot`` (the solved few-shot examples in front of every prompt, in the
   prompt's own form), ``fit`` (only builds the vectors), ``validation`` (only
   selects the layer and alpha) and ``test`` (only reports). Every math form is
   used once in all splits together.
2. The fit problems' few-shot word and math prompts are run once; at every layer
   ``v = mean(math) - mean(word)`` of their last-token states.
3. Validation: the word form, unsteered and steered by ``alpha * v`` for every
   (layer, alpha) of the grid. The best validation accuracy picks the condition
   (ties: the first in grid order).
4. Test, on the same items: the unsteered word form, the math form, the selected
   steered condition, ``controls`` random directions of the vector's norm at the
   selected layer and alpha (one seed each), and a label-shuffle control (the
   pooled word and math fit states split at random into halves; the difference of
   the halves' means, scaled to the vector's norm).
5. Trivial baselines that need no model: the best constant answer (chosen on
   validation), copying an operand (first, second, last, and the position chosen
   on validation), and the answer of the last few-shot example.
6. An exact McNemar test of the steered against the unsteered word form on the
   test items, and the verdict of :func:`decide`.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from tokenfield._progress import ProgressBar
from tokenfield.errors import UserError
from tokenfield.steering.closed_loop import progress_toward
from tokenfield.steering.generate import Condition, answer_conditions, count_answers
from tokenfield.steering.problems import Problem, few_shot, make_splits, parse_answer
from tokenfield.steering.vectors import SteeringVector, check_layer, random_control

__all__ = [
    "evaluate_steering",
    "wilson_interval",
    "default_layers",
    "mcnemar_exact",
    "decide",
    "trivial_baselines",
    "select_condition",
    "label_shuffle_vector",
    "control_seeds",
    "TRIVIAL",
]

#: The baselines that need no model; the verdict requires beating every one.
TRIVIAL = ("constant", "copy_operand", "copy_first", "copy_second", "copy_last", "last_shot")


def wilson_interval(correct: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval for a binomial proportion (95 % by default)."""
    if n == 0:
        return (0.0, 1.0)
    p = correct / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


def default_layers(n_layers: int) -> list[int]:
    """A quarter, half and three quarters of the way through the model."""
    return sorted({max(1, round(n_layers * f)) for f in (0.25, 0.5, 0.75)})


def mcnemar_exact(first: Sequence[bool], second: Sequence[bool]) -> dict[str, float | int]:
    """Exact (binomial) McNemar test of two paired 0/1 outcomes on the same items.

    ``b`` = items only ``first`` gets right, ``c`` = items only ``second`` gets
    right; under the null each discordant item is a fair coin, so the two-sided p
    is ``binomtest(b, b + c, 0.5)``. No discordant item gives p = 1.
    """
    from scipy.stats import binomtest

    if len(first) != len(second):
        raise ValueError("paired outcomes must have the same length")
    b = sum(bool(x) and not bool(y) for x, y in zip(first, second, strict=True))
    c = sum(bool(y) and not bool(x) for x, y in zip(first, second, strict=True))
    p = 1.0 if b + c == 0 else float(binomtest(b, b + c, 0.5).pvalue)
    return {"b": int(b), "c": int(c), "p": p}


def _accuracy(guesses: Sequence[int | None], problems: Sequence[Problem]) -> float:
    if not problems:
        return 0.0
    return sum(int(g == p.answer) for g, p in zip(guesses, problems, strict=True)) / len(problems)


def _operand(problem: Problem, which: str) -> int:
    ops = problem.operands
    return {"first": ops[0], "second": ops[1], "last": ops[-1]}[which]


def trivial_baselines(
    validation: Sequence[Problem], test: Sequence[Problem], shots: Sequence[Problem]
) -> dict[str, Any]:
    """Test accuracy of the answers that need no model, choices made on validation.

    - ``constant``: always the most frequent validation answer (the constant with
      the best validation accuracy; ties: the smallest);
    - ``copy_first``, ``copy_second``, ``copy_last``: repeat that operand of the
      math form; ``copy_operand``: the one of the three best on validation
      (ties: in that order);
    - ``last_shot``: the answer of the last few-shot example (what a model that
      copies the previous answer says).

    Returns:
        ``{"accuracy": {name: test accuracy}, "choices": {...}}``.
    """
    counts = Counter(p.answer for p in validation)
    constant = min(counts, key=lambda a: (-counts[a], a)) if counts else 0
    accuracy: dict[str, float] = {"constant": _accuracy([constant] * len(test), test)}
    on_validation = {}
    for which in ("first", "second", "last"):
        accuracy[f"copy_{which}"] = _accuracy([_operand(p, which) for p in test], test)
        on_validation[which] = _accuracy([_operand(p, which) for p in validation], validation)
    chosen = max(("first", "second", "last"), key=lambda w: (on_validation[w], -"fsl".index(w[0])))
    accuracy["copy_operand"] = accuracy[f"copy_{chosen}"]
    last = shots[-1].answer if shots else None
    accuracy["last_shot"] = _accuracy([last] * len(test), test)
    return {
        "accuracy": accuracy,
        "choices": {
            "constant": constant,
            "copy_operand": chosen,
            "copy_validation_accuracy": on_validation,
            "last_shot": last,
        },
    }


def select_condition(grid: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The grid row with the best ``accuracy`` (validation); ties: the first in order."""
    if not grid:
        raise ValueError("empty grid")
    best = max(range(len(grid)), key=lambda i: (grid[i]["accuracy"], -i))
    return grid[best]


def control_seeds(base: int, k: int) -> list[int]:
    """One distinct seed per random control: ``base, base + 1, ..., base + k - 1``."""
    return [base + i for i in range(k)]


def label_shuffle_vector(
    states: np.ndarray, norm: float, seed: int, layer: int, provenance: dict[str, Any]
) -> tuple[SteeringVector, float]:
    """A vector from a random split of the pooled fit states (``(prompts, d)``: the
    word and the math forms together): the mean of one random half minus the mean
    of the other, scaled to ``norm`` (the real vector's). Returns it and its norm
    before scaling."""
    rng = np.random.default_rng(seed)
    order = rng.permutation(states.shape[0])
    half = states.shape[0] // 2
    raw = states[order[:half]].mean(0) - states[order[half : 2 * half]].mean(0)
    raw_norm = float(np.linalg.norm(raw))
    scaled = raw * (norm / raw_norm) if raw_norm > 0 else raw
    meta = {**provenance, "method": "label-shuffle", "shuffle_seed": seed}
    return SteeringVector(scaled.astype(np.float32), layer, meta), raw_norm


def decide(
    *,
    steered: float,
    word: float,
    mcnemar_p: float,
    baselines: dict[str, float],
    controls: Sequence[float],
    label_shuffle: float,
    alpha_level: float = 0.05,
) -> tuple[str, list[str]]:
    """The verdict on "steering toward the math region helps", and why.

    ``"supports"`` only if the steered test accuracy

    1. beats the unsteered word form with an exact McNemar p < ``alpha_level``,
    2. beats every trivial baseline in :data:`TRIVIAL`,
    3. exceeds the 95th percentile of the random-direction controls, and
    4. beats the label-shuffle control;

    otherwise ``"does not support"``, with one reason per failed condition.
    """
    reasons = []
    if not (steered > word and mcnemar_p < alpha_level):
        reasons.append(
            f"steered accuracy {steered:.3f} does not beat the unsteered word form "
            f"{word:.3f} with McNemar p < {alpha_level:g} (p = {mcnemar_p:.3g})"
        )
    for name in TRIVIAL:
        if name in baselines and not steered > baselines[name]:
            reasons.append(
                f"steered accuracy {steered:.3f} does not beat the trivial baseline "
                f"'{name}' ({baselines[name]:.3f})"
            )
    p95 = float(np.percentile(controls, 95)) if len(controls) else float("inf")
    if not steered > p95:
        reasons.append(
            f"steered accuracy {steered:.3f} does not exceed the 95th percentile of "
            f"{len(controls)} random-direction controls ({p95:.3f})"
        )
    if not steered > label_shuffle:
        reasons.append(
            f"steered accuracy {steered:.3f} does not beat the label-shuffle control "
            f"({label_shuffle:.3f})"
        )
    return ("supports" if not reasons else "does not support"), reasons


def _row(correct: Sequence[bool], **extra: Any) -> dict[str, Any]:
    n, k = len(correct), int(sum(correct))
    low, high = wilson_interval(k, n)
    return {**extra, "correct": k, "n": n, "accuracy": k / n if n else 0.0, "ci95": [low, high]}


def evaluate_steering(
    model: Any,
    *,
    n: int = 300,
    validation: int = 100,
    fit: int = 64,
    shots: int = 4,
    seed: int = 0,
    max_operand: int = 20,
    templates: Sequence[str] = ("add", "sub", "mul", "mul_add"),
    layers: Sequence[int] | None = None,
    alphas: Sequence[float] = (0.5, 1.0, 2.0),
    controls: int = 32,
    control_seed: int = 0,
    shuffle_seed: int = 0,
    positions: str = "last",
    max_new_tokens: int = 5,
    batch_size: int = 256,
    progress: bool = False,
) -> dict[str, Any]:
    """Run the protocol above; return JSON-able results (the ``eval.json`` content)."""
    started, cpu_started = time.perf_counter(), time.process_time()
    if n < 1 or validation < 1 or fit < 2 or shots < 0:
        raise UserError(
            "need at least 1 test, 1 validation and 2 fit problems (and no negative --shots)",
            "raise --n / --validation / --fit",
        )
    if controls < 1:
        raise UserError("--controls must be at least 1", "the issue's protocol uses 32")
    if max_new_tokens < 1:
        raise UserError("--max-new-tokens must be at least 1", "use e.g. 5")
    layers = list(layers) if layers else default_layers(model.n_layers)
    for layer in layers:
        check_layer(layer, model.n_layers)
    alphas = [float(a) for a in alphas]
    splits = make_splits(
        {"shot": shots, "fit": fit, "validation": validation, "test": n},
        seed,
        max_operand=max_operand,
        templates=templates,
    )
    shot_set, fit_set = splits["shot"], splits["fit"]
    val_set, test_set = splits["validation"], splits["test"]

    def prompts(items: Sequence[Problem], form: str) -> list[str]:
        return [few_shot(shot_set, p, form) for p in items]

    grid = [(layer, alpha) for layer in layers for alpha in alphas]
    total = (
        count_answers(2 * fit, 1)
        + count_answers(validation, 1 + len(grid))
        + count_answers(n, 1)  # math form
        + count_answers(n, 3 + controls)  # word, steered, label shuffle, controls
    )
    timings: dict[str, float] = {}
    bar = ProgressBar("evaluating", total, enabled=progress, unit="answers")
    run = dict(max_new_tokens=max_new_tokens, batch_size=batch_size, positions=positions, bar=bar)

    def correct(texts: Sequence[str], items: Sequence[Problem]) -> list[bool]:
        return [parse_answer(t) == p.answer for t, p in zip(texts, items, strict=True)]

    with bar:
        # 1. the fit states, once, for every layer
        t0 = time.perf_counter()
        fit_run = {**run, "max_new_tokens": 1}  # one step: the last prompt token's states
        fit_word, fit_math = (
            answer_conditions(model, prompts(fit_set, form), [Condition("fit", record=True)],
                              **fit_run)["fit"]["states"].astype(np.float64)  # (time, fit, d)
            for form in ("word", "math")
        )  # fmt: skip
        fit_out = np.concatenate([fit_word, fit_math], axis=1)
        math_centroid = fit_math.mean(axis=1)  # (time, d)
        provenance = {"model": model.run_config(), "from": "word", "to": "math"}
        vectors = {
            layer: SteeringVector(
                (fit_math[layer].mean(0) - fit_word[layer].mean(0)).astype(np.float32),
                layer,
                {**provenance, "method": "mean", "layer": layer, "n_from": fit, "n_to": fit},
            )
            for layer in layers
        }
        timings["fit_s"] = time.perf_counter() - t0

        # 2. validation: select (layer, alpha)
        t0 = time.perf_counter()
        names = {cell: f"steered@{cell[0]}x{cell[1]:g}" for cell in grid}
        val_out = answer_conditions(
            model,
            prompts(val_set, "word"),
            [Condition("word", record=True)]
            + [Condition(names[c], vectors[c[0]], c[1], record=True) for c in grid],
            **run,
        )
        val_word = correct(val_out["word"]["texts"], val_set)
        grid_rows = []
        for layer, alpha in grid:
            out = val_out[names[(layer, alpha)]]
            toward = progress_toward(
                out["states"].astype(np.float64),
                val_out["word"]["states"].astype(np.float64),
                math_centroid,
            )
            grid_rows.append(
                _row(
                    correct(out["texts"], val_set),
                    condition="steered",
                    split="validation",
                    layer=layer,
                    alpha=alpha,
                    progress_final=float(toward[-1]),
                    progress_at_layer=float(toward[layer]),
                )
            )
        chosen = select_condition(grid_rows)
        layer, alpha = int(chosen["layer"]), float(chosen["alpha"])
        vector = vectors[layer]
        timings["validation_s"] = time.perf_counter() - t0

        # 3. test: the one selected condition and its controls
        t0 = time.perf_counter()
        seeds = control_seeds(control_seed, controls)
        shuffle, shuffle_raw_norm = label_shuffle_vector(
            fit_out[layer], vector.norm, shuffle_seed, layer, provenance
        )
        test_conditions = [
            Condition("word", record=True),
            Condition("steered", vector, alpha, record=True),
            Condition("label_shuffle", shuffle, alpha),
        ] + [Condition(f"control_{s}", random_control(vector, s), alpha) for s in seeds]
        test_out = answer_conditions(model, prompts(test_set, "word"), test_conditions, **run)
        math_out = answer_conditions(model, prompts(test_set, "math"), [Condition("math")], **run)[
            "math"
        ]
        timings["test_s"] = time.perf_counter() - t0

    word_ok = correct(test_out["word"]["texts"], test_set)
    steered_ok = correct(test_out["steered"]["texts"], test_set)
    math_ok = correct(math_out["texts"], test_set)
    shuffle_ok = correct(test_out["label_shuffle"]["texts"], test_set)
    control_acc = [
        float(np.mean(correct(test_out[f"control_{s}"]["texts"], test_set))) for s in seeds
    ]
    toward = progress_toward(
        test_out["steered"]["states"].astype(np.float64),
        test_out["word"]["states"].astype(np.float64),
        math_centroid,
    )
    steered_row = _row(
        steered_ok,
        layer=layer,
        alpha=alpha,
        progress_final=float(toward[-1]),
        progress_at_layer=float(toward[layer]),
    )
    trivial = trivial_baselines(val_set, test_set, shot_set)
    baselines = {
        **trivial["accuracy"],
        "word": float(np.mean(word_ok)),
        "math": float(np.mean(math_ok)),
    }
    mcnemar = mcnemar_exact(steered_ok, word_ok)
    acc = steered_row["accuracy"]
    control_summary = {
        "k": controls,
        "seeds": seeds,
        "median": float(np.median(control_acc)),
        "p95": float(np.percentile(control_acc, 95)),
        "max": float(np.max(control_acc)),
        # 1 = the steered accuracy is above every control; k + 1 = below every one
        "rank": 1 + sum(c > acc for c in control_acc),
        "n_at_or_above": sum(c >= acc for c in control_acc),
        "p_empirical": (1 + sum(c >= acc for c in control_acc)) / (controls + 1),
    }
    label_shuffle = {
        **_row(shuffle_ok),
        "seed": shuffle_seed,
        "raw_norm": shuffle_raw_norm,
        "scaled_norm": shuffle.norm,
    }
    verdict, reasons = decide(
        steered=acc,
        word=baselines["word"],
        mcnemar_p=float(mcnemar["p"]),
        baselines=trivial["accuracy"],
        controls=control_acc,
        label_shuffle=label_shuffle["accuracy"],
    )
    timings["total_s"] = time.perf_counter() - started
    # CPU seconds of this process (all threads): on a shared machine the wall time
    # also counts the time other processes held the cores
    timings["cpu_s"] = time.process_time() - cpu_started
    problems = [
        {"split": split, "word": p.word, "math": p.expression, "answer": p.answer,
         "template": p.template}
        for split, items in splits.items()
        for p in items
    ]  # fmt: skip
    examples = [
        {
            "word": p.word,
            "math": p.expression,
            "answer": p.answer,
            "word_output": test_out["word"]["texts"][i],
            "word_parsed": parse_answer(test_out["word"]["texts"][i]),
            "steered_output": test_out["steered"]["texts"][i],
            "math_output": math_out["texts"][i],
        }
        for i, p in enumerate(test_set[:8])
    ]
    return {
        "config": {
            "model": model.run_config(),
            "n": n,
            "validation": validation,
            "fit": fit,
            "shots": shots,
            "seed": seed,
            "max_operand": max_operand,
            "templates": list(templates),
            "layers": layers,
            "alphas": alphas,
            "controls": controls,
            "control_seed": control_seed,
            "shuffle_seed": shuffle_seed,
            "positions": positions,
            "max_new_tokens": max_new_tokens,
            "answer_rule": "first integer on the first line of the greedy continuation",
        },
        "problems": problems,
        "vector_norms": {str(k): v.norm for k, v in vectors.items()},
        "validation": {
            "word": _row(val_word, condition="word", split="validation"),
            "grid": grid_rows,
        },  # fmt: skip
        "rows": [_row(val_word, condition="word", split="validation", layer=None, alpha=None)]
        + grid_rows,
        "selected": {
            "layer": layer,
            "alpha": alpha,
            "validation_accuracy": chosen["accuracy"],
        },  # fmt: skip
        "baselines": baselines,
        "baseline_choices": trivial["choices"],
        "steered": steered_row,
        "word": _row(word_ok),
        "math": _row(math_ok),
        "controls": control_acc,
        "control_summary": control_summary,
        "label_shuffle": label_shuffle,
        "mcnemar": mcnemar,
        "mcnemar_p": float(mcnemar["p"]),
        "verdict": verdict,
        "verdict_reasons": reasons,
        "examples": examples,
        "timings": timings,
    }

"""The seed's open question, measured: does steering math word problems toward
the pure-math region make the model solve them better?

Protocol (all seeded, all recorded):

1. Generate ``shots + fit + n`` problems
   (:func:`~tokenfield.steering.problems.make_problems`). The first ``shots`` are
   the solved few-shot examples in front of every prompt (in the prompt's own
   form); the next ``fit`` only build the steering vectors; the last ``n`` are
   the test set.
2. Trace the fit problems' few-shot word and math prompts (last token) and, per
   layer, take ``v = mean(math) - mean(word)`` (``alpha = 1`` carries the
   word-form mean onto the math-form mean at that layer).
3. Greedy answers (the first integer of the continuation) on the test set for:
   the word form, the math form, the word form steered by ``alpha * v`` at each
   layer, and the word form pushed along a random direction of the same norm
   (the control).
4. Accuracy with a 95 % Wilson interval for each condition, and the progress of
   the steered states toward the math centroid (see
   :func:`~tokenfield.steering.closed_loop.progress_toward`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from tokenfield._progress import ProgressBar
from tokenfield.errors import UserError
from tokenfield.prompts import Prompt
from tokenfield.steering.generate import greedy_continuations
from tokenfield.steering.hooks import steering
from tokenfield.steering.problems import few_shot, make_problems, parse_integer
from tokenfield.steering.vectors import check_layer, random_control, steering_vector

__all__ = ["evaluate_steering", "wilson_interval", "default_layers"]


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


def _score(texts: Sequence[str], answers: Sequence[int]) -> tuple[int, list[int | None]]:
    parsed = [parse_integer(t) for t in texts]
    return sum(int(p == a) for p, a in zip(parsed, answers, strict=True)), parsed


def evaluate_steering(
    model: Any,
    *,
    n: int = 100,
    fit: int = 32,
    shots: int = 3,
    seed: int = 0,
    max_operand: int = 9,
    templates: Sequence[str] = ("add", "sub"),
    layers: Sequence[int] | None = None,
    alphas: Sequence[float] = (0.5, 1.0, 2.0),
    positions: str = "last",
    max_new_tokens: int = 8,
    batch_size: int = 16,
    control_seed: int = 0,
    progress: bool = False,
) -> dict[str, Any]:
    """Run the protocol above; return JSON-able results (``rows`` is the table)."""
    import tokenfield as tf
    from tokenfield.steering.closed_loop import progress_toward

    if n < 1 or fit < 2:
        raise UserError("need at least 1 test problem and 2 fit problems", "raise --n / --fit")
    layers = list(layers) if layers else default_layers(model.n_layers)
    for layer in layers:
        check_layer(layer, model.n_layers)
    problems = make_problems(shots + fit + n, seed, max_operand=max_operand, templates=templates)
    shot_set, fit_set, test_set = (
        problems[:shots],
        problems[shots : shots + fit],
        problems[shots + fit :],
    )
    answers = [p.answer for p in test_set]

    def prompts(items: Sequence[Any], form: str) -> list[Prompt]:
        return [Prompt(few_shot(shot_set, p, form), form) for p in items]

    fit_ds = tf.trace(
        model, prompts(fit_set, "word") + prompts(fit_set, "math"), batch_size=batch_size
    )
    words = [p.text for p in prompts(test_set, "word")]
    maths = [p.text for p in prompts(test_set, "math")]

    steps = 2 + 2 * len(layers) * len(alphas)
    bar = ProgressBar("evaluating", steps, enabled=progress, unit="passes")

    def answer(
        texts: Sequence[str], states: list[list[Any]] | None = None
    ) -> tuple[int, list[int | None], list[str]]:
        out = greedy_continuations(
            model, texts, max_new_tokens=max_new_tokens, batch_size=batch_size, states=states
        )
        correct, parsed = _score(out, answers)
        bar.advance()
        return correct, parsed, out

    rows: list[dict[str, Any]] = []

    def row(condition: str, layer: int | None, alpha: float | None, correct: int, extra=None):
        low, high = wilson_interval(correct, n)
        rows.append(
            {
                "condition": condition,
                "layer": layer,
                "alpha": alpha,
                "correct": correct,
                "n": n,
                "accuracy": correct / n,
                "ci95": [low, high],
                **(extra or {}),
            }
        )

    def stacked(recorded: list[list[Any]]) -> np.ndarray:
        return np.stack([torch.cat(parts).numpy() for parts in recorded]).astype(np.float64)

    with bar:
        recorded_words: list[list[Any]] = [[] for _ in range(model.n_layers + 1)]
        word_correct, word_parsed, word_text = answer(words, states=recorded_words)
        row("word", None, None, word_correct)
        recorded_maths: list[list[Any]] = [[] for _ in range(model.n_layers + 1)]
        math_correct, _parsed, math_text = answer(maths, states=recorded_maths)
        row("math", None, None, math_correct)
        word_states = stacked(recorded_words)  # (time, n, d)
        math_centroid = stacked(recorded_maths).mean(axis=1)  # (time, d)
        vectors: dict[str, float] = {}
        for layer in layers:
            vector = steering_vector(fit_ds, source="word", target="math", layer=layer)
            vectors[str(layer)] = vector.norm
            control = random_control(vector, control_seed)
            for condition, direction in (("steered", vector), ("control", control)):
                for alpha in alphas:
                    recorded: list[list[Any]] = [[] for _ in range(model.n_layers + 1)]
                    with steering(model, direction, float(alpha), positions=positions, check=False):
                        correct, _p, _t = answer(words, states=recorded)
                    toward = progress_toward(stacked(recorded), word_states, math_centroid)
                    row(
                        condition,
                        layer,
                        float(alpha),
                        correct,
                        {
                            "progress_final": float(toward[-1]),
                            "progress_at_layer": float(toward[layer]),
                        },
                    )
    examples = [
        {
            "word": p.word,
            "math": p.expression,
            "answer": p.answer,
            "word_output": word_text[i],
            "word_parsed": word_parsed[i],
            "math_output": math_text[i],
        }
        for i, p in enumerate(test_set[:8])
    ]
    return {
        "config": {
            "model": model.run_config(),
            "n": n,
            "fit": fit,
            "shots": shots,
            "seed": seed,
            "max_operand": max_operand,
            "templates": list(templates),
            "layers": layers,
            "alphas": [float(a) for a in alphas],
            "positions": positions,
            "max_new_tokens": max_new_tokens,
            "control_seed": control_seed,
        },
        "vector_norms": vectors,
        "rows": rows,
        "examples": examples,
    }

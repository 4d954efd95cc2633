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
   selected layer and alpha (one seed each), and two families of data-shaped
   controls of the same norm, at the same layer and alpha: ``shuffles`` label
   shuffles (the pooled word and math fit states split at random into halves; the
   difference of the halves' means) and ``halves`` centroid halves (the fit
   problems split at random into halves, each half's centroid over both forms of
   its problems, so the word -> math difference cancels exactly and what is left
   is how the fit prompts vary within each form).
5. Trivial baselines that need no model: the best constant answer (chosen on
   validation), copying an operand (first, second, last, and the position chosen
   on validation), and the answer of the last few-shot example.
6. An exact McNemar test of the steered against the unsteered word form on the
   test items, the steered accuracy's rank in each control family (ties count
   against it) and the verdict of :func:`decide`.
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
    "label_shuffle_vectors",
    "centroid_half_vector",
    "centroid_half_vectors",
    "control_seeds",
    "control_rank",
    "family_summary",
    "control_families",
    "distinct_splits",
    "TRIVIAL",
    "FAMILIES",
]

#: The baselines that need no model; the verdict requires beating every one.
TRIVIAL = ("constant", "copy_operand", "copy_first", "copy_second", "copy_last", "last_shot")

#: The control families, in ``eval.json``'s keys, and their names in words.
FAMILIES = {
    "random": "random-direction controls",
    "label_shuffle": "label-shuffle controls",
    "centroid_halves": "centroid-half controls",
}


class SteeringEvaluation(dict):
    """What :func:`evaluate_steering` returns: the ``eval.json`` content, a plain dict
    (JSON-able as it is) that also shows as a table in Jupyter (``_repr_html_``)."""

    def _repr_html_(self) -> str:
        """Accuracy of each condition beside the controls it must beat, and the verdict."""
        from tokenfield._html import html_table

        def acc(part: Any) -> str:
            if not isinstance(part, dict) or part.get("accuracy") is None:
                return ""
            low, high = part.get("ci95") or (None, None)
            ci = f" [{low:.3f}, {high:.3f}]" if low is not None else ""
            return f"{part['accuracy']:.3f}{ci} (n = {part.get('n')})"

        def family(name: str, part: Any) -> list[str]:
            if not isinstance(part, dict) or not part.get("accuracies"):
                return [name, ""]
            values = part["accuracies"]
            return [name, f"max {max(values):.3f} over {len(values)}"]

        steered = self.get("steered") or {}
        rows = [
            ["word form, unsteered", acc(self.get("word"))],
            ["math form (the target)", acc(self.get("math"))],
            [f"steered (layer {steered.get('layer')}, alpha {steered.get('alpha')})", acc(steered)],
        ]
        summary = self.get("control_summary") or {}
        if summary:
            rows.append(
                [
                    f"random-direction controls ({summary.get('k')})",
                    f"max {summary.get('max', 0):.3f}, empirical p = "
                    f"{summary.get('p_empirical', float('nan')):.3g}",
                ]
            )
        rows.append(family("label-shuffle controls", self.get("label_shuffle")))
        rows.append(family("centroid-half controls", self.get("centroid_halves")))
        if self.get("mcnemar_p") is not None:
            rows.append(["McNemar p, steered vs word", f"{self['mcnemar_p']:.3g}"])
        reasons = "; ".join(self.get("verdict_reasons") or [])
        caption = f"steering evaluation: the claim is {self.get('verdict', 'not decided')}"
        return html_table(caption, ["condition", "accuracy"], rows, note=reasons)


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


def _halves(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """A random split of ``range(n)`` into two halves of ``n // 2`` (one item left out
    when ``n`` is odd)."""
    order = rng.permutation(n)
    half = n // 2
    return order[:half], order[half : 2 * half]


def distinct_splits(n: int) -> int:
    """How many different ordered splits into two halves ``n`` items allow (a
    family of controls draws at most this many)."""
    half = n // 2
    return math.comb(n, half) * math.comb(n - half, half)


def _distinct_halves(n: int, seeds: Sequence[int], what: str) -> list[tuple[np.ndarray, ...]]:
    """One split per seed, each from ``default_rng(seed)``; a split already drawn is
    redrawn from the same generator, so the draws are distinct and each seed's first
    split is what :func:`_halves` gives it alone.

    Raises:
        UserError: more draws than there are different splits.
    """
    if len(seeds) > distinct_splits(n):
        raise UserError(
            f"{len(seeds)} {what} ask for more distinct splits than {n} fit states have "
            f"({distinct_splits(n)})",
            f"lower the number of {what} or raise --fit",
        )
    seen: set[tuple[int, ...]] = set()
    splits = []
    for seed in seeds:
        rng = np.random.default_rng(seed)
        while True:
            first, second = _halves(n, rng)
            key = (*sorted(first.tolist()), -1, *sorted(second.tolist()))
            if key not in seen:
                seen.add(key)
                splits.append((first, second))
                break
    return splits


def _scaled(raw: np.ndarray, norm: float) -> tuple[np.ndarray, float]:
    raw_norm = float(np.linalg.norm(raw))
    return (raw * (norm / raw_norm) if raw_norm > 0 else raw), raw_norm


def label_shuffle_vector(
    states: np.ndarray, norm: float, seed: int, layer: int, provenance: dict[str, Any]
) -> tuple[SteeringVector, float]:
    """A vector from a random split of the pooled fit states (``(prompts, d)``: the
    word and the math forms together): the mean of one random half minus the mean
    of the other, scaled to ``norm`` (the real vector's). Returns it and its norm
    before scaling."""
    return label_shuffle_vectors(states, norm, [seed], layer, provenance)[0]


def label_shuffle_vectors(
    states: np.ndarray, norm: float, seeds: Sequence[int], layer: int, provenance: dict[str, Any]
) -> list[tuple[SteeringVector, float]]:
    """The label-shuffle family: one :func:`label_shuffle_vector` per seed, all distinct
    (a split drawn before is redrawn from that seed's generator). The first is the
    single draw of the earlier protocol (``--shuffle-seed``)."""
    states = np.asarray(states, dtype=np.float64)
    out = []
    for seed, (first, second) in zip(
        seeds, _distinct_halves(states.shape[0], seeds, "label shuffles"), strict=True
    ):
        scaled, raw_norm = _scaled(states[first].mean(0) - states[second].mean(0), norm)
        meta = {**provenance, "method": "label-shuffle", "shuffle_seed": seed}
        out.append((SteeringVector(scaled.astype(np.float32), layer, meta), raw_norm))
    return out


def centroid_half_vector(
    states: np.ndarray, norm: float, seed: int, layer: int, provenance: dict[str, Any]
) -> tuple[SteeringVector, float]:
    """A direction where the fit data lives: the fit problems split at random into two
    halves, the difference of the halves' centroids, scaled to ``norm``.

    Args:
        states: ``(forms, problems, d)``, e.g. the word and the math forms' fit states
            stacked (or ``(problems, d)``: one form). Problem ``i`` is the same problem
            in every form, and a problem goes to one half with all its forms, so each
            half holds as many word as math prompts and the word -> math difference
            cancels exactly: the vector is a combination of the fit states with
            coefficients that sum to zero (within-form variation only).

    Returns:
        the vector and its norm before scaling.
    """
    return centroid_half_vectors(states, norm, [seed], layer, provenance)[0]


def centroid_half_vectors(
    states: np.ndarray, norm: float, seeds: Sequence[int], layer: int, provenance: dict[str, Any]
) -> list[tuple[SteeringVector, float]]:
    """The centroid-half family: one :func:`centroid_half_vector` per seed, all distinct."""
    states = np.asarray(states, dtype=np.float64)
    if states.ndim == 2:
        states = states[None]
    problems = states.shape[1]
    if problems < 2:
        raise UserError("centroid halves need at least 2 fit problems", "raise --fit")
    out = []
    for seed, (first, second) in zip(
        seeds, _distinct_halves(problems, seeds, "centroid halves"), strict=True
    ):
        raw = states[:, first].mean(axis=(0, 1)) - states[:, second].mean(axis=(0, 1))
        scaled, raw_norm = _scaled(raw, norm)
        meta = {**provenance, "method": "centroid-halves", "halves_seed": seed}
        out.append((SteeringVector(scaled.astype(np.float32), layer, meta), raw_norm))
    return out


def control_rank(accuracy: float, controls: Sequence[float]) -> dict[str, Any]:
    """Where ``accuracy`` stands among a family of control accuracies; ties count
    against it.

    ``rank = 1 + (controls at or above it)``: 1 = strictly above every control,
    ``k + 1`` = at or below every one. ``p_empirical = rank / (k + 1)``, the
    permutation p of "the steered condition is no better than a control".
    """
    k = len(controls)
    at_or_above = sum(float(c) >= accuracy for c in controls)
    return {
        "rank": 1 + at_or_above,
        "of": k + 1,
        "n_at_or_above": at_or_above,
        "n_tied": sum(float(c) == accuracy for c in controls),
        "p_empirical": (1 + at_or_above) / (k + 1),
    }


def family_summary(accuracy: float, controls: Sequence[float], seeds: Sequence[int]) -> dict:
    """k, seeds, the accuracies, median / 95th percentile / max and the rank of
    ``accuracy`` (:func:`control_rank`) for one control family."""
    values = [float(c) for c in controls]
    return {
        "k": len(values),
        "seeds": [int(s) for s in seeds],
        "accuracies": values,
        "median": float(np.median(values)) if values else float("nan"),
        "p95": float(np.percentile(values, 95)) if values else float("nan"),
        "max": float(np.max(values)) if values else float("nan"),
        **control_rank(accuracy, values),
    }


def control_families(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every control family of an ``eval.json`` as :func:`family_summary` dicts, for this
    version's files and the earlier ones alike.

    Earlier files hold one label-shuffle draw (``label_shuffle.accuracy``), no
    centroid halves, and a ``control_summary.rank`` that counted only the controls
    strictly above; here every rank is recomputed from the accuracies, ties counted.
    """
    acc = float(result["steered"]["accuracy"])
    cs = result.get("control_summary", {})
    families = {"random": family_summary(acc, result.get("controls", []), cs.get("seeds", []))}
    shuffle = result.get("label_shuffle")
    if isinstance(shuffle, dict):
        if "accuracies" in shuffle:
            families["label_shuffle"] = family_summary(acc, shuffle["accuracies"], shuffle["seeds"])
        elif "accuracy" in shuffle:  # an earlier eval.json: one draw
            families["label_shuffle"] = family_summary(
                acc, [shuffle["accuracy"]], [shuffle.get("seed", 0)]
            )
    halves = result.get("centroid_halves")
    if isinstance(halves, dict) and "accuracies" in halves:
        families["centroid_halves"] = family_summary(acc, halves["accuracies"], halves["seeds"])
    return families


def decide(
    *,
    steered: float,
    word: float,
    mcnemar_p: float,
    baselines: dict[str, float],
    controls: Sequence[float],
    label_shuffle: Sequence[float] | float,
    centroid_halves: Sequence[float] | None = None,
    alpha_level: float = 0.05,
) -> tuple[str, list[str]]:
    """The verdict on "steering toward the math region helps", and why.

    ``"supports"`` only if the steered test accuracy

    1. beats the unsteered word form with an exact McNemar p < ``alpha_level``,
    2. beats every trivial baseline in :data:`TRIVIAL`, and
    3. beats each control family (the random directions ``controls``, the label
       shuffles ``label_shuffle``, the centroid halves ``centroid_halves``): its
       empirical p, ``(1 + controls at or above it) / (k + 1)``, is below
       ``alpha_level``. Ties count against the claim. With 32 controls this means
       strictly above every one; a family of fewer than ``1 / alpha_level - 1``
       controls can never be beaten (the rule then says "does not support").

    A single number for ``label_shuffle`` is a family of one draw. ``None`` for
    ``centroid_halves`` leaves that family out (an earlier protocol); an empty one
    cannot be beaten. Otherwise ``"does not support"``, with one reason per failed
    condition.
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
    if isinstance(label_shuffle, (int, float)):
        label_shuffle = [float(label_shuffle)]
    families = {"random": controls, "label_shuffle": label_shuffle}
    if centroid_halves is not None:
        families["centroid_halves"] = centroid_halves
    for key, values in families.items():
        values = [float(v) for v in values]
        rank = control_rank(steered, values)
        if not rank["p_empirical"] < alpha_level:
            top = f"max {max(values):.3f}" if values else "no controls"
            reasons.append(
                f"steered accuracy {steered:.3f} does not beat the {len(values)} "
                f"{FAMILIES[key]} ({top}; rank {rank['rank']} of {rank['of']}, "
                f"{rank['n_at_or_above']} at or above it, empirical p = "
                f"{rank['p_empirical']:.3g}, needs < {alpha_level:g})"
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
    shuffles: int = 32,
    halves: int = 32,
    halves_seed: int = 0,
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
            "raise --test / --validation / --fit",
        )
    for flag, value in (("--controls", controls), ("--shuffles", shuffles), ("--halves", halves)):
        if value < 1:
            raise UserError(f"{flag} must be at least 1, got {value}", "the protocol uses 32")
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
        + count_answers(n, 2 + controls + shuffles + halves)  # word, steered, the controls
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
        shuffle_seeds = control_seeds(shuffle_seed, shuffles)
        half_seeds = control_seeds(halves_seed, halves)
        shuffled = label_shuffle_vectors(
            fit_out[layer], vector.norm, shuffle_seeds, layer, provenance
        )
        halved = centroid_half_vectors(
            np.stack([fit_word[layer], fit_math[layer]]), vector.norm, half_seeds, layer,
            provenance,
        )  # fmt: skip
        test_conditions = (
            [Condition("word", record=True), Condition("steered", vector, alpha, record=True)]
            + [Condition(f"control_{s}", random_control(vector, s), alpha) for s in seeds]
            + [
                Condition(f"shuffle_{s}", v, alpha)
                for s, (v, _) in zip(shuffle_seeds, shuffled, strict=True)
            ]
            + [
                Condition(f"halves_{s}", v, alpha)
                for s, (v, _) in zip(half_seeds, halved, strict=True)
            ]
        )
        test_out = answer_conditions(model, prompts(test_set, "word"), test_conditions, **run)
        math_out = answer_conditions(model, prompts(test_set, "math"), [Condition("math")], **run)[
            "math"
        ]
        timings["test_s"] = time.perf_counter() - t0

    word_ok = correct(test_out["word"]["texts"], test_set)
    steered_ok = correct(test_out["steered"]["texts"], test_set)
    math_ok = correct(math_out["texts"], test_set)

    def accuracy_of(name: str) -> float:
        return float(np.mean(correct(test_out[name]["texts"], test_set)))

    control_acc = [accuracy_of(f"control_{s}") for s in seeds]
    shuffle_acc = [accuracy_of(f"shuffle_{s}") for s in shuffle_seeds]
    halves_acc = [accuracy_of(f"halves_{s}") for s in half_seeds]
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
    random_family = family_summary(acc, control_acc, seeds)
    control_summary = {key: v for key, v in random_family.items() if key != "accuracies"}
    label_shuffle = {
        **family_summary(acc, shuffle_acc, shuffle_seeds),
        "raw_norms": [raw for _v, raw in shuffled],
        "scaled_norm": vector.norm,
    }
    centroid_halves = {
        **family_summary(acc, halves_acc, half_seeds),
        "raw_norms": [raw for _v, raw in halved],
        "scaled_norm": vector.norm,
    }
    verdict, reasons = decide(
        steered=acc,
        word=baselines["word"],
        mcnemar_p=float(mcnemar["p"]),
        baselines=trivial["accuracy"],
        controls=control_acc,
        label_shuffle=shuffle_acc,
        centroid_halves=halves_acc,
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
    return SteeringEvaluation(
        {
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
                "shuffles": shuffles,
                "halves": halves,
                "halves_seed": halves_seed,
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
            "centroid_halves": centroid_halves,
            "mcnemar": mcnemar,
            "mcnemar_p": float(mcnemar["p"]),
            "verdict": verdict,
            "verdict_reasons": reasons,
            "examples": examples,
            "timings": timings,
        }
    )

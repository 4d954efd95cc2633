"""The workflow of ``tokenfield eval-steering``: a :class:`SteeringEvaluation`
(every choice of the protocol, validated on construction, before any model is
loaded) is run on its model by :func:`evaluate_run`, which writes ``eval.json``
and the figures (the protocol itself: :func:`tokenfield.steering.evaluate.evaluate_steering`).

The fields are the library's parameter names; ``tokenfield`` names their flags
when it reports an error (``n`` is ``--n``, ``batch_size`` is ``--batch-size``).
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tokenfield._io import write_json_atomic
from tokenfield._progress import console as make_console
from tokenfield.errors import ParameterError
from tokenfield.models.load import ModelSpec
from tokenfield.pipelines.steer import prepare_steering_out
from tokenfield.steering.evaluate import distinct_splits, evaluate_steering
from tokenfield.steering.generate import require_causal
from tokenfield.steering.problems import make_splits
from tokenfield.steering.vectors import check_layer
from tokenfield.viz.steering import plot_accuracy, plot_test_summary, save

__all__ = ["DTYPES", "SteeringEvaluation", "evaluate_run"]

DTYPES = ("float32", "bfloat16")


@dataclass(frozen=True)
class SteeringEvaluation:
    """The settings of one steering evaluation (``docs/steering.md`` has the protocol).

    Args:
        model: a causal model (a bundled name, a directory, a ``.gguf`` or a hub id).
        n, validation, fit, shots: the test, validation, fit and few-shot problems.
        seed: seed of the problem set.
        max_operand, templates: the problems' difficulty and kinds.
        layers: where to steer (``None``: 1/4, 1/2 and 3/4 of the depth).
        alphas: multiples of the vector.
        controls, shuffles, halves: the sizes of the three control families (random
            directions, label shuffles, centroid halves); each a different draw.
        control_seed, shuffle_seed, halves_seed: the first seed of each family.
        positions: ``last`` or ``all``.
        max_new_tokens: the longest continuation.
        batch_size: rows (prompt x condition) per forward pass.
        dtype: ``float32`` or ``bfloat16``.
        device: where the model runs (``cpu``, ``cuda``, ``cuda:1``, ...).

    Raises:
        ParameterError, UserError: a bad value, on construction.
    """

    model: str = "smollm2"
    n: int = 300
    validation: int = 100
    fit: int = 64
    shots: int = 4
    seed: int = 0
    max_operand: int = 20
    templates: tuple[str, ...] = ("add", "sub", "mul", "mul_add")
    layers: tuple[int, ...] | None = None
    alphas: tuple[float, ...] = (0.5, 1.0, 2.0)
    controls: int = 32
    control_seed: int = 0
    shuffle_seed: int = 0
    shuffles: int = 32
    halves: int = 32
    halves_seed: int = 0
    positions: str = "last"
    max_new_tokens: int = 5
    batch_size: int = 256
    dtype: str = "float32"
    device: str = "cpu"

    def __post_init__(self) -> None:
        object.__setattr__(self, "templates", tuple(self.templates))
        object.__setattr__(self, "alphas", tuple(float(a) for a in self.alphas))
        if self.layers is not None:
            object.__setattr__(self, "layers", tuple(self.layers) or None)
        # validates templates, sizes and the number of distinct forms before any loading
        make_splits({"shot": self.shots, "fit": self.fit, "validation": self.validation,
                     "test": self.n}, self.seed, max_operand=self.max_operand,
                    templates=list(self.templates))  # fmt: skip
        if self.positions not in ("last", "all"):
            raise ParameterError(
                "positions", f"unknown {{name}} '{self.positions}'", "use 'last' or 'all'"
            )
        for param, least in (("controls", 1), ("shuffles", 1), ("halves", 1), ("batch_size", 1),
                             ("max_new_tokens", 1), ("n", 1), ("validation", 1), ("fit", 2)):  # fmt: skip
            value = getattr(self, param)
            if value < least:
                raise ParameterError(
                    param, f"{{name}} must be at least {least}, got {value}", "raise {name}"
                )
        if self.dtype not in DTYPES:
            raise ParameterError(
                "dtype", f"unknown {{name}} '{self.dtype}'", "use float32 or bfloat16"
            )
        # every draw of a family is a different split: no more draws than splits
        for param, states in (("shuffles", 2 * self.fit), ("halves", self.fit)):
            value, most = getattr(self, param), distinct_splits(states)
            if value > most:
                raise ParameterError(
                    param,
                    f"{{name}} {value} asks for more distinct splits than --fit {self.fit} gives "
                    f"({most})",
                    "lower {name} or raise --fit",
                )

    def protocol(self) -> dict[str, Any]:
        """The keyword arguments of :func:`~tokenfield.steering.evaluate.evaluate_steering`."""
        settings = asdict(self)
        for key in ("model", "dtype", "device"):
            settings.pop(key)
        settings["templates"] = list(self.templates)
        settings["layers"] = list(self.layers) if self.layers else None
        settings["alphas"] = list(self.alphas)
        return settings


def evaluate_run(
    evaluation: SteeringEvaluation,
    out: str | Path,
    *,
    overwrite: bool = False,
    progress: bool = False,
) -> dict[str, Any]:
    """Load the model, run the evaluation, and write ``out/eval.json`` and
    ``out/figures/accuracy_vs_alpha`` and ``test_summary``.

    An encoder, or a layer the model does not have, is refused after the model is
    loaded and before ``out`` is created; ``out`` is replaced only with
    ``overwrite`` and only when ``eval-steering`` wrote it.

    Returns:
        What ``eval.json`` holds.
    """
    spec = ModelSpec(evaluation.model, dtype=evaluation.dtype, device=evaluation.device)
    status = make_console(stderr=True).status if progress else None
    with status(f"loading {evaluation.model}") if status else nullcontext():
        loaded = spec.load()
    require_causal(loaded)  # an encoder fails here, before out is created
    for layer in evaluation.layers or ():
        check_layer(layer, loaded.n_layers)
    out = prepare_steering_out(out, overwrite, "eval.json")
    result = evaluate_steering(loaded, **evaluation.protocol(), progress=progress)
    write_json_atomic(out / "eval.json", result)
    (out / "figures").mkdir(exist_ok=True)
    save(plot_accuracy(result), out / "figures" / "accuracy_vs_alpha")
    save(plot_test_summary(result), out / "figures" / "test_summary")
    return result

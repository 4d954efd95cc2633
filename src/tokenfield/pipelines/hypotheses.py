"""``tokenfield hypotheses``: the source material's other claims as measurements.

For a traced run (and its random-weight copy with ``baseline``) the run's model
is loaded, every prompt is run once more on its own (no padding, eager
attention), and three claims are measured (see ``docs/theory-lens.md``):

1. the depth "order" panel (:mod:`tokenfield.analysis.order`): ``E_beta`` at the
   fitted ``beta`` and at ``beta = 1, 4, 16``, the matrix entropy and the TwoNN
   dimension of every prompt's token cloud and of the last-token cloud, and the
   He-Su fuzziness of the last tokens by category, each with its log-linear
   slope, bootstrap interval over prompts, ``R^2``, monotone fraction and
   verdict;
2. attention as a convex fit (:mod:`tokenfield.analysis.convex_fit`), per layer
   and head, for two targets: the next token's input embedding and the block's
   actual update at ``t``;
3. the next token's embedding along depth (:mod:`tokenfield.analysis.next_embedding`).

:func:`write_hypotheses` writes ``hypotheses.json`` (atomically).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tokenfield._io import to_jsonable, write_atomic, write_json_atomic
from tokenfield._version import __version__
from tokenfield.analysis.convex_fit import ALPHA, head_test, layer_summary, prompt_gaps
from tokenfield.analysis.effective_beta import effective_beta
from tokenfield.analysis.next_embedding import next_embedding_curve
from tokenfield.analysis.order import BETAS, LINEAR_PACE_RULE, order_panel
from tokenfield.errors import ParameterError, UserError
from tokenfield.prompts import Prompt
from tokenfield.runs import (
    HYPOTHESES_HTML,
    HYPOTHESES_JSON,
    check_results_writable,
    check_writable_dir,
    read_run_info,
)

__all__ = [
    "HYPOTHESES_JSON",
    "HypothesesSettings",
    "hypotheses",
    "measure_model",
    "write_hypotheses",
]

TARGETS = ("next_embedding", "block_update")


@dataclass(frozen=True)
class HypothesesSettings:
    """What the measurements use.

    Attributes:
        max_prompts: at most this many prompts (the first ones, taken evenly
            across categories); ``None``: all.
        convex_prompts: at most this many of them for the convex fit (the
            costliest part: one exact NNLS per position pair, layer and head).
        bootstrap: bootstrap resamples of prompts for the order panel's slopes.
        shuffles: target shuffles per head (the shuffle null).
        flips: sign flips over prompts (the uniform null).
        random_tokens: random vocabulary tokens for the next-embedding ranks.
        betas: the fixed grid of ``E_beta``.
        seed: every random draw.

    Example:
        >>> settings = tf.HypothesesSettings(max_prompts=20, bootstrap=200)
        >>> settings.max_prompts, settings.betas
        (20, (1.0, 4.0, 16.0))
    """

    max_prompts: int | None = None
    convex_prompts: int | None = 40
    bootstrap: int = 1000
    shuffles: int = 199
    flips: int = 999
    random_tokens: int = 1000
    betas: tuple[float, ...] = BETAS
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("bootstrap", "shuffles", "flips", "random_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ParameterError(
                    name, f"{{name}} must be a positive integer, not {value!r}", "pass {name} >= 1"
                )
        for name in ("max_prompts", "convex_prompts"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 2):
                raise ParameterError(
                    name, f"{{name}} must be at least 2, not {value!r}", "pass {name} >= 2"
                )
        if not self.betas or any(not math.isfinite(b) or b < 0 for b in self.betas):
            raise ParameterError(
                "betas", f"{{name}} must be finite and >= 0, not {self.betas}", "pass betas >= 0"
            )


def _even_subset(prompts: Sequence[Prompt], limit: int | None) -> list[int]:
    """The first ``limit`` prompt indices taken round-robin across categories (in order)."""
    if limit is None or limit >= len(prompts):
        return list(range(len(prompts)))
    by_category: dict[str, list[int]] = {}
    for index, prompt in enumerate(prompts):
        by_category.setdefault(prompt.category, []).append(index)
    chosen: list[int] = []
    queues = [list(v) for v in by_category.values()]
    while len(chosen) < limit:
        for queue in queues:
            if queue and len(chosen) < limit:
                chosen.append(queue.pop(0))
    return sorted(chosen)


def measure_model(
    model: Any,
    prompts: Sequence[Prompt],
    settings: HypothesesSettings = HypothesesSettings(),
    *,
    progress: Callable[[str], Any] | None = None,
) -> dict[str, Any]:
    """All three measurements for one loaded model on ``prompts``.

    Returns:
        ``{"model", "tied_embeddings", "n_prompts", "fitted_beta", "order",
        "convex_fit", "next_embedding"}`` (JSON-ready).
    """
    from tokenfield.models.batching import encode_prompts
    from tokenfield.models.heads import embedding_rows, prompt_internals, tied_embeddings

    say = progress or (lambda _m: None)
    chosen = _even_subset(prompts, settings.max_prompts)
    prompts = [prompts[i] for i in chosen]
    encoded = [e.ids for e in encode_prompts(model, prompts)]
    keep = [i for i, ids in enumerate(encoded) if len(ids) >= 3]
    if len(keep) < 2:
        raise UserError("fewer than 2 prompts have 3 or more tokens", "give longer prompts")
    prompts = [prompts[i] for i in keep]
    encoded = [encoded[i] for i in keep]
    convex = set(_even_subset(prompts, settings.convex_prompts))
    blocks = model.n_layers
    clouds, next_ids = [], []
    gaps: dict[str, list[list[list[Any]]]] = {}
    for number, ids in enumerate(encoded):
        internals = prompt_internals(model, ids, vertices=number in convex)
        x = internals.states  # (T, n, d)
        clouds.append(x)
        next_ids.append(np.asarray(ids[1:]))
        if internals.vertices is not None:
            heads = internals.attention.shape[1]
            if not gaps:
                gaps = {t: [[[] for _ in range(heads)] for _ in range(blocks)] for t in TARGETS}
            for block in range(blocks):
                targets = {
                    "next_embedding": x[0, 1:],  # e_{t+1}: the input of block 0 at t + 1
                    "block_update": x[block + 1] - x[block],
                }
                for name, target in targets.items():
                    for head in range(heads):
                        gaps[name][block][head].append(
                            prompt_gaps(
                                internals.vertices[block, head],
                                internals.attention[block, head],
                                target,
                            )
                        )
        say(f"prompt {number + 1}/{len(encoded)}")
    # the fitted beta: the identity-field effective beta of every layer (causal)
    fit = effective_beta(
        np.concatenate([clouds[i] for i in sorted(convex)], axis=1),
        np.concatenate([np.full(clouds[i].shape[1], i) for i in sorted(convex)]),
        causal=True,
    )
    betas = fit.column("beta")
    finite = betas[np.isfinite(betas)]
    fitted = float(np.median(finite)) if finite.size else float("nan")
    say("order panel")
    labels = np.array([p.category for p in prompts])
    last = np.stack([c[:, -1] for c in clouds], axis=1)  # (T, P, d)
    panel = order_panel(
        clouds,
        last=last,
        labels=labels if np.unique(labels).size >= 2 else None,
        betas=settings.betas,
        fitted_beta=fitted,
        n_boot=settings.bootstrap,
        seed=settings.seed,
    )
    say("convex fit")
    convex_out: dict[str, Any] = {}
    for name in TARGETS:
        layers = []
        for block in range(blocks):
            tests = [
                head_test(
                    head_gaps,
                    n_shuffles=settings.shuffles,
                    n_flips=settings.flips,
                    seed=settings.seed + 1000 * block + head,
                )
                for head, head_gaps in enumerate(gaps[name][block])
            ]
            layers.append(layer_summary(tests))
        convex_out[name] = layers
    say("next-token embedding")
    rng = np.random.default_rng(settings.seed)
    vocab = int(model.sites.embed_tokens.weight.shape[0])
    random_ids = rng.choice(vocab, size=min(settings.random_tokens, vocab), replace=False)
    cache: dict[int, np.ndarray] = {}

    def embed(ids: np.ndarray) -> np.ndarray:
        missing = sorted({int(i) for i in np.asarray(ids)} - cache.keys())
        if missing:
            for i, row in zip(missing, embedding_rows(model, missing), strict=True):
                cache[i] = row
        return np.stack([cache[int(i)] for i in np.asarray(ids)])

    curve = next_embedding_curve(clouds, next_ids, embed, random_ids)
    return {
        "model": model.run_config(),
        "tied_embeddings": tied_embeddings(model),
        "n_prompts": len(prompts),
        "n_prompts_convex_fit": len(convex),
        "fitted_beta": {"per_layer": betas.tolist(), "median": fitted},
        "order": {name: result.to_dict() for name, result in panel.items()},
        "convex_fit": {
            "alpha": ALPHA,
            "correction": "Holm over the heads of each layer",
            "scale": "one non-negative scale c per position (NNLS: b = c a)",
            "targets": convex_out,
        },
        "next_embedding": curve.to_dict(),
    }


def _run_prompts(run: str | Path) -> tuple[dict[str, Any], list[Prompt]]:
    info = read_run_info(run)
    if info.kind != "trace":
        raise UserError(
            f"run '{run}' is a {info.kind}, not a trace", "pass a run made by tokenfield trace"
        )
    if info.config.get("chat"):
        raise UserError(
            f"run '{run}' was traced with --chat", "trace the prompts without --chat for this"
        )
    raw = info.config.get("prompts") or []
    prompts = [Prompt(str(p.get("text", "")), str(p.get("category", ""))) for p in raw]
    if len(prompts) < 2:
        raise UserError(f"run '{run}' has fewer than 2 prompts", "trace at least 2 prompts")
    return info.config, prompts


def hypotheses(
    run: str | Path,
    *,
    baseline: str | Path | None = None,
    settings: HypothesesSettings = HypothesesSettings(),
    model: Any = None,
    baseline_model: Any = None,
    progress: Callable[[str], Any] | None = None,
) -> dict[str, Any]:
    """Measure a traced run's model (and a baseline run's, e.g. its random copy).

    Args:
        run: a traced run (its model and prompts are used; positions do not matter).
        baseline: another run of the same prompts (e.g. ``--random-weights``).
        settings: :class:`HypothesesSettings`.
        model: an already loaded model to use instead of loading the run's.
        baseline_model: likewise for the baseline run.
        progress: called with a line of text as each measurement starts.

    Returns:
        The ``hypotheses.json`` content: ``order``, ``convex_fit``,
        ``next_embedding`` and the others of :func:`measure_model`, plus
        ``baseline`` (the same for the baseline) when given.

    Example:
        >>> result = tf.hypotheses("runs/categories", baseline="runs/categories-random",
        ...                        settings=tf.HypothesesSettings(max_prompts=20))  # doctest: +SKIP
        >>> tf.write_hypotheses(result, "runs/categories")                          # doctest: +SKIP
        PosixPath('runs/categories/hypotheses.json')
    """
    from tokenfield.models.load import ModelSpec

    config, prompts = _run_prompts(run)
    if baseline is not None:
        _, other = _run_prompts(baseline)
        if [p.text for p in other] != [p.text for p in prompts]:
            raise UserError(
                f"runs '{run}' and '{baseline}' trace different prompts",
                "pass a baseline traced from the same prompts",
            )
    say = progress or (lambda _m: None)
    if model is None:
        model = ModelSpec.from_run(config).load()
    result = {
        "tokenfield_version": __version__,
        "run": str(run),
        "rule": LINEAR_PACE_RULE,
        "settings": to_jsonable(asdict(settings)),
        **measure_model(model, prompts, settings, progress=lambda m: say(f"model: {m}")),
    }
    if baseline is not None:
        if baseline_model is None:
            baseline_model = ModelSpec.from_run(read_run_info(baseline).config).load()
        result["baseline"] = {
            "run": str(baseline),
            **measure_model(
                baseline_model, prompts, settings, progress=lambda m: say(f"baseline: {m}")
            ),
        }
    return result


def check_out(out: str | Path) -> Path:
    """Refuse, before any model loads, an output directory that is a file or that
    cannot be written (one line, exit 2 through the CLI)."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UserError(f"'{out}' is a file, not a directory", "pass a directory for --out")
    if out.is_dir():
        check_results_writable(out, "hypotheses")
    else:
        check_writable_dir(out)
    return out


def write_hypotheses(result: dict[str, Any], out: str | Path) -> Path:
    """Write ``out/hypotheses.json`` and the report fragment ``out/hypotheses.html``
    (``tokenfield report RUN --section RUN/hypotheses.html``) atomically (``out`` is
    created if missing).

    Args:
        result: what :func:`hypotheses` returned.
        out: the directory to write into.

    Returns:
        The path of ``hypotheses.json``.

    Example:
        >>> result = tf.hypotheses("runs/categories")          # doctest: +SKIP
        >>> tf.write_hypotheses(result, "runs/categories")     # doctest: +SKIP
        PosixPath('runs/categories/hypotheses.json')
    """
    out = check_out(out)
    out.mkdir(parents=True, exist_ok=True)
    from tokenfield.viz.hypotheses import hypotheses_html_section

    path = out / HYPOTHESES_JSON
    data = to_jsonable(result)
    write_json_atomic(path, data)
    write_atomic(out / HYPOTHESES_HTML, (hypotheses_html_section(data) + "\n").encode())
    return path

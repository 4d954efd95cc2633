"""Real transformers through the lens of the theory: every section on one run.

:func:`theory_lens` measures a traced run the way the mean-field theory would
(seeds 002-004) and returns one :class:`TheoryLens`:

- **clouds** (:mod:`~tokenfield.analysis.clouds`): per layer, the mean pairwise
  cosine, cluster count and masses (the simulator's own counter) and spread of
  each prompt's tokens; the same for a baseline run (a random-weight copy) and
  for the simulator started from the run's own layer-0 token states;
- **attention** (:mod:`~tokenfield.analysis.markov`): entropy, sink mass,
  ``|lambda_2|`` and gap per layer and head (runs traced with ``attention=True``);
- **effective beta** (:mod:`~tokenfield.analysis.effective_beta`): per layer, the
  ``beta`` and step of the idealised attention flow (Q = K = V = I) that best
  explain the layer's update, and how much they explain; given the model, also
  with the layer's own heads;
- **probes** (:mod:`~tokenfield.analysis.probes`): category accuracy from the
  last token and from the token mean, against a permutation null;
- **logit lens** (:mod:`~tokenfield.analysis.lens`) when the run has one.

Sections a run cannot support (``positions="last"`` has no clouds, a run
without categories has no probes, ...) are skipped with a note saying why.
:func:`write_theory` writes ``RUN/theory.json`` and ``RUN/figures/theory_*.png``.
"""

from __future__ import annotations

import html
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from tokenfield.analysis.clouds import TokenClouds, token_clouds
from tokenfield.analysis.clusters import DEFAULT_EPS
from tokenfield.analysis.effective_beta import EffectiveBeta, effective_beta
from tokenfield.analysis.lens import LogitLens, logit_lens_summary
from tokenfield.analysis.markov import AttentionByLayer, attention_by_layer
from tokenfield.analysis.probes import (
    ProbeCurve,
    last_token_features,
    pooled_features,
    probe_accuracy,
)
from tokenfield.errors import UserError
from tokenfield.runs import FIGURES, open_run, read_run_info, write_json_atomic

__all__ = [
    "THEORY_HTML",
    "THEORY_JSON",
    "TheoryLens",
    "model_of_run",
    "simulate_from_run",
    "theory_lens",
    "write_theory",
]

THEORY_JSON = "theory.json"
THEORY_HTML = "theory.html"


@dataclass(frozen=True)
class SimulatedClouds:
    """The simulator started from the run's layer-0 tokens, one system per prompt.

    ``clouds.time`` is the layer index ``l``; the simulated time is ``l * dt``.
    """

    clouds: TokenClouds
    beta: float
    dt: float
    source: str  # how beta and dt were chosen

    def to_dict(self) -> dict[str, Any]:
        return {"beta": self.beta, "dt": self.dt, "source": self.source, **self.clouds.to_dict()}


@dataclass(frozen=True)
class TheoryLens:
    """Everything :func:`theory_lens` measured (``None``: skipped, see ``notes``)."""

    info: dict[str, Any]
    clouds: TokenClouds | None = None
    baseline_clouds: TokenClouds | None = None
    simulated: SimulatedClouds | None = None
    attention: AttentionByLayer | None = None
    baseline_attention: AttentionByLayer | None = None
    beta: EffectiveBeta | None = None
    baseline_beta: EffectiveBeta | None = None
    beta_heads: EffectiveBeta | None = None
    baseline_beta_heads: EffectiveBeta | None = None
    probes: dict[str, ProbeCurve] = field(default_factory=dict)
    baseline_probes: dict[str, ProbeCurve] = field(default_factory=dict)
    lens: LogitLens | None = None
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        def dump(value: Any) -> Any:
            return None if value is None else value.to_dict()

        return {
            "info": self.info,
            "notes": self.notes,
            "clouds": dump(self.clouds),
            "baseline_clouds": dump(self.baseline_clouds),
            "simulated_clouds": dump(self.simulated),
            "attention": dump(self.attention),
            "baseline_attention": dump(self.baseline_attention),
            "effective_beta": dump(self.beta),
            "baseline_effective_beta": dump(self.baseline_beta),
            "effective_beta_heads": dump(self.beta_heads),
            "baseline_effective_beta_heads": dump(self.baseline_beta_heads),
            "probes": {k: v.to_dict() for k, v in self.probes.items()},
            "baseline_probes": {k: v.to_dict() for k, v in self.baseline_probes.items()},
            "logit_lens": dump(self.lens),
        }


def _is_all(ds: xr.Dataset) -> bool:
    return "is_last" in ds.coords and not bool(np.asarray(ds["is_last"].values).all())


def _causal(ds: xr.Dataset) -> bool:
    model = ds.attrs.get("run", {}).get("config", {}).get("model", {})
    return model.get("family", "llama") != "bert"


def _probes(ds: xr.Dataset, permutations: int, seed: int, notes: list[str], tag: str):
    out: dict[str, ProbeCurve] = {}
    categories = np.asarray(ds["category"].values) if "category" in ds.coords else None
    if categories is None or np.unique(categories[categories != ""]).size < 2:
        notes.append(f"{tag}probes skipped: the prompts have fewer than two categories")
        return out
    time = np.asarray(ds["time"].values)
    features, labels = last_token_features(ds)
    out["last"] = probe_accuracy(features, labels, time=time, permutations=permutations, seed=seed)
    if _is_all(ds):
        features, labels = pooled_features(ds)
        out["pooled"] = probe_accuracy(
            features, labels, time=time, permutations=permutations, seed=seed
        )
    else:
        notes.append(f"{tag}pooled probe skipped: positions=last keeps no other tokens")
    return out


def _pick_simulation(beta: EffectiveBeta | None) -> tuple[float, float, str]:
    """The median fitted beta and step over layers whose fit explains anything."""
    if beta is not None:
        r2 = beta.column("r2")
        ok = (r2 > 0.01) & np.isfinite(beta.column("beta"))
        if ok.any():
            b = float(np.median(beta.column("beta")[ok]))
            h = float(np.median(beta.column("step")[ok]))
            if h > 0:
                return b, h, "median effective beta and step over layers with R^2 > 0.01"
    return 1.0, 0.1, "default (no usable effective-beta fit)"


def _heads_fit(ds: xr.Dataset, model: Any, causal: bool) -> EffectiveBeta:
    from tokenfield.models.attention import head_inputs

    layers = ds.sizes["time"] - 1
    if model.n_layers != layers:
        raise UserError(
            f"the model has {model.n_layers} blocks but the run has {layers} layers",
            "pass the model that made the run",
        )
    return effective_beta(ds, causal=causal, heads=lambda t, x: head_inputs(model, t, x))


def model_of_run(run: str | Path) -> Any:
    """Load the model named in a trace run's config (random weights and seed included)."""
    from tokenfield.models.load import ModelSpec

    config = read_run_info(run).config
    if not config.get("model", {}).get("name"):
        raise UserError(f"run '{run}' names no model")
    return ModelSpec.from_run(config).load()


def simulate_from_run(
    run: str | Path,
    ds: xr.Dataset,
    *,
    beta: float,
    dt: float,
    causal: bool,
    eps: float,
    more_eps: tuple[float, ...] = (),
) -> TokenClouds:
    """Simulate ``dx/dt = P^perp sum_j softmax_j(beta <x_i, x_j>) x_j`` from each
    prompt's layer-0 tokens (``tokenfield simulate --init run:RUN``), one Euler
    step of ``dt`` per layer, and measure the clouds per layer."""
    from tokenfield.particles.dynamics import Dynamics
    from tokenfield.particles.init import initial_condition
    from tokenfield.particles.integrate import simulate

    layers = ds.sizes["time"] - 1
    dynamics = Dynamics(beta=beta, causal=causal)
    frames, groups = [], []
    for prompt in np.unique(ds["prompt_index"].values):
        x0 = initial_condition(f"run:{run}", None, None, prompt_index=int(prompt))
        result = simulate(dynamics, x0, t_max=layers * dt, dt=dt, solver="euler")
        states = result["states"].values  # (layers + 1, n, d)
        if states.shape[0] != layers + 1:
            raise RuntimeError(f"expected {layers + 1} saved frames, got {states.shape[0]}")
        frames.append(states)
        groups.extend([int(prompt)] * states.shape[1])
    clouds = token_clouds(
        np.concatenate(frames, axis=1), np.asarray(groups), eps=eps, more_eps=more_eps
    )
    return TokenClouds(
        np.asarray(ds["time"].values), clouds.groups, clouds.values, clouds.masses, eps
    )


def theory_lens(
    run: str | Path,
    *,
    baseline: str | Path | None = None,
    simulate: bool = False,
    eps: float = DEFAULT_EPS,
    more_eps: tuple[float, ...] = (0.1, 0.3),
    permutations: int = 20,
    seed: int = 0,
    sim_beta: float | None = None,
    sim_dt: float | None = None,
    model: Any = None,
    baseline_model: Any = None,
    progress: Callable[[str, int], Any] | None = None,
) -> TheoryLens:
    """Measure a traced run against the mean-field theory (see the module docstring).

    Args:
        run: a trace run (``positions="all"`` for clouds, beta and pooled probes;
            ``attention=True`` for the attention section; ``logit_lens=True``
            for the lens).
        baseline: a trace of the same prompts by a random-weight copy
            (``tokenfield trace --random-weights``), measured the same way.
        simulate: also run the simulator from the run's layer-0 token states.
        eps: cluster threshold (the simulator's default).
        more_eps: coarser thresholds for extra cluster counts.
        permutations: label shuffles of the probes' null.
        seed: probe folds and shuffles.
        sim_beta, sim_dt: the simulation's beta and step (default: the median
            fitted effective beta and step).
        model, baseline_model: the loaded models that made the runs
            (llama family); given, the effective beta is also fitted with each
            layer's own heads (:func:`tokenfield.models.attention.head_inputs`).
        progress: called as ``progress(label, total)`` before each of the ``total``
            measurements (for a progress bar).
    """
    info_run = read_run_info(run)
    if info_run.kind != "trace":
        raise UserError(
            f"'{run}' is a {info_run.kind} run", "pass a run made by 'tokenfield trace'"
        )
    ds = open_run(run).load()
    causal = _causal(ds)
    notes: list[str] = []
    info = {
        "run": str(run),
        "model": info_run.config.get("model", {}),
        "positions": info_run.config.get("positions"),
        "prompts": int(np.unique(ds["prompt_index"].values).size),
        "causal": causal,
        "eps": eps,
        "permutations": permutations,
        "baseline": None if baseline is None else str(baseline),
    }
    parts: dict[str, Any] = {}
    base = None
    if baseline is not None:
        if read_run_info(baseline).kind != "trace":
            raise UserError(f"baseline '{baseline}' is not a trace run")
        base = open_run(baseline).load()
    step = _stepper(progress, ds, base, simulate, model, baseline_model)
    if _is_all(ds):
        step("token clouds")
        parts["clouds"] = token_clouds(ds, eps=eps, more_eps=more_eps)
        step("effective beta")
        parts["beta"] = effective_beta(ds, causal=causal)
        if model is not None:
            step("effective beta, own heads")
            parts["beta_heads"] = _heads_fit(ds, model, causal)
        if base is not None and _is_all(base):
            step("baseline clouds")
            parts["baseline_clouds"] = token_clouds(base, eps=eps, more_eps=more_eps)
            step("baseline effective beta")
            parts["baseline_beta"] = effective_beta(base, causal=causal)
            if baseline_model is not None:
                step("baseline effective beta, own heads")
                parts["baseline_beta_heads"] = _heads_fit(base, baseline_model, causal)
        if simulate:
            beta, dt, source = _pick_simulation(parts["beta"])
            if sim_beta is not None or sim_dt is not None:
                beta = beta if sim_beta is None else float(sim_beta)
                dt = dt if sim_dt is None else float(sim_dt)
                source = "given"
            if not (math.isfinite(beta) and math.isfinite(dt) and dt > 0):
                raise UserError(f"bad simulation parameters beta={beta}, dt={dt}", "pass dt > 0")
            step("simulating")
            clouds = simulate_from_run(
                run, ds, beta=beta, dt=dt, causal=causal, eps=eps, more_eps=more_eps
            )
            parts["simulated"] = SimulatedClouds(clouds, beta, dt, source)
    else:
        notes.append(
            "clouds and effective beta skipped: the run keeps only the last token "
            "(trace with --positions all)"
        )
    if "attn_lambda2" in ds:
        step("attention")
        parts["attention"] = attention_by_layer(ds)
    else:
        notes.append("attention skipped: trace with --attention")
    if base is not None and "attn_lambda2" in base:
        step("baseline attention")
        parts["baseline_attention"] = attention_by_layer(base)
    step("probes")
    parts["probes"] = _probes(ds, permutations, seed, notes, "")
    if base is not None:
        step("baseline probes")
        parts["baseline_probes"] = _probes(base, permutations, seed, notes, "baseline ")
    if "lens_rank" in ds:
        step("logit lens")
        parts["lens"] = logit_lens_summary(ds)
    else:
        notes.append("logit lens skipped: trace with --logit-lens")
    return TheoryLens(info=info, notes=notes, **parts)


def _stepper(
    progress: Callable[[str, int], Any] | None,
    ds: xr.Dataset,
    base: xr.Dataset | None,
    simulate: bool,
    model: Any,
    baseline_model: Any,
) -> Callable[[str], None]:
    """``step(label)`` for :func:`theory_lens`, knowing how many steps there will be."""
    if progress is None:
        return lambda label: None
    total = 1 + (base is not None) + ("attn_lambda2" in ds) + ("lens_rank" in ds)
    total += base is not None and "attn_lambda2" in base
    if _is_all(ds):
        total += 2 + (model is not None) + bool(simulate)
        if base is not None and _is_all(base):
            total += 2 + (baseline_model is not None)
    return lambda label: progress(label, int(total))


def write_theory(run: str | Path, result: TheoryLens, *, figures: bool = True) -> Path:
    """Write ``RUN/theory.json``, the report fragment ``RUN/theory.html``
    (``tokenfield report --section RUN/theory.html``) and, with ``figures``,
    ``RUN/figures/theory_*.png``. Returns the JSON path."""
    from tokenfield.viz.theory import theory_html_section, write_theory_figures

    run = Path(run)
    target = run / THEORY_JSON
    data = _finite(result.to_json())
    write_json_atomic(target, data)
    title = f"<h2>{html.escape(run.name or str(run))}: through the lens of the theory</h2>"
    fragment = f"<section>{title}{theory_html_section(data)}</section>\n"
    tmp = run / f".{THEORY_HTML}.tmp"
    tmp.write_text(fragment, encoding="utf-8")
    os.replace(tmp, run / THEORY_HTML)
    if figures:
        write_theory_figures(result, run / FIGURES)
    return target


def _finite(value: Any) -> Any:
    """JSON has no NaN: write ``null``."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    if isinstance(value, np.generic):
        return _finite(value.item())
    return value

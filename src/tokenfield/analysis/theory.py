"""Real transformers through the lens of the theory: every section on one run.

:func:`tokenfield.pipelines.theory.theory_lens` measures a traced run the way the mean-field theory would
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
The workflow (:func:`tokenfield.pipelines.theory.theory_lens`, which opens the run and
may load its model, and ``write_theory``) is in :mod:`tokenfield.pipelines.theory`;
this module keeps the result types and the pure steps.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import xarray as xr

from tokenfield.analysis.clouds import TokenClouds
from tokenfield.analysis.effective_beta import EffectiveBeta
from tokenfield.analysis.lens import LogitLens
from tokenfield.analysis.markov import AttentionByLayer
from tokenfield.analysis.probes import (
    ProbeCurve,
    last_token_features,
    pooled_features,
    probe_accuracy,
)
from tokenfield.runs import THEORY_HTML, THEORY_JSON

__all__ = [
    "THEORY_HTML",
    "THEORY_JSON",
    "SimulatedClouds",
    "TheoryLens",
    "is_causal_run",
    "pick_simulation",
    "probe_curves",
    "traced_all_positions",
]


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
    """Everything :func:`theory_lens` measured (``None``: skipped, see ``notes``).

    Attributes:
        info: what was measured (run, model, sizes).
        clouds, baseline_clouds: :func:`token_clouds` of the run and of the baseline.
        simulated: the clouds of the simulator run from the layer-0 tokens.
        attention, baseline_attention: :func:`attention_by_layer` of each.
        beta, baseline_beta: :func:`effective_beta` with ``Q = K = V = I``.
        beta_heads, baseline_beta_heads: the same with each layer's own heads
            (needs the model).
        probes, baseline_probes: probe name -> :func:`probe_accuracy` curve.
        lens: :func:`logit_lens_summary`.
        notes: why a section was skipped.

    Example:
        >>> lens = tf.theory_lens("runs/spectrum")    # doctest: +SKIP
        >>> lens.beta.column("beta")                  # doctest: +SKIP
        >>> lens.notes                                # doctest: +SKIP
    """

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

    def to_dict(self) -> dict[str, Any]:
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

    to_json = to_dict  # the old name of the one serialisation verb


def traced_all_positions(ds: xr.Dataset) -> bool:
    """Whether the run kept every token (``positions="all"``), not only the last."""
    return "is_last" in ds.coords and not bool(np.asarray(ds["is_last"].values).all())


def is_causal_run(ds: xr.Dataset) -> bool:
    """Whether the run's model attends causally (every family but BERT)."""
    model = ds.attrs.get("run", {}).get("config", {}).get("model", {})
    return model.get("family", "llama") != "bert"


def probe_curves(ds: xr.Dataset, permutations: int, seed: int, notes: list[str], tag: str):
    """The category probes of a run (last token, and token mean when every token
    was kept), by name; skipped with a note (prefixed ``tag``) without two categories."""
    out: dict[str, ProbeCurve] = {}
    categories = np.asarray(ds["category"].values) if "category" in ds.coords else None
    if categories is None or np.unique(categories[categories != ""]).size < 2:
        notes.append(f"{tag}probes skipped: the prompts have fewer than two categories")
        return out
    time = np.asarray(ds["time"].values)
    features, labels = last_token_features(ds)
    out["last"] = probe_accuracy(features, labels, time=time, permutations=permutations, seed=seed)
    if traced_all_positions(ds):
        features, labels = pooled_features(ds)
        out["pooled"] = probe_accuracy(
            features, labels, time=time, permutations=permutations, seed=seed
        )
    else:
        notes.append(f"{tag}pooled probe skipped: positions=last keeps no other tokens")
    return out


def pick_simulation(beta: EffectiveBeta | None) -> tuple[float, float, str]:
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

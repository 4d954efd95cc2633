"""tokenfield: transformers as dynamical systems.

Depth is time, tokens are particles. Trace a real model's residual stream layer
by layer, simulate self-attention as interacting particles on the sphere, and
measure both with the same tools.

The public API is re-exported here and imported lazily, so ``import tokenfield``
and ``tokenfield --help`` stay fast (torch is only imported when needed).
"""

from __future__ import annotations

import importlib
from typing import Any

from tokenfield._version import __version__

# name -> module that defines it
_EXPORTS: dict[str, str] = {
    "UserError": "tokenfield.errors",
    "open_run": "tokenfield.runs",
    "read_run_info": "tokenfield.runs",
    "RunWriter": "tokenfield.runs",
    "load_model": "tokenfield.models.load",
    "wrap_model": "tokenfield.models.load",
    "LoadedModel": "tokenfield.models.load",
    "ModelSpec": "tokenfield.models.load",
    "list_bundled_models": "tokenfield.models.load",
    "trace": "tokenfield.pipelines.trace",
    "TraceConfig": "tokenfield.models.trace_config",
    "Prompt": "tokenfield.prompts",
    "load_prompts": "tokenfield.prompts",
    "Dynamics": "tokenfield.particles.dynamics",
    "Mlp": "tokenfield.particles.dynamics",
    "random_matrices": "tokenfield.particles.dynamics",
    "simulate": "tokenfield.particles.integrate",
    "SaveAt": "tokenfield.particles.integrate",
    "Euler": "tokenfield.particles.integrate",
    "RK4": "tokenfield.particles.integrate",
    "Adaptive": "tokenfield.particles.integrate",
    "initial_condition": "tokenfield.particles.init",
    "energy": "tokenfield.analysis.energy",
    "cluster_count": "tokenfield.analysis.clusters",
    "clusters": "tokenfield.analysis.clusters",
    "Clusters": "tokenfield.analysis.clusters",
    "cluster_masses": "tokenfield.analysis.clusters",
    "diameter": "tokenfield.analysis.clusters",
    "min_inner_product": "tokenfield.analysis.clusters",
    "plateaus": "tokenfield.analysis.clusters",
    "merge_times": "tokenfield.analysis.clusters",
    "analyze_simulation": "tokenfield.analysis.simulation",
    "analyze": "tokenfield.analysis.run_analysis",
    "analyze_run": "tokenfield.pipelines.analyze",
    "attractors": "tokenfield.pipelines.attractors",
    "RunAnalysis": "tokenfield.analysis.run_analysis",
    "fit_projection": "tokenfield.analysis.projection",
    "load_projection": "tokenfield.analysis.projection",
    "project": "tokenfield.analysis.projection",
    "Projection": "tokenfield.analysis.projection",
    "depth_ordering": "tokenfield.analysis.projection",
    "kinematics": "tokenfield.analysis.kinematics",
    "separation": "tokenfield.analysis.separation",
    "bifurcation": "tokenfield.analysis.separation",
    "centroid_distances": "tokenfield.analysis.separation",
    "write_report": "tokenfield.pipelines.report",
    "growth_rates": "tokenfield.meanfield.stability",
    "stability_spectrum": "tokenfield.meanfield.stability",
    "most_unstable_mode": "tokenfield.meanfield.stability",
    "k_max_curve": "tokenfield.meanfield.stability",
    "StabilitySpectrum": "tokenfield.meanfield.stability",
    "CirclePDE": "tokenfield.meanfield.pde",
    "pde_vs_particles": "tokenfield.meanfield.convergence",
    "cluster_prediction": "tokenfield.meanfield.predict",
    "growth_rate_experiment": "tokenfield.meanfield.predict",
    "PhaseDiagramConfig": "tokenfield.meanfield.phase",
    "phase_diagram": "tokenfield.meanfield.phase",
    "metastability": "tokenfield.meanfield.metastability",
    "MetastabilityConfig": "tokenfield.meanfield.metastability",
    "PlateauConfig": "tokenfield.meanfield.predict",
    "GrowthConfig": "tokenfield.meanfield.predict",
    "theory_lens": "tokenfield.pipelines.theory",
    "write_theory": "tokenfield.pipelines.theory",
    "TheoryLens": "tokenfield.analysis.theory",
    "token_clouds": "tokenfield.analysis.clouds",
    "effective_beta": "tokenfield.analysis.effective_beta",
    "fit_beta": "tokenfield.analysis.effective_beta",
    "probe_accuracy": "tokenfield.analysis.probes",
    "summarize_attention": "tokenfield.analysis.markov",
    "attention_by_layer": "tokenfield.analysis.markov",
    "stationary_distribution": "tokenfield.analysis.markov",
    "logit_lens_summary": "tokenfield.analysis.lens",
    "attention_matrices": "tokenfield.models.attention",
    # the source material's other hypotheses (issue 24)
    "hypotheses": "tokenfield.pipelines.hypotheses",
    "write_hypotheses": "tokenfield.pipelines.hypotheses",
    "HypothesesSettings": "tokenfield.pipelines.hypotheses",
    "order_panel": "tokenfield.analysis.order",
    "convex_fit": "tokenfield.analysis.convex_fit",
    "next_embedding_curve": "tokenfield.analysis.next_embedding",
}

__all__ = ["__version__", *_EXPORTS]

# submodules reached as attributes, e.g. ``tokenfield.plot.paths(...)`` (figures in Jupyter)
_SUBMODULES = ("plot",)


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"tokenfield.{name}")
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'tokenfield' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*__all__, *_SUBMODULES])

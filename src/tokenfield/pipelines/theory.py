"""The theory-lens workflow of ``tokenfield lens``: open the run, load its model,
simulate the matched ideal system, measure (:mod:`tokenfield.analysis.theory` and the
modules it names), write ``theory.json``, ``theory.html`` and the figures.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from tokenfield._io import to_jsonable, write_atomic, write_json_atomic
from tokenfield.analysis.clouds import TokenClouds, token_clouds
from tokenfield.analysis.clusters import DEFAULT_EPS
from tokenfield.analysis.effective_beta import EffectiveBeta, effective_beta
from tokenfield.analysis.lens import logit_lens_summary
from tokenfield.analysis.markov import attention_by_layer
from tokenfield.analysis.theory import (
    THEORY_HTML,
    THEORY_JSON,
    SimulatedClouds,
    TheoryLens,
    is_causal_run,
    pick_simulation,
    probe_curves,
    traced_all_positions,
)
from tokenfield.errors import UserError
from tokenfield.models.attention import head_inputs
from tokenfield.models.load import ModelSpec
from tokenfield.particles.dynamics import Dynamics
from tokenfield.particles.init import initial_condition
from tokenfield.particles.integrate import simulate
from tokenfield.runs import FIGURES, open_run, read_run_info
from tokenfield.viz.theory import theory_html_section, write_theory_figures

__all__ = [
    "LensSettings",
    "lens_settings",
    "model_of_run",
    "simulate_from_run",
    "theory_lens",
    "write_theory",
]

#: The defaults of the settings a lens run records (``info["settings"]`` of theory.json).
DEFAULT_SETTINGS: dict[str, Any] = {
    "eps": DEFAULT_EPS,
    "more_eps": [0.1, 0.3],
    "permutations": 20,
    "seed": 0,
}
#: Flags of the settings, for the messages.
_FLAGS = {"eps": "--eps", "more_eps": "--more-eps", "permutations": "--permutations",
          "seed": "--seed", "baseline": "--baseline", "sim_beta": "--sim-beta",
          "sim_dt": "--sim-dt"}  # fmt: skip


@dataclass(frozen=True)
class LensSettings:
    """What one ``tokenfield lens`` measures: the request merged with the run's
    earlier ``theory.json`` (see :func:`lens_settings`).

    Attributes:
        eps, more_eps, permutations, seed: the measurement's settings.
        baseline: the random-weight run, or ``None``.
        simulate, sim_beta, sim_dt: the simulation and its given beta and step.
        heads: fit the effective beta with each layer's own heads.
        measure: whether theory.json is measured (``False``: it is kept as it is,
            e.g. ``lens RUN --flow`` adds only the flow).
        kept: what an earlier theory.json contributed (for a note), e.g.
            ``["--baseline runs/s-rw", "--permutations 50"]``.
    """

    eps: float
    more_eps: tuple[float, ...]
    permutations: int
    seed: int
    baseline: str | None = None
    simulate: bool = False
    sim_beta: float | None = None
    sim_dt: float | None = None
    heads: bool = False
    measure: bool = True
    kept: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "eps": self.eps,
            "more_eps": list(self.more_eps),
            "permutations": self.permutations,
            "seed": self.seed,
            "baseline": self.baseline,
            "simulate": self.simulate,
            "sim_beta": self.sim_beta,
            "sim_dt": self.sim_dt,
            "heads": self.heads,
        }

    def lens_arguments(self) -> dict[str, Any]:
        """The keyword arguments of :func:`theory_lens` these settings give (the
        rest, ``model``, ``baseline_model`` and ``progress``, are the caller's)."""
        arguments = self.to_dict()  # every recorded setting but heads is an argument
        del arguments["heads"]  # the CLI loads the models for it: model=, baseline_model=
        arguments["more_eps"] = self.more_eps
        return arguments


def _recorded_settings(theory: dict[str, Any]) -> dict[str, Any]:
    """The settings of an earlier theory.json: ``info["settings"]``, or (a file from
    before it was recorded) what its sections show."""
    info = theory.get("info") or {}
    if isinstance(info.get("settings"), dict):
        return dict(info["settings"])
    recorded: dict[str, Any] = {
        "eps": info.get("eps", DEFAULT_EPS),
        "permutations": info.get("permutations", 20),
        "seed": 0,
        "baseline": info.get("baseline"),
        "heads": theory.get("effective_beta_heads") is not None,
        "simulate": theory.get("simulated_clouds") is not None,
    }
    means = (theory.get("clouds") or {}).get("mean") or {}
    extra = sorted(float(k.split("@")[1]) for k in means if k.startswith("cluster_count@"))
    recorded["more_eps"] = extra if means else DEFAULT_SETTINGS["more_eps"]
    simulated = theory.get("simulated_clouds") or {}
    if simulated.get("source") == "given":
        recorded["sim_beta"], recorded["sim_dt"] = simulated.get("beta"), simulated.get("dt")
    return recorded


def _shown(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return ",".join(f"{v:g}" for v in value) or "''"
    return f"{value:g}" if isinstance(value, float) else str(value)


def lens_settings(
    run: str | Path,
    *,
    eps: float | None = None,
    more_eps: tuple[float, ...] | None = None,
    permutations: int | None = None,
    seed: int | None = None,
    baseline: str | Path | None = None,
    simulate: bool = False,
    sim_beta: float | None = None,
    sim_dt: float | None = None,
    heads: bool = False,
    flow: bool = False,
    overwrite: bool = False,
) -> LensSettings:
    """What ``tokenfield lens`` measures: it adds to a run, it does not replace.

    Without ``overwrite``, an earlier ``RUN/theory.json`` is kept whole: its
    baseline, simulation and own-heads sections are measured again with their
    recorded settings (the measurements are deterministic, so they come back the
    same), and a setting not given is the recorded one. A given setting that
    differs from the recorded one is refused (``overwrite`` measures afresh with
    only what is given). With only ``flow`` asked for and a theory.json there, the
    theory is not measured at all: the flow goes into its own files.

    Arguments are the CLI's, ``None`` for "not given".

    Raises:
        UserError: a setting that contradicts the recorded one.
    """
    given = {"eps": eps, "more_eps": None if more_eps is None else list(more_eps),
             "permutations": permutations, "seed": seed,
             "baseline": None if baseline is None else str(baseline),
             "sim_beta": sim_beta, "sim_dt": sim_dt}  # fmt: skip
    recorded: dict[str, Any] = {}
    path = Path(run) / THEORY_JSON
    if path.is_file() and not overwrite:
        try:
            theory = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            theory = None  # unreadable: measured afresh (write_theory replaces it)
        if isinstance(theory, dict):
            recorded = _recorded_settings(theory)
    kept: list[str] = []
    merged: dict[str, Any] = {}
    for name, value in given.items():
        old = recorded.get(name)
        if name in ("sim_beta", "sim_dt") and not (simulate or recorded.get("simulate")):
            old = None
        if value is not None and old is not None and not _same(value, old):
            flag = _FLAGS[name]
            raise UserError(
                f"'{path}' was measured with {flag} {_shown(old)}, and this asks for "
                f"{flag} {_shown(value)}",
                f"pass {flag} {_shown(old)} (or leave it out) to add to it, or --overwrite "
                f"to measure it again with {flag} {_shown(value)} and only the options given",
            )
        if value is None and old is not None:
            merged[name] = old
            if name == "baseline" or old != DEFAULT_SETTINGS.get(name, old):
                kept.append(f"{_FLAGS[name]} {_shown(old)}")
        else:
            merged[name] = value if value is not None else DEFAULT_SETTINGS.get(name)
    for name, asked in (("simulate", simulate), ("heads", heads)):
        if not asked and recorded.get(name):
            kept.append(f"--{name}")
    adds = bool(
        (simulate and not recorded.get("simulate"))
        or (heads and not recorded.get("heads"))
        or (baseline is not None and not recorded.get("baseline"))
        or any(given[k] is not None for k in ("eps", "more_eps", "permutations", "seed"))
    )
    return LensSettings(
        eps=float(merged["eps"]),
        more_eps=tuple(float(v) for v in merged["more_eps"]),
        permutations=int(merged["permutations"]),
        seed=int(merged["seed"]),
        baseline=merged["baseline"],
        simulate=bool(simulate or recorded.get("simulate")),
        sim_beta=merged["sim_beta"],
        sim_dt=merged["sim_dt"],
        heads=bool(heads or recorded.get("heads")),
        measure=not (flow and recorded and not adds),
        kept=tuple(kept),
    )


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        a_list, b_list = list(a or []), list(b or [])
        return len(a_list) == len(b_list) and all(
            math.isclose(float(x), float(y)) for x, y in zip(a_list, b_list, strict=True)
        )
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(float(a), float(b))
    return str(a) == str(b)


def _heads_fit(ds: xr.Dataset, model: Any, causal: bool) -> EffectiveBeta:
    layers = ds.sizes["time"] - 1
    if model.n_layers != layers:
        raise UserError(
            f"the model has {model.n_layers} blocks but the run has {layers} layers",
            "pass the model that made the run",
        )
    return effective_beta(ds, causal=causal, heads=lambda t, x: head_inputs(model, t, x))


def model_of_run(run: str | Path, *, device: str = "cpu") -> Any:
    """Load the model named in a trace run's config (random weights and seed included)
    onto ``device``."""
    config = read_run_info(run).config
    if not config.get("model", {}).get("name"):
        raise UserError(f"run '{run}' names no model")
    return ModelSpec.from_run(config, device=device).load()


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
        sim_beta: the simulation's beta (default: the median fitted effective beta).
        sim_dt: the simulation's step (default: the median fitted step).
        model: the loaded model that made the run (llama family); given, the
            effective beta is also fitted with each layer's own heads
            (:func:`tokenfield.models.attention.head_inputs`).
        baseline_model: the loaded model that made the baseline run, likewise.
        progress: called as ``progress(label, total)`` before each of the ``total``
            measurements (for a progress bar).

    Returns:
        A :class:`~tokenfield.analysis.theory.TheoryLens` (sections a run
        cannot give are ``None``, with the reason in ``notes``).

    Raises:
        UserError: ``run`` is not a trace run.

    Example:
        >>> lens = tf.theory_lens("runs/spectrum", baseline="runs/spectrum-random",
        ...                       simulate=True)                # doctest: +SKIP
        >>> tf.write_theory("runs/spectrum", lens)              # doctest: +SKIP
        PosixPath('runs/spectrum/theory.json')
    """
    info_run = read_run_info(run)
    if info_run.kind != "trace":
        raise UserError(
            f"'{run}' is a {info_run.kind} run", "pass a run made by 'tokenfield trace'"
        )
    ds = open_run(run).load()
    causal = is_causal_run(ds)
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
        # everything that decides the sections: a later lens adds to them with these
        "settings": {
            "eps": eps,
            "more_eps": list(more_eps),
            "permutations": permutations,
            "seed": seed,
            "baseline": None if baseline is None else str(baseline),
            "simulate": bool(simulate),
            "sim_beta": sim_beta,
            "sim_dt": sim_dt,
            "heads": model is not None,
        },
    }
    parts: dict[str, Any] = {}
    base = None
    if baseline is not None:
        if read_run_info(baseline).kind != "trace":
            raise UserError(f"baseline '{baseline}' is not a trace run")
        base = open_run(baseline).load()
    step = _stepper(progress, ds, base, simulate, model, baseline_model)

    def fit(run_ds: xr.Dataset, own_model: Any, prefix: str, clouds_label: str) -> None:
        """The clouds and the effective beta of one run (``prefix``: its keys)."""
        step(clouds_label)
        parts[f"{prefix}clouds"] = token_clouds(run_ds, eps=eps, more_eps=more_eps)
        step(f"{prefix.replace('_', ' ')}effective beta")
        parts[f"{prefix}beta"] = effective_beta(run_ds, causal=causal)
        if own_model is not None:
            step(f"{prefix.replace('_', ' ')}effective beta, own heads")
            parts[f"{prefix}beta_heads"] = _heads_fit(run_ds, own_model, causal)

    if traced_all_positions(ds):
        fit(ds, model, "", "token clouds")
        if base is not None and traced_all_positions(base):
            fit(base, baseline_model, "baseline_", "baseline clouds")
        if simulate:
            beta, dt, source = pick_simulation(parts["beta"])
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
    parts["probes"] = probe_curves(ds, permutations, seed, notes, "")
    if base is not None:
        step("baseline probes")
        parts["baseline_probes"] = probe_curves(base, permutations, seed, notes, "baseline ")
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
    if traced_all_positions(ds):
        total += 2 + (model is not None) + bool(simulate)
        if base is not None and traced_all_positions(base):
            total += 2 + (baseline_model is not None)
    return lambda label: progress(label, int(total))


def write_theory(run: str | Path, result: TheoryLens, *, figures: bool = True) -> Path:
    """Write ``RUN/theory.json``, the report fragment ``RUN/theory.html``
    (``tokenfield report --section RUN/theory.html``) and, with ``figures``,
    ``RUN/figures/theory_*.png``.

    Args:
        run: the run directory measured.
        result: what :func:`theory_lens` returned for it.
        figures: also draw the PNG figures.

    Returns:
        The path of ``theory.json``.

    Example:
        >>> lens = tf.theory_lens("runs/spectrum")             # doctest: +SKIP
        >>> tf.write_theory("runs/spectrum", lens, figures=False)  # doctest: +SKIP
        PosixPath('runs/spectrum/theory.json')
    """
    run = Path(run)
    target = run / THEORY_JSON
    data = to_jsonable(result.to_dict())
    write_json_atomic(target, data)
    title = f"<h2>{html.escape(run.name or str(run))}: through the lens of the theory</h2>"
    fragment = f"<section>{title}{theory_html_section(data)}</section>\n"
    write_atomic(run / THEORY_HTML, fragment)
    if figures:
        write_theory_figures(result, run / FIGURES)
    return target

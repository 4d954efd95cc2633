"""The workflow of ``tokenfield steer``: build or load the vector, load the run's
model, run the closed loop (trace the source category's prompts with and without
the steering vector and a random control, and measure where they go in the
reference run's frame; :mod:`tokenfield.steering.closed_loop` for the pure
measures), and write the vector, the control, ``steering.json`` and the figure
(:func:`steer_run`). :func:`prepare_steering_out` is the output directory of
``steer`` and ``eval-steering`` (:mod:`tokenfield.pipelines.steer_eval`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import numpy as np
import torch
import xarray as xr

from tokenfield._io import write_json_atomic
from tokenfield._progress import ProgressBar
from tokenfield._progress import console as make_console
from tokenfield.analysis.projection import PROJECTION_NPZ, fit_projection, load_projection, project
from tokenfield.errors import UserError
from tokenfield.models.load import ModelSpec
from tokenfield.pipelines.trace import trace
from tokenfield.runs import open_run
from tokenfield.steering.closed_loop import category_centroids, progress_toward
from tokenfield.steering.generate import greedy_continuations, next_token_logprobs, require_causal
from tokenfield.steering.hooks import steering
from tokenfield.steering.vectors import SteeringVector, random_control, steering_vector
from tokenfield.viz.steering import plot_steered_paths, save

__all__ = [
    "OUTPUTS",
    "closed_loop",
    "prepare_steering_out",
    "steer_run",
    "time_convention",
    "top5_tokens",
]

# What steer / eval-steering write: --overwrite deletes these (and the command's own
# figures, viz.steering.FIGURES) and nothing else; the marker file last.
OUTPUTS = {
    "steering.json": ("vector.safetensors", "control.safetensors", "steering.json"),
    "eval.json": ("eval.json",),
}


def closed_loop(
    model: Any,
    ds: xr.Dataset,
    vector: SteeringVector,
    alphas: Sequence[float],
    *,
    positions: str = "last",
    control_seed: int = 0,
    max_new_tokens: int = 12,
    frame: Any = None,
    progress: bool = False,
) -> dict[str, Any]:
    """Steer the source category's prompts of run ``ds`` and measure the effect.

    Returns JSON-able data: one row per (condition, alpha) plus the projected
    paths (``paths``: condition -> alpha -> (time, prompt, 2) list) and the
    reference run's projected last-token paths for drawing.
    """
    config = ds.attrs.get("run", {}).get("config", {})
    chat = bool(config.get("chat", False))
    source, target = vector.provenance["from"], vector.provenance["to"]
    last = ds.isel(particle=np.asarray(ds["is_last"].values, bool))
    picked = np.array([str(c) == source for c in last["category"].values])
    texts = [str(t) for t in last["prompt"].values[picked]]
    target_centroid = category_centroids(ds, target)
    frame = frame or fit_projection(last, n_components=2)

    def measure(alpha: float, direction: SteeringVector | None) -> dict[str, Any]:
        def run() -> tuple[xr.Dataset, torch.Tensor, list[str]]:
            traced = trace(model, texts, chat=chat)
            logp = next_token_logprobs(model, texts, chat=chat)
            conts = greedy_continuations(model, texts, max_new_tokens=max_new_tokens, chat=chat)
            return traced, logp, conts

        if direction is None:
            return dict(zip(("ds", "logp", "text"), run(), strict=True))
        with steering(model, direction, alpha, positions=positions, check=False):
            return dict(zip(("ds", "logp", "text"), run(), strict=True))

    vector.check_model(model)
    base = measure(0.0, None)
    base_states = np.asarray(base["ds"]["states"].values, dtype=np.float64)
    control = random_control(vector, control_seed)
    rows: list[dict[str, Any]] = []
    paths: dict[str, dict[str, Any]] = {"steer": {}, "control": {}}
    base_pcs = project(base["ds"], frame).values[..., :2]
    conditions = [("steer", vector), ("control", control)]
    total = len(conditions) * len(alphas)
    bar = ProgressBar("steering", total, enabled=progress, unit="conditions")
    with bar:
        for name, direction in conditions:
            for alpha in alphas:
                got = measure(float(alpha), direction)
                states = np.asarray(got["ds"]["states"].values, dtype=np.float64)
                moved = progress_toward(states, base_states, target_centroid)
                kl = (base["logp"].exp() * (base["logp"] - got["logp"])).sum(-1)  # (prompt,)
                top1_changed = (got["logp"].argmax(-1) != base["logp"].argmax(-1)).float()
                rows.append(
                    {
                        "condition": name,
                        "alpha": float(alpha),
                        "layer": vector.layer,
                        "vector_norm": direction.norm,
                        "progress_at_layer": float(moved[vector.layer]),
                        "progress_final": float(moved[-1]),
                        "progress_by_time": moved.tolist(),
                        "kl_mean": float(kl.mean()),
                        "top1_changed": float(top1_changed.mean()),
                        "top5": top5_tokens(model, got["logp"]),
                        "continuations": got["text"],
                    }
                )
                paths[name][str(float(alpha))] = project(got["ds"], frame).values[..., :2].tolist()
                bar.advance()
    reference = project(last, frame).values[..., :2]
    return {
        "source": source,
        "target": target,
        "layer": vector.layer,
        "positions": positions,
        "prompts": texts,
        "unsteered": {
            "top5": top5_tokens(model, base["logp"]),
            "continuations": base["text"],
            "paths": base_pcs.tolist(),
        },
        "rows": rows,
        "paths": paths,
        "reference": {
            "paths": reference.tolist(),
            "category": [str(c) for c in last["category"].values],
            "label": [str(c) for c in last["label"].values] if "label" in last else [],
        },
        "explained_variance_ratio": np.asarray(frame.explained_variance_ratio).tolist()[:2],
    }


def top5_tokens(model: Any, logprobs: torch.Tensor) -> list[list[str]]:
    """The five most likely next tokens of each row of ``logprobs`` ``(prompt, vocab)``, decoded."""
    ids = logprobs.topk(5, dim=-1).indices
    return [[model.tokenizer.decode([t]) for t in row.tolist()] for row in ids]


def prepare_steering_out(out: str | Path, overwrite: bool, marker: str) -> Path:
    """A fresh output directory for ``steer`` (``marker="steering.json"``) or
    ``eval-steering`` (``"eval.json"``), locked for this process (one writer,
    until the command ends); an existing non-empty one only with ``overwrite``,
    and only if the same command wrote it, and then only that command's own
    files (:data:`OUTPUTS` and its figures) are deleted."""
    from tokenfield._lock import LOCK_NAME, hold_for_command
    from tokenfield.runs import check_writable_dir, figures_dir
    from tokenfield.viz.steering import FIGURES

    out = Path(out)
    check_writable_dir(out)
    if out.exists() and (not out.is_dir()):
        raise UserError(f"output path '{out}' is a file", "choose a directory for --out")
    hold_for_command(out)
    present = [p for p in out.iterdir() if p.name != LOCK_NAME]
    if present:
        if not overwrite:
            raise UserError(
                f"output directory '{out}' is not empty", "choose another --out or pass --overwrite"
            )
        if not (out / marker).exists():
            raise UserError(
                f"'{out}' was not written by this command; refusing to overwrite it",
                "choose another --out",
            )
        figures = figures_dir(out, create=False)  # a symlinked figures/: refused, untouched
        command = "steer" if marker == "steering.json" else "eval-steering"
        mine = [figures / f"{stem}.{fmt}" for stem in FIGURES[command] for fmt in ("png", "svg")]
        files = [out / name for name in OUTPUTS[marker]]
        for target in (*mine, *files):  # the marker last: a crash leaves it a run to redo
            if target.is_symlink() or target.is_file():
                target.unlink()
    return out


def steer_run(
    run: str | Path,
    *,
    source: str,
    target: str,
    layer: int,
    out: str | Path,
    alphas: Sequence[float],
    method: str = "mean",
    positions: str = "last",
    vector: str | Path | None = None,
    model: str | None = None,
    max_new_tokens: int = 12,
    control_seed: int = 0,
    device: str = "cpu",
    overwrite: bool = False,
    progress: bool = False,
) -> dict[str, Any]:
    """``tokenfield steer``: steer the ``source`` category's prompts of the traced
    ``run`` toward ``target``'s region at ``layer`` and write into ``out``:
    ``vector.safetensors`` (with provenance), ``control.safetensors``,
    ``steering.json`` and ``figures/steered_paths``.

    ``vector`` is a saved vector to use instead of computing one (it must belong
    to ``layer`` and to ``source`` -> ``target``); ``model`` overrides the run's
    model (its dtype and weights are the run's); ``device`` is where it runs.
    Nothing is written before the inputs are checked and the model is loaded.

    Returns:
        What ``steering.json`` holds beside the vector's provenance (the rows,
        the paths; :func:`closed_loop`).
    """
    run = Path(run)
    if positions not in ("last", "all"):
        raise UserError(f"unknown --positions '{positions}'", "use 'last' or 'all'")
    ds = open_run(run).load()
    if vector is not None:
        steer_vec = SteeringVector.load(vector)
        if steer_vec.layer != layer:
            raise UserError(
                f"the vector belongs to layer {steer_vec.layer}, not {layer}",
                f"pass --layer {steer_vec.layer}",
            )
        if steer_vec.provenance.get("from") != source or steer_vec.provenance.get("to") != target:
            raise UserError(
                "the vector was made for other categories", "match --from/--to to the vector's"
            )
    else:
        steer_vec = steering_vector(
            ds, source=source, target=target, layer=layer, method=method, run=str(run)
        )
    spec = ModelSpec.from_run(ds, name=model, device=device)  # the run's model, dtype and weights
    with make_console(stderr=True).status("loading model") if progress else nullcontext():
        loaded = spec.load()
    steer_vec.check_model(loaded)
    require_causal(loaded)
    frame = load_projection(run) if (run / PROJECTION_NPZ).is_file() else None
    out = prepare_steering_out(out, overwrite, "steering.json")
    result = closed_loop(loaded, ds, steer_vec, alphas, positions=positions, control_seed=control_seed,
                         max_new_tokens=max_new_tokens, frame=frame, progress=progress)  # fmt: skip
    steer_vec.save(out / "vector.safetensors")
    random_control(steer_vec, control_seed).save(out / "control.safetensors")
    write_json_atomic(out / "steering.json", {"vector": steer_vec.provenance, **result})
    (out / "figures").mkdir(exist_ok=True)
    save(plot_steered_paths(result, times=time_convention(run)), out / "figures" / "steered_paths")
    return result


def time_convention(run: Path) -> str:
    """The times the run's own figures use (its metrics.json; ``seed`` before
    it is analysed, analyze's default)."""
    try:
        options = json.loads((run / "metrics.json").read_text(encoding="utf-8")).get("options")
        times = options.get("times", "seed") if isinstance(options, dict) else "seed"
    except (OSError, ValueError, AttributeError):
        return "seed"
    return times if times in ("seed", "all") else "seed"

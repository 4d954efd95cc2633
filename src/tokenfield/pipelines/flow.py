"""The attention-only flow workflow of ``tokenfield lens --flow``: re-trace the run's
prompts with the MLPs removed, with a random-weight copy's attention, and as the
idealised flow; measure (:mod:`tokenfield.analysis.flow`); write ``flow.json``,
``flow.html`` and ``figures/theory_flow.png``.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from tokenfield._io import write_atomic, write_json_atomic
from tokenfield.analysis.clusters import check_eps
from tokenfield.analysis.flow import (
    FLOW_FIGURE,
    FLOW_HTML,
    FLOW_JSON,
    VARIANTS,
    AttentionFlow,
    flow_measures,
    identity_flow,
)
from tokenfield.errors import UserError
from tokenfield.models.surgery import (
    MlpPutBack,
    mlp_owners,
    mlps_removed,
    mlps_swapped,
    random_copy,
)
from tokenfield.pipelines.trace import trace
from tokenfield.prompts import as_prompts
from tokenfield.viz.flow import flow_html_section, plot_flow

__all__ = ["attention_flow", "flow_states", "write_flow"]


def _prompts_of(ds: xr.Dataset) -> list[Any]:

    config = json.loads(ds.attrs.get("tokenfield_config", "{}"))
    if "prompts" not in config:
        raise UserError("this run records no prompts", "trace it with tokenfield trace")
    return as_prompts(config["prompts"])


def flow_states(
    model: Any,
    prompts: Any,
    variant: str,
    *,
    keep_mlp: bool = False,
    chat: bool = False,
    truncate: bool = False,
    seed: int = 0,
    real: xr.Dataset | None = None,
) -> xr.Dataset:
    """The token states ``(time, particle, feature)`` of one flow (``positions="all"``).

    ``variant`` is ``"full"`` (the trace), ``"attention"`` (``keep_mlp=True`` puts
    the MLPs back through the same swap, :class:`MlpPutBack`: then it equals the trace), ``"random_attention"`` or
    ``"identity"`` (needs ``real``, the trace, for the start and the fits)."""

    options = dict(positions="all", chat=chat, truncate=truncate, top_k=1)
    if variant == "full":
        return trace(model, prompts, **options)
    if variant in ("attention", "random_attention"):
        target = model if variant == "attention" else random_copy(model, seed)
        # keep_mlp swaps in a module that calls the MLP: the same swap path, which
        # must then give the trace exactly (tests/integration/test_attention_flow.py)
        with mlps_swapped(target, MlpPutBack) if keep_mlp else mlps_removed(target):
            return trace(target, prompts, **options)
    if variant == "identity":
        if real is None:
            real = trace(model, prompts, **options)
        return identity_flow(real, model.causal)
    raise UserError(f"unknown flow variant '{variant}'", f"use one of {', '.join(VARIANTS)}")


def attention_flow(
    model: Any,
    prompts: Any = None,
    *,
    real: xr.Dataset | None = None,
    eps: float = 0.1,
    seed: int = 0,
    chat: bool = False,
    truncate: bool = False,
    progress: Any = None,
) -> AttentionFlow:
    """Run the four flows (module docstring) from each prompt's layer-0 cloud.

    Args:
        model: a loaded model (:func:`tokenfield.load_model`), llama / gpt2 /
            gpt_neox family.
        prompts: the prompts (default: those of ``real``).
        real: the model's trace of the prompts with ``positions="all"`` (a run
            Dataset); traced here when omitted.
        eps: cluster threshold (tokens linked at ``cos >= 1 - eps``).
        seed: the random-weight copy's seed.
        progress: called with each variant's name as it starts.
    """

    eps = check_eps(eps)
    mlp_owners(model)
    if real is not None:
        config = json.loads(real.attrs.get("tokenfield_config", "{}"))
        if config.get("positions") != "all":
            raise UserError(
                "the attention-only flow needs a run traced with --positions all",
                "trace it again with --positions all",
            )
        prompts = _prompts_of(real) if prompts is None else prompts
    if prompts is None:
        raise UserError("pass prompts or a traced run")
    flows: dict[str, xr.Dataset] = {}
    for variant in VARIANTS:
        if progress is not None:
            progress(variant)
        if variant == "full" and real is not None:
            flows[variant] = real
            continue
        flows[variant] = flow_states(
            model, prompts, variant, chat=chat, truncate=truncate, seed=seed,
            real=flows.get("full"),
        )  # fmt: skip
        if variant == "full":
            real = flows["full"]
    assert real is not None
    reference = real["states"].transpose("time", "particle", "feature").values.astype(np.float64)
    groups = real["prompt_index"].values
    start = reference[0]
    measures = []
    for variant in VARIANTS:
        states = flows[variant]["states"].transpose("time", "particle", "feature").values
        states = states.astype(np.float64)
        if states.shape != reference.shape:
            raise UserError(
                f"the {variant} flow has shape {states.shape}, the trace {reference.shape}",
                "trace the run again with this model and --positions all",
            )
        if variant != "identity":
            gap = np.abs(states[0] - start).max() / max(1e-12, np.abs(start).max())
            if gap > 1e-4:
                raise UserError(
                    f"the {variant} flow does not start from the run's layer-0 cloud "
                    f"(relative gap {gap:.1e})",
                    "pass the model that made the run",
                )
        measures.append(flow_measures(states, reference, groups, eps))
    stack = [np.stack([m[k] for m in measures]) for k in range(4)]
    tokens = float(np.mean(np.unique(groups, return_counts=True)[1]))
    return AttentionFlow(
        time=np.asarray(real["time"].values),
        variants=VARIANTS,
        clusters=stack[0],
        mean_cosine=stack[1],
        gram_rank=stack[2],
        distance=stack[3],
        eps=eps,
        model=str(getattr(model, "name", "")),
        tokens=tokens,
    )


def write_flow(run: Any, flow: AttentionFlow) -> Any:
    """Write ``RUN/flow.json``, the report fragment ``RUN/flow.html``
    (``tokenfield report --section RUN/flow.html``) and ``RUN/figures/theory_flow.png``."""

    from tokenfield.runs import figures_dir

    run = Path(run)
    figures_dir(run, create=False)  # a symlinked figures/ is refused before any write
    data = flow.to_dict()
    write_json_atomic(run / FLOW_JSON, data)
    buffer = io.BytesIO()
    plot_flow(flow).savefig(buffer, format="png", dpi=90)
    figures_dir(run)
    for name, content in ((Path("figures") / FLOW_FIGURE, buffer.getvalue()),
                          (Path(FLOW_HTML), f"<section>{flow_html_section(data, buffer.getvalue())}"
                                            "</section>\n".encode()),):  # fmt: skip
        write_atomic(run / name, content)
    return run / FLOW_JSON

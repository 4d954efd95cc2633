"""The attention-only flow workflow of ``tokenfield lens --flow``: re-trace the run's
prompts with the MLPs removed, with a random-weight copy's attention, and as the
idealised flow; measure (:mod:`tokenfield.analysis.flow`); write ``flow.json``,
``flow.html`` and ``figures/theory_flow.png``.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import xarray as xr

from tokenfield._io import write_atomic
from tokenfield.analysis.clusters import _check_eps
from tokenfield.analysis.flow import (
    FLOW_FIGURE,
    FLOW_HTML,
    FLOW_JSON,
    VARIANTS,
    AttentionFlow,
    _identity_flow,
    _measure,
)
from tokenfield.errors import UserError
from tokenfield.models.load import wrap_model
from tokenfield.pipelines.trace import trace
from tokenfield.prompts import as_prompts
from tokenfield.runs import write_json_atomic
from tokenfield.viz.flow import flow_html_section, plot_flow

__all__ = [
    "MlpPutBack",
    "attention_flow",
    "flow_states",
    "mlps_removed",
    "mlps_swapped",
    "random_copy",
    "write_flow",
]


def _mlp_owners(model: Any) -> list[Any]:
    blocks = model.sites.blocks
    owners = [block for block in blocks if hasattr(block, "mlp")]
    if len(owners) != len(blocks):
        raise UserError(
            f"model '{model.name}' has blocks without an 'mlp' module ({model.family.name} family)",
            "the attention-only flow supports llama-, gpt2- and gpt_neox-family models",
        )
    return owners


class _ZeroMlp(torch.nn.Module):
    """An MLP that returns zero: the attention-only flow."""

    def forward(self, hidden, *args, **kwargs):  # noqa: D401
        return torch.zeros_like(hidden)


class MlpPutBack(torch.nn.Module):
    """Swapped in where the MLP was, calling it: the flow with the MLP put back
    goes through the same swap as the attention-only flow."""

    def __init__(self, mlp: torch.nn.Module):
        super().__init__()
        self.original = mlp

    def forward(self, hidden, *args, **kwargs):  # noqa: D401
        return self.original(hidden, *args, **kwargs)


@contextlib.contextmanager
def mlps_swapped(model: Any, replacement: Callable[[torch.nn.Module], torch.nn.Module]):
    """Within the block, every block's MLP module is ``replacement(mlp)`` (restored
    after, even on error)."""

    owners = _mlp_owners(model)
    saved = [owner.mlp for owner in owners]
    try:
        for owner, mlp in zip(owners, saved, strict=True):
            owner._modules["mlp"] = replacement(mlp)
        yield
    finally:
        for owner, mlp in zip(owners, saved, strict=True):
            owner._modules["mlp"] = mlp


def mlps_removed(model: Any) -> contextlib.AbstractContextManager[None]:
    """Within the block, every block's MLP returns zero (restored after)."""
    return mlps_swapped(model, lambda _mlp: _ZeroMlp())


def random_copy(model: Any, seed: int = 0) -> Any:
    """A random-weight copy of ``model``'s architecture (seeded) whose token
    embedding is the real one, so its layer-0 cloud is the real model's."""

    hf = model.model
    config = copy.deepcopy(hf.config)
    torch.manual_seed(seed)
    twin = type(hf)(config).to(dtype=next(hf.parameters()).dtype, device=model.device)
    wrapped = wrap_model(twin, model.tokenizer, f"{model.name} (random)", random_weights=True,
                         seed=seed)  # fmt: skip
    with torch.no_grad():
        wrapped.sites.embed_tokens.weight.copy_(model.sites.embed_tokens.weight)
    return wrapped


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
        return _identity_flow(real, model.causal)
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

    eps = _check_eps(eps)
    _mlp_owners(model)
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
        measures.append(_measure(states, reference, groups, eps))
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

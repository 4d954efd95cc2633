"""The attention-only flow of a real model.

Do a real transformer's tokens follow the self-attention flow? Start from the
model's own layer-0 token cloud of each prompt (the ``embed`` site of a trace)
and apply, layer by layer:

- ``full``: the full block (attention and MLP): this is the trace itself;
- ``attention``: the block's attention sub-layer only: every block's MLP is
  replaced by zero, the residual connection and the model's own norms kept
  (Llama: ``x + attn(norm(x))``; Gemma 3: ``x + norm'(attn(norm(x)))``; the
  post-MLP norm of zero is zero);
- ``identity``: the identity-matrix step of the theory,
  ``y <- N(y + h_l f(y; beta_l))`` with ``f`` the SA field with ``Q = K = V = I``
  (causal when the model is) and ``(beta_l, h_l)`` the per-layer effective beta
  fitted to the real trace (:mod:`tokenfield.analysis.effective_beta`);
- ``random_attention``: a random-weight copy of the architecture (seeded), its
  MLPs removed the same way, fed the real model's layer-0 cloud (its token
  embedding is the real one).

Per layer and variant, averaged over prompts: the number of clusters (tokens
linked at ``cos >= 1 - eps``, :func:`tokenfield.cluster_count`), the mean
pairwise cosine, the rank of the Gram matrix at ``cos >= 0.999`` (the rank of
the 0/1 matrix ``[cos(x_i, x_j) >= 0.999]``: the number of distinct directions
once tokens closer than that are identified), and the distance to the real
trajectory (the mean angle, radians, between each token and the same token of
the trace at the same layer).

The flows are run through :func:`tokenfield.trace` itself (with the MLPs
swapped out), so the positions, masks and padding are those of the real trace;
with the MLPs kept the flow is the trace (tested on tiny models).
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import xarray as xr

from tokenfield.errors import UserError

__all__ = ["AttentionFlow", "VARIANTS", "attention_flow", "flow_states", "mlps_removed"]

VARIANTS = ("full", "attention", "identity", "random_attention")
GRAM_COS = 0.999


def _mlp_owners(model: Any) -> list[Any]:
    blocks = model.sites.blocks
    owners = [block for block in blocks if hasattr(block, "mlp")]
    if len(owners) != len(blocks):
        raise UserError(
            f"model '{model.name}' has blocks without an 'mlp' module ({model.family.name} family)",
            "the attention-only flow supports llama-, gpt2- and gpt_neox-family models",
        )
    return owners


@contextlib.contextmanager
def mlps_removed(model: Any) -> Iterator[None]:
    """Within the block, every block's MLP returns zero (restored after)."""
    import torch

    owners = _mlp_owners(model)
    saved = [owner.mlp for owner in owners]

    class Zero(torch.nn.Module):
        def forward(self, hidden, *args, **kwargs):  # noqa: D401
            return torch.zeros_like(hidden)

    try:
        for owner in owners:
            owner._modules["mlp"] = Zero()
        yield
    finally:
        for owner, mlp in zip(owners, saved, strict=True):
            owner._modules["mlp"] = mlp


def random_copy(model: Any, seed: int = 0) -> Any:
    """A random-weight copy of ``model``'s architecture (seeded) whose token
    embedding is the real one, so its layer-0 cloud is the real model's."""
    import torch

    from tokenfield.models.load import wrap_model

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
    import json

    from tokenfield.prompts import as_prompts

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
    the MLPs back: then it equals the trace), ``"random_attention"`` or
    ``"identity"`` (needs ``real``, the trace, for the start and the fits)."""
    from tokenfield.models.trace import trace

    options = dict(positions="all", chat=chat, truncate=truncate, top_k=1)
    if variant == "full":
        return trace(model, prompts, **options)
    if variant in ("attention", "random_attention"):
        target = model if variant == "attention" else random_copy(model, seed)
        guard = contextlib.nullcontext() if keep_mlp else mlps_removed(target)
        with guard:
            return trace(target, prompts, **options)
    if variant == "identity":
        if real is None:
            real = trace(model, prompts, **options)
        return _identity_flow(real, model.causal)
    raise UserError(f"unknown flow variant '{variant}'", f"use one of {', '.join(VARIANTS)}")


def _identity_flow(real: xr.Dataset, causal: bool) -> xr.Dataset:
    from tokenfield.analysis.effective_beta import attention_field, effective_beta

    fits = effective_beta(real, causal=causal)
    betas, steps = fits.column("beta"), fits.column("step")
    states = real["states"].transpose("time", "particle", "feature").values.astype(np.float64)
    out = np.empty_like(states)
    groups = real["prompt_index"].values
    positions = real["position"].values if "position" in real.coords else None
    for prompt in np.unique(groups):
        index = np.flatnonzero(groups == prompt)
        if positions is not None:
            index = index[np.argsort(positions[index], kind="stable")]
        y = states[0, index]
        y = y / np.linalg.norm(y, axis=1, keepdims=True)
        out[0, index] = y
        for layer in range(states.shape[0] - 1):
            beta, h = betas[layer], steps[layer]
            if math.isfinite(beta) and h > 0:
                y = y + h * attention_field(y, beta, causal=causal)
                y = y / np.linalg.norm(y, axis=1, keepdims=True)
            out[layer + 1, index] = y
    flow = real.copy()
    flow["states"] = (("time", "particle", "feature"), out.astype(np.float32))
    return flow


def _unit(x: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(x, axis=-1, keepdims=True)
    return x / np.where(norms > 0, norms, 1.0)


@dataclass(frozen=True)
class AttentionFlow:
    """Per-layer measures of each flow, averaged over prompts.

    Attributes:
        time: ``(T,)`` layer index (0 = the layer-0 cloud).
        variants: the flows (rows of every array).
        clusters, mean_cosine, gram_rank, distance: ``(V, T)``.
        eps: the cluster threshold; model: the model's name.
    """

    time: np.ndarray
    variants: tuple[str, ...]
    clusters: np.ndarray
    mean_cosine: np.ndarray
    gram_rank: np.ndarray
    distance: np.ndarray
    eps: float
    model: str
    tokens: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "eps": self.eps,
            "gram_cos": GRAM_COS,
            "mean_tokens_per_prompt": self.tokens,
            "time": self.time.tolist(),
            "variants": {
                v: {
                    "clusters": self.clusters[i].tolist(),
                    "mean_cosine": self.mean_cosine[i].tolist(),
                    "gram_rank": self.gram_rank[i].tolist(),
                    "distance": self.distance[i].tolist(),
                }
                for i, v in enumerate(self.variants)
            },
        }

    def rows(self, layers: Any = None) -> list[list[Any]]:
        """``[layer, variant, clusters, mean cos, rank, distance]`` rows."""
        picks = range(self.time.size) if layers is None else layers
        return [
            [
                int(self.time[t]),
                v,
                float(self.clusters[i, t]),
                float(self.mean_cosine[i, t]),
                float(self.gram_rank[i, t]),
                float(self.distance[i, t]),
            ]  # fmt: skip
            for t in picks
            for i, v in enumerate(self.variants)
        ]


def _measure(
    states: np.ndarray, real: np.ndarray, groups: np.ndarray, eps: float
) -> tuple[np.ndarray, ...]:
    from tokenfield.analysis.clusters import cluster_count

    prompts = np.unique(groups)
    shape = (prompts.size, states.shape[0])
    clusters, cosine, rank, distance = (np.empty(shape) for _ in range(4))
    for p, prompt in enumerate(prompts):
        index = np.flatnonzero(groups == prompt)
        x, r = _unit(states[:, index]), _unit(real[:, index])
        for t in range(states.shape[0]):
            gram = x[t] @ x[t].T
            n = index.size
            clusters[p, t] = cluster_count(x[t], eps)
            cosine[p, t] = (gram.sum() - n) / max(1, n * (n - 1))
            rank[p, t] = np.linalg.matrix_rank((gram >= GRAM_COS).astype(np.float64))
            distance[p, t] = np.arccos(np.clip((x[t] * r[t]).sum(-1), -1, 1)).mean()
    return clusters.mean(0), cosine.mean(0), rank.mean(0), distance.mean(0)


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
    from tokenfield.analysis.clusters import _check_eps

    eps = _check_eps(eps)
    _mlp_owners(model)
    if real is not None:
        import json

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


FLOW_JSON = "flow.json"
FLOW_HTML = "flow.html"
FLOW_FIGURE = "theory_flow.png"


def flow_html_section(data: dict[str, Any], image: bytes | None = None) -> str:
    """The report fragment: per layer, the four flows side by side."""
    import base64
    import html

    variants = list(data["variants"])
    head = "".join(
        f"<th>{html.escape(v)}: {m}</th>"
        for m in ("clusters", "mean cos", "rank", "dist")
        for v in variants
    )
    body = []
    for t, layer in enumerate(data["time"]):
        cells = "".join(
            f"<td class='num'>{data['variants'][v][key][t]:.3g}</td>"
            for key in ("clusters", "mean_cosine", "gram_rank", "distance")
            for v in variants
        )
        body.append(f"<tr><td class='num'>{layer}</td>{cells}</tr>")
    img = (
        f"<figure><img alt='attention-only flow' src='data:image/png;base64,"
        f"{base64.b64encode(image).decode()}'></figure>"
        if image
        else ""
    )
    return (
        f"<h3>The attention-only flow ({html.escape(str(data['model']))})</h3>"
        "<p class='note'>From each prompt's layer-0 cloud: full = the trace; attention = the "
        "block's attention sub-layer only (MLP removed, residual and norms kept); identity = "
        "the Q = K = V = I step with the fitted beta; random_attention = a random-weight "
        f"copy's attention. Clusters at cos >= 1 - {data['eps']:g}; rank of [cos >= "
        f"{data['gram_cos']}]; dist = mean angle to the real token (rad). Means over "
        "prompts.</p>"
        f"{img}<div class='scroll'><table><thead><tr><th>layer</th>{head}</tr></thead>"
        f"<tbody>{''.join(body)}</tbody></table></div>"
    )


def plot_flow(flow: AttentionFlow):
    from tokenfield.viz._common import new_figure

    fig, axes = new_figure((12, 3.4), ncols=4)
    for ax, (values, label) in zip(
        axes,
        ((flow.clusters, f"clusters (eps {flow.eps:g})"), (flow.mean_cosine, "mean cosine"),
         (flow.gram_rank, "rank at cos >= 0.999"), (flow.distance, "distance to trace (rad)")),
        strict=True,
    ):  # fmt: skip
        for i, variant in enumerate(flow.variants):
            ax.plot(flow.time, values[i], marker=".", label=variant)
        ax.set_xlabel("layer")
        ax.set_title(label, fontsize=9)
    axes[0].legend(fontsize=7)
    return fig


def write_flow(run: Any, flow: AttentionFlow) -> Any:
    """Write ``RUN/flow.json``, the report fragment ``RUN/flow.html``
    (``tokenfield report --section RUN/flow.html``) and ``RUN/figures/theory_flow.png``."""
    import io
    import os
    from pathlib import Path

    from tokenfield.runs import write_json_atomic

    run = Path(run)
    data = flow.to_dict()
    write_json_atomic(run / FLOW_JSON, data)
    buffer = io.BytesIO()
    plot_flow(flow).savefig(buffer, format="png", dpi=90)
    (run / "figures").mkdir(exist_ok=True)
    for name, content in ((Path("figures") / FLOW_FIGURE, buffer.getvalue()),
                          (Path(FLOW_HTML), f"<section>{flow_html_section(data, buffer.getvalue())}"
                                            "</section>\n".encode()),):  # fmt: skip
        tmp = run / name.parent / f".{name.name}.tmp"
        tmp.write_bytes(content)
        os.replace(tmp, run / name)
    return run / FLOW_JSON

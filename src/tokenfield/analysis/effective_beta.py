"""Effective beta: how much of a layer's update the idealised attention flow explains.

The idealised self-attention dynamics (Q = K = V = I, tokens on the sphere,
softmax attention, seeds 002/004) move token ``i`` along

    f_i(beta) = P_{y_i}^perp ( sum_j w_ij(beta) y_j ),
    w_ij(beta) = exp(beta <y_i, y_j>) / sum_k exp(beta <y_i, y_k>),
    P_y^perp v = v - <v, y> y,

where ``y_i = x_i / |x_i|`` and, in a causal model, ``j, k <= i``. One layer of
the model is compared with one Euler step ``y_i -> N(y_i + h f_i(beta))``: the
layer's observed update is the tangent part of the new direction,

    u_i = P_{y_i}^perp y'_i,     y'_i = x'_i / |x'_i|,

which is exactly ``h f_i / sqrt(1 + h^2 |f_i|^2)`` for an Euler step, i.e.
``h f_i`` up to ``O(h^3)``. Per layer, one ``beta`` and one step ``h`` are fitted to
all tokens of all prompts (each prompt its own particle system):

    min_{beta, h >= 0} sum_i |u_i - h f_i(beta)|^2.

For fixed ``beta`` the best ``h`` is ``<u, f> / |f|^2`` and the explained fraction is
``R^2 = 1 - |u - h f|^2 / |u|^2 = cos^2(u, f)`` (``u`` and ``f`` stacked over all
tokens), so ``beta`` maximises the (signed) cosine; a layer whose update points
against every attention field (tokens pushed apart) gets ``h = 0``, ``R^2 = 0``.
Everything is computed in the ``n x n`` Gram space of each prompt
(``<u_i, f_i>`` and ``|f_i|^2`` from ``G = Y Y^T``, ``C = U Y^T`` and ``W``), so a
fit costs nothing in the model dimension ``d``.

**The layer's own attention** (``heads``). Instead of ``Q = K = V = I`` the field
can use the layer's own heads, with the logits and values precomputed per prompt
by :func:`tokenfield.models.attention.head_inputs`:

    f_i(beta) = P_{y_i}^perp ( sum_h sum_j softmax_j(beta G^h_ij) z^h_j ),

``G^h_ij = <q^h_i, k^h_j> / sqrt(d_h)`` and ``z^h_j = O_h v^h_j`` computed from the
layer's input norm and projections without the rotary position code, so
``beta = 1`` is the model's own attention with positions ignored. The same fit
then says how much of the update the layer's attention (as a mean-field
interaction between exchangeable tokens) explains.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.optimize import minimize_scalar

from tokenfield.analysis._frames import trajectory_arrays
from tokenfield.errors import UserError

__all__ = ["BetaFit", "EffectiveBeta", "attention_field", "effective_beta", "fit_beta"]

BETA_GRID = np.concatenate([[0.0], np.geomspace(1e-2, 1e3, 121)])


def _unit(x: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(x, axis=-1, keepdims=True)
    return x / np.where(norms > 0, norms, 1.0)


def _softmax_heads(logits: np.ndarray, beta: float, causal: bool) -> np.ndarray:
    """``(H, n, n)`` row softmax of ``beta * logits`` (causal: ``j <= i``)."""
    scaled = beta * logits
    if causal:
        scaled = np.where(np.tril(np.ones(logits.shape[-2:], dtype=bool)), scaled, -np.inf)
    scaled = scaled - scaled.max(axis=-1, keepdims=True)
    w = np.exp(scaled)
    return w / w.sum(axis=-1, keepdims=True)


def attention_field(y: np.ndarray, beta: float, *, causal: bool = False) -> np.ndarray:
    """``f_i(beta)`` of the module docstring for unit vectors ``y`` ``(n, d)``: ``(n, d)``."""
    y = np.asarray(y, dtype=np.float64)
    a = _softmax_heads((y @ y.T)[None], beta, causal)[0] @ y  # (n, d)
    return a - (a * y).sum(axis=1, keepdims=True) * y


@dataclass(frozen=True)
class _Prompt:
    """Gram-space data of one prompt; ``H = 1`` and ``z = y`` for Q = K = V = I."""

    logits: np.ndarray  # (H, n, n) G^h_ij
    u_z: np.ndarray  # (H, n, n) <u_i, z^h_j>
    y_z: np.ndarray  # (H, n, n) <y_i, z^h_j>
    z_z: np.ndarray  # (H, H, n, n) <z^h_j, z^g_k>
    u_norm2: np.ndarray  # (n,) |u_i|^2


def _prepare(
    before: np.ndarray, after: np.ndarray, heads: tuple[np.ndarray, np.ndarray] | None = None
) -> _Prompt:
    y = _unit(np.asarray(before, dtype=np.float64))
    y_next = _unit(np.asarray(after, dtype=np.float64))
    u = y_next - (y_next * y).sum(axis=1, keepdims=True) * y  # (n, d) tangent update
    if heads is None:
        logits, z = (y @ y.T)[None], y[None]  # (1, n, n), (1, n, d)
    else:
        logits, z = (np.asarray(a, dtype=np.float64) for a in heads)
        if logits.ndim != 3 or z.shape[:2] != logits.shape[:2] or z.shape[2] != y.shape[1]:
            raise UserError(f"head inputs have shapes {logits.shape} and {z.shape}")
    return _Prompt(
        logits,
        np.einsum("id,hjd->hij", u, z),
        np.einsum("id,hjd->hij", y, z),
        np.einsum("hjd,gkd->hgjk", z, z),
        (u * u).sum(axis=1),
    )


def _terms(prompt: _Prompt, beta: float, causal: bool) -> tuple[np.ndarray, np.ndarray]:
    """Per token ``<u_i, f_i>`` and ``|f_i|^2`` (``u_i`` is tangent, so ``<u_i, y_i> = 0``).

    With ``a_i = sum_h sum_j w^h_ij z^h_j``: ``<u_i, f_i> = <u_i, a_i>`` and
    ``|f_i|^2 = |a_i|^2 - <a_i, y_i>^2``.
    """
    w = _softmax_heads(prompt.logits, beta, causal)  # (H, n, n)
    uf = (w * prompt.u_z).sum(axis=(0, 2))
    along = (w * prompt.y_z).sum(axis=(0, 2))
    through = np.matmul(w[:, None], prompt.z_z).sum(axis=0)  # (H, n, n): sum_h w^h Z^hg
    aa = (through * w).sum(axis=(0, 2))  # |a_i|^2
    return uf, np.clip(aa - along**2, 0.0, None)


@dataclass(frozen=True)
class BetaFit:
    """One layer's fit.

    Attributes:
        beta: the fitted inverse temperature (NaN when no ``beta`` gives a
            positive cosine).
        step: the fitted step ``h >= 0``.
        r2: explained fraction of ``sum |u_i|^2`` (``cos^2``, 0 when ``cos <= 0``).
        cosine: the cosine between stacked ``u`` and ``f(beta)``.
        token_cosine: the mean over tokens of ``cos(u_i, f_i)``.
        r2_beta0: ``R^2`` of ``beta = 0`` (every token pulled to the plain mean).
        update: the RMS tangent update ``sqrt(mean |u_i|^2)`` (how far the layer turns tokens).
        n_tokens: tokens in the fit.
    """

    beta: float
    step: float
    r2: float
    cosine: float
    token_cosine: float
    r2_beta0: float
    update: float
    n_tokens: int

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _cosine(prompts: Sequence[_Prompt], beta: float, causal: bool) -> tuple[float, float, float]:
    uf = ff = 0.0
    for prompt in prompts:
        a, b = _terms(prompt, beta, causal)
        uf += float(a.sum())
        ff += float(b.sum())
    uu = float(sum(p.u_norm2.sum() for p in prompts))
    if uu <= 0 or ff <= 0:
        return 0.0, uf, ff
    return uf / math.sqrt(uu * ff), uf, ff


def fit_beta(
    pairs: Sequence[tuple[np.ndarray, np.ndarray]],
    *,
    causal: bool = False,
    betas: np.ndarray | None = None,
    heads: Sequence[tuple[np.ndarray, np.ndarray]] | None = None,
) -> BetaFit:
    """Fit ``beta`` and ``h`` to ``(before, after)`` token states of one layer.

    Args:
        pairs: per prompt, the states ``(n, d)`` before and after the layer
            (any norm: they are put on the sphere).
        causal: token ``i`` attends to ``j <= i`` only.
        betas: the grid searched before a bounded refinement (default
            ``0`` and 121 log-spaced values in ``[0.01, 1000]``).
        heads: per prompt, the layer's own ``(logits (H, n, n), values (H, n, d))``
            (see the module docstring); ``None``: Q = K = V = I.

    Returns:
        A ``BetaFit``: ``beta``, ``step``, ``r2``, ``cosine`` and the rest.

    Example:
        >>> sim = tf.simulate(tf.Dynamics(beta=4.0), tf.initial_condition("uniform", n=8, d=3),
        ...                   t_max=1.0, dt=0.1)
        >>> states = sim.states.values
        >>> fit = tf.fit_beta([(states[0], states[1])])
        >>> round(fit.beta, 1), round(fit.r2, 3)
        (4.0, 1.0)
    """
    if not pairs:
        raise UserError("no token states to fit", "give at least one prompt")
    if heads is not None and len(heads) != len(pairs):
        raise UserError(f"{len(heads)} head inputs for {len(pairs)} prompts")
    prompts = [
        _prepare(before, after, None if heads is None else heads[index])
        for index, (before, after) in enumerate(pairs)
    ]
    grid = BETA_GRID if betas is None else np.asarray(betas, dtype=np.float64)
    scores = np.array([_cosine(prompts, float(b), causal)[0] for b in grid])
    best = int(np.nanargmax(scores))
    beta = float(grid[best])
    if 0 < best < grid.size - 1 and grid[best - 1] > 0:
        low, high = math.log(grid[best - 1]), math.log(grid[best + 1])
        found = minimize_scalar(
            lambda s: -_cosine(prompts, math.exp(s), causal)[0],
            bounds=(low, high),
            method="bounded",
            options={"xatol": 1e-6},
        )
        if -found.fun >= scores[best]:
            beta = math.exp(float(found.x))
    cosine, uf, ff = _cosine(prompts, beta, causal)
    token_cos = []
    for prompt in prompts:
        a, b = _terms(prompt, beta, causal)
        denom = np.sqrt(prompt.u_norm2 * b)
        token_cos.extend((a[denom > 0] / denom[denom > 0]).tolist())
    cos0 = _cosine(prompts, 0.0, causal)[0]
    if cosine <= 0:  # nothing explained: no beta to speak of
        beta = float("nan")
    n_tokens = sum(p.u_norm2.size for p in prompts)
    uu = float(sum(p.u_norm2.sum() for p in prompts))
    return BetaFit(
        beta=beta,
        step=max(0.0, uf / ff) if ff > 0 else 0.0,
        r2=max(0.0, cosine) ** 2,
        cosine=cosine,
        token_cosine=float(np.mean(token_cos)) if token_cos else float("nan"),
        r2_beta0=max(0.0, cos0) ** 2,
        update=math.sqrt(uu / n_tokens),
        n_tokens=n_tokens,
    )


@dataclass(frozen=True)
class EffectiveBeta:
    """Per-layer fits: ``fits[l]`` fits the step from ``time[l]`` to ``time[l + 1]``."""

    time: np.ndarray
    fits: list[BetaFit]
    causal: bool
    field: str = "identity"  # "identity" (Q = K = V = I) or "heads" (the layer's own)

    def column(self, name: str) -> np.ndarray:
        return np.array([getattr(fit, name) for fit in self.fits], dtype=np.float64)

    def to_dict(self) -> dict[str, Any]:
        names = ("beta", "step", "r2", "cosine", "token_cosine", "r2_beta0", "update")
        return {
            "causal": self.causal,
            "field": self.field,
            "layer": self.time[:-1].tolist(),
            **{name: self.column(name).tolist() for name in names},
        }


def effective_beta(
    states: Any,
    groups: Sequence[int] | np.ndarray | None = None,
    *,
    causal: bool = False,
    betas: np.ndarray | None = None,
    heads: Callable[[int, np.ndarray], tuple[np.ndarray, np.ndarray]] | None = None,
) -> EffectiveBeta:
    """Fit every consecutive pair of times (a traced run: every layer).

    Args:
        states: Dataset / DataArray ``(time, particle, feature)`` (groups
            default to ``prompt_index``) or an array ``(time, n, d)``.
        groups: ``(n,)`` prompt of each particle; each prompt is its own system.
        causal: the causal mask (use the model's).
        betas: see :func:`fit_beta`.
        heads: ``heads(l, x)`` gives the head inputs of layer ``l`` for one
            prompt's raw states ``x`` ``(n, d)`` at time ``l`` (the layer's own
            attention, e.g. ``functools.partial(head_inputs, model)``);
            ``None``: Q = K = V = I.

    Returns:
        An ``EffectiveBeta``: one :func:`fit_beta` result per step in
        ``fits``; ``column("beta")`` gives the fitted betas.

    Example:
        A simulated run's steps are fitted back to its own ``beta``:

        >>> sim = tf.simulate(tf.Dynamics(beta=4.0), tf.initial_condition("uniform", n=8, d=3),
        ...                   t_max=1.0, dt=0.1)
        >>> fit = tf.effective_beta(sim.states.values)
        >>> len(fit.fits), bool(np.allclose(fit.column("beta"), 4.0, rtol=1e-2))
        (10, True)
    """
    # the causal mask follows token order (``position``)
    x, groups, time, order = trajectory_arrays(states, groups)
    if x.ndim != 3 or x.shape[0] < 2:
        raise UserError(f"need states (time >= 2, particle, feature), got shape {x.shape}")
    time = np.arange(x.shape[0]) if time is None else np.asarray(time)
    labels = np.zeros(x.shape[1], dtype=np.int64) if groups is None else np.asarray(groups)
    members = [np.flatnonzero(labels == g) for g in np.unique(labels)]
    if order is not None:
        members = [m[np.argsort(order[m], kind="stable")] for m in members]
    fits = []
    for t in range(x.shape[0] - 1):
        inputs = None if heads is None else [heads(t, x[t, m]) for m in members]
        pairs = [(x[t, m], x[t + 1, m]) for m in members]
        fits.append(fit_beta(pairs, causal=causal, betas=betas, heads=inputs))
    return EffectiveBeta(time, fits, causal, "identity" if heads is None else "heads")

"""Self-attention dynamics: parameters in a frozen dataclass, a pure vector field.

Tokens ``x_1..x_n`` move by (Geshkovski-Letrouit-Polyanskiy-Rigollet, "A
mathematical perspective on transformers", arXiv 2312.10794)::

    dx_i/dt = P_{x_i}^perp ( (1/H) sum_h sum_j w^h_ij V_h x_j  +  MLP(x_i) )
    w^h_ij  = exp(beta <Q_h x_i, K_h x_j>) / Z^h_i
    SA:  Z^h_i = sum_k exp(beta <Q_h x_i, K_h x_k>)       (true softmax attention)
    USA: Z^h_i = n                                          (unnormalised)
    P_x^perp(v) = v - <v, x> x

A residual layer is one Euler step of this flow and layer norm the projection
back to the sphere. Options:

- ``Q, K, V``: identity by default, or ``(d, d)`` matrices, ``(H, d, d)`` for
  ``H`` heads (averaged), or ``(L, H, d, d)`` for parameters that are piecewise
  constant in time, layer ``l`` acting on ``[l * layer_time, (l + 1) * layer_time)``
  (the last layer continues past the end).
- ``mlp``: an optional per-token term ``W2 sigma(W1 x + b1) + b2`` (:class:`Mlp`).
- ``causal``: token ``i`` attends to ``j <= i``.
- ``state``: ``"sphere"`` (projected field; post-norm), ``"free"`` (no
  projection, no normalisation: the state lives in R^d) or ``"prenorm"``
  (attention reads ``x / |x|``, the update is not projected:
  ``dx_i/dt = Attn(N(x))_i``).
- ``time``: ``"paper"`` (the weights above) or ``"rescaled"``: the USA weights
  become ``exp(beta (<Qx, Ky> - 1)) / n``, i.e. time runs ``e^beta`` times slower.
  SA is unchanged (the factor cancels in ``Z_i``).

The field is :meth:`Dynamics.vector_field` ``(t, x) -> dx/dt``; ``x`` is
``(..., n, d)`` with any leading batch dims, and the result follows its dtype
and device.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np
import torch

from tokenfield.errors import ParameterError, UserError
from tokenfield.particles.kernels import attention

Normalization = Literal["sa", "usa"]
StateSpace = Literal["sphere", "free", "prenorm"]
TimeConvention = Literal["paper", "rescaled"]
Activation = Literal["relu", "gelu", "tanh", "identity"]

# Parameters listed in the run config in full up to this many numbers, else by digest.
CONFIG_INLINE_LIMIT = 4096


def _as_tensor(name: str, value: Any) -> torch.Tensor:
    """A floating tensor: tensors keep their dtype and device, anything else
    becomes float64 on the CPU."""
    if isinstance(value, torch.Tensor):
        tensor = value.detach()
        if not tensor.is_floating_point():
            tensor = tensor.to(torch.float64)
    else:
        try:
            tensor = torch.as_tensor(np.asarray(value, dtype=np.float64))
        except (TypeError, ValueError) as exc:
            raise UserError(
                f"{name} is not a numeric array ({exc})", f"pass {name} as numbers"
            ) from None
    if not torch.isfinite(tensor).all():
        raise UserError(f"{name} has non-finite entries", f"pass a finite {name}")
    return tensor


def describe_tensor(tensor: torch.Tensor | None) -> Any:
    """JSON data for a parameter: the numbers when small, else shape and digest."""
    if tensor is None:
        return None
    array = tensor.detach().cpu().to(torch.float64).numpy()
    if array.size <= CONFIG_INLINE_LIMIT:
        return array.tolist()
    digest = hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()[:16]
    return {"shape": list(array.shape), "sha256": digest}


@dataclass(frozen=True, eq=False)
class Mlp:
    """A per-token feed-forward term ``W2 sigma(W1 x + b1) + b2``.

    Args:
        w_in: ``(m, d)`` or ``(L, m, d)`` (per layer).
        w_out: ``(d, m)`` or ``(L, d, m)``.
        b_in: ``(m,)`` / ``(L, m)``; zero when omitted.
        b_out: ``(d,)`` / ``(L, d)``; zero when omitted.
        activation: ``relu``, ``gelu``, ``tanh`` or ``identity``.

    Example:
        >>> gen = torch.Generator().manual_seed(0)
        >>> w_in = torch.randn(5, 3, generator=gen, dtype=torch.float64)
        >>> w_out = 0.1 * torch.randn(3, 5, generator=gen, dtype=torch.float64)
        >>> dyn = tf.Dynamics(beta=1.0, mlp=tf.Mlp(w_in, w_out, activation="gelu"))
        >>> x0 = tf.initial_condition("uniform", n=8, d=3, seed=0)
        >>> dict(tf.simulate(dyn, x0, t_max=0.2, dt=0.1).sizes)
        {'time': 3, 'particle': 8, 'feature': 3}
    """

    w_in: Any
    w_out: Any
    b_in: Any = None
    b_out: Any = None
    activation: Activation = "relu"

    def __post_init__(self) -> None:
        if self.activation not in ("relu", "gelu", "tanh", "identity"):
            raise UserError(
                f"unknown MLP activation {self.activation!r}", "use relu, gelu, tanh or identity"
            )
        w_in = _as_tensor("mlp.w_in", self.w_in)
        w_out = _as_tensor("mlp.w_out", self.w_out)
        if w_in.ndim == 2:
            w_in = w_in.unsqueeze(0)
        if w_out.ndim == 2:
            w_out = w_out.unsqueeze(0)
        if w_in.ndim != 3 or w_out.ndim != 3:
            raise UserError("mlp weights must be (m, d) and (d, m), or per layer (L, m, d)")
        layers, hidden, dim = w_in.shape
        if w_out.shape[1:] != (dim, hidden) or w_out.shape[0] not in (1, layers):
            raise UserError(
                f"mlp.w_out has shape {tuple(w_out.shape)}, expected (d, m) = ({dim}, {hidden})",
                "pass w_out as the transpose shape of w_in",
            )
        layers = max(layers, w_out.shape[0])
        b_in = torch.zeros(hidden) if self.b_in is None else _as_tensor("mlp.b_in", self.b_in)
        b_out = torch.zeros(dim) if self.b_out is None else _as_tensor("mlp.b_out", self.b_out)
        b_in = b_in.unsqueeze(0) if b_in.ndim == 1 else b_in
        b_out = b_out.unsqueeze(0) if b_out.ndim == 1 else b_out
        if b_in.ndim != 2 or b_in.shape[-1] != hidden or b_out.ndim != 2 or b_out.shape[-1] != dim:
            raise UserError("mlp biases must be (m,) and (d,), or per layer (L, m) and (L, d)")
        for name, t in (("w_in", w_in), ("w_out", w_out), ("b_in", b_in), ("b_out", b_out)):
            if t.shape[0] not in (1, layers):
                raise UserError(f"mlp.{name} has {t.shape[0]} layers, expected 1 or {layers}")
            object.__setattr__(self, name, t)

    @property
    def layers(self) -> int:
        return max(t.shape[0] for t in (self.w_in, self.w_out, self.b_in, self.b_out))

    @property
    def dim(self) -> int:
        return int(self.w_in.shape[-1])

    def at_layer(self, layer: int) -> Mlp:
        def pick(t: torch.Tensor) -> torch.Tensor:
            return t[min(layer, t.shape[0] - 1)].unsqueeze(0)

        return replace(
            self,
            w_in=pick(self.w_in),
            w_out=pick(self.w_out),
            b_in=pick(self.b_in),
            b_out=pick(self.b_out),
        )

    def to(self, dtype: torch.dtype, device: torch.device | str) -> Mlp:
        return replace(
            self,
            **{
                name: getattr(self, name).to(dtype=dtype, device=device)
                for name in ("w_in", "w_out", "b_in", "b_out")
            },
        )

    def __call__(self, y: torch.Tensor, layer: int = 0) -> torch.Tensor:
        """``(..., n, d) -> (..., n, d)`` for layer ``layer``."""

        def pick(t: torch.Tensor) -> torch.Tensor:
            return t[min(layer, t.shape[0] - 1)].to(dtype=y.dtype, device=y.device)

        hidden = y @ pick(self.w_in).T + pick(self.b_in)  # (..., n, m)
        if self.activation == "relu":
            hidden = torch.relu(hidden)
        elif self.activation == "gelu":
            hidden = torch.nn.functional.gelu(hidden)
        elif self.activation == "tanh":
            hidden = torch.tanh(hidden)
        return hidden @ pick(self.w_out).T + pick(self.b_out)  # (..., n, d)

    def to_config(self) -> dict[str, Any]:
        return {
            "activation": self.activation,
            "w_in": describe_tensor(self.w_in),
            "w_out": describe_tensor(self.w_out),
            "b_in": describe_tensor(self.b_in),
            "b_out": describe_tensor(self.b_out),
        }


def _canonical_matrix(name: str, value: Any) -> torch.Tensor | None:
    """``None`` (identity) or a ``(L, H, d, d)`` tensor."""
    if value is None:
        return None
    tensor = _as_tensor(name, value)
    if tensor.ndim < 2 or tensor.ndim > 4 or tensor.shape[-1] != tensor.shape[-2]:
        raise UserError(
            f"{name} has shape {tuple(tensor.shape)}; expected (d, d), (heads, d, d) "
            "or (layers, heads, d, d)",
            f"pass square matrices for {name}",
        )
    while tensor.ndim < 4:
        tensor = tensor.unsqueeze(0)
    return tensor


@dataclass(frozen=True, eq=False)
class Dynamics:
    """Parameters of the self-attention particle system (see the module docstring).

    Args:
        beta: inverse temperature (finite; any sign).
        normalization: ``"sa"`` (softmax attention, ``Z_i`` = row sum) or
            ``"usa"`` (``Z_i = n``).
        query: ``None`` (identity) or ``(d, d)``, ``(H, d, d)`` or
            ``(L, H, d, d)`` matrices; see :func:`random_matrices`.
        key: as ``query``.
        value: as ``query``.
        mlp: optional per-token term, :class:`Mlp`.
        causal: token ``i`` attends to tokens ``j <= i`` only.
        state: ``"sphere"``, ``"free"`` or ``"prenorm"``.
        time: ``"paper"`` or ``"rescaled"``.
        layer_time: how long each layer's parameters act (per-layer parameters).
        chunk_size: queries per block where a block loop is used (the USA
            log-sum-exp fallback, CUDA float64); a memory knob only. ``None``
            picks blocks of 2 MiB (CPU) or 1 GiB (CUDA).

    Example:
        >>> q = tf.random_matrices(3, heads=2, seed=0)
        >>> v = tf.random_matrices(3, heads=2, seed=1)
        >>> dyn = tf.Dynamics(beta=1.0, query=q, key=q, value=v)
        >>> x0 = tf.initial_condition("uniform", n=8, d=3, seed=0)
        >>> dict(tf.simulate(dyn, x0, t_max=0.2, dt=0.1).sizes)
        {'time': 3, 'particle': 8, 'feature': 3}
    """

    beta: float = 1.0
    normalization: Normalization = "sa"
    query: Any = None
    key: Any = None
    value: Any = None
    mlp: Mlp | None = None
    causal: bool = False
    state: StateSpace = "sphere"
    time: TimeConvention = "paper"
    layer_time: float = 1.0
    chunk_size: int | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.beta, bool) or not isinstance(self.beta, (int, float, np.number)):
            raise UserError(f"beta must be a number, not {self.beta!r}", "pass e.g. beta=1.0")
        if not math.isfinite(float(self.beta)):
            raise ParameterError(
                "beta", f"{{name}} must be finite, not {self.beta}", "pass a finite {name}"
            )
        object.__setattr__(self, "beta", float(self.beta))
        if self.normalization not in ("sa", "usa"):
            raise UserError(
                f"unknown attention normalization {self.normalization!r}", "use 'sa' or 'usa'"
            )
        if self.state not in ("sphere", "free", "prenorm"):
            raise UserError(f"unknown state space {self.state!r}", "use sphere, free or prenorm")
        if self.time not in ("paper", "rescaled"):
            raise UserError(f"unknown time convention {self.time!r}", "use paper or rescaled")
        layer_time = float(self.layer_time)
        if not math.isfinite(layer_time) or layer_time <= 0:
            raise UserError(f"layer_time must be > 0, not {self.layer_time}")
        object.__setattr__(self, "layer_time", layer_time)
        if self.mlp is not None and not isinstance(self.mlp, Mlp):
            raise UserError(
                "mlp must be a tokenfield.particles.Mlp", "build it with Mlp(w_in, w_out)"
            )
        if self.chunk_size is not None and int(self.chunk_size) < 1:
            raise UserError(f"chunk_size must be >= 1, not {self.chunk_size}")
        matrices = {}
        for name in ("query", "key", "value"):
            matrices[name] = _canonical_matrix(name, getattr(self, name))
            object.__setattr__(self, name, matrices[name])
        given = [m for m in matrices.values() if m is not None]
        dims = {int(m.shape[-1]) for m in given} | ({self.mlp.dim} if self.mlp else set())
        if len(dims) > 1:
            raise UserError(
                f"query, key, value and mlp disagree on the dimension d: {sorted(dims)}"
            )
        heads = {int(m.shape[1]) for m in given} - {1}
        if len(heads) > 1:
            raise UserError(
                f"query, key and value disagree on the number of heads: {sorted(heads)}"
            )
        layers = {int(m.shape[0]) for m in given} | ({self.mlp.layers} if self.mlp else set())
        if len(layers - {1}) > 1:
            raise UserError(f"parameters disagree on the number of layers: {sorted(layers)}")

    # -- shape ------------------------------------------------------------------
    def _matrices(self) -> list[torch.Tensor]:
        return [m for m in (self.query, self.key, self.value) if m is not None]

    @property
    def dim(self) -> int | None:
        """The dimension ``d`` the parameters fix, or ``None`` (identity, no MLP)."""
        for m in self._matrices():
            return int(m.shape[-1])
        return self.mlp.dim if self.mlp is not None else None

    @property
    def heads(self) -> int:
        return max([int(m.shape[1]) for m in self._matrices()] + [1])

    @property
    def layers(self) -> int:
        counts = [int(m.shape[0]) for m in self._matrices()]
        if self.mlp is not None:
            counts.append(self.mlp.layers)
        return max(counts + [1])

    def layer_at(self, t: float) -> int:
        """Index of the layer acting at time ``t``."""
        if self.layers == 1:
            return 0
        return int(min(self.layers - 1, max(0, math.floor(t / self.layer_time + 1e-12))))

    def at_layer(self, layer: int) -> Dynamics:
        """The same dynamics with layer ``layer``'s parameters held constant."""

        def pick(m: torch.Tensor | None) -> torch.Tensor | None:
            return None if m is None else m[min(layer, m.shape[0] - 1)].unsqueeze(0)

        return replace(
            self,
            query=pick(self.query),
            key=pick(self.key),
            value=pick(self.value),
            mlp=None if self.mlp is None else self.mlp.at_layer(layer),
        )

    def to(self, dtype: torch.dtype, device: torch.device | str = "cpu") -> Dynamics:
        """A copy with every parameter tensor in ``dtype`` on ``device``."""

        def move(m: torch.Tensor | None) -> torch.Tensor | None:
            return None if m is None else m.to(dtype=dtype, device=device)

        return replace(
            self,
            query=move(self.query),
            key=move(self.key),
            value=move(self.value),
            mlp=None if self.mlp is None else self.mlp.to(dtype, device),
        )

    def check_state(self, x: torch.Tensor) -> None:
        """Raise :class:`UserError` unless ``x`` is ``(..., n, d)`` matching the parameters."""
        if x.ndim < 2:
            raise UserError(f"states must be (..., n, d), got shape {tuple(x.shape)}")
        if x.shape[-2] < 1:
            raise ParameterError(
                "n_particles",
                "there must be at least one particle (n >= 1)",
                "pass {name} 1 or more",
            )
        if x.shape[-1] < 2:
            raise ParameterError(
                "dim", f"the dimension must be d >= 2, not {x.shape[-1]}", "pass {name} 2 or more"
            )
        if self.dim is not None and x.shape[-1] != self.dim:
            raise UserError(
                f"states have d = {x.shape[-1]} but the parameters are {self.dim} x {self.dim}",
                "make the matrices match the dimension",
            )

    # -- the vector field ---------------------------------------------------------
    def vector_field(self, t: float, x: torch.Tensor) -> torch.Tensor:
        """``dx/dt`` at time ``t``; ``x`` is ``(..., n, d)``, result likewise."""
        return self.field_at_layer(self.layer_at(float(t)), x)

    __call__ = vector_field

    def _project(self, matrix: torch.Tensor | None, layer: int, y: torch.Tensor) -> torch.Tensor:
        """``(..., n, d) -> (..., H, n, d)``: rows ``M_h y_i`` for every head."""
        if matrix is None:
            return y.unsqueeze(-3).expand(*y.shape[:-2], self.heads, *y.shape[-2:])
        m = matrix[min(layer, matrix.shape[0] - 1)].to(dtype=y.dtype, device=y.device)  # (H, d, d)
        out = torch.einsum("...nd,hed->...hne", y, m)  # (..., H_m, n, d)
        if out.shape[-3] != self.heads:
            out = out.expand(*y.shape[:-2], self.heads, *y.shape[-2:])
        return out

    def attention_term(self, layer: int, y: torch.Tensor) -> torch.Tensor:
        """``(1/H) sum_h sum_j w^h_ij V_h y_j`` for layer ``layer``: ``(..., n, d)``."""
        q = self._project(self.query, layer, y)  # (..., H, n, d)
        k = self._project(self.key, layer, y)  # (..., H, n, d)
        v = self._project(self.value, layer, y)  # (..., H, n, d)
        log_scale = -self.beta if self.time == "rescaled" else 0.0
        out = attention(
            q,
            k,
            v,
            beta=self.beta,
            normalization=self.normalization,
            causal=self.causal,
            log_scale=log_scale,
            chunk_size=self.chunk_size,
        )  # (..., H, n, d)
        return out.mean(dim=-3)

    def field_at_layer(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        """The vector field with layer ``layer``'s parameters (no time lookup)."""
        y = x / x.norm(dim=-1, keepdim=True) if self.state == "prenorm" else x
        velocity = self.attention_term(layer, y)  # (..., n, d)
        if self.mlp is not None:
            velocity = velocity + self.mlp(y, min(layer, self.mlp.layers - 1))
        if self.state == "sphere":
            velocity = velocity - (velocity * x).sum(-1, keepdim=True) * x  # P_x^perp
        return velocity

    def retract(self, x: torch.Tensor) -> torch.Tensor:
        """Bring a stepped state back to where it lives (the sphere, or unchanged)."""
        if self.state == "sphere":
            return x / x.norm(dim=-1, keepdim=True)
        return x

    # -- config -------------------------------------------------------------------
    def to_config(self) -> dict[str, Any]:
        """JSON data describing the dynamics (large matrices by shape and digest)."""
        return {
            "beta": self.beta,
            "normalization": self.normalization,
            "causal": self.causal,
            "state": self.state,
            "time": self.time,
            "layer_time": self.layer_time,
            "heads": self.heads,
            "layers": self.layers,
            "query": describe_tensor(self.query),
            "key": describe_tensor(self.key),
            "value": describe_tensor(self.value),
            "mlp": None if self.mlp is None else self.mlp.to_config(),
        }

    def bilinear(self, layer: int = 0) -> np.ndarray | None:
        """``Q^T K`` of the first head of ``layer`` (``None`` for identity): the form
        ``<x, Q^T K y>`` that the energy uses."""
        if self.query is None and self.key is None:
            return None
        d = self.dim
        eye = torch.eye(d, dtype=torch.float64)
        q = eye if self.query is None else self.query[min(layer, self.query.shape[0] - 1), 0]
        k = eye if self.key is None else self.key[min(layer, self.key.shape[0] - 1), 0]
        return (q.T.to(torch.float64) @ k.to(torch.float64)).cpu().numpy()


Ensemble = Literal["gaussian", "orthogonal", "symmetric", "identity"]


@dataclass(frozen=True)
class DynamicsSpec:
    """The choices of the ``Q = K = V = I`` dynamics that a sweep's settings fix
    (the base of :class:`~tokenfield.MetastabilityConfig`,
    :class:`~tokenfield.PhaseDiagramConfig` and the simulation recipe; its
    fields are theirs, checked on construction).

    Attributes:
        normalization: ``"sa"`` or ``"usa"`` (:class:`Dynamics`).
        time: ``"paper"`` or ``"rescaled"`` (:class:`Dynamics`).

    Raises:
        ParameterError: an unknown ``normalization`` or ``time``.
    """

    normalization: str = "sa"
    time: str = "paper"

    def __post_init__(self) -> None:
        for param, value, known in (
            ("normalization", self.normalization, ("sa", "usa")),
            ("time", self.time, ("paper", "rescaled")),
        ):
            if value not in known:
                raise ParameterError(
                    param, f"unknown {{name}} {value!r}", f"use {' or '.join(known)}"
                )

    def dynamics_at(self, beta: float) -> Dynamics:
        """The :class:`Dynamics` with these choices at inverse temperature ``beta``
        (``Q = K = V = I``, no mask, on the sphere; the simulation recipe's own
        ``dynamics(dim)`` adds its matrices, mask and state space)."""
        return Dynamics(beta=beta, normalization=self.normalization, time=self.time)


def random_matrices(
    dim: int,
    *,
    heads: int = 1,
    layers: int | None = None,
    ensemble: Ensemble = "gaussian",
    scale: float = 1.0,
    seed: int = 0,
) -> torch.Tensor:
    """A seeded random ensemble of ``d x d`` matrices, float64 on CPU.

    Args:
        dim: ``d``.
        heads: ``H``.
        layers: ``L`` (``None``: no layer axis).
        ensemble: ``gaussian`` (i.i.d. ``N(0, 1/d)`` entries), ``orthogonal``
            (Haar), ``symmetric`` (``(G + G^T) / sqrt(2)``, G gaussian) or
            ``identity``.
        scale: multiplies every matrix.
        seed: the same seed gives the same matrices on every machine.

    Returns:
        ``(H, d, d)`` or ``(L, H, d, d)``.

    Example:
        >>> tuple(tf.random_matrices(3, heads=2, seed=0).shape)
        (2, 3, 3)
        >>> tuple(tf.random_matrices(3, heads=2, layers=4, ensemble="orthogonal").shape)
        (4, 2, 3, 3)
    """
    if dim < 2:
        raise ParameterError(
            "dim", f"the dimension must be d >= 2, not {dim}", "pass {name} 2 or more"
        )
    if heads < 1 or (layers is not None and layers < 1):
        raise UserError("heads and layers must be >= 1")
    if not math.isfinite(scale):
        raise UserError(f"the matrix scale must be finite, not {scale}")
    shape = (layers or 1, heads, dim, dim)
    gen = torch.Generator().manual_seed(int(seed))
    if ensemble == "identity":
        out = torch.eye(dim, dtype=torch.float64).expand(shape).clone()
    elif ensemble == "gaussian":
        out = torch.randn(shape, generator=gen, dtype=torch.float64) / math.sqrt(dim)
    elif ensemble == "symmetric":
        g = torch.randn(shape, generator=gen, dtype=torch.float64) / math.sqrt(dim)
        out = (g + g.transpose(-1, -2)) / math.sqrt(2.0)
    elif ensemble == "orthogonal":
        g = torch.randn(shape, generator=gen, dtype=torch.float64)
        qmat, rmat = torch.linalg.qr(g)
        # sign fix makes the distribution Haar and the result unique
        out = qmat * torch.sign(torch.diagonal(rmat, dim1=-2, dim2=-1)).unsqueeze(-2)
    else:
        raise UserError(
            f"unknown matrix ensemble {ensemble!r}",
            "use gaussian, orthogonal, symmetric or identity",
        )
    out = out * scale
    return out if layers is not None else out[0]

"""The last token's layer map, its Jacobians and their singular values.

Depth is time: block ``l`` maps the last token's raw residual state ``x_l`` (its
input) to ``x_{l+1}``. The other tokens of the prompt are held at their traced
states; attention is causal, so they do not depend on the last token and the
map is a function of ``x_l`` alone::

    F_l(x) = block_l(H_l[:-1] with x appended)[-1]

:class:`LayerMap` captures, in one forward pass, every block's call (mask,
rotary angles, position ids) and the prefix keys and values of every block,
then evaluates ``F_l`` on the last token only: the block is called on one
column with a cache that hands it the prefix's keys and values (the
Hugging Face decoding path), so evaluating the map costs one token, not the
whole prompt. Rows are independent: a batch of ``m * B`` rows is ``m`` copies of
the ``B`` prompts (row ``r`` belongs to prompt ``r % B``).

Linear algebra on maps (:func:`top_singular`): the top-k singular values of a
map's Jacobian, or of its angular part
``P^perp(y_out) J P^perp(y_in) |x_in| / |x_out|`` (``y = x / |x|``), by block
subspace iteration with ``torch.func.jvp`` (``J V``) and ``torch.func.vjp``
(``U^T J``); the Jacobian is never materialised. The Ritz pairs satisfy
``M^T u_i = sigma_i v_i`` exactly, and the iteration stops when the residual
``|M v_1 - sigma_1 u_1| / sigma_1`` of the top pair is below ``tol``: then
``sigma_1`` is within that relative distance of a singular value of ``M``
(the residual bound for singular values). The others converge more slowly
(their rate is the gap ``sigma_{k+p+1} / sigma_i`` of the oversampled block);
their residuals are returned too.

The code takes any map ``f((m*B, *S)) -> (m*B, *S)`` with independent rows; the
trailing axis is the one that the radial projection acts on, so a particle
configuration ``(B, n, d)`` is projected particle by particle.
"""

from __future__ import annotations

import contextlib
import inspect
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from tokenfield.errors import UserError

__all__ = [
    "LayerMap",
    "ProductSpectrum",
    "Spectrum",
    "angle_between",
    "lanczos_singular",
    "product_spectra",
    "radial_project",
    "tangent_directions",
    "tangent_maps",
    "top_singular",
]

Map = Callable[[torch.Tensor], torch.Tensor]


# ---------------------------------------------------------------- geometry


def radial_project(y: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``P^perp(y) v = v - y <y, v>`` along the last axis (``y`` unit, broadcast)."""
    return v - y * (y * v).sum(-1, keepdim=True)


def _unit(x: torch.Tensor) -> torch.Tensor:
    return x / x.norm(dim=-1, keepdim=True)


def angle_between(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The angle between rows of ``a`` and ``b`` (last axis), stable near 0
    (``2 atan2(|a^ - b^|, |a^ + b^|)``)."""
    ua, ub = _unit(a), _unit(b)
    return 2 * torch.atan2((ua - ub).norm(dim=-1), (ua + ub).norm(dim=-1))


def tangent_directions(
    y: torch.Tensor, count: int, generator: torch.Generator | None = None
) -> torch.Tensor:
    """``count`` random unit tangent directions at each row of ``y`` ``(B, d)``:
    ``(count, B, d)``, Gaussian projected by ``P^perp(y)`` and normalised."""
    noise = torch.randn(
        (count, *y.shape), generator=generator, dtype=torch.float64, device="cpu"
    ).to(dtype=y.dtype, device=y.device)
    return _unit(radial_project(y.unsqueeze(0), noise))


# ---------------------------------------------------------------- spectra


@dataclass(frozen=True)
class Spectrum:
    """Top singular values of a linear map per batch row.

    Attributes:
        values: ``(B, k)`` singular values, descending.
        right: ``(B, *S, k)`` right singular vectors (the most sensitive input
            directions, ``right[..., 0]`` first).
        residual: ``(B, k)`` relative residuals ``|M v_i - sigma_i u_i| / sigma_i``
            (``sigma_i`` is within that relative distance of a singular value).
        iterations: the iterations run.
    """

    values: torch.Tensor
    right: torch.Tensor
    residual: torch.Tensor
    iterations: int


def _flat(t: torch.Tensor, batch: int, m: int) -> torch.Tensor:
    """``(m*B, *S)`` rows -> ``(B, D, m)`` columns."""
    return t.reshape(m, batch, -1).permute(1, 2, 0)


def _rows(t: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    """``(B, D, m)`` columns -> ``(m*B, *S)`` rows."""
    batch, _, m = t.shape
    return t.permute(2, 0, 1).reshape(m * batch, *shape)


def _orth(a: torch.Tensor) -> torch.Tensor:
    return torch.linalg.qr(a).Q


class _Linearised:
    """A row map linearised at ``x0`` for ``m`` columns per row, the forward pass done once.

    ``pull(U) = J^T U`` is a reused ``torch.func.vjp`` pullback of ``f`` on ``m``
    copies of the batch; ``push(V) = J V`` is the pullback of that pullback (it is
    linear in its argument, so its own pullback is ``J``: the double-vjp form of a
    ``jvp``, which reuses the same forward pass). Both take and return rows
    ``(m*B, *S)`` (row ``r`` is column ``r // B`` of prompt ``r % B``).
    """

    def __init__(self, f: Map, x0: torch.Tensor, m: int):
        self.batch, self.shape, self.m = x0.shape[0], tuple(x0.shape[1:]), m
        primal = x0.repeat(m, *([1] * len(self.shape)))  # (m*B, *S)
        out, self._pullback = torch.func.vjp(f, primal)
        self.out0 = out[: self.batch].detach()
        _, self._push = torch.func.vjp(lambda u: self._pullback(u)[0], torch.zeros_like(out))

    def push(self, v: torch.Tensor) -> torch.Tensor:
        return self._push(v)[0].detach()

    def pull(self, u: torch.Tensor) -> torch.Tensor:
        return self._pullback(u)[0].detach()


def tangent_maps(
    f: Map, x0: torch.Tensor, m: int, *, angular: bool = False
) -> tuple[Callable[[torch.Tensor], torch.Tensor], Callable[[torch.Tensor], torch.Tensor]]:
    """``(matvec, rmatvec)``: ``V -> M V`` and ``U -> M^T U`` on ``m`` columns per row.

    ``V``, ``U`` are ``(B, D, m)`` (``D`` the flattened state); ``M = J`` or, with
    ``angular``, ``P^perp(y_out) J P^perp(y_in) |x_in| / |x_out|``. The map is
    linearised once (one forward pass of ``f`` on ``m`` copies of the batch):
    ``rmatvec`` reuses its ``torch.func.vjp`` pullback and ``matvec`` the pullback
    of that pullback (equal to ``torch.func.jvp``, without a new forward pass).
    """
    batch, shape = x0.shape[0], tuple(x0.shape[1:])
    ones = [1] * len(shape)
    linear = _Linearised(f, x0, m)
    out0 = linear.out0
    y_in, y_out = _unit(x0).repeat(m, *ones), _unit(out0).repeat(m, *ones)
    scale = (x0.norm(dim=-1, keepdim=True) / out0.norm(dim=-1, keepdim=True)).repeat(m, *ones)

    def project_in(v: torch.Tensor) -> torch.Tensor:
        return radial_project(y_in, v) if angular else v

    def project_out(w: torch.Tensor) -> torch.Tensor:
        return radial_project(y_out, w) * scale if angular else w

    def matvec(v_cols: torch.Tensor) -> torch.Tensor:
        out = linear.push(project_in(_rows(v_cols, shape)))
        return _flat(project_out(out), batch, m)

    def rmatvec(u_cols: torch.Tensor) -> torch.Tensor:
        back = linear.pull(project_out(_rows(u_cols, shape)))
        return _flat(project_in(back), batch, m)

    return matvec, rmatvec


def top_singular(
    f: Map,
    x0: torch.Tensor,
    k: int = 4,
    *,
    angular: bool = False,
    oversample: int = 4,
    max_iter: int = 50,
    tol: float = 1e-4,
    seed: int = 0,
) -> Spectrum:
    """Top-k singular values of ``J = df/dx`` at ``x0`` ``(B, *S)``, per row.

    With ``angular``, of ``P^perp(y_out) J P^perp(y_in) |x_in| / |x_out|``
    (``y`` the unit vectors along the last axis, norms over the last axis; for
    ``S = (d,)`` a scalar per row, for particles ``(n, d)`` one per particle).

    ``f`` must take ``(m*B, *S)`` (``m`` copies of the batch) with independent
    rows. Block subspace iteration on ``m = k + oversample`` columns: ``W = M V``
    (one ``jvp``), ``Q = qr(W)``, ``Z = M^T Q`` (one ``vjp``), ``Z = V' S U'^T``,
    until the top pair's relative residual is below ``tol`` in every row.
    """
    if k < 1:
        raise UserError(f"k must be at least 1, got {k}", "pass k >= 1")
    batch, shape = x0.shape[0], tuple(x0.shape[1:])
    dim = math.prod(shape)
    m = min(dim, k + max(0, oversample))
    k = min(k, m)
    matvec, rmatvec = tangent_maps(f, x0, m, angular=angular)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    start = torch.randn((batch, dim, m), generator=gen, dtype=torch.float64)
    v = _orth(start.to(dtype=x0.dtype, device=x0.device))
    sigma = left = None
    residual = torch.full((batch, k), float("inf"), dtype=x0.dtype, device=x0.device)
    iterations = 0
    for iterations in range(1, max_iter + 2):
        w = matvec(v)  # (B, D, m): M v_i
        if sigma is not None:
            gap = (w[..., :k] - left[..., :k] * sigma[:, None, :k]).norm(dim=1)
            residual = gap / sigma[:, :k].clamp_min(torch.finfo(x0.dtype).tiny)
            if bool((residual[:, 0] <= tol).all()) or iterations > max_iter:
                break
        q = _orth(w)
        z = rmatvec(q)  # (B, D, m) = M^T Q
        vz, s, uh = torch.linalg.svd(z, full_matrices=False)
        v, sigma, left = vz, s, q @ uh.transpose(-1, -2)  # M^T u_i = s_i v_i
    assert sigma is not None
    right = v[..., :k].reshape(batch, *shape, k)
    return Spectrum(sigma[:, :k], right, residual, iterations - 1)


def lanczos_singular(
    f: Map,
    x0: torch.Tensor,
    k: int = 4,
    *,
    angular: bool = False,
    max_iter: int = 60,
    tol: float = 1e-4,
    seed: int = 0,
) -> Spectrum:
    """Top-k singular values of ``J = df/dx`` (or its angular part) at ``x0`` ``(B, *S)``
    by Golub-Kahan-Lanczos bidiagonalisation, one vector per row.

    Step ``j``: ``alpha_j q_j = M p_j - beta_{j-1} q_{j-1}``, ``beta_j p_{j+1} = M^T q_j -
    alpha_j p_j``, both fully re-orthogonalised (twice) against the earlier vectors,
    so ``M P = Q B`` with ``B`` upper bidiagonal. The Ritz pairs of ``B = X S Y^T``
    (``v = P y``, ``u = Q x``) satisfy ``M v_i = sigma_i u_i`` and
    ``|M^T u_i - sigma_i v_i| = beta_j |x_i[j]|``: it stops when that relative
    residual of the top pair is below ``tol`` in every row (then ``sigma_1`` is within
    that relative distance of a singular value of ``M``), or after ``max_iter``
    steps; the other ``k - 1`` pairs must reach ``sqrt(tol)`` too (they are
    approximate). Each step is one ``J v`` and one ``J^T u`` on a single column: a Krylov
    method, so clustered top values (block Jacobians near the identity) converge in
    far fewer column passes than the block subspace iteration of :func:`top_singular`.
    """
    if k < 1:
        raise UserError(f"k must be at least 1, got {k}", "pass k >= 1")
    batch, shape = x0.shape[0], tuple(x0.shape[1:])
    dim = math.prod(shape)
    steps = min(dim, max(max_iter, k))
    matvec, rmatvec = tangent_maps(f, x0, 1, angular=angular)
    tiny = torch.finfo(x0.dtype).tiny
    gen = torch.Generator(device="cpu").manual_seed(seed)
    start = torch.randn((batch, dim), generator=gen, dtype=torch.float64)
    if angular:  # start in the tangent space (the range of M^T)
        start = radial_project(_unit(x0.reshape(batch, dim)).double().cpu(), start)
    p_vec = _unit(start.to(dtype=x0.dtype, device=x0.device))
    right: list[torch.Tensor] = [p_vec]
    left: list[torch.Tensor] = []
    alphas: list[torch.Tensor] = []
    betas: list[torch.Tensor] = []

    def reorth(vec: torch.Tensor, basis: list[torch.Tensor]) -> torch.Tensor:
        if not basis:
            return vec
        stack = torch.stack(basis, -1)  # (B, D, j)
        for _ in range(2):
            vec = vec - (stack @ (stack.transpose(-1, -2) @ vec[..., None]))[..., 0]
        return vec

    sigma = x_mat = y_mat = None
    residual = torch.full((batch, k), float("inf"), dtype=x0.dtype, device=x0.device)
    for j in range(steps):
        q = matvec(right[j][..., None])[..., 0]
        if j > 0:
            q = q - betas[-1][:, None] * left[-1]
        q = reorth(q, left)
        alpha = q.norm(dim=-1)
        left.append(q / alpha.clamp_min(tiny)[:, None])
        alphas.append(alpha)
        r = rmatvec(left[-1][..., None])[..., 0] - alpha[:, None] * right[j]
        r = reorth(r, right)
        beta = r.norm(dim=-1)
        betas.append(beta)
        n = j + 1
        bidiag = torch.diag_embed(torch.stack(alphas, -1))
        if n > 1:
            bidiag = bidiag + torch.diag_embed(torch.stack(betas[:-1], -1), offset=1)
        x_mat, sigma, yh = torch.linalg.svd(bidiag)  # (B, n, n), (B, n), (B, n, n)
        y_mat = yh.transpose(-1, -2)
        kk = min(k, n)
        gap = beta[:, None] * x_mat[:, -1, :kk].abs()
        residual = gap / sigma[:, :kk].clamp_min(tiny)
        if (
            n >= min(k, steps)
            and bool((residual[:, 0] <= tol).all())
            and bool((residual <= math.sqrt(tol)).all())
        ):
            break
        if n < steps:
            right.append(r / beta.clamp_min(tiny)[:, None])
    assert sigma is not None and y_mat is not None
    n = sigma.shape[-1]
    kk = min(k, n)
    basis = torch.stack(right[:n], -1)  # (B, D, n)
    vectors = (basis @ y_mat[..., :kk]).reshape(batch, *shape, kk)
    return Spectrum(sigma[:, :kk], vectors, residual[:, :kk], n)


def _rows_of(f: Map, batch: int, rows: slice) -> Map:
    """A :meth:`LayerMap.block_fn` map of ``batch`` prompts restricted to the prompts
    ``rows`` (other maps cannot be sliced: the error says to raise ``max_rows``)."""
    owner = getattr(f, "layer_map", None)
    if owner is not None:
        return owner.select(torch.arange(batch)[rows]).block_fn(f.block_index)
    raise ValueError("product_spectra can slice only LayerMap.block_fn maps; pass max_rows larger")


@dataclass(frozen=True)
class ProductSpectrum:
    """Top singular values of the products ``M_l`` from every start block ``l`` to the end.

    Attributes:
        starts: the start blocks ``l``, increasing.
        values: ``(B, n_start, k)`` singular values of each ``M_l``, descending (the
            first to the residual below; the others are Ritz values on a shared
            subspace: lower bounds, approximate).
        right: ``(B, n_start, *S)`` the top right singular vector of each ``M_l``.
        residual: ``(B, n_start)`` relative residual ``|M_l v_1 - sigma_1 u_1| / sigma_1``
            of the top pair.
        iterations: the sweeps run (one backward and one forward sweep each).
    """

    starts: tuple[int, ...]
    values: torch.Tensor
    right: torch.Tensor
    residual: torch.Tensor
    iterations: int


def product_spectra(
    blocks: Sequence[Map],
    states: torch.Tensor,
    starts: Sequence[int],
    k: int = 4,
    *,
    angular: bool = True,
    oversample: int = 4,
    max_iter: int = 50,
    tol: float = 1e-4,
    seed: int = 0,
    max_rows: int = 8192,
) -> ProductSpectrum:
    """Top-k singular values of ``M_l = P^perp(y_L) J_{L-1} ... J_l P^perp(y_l) |x_l|/|x_L|``
    for every start block ``l`` in ``starts`` at once (``J`` alone without ``angular``).

    ``blocks[j]`` maps ``x_j -> x_{j+1}`` (rows ``(m*B, *S)``, independent), and
    ``states`` ``(B, L + 1, *S)`` holds ``x_0 .. x_L``. Every block is linearised once
    (:class:`_Linearised`, ``p = len(starts) + k - 1 + oversample`` columns), then
    each iteration is two sweeps through the blocks, not one per start block:

    - backward: ``Z_l = M_l^T U`` for every ``l`` from one shared orthonormal
      output basis ``U`` ``(d, p)``, pulled back block by block (a start block reads
      its ``Z_l`` as the sweep passes); the Rayleigh-Ritz pairs of each ``M_l`` on
      ``U`` (``Z_l = V S U'^T``, ``u = U U'``) satisfy ``M_l^T u_i = sigma_i v_i``
      exactly;
    - forward: each start block's top right Ritz vector ``v_l`` enters the sweep at
      block ``l`` in its own column and is pushed to the output, ``W_l = M_l v_l``
      (the spare columns carry second and later Ritz vectors of the start blocks
      with the largest residuals); the next ``U`` is ``qr(W)``.

    So ``U`` always holds the power-iteration step ``M_l v_l`` of every start block
    and each ``sigma_1(M_l)`` converges at least as fast as a power iteration on
    ``M_l M_l^T`` would. It stops when the top pair's relative residual
    ``|M_l v_1 - sigma_1 u_1| / sigma_1`` is below ``tol`` for every start block and
    row (then ``sigma_1`` is within that relative distance of a singular value of
    ``M_l``) or after ``max_iter`` sweeps; the residuals are returned. The cost per
    iteration is ``2 L p`` column passes through one block, against
    ``2 (k + oversample) sum_l (L - l)`` for a separate subspace iteration per start.
    The linearisations of all ``L`` blocks are held at once (``L p B`` rows of
    saved activations), so the prompts are taken in slices of at most
    ``max_rows / (L p)`` (results concatenated, ``iterations`` the most any took).
    """
    if k < 1:
        raise UserError(f"k must be at least 1, got {k}", "pass k >= 1")
    starts = tuple(sorted({int(s) for s in starts}))
    n_blocks = len(blocks)
    batch = states.shape[0]
    p_cols = len(starts) + max(0, k - 1) + max(0, oversample)
    step = max(1, max_rows // max(1, n_blocks * p_cols))
    if batch > step:  # the linearisations of all blocks are held: bound their rows
        parts = [
            product_spectra(
                [_rows_of(f, batch, slice(i, min(batch, i + step))) for f in blocks],
                states[i : i + step], starts, k, angular=angular, oversample=oversample,
                max_iter=max_iter, tol=tol, seed=seed, max_rows=max_rows,
            )
            for i in range(0, batch, step)
        ]  # fmt: skip
        return ProductSpectrum(
            starts,
            torch.cat([q.values for q in parts]),
            torch.cat([q.right for q in parts]),
            torch.cat([q.residual for q in parts]),
            max(q.iterations for q in parts),
        )
    if not starts or starts[0] < 0 or starts[-1] >= n_blocks:
        raise ValueError(f"start blocks must lie in 0..{n_blocks - 1}, got {list(starts)}")
    batch, shape = states.shape[0], tuple(states.shape[2:])
    dim = math.prod(shape)
    n_start = len(starts)
    if dim < n_start:
        raise ValueError(f"{n_start} start blocks need a state of at least that size, got {dim}")
    p = min(dim, n_start + max(0, k - 1) + max(0, oversample))
    k = min(k, p)
    ones = [1] * len(shape)
    linear = [_Linearised(blocks[j], states[:, j], p) for j in range(n_blocks)]
    y = _unit(states)  # (B, L + 1, *S)
    norms = states.norm(dim=-1, keepdim=True)  # (B, L + 1, *S[:-1], 1)
    y_end = y[:, -1].repeat(p, *ones)

    def cols(t: torch.Tensor) -> torch.Tensor:  # (p*B, *S) -> (B, D, p)
        return _flat(t, batch, p)

    def rows(t: torch.Tensor) -> torch.Tensor:  # (B, D, p) -> (p*B, *S)
        return _rows(t, shape)

    def enter(start: int, t: torch.Tensor) -> torch.Tensor:
        """``P^perp(y_l) t |x_l| / |x_L|`` on rows (or ``t``)."""
        if not angular:
            return t
        reps = [t.shape[0] // batch, *ones]
        y_l = y[:, start].repeat(*reps)
        scale = (norms[:, start] / norms[:, -1]).repeat(*reps)
        return radial_project(y_l, t) * scale

    def backward(u_cols: torch.Tensor) -> torch.Tensor:
        """``(B, D, p)`` -> ``(n_start, B, D, p)``: ``M_l^T U`` for every start."""
        g = rows(u_cols)
        if angular:
            g = radial_project(y_end, g)
        out = [None] * n_start
        for j in range(n_blocks - 1, -1, -1):
            g = linear[j].pull(g)
            if j in starts:
                out[starts.index(j)] = cols(enter(j, g))
        return torch.stack(out)

    def forward(columns: list[tuple[int, torch.Tensor]]) -> torch.Tensor:
        """Column ``c`` enters at block ``columns[c][0]`` with ``(B, D)`` vectors;
        returns ``(B, D, p)``: each column's ``M_l v``."""
        t = torch.zeros((p * batch, *shape), dtype=states.dtype, device=states.device)
        for j in range(n_blocks):
            for c, (start, vec) in enumerate(columns):
                if start == j:
                    part = slice(c * batch, (c + 1) * batch)
                    t[part] = enter(j, vec.reshape(batch, *shape))
            t = linear[j].push(t)
        if angular:
            t = radial_project(y_end, t)
        return cols(t)

    gen = torch.Generator(device="cpu").manual_seed(seed)
    start_u = torch.randn((batch, dim, p), generator=gen, dtype=torch.float64)
    u_basis = _orth(start_u.to(dtype=states.dtype, device=states.device))
    residual = torch.full((batch, n_start), float("inf"), dtype=states.dtype, device=states.device)
    iterations = 0
    while iterations < max_iter:
        iterations += 1
        z = backward(u_basis)  # (n_start, B, D, p)
        vz, sigma, uh = torch.linalg.svd(z, full_matrices=False)  # (n, B, D, p), (n, B, p)
        left = u_basis[None] @ uh.transpose(-1, -2)  # (n, B, D, p): M^T u_i = s_i v_i
        # top vectors of every start, then the spare columns by largest residual
        order = torch.argsort(residual.amax(0), descending=True).tolist()
        spare = [(i, rank) for rank in range(1, p) for i in order][: p - n_start]
        columns = [(starts[i], vz[i, ..., 0]) for i in range(n_start)]
        columns += [(starts[i], vz[i, ..., rank]) for i, rank in spare]
        w = forward(columns)  # (B, D, p)
        top = w[..., :n_start].permute(2, 0, 1)  # (n, B, D): M_l v_l
        gap = (top - left[..., 0] * sigma[..., :1]).norm(dim=-1)
        residual = (gap / sigma[..., 0].clamp_min(torch.finfo(states.dtype).tiny)).T
        if bool((residual <= tol).all()):
            break
        u_basis = _orth(w)
    values = sigma[..., :k].permute(1, 0, 2)  # (B, n, k)
    right = vz[..., 0].permute(1, 0, 2).reshape(batch, n_start, *shape)
    return ProductSpectrum(starts, values, right, residual, iterations)


# ---------------------------------------------------------------- the model's map


class _PrefixCache:
    """Hands a block the prefix's keys and values (held fixed) before the new column's."""

    def __init__(self, keys: dict[int, torch.Tensor], values: dict[int, torch.Tensor]):
        self.keys, self.values = keys, values

    def update(self, key, value, layer_idx, *args, **kwargs):  # noqa: D401
        reps = key.shape[0] // self.keys[layer_idx].shape[0]
        pk, pv = self.keys[layer_idx], self.values[layer_idx]
        if reps > 1:
            pk, pv = pk.repeat(reps, 1, 1, 1), pv.repeat(reps, 1, 1, 1)
        return torch.cat([pk, key], dim=-2), torch.cat([pv, value], dim=-2)


class _RecordingCache:
    """Records each block's keys and values of the whole prompt; changes nothing."""

    def __init__(self):
        self.keys: dict[int, torch.Tensor] = {}
        self.values: dict[int, torch.Tensor] = {}

    def update(self, key, value, layer_idx, *args, **kwargs):  # noqa: D401
        self.keys[layer_idx], self.values[layer_idx] = key, value
        return key, value


def _cache_name(block: torch.nn.Module) -> str:
    params = inspect.signature(block.forward).parameters
    for name in ("cache", "past_key_values", "past_key_value"):
        if name in params:
            return name
    raise UserError(
        f"the block {type(block).__name__} takes no key/value cache",
        "the attractor analysis supports decoder models with a Hugging Face cache",
    )


def _hidden(value: Any) -> torch.Tensor:
    return value[0] if isinstance(value, tuple) else value


def _last_column(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The captured block kwargs of a full prompt, cut to its last query column."""
    out = dict(kwargs)
    mask = out.get("attention_mask")
    if isinstance(mask, torch.Tensor) and mask.dim() == 4:
        out["attention_mask"] = mask[:, :, -1:, :]
    pe = out.get("position_embeddings")
    if isinstance(pe, tuple):
        out["position_embeddings"] = tuple(t[:, -1:] for t in pe)
    for name in ("position_ids", "cache_position"):
        value = out.get(name)
        if isinstance(value, torch.Tensor):
            out[name] = value[..., -1:]
    out["use_cache"] = False
    return out


def _repeat_kwargs(kwargs: dict[str, Any], reps: int) -> dict[str, Any]:
    if reps == 1:
        return kwargs
    out = dict(kwargs)
    mask = out.get("attention_mask")
    if isinstance(mask, torch.Tensor) and mask.shape[0] > 1:
        out["attention_mask"] = mask.repeat(reps, *([1] * (mask.dim() - 1)))
    pe = out.get("position_embeddings")
    if isinstance(pe, tuple):
        out["position_embeddings"] = tuple(
            t.repeat(reps, *([1] * (t.dim() - 1))) if t.shape[0] > 1 else t for t in pe
        )
    value = out.get("position_ids")
    if isinstance(value, torch.Tensor) and value.shape[0] > 1:
        out["position_ids"] = value.repeat(reps, 1)
    return out


@contextlib.contextmanager
def _eager(model: torch.nn.Module) -> Iterator[None]:
    """Eager attention (plain matmul and softmax: forward-mode AD goes through it)."""
    from tokenfield.models.attention import eager_attention

    with eager_attention(model):
        yield


class LayerMap:
    """The last token's block maps of a batch of prompts (module docstring).

    Args:
        model: a loaded causal model (:func:`tokenfield.load_model`).
        token_ids: one list of token ids per prompt.

    Attributes:
        states: ``(B, L + 1, d)`` the last token's raw states ``x_0 .. x_L``
            (block inputs, then the last block's output before the final norm).
        n_blocks: ``L``.
    """

    def __init__(self, model: Any, token_ids: Sequence[Sequence[int]]):
        if not model.causal:
            raise UserError(
                f"model '{model.name}' is not causal",
                "the attractor analysis needs a decoder (the other tokens must not see the last)",
            )
        if min(len(ids) for ids in token_ids) < 2:
            raise UserError(
                "a prompt encodes to one token: the last token has no prompt to attend to",
                "give every prompt at least two tokens",
            )
        self.model = model
        self.blocks = model.sites.blocks
        self.n_blocks = len(self.blocks)
        self._cache_arg = _cache_name(self.blocks[0])
        self._capture(token_ids)

    def _capture(self, token_ids: Sequence[Sequence[int]]) -> None:
        from tokenfield.models.batching import Encoded, pad_batch
        from tokenfield.prompts import Prompt

        model = self.model
        batch = [Encoded(Prompt("?"), list(ids)) for ids in token_ids]
        inputs = {
            k: v.to(model.device) for k, v in pad_batch(batch, model, "last")["inputs"].items()
        }
        calls: list[tuple[torch.Tensor, dict[str, Any]]] = []

        def grab(_module, args, kwargs):
            # Eager attention leaves NaN in fully masked (left-padding) rows; they
            # are masked for every real token, so zeros change nothing but keep
            # 0 * NaN out of the real rows.
            hidden = torch.nan_to_num(args[0] if args else kwargs.pop("hidden_states"))
            rest = {k: v for k, v in kwargs.items() if k != "hidden_states"}
            calls.append((hidden.detach(), rest))
            return (hidden, *args[1:]), kwargs

        handles = [block.register_forward_pre_hook(grab, with_kwargs=True) for block in self.blocks]
        try:
            with _eager(model.model), torch.no_grad():
                model.model(**inputs, use_cache=False, logits_to_keep=1)
        finally:
            for handle in handles:
                handle.remove()
        if len(calls) != self.n_blocks:
            raise RuntimeError(f"captured {len(calls)} block calls, expected {self.n_blocks}")
        self._kwargs: list[dict[str, Any]] = []
        keys: dict[int, torch.Tensor] = {}
        values: dict[int, torch.Tensor] = {}
        states = [calls[0][0][:, -1]]
        with _eager(model.model), torch.no_grad():
            for index, (block, (hidden, kwargs)) in enumerate(zip(self.blocks, calls, strict=True)):
                recorder = _RecordingCache()
                full = dict(kwargs, use_cache=False)
                full[self._cache_arg] = recorder
                out = _hidden(block(hidden, **full))
                if len(recorder.keys) != 1:
                    raise UserError(
                        f"block {index} did not hand its keys and values to the cache",
                        "the attractor analysis supports Hugging Face decoder blocks",
                    )
                (layer_idx,) = recorder.keys
                keys[layer_idx] = recorder.keys[layer_idx][..., :-1, :]
                values[layer_idx] = recorder.values[layer_idx][..., :-1, :]
                self._kwargs.append(_last_column(kwargs))
                out = torch.nan_to_num(out)
                expected = calls[index + 1][0] if index + 1 < len(calls) else out
                gap = (out - expected)[:, -1].abs().max() / expected[:, -1].abs().max()
                if not bool(gap <= 1e-4):
                    raise RuntimeError(f"block {index} replayed with relative gap {float(gap):.1e}")
                states.append(out[:, -1])
        self._cache = _PrefixCache(keys, values)
        self.batch = len(token_ids)
        self.states = torch.stack(states, dim=1)  # (B, L + 1, d)

    @property
    def dtype(self) -> torch.dtype:
        return self.states.dtype

    def block(self, index: int, x: torch.Tensor) -> torch.Tensor:
        """``F_index`` on rows ``(m*B, d)`` (``m`` copies of the prompts)."""
        reps = x.shape[0] // self.batch
        if reps * self.batch != x.shape[0]:
            raise ValueError(f"{x.shape[0]} rows are not copies of {self.batch} prompts")
        kwargs = _repeat_kwargs(self._kwargs[index], reps)
        kwargs[self._cache_arg] = self._cache
        with _eager(self.model.model):
            return _hidden(self.blocks[index](x.unsqueeze(1), **kwargs))[:, 0]

    def onward(self, start: int, x: torch.Tensor, stop: int | None = None) -> torch.Tensor:
        """``F_{stop-1} o ... o F_start`` (``stop`` defaults to ``L``): ``x_start -> x_stop``."""
        stop = self.n_blocks if stop is None else stop
        for index in range(start, stop):
            x = self.block(index, x)
        return x

    def block_fn(self, index: int) -> Map:
        def fn(x: torch.Tensor) -> torch.Tensor:
            return self.block(index, x)

        fn.layer_map, fn.block_index = self, index  # type: ignore[attr-defined]
        return fn

    def onward_fn(self, start: int, stop: int | None = None) -> Map:
        return lambda x: self.onward(start, x, stop)

    def logits(self, x_last: torch.Tensor) -> torch.Tensor:
        """Next-token logits from raw final states ``(N, d)``: final norm then the head."""
        norm = self.model.sites.final_norm
        hidden = norm(x_last.unsqueeze(1)) if norm is not None else x_last.unsqueeze(1)
        head = self.model.model.get_output_embeddings()
        logits = head(hidden)[:, 0]
        softcap = getattr(self.model.model.config, "final_logit_softcapping", None)
        if softcap:
            logits = torch.tanh(logits / softcap) * softcap
        return logits.float()

    def select(self, rows: torch.Tensor) -> LayerMap:
        """A map over a subset of the prompts (rows of this batch), sharing tensors."""
        other = object.__new__(LayerMap)
        other.__dict__.update(self.__dict__)
        rows = rows.to(self.states.device)
        other.batch = int(rows.numel())
        other.states = self.states[rows]
        other._cache = _PrefixCache(
            {i: t[rows] for i, t in self._cache.keys.items()},
            {i: t[rows] for i, t in self._cache.values.items()},
        )
        other._kwargs = [_select_kwargs(kw, rows, self.batch) for kw in self._kwargs]
        return other


def _select_kwargs(kwargs: dict[str, Any], rows: torch.Tensor, batch: int) -> dict[str, Any]:
    out = dict(kwargs)
    for name in ("attention_mask", "position_ids"):
        value = out.get(name)
        if isinstance(value, torch.Tensor) and value.shape[0] == batch:
            out[name] = value[rows]
    pe = out.get("position_embeddings")
    if isinstance(pe, tuple):
        out["position_embeddings"] = tuple(t[rows] if t.shape[0] == batch else t for t in pe)
    return out


# ---------------------------------------------------------------- beyond the linear regime


def _chunks(copies: int, batch: int, max_rows: int) -> Iterator[slice]:
    step = max(1, max_rows // max(1, batch))
    for first in range(0, copies, step):
        yield slice(first, min(copies, first + step))


def _final_readout(
    layer_map: LayerMap, x_final: torch.Tensor, ref_logits: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """KL(p_ref || p) and the top-1 token of raw final states ``(m*B, d)``.

    With ``delta = z - z_ref`` (logits minus the prompt's reference logits),
    ``KL = log sum p_ref e^delta - sum p_ref delta``: exact, one log-normaliser and
    one cross term per row, ``p_ref`` computed once per prompt and broadcast (never
    repeated per row), and small terms for small perturbations (no cancellation
    of two log-probabilities of size ``log V``).
    """
    logits = layer_map.logits(x_final)  # (m*B, V)
    batch = ref_logits.shape[0]
    reps = x_final.shape[0] // batch
    ref_logp = torch.log_softmax(ref_logits, dim=-1)  # (B, V)
    delta = logits.reshape(reps, batch, -1) - ref_logits  # (m, B, V)
    cross = torch.einsum("rbv,bv->rb", delta, ref_logp.exp())
    kl = torch.logsumexp(delta + ref_logp, dim=-1) - cross
    return kl.reshape(-1).clamp_min(0), logits.argmax(-1)


@torch.no_grad()
def perturbation_recovery(
    layer_map: LayerMap,
    start: int,
    thetas: Sequence[float],
    directions: torch.Tensor,
    *,
    max_rows: int = 4096,
) -> dict[str, torch.Tensor]:
    """Rotate the last token's state at block ``start`` and run the model onward.

    ``x' = |x_l| (cos(theta) y_l + sin(theta) t)`` for each unit tangent ``t`` of
    ``directions`` ``(n_dir, B, d)`` and each ``theta``.

    Returns ``(n_theta, n_dir, B)`` arrays: ``angle_ratio`` (``angle(x_L', x_L) /
    theta``), ``kl`` (``KL(p || p')`` of the next-token distributions, nats) and
    ``flipped`` (the top-1 token changed).
    """
    batch = layer_map.batch
    x = layer_map.states[:, start]  # (B, d)
    norm, y = x.norm(dim=-1, keepdim=True), _unit(x)
    final = layer_map.states[:, -1]
    ref_logits = layer_map.logits(final)  # (B, V)
    ref_top = ref_logits.argmax(-1)
    theta = torch.as_tensor(list(thetas), dtype=x.dtype, device=x.device)
    n_theta, n_dir = theta.numel(), directions.shape[0]
    # (n_theta, n_dir, B, d) starting states, flattened to copies of the batch
    start_states = norm * (
        torch.cos(theta)[:, None, None, None] * y
        + torch.sin(theta)[:, None, None, None] * directions
    )
    start_states = start_states.reshape(n_theta * n_dir * batch, -1)
    copies = n_theta * n_dir
    angle = torch.empty(copies * batch, dtype=x.dtype, device=x.device)
    kl = torch.empty_like(angle)
    top = torch.empty(copies * batch, dtype=torch.long, device=x.device)
    for part in _chunks(copies, batch, max_rows):
        rows = slice(part.start * batch, part.stop * batch)
        out = layer_map.onward(start, start_states[rows])
        angle[rows] = angle_between(out, final.repeat(part.stop - part.start, 1))
        kl[rows], top[rows] = _final_readout(layer_map, out, ref_logits)
    shape = (n_theta, n_dir, batch)
    return {
        "angle_ratio": angle.reshape(shape) / theta[:, None, None],
        "kl": kl.reshape(shape),
        "flipped": top.reshape(shape) != ref_top,
    }


def great_circle(a: torch.Tensor, b: torch.Tensor, lambdas: torch.Tensor) -> torch.Tensor:
    """Points from ``a`` toward ``b`` ``(P, d)`` along the great circle of their
    directions, the norm interpolated linearly: ``(n_lambda, P, d)``."""
    ya, yb = _unit(a), _unit(b)
    omega = angle_between(a, b)[None, :, None]  # (1, P, 1)
    lam = lambdas[:, None, None]
    safe = torch.sin(omega).clamp_min(1e-12)
    direction = (torch.sin((1 - lam) * omega) * ya + torch.sin(lam * omega) * yb) / safe
    na, nb = a.norm(dim=-1, keepdim=True), b.norm(dim=-1, keepdim=True)
    return _unit(direction) * ((1 - lam) * na + lam * nb)


@torch.no_grad()
def great_circle_runs(
    layer_map: LayerMap,
    start: int,
    pairs: torch.Tensor,
    lambdas: Sequence[float],
    *,
    max_rows: int = 4096,
) -> dict[str, torch.Tensor]:
    """Move prompt A's state at block ``start`` toward prompt B's along the great
    circle and run A's prompt onward from each point.

    Args:
        pairs: ``(P, 2)`` prompt indices ``(A, B)``.

    Returns:
        ``final``: ``(n_lambda, P, d)`` raw final states; ``top``: ``(n_lambda, P)``
        top-1 tokens. The prompt context (other tokens, positions) is A's.
    """
    a_rows, b_rows = pairs[:, 0], pairs[:, 1]
    sub = layer_map.select(a_rows)
    lam = torch.as_tensor(list(lambdas), dtype=layer_map.dtype, device=layer_map.states.device)
    points = great_circle(
        layer_map.states[a_rows, start], layer_map.states[b_rows, start], lam
    )  # (n_lambda, P, d)
    n_pairs = pairs.shape[0]
    flat = points.reshape(lam.numel() * n_pairs, -1)
    final = torch.empty_like(flat)
    top = torch.empty(flat.shape[0], dtype=torch.long, device=flat.device)
    for part in _chunks(lam.numel(), n_pairs, max_rows):
        rows = slice(part.start * n_pairs, part.stop * n_pairs)
        final[rows] = sub.onward(start, flat[rows])
        top[rows] = sub.logits(final[rows]).argmax(-1)
    return {
        "final": final.reshape(lam.numel(), n_pairs, -1),
        "top": top.reshape(lam.numel(), n_pairs),
    }

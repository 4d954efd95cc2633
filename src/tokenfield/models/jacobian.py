"""Jacobians of maps on states and their singular values, never materialised.

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

The last token's layer map of a real model, the maps these functions are used on,
is :class:`tokenfield.models.layer_map.LayerMap`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from tokenfield.errors import UserError

__all__ = [
    "ProductSpectrum",
    "Spectrum",
    "angle_between",
    "lanczos_singular",
    "product_slice",
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
    """A row map linearised at ``x0`` ``(B, *S)``, the forward pass done once, for any
    number of columns per row.

    ``pull(U) = J^T U`` is the reused ``torch.func.vjp`` pullback of ``f`` at ``x0``;
    ``push(V) = J V`` is the pullback of that pullback (it is linear in its
    argument, so its own pullback is ``J``: the double-vjp form of a ``jvp``, which
    reuses the same forward pass), built on first use. Both take and return rows
    ``(m*B, *S)`` (row ``r`` is column ``r // B`` of prompt ``r % B``) for any ``m``:
    the columns are mapped with ``torch.func.vmap``, so the forward pass and its
    saved activations are those of ``B`` rows, not ``m*B``.
    """

    def __init__(self, f: Map, x0: torch.Tensor):
        self.batch, self.shape = x0.shape[0], tuple(x0.shape[1:])
        out, self._pullback = torch.func.vjp(f, x0)
        self.out0 = out.detach()
        self._pull_cols = torch.func.vmap(self._pull_one)
        self._push_one: Callable[[torch.Tensor], tuple[torch.Tensor, ...]] | None = None
        self._push_cols = torch.func.vmap(self._push_column)

    def _pull_one(self, u: torch.Tensor) -> torch.Tensor:
        return self._pullback(u)[0]

    def _push_column(self, v: torch.Tensor) -> torch.Tensor:
        assert self._push_one is not None
        return self._push_one(v)[0]

    def _columns(self, fn, vmapped, t: torch.Tensor) -> torch.Tensor:
        if t.shape[0] == self.batch:  # one column: no vmap
            return fn(t).detach()
        cols = t.reshape(-1, self.batch, *self.shape)
        return vmapped(cols).reshape(t.shape).detach()

    def push(self, v: torch.Tensor) -> torch.Tensor:
        if self._push_one is None:
            _, self._push_one = torch.func.vjp(self._pull_one, torch.zeros_like(self.out0))
        return self._columns(self._push_column, self._push_cols, v)

    def pull(self, u: torch.Tensor) -> torch.Tensor:
        return self._columns(self._pull_one, self._pull_cols, u)


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
    linear = _Linearised(f, x0)
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


def product_slice(
    starts: Sequence[int], k: int = 4, oversample: int = 4, max_rows: int = 512
) -> int:
    """The prompts :func:`product_spectra` takes at once: each block call of its
    sweeps runs ``p = len(starts) + k - 1 + oversample`` columns of every prompt,
    at most ``max_rows`` rows (past a few hundred rows a block call is no faster
    per row, and a slice iterates until its slowest prompt has converged)."""
    p_cols = len({int(s) for s in starts}) + max(0, k - 1) + max(0, oversample)
    return max(1, max_rows // max(1, p_cols))


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
    max_rows: int = 512,
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
      with the largest residuals); the next ``U`` is ``qr(W)``. A column is pushed
      only from its start block on (the spare ones, then each start's as it
      enters), so the forward sweep costs ``sum_l (L - l)`` column passes plus the
      spare columns', not ``L p``.

    So ``U`` always holds the power-iteration step ``M_l v_l`` of every start block
    and each ``sigma_1(M_l)`` converges at least as fast as a power iteration on
    ``M_l M_l^T`` would. It stops when the top pair's relative residual
    ``|M_l v_1 - sigma_1 u_1| / sigma_1`` is below ``tol`` for every start block and
    row (then ``sigma_1`` is within that relative distance of a singular value of
    ``M_l``) or after ``max_iter`` sweeps; the residuals are returned. The cost per
    iteration is at most ``2 L p`` column passes through one block, against
    ``2 (k + oversample) sum_l (L - l)`` for a separate subspace iteration per start.
    The linearisations of all ``L`` blocks are held at once (the saved activations
    of ``B`` rows each: the columns are mapped over, not copied), and the prompts
    are taken in slices of :func:`product_slice` (results concatenated,
    ``iterations`` the most any took).
    """
    if k < 1:
        raise UserError(f"k must be at least 1, got {k}", "pass k >= 1")
    starts = tuple(sorted({int(s) for s in starts}))
    n_blocks = len(blocks)
    batch = states.shape[0]
    step = product_slice(starts, k, oversample, max_rows)
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
    n_spare = p - n_start
    first = starts[0]
    linear = [_Linearised(blocks[j], states[:, j]) for j in range(n_blocks)]
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
        """Column ``c`` enters at block ``columns[c][0]`` with ``(B, D)`` vectors (the
        first ``n_start`` at ``starts``, in order, then the spare ones); returns
        ``(B, D, p)``: each column's ``M_l v``, in the same order."""
        spare = columns[n_start:]
        # rows: the spare columns (zero until they enter), then each start's as it enters
        t = torch.zeros((n_spare * batch, *shape), dtype=states.dtype, device=states.device)
        for j in range(first, n_blocks):
            for c, (start, vec) in enumerate(spare):
                if start == j:
                    t[c * batch : (c + 1) * batch] = enter(j, vec.reshape(batch, *shape))
            if j in starts:
                vec = columns[starts.index(j)][1].reshape(batch, *shape)
                t = torch.cat([t, enter(j, vec)])
            t = linear[j].push(t)
        t = torch.cat([t[n_spare * batch :], t[: n_spare * batch]])  # starts, then spare
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

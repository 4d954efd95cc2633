"""``|lambda_2|`` of the symmetrised attention chains on the CPU, compiled (numba).

The batched torch Lanczos of :func:`tokenfield.models.attention._lanczos_lambda2`
runs every matrix of a group in lockstep, one batched matrix-vector product a
step: each step rereads the whole group (megabytes) from the L3 cache, and each
step and each Ritz check pays the interpreter. Here each matrix is done alone,
from start to finish, while it sits in the core's L2 cache (a 256 x 256 float32
matrix is 256 KB): its symmetrised ``S`` is built, the Lanczos runs, its Ritz
values are checked, and the next matrix follows. Same method as the torch
version: the deflated ``S - sqrt(pi) sqrt(pi)^T``, a fixed start vector, the
Krylov vectors orthogonalised twice against all before them, done when the
residual bounds ``beta_k |y_k|`` of both extreme Ritz pairs are below ``tol``; here
also when Temple's bound certifies the end that gives the answer and the other end
cannot be it (:func:`_excess`). A matrix's two chains (with and without the sink)
can run in lockstep (``skip = 2``), each pass over the matrix serving both products
(:func:`_multiply_pair`): at 512 tokens the lower triangle (512 KB) fills the core's
L2, and the product is bound by reading it.

The Ritz checks solve only what they need of the tridiagonal ``T_k``: its extreme
eigenvalues by bisection on Sturm counts and then Newton's method, and the last
components of their eigenvectors from a twisted factorisation at the largest
diagonal of its inverse (as LAPACK's MRRR does): 8 us a check where a dense ``eigh``
of ``T_k`` takes 57 us at ``k = 30`` (20 us with bisection alone). Where an extreme eigenvalue of ``T_k`` has a neighbour closer
than :data:`CLUSTER` (its eigenvector is then ill-determined) the check falls back
to ``numpy.linalg.eigh`` of ``T_k``.

The matrix-vector product of a causal chain takes its rows four at a time
(:func:`_four_rows`), so that each load of the vectors serves four rows. The row
entropies (:func:`row_entropy`) take their logarithms from the float32 bits and a
polynomial (:func:`_log`), which vectorises where libm's ``logf`` does not.

Compiled once per machine (``cache=True``, a few seconds the first time), without
the interpreter lock held (``nogil``): the callers split the chains over the torch
threads (:func:`tokenfield.models.attention._in_threads`).
"""

from __future__ import annotations

import numpy as np
from numba import njit

# reassociation and contraction only: vectorised sums and fused multiply-adds, NaN and
# infinity kept as IEEE has them
_FAST = {"reassoc", "contract"}
# a neighbouring eigenvalue of T_k closer than this to an extreme one (relative to the
# spread of T_k): the check takes a dense eigh
CLUSTER = 1e-6
_BISECTIONS = 64  # halvings of the Gershgorin interval (to below float64 rounding)
# :func:`_excess`: the end that does not give |lambda_2| is done once its residual bound is
# below this share of its distance to the answer (on 90 SmolLM2 chains at 512 tokens, a
# float64 Lanczos checked every step: 22.2 steps on average, against 22.0 with no cap and
# 24.0 with a cap of 1e-3)
OTHER_SHARE = 0.1


@njit(cache=True, nogil=True)
def _count_below(alpha, beta2, k, x, pivot):  # pragma: no cover - compiled
    """How many eigenvalues of ``T_k`` (diagonal ``alpha``, squared couplings
    ``beta2``) are below ``x``: the negative pivots of ``T_k - x I = L D L^T``."""
    count = 0
    d = alpha[0] - x
    if abs(d) < pivot:
        d = -pivot
    if d < 0.0:
        count += 1
    for i in range(1, k):
        d = alpha[i] - x - beta2[i - 1] / d
        if abs(d) < pivot:
            d = -pivot
        if d < 0.0:
            count += 1
    return count


@njit(cache=True, nogil=True)
def _newton(alpha, beta2, k, x, pivot):  # pragma: no cover - compiled
    """``(count below x, chi'/chi at x)`` of ``T_k``: the pivots ``d_i`` of ``T_k - x I``
    and their derivatives, ``chi'/chi = sum d_i'/d_i`` (``chi = prod d_i``)."""
    d = alpha[0] - x
    slope = -1.0
    if abs(d) < pivot:
        d = -pivot
    count = 1 if d < 0.0 else 0
    ratio = slope / d
    for i in range(1, k):
        slope = -1.0 + beta2[i - 1] * slope / (d * d)
        d = alpha[i] - x - beta2[i - 1] / d
        if abs(d) < pivot:
            d = -pivot
        if d < 0.0:
            count += 1
        ratio += slope / d
    return count, ratio


@njit(cache=True, nogil=True)
def _eigenvalue(alpha, beta2, k, index, low, high, pivot):  # pragma: no cover
    """The ``index``-th smallest eigenvalue of ``T_k`` in ``[low, high]`` (no eigenvalue
    below ``low``, all below ``high``): bisection on Sturm counts until the bracket holds
    that eigenvalue alone and is narrower than a thousandth of the start, then Newton's
    method on ``chi`` kept inside the bracket (quadratic near a simple root), to the
    last bits. About 20 counts where bisection alone takes 55 to 64."""
    width = high - low
    below_low, below_high = 0, k
    for _ in range(_BISECTIONS):
        if below_low == index and below_high == index + 1 and high - low < 1e-3 * width:
            break
        middle = 0.5 * (low + high)
        if middle <= low or middle >= high:
            return middle
        count = _count_below(alpha, beta2, k, middle, pivot)
        if count > index:
            high, below_high = middle, count
        else:
            low, below_low = middle, count
    x = 0.5 * (low + high)
    for _ in range(_BISECTIONS):
        count, ratio = _newton(alpha, beta2, k, x, pivot)
        if count > index:
            high = x
        else:
            low = x
        step = 1.0 / ratio if ratio != 0.0 else np.inf
        following = x - step
        if not (low < following < high):  # outside the bracket (or not finite): halve
            following = 0.5 * (low + high)
        if abs(following - x) <= 4e-16 * max(abs(x), width) or following in (low, high):
            return following
        x = following
    return x


@njit(cache=True, nogil=True)
def _last_component(alpha, beta, k, theta, plus, minus, pivot):  # pragma: no cover
    """``|y_k|`` of the unit eigenvector ``y`` of ``T_k`` for the eigenvalue ``theta``:
    the twisted factorisation ``T_k - theta I = N_r D_r N_r^T`` at the index ``r``
    where ``|gamma_r|`` (``1 / [(T - theta)^-1]_rr``) is smallest, ``z_r = 1``, the
    other components by the two bidiagonal recurrences from ``r`` outward."""
    plus[0] = alpha[0] - theta
    if abs(plus[0]) < pivot:
        plus[0] = -pivot
    for i in range(1, k):
        plus[i] = alpha[i] - theta - beta[i - 1] * beta[i - 1] / plus[i - 1]
        if abs(plus[i]) < pivot:
            plus[i] = -pivot
    minus[k - 1] = alpha[k - 1] - theta
    if abs(minus[k - 1]) < pivot:
        minus[k - 1] = -pivot
    for i in range(k - 2, -1, -1):
        minus[i] = alpha[i] - theta - beta[i] * beta[i] / minus[i + 1]
        if abs(minus[i]) < pivot:
            minus[i] = -pivot
    twist, smallest = 0, np.inf
    for r in range(k):
        gamma = abs(plus[r] + minus[r] - (alpha[r] - theta))
        if gamma < smallest:
            twist, smallest = r, gamma
    # z_r = 1; above r: z_i = -beta_i / plus_i z_(i+1); below: z_(i+1) = -beta_i / minus_(i+1) z_i
    norm2 = 1.0
    z = 1.0
    for i in range(twist - 1, -1, -1):
        z = -beta[i] / plus[i] * z
        norm2 += z * z
    z = 1.0
    last = 1.0
    for i in range(twist, k - 1):
        z = -beta[i] / minus[i + 1] * z
        norm2 += z * z
        last = z
    return abs(last) / np.sqrt(norm2)


@njit(cache=True, nogil=True)
def ritz_ends(alpha, beta, k, plus, minus, out):  # pragma: no cover - compiled
    """The extreme eigenpairs of ``T_k`` (diagonal ``alpha[:k]``, couplings ``beta[:k -
    1]``) as ``out``: ``theta_min``, ``theta_max``, the last components ``|y_k|`` of
    their unit eigenvectors, then the neighbour of the larger ``|theta|`` (the next
    eigenvalue inward) and its ``|y_k|`` (``inf`` where it is not known: ``k = 1``, the
    neighbour itself has a neighbour closer than :data:`CLUSTER`, or an end has one and
    the check takes the dense ``eigh``). Times the next coupling ``beta_k``, the ``|y_k|``
    are the residual bounds."""
    if k == 1:
        out[0], out[1], out[2], out[3] = alpha[0], alpha[0], 1.0, 1.0
        out[4], out[5] = alpha[0], np.inf
        return
    beta2 = np.empty(k)
    low, high, largest = np.inf, -np.inf, 0.0
    for i in range(k):
        left = abs(beta[i - 1]) if i > 0 else 0.0
        right = abs(beta[i]) if i < k - 1 else 0.0
        low = min(low, alpha[i] - left - right)
        high = max(high, alpha[i] + left + right)
        if i < k - 1:
            beta2[i] = beta[i] * beta[i]
            largest = max(largest, beta2[i])
    spread = max(high - low, 1e-300)
    pivot = 1e-290 * max(1.0, largest)
    low, high = low - 1e-12 * spread, high + 1e-12 * spread
    smallest = _eigenvalue(alpha, beta2, k, 0, low, high, pivot)
    biggest = _eigenvalue(alpha, beta2, k, k - 1, low, high, pivot)
    # no other eigenvalue within CLUSTER of either end (two Sturm counts)
    gap = CLUSTER * spread
    apart = _count_below(alpha, beta2, k, smallest + gap, pivot) <= 1
    apart = apart and _count_below(alpha, beta2, k, biggest - gap, pivot) >= k - 1
    top_end = abs(biggest) >= abs(smallest)
    if k == 2 or apart:
        out[0], out[1] = smallest, biggest
        out[2] = _last_component(alpha, beta, k, smallest, plus, minus, pivot)
        out[3] = _last_component(alpha, beta, k, biggest, plus, minus, pivot)
        if k == 2:
            out[4], out[5] = (smallest, out[2]) if top_end else (biggest, out[3])
            return
        index = k - 2 if top_end else 1
        near = _eigenvalue(alpha, beta2, k, index, low, high, pivot)
        out[4], out[5] = near, np.inf
        # the neighbour's own eigenvector well determined: nothing else within CLUSTER
        if top_end:
            alone = _count_below(alpha, beta2, k, near - gap, pivot) >= k - 2
        else:
            alone = _count_below(alpha, beta2, k, near + gap, pivot) <= 2
        if alone:
            out[5] = _last_component(alpha, beta, k, near, plus, minus, pivot)
        return
    t = np.zeros((k, k))
    for i in range(k):
        t[i, i] = alpha[i]
        if i < k - 1:
            t[i, i + 1] = beta[i]
            t[i + 1, i] = beta[i]
    values, vectors = np.linalg.eigh(t)
    out[0], out[1] = values[0], values[k - 1]
    out[2], out[3] = abs(vectors[k - 1, 0]), abs(vectors[k - 1, k - 1])
    out[4] = values[k - 2] if top_end else values[1]
    out[5] = np.inf  # a cluster at an end: no gap to lean on


@njit(cache=True, nogil=True)
def ritz_check(alpha, beta, k, plus, minus):  # pragma: no cover - compiled
    """``(max(|theta_min|, |theta_max|), max(|y_k(theta_min)|, |y_k(theta_max)|))`` of
    ``T_k`` (:func:`ritz_ends`): the largest modulus of its extreme eigenvalues and the
    larger last eigenvector component of the two (times ``beta_k``: the residual bound)."""
    out = np.empty(6)
    ritz_ends(alpha, beta, k, plus, minus, out)
    return max(abs(out[0]), abs(out[1])), max(out[2], out[3])


@njit(cache=True, nogil=True)
def _excess(ends, coupling, tol, temple):  # pragma: no cover - compiled
    """How far (decades) the Ritz pairs ``ends`` (:func:`ritz_ends`, residual bounds
    ``coupling |y_k|``) are from certifying ``|lambda_2| = max(|theta_min|,
    |theta_max|)``; below 0: certified. The end of the larger ``|theta|`` (the answer) is
    certified when its residual bound ``r`` is below ``tol``, or when ``r^2 / delta`` is
    below ``temple`` (Temple's inequality: the error of a Ritz value is at most ``r^2``
    over the distance ``delta`` to the rest of the spectrum, here estimated as the
    distance to the neighbouring Ritz value less that one's own bound; an eigenvalue the
    Krylov space has not yet found between the two would make it smaller). The other end
    is certified when its bound is below ``tol``, or below :data:`OTHER_SHARE` of its
    distance to the answer's modulus. Like the residual test itself, these are practical
    stopping rules, not proofs: a bound says an eigenvalue lies that close to the Ritz
    value, not that the extreme one does (measured against dense ``eigvalsh``: see
    ``tokenfield.models.attention.COMPILED_TEMPLE``)."""
    low, high = abs(ends[0]), abs(ends[1])
    r_low, r_high = coupling * ends[2], coupling * ends[3]
    if high >= low:
        value, r, other, r_other = high, r_high, low, r_low
    else:
        value, r, other, r_other = low, r_low, high, r_high
    target = tol
    delta = abs((ends[1] if high >= low else ends[0]) - ends[4]) - coupling * ends[5]
    if temple > 0.0 and delta > 0.0:
        target = max(target, np.sqrt(temple * delta))
    target_other = max(tol, OTHER_SHARE * (value - other))
    worst = max(r / target, r_other / target_other)
    return np.log10(max(worst, 1e-300))


@njit(cache=True, nogil=True, fastmath=_FAST)
def _sink_free(a, valid, skip, scale, loop):  # pragma: no cover - compiled
    """The chain ``B`` read from ``a``: ``B_ij = scale_i a_ij + loop_i [i = j]`` for ``i, j
    >= skip``, zero elsewhere. ``skip = 0``: ``B = a``. ``skip = 1``: without the sink
    (row and column 0 dropped, the rows renormalised, a row left empty a self-loop), as
    :func:`tokenfield.models.markov.without_sink`."""
    m = a.shape[0]
    for i in range(m):
        scale[i], loop[i] = np.float32(1.0 if skip == 0 else 0.0), np.float32(0.0)
    if skip == 0:
        return
    for i in range(1, m):
        total = np.float32(0.0)
        for j in range(m):  # from 0 (vectorised), column 0 masked out
            total += a[i, j] * np.float32(j > 0)
        if valid[i] > 0.0 and total > 0.0:
            scale[i] = np.float32(1.0 / total)
        elif valid[i] > 0.0:
            loop[i] = np.float32(1.0)


@njit(cache=True, nogil=True, fastmath=_FAST)
def _degrees(a, valid, skip, scale, loop, root, pi, top):  # pragma: no cover - compiled
    """``root = D^-1/2`` (``D`` the degrees ``(B + B^T) 1``, 1 where 0), ``pi`` (the valid
    degrees, normalised) and ``top = sqrt(pi)`` of the chain ``B`` of :func:`_sink_free`.
    Returns whether ``a`` is lower triangular (causal: nothing above the diagonal)."""
    m = a.shape[0]
    degree = np.zeros(m)  # float64: a column's sum adds m terms
    block = np.zeros(m, dtype=np.float32)  # float32 sums of 32 rows at a time
    above = np.float32(0.0)
    # the inner loops start at 0 whatever skip (a variable start stops them being
    # vectorised): row 0 has scale 0 when skipped, column 0 is taken out after
    for i in range(m):  # row sums and column sums, the rows in order
        total = np.float32(0.0)
        factor = scale[i]
        for j in range(m):  # (a >= 0: the sum above the diagonal is 0 only if all is)
            total += a[i, j]
            block[j] += a[i, j] * factor
            above += a[i, j] * np.float32(j > i)
        if skip:  # B's rows are normalised: 1 (not total - a[i, 0], which cancels
            total = np.float32(1.0 if factor > 0.0 else 0.0)  # when the sink has it all)
            factor = np.float32(1.0)
        degree[i] += total * factor + 2.0 * loop[i]
        if i % 32 == 31 or i == m - 1:
            for j in range(m):
                degree[j] += block[j]
                block[j] = 0.0
    if skip:
        degree[0] = 0.0
    _finish_degrees(degree, valid, root, pi, top)
    return above == 0.0


@njit(cache=True, nogil=True, fastmath=_FAST)
def _finish_degrees(degree, valid, root, pi, top):  # pragma: no cover - compiled
    """``root``, ``pi`` and ``top`` of :func:`_degrees` from the degrees (float64)."""
    m = degree.shape[0]
    total = 0.0
    for i in range(m):
        if not degree[i] > 0.0:
            degree[i] = 1.0
        root[i] = 1.0 / np.sqrt(degree[i])
        degree[i] *= valid[i]
        total += degree[i]
    for i in range(m):
        pi[i] = degree[i] / total
        top[i] = np.sqrt(pi[i]) if pi[i] == pi[i] else np.float32(0.0)


@njit(cache=True, nogil=True, fastmath=_FAST)
def _pair_degrees(a, valid, scale, loop, root, pi, top):  # pragma: no cover - compiled
    """:func:`_sink_free` and :func:`_degrees` of both chains of ``a`` (0: ``a`` itself,
    1: without the sink; ``scale``, ``loop``, ``root``, ``pi``, ``top`` ``(2, m)``) in
    one pass over ``a`` instead of three (a row read once from memory, its sums then
    taken from the cache: 0.2 against 0.06 ms for a 512-token chain). Returns whether
    ``a`` is lower triangular."""
    m = a.shape[0]
    degree = np.zeros((2, m))  # float64: a column's sum adds m terms
    block = np.zeros((2, m), dtype=np.float32)  # float32 sums of 32 rows at a time
    above = np.float32(0.0)
    for i in range(m):
        row = a[i]
        total = np.float32(0.0)
        rest = np.float32(0.0)
        for j in range(m):  # (a >= 0: the sum above the diagonal is 0 only if all is)
            total += row[j]
            rest += row[j] * np.float32(j > 0)
            above += row[j] * np.float32(j > i)
        scale[0, i], loop[0, i] = np.float32(1.0), np.float32(0.0)
        scale[1, i], loop[1, i] = np.float32(0.0), np.float32(0.0)
        if i > 0 and valid[i] > 0.0 and rest > 0.0:
            scale[1, i] = np.float32(1.0 / rest)
        elif i > 0 and valid[i] > 0.0:
            loop[1, i] = np.float32(1.0)
        factor = scale[1, i]
        for j in range(m):
            block[0, j] += row[j]
            block[1, j] += row[j] * factor
        degree[0, i] += total
        # the sink-free rows are normalised: 1 (not rest * factor)
        degree[1, i] += (1.0 if factor > 0.0 else 0.0) + 2.0 * loop[1, i]
        if i % 32 == 31 or i == m - 1:
            for c in range(2):
                for j in range(m):
                    degree[c, j] += block[c, j]
                    block[c, j] = 0.0
    degree[1, 0] = 0.0
    inside = valid.copy()
    _finish_degrees(degree[0], inside, root[0], pi[0], top[0])
    inside[0] = 0.0
    _finish_degrees(degree[1], inside, root[1], pi[1], top[1])
    return above == 0.0


@njit(cache=True, nogil=True, fastmath=_FAST)
def _four_rows(a, i, scale, loop, scaled, out):  # pragma: no cover - compiled
    """:func:`_multiply`'s rows ``i .. i + 3`` of a lower triangular ``a`` together: below
    the four diagonals one pass over the columns ``j < i`` for the four rows, each
    ``out[j]`` and ``scaled[j]`` loaded once for all four (a third fewer loads than row
    by row: 22 against 33 us for a 512-token chain), then the 4 x 4 corner."""
    r0, r1, r2, r3 = a[i], a[i + 1], a[i + 2], a[i + 3]
    f0, f1, f2, f3 = scale[i], scale[i + 1], scale[i + 2], scale[i + 3]
    u0, u1 = scaled[i] * f0, scaled[i + 1] * f1
    u2, u3 = scaled[i + 2] * f2, scaled[i + 3] * f3
    t0, t1 = np.float32(0.0), np.float32(0.0)
    t2, t3 = np.float32(0.0), np.float32(0.0)
    for j in range(i):
        s = scaled[j]
        t0 += r0[j] * s
        t1 += r1[j] * s
        t2 += r2[j] * s
        t3 += r3[j] * s
        out[j] += r0[j] * u0 + r1[j] * u1 + r2[j] * u2 + r3[j] * u3
    totals = (t0, t1, t2, t3)
    ups = (u0, u1, u2, u3)
    for r in range(4):  # the corner: row i + r, columns i .. i + r
        row = a[i + r]
        total = totals[r]
        for j in range(i, i + r + 1):
            total += row[j] * scaled[j]
            out[j] += row[j] * ups[r]
        out[i + r] += total * scale[i + r] + np.float32(2.0) * loop[i + r] * scaled[i + r]


@njit(cache=True, nogil=True, fastmath=_FAST)
def _multiply(a, skip, scale, loop, root, q, scaled, out, lower):  # pragma: no cover
    """``out = S q`` for ``S = D^-1/2 (B + B^T) D^-1/2`` (``B`` of :func:`_sink_free`)
    without forming either: ``u = D^-1/2 q``, then each row ``i`` of ``a`` once for both
    ``(B u)_i`` and the ``u_i B[i, :]`` it adds to ``B^T u``. ``lower``: ``a`` is lower
    triangular (a causal chain), only ``j <= i`` is read."""
    m = a.shape[0]
    for i in range(m):
        scaled[i] = root[i] * q[i]
        out[i] = 0.0
    if skip:  # column 0 out of the products (row 0 has scale 0)
        scaled[0] = 0.0
    first = 0
    if lower:  # four rows at a time: each load of out[j] and scaled[j] serves four rows
        while first + 4 <= m:
            _four_rows(a, first, scale, loop, scaled, out)
            first += 4
    for i in range(first, m):  # the inner loop from 0 whatever skip: vectorised
        end = i + 1 if lower else m
        row = a[i]
        factor = scale[i]
        ui = scaled[i] * factor
        total = np.float32(0.0)
        for j in range(end):
            total += row[j] * scaled[j]
            out[j] += row[j] * ui
        out[i] += total * factor + np.float32(2.0) * loop[i] * scaled[i]
    if skip:
        out[0] = 0.0
    for i in range(m):
        out[i] *= root[i]


@njit(cache=True, nogil=True, fastmath=_FAST)
def _four_rows_pair(a, i, scale, loop, scaled, out):  # pragma: no cover - compiled
    """:func:`_four_rows` for two chains of the same ``a`` at once (``scale``, ``loop``,
    ``scaled``, ``out`` ``(2, m)``): each load of ``a`` serves both products (1.2 times
    one product's time for the two, against 2)."""
    r0, r1, r2, r3 = a[i], a[i + 1], a[i + 2], a[i + 3]
    x, y = scaled[0], scaled[1]
    out_x, out_y = out[0], out[1]
    u0, u1 = x[i] * scale[0, i], x[i + 1] * scale[0, i + 1]
    u2, u3 = x[i + 2] * scale[0, i + 2], x[i + 3] * scale[0, i + 3]
    v0, v1 = y[i] * scale[1, i], y[i + 1] * scale[1, i + 1]
    v2, v3 = y[i + 2] * scale[1, i + 2], y[i + 3] * scale[1, i + 3]
    t0, t1 = np.float32(0.0), np.float32(0.0)
    t2, t3 = np.float32(0.0), np.float32(0.0)
    s0, s1 = np.float32(0.0), np.float32(0.0)
    s2, s3 = np.float32(0.0), np.float32(0.0)
    for j in range(i):
        e0, e1, e2, e3 = r0[j], r1[j], r2[j], r3[j]
        p, q = x[j], y[j]
        t0 += e0 * p
        t1 += e1 * p
        t2 += e2 * p
        t3 += e3 * p
        s0 += e0 * q
        s1 += e1 * q
        s2 += e2 * q
        s3 += e3 * q
        out_x[j] += e0 * u0 + e1 * u1 + e2 * u2 + e3 * u3
        out_y[j] += e0 * v0 + e1 * v1 + e2 * v2 + e3 * v3
    totals = ((t0, t1, t2, t3), (s0, s1, s2, s3))
    ups = ((u0, u1, u2, u3), (v0, v1, v2, v3))
    for c in range(2):  # the corners: row i + r, columns i .. i + r
        into, by = out[c], scaled[c]
        for r in range(4):
            row = a[i + r]
            total = totals[c][r]
            for j in range(i, i + r + 1):
                total += row[j] * by[j]
                into[j] += row[j] * ups[c][r]
            into[i + r] += total * scale[c, i + r] + np.float32(2.0) * loop[c, i + r] * by[i + r]


@njit(cache=True, nogil=True, fastmath=_FAST)
def _multiply_pair(a, scale, loop, root, basis, k, scaled, w):  # pragma: no cover
    """:func:`_multiply` of both chains of a lower triangular ``a`` in one pass over it:
    ``w[c] = S_c q_k`` of chain ``c`` (0 ``a`` itself, 1 without the sink), ``q_k`` from
    ``basis[c, k]``."""
    m = a.shape[0]
    for c in range(2):
        for i in range(m):
            scaled[c, i] = root[c, i] * basis[c, k, i]
            w[c, i] = 0.0
    scaled[1, 0] = 0.0  # column 0 out of the sink-free products (its row 0 has scale 0)
    first = 0
    while first + 4 <= m:
        _four_rows_pair(a, first, scale, loop, scaled, w)
        first += 4
    for c in range(2):
        for i in range(first, m):
            row = a[i]
            factor = scale[c, i]
            ui = scaled[c, i] * factor
            total = np.float32(0.0)
            for j in range(i + 1):
                total += row[j] * scaled[c, j]
                w[c, j] += row[j] * ui
            w[c, i] += total * factor + np.float32(2.0) * loop[c, i] * scaled[c, i]
    w[1, 0] = 0.0
    for c in range(2):
        for i in range(m):
            w[c, i] *= root[c, i]


@njit(cache=True, nogil=True, fastmath=_FAST)
def _orthogonalise(basis, k, w, c):  # pragma: no cover - compiled
    """``w`` against ``basis[0 .. k]`` (Gram-Schmidt, classical, ``c`` the
    projections); returns the projection on ``basis[k]``. Loops, not ``@``: the
    products allocate and call BLAS, slower at these sizes (3.1 against 4.3 us a pass
    pair at ``k = 20``, 512 tokens)."""
    m = w.shape[0]
    for r in range(k + 1):
        row = basis[r]
        total = np.float32(0.0)
        for j in range(m):
            total += row[j] * w[j]
        c[r] = total
    for r in range(k + 1):
        row = basis[r]
        factor = c[r]
        for j in range(m):
            w[j] -= factor * row[j]
    return c[k]


@njit(cache=True, nogil=True, fastmath=_FAST)
def _begin(top, start, breakdown, basis):  # pragma: no cover - compiled
    """``basis[0] = top``, ``basis[1]`` the start orthogonalised against it (twice) and
    normalised; ``False`` where nothing is left of the start (no valid token but top)."""
    basis[0] = top
    q = start - top * np.dot(top, start)
    q = q - top * np.dot(top, q)
    norm = np.sqrt(np.dot(q, q))
    if not norm > breakdown * np.sqrt(np.dot(start, start)):
        return False
    basis[1] = q / norm
    return True


RUNNING = -2.0  # :func:`_advance`: the chain goes on


@njit(cache=True, nogil=True, fastmath=_FAST)
def _advance(
    k, steps, basis, w, c, alpha, beta, plus, minus, ends, tol, temple, breakdown, state
):  # pragma: no cover - compiled
    """Lanczos step ``k`` of one chain after its product ``w = S q_k``: ``w``
    orthogonalised twice against every ``q`` so far (``alpha_k`` from the first pass),
    ``beta_k``, ``q_(k+1)``; a Ritz check when due (``state``: the next check's step,
    the last check's step and excess). Returns ``|lambda_2|`` once certified
    (:func:`_excess`), ``-1`` where ``k`` is the last step and it is not, else
    :data:`RUNNING`."""
    alpha[k - 1] = _orthogonalise(basis, k, w, c)
    _orthogonalise(basis, k, w, c)
    beta[k - 1] = np.sqrt(np.dot(w, w))
    if not beta[k - 1] > breakdown:  # the Krylov space is spent: T_k is exact
        ritz_ends(alpha, beta, k, plus, minus, ends)
        return max(abs(ends[0]), abs(ends[1]))
    basis[k + 1] = w / np.float32(beta[k - 1])
    if k < state[0] and k < steps:
        return RUNNING
    ritz_ends(alpha, beta, k, plus, minus, ends)
    now = _excess(ends, beta[k - 1], tol, temple)
    if now < 0.0:
        return max(abs(ends[0]), abs(ends[1]))
    if k >= steps:
        return -1.0
    # the next check: when the excess reaches 0 at the rate it fell (0.15 decades a step
    # at least), 2 to 8 steps on; 4 after the first
    wait = 4
    if state[1] >= 0:
        rate = max((state[2] - now) / (k - state[1]), 0.15)
        wait = min(max(int(np.ceil(now / rate)), 2), 8)
    state[0], state[1], state[2] = k + wait, k, now
    return RUNNING


@njit(cache=True, nogil=True, fastmath=_FAST)
def _lanczos(
    a, chains, drops, scale, loop, root, lower, top, start, tol, temple, steps, first,
    breakdown, basis, w, scaled, c, alpha, beta, plus, minus, ends, state, lam, taken,
):  # pragma: no cover  # fmt: skip
    """The largest ``|eigenvalue|`` of ``S_c - top_c top_c^T`` of each of the ``chains``
    chains ``c`` of ``a`` (1: ``a`` itself or without the sink; 2: both) into
    ``lam[c]``, ``-1`` where not certified within ``steps`` steps; the steps into
    ``taken[c]``. ``drops[c]``: chain ``c`` is without the sink (:func:`_sink_free`). Two chains of a lower triangular ``a`` take their products together
    (:func:`_multiply_pair`) while both run."""
    m = a.shape[0]
    steps = min(steps, m - 1)
    live = 0
    for j in range(chains):
        if _begin(top[j], start[j], breakdown, basis[j]):
            live += 1
            lam[j], taken[j] = RUNNING, 0
            state[j, 0], state[j, 1], state[j, 2] = first, -1.0, 0.0
        else:
            lam[j], taken[j] = 0.0, 0  # nothing valid but top: no eigenvalue left to bound
    for k in range(1, steps + 1):
        if live == 0:
            break
        if live == 2 and lower:
            _multiply_pair(a, scale, loop, root, basis, k, scaled, w)
        else:
            for j in range(chains):
                if lam[j] == RUNNING:
                    _multiply(a, drops[j], scale[j], loop[j], root[j], basis[j, k], scaled[j],
                              w[j], lower)  # fmt: skip
        for j in range(chains):
            if lam[j] != RUNNING:
                continue
            value = _advance(
                k, steps, basis[j], w[j], c, alpha[j], beta[j], plus, minus, ends, tol,
                temple, breakdown, state[j],
            )  # fmt: skip
            if value != RUNNING:
                lam[j], taken[j] = value, k
                live -= 1
    for j in range(chains):
        if lam[j] == RUNNING:  # pragma: no cover - a running chain ends at its last step
            lam[j], taken[j] = -1.0, steps


@njit(cache=True, nogil=True)
def chain_lambda2(
    a, valid, skip, start, tol, temple, steps, first, breakdown, lam, pi, taken
):  # pragma: no cover
    """``|lambda_2|`` (into ``lam``, float64; ``-1`` where not certified), ``pi`` and the
    Lanczos steps (``taken``) of the chains of each ``a[g]`` ``(m, m)`` float32 (zero
    outside ``valid[g]``), one matrix after another: ``skip = 0`` ``a`` itself, ``skip =
    1`` ``a`` without the sink (``valid[g][0]`` 0; :func:`_sink_free`), ``skip = 2`` both
    (``valid[g]`` ``a``'s; its chains' Lanczos in lockstep, one pass over ``a`` a step
    for both products). ``lam``, ``taken`` ``(count, chains)``, ``pi`` ``(count,
    chains, m)``, ``chains`` 2 for ``skip = 2``, else 1. A lower triangular ``a``
    (causal) is read below its diagonal only. ``temple``: :func:`_excess`'s bound on
    ``r^2 / delta`` (0: residual bounds alone)."""
    count, m = a.shape[0], a.shape[-1]
    chains = 2 if skip == 2 else 1
    steps = max(min(steps, m - 1), 1)
    root = np.empty((chains, m), dtype=np.float32)
    top = np.empty((chains, m), dtype=np.float32)
    starts = np.empty((chains, m), dtype=np.float32)
    basis = np.empty((chains, steps + 2, m), dtype=np.float32)
    w = np.empty((chains, m), dtype=np.float32)
    scaled = np.empty((chains, m), dtype=np.float32)
    scale = np.empty((chains, m), dtype=np.float32)
    loop = np.empty((chains, m), dtype=np.float32)
    inside = np.empty((chains, m), dtype=np.float32)
    c = np.empty(steps + 2, dtype=np.float32)
    alpha = np.empty((chains, steps + 1))
    beta = np.empty((chains, steps + 1))
    plus = np.empty(steps + 1)
    minus = np.empty(steps + 1)
    ends = np.empty(6)
    state = np.empty((chains, 3))
    drops = np.zeros(chains, dtype=np.int64)  # chain j without the sink
    drops[chains - 1] = 1 if skip >= 1 else 0
    for g in range(count):
        for j in range(chains):
            inside[j] = valid[g]
            if skip == 2 and j == 1:
                inside[j, 0] = 0.0
            for i in range(m):
                starts[j, i] = start[i] * inside[j, i]
        if skip == 2:
            lower = _pair_degrees(a[g], valid[g], scale, loop, root, pi[g], top)
        else:
            _sink_free(a[g], inside[0], drops[0], scale[0], loop[0])
            lower = _degrees(
                a[g], inside[0], drops[0], scale[0], loop[0], root[0], pi[g, 0], top[0]
            )
        _lanczos(
            a[g], chains, drops, scale, loop, root, lower, top, starts, tol, temple, steps, first,
            breakdown, basis, w, scaled, c, alpha, beta, plus, minus, ends, state, lam[g],
            taken[g],
        )  # fmt: skip


@njit(cache=True, nogil=True, fastmath=_FAST, inline="always")
def _log(mantissa, exponent):  # pragma: no cover - compiled
    """``log x`` in float32 for ``x = mantissa * 2^exponent``, ``mantissa`` in ``[0.5,
    1)``: Cephes' ``logf`` (a degree-9 polynomial in ``mantissa - 1`` on ``[sqrt(1/2),
    sqrt(2))``, ``log 2`` in two parts), within 2 ulp. No call to libm's ``logf``, so
    a row's logarithms are vectorised."""
    small = mantissa < np.float32(0.70710677)
    e = exponent - np.float32(1.0) if small else exponent
    x = mantissa + mantissa - np.float32(1.0) if small else mantissa - np.float32(1.0)
    z = x * x
    y = np.float32(7.0376836292e-2) * x - np.float32(1.1514610310e-1)
    y = y * x + np.float32(1.1676998740e-1)
    y = y * x - np.float32(1.2420140846e-1)
    y = y * x + np.float32(1.4249322787e-1)
    y = y * x - np.float32(1.6668057665e-1)
    y = y * x + np.float32(2.0000714765e-1)
    y = y * x - np.float32(2.4999993993e-1)
    y = y * x + np.float32(3.3333331174e-1)
    y = y * x * z + np.float32(-2.12194440e-4) * e - np.float32(0.5) * z
    return x + y + np.float32(0.693359375) * e


@njit(cache=True, nogil=True, fastmath=_FAST)
def row_entropy(a, out):  # pragma: no cover - compiled
    """``out[g, i] = -sum_j a[g, i, j] log a[g, i, j]`` over the entries above 0 (``0 log
    0 = 0``) of float32 ``a``, the logarithms by :func:`_log` (the exponent and mantissa
    read from the bits) and summed in float32 (within 2e-6 of a float64 sum at 512
    tokens). A row with nothing above its diagonal (causal) is read to the diagonal.
    Four times faster than ``np.log`` in a loop (libm, one entry at a time)."""
    count, rows, m = a.shape[0], a.shape[1], a.shape[2]
    mantissa = np.empty(m, dtype=np.int32)
    floats = mantissa.view(np.float32)
    for g in range(count):
        for i in range(rows):
            row = a[g, i]
            bits = row.view(np.int32)
            above = np.float32(0.0)
            for j in range(m):
                above += row[j] * np.float32(j > i)
            stop = m if above > 0.0 else min(i + 1, m)
            for j in range(stop):  # the mantissa's bits with exponent -1: [0.5, 1)
                mantissa[j] = (bits[j] & 0x007FFFFF) | 0x3F000000
            total = np.float32(0.0)
            for j in range(stop):
                x = row[j]
                exponent = np.float32((bits[j] >> 23) - 126)
                total += x * _log(floats[j], exponent) if x > 0.0 else np.float32(0.0)
            out[g, i] = -total

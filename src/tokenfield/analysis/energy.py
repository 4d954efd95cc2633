"""The interaction energy of a particle configuration, with the papers' normalisations.

For unit vectors ``x_1..x_n`` and a bilinear form ``<x, A y>`` (``A = I`` by
default; ``A = Q^T K`` for general attention)::

    glpr        E = 1/(2 beta n^2) sum_ij exp(beta <x_i, A x_j>)      (default)
    mean        E = 1/(2 n^2)      sum_ij exp(beta <x_i, A x_j>)
    gaussian    E = 1/2            sum_ij exp(-beta |x_i - x_j|^2 / 2)   (A = I only)
    normalized  E = 1/n^2          sum_ij exp(beta (<x_i, A x_j> - 1))

``glpr`` is the energy of Geshkovski-Letrouit-Polyanskiy-Rigollet (arXiv
2312.10794): the USA dynamics is ``dx_i/dt = n grad_{x_i} E`` on the sphere,
gradient *ascent*, so ``E`` never decreases (nor along SA, whose velocity is the
USA one times ``n / Z_i > 0``). ``mean`` is the same up to the factor ``beta``
(the lecture notes' form), ``gaussian`` the form of Sander et al. (``e^{-beta}``
times ``n^2`` times ``mean``), and ``normalized`` lies in ``(0, 1]`` with 1 exactly
when all particles coincide.

The double sum is accumulated as a log-sum-exp over blocks of rows, so memory
is ``O(block * n)`` and large ``beta`` does not overflow before the final value.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import numpy as np
from scipy.special import logsumexp

from tokenfield.analysis._frames import iter_blocks, map_frames, normalize_rows
from tokenfield.errors import UserError

EnergyNormalization = Literal["glpr", "mean", "gaussian", "normalized"]
ENERGY_NORMALIZATIONS: dict[str, str] = {
    "glpr": "1/(2 beta n^2) sum_ij exp(beta <x_i, x_j>)",
    "mean": "1/(2 n^2) sum_ij exp(beta <x_i, x_j>)",
    "gaussian": "1/2 sum_ij exp(-beta |x_i - x_j|^2 / 2)",
    "normalized": "1/n^2 sum_ij exp(beta (<x_i, x_j> - 1))",
}


def log_pair_sum(x: np.ndarray, beta: float, bilinear: np.ndarray | None = None) -> float:
    """``log sum_ij exp(beta <x_i, A x_j>)`` for one ``(n, d)`` configuration."""
    left = x if bilinear is None else x @ bilinear  # rows x_i^T A
    partial = [logsumexp(beta * block) for _, block in iter_blocks(left, x)]
    return float(logsumexp(partial))


def _energy_frame(
    x: np.ndarray,
    beta: float,
    normalization: str,
    bilinear: np.ndarray | None,
    normalize: bool,
) -> float:
    if normalize:
        x = normalize_rows(x)
    n = x.shape[0]
    if normalization == "gaussian":
        # -beta |x_i - x_j|^2 / 2 = beta <x_i, x_j> - beta (|x_i|^2 + |x_j|^2) / 2
        half = 0.5 * beta * np.einsum("nd,nd->n", x, x)
        partial = [
            logsumexp(beta * block - half[start : start + block.shape[0], None] - half[None, :])
            for start, block in iter_blocks(x)
        ]
        return 0.5 * math.exp(float(logsumexp(partial)))
    log_sum = log_pair_sum(x, beta, bilinear)
    if normalization == "glpr":
        sign = 1.0 if beta > 0 else -1.0
        return sign * math.exp(log_sum - math.log(2 * abs(beta) * n * n))
    if normalization == "mean":
        return math.exp(log_sum - math.log(2 * n * n))
    return math.exp(log_sum - beta - 2 * math.log(n))  # normalized


def energy(
    states: Any,
    beta: float,
    *,
    normalization: EnergyNormalization = "glpr",
    bilinear: Any = None,
    normalize: bool = True,
) -> Any:
    """The interaction energy (see the module docstring for the normalisations).

    Args:
        states: ``(..., n, d)`` array, or a DataArray / Dataset with ``particle``
            and ``feature`` dims (e.g. a run's ``states``).
        beta: inverse temperature (``glpr`` needs ``beta != 0``).
        normalization: ``glpr``, ``mean``, ``gaussian`` or ``normalized``.
        bilinear: ``(d, d)`` matrix ``A`` of the form ``<x, A y>`` (e.g. ``Q^T K``);
            ``None`` for the identity.
        normalize: put the states on the unit sphere first.

    Returns:
        A float for one ``(n, d)`` configuration, else an array / DataArray of
        the leading shape (one energy per time step, say).

    Example:
        >>> round(float(tf.energy(np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]]), beta=1.0)), 4)
        0.9773
    """
    if isinstance(beta, bool) or not math.isfinite(float(beta)):
        raise UserError(f"beta must be a finite number, not {beta}")
    beta = float(beta)
    if normalization not in ENERGY_NORMALIZATIONS:
        raise UserError(
            f"unknown energy normalization {normalization!r}",
            f"use one of {', '.join(ENERGY_NORMALIZATIONS)}",
        )
    if normalization == "glpr" and beta == 0:
        raise UserError("the glpr energy divides by beta, which is 0", "use normalization='mean'")
    matrix = None
    if bilinear is not None:
        matrix = np.asarray(bilinear, dtype=np.float64)
        if matrix.ndim != 2 or matrix.shape[0] != matrix.shape[1]:
            raise UserError(f"bilinear must be a (d, d) matrix, got shape {matrix.shape}")
        if normalization == "gaussian":
            raise UserError("the gaussian energy is defined for A = I only", "drop bilinear")

    def frame(x: np.ndarray) -> float:
        if matrix is not None and matrix.shape[0] != x.shape[-1]:
            raise UserError(f"bilinear is {matrix.shape[0]}-dimensional, states are {x.shape[-1]}")
        return _energy_frame(x, beta, normalization, matrix, normalize)

    return map_frames(states, frame)

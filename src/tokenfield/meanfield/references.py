"""Independent references for the conformance suite, in plain NumPy and SciPy.

Each function is written from a paper's equations and imports nothing from
tokenfield: a bug in tokenfield's vector field (``particles/dynamics.py``,
``particles/kernels.py``) or its integrators cannot be shared by the reference,
so a conformance item that compares the two can fail
(``tests/unit/test_conformance_references.py`` checks the imports).

With ``Q = K = V = I`` the tokens ``x_i`` on the unit sphere move by
(Geshkovski-Letrouit-Polyanskiy-Rigollet, arXiv 2312.10794, eqs. (SA), (USA))::

    dx_i/dt = P_{x_i}^perp ( sum_j w_ij x_j ),   P_x^perp v = v - <v, x> x
    SA:  w_ij = exp(beta <x_i, x_j>) / sum_k exp(beta <x_i, x_k>)
    USA: w_ij = exp(beta <x_i, x_j>) / n   (the phase-diagram script: exp(beta (<x_i, x_j> - 1)) / n)

On the circle, ``x_i = (cos theta_i, sin theta_i)``, the projection onto the
tangent ``(-sin theta_i, cos theta_i)`` gives the angle form used by
:func:`circle_angles`::

    dtheta_i/dt = sum_j w_ij sin(theta_j - theta_i),   <x_i, x_j> = cos(theta_j - theta_i).
"""

from __future__ import annotations

import numpy as np
from scipy.integrate import solve_ivp


def _weights(gram: np.ndarray, beta: float, normalization: str, rescaled: bool) -> np.ndarray:
    """Attention weights ``w_ij`` from the inner products ``(..., n, n)``."""
    if normalization == "sa":
        scores = beta * gram
        scores = scores - scores.max(axis=-1, keepdims=True)  # the row's scale cancels
        weights = np.exp(scores)
        return weights / weights.sum(axis=-1, keepdims=True)
    n = gram.shape[-1]
    return np.exp(beta * (gram - 1.0 if rescaled else gram)) / n


def projected_euler_merged_fraction(
    x0: np.ndarray,
    beta: float,
    *,
    normalization: str,
    rescaled: bool,
    t_max: float,
    dt: float,
    frames: int,
    delta: float,
) -> np.ndarray:
    """The published phase-diagram algorithm: Euler steps of ``dt`` in the ambient
    space, every token renormalised after each step; at ``frames`` equally spaced
    times in ``[0, t_max]`` the share of pairs ``i < j`` (over all systems) with
    ``<x_i, x_j> >= 1 - delta``.

    Args:
        x0: ``(S, n, d)`` unit vectors (``S`` systems).
        beta: inverse temperature.
        normalization: ``"sa"`` or ``"usa"``; rescaled: USA weights
            ``exp(beta (<x, y> - 1)) / n`` (the script's step normalisation).
        t_max, dt, frames: the saved times are ``linspace(0, t_max, frames)``,
            each a whole number of steps.
        delta: the merge threshold.

    Returns:
        ``(frames,)`` merged fractions.
    """
    steps = int(round(t_max / dt))
    every, rest = divmod(steps, frames - 1)
    if rest or abs(steps * dt - t_max) > 1e-9 * t_max:
        raise ValueError("t_max / dt must be a whole multiple of frames - 1")
    x = np.array(x0, dtype=np.float64)  # (S, n, d)
    n = x.shape[-2]
    upper = np.triu_indices(n, 1)
    out = np.empty(frames)
    for k in range(steps + 1):
        gram = x @ np.swapaxes(x, -1, -2)  # (S, n, n)
        if k % every == 0:
            out[k // every] = float((gram[:, upper[0], upper[1]] >= 1 - delta).mean())
        if k == steps:
            break
        drift = _weights(gram, beta, normalization, rescaled) @ x  # (S, n, d)
        drift -= (drift * x).sum(-1, keepdims=True) * x
        x = x + dt * drift
        x /= np.linalg.norm(x, axis=-1, keepdims=True)
    return out


def circle_angles(
    theta0: np.ndarray,
    beta: float,
    times: np.ndarray,
    *,
    normalization: str = "sa",
    rtol: float = 1e-10,
    atol: float = 1e-12,
) -> np.ndarray:
    """Angles ``(T, n)`` at ``times`` of the circle dynamics
    ``dtheta_i/dt = sum_j w_ij sin(theta_j - theta_i)`` (module docstring, paper
    time) from ``theta0`` ``(n,)``, by SciPy's DOP853 (``rtol``, ``atol``)."""

    def rate(_t: float, theta: np.ndarray) -> np.ndarray:
        diff = theta[None, :] - theta[:, None]  # (n, n): theta_j - theta_i
        weights = _weights(np.cos(diff), beta, normalization, rescaled=False)
        return (weights * np.sin(diff)).sum(axis=1)

    times = np.asarray(times, dtype=np.float64)
    solution = solve_ivp(
        rate, (0.0, float(times[-1])), np.asarray(theta0, dtype=np.float64),
        method="DOP853", t_eval=times, rtol=rtol, atol=atol,
    )  # fmt: skip
    if not solution.success:
        raise RuntimeError(f"the reference integration failed: {solution.message}")
    return solution.y.T


# -- Bruno, Pasqualotto & Agazzi 2024 -------------------------------------------------
#: Bruno, Pasqualotto & Agazzi, *Emergence of meta-stable clustering in mean-field
#: transformer models* (ICLR 2025, arXiv 2410.23228), Figure 4: the mean-field equation
#: on the circle from the uniform measure perturbed by white noise of size
#: ``sigma = 0.01`` at ``beta = 5`` develops a 3-periodic solution (three clusters), the
#: periodicity their Theorem 4.3 predicts from the most unstable Fourier mode.
BPA_FIGURE4 = {"beta": 5.0, "noise": 0.01, "clusters": 3}


def circle_usa_growth_rates(modes: np.ndarray, beta: float) -> np.ndarray:
    """Linear growth rates of the Fourier modes ``k`` of the uniform density on the circle
    under the USA mean-field equation ``d_t rho + d_theta(rho v) = 0``,
    ``v(theta) = int e^{beta cos(phi - theta)} sin(phi - theta) rho(phi) dphi`` (paper time).

    For ``rho = 1/(2 pi) + eps e^{i k theta}``: ``v = eps e^{i k theta} i int e^{beta cos psi}
    sin psi sin(k psi) dpsi = eps e^{i k theta} i 2 pi k I_k(beta) / beta`` (the Bessel
    recurrence ``I_{k-1} - I_{k+1} = 2 k I_k / beta``), so the coefficient grows at
    ``lambda_k = k^2 I_k(beta) / beta``. Written with SciPy's ``iv`` (no tokenfield code).
    """
    from scipy.special import iv

    k = np.asarray(modes, dtype=np.float64)
    return k**2 * iv(k, beta) / beta


def circle_most_unstable_mode(beta: float, max_mode: int = 200) -> int:
    """``argmax_{k >= 1} lambda_k`` of :func:`circle_usa_growth_rates` (the periodicity of
    Bruno-Pasqualotto-Agazzi's Theorem 4.3 on the circle; SA has the same maximiser)."""
    k = np.arange(1, max_mode + 1)
    return int(k[np.argmax(circle_usa_growth_rates(k, beta))])

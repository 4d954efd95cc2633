"""Linear stability of the uniform measure, in closed form with Bessel functions.

The mean-field equation of self-attention with ``Q = K = V = I`` on ``S^{d-1}``
(``sigma`` the uniform probability measure, ``rho`` a density w.r.t. ``sigma``)::

    d_t rho + div(rho v[rho]) = 0,
    v[rho](x) = P_x^perp int e^{beta <x, y>} y rho(y) dsigma(y) / Z[rho](x),
    USA: Z = 1,      SA: Z[rho](x) = int e^{beta <x, y>} rho(y) dsigma(y).

Writing ``Phi[rho](x) = int e^{beta <x, y>} rho(y) dsigma(y)`` for ``x`` in
``R^d``, the integral in ``v`` is ``grad Phi / beta``, so ``v = grad_S Phi / (beta Z)``
(spherical gradient). The uniform density ``rho = 1`` is a fixed point
(``Phi[1]`` is constant). Linearise ``rho = 1 + eps Y_l`` with ``Y_l`` a spherical
harmonic of degree ``l``:

- Funk-Hecke: ``Phi[Y_l] = mu_l(beta) Y_l`` with
  ``mu_l(beta) = Gamma(d/2) (2/beta)^{d/2-1} I_{l+d/2-1}(beta)``
  (``I_nu`` the modified Bessel function; half-integer orders for odd ``d``);
- ``v[1 + eps Y_l] = eps grad_S Phi[Y_l] / (beta Z_0) + O(eps^2)`` (the
  numerator vanishes at ``rho = 1``, so SA only divides by
  ``Z_0 = Phi[1] = mu_0(beta)``);
- ``-div grad_S Y_l = -Delta_S Y_l = l (l + d - 2) Y_l``.

Hence every degree-``l`` harmonic grows at

    USA:  lambda_l(beta) = l (l + d - 2) mu_l(beta) / beta
    SA:   lambda_l(beta) = l (l + d - 2) I_{l+d/2-1}(beta) / (beta I_{d/2-1}(beta))

with multiplicity ``dim H_l = (2l + d - 2) (l + d - 3)! / (l! (d - 2)!)``. On the
circle (``d = 2``, ``x = (cos theta, sin theta)``, modes ``e^{i k theta}``)::

    USA:  lambda_k = k^2 I_k(beta) / beta = (k/2) (I_{k-1}(beta) - I_{k+1}(beta))
    SA:   lambda_k = k^2 I_k(beta) / (beta I_0(beta))

The seed notes give ``lambda_k = I_k(beta) / beta``. That misses the factor
``k^2`` (one ``k`` from the angular derivative in the velocity, one from the
divergence); since ``I_k(beta)`` decreases in ``k``, the seed's maximiser is
``k = 1`` for every ``beta`` and could never predict several clusters. With
``k^2``: ``I_k(beta) ~ e^beta e^{-k^2 / (2 beta)} / sqrt(2 pi beta)`` for large
``beta``, so ``k^2 I_k`` peaks at ``k_max ~ sqrt(2 beta)`` (on ``S^{d-1}``:
``l_max ~ sqrt(2 beta + nu^2) - nu`` with ``nu = d/2 - 1``, within 1 of the
exact maximiser for d = 2 .. 128; the simpler ``sqrt(2 beta) - nu`` needs
``beta >> nu^2``).

``n`` equally spaced particles on the circle (the fixed point of the particle
system): the Jacobian of ``theta_i' = (1/n) sum_j K(theta_j - theta_i)``,
``K(u) = e^{beta cos u} sin u``, is a symmetric circulant matrix; mode ``k``'s
eigenvalue is the trapezoidal rule ``(1/n) sum_m K'(2 pi m/n) (cos(2 pi k m/n) - 1)``
of the continuum integral, which by aliasing equals exactly

    lambda_k^(n) = sum_{p in Z} [c(k + p n) - c(p n)],    c(q) = q^2 I_q(beta) / beta

(SA: divided by ``(1/n) sum_m e^{beta cos(2 pi m/n)} = sum_p I_{pn}(beta)``). The
``p != 0`` terms are below ``I_{n-k}(beta)``: negligible once ``n - k >> beta``.

Time: the papers' time by default; ``time="rescaled"`` (USA weights
``exp(beta (<x, y> - 1)) / n``, the simulator's option) multiplies USA rates by
``e^{-beta}`` and leaves SA alone. Negative ``beta`` (repulsion) is allowed:
``mu_l(-beta) = (-1)^l mu_l(beta)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from scipy.special import gammaln, ive

from tokenfield.errors import ParameterError, UserError
from tokenfield.particles.dynamics import Dynamics

Normalization = Literal["sa", "usa"]
TimeConvention = Literal["paper", "rescaled"]


def _check(beta: float, dim: int, normalization: str, time: str) -> tuple[float, int]:
    if isinstance(beta, bool) or not math.isfinite(float(beta)):
        raise ParameterError(
            "beta", f"{{name}} must be a finite number, not {beta}", "pass e.g. {name} 9"
        )
    if isinstance(dim, bool) or int(dim) != dim or int(dim) < 2:
        raise ParameterError(
            "dim", f"the dimension must be an integer d >= 2, not {dim}", "pass {name} 2 or more"
        )
    if normalization not in ("sa", "usa"):
        raise UserError(f"unknown attention normalization {normalization!r}", "use sa or usa")
    if time not in ("paper", "rescaled"):
        raise UserError(f"unknown time convention {time!r}", "use paper or rescaled")
    return float(beta), int(dim)


def _modes(modes: Any) -> np.ndarray:
    array = np.atleast_1d(np.asarray(modes))
    if array.size and (np.any(array < 0) or np.any(array != np.round(array))):
        raise UserError("modes must be integers >= 0", "pass k = 0, 1, 2, ...")
    return array.astype(np.int64)


def _log_mu_scaled(order: np.ndarray, beta_abs: float, dim: int) -> np.ndarray:
    """``log(mu(beta) e^{-beta})`` for Bessel orders ``order`` (``beta > 0``):
    ``mu = Gamma(d/2) (2/beta)^{d/2-1} I_order(beta)``; ``ive`` keeps it finite."""
    with np.errstate(divide="ignore"):
        return (
            gammaln(dim / 2)
            + (dim / 2 - 1) * math.log(2 / beta_abs)
            + np.log(ive(order.astype(np.float64), beta_abs))
        )


def funk_hecke_eigenvalue(degree: Any, beta: float, dim: int = 2) -> np.ndarray:
    """``mu_l(beta)``: ``int e^{beta <x, y>} Y_l(y) dsigma(y) = mu_l(beta) Y_l(x)``.

    ``mu_l = Gamma(d/2) (2/beta)^{d/2-1} I_{l+d/2-1}(beta)``; ``mu_l(0) = [l = 0]``;
    ``mu_l(-beta) = (-1)^l mu_l(beta)``. Overflows to ``inf`` past ``beta ~ 700``.

    Args:
        degree: harmonic degrees ``l >= 0`` (mode numbers ``k`` on the circle).
        beta: inverse temperature (any sign).
        dim: ``d`` (the sphere ``S^{d-1}``).

    Returns:
        ``(len(degree),)`` float64.

    Example:
        >>> from tokenfield.meanfield import funk_hecke_eigenvalue
        >>> funk_hecke_eigenvalue([0, 1], beta=1.0, dim=2).round(4)   # 2 pi I_k(1)
        array([1.2661, 0.5652])
    """
    beta, dim = _check(beta, dim, "usa", "paper")
    degree = _modes(degree)
    if beta == 0:
        return (degree == 0).astype(np.float64)
    order = degree + dim / 2 - 1
    with np.errstate(over="ignore"):
        value = np.exp(_log_mu_scaled(order, abs(beta), dim) + abs(beta))
    return value * np.where((degree % 2 == 1) & (beta < 0), -1.0, 1.0)


def harmonic_dimension(degree: Any, dim: int) -> np.ndarray:
    """Number of independent degree-``l`` spherical harmonics on ``S^{d-1}``
    (``2`` for ``k >= 1`` on the circle: ``cos k theta``, ``sin k theta``).

    Args:
        degree: harmonic degrees ``l >= 0``.
        dim: ``d``.

    Returns:
        ``(len(degree),)`` int64 (an object array of Python ints past ``2^63``).

    Example:
        >>> from tokenfield.meanfield import harmonic_dimension
        >>> harmonic_dimension([0, 1, 2, 3], dim=3)          # 2 l + 1 on S^2
        array([1, 3, 5, 7])
    """
    degree = _modes(degree)
    if dim == 2:
        return np.where(degree == 0, 1, 2).astype(np.int64)
    # Exact: C(l+d-1, l) - C(l+d-3, l-2). Python integers, since the count passes
    # 2^63 for large d and l (d = 32, l = 69); an int64 array when it fits.
    counts = []
    for value in degree.tolist():
        deg = int(value)
        lower = math.comb(deg + dim - 3, deg - 2) if deg >= 2 else 0
        counts.append(math.comb(deg + dim - 1, deg) - lower)
    if max(counts, default=0) < 2**63:
        return np.array(counts, dtype=np.int64)
    return np.array(counts, dtype=object)


def _scaled_rates(degree: np.ndarray, beta: float, dim: int, normalization: str) -> np.ndarray:
    """``lambda_l e^{-|beta|}`` (USA) or ``lambda_l`` (SA), finite for any beta != 0."""
    b = abs(beta)
    eigen = (degree * (degree + dim - 2)).astype(np.float64)
    order = degree + dim / 2 - 1
    log_mu = _log_mu_scaled(order, b, dim)
    if normalization == "sa":
        log_mu = log_mu - _log_mu_scaled(np.asarray([dim / 2 - 1]), b, dim)[0]
    # mu_l(-beta) = (-1)^l mu_l(beta)
    sign = np.where(degree % 2 == 1, -1.0, 1.0) if beta < 0 else 1.0
    return np.where(eigen == 0, 0.0, eigen * np.exp(log_mu) / beta * sign)


def growth_rates(
    modes: Any,
    beta: float,
    *,
    dim: int = 2,
    normalization: Normalization = "usa",
    time: TimeConvention = "paper",
) -> np.ndarray:
    """Growth rate ``lambda_l(beta)`` of every mode (see the module docstring).

    Args:
        modes: mode numbers ``k`` (circle) or harmonic degrees ``l`` (``d >= 3``),
            integers ``>= 0``.
        beta: inverse temperature.
        dim: ``d`` (particles on ``S^{d-1}``).
        normalization: ``"usa"`` or ``"sa"``.
        time: ``"paper"`` or ``"rescaled"`` (USA rates times ``e^{-beta}``).

    Returns:
        ``(len(modes),)`` float64. USA in paper time overflows to ``inf`` past
        ``beta ~ 700`` (use ``time="rescaled"``); ``k_max`` never does.

    Example:
        >>> tf.growth_rates([0, 1, 2, 3], beta=4.0).round(4)
        array([0.    , 2.4399, 6.4222, 7.5089])
    """
    beta, dim = _check(beta, dim, normalization, time)
    degree = _modes(modes)
    if beta == 0:
        # lim_{beta -> 0} l (l+d-2) mu_l / beta: only l = 1 survives, mu_1 ~ beta / d
        return np.where(degree == 1, (dim - 1) / dim, 0.0)
    scaled = _scaled_rates(degree, beta, dim, normalization)
    if normalization == "sa" or time == "rescaled":
        return scaled * (math.exp(abs(beta) - beta) if normalization == "usa" else 1.0)
    with np.errstate(over="ignore"):
        return scaled * np.exp(abs(beta))


def seed_growth_rates(modes: Any, beta: float) -> np.ndarray:
    """The seed notes' formula ``I_k(beta) / beta`` (kept to show why it fails:
    its maximiser over ``k >= 1`` is always ``k = 1``).

    Args:
        modes: mode numbers ``k >= 0``.
        beta: inverse temperature (non-zero).

    Returns:
        ``(len(modes),)`` float64, decreasing in ``k``.

    Example:
        >>> from tokenfield.meanfield import seed_growth_rates
        >>> seed_growth_rates([1, 2, 3], beta=9.0).round(3)   # largest at k = 1
        array([114.546,  96.055,  71.855])
    """
    degree = _modes(modes)
    beta = float(beta)
    with np.errstate(over="ignore"):
        return np.exp(np.log(ive(degree.astype(float), abs(beta))) + abs(beta)) / beta


def _alias_terms(k: int, n: int, beta: float) -> np.ndarray:
    """Indices ``k + p n`` with ``|k + p n|`` up to where ``I_q(beta)`` is negligible."""
    reach = abs(beta) + 12 * math.sqrt(abs(beta) + 1) + 60 + abs(k)
    p = np.arange(-math.ceil(reach / n) - 1, math.ceil(reach / n) + 2)
    return np.abs(k + p * n)


def discrete_growth_rates(
    modes: Any,
    beta: float,
    n_particles: int,
    *,
    normalization: Normalization = "usa",
    time: TimeConvention = "paper",
) -> np.ndarray:
    """Eigenvalue of Fourier mode ``k`` of the Jacobian of ``n`` equally spaced
    particles on the circle (exact for every ``n``; see the module docstring):
    ``sum_p [c(k + p n) - c(p n)]``, ``c(q) = q^2 I_q(beta) / beta``; SA divides by
    ``sum_p I_{pn}(beta)``. Tends to :func:`growth_rates` (``d = 2``) as ``n`` grows.

    Args:
        modes: mode numbers ``k`` (up to ``n / 2`` are distinct).
        beta: inverse temperature.
        n_particles: ``n``.
        normalization: ``"usa"`` or ``"sa"``.
        time: ``"paper"`` or ``"rescaled"``.

    Returns:
        ``(len(modes),)`` float64.

    Raises:
        ParameterError: ``n_particles < 1``.

    Example:
        >>> from tokenfield.meanfield import discrete_growth_rates
        >>> discrete_growth_rates([1, 2, 3], beta=9.0, n_particles=64).round(3)
        array([114.546, 384.221, 646.694])
    """
    beta, _ = _check(beta, 2, normalization, time)
    if isinstance(n_particles, bool) or int(n_particles) < 1:
        raise ParameterError("n_particles", f"{{name}} must be >= 1, not {n_particles}")
    n = int(n_particles)
    degree = _modes(modes)
    if beta == 0:
        # c(q) -> [|q| = 1] / 2 as beta -> 0 (I_1(beta) / beta -> 1/2)
        def count(k: int) -> float:
            return 0.5 * float(np.sum(_alias_terms(k, n, 0.0) == 1))

        return np.array([count(int(k)) - count(0) for k in degree], dtype=np.float64)
    b = abs(beta)

    def c_scaled(q: np.ndarray) -> np.ndarray:  # c(q) e^{-|beta|}, sign-correct for beta < 0
        sign = np.where(q % 2 == 1, -1.0, 1.0) if beta < 0 else 1.0
        return q.astype(float) ** 2 * ive(q.astype(float), b) * sign / beta

    rates = np.empty(degree.size)
    zero = _alias_terms(0, n, beta)
    for i, k in enumerate(degree):
        rates[i] = c_scaled(_alias_terms(int(k), n, beta)).sum() - c_scaled(zero).sum()
    if normalization == "sa":
        return rates / ive(zero.astype(float), b).sum()
    with np.errstate(over="ignore"):
        return rates * np.exp(b - beta if time == "rescaled" else b)


@dataclass(frozen=True)
class StabilitySpectrum:
    """Growth rates of the modes of the uniform measure at one ``beta``.

    Attributes:
        beta, dim, normalization, time: the setting.
        modes: ``(m,)`` mode numbers ``k`` (circle) / degrees ``l``, from 0.
        growth_rates: ``(m,)`` ``lambda`` of each mode.
        multiplicity: ``(m,)`` how many independent modes share the rate.
        n_particles: ``None`` for the continuum, else the discrete (``n``
            equispaced particles) rates.

    Example:
        >>> spectrum = tf.stability_spectrum(9.0, dim=2)
        >>> spectrum.modes[:3], spectrum.k_max
        (array([0, 1, 2]), 4)
    """

    beta: float
    dim: int
    normalization: str
    time: str
    modes: np.ndarray
    growth_rates: np.ndarray
    multiplicity: np.ndarray
    n_particles: int | None = None

    @property
    def k_max(self) -> int:
        """The most unstable mode (ties: the smaller mode)."""
        return int(self.modes[int(np.argmax(self.growth_rates))])

    @property
    def top_rate(self) -> float:
        return float(np.max(self.growth_rates))

    @property
    def seed_rates(self) -> np.ndarray | None:
        """The seed's ``I_k(beta) / beta`` at each mode, ``(modes,)``, NaN at ``k = 0``
        (the mass, not a mode), for contrast in the figure; ``None`` off the circle
        or for ``beta <= 0``."""
        if self.dim != 2 or self.beta <= 0:
            return None
        seed = np.asarray(seed_growth_rates(self.modes, self.beta), dtype=float)
        seed[0] = np.nan
        return seed

    @property
    def sqrt_2beta(self) -> float:
        """``sqrt(2 beta)``: the large-``beta`` prediction for ``k_max`` on the circle."""
        return math.sqrt(2 * abs(self.beta))

    @property
    def mode_name(self) -> str:
        """``k_max`` on the circle (Fourier modes), ``l_max`` on ``S^{d-1}``, d >= 3
        (harmonic degrees)."""
        return mode_name(self.dim)

    @property
    def large_beta_mode(self) -> float:
        """The large-``beta`` prediction for the most unstable mode:
        ``sqrt(2 beta + nu^2) - nu``, ``nu = d/2 - 1`` (``sqrt(2 beta)`` on the circle)."""
        return float(large_beta_mode(self.beta, self.dim))

    def to_dict(self) -> dict[str, Any]:
        return {
            "beta": self.beta,
            "dim": self.dim,
            "normalization": self.normalization,
            "time": self.time,
            "n_particles": self.n_particles,
            "mode_name": self.mode_name,
            "k_max": self.k_max,  # the most unstable mode; the degree l_max for d >= 3
            "top_rate": self.top_rate,
            "sqrt_2beta": self.sqrt_2beta,
            "large_beta_mode": self.large_beta_mode,
            "large_beta_formula": large_beta_formula(self.dim),
            "modes": self.modes.tolist(),
            "growth_rates": [float(r) for r in self.growth_rates],
            "multiplicity": self.multiplicity.tolist(),
        }


def mode_name(dim: int) -> str:
    """What the most unstable mode is called: ``k_max`` (circle) or ``l_max`` (d >= 3)."""
    return "k_max" if int(dim) == 2 else "l_max"


def large_beta_formula(dim: int) -> str:
    """The large-``beta`` law for the most unstable mode, as printed."""
    return "sqrt(2 beta)" if int(dim) == 2 else "sqrt(2 beta + nu^2) - nu"


def large_beta_mode(beta: Any, dim: int = 2) -> Any:
    """``sqrt(2 |beta| + nu^2) - nu`` with ``nu = d/2 - 1``: where
    ``(m^2 - nu^2) e^{-m^2/(2 beta)}`` (the rate ``l (l + d - 2) I_{l+nu}(beta)``
    with ``m = l + nu`` and ``I_m(beta) ~ e^beta e^{-m^2/(2 beta)}``) peaks;
    ``sqrt(2 beta)`` on the circle."""
    nu = int(dim) / 2 - 1
    return np.sqrt(2 * np.abs(beta) + nu * nu) - nu


def default_max_mode(beta: float, dim: int = 2) -> int:
    """Enough modes to pass the maximum well: ``2 sqrt(2 |beta|) + 8``."""
    return int(math.ceil(2 * math.sqrt(2 * abs(float(beta))) + 8 + dim))


def stability_spectrum(
    beta: float,
    *,
    dim: int = 2,
    normalization: Normalization = "usa",
    time: TimeConvention = "paper",
    max_mode: int | None = None,
    n_particles: int | None = None,
) -> StabilitySpectrum:
    """Growth rates of modes ``0..max_mode`` of the uniform measure.

    Args:
        beta: as in :func:`growth_rates`.
        dim: as in :func:`growth_rates`.
        normalization: as in :func:`growth_rates`.
        time: as in :func:`growth_rates`.
        max_mode: the last mode (default :func:`default_max_mode`).
        n_particles: give the discrete rates of ``n`` equispaced particles on
            the circle instead of the continuum (``d = 2`` only; modes up to ``n/2``).

    Returns:
        A :class:`StabilitySpectrum`: the modes, their rates and multiplicities.

    Example:
        >>> tf.stability_spectrum(9.0, dim=2).k_max
        4
    """
    beta, dim = _check(beta, dim, normalization, time)
    top = default_max_mode(beta, dim) if max_mode is None else int(max_mode)
    if top < 1:
        raise ParameterError("max_mode", f"{{name}} must be >= 1, not {max_mode}")
    if n_particles is not None:
        if dim != 2:
            raise UserError("discrete rates (n_particles) exist on the circle only", "use --dim 2")
        top = min(top, int(n_particles) // 2)
    modes = np.arange(top + 1)
    if n_particles is None:
        rates = growth_rates(modes, beta, dim=dim, normalization=normalization, time=time)
    else:
        rates = discrete_growth_rates(
            modes, beta, n_particles, normalization=normalization, time=time
        )
    return StabilitySpectrum(
        beta=beta,
        dim=dim,
        normalization=normalization,
        time=time,
        modes=modes,
        growth_rates=rates,
        multiplicity=harmonic_dimension(modes, dim),
        n_particles=None if n_particles is None else int(n_particles),
    )


def most_unstable_mode(beta: float, *, dim: int = 2, normalization: Normalization = "usa") -> int:
    """``k_max(beta) = argmax_{k >= 1} lambda_k(beta)``: the number of clusters that
    linear stability predicts on the circle (the degree ``l_max`` on ``S^{d-1}``).
    The same for SA and USA (their rates differ by a ``k``-independent factor).

    Args:
        beta: inverse temperature.
        dim: ``d`` (particles on ``S^{d-1}``).
        normalization: ``"usa"`` or ``"sa"`` (the same answer).

    Returns:
        ``k_max`` (``l_max`` for ``d >= 3``), at least 1.

    Example:
        >>> tf.most_unstable_mode(9.0, dim=2)
        4
    """
    return stability_spectrum(beta, dim=dim, normalization=normalization, time="rescaled").k_max


@dataclass(frozen=True)
class KmaxCurve:
    """``k_max`` against ``beta`` with the large-``beta`` law ``sqrt(2 beta)``.

    Attributes:
        betas: ``(b,)``.
        k_max: ``(b,)`` the most unstable mode at each beta.
        top_rate: ``(b,)`` ``lambda_{k_max}``.
        dim, normalization, time: the setting.

    Example:
        >>> curve = tf.k_max_curve([1.0, 9.0])
        >>> curve.k_max, curve.dim
        (array([1, 4]), 2)
    """

    betas: np.ndarray
    k_max: np.ndarray
    top_rate: np.ndarray
    dim: int
    normalization: str
    time: str

    @property
    def sqrt_2beta(self) -> np.ndarray:
        return np.sqrt(2 * np.abs(self.betas))

    @property
    def mode_name(self) -> str:
        return mode_name(self.dim)

    @property
    def large_beta_mode(self) -> np.ndarray:
        """:func:`large_beta_mode` at every ``beta``: ``sqrt(2 beta + nu^2) - nu``."""
        return large_beta_mode(self.betas, self.dim)

    def to_dict(self) -> dict[str, Any]:
        return {
            "dim": self.dim,
            "normalization": self.normalization,
            "time": self.time,
            "mode_name": self.mode_name,
            "beta": self.betas.tolist(),
            "k_max": self.k_max.tolist(),  # the degree l_max for d >= 3
            "top_rate": [float(r) for r in self.top_rate],
            "sqrt_2beta": self.sqrt_2beta.tolist(),
            "large_beta_mode": self.large_beta_mode.tolist(),
            "large_beta_formula": large_beta_formula(self.dim),
        }


def k_max_curve(
    betas: Any,
    *,
    dim: int = 2,
    normalization: Normalization = "usa",
    time: TimeConvention = "paper",
) -> KmaxCurve:
    """:func:`most_unstable_mode` and its rate for every ``beta`` in ``betas``.

    Args:
        betas: inverse temperatures.
        dim: ``d`` (particles on ``S^{d-1}``).
        normalization: ``"usa"`` or ``"sa"``.
        time: ``"paper"`` or ``"rescaled"`` (scales the rates only).

    Returns:
        A ``KmaxCurve`` with ``betas``, ``k_max`` and ``top_rate`` (``(b,)`` each).

    Example:
        >>> tf.k_max_curve([1.0, 9.0, 25.0]).k_max
        array([1, 4, 7])
    """
    betas = np.asarray(betas, dtype=np.float64).reshape(-1)
    if betas.size == 0:
        raise UserError("no beta values given", "pass e.g. --betas 1:100")
    spectra = [
        stability_spectrum(float(b), dim=dim, normalization=normalization, time=time) for b in betas
    ]
    return KmaxCurve(
        betas=betas,
        k_max=np.array([s.k_max for s in spectra], dtype=np.int64),
        top_rate=np.array([s.top_rate for s in spectra]),
        dim=int(dim),
        normalization=normalization,
        time=time,
    )


# -- the n-particle Jacobian (the numerical check) --------------------------------


def equispaced_jacobian(
    n_particles: int,
    beta: float,
    *,
    normalization: Normalization = "usa",
    time: TimeConvention = "paper",
) -> np.ndarray:
    """The exact Jacobian ``d theta_i' / d theta_j`` at ``n`` equally spaced particles.

    The angle dynamics is read off the simulator's own field
    (:meth:`tokenfield.Dynamics.vector_field` on ``x = (cos theta, sin theta)``,
    ``theta_i' = <f_i, (-sin theta_i, cos theta_i)>``) and differentiated with
    :func:`torch.autograd.functional.jacobian` in float64.

    Args:
        n_particles: ``n``.
        beta: inverse temperature.
        normalization: ``"usa"`` or ``"sa"``.
        time: ``"paper"`` or ``"rescaled"``.

    Returns:
        ``(n, n)`` float64; symmetric circulant.

    Example:
        >>> from tokenfield.meanfield import equispaced_jacobian
        >>> jac = equispaced_jacobian(8, beta=4.0)
        >>> jac.shape, bool(np.allclose(jac, jac.T))
        ((8, 8), True)
    """
    import torch

    theta = 2 * math.pi * torch.arange(int(n_particles), dtype=torch.float64) / n_particles
    return circle_jacobian(theta.numpy(), beta, normalization=normalization, time=time)


def circle_jacobian(
    theta: Any,
    beta: float,
    *,
    normalization: Normalization = "usa",
    time: TimeConvention = "paper",
) -> np.ndarray:
    """The Jacobian ``d theta_i' / d theta_j`` of the angle dynamics at any
    configuration ``theta`` ``(n,)`` on the circle (read off the simulator's field,
    as :func:`equispaced_jacobian`; autograd, float64). At a stationary point its
    spectrum decides stability: one zero eigenvalue (rotations) and, for a stable
    point, every other one negative."""
    import torch

    beta, _ = _check(beta, 2, normalization, time)
    dynamics = Dynamics(beta=beta, normalization=normalization, time=time)

    def angle_velocity(angles: torch.Tensor) -> torch.Tensor:
        x = torch.stack([torch.cos(angles), torch.sin(angles)], dim=-1)  # (n, 2)
        tangent = torch.stack([-torch.sin(angles), torch.cos(angles)], dim=-1)  # (n, 2)
        return (dynamics.vector_field(0.0, x) * tangent).sum(-1)  # (n,)

    angles = torch.as_tensor(np.asarray(theta, dtype=np.float64))
    return torch.autograd.functional.jacobian(angle_velocity, angles).numpy()


def circulant_mode_eigenvalues(jacobian: np.ndarray) -> np.ndarray:
    """Eigenvalue of Fourier mode ``k = 0..n-1`` of a circulant matrix:
    ``sum_m J[0, m] e^{2 pi i k m / n}`` (real part; exact for a symmetric one).

    Args:
        jacobian: ``(n, n)`` circulant (only its first row is read).

    Returns:
        ``(n,)`` float64, mode ``k`` at index ``k``.

    Example:
        The autograd Jacobian's modes are the closed-form discrete rates:

        >>> from tokenfield.meanfield import (circulant_mode_eigenvalues,
        ...                                   discrete_growth_rates, equispaced_jacobian)
        >>> modes = circulant_mode_eigenvalues(equispaced_jacobian(8, beta=4.0))
        >>> bool(np.allclose(modes[:5], discrete_growth_rates(range(5), 4.0, 8)))
        True
    """
    row = np.asarray(jacobian, dtype=np.float64)[0]
    return np.real(np.fft.ifft(row) * row.size)


# -- d >= 3: an exact quadrature of the sphere as a weighted particle system ---------


def sphere_quadrature(dim: int, order: int) -> tuple[np.ndarray, np.ndarray]:
    """Points and weights integrating polynomials of degree ``<= order`` on
    ``S^{d-1}`` exactly (``d = 3``: Gauss-Legendre in ``z`` times equispaced
    longitude; ``d = 4``: Hopf coordinates ``(sqrt(1-u) e^{i a}, sqrt(u) e^{i b})``,
    Gauss-Legendre in ``u`` times equispaced ``a`` and ``b``).

    Returns:
        ``(points (m, d), weights (m,))``, weights summing to 1.
    """
    if dim not in (3, 4):
        raise UserError(f"sphere_quadrature covers d = 3 and 4, not {dim}")
    ring = order + 1  # equispaced angles: exact for trigonometric degree <= order
    angles = 2 * np.pi * np.arange(ring) / ring
    if dim == 3:
        z, wz = np.polynomial.legendre.leggauss(order // 2 + 1)
        zz, aa = np.meshgrid(z, angles, indexing="ij")
        r = np.sqrt(1 - zz**2)
        points = np.stack([r * np.cos(aa), r * np.sin(aa), zz], axis=-1).reshape(-1, 3)
        weights = np.repeat(wz / 2, ring) / ring
        return points, weights
    s, ws = np.polynomial.legendre.leggauss(order // 4 + 1)
    u, wu = (s + 1) / 2, ws / 2
    uu, aa, bb = np.meshgrid(u, angles, angles, indexing="ij")
    c, d = np.sqrt(1 - uu), np.sqrt(uu)
    points = np.stack([c * np.cos(aa), c * np.sin(aa), d * np.cos(bb), d * np.sin(bb)], -1)
    weights = np.repeat(wu, ring * ring) / ring**2
    return points.reshape(-1, 4), weights


def weighted_linearization(
    points: np.ndarray,
    weights: np.ndarray,
    displacement: np.ndarray,
    beta: float,
    *,
    normalization: Normalization = "usa",
) -> np.ndarray:
    """``J xi``: the Jacobian of the weighted particle field
    ``v_i = P_{x_i}^perp sum_j w_j e^{beta <x_i, x_j>} x_j / Z_i`` (``Z_i = 1`` USA,
    ``sum_j w_j e^{beta <x_i, x_j>}`` SA) applied to a tangent displacement
    ``xi`` (``(m, d)``), by forward-mode autograd in float64. At an exact
    quadrature of the uniform measure, ``xi = grad_S Y_l`` is an eigenvector
    with eigenvalue ``lambda_l`` (the displacement ``xi`` moves the density by
    ``-div xi = l (l + d - 2) Y_l``)."""
    import torch

    x = torch.as_tensor(points, dtype=torch.float64)
    w = torch.as_tensor(weights, dtype=torch.float64)

    def field(y: torch.Tensor) -> torch.Tensor:
        kernel = torch.exp(beta * (y @ y.T)) * w  # (m, m)
        drift = kernel @ y  # (m, d)
        if normalization == "sa":
            drift = drift / kernel.sum(-1, keepdim=True)
        return drift - (drift * y).sum(-1, keepdim=True) * y

    _, tangent = torch.func.jvp(field, (x,), (torch.as_tensor(displacement, dtype=torch.float64),))
    return tangent.numpy()

"""Published results as a conformance suite.

Each item is a small experiment run with the library's own functions, set
beside a published result (a closed form, a theorem, or a figure's set-up),
with a tolerance or a qualitative criterion, and a verdict PASS / FAIL:

1. ``equiangular``: from orthogonal tokens the particles stay equiangular and
   ``rho(t)`` solves the scalar ODE (Geshkovski-Letrouit-Polyanskiy-Rigollet,
   *A mathematical perspective on Transformers*, arXiv 2312.10794, Thm 6.8),
   SA and USA.
2. ``phase-diagram``: the same paper's figure set-up (d = 2, n = 32, beta from
   0.1 to 9, SA to t = 30 and USA in its own (rescaled) time, step 0.1, the share
   of pairs with ``<x_i, x_j> > 0.999`` over random starts), drawn with RK4 and
   with the published script's projected Euler, and both compared at every
   (beta, t) with the published algorithm re-implemented in plain NumPy
   (:mod:`tokenfield.meanfield.references`, which shares no code with the
   library's vector field) from the same starts.
3. ``circle-synchronisation``: Polyanskiy-Rigollet-Yao 2025 (arXiv 2507.22857):
   on the circle the dynamics synchronise from almost every start for
   ``beta >= -0.16`` and global synchronisation fails for ``beta < -2/3``.
   Random starts for n = 3..8 and 32 on a beta grid through [-3, 2]; each end
   state is "synchronised" (one cluster), "stuck" (not one cluster, field
   norm below ``STUCK_FIELD``: a stationary point) or "not yet merged". Stuck
   states are checked for stability by the spectrum of the angle Jacobian.
4. ``linear-stability``: the closed-form growth rates against the n-particle
   Jacobian (circle, and an exact quadrature of S^2), and ``k_max(beta)``
   against the first plateau of the cluster count from near-equispaced starts.
5. ``metastable-staircase``: Geshkovski-Koubbi-Polyanskiy-Rigollet (arXiv
   2410.06833): the normalised interaction energy
   ``E = (1/n^2) sum_ij exp(beta (<x_i, x_j> - 1))`` sits on plateaus at
   ``sum_k w_k^2 / n^2`` (``w_k`` the current cluster sizes) and jumps by
   ``2 w_i w_j / n^2`` when clusters ``i`` and ``j`` merge; plateau lengths grow
   like ``e^{c beta}`` (the slope of log first-merge time against beta, from
   :func:`~tokenfield.meanfield.metastability.metastability`). The levels and
   jumps are consistency checks (they hold for any tight clusters); the dynamics
   is checked by the plateau times and ``E(t)`` of an independent integration of
   the same start (NumPy angle ODE, SciPy DOP853).
6. ``mean-field-pde``: ``W1`` between the PDE and n particles decreases like
   ``n^{-1/2}`` (i.i.d. starts; the rate's 95 % interval over seeds) and ``n^{-1}``
   (quantile starts); PASS needs the whole interval inside the tolerance.
7. ``causal-renyi-centres``: Karagodin-Polyanskiy-Rigollet (NeurIPS 2024, arXiv
   2411.04990), Fig. 2: under causal attention the strong Renyi centres stay put
   (:mod:`tokenfield.pipelines.conformance_causal`).
8. ``periodic-clusters``: Bruno-Pasqualotto-Agazzi (ICLR 2025, arXiv 2410.23228),
   Thm 4.3 and Fig. 4: the mean-field PDE from noisy uniform grows the most
   unstable Fourier mode ``k_max``; three clusters at beta = 5
   (:mod:`tokenfield.pipelines.conformance_periodic`).

This module keeps the pure measures (energy, state classification, the stuck
states' spectrum). The items themselves run simulations and draw, so they are a
workflow: :func:`tokenfield.pipelines.conformance.run_suite` runs them
(``quick=True``: sizes for CI) and returns :class:`ItemResult` objects;
``tokenfield theory conformance`` writes the JSON and the HTML page.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tokenfield._io import to_jsonable
from tokenfield.analysis.clusters import cluster_masses
from tokenfield.meanfield.stability import circle_jacobian
from tokenfield.particles import Dynamics

# Field norm below which an end state that is not one cluster counts as a
# stationary point ("stuck"), not as "not yet merged".
STUCK_FIELD = 1e-6
# One cluster: every pair within this inner-product distance of 1.
SYNC_EPS = 1e-3


@dataclass
class ItemResult:
    """One conformance item: what was compared, and the verdict."""

    name: str
    reference: str
    measured: str
    tolerance: str
    passed: bool
    seconds: float = 0.0
    cpu_seconds: float | None = None
    details: dict[str, Any] = field(default_factory=dict)
    figure: Any = None  # a matplotlib Figure (not serialised)

    @property
    def status(self) -> str:
        return "PASS" if self.passed else "FAIL"

    def _repr_html_(self) -> str:
        """The item's row of ``conformance.html``, for Jupyter."""
        from tokenfield._html import html_table

        headers = ["item", "status", "reference", "measured", "tolerance", "seconds"]
        row = [self.name, self.status, self.reference, self.measured, self.tolerance]
        return html_table(f"conformance: {self.name}", headers, [[*row, f"{self.seconds:.1f}"]])

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "reference": self.reference,
            "measured": self.measured,
            "tolerance": self.tolerance,
            "status": self.status,
            "seconds": round(float(self.seconds), 3),
            **({} if self.cpu_seconds is None else {"cpu_seconds": round(self.cpu_seconds, 3)}),
            "details": to_jsonable(self.details),
        }


# -- 3. circle synchronisation (PRY 2025) -------------------------------------------


def polar_angles(states: np.ndarray) -> np.ndarray:
    """The angle of each point on the circle: ``(..., 2)`` -> ``(...)``."""
    return np.arctan2(states[..., 1], states[..., 0])


def classify_circle_states(states: np.ndarray, beta: float, normalization: str = "usa"):
    """``(S, n, 2)`` end states -> (labels ``(S,)`` in {"sync", "stuck", "moving"},
    field norms ``(S,)``)."""
    import torch

    x = torch.as_tensor(states, dtype=torch.float64)
    field_norm = (
        Dynamics(beta=beta, normalization=normalization).vector_field(0.0, x).norm(dim=-1).amax(-1)
    ).numpy()
    gram = np.einsum("sid,sjd->sij", states, states)
    sync = gram.min(axis=(1, 2)) >= 1 - SYNC_EPS
    labels = np.where(sync, "sync", np.where(field_norm < STUCK_FIELD, "stuck", "moving"))
    return labels, field_norm


def stuck_spectrum(theta: np.ndarray, beta: float, normalization: str = "usa") -> float:
    """Largest Jacobian eigenvalue at a stationary configuration, the rotation
    mode (eigenvector ``(1, ..., 1)``) removed."""

    jac = circle_jacobian(theta, beta, normalization=normalization)
    jac = 0.5 * (jac + jac.T)  # symmetric for this gradient flow (exactly, up to rounding)
    n = jac.shape[0]
    basis = np.linalg.qr(np.column_stack([np.ones(n), np.eye(n)[:, : n - 1]]))[0][:, 1:]
    return float(np.linalg.eigvalsh(basis.T @ jac @ basis).max())


# -- 4. linear stability --------------------------------------------------------------


def sectoral_gradient(points: np.ndarray, degree: int) -> np.ndarray:
    """``grad_S Re (x_1 + i x_2)^l``: an eigen-displacement of degree ``l``."""
    z = points[:, 0] + 1j * points[:, 1]
    derivative = degree * z ** (degree - 1)
    grad = np.zeros_like(points)
    grad[:, 0], grad[:, 1] = np.real(derivative), np.real(1j * derivative)
    return grad - (grad * points).sum(1, keepdims=True) * points


# -- 5. the metastable staircase ------------------------------------------------------


def interaction_energy(states: np.ndarray, beta: float) -> np.ndarray:
    """``(1/n^2) sum_ij exp(beta (<x_i, x_j> - 1))`` per frame (``(..., n, d)``)."""
    gram = np.einsum("...id,...jd->...ij", states, states)
    return np.exp(beta * (gram - 1)).mean(axis=(-1, -2))


def staircase(states: np.ndarray, times: np.ndarray, beta: float, eps: float = 1e-2):
    """Energy, cluster sizes and plateau levels of one run ``(T, n, d)``."""

    energy = interaction_energy(states, beta)
    masses = [cluster_masses(frame, eps) for frame in states]
    level = np.array([float((m**2).sum()) for m in masses])
    counts = np.array([m.size for m in masses])
    return energy, level, counts, masses

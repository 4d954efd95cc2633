"""The idealised theory: self-attention as interacting particles on the sphere.

- :mod:`~tokenfield.particles.dynamics`: :class:`Dynamics` (parameters) and its
  vector field ``f(t, x)``; :class:`Mlp`; :func:`random_matrices`.
- :mod:`~tokenfield.particles.kernels`: the fused attention kernels.
- :mod:`~tokenfield.particles.integrate`: :class:`Euler`, :class:`RK4`,
  :class:`Adaptive`, :class:`SaveAt` and :func:`simulate`.
- :mod:`~tokenfield.particles.init`: initial conditions.
"""

from __future__ import annotations

from tokenfield.particles.dynamics import Dynamics, Mlp, random_matrices
from tokenfield.particles.init import initial_condition
from tokenfield.particles.integrate import RK4, Adaptive, Euler, ProjectedEuler, SaveAt, simulate

__all__ = [
    "RK4",
    "Adaptive",
    "Dynamics",
    "Euler",
    "ProjectedEuler",
    "Mlp",
    "SaveAt",
    "initial_condition",
    "random_matrices",
    "simulate",
]

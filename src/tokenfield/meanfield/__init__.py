"""The mean-field theory of self-attention, set beside the particle simulator.

- :mod:`~tokenfield.meanfield.stability`: growth rates of the modes of the
  uniform measure (Bessel closed forms), ``k_max(beta)``, the n-particle Jacobian.
- :mod:`~tokenfield.meanfield.predict`: first-plateau cluster counts and the
  linear-phase growth of Fourier amplitudes in particle runs, against the theory.
- :mod:`~tokenfield.meanfield.pde`: the continuity equation on the circle
  (conservative finite volumes), Wasserstein distance to particle runs.
- :mod:`~tokenfield.meanfield.phase`: the merge-probability phase diagram over
  ``(t, beta, d)``, in process or over a Dask cluster into one Zarr store.
- :mod:`~tokenfield.meanfield.metastability`: first-merge times from separated caps.
"""

from __future__ import annotations

from tokenfield.meanfield.stability import (
    KmaxCurve,
    StabilitySpectrum,
    circulant_mode_eigenvalues,
    discrete_growth_rates,
    equispaced_jacobian,
    funk_hecke_eigenvalue,
    growth_rates,
    harmonic_dimension,
    k_max_curve,
    most_unstable_mode,
    seed_growth_rates,
    stability_spectrum,
)

__all__ = [
    "KmaxCurve",
    "StabilitySpectrum",
    "circulant_mode_eigenvalues",
    "discrete_growth_rates",
    "equispaced_jacobian",
    "funk_hecke_eigenvalue",
    "growth_rates",
    "harmonic_dimension",
    "k_max_curve",
    "most_unstable_mode",
    "seed_growth_rates",
    "stability_spectrum",
]

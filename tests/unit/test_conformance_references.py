"""The conformance suite's independent references and its interval rule.

The references (:mod:`tokenfield.meanfield.references`) must not share tokenfield's
vector field: they import nothing from tokenfield, and they are checked against a
closed form (two tokens are equiangular: ``rho' `` of GLPR Thm 6.8) and against
tokenfield's own projected Euler, which implements the same published algorithm.
"""

from __future__ import annotations

import ast
import math
from pathlib import Path

import numpy as np
import pytest
from scipy.integrate import solve_ivp

from tokenfield.meanfield import references
from tokenfield.meanfield.phase import PhaseDiagramConfig, equiangular_rate, phase_diagram
from tokenfield.meanfield.phase import starts as phase_starts
from tokenfield.pipelines import conformance


def test_the_references_import_nothing_from_tokenfield():
    tree = ast.parse(Path(references.__file__).read_text(encoding="utf-8"))
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert names and not [name for name in names if name.startswith("tokenfield")]


@pytest.mark.parametrize("beta", [0.5, 4.0, -1.0])
def test_two_tokens_on_the_circle_follow_the_equiangular_ode(beta):
    """n = 2 is equiangular: rho = cos(theta_2 - theta_1) solves rho' (SA)."""
    times = np.linspace(0.0, 3.0, 13)
    theta = references.circle_angles(np.array([0.0, 2.0]), beta, times)
    rho = np.cos(theta[:, 1] - theta[:, 0])
    ode = solve_ivp(
        lambda _t, r: [equiangular_rate(r[0], beta, 2, "sa")], (0, 3.0), [math.cos(2.0)],
        t_eval=times, rtol=1e-12, atol=1e-13,
    ).y[0]  # fmt: skip
    assert np.abs(rho - ode).max() < 1e-8


@pytest.mark.parametrize(("normalization", "clock"), [("sa", "paper"), ("usa", "rescaled")])
def test_the_numpy_projected_euler_equals_tokenfields(normalization, clock):
    config = PhaseDiagramConfig(
        dims=(2,), betas=(0.5, 6.0), t_max=6.0, frames=7, n_particles=12, n_systems=3,
        delta=0.01, normalization=normalization, time=clock, dt=0.1,
        solver="projected-euler", beta_block=2,
    )  # fmt: skip
    ours = phase_diagram(config)["merged_probability"].sel(dim=2).values
    x0 = phase_starts(config, 2).numpy()
    theirs = np.stack(
        [
            references.projected_euler_merged_fraction(
                x0,
                beta,
                normalization=normalization,
                rescaled=clock == "rescaled",
                t_max=6.0,
                dt=0.1,
                frames=7,
                delta=0.01,
            )  # fmt: skip
            for beta in config.betas
        ]
    )
    assert np.array_equal(ours, theirs)
    assert theirs[:, -1].max() > theirs[:, 0].max()  # pairs merged: not a trivial match


def test_pass_is_decided_by_the_whole_interval():
    within = conformance.interval_within
    assert within((-0.6, -0.4), -0.5, 0.2)
    # the --quick i.i.d. rate of the review: the estimate -0.401 is inside, the interval not
    assert not within((-0.603, -0.200), -0.5, 0.2)
    assert not within((math.nan, -0.4), -0.5, 0.2)


def test_the_pde_item_fails_when_the_interval_straddles_the_tolerance(monkeypatch):
    """A point estimate inside the tolerance does not pass if its interval is not."""

    class Fake:
        ns = np.array([16, 32, 64])
        w1_per_seed = np.ones((3, 2, 3))

        def to_dict(self):
            return {}

    rates = iter([(-1.0, -1.01, -0.99), (-0.45, -0.65, -0.25)])
    monkeypatch.setattr(conformance, "pde_vs_particles", lambda *a, **k: Fake())
    monkeypatch.setattr(conformance, "_slope_interval", lambda *a: next(rates))
    monkeypatch.setattr(conformance, "plot_pde_rates", lambda *a: None)
    assert conformance.pde_item(quick=True).status == "FAIL"
    rates = iter([(-1.0, -1.01, -0.99), (-0.45, -0.55, -0.35)])
    assert conformance.pde_item(quick=True).status == "PASS"


@pytest.mark.parametrize("beta", [1.0, 2.0, 5.0, 8.0, 25.0])
def test_the_bpa_reference_rates_equal_tokenfields_closed_form(beta):
    """The periodic-clusters item's reference (SciPy, from the paper's linearisation)
    and tokenfield's stability module agree on every rate and on k_max."""
    from tokenfield.meanfield.stability import growth_rates, stability_spectrum

    modes = np.arange(1, 40)
    ours = growth_rates(modes, beta, normalization="usa")
    np.testing.assert_allclose(references.circle_usa_growth_rates(modes, beta), ours, rtol=1e-12)
    assert references.circle_most_unstable_mode(beta) == stability_spectrum(beta).k_max
    assert references.circle_most_unstable_mode(references.BPA_FIGURE4["beta"]) == 3


def test_dominant_mode_and_peaks_of_a_known_density():
    from tokenfield.pipelines.conformance_periodic import density_peaks, dominant_mode

    cells = 256
    theta = (np.arange(cells) + 0.5) * 2 * np.pi / cells
    small = 1 + 0.01 * np.cos(3 * theta) + 0.02 * np.cos(5 * theta)  # below the linear end
    grown = 1 + 0.05 * np.cos(3 * theta) + 0.3 * np.cos(5 * theta)  # |rho_5| / rho_0 = 0.15
    later = np.exp(4 * np.cos(3 * theta))  # three sharp bumps
    frames = np.stack([small, grown, later]) / (2 * np.pi)
    assert dominant_mode(frames) == (5, 1)
    assert dominant_mode(frames[:1]) == (0, -1)  # never leaves the linear phase
    assert density_peaks(later / later.mean() / (2 * np.pi)) == 3
    assert density_peaks(small / (2 * np.pi)) == 0  # ripples on the uniform: no cluster

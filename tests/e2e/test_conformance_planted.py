"""Conformance items that can fail: a planted x2 in tokenfield's attention field
(every velocity doubled, so the clock runs twice as fast) must fail the phase-diagram
item and the staircase's dynamics check, which compare with independent NumPy
references (:mod:`tokenfield.meanfield.references`) that do not share the field. The two
items of issue 24 each fail on their own planted bug (a halved PDE kernel, a dropped causal
mask) and pass without it at the same size."""

from __future__ import annotations

import numpy as np
import pytest

from tokenfield.particles import Dynamics
from tokenfield.particles.init import uniform
from tokenfield.pipelines.conformance import (
    STAIRCASE_ENERGY_TOL,
    STAIRCASE_TIME_TOL,
    phase_diagram_item,
    staircase_dynamics,
)


@pytest.fixture
def doubled_field(monkeypatch):
    original = Dynamics.attention_term

    def doubled(self, layer, y):
        return 2 * original(self, layer, y)

    monkeypatch.setattr(Dynamics, "attention_term", doubled)


def test_a_doubled_field_fails_the_phase_diagram_item(doubled_field):
    result = phase_diagram_item(quick=True)
    assert result.status == "FAIL"
    gaps = result.details["difference_from_reference"]
    # the merged share at a given t differs from the published algorithm's by far more
    # than the tolerance (0.01 same algorithm, 0.1 RK4); measured ~0.83 for each
    assert min(gaps.values()) > 0.5, gaps


def _times(t_max=200.0, frames=60):
    return np.concatenate([[0.0], np.geomspace(0.1, t_max, frames)])


def test_the_staircase_dynamics_agrees_with_the_independent_integration():
    run = staircase_dynamics(uniform(32, 2, seed=7), 12.0, _times())
    assert run["time_error"] <= STAIRCASE_TIME_TOL
    assert run["energy_gap"] <= STAIRCASE_ENERGY_TOL
    ours = run["level_times"]["tokenfield"]
    assert len(ours) >= 10 and run["counts"][-1] < 8  # clusters formed and some merged


def test_a_doubled_field_fails_the_staircase_dynamics_check(doubled_field):
    run = staircase_dynamics(uniform(32, 2, seed=7), 12.0, _times())
    # every plateau is reached in about half the time: |log t - log t_ref| ~ log 2
    assert run["time_error"] > STAIRCASE_TIME_TOL
    assert run["energy_gap"] > STAIRCASE_ENERGY_TOL


# --- the two items from the 2024 literature ------------------------------------------


def test_a_halved_kernel_fails_the_periodic_clusters_item(monkeypatch):
    """The PDE's kernel e^{beta cos} computed at beta / 2 (the E_beta convention slip):
    the fastest mode at beta = 5 becomes k_max(2.5) = 2, two clusters, not the published 3."""
    import tokenfield.meanfield.pde as pde
    from tokenfield.pipelines.conformance_periodic import periodic_clusters_item

    assert periodic_clusters_item(betas=(5.0,), seeds=4).status == "PASS"  # the control
    original = pde.ive
    monkeypatch.setattr(pde, "ive", lambda order, beta: original(order, beta / 2))
    result = periodic_clusters_item(betas=(5.0,), seeds=4)
    assert result.status == "FAIL"
    assert result.details["rows"][0]["dominant_mode"] != 3


def test_a_dropped_causal_mask_fails_the_renyi_centres_item(monkeypatch):
    """Full attention instead of causal: the strong Renyi centres (early tokens with no
    earlier token nearby) are pulled by later tokens and move far more than delta / 10."""
    import tokenfield.particles.dynamics as dynamics
    from tokenfield.pipelines.conformance_causal import renyi_centres_item

    assert renyi_centres_item(n=60, horizon=20.0, seeds=(0,)).status == "PASS"  # the control
    original = dynamics.attention

    def unmasked(*args, **kwargs):
        kwargs["causal"] = False
        return original(*args, **kwargs)

    monkeypatch.setattr(dynamics, "attention", unmasked)
    result = renyi_centres_item(n=60, horizon=20.0, seeds=(0,))
    assert result.status == "FAIL"
    assert result.details["runs"][0]["max_strong_displacement"] > 0.05

"""The published script's integrator: Euler step, then renormalise."""

from __future__ import annotations

import numpy as np
import pytest

from tokenfield.errors import UserError
from tokenfield.particles import Dynamics, ProjectedEuler, SaveAt, simulate
from tokenfield.particles.init import uniform


@pytest.mark.parametrize(
    ("normalization", "time", "dim"), [("sa", "paper", 2), ("usa", "rescaled", 3)]
)
def test_projected_euler_is_first_order_and_stays_on_the_sphere(normalization, time, dim):
    """Errors at t = 2 against a fine RK4 reference halve when the step halves (the
    fitted slope of log error against log step is 1 +- 0.1), and every token keeps
    norm 1 to rounding after hundreds of steps."""
    x0 = uniform(8, dim, seed=3)
    dynamics = Dynamics(beta=2.0, normalization=normalization, time=time)
    t_max = 2.0
    ref = simulate(dynamics, x0, t_max=t_max, dt=1e-3, solver="rk4", saveat=SaveAt(times=(t_max,)))
    ref = ref.states.values[-1]
    steps = np.array([0.04, 0.02, 0.01, 0.005])
    errors = []
    for h in steps:
        ds = simulate(
            dynamics, x0, t_max=t_max, dt=float(h), solver="projected-euler", saveat=SaveAt(every=1)
        )
        states = ds.states.values
        assert np.abs(np.linalg.norm(states, axis=-1) - 1).max() < 1e-13
        assert ds.attrs["tokenfield_config"].count("projected-euler") == 1
        errors.append(np.abs(states[-1] - ref).max())
    slope = np.polyfit(np.log(steps), np.log(errors), 1)[0]
    assert abs(slope - 1.0) < 0.1, (slope, errors)
    assert errors[-1] > 1e-6  # first order, not accidentally exact


def test_projected_euler_is_one_renormalised_euler_step():
    """One step by hand: N(x + h f(x)), with f the simulator's field."""
    import torch

    x0 = torch.as_tensor(uniform(5, 3, seed=1))
    dynamics = Dynamics(beta=1.5, normalization="usa")
    h = 0.3
    ds = simulate(dynamics, x0, t_max=h, dt=h, solver=ProjectedEuler())
    y = x0 + h * dynamics.vector_field(0.0, x0)
    y = y / y.norm(dim=-1, keepdim=True)
    assert np.allclose(ds.states.values[-1], y.numpy(), atol=1e-15, rtol=0)


def test_phase_sweep_takes_the_integrator_and_refuses_unknown_ones():
    from tokenfield.meanfield.phase import PhaseDiagramConfig, phase_diagram

    with pytest.raises(UserError):
        PhaseDiagramConfig(solver="leapfrog")
    kwargs = dict(dims=(2,), betas=(1.0,), t_max=3.0, frames=4, n_particles=6, n_systems=4)
    coarse = {
        s: phase_diagram(PhaseDiagramConfig(dt=0.5, solver=s, delta=0.001, **kwargs))
        for s in ("rk4", "projected-euler")
    }
    a, b = (coarse[s]["merged_probability"].values for s in ("rk4", "projected-euler"))
    assert a.shape == b.shape and np.isfinite(a).all()
    assert "projected-euler" in coarse["projected-euler"].attrs["tokenfield_config"]

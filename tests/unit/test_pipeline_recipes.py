"""The recipes of ``simulate`` and ``eval-steering``: checked once, on construction,
and the pipeline runs exactly what the library would run by hand."""

from __future__ import annotations

import dataclasses
import inspect

import numpy as np
import pytest

from tokenfield.errors import ParameterError
from tokenfield.pipelines.simulate import SimulationRecipe, simulate_run
from tokenfield.pipelines.steer_eval import SteeringEvaluation


@pytest.mark.parametrize(
    ("change", "param"),
    [({"dtype": "float16"}, "dtype"), ({"matrices": "hermitian"}, "matrices"),
     ({"heads": 0}, "heads"), ({"t_max": float("nan")}, "t_max"), ({"dt": 0.0}, "dt")],
)  # fmt: skip
def test_a_bad_simulation_recipe_names_its_parameter(change, param):
    with pytest.raises(ParameterError) as caught:
        SimulationRecipe(**change)
    assert caught.value.param == param


def test_the_recipe_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        SimulationRecipe().beta = 2.0  # type: ignore[misc]


@pytest.mark.parametrize("matrices", ["identity", "gaussian"])
def test_simulate_run_is_the_library_simulation_with_the_documented_defaults(tmp_path, matrices):
    """Defaults (32 particles in d = 3, uniform start, seed 0; random Q, K, V seeded
    seed + 1000, + 2000, + 3000) and the run config, against the same system built
    by hand."""
    from tokenfield.particles import Dynamics, random_matrices, simulate
    from tokenfield.particles.init import uniform
    from tokenfield.runs import read_run_info

    recipe = SimulationRecipe(t_max=0.3, dt=0.1, beta=2.0, matrices=matrices, seed=3)
    got = simulate_run(recipe, tmp_path / "run")
    qkv = (
        {name: random_matrices(3, ensemble=matrices, seed=3 + 1000 * (i + 1))
         for i, name in enumerate(("query", "key", "value"))}
        if matrices != "identity" else {}
    )  # fmt: skip
    want = simulate(Dynamics(beta=2.0, **qkv), uniform(32, 3, seed=3), t_max=0.3, dt=0.1)
    np.testing.assert_array_equal(got["states"].values, want["states"].values)
    config = read_run_info(tmp_path / "run").config
    assert config["init"]["spec"] == "uniform" and config["init"]["seed"] == 3
    assert config["matrices"] == {"ensemble": matrices, "heads": 1, "seed": 3}


def test_a_large_step_is_reported_through_warn(tmp_path):
    said: list[str] = []
    recipe = SimulationRecipe(normalization="usa", dim=2, n_particles=32, beta=9.0, dt=0.05,
                              t_max=0.1, init="equispaced")  # fmt: skip
    simulate_run(recipe, tmp_path / "a", warn=said.append)
    assert len(said) == 1 and "rad per step" in said[0]
    simulate_run(dataclasses.replace(recipe, beta=1.0), tmp_path / "b", warn=said.append)
    assert len(said) == 1


@pytest.mark.parametrize(
    ("change", "message"),
    [({"controls": 0}, "controls must be at least 1, got 0; raise controls"),
     ({"fit": 1}, "fit must be at least 2, got 1; raise fit"),
     ({"positions": "middle"}, "unknown positions 'middle'"),
     ({"dtype": "float16"}, "unknown dtype 'float16'"),
     ({"fit": 4, "halves": 7}, "halves 7 asks for more distinct splits")],
)  # fmt: skip
def test_a_bad_evaluation_names_its_parameter(change, message):
    with pytest.raises(ParameterError, match=message):
        SteeringEvaluation(**change)


def test_the_evaluation_passes_every_protocol_parameter():
    """``protocol()`` is exactly the keyword arguments of ``evaluate_steering`` (all
    but the model and the progress bar), with the evaluation's values."""
    from tokenfield.steering.evaluate import evaluate_steering

    evaluation = SteeringEvaluation(n=7, layers=[2, 3], alphas=[1, 2], halves=5)
    protocol = evaluation.protocol()
    accepted = set(inspect.signature(evaluate_steering).parameters) - {"model", "progress"}
    assert set(protocol) == accepted
    assert protocol["n"] == 7 and protocol["layers"] == [2, 3] and protocol["halves"] == 5
    assert protocol["alphas"] == [1.0, 2.0]

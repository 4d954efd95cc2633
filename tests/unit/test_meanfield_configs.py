"""The config dataclasses of metastability and predict: a config and the same
fields as keywords give the same result; a misspelt field is refused."""

from __future__ import annotations

import numpy as np
import pytest

from tokenfield.errors import ParameterError
from tokenfield.meanfield.metastability import (
    MetastabilityConfig,
    first_merge_times,
    metastability,
)
from tokenfield.meanfield.phase import PhaseDiagramConfig
from tokenfield.meanfield.predict import (
    GrowthConfig,
    PlateauConfig,
    first_plateau_experiment,
    growth_rate_experiment,
)
from tokenfield.pipelines.simulate import SimulationRecipe

SPECS = [MetastabilityConfig, PhaseDiagramConfig, SimulationRecipe]


def test_metastability_config_equals_keywords_and_keeps_the_json():
    config = MetastabilityConfig(seeds=1, per_cap=2, t_cap=50.0)
    by_config = metastability([4.0, 6.0], config)
    by_keywords = metastability([4.0, 6.0], seeds=1, per_cap=2, t_cap=50.0)
    np.testing.assert_array_equal(by_config.merge_times, by_keywords.merge_times)
    assert list(by_config.to_dict())[:13] == [
        "k", "dim", "per_cap", "cap_radius", "normalization", "time", "seeds", "seed",
        "eps", "t_cap", "rtol", "fit_min_beta", "solver",
    ]  # fmt: skip
    # a keyword overrides the config's field
    np.testing.assert_array_equal(
        first_merge_times(4.0, config, seeds=2)[:1], first_merge_times(4.0, config)
    )


def test_predict_configs_equal_keywords():
    plateau = first_plateau_experiment(4.0, PlateauConfig(n_particles=32, seeds=1, frames=40))
    same = first_plateau_experiment(4.0, n_particles=32, seeds=1, frames=40)
    np.testing.assert_array_equal(plateau.count_series, same.count_series)
    growth = growth_rate_experiment(9.0, GrowthConfig(normalization="sa", n_particles=64, seeds=1))
    again = growth_rate_experiment(9.0, normalization="sa", n_particles=64, seeds=1)
    np.testing.assert_array_equal(growth.fitted, again.fitted)


@pytest.mark.parametrize(
    "call",
    [
        lambda: metastability([4.0], sedes=1),
        lambda: first_plateau_experiment(4.0, n_partcles=8),
        lambda: growth_rate_experiment(4.0, amplitude=1e-3),
    ],
)
def test_a_misspelt_field_is_refused(call):
    with pytest.raises(TypeError, match="unexpected keyword"):
        call()


@pytest.mark.parametrize("config", SPECS, ids=lambda c: c.__name__)
@pytest.mark.parametrize(
    ("change", "param"),
    [({"normalization": "softmax"}, "normalization"), ({"time": "slow"}, "time")],
)
def test_the_configs_refuse_an_unknown_dynamics_on_construction(config, change, param):
    """One check (DynamicsSpec) for every config that names the dynamics."""
    with pytest.raises(ParameterError) as caught:
        config(**change)
    assert caught.value.param == param


@pytest.mark.parametrize("config", SPECS[1:], ids=lambda c: c.__name__)
@pytest.mark.parametrize(("change", "param"), [({"dt": 0.0}, "dt"), ({"t_max": -1.0}, "t_max")])
def test_the_integrated_configs_check_their_times(config, change, param):
    with pytest.raises(ParameterError) as caught:
        config(**change)
    assert caught.value.param == param


@pytest.mark.parametrize("config", SPECS, ids=lambda c: c.__name__)
def test_dynamics_at_is_the_configs_dynamics(config):
    dynamics = config(normalization="usa", time="rescaled").dynamics_at(2.5)
    assert (dynamics.beta, dynamics.normalization, dynamics.time) == (2.5, "usa", "rescaled")

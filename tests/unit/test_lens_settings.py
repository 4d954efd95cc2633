"""The lens's settings hand theory_lens exactly its own keyword arguments."""

from __future__ import annotations

import inspect


def test_lens_arguments_are_theory_lens_keywords_with_the_settings_values():
    from tokenfield.pipelines.theory import LensSettings, theory_lens

    settings = LensSettings(eps=0.02, more_eps=(0.2,), permutations=7, seed=3,
                            baseline="runs/rw", simulate=True, sim_beta=2.5, sim_dt=0.25,
                            heads=True)  # fmt: skip
    arguments = settings.lens_arguments()
    assert arguments == {"baseline": "runs/rw", "simulate": True, "eps": 0.02,
                         "more_eps": (0.2,), "permutations": 7, "seed": 3,
                         "sim_beta": 2.5, "sim_dt": 0.25}  # fmt: skip
    keywords = inspect.signature(theory_lens).parameters
    assert set(arguments) <= set(keywords) - {"run", "model", "baseline_model", "progress"}
    assert settings.to_dict()["heads"] is True  # the record keeps heads

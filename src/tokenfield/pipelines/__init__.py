"""Workflows: open runs, call the pure layers, draw, write files.

The floor between the CLI and the pure layers (see ``docs/architecture.md``):

- :mod:`~tokenfield.pipelines.trace`: ``tokenfield trace`` and :func:`tokenfield.trace`
  (the run's lock, writer and resume; :mod:`~tokenfield.pipelines.shards` runs it on
  Dask workers).
- :mod:`~tokenfield.pipelines.analyze`: ``tokenfield analyze`` (``analyze_run``).
- :mod:`~tokenfield.pipelines.theory`: the theory lens of ``tokenfield lens``
  (load the run's model, fit, simulate the matched ideal system, write HTML).
- :mod:`~tokenfield.pipelines.flow`: ``tokenfield lens --flow`` (re-trace with the
  MLPs removed and with random attention; write ``flow.json``/``flow.html``).
- :mod:`~tokenfield.pipelines.steer`: ``tokenfield steer`` (the closed loop: trace
  steered prompts and measure them in the run's frame; write the vector and results).
- :mod:`~tokenfield.pipelines.steer_eval`: ``tokenfield eval-steering``
  (:class:`~tokenfield.pipelines.steer_eval.SteeringEvaluation`, ``eval.json``).
- :mod:`~tokenfield.pipelines.simulate`: ``tokenfield simulate``
  (:class:`~tokenfield.pipelines.simulate.SimulationRecipe` into a run).
- :mod:`~tokenfield.pipelines.meanfield`: the mean-field commands' JSON and figures.
- :mod:`~tokenfield.pipelines.conformance`: ``tokenfield theory conformance``.

Nothing below this floor opens a run directory, loads a model or writes a file.
"""

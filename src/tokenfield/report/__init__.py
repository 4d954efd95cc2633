"""The self-contained HTML report (offline: plotly.js and figures are inlined).

Rendering only; :mod:`tokenfield.pipelines.report` (``tokenfield.write_report``)
gathers the runs and writes the file.

- :mod:`~tokenfield.report.html`: the page (``render_page``), a run's section, the figures.
- :mod:`~tokenfield.report.tables`: the tables, from the typed metrics.
- :mod:`~tokenfield.report.paths`: a run's paths, generated tokens and overlays.
- :mod:`~tokenfield.report.views`: the trajectory views' JSON payload (drawn by
  ``assets/views.js``).
- :mod:`~tokenfield.report.simulation`: a simulated run on its sphere, energy, clusters.
- :mod:`~tokenfield.report.interactive`: the standalone trajectory figure and the
  helpers the views share with it.
"""

from __future__ import annotations

from tokenfield.report.html import RunPage, Section, render_page
from tokenfield.report.interactive import trajectory_figure

__all__ = ["RunPage", "Section", "render_page", "trajectory_figure"]

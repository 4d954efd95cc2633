"""The self-contained HTML report (offline: plotly.js and figures are inlined)."""

from __future__ import annotations

from tokenfield.report.html import write_report
from tokenfield.report.interactive import trajectory_figure

__all__ = ["trajectory_figure", "write_report"]

"""The file side of the mean-field commands (``predict-clusters``, ``pde``,
``phase-diagram``, ``metastability``): write a result's JSON and its figures into
``--out``. The computations are :mod:`tokenfield.meanfield`; the drawing is
:mod:`tokenfield.viz.meanfield`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tokenfield._io import write_json_atomic
from tokenfield.viz.meanfield import write_meanfield_figures

__all__ = ["write_figures", "write_result"]


def write_result(data: dict[str, Any], out: str | Path, name: str) -> Path:
    """Write ``OUT/NAME.json`` (atomically; ``OUT`` is created). Returns its path."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    return write_json_atomic(out / f"{name}.json", data)


def write_figures(results: dict[str, Any], out: str | Path) -> list[Path]:
    """Draw the figures of ``results`` (the keys of
    :func:`tokenfield.viz.meanfield.meanfield_figures`) into ``OUT/figures``."""
    return write_meanfield_figures(results, Path(out) / "figures")

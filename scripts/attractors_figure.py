"""Draw docs/attractors.png from the committed docs/data/attractors/*.json.

.venv/bin/python scripts/attractors_figure.py
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

from tokenfield.viz.attractors import plot_attractors  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "docs" / "data" / "attractors"
FIGURE = ROOT / "docs" / "attractors.png"


def main() -> int:
    results = {p.stem: json.loads(p.read_text()) for p in sorted(DATA.glob("*.json"))}
    plot_attractors(results).savefig(FIGURE, dpi=110)
    print(FIGURE)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

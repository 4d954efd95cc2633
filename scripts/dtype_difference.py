"""Per-layer relative difference of a reduced-precision trace to a float32 trace.

    python scripts/dtype_difference.py --model smollm2 --prompts seed-categories

For each ``time`` (0 = embedding output, i = block i), over the kept particles:

- ``max``: the largest |state(dtype) - state(float32)| over the layer's largest
  |state(float32)| (the scale the batch-invariance figures use);
- ``median``: the median over particles of ||difference|| / ||state(float32)||.

Prints a Markdown table (the one in docs/scaling.md) and, with ``--json``, writes it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np


def differences(reference: np.ndarray, other: np.ndarray) -> dict[str, list[float]]:
    """``reference``, ``other``: (time, particle, feature) -> per-time relative differences."""
    diff = other.astype(np.float64) - reference.astype(np.float64)
    scale = np.abs(reference).max(axis=(1, 2))
    norms = np.linalg.norm(reference, axis=-1)
    return {
        "max": (np.abs(diff).max(axis=(1, 2)) / scale).tolist(),
        "median": np.median(np.linalg.norm(diff, axis=-1) / norms, axis=1).tolist(),
    }


def main() -> None:
    import tokenfield as tf

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--prompts", default="seed-categories")
    parser.add_argument("--positions", default="last")
    parser.add_argument("--dtypes", default="bfloat16,float16")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    reference = tf.trace(tf.load_model(args.model), args.prompts, positions=args.positions)
    ref = reference.states.values
    table = {}
    for dtype in args.dtypes.split(","):
        run = tf.trace(
            tf.load_model(args.model, dtype=dtype), args.prompts, positions=args.positions
        )
        table[dtype] = differences(ref, run.states.values)
    dtypes = list(table)
    header = "| time | " + " | ".join(f"{d} max | {d} median" for d in dtypes) + " |"
    print(header)
    print("|" + "---|" * (1 + 2 * len(dtypes)))
    for time in range(ref.shape[0]):
        cells = " | ".join(
            f"{table[d]['max'][time]:.2e} | {table[d]['median'][time]:.2e}" for d in dtypes
        )
        print(f"| {time} | {cells} |")
    if args.json:
        args.json.write_text(json.dumps(table, indent=2) + "\n")


if __name__ == "__main__":
    main()

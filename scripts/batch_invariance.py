"""Measure how much the batch size changes traced states (float32 rounding).

For each layer, the largest |difference| between the states traced with batch
size B and with batch size 1, relative to that layer's largest |state| (batch
size 1). Prints one line per (positions, B) with the maximum and median over
layers, and the layer where the maximum occurs.

    python scripts/batch_invariance.py --model smollm2 --prompts seed-categories
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

import tokenfield as tf


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--prompts", default="seed-categories")
    parser.add_argument("--batch-sizes", default="1,8,25")
    args = parser.parse_args()
    torch.set_num_threads(1)
    loaded = tf.load_model(args.model)
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    for positions in ("last", "all"):
        runs = {b: tf.trace(loaded, args.prompts, positions=positions, batch_size=b) for b in sizes}
        ref = runs[sizes[0]]["states"].values  # (time, particle, feature)
        scale = np.abs(ref).max(axis=(1, 2))
        for b in sizes[1:]:
            absolute = np.abs(runs[b]["states"].values - ref).max(axis=(1, 2))
            diff = absolute / scale
            worst = int(diff.argmax())
            print(
                f"positions={positions} batch {b} vs {sizes[0]}: per-layer max |difference| "
                f"relative to the layer's max |state|: max {diff.max():.2e} (layer {worst}), "
                f"median {np.median(diff):.2e}; absolute max {absolute.max():.2e} "
                f"(layer {int(absolute.argmax())}, max |state| there {scale[absolute.argmax()]:.3g})"
            )


if __name__ == "__main__":
    main()

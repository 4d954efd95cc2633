"""The cost of the store's chunk checksums (issue 21, item 3) on a trace-sized write.

Writes the same trace-shaped pieces (``states`` of shape (31, particles, 576),
float32, as SmolLM2 gives, with the usual per-particle coordinates) through
:class:`tokenfield.runs.RunWriter` the way ``tokenfield trace`` does (buffered,
``flush_seconds`` with one flush per 64 MB), once with the store's compressor as
it is now (Zstandard with its frame checksum) and once as before (no checksum),
interleaved, and reads each store back in full. Prints the median of
``--repeats`` of each and the ratios.

Usage: python benchmarks/store_checksum.py [--particles 2000] [--piece 80] [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import xarray as xr
from zarr.codecs import ZstdCodec

from tokenfield import runs


def pieces(particles: int, per_piece: int, layers: int = 31, d: int = 576):
    rng = np.random.default_rng(0)
    for start in range(0, particles, per_piece):
        n = min(per_piece, particles - start)
        states = rng.standard_normal((layers, n, d)).astype(np.float32)
        yield (
            xr.Dataset(
                {"states": (("time", "particle", "feature"), states)},
                coords={
                    "time": np.arange(layers),
                    "particle": np.arange(start, start + n),
                    "prompt_index": ("particle", np.arange(start, start + n) // 10),
                    "prompt": (
                        "particle",
                        runs.strings(f"p{i // 10}" for i in range(start, start + n)),
                    ),
                },
            ),
            (start + n) // 10,
        )


def write(out: Path, data, checksum: bool) -> tuple[float, float]:
    original = runs.checksummed
    if not checksum:
        runs.checksummed = lambda: (ZstdCodec(level=0, checksum=False),)
    try:
        began = time.perf_counter()
        writer = runs.RunWriter(
            out, "trace", {"bench": 1}, append_dim="particle", flush_seconds=3600
        )
        for piece, done in data:
            writer.append(piece, done=done)
        writer.finish()
        wrote = time.perf_counter() - began
    finally:
        runs.checksummed = original
    began = time.perf_counter()
    runs.open_run(out)["states"].values.sum()
    return wrote, time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--particles", type=int, default=2000)
    parser.add_argument("--piece", type=int, default=80)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    data = list(pieces(args.particles, args.piece))
    mb = sum(p.nbytes for p, _ in data) / 1e6
    times: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            for checksum in (r % 2 == 0, r % 2 != 0):  # alternate which goes first
                out = Path(tmp) / f"run-{checksum}-{r}"
                times[checksum].append(write(out, data, checksum))
    print(f"{args.particles} particles x 31 layers x 576 features ({mb:.0f} MB), "
          f"pieces of {args.piece}, median of {args.repeats}")  # fmt: skip
    for label, index in (("write", 0), ("read", 1)):
        on = statistics.median(t[index] for t in times[True])
        off = statistics.median(t[index] for t in times[False])
        print(f"{label}: checksum {on:.3f} s, none {off:.3f} s, ratio {on / off:.3f}")


if __name__ == "__main__":
    main()

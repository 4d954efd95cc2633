"""The attractor analysis (``tokenfield attractors``) on a bundled model: time and tables.

Measures the trained model and its seeded random-weight copy on the first
``--prompts`` prompts of a prompt set (default ``replication-spectrum``, 221
prompts in 7 categories; taken round-robin over its categories so every
category is present), with the settings given, and prints wall time, CPU time
(all threads), the wall and CPU time of each stage, and the load average.

``--json F`` writes the summary (the same ``trained`` / ``random`` /
``verdicts`` as ``attractors.json``, plus the timing); docs/attractors.md
renders its tables from ``docs/data/attractors/*.json``
(``scripts/attractors_tables.py``).

Usage: python benchmarks/attractors_bench.py [--model smollm2] [--prompts 200] [--k 4]
       [--spectra-prompts N] [--ftle-stride S] [--max-iter I] [--directions 16]
       [--thetas 0.001,...] [--pairs 48] [--lambdas 11] [--blocks 0,6,...] [--no-random]
       [--device cpu] [--workers W] [--json F]

The issue's benchmark is ``--prompts 200 --k 4`` with the default grid (every
stage on all 200 prompts); the trained model's part of a run is that benchmark
(``timing.trained_wall_s``), the random-weight copy is measured after it.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path


def _round_robin(prompts, count):
    by_cat: dict[str, list] = {}
    for prompt in prompts:
        by_cat.setdefault(prompt.category, []).append(prompt)
    out, i = [], 0
    while len(out) < min(count, len(prompts)):
        for items in by_cat.values():
            if i < len(items) and len(out) < count:
                out.append(items[i])
        i += 1
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--prompt-set", default="replication-spectrum")
    parser.add_argument("--prompts", type=int, default=200)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--spectra-prompts", type=int, default=None)
    parser.add_argument("--ftle-stride", type=int, default=1)
    parser.add_argument("--max-iter", type=int, default=40)
    parser.add_argument("--tol", type=float, default=1e-3)
    parser.add_argument("--oversample", type=int, default=4)
    parser.add_argument("--directions", type=int, default=16)
    parser.add_argument("--thetas", default=None)
    parser.add_argument("--pairs", type=int, default=48)
    parser.add_argument("--lambdas", type=int, default=11)
    parser.add_argument("--blocks", default=None)
    parser.add_argument("--no-random", action="store_true")
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--workers",
        type=int,
        default=None,
        help="measuring threads (default: torch's thread count on a CPU)",
    )
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    import numpy as np

    from tokenfield._io import write_json_atomic
    from tokenfield.models.load import load_model
    from tokenfield.pipelines.attractors import (
        DEFAULT_THETAS,
        AttractorConfig,
        compare,
        measure_attractors,
    )
    from tokenfield.pipelines.flow import random_copy
    from tokenfield.prompts import load_prompts

    prompts = _round_robin(load_prompts(args.prompt_set), args.prompts)
    thetas = tuple(float(x) for x in args.thetas.split(",")) if args.thetas else DEFAULT_THETAS
    blocks = tuple(int(x) for x in args.blocks.split(",")) if args.blocks else None
    config = AttractorConfig(
        k=args.k, oversample=args.oversample, tol=args.tol, max_iter=args.max_iter,
        thetas=thetas, directions=args.directions, blocks=blocks,
        ftle_stride=args.ftle_stride, pairs=args.pairs,
        lambdas=tuple(float(x) for x in np.linspace(0, 1, args.lambdas)),
        spectra_prompts=args.spectra_prompts, device=args.device, workers=args.workers,
    )  # fmt: skip
    model = load_model(args.model, device=args.device)
    load_before = os.getloadavg()
    wall0, cpu0 = time.perf_counter(), time.process_time()

    stages: dict[str, float] = {}  # CPU seconds per stage, both models together
    stage_walls: dict[str, float] = {}  # and wall seconds
    current = {"stage": None, "cpu": cpu0, "wall": wall0}

    def progress(stage: str, fraction: float) -> None:
        now, wall = time.process_time(), time.perf_counter()
        if current["stage"] is not None:
            stages[current["stage"]] = stages.get(current["stage"], 0.0) + now - current["cpu"]
            stage_walls[current["stage"]] = (
                stage_walls.get(current["stage"], 0.0) + wall - current["wall"]
            )
        current.update(stage=stage, cpu=now, wall=wall)
        if stage is None:
            return
        print(f"  {time.perf_counter() - wall0:8.1f}s wall {time.process_time() - cpu0:8.1f}s cpu"
              f" {stage} {100 * fraction:5.1f}%", flush=True)  # fmt: skip

    def close_stage() -> None:  # the last stage of a measurement ends with it
        progress(None, 1.0)  # type: ignore[arg-type]

    trained = measure_attractors(model, prompts, config, progress=progress)
    close_stage()
    timing = {"trained_wall_s": time.perf_counter() - wall0,
              "trained_cpu_s": time.process_time() - cpu0,
              "trained_stage_wall_s": {k: round(v, 1) for k, v in stage_walls.items()},
              "trained_stage_cpu_s": {k: round(v, 1) for k, v in stages.items()}}  # fmt: skip
    random = None
    if not args.no_random:
        random = measure_attractors(random_copy(model, config.seed), prompts, config,
                                    progress=progress)  # fmt: skip
        close_stage()
    timing.update(wall_s=time.perf_counter() - wall0, cpu_s=time.process_time() - cpu0,
                  load_before=list(load_before), load_after=list(os.getloadavg()),
                  threads=int(__import__("torch").get_num_threads()), cpus=os.cpu_count(),
                  stage_cpu_s={k: round(v, 1) for k, v in stages.items()},
                  stage_wall_s={k: round(v, 1) for k, v in stage_walls.items()},
                  workers=config.workers)  # fmt: skip
    summary = {
        "model": args.model,
        "prompt_set": args.prompt_set,
        "config": config.to_dict(),
        "timing": {k: (round(v, 1) if isinstance(v, float) else v) for k, v in timing.items()},
        "trained": trained["summary"],
        "random": None if random is None else random["summary"],
        "verdicts": compare(trained, random, config),
    }
    print(json.dumps(summary["timing"]))
    for line in summary["verdicts"]["ftle"]:
        print("trained:", line["text"])
    if random is not None:
        for line in summary["verdicts"]["ftle_random"]:
            print("random: ", line["text"])
    print(summary["verdicts"]["basins"]["text"])
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(args.json, json.loads(json.dumps(summary, default=_plain)))


def _plain(value):
    import numpy as np

    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(type(value).__name__)


if __name__ == "__main__":
    main()

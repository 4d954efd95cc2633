"""Where a plain trace's time goes on the host, and how much it moves within one process.

On a GPU the forward pass of a small model is cheap, and a plain in-memory trace
(``positions="all"``) is bound by the host: joining the states, stacking them into
one array, building the dataset. This benchmark traces the same prompts plainly
several times in one process, in four states:

- fresh (after two warm-up traces);
- after one ``--attention`` trace on the eager path (the model switched to eager
  attention and back);
- after one ``--attention`` trace by the queries-and-keys read-out;
- on one torch thread.

It prints the median and every time of each state, the model's attention
implementation around them (a switch that did not switch back would show here),
and the heaviest functions of one plain trace by their own time (``cProfile``)
fresh and after the eager trace, so that a slow trace can be told apart from a
slow part of it.

Usage: python benchmarks/trace_host_time.py [--device cuda] [--model smollm2]
       [--random-weights] [--tokens 256] [--prompts 16] [--batch-size 8]
       [--repeats 4] [--json F]
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def heaviest(profile: cProfile.Profile, count: int = 8) -> list[dict]:
    """The ``count`` functions of most own time: name, calls, own and total seconds."""
    stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    rows = []
    for (path, line, name), (_calls, calls, own, total, _callers) in stats.items():
        where = f"{Path(path).name}:{line}({name})" if line else name
        rows.append({"function": where, "calls": calls, "own_s": own, "total_s": total})
    return sorted(rows, key=lambda row: -row["own_s"])[:count]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--random-weights", action="store_true")
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()

    import torch

    import tokenfield as tf
    from attention_readout import long_prompts, require_device
    from tokenfield.models.trace import trace_in_memory
    from tokenfield.models.trace_config import TraceConfig

    cuda = args.device != "cpu"
    require_device(args.device)
    model = tf.load_model(args.model, device=args.device, random_weights=args.random_weights)
    prompts = long_prompts(model, args.prompts, args.tokens)

    def config(**extra) -> TraceConfig:
        return TraceConfig(prompts, positions="all", batch_size=args.batch_size, **extra)

    plain = config()

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    def run(c: TraceConfig) -> float:
        sync()
        start = time.perf_counter()
        trace_in_memory(model, c)
        sync()
        return time.perf_counter() - start

    def implementation() -> str:
        return str(getattr(model.model.config, "_attn_implementation", None))

    def profiled() -> list[dict]:
        profile = cProfile.Profile()
        profile.enable()
        run(plain)
        profile.disable()
        return heaviest(profile)

    device_name = torch.cuda.get_device_name() if cuda else "cpu"
    run(plain)
    run(plain)
    times: dict[str, list[float]] = {}
    implementations = {"start": implementation()}
    times["fresh"] = [run(plain) for _ in range(args.repeats)]
    profiles = {"fresh": profiled()}
    run(config(attention=True, attention_readout="eager"))
    implementations["after the eager trace"] = implementation()
    times["after one eager --attention trace"] = [run(plain) for _ in range(args.repeats)]
    profiles["after one eager --attention trace"] = profiled()
    run(config(attention=True))
    implementations["after the read-out trace"] = implementation()
    times["after one read-out --attention trace"] = [run(plain) for _ in range(args.repeats)]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    times["one torch thread"] = [run(plain) for _ in range(args.repeats)]
    torch.set_num_threads(threads)

    print(
        f"{device_name}, {args.prompts} prompts of {args.tokens} tokens, batch "
        f"{args.batch_size}, {threads} torch threads; attention implementation: "
        + ", ".join(f"{when} {value}" for when, value in implementations.items())
    )
    for state, values in times.items():
        spread = ", ".join(f"{value:.3f}" for value in values)
        print(f"  {state:40s} median {statistics.median(values):.3f} s  ({spread})")
    for state, rows in profiles.items():
        print(f"  heaviest functions of one plain trace, {state} (own time):")
        for row in rows:
            print(f"    {row['own_s']:7.3f} s {row['calls']:6d} calls  {row['function']}")
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "model": args.model,
                    "device": device_name,
                    "random_weights": args.random_weights,
                    "tokens": args.tokens,
                    "prompts": args.prompts,
                    "batch_size": args.batch_size,
                    "threads": threads,
                    "repeats": args.repeats,
                    "implementations": implementations,
                    "wall_s": times,
                    "wall_medians_s": {k: statistics.median(v) for k, v in times.items()},
                    "heaviest": profiles,
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()

"""The attention read-out's solver settings against a plain trace, on one machine.

Times a plain trace and ``--attention`` under several settings of the batched
reduction (the work array's precision ``REDUCE_DTYPE``, the Lanczos in rounds or
adaptive, ``DEFER_ELEMENTS``; on a GPU, the chains of short prompts solved on the host,
``HOST_CHAINS_UNTIL_CUDA``, and the Lanczos rounds replayed as CUDA graphs,
``_ROUNDS_GRAPHED``), every case in turn for ``--repeats`` rounds, and
prints the medians, each setting's ratio to the plain trace, and the largest
difference of its statistics from the eager path's (float64). Then the
read-out's own functions timed inside one trace (the device synchronised around
each call, so nested times are inclusive), and on a GPU the heaviest kernels
(``torch.profiler``).

Unlike ``attention_readout.py`` it leaves torch's thread count alone (unless
``--threads``) and keeps the eager path out of the timed rounds.

Usage: python benchmarks/attention_variants.py --device cuda --model DIR --random-weights
       [--tokens 64,256] [--prompts 16] [--batch-size 8] [--repeats 3] [--json F]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--tokens", default="64,256", help="prompt lengths, comma separated")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cuda", help="cuda or cpu")
    parser.add_argument("--random-weights", action="store_true")
    parser.add_argument("--profile", action="store_true", help="also torch.profiler (GPU)")
    parser.add_argument(
        "--threads", type=int, default=0, help="torch threads (default: torch's own count)"
    )
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()

    import numpy as np
    import torch

    import tokenfield as tf
    import tokenfield.models.attention as at
    import tokenfield.models.attention_readout as ar
    from attention_readout import long_prompts, require_device
    from tokenfield.models.trace import trace_in_memory
    from tokenfield.models.trace_config import TraceConfig

    cuda = args.device != "cpu"
    require_device(args.device)
    kind = "cuda" if cuda else "cpu"
    if args.threads:
        torch.set_num_threads(args.threads)
    base = {
        "reduce": at.REDUCE_DTYPE[kind],
        "fixed_on": at.FIXED_ON,
        "rounds": at.LANCZOS_ROUNDS_CUDA,
        "defer": at.DEFER_ELEMENTS,
        "graphs": at._GRAPH_COUNTS,
        "host": at.HOST_CHAINS_UNTIL_CUDA,
        "graphed": at._ROUNDS_GRAPHED,
    }
    variants = {
        "now": {},
        "DEFER_ELEMENTS 1 << 26": {"defer": 1 << 26},
        "DEFER_ELEMENTS 1 << 28": {"defer": 1 << 28},
        # the Ritz checks' CUDA graphs for up to 8192 matrices: one chunk a check, not 5 to 9
        "graph sets to 8192": {"graphs": (*at._GRAPH_COUNTS, 4096, 8192)},
        "float64, adaptive Lanczos": {"reduce": torch.float64, "fixed_on": ()},
    }
    if cuda:  # the chains of short prompts copied to the host, its compiled Lanczos there
        variants["chains on the host below 128 tokens"] = {"host": 128}
        variants["chains on the host below 320 tokens"] = {"host": 320}
        variants["Lanczos rounds as CUDA graphs"] = {"graphed": True}

    def apply(change: dict) -> None:
        settings = {**base, **change}
        at.REDUCE_DTYPE[kind] = settings["reduce"]
        at.FIXED_ON = settings["fixed_on"]
        at.LANCZOS_ROUNDS_CUDA = settings["rounds"]
        at.DEFER_ELEMENTS = settings["defer"]
        at._GRAPH_COUNTS = settings["graphs"]
        at.HOST_CHAINS_UNTIL_CUDA = settings["host"]
        at._ROUNDS_GRAPHED = settings["graphed"]

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    model = tf.load_model(args.model, device=args.device, random_weights=args.random_weights)
    device_name = torch.cuda.get_device_name() if cuda else "cpu"
    print(f"{device_name}, torch {torch.__version__}, {torch.get_num_threads()} threads")
    results: dict = {"model": args.model, "device": device_name, "threads":
                     torch.get_num_threads(), "prompts": args.prompts, "batch_size":
                     args.batch_size, "repeats": args.repeats, "tokens": {}}  # fmt: skip

    def measure(tokens: int) -> None:
        prompts = long_prompts(model, args.prompts, tokens)

        def config(**extra) -> TraceConfig:
            return TraceConfig(prompts, positions="all", batch_size=args.batch_size, **extra)

        def run(c: TraceConfig):
            sync()
            start = time.perf_counter()
            ds = trace_in_memory(model, c)
            sync()
            return time.perf_counter() - start, ds

        plain, attention = config(), config(attention=True)
        apply(variants["float64, adaptive Lanczos"])
        _, eager = run(config(attention=True, attention_readout="eager"))
        run(plain)
        names = [n for n in eager.data_vars if n.startswith("attn_")]
        difference = {}
        for name, change in variants.items():  # warm-up, and the statistics
            apply(change)
            _, ds = run(attention)
            difference[name] = max(
                float(np.nanmax(np.abs(ds[n].values - eager[n].values))) for n in names
            )
        wall: dict[str, list[float]] = {"plain": []} | {name: [] for name in variants}
        for _ in range(args.repeats):
            apply({})
            wall["plain"].append(run(plain)[0])
            for name, change in variants.items():
                apply(change)
                wall[name].append(run(attention)[0])
        medians = {name: statistics.median(times) for name, times in wall.items()}
        print(f"\n{tokens} tokens, {args.prompts} prompts, median of {args.repeats}")
        for name, value in medians.items():
            extra = f"  largest difference {difference[name]:.1e}" if name in difference else ""
            print(f"  {name:28s} {value:7.3f} s {value / medians['plain']:6.2f}x{extra}")

        # the read-out's functions inside one trace, synchronised around each call
        apply({})
        spent: dict[str, float] = {}
        calls: dict[str, int] = {}
        targets = [(ar, "reduce_queries_keys"), (ar, "short_weights"),
                   (at.AttentionCapture, "settle"), (at.AttentionCapture, "variables"),
                   (at, "_reduce_padded"), (at, "_chain_spectrum"), (at, "_lanczos_rounds"),
                   (at, "_lanczos_lambda2"), (at, "_ritz_extremes"), (at, "_symmetrised"),
                   (at, "_compiled_chains")]  # fmt: skip
        saved = [(owner, name, getattr(owner, name)) for owner, name in targets]

        def timed(name, function):
            def call(*a, **k):
                sync()
                start = time.perf_counter()
                try:
                    return function(*a, **k)
                finally:
                    sync()
                    spent[name] = spent.get(name, 0.0) + time.perf_counter() - start
                    calls[name] = calls.get(name, 0) + 1

            return call

        for owner, name, function in saved:
            setattr(owner, name, timed(name, function))
        try:
            total, _ = run(attention)
        finally:
            for owner, name, function in saved:
                setattr(owner, name, function)
        print(f"  inside one --attention trace ({total:.3f} s; inclusive):")
        for name, value in sorted(spent.items(), key=lambda item: -item[1]):
            print(f"    {name:24s} {value:7.3f} s {calls[name]:5d} calls")
        results["tokens"][tokens] = {
            "wall_s": wall,
            "wall_medians_s": medians,
            "max_difference_vs_eager": difference,
            "inside_s": {"total": total, "spent": spent, "calls": calls},
        }
        if cuda and args.profile:
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                run(attention)
            print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=15))

    for tokens in (int(t) for t in args.tokens.split(",")):
        measure(tokens)
        at._ROUND_GRAPHS.clear()  # the graphed variant's graphs hold GPU memory
        at._ROUNDS_SEEN.clear()
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()

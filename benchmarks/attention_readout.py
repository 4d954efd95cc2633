"""The attention read-out's cost on long prompts: ``--attention`` against a plain trace.

Same prompts, same batches, positions="all", in memory, model load excluded; the
three cases run in turn, --repeats rounds (so drifts in machine load hit every
case alike), and the median of each is compared:

- plain: ``tokenfield.trace(model, prompts, positions="all")``;
- attention (queries and keys): ``attention=True`` on the default path, SDPA left
  running and the statistics computed from the captured queries and keys
  (``TraceConfig(attention_readout="auto")``);
- attention (eager): the old path, the model switched to eager attention
  (``attention_readout="eager"``).

Also printed: the largest difference between the two paths' statistics on these
prompts, and how much of each attention trace went into the ``|lambda_2|``
eigensolves (one extra untimed run of each, with the solver timed).

Target (issue 25): attention <= 1.5x the plain trace.

Usage: python benchmarks/attention_readout.py [--model smollm2] [--tokens 256] [--prompts 4]
       [--repeats 3] [--threads 1] [--device cpu] [--random-weights] [--json F]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time


def long_prompts(model, count: int, tokens: int) -> list[str]:
    """``count`` distinct prompts of about ``tokens`` tokens each, made by joining the
    sentences of the bundled prompt sets in a different order for each prompt."""
    from tokenfield.prompts import load_prompts

    sentences = [
        p.text for name in ("seed-categories", "seed-spectrum") for p in load_prompts(name)
    ]
    out = []
    for index in range(count):
        words: list[str] = []
        step = 0
        while len(model.tokenizer(" ".join(words))["input_ids"]) < tokens:
            words.append(sentences[(index * 7 + step * 5) % len(sentences)])
            step += 1
        ids = model.tokenizer(" ".join(words))["input_ids"][:tokens]
        out.append(model.tokenizer.decode(ids))
    return out


def require_device(device: str) -> None:
    """Stop in one line (exit 2) where ``device`` asks for a GPU this machine lacks."""
    import torch

    if device != "cpu" and not torch.cuda.is_available():
        print(
            f"--device {device}: no CUDA device on this machine "
            "(torch.cuda.is_available() is False); use --device cpu",
            file=sys.stderr,
        )
        sys.exit(2)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu", help="cpu or cuda (the model and the read-out)")
    parser.add_argument(
        "--random-weights",
        action="store_true",
        help="a seeded random-weight copy of --model (same shapes, so the same speed); "
        "--model may then be a directory holding only config.json and the tokenizer",
    )
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()

    import numpy as np
    import torch

    import tokenfield as tf
    import tokenfield.models.attention as attention
    from tokenfield.models.trace import trace_in_memory
    from tokenfield.models.trace_config import TraceConfig

    torch.set_num_threads(args.threads)
    require_device(args.device)
    model = tf.load_model(args.model, device=args.device, random_weights=args.random_weights)
    prompts = long_prompts(model, args.prompts, args.tokens)
    lengths = [len(model.tokenizer(p)["input_ids"]) for p in prompts]

    def config(**extra) -> TraceConfig:
        return TraceConfig(prompts, positions="all", batch_size=args.batch_size, **extra)

    cases = {
        "plain": config(),
        "attention (queries and keys)": config(attention=True),
        "attention (eager)": config(attention=True, attention_readout="eager"),
    }
    results = {name: trace_in_memory(model, c) for name, c in cases.items()}  # warm-up
    new, old = results["attention (queries and keys)"], results["attention (eager)"]
    difference = max(
        float(np.nanmax(np.abs(new[name].values - old[name].values)))
        for name in new.data_vars
        if name.startswith("attn_")
    )
    paths = {
        name: json.loads(ds.attrs["tokenfield_config"])
        .get("attention", {})
        .get("attn_implementation")
        for name, ds in results.items()
    }
    load_before = os.getloadavg()
    wall: dict[str, list[float]] = {name: [] for name in cases}
    cpu: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.repeats):
        for name, c in cases.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            trace_in_memory(model, c)
            wall[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - start_cpu)
    load_after = os.getloadavg()

    # the eigensolves' share: one more run of each attention case with the solvers timed
    # (the batched one for prompts of at most DENSE_LIMIT tokens, the reference's above)
    import tokenfield.models.markov as markov

    solvers = {
        (attention, "_chain_spectrum"): attention._chain_spectrum,
        (attention, "_compiled_chains"): attention._compiled_chains,
        (markov, "symmetrized_spectrum"): markov.symmetrized_spectrum,
    }
    spent = {"s": 0.0}

    def timed(solver):
        def run(*a, **k):
            start = time.perf_counter()
            try:
                return solver(*a, **k)
            finally:
                spent["s"] += time.perf_counter() - start

        return run

    eigensolve: dict[str, float] = {}
    for (module, name), solver in solvers.items():
        setattr(module, name, timed(solver))
    try:
        for name in ("attention (queries and keys)", "attention (eager)"):
            spent["s"] = 0.0
            start = time.perf_counter()
            trace_in_memory(model, cases[name])
            eigensolve[name] = spent["s"] / (time.perf_counter() - start)
    finally:
        for (module, name), solver in solvers.items():
            setattr(module, name, solver)

    medians = {name: statistics.median(ts) for name, ts in wall.items()}
    device_name = torch.cuda.get_device_name() if args.device != "cpu" else "cpu"
    cpu_medians = {name: statistics.median(ts) for name, ts in cpu.items()}
    base = medians["plain"]
    print(
        f"model {args.model}, {len(prompts)} prompts of {min(lengths)}-{max(lengths)} tokens, "
        f"positions all, batch {args.batch_size}, {args.threads} thread(s), {device_name}, median of "
        f"{args.repeats}; load average {load_before[0]:.2f} -> {load_after[0]:.2f}"
    )
    print(f"{'case':32s} {'wall s':>8s} {'x plain':>8s} {'cpu s':>8s} {'eigensolves':>12s}")
    for name, value in medians.items():
        share = f"{eigensolve[name]:.0%}" if name in eigensolve else ""
        print(f"{name:32s} {value:8.2f} {value / base:8.2f} {cpu_medians[name]:8.2f} {share:>12s}")
    print(f"largest difference between the two paths' statistics: {difference:.2e}")
    ratio = medians["attention (queries and keys)"] / base
    print(
        f"target: attention <= 1.5x plain -> {ratio:.2f}x: {'MET' if ratio <= 1.5 else 'NOT MET'}"
    )
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(
                {
                    "model": args.model,
                    "device": device_name,
                    "random_weights": args.random_weights,
                    "prompts": len(prompts),
                    "tokens": lengths,
                    "batch_size": args.batch_size,
                    "threads": args.threads,
                    "repeats": args.repeats,
                    "wall_s": wall,
                    "cpu_s": cpu,
                    "wall_medians_s": medians,
                    "cpu_medians_s": cpu_medians,
                    "eigensolve_share": eigensolve,
                    "paths": paths,
                    "max_difference": difference,
                    "loadavg_before": list(load_before),
                    "loadavg_after": list(load_after),
                },
                handle,
                indent=2,
            )


if __name__ == "__main__":
    main()

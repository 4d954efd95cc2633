"""Prompts per second of a trace: one process against Dask workers, or on a GPU.

CPU mode (default): the same prompts traced into a run (streamed to Zarr) by

- one process (the model loaded first, not timed), and
- ``--workers N`` worker processes of a local Dask cluster (``torch`` threads
  ``cores // N`` each), twice: ``cold`` counts starting the cluster and loading
  the model in every worker, ``warm`` is a second trace on the same cluster
  (the workers keep the model), the steady state of a long trace;

and prints prompts/s of each and the ratios to the single process, all measured
in this one run. The single process is timed at torch's default thread count
(all cores) and at the workers' count (``cores // N``); the workers' states are
checked equal to the latter (a different thread count rounds float32 matmuls
differently: about 1e-7 of a layer's scale).

    python benchmarks/trace_scale.py --model smollm2 --prompts seed-categories --copies 4
    python benchmarks/trace_scale.py --device cuda --model smollm2 --copies 40

CUDA mode (``--device cuda``): one process on the GPU, the trace in memory,
streamed to Zarr, and with ``--attention``, and a plain Hugging Face forward
(``output_hidden_states``, moved to the CPU); prints prompts/s, states/s
(particles x times per second), the peak GPU memory
(``torch.cuda.max_memory_allocated``) of each, and the two ratios to the trace in
memory. Without a GPU it stops with one line saying so (exit 2).

``--random-weights`` times a seeded random-weight copy (same shapes, so the same
speed); ``--model`` may then be a directory holding only ``config.json`` and the
tokenizer files, e.g. a larger model's shape without its weights:

    python benchmarks/trace_scale.py --device cuda --model DIR --random-weights --dtype bfloat16

Wall times depend on the machine and its load: compare numbers from one run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path


def _prompts(name: str, copies: int):
    from tokenfield.prompts import Prompt, load_prompts

    base = load_prompts(name)
    # distinct texts (a copy number at the end) so that no two prompts are the same
    return [
        Prompt(f"{p.text} ({copy})" if copy else p.text, p.category, p.label)
        for copy in range(copies)
        for p in base
    ]


def cpu_mode(args: argparse.Namespace) -> dict:
    import numpy as np
    from dask.distributed import LocalCluster

    import tokenfield as tf
    from tokenfield.models.load import ModelSpec
    from tokenfield.models.trace_config import TraceConfig
    from tokenfield.pipelines.shards import ParallelReport, trace_parallel

    prompts = _prompts(args.prompts, args.copies)
    options = {"positions": args.positions, "batch_size": args.batch_size}
    root = Path(tempfile.mkdtemp(prefix="trace-scale-"))
    start = time.perf_counter()
    model = tf.load_model(args.model, random_weights=args.random_weights)
    load_s = time.perf_counter() - start
    import torch

    threads = max(1, (os.cpu_count() or 1) // args.workers)
    default_threads = torch.get_num_threads()
    singles = {}
    for label, count in (("default", default_threads), ("matched", threads)):
        torch.set_num_threads(count)
        start = time.perf_counter()
        singles[label] = (
            tf.trace(model, prompts, out=root / f"single-{label}", **options),
            time.perf_counter() - start,
        )
    torch.set_num_threads(default_threads)
    single, single_s = singles["default"]
    matched, matched_s = singles["matched"]
    start = time.perf_counter()
    with LocalCluster(
        n_workers=args.workers,
        threads_per_worker=1,
        processes=True,
        dashboard_address=":0",
        silence_logs=50,
    ) as cluster:
        timings = {}
        for name in ("cold", "warm"):
            report = ParallelReport()
            if name == "warm":
                start = time.perf_counter()
            parallel = trace_parallel(
                ModelSpec(args.model, random_weights=args.random_weights),
                TraceConfig(prompts, scheduler=cluster.scheduler_address, **options),
                out=root / name,
                threads=threads,
                report=report,
            )
            timings[name] = time.perf_counter() - start
    a, b = matched.states.values, parallel.states.values
    equal = bool(np.array_equal(a, b))
    n = len(prompts)
    result = {
        "model": args.model,
        "prompts": n,
        "positions": args.positions,
        "particles": int(single.sizes["particle"]),
        "cores": os.cpu_count(),
        "workers": args.workers,
        "torch_threads_per_worker": threads,
        "shards": report.shards,
        "model_load_s": round(load_s, 2),
        "torch_threads_single_default": default_threads,
        "single_s": round(single_s, 2),
        "single_matched_threads_s": round(matched_s, 2),
        "workers_cold_s": round(timings["cold"], 2),
        "workers_warm_s": round(timings["warm"], 2),
        "single_prompts_per_s": round(n / single_s, 2),
        "single_matched_threads_prompts_per_s": round(n / matched_s, 2),
        "workers_cold_prompts_per_s": round(n / timings["cold"], 2),
        "workers_warm_prompts_per_s": round(n / timings["warm"], 2),
        "ratio_cold": round(single_s / timings["cold"], 3),
        "ratio_warm": round(single_s / timings["warm"], 3),
        "ratio_warm_vs_matched_threads": round(matched_s / timings["warm"], 3),
        "states_equal": equal,
        "max_abs_difference": float(np.abs(a - b).max()),
    }
    print(
        f"{n} prompts ({result['particles']} particles), {args.model}, {os.cpu_count()} cores\n"
        f"  1 process, {default_threads} thread(s)   {result['single_prompts_per_s']:8.2f} "
        "prompts/s\n"
        f"  1 process, {threads} thread(s)   "
        f"{result['single_matched_threads_prompts_per_s']:8.2f} prompts/s\n"
        f"  {args.workers} workers (cold)   {result['workers_cold_prompts_per_s']:8.2f} "
        f"prompts/s  ratio {result['ratio_cold']:.2f}x  (cluster start + model loads)\n"
        f"  {args.workers} workers (warm)   {result['workers_warm_prompts_per_s']:8.2f} "
        f"prompts/s  ratio {result['ratio_warm']:.2f}x "
        f"({result['ratio_warm_vs_matched_threads']:.2f}x against {threads} thread(s))\n"
        f"  states equal to the single process at {threads} thread(s): {equal}"
    )
    return result


def cuda_mode(args: argparse.Namespace) -> dict:
    import torch

    if not torch.cuda.is_available():
        print(
            "trace_scale: --device cuda needs a CUDA GPU and torch.cuda.is_available() is "
            "False here; run it on a GPU machine, or leave out --device for the CPU mode",
            file=sys.stderr,
        )
        raise SystemExit(2)
    import tokenfield as tf

    prompts = _prompts(args.prompts, args.copies)
    start = time.perf_counter()
    model = tf.load_model(
        args.model, device="cuda", dtype=args.dtype, random_weights=args.random_weights
    )
    load_s = time.perf_counter() - start
    options = {"positions": args.positions, "batch_size": args.batch_size}
    root = Path(tempfile.mkdtemp(prefix="trace-scale-"))
    cases = {
        "in_memory": {},
        "streamed": {"out": root / "gpu"},
        "attention": {"attention": True},
    }
    result = {
        "model": args.model,
        "random_weights": args.random_weights,
        "device": torch.cuda.get_device_name(),
        "dtype": args.dtype,
        "positions": args.positions,
        "batch_size": args.batch_size,
        "prompts": len(prompts),
        "model_load_s": round(load_s, 2),
        "cpu_cores": os.cpu_count(),
    }
    for name, extra in cases.items():
        tf.trace(model, prompts[: args.batch_size], **options, **extra, overwrite=True)  # warm-up
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        run = tf.trace(model, prompts, **options, **extra, overwrite=True)
        torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        states = int(run.sizes["particle"]) * int(run.sizes["time"])
        result[name] = {
            "seconds": round(seconds, 3),
            "prompts_per_s": round(len(prompts) / seconds, 2),
            "states_per_s": round(states / seconds, 1),
            "particles": int(run.sizes["particle"]),
            "peak_gpu_memory_mib": round(torch.cuda.max_memory_allocated() / 2**20, 1),
        }
    from tokenfield.models.batching import encode_prompts, pad_batch

    # what a user writes by hand: every layer's output, moved to the CPU
    encoded = encode_prompts(model, prompts)
    batches = [
        {
            key: value.to(model.device)
            for key, value in pad_batch(encoded[i : i + args.batch_size], model, "last")[
                "inputs"
            ].items()
        }
        for i in range(0, len(encoded), args.batch_size)
    ]
    last = args.positions == "last"
    for _repeat in range(2):  # the first is the warm-up
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        with torch.inference_mode():
            for inputs in batches:
                out = model.model(**inputs, output_hidden_states=True, use_cache=False)
                torch.stack([h[:, -1] if last else h for h in out.hidden_states]).cpu()
        torch.cuda.synchronize()
        plain_s = time.perf_counter() - start
    result["plain_hf"] = {
        "seconds": round(plain_s, 3),
        "prompts_per_s": round(len(prompts) / plain_s, 2),
        "peak_gpu_memory_mib": round(torch.cuda.max_memory_allocated() / 2**20, 1),
    }
    seconds = {name: result[name]["seconds"] for name in cases}
    result["in_memory_over_plain_hf"] = round(seconds["in_memory"] / plain_s, 3)
    result["streamed_over_in_memory"] = round(seconds["streamed"] / seconds["in_memory"], 3)
    result["attention_over_in_memory"] = round(seconds["attention"] / seconds["in_memory"], 3)
    print(json.dumps(result, indent=2))
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--prompts", default="seed-categories")
    parser.add_argument("--copies", type=int, default=4, help="copies of the prompt set")
    parser.add_argument("--positions", default="last", choices=("last", "all"))
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--dtype", default="float32", help="cuda mode: float32 or bfloat16")
    parser.add_argument(
        "--random-weights",
        action="store_true",
        help="a seeded random-weight copy of --model (same shapes, so the same speed); "
        "--model may then be a directory holding only config.json and the tokenizer",
    )
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    before = os.getloadavg()[0]
    result = cuda_mode(args) if args.device == "cuda" else cpu_mode(args)
    result["load_average_before"] = round(before, 2)
    result["load_average_after"] = round(os.getloadavg()[0], 2)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()

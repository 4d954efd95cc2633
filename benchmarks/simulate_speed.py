"""Speed and memory of the particle simulator against a dense numpy baseline.

One Euler step of ``dx_i/dt = P_{x_i}^perp(sum_j w_ij x_j)`` (Q = K = V = I):

- tokenfield: ``Dynamics.vector_field`` (fused scaled_dot_product_attention; USA
  adds a chunked log-sum-exp), then the retraction to the sphere;
- baseline: plain numpy that builds the full ``n x n`` matrices
  (``G = X X^T``, ``W = exp(beta G)``, row sums, ``W X``).

Reported: the median seconds per step over ``--steps`` steps, both ways, and
their ratio; then one step at ``--large-n`` (default 100,000 particles in
d = 16) in a fresh subprocess, with its peak resident memory (the baseline
would need ``n^2`` floats per matrix there, 40 GB in float32, so it is not run).

    python benchmarks/simulate_speed.py                      # CPU table
    python benchmarks/simulate_speed.py --json bench.json    # also write JSON
    python benchmarks/simulate_speed.py --device cuda --n 100000,1000000 --dim 16

With ``--device cuda`` only tokenfield runs (steps per second and peak GPU memory).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time

import numpy as np


def baseline_step(x: np.ndarray, beta: float, dt: float, normalization: str) -> np.ndarray:
    """One Euler step with every n x n matrix built in full (the naive way)."""
    gram = x @ x.T  # (n, n)
    weights = np.exp(beta * gram)  # (n, n)
    if normalization == "sa":
        weights /= weights.sum(axis=1, keepdims=True)
    else:
        weights /= x.shape[0]
    attn = weights @ x  # (n, d)
    velocity = attn - (attn * x).sum(axis=1, keepdims=True) * x
    y = x + dt * velocity
    return y / np.linalg.norm(y, axis=1, keepdims=True)


def tokenfield_stepper(normalization: str, beta: float, dt: float):
    from tokenfield.particles import Dynamics
    from tokenfield.particles.integrate import Euler

    dynamics = Dynamics(beta=beta, normalization=normalization)
    solver = Euler()

    def step(x):
        return dynamics.retract(solver.step(lambda y: dynamics.field_at_layer(0, y), x, dt))

    return step


def start(n: int, dim: int, seed: int = 0) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n, dim))
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def median_seconds(step, x, steps: int, sync=lambda: None) -> float:
    x = step(x)  # warm-up
    sync()
    times = []
    for _ in range(steps):
        begin = time.perf_counter()
        x = step(x)
        sync()
        times.append(time.perf_counter() - begin)
    return statistics.median(times)


def compare(n: int, dim: int, dtype: str, steps: int, beta: float, normalization: str) -> dict:
    import torch

    x = start(n, dim).astype(dtype)
    step = tokenfield_stepper(normalization, beta, 0.1)
    with torch.no_grad():
        ours = median_seconds(step, torch.from_numpy(x), steps)
    base = median_seconds(
        lambda y: baseline_step(y, np.float32(beta).astype(dtype), 0.1, normalization), x, steps
    )
    return {
        "n": n,
        "dim": dim,
        "dtype": dtype,
        "dynamics": normalization,
        "tokenfield_s_per_step": ours,
        "baseline_s_per_step": base,
        "speedup": base / ours,
    }


def child(n: int, dim: int, dtype: str, beta: float, normalization: str, device: str) -> None:
    """Run in a fresh process: one step, then print seconds and peak memory as JSON."""
    import torch

    x = torch.from_numpy(start(n, dim).astype(dtype)).to(device)
    step = tokenfield_stepper(normalization, beta, 0.1)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    with torch.no_grad():
        begin = time.perf_counter()
        y = step(x)
        sync()
        seconds = time.perf_counter() - begin
    assert bool(torch.isfinite(y).all())
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    out = {"seconds": seconds, "peak_rss_mb": peak_kb / 1024}
    if device.startswith("cuda"):
        out["peak_gpu_mb"] = torch.cuda.max_memory_allocated() / 2**20
    print(json.dumps(out))


def large(
    n: int, dim: int, dtype: str, beta: float, normalization: str, device: str = "cpu"
) -> dict:
    command = [
        sys.executable, __file__, "--child", "--n", str(n), "--dim", str(dim),
        "--dtype", dtype, "--beta", str(beta), "--dynamics", normalization, "--device", device,
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return {"n": n, "dim": dim, "dtype": dtype, "dynamics": normalization, **result}


def cuda_rows(
    ns: list[int], dim: int, dtype: str, steps: int, beta: float, dynamics: list[str]
) -> list[dict]:
    import torch

    if not torch.cuda.is_available():
        sys.exit("--device cuda: CUDA is not available here")
    rows = []
    for normalization in dynamics:
        for n in ns:
            torch.cuda.reset_peak_memory_stats()
            x = torch.from_numpy(start(n, dim).astype(dtype)).cuda()
            step = tokenfield_stepper(normalization, beta, 0.1)
            with torch.no_grad():
                seconds = median_seconds(step, x, steps, torch.cuda.synchronize)
            rows.append(
                {
                    "n": n,
                    "dim": dim,
                    "dtype": dtype,
                    "dynamics": normalization,
                    "device": torch.cuda.get_device_name(),
                    "s_per_step": seconds,
                    "steps_per_s": 1.0 / seconds,
                    "peak_gpu_mb": torch.cuda.max_memory_allocated() / 2**20,
                }
            )
            print(f"{normalization:>4} n={n:>9,} d={dim}: {1 / seconds:8.3f} steps/s "
                  f"({seconds:.4f} s/step, peak GPU {rows[-1]['peak_gpu_mb']:.0f} MiB)", flush=True)  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", default=None, help="comma-separated particle counts (default 4096)")
    parser.add_argument("--dim", type=int, default=3)
    parser.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    parser.add_argument("--beta", type=float, default=1.0)
    parser.add_argument("--steps", type=int, default=5, help="steps timed (the median is reported)")
    parser.add_argument("--dynamics", default="sa,usa", help="sa, usa or sa,usa")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--large-n", type=int, default=100_000)
    parser.add_argument("--large-dim", type=int, default=16)
    parser.add_argument("--large-dtype", default=None, choices=["float32", "float64"])
    parser.add_argument("--no-large", action="store_true", help="skip the large one-step run")
    parser.add_argument(
        "--no-compare", action="store_true", help="skip the comparison with dense numpy"
    )
    parser.add_argument("--json", default=None, help="write the results here")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    dynamics = [d.strip() for d in args.dynamics.split(",") if d.strip()]
    if args.child:
        child(int(args.n), args.dim, args.dtype, args.beta, dynamics[0], args.device)
        return

    import torch

    report: dict = {
        "machine": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "device": args.device,
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", ""),
        "load_average_before": os.getloadavg()[0],
    }
    if args.device.startswith("cuda"):
        ns = [int(v) for v in (args.n or "100000,1000000").split(",")]
        report["cuda"] = cuda_rows(ns, args.dim, args.dtype, args.steps, args.beta, dynamics)
    else:
        ns = [int(v) for v in (args.n or "4096").split(",")]
        rows = [
            compare(n, args.dim, args.dtype, args.steps, args.beta, dyn)
            for dyn in dynamics
            for n in ns
            if not args.no_compare
        ]
        report["compare"] = rows
        print(f"{'dynamics':>8} {'n':>7} {'d':>3} {'dtype':>8} {'tokenfield s/step':>18} "
              f"{'numpy dense s/step':>19} {'speedup':>8}")  # fmt: skip
        for r in rows:
            print(f"{r['dynamics']:>8} {r['n']:>7} {r['dim']:>3} {r['dtype']:>8} "
                  f"{r['tokenfield_s_per_step']:>18.4f} {r['baseline_s_per_step']:>19.4f} "
                  f"{r['speedup']:>7.1f}x")  # fmt: skip
        if not args.no_large:
            dtype = args.large_dtype or args.dtype
            big = [large(args.large_n, args.large_dim, dtype, args.beta, dyn) for dyn in dynamics]
            report["large"] = big
            dense_gb = args.large_n**2 * np.dtype(dtype).itemsize / 1e9
            print(f"\none step at n = {args.large_n:,}, d = {args.large_dim}, {dtype} "
                  f"(a dense n x n matrix alone would be {dense_gb:.0f} GB):")  # fmt: skip
            for r in big:
                print(
                    f"{r['dynamics']:>8}: {r['seconds']:.2f} s, peak RSS {r['peak_rss_mb']:.0f} MB"
                )
    report["load_average_after"] = os.getloadavg()[0]
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(report, handle, indent=2)
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()

"""Wall time of ``tokenfield steer eval`` and of its decoder against the old protocol.

Two measurements, in one process so a busy machine affects both alike:

1. **decoder ratio** (always): the same answers (``--items`` test word prompts x
   ``--conditions`` conditions: unsteered plus random directions at the middle
   layer) produced by
   - the old protocol: one Hugging Face ``generate`` pass per condition
     (``greedy_continuations``, batches of 16, the steering hook on, no sharing);
   - the new decoder (``answer_conditions``): the few-shot prefix run once, each
     prompt's own part once, every condition decoded together in one batch, early
     stop once every answer is finished.
   Both give the same parsed answers (checked here, reported as ``agree``).
2. **the whole default evaluation** (``--full``): ``evaluate_steering`` with the
   command's defaults (300 test, 100 validation, 64 fit problems, 3 x 3 grid,
   32 random directions, 32 label shuffles, 32 centroid halves); prints its wall time
   and the per-phase timings.

The decoder's advantage grows with the number of conditions per prompt (the
default evaluation decodes 98 conditions of each test prompt together); a small
``--conditions`` understates it. Measured on the shared 2-core machine (load average 3 to 5,
one thread, ``--items 16 --conditions 8``): old 88.9 s wall / 45.3 s CPU, new 6.4 s wall /
3.2 s CPU (14x), parsed answers identical. The earlier default evaluation on SmolLM2 (one
label-shuffle draw, no centroid halves: about 12 000 answers) used 3.6 min of CPU time (14.7 min of wall time while getting a quarter of a
core); the previous decoder, which copied the KV cache per row, used 26 min of CPU time.

Usage: python benchmarks/steering_eval.py [--model smollm2] [--items 16] [--conditions 4]
       [--full] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--items", type=int, default=16)
    parser.add_argument("--conditions", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--full", action="store_true", help="also time the default evaluation")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    import tokenfield as tf
    from tokenfield.steering.evaluate import default_layers, evaluate_steering
    from tokenfield.steering.generate import Condition, answer_conditions, greedy_continuations
    from tokenfield.steering.hooks import steering
    from tokenfield.steering.problems import few_shot, make_splits, parse_answer
    from tokenfield.steering.vectors import SteeringVector, random_control

    model = tf.load_model(args.model)
    splits = make_splits({"shot": 4, "test": args.items}, 0)
    prompts = [few_shot(splits["shot"], p, "word") for p in splits["test"]]
    layer = default_layers(model.n_layers)[1]
    base = SteeringVector(np.ones(model.d_model, np.float32) * 2.0, layer, {})
    conditions = [Condition("plain")] + [
        Condition(f"control_{s}", random_control(base, s), 1.0) for s in range(args.conditions - 1)
    ]
    answers = args.items * args.conditions

    start, cpu = time.perf_counter(), time.process_time()
    old: dict[str, list[str]] = {}
    for c in conditions:
        if c.vector is None:
            old[c.name] = greedy_continuations(model, prompts, max_new_tokens=5, batch_size=16)
        else:
            with steering(model, c.vector, c.alpha, check=False):
                old[c.name] = greedy_continuations(model, prompts, max_new_tokens=5, batch_size=16)
    old_s, old_cpu = time.perf_counter() - start, time.process_time() - cpu

    start, cpu = time.perf_counter(), time.process_time()
    new = answer_conditions(model, prompts, conditions, max_new_tokens=5, batch_size=256)
    new_s, new_cpu = time.perf_counter() - start, time.process_time() - cpu
    agree = np.mean(
        [
            parse_answer(a) == parse_answer(b)
            for c in conditions
            for a, b in zip(new[c.name]["texts"], old[c.name], strict=True)
        ]
    )
    result = {
        "model": args.model,
        "answers": answers,
        "old_s": old_s,
        "new_s": new_s,
        "speedup": old_s / new_s,
        # CPU seconds (all threads): steadier than wall time on a shared machine
        "old_cpu_s": old_cpu,
        "new_cpu_s": new_cpu,
        "cpu_speedup": old_cpu / new_cpu,
        "agree": float(agree),
    }
    print(f"{answers} answers ({args.items} prompts x {args.conditions} conditions), {args.model}")
    print(f"  old protocol (generate per condition): {old_s:8.1f} s wall {old_cpu:8.1f} s CPU")
    print(f"  new decoder (shared prefix, batched):  {new_s:8.1f} s wall {new_cpu:8.1f} s CPU"
          f"   ({old_s / new_s:.1f}x wall, {old_cpu / new_cpu:.1f}x CPU)")  # fmt: skip
    print(f"  parsed answers agree: {agree:.1%}")
    if args.full:
        start = time.perf_counter()
        evaluation = evaluate_steering(model, progress=True)
        result["full_s"] = time.perf_counter() - start
        result["full_timings"] = evaluation["timings"]
        print(f"  default evaluation, measured: {result['full_s'] / 60:.1f} min "
              f"({', '.join(f'{k} {v:.0f}' for k, v in evaluation['timings'].items())})")  # fmt: skip
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(result, handle, indent=2)


if __name__ == "__main__":
    main()

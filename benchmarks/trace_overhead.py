"""Tracer cost against a plain Hugging Face forward with output_hidden_states=True.

Same 25 prompts (seed-categories), same batches and padding, model load excluded,
median of --repeats runs, everything measured in one process and one run so the
ratios are not thrown off by a noisy machine.

- baseline: ``model(**inputs, output_hidden_states=True)`` then reading the last
  token of every layer: what a user writes by hand.
- strict baseline: the same with ``logits_to_keep=1``.
- tokenfield: the whole ``tokenfield.trace(model, prompts)`` call (tokenising,
  hooks, Dataset assembly), positions="last", in memory; and with ``out=`` (Zarr).

Memory held: bytes of hidden states each approach keeps (the baseline holds every
position of every layer; the tracer only the positions asked for).

Usage: python benchmarks/trace_overhead.py [--model smollm2] [--repeats 7] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--prompts", default="seed-categories")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()

    import tokenfield as tf
    from tokenfield.models.batching import encode_prompts, pad_batch
    from tokenfield.prompts import load_prompts

    model = tf.load_model(args.model)
    prompts = load_prompts(args.prompts)
    encoded = encode_prompts(model, prompts)
    batches = [
        pad_batch(encoded[i : i + args.batch_size], model, "last")["inputs"]
        for i in range(0, len(encoded), args.batch_size)
    ]

    def baseline(logits_to_keep: int | None) -> tuple[torch.Tensor, int]:
        kept, held = [], 0
        extra = {} if logits_to_keep is None else {"logits_to_keep": logits_to_keep}
        with torch.inference_mode():
            for inputs in batches:
                out = model.model(**inputs, output_hidden_states=True, use_cache=False, **extra)
                held += sum(h.numel() * h.element_size() for h in out.hidden_states)
                kept.append(torch.stack([h[:, -1] for h in out.hidden_states]))
        return torch.cat(kept, dim=1), held

    def tokenfield_memory():
        return tf.trace(model, prompts, batch_size=args.batch_size)

    def tokenfield_zarr() -> None:
        tmp = tempfile.mkdtemp()
        try:
            tf.trace(model, prompts, batch_size=args.batch_size, out=f"{tmp}/run")
        finally:
            shutil.rmtree(tmp)

    cases = {
        "plain HF, output_hidden_states": lambda: baseline(None),
        "plain HF, output_hidden_states, logits_to_keep=1": lambda: baseline(1),
        "tokenfield.trace (in memory)": tokenfield_memory,
        "tokenfield.trace (to Zarr run)": tokenfield_zarr,
    }
    for fn in cases.values():  # warm-up
        fn()
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.repeats):  # interleaved, so drifts in machine load hit all cases
        for name, fn in cases.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    medians = {name: statistics.median(ts) for name, ts in times.items()}
    base = medians["plain HF, output_hidden_states"]

    _, held_baseline = baseline(None)
    ds = tokenfield_memory()
    held_tracer = ds.states.nbytes + ds.final_norm_states.nbytes
    reference, _ = baseline(None)
    # HF's last hidden state is the final-norm output; compare it with ours apart
    scale = reference.abs().max()
    agreement = max(
        float((torch.from_numpy(ds.states.values[:-1]) - reference[:-1]).abs().max() / scale),
        float((torch.from_numpy(ds.final_norm_states.values) - reference[-1]).abs().max() / scale),
    )

    print(
        f"model {args.model}, {len(prompts)} prompts, batch {args.batch_size}, median of {args.repeats}"
    )
    print(f"{'case':52s} {'median s':>9s} {'x baseline':>10s}")
    for name, value in medians.items():
        print(f"{name:52s} {value:9.4f} {value / base:10.3f}")
    print(
        f"hidden-state bytes held: baseline {held_baseline / 1e6:.2f} MB, "
        f"tracer {held_tracer / 1e6:.3f} MB ({held_baseline / held_tracer:.0f}x less)"
    )
    print(f"max relative difference of the traced states from the baseline's: {agreement:.2e}")
    ratio = medians["tokenfield.trace (in memory)"] / base
    print(
        f"target: tracer <= 1.10x baseline -> {ratio:.3f}x: {'MET' if ratio <= 1.10 else 'NOT MET'}"
    )
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(
                {
                    "medians_s": medians,
                    "times_s": times,
                    "ratio": ratio,
                    "bytes_baseline": held_baseline,
                    "bytes_tracer": held_tracer,
                },
                handle,
                indent=2,
            )


if __name__ == "__main__":
    main()

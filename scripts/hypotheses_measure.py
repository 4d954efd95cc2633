"""Measure the source material's other hypotheses on the bundled models (docs/theory-lens.md).

For each model, its trained weights and its seeded random-weight copy are measured
with :func:`tokenfield.pipelines.hypotheses.measure_model` on a prompt set; the
result (per-head lists dropped) goes to ``docs/data/hypotheses/<model>.json``,
rendered by ``scripts/hypotheses_tables.py``. The same numbers come from
``tokenfield hypotheses RUN --baseline RANDOM_RUN`` on runs traced from these prompts.

Usage: python scripts/hypotheses_measure.py --model smollm2 [--prompts replication-categories]
       [--convex-prompts 20]
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import asdict
from pathlib import Path

from tokenfield._io import to_jsonable, write_json_atomic
from tokenfield._version import __version__
from tokenfield.analysis.order import LINEAR_PACE_RULE
from tokenfield.models.load import ModelSpec
from tokenfield.pipelines.hypotheses import HypothesesSettings, measure_model
from tokenfield.prompts import load_prompts

PARTS = ("trained", "baseline")
OUT = Path(__file__).resolve().parent.parent / "docs" / "data" / "hypotheses"


def _trim(result: dict) -> dict:
    for layers in result["convex_fit"]["targets"].values():
        for layer in layers:
            layer.pop("heads", None)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--prompts", default="replication-categories")
    parser.add_argument("--max-prompts", type=int, default=None)
    parser.add_argument("--convex-prompts", type=int, default=20)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument(
        "--part",
        choices=("both", "trained", "baseline"),
        default="both",
        help="measure one part only, into MODEL-PART.json (merge them with --merge)",
    )
    parser.add_argument("--merge", action="store_true", help="merge MODEL-{trained,baseline}.json")
    args = parser.parse_args(argv)
    path = args.out / f"{args.model}.json"
    if args.merge:
        import json

        parts = [json.loads((args.out / f"{args.model}-{k}.json").read_text()) for k in PARTS]
        merged = {**parts[0], "baseline": parts[1]["baseline"]}
        merged["seconds"] = parts[0]["seconds"] + parts[1]["seconds"]
        write_json_atomic(path, merged)
        print(path)
        return 0
    settings = HypothesesSettings(max_prompts=args.max_prompts, convex_prompts=args.convex_prompts)
    prompts = load_prompts(args.prompts)
    started = time.time()
    out = {
        "tokenfield_version": __version__,
        "prompts": args.prompts,
        "rule": LINEAR_PACE_RULE,
        "settings": to_jsonable(asdict(settings)),
    }
    for key, random_weights in (("trained", False), ("baseline", True)):
        if args.part not in ("both", key):
            continue
        model = ModelSpec(args.model, random_weights=random_weights, seed=0).load()
        result = measure_model(
            model, prompts, settings,
            progress=lambda m, k=key: print(f"{args.model} {k}: {m}", file=sys.stderr, flush=True),
        )  # fmt: skip
        out[key] = _trim(result)
    out["seconds"] = round(time.time() - started)
    if args.part != "both":
        path = args.out / f"{args.model}-{args.part}.json"
    args.out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, to_jsonable(out))
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

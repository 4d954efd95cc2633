"""Wall time of one ``tokenfield`` command under different torch thread settings,
run in alternation (round-robin) on the same machine, with the load average before
and after each run: what the default thread count costs when the cores are busy.

    python benchmarks/threads_contention.py --rounds 4 --json out.json \\
        --variants '{"torch default": {"TOKENFIELD_THREADS": "2"}, "idle cores": {}}' \\
        -- .venv/bin/tokenfield trace -m smollm2 -p seed-spectrum -o /tmp/t --overwrite

Each variant is a set of environment variables added to a clean copy of the
environment (``OMP_NUM_THREADS``, ``OMP_WAIT_POLICY`` and ``TOKENFIELD_THREADS``
removed first). ``docs/scaling.md`` renders the committed results
(``docs/data/scale/cpu2-threads-*.json``) with ``scripts/scaling_tables.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

CLEARED = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "TOKENFIELD_THREADS")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", required=True, help="JSON: name -> environment")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--label", default="", help="what the command is, for the table")
    parser.add_argument("--json", type=Path)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = [c for c in args.command if c != "--"]
    variants = json.loads(args.variants)
    rows = []
    for round_ in range(args.rounds):
        for name, extra in variants.items():
            env = {k: v for k, v in os.environ.items() if k not in CLEARED}
            env.update(extra)
            before = os.getloadavg()[0]
            started = time.perf_counter()
            done = subprocess.run(command, env=env, capture_output=True, text=True)
            seconds = time.perf_counter() - started
            row = {"round": round_, "variant": name, "seconds": round(seconds, 1),
                   "load_before": round(before, 2), "load_after": round(os.getloadavg()[0], 2),
                   "returncode": done.returncode}  # fmt: skip
            rows.append(row)
            print(json.dumps(row), flush=True)
            if done.returncode:
                print(done.stderr[-500:], file=sys.stderr, flush=True)
    if args.json:
        report = {"label": args.label, "command": command, "variants": variants, "rows": rows}
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

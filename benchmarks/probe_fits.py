"""The probes' fits: one batch against one scikit-learn fit per problem, in the same run.

``tokenfield.analysis.probes.probe_accuracy`` solves every (layer, labelling,
fold) problem, the real labels and all the shuffles, in one batch of Newton
steps. The baseline is what it replaced: one ``LogisticRegression`` fit per
problem, at scikit-learn's default tolerance (``--tol 1e-4``, what tokenfield
used) or held to a tight one (``--tol 1e-8``, about the batch's precision).
Random features (a class signal plus noise), ``--layers`` layers, 5-fold.

Usage: python benchmarks/probe_fits.py [--prompts 25 100 400] [--dim 576] [--classes 5]
       [--layers 3] [--permutations 20] [--tol 1e-4 1e-8] [--json F]

docs/scaling.md renders its table from ``docs/data/scale/cpu2-probe-fits.json``
(``--json``; ``scripts/scaling_tables.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import time
import warnings

import numpy as np


def sklearn_seconds(x, labels, permutations: int, tol: float, seed: int = 0) -> float:
    """One scikit-learn fit per (layer, labelling, fold): the old probes."""
    from sklearn.linear_model import LogisticRegression

    from tokenfield.analysis.probes import _folds, _prepare

    splits, _cv = _folds(labels, 5, seed)
    rng = np.random.default_rng(seed)
    labellings = [labels, *(rng.permutation(labels) for _ in range(permutations))]
    start = time.perf_counter()
    for layer in x:
        z = _prepare(layer)
        for lab in labellings:
            for train, test in splits:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    model = LogisticRegression(C=1.0, max_iter=2000, solver="newton-cg", tol=tol)
                    model.fit(z[train], lab[train]).predict(z[test])
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--prompts", type=int, nargs="+", default=[25, 100, 400])
    parser.add_argument("--dim", type=int, default=576)
    parser.add_argument("--classes", type=int, default=5)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--permutations", type=int, default=20)
    parser.add_argument("--tol", type=float, nargs="+", default=[1e-4, 1e-8])
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()

    from tokenfield.analysis.probes import probe_accuracy

    # warm-up: imports (scikit-learn's folds and models) and first calls, timed by neither
    warm = np.random.default_rng(0).standard_normal((1, 10, 4))
    probe_accuracy(warm, np.arange(10) % 2, permutations=1)
    sklearn_seconds(warm, np.arange(10) % 2, 1, 1e-4)
    print(
        f"{args.layers} layers, {args.dim} features, {args.classes} classes, "
        f"{args.permutations} shuffles, 5-fold; seconds"
    )
    header = f"{'prompts':>8s} {'batched':>9s}" + "".join(
        f" {'sklearn tol ' + format(t, 'g'):>17s} {'ratio':>6s}" for t in args.tol
    )
    print(header)
    rows = []
    for n in args.prompts:
        rng = np.random.default_rng(n)
        codes = np.arange(n) % args.classes
        signal = 0.15 * rng.standard_normal((args.classes, args.dim))[codes]
        x = rng.standard_normal((args.layers, n, args.dim)) + signal
        labels = codes.astype(str)
        start = time.perf_counter()
        probe_accuracy(x, labels, permutations=args.permutations)
        batched = time.perf_counter() - start
        row = f"{n:8d} {batched:9.2f}"
        sklearn = {}
        for tol in args.tol:
            sklearn[format(tol, "g")] = old = sklearn_seconds(x, labels, args.permutations, tol)
            row += f" {old:17.2f} {old / batched:5.2f}x"
        print(row)
        rows.append({"prompts": n, "batched_s": batched, "sklearn_s": sklearn})
    if args.json:
        settings = {k: getattr(args, k) for k in ("dim", "classes", "layers", "permutations")}
        result = {**settings, "rows": rows, "loadavg": os.getloadavg()}
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()

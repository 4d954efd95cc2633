"""Measure the seed post's claims on traced runs and print them as Markdown.

Usage:
    python scripts/seed_findings.py runs/demo            # smollm2 demo runs
    python scripts/seed_findings.py runs/demo-gemma

Expects DIR/seed-categories, DIR/seed-spectrum and their random-weight baselines
DIR/seed-categories-random, DIR/seed-spectrum-random (what `tokenfield demo`
writes). Every number uses tokenfield's own analysis functions; every claim is
set beside a null (permutation) or the random-weight baseline.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from scipy.stats import mannwhitneyu

from tokenfield.analysis import (
    centroid_distances,
    depth_ordering,
    fit_projection,
    kinematics,
    project,
    separation,
)
from tokenfield.runs import open_run

FORMAL = {"Code", "Math", "Pure Code", "Pure Math"}
NATURAL = {"History/Facts", "Creative/Poetry", "Pure Story"}


def load(path: Path):
    ds = open_run(path).load()
    return ds.isel(particle=np.asarray(ds["is_last"].values, bool))


def depth(ds, sphere: bool) -> tuple[float, float]:
    frame = fit_projection(ds, sphere=sphere)
    order = depth_ordering(project(ds, frame))
    return order.overall, float(np.nanmedian(order.per_particle.values))


def pc2_axis(ds) -> tuple[float, int, float]:
    """Best separation of formal vs natural prompts along PC2 over layers:
    AUC (0.5 = none, 1 = perfect, either sign) and its layer, with the p-value of
    a two-sided Mann-Whitney test at that layer."""
    frame = fit_projection(ds)
    pcs = project(ds, frame).values  # (time, particle, comp)
    cats = [str(c) for c in ds["category"].values]
    formal = np.array([c in FORMAL for c in cats])
    natural = np.array([c in NATURAL for c in cats])
    best = (0.5, 0, 1.0)
    for t in range(pcs.shape[0]):
        a, b = pcs[t, formal, 1], pcs[t, natural, 1]
        test = mannwhitneyu(a, b, alternative="two-sided")
        auc = test.statistic / (len(a) * len(b))
        auc = max(auc, 1 - auc)
        if auc > best[0]:
            best = (float(auc), t, float(test.pvalue))
    return best


def sep(ds) -> dict:
    result = separation(ds, n_permutations=500, seed=0)
    sil = np.asarray(result["silhouette"].values)
    t = int(np.nanargmax(sil))
    return {
        "best": float(sil[t]),
        "layer": int(ds["time"].values[t]),
        "null_high": float(result["silhouette_null_high"].values[t]),
        "p": float(result["silhouette_p"].values[t]),
    }


def centroid_table(ds, a: str, b: str, c: str, times) -> list[tuple[int, float, float]]:
    dist = centroid_distances(ds)
    return [
        (
            t,
            float(dist.sel(time=t, category=a, other=b)),
            float(dist.sel(time=t, category=a, other=c)),
        )
        for t in times
    ]


def cosine_to_centroid(ds, label: str, category: str, t: int) -> float:
    states = np.asarray(ds["states"].values[t], dtype=np.float64)
    unit = states / np.linalg.norm(states, axis=-1, keepdims=True)
    cats = np.array([str(c) for c in ds["category"].values])
    labels = np.array([str(x) for x in ds["label"].values])
    centroid = unit[cats == category].mean(0)
    centroid /= np.linalg.norm(centroid)
    return float(1 - unit[labels == label][0] @ centroid)


def prompt15(ds) -> dict:
    """Where prompt 15's relative step is largest, inner layers only (block 1 and
    the last block move every prompt most), against the other prompts there."""
    kin = kinematics(ds)
    rel = np.asarray(kin["relative_step"].values)  # (step, particle)
    steps = np.asarray(kin["step"].values)
    labels = [str(x) for x in ds["label"].values]
    p = labels.index("15")
    inner = slice(1, rel.shape[0] - 1)
    k = int(np.argmax(rel[inner, p])) + 1
    others = np.delete(rel[k], p)
    return {
        "step": int(steps[k]),
        "relative": float(rel[k, p]),
        "others_median": float(np.median(others)),
        "rank": int((others > rel[k, p]).sum()) + 1,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("runs", type=Path)
    args = parser.parse_args()
    d = args.runs
    cats, spec = load(d / "seed-categories"), load(d / "seed-spectrum")
    cats_r, spec_r = load(d / "seed-categories-random"), load(d / "seed-spectrum-random")
    model = cats.attrs["run"]["config"]["model"]["name"]
    n_time = cats.sizes["time"]
    out = sys.stdout.write
    out(f"### {model} ({n_time - 1} blocks)\n\n")
    out("| claim | measure | model | random-weight copy |\n|---|---|---|---|\n")
    for sphere in (False, True):
        m, r = depth(cats, sphere), depth(cats_r, sphere)
        out(
            f"| PC1 is depth | Spearman(PC1, layer), pooled / median per prompt, "
            f"{'unit-sphere' if sphere else 'raw'} states, seed-categories | "
            f"{m[0]:.2f} / {m[1]:.2f} | {r[0]:.2f} / {r[1]:.2f} |\n"
        )
    for name, ds, dr in (("seed-categories", cats, cats_r), ("seed-spectrum", spec, spec_r)):
        m, r = pc2_axis(ds), pc2_axis(dr)
        out(
            f"| PC2 is natural vs formal | best AUC of formal vs natural prompts on PC2 "
            f"(layer, Mann-Whitney p), {name} | {m[0]:.2f} (layer {m[1]}, p={m[2]:.3f}) | "
            f"{r[0]:.2f} (layer {r[1]}, p={r[2]:.3f}) |\n"
        )
    for name, ds, dr in (("seed-categories", cats, cats_r), ("seed-spectrum", spec, spec_r)):
        m, r = sep(ds), sep(dr)
        out(
            f"| categories group | best cosine silhouette (layer; null 97.5 %; p), {name} | "
            f"{m['best']:.3f} (layer {m['layer']}; {m['null_high']:.3f}; p={m['p']:.3f}) | "
            f"{r['best']:.3f} (layer {r['layer']}; {r['null_high']:.3f}; p={r['p']:.3f}) |\n"
        )
    p15, p15r = prompt15(spec), prompt15(spec_r)
    out(
        "| prompt 15 moves fast early | its largest relative step in inner blocks: step, size, "
        "others' median there, its rank of 21 | "
        f"step {p15['step']}: {p15['relative']:.2f} vs {p15['others_median']:.2f}, rank {p15['rank']} | "
        f"step {p15r['step']}: {p15r['relative']:.2f} vs {p15r['others_median']:.2f}, rank {p15r['rank']} |\n"
    )
    mid = [n_time // 4, n_time // 2, (3 * n_time) // 4, n_time - 1]
    out(
        "\nCosine distance between category centroids (last tokens): word problems to stories vs to pure math.\n\n"
    )
    out(
        "| layer | d(WP, Story) | d(WP, Math) | closer to | random copy: d(WP, Story) | d(WP, Math) |\n|---|---|---|---|---|---|\n"
    )
    real = centroid_table(spec, "Word Problems", "Pure Story", "Pure Math", mid)
    rand = centroid_table(spec_r, "Word Problems", "Pure Story", "Pure Math", mid)
    for (t, s, m), (_t, rs, rm) in zip(real, rand, strict=True):
        out(
            f"| {t} | {s:.3f} | {m:.3f} | {'stories' if s < m else 'math'} | {rs:.3f} | {rm:.3f} |\n"
        )
    out(
        "\nCosine distance of each pseudocode prompt to the Pure Math centroid (prompt 17 uses '10').\n\n"
    )
    out("| layer | 16 | 17 | 18 |\n|---|---|---|---|\n")
    for t in mid:
        row = [cosine_to_centroid(spec, label, "Pure Math", t) for label in ("16", "17", "18")]
        out(f"| {t} | " + " | ".join(f"{v:.3f}" for v in row) + " |\n")


if __name__ == "__main__":
    main()

"""The store writer's throughput against the disk's raw sequential rate, in one run.

Feeds :class:`tokenfield.runs.RunWriter` synthetic trace-shaped pieces as fast as
it takes them (no model): each piece is a batch of ``--batch`` prompts of
``--tokens`` tokens, i.e. ``states`` of shape (``--layers``, batch x tokens,
``--d``) in float32 with a streamed ``positions=all`` trace's other variables
(final-norm states, next-token top-k, the per-token coordinates), written the way
``tokenfield trace --out`` writes them (buffered flushes in a background thread).
After :meth:`~tokenfield.runs.RunWriter.finish`, the file system is synced
(``syncfs``: what the kernel's write-back does, all files at once).

Alternating with each writer run, the same bytes go into one plain file, one
``write`` per piece, then synced the same way: the disk's raw sequential rate as
the writer would see it. ``--sync files`` fsyncs instead every file (the run's,
directories included; the plain file's), which charges each of the run's files
a journal commit. Both rates count the same bytes (the pieces' ``nbytes``), and the
ratio is the median over ``--alternations`` (which goes first alternates too, so
a drift in the machine's load hits both alike). The load average is recorded at
the start and the end.

Also alternated, as a third case: the plain file again, with its write-back
started after every piece (Linux ``sync_file_range(SYNC_FILE_RANGE_WRITE)``), so
that the disk writes while the next piece is copied: what the disk itself can
take, which the write-then-sync baseline above underestimates when the copy and
the disk's work do not overlap. The writer is compared with both; the target is
stated against the first, the issue's definition. ``--no-write-behind`` skips it
(and it is skipped where ``sync_file_range`` is missing).

The writer is given the run's particle count as its ``size_hint``, as a trace
passes it (its arrays are then pre-sized and written by region); ``--size-hint
none`` writes without it (every flush resizes every array).

Also measured once: the compression ratio of ``states`` under the store's former
compressor (Zstandard level 0), on these synthetic states and, with ``--real
RUN``, on a real run's states.

Target (issue 25): writer >= 0.8x raw on the 2-core development machine.

Usage: python benchmarks/writer_throughput.py [--mib 512] [--alternations 5]
       [--sync fs|files] [--size-hint particles|none] [--compress] [--real RUN]
       [--json F]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr
import zarr  # noqa: F401 - imported before the clock starts, as in a trace

from tokenfield import runs

MIB = 1 << 20


def pieces(args: argparse.Namespace) -> list[tuple[xr.Dataset, int]]:
    """Trace-shaped pieces adding up to about ``--mib`` MiB of states. The states'
    values repeat from piece to piece (one random buffer), their coordinates do not."""
    rng = np.random.default_rng(0)
    n = args.batch * args.tokens
    states = (rng.standard_normal((args.layers, n, args.d)) * 3).astype(np.float32)
    final = states[-1].copy()
    prob = rng.random((n, 5)).astype(np.float32)
    top = np.array([[f"tok{j}" for j in range(5)]] * n, dtype=object)
    count = max(1, round(args.mib * MIB / states.nbytes))
    out = []
    for b in range(count):
        start = b * n
        prompt = np.repeat(np.arange(b * args.batch, (b + 1) * args.batch), args.tokens)
        position = np.tile(np.arange(args.tokens), args.batch)
        out.append(
            (
                xr.Dataset(
                    {
                        "states": (("time", "particle", "feature"), states),
                        "final_norm_states": (("particle", "feature"), final),
                        "next_token_prob": (("particle", "k"), prob),
                        "next_token_top": (("particle", "k"), top),
                    },
                    coords={
                        "time": np.arange(args.layers),
                        "site": ("time", runs.strings(f"block{t}" for t in range(args.layers))),
                        "particle": np.arange(start, start + n),
                        "prompt_index": ("particle", prompt),
                        "position": ("particle", position),
                        "is_last": ("particle", position == args.tokens - 1),
                        "token_id": ("particle", position + 100),
                        "prompt": ("particle", runs.strings(f"prompt {p}" for p in prompt)),
                        "token": ("particle", runs.strings(f"t{p}" for p in position)),
                        "token_piece": ("particle", runs.strings(f"t{p}" for p in position)),
                        "category": ("particle", runs.strings("c" for _ in position)),
                        "label": ("particle", runs.strings("l" for _ in position)),
                    },
                ),
                (b + 1) * args.batch,
            )
        )
    return out


def syncfs(path: Path) -> None:
    """Sync the file system holding ``path`` (Linux ``syncfs``; ``sync`` elsewhere)."""
    import ctypes

    fd = os.open(path, os.O_RDONLY)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if not hasattr(libc, "syncfs") or libc.syncfs(fd) != 0:
            os.sync()
    finally:
        os.close(fd)


def fsync_tree(path: Path) -> None:
    """fsync every file under ``path``, then every directory."""
    for folder, _dirs, files in os.walk(path):
        for name in files:
            fd = os.open(os.path.join(folder, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def writer_run(out: Path, data: list[tuple[xr.Dataset, int]], args: argparse.Namespace) -> float:
    """Seconds to write ``data`` through RunWriter as ``tokenfield trace --out`` does."""
    options: dict[str, object] = {"compressor": "zstd"} if args.compress else {}
    if args.size_hint == "particles":  # as a trace passes it: its particle count
        options["size_hint"] = sum(int(piece.sizes["particle"]) for piece, _ in data)
    began = time.perf_counter()
    writer = runs.RunWriter(
        out,
        "trace",
        {"bench": "writer_throughput"},
        append_dim="particle",
        batch_size=args.batch,
        flush_seconds=5.0,
        background=True,
        **options,
    )
    for piece, done in data:
        writer.append(piece, done=done)
    writer.finish()
    if args.sync == "files":
        fsync_tree(out)
    else:
        syncfs(out)
    return time.perf_counter() - began


def start_write_back():
    """A function that starts the kernel's write-back of a file's dirty pages without
    waiting for it (``sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WRITE)``), or None
    where the C library has no ``sync_file_range`` (not Linux)."""
    import ctypes

    try:
        call = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (AttributeError, OSError):
        return None
    call.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]

    def start(fd: int) -> None:
        call(fd, 0, 0, 2)  # SYNC_FILE_RANGE_WRITE

    return start


def raw_run(
    out: Path, data: list[tuple[xr.Dataset, int]], sync: str = "fs", behind: Any = None
) -> float:
    """Seconds to write the same bytes into one plain file (one write per piece), fsynced;
    with ``behind`` (:func:`start_write_back`'s function) the write-back of what is
    written so far is started after every piece."""
    buffers = [
        [np.ascontiguousarray(v.values) for v in piece.variables.values() if v.dtype != object]
        for piece, _ in data
    ]
    began = time.perf_counter()
    with open(out, "wb") as f:
        for arrays in buffers:
            f.write(b"".join(memoryview(a).cast("B") for a in arrays))
            if behind is not None:
                f.flush()
                behind(f.fileno())
        f.flush()
        if sync == "files":
            os.fsync(f.fileno())
    if sync == "files":
        fsync_tree_dir(out.parent)
    else:
        syncfs(out)
    return time.perf_counter() - began


def fsync_tree_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def zstd_ratio(states: np.ndarray, chunk_rows: int = 56) -> float:
    """Raw bytes / Zstandard (level 0, as the store used) bytes of ``states``, chunk by chunk."""
    from numcodecs import Zstd

    codec = Zstd(level=0)
    raw = packed = 0
    for start in range(0, states.shape[1], chunk_rows):
        block = np.ascontiguousarray(states[:, start : start + chunk_rows])
        raw += block.nbytes
        packed += len(codec.encode(block))
    return raw / packed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mib", type=float, default=512, help="MiB of pieces per write")
    parser.add_argument("--batch", type=int, default=8, help="prompts per piece")
    parser.add_argument("--tokens", type=int, default=12, help="tokens per prompt")
    parser.add_argument("--layers", type=int, default=31, help="the time axis (blocks + 1)")
    parser.add_argument("--d", type=int, default=576, help="the feature size")
    parser.add_argument("--alternations", type=int, default=5)
    parser.add_argument("--compress", action="store_true", help="writer with compressor=zstd")
    parser.add_argument("--real", help="a run whose states also give a compression ratio")
    parser.add_argument(
        "--sync",
        choices=("fs", "files"),
        default="fs",
        help="fs: syncfs after each write (default); files: fsync every file",
    )
    parser.add_argument(
        "--size-hint",
        choices=("particles", "none"),
        default="particles",
        help="particles: pass the run's particle count as size_hint, as a trace does "
        "(default); none: no hint",
    )
    parser.add_argument(
        "--no-write-behind",
        action="store_true",
        help="skip the third case (the plain file with its write-back started after every piece)",
    )
    parser.add_argument("--dir", help="where to write (default: a temporary directory)")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args(argv)
    data = pieces(args)
    nbytes = sum(int(piece.nbytes) for piece, _ in data)
    states_bytes = sum(int(piece["states"].nbytes) for piece, _ in data)
    load_before = os.getloadavg()
    writer_s: list[float] = []
    raw_s: list[float] = []
    behind_s: list[float] = []
    behind = None if args.no_write_behind else start_write_back()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        for i in range(args.alternations):
            order = ["writer", "raw"] + (["behind"] if behind is not None else [])
            order = order if i % 2 == 0 else order[::-1]
            for which in order:
                target = Path(tmp) / f"{which}-{i}"
                if which == "writer":
                    writer_s.append(writer_run(target, data, args))
                    shutil.rmtree(target)
                elif which == "raw":
                    raw_s.append(raw_run(target, data, args.sync))
                    target.unlink()
                else:
                    behind_s.append(raw_run(target, data, args.sync, behind))
                    target.unlink()
                # the removal's own disk work (freeing a run's blocks) is not charged
                # to the next case. The plain file's two levels remain with it (on the
                # development machine 450-535 MiB/s right after the writer's case,
                # 680-815 right after the write-behind one; docs/scaling.md)
                syncfs(Path(tmp))
    load_after = os.getloadavg()
    ratios = [r / w for w, r in zip(writer_s, raw_s, strict=True)]
    results = {
        "benchmark": "writer_throughput",
        "machine": f"{platform.node()}: {os.cpu_count()} CPUs",
        "shape": {"batch": args.batch, "tokens": args.tokens, "layers": args.layers, "d": args.d},
        "pieces": len(data),
        "mib": nbytes / MIB,
        "states_mib": states_bytes / MIB,
        "compress": bool(args.compress),
        "sync": args.sync,
        "size_hint": args.size_hint,
        "alternations": args.alternations,
        "writer_s": writer_s,
        "raw_s": raw_s,
        "writer_mib_s": [nbytes / MIB / s for s in writer_s],
        "raw_mib_s": [nbytes / MIB / s for s in raw_s],
        "ratios": ratios,
        "ratio_median": statistics.median(ratios),
        "writer_mib_s_median": statistics.median(nbytes / MIB / s for s in writer_s),
        "raw_mib_s_median": statistics.median(nbytes / MIB / s for s in raw_s),
        "raw_write_behind_s": behind_s,
        "raw_write_behind_mib_s": [nbytes / MIB / s for s in behind_s],
        "ratios_write_behind": [r / w for w, r in zip(writer_s, behind_s, strict=False)],
        "load_before": list(load_before),
        "load_after": list(load_after),
        "zstd_ratio_synthetic": zstd_ratio(data[0][0]["states"].values),
    }
    if args.real:
        real = runs.open_run(args.real)["states"].values
        results["zstd_ratio_real"] = zstd_ratio(real)
        results["real_states_mib"] = real.nbytes / MIB
    print(
        f"{len(data)} pieces, {nbytes / MIB:.0f} MiB ({args.batch} prompts x {args.tokens} "
        f"tokens x {args.layers} layers x d={args.d}), {args.alternations} alternations, "
        f"sync {args.sync}, size hint {args.size_hint}, "
        f"load {load_before[0]:.1f} -> {load_after[0]:.1f}"
    )
    for w, r, q in zip(results["writer_mib_s"], results["raw_mib_s"], ratios, strict=True):
        print(f"  writer {w:7.1f} MiB/s   raw {r:7.1f} MiB/s   ratio {q:.2f}")
    print(
        f"median: writer {results['writer_mib_s_median']:.1f} MiB/s, raw "
        f"{results['raw_mib_s_median']:.1f} MiB/s, ratio {results['ratio_median']:.2f}x "
        "(target >= 0.8x)"
    )
    if behind_s:
        print(
            f"the plain file with write-back started after every piece: median "
            f"{statistics.median(results['raw_write_behind_mib_s']):.1f} MiB/s; writer / it "
            f"{statistics.median(results['ratios_write_behind']):.2f}x"
        )
    print(f"zstd level 0 on the synthetic states: {results['zstd_ratio_synthetic']:.3f}x")
    if args.real:
        print(f"zstd level 0 on {args.real}'s states: {results['zstd_ratio_real']:.3f}x")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

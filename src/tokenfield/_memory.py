"""Keeping a long streamed write's resident memory flat.

A streamed trace writes its store in a background thread while the tracing thread
makes the next pieces, and Zarr encodes strings and integers in a pool of threads of
its own. On Linux each thread that allocates gets a glibc heap ("arena") of its own,
and what one thread frees stays in its arena, out of reach of the others: measured on
a 20,000-prompt streamed trace of a tiny model (``benchmarks/trace_streaming.py
--rss-only --rss-20000``), the resident memory climbed about 15 times as far above
the 200-prompt trace's as the pieces waiting to be written explain. Two measures,
both taken by :class:`~tokenfield.runs.writer.RunWriter`:

- :func:`limit_zarr_threads`: Zarr's pool gets one thread (``threading.max_workers =
  1``) unless the user configured it (``zarr.config`` or the
  ``ZARR_THREADING__MAX_WORKERS`` environment variable). Without a setting, Zarr
  leaves its codecs to asyncio's default pool, ``min(32, cores + 4)`` threads, each
  with its own arena. Only the Zstandard-compressed arrays (strings, integers, and
  float states stored with ``TOKENFIELD_STORE_COMPRESSOR=zstd``) are encoded or
  decoded in that pool; the uncompressed float states never were.
- :func:`release_free_memory`: after each background write, glibc's
  ``malloc_trim(0)`` hands the free pages of every arena back to the system, as Dask
  workers do (``distributed``'s memory trimming). Elsewhere (macOS, musl) it does
  nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import sys
from typing import Any

ZARR_THREADS_ENV = "ZARR_THREADING__MAX_WORKERS"


@functools.cache
def _trim() -> Any:
    """glibc's ``malloc_trim``, or ``None`` where there is none."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


def release_free_memory() -> bool:
    """Give the free pages of every glibc heap back to the system.

    Returns:
        Whether anything could be asked (False without glibc).
    """
    trim = _trim()
    if trim is None:
        return False
    trim(0)
    return True


def limit_zarr_threads() -> None:
    """One thread in Zarr's codec pool, unless the user chose a number.

    Takes effect at Zarr's next call when its pool was not made yet (Zarr makes it
    on first use from ``threading.max_workers``); a pool Zarr already made is kept.
    """
    if os.environ.get(ZARR_THREADS_ENV):
        return
    import zarr

    if zarr.config.get("threading.max_workers", None) is None:
        zarr.config.set({"threading.max_workers": 1})

"""The compiled Lanczos on torch's own OpenMP threads.

With several torch threads the forward pass runs on an OpenMP team (torch's
``libgomp``). Between two of its parallel regions the team's other threads spin for
a while before they sleep (``GOMP_SPINCOUNT``, 300,000 turns by default: several
milliseconds). Chains handed to threads of our own (a thread pool) then share a core
with a spinning thread: in a trace with two torch threads they took about as long
as on one thread (0.42 against 0.44 s a trace, SmolLM2, 2 prompts of 256 tokens).

Here the chains run inside a parallel region of torch's own runtime instead
(``GOMP_parallel`` with a compiled C callback, :func:`numba.cfunc`), so the spinning
threads are the ones that take the work. Linux with torch's ``libgomp`` only;
:func:`chains_in_team` returns ``False`` elsewhere (and the caller falls back to a
thread pool).
"""

from __future__ import annotations

import ctypes
import functools
import threading
from typing import Any

import numpy as np

# the argument block handed to the callback (tokenfield.models._omp_body.SLOTS, which
# compiles on import): int64 slots, the three floats as their bits (11, 14 and 15), the
# two OpenMP functions' addresses (12 and 13)
_SLOTS = 16
_LOCK = threading.Lock()


def _torch_gomp() -> Any:
    """torch's ``libgomp`` (already loaded: ``dlopen`` by its soname returns it), or
    ``None`` where torch runs another OpenMP or none, or off Linux."""
    try:
        with open("/proc/self/maps") as maps:
            loaded = [line.split()[-1] for line in maps if "libgomp" in line]
    except OSError:
        return None
    if not any("torch" in path for path in loaded):
        return None
    try:
        lib = ctypes.CDLL("libgomp.so.1")
    except OSError:  # pragma: no cover - it is loaded
        return None
    if not all(hasattr(lib, name) for name in ("GOMP_parallel", "omp_get_thread_num")):
        return None  # pragma: no cover
    return lib


@functools.lru_cache(maxsize=1)
def _team() -> tuple[Any, int, int, int] | None:
    """``(GOMP_parallel, the callback's address, omp_get_thread_num's,
    omp_get_num_threads's)``, or ``None`` (no torch ``libgomp``)."""
    lib = _torch_gomp()
    if lib is None:
        return None
    parallel = lib.GOMP_parallel
    parallel.restype = None
    parallel.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint]
    addresses = [
        ctypes.cast(getattr(lib, name), ctypes.c_void_p).value
        for name in ("omp_get_thread_num", "omp_get_num_threads")
    ]
    from tokenfield.models._omp_body import SLOTS, body

    assert SLOTS == _SLOTS
    return parallel, body.address, *addresses


def chains_in_team(
    threads: int,
    a: np.ndarray,
    valid: np.ndarray,
    skip: int,
    start: np.ndarray,
    tol: float,
    temple: float,
    steps: int,
    first: int,
    breakdown: float,
    lam: np.ndarray,
    pi: np.ndarray,
    taken: np.ndarray,
) -> bool:
    """:func:`tokenfield.models._lanczos_cpu.chain_lambda2` of the chains of ``a``, split
    over ``threads`` threads of torch's OpenMP team (``lam``, ``pi``, ``taken`` filled as
    there). ``False`` (nothing done) where torch's ``libgomp`` is not found."""
    with _LOCK:
        team = _team()
    if team is None:
        return False
    parallel, body, thread_num, num_threads = team
    arrays = (a, valid, start, lam, pi, taken)
    kinds = (np.float32, np.float32, np.float32, np.float64, np.float32, np.int64)
    for array, kind in zip(arrays, kinds, strict=True):
        if array.dtype != kind or not array.flags.c_contiguous:
            raise ValueError("chains_in_team takes C-contiguous arrays of the kernel's dtypes")
    count, m = a.shape[0], a.shape[-1]
    width = 2 if skip == 2 else 1  # the compiled body writes these shapes in place
    shapes = {"lam": (count, width), "pi": (count, width, m), "taken": (count, width)}
    for name, array in (("lam", lam), ("pi", pi), ("taken", taken)):
        if array.shape != shapes[name]:
            raise ValueError(f"chains_in_team: {name} must be {shapes[name]} for skip {skip}")
    block = np.zeros(_SLOTS, dtype=np.int64)
    block[:6] = [array.ctypes.data for array in arrays]
    block[6:11] = [count, m, skip, steps, first]
    block[12:14] = [thread_num, num_threads]
    block.view(np.float64)[[11, 14, 15]] = [tol, breakdown, temple]
    # GOMP_parallel(fn, data, threads, flags): the calling thread is thread 0 of the team
    parallel(body, block.ctypes.data, threads, 0)
    return True

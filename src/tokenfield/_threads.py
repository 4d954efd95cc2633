"""How many threads torch computes with, chosen when the command starts.

torch's default is one thread per core. On a machine whose cores are busy with
other work that collapses: torch's OpenMP threads wait for each other at every
parallel region, and one thread that shares its core with another process holds
all the others up. Measured on the project's 2-core machine with other jobs
running (load 6 to 27): the README's 21-prompt ``trace`` took 133 to 275 s with
torch's 2 threads and 117 to 130 s with this rule's 1; its ``steer`` example 571
to 1160 s against 182 to 201 s (README, "Threads").

So the command line uses the cores that are idle: ``cores - load`` (the
one-minute load average, rounded), at least 1 and at most the cores this
process may run on. On an idle machine that is torch's own default.

An explicit choice always wins:

- ``TOKENFIELD_THREADS=N`` (a positive integer): N threads (``auto``: the rule above);
- otherwise ``OMP_NUM_THREADS`` in the environment: left to torch, unchanged.

The library (``import tokenfield``) never changes torch's setting; only the
``tokenfield`` command does, and only before torch is imported.
"""

from __future__ import annotations

import math
import os
from collections.abc import MutableMapping

from tokenfield.errors import UserError

__all__ = ["ENV", "configure_threads", "idle_cores", "usable_cores"]

#: The environment variable that overrides the choice.
ENV = "TOKENFIELD_THREADS"


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return max(1, os.cpu_count() or 1)


def idle_cores(cores: int, load: float) -> int:
    """``round(cores - load)`` clipped to ``1 .. cores``: the threads that find a
    core of their own when ``load`` runnable processes share ``cores`` cores."""
    if not math.isfinite(load) or load < 0:
        return cores
    return max(1, min(cores, math.floor(cores - load + 0.5)))


def _load() -> float:
    try:
        return float(os.getloadavg()[0])
    except (AttributeError, OSError):  # not available: assume idle
        return 0.0


def configure_threads(
    environ: MutableMapping[str, str] | None = None,
    *,
    cores: int | None = None,
    load: float | None = None,
) -> int | None:
    """Choose torch's thread count for this command and put it in ``environ``
    (``os.environ`` by default) as ``OMP_NUM_THREADS``, which torch, MKL and
    OpenBLAS read when they load.

    Returns:
        The number chosen, or ``None`` when the choice was left alone: an
        explicit ``OMP_NUM_THREADS`` and no ``TOKENFIELD_THREADS`` number.

    Raises:
        UserError: ``TOKENFIELD_THREADS`` is neither ``auto`` nor a positive integer.
    """
    environ = os.environ if environ is None else environ
    wanted = environ.get(ENV, "auto").strip().lower() or "auto"
    if wanted == "auto" and environ.get("OMP_NUM_THREADS", "").strip():
        return None
    if wanted == "auto":
        cores = usable_cores() if cores is None else cores
        threads = idle_cores(cores, _load() if load is None else load)
    else:
        try:
            threads = int(wanted)
        except ValueError:
            threads = 0
        if threads < 1:
            raise UserError(
                f"{ENV}='{environ[ENV]}' is not a number of threads",
                f"set {ENV} to a positive integer or to auto (or unset it)",
            )
    environ["OMP_NUM_THREADS"] = str(threads)
    return threads

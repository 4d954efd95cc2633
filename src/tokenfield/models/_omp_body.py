"""The callback of :mod:`tokenfield.models._omp`, compiled (numba ``cfunc``) and cached on
disk like the other kernels: each thread of torch's OpenMP team runs it on its share of the
chains. It reads everything from its argument block, the addresses of
``omp_get_thread_num`` and ``omp_get_num_threads`` too, so it holds nothing of the process
that compiled it. Imported only where it runs (numba compiles or loads it then)."""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import carray, cfunc, types
from numba.core.extending import intrinsic

# numba's disk cache keys this cfunc on this file alone, and it holds its own compiled
# copy of chain_lambda2: after a change to _lanczos_cpu.py, touch this file too (or the
# team runs the old kernel until the cache is cleared)
from tokenfield.models._lanczos_cpu import chain_lambda2

# the argument block: int64 slots; the three floats as their bits (11, 14 and 15), the
# two OpenMP functions' addresses (12 and 13)
SLOTS = 16


@intrinsic
def _float32s(typingctx, address):
    """An ``int64`` address as a ``float32`` pointer."""
    signature = types.CPointer(types.float32)(types.int64)
    return signature, _cast


@intrinsic
def _float64s(typingctx, address):
    """An ``int64`` address as a ``float64`` pointer."""
    signature = types.CPointer(types.float64)(types.int64)
    return signature, _cast


@intrinsic
def _int64s(typingctx, address):
    """An ``int64`` address as an ``int64`` pointer."""
    signature = types.CPointer(types.int64)(types.int64)
    return signature, _cast


def _cast(context, builder, sig, args):
    return builder.inttoptr(args[0], context.get_value_type(sig.return_type))


@intrinsic
def _call(typingctx, address):
    """A call of the C function ``int f(void)`` at an ``int64`` address."""

    def codegen(context, builder, sig, args):
        kind = ir.FunctionType(ir.IntType(32), [])
        return builder.call(builder.inttoptr(args[0], kind.as_pointer()), [])

    return types.int32(types.int64), codegen


@cfunc(types.void(types.voidptr), nogil=True, cache=True)
def body(data):  # pragma: no cover - compiled
    """This thread's share of the chains: :func:`chain_lambda2` of the chains ``lo ..
    hi - 1`` of ``count``, ``lo, hi`` from its number in the team."""
    slots = carray(data, (SLOTS,), dtype=np.int64)
    floats = carray(data, (SLOTS,), dtype=np.float64)
    count, m, skip, steps, first = slots[6], slots[7], slots[8], slots[9], slots[10]
    me, team = _call(slots[12]), _call(slots[13])
    lo, hi = (count * me) // team, (count * (me + 1)) // team
    if hi <= lo:
        return
    # this thread's chains as arrays of their own (C-contiguous from their first element,
    # as the Python callers' slices are: the same compiled code, so the same numbers bit
    # for bit; a slice of the whole would be typed apart and vectorised differently)
    width = 2 if skip == 2 else 1  # the chains of each matrix
    n = hi - lo
    a = carray(_float32s(slots[0] + 4 * lo * m * m), (n, m, m))
    valid = carray(_float32s(slots[1] + 4 * lo * m), (n, m))
    start = carray(_float32s(slots[2]), (m,))
    lam = carray(_float64s(slots[3] + 8 * lo * width), (n, width))
    pi = carray(_float32s(slots[4] + 4 * lo * width * m), (n, width, m))
    taken = carray(_int64s(slots[5] + 8 * lo * width), (n, width))
    chain_lambda2(
        a, valid, skip, start, floats[11], floats[15], steps, first, floats[14], lam, pi, taken
    )

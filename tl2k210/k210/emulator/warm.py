"""Compile the emulator's numba kernels ahead of time, into numba's on-disk cache.

A cold cache costs about 45 s of compilation (27 signatures then, 37 now; measured on a 2-core VM) spread over
the first frames a process runs, and again in every process that starts before the cache is
written (each pytest-xdist worker). `make venv` runs this once after installing:

    python -m tl2k210.k210.emulator.warm            # compile SIGNATURES (seconds when cached)
    python -m tl2k210.k210.emulator.warm --record   # print the signatures the cache now holds

SIGNATURES are the argument types the emulator's call sites pass (recorded with --record after a
full test run, plus bn_steps on a Fortran-ordered sum, which runs outside the suite compiled in
the development checkout). A signature missing here is compiled on first use as before; one no
longer used costs only its compile time here. Without numba this does nothing.
"""
from __future__ import annotations

import argparse
import sys
import time

from tl2k210.k210.emulator import fast

SIGNATURES = {
    '_step': [
        '(int64, int64[::1], uint8[::1])',
    ],
    'bn_lut': [
        '(int32[:, ::1], int64[::1], int64[::1], int64[::1], int64[::1], uint16[::1], uint8[::1], int64, int64, UniTuple(int64, 19), int32[::1], uint8[:, ::1])',
        '(int32[:, ::1], int64[::1], int64[::1], int64[::1], int64[::1], uint16[::1], uint8[::1], int64, int64, UniTuple(int64, 19), int32[::1], uint8[:, :])',
        '(float64[:, ::1], int64[::1], int64[::1], int64[::1], int64[::1], uint16[::1], uint8[::1], int64, int64, UniTuple(int64, 19), int32[::1], uint8[:, ::1])',
        '(int32[:, ::1], int64[::1], int64[::1], int64[::1], int64[::1], uint16[::1], uint8[::1], int64, int64, UniTuple(int64, 19), int64[::1], uint8[:, ::1])',
        '(int64[:, ::1], int64[::1], int64[::1], int64[::1], int64[::1], uint16[::1], uint8[::1], int64, int64, UniTuple(int64, 19), int64[::1], uint8[:, ::1])',
        '(float32[:, ::1], int64[::1], int64[::1], int64[::1], int64[::1], uint16[::1], uint8[::1], int64, int64, UniTuple(int64, 19), int32[::1], uint8[:, :])',
        '(float32[:, ::1], int64[::1], int64[::1], int64[::1], int64[::1], uint16[::1], uint8[::1], int64, int64, UniTuple(int64, 19), int32[::1], uint8[:, ::1])',
        '(float64[:, ::1], int64[::1], int64[::1], int64[::1], int64[::1], uint16[::1], uint8[::1], int64, int64, UniTuple(int64, 19), int32[::1], uint8[:, :])',
        '(int32[:, :], int64[::1], int64[::1], int64[::1], int64[::1], uint16[::1], uint8[::1], int64, int64, UniTuple(int64, 19), int32[::1], uint8[:, ::1])',
        '(int32[:, :], int64[::1], int64[::1], int64[::1], int64[::1], uint16[::1], uint8[::1], int64, int64, UniTuple(int64, 19), int32[::1], uint8[:, :])',
    ],
    'bn_steps': [
        '(int32[:, ::1], int64[::1], int64[::1], int64[::1], int64[::1], int64[::1], uint8[::1], uint8[:, ::1])',
        '(float64[:, ::1], int64[::1], int64[::1], int64[::1], int64[::1], int64[::1], uint8[::1], uint8[:, :])',
        '(float64[:, ::1], int64[::1], int64[::1], int64[::1], int64[::1], int64[::1], uint8[::1], uint8[:, ::1])',
        '(int32[:, ::1], int64[::1], int64[::1], int64[::1], int64[::1], int64[::1], uint8[::1], uint8[:, :])',
        '(float64[::1, :], int64[::1], int64[::1], int64[::1], int64[::1], int64[::1], uint8[::1], uint8[:, ::1])',
    ],
    'dw3_bn_lut': [
        '(uint8[:, :, ::1], int64, int64, float32[:, ::1], int64[::1], int64[::1], int64[::1], int64[::1], uint16[::1], uint8[::1], int64, int64, UniTuple(int64, 19), int32[::1], uint8[:, :, :])',
        '(uint8[:, :, ::1], int64, int64, float64[:, ::1], int64[::1], int64[::1], int64[::1], int64[::1], uint16[::1], uint8[::1], int64, int64, UniTuple(int64, 19), int32[::1], uint8[:, :, :])',
    ],
    'dw_bn_lut': [
        '(float32[::1], int64, int64, int64, float32[:, ::1], int64, int64, int64, boolean, int64[::1], int64[::1], int64[::1], int64[::1], uint16[::1], uint8[::1], int64, int64, UniTuple(int64, 19), int32[::1], uint8[:, :, ::1])',
        '(float32[::1], int64, int64, int64, float32[:, ::1], int64, int64, int64, boolean, int64[::1], int64[::1], int64[::1], int64[::1], uint16[::1], uint8[::1], int64, int64, UniTuple(int64, 19), int32[::1], uint8[:, :, :])',
        '(uint8[::1], int64, int64, int64, float32[:, ::1], int64, int64, int64, boolean, int64[::1], int64[::1], int64[::1], int64[::1], uint16[::1], uint8[::1], int64, int64, UniTuple(int64, 19), int32[::1], uint8[:, :, ::1])',
        '(uint8[::1], int64, int64, int64, float32[:, ::1], int64, int64, int64, boolean, int64[::1], int64[::1], int64[::1], int64[::1], uint16[::1], uint8[::1], int64, int64, UniTuple(int64, 19), int32[::1], uint8[:, :, :])',
        '(uint8[::1], int64, int64, int64, float64[:, ::1], int64, int64, int64, boolean, int64[::1], int64[::1], int64[::1], int64[::1], uint16[::1], uint8[::1], int64, int64, UniTuple(int64, 19), int32[::1], uint8[:, :, :])',
    ],
    'pad1': [
        '(uint8[:, :, ::1], int64, uint8[:, :, ::1])',
        '(uint8[:, :, ::1], int64, float32[:, :, ::1])',
        '(uint8[:, :, :], int64, uint8[:, :, ::1])',
    ],
    'fold_box': [
        '(int32[:, ::1], int32, int32[::1])',
    ],
    'im2col_s8': [
        '(uint8[:, :, :], int64, int64, int64, int64, uint8[:, ::1])',
        '(uint8[:, :, ::1], int64, int64, int64, int64, uint8[:, ::1])',
    ],
    'max2_bn_lut': [
        '(int64[:, :, ::1], uint8[::1], int64[::1], int64[::1], int64[::1], int64[::1], uint16[::1], uint8[::1], int64, int64, UniTuple(int64, 19), int32[::1], uint8[:, :, ::1])',
        '(int64[:, :, ::1], uint8[::1], int64[::1], int64[::1], int64[::1], int64[::1], uint16[::1], uint8[::1], int64, int64, UniTuple(int64, 19), int32[::1], uint8[:, :, :])',
    ],
    'max_bn_lut': [
        '(float64[:, :, ::1], int64, int64, uint8[::1], int64[::1], int64[::1], int64[::1], int64[::1], uint16[::1], uint8[::1], int64, int64, UniTuple(int64, 19), float64[::1], float64[::1], int32[::1], uint8[:, :, :])',
        '(float64[:, :, ::1], int64, int64, uint8[::1], int64[::1], int64[::1], int64[::1], int64[::1], uint16[::1], uint8[::1], int64, int64, UniTuple(int64, 19), float64[::1], float64[::1], int32[::1], uint8[:, :, ::1])',
        '(int32[:, :, ::1], int64, int64, uint8[::1], int64[::1], int64[::1], int64[::1], int64[::1], uint16[::1], uint8[::1], int64, int64, UniTuple(int64, 19), int32[::1], int32[::1], int32[::1], uint8[:, :, ::1])',
        '(float32[:, :, ::1], int64, int64, uint8[::1], int64[::1], int64[::1], int64[::1], int64[::1], uint16[::1], uint8[::1], int64, int64, UniTuple(int64, 19), float32[::1], float32[::1], int32[::1], uint8[:, :, :])',
        '(float32[:, :, ::1], int64, int64, uint8[::1], int64[::1], int64[::1], int64[::1], int64[::1], uint16[::1], uint8[::1], int64, int64, UniTuple(int64, 19), float32[::1], float32[::1], int32[::1], uint8[:, :, ::1])',
        '(int32[:, :, ::1], int64, int64, uint8[::1], int64[::1], int64[::1], int64[::1], int64[::1], uint16[::1], uint8[::1], int64, int64, UniTuple(int64, 19), int32[::1], int32[::1], int32[::1], uint8[:, :, :])',
    ],
}


def dispatchers() -> dict:
    from numba.core.registry import CPUDispatcher
    return {n: f for n, f in vars(fast).items() if isinstance(f, CPUDispatcher)}


def warm() -> tuple[int, list]:
    """Compile (or load from the cache) every signature: (how many are ready, [the ones that no
    longer match a kernel, with why]). A stale entry never stops an install: that kernel then
    compiles on first use, as without this."""
    if not fast.available():
        return 0, []
    from numba.core.sigutils import normalize_signature
    funcs, ready, stale = dispatchers(), 0, []
    for name, sigs in SIGNATURES.items():
        for s in sigs:
            try:
                funcs[name].compile(normalize_signature(s)[0])   # types, not the string: the cache's key
                ready += 1
            except Exception as e:   # noqa: BLE001  (a renamed kernel, changed argument types)
                stale.append(f"{name}{s}: {type(e).__name__}")
    return ready, stale


def recorded() -> dict:
    """The signatures numba's cache holds for each kernel, as numba type strings."""
    return {n: [_signature(k[0]) for k in f._cache._cache_file._load_index()]
            for n, f in sorted(dispatchers().items())}


def _signature(types) -> str:
    return "(" + ", ".join(map(_type, types)) + ")"


def _type(t) -> str:
    """A numba type as the string `compile` parses: int32[:, ::1] for a C-contiguous 2-d array."""
    from numba.core import types
    if isinstance(t, types.Array):
        dims = [":"] * t.ndim
        if t.layout == "C":
            dims[-1] = "::1"
        elif t.layout == "F":
            dims[0] = "::1"
        return f"{t.dtype}[{', '.join(dims)}]"
    if isinstance(t, types.UniTuple):
        return f"UniTuple({_type(t.dtype)}, {t.count})"
    return "boolean" if t == types.boolean else str(t)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--record", action="store_true", help="print the signatures numba's cache holds")
    args = ap.parse_args(argv)
    if not fast.available():      # --record too: no numba, no cache to read
        print("numba is not available: the emulator runs its numpy path")
        return 0
    if args.record:
        for name, sigs in recorded().items():
            for s in sigs:
                print(name, s)
        return 0
    t = time.monotonic()
    n, stale = warm()
    print(f"numba kernels: {n} signatures ready in {time.monotonic() - t:.1f} s")
    for s in stale:
        print(f"  not compiled ahead (re-record SIGNATURES with --record): {s}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

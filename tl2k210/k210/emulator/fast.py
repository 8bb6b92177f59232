"""Optional fused kernels (numba) for the KPU layer: the batch-norm stage and the activation
lookup in one pass (and the depthwise taps too), parallel over output channels.

Same integer arithmetic as the numpy path in kpu.py (int64, arithmetic shifts, the same step
table), so results are identical bit for bit; `tests/test_kpu_stages.py` compares both paths.
Without numba (or with TL2K210_NO_NUMBA=1) the numpy path runs.
"""
from __future__ import annotations

import os

import numpy as np

try:  # pragma: no cover - depends on the environment
    if os.environ.get("TL2K210_NO_NUMBA"):
        raise ImportError
    from numba import config, njit, prange, set_num_threads
except ImportError:  # pragma: no cover
    njit = None


def available() -> bool:
    return njit is not None


if njit is not None:
    @njit(parallel=True, cache=True)
    def bn_lut(acc, const, mul, shift, add_lo, lut, out):  # pragma: no cover (compiled)
        """out[o, p] = lut[clip(((acc[o, p] + const[o]) * mul[o] >> shift[o]) + add_lo[o])];
        acc holds exact integers (float32/float64 BLAS output)."""
        n = lut.size
        for o in prange(acc.shape[0]):
            c, m, s, a = const[o], mul[o], shift[o], add_lo[o]
            for p in range(acc.shape[1]):
                v = (((np.int64(acc[o, p]) + c) * m) >> s) + a
                if v < 0:
                    v = 0
                elif v >= n:
                    v = n - 1
                out[o, p] = lut[v]

    @njit(cache=True)
    def _step(v, starts, values):  # pragma: no cover (compiled)
        """values[j] for the last j with starts[j] <= v (starts[0] <= every reachable v)."""
        lo, hi = 0, starts.size - 1
        while lo < hi:
            mid = (lo + hi + 1) >> 1
            if starts[mid] <= v:
                lo = mid
            else:
                hi = mid - 1
        return values[lo]

    @njit(parallel=True, cache=True)
    def bn_steps(acc, const, mul, shift, add, starts, values, out):  # pragma: no cover (compiled)
        """Like bn_lut for an activation kept as breakpoints (its V span is too wide to tabulate)."""
        for o in prange(acc.shape[0]):
            c, m, s, a = const[o], mul[o], shift[o], add[o]
            for p in range(acc.shape[1]):
                out[o, p] = _step((((np.int64(acc[o, p]) + c) * m) >> s) + a, starts, values)

    @njit(parallel=True, cache=True)
    def dw_bn_lut(xp, w, k, arg_x, shr_x, x_exact, const, mul, shift, add_lo, lut, out):  # pragma: no cover
        """Depthwise k×k taps from the padded uint8 map (weights already hold the folded Σx
        term when x_exact), then the same BN + lookup as bn_lut."""
        n = lut.size
        h, wd = out.shape[1], out.shape[2]
        for c in prange(out.shape[0]):
            cc, m, s, a = const[c], mul[c], shift[c], add_lo[c]
            for y in range(h):
                for x in range(wd):
                    acc = np.int64(0)
                    box = np.int64(0)
                    for ky in range(k):
                        for kx in range(k):
                            px = np.int64(xp[c, y + ky, x + kx])
                            acc += px * w[c, ky * k + kx]
                            box += px
                    if not x_exact:
                        acc += (arg_x * box) >> shr_x
                    v = (((acc + cc) * m) >> s) + a
                    if v < 0:
                        v = 0
                    elif v >= n:
                        v = n - 1
                    out[c, y, x] = lut[v]


def threads(n: int):
    if njit is not None:
        set_num_threads(max(1, min(n, config.NUMBA_NUM_THREADS)))

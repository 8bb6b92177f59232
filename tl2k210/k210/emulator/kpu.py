"""Bit-exact KPU layer: convolution → batch-norm → 16-segment activation → uint8 → pooling.

Semantics: docs/kpu.md#pipeline and #sum-rule. Each stage is a small
function over whole numpy arrays (testable on its own); ``PreparedConv`` precomputes what does
not depend on the input and runs a layer with a handful of whole-array passes.

Exactness: a normal conv's sum comes from onnxruntime's integer MatMulInteger (uint8 x int8, where
this machine's product is exact) or ConvInteger (uint8 x uint8) where it is installed
and its int32 bound holds (``intconv.py``), else from float32 BLAS on K-chunks short enough that
every partial sum is an integer < 2^24 (exact in float32), or float64 (integers < 2^53) for 16-bit
weights; everything after it is int64. With numba installed (`fast.py`), the batch-norm stage,
the activation lookup and the depthwise taps run in fused kernels (same bytes); otherwise rows
are split into cache-sized bands. Big layers run their row bands (normal convs summed by
onnxruntime: output-channel parts instead) on threads where a measurement of their first calls
shows the threads pay (``PreparedConv._parallel``).

Named rules (defaults follow the spec):
  sum_rule  "silicon"   Σx/Σw terms shifted per input channel, then summed (docs/kpu.md#sum-rule)
            "simulator" the vendor simulator: shift of the whole sum (docs/kpu.md#convolution)
  act_rule  "nncase02"  segment = highest i with V > x_start; banker carry-shift with sign quirk
            "nncase01"  segment = highest i with V >= x_start; round-half-up carry-shift
"""
from __future__ import annotations

import time
from dataclasses import replace

import numpy as np
from concurrent.futures import ThreadPoolExecutor
from numpy.lib.stride_tricks import sliding_window_view

from tl2k210.errors import EmulatorError
from tl2k210.k210 import hardware as hw
from tl2k210.k210.emulator import fast, intconv

_POOLS: dict = {}


def _executor(n: int) -> ThreadPoolExecutor:
    if n not in _POOLS:
        _POOLS[n] = ThreadPoolExecutor(n, thread_name_prefix="kpu")
    return _POOLS[n]


SUM_RULES = ("silicon", "simulator")
ACT_RULES = ("nncase02", "nncase01")
FLAT_MAX = 1 << 20     # activation lookup: one flat table up to this span (1 MiB of uint8) ...
PAGES_MAX = 1 << 16    # ... else paged: at most this many u16 page entries ...
FINE_MAX = 1 << 22     # ... and this many table bytes (else binary search)
BAND_ELEMS = 1 << 17   # output values per row band (int64 intermediates of ~1 MiB stay in cache)
FAST_BAND_ELEMS = 1 << 18  # ... on the numba path (float32 sums; facedetect's first layer in 5
                           # bands runs about 1.25x faster than in one)
PART_MIN = 8           # output channels per part at least (threads split a normal conv's)
TRIALS = 3             # calls each way before a layer decides whether its band threads pay
PAY_OFF = 1.15         # ... they must be this much faster than one thread (they cost 2 cores)


# ---------------------------------------------------------------------------------------------
# Rounding shifts
def carry_shift_nncase02(t: np.ndarray, s) -> np.ndarray:
    """nncase v0.2 ``carry_shift<int64, Banker=true>``, literally (including its sign quirk)."""
    t = np.asarray(t, np.int64)
    s = np.asarray(s, np.int64)
    q = t >> s
    f = t & ((np.int64(1) << s) - 1)
    h = np.where(s > 0, np.int64(1) << np.maximum(s - 1, 0), 0)
    sign = np.where(t < 0, -1, 1)
    up = (f > h) | ((f == h) & (q & 1 == 1))
    return np.where(s == 0, t, np.where(up, q + sign, q))


def carry_shift_nncase01(t: np.ndarray, s) -> np.ndarray:
    """nncase v0.1 ``CarryShift`` = SDK ``kpu_carry_shift``, literally."""
    t = np.asarray(t, np.int64)
    s = np.asarray(s, np.int64)
    v = t >> np.maximum(s - 1, 0)
    odd = (v & 1) == 1
    r = np.where(odd, np.where(v >= 0, (v >> 1) + 1, (v >> 1) - 1), v >> 1)
    return np.where(s == 0, t, r)


# ---------------------------------------------------------------------------------------------
# Stages
def batchnorm(acc: np.ndarray, bn: dict) -> np.ndarray:
    """V = ((ACC * norm_mul) >> norm_shift) + norm_add, per output channel (axis 0)."""
    shape = (-1,) + (1,) * (acc.ndim - 1)
    m = np.asarray(bn["norm_mul"], np.int64).reshape(shape)
    s = np.asarray(bn["norm_shift"], np.int64).reshape(shape)
    a = np.asarray(bn["norm_add"], np.int64).reshape(shape)
    return ((acc.astype(np.int64) * m) >> s) + a


def activation(v: np.ndarray, act: dict, rule: str = "nncase02") -> np.ndarray:
    """16-segment piecewise-linear activation, clamped to uint8."""
    v = np.asarray(v, np.int64)
    xs = np.asarray(act["x_start"], np.int64)
    if np.all(np.diff(xs) >= 0):
        seg = np.searchsorted(xs, v, side="left" if rule == "nncase02" else "right") - 1
    else:  # unsorted table: highest index whose start is passed
        seg = np.full(v.shape, -1, np.int64)
        for i in range(hw.ACT_SEGMENTS):
            seg[(v > xs[i]) if rule == "nncase02" else (v >= xs[i])] = i
    seg = np.maximum(seg, 0)  # V below every start: segment 0 (vendor tables start at -2^35)
    t = (v - xs[seg]) * np.asarray(act["y_mul"], np.int64)[seg]
    shift = np.asarray(act["shift_number"], np.int64)[seg]
    r = carry_shift_nncase02(t, shift) if rule == "nncase02" else carry_shift_nncase01(t, shift)
    return np.clip(r + np.asarray(act["bias"], np.int64)[seg], 0, 255).astype(np.uint8)


def pool(y: np.ndarray, code: int) -> np.ndarray:
    """Pooling on the uint8 (C, H, W) activation output (docs/kpu.md#pooling)."""
    p = hw.POOL[code]
    c, h, w = y.shape
    if p.kind == "bypass":
        return y
    if p.stride == 1:  # codes 8/9: 2x2 window at every position
        if p.kind == "mean":
            e = np.pad(y, ((0, 0), (0, 1), (0, 1)), mode="edge").astype(np.uint16)
            return ((e[:, :-1, :-1] + e[:, 1:, :-1] + e[:, :-1, 1:] + e[:, 1:, 1:]) >> 2).astype(np.uint8)
        z = np.pad(y, ((0, 0), (0, 1), (0, 1)))
        return np.maximum(np.maximum(z[:, :-1, :-1], z[:, 1:, :-1]),
                          np.maximum(z[:, :-1, 1:], z[:, 1:, 1:]))
    k = p.size
    oh, ow = h // k, w // k
    if p.kind == "pick":
        dy, dx = p.pick
        return np.ascontiguousarray(y[:, dy:dy + k * oh:k, dx:dx + k * ow:k])
    if p.kind == "max" and k == 2:
        # rows pairwise (contiguous), then each pair of adjacent bytes read as one uint16: the
        # larger of its two bytes (either byte order); 3x the strided taps below
        r = np.maximum(y[:, 0:2 * oh:2, :2 * ow], y[:, 1:2 * oh:2, :2 * ow]).view(np.uint16)
        return np.maximum(r & 0xFF, r >> 8).astype(np.uint8)
    # k*k strided slices combined elementwise (much faster than a reduce over a 5-D view)
    taps = [y[:, dy:k * oh:k, dx:k * ow:k] for dy in range(k) for dx in range(k)]
    if p.kind == "max":
        out = taps[0].copy()
        for t in taps[1:]:
            np.maximum(out, t, out=out)
        return out
    acc = taps[0].astype(np.uint16)
    for t in taps[1:]:
        acc += t
    return (acc // (k * k)).astype(np.uint8)


def conv_acc(x: np.ndarray, weights: np.ndarray, args: dict, sum_rule: str = "silicon") -> np.ndarray:
    """Reference (unoptimised but vectorised) ACC (docs/kpu.md#convolution) for input x (C_in, H, W) uint8.

    weights: (C_out, C_in, k, k) for normal, (C, k, k) for depthwise. Returns int64 (C_out, H, W).
    """
    k = hw.KERNEL_SIZES[args["kernel_type"]]
    p = k // 2
    xp = np.pad(x, ((0, 0), (p, p), (p, p)), constant_values=args["pad_value"]).astype(np.int64)
    win = sliding_window_view(xp, (k, k), axis=(1, 2))  # (C, H, W, k, k)
    w = np.asarray(weights, np.int64)
    if args["depth_wise_layer"]:
        s = np.einsum("chwyx,cyx->chw", win, w)
        sx_i = win.sum(axis=(3, 4))[:, None]             # (C, 1, H, W): one input channel each
        sw_i = w.sum(axis=(1, 2))[:, None, None, None]   # (C, 1, 1, 1)
        n_ic = 1
        sx_i = sx_i[:, 0]
        sw_i = sw_i[:, 0]
        tx = (args["arg_x"] * sx_i) >> args["shr_x"]
        tw = (args["arg_w"] * sw_i) >> args["shr_w"]
        return s + tx + tw + args["arg_add"] * n_ic
    s = np.einsum("chwyx,ocyx->ohw", win, w)
    sx_i = win.sum(axis=(3, 4))        # (C_in, H, W)
    sw_i = w.sum(axis=(2, 3))          # (C_out, C_in)
    n_ic = x.shape[0]
    if sum_rule == "silicon":
        tx = ((args["arg_x"] * sx_i) >> args["shr_x"]).sum(axis=0)[None]
        tw = ((args["arg_w"] * sw_i) >> args["shr_w"]).sum(axis=1)[:, None, None]
    else:
        tx = ((args["arg_x"] * sx_i.sum(axis=0)) >> args["shr_x"])[None]
        tw = ((args["arg_w"] * sw_i.sum(axis=1)) >> args["shr_w"])[:, None, None]
    return s + tx + tw + args["arg_add"] * n_ic


def reference_layer(x, weights, args, bn, act, sum_rule="silicon", act_rule="nncase02"):
    """Whole layer, written stage by stage for clarity (tests compare PreparedConv to this)."""
    acc = conv_acc(x, weights, args, sum_rule)
    y = activation(batchnorm(acc, bn), act, act_rule)
    return pool(y, args["pool_type"])


# ---------------------------------------------------------------------------------------------
_TABLES: dict = {}   # one StepTable per distinct step function: layers with the same activation
                     # share it, so it stays in cache from one layer to the next


class StepTable:
    """The activation as an exact step function of V on [vmin, vmax], compiled into a lookup of
    u = V - lo: ``values[j]`` holds on [starts[j], starts[j+1]); outside the span where it
    changes it is constant (u is clipped). Spans up to FLAT_MAX are one flat table (``q == 0``,
    ``fine[u]``); wider ones are paged, exactly, in buckets of 2^q values: ``pages[u >> q]``
    is the byte itself (< 256) for a bucket holding one constant value (one load, for all but
    the few buckets with a step inside), else 256 + the bucket's page in ``fine``:
    ``fine[((pages[u >> q] - 256) << q) + (u & (2^q - 1))]``, so the table stays small however
    wide the span. ``fine is None``: binary search instead."""

    def __init__(self, starts: np.ndarray, values: np.ndarray):
        self.starts, self.values = starts, values
        lo = int(starts[1]) - 1 if len(starts) > 1 else int(starts[0])
        self.lo, self.span = lo, int(starts[-1]) - lo + 1
        self.q, self.pages, self.fine = 0, np.zeros(1, np.uint16), None
        if self.span <= FLAT_MAX:
            self.fine = self._at(np.arange(self.span, dtype=np.int64))
            return
        q = int(np.ceil(np.log2(self.span / PAGES_MAX)))
        nb = -(-self.span // (1 << q))
        pages = self._at(np.arange(nb, dtype=np.int64) << q).astype(np.uint16)  # bucket starts
        u_st = starts[1:] - lo
        mixed = np.unique(u_st[u_st % (1 << q) != 0] >> q)          # buckets with a step inside
        if len(mixed) << q > FINE_MAX or 256 + len(mixed) > 1 << 16:
            return
        pages[mixed] = 256 + np.arange(len(mixed), dtype=np.uint16)
        u = (mixed.astype(np.int64)[:, None] << q) + np.arange(1 << q)
        fine = self._at(u.reshape(-1))
        self.q, self.pages, self.fine = q, pages, fine if fine.size else np.zeros(1, np.uint8)

    @property
    def monotone(self) -> bool:
        """Whether the table is non-decreasing in V."""
        return bool(np.all(np.diff(self.values.astype(np.int16)) >= 0))

    def _at(self, u: np.ndarray) -> np.ndarray:
        """The values at the ascending offsets u (≥ 0), as runs: where each start falls among
        u, not a search per entry (a flat table holds up to FLAT_MAX of them)."""
        at = np.searchsorted(u + self.lo, self.starts, side="left")
        return np.repeat(self.values, np.diff(np.append(at, len(u))))

    @property
    def top(self) -> int:
        return self.span - 1

    def __call__(self, v: np.ndarray) -> np.ndarray:
        if self.fine is None:
            return self.values[np.searchsorted(self.starts, v, side="right") - 1]
        return self.shifted(v - self.lo)

    def shifted(self, u: np.ndarray) -> np.ndarray:
        """Lookup of u = V − lo (the caller folded −lo into its add); clipped to the span."""
        u = np.clip(u, 0, self.span - 1)
        if self.q == 0:
            return self.fine.take(u)
        page = self.pages.take(u >> self.q).astype(np.int64)
        out = page.astype(np.uint8)               # the constant buckets' bytes
        mixed = page >= 256
        low = u[mixed] & ((1 << self.q) - 1)
        out[mixed] = self.fine.take(((page[mixed] - 256) << self.q) + low)
        return out


def _level_brackets(f, levels, a, b, x0, ym, sh, bias):
    """[lo, hi] per level, each holding the first V in [a, b] where the rising piece f reaches
    it: V ≈ x0 + (level − bias − ½)·2^sh / ym (the shift rounds), bracketed by ±2 and checked
    (f(hi) ≥ level, f(lo − 1) < level); the whole piece where the estimate misses. The
    bisection then takes a step or two instead of ~40 per level."""
    est = x0 + np.ceil((levels - bias - 0.5) * (2.0 ** sh) / ym)
    est = np.clip(np.nan_to_num(est, nan=a), a, b).astype(np.int64)
    lo, hi = np.maximum(est - 2, a), np.minimum(est + 2, b)
    miss = (f(hi) < levels) | (lo > a) & (f(np.maximum(lo - 1, a)) >= levels)
    return np.where(miss, a, lo), np.where(miss, b, hi)


def compile_activation(act: dict, rule: str, vmin: int, vmax: int) -> StepTable | None:
    """Exact step function of ``activation`` for V in [vmin, vmax], or None when a reachable
    segment is non-monotone over a wide range (negative y_mul: then the direct path is used)."""
    xs = np.asarray(act["x_start"], np.int64)
    if not np.all(np.diff(xs) >= 0) or vmin > vmax:
        return None
    # the V interval where each distinct start's segment is selected
    bounds = sorted(set(int(b) + (1 if rule == "nncase02" else 0) for b in xs))
    edges = [vmin] + [b for b in bounds if vmin < b <= vmax] + [vmax + 1]
    starts, values = [], []
    shift_fn = carry_shift_nncase02 if rule == "nncase02" else carry_shift_nncase01
    for a, b in zip(edges[:-1], edges[1:]):     # piece [a, b-1], one segment throughout
        seg = max(0, int(np.searchsorted(xs, a, side="left" if rule == "nncase02" else "right") - 1))
        x0, ym = int(xs[seg]), int(act["y_mul"][seg])
        sh, bias = int(act["shift_number"][seg]), int(act["bias"][seg])

        def f(v):  # the activation inside this piece
            return np.clip(shift_fn((np.asarray(v, np.int64) - x0) * ym, sh) + bias, 0, 255)

        if ym < 0 or a < x0:  # negative products: the vendor rounding is not monotone there
            if b - a > 1 << 16:
                return None
            v = np.arange(a, b, dtype=np.int64)
            out = f(v)
            change = np.concatenate([[True], out[1:] != out[:-1]])
            starts.extend(v[change].tolist())
            values.extend(out[change].tolist())
            continue
        y0, y1 = int(f(a)), int(f(b - 1))
        starts.append(a)
        values.append(y0)
        if y1 > y0:  # monotone non-decreasing: bisect the first V reaching each level
            levels = np.arange(y0 + 1, y1 + 1, dtype=np.int64)
            lo, hi = _level_brackets(f, levels, a, b - 1, x0, ym, sh, bias)
            while np.any(lo < hi):
                mid = (lo + hi) >> 1
                ok = f(mid) >= levels
                hi = np.where(ok, mid, hi)
                lo = np.where(ok, lo, mid + 1)
            first = np.unique(lo)
            starts.extend(first.tolist())
            values.extend(f(first).tolist())
    starts = np.asarray(starts, np.int64)
    values = np.asarray(values, np.uint8)
    keep = np.concatenate([[True], values[1:] != values[:-1]])  # merge equal neighbours
    starts, values = starts[keep], values[keep]
    key = (starts.tobytes(), values.tobytes())
    if key not in _TABLES:
        if len(_TABLES) >= 1024:
            _TABLES.clear()
        _TABLES[key] = StepTable(starts, values)
    return _TABLES[key]


MAX_PIECES = 4     # act_pieces: at most this many linear pieces (else the step table)
NO_PIECES = (0,) * 19
I64 = 1 << 64


def act_pieces(act: dict, rule: str, table: StepTable | None) -> tuple:
    """The activation on the table's span [lo, lo + top] (outside it the table is constant, so the
    fused kernels clip u = V − lo to [0, top]) as at most MAX_PIECES linear pieces in u, for the
    fused kernels' arithmetic (fast._look_rows): the very int64 formula of ``activation`` with
    its carry shift, evaluated per value in a few vector instructions, where the table costs a
    gather per value. A tuple (n, start[1..3], y_mul[0..3], offset[0..3], bias[0..3], shift,
    mask, half) of piece n's u ≥ start, t = u·y_mul − offset ≡ (V − x_start)·y_mul (mod 2^64,
    as int64 wraps), (carry_shift(t, shift) + bias) clipped to uint8; pieces of slope 0 give
    their bias whatever the shift. NO_PIECES (n = 0) where it does not apply: the nncase01
    rule, more pieces, or pieces of different shifts."""
    if rule != "nncase02" or table is None:
        return NO_PIECES
    lo, hi = table.lo, table.lo + table.top
    xs = np.asarray(act["x_start"], np.int64)
    edges = [lo] + sorted({int(b) + 1 for b in xs if lo < int(b) + 1 <= hi})  # segment changes
    if len(edges) > MAX_PIECES:
        return NO_PIECES
    segs = [max(0, int(np.searchsorted(xs, e, side="left")) - 1) for e in edges]
    ym = [int(act["y_mul"][i]) for i in segs]
    shifts = {int(act["shift_number"][i]) for i, m in zip(segs, ym) if m}
    if len(shifts) > 1:
        return NO_PIECES
    sh = shifts.pop() if shifts else 0
    wrap = lambda v: (v + (I64 >> 1)) % I64 - (I64 >> 1)   # noqa: E731  (int64, as numpy wraps)
    pad = MAX_PIECES - len(edges)
    starts = [e - lo for e in edges[1:]] + [(I64 >> 1) - 1] * pad
    offs = [wrap((int(xs[i]) - lo) * m) for i, m in zip(segs, ym)] + [0] * pad
    bias = [int(act["bias"][i]) for i in segs] + [0] * pad
    return (len(edges), *starts, *(ym + [0] * pad), *offs, *bias, sh, (1 << sh) - 1,
            1 << (sh - 1) if sh else 1)


class PreparedConv:
    """One KPU layer with everything input-independent precomputed (weights as BLAS matrices,
    Σw terms, per-channel constants, the activation as a lookup table when its reachable V range
    is small). ``__call__(x)`` maps (C_in, H, W) uint8 → pooled (C_out, Ho, Wo) uint8."""

    def __init__(self, conv, sum_rule: str = "silicon", act_rule: str = "nncase02", where: str = "layer",
                 threads: int = 1, use_fast: bool = True, int_sums: bool = True):
        if sum_rule not in SUM_RULES or act_rule not in ACT_RULES:
            raise ValueError(f"sum_rule must be one of {SUM_RULES}, act_rule one of {ACT_RULES}")
        a = conv.args
        self.where, self.args, self.threads = where, a, threads
        self.sum_rule, self.act_rule = sum_rule, act_rule
        self.in_shape, self.out_shape = conv.in_shape, conv.out_shape
        self.k, self.depthwise = conv.k, conv.depthwise
        ci, h, w = self.in_shape
        co = self.out_shape[0]
        kk = self.k * self.k
        oh, ow = hw.POOL[a["pool_type"]].out_size(h, w)
        if (oh, ow) != self.out_shape[1:]:
            raise EmulatorError(f"{where}: pool {hw.POOL[a['pool_type']].name} of a {w}x{h} map "
                                f"gives {ow}x{oh}, but the layer says output {self.out_shape[2]}x"
                                f"{self.out_shape[1]}")
        wt = np.asarray(conv.weights, np.int64)
        self.wide = conv.weights.dtype.itemsize == 2
        # Σx term: when arg_x is a whole multiple of 2^shr_x (every nncase file) both rules equal
        # (arg_x >> shr_x)·ΣX, which folds into the weights: Σ(W + k)·X. Otherwise extra matrix
        # rows produce the per-channel (silicon) or total (simulator) window sums.
        self.x_exact = a["arg_x"] % (1 << a["shr_x"]) == 0
        fold = a["arg_x"] >> a["shr_x"] if self.x_exact else 0
        if self.depthwise:
            wt = wt.reshape(ci, self.k, self.k)
            sw_i = wt.sum(axis=(1, 2))[:, None]          # (C, 1)
            n_ic = 1
            wmat = (wt + fold).reshape(ci, kk)
            extra = 0
        else:
            wt = wt.reshape(co, ci, self.k, self.k)
            sw_i = wt.sum(axis=(2, 3))                   # (C_out, C_in)
            n_ic = ci
            wmat = (wt + fold).reshape(co, ci * kk)
            if not self.x_exact:
                boxes = np.kron(np.eye(ci, dtype=np.int64), np.ones((1, kk), np.int64))
                if sum_rule == "simulator":
                    boxes = boxes.sum(axis=0, keepdims=True)
                wmat = np.concatenate([wmat, boxes])
            extra = wmat.shape[0] - co
        self.extra = extra
        # exact BLAS: float32 while every partial sum stays below 2^24, else float64 (< 2^53)
        big = 255 * max(1, int(np.abs(wmat).max()))
        self.chunk = (1 << 24) // big if not self.wide else 0
        self.ftype = np.float32 if self.chunk >= min(wmat.shape[1], 16) else np.float64
        if self.ftype == np.float64:
            self.chunk = wmat.shape[1]
        self.wmat = wmat.astype(self.ftype)
        # float taps for the fused depthwise kernel (fast.dw_bn_lut) only: float32 when every
        # partial k x k window sum is an integer below 2^24 (8-bit weights: 9·255·255 < 2^24),
        # else float64 (below 2^53: the KPU's 36-bit values)
        small = kk * 255 * max(1, int(np.abs(wmat).max())) < 1 << 24
        self.wtap = (np.ascontiguousarray(wmat, np.float32 if small else np.float64)
                     if self.depthwise else None)
        if sum_rule == "silicon" or self.depthwise:
            tw = ((a["arg_w"] * sw_i) >> a["shr_w"]).sum(axis=1)
        else:
            tw = (a["arg_w"] * sw_i.sum(axis=1)) >> a["shr_w"]
        self.const = (tw + a["arg_add"] * n_ic).astype(np.int64)[:, None]  # (C_out, 1)
        self.bn_mul = np.asarray(conv.bn["norm_mul"], np.int64)[:, None]
        self.bn_shift = np.asarray(conv.bn["norm_shift"], np.int64)[:, None]
        self.bn_add = np.asarray(conv.bn["norm_add"], np.int64)[:, None]
        self.act = conv.act
        self._build_lut(wt, sw_i, n_ic, kk)
        # the fused numba kernels need the tabulated activation and no Σx extra rows
        self.use_fast = use_fast and fast.available() and self.table is not None and not self.extra
        # the fused depthwise kernel reads its padded input as float32 where its taps are
        # float32 (fast.pad1 converts each value once; the taps would convert it nine times)
        fused_dw = self.use_fast and self.depthwise and self.table.fine is not None
        self.plane = np.float32 if fused_dw and self.wtap.dtype == np.float32 else np.uint8
        # ... and a 3x3 one with the Σx term in its weights pads each channel itself, in cache
        # (fast.dw3_bn_lut): no padded copy of the map at all
        self.dw3 = fused_dw and self.k == 3 and self.x_exact
        # pick pools (nncase's stride-2 convs) sum only the picked windows (a quarter or a
        # sixteenth of the work). Max pools of a normal conv run on the sums, before the BN
        # stage, where the layer is monotone: V = ((ACC + c)·mul >> shift) + add is
        # non-decreasing in ACC for mul >= 0 (non-increasing for mul < 0: there the pool takes
        # the min), and the step table non-decreasing in V, so the max of the looked-up bytes is
        # the lookup of the max (or min) sum: a quarter of the lookups
        p = hw.POOL[a["pool_type"]]
        self.pool_first = (self.use_fast and not self.depthwise and self.table.fine is not None
                           and (p.kind == "pick" or p.kind == "max" and self.table.monotone))
        self.neg = (self.bn_mul[:, 0] < 0).astype(np.uint8)
        t = self.table   # the fused kernels' BN + lookup arguments, made once
        self.bn_args = None if t is None or t.fine is None else tuple(
            np.ascontiguousarray(v) for v in (self.const[:, 0], self.bn_mul[:, 0],
                                              self.bn_shift[:, 0], self.bn_add[:, 0] - t.lo)
        ) + (t.pages, t.fine, t.q, t.top, act_pieces(self.act, act_rule, t))
        # the fused path's normal-conv sums come from onnxruntime's exact integer conv where it
        # is installed and the int32 bound holds (intconv.py); else from the float BLAS
        wq, z = np.asarray(conv.weights).reshape(co, -1, self.k, self.k), -fold
        picked = self.pool_first and p.kind == "pick"
        self.int_sums = (intconv.ConvSums(wq, z, stride=p.stride if picked else 1)
                         if int_sums and self.use_fast and not self.depthwise and not self.wide
                         and intconv.available() and intconv.fits(wq, z) else None)
        # with several threads, a normal conv can also run as output-channel parts on threads
        # (each its own onnxruntime session and post-processing, on the whole input: no row
        # slices to copy); kept, like row bands, only where measured to pay (_parallel). The
        # parts' layers are made on their first call (sessions take time to build)
        n = min(threads, co // PART_MIN)
        self.part_cuts = [] if n < 2 or self.int_sums is None else [
            (co * i // n, co * (i + 1) // n) for i in range(n)]
        self._conv, self._parts = conv, None
        self._plan_bands()

    def _build_lut(self, wt, sw_i, n_ic, kk):
        """Bound V over every possible uint8 input, then compile the activation over that range."""
        a = self.args
        wsum = wt.reshape(wt.shape[0], -1).sum(axis=1)           # Σ W over the window per o
        x_terms = [0, (a["arg_x"] * 255 * kk) >> a["shr_x"]]
        per_ch = 1 if self.depthwise else n_ic
        margin = n_ic + 1  # the simulator rule floors the whole sum: within n_ic of per-channel
        acc_lo = per_ch * min(x_terms) - margin + self.const[:, 0]
        acc_hi = 255 * wsum + per_ch * max(x_terms) + margin + self.const[:, 0]
        if max(abs(int(acc_lo.min())), abs(int(acc_hi.max()))) * max(1, int(np.abs(self.bn_mul).max())) >= 1 << 62:
            raise EmulatorError(f"{self.where}: accumulator x norm_mul can exceed 64 bits; the KPU "
                                "keeps 36-bit values (docs/kpu.md#convolution) - this layer's parameters are absurd")
        ends = np.stack([(acc_lo * self.bn_mul[:, 0]) >> self.bn_shift[:, 0],
                         (acc_hi * self.bn_mul[:, 0]) >> self.bn_shift[:, 0]]) + self.bn_add[:, 0]
        self.table = compile_activation(self.act, self.act_rule, int(ends.min()), int(ends.max()))

    # ----- run
    def _matmul_exact(self, cols: np.ndarray) -> np.ndarray:
        """W·cols as float32/float64 holding exact integers."""
        K = cols.shape[0]
        if K <= self.chunk:
            return self.wmat @ cols
        acc = np.zeros((self.wmat.shape[0], cols.shape[1]), np.float64)
        for k0 in range(0, K, self.chunk):
            acc += self.wmat[:, k0:k0 + self.chunk] @ cols[k0:k0 + self.chunk]
        return acc

    def _exact_sums(self, rows: np.ndarray, h: int, w: int, s: int = 1) -> np.ndarray:
        """Σ(W + fold)·X (C_out, h·w) of a normal conv as exact integers (int32 or float), for
        the h x w windows of the padded rows that start every s rows and columns."""
        if self.int_sums is not None:
            return self.int_sums(rows, h, w)
        return self._matmul_exact(self._cols(rows, h, w, s))

    def _matmul(self, cols: np.ndarray) -> np.ndarray:
        return self._matmul_exact(cols).astype(np.int64)

    def _cols(self, xp: np.ndarray, h: int, w: int, s: int = 1) -> np.ndarray:
        """im2col of the h x w windows of xp starting every s rows and columns."""
        ci = xp.shape[0]
        if self.k == 1:
            return xp[:, :s * h:s, :s * w:s].reshape(ci, h * w).astype(self.ftype)
        cols = np.empty((ci, 3, 3, h, w), self.ftype)
        for ky in range(3):
            for kx in range(3):
                cols[:, ky, kx] = xp[:, ky:ky + s * h:s, kx:kx + s * w:s]
        return cols.reshape(ci * 9, h * w)

    def _pad(self, x: np.ndarray, dtype=np.uint8) -> np.ndarray:
        """x with the 3 x 3 conv's 1-pixel border of pad_value, in dtype (x itself for 1 x 1)."""
        if self.k == 1:
            return x
        ci, h, w = x.shape
        pv = self.args["pad_value"]
        xp = np.empty((ci, h + 2, w + 2), dtype)
        if self.use_fast:
            fast.pad1(x, pv, xp)
            return xp
        xp[:, 1:-1, 1:-1] = x
        xp[:, 0, :] = xp[:, -1, :] = pv
        xp[:, :, 0] = xp[:, :, -1] = pv
        return xp

    def sums(self, x: np.ndarray) -> np.ndarray:
        """ACC (C_out, H*W) int64 for input x (C_in, H, W) uint8."""
        return self._sums(self._pad(x), *x.shape[1:])

    def _sums(self, xp: np.ndarray, h: int, w: int) -> np.ndarray:
        """ACC for the h x w outputs whose windows lie in the (already padded) xp."""
        a = self.args
        ci, k = xp.shape[0], self.k
        if self.depthwise:
            xf = xp.astype(self.ftype)
            s = np.multiply(xf[:, :h, :w], self.wmat[:, 0, None, None])
            tmp = np.empty_like(s)
            for t in range(1, k * k):
                ky, kx = divmod(t, k)
                np.multiply(xf[:, ky:ky + h, kx:kx + w], self.wmat[:, t, None, None], out=tmp)
                s += tmp
            acc = s.reshape(ci, h * w).astype(np.int64)
            if not self.x_exact:
                box = sliding_window_view(xp, (k, k), axis=(1, 2)).sum(axis=(3, 4), dtype=np.int64)
                acc += (a["arg_x"] * box.reshape(ci, h * w)) >> a["shr_x"]
            acc += self.const
            return acc
        out = self._matmul(self._cols(xp, h, w))
        if self.extra:
            acc, box = out[:-self.extra], out[-self.extra:]
            acc += ((a["arg_x"] * box) >> a["shr_x"]).sum(axis=0)
        else:
            acc = out
        acc += self.const
        return acc

    def _band(self, xp: np.ndarray, y: np.ndarray, r0: int, r1: int):
        """Rows [r0, r1) of the activation output, written into y (C_out, H, W)."""
        w = y.shape[2]
        acc = self._sums(xp[:, r0:r1 + self.k - 1], r1 - r0, w)
        acc *= self.bn_mul
        acc >>= self.bn_shift
        if self.table is not None and self.table.fine is not None:
            acc += self.bn_add - self.table.lo        # V − lo in one pass
            out = self.table.shifted(acc)
        else:
            acc += self.bn_add
            out = self.table(acc) if self.table is not None else activation(acc, self.act, self.act_rule)
        y[:, r0:r1] = out.reshape(-1, r1 - r0, w)

    def _buf(self, n: int) -> np.ndarray:
        """Scratch row for the fused kernels' clipped table indices (one per band: bands run
        on threads at once)."""
        return np.empty(n, np.int32 if self.table.top < 1 << 31 else np.int64)

    def _fused_band(self, xp: np.ndarray, y: np.ndarray, r0: int, r1: int):
        """The numba path for rows [r0, r1): BN + activation lookup (and the depthwise taps) in
        one pass over the band, written into y (C_out, H, W). xp is the padded input (the
        input itself for dw3 layers, which pad in the kernel)."""
        a, co, t, w = self.args, self.out_shape[0], self.table, y.shape[2]
        rows = xp[:, r0:r1 + self.k - 1]
        out = y[:, r0:r1]
        if self.dw3:
            fast.dw3_bn_lut(xp, a["pad_value"], r0, self.wtap, *self.bn_args,
                            self._buf((r1 - r0 - 1) * (w + 2) + w), out)
            return
        if t.fine is not None and self.depthwise:
            hp, wp = xp.shape[1:]
            fast.dw_bn_lut(np.ascontiguousarray(xp).reshape(-1), hp * wp, wp, r0, self.wtap, self.k,
                           a["arg_x"], a["shr_x"], self.x_exact, *self.bn_args,
                           self._buf((r1 - r0 - 1) * wp + w), out)
            return
        n = r1 - r0
        acc = self._exact_sums(rows, n, w) if not self.depthwise else \
            (self._sums(rows, n, w) - self.const).astype(np.float64)
        flat = out.reshape(co, n * w)   # a view: rows of one channel are contiguous
        if t.fine is not None:
            fast.bn_lut(acc, *self.bn_args, self._buf(n * w), flat)
        else:
            fast.bn_steps(acc, self.const[:, 0], self.bn_mul[:, 0], self.bn_shift[:, 0],
                          self.bn_add[:, 0], t.starts, t.values, flat)

    def _pooled_band(self, xp: np.ndarray, out: np.ndarray, r0: int, r1: int):
        """Rows [r0, r1) of the conv (r0 a multiple of the pool stride) straight to pooled rows:
        a pick pool sums only the picked windows, a max pool pools the sums (see __init__)."""
        a, co = self.args, self.out_shape[0]
        p = hw.POOL[a["pool_type"]]
        s, w, h = p.stride, self.in_shape[2], self.in_shape[1]
        oh, ow = (r1 - r0) // s if s > 1 else r1 - r0, w // s
        bn = self.bn_args
        if p.kind == "pick":
            dy, dx = p.pick
            acc = self._exact_sums(xp[:, r0 + dy:r1 + self.k - 1, dx:], oh, ow, s)
            fast.bn_lut(acc, *bn, self._buf(oh * ow),
                        out[:, r0 // s:r0 // s + oh].reshape(co, oh * ow))
            return
        rows = min(h, r1 + p.size - s) - r0       # a stride-1 window reaches into the next band
        acc = self._exact_sums(xp[:, r0:r0 + rows + self.k - 1], rows, w).reshape(co, rows, w)
        dst = out[:, r0 // s:r0 // s + oh]
        if p.size == s == 2 and acc.dtype == np.int32 and w % 2 == 0:
            fast.max2_bn_lut(acc.view(np.int64), self.neg, *bn, self._buf(oh * ow), dst)
        else:
            fast.max_bn_lut(acc, p.size, s, self.neg, *bn, np.empty(w, acc.dtype),
                            np.empty(oh * ow, acc.dtype), self._buf(oh * ow), dst)

    def _plan_bands(self):
        """Row bands of the conv output: at least one per thread on big layers, small enough
        for their intermediates to stay in cache, and aligned to the pool stride so
        each band pools on its own. ``serial_bands``: the same for one thread."""
        self.bands = self._bands(self.threads)
        self.serial_bands = self._bands(1)
        # several threads only where measured to pay (see _parallel): the first TRIALS calls
        # each way alternate, starting with the threads
        self.parallel = self.threads > 1 and (len(self.bands) > 1 or bool(self.part_cuts))
        self._trials = ([], []) if self.parallel else None

    def _bands(self, threads: int):
        co, (ci, h, w) = self.out_shape[0], self.in_shape
        p = hw.POOL[self.args["pool_type"]]
        step = p.stride if p.stride > 1 else 1
        size = co * h * w
        want = threads if size * max(1, ci // 8) > 40_000 else 1
        want = max(want, -(-size // (FAST_BAND_ELEMS if self.use_fast else BAND_ELEMS)))
        units = h // step if step > 1 else h
        n = max(1, min(units, want))
        cuts = [units * i // n * step for i in range(n + 1)]
        cuts[-1] = h
        return [(r0, r1) for r0, r1 in zip(cuts[:-1], cuts[1:]) if r1 > r0]

    def _parallel(self) -> bool:
        """Whether this call runs its bands on threads. Threads cost a hand-off per band and
        compete with whatever else the machine runs, so each layer measures: its first
        2 x TRIALS calls alternate threads / one thread (wall time), then it keeps threads
        only if their median is at least PAY_OFF times faster. Results are the same bytes
        either way."""
        if self._trials is None:
            return self.parallel
        par, ser = self._trials
        if len(ser) < TRIALS:
            return len(par) == len(ser)
        self.parallel = float(np.median(par)) * PAY_OFF <= float(np.median(ser))
        self._trials = None
        return self.parallel

    def __call__(self, x: np.ndarray) -> np.ndarray:
        ci, h, w = self.in_shape
        if x.shape != (ci, h, w):
            raise EmulatorError(f"{self.where}: input is {x.shape}, layer expects {(ci, h, w)}")
        par = self._parallel()
        if self._trials is None:
            return self._run(x, par)
        t = time.perf_counter()
        out = self._run(x, par)
        self._trials[0 if par else 1].append(time.perf_counter() - t)
        return out

    def _run_parts(self, x: np.ndarray) -> np.ndarray:
        """The output-channel parts on threads (this one runs the first), into one output."""
        if self._parts is None:
            self._parts = [(c0, c1, PreparedConv(_channels(self._conv, c0, c1), self.sum_rule,
                                                 self.act_rule, self.where))
                           for c0, c1 in self.part_cuts]
        out = np.empty(self.out_shape, np.uint8)
        (c0, c1, first), *rest = self._parts
        futures = [_executor(self.threads).submit(part._run, x, False, out[d0:d1])
                   for d0, d1, part in rest]
        first._run(x, False, out[c0:c1])
        for f in futures:
            f.result()
        return out

    def _run(self, x: np.ndarray, par: bool, out: np.ndarray | None = None) -> np.ndarray:
        """The layer's output (written into out when given)."""
        if par and self.part_cuts:
            return self._run_parts(x)
        h = self.in_shape[1]
        bands = self.bands if par else self.serial_bands

        def each(fn):
            if par:     # one contiguous group of bands per thread, the first on this one
                n = min(self.threads, len(bands))
                groups = [bands[len(bands) * i // n:len(bands) * (i + 1) // n] for i in range(n)]
                futures = [_executor(self.threads).submit(lambda g=g: [fn(rr) for rr in g])
                           for g in groups[1:]]
                for rr in groups[0]:
                    fn(rr)
                for f in futures:
                    f.result()
            else:
                for rr in bands:
                    fn(rr)
        xp = x if self.dw3 else self._pad(x, self.plane)
        code = self.args["pool_type"]
        if self.pool_first:
            out = np.empty(self.out_shape, np.uint8) if out is None else out
            if len(bands) == 1:
                self._pooled_band(xp, out, 0, h)
            else:
                each(lambda rr: self._pooled_band(xp, out, *rr))
            return out
        p = hw.POOL[code]
        y = out if out is not None and p.kind == "bypass" else \
            np.empty((self.out_shape[0], h, self.in_shape[2]), np.uint8)
        run = self._fused_band if self.use_fast else self._band
        if len(bands) == 1:
            run(xp, y, 0, h)
            return _into(pool(y, code), out)
        s = p.stride
        pooled = None
        if p.kind != "bypass" and s > 1:
            pooled = np.empty(self.out_shape, np.uint8) if out is None else out

        def band(rr):
            run(xp, y, *rr)
            if pooled is not None:
                r0, r1 = rr
                pooled[:, r0 // s:r1 // s] = pool(y[:, r0:r1], code)
        each(band)
        return pooled if pooled is not None else _into(pool(y, code), out)


def _into(y: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    """y, copied into out when out is given (and not y itself)."""
    if out is None or y is out:
        return y
    out[...] = y
    return out


def _channels(conv, c0: int, c1: int):
    """The normal conv ``conv`` restricted to output channels [c0, c1)."""
    co = conv.out_shape[0]
    return replace(conv, args={**conv.args, "o_ch_num": c1 - c0 - 1},
                   weights=np.asarray(conv.weights).reshape(co, -1)[c0:c1].reshape(-1),
                   bn={k: np.asarray(v)[c0:c1] for k, v in conv.bn.items()})

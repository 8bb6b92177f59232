"""Fixed-point parameters of a KPU layer from float weights and calibrated ranges.

Conventions (value = scale · (q − zero_point)):
  input X  : (s_x, z_x), z_x an integer 0..255 (the pad value)
  weights  : per output channel o, symmetric: W[o] ≈ sw[o] · (Wq[o] − zw), zw = 128 (2^(bits−1))
  ACC      : Σ (Xq − z_x)(Wq − zw)  (KPU: arg_x = −zw, arg_w = −z_x, arg_add = k²·z_x·zw)
  V        : ((ACC · norm_mul) >> norm_shift) + norm_add ≈ (conv + bias) · S_V, one S_V per layer
  output   : the activation table maps V to uint8 (s_z, z_z) of f(conv + bias)

S_V is as large as the registers allow (norm_mul 24-bit signed with shift ≤ 15, norm_add 32-bit,
V inside 36 bits with margin), so rounding in V is far below one output step.
"""
from __future__ import annotations

import math

import numpy as np

from tl2k210.k210 import hardware as hw
from tl2k210.memo import memoised
from tl2k210.quantize.uniform import qparams, quantize_weights  # noqa: F401  (fx.qparams in the lowering)

V_LIMIT = 2.0 ** 33          # |V| over the calibrated range (x2 margin, then x2 to the 36-bit limit)
ACT_SHIFT_MAX = 40           # activation shift cap (nncase v1, which ran on silicon, used up to 43)
SEGMENTS = hw.ACT_SEGMENTS - 1


def fixed_mul(value: float, bits: int, max_shift: int, min_shift: int = 0) -> tuple[int, int]:
    """(mul, shift) with mul / 2^shift ≈ value, |mul| < 2^(bits-1) (signed), shift as large as fits."""
    if value == 0 or not math.isfinite(value):
        return 0, 0
    limit = (1 << (bits - 1)) - 1
    e = math.frexp(abs(value))[1]               # |value| = m·2^e, 0.5 <= m < 1
    shift = int(min(max_shift, bits - 1 - e))
    shift = max(shift, min_shift)
    mul = int(round(value * 2.0 ** shift))
    while abs(mul) > limit and shift > min_shift:
        shift -= 1
        mul = int(round(value * 2.0 ** shift))
    return max(-limit, min(limit, mul)), shift


def choose_v_scale(s_x: float, sw: np.ndarray, bias: np.ndarray, y_amax: float) -> float:
    """The largest S_V the BN registers can carry for this layer."""
    base = float(s_x * np.max(sw))
    cands = [V_LIMIT / max(y_amax, 1e-12),
             ((1 << 23) - 1) / max(base, 1e-30),                         # norm_mul at shift 0
             (2.0 ** 31 - 1) / max(float(np.max(np.abs(bias))) if bias.size else 0.0, 1e-30)]
    return min(cands) * 0.999


def clamp_of(act: dict | None):
    """(lo, hi) of an activation that is a clamp of the identity (none, Relu, Clip), else None."""
    if act is None:
        return (-math.inf, math.inf)
    if act["op"] == "Relu":
        return (0.0, math.inf)
    if act["op"] == "Clip":
        return (act.get("min", -math.inf), act.get("max", math.inf))
    return None


def exact_v_scale(s_v_max: float, s_z: float) -> tuple[float, int]:
    """(S_V, A): the largest S_V <= s_v_max with S_V·s_z = 2^A, so that one output step is 2^A in V
    and the activation stage rounds V to the output grid with a plain shift (no 16-bit slope)."""
    a = math.floor(math.log2(s_v_max * s_z))
    return 2.0 ** a / s_z, a


def double_rounding_offset(m: float) -> float:
    """How far (output LSB) TFLite's reference kernels push a requantized value away from zero.
    They (and TFLite Micro: MultiplyByQuantizedMultiplier without TFLITE_SINGLE_ROUNDING) round
    twice, half away from zero: r = round(acc·q / 2^31) with m = q·2^-31·2^-s (q the 31-bit
    multiplier, q >= 2^30), then round(r / 2^s). For acc·q >= 0 that is floor((floor((acc·q + 2^30)
    / 2^31) + 2^(s-1)) / 2^s) = floor(acc·m + 1/2 + 2^-(s+1)): one rounding of acc·m + e, e =
    2^-(s+1) in [m/2, m] (and its mirror below zero); 0 without a right shift (m >= 1/2)."""
    f, e = math.frexp(m)
    if round(f * 2 ** 31) == 2 ** 31:
        e += 1
    return 2.0 ** (e - 1) if e < 0 else 0.0


def mean_rounding_offset(s_in: float, s_out: float, n: int) -> float:
    """`double_rounding_offset` of TFLite's reference int8 MEAN (QuantizedMeanOrSum, TFLite
    Micro's too): the sum of n inputs times multiplier q·2^k // n at shift - k, k = floor(log2 n)
    (q, shift of s_in / s_out); the truncated q' may fall below 2^30, so e can reach 2m."""
    f, e = math.frexp(s_in / s_out)
    if round(f * 2 ** 31) == 2 ** 31:
        e += 1
    k = min(n.bit_length() - 1, 32, 31 + e)
    return 2.0 ** (e - k - 1) if e - k < 0 else 0.0


def clamp_table(lo: float, hi: float, a: int, s_z: float, z_z: int, shifts=(0,), spacing: int = 0) -> dict:
    """Activation table of round(V / 2^A) + z_z clamped to [lo, hi] (real) and to 0..255: TFLite's
    requantization with its fused-activation clamp (act_min = z_z + round(lo / s_z)). Segment 1
    starts where the output leaves its lower clamp (V - start >= 0 there, so the carry shift
    rounds half to even), segment 2 (a finite hi) holds the upper clamp.
    Channel groups (TFLite's reference rounding, `double_rounding_offset`): group g's V is moved
    up by g·spacing plus its offset E, and its values below zero round `shifts[g]` = 2E lower (one
    more segment whose start carries that phase): round(V + E) above zero, round(V - E) below."""
    def code(v):
        return int(np.clip(math.floor(v / s_z + 0.5) + z_z, 0, 255)) if math.isfinite(v) else None
    c_lo, c_hi = code(lo) if code(lo) is not None else 0, code(hi) if code(hi) is not None else 255
    starts, muls, sh, biases = [], [], [], []

    def seg(start, mul, shift, bias):
        starts.append(start), muls.append(mul), sh.append(shift), biases.append(bias)
    for g, n in enumerate(shifts):
        d = g * spacing
        seg(d - spacing // 2 if g else hw.ACT_X_START_MIN, 0, 0, c_lo)
        if n and c_lo < z_z:
            seg(d + n + ((c_lo - z_z) << a), 1, a, c_lo)
            seg(d, 1, a, z_z)
        else:
            seg(d + ((c_lo - z_z) << a if a >= 0 else 0), 1, a, c_lo)
        if c_hi < 255:
            seg(d + ((c_hi - z_z) << a), 0, 0, c_hi)
    return act_table(starts, muls, sh, biases)


def tie_margin(sw: np.ndarray, bn: dict, s_v: float, a: int, y_amax, bias: np.ndarray) -> float:
    """Bound (output LSB) on |V / 2^A - TFLite's real requantized value| over |y| <= y_amax (one
    bound, or one a channel): the 24-bit BN multipliers' relative error times the output, the
    floor of the BN shift and the rounding of norm_add. Outputs differ from TFLite's only where
    its value lies this close to a rounding tie."""
    want = sw.astype(np.float64) * s_v
    got = bn["norm_mul"].astype(np.float64) / 2.0 ** bn["norm_shift"]
    rel = np.abs(got - want) / np.maximum(want, 1e-300)
    acc_amax = (y_amax + np.abs(bias)) * s_v / 2.0 ** a         # |conv without bias| in output LSB
    return float(np.max(rel * acc_amax) + 1.5 / 2.0 ** a)


def bn_params(s_x: float, sw: np.ndarray, bias: np.ndarray, s_v: float) -> dict:
    muls, shifts = zip(*(fixed_mul(float(s_x * s * s_v), 24, 15) for s in sw))
    return {"norm_mul": np.array(muls, np.int64), "norm_shift": np.array(shifts, np.int64),
            "norm_add": np.clip(np.rint(bias.astype(np.float64) * s_v), -(2 ** 31), 2 ** 31 - 1).astype(np.int64)}


# ---------------------------------------------------------------------------------------------
# Activation functions (float reference) and their kinks
def _sigmoid(y):
    with np.errstate(over="ignore"):     # exp(-y) is inf far below zero: the value is 0, no warning
        return 1 / (1 + np.exp(-y))


def _swish(y):
    with np.errstate(over="ignore"):
        return y / (1 + np.exp(-y))


def act_function(act: dict | None):
    """(f, kinks) for an IR activation attr (None = identity)."""
    if act is None:
        return (lambda y: y), []
    op = act["op"]
    if op == "Relu":
        return (lambda y: np.maximum(y, 0)), [0.0]
    if op == "Clip":
        lo, hi = act.get("min", -np.inf), act.get("max", np.inf)
        return (lambda y: np.clip(y, lo, hi)), [v for v in (lo, hi) if np.isfinite(v)]
    if op == "LeakyRelu":
        a = act.get("alpha", 0.01)
        return (lambda y: np.where(y >= 0, y, a * y)), [0.0]
    if op == "Sigmoid":
        return _sigmoid, []
    if op == "Tanh":
        return np.tanh, []
    if op == "HardSigmoid":
        a, b = act.get("alpha", 0.2), act.get("beta", 0.5)
        return (lambda y: np.clip(a * y + b, 0, 1)), [(-b) / a, (1 - b) / a]
    if op == "HardSwish":
        return (lambda y: y * np.clip(y / 6 + 0.5, 0, 1)), [-3.0, 3.0]
    if op == "Swish":
        return _swish, []
    if op in ("Elu", "Selu"):
        a = act.get("alpha", 1.0 if op == "Elu" else 1.67326319217681884765625)
        g = act.get("gamma", 1.0 if op == "Elu" else 1.05070102214813232421875)
        return (lambda y: g * np.where(y > 0, y, a * np.expm1(np.minimum(y, 0)))), [0.0]
    if op == "Softplus":
        return (lambda y: np.logaddexp(0, y)), []
    if op == "Mish":
        return (lambda y: y * np.tanh(np.logaddexp(0, y))), []
    raise KeyError(op)


def fit_knots(f, lo: float, hi: float, kinks=(), segments: int = SEGMENTS, samples: int = 4097):
    """Knots of a piecewise-linear interpolation of f on [lo, hi] with at most `segments` pieces:
    the ends and the kinks, then greedily the sample with the largest interpolation error."""
    if hi <= lo:
        hi = lo + 1e-6
    inner = [k for k in kinks if lo < k < hi]
    xs = np.unique(np.concatenate([np.linspace(lo, hi, samples), inner]))   # kinks exactly
    ys = f(xs)
    knots = {0, len(xs) - 1} | {int(np.searchsorted(xs, k)) for k in inner}
    while len(knots) <= segments:
        k = np.array(sorted(knots))
        err = np.abs(np.interp(xs, xs[k], ys[k]) - ys)
        i = int(np.argmax(err))
        if err[i] < 1e-9 or i in knots:
            break
        knots.add(i)
    k = np.array(sorted(knots))
    return xs[k], ys[k]


_STEPS = np.arange(65, dtype=np.float64)


def _minimax(g, *knots):
    """Error of the best line with the chord's slope for g on each [knots[i], knots[i + 1]]: half
    the deviation range over 65 samples. The samples are np.linspace's floats (its arithmetic:
    i·step + a, the last one b), all segments in one call of g, which works element-wise."""
    k = np.asarray(knots, np.float64)
    return _minimax_ab(g, k[:-1], k[1:])


def _minimax_ab(g, a, b):
    """_minimax on the segments [a[j], b[j]] (arrays), each on its own."""
    a, b = np.asarray(a, np.float64)[:, None], np.asarray(b, np.float64)[:, None]
    xs = _STEPS * ((b - a) / (len(_STEPS) - 1)) + a
    xs[:, -1] = b[:, 0]
    ys = g(xs.reshape(-1)).reshape(xs.shape)
    d = ys - (ys[:, :1] + (xs - a) * (ys[:, -1:] - ys[:, :1]) / np.maximum(b - a, 1e-30))
    return (d.max(axis=1) - d.min(axis=1)) / 2


def balance_knots(g, kx, kinks=(), sweeps=6, steps=18):
    """Move the inner knots (not the kinks) so neighbouring segments have equal minimax error:
    coordinate descent with bisection; the ends and the kinks stay."""
    kx = np.array(kx, np.float64)
    fixed = {0, len(kx) - 1} | {i for i, x in enumerate(kx) if any(abs(x - k) < 1e-12 for k in kinks)}
    if len(kx) < 3 or max(_minimax(g, *kx)) < 0.05:
        return kx
    for _ in range(sweeps):
        for i in range(1, len(kx) - 1):
            if i in fixed:
                continue
            kx[i] = _bisect_knot(g, kx[i - 1], kx[i + 1], steps)
    return kx


def _bisect_knot(g, left, right, steps, depth=4):
    """The bisection of balance_knots for a knot between `left` and `right`: move to the half
    whose side has the larger minimax error, `steps` times. Computed `depth` steps at a time:
    the 2^depth - 1 midpoints any path of those steps can visit (each as the sequential bisection
    computes it) go to one _minimax_ab call, and the path is walked through them after: the same
    midpoints, the same comparisons, a few numpy calls instead of one per step."""
    lo, hi = left, right
    while steps > 0:
        d = min(depth, steps)
        mids, level = [], [(lo, hi)]
        for _ in range(d):               # breadth first: node k's halves are 2k + 1 and 2k + 2
            nxt = []
            for a, b in level:
                m = (a + b) / 2
                mids.append(m)
                nxt += [(a, m), (m, b)]
            level = nxt
        n = len(mids)
        err = _minimax_ab(g, [left] * n + mids, mids + [right] * n)
        k = 0
        for _ in range(d):
            if err[k] > err[n + k]:
                hi, k = mids[k], 2 * k + 1
            else:
                lo, k = mids[k], 2 * k + 2
        steps -= d
    return (lo + hi) / 2


def _varying(g, lo, hi, samples=4097):
    """(a, b, top): the part [a, b] of [lo, hi] to fit -- without the saturated tails, where the
    rounded output round(g) stays constant over more than a segment's share -- and the rounded
    output above b when the top is trimmed (else None). A sigmoid's uint8 output is 0
    below -6.2 and 255 above 6.2 whatever the calibrated range: fitted over [-13.5, 13.5] (LFFD's
    score head), the segments spent on those tails missed the rounding there (1 LSB on half the
    background, and 4 LSB near the top). Below a, the table's first segment is flat already."""
    ys = np.linspace(lo, hi, samples)
    r = np.round(g(ys))
    moves = np.flatnonzero(r != r[0])
    if hi <= lo or not moves.size:
        return lo, hi, None
    a, b = ys[moves[0] - 1], ys[np.flatnonzero(r != r[-1])[-1] + 1]
    # a tail is saturated when its plateau is longer than a segment's share of the rest; the
    # last output step of a function still rising at hi is not (values above hi go on rising)
    share = (b - a) / SEGMENTS
    a = a if a - lo > share else lo
    return (a, b, int(r[-1])) if hi - b > share else (a, hi, None)


def _falling_steps(g, a, b, samples=4097):
    """(steps, fall) for a function whose rounded output falls from `a` to an inner minimum
    (swish, mish, hard-swish below zero): steps = [(y, code)], where round(g) turns to `code`
    going up from a (each y found by bisection) as far as SEGMENTS turns, the first `fall` of
    them down to the minimum; None when g does not fall at a."""
    ys = np.linspace(a, b, samples)
    v = g(ys)
    i = int(np.argmin(v))
    if i == 0 or i == len(ys) - 1 or v[0] - v[i] < 0.5:
        return None
    r = np.round(v)
    turns = np.flatnonzero(r[1:] != r[:-1])[:SEGMENTS]
    steps = []
    for j in turns:
        lo, hi, before = ys[j], ys[j + 1], r[j]
        for _ in range(40):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if np.round(g(mid)) == before else (lo, mid)
        steps.append((hi, int(r[j + 1])))
    return steps, int(np.sum(turns < i))


def _table_error(table, g, y_lo, y_hi, s_v, samples=4096) -> float:
    """RMS of table(V = y·S_V) - g(y) over [y_lo, y_hi], the table run as the emulator runs it,
    plus its largest mean offset from round(g) over a sixteenth of that range (a bias there
    moves a pooled mean; the rounding's own is no fault of the table's)."""
    from tl2k210.k210.emulator.kpu import activation
    y = np.linspace(y_lo, y_hi, samples)
    got = activation(np.rint(y * s_v).astype(np.int64), table).astype(np.float64)
    e, r = got - g(y), got - np.round(g(y))
    return float(np.sqrt(np.mean(e ** 2)) + np.abs(r.reshape(16, -1).mean(axis=1)).max())


@memoised(lambda act, y_lo, y_hi, s_v, s_z, z_z: (None if act is None else repr(sorted(act.items())), float(y_lo),
                                                   float(y_hi), float(s_v), float(s_z), int(z_z)))
def activation_table(act: dict | None, y_lo: float, y_hi: float, s_v: float, s_z: float, z_z: int) -> dict:
    """The 16-segment table mapping V ≈ y·S_V to uint8 round(f(y)/s_z + z_z). Each segment is the
    chord between two knots moved to its minimax position (half way between the largest deviations
    of f above and below it): segments need not join, so this halves the error of interpolation.

    A falling part (swish, mish, hard-swish below their minimum) needs a negative slope, and the
    KPU's shift of a negative T is no rounding (docs/kpu.md#activation-rules: it zigzags 2 output
    LSB about the line; swish's table was 1.55 LSB off there, rms 0.8 against 0.3 on its rising
    segments). So where the fall is at most 9 output steps, the table also tries one flat
    segment per step (exact rounding there; and 2 or 4 steps more, where the rise from the
    minimum is still slow and a chord's rounded bias is half a step off) and the chords on the
    rest, and keeps the one closest to f (rms, plus the largest mean offset from the rounding
    over a sixteenth of the calibrated range). A longer fall (hard-swish's 10 steps and more) would leave too few
    chords for the rise, where most of a layer's values lie (k3_seg_hswish128 lost 0.7 dB).

    Memoised: the plan's searches (fit.choose_forms) lower a model several times, each layer at the
    same ranges, and fitting a table is most of a KPU layer's lowering."""
    f, kinks = act_function(act)
    g = lambda y: np.clip(f(y) / s_z + z_z, 0, 255)     # noqa: E731
    a, b, top = _varying(g, y_lo, y_hi)
    table = _chord_table(f, kinks, g, a, b, top, s_v, s_z, z_z, [])
    falling = _falling_steps(g, a, b)
    if falling is not None:
        steps, fall = falling
        best = _table_error(table, g, y_lo, y_hi, s_v)
        # the first k steps flat, then chords: through the fall, and a few steps on
        for k in [fall + 4, fall + 2, fall] if fall <= SEGMENTS * 3 // 5 else []:
            if k >= len(steps):
                continue
            t = _chord_table(f, kinks, g, steps[k][0], b, top, s_v, s_z, z_z, steps[:k], first=int(np.round(g(a))))
            err = _table_error(t, g, y_lo, y_hi, s_v)
            if err < best:
                table, best = t, err
    return table


def _chord_table(f, kinks, g, a, b, top, s_v, s_z, z_z, steps, first=None) -> dict:
    """The table of activation_table: below a flat at `first` (default: g(a) rounded), then a flat
    segment per (y, code) of `steps`, then chords on [a, b], then the flat `top` if any."""
    kx, _ = fit_knots(f, a, b, kinks, SEGMENTS - len(steps) - (top is not None))
    kx = balance_knots(g, kx, kinks)
    q = f(kx) / s_z + z_z                                # target output (real) at each knot
    starts = [hw.ACT_X_START_MIN]
    muls, shifts = [0] * (1 + len(steps)), [0] * (1 + len(steps))
    biases = [int(np.clip(round(q[0]), 0, 255)) if first is None else first]
    prev = hw.ACT_X_START_MIN
    for y, code in steps:
        prev = int(max(prev, min(round(y * s_v), (1 << 35) - 2)))
        starts.append(prev)
        biases.append(code)
    for i in range(len(kx) - 1):
        v0 = kx[i] * s_v
        slope = (q[i + 1] - q[i]) / max((kx[i + 1] - kx[i]) * s_v, 1e-30)   # output units per V
        xs = np.linspace(kx[i], kx[i + 1], 129)
        dev = g(xs) - np.clip(q[i] + (xs - kx[i]) * s_v * slope, 0, 255)
        qi = q[i] + (dev.max() + dev.min()) / 2
        bias = int(np.clip(round(qi), 0, 255))
        # move the start so the rounded bias still lies on the exact line, unless that moves the
        # segment's boundary by more than a quarter of its length (a nearly flat segment: then the
        # rounded bias costs at most half an output step)
        move = (bias - qi) / slope if abs(slope) > 1e-30 else np.inf
        start = v0 + move if abs(move) <= 0.25 * (kx[i + 1] - kx[i]) * s_v else v0
        start = int(max(prev, min(round(start), (1 << 35) - 2)))
        mul, sh = fixed_mul(slope, 16, ACT_SHIFT_MAX)
        if mul < 0 and sh > 0:
            # T = (V - start)·mul < 0 here, and the vendor carry-shift (docs/kpu.md#activation-rules, nncase v0.2)
            # gives floor - 1 above a half: errors in (-2, 0]; one more in the bias centres them
            bias = min(bias + 1, 255)
        starts.append(start)
        muls.append(mul)
        shifts.append(sh)
        biases.append(bias)
        prev = start
    if top is not None:   # the saturated top: one flat segment at its exact output
        starts.append(int(max(prev, min(round(b * s_v), (1 << 35) - 2))))
        muls.append(0)
        shifts.append(0)
        biases.append(top)
    return act_table(starts, muls, shifts, biases)


def act_table(starts, muls, shifts, biases) -> dict:
    """The KPU activation table of these segments, its unused segments padded with unreachable
    starts at the top (the last output held)."""
    n = hw.ACT_SEGMENTS - len(starts)
    return {"x_start": np.array(list(starts) + [(1 << 35) - 1] * n, np.int64),
            "y_mul": np.array(list(muls) + [0] * n, np.int64),
            "shift_number": np.array(list(shifts) + [0] * n, np.int64),
            "bias": np.array(list(biases) + [biases[-1]] * n, np.uint8)}

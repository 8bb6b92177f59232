"""Float reference and activation-range calibration through onnxruntime.

Every intermediate float tensor of the IR graph (including a fused Conv's internal stages, see
graph.stage_names) is exposed as an output, so one session run gives all per-layer values.

  stats = collect(graph, batches)           # {tensor: TensorStats}, two passes over the data
  rngs = ranges(stats, "kld")               # {tensor: (lo, hi)}; "minmax" | "percentile" | "kld" | "mse"
  ref = float_reference(graph, x)           # {tensor: ndarray} for one input

The float graph's values differ in their last bits from one CPU to another (onnxruntime's and
BLAS's kernels sum in the order their SIMD width gives), and a kmodel built from ranges that
differ so would differ too (825 bytes of the zoo face detector for a 1e-6 relative noise). So each
range is rounded outward to a grid of 1/2**SNAP_BITS of its largest magnitude's power of two
(`snap`): the same kmodel on every machine unless a bound falls within that noise of a grid
line, for at most about 2/2**SNAP_BITS of wider range (0.07 dB of SQNR at worst).
"""
import math
from dataclasses import dataclass

import numpy as np

from tl2k210.graph import MOVES, FloatSession, describe, stage_names, to_onnx

BINS = 2048
SNAP_BITS = 8
SNAP_SLACK = 2.0 ** -10    # of a grid step
METHODS = ("minmax", "percentile", "kld", "mse")


class FloatRunner:
    """An onnxruntime session over a Graph with all intermediate tensors exposed."""

    def __init__(self, graph, expose_all=True):
        self.sess = FloatSession(to_onnx(graph, expose_all=expose_all))
        self.names = [o.name for o in self.sess.get_outputs()]
        self.inputs = list(graph.inputs)

    def __call__(self, x):
        feeds = x if isinstance(x, dict) else {self.inputs[0]: np.asarray(x, np.float32)}
        return {**feeds, **dict(zip(self.names, self.sess.run(self.names, feeds)))}


def float_reference(graph, x):
    """{tensor_name: float ndarray} of every tensor (inputs included) for one input
    (an array or {input_name: array})."""
    return FloatRunner(graph)(x)


@dataclass
class TensorStats:
    lo: float
    hi: float
    count: int = 0
    hist: np.ndarray = None       # BINS over [lo, hi]
    abs_hist: np.ndarray = None   # BINS over [0, max(|lo|, |hi|)]

    @property
    def amax(self):
        return max(abs(self.lo), abs(self.hi))


def collect(graph, batches, histograms=True):
    """Run the float graph over `batches` (iterable of inputs: arrays or {input: array}) and
    return {tensor_name: TensorStats}. Pass 1: min/max; pass 2: value and |value| histograms."""
    run = FloatRunner(graph)
    batches = batches if isinstance(batches, (list, tuple)) else list(batches)  # read twice
    stats = {}
    for x in batches:
        for k, v in run(x).items():
            if v.dtype.kind != "f" or v.size == 0:
                continue
            s = stats.get(k)
            lo, hi = float(v.min()), float(v.max())
            if not (np.isfinite(lo) and np.isfinite(hi)):
                _non_finite(graph, k, v, run(x))
            if s is None:
                stats[k] = TensorStats(lo, hi, v.size)
            else:
                s.lo, s.hi, s.count = min(s.lo, lo), max(s.hi, hi), s.count + v.size
    if not stats:
        raise ValueError("calibration dataset is empty")
    for s in stats.values():
        s.lo, s.hi = snap(s.lo, s.hi)
    if histograms:
        for s in stats.values():
            s.hist, s.abs_hist = np.zeros(BINS, np.int64), np.zeros(BINS, np.int64)
        for x in batches:
            for k, v in run(x).items():
                s = stats.get(k)
                if s is None:
                    continue
                v = v.ravel()
                if s.hi > s.lo:     # one value everywhere (a constant map) takes its min/max (ranges)
                    s.hist += np.histogram(v, BINS, (s.lo, s.hi))[0]
                s.abs_hist += np.histogram(np.abs(v), BINS, (0, s.amax if s.amax > 0 else 1e-12))[0]
    return stats


def snap(lo: float, hi: float, bits: int = SNAP_BITS) -> tuple[float, float]:
    """(lo, hi) rounded outward to multiples of 2**(e - bits), 2**e the power of two at or below
    max(|lo|, |hi|): exact bounds (0, 6, a power of two) stay, and values that differ only by a
    CPU's summation order land on the same grid line."""
    step = _grid(max(abs(lo), abs(hi)), bits)
    if step is None:
        return lo, hi
    # a bound a hair past a grid line (6.0000005 for a ReLU6's 6) is that line: the noise
    # straddles a line where the values are not round, not at the round values models are full of
    return math.floor(lo / step + SNAP_SLACK) * step, math.ceil(hi / step - SNAP_SLACK) * step


def snap_values(v: np.ndarray, bits: int = SNAP_BITS) -> np.ndarray:
    """`v` rounded to the nearest multiple of 2**(e - bits), 2**e the power of two at or below
    max|v|: per-channel statistics (bias correction's means) made the same on every CPU."""
    step = _grid(float(np.max(np.abs(v), initial=0.0)), bits)
    return v if step is None else np.round(v / step) * step


def _grid(amax: float, bits: int) -> float | None:
    """2**(e - bits), 2**e the power of two at or below amax (None for 0 or not finite)."""
    return math.ldexp(1.0, math.frexp(amax)[1] - 1 - bits) if amax and math.isfinite(amax) else None


def _non_finite(graph, name, v, values):
    """Refuse a calibration sample that drives a tensor to NaN/inf (sqrt or log of negatives,
    a division by zero): no 8-bit range holds it. Names the node, its op and its input range."""
    from tl2k210.errors import Tl2k210Error

    def bad_at(t):
        a = values.get(t)
        return a is not None and a.dtype.kind == "f" and not np.isfinite(a).all()
    # where it starts: the first node in graph order whose output is not finite (a concat of NaNs
    # only passes them on: OpenCV's res10 SSD, whose NaNs start at a division)
    first = next((o for n in graph.nodes for o in n.outputs if bad_at(o)), None)
    name, v = (first, values[first]) if first is not None else (name, v)
    node = graph.producer(name)
    where = f"input {name!r}" if node is None else f"node {node.name!r} ({describe(node)})"
    ins = [] if node is None else [values[i] for i in node.inputs if i in values and graph.const(i) is None]
    ins = [a for a in ins if np.isfinite(a).any()]
    rng = "".join(f"; its input spans {float(np.nanmin(a)):.4g}..{float(np.nanmax(a)):.4g}" for a in ins[:1])
    bad = "NaN" if np.isnan(v).any() else "inf"
    consts = [] if node is None else [(i, graph.const(i)) for i in node.inputs if i and graph.const(i) is not None]
    broken = [(i, c) for i, c in consts if np.asarray(c).dtype.kind == "f" and not np.isfinite(c).all()]
    if broken:      # the model's own numbers (a batch norm folded with a negative variance)
        i, c = broken[0]
        raise Tl2k210Error(f"{where} gives {bad} on the calibration data: its constant {i!r} holds "
                           f"{int(np.size(c) - np.isfinite(c).sum())} of {np.size(c)} values that are not "
                           "finite (e.g. a batch norm's negative variance): the model file's weights are "
                           "broken there; export it again")
    raise Tl2k210Error(f"{where} gives {bad} on the calibration data{rng}: no 8-bit range holds "
                       "it. Calibrate with data inside the op's domain, or clamp its input in the model "
                       "(e.g. Relu/Clip before Sqrt or Log, an epsilon before a division)")


def _percentile(s, p):
    edges = np.linspace(s.lo, s.hi, BINS + 1)
    cdf = np.cumsum(s.hist) / max(1, s.hist.sum())
    lo = edges[np.searchsorted(cdf, (100 - p) / 100, side="left")]
    hi = edges[min(BINS, np.searchsorted(cdf, p / 100, side="left") + 1)]
    return float(lo), float(hi)


def kld_threshold(abs_hist, amax, levels=128):
    """TensorRT-style entropy calibration: the |x| clipping threshold whose `levels`-bin
    quantized distribution has the least KL divergence from the clipped reference."""
    hist = abs_hist.astype(np.float64)
    n = len(hist)
    if hist.sum() == 0 or amax == 0:
        return amax
    best, best_i = np.inf, n
    for i in range(levels, n + 1, max(1, n // 256)):
        p = hist[:i].copy()
        p[-1] += hist[i:].sum()
        idx = np.arange(i) * levels // i  # bin -> quantization level
        sums = np.bincount(idx, weights=hist[:i], minlength=levels)
        nz = np.bincount(idx, weights=(hist[:i] > 0), minlength=levels)
        q = np.where(hist[:i] > 0, sums[idx] / np.maximum(nz[idx], 1), 0.0)
        ps, qs = p.sum(), q.sum()
        if qs == 0:
            continue
        p, q = p / ps, q / qs
        m = p > 0
        kl = np.sum(p[m] * np.log(p[m] / np.maximum(q[m], 1e-12)))
        if kl < best:
            best, best_i = kl, i
    return amax * best_i / n


def mse_range(s, levels=255, steps=64):
    """The clipped range [lo, hi] of the minmax range scaled by c (0.25 <= c <= 1; a tensor that
    never goes below 0 keeps lo = 0) whose uniform `levels`-step quantizer has the least expected
    squared error over the value histogram: rounding (step^2 / 12 per value inside the range)
    plus clipping (distance to the range for values outside). nncase v0.2's `l2` method asks the
    same question."""
    edges = np.linspace(s.lo, s.hi, BINS + 1)
    x, h = (edges[:-1] + edges[1:]) / 2, s.hist.astype(np.float64)
    best, best_r = np.inf, (s.lo, s.hi)
    for c in np.linspace(0.25, 1.0, steps):
        lo, hi = (s.lo * c if s.lo < 0 else s.lo), s.hi * c if s.hi > 0 else s.hi
        if hi <= lo:
            continue
        step = (hi - lo) / levels
        clip = np.clip(x, lo, hi)
        err = np.sum(h * ((x - clip) ** 2 + np.where(x == clip, step * step / 12, 0.0)))
        if err < best:
            best, best_r = err, (float(lo), float(hi))
    return best_r


def ranges(stats, method="minmax", percentile=99.99):
    """{tensor: (lo, hi)} from collected stats. minmax: the union range; percentile: the p / 100-p
    percentiles of the values; kld: the minmax range clipped to the KL-optimal |x| threshold; mse:
    the clipping with the least expected squared quantization error (mse_range)."""
    if method not in METHODS:
        raise ValueError(f"unknown calibration method {method!r}; choose from {METHODS}")
    out = {}
    for k, s in stats.items():
        if method == "minmax" or s.hist is None or s.hi == s.lo:
            out[k] = (s.lo, s.hi)
        elif method == "percentile":
            out[k] = _percentile(s, percentile)
        elif method == "mse":
            out[k] = mse_range(s)
        else:
            h = s.abs_hist
            if s.lo >= 0:  # ReLU-like: the spike of exact zeros says nothing about the clip point
                h = h.copy()
                h[0] = 0
            t = kld_threshold(h, s.amax, 255 if s.lo >= 0 else 128)
            out[k] = (max(s.lo, -t), min(s.hi, t))
    return out


#: ops whose output holds some of their first input's values (picked)
PICKS = ("Split", "Slice")
#: elementwise activations whose output is bounded: a model output they write is a score, a
#: probability (a Softmax output is the runtime's float SOFTMAX: no grid to widen)
BOUNDED = {"Sigmoid": (0.0, 1.0), "HardSigmoid": (0.0, 1.0), "Tanh": (-1.0, 1.0)}


def _reach(act: dict):
    """(lo, hi): the inputs beyond which the bounded activation `act` is within half a uint8 step
    of its bounds."""
    op = act["op"]
    if op == "HardSigmoid":
        a, b = act.get("alpha", 0.2), act.get("beta", 0.5)
        return -b / a, (1 - b) / a
    e = math.log(2 * 255 - 1) if op == "Sigmoid" else math.atanh(1 - 1 / 255)
    return -e, e


def bounded_outputs(graph, ranges, own=()) -> dict:
    """Give each model output that a bounded activation writes (fused into its conv or not,
    through moves) the activation's whole range, and what the activation reads (through moves
    and picks, back to the conv that writes the logits) the inputs that reach it, unless the
    model states them (`own`): calibration photos whose objects score low leave a detector's
    logits a small maximum, above which every score clips (NanoDet-m: at 0.29, where a person
    scores 0.42 and the threshold is 0.35). Returns {output: calibrated range} of those widened."""
    def back(t, through):
        path = [t]
        while (p := graph.producer(t)) is not None and p.op in through:
            t = p.inputs[0]
            path.append(t)
        return path, p
    out = {}
    for y in graph.outputs:
        path, p = back(y, MOVES)
        if p is None:
            continue
        fused = p.attrs.get("activation") if p.op == "Conv" and not p.attrs.get("pool") else None
        act = {"op": p.op, **p.attrs} if p.op in BOUNDED else fused
        if act is None or act["op"] not in BOUNDED:
            continue
        reads = [stage_names(p)["conv"]] if fused else back(p.inputs[0], MOVES + PICKS)[0]
        if any(m in own or m not in ranges for m in path + reads):
            continue
        lo, hi = ranges[y]
        wide = (min(lo, BOUNDED[act["op"]][0]), max(hi, BOUNDED[act["op"]][1]))
        if wide == (lo, hi):
            continue
        out[y] = (lo, hi)
        ranges.update({m: wide for m in path})
        reach = _reach(act)
        for m in reads:
            a, b = ranges[m]
            ranges[m] = (min(a, reach[0]) if a < 0 else a, max(b, reach[1]))
    return out


def compare_graphs(ref_graph, test_graph, batches):
    """Per-output SQNR (dB) and cosine of `test_graph` vs `ref_graph` over `batches` (e.g. to
    report what the opt-in kpu_padding rewrite cost)."""
    from .metrics import cosine, sqnr_db
    ref_run, test_run = FloatRunner(ref_graph, False), FloatRunner(test_graph, False)
    refs, tests = {}, {}
    for x in batches:
        r, t = ref_run(x), test_run(x)
        for k in ref_graph.outputs:
            refs.setdefault(k, []).append(r[k])
            tests.setdefault(k, []).append(t[k])
    return {k: {"sqnr_db": sqnr_db(np.stack(refs[k]), np.stack(tests[k])),
                "cosine": cosine(np.stack(refs[k]), np.stack(tests[k]))} for k in refs}

"""Convolutions and matrix products the KPU cannot run, on the K210's CPU (kmodel v4).

* `quantized_conv2d` (uint8, any kernel / stride / dilation / groups / padding): per-layer uint8
  weights w = s_w (q - z_w), int32 bias in accumulator units, acc = bias + sum (x - z_x)(w - z_w),
  output = mul_and_carry_shift(acc, m, k) + z_y with m / 2^k = s_x s_w / s_y (31-bit multiplier; the
  product stays inside int64). A ReLU / Clip(0, b) is the uint8 clamp of the activation's range
  (or, on a quantized model's own grid that reaches past the bounds, a clamp table after it:
  cpu.clamp_after); any other activation is a 256-entry table after it; a fused pool runs after that.
  Refused (float conv2d instead) when per-layer uint8 weights lose too much: an SQNR of the
  weights below WEIGHT_SQNR_MIN dB (nncase v0.2 falls back to float on a weight range > 32).
* `conv2d` (float32, the same op set) with the ReLU/Clip as its fused clamp and other activations
  as an NNIL method after it.
* `conv2d_transpose` (float; the v0.2 kernel ignores its bias: a broadcast add follows).
* `matmul` of two activations (attention-style products) and `quantized_matmul` for dense layers
  wider than the KPU's 1024 channels, its activation (Swish, HardSwish, Sigmoid, ...: any function
  of one value) a 256-entry table after it like the uint8 conv's (`activation_after`).
"""
from __future__ import annotations

import hashlib

import numpy as np

from tl2k210.graph import stage_names
from tl2k210.memo import memoised
from tl2k210.passes.conv_transpose import convt_pads
from tl2k210.passes.fuse_activation import activation_node
from tl2k210.k210 import cost, fixed_point as fx
from tl2k210.k210 import hardware as hw
from tl2k210.quantize.bias_correction import mean_shift
from tl2k210.quantize.fake_quant import float_head
from tl2k210.quantize.metrics import sqnr_db
from tl2k210.quantize.uniform import uint8_grid

from .cpu import clamp_after, table
from .conv import dense_matrix, grouped_dense, is_dense
from .fc import dense_cycles, dense_rows, feeds_output, float_fc_refuses, source_unit
from .kxk import forms, phase_forms
from .registry import CPU_F32, CPU_U8, NA, lowering
from .state import SMALLER_TAKEN, wants_small
from .v4elementwise import g4, nnil_ops
from .v4emit import BYTES, F32, NO_CLAMP, U8, Const, float_clamp, main, nnil_code, pixel_fold
from .v4ops import _pool_pads, window_pool
from .v4resize import resize_as_mean

WEIGHT_SQNR_MIN = 30.0          # dB of per-layer uint8 weights below which the float conv is chosen
WEIGHT_PARTS_MAX = 12           # quantized_conv2d nodes (each its own weight scale) one conv may take
PARTS_DB = 1.0                  # how far below per-channel weights a conv's worst channel may stay
PARTS_ENOUGH_DB = 38.0          # weights this good stay one node (below the 8-bit maps' own rounding)
ACC_TAPS_MAX = (2 ** 31 - 1) // (255 * 255)   # taps per output that keep the int32 accumulator exact
GRID_PROBE = 50                 # weights own_grid checks before the rest (no hardware fact)


def own_grid(w) -> tuple[float, int] | None:
    """(step s, zero point z) of the one 8-bit grid `w` lies on (a quantized model's own weights:
    w = s·(q - z), q in 0..255), or None: the symmetric int8 grid (z 128; the largest weight ±127
    or -128 steps) or an asymmetric one (TOCO's uint8 weights: `uniform.uint8_grid`). All zeros
    lie on every grid (step 1)."""
    w = np.asarray(w, np.float64).ravel()
    amax = float(np.abs(w).max()) if w.size else 0.0
    if w.size and amax == 0:
        return 1.0, 128
    for s in (amax / 127, amax / 128) if amax > 0 else ():
        for part in (w[:GRID_PROBE], w):     # float weights fail on the first few: the lowering asks often
            q = np.rint(part / s)
            if q.min() < -128 or q.max() > 127 or float(np.abs(q * s - part).max()) > 1e-5 * amax:
                break
        else:
            return s, 128
    grid = uint8_grid(w) if amax > 0 else None
    if grid is not None and float(np.abs(np.rint(w / grid[0]) * grid[0] - w).max()) <= 1e-5 * amax:
        return grid[0], -grid[1]
    return None


def _grid_parts(flat) -> list | None:
    """[(i, j)]: the fewest contiguous runs of rows of `flat` that each lie on one 8-bit grid (the
    model's own per-axis weights; weight_parts asks about one grid for the whole first), or None
    where a row is on none."""
    parts, i, n = [], 0, len(flat)
    while i < n:
        if own_grid(flat[i]) is None:
            # a near-dead row the quantizer gave a floor scale (ST's int8 SSD head: largest
            # weight 2.8e-6, a few steps) rounds to zeros on a neighbour's grid: it joins that run
            if i + 1 < n and own_grid(flat[i:i + 2]) is not None:
                pass
            elif parts and own_grid(flat[parts[-1][0]:i + 1]) is not None:
                parts[-1], i = (parts[-1][0], i + 1), i + 1
                continue
            else:
                return None
        j = i + 1
        while j < n and own_grid(flat[i:j + 1]) is not None:
            j += 1
        parts.append((i, j))
        i = j
    return parts


def _conv_refuses_common(g, node):
    if len(g.shape(node.inputs[0])) != 4 or len(tuple(node.attrs.get("kernel", ()))) != 2:
        return "only 2-D convolutions"
    return None


def _weights_key(W, groups=None):
    """The memo key of a question about a conv's weights: their bytes, and the split's limits
    (tests change them)."""
    W = np.ascontiguousarray(W, np.float64)
    return (W.shape, groups, WEIGHT_PARTS_MAX, PARTS_DB, PARTS_ENOUGH_DB, WEIGHT_SQNR_MIN,
            hashlib.blake2b(W.tobytes()).digest())


@memoised(_weights_key)     # the plan lowers a model tens of times: the same weights each time
def weight_parts(W, groups) -> list:
    """Contiguous output-channel ranges [(o0, o1)] of a conv's weights (Co, Ci/groups, kh, kw), each
    to be one quantized_conv2d with its own uint8 (scale, zero point): the runtime's weights are
    per layer, so channels whose ranges differ (batch norm folded in) are split where that keeps
    their worst channel within PARTS_DB of per-channel weights (PARTS_ENOUGH_DB is enough), in
    at most WEIGHT_PARTS_MAX nodes; a grouped or depthwise one, whose nodes each read only their
    own groups' channels, takes as many as keep WEIGHT_SQNR_MIN where that many do not (MediaPipe's
    pose detector: 12 nodes kept 0.0 dB of a 672-channel 5x5 depthwise conv's worst channel;
    PicoDet's 5x5 depthwise convs, 48-96 channels: 11-14 dB in one node, 20-25 in 12, 30 in 12-36,
    a few KB where their KPU shift stages store 52-77 KB); a quantized model's own integers too,
    where they lie on more grids than WEIGHT_PARTS_MAX nodes hold (onnxruntime's per-channel QDQ
    of a 576-channel 5x5 depthwise conv: a grid a channel; the float conv2d that keeps them
    exactly reads and writes float maps, 2.3 MB each there, and its KPU shift stages 3.7 MB of
    weights: a PAN segmenter needed 9.3 MB for an ideal of 3.06 MB).
    A range is whole groups of a grouped conv (1 channel of a depthwise one). Chosen on the
    rounding-noise model step^2/12; weight_sqnr measures the result. Weights that are a quantized
    model's own integers keep them: one range per run of channels on one 8-bit grid, where that
    takes at most WEIGHT_PARTS_MAX nodes."""
    W = np.asarray(W, np.float64)
    co = W.shape[0]
    unit = co // groups if groups > 1 else 1
    n = co // unit
    flat = W.reshape(n, -1)
    own = [(0, n)] if own_grid(flat) is not None else _grid_parts(flat)
    if own is not None and len(own) <= WEIGHT_PARTS_MAX:
        return [(i * unit, j * unit) for i, j in own]
    lo, hi = np.minimum(flat.min(axis=1), 0.0), np.maximum(flat.max(axis=1), 0.0)
    pw = (W.reshape(co, -1) ** 2).mean(axis=1)
    pw = np.where(pw > 0, pw, np.inf).reshape(n, unit).min(axis=1)

    def db(p, a, b):
        return 10 * np.log10(p * 12 * 255.0 ** 2 / max(b - a, 1e-30) ** 2) if np.isfinite(p) else np.inf

    def greedy(t):
        parts, i = [], 0
        while i < n:
            a, b, p, j = lo[i], hi[i], pw[i], i + 1
            while j < n and db(min(p, pw[j]), min(a, lo[j]), max(b, hi[j])) >= t:
                a, b, p, j = min(a, lo[j]), max(b, hi[j]), min(p, pw[j]), j + 1
            parts.append((i, j))
            i = j
        return parts
    one = db(pw.min(), lo.min(), hi.max())
    goal = min(min(db(pw[u], lo[u], hi[u]) for u in range(n)) - PARTS_DB, PARTS_ENOUGH_DB)
    if one >= goal:
        return [(0, co)]
    a, b = one, goal
    for _ in range(24):          # the highest worst-channel SQNR reachable in WEIGHT_PARTS_MAX parts
        t = (a + b) / 2
        a, b = (t, b) if len(greedy(t)) <= WEIGHT_PARTS_MAX else (a, t)
    if a < WEIGHT_SQNR_MIN and groups > 1:
        # grouped: a node reads only its own groups' channels, so as many nodes as keep
        # WEIGHT_SQNR_MIN, measured (the noise model is an estimate), or as per-group ranges keep
        t = min(goal, WEIGHT_SQNR_MIN)
        while True:
            parts = [(i * unit, j * unit) for i, j in greedy(t)]
            if t >= goal or _worst_db(W, parts) >= WEIGHT_SQNR_MIN:
                return parts
            t = min(t + 0.1, goal)
    return [(i * unit, j * unit) for i, j in greedy(a)]


def _on_grids(W, parts) -> bool:
    return all(own_grid(W[o0:o1]) is not None for o0, o1 in parts)


def _scales(parts, what, exact) -> str:
    """How a CPU conv's or dense layer's weights are stored, for its receipt (`exact`: _on_grids)."""
    if exact:
        return f"on the model's own 8-bit grid{'s' if len(parts) > 1 else ''}, exactly, in {len(parts)} node(s)"
    return "per layer" if len(parts) == 1 else f"in {len(parts)} {what} ranges of their own scale"


def quantize_parts(W, parts):
    """[(o0, o1, scale, zero point, uint8 weights)] of `W` quantized per part (a part on an int8
    grid: that grid, exactly)."""
    out = []
    for o0, o1 in parts:
        w = W[o0:o1]
        s, z = own_grid(w) or fx.qparams(w.min(), w.max())
        out.append((o0, o1, s, z, np.clip(np.rint(w / s + z), 0, 255).astype(np.uint8)))
    return out


@memoised(_weights_key)
def weight_sqnr(W, groups=None) -> float:
    """SQNR (dB) of uint8 weights, per layer (groups None: one scale, as quantized_matmul) or in
    the conv's `weight_parts`, for the output channel they serve worst (one large channel must
    not hide the ones rounded to nothing)."""
    W = np.asarray(W, np.float64)
    return _worst_db(W, [(0, W.shape[0])] if groups is None else weight_parts(W, groups))


def _worst_db(W, parts) -> float:
    """The SQNR (dB) of the output channel `W`'s uint8 weights in `parts` serve worst."""
    q = np.concatenate([(wq.astype(np.float64) - z) * s for _, _, s, z, wq in quantize_parts(W, parts)])
    per = [sqnr_db(W[o].reshape(-1), q[o].reshape(-1)) for o in range(W.shape[0]) if np.any(W[o])]
    return float(min(per)) if per else float("inf")


def _fc_only(g, node) -> bool:
    """A dense layer of one group: fc.py's forms (and _dense_weights' matmuls), not a conv's."""
    return node.op != "Conv" or (is_dense(g, node) and not grouped_dense(g, node))


def qconv_refuses(g, node, opts):
    if _fc_only(g, node):
        return NA
    why = _conv_refuses_common(g, node)
    if why:
        return why
    W = g.const(node.inputs[1])
    taps = int(np.prod(W.shape[1:]))
    if taps > ACC_TAPS_MAX:
        return f"{taps} taps per output overflow the int32 accumulator (at most {ACC_TAPS_MAX:,})"
    q = weight_sqnr(W, int(node.attrs.get("group", 1)))
    if q < WEIGHT_SQNR_MIN and not (wants_small(opts, node) and _banded(g, node)):
        return (f"per-layer uint8 weights keep only {q:.1f} dB of the weights of the output channel they serve "
                f"worst (spread {float(np.max(np.abs(W))):.3g} / {float(np.std(W)):.3g}): the float conv2d keeps them")
    return None


def _banded(g, node) -> bool:
    """Is the conv's input taller than the KPU's rows (its KPU form: row bands and an assembled
    map in main memory, which the CPU conv does not take)?"""
    return g.shape(node.inputs[0])[2] > hw.LIMITS["in_h"][1]


def cpu_trade(g, node, opts) -> bool:
    """Is the uint8 CPU quantized_conv2d the smaller form a KPU conv yields to? A byte a weight,
    where the KPU adds per-channel args, activation tables, batch norm and 256-B alignment to each
    layer (kpu_conv; a group conv as block-diagonal tiles) or stores the weights several times
    (kxk.py's shift stages); the plan keeps it only where the model shrinks (fit.choose_forms).
    When the plan asks for the node's smaller form (wants_small) in kmodel v4 and per-layer uint8
    weights keep WEIGHT_SQNR_MIN dB of the weights: the trade gives up speed, never accuracy
    (except for an input taller than the KPU's rows: its KPU form's row bands and assembled map
    take main memory the CPU conv does not, so to fit a runtime the CPU conv is the only smaller
    form, whatever its weights keep; the receipt's trade line gives their dB). Not
    a dense or depthwise 3x3 stride-2 conv with 'stride-2 phases' forms: its smaller form is the
    stride-1 map + CPU pick, its weights once in one KPU layer (the CPU conv would be ~40x
    slower); a grouped one's stride-1 map runs as block-diagonal tiles, each a KPU layer with its
    own 256-aligned BN, activation and weight blocks (conv.py), so its smaller form is this one.
    Nor a float head (float_head_why): float for its output's accuracy, a few weights.
    A grouped conv with one output pixel a channel takes it also where it is the faster form
    (_cpu_faster_why)."""
    if getattr(opts, "format", "v3") != "v4" or node.op != "Conv":
        return False
    if _cpu_faster_why(g, node, opts):
        return qconv_refuses(g, node, opts) is None
    if not wants_small(opts, node):
        return False
    (_, ci, _, _), co = g.shape(node.inputs[0]), g.shape(node.outputs[0])[1]
    groups = int(node.attrs.get("group", 1))
    if phase_forms(g, node, "v4") and (groups == 1 or groups == ci == co):
        return False
    if float_head_why(g, node, opts):      # kept float for the output's accuracy: a few weights
        return False
    return qconv_refuses(g, node, opts) is None


def _cpu_faster_why(g, node, opts):
    """Why the uint8 CPU conv of a grouped conv with one output pixel a channel is faster than its
    KPU forms, or None: a grouped dense layer (conv.grouped_dense), where the KPU's dense layer
    multiplies the whole block-diagonal matrix (fc.dense_cycles), or a kernel over the whole map
    (MobileFaceNet-style 'GDC' heads: a 7x7 depthwise conv on the 7x7 map), where the KPU's shift
    stages (kxk.py) compute every pixel of the map to keep one: a face-quality net's group-50 7x7
    conv took 760 KB and 1.43 M cycles for 10 KB of weights."""
    if node.op != "Conv" or int(node.attrs.get("group", 1)) == 1:
        return None
    (_, ci, h, w), (_, co, oh, ow) = g.shape(node.inputs[0]), g.shape(node.outputs[0])
    groups, (kh, kw) = int(node.attrs["group"]), node.attrs["kernel"]
    cpu = cost.CPU_CYCLES["qmac"] * co * (ci // groups) * kh * kw
    if grouped_dense(g, node):
        if cpu < dense_cycles(ci, co, opts.weight_bits)[0]:
            return (f"group {groups} on a 1x1 map: quantized_conv2d multiplies and stores its {ci // groups} "
                    "weight(s) an output, the KPU dense layer the whole block-diagonal matrix")
        return None
    if (oh, ow) != (1, 1):
        return None
    alts = forms(g, node, "v4") or forms(g, node, "v4", windows=True)
    if alts and cpu < alts[0].cycles:
        return (f"group {groups}, one output pixel a channel: quantized_conv2d computes that pixel (est. "
                f"{cpu:,} cycles), the KPU's shift stages every pixel of the {h}x{w} map ({alts[0].cycles:,})")
    return None


def cpu_trade_why(g, node, opts):
    """registry `takes`: why quantized_conv2d goes before the KPU forms (cpu_trade), or None."""
    if not cpu_trade(g, node, opts):
        return None
    return _cpu_faster_why(g, node, opts) or \
        f"{SMALLER_TAKEN}: quantized_conv2d stores each weight once, a byte each"


def float_trade_why(g, node, opts):
    """registry `takes`: why the float conv2d is the smaller form of a K x K (or dilated) KPU conv,
    or None. Its shift stages store the kernel several times over (anilsathyan7's slimnet: a 3x3
    conv dilated by 8, 37 KiB of weights in 616 KiB), and where per-layer uint8 weights keep too
    little of them for quantized_conv2d (cpu_trade: some channels' weights are a few steps of
    the others'), four bytes a weight once is still the fewer; the plan keeps it only where the
    model shrinks (fit.choose_forms)."""
    if getattr(opts, "format", "v3") != "v4" or node.op != "Conv" or not wants_small(opts, node):
        return None
    a = node.attrs
    if max(a.get("kernel", (1, 1))) <= 3 and max(a.get("dilations", (1, 1))) == 1:
        return None
    if cpu_trade(g, node, opts) or fconv_refuses(g, node, opts) is not None:
        return None
    q = weight_sqnr(g.const(node.inputs[1]), int(a.get("group", 1)))
    return (f"{SMALLER_TAKEN}: uint8 weights would keep {q:.1f} dB, the float conv2d "
            "stores each weight once (4 bytes) where the KPU's shift stages store it several times")


def float_conv_why(g, node, opts):
    """registry `takes` of the float conv2d: a model output's head, or a K x K conv's smaller form."""
    return float_head_why(g, node, opts) or float_trade_why(g, node, opts)


def float_head_why(g, node, opts):
    """registry `takes`: why the float conv2d goes before the KPU and uint8 forms (a model
    output's logit head, fake_quant.float_head), or None."""
    if getattr(opts, "format", "v3") != "v4" or fconv_refuses(g, node, opts) is not None or not float_head(g, node):
        return None
    return ("a head of a Sigmoid model output: float keeps the large logits that uint8 would round "
            "and the sigmoid magnify")


def fconv_refuses(g, node, opts):
    if _fc_only(g, node):
        return NA
    why = _conv_refuses_common(g, node)
    if why:
        return why
    act = node.attrs.get("activation")
    if act and not float_clamp(act) and _act_nnil(g, act) is None:
        return f"activation {act['op']} has no float form on the CPU"
    return None


def _act_node(act):
    return activation_node(act, "x", "y", "act")


def _act_nnil(g, act):
    return nnil_ops(g, _act_node(act), True)


def _relu_like(act):
    """The activation is a clamp at 0 and maybe above (ReLU, Clip(0, b)): on an output grid that
    starts at 0 the uint8 clamp, else cpu.clamp_after's table."""
    if act is None:
        return True
    return act["op"] == "Relu" or (act["op"] == "Clip" and float(act.get("min", -np.inf)) == 0.0)


def trim_taps(W, pads, dilations=(1, 1)):
    """(W, pads) without the kernel's all-zero outer rows and columns where the padding on that
    side covers them (square_kernels' zero taps, for a conv the KPU did not take): a 2x2 conv
    made 3x3 for the KPU costs the CPU 4 taps, not 9. Exact: every output reads the same inputs."""
    t, l, b, r = pads
    dh, dw = dilations
    while W.shape[2] > 1 and t >= dh and not W[:, :, 0].any():
        W, t = W[:, :, 1:], t - dh
    while W.shape[2] > 1 and b >= dh and not W[:, :, -1].any():
        W, b = W[:, :, :-1], b - dh
    while W.shape[3] > 1 and l >= dw and not W[:, :, :, 0].any():
        W, l = W[:, :, :, 1:], l - dw
    while W.shape[3] > 1 and r >= dw and not W[:, :, :, -1].any():
        W, r = W[:, :, :, :-1], r - dw
    return W, [t, l, b, r]


def _trimmed_note(row, k0, W, pads):
    if tuple(W.shape[2:]) != tuple(k0):
        row.notes.append(f"kernel {k0[0]}x{k0[1]} -> {W.shape[2]}x{W.shape[3]}, pads {pads}: its all-zero outer taps "
                         "dropped (the same outputs)")


def _conv_fields(node, shape_in, co, kernel, pads):
    a = node.attrs
    kh, kw = kernel
    t, l, b, r = pads
    sh, sw = a["strides"]
    dh, dw = a.get("dilations", (1, 1))
    return dict(in_shape=shape_in, groups=int(a.get("group", 1)), out_channels=co, padding_h=(t, b),
                padding_w=(l, r), filter_h=kh, filter_w=kw, stride_h=sh, stride_w=sw, dilation_h=dh,
                dilation_w=dw)


def _pixel_fold(lw, x, W, B, groups, pads):
    """(W, B, z_x, raw pixel address, E[q - z_x] per channel or None) with the image
    preprocessing folded in (v4emit.pixel_fold), or None."""
    fold = pixel_fold(lw, x, pads)
    if fold is None:
        return None
    sc, resid, z, e = fold
    co, cig = W.shape[:2]
    ch = (np.arange(co)[:, None] // (co // groups)) * cig + np.arange(cig)[None, :]   # input channel of W[o, i]
    B = B + (W.sum(axis=(2, 3)) * resid[ch]).sum(axis=1)
    W = W * sc[ch][:, :, None, None]
    return W, B, z, lw.locs[x].pixels, e


@lowering("Conv", unit=CPU_U8, check=qconv_refuses, formats=("v4",), name="quantized_conv2d",
          takes=cpu_trade_why)
def quantized_conv(lw, node):
    x, w_name, b_name = node.inputs
    out = node.outputs[0]
    a = node.attrs
    st = stage_names(node)
    act, pool = a.get("activation"), a.get("pool")
    ci, h, w = lw.shape(x)
    W = np.asarray(lw.g.tensors[w_name].value, np.float64)
    B = np.asarray(lw.g.tensors[b_name].value, np.float64)
    co = W.shape[0]
    groups = int(a.get("group", 1))
    k0 = W.shape[2:]
    W, pads = trim_taps(W, a["pads"], a.get("dilations", (1, 1)))
    how = "the KPU cannot run"
    if cpu_trade(lw.g, node, lw.opts):
        how = (f"of {groups} groups on a 1x1 map, not a block-diagonal dense layer" if grouped_dense(lw.g, node)
               else f"of {groups} groups, one output pixel a channel, not shift stages over the map"
               if _cpu_faster_why(lw.g, node, lw.opts) else "in its smaller form")
    row = lw.row(node, f"conv{W.shape[2]}x{W.shape[3]} {how}: quantized_conv2d on uint8", in_shape=(ci, h, w),
                 out_shape=lw.shape(out))
    _trimmed_note(row, k0, W, pads)
    fold = _pixel_fold(lw, x, W, B, groups, pads)
    if fold is not None:
        W, B, z_x, src, mean = fold
        s_x = 1.0
        row.notes.append(f"input: pixels, preprocessing folded into weights (zero point {z_x})")
    else:
        src = lw.need_u8(x, row)
        s_x, z_x = lw.locs[x].quant
        mean = lw.opts.channel_means.get(x)
    parts = weight_parts(W, groups)
    exact = _on_grids(W, parts)
    scales = _scales(parts, "channel", exact) + ("" if exact else f", {weight_sqnr(W, groups):.1f} dB")
    if wants_small(lw.opts, node):       # the trade's receipt line says what the weights keep
        row.form = f"uint8 weights {scales}"
    q = quantize_parts(W, parts)
    cig = W.shape[1]
    ch = (np.arange(co)[:, None] // (co // groups)) * cig + np.arange(cig)[None, :]    # input channel of W[o, i]
    if mean is not None and not exact:   # remove the mean shift the weight rounding causes (kpu.quantize_layer's)
        B = B - mean_shift(np.concatenate([(wq.astype(np.float64) - z) * s for _, _, s, z, wq in q]) - W,
                           mean, groups)
        row.notes.append("bias corrected for weight rounding")
    direct = _relu_like(act)
    y_t = st["act"] if direct else st["conv"]
    s_y, z_y = lw.quant_of(y_t)
    final = not pool and direct
    name = out if final else y_t
    loc = lw.u8_out(name, (s_y, z_y), (co,) + _out_hw(lw, node, st, pool))
    hw_out = int(np.prod(loc.shape[1:]))
    idx = []
    for o0, o1, s_w, z_w, wq in q:       # one node per channel range: its input channels, its outputs
        c0, c1 = (0, ci) if groups == 1 else (ch[o0, 0], ch[o1 - 1, -1] + 1)
        f = _conv_fields(node, (1, c1 - c0, h, w), o1 - o0, W.shape[2:], pads)
        f.update(groups=1 if groups == 1 else (o1 - o0) // (co // groups),
                 input=main(U8, src + c0 * h * w, (c1 - c0) * h * w),
                 output=main(U8, loc.u8 + o0 * hw_out, (o1 - o0) * hw_out), input_offset=-z_x, filter_offset=-z_w,
                 output_offset=z_y)
        f["output_mul"], f["output_shift"] = fx.fixed_mul(s_x * s_w / s_y, 32, 62)
        bq = np.clip(np.rint(B[o0:o1] / (s_x * s_w)), -(2 ** 31), 2 ** 31 - 1).astype(np.int64)
        idx.append(lw.emit_v4("quantized_conv2d", f, row, data={"bias": bq, "weights": wq.reshape(-1)}))
    lw.trace_map[name] = (idx[0] if len(idx) == 1 else tuple(idx), "u8")
    row.macs = int(np.prod(loc.shape)) * int(np.prod(W.shape[1:]))
    row.weight_bytes = W.size + 4 * co
    row.notes.append(f"weights uint8 {scales}")
    if direct:
        clamp_after(lw, name, act, row)
    cur = name
    if not direct:
        cur = activation_after(lw, name, out if not pool else st["act"], act, row)
    if pool:
        window_pool(lw, cur, out, pool["kind"], (pool["size"],) * 2, (pool["stride"],) * 2,
                    list(pool.get("pads", [0, 0, 0, 0])), row)
        lw.main.free(f"{cur}:u8")


def activation_after(lw, src, dst, act, row):
    """`dst` = act(`src`) for a uint8 `src` just written by a CPU layer: one REQUANTIZE whose
    256-entry table maps each uint8 value of src's quantization to the nearest of dst's -- exact
    (to dst's rounding) for any function of one value, whatever the channel count; written over
    src (kmodel.v3/v4 IN_PLACE), which dies here."""
    s_in, z_in = lw.locs[src].quant
    so, zo = lw.quant_of(dst)
    shape = lw.locs[src].shape
    nxt = lw.in_place(None, dst, src, (so, zo)) or lw.u8_out(dst, (so, zo), shape)
    f, _ = fx.act_function(act)
    with np.errstate(over="ignore"):
        tab = table(f, s_in, z_in, so, zo)
    lw.emit("REQUANTIZE", dict(flags=1, main_mem_in_address=lw.locs[src].u8, main_mem_out_address=nxt.u8,
                               count=int(np.prod(shape))), row, data={"table": tab})
    lw.traced(dst, "u8")
    row.notes.append(f"{act['op']} as a 256-entry table (exact on the uint8 grid)")
    lw.main.free(f"{src}:u8")
    return dst


def _out_hw(lw, node, st, pool):
    """H, W of the conv before its fused pool (the pre-pool stage tensor's shape)."""
    if not pool:
        return tuple(lw.shape(node.outputs[0])[1:])
    a = node.attrs
    _, h, w = lw.shape(node.inputs[0])
    kh, kw = a["kernel"]
    t, l, b, r = a["pads"]
    sh, sw = a["strides"]
    dh, dw = a.get("dilations", (1, 1))
    return ((h + t + b - (kh - 1) * dh - 1) // sh + 1, (w + l + r - (kw - 1) * dw - 1) // sw + 1)


@lowering("Conv", unit=CPU_F32, check=fconv_refuses, formats=("v4",), name="conv2d", takes=float_conv_why)
def float_conv(lw, node):
    x, w_name, b_name = node.inputs
    out = node.outputs[0]
    a = node.attrs
    st = stage_names(node)
    act, pool = a.get("activation"), a.get("pool")
    ci, h, w = lw.shape(x)
    W = np.asarray(lw.g.tensors[w_name].value, np.float32)
    B = np.asarray(lw.g.tensors[b_name].value, np.float32)
    co = W.shape[0]
    k0 = W.shape[2:]
    W, pads = trim_taps(W, a["pads"], a.get("dilations", (1, 1)))
    why = "a Sigmoid output's head" if float_head(lw.g, node) else "the KPU cannot run"
    row = lw.row(node, f"conv{W.shape[2]}x{W.shape[3]} {why}: float conv2d",
                 in_shape=(ci, h, w), out_shape=lw.shape(out))
    _trimmed_note(row, k0, W, pads)
    src = lw.need_f32(x, row)
    clamp = float_clamp(act)
    hw_ = _out_hw(lw, node, st, pool)
    name = out if not pool else st["act"]
    n = co * hw_[0] * hw_[1]
    pre = lw.alloc(name, "pre", 4 * n) if clamp is None else None   # the activation reads it
    loc = lw.f32_out(name, (co,) + hw_)
    f = _conv_fields(node, (1, ci, h, w), co, W.shape[2:], pads)
    f.update(input=main(F32, src, ci * h * w), output=main(F32, loc.f32 if pre is None else pre, n),
             fused_activation=clamp if clamp is not None else NO_CLAMP)
    lw.emit_v4("conv2d", f, row, data={"weights": W.reshape(-1), "bias": B})
    row.macs = n * int(np.prod(W.shape[1:]))
    row.weight_bytes = 4 * (W.size + co)
    if clamp is None:
        code = _act_nnil(lw.g, act)
        lw.emit_v4("nnil_unary_method", dict(input=main(F32, pre, n), output=main(F32, loc.f32, n)), row,
                   data={"code": nnil_code(*(code if "lda_0" in code else ["lda_0"] + code), "ret")})
        lw.main.free(f"{name}:pre")
        row.notes.append(f"{act['op']} as an NNIL method")
    lw.traced(name, "f32")
    if pool:
        window_pool(lw, name, out, pool["kind"], (pool["size"],) * 2, (pool["stride"],) * 2,
                    list(pool.get("pads", [0, 0, 0, 0])), row, dtype=F32)
        lw.main.free(f"{name}:f32")


# ---------------------------------------------------------------------------------------------
def _mean_window(g, node):
    """(kernel, strides, pads, dilations) of an AveragePool / GlobalAveragePool."""
    if node.op == "GlobalAveragePool":
        return tuple(g.shape(node.inputs[0])[2:]), (1, 1), [0, 0, 0, 0], (1, 1)
    a = node.attrs
    return (tuple(a["kernel_shape"]), tuple(a.get("strides", (1, 1))), _pool_pads(g, node),
            tuple(a.get("dilations", (1, 1))))


def qmean_refuses(g, node, opts):
    if len(g.shape(node.inputs[0])) != 4 or node.op == "AveragePool" and len(node.attrs.get("kernel_shape", ())) != 2:
        return "only 2-D pools"
    a = node.attrs
    if a.get("ceil_mode"):
        return "ceil_mode: the last windows divide by the taps inside the map"
    k, _, pads, _ = _mean_window(g, node)
    if any(pads) and not a.get("count_include_pad", 0):
        return "padded, count_include_pad=0: the border windows divide by the taps inside the map"
    if k[0] * k[1] > ACC_TAPS_MAX:
        return f"{k[0] * k[1]} taps overflow the int32 accumulator (at most {ACC_TAPS_MAX:,})"
    if feeds_output(g, node.outputs[0]):
        return "it computes a model output: the float pool keeps it unclipped and exact"
    return None


@lowering("AveragePool", "GlobalAveragePool", unit=CPU_U8, check=qmean_refuses, formats=("v4",),
          name="quantized_conv2d_mean")
def quantized_mean(lw, node):
    """A mean pool on uint8 (kmodel v4 has no uint8 pool: reduce_window2d and reduce are float):
    one quantized_conv2d over the map seen as C batches of one channel, k x k weights of 1:
    acc = sum (q - z_x) over the window (zero padding: float 0), y = acc s_x / (k^2 s_y) rounded
    once to y's grid, as the float mean quantized. k^2 bytes of weights, no float map."""
    (kh, kw), strides, pads, dilations = _mean_window(lw.g, node)
    row = lw.row(node, f"{node.op} {kh}x{kw}: quantized_conv2d on uint8 (weights 1, the mean rounded once)",
                 in_shape=lw.shape(node.inputs[0]), out_shape=lw.shape(node.outputs[0]))
    _mean_conv(lw, node, row, (kh, kw), strides, pads, dilations)


def mean_resize_refuses(g, node, opts):
    if node.attrs.get("mode", "nearest") != "linear" or len(g.shape(node.inputs[0]) or ()) != 4 or \
            resize_as_mean(g, node) is None:
        return NA
    if feeds_output(g, node.outputs[0]):
        return "it computes a model output: the float resize keeps it unclipped and exact"
    return None


@lowering("Resize", unit=CPU_U8, check=mean_resize_refuses, formats=("v4",), name="resize_as_mean")
def resize_mean(lw, node):
    """A linear Resize whose every sample is the mean of k adjacent pixels on each axis, k
    apart (a 2x downscale with half-pixel centres: (2i + 0.5) lies halfway between pixels 2i and
    2i + 1; a pick of every s-th pixel: k = 1): the uint8 mean pool of quantized_mean, so the map
    never exists in float."""
    (kh, sh), (kw, sw) = resize_as_mean(lw.g, node)
    row = lw.row(node, f"linear Resize as a {kh}x{kw} mean, stride ({sh}, {sw}): quantized_conv2d on uint8",
                 in_shape=lw.shape(node.inputs[0]), out_shape=lw.shape(node.outputs[0]))
    _mean_conv(lw, node, row, (kh, kw), (sh, sw), (0, 0, 0, 0), (1, 1))


def _mean_conv(lw, node, row, kernel, strides, pads, dilations):
    x, out = node.inputs[0], node.outputs[0]
    c, h, w = lw.shape(x)
    (kh, kw), (sh, sw), (t, l, b, r), (dh, dw) = kernel, strides, pads, dilations
    oh, ow = lw.shape(out)[1:] if len(lw.shape(out)) == 3 else (1, 1)
    src = lw.need_u8(x, row)
    s_x, z_x = lw.locs[x].quant
    s_y, z_y = lw.quant_of(out)
    loc = lw.u8_out(out, (s_y, z_y), lw.shape(out))
    om, osh = fx.fixed_mul(s_x / (kh * kw * s_y), 32, 62)
    pb = (oh - 1) * sh + (kh - 1) * dh + 1 - h - t       # the padding after that gives the runtime's floor size
    pr = (ow - 1) * sw + (kw - 1) * dw + 1 - w - l
    lw.emit_v4("quantized_conv2d", dict(
        in_shape=(c, 1, h, w), groups=1, out_channels=1, padding_h=(t, pb), padding_w=(l, pr), filter_h=kh,
        filter_w=kw, stride_h=sh, stride_w=sw, dilation_h=dh, dilation_w=dw, input=main(U8, src, c * h * w),
        output=main(U8, loc.u8, c * oh * ow), input_offset=-z_x, filter_offset=0, output_mul=om,
        output_shift=osh, output_offset=z_y), row, data={"bias": np.zeros(1, np.int64),
                                                         "weights": np.ones(kh * kw, np.uint8)})
    lw.traced(out, "u8")
    row.macs = c * oh * ow * kh * kw
    row.weight_bytes = kh * kw + 4


# ---------------------------------------------------------------------------------------------
def convt_refuses(g, node, opts):
    if len(g.shape(node.inputs[0])) != 4 or g.const(node.inputs[1]) is None:
        return "only 2-D ConvTranspose with constant weights"
    return None


@lowering("ConvTranspose", unit=CPU_F32, check=convt_refuses, formats=("v4",), name="conv2d_transpose")
def conv_transpose(lw, node):
    x, w_name = node.inputs[:2]
    out = node.outputs[0]
    a = node.attrs
    W = np.asarray(lw.g.const(w_name), np.float32)            # (Ci, Co/g, kh, kw)
    groups = int(a.get("group", 1))
    ci, cog, kh, kw = W.shape
    co = cog * groups
    B = np.asarray(lw.g.const(node.inputs[2]), np.float32) if len(node.inputs) > 2 and node.inputs[2] \
        else np.zeros(co, np.float32)
    _, h, w = lw.shape(x)
    oc, oh, ow = lw.shape(out)
    sh, sw = a.get("strides", (1, 1))
    dh, dw = a.get("dilations", (1, 1))
    pads = convt_pads(node, (h, w), (oh, ow), (kh, kw))
    row = lw.row(node, "transposed conv: float conv2d_transpose", in_shape=(ci, h, w), out_shape=(oc, oh, ow))
    src = lw.need_f32(x, row)
    n = oc * oh * ow
    biased = bool(np.any(B))
    loc = lw.f32_out(out)
    gic = ci // groups
    wt = W.reshape(groups, gic, cog, kh, kw).transpose(0, 2, 1, 3, 4).reshape(-1)   # [g][o][i][kh][kw]
    # the body's bias is zero: v0.2.0-beta4 reads it but never adds it
    # (docs/kmodel-format.md#v4-interpreter), and a runtime that did add it would then add it twice
    lw.emit_v4("conv2d_transpose", dict(
        input=main(F32, src, ci * h * w), output=main(F32, loc.f32, n),
        in_shape=(1, ci, h, w), out_shape=(1, oc, oh, ow), groups=groups, padding_h=(pads[0], pads[2]),
        padding_w=(pads[1], pads[3]), filter_h=kh, filter_w=kw, stride_h=sh, stride_w=sw, dilation_h=dh,
        dilation_w=dw, fused_activation=NO_CLAMP), row, data={"weights": wt, "bias": np.zeros(co, np.float32)})
    if biased:
        shp = (1, oc, oh, ow)
        # in place: binary reads each element before it writes it (kmodel.v4.IN_PLACE)
        lw.emit_v4("binary", dict(input_a=main(F32, loc.f32, n), input_b=Const(B), output=main(F32, loc.f32, n),
                                  binary_op=0, in_a_shape=shp, in_b_shape=(1, oc, 1, 1), out_shape=shp,
                                  fused_activation=NO_CLAMP), row)
        row.notes.append("bias as a broadcast add in place (the v0.2 conv2d_transpose kernel does not add it)")
    row.macs = ci * h * w * cog * kh * kw
    row.weight_bytes = 4 * (W.size + co)
    lw.traced(out, "f32")


# ---------------------------------------------------------------------------------------------
def _mm_dims(g, node):
    """(B, M, K, N, a_step, b_step) of a MatMul: B products of MxK by KxN, the i-th reading the
    operands' i-th matrices (step 1) or their only one (step 0, a broadcast operand); None where
    an operand's batch is neither the output's nor all ones."""
    a, b, y = (tuple(g.shape(t)) if g.tensors[t].shape is not None else np.shape(g.const(t))
               for t in (*node.inputs[:2], node.outputs[0]))
    if len(a) < 2 or len(b) < 2 or len(y) < 2:
        return None
    batch = y[:-2]
    steps = []
    for s in (a, b):
        lead = (1,) * (len(batch) - len(s[:-2])) + s[:-2]
        if len(lead) != len(batch):
            return None
        if all(d == 1 for d in lead):
            steps.append(0)
        elif lead == batch:
            steps.append(1)
        else:
            return None
    return int(np.prod(batch, dtype=np.int64)), a[-2], a[-1], b[-1], *steps


def matmul_refuses(g, node, opts):
    if node.op not in ("MatMul", "Gemm"):
        return NA
    if g.const(node.inputs[1]) is not None or g.const(node.inputs[0]) is not None:
        # constant weights: a dense layer; the float matmul takes the many-row ones (tokens)
        if _dense_weights(g, node) is None or dense_rows(g, node) < 2:
            return NA
        if float_clamp(node.attrs.get("activation")) is None:
            return f"activation {node.attrs['activation']['op']} after a float matmul: only ReLU / Clip fuse"
        return None
    if node.op == "Gemm":
        return NA
    if _mm_dims(g, node) is None:
        return (f"batched MatMul {g.shape(node.inputs[0])} x {g.shape(node.inputs[1])}: only batches that "
                "match the output's or are broadcast whole")
    return None


@lowering("MatMul", "Gemm", unit=CPU_F32, check=matmul_refuses, formats=("v4",), name="matmul")
def matmul(lw, node):
    """A product of two activations: one v4 matmul per matrix of the batch (attention's heads), at
    the matrices' offsets. A dense layer over many rows (a token sequence): one matmul, the
    weights a constant operand."""
    out = node.outputs[0]
    if lw.g.const(node.inputs[1]) is not None:
        W, B = _dense_weights(lw.g, node)
        n, k = W.shape
        m = dense_rows(lw.g, node)
        row = lw.row(node, f"dense layer over {m} rows: float matmul", out_shape=lw.shape(out), macs=m * k * n,
                     weight_bytes=4 * (W.size + n))
        src = lw.need_f32(node.inputs[0], row)
        loc = lw.f32_out(out)
        lw.emit_v4("matmul", dict(input_a=main(F32, src, m * k), input_b=Const(np.ascontiguousarray(W.T, np.float32)),
                                  output=main(F32, loc.f32, m * n), a_rows=m, a_cols=k, b_cols=n,
                                  fused_activation=float_clamp(node.attrs.get("activation"))), row,
                   data={"bias": np.asarray(B, np.float32)})
        lw.traced(out, "f32")
        return
    a_t, b_t = node.inputs
    batch, m, k, n, sa, sb = _mm_dims(lw.g, node)
    row = lw.row(node, "product of two activations: float matmul" + (f" x{batch}" if batch > 1 else ""),
                 out_shape=lw.shape(out), macs=batch * m * k * n)
    ra, rb = lw.need_f32(a_t, row), lw.need_f32(b_t, row)
    loc = lw.f32_out(out)
    f = BYTES[F32]
    for i in range(batch):
        lw.emit_v4("matmul", dict(input_a=main(F32, ra + i * sa * m * k * f, m * k),
                                  input_b=main(F32, rb + i * sb * k * n * f, k * n),
                                  output=main(F32, loc.f32 + i * m * n * f, m * n), a_rows=m, a_cols=k, b_cols=n,
                                  fused_activation=NO_CLAMP), row, data={"bias": np.zeros(n, np.float32)})
    lw.traced(out, "f32")


def _dense_weights(g, node):
    """(W (N, K), bias (N,)) of a dense layer with constant weights, or None."""
    if node.op == "Conv":
        if not is_dense(g, node):
            return None
        W = dense_matrix(np.asarray(g.const(node.inputs[1]), np.float64), node.attrs.get("group", 1))
        return W, np.asarray(g.const(node.inputs[2]), np.float64)
    W = g.const(node.inputs[1]) if len(node.inputs) > 1 else None
    if W is None or g.const(node.inputs[0]) is not None or np.ndim(W) != 2:
        return None
    W = np.asarray(W, np.float64)
    a = node.attrs
    if node.op == "Gemm":
        if a.get("transA", 0) or a.get("alpha", 1.0) != 1.0:
            return None
        W = W if a.get("transB", 0) else W.T
    else:
        W = W.T
    bias = np.zeros(W.shape[0])
    if node.op == "Gemm" and len(node.inputs) > 2 and node.inputs[2]:
        C = g.const(node.inputs[2])
        if C is None or np.size(C) not in (1, W.shape[0]):
            return None
        bias = np.broadcast_to(a.get("beta", 1.0) * np.asarray(C, np.float64).reshape(-1), bias.shape)
    return W, bias


def qmatmul_refuses(g, node, opts):
    wb = _dense_weights(g, node)
    if wb is None:
        return NA
    act = node.attrs.get("activation")
    if act and not _relu_like(act) and not _has_table(act):
        return f"activation {act['op']} has no function of one value to tabulate"
    if wb[0].shape[1] > ACC_TAPS_MAX:
        return f"{wb[0].shape[1]} inputs per output overflow the int32 accumulator (at most {ACC_TAPS_MAX:,})"
    rows = dense_rows(g, node) if node.op != "Conv" else 1
    if rows > 1 and len(weight_parts(wb[0], 1)) > 1:
        return f"{rows} rows with the outputs in {len(weight_parts(wb[0], 1))} weight scales: one scale per matmul"
    if wants_small(opts, node):
        return None             # 4x less weight memory than the float layer: the plan needs it to fit
    if source_unit(g, node.inputs[0], opts) in ("input", CPU_F32) and float_fc_refuses(g, node, opts) is None:
        return "its input is float: the float layer avoids a quantize"
    if feeds_output(g, node.outputs[0]):
        return "it computes a model output: the float layer keeps it unclipped and exact"
    if weight_sqnr(wb[0], 1) < WEIGHT_SQNR_MIN:
        return f"uint8 weights keep only {weight_sqnr(wb[0], 1):.1f} dB of the weights"
    return None


@lowering("Gemm", "MatMul", "Conv", unit=CPU_U8, check=qmatmul_refuses, formats=("v4",), name="quantized_matmul")
def quantized_matmul(lw, node):
    """A dense layer wider than the KPU takes: uint8 x uint8 -> int32 -> uint8 (4x less weight memory
    than the float layer)."""
    x, out = node.inputs[0], node.outputs[0]
    W, B = _dense_weights(lw.g, node)
    n_out, k = W.shape
    m = dense_rows(lw.g, node) if node.op != "Conv" else 1      # rows (tokens), each a vector
    act = node.attrs.get("activation")
    row = lw.row(node, "dense layer over the KPU's channels: quantized_matmul on uint8"
                 + (f" ({m} rows)" if m > 1 else ""), in_shape=(k,) if m == 1 else (m, k),
                 out_shape=(n_out,) if m == 1 else (m, n_out), macs=m * W.size, weight_bytes=W.size + 4 * n_out)
    src = lw.need_u8(x, row)
    s_x, z_x = lw.locs[x].quant
    parts = weight_parts(W, 1)
    exact = _on_grids(W, parts)
    if len(parts) > 1 or exact:
        row.notes.append(f"weights uint8 {_scales(parts, 'output', exact)}"
                         + ("" if exact else f", {weight_sqnr(W, 1):.1f} dB"))
    direct = _relu_like(act)     # ReLU / Clip(0, b): the uint8 clamp of the output's range
    y_t = out if direct else stage_names(node)["conv"]
    s_y, z_y = lw.quant_of(y_t)
    loc = lw.u8_out(y_t, (s_y, z_y), lw.shape(out) or (n_out,))
    idx = []
    for o0, o1, s_w, z_w, wq in quantize_parts(W, parts):     # one node per output range, as quantized_conv2d
        bq = np.clip(np.rint(B[o0:o1] / (s_x * s_w)), -(2 ** 31), 2 ** 31 - 1).astype(np.int64)
        om, osh = fx.fixed_mul(s_x * s_w / s_y, 32, 62)
        idx.append(lw.emit_v4("quantized_matmul", dict(
            input_a=main(U8, src, m * k), input_b=Const(np.ascontiguousarray(wq.T).reshape(-1), U8),   # (K, n)
            output=main(U8, loc.u8 + o0, m * (o1 - o0)), a_rows=m, a_cols=k, b_cols=o1 - o0, input_a_offset=-z_x,
            input_b_offset=-z_w, output_mul=om, output_shift=osh, output_offset=z_y), row, data={"bias": bq}))
    lw.trace_map[y_t] = (idx[0] if len(idx) == 1 else tuple(idx), "u8")
    if not direct:
        activation_after(lw, y_t, out, act, row)
    else:
        clamp_after(lw, y_t, act, row)


def _has_table(act):
    try:
        fx.act_function(act)
        return True
    except KeyError:
        return False

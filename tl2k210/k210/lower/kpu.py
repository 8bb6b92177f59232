"""K210_CONV layers from float weights and calibrated ranges: weights, batch-norm fixed point,
activation table and the 12 register words (docs/kpu.md#layer-argument, #pipeline,
#from-float-to-registers). Every number from hardware.py.

A layer is quantized once (`quantize_layer`, all output channels) and then emitted as one or
more tiles (`tile_conv`): a tile reads a window of input channels (and rows) and writes a window
of output channels. Tiles of one layer share its weights, BN table and activation table, so a
tiled layer computes the same bytes as the whole layer would.
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field

import numpy as np

from tl2k210.errors import KpuLimitError
from tl2k210.k210 import hardware as hw
from tl2k210.k210.kmodel.binio import align_up
from tl2k210.k210.kmodel.kpu import KpuConv
from tl2k210.k210 import fixed_point as fx
from tl2k210.quantize.bias_correction import mean_shift
from tl2k210.quantize.uniform import uint8_grid
from tl2k210.memo import memoised

IR_POOL_KIND = {"max": "max", "avg": "mean"}
# a streamed output channel holds at most this many pixels (channel_byte_num, docs/kpu.md#write-back-and-streaming); the
# field is clamped for outputs that stay in KPU RAM (only the output FIFO reads it)
STREAM_PIXELS = 1 << hw.LAYER_FIELD["channel_byte_num"].width
U8_MAX = int(np.iinfo(np.uint8).max)
CLAMP_SHIFT = 20         # V units an output step is worth in the shared clamp table (2^A)
CLAMP_SHIFT_MIN = 8      # fewer bits below an output step: the fitted table instead
NORM_ADD_MAX = 0.99 * 2.0 ** 31      # the BN add is 32-bit signed


def pool_code(pool: dict | None) -> int | None:
    """KPU pool code of an IR pool attr {"kind", "size", "stride", "pads"}; 0 for none; None if
    the KPU has no such pool. The stride-1 pools pad (0, 0, 1, 1) like the hardware's window."""
    if not pool:
        return 0
    kind = IR_POOL_KIND.get(pool["kind"])
    for p in hw.POOLS:
        if (p.kind, p.size, p.stride) == (kind, pool["size"], pool["stride"]):
            pads = list(pool.get("pads", [0, 0, 1, 1] if p.stride == 1 else [0, 0, 0, 0]))
            if pads == ([0, 0, 1, 1] if p.stride == 1 else [0, 0, 0, 0]) and not (
                    p.stride == 1 and p.kind == "mean"):   # mean_2_s1 replicates edges: not ONNX
                return p.code
    return None


def pick_code(dx: int) -> int:
    """The stride-2 pick pool taking row phase 0 and column phase dx."""
    return next(p.code for p in hw.POOLS if p.kind == "pick" and p.stride == 2 and p.pick == (0, dx))


def weight_loads(co: int, per_oc: int, weight_bits: int, depthwise: bool):
    """(output channels per weight load, load_time) of docs/kpu.md#weight-loading."""
    if depthwise:
        return co, 0
    wbytes = weight_bits // 8
    n_oc = max(1, min(co, hw.WEIGHT_LOAD_BUDGET[weight_bits] // (per_oc * wbytes)))
    return n_oc, -(-co // n_oc) - 1


def layout_args(in_shape, out_shape) -> dict:
    """The register fields that follow from the input and output map shapes
    (docs/kpu.md#kpu-ram-layout, #layer-argument)."""
    ci, h, w = in_shape
    co, ph, pw = out_shape
    g_in, _, L_in = hw.row_layout(w)
    g_out, _, L_out = hw.row_layout(pw)
    return dict(i_ch_num=ci - 1, o_ch_num=co - 1, i_row_wid=w - 1, i_col_high=h - 1,
                o_row_wid=pw - 1, o_col_high=ph - 1,
                channel_switch_addr=L_in * h, row_switch_addr=L_in, coef_group=g_in,
                wb_channel_switch_addr=L_out * ph, wb_row_switch_addr=L_out, wb_group=g_out,
                channel_byte_num=min(ph * pw, STREAM_PIXELS) - 1, dma_total_byte=co * ph * pw - 1)


def window_line(c0: int, h: int, w: int) -> int:
    """Line offset of channel c0 inside a (C, h, w) map (c0 a multiple of the map's group)."""
    g, _, L = hw.row_layout(w)
    assert c0 % g == 0, (c0, g)
    return (c0 // g) * L * h


@dataclass
class LayerQuant:
    """A KPU layer's integer parameters over all its output channels; tiles take slices."""
    Wq: np.ndarray        # (Co, Ci/groups, k, k) uint8/uint16
    zw: int               # weight zero point (arg_x = -zw)
    z_x: int              # input zero point = pad value (arg_w = -z_x)
    bn: dict              # norm_mul, norm_shift, norm_add: (Co,)
    act: dict             # activation table
    out_quant: tuple      # (s_z, z_z) of the uint8 output
    groups: int
    bits: int
    exact_copy: bool = False   # one-hot weights, ACC = the picked input byte (no zero points)
    pixels: bool = False       # reads the image's uint8 pixels in main memory, preprocessing folded in
    fit_lsb: float = 0.0       # the activation table's max error (output LSB) over the input range

    @property
    def k(self):
        return self.Wq.shape[2]

    @property
    def co(self):
        return self.Wq.shape[0]


def quantize_layer(W, B, e, z_x, groups, y_range, z_range, act_attr, bits, row,
                   exact_rounding=False, out_offset=0.0) -> LayerQuant:
    """Per-channel weights acting on q − z_x (W already carries the input scale), bias correction
    for the weight rounding (e = E[q − z_x] per input channel), BN fixed point, activation table.
    `exact_rounding` (a quantized model's layer: "reference" or "single"): an identity/ReLU/Clip
    output is rounded as those TFLite kernels round it (`exact_requantize`). `out_offset`: output
    LSB added before the output rounds (a fused mean pool's floor takes it back off, on average).
    The receipt row gets the notes and the table's fit error. Memoised: the plan lowers a model
    tens of times, each layer with the same weights and ranges."""
    lq, notes = _quantize_layer(W, B, e, z_x, groups, y_range, z_range, act_attr, bits, exact_rounding,
                                out_offset)
    row.notes.extend(notes)
    row.act_fit_lsb = lq.fit_lsb
    return lq


@dataclass
class _Notes:
    """What quantizing a layer tells its receipt row (a memoised result carries it; the table's
    fit error is the result's own `fit_lsb`)."""
    notes: list = field(default_factory=list)


def _layer_key(W, B, e, z_x, groups, y_range, z_range, act_attr, bits, exact_rounding, out_offset):
    arrays = [np.asarray(a) for a in (W, B) + (() if e is None else (e,))]
    act = sorted((act_attr or {}).items())
    arrays += [np.asarray(v) for _, v in act if isinstance(v, np.ndarray)]
    h = hashlib.blake2b()
    for a in arrays:
        h.update(repr((a.dtype.str, a.shape)).encode())
        h.update(np.ascontiguousarray(a).tobytes())
    return (h.digest(), e is None, int(z_x), groups, tuple(map(float, y_range)), tuple(map(float, z_range)),
            act_attr is None, repr([(k, None if isinstance(v, np.ndarray) else v) for k, v in act]), bits,
            exact_rounding, float(out_offset))


@memoised(_layer_key)
def _quantize_layer(W, B, e, z_x, groups, y_range, z_range, act_attr, bits, exact_rounding, out_offset):
    row = _Notes()
    return _quantized(W, B, e, z_x, groups, y_range, z_range, act_attr, bits, row, exact_rounding,
                      out_offset), row.notes


def _quantized(W, B, e, z_x, groups, y_range, z_range, act_attr, bits, row, exact_rounding, out_offset):
    Wq, zw, sw = fx.quantize_weights(W, bits)
    if exact_rounding and fx.clamp_of(act_attr) is not None and bits == 8:
        lq = exact_requantize(Wq, zw, sw, W, B, z_x, groups, y_range, z_range, act_attr, row, exact_rounding)
        if lq is not None:
            return lq
    if e is not None:   # remove the mean shift the weight rounding causes (Nagel et al. 2019)
        B = B - mean_shift((Wq.astype(np.float64) - zw) * sw[:, None, None, None] - W, e, groups)
        row.notes.append("bias corrected for weight rounding")
    y_lo, y_hi = y_range
    s_z, z_z = fx.qparams(*z_range)
    s_v = fx.choose_v_scale(1.0, sw, B, max(abs(y_lo), abs(y_hi)) * 2)
    clamp, shift = fx.clamp_of(act_attr), 0.0
    a = _shared_shift(s_v, s_z, z_z + out_offset, B) if clamp is not None else None
    if a is not None:
        # a clamp of the identity (none, ReLU, ReLU6...): S_V·s_z = 2^A and the zero point in the
        # BN add make the table a rounding shift by A clamped to the output codes -- exact, and the
        # same bytes in every such layer (stored once)
        s_v, shift = 2.0 ** a / s_z, (z_z + out_offset) * 2.0 ** a
        lo, hi = clamp
        act = fx.clamp_table(lo + (z_z + out_offset) * s_z, hi + (z_z + out_offset) * s_z, a, s_z, 0)
        B = B + (z_z + out_offset) * s_z
    else:
        act = fx.activation_table(act_attr, y_lo, y_hi, s_v, s_z, z_z + out_offset)
    bn = fx.bn_params(1.0, sw, B, s_v)
    lq = LayerQuant(Wq, zw, z_x, bn, act, (s_z, z_z), groups, bits)
    lq.fit_lsb = fit_error(act_attr, act, y_lo, y_hi, s_v, s_z, z_z + out_offset, v_offset=shift)
    if act_attr is not None and act_attr["op"] != "Relu":   # ReLU: the table is exact by construction
        name = "Relu6 (Clip 0..6)" if act_attr["op"] == "Clip" and (act_attr.get("min"), act_attr.get("max")) == (0, 6) \
            else act_attr["op"]
        row.notes.append(f"activation {name}: {hw.ACT_SEGMENTS}-segment table, max error "
                         f"{lq.fit_lsb:.2f} output LSB (rounding alone: 0.50) over the calibrated input "
                         f"[{y_lo:.3g}, {y_hi:.3g}]")
    return lq


def _shared_shift(s_v_max, s_z, z_z, B) -> int | None:
    """A of the shared clamp table (S_V = 2^A / s_z <= s_v_max), at most CLAMP_SHIFT so that most
    layers take the same, with the BN add (bias and zero point, 32-bit signed) in range; None when
    under CLAMP_SHIFT_MIN."""
    a = min(fx.exact_v_scale(s_v_max, s_z)[1], CLAMP_SHIFT)
    add = float(np.max(np.abs(B))) / s_z + abs(z_z) if np.size(B) else abs(z_z)
    if add > 0:
        a = min(a, math.floor(math.log2(NORM_ADD_MAX / add)))
    return a if a >= CLAMP_SHIFT_MIN else None


def _on_grid(W, Wq, zw, sw) -> bool:
    return float(np.abs((Wq.astype(np.float64) - zw) * sw[:, None, None, None] - W).max()) \
        <= 1e-5 * float(np.abs(W).max() or 1.0)


def _symmetric_steps(W, amax, zw):
    """Each channel's step where W lies on a symmetric grid whose extreme weight is `amax` at
    +-(zw - 1) steps, or at -zw steps (a quantizer with the range [-128, 127], as PPQ's QDQ
    models: 143 of an MLPerf ResNet-8's 346 channels reach -128 but not 127), or None."""
    tol = 1e-5 * float(np.abs(W).max() or 1.0)
    flat = W.reshape(W.shape[0], -1)
    steps = np.full(len(amax), np.nan)
    for n in (zw - 1, zw):
        s = np.where(amax > 0, amax / n, 1.0)
        q = np.rint(flat / s[:, None])
        ok = (np.abs(q * s[:, None] - flat).max(axis=1) <= tol) & (q.min(axis=1) >= -zw) & (q.max(axis=1) < zw)
        steps = np.where(np.isnan(steps) & ok, s, steps)
    return None if np.isnan(steps).any() else steps


def _own_integers(W, Wq, zw, sw):
    """(Wq, zw, sw, on_grid): the model's own 8-bit weights where W is on a grid: per channel
    (TFLite's per-axis scales: every channel reaches ±127, or -128: _symmetric_steps), per tensor
    (one scale, max |W| / 127 or / 128) or per tensor with a zero point (TOCO's uint8 weights:
    q − zw for q in 0..255, any zw; the KPU's arg_x takes it)."""
    if _on_grid(W, Wq, zw, sw):
        return Wq, zw, sw, True
    amax = np.abs(W.reshape(W.shape[0], -1)).max(axis=1)
    for a in (amax, np.full(len(amax), amax.max())):        # per channel, per tensor
        s = _symmetric_steps(W, a, zw)
        if s is not None:
            q = (np.clip(np.rint(W / s[:, None, None, None]), -zw, zw - 1) + zw).astype(Wq.dtype)
            return q, zw, s, True
    if Wq.dtype == np.uint8 and (grid := uint8_grid(W)) is not None:
        s, lo = np.full(W.shape[0], grid[0]), grid[1]
        q = (np.rint(W / s[:, None, None, None]) - lo).astype(Wq.dtype)
        if _on_grid(W, q, -lo, s):
            return q, -lo, s, True
    return Wq, zw, sw, False


def exact_requantize(Wq, zw, sw, W, B, z_x, groups, y_range, z_range, act_attr, row,
                     rounding="reference") -> LayerQuant | None:
    """TFLite's requantization, round(M_c·(acc + bias)) + z clamped by the fused activation, on the
    KPU: S_V = 2^A / s_z puts the per-channel M_c into the 24-bit BN multipliers and makes the
    activation stage a rounding shift by A (fx.clamp_table). Weights that are the model's own
    integers need no bias correction. `rounding`: "reference" rounds as TFLite's reference
    kernels (TFLite Micro's) do, twice (fx.double_rounding_offset): each channel's offset E_c
    rides in norm_add; where the output can go below its zero point, the channels are grouped by
    E_c, each group's V moved to its own stretch of the table (wide enough for any input: the
    weights bound |acc|), as many groups as the table's segments hold. "single": once (the
    default desktop interpreter's XNNPACK kernels). The receipt says how close to a rounding tie
    TFLite's value must lie for the output byte to differ, or why it is not exact. None: no room
    for A."""
    y_lo, y_hi = y_range
    s_z, z_z = fx.qparams(*z_range)
    y_amax = max(abs(y_lo), abs(y_hi), (255 - z_z) * s_z, z_z * s_z)
    Wq, zw, sw, on_grid = _own_integers(W, Wq, zw, sw)
    # each channel's |y - bias| within what its weights reach from any input bytes
    reach = np.abs(Wq.astype(np.int64) - zw).reshape(len(sw), -1).sum(axis=1) * max(z_x, 255 - z_x) * sw
    lo, hi = fx.clamp_of(act_attr)
    e = np.array([fx.double_rounding_offset(m) for m in sw / s_z]) if rounding == "reference" else np.zeros(len(sw))
    signed = lo < -0.5 * s_z and z_z > 0    # outputs below the zero point: their rounding mirrors
    offsets = np.unique(e) if signed else np.zeros(1)
    per_group = 3 + math.isfinite(hi)
    why = []
    if len(offsets) * per_group > hw.ACT_SEGMENTS:
        why.append(f"{len(offsets)} double-rounding offsets below zero, the table holds "
                   f"{hw.ACT_SEGMENTS // per_group}")
        offsets = offsets[-1:]
    s_v_max = fx.choose_v_scale(1.0, sw, B, y_amax * 2)
    spacing_real = 0.0
    if len(offsets) > 1:    # every group's |V| below half the spacing for any input bytes
        spacing_real = 2 * float(np.max(reach + np.abs(B))) + 4 * s_z
        if fx.exact_v_scale(0.99 * 2.0 ** 31 / (spacing_real * len(offsets)), s_z)[1] < 8:
            why.append(f"{len(offsets)} double-rounding offsets below zero, their table stretches too wide")
            offsets, spacing_real = offsets[-1:], 0.0
        else:
            s_v_max = min(s_v_max, 0.99 * 2.0 ** 31 / (spacing_real * len(offsets)))
    group = np.searchsorted(offsets, e).clip(0, len(offsets) - 1)
    s_v, a = fx.exact_v_scale(s_v_max, s_z)
    if a < 8:
        return None
    spacing = int(math.ceil(spacing_real * s_v))
    big = 2.0 ** a                              # one output step in V
    add = group * spacing + np.rint(e * big)    # V units: the group's stretch and E_c
    bn = fx.bn_params(1.0, sw, B + add / s_v, s_v)
    act = fx.clamp_table(lo, hi, a, s_z, z_z, [int(2 * np.rint(o * big)) for o in offsets], spacing)
    lq = LayerQuant(Wq, zw, z_x, bn, act, (s_z, z_z), groups, 8)
    lq.fit_lsb = fit_error(act_attr, act, y_lo, y_hi, s_v, s_z, z_z)
    # each channel within its reach (a channel of tiny weights, whose multiplier the 24 bits hold
    # poorly, reaches little: the layer's range had made MobileNetV2's first conv "650 LSB off"
    # where its bytes were TFLite's)
    margin = fx.tie_margin(sw, bn, s_v, a, np.minimum(y_amax, reach), B) + (0.5 / big if rounding == "reference" else 0)
    if signed and why:
        unmatched = int(np.sum(e != offsets[group]))
        why[-1] += f" ({unmatched} of {len(e)} channels round their negative outputs off by up to " \
                   f"{2 * float(np.max(np.abs(e - offsets[group]))):.2g} LSB)"
    kernels = "reference kernels" if rounding == "reference" else "XNNPACK kernels"
    if on_grid and margin < 0.01 and not why:
        row.notes.append(f"int8 exact: TFLite's output bytes ({kernels}) from the same input bytes, except where "
                         f"its value lies within {margin:.1g} output LSB of a rounding tie (24-bit BN multipliers, "
                         "TFLite's 31-bit; a byte off at a tie goes on into the layers after)")
    else:
        why += [] if on_grid else ["weights re-rounded (not on one 8-bit grid per channel)"]
        why += [] if margin < 0.01 else [f"multipliers {margin:.2g} LSB off"]
        row.notes.append("not exact: " + "; ".join(why) + f" (vs TFLite's {kernels})")
    return lq


def fit_error(act_attr, table, y_lo, y_hi, s_v, s_z, z_z, samples=4097, v_offset=0.0) -> float:
    """Max |table(V) - (f(y)/s_z + z_z)| in output LSB over the calibrated input range, with
    V = y·S_V (+ `v_offset`, a zero point the BN add carries) as the BN stage delivers it and the
    table run as the emulator runs it."""
    from tl2k210.k210.emulator.kpu import activation
    f, kinks = fx.act_function(act_attr)
    y = np.unique(np.concatenate([np.linspace(y_lo, y_hi, samples), [k for k in kinks if y_lo < k < y_hi]]))
    got = activation(np.rint(y * s_v + v_offset).astype(np.int64), table).astype(np.float64)
    return float(np.max(np.abs(got - np.clip(f(y) / s_z + z_z, 0, U8_MAX))))


def copy_layer(onehot: np.ndarray, quant: tuple, bits: int, groups: int = 1) -> LayerQuant:
    """A layer whose output channel o is input channel src[o] at tap t[o], byte for byte:
    weights 1 at that tap and 0 elsewhere, no zero-point terms, BN x1, identity activation.
    Out-of-map taps read the pad value = the input's zero point = the quantized 0.0."""
    co = onehot.shape[0]
    act = {"x_start": np.array([hw.ACT_X_START_MIN, 0] + [hw.ACT_X_START_MAX] * (hw.ACT_SEGMENTS - 2), np.int64),
           "y_mul": np.array([0, 1] + [0] * (hw.ACT_SEGMENTS - 2), np.int64),
           "shift_number": np.zeros(hw.ACT_SEGMENTS, np.int64),
           "bias": np.array([0, 0] + [U8_MAX] * (hw.ACT_SEGMENTS - 2), np.uint8)}
    bn = {"norm_mul": np.ones(co, np.int64), "norm_shift": np.zeros(co, np.int64),
          "norm_add": np.zeros(co, np.int64)}
    wq = onehot.astype(np.uint8 if bits == 8 else np.uint16)
    return LayerQuant(wq, 0, int(quant[1]), bn, act, tuple(quant), groups, bits, exact_copy=True)


def dense_weights(lq: LayerQuant, cin, cout) -> np.ndarray:
    """(len(cout), len(cin), k, k) weights of a tile; a grouped layer becomes block-diagonal
    (zero weights = zw contribute nothing to ACC)."""
    (c0, c1), (o0, o1) = cin, cout
    co, m, k = lq.co, lq.Wq.shape[1], lq.k
    n = co // lq.groups
    if lq.groups == 1:
        assert m == c1 - c0, "a dense tile reads every input channel"
        return lq.Wq[o0:o1]
    out = np.full((o1 - o0, c1 - c0, k, k), lq.zw, lq.Wq.dtype)
    for o in range(o0, o1):
        s = (o // n) * m - c0
        assert 0 <= s and s + m <= c1 - c0, f"output {o} reads inputs outside the tile's window {cin}"
        out[o - o0, s:s + m] = lq.Wq[o]
    return out


def tile_conv(lq: LayerQuant, cin, cout, in_shape, code, depthwise, name) -> KpuConv:
    """One K210_CONV computing output channels `cout` from the (C, H, W) input window `in_shape`
    holding channels `cin` (addresses 0, see `place`)."""
    ci, h, w = in_shape
    (o0, o1) = cout
    co, k = o1 - o0, lq.k
    wq = lq.Wq[o0:o1] if depthwise else dense_weights(lq, cin, cout)
    ph, pw = hw.POOL[code].out_size(h, w)
    lo = hw.LIMITS["out_min"]
    if min(ph, pw) < lo:
        raise KpuLimitError(f"node {name!r}: KPU output {pw}x{ph} after {hw.POOL[code].name}; the KPU "
                            f"writes maps of at least {lo}x{lo} (docs/kpu.md#limits): use a larger input or pool later")
    per_oc = k * k * (1 if depthwise else ci)
    n_oc, load_time = weight_loads(co, per_oc, lq.bits, depthwise)
    para = n_oc * per_oc * lq.bits // 8
    if load_time > hw.LIMITS["load_time_max"] or para > hw.LIMITS["para_size_max"]:
        raise KpuLimitError(f"node {name!r}: {co}x{per_oc} weights need {load_time + 1} weight loads "
                            f"of {para:,} B; the KPU allows {hw.LIMITS['load_time_max'] + 1} loads of "
                            f"at most {hw.LIMITS['para_size_max']:,} B: use fewer input channels")
    zp = (0, 0, 0) if lq.exact_copy else (-lq.zw, -lq.z_x, k * k * lq.z_x * lq.zw)
    args = dict(hw.LAYER_DEFAULTS)
    args.update(layout_args(in_shape, (co, ph, pw)))
    args.update(
        depth_wise_layer=int(depthwise), image_src_addr=0, image_dst_addr=0, o_ch_num_coef=n_oc - 1,
        kernel_type=next(t for t, kk in hw.KERNEL_SIZES.items() if kk == k), pool_type=code,
        pad_value=lq.z_x, load_time=load_time, para_size=para,
        arg_x=zp[0], shr_x=0, arg_w=zp[1], shr_w=0, arg_add=zp[2],
        bwsx_base_addr=0, para_start_addr=0, active_addr=0)
    bn = {f: np.asarray(v)[o0:o1] for f, v in lq.bn.items()}
    return KpuConv(args, wq.reshape(-1), bn, lq.act)


def place(conv: KpuConv, src_line: int, dst_line: int) -> KpuConv:
    conv.args["image_src_addr"], conv.args["image_dst_addr"] = src_line, dst_line
    return conv


def out_lines(conv: KpuConv) -> int:
    return hw.map_lines(*conv.out_shape)


def layer_file_bytes(ci: int, co: int, k: int) -> int:
    """Estimated kmodel bytes of one 8-bit KPU conv layer of `ci` -> `co` channels: its arguments
    and weights, its BN table and its activation table, each block starting at a 256-byte
    boundary, so a small layer costs about 768 B whatever its weights."""
    return sum(align_up(b, a) for b, a in ((hw.LAYER_ARG_BYTES + co * ci * k * k, hw.PARAM_ALIGN),
                                           (8 * co, hw.PARAM_ALIGN), (hw.ACT_TABLE_BYTES, hw.ACT_TABLE_ALIGN)))


def estimate_cycles(macs: int, weight_bytes: int, streamed_bytes: int = 0) -> int:
    """Cost-model cycles of one K210_CONV before it is built (k210/cost.py constants)."""
    from tl2k210.k210 import cost
    return int(macs / cost.KPU_MACS_PER_CYCLE + cost.KPU_LAYER_OVERHEAD
               + (weight_bytes + streamed_bytes) / cost.DMA_BYTES_PER_CYCLE)

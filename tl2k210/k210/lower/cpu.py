"""SDK CPU layers for what the KPU does not do: residual adds, concats, upsampling, pools,
tables, softmax, L2 norm. uint8 layers where the SDK has them, float where it has only those."""
from __future__ import annotations

import math

import numpy as np

from tl2k210.graph import pads_of
from tl2k210.k210 import fixed_point as fx
from tl2k210.passes.fuse_activation import activation_of

from .fc import CONCAT_MOVES, SOFTMAX_LOW, feeds_output, logistic, source_unit
from .memory import SLICES, float_slices
from .registry import CPU_F32, CPU_U8, NA, lowering


U8 = np.arange(np.iinfo(np.uint8).max + 1)      # every uint8 value: the index of a REQUANTIZE table
ADD_ONE = 1 << 12       # QUANTIZED_ADD's input multiplier for 1.0 (12 fraction bits; SDK int32 arithmetic)


def table(f, s_in, z_in, so, zo):
    """REQUANTIZE table of y = f(x) from uint8 (s_in, z_in) to uint8 (so, zo), rounded."""
    return np.clip(np.rint(f(s_in * (U8 - z_in)) / so + zo), 0, U8[-1]).astype(np.uint8)


def _act(g, node):
    return activation_of(g, node)


def act_bounds(act):
    """(lo, hi) of a clamp activation (Relu, Clip); None for none or any other."""
    if act is None:
        return None
    if act["op"] == "Relu":
        return (0.0, np.inf)
    if act["op"] == "Clip":
        return (float(act.get("min", -np.inf)), float(act.get("max", np.inf)))
    return None


def saturation_clamps(bounds, quant) -> bool:
    """Is QUANTIZE to the grid `quant` (s, z) the clamp `bounds` itself: do the values of codes 0
    and 255 lie within them (a ReLU: zero point 0)?"""
    s, z = quant
    eps = 1e-6 * s
    return s * -z >= bounds[0] - eps and s * (U8[-1] - z) <= bounds[1] + eps


def grid_clamp(bounds, s, z):
    """(q_lo, q_hi): the uint8 codes of a clamp's `bounds` on the grid (s, z) -- what TFLite
    applies to a fused ReLU / ReLU6 after requantizing -- or None where the uint8 range [0, 255]
    is that clamp already (a calibrated range lies within the bounds). A quantized model's own
    grid need not: the MobileNetV2 TFLite Micro exports from PyTorch has fused ReLU6 convs whose
    output grid reaches down to -0.80."""
    if bounds is None:
        return None
    lo, hi = bounds
    q_lo = 0 if not np.isfinite(lo) else int(np.clip(z + np.rint(lo / s), 0, 255))
    q_hi = 255 if not np.isfinite(hi) else int(np.clip(z + np.rint(hi / s), 0, 255))
    return None if (q_lo, q_hi) == (0, 255) else (q_lo, q_hi)


def clamp_after(lw, t, act, row):
    """Apply the clamp activation `act` (Relu, Clip; a dict, activation_of's) to the uint8 map
    `t` just written by a CPU layer, where t's grid reaches past its bounds (grid_clamp): one
    REQUANTIZE in place whose table is the identity between the bounds' codes
    (kmodel.v3.IN_PLACE; the grid stays t's). Elsewhere the uint8 range is the clamp: nothing."""
    loc = lw.locs[t]
    codes = grid_clamp(act_bounds(act), *loc.quant)
    if codes is None:
        return
    lw.emit("REQUANTIZE", dict(flags=1, main_mem_in_address=loc.u8, main_mem_out_address=loc.u8,
                               count=int(np.prod(loc.shape))), row,
            data={"table": np.clip(U8, *codes).astype(np.uint8)})
    lw.traced(t, "u8")
    row.notes.append(f"{act['op']} as a clamp to codes {codes[0]}..{codes[1]} of the output grid, which "
                     "reaches past its bounds (a 256-entry table, in place)")


# ------------------------------------------------------------------ uint8 layers
def add_refuses(g, node, opts):
    if len(node.inputs) != 2 or any(g.const(i) is not None for i in node.inputs):
        return ("only the sum/difference of two activations (a per-channel constant folds into a "
                "conv: fold_affine)")
    if g.shape(node.inputs[0]) != g.shape(node.inputs[1]):
        return f"broadcast add {g.shape(node.inputs[0])} + {g.shape(node.inputs[1])}: only same shapes"
    return None


def add_offsets(za, zb, zo, ma, mb, mul, sh, search=32):
    """QUANTIZED_ADD's (in_a_offset, in_b_offset, out_offset) for zero points za, zb, zo.

    kpu_carry_shift rounds a negative value wrongly (an odd v >> (s-1) lands 2 LSB low;
    docs/kmodel-format.md#v3-runner), so offsets of -za, -zb (a signed sum) bias every output by
    -0.5 LSB on average, and up to -2 LSB: 2.1 dB lost at MobileNetV2's first residual add. Instead the inputs are offset
    so that the sum is never negative (a + off_a >= 0, (b + off_b)·mb >= 0 for every uint8), and
    out_offset takes the added constant K back: off_o = zo - K·mul/2^sh. Of the offsets tried,
    the one whose K·mul/2^sh is nearest an integer wins (its fraction is the only bias left)."""
    lo_b = 0 if mb > 0 else -(len(U8) - 1)      # mb < 0 (a difference): b + off_b <= 0
    step_b = 1 if mb > 0 else -1
    best = None
    for da in range(search):
        for db in range(search):
            off_a, off_b = da, lo_b + step_b * db
            k = (off_a + za) * ma + (off_b + zb) * mb                 # v_new - v_signed, >= 0
            c = k * mul / 2.0 ** sh
            err = abs(c - round(c))
            if best is None or err < best[0] - 1e-12:
                best = (err, off_a, off_b, zo - int(round(c)))
    return best[1:]


def exact_add_params(ta, tb, za, zb, zo, sign=1):
    """QUANTIZED_ADD of a quantized model: (off_a, mul_a, off_b, mul_b, out_offset, out_shift,
    margin) with out_mul 1, computing round(ta·(a − za) + sign·tb·(b − zb)) + zo as TFLite does
    (ta = sa/so, tb = sb/so). The multipliers carry 21 bits and the offsets are at most 255, so
    every sum stays inside int32 and non-negative (the SDK's carry shift rounds a negative one
    wrongly: add_offsets); of the offsets, the pair whose added constant is nearest a whole output
    step wins. margin: the largest distance (output LSB) from the exact value, so an output byte
    differs from TFLite's only where its value lies that close to a rounding tie."""
    sh = 21 - max(0, math.frexp(max(ta, tb))[1])
    ma, mb = round(ta * 2 ** sh), sign * round(tb * 2 ** sh)
    oa = U8[:, None]
    ob = U8[None, :] if sign > 0 else -U8[-1] - U8[None, :]
    c = ((oa + za) * ma + (ob + zb) * mb) / 2.0 ** sh                     # the constant the offsets add
    frac = np.abs(c - np.rint(c))
    i, j = np.unravel_index(int(np.argmin(frac)), frac.shape)
    margin = frac[i, j] + (abs(ma / 2.0 ** sh - ta) + abs(abs(mb) / 2.0 ** sh - tb)) * U8[-1]
    return int(oa[i, 0]), ma, int(ob[0, j]), mb, int(zo - np.rint(c[i, j])), sh, float(margin)


@lowering("Add", "Sub", unit=CPU_U8, check=add_refuses)
def quantized_add(lw, node):
    """Residual add (or difference: a negative multiplier for b): QUANTIZED_ADD on uint8 (the KPU
    has no add); a ReLU after it is the clamp."""
    a_name, b_name = node.inputs
    out = node.outputs[0]
    sign = -1 if node.op == "Sub" else 1
    row = lw.row(node, f"residual {'difference' if sign < 0 else 'add'}: QUANTIZED_ADD on uint8 (no KPU add)",
                 in_shape=lw.shape(a_name), out_shape=lw.shape(out))
    pa, pb = lw.need_u8(a_name, row), lw.need_u8(b_name, row)
    (sa, za), (sb, zb) = lw.locs[a_name].quant, lw.locs[b_name].quant
    cons = lw.consumers(out)
    relu = len(cons) == 1 and cons[0].op in ("Relu", "Clip") and out not in lw.g.outputs
    rng_t = cons[0].outputs[0] if relu else out
    so, zo = lw.quant_of(rng_t)
    if lw.quantized_model:
        off_a, ma, off_b, mb, off_o, sh, margin = exact_add_params(sa / so, sb / so, za, zb, zo, sign)
        mul = 1
        row.notes.append(f"int8 exact: TFLite's output bytes from the same input bytes, except where its value "
                         f"lies within {margin:.1g} output LSB of a rounding tie (21-bit input multipliers)")
    else:
        smax = max(sa, sb)
        ma, mb = int(round(sa / smax * ADD_ONE)), int(round(sb / smax * ADD_ONE))
        mul, sh = fx.fixed_mul(smax / ADD_ONE / so, 10, 31)   # keeps every product inside int32
        off_a, off_b, off_o = add_offsets(za, zb, zo, ma, sign * mb, mul, sh)
        mb *= sign
    # the SDK's QUANTIZED_ADD may write over an input it reads last (kmodel.v3.IN_PLACE)
    loc = lw.in_place(node, out, a_name, (so, zo)) or lw.in_place(node, out, b_name, (so, zo)) or \
        lw.u8_out(out, (so, zo))
    n = int(np.prod(loc.shape))
    lw.emit("QUANTIZED_ADD", dict(
        flags=1, main_mem_in_a_address=pa, main_mem_in_b_address=pb, main_mem_out_address=loc.u8,
        count=n, in_a_offset=off_a, in_a_mul=ma, in_a_shift=0, in_b_offset=off_b, in_b_mul=mb,
        in_b_shift=0, out_offset=off_o, out_mul=mul, out_shift=sh), row)
    if relu:
        clamp_after(lw, out, _act(lw.g, cons[0]), row)
        lw.traced(cons[0].outputs[0], "u8")
        row.tensor = cons[0].outputs[0]
        lw.alias(cons[0].outputs[0], out)
        row.notes.append(f"{cons[0].op} folded into the uint8 clamp")
        lw.folded.add(cons[0].name)


def table_refuses(g, node, opts):
    act = _act(g, node)
    if act is None:
        return "its bounds are not constants"
    moves = ("Transpose",) if getattr(opts, "format", "v3") == "v4" else ()     # v4 moves float maps
    if node.op == "Sigmoid" and (feeds_output(g, node.outputs[0], moves) or source_unit(g, node.inputs[0], opts) in
                                 ("input", CPU_F32)):
        return "float input or model output: the float LOGISTIC keeps full precision"
    return None


def quantize_clamp_refuses(g, node, opts):
    act = _act(g, node)
    if act is None or act["op"] not in ("Relu", "Clip"):
        return NA
    if source_unit(g, node.inputs[0], opts) != CPU_F32:
        return "its input is not a float map"
    return None


@lowering("Relu", "Clip", unit=CPU_U8, check=quantize_clamp_refuses, name="quantize_clamp")
def quantize_clamp(lw, node):
    """A ReLU / Clip of a float map (a CPU float layer's output: conv2d_transpose, a float conv)
    as QUANTIZE of that map to the activation's uint8 range: QUANTIZE saturates at codes 0 and
    255, a clamp that is exactly the activation's where those codes' values lie within its bounds
    (a ReLU: zero point 0). One rounding, where the map's own uint8 grid and a REQUANTIZE table
    after it round twice. Elsewhere (the codes reach past a bound, no float copy left): the table."""
    x, out = node.inputs[0], node.outputs[0]
    act = _act(lw.g, node)
    so, zo = lw.quant_of(out)
    if lw.locs[x].f32 is None or not saturation_clamps(act_bounds(act), (so, zo)):
        return activation_table(lw, node)
    row = lw.row(node, f"{act['op']} of a float map: QUANTIZE to its range (saturation is the clamp)",
                 in_shape=lw.shape(x), out_shape=lw.shape(out))
    src = lw.need_f32(x, row)
    lw.emit_quantize(src, out, lw.u8_out(out, (so, zo)).u8, (so, zo), row)
    lw.traced(out, "u8")


@lowering("Relu", "Clip", "LeakyRelu", "Tanh", "HardSigmoid", "HardSwish", "Sigmoid", "Elu", "Selu",
          "Softplus", "Mish", "Swish", unit=CPU_U8,
          check=table_refuses, name="activation_table")
def activation_table(lw, node):
    """An activation of one uint8 value is a table over the 256 values: REQUANTIZE, exact to the output step."""
    x, out = node.inputs[0], node.outputs[0]
    row = lw.row(node, "activation on uint8: REQUANTIZE table", in_shape=lw.shape(x), out_shape=lw.shape(out))
    src = lw.need_u8(x, row)
    s_in, z_in = lw.locs[x].quant
    so, zo = lw.quant_of(out)
    f, _ = fx.act_function(_act(lw.g, node))
    loc = lw.in_place(node, out, x, (so, zo)) or lw.u8_out(out, (so, zo))   # kmodel.v3/v4 IN_PLACE
    lw.emit("REQUANTIZE", dict(flags=1, main_mem_in_address=src, main_mem_out_address=loc.u8,
                               count=int(np.prod(loc.shape))), row, data={"table": table(f, s_in, z_in, so, zo)})
    lw.traced(out, "u8")


def concat_refuses(g, node, opts):
    """QUANTIZED_CONCAT / CONCAT copy each input as one range of the output: the dims before the
    axis must be 1 (a channel concat of a map; not rows (484, 12) + (484, 80) on axis 1)."""
    if node.attrs.get("axis", 1) not in (1, -3):
        return f"Concat on axis {node.attrs.get('axis')}: only channel concat (axis 1) is lowered"
    shape = g.shape(node.outputs[0])
    axis = node.attrs.get("axis", 1) % len(shape)
    const = [t for t in node.inputs if g.const(t) is not None]
    if const:       # a uniform block at an end is a Pad (passes/concat_pad.py)
        return (f"input {const[0]!r} {tuple(g.shape(const[0]) or ())} is a constant map: the runtime's concat "
                "copies maps that layers computed; a constant of one value at either end of the maps is "
                "lowered as a pad, other constants are not")
    if int(np.prod(shape[:axis])) != 1:
        return (f"Concat on axis {axis} of {shape}: each input is {int(np.prod(shape[:axis]))} ranges of the output "
                "(the SDK's concat copies one range per input)")
    return None


@lowering("Concat", unit=CPU_U8, check=concat_refuses)
def quantized_concat(lw, node):
    out = node.outputs[0]
    if feeds_output(lw.g, out, CONCAT_MOVES):
        return float_concat(lw, node)
    row = lw.row(node, "channel concat: QUANTIZED_CONCAT (memcpy) after requantizing inputs to one scale",
                 out_shape=lw.shape(out))
    so, zo = lw.quant_of(out)
    parts, tmp = [], []
    for t in node.inputs:
        src = lw.need_u8(t, row)
        s_in, z_in = lw.locs[t].quant
        n = int(np.prod(lw.locs[t].shape))
        if abs(s_in - so) > 1e-9 * so or z_in != zo:
            tmp.append(f"{out}:rq{len(tmp)}")
            dst = lw.alloc(tmp[-1], "u8", n)
            lw.emit("REQUANTIZE", dict(flags=1, main_mem_in_address=src, main_mem_out_address=dst,
                                       count=n), row, data={"table": table(lambda v: v, s_in, z_in, so, zo)})
            src = dst
        parts.append((t, src, n))
    loc = lw.u8_out(out, (so, zo))
    lw.concat_into(node, row, f"{out}:u8", loc.u8, parts, "u8", lambda at, run: lw.emit(
        "QUANTIZED_CONCAT", dict(flags=1, main_mem_out_address=at, input_count=len(run)), row, data={"ranges": run}))
    for name in tmp:
        lw.main.free(name + ":u8")


def float_concat(lw, node):
    """A model output: CONCAT of the float inputs (uint8 ones dequantized exactly), so scores next
    to boxes keep their own steps instead of one uint8 grid over both."""
    out = node.outputs[0]
    row = lw.row(node, "channel concat of a model output: float CONCAT (memcpy)", out_shape=lw.shape(out))
    parts = [(t, lw.need_f32(t, row), 4 * int(np.prod(lw.locs[t].shape))) for t in node.inputs]
    loc = lw.f32_out(out)
    lw.concat_into(node, row, f"{out}:f32", loc.f32, parts, "f32", lambda at, run: lw.emit(
        "CONCAT", dict(flags=1, main_mem_out_address=at, input_count=len(run)), row, data={"ranges": run}))


def _resize_sizes(g, node):
    c, h, w = g.shape(node.inputs[0])[1:]
    oc, oh, ow = g.shape(node.outputs[0])[1:]
    return h, w, oh, ow


def resize_refuses(g, node, opts):
    mode = node.attrs.get("mode", "nearest")
    if mode != "nearest":
        return (f"Resize mode {mode}: the SDK has nearest-neighbour only; use Resize mode nearest "
                "(UpSampling2D interpolation='nearest')")
    h, w, oh, ow = _resize_sizes(g, node)
    if oh % h or ow % w:
        return f"{h}x{w} -> {oh}x{ow} is not an integer scale"
    from .v4resize import nearest_is_floor
    if not nearest_is_floor(g, node):
        a = node.attrs
        return (f"coordinate_transformation_mode {a.get('coordinate_transformation_mode', 'half_pixel')} / "
                f"nearest_mode {a.get('nearest_mode', 'round_prefer_floor')} picks other pixels than the "
                "SDK's floor(o * in / out)")
    return None


@lowering("Resize", unit=CPU_U8, check=resize_refuses)
def resize_nearest(lw, node):
    x, out = node.inputs[0], node.outputs[0]
    c, h, w = lw.shape(x)
    oc, oh, ow = lw.shape(out)
    row = lw.row(node, "nearest upsampling: QUANTIZED_RESIZE_NEAREST_NEIGHBOR", in_shape=(c, h, w),
                 out_shape=(oc, oh, ow))
    src = lw.need_u8(x, row)
    loc = lw.u8_out(out, lw.locs[x].quant)
    lw.emit("QUANTIZED_RESIZE_NEAREST_NEIGHBOR", dict(
        flags=1, main_mem_in_address=src, main_mem_out_address=loc.u8, in_shape=(w, h, c),
        out_width=ow, out_height=oh, align_corners=0), row)
    lw.traced(out, "u8")


def pool_refuses(g, node, opts):
    a = node.attrs
    if a.get("ceil_mode") or a.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID") or \
            any(d != 1 for d in a.get("dilations", [1, 1])):
        return "ceil_mode / auto_pad / dilations: only explicit pads are lowered"
    if node.op == "AveragePool" and a.get("count_include_pad", 0):
        return "AveragePool with count_include_pad=1; the SDK averages in-range taps only"
    return None


@lowering("MaxPool", unit=CPU_U8, check=pool_refuses)
def max_pool(lw, node):
    """Max commutes with the uint8 quantization: QUANTIZED_MAX_POOL2D is exact (out-of-map taps
    are skipped, as ONNX's -inf padding)."""
    x, out = node.inputs[0], node.outputs[0]
    a = node.attrs
    c, h, w = lw.shape(x)
    oc, oh, ow = lw.shape(out)
    how = "QUANTIZED_MAX_POOL2D" if lw.format != "v4" else "float reduce_window2d (v4 has no uint8 max pool)"
    row = lw.row(node, f"max pool not fusable into a KPU conv: {how}", in_shape=(c, h, w), out_shape=(oc, oh, ow))
    src = lw.need_u8(x, row)
    k, s = a["kernel_shape"], a.get("strides", [1, 1])
    pads = list(a.get("pads", [0, 0, 0, 0]))
    loc = lw.u8_out(out, lw.locs[x].quant)
    kw = {}
    if lw.format == "v4":     # v4 pools in float, a slice of channels at a time (v4emit._max_pool)
        per_c, room = 4 * (h * w + oh * ow), lw.float_room()   # within MAIN_TARGET of the live set
        fast = max(c1 - c0 for c0, c1 in float_slices(c, h * w, per_c, room))
        kw["data"] = {"float_room": room}
        if fast > 1:
            lw.smaller[node.name + SLICES] = True       # the same max: the same output bytes
        # by its own name: the node's name asks for the pool that kpu_pool would have run on the KPU
        if fast > 1 and ("*" in lw.opts.small or node.name + SLICES in lw.opts.small):
            kw["data"] = {"float_room": 0}
            row.form = f"float temporaries a channel at a time, {per_c:,} B, not {fast * per_c:,} B"
    lw.emit("QUANTIZED_MAX_POOL2D", dict(
        flags=1, main_mem_in_address=src, main_mem_out_address=loc.u8, in_shape=(w, h, c),
        out_shape=(ow, oh, oc), kernel_width=k[1], kernel_height=k[0], stride_width=s[1],
        stride_height=s[0], padding_width=pads[1], padding_height=pads[0]), row, **kw)
    lw.traced(out, "u8")


def zero_pad_refuses(g, node, opts):
    """Why kmodel v3, which has no pad layer, cannot pad this map with a kernel-1
    QUANTIZED_MAX_POOL2D whose output is the padded map (its taps outside the input are skipped
    and its max starts at code 0): exact for a pad of code 0, the value 0 of a map >= 0."""
    from tl2k210.passes.pad_into_conv import constant_pads, nonnegative
    r = constant_pads(g, node) if len(g.shape(node.inputs[0]) or ()) == 4 else None
    if r is None:
        return "only a constant pad of H and W (no crop) is a kernel-1 max pool"
    if r[1] != 0 or not nonnegative(g, node.inputs[0]):
        return (f"pad value {r[1]:g}: the kernel-1 QUANTIZED_MAX_POOL2D pads with code 0, the value 0 of a "
                "map whose range starts at 0 (after a ReLU / ReLU6)")
    return None


@lowering("Pad", unit=CPU_U8, check=zero_pad_refuses, formats=("v3",), name="zero_pad", explicit=True)
def zero_pad(lw, node):
    """A zero pad of a map >= 0 as a kernel-1 QUANTIZED_MAX_POOL2D: out_shape the padded map,
    padding the pads before (in_origin = out - padding); exact where 0 is code 0 (checked)."""
    from tl2k210.errors import UnsupportedOpError
    from tl2k210.passes.pad_into_conv import constant_pads
    x, out = node.inputs[0], node.outputs[0]
    (t, l, b, r), _ = constant_pads(lw.g, node)
    c, h, w = lw.shape(x)
    row = lw.row(node, "zero pad: QUANTIZED_MAX_POOL2D, kernel 1 (kmodel v3 has no pad layer)",
                 in_shape=(c, h, w), out_shape=lw.shape(out))
    src = lw.need_u8(x, row)
    s, z = lw.locs[x].quant
    if z:
        raise UnsupportedOpError(f"node {node.name!r}: the pad value 0 is code {z} of its input's uint8 range, "
                                 "but the kernel-1 QUANTIZED_MAX_POOL2D pads with code 0: use --format v4")
    loc = lw.u8_out(out, (s, z))
    lw.emit("QUANTIZED_MAX_POOL2D", dict(
        flags=1, main_mem_in_address=src, main_mem_out_address=loc.u8, in_shape=(w, h, c),
        out_shape=(w + l + r, h + t + b, c), kernel_width=1, kernel_height=1, stride_width=1,
        stride_height=1, padding_width=l, padding_height=t), row)
    lw.traced(out, "u8")


def _channel_pads(g, node):
    """((before, after), value) of a constant Pad of the channel axis only, or None."""
    p = pads_of(g, node) if len(g.shape(node.inputs[0]) or ()) == 4 else None
    if not isinstance(p, tuple) or p[2] != "constant":
        return None
    (n, ch, h, w), value, _ = p
    if n != (0, 0) or h != (0, 0) or w != (0, 0) or min(ch) < 0 or not any(ch):
        return None
    return ch, value


def channel_pad_refuses(g, node, opts):
    return None if _channel_pads(g, node) is not None else NA      # zero_pad's, or no v3 form's


@lowering("Pad", unit=CPU_U8, check=channel_pad_refuses, formats=("v3",), name="channel_pad")
def channel_pad(lw, node):
    """A constant pad of the channel axis (BlazeFace's residual blocks widen a map with zero
    channels) in kmodel v3, which has no pad layer: the added channels are one buffer of the
    value's code, written by a QUANTIZED_ADD whose multipliers are 0 (every output is out_offset;
    it reads its own output, the in-place form the SDK runs), joined to the input by a
    QUANTIZED_CONCAT (channels are contiguous in CHW). The output keeps the input's grid: exact."""
    x, out = node.inputs[0], node.outputs[0]
    (before, after), value = _channel_pads(lw.g, node)
    c, h, w = lw.shape(x)
    row = lw.row(node, "channel pad: QUANTIZED_ADD fill (multipliers 0) + QUANTIZED_CONCAT (kmodel v3 has no "
                       "pad layer)", in_shape=(c, h, w), out_shape=lw.shape(out))
    src = lw.need_u8(x, row)
    s, z = quant = lw.locs[x].quant
    code = int(np.clip(np.rint(value / s + z), 0, U8[-1]))
    if abs((code - z) * s - value) > 1e-6 * max(1.0, abs(value)):
        row.notes.append(f"pad value {value:g} on the input's grid: code {code} ({(code - z) * s:.4g})")
    n = max(before, after) * h * w
    fill = lw.alloc(f"{out}:fill", "u8", n)
    lw.emit("QUANTIZED_ADD", dict(
        flags=1, main_mem_in_a_address=fill, main_mem_in_b_address=fill, main_mem_out_address=fill, count=n,
        in_a_offset=0, in_a_mul=0, in_a_shift=0, in_b_offset=0, in_b_mul=0, in_b_shift=0, out_offset=code,
        out_mul=0, out_shift=0), row)
    parts = [(f"{out}:fill", fill, k * h * w) for k in (before,) if k] + [(x, src, c * h * w)] + \
        [(f"{out}:fill", fill, k * h * w) for k in (after,) if k]
    loc = lw.u8_out(out, quant)
    lw.concat_into(node, row, f"{out}:u8", loc.u8, parts, "u8", lambda at, run: lw.emit(
        "QUANTIZED_CONCAT", dict(flags=1, main_mem_out_address=at, input_count=len(run)), row, data={"ranges": run}))
    lw.main.free(f"{out}:fill:u8")


@lowering("GlobalMaxPool", unit=CPU_U8)
def global_max_pool(lw, node):
    """QUANTIZED_MAX_POOL2D with a whole-map window (the SDK runs no global max pool; max commutes
    with the uint8 quantization, so this is exact)."""
    x, out = node.inputs[0], node.outputs[0]
    c, h, w = lw.shape(x)
    row = lw.row(node, "global max pool: QUANTIZED_MAX_POOL2D over the whole map", in_shape=(c, h, w),
                 out_shape=(c,))
    src = lw.need_u8(x, row)
    loc = lw.u8_out(out, lw.locs[x].quant)
    lw.emit("QUANTIZED_MAX_POOL2D", dict(
        flags=1, main_mem_in_address=src, main_mem_out_address=loc.u8, in_shape=(w, h, c),
        out_shape=(1, 1, c), kernel_width=w, kernel_height=h, stride_width=1, stride_height=1,
        padding_width=0, padding_height=0), row)
    lw.traced(out, "u8")


# ------------------------------------------------------------------ float layers
@lowering("AveragePool", unit=CPU_F32, check=pool_refuses)
def average_pool(lw, node):
    """An average pool the KPU cannot fuse: float AVERAGE_POOL2D (in-range taps only, as ONNX
    count_include_pad=0)."""
    x, out = node.inputs[0], node.outputs[0]
    a = node.attrs
    c, h, w = lw.shape(x)
    oc, oh, ow = lw.shape(out)
    k, st = a["kernel_shape"], a.get("strides", [1, 1])
    pads = list(a.get("pads", [0, 0, 0, 0]))
    row = lw.row(node, "average pool: float AVERAGE_POOL2D (no uint8 version in the SDK)",
                 in_shape=(c, h, w), out_shape=(oc, oh, ow))
    xl = lw.locs[x]
    to_u8 = not lw.float_readers(out)
    room = lw.float_room(oc * oh * ow if to_u8 else 0)
    whole = 4 * (c * h * w + oc * oh * ow)           # the float copies of one big layer
    if xl.f32 is not None or xl.pixels is not None or room is None or whole <= room:
        src = lw.need_f32(x, row)
        loc = lw.f32_out(out, (oc, oh, ow))
        lw.emit("AVERAGE_POOL2D", dict(
            flags=1, main_mem_in_address=src, main_mem_out_address=loc.f32, in_shape=(w, h, c),
            out_shape=(ow, oh, oc), kernel_width=k[1], kernel_height=k[0], stride_width=st[1],
            stride_height=st[0], padding_width=pads[1], padding_height=pads[0], act=0), row)
        lw.traced(out, "f32")
        return
    _sliced_average_pool(lw, node, (c, h, w), (oh, ow), k, st, pads, to_u8, room, row)


def _sliced_average_pool(lw, node, shape, out_hw, k, st, pads, to_u8, room, row):
    """The float pool a slice at a time, within `room` bytes of float scratch: dequantize a slice
    of the uint8 map, pool it, and quantize it into the uint8 output (no reader needs float) or
    leave it in the float output. A slice is a range of channels; or, when no window crosses a
    channel's rows (no vertical padding, kernel height <= stride, every row read), a range of
    output rows of the (C*H, W) map, one channel's rows after the other's: the same windows."""
    x, out = node.inputs[0], node.outputs[0]
    (c, h, w), (oh, ow) = shape, out_hw
    s, z = lw.locs[x].quant
    rows = pads[0] == pads[2] == 0 and k[0] <= st[0] and h == oh * st[0]
    units, u_in, u_out = (c * oh, st[0] * w, ow) if rows else (c, h * w, oh * ow)
    slices = float_slices(units, u_in, 4 * (u_in + u_out), room)
    n = max(b - a for a, b in slices)
    src = lw.need_u8(x, row)
    loc = lw.u8_out(out, lw.quant_of(out)) if to_u8 else lw.f32_out(out, (c, oh, ow))
    a_buf, b_buf = lw.main.alloc(f"{out}:dq", 4 * n * u_in), lw.main.alloc(f"{out}:pool", 4 * n * u_out)
    parts = []
    for u0, u1 in slices:
        m = u1 - u0
        in_shape, out_shape = ((w, m * st[0], 1), (ow, m, 1)) if rows else ((w, h, m), (ow, oh, m))
        lw.emit("DEQUANTIZE", dict(flags=1, main_mem_in_address=src + u0 * u_in, mem_out_address=a_buf,
                                   count=m * u_in, scale=s, bias=-z * s), row)
        dst = b_buf if to_u8 else loc.f32 + 4 * u0 * u_out
        parts.append(lw.emit("AVERAGE_POOL2D", dict(
            flags=1, main_mem_in_address=a_buf, main_mem_out_address=dst, in_shape=in_shape,
            out_shape=out_shape, kernel_width=k[1], kernel_height=k[0], stride_width=st[1],
            stride_height=st[0], padding_width=pads[1], padding_height=0 if rows else pads[0], act=0), row))
        if to_u8:
            so, zo = loc.quant
            parts[-1] = lw.emit("QUANTIZE", dict(flags=0, main_mem_in_address=b_buf, mem_out_address=loc.u8 + u0 * u_out,
                                                 count=m * u_out, scale=so, bias=-zo * so), row)
    lw.main.free(f"{out}:dq")
    lw.main.free(f"{out}:pool")
    lw.trace_map[out] = (parts[0] if len(parts) == 1 else tuple(parts), "u8" if to_u8 else "f32")
    row.notes.append(f"dequantized and pooled {n} {'output rows' if rows else 'channels'} at a time "
                     f"({4 * n * (u_in + u_out):,} B of float scratch)" + (", quantized into the uint8 output"
                                                                          if to_u8 else ""))


@lowering("GlobalAveragePool", unit=CPU_F32)
def global_average_pool(lw, node):
    """A uint8 map with no float copy yet is dequantized and pooled a slice of channels at a time
    (channels are contiguous, and each one's mean is its own): the float scratch is no bigger
    than the uint8 map instead of four times it (EfficientNetB0's first squeeze-and-excite pool
    needed a 1.7 MiB float copy of a 441 KiB map). The same values as one big layer."""
    x, out = node.inputs[0], node.outputs[0]
    c, h, w = lw.shape(x)
    row = lw.row(node, "global average pool: float GLOBAL_AVERAGE_POOL2D (the SDK has no uint8 version)",
                 in_shape=(c, h, w), out_shape=(c,))
    xl, hw_ = lw.locs[x], h * w
    if lw.quantized_model and lw.int8_rounding == "reference" and xl.quant is not None and xl.quant[1] == 0:
        # every sum is >= 0 (the input's lowest byte is its zero): TFLite's reference MEAN rounds
        # it e higher, which the QUANTIZE reading the mean adds (Lowering.need_u8)
        lw.u8_offset[out] = fx.mean_rounding_offset(xl.quant[0], lw.quant_of(out)[0], hw_)
        row.notes.append(f"mean rounded as TFLite's reference MEAN: {lw.u8_offset[out]:.3g} LSB up")
    slices = float_slices(c, hw_, 4 * hw_, lw.float_room(4 * c))
    per = slices[0][1]                                             # channels per float slice
    if xl.f32 is not None or xl.pixels is not None or len(slices) == 1:
        src = lw.need_f32(x, row)
        loc = lw.f32_out(out)
        lw.emit("GLOBAL_AVERAGE_POOL2D", dict(flags=1, main_mem_in_address=src, main_mem_out_address=loc.f32,
                                              kernel_size=hw_, channels=c), row)
        lw.traced(out, "f32")
        return
    src = lw.need_u8(x, row)
    s, z = xl.quant
    loc = lw.f32_out(out)
    scratch = lw.main.alloc(f"{out}:slice", 4 * per * hw_)
    for c0 in range(0, c, per):
        n = min(per, c - c0)
        lw.emit("DEQUANTIZE", dict(flags=1, main_mem_in_address=src + c0 * hw_, mem_out_address=scratch,
                                   count=n * hw_, scale=s, bias=-z * s), row)
        lw.emit("GLOBAL_AVERAGE_POOL2D", dict(flags=1, main_mem_in_address=scratch,
                                              main_mem_out_address=loc.f32 + 4 * c0, kernel_size=hw_, channels=n), row)
    lw.main.free(f"{out}:slice")
    row.notes.append(f"dequantized and pooled {per} channels at a time ({4 * per * hw_:,} B of float scratch)")
    lw.traced(out, "f32")


def _vector_op(lw, node, kind, why):
    x, out = node.inputs[0], node.outputs[0]
    n = int(np.prod(lw.shape(x)))
    row = lw.row(node, why, in_shape=lw.shape(x), out_shape=lw.shape(out))
    src = lw.need_f32(x, row)
    loc = lw.f32_out(out)
    lw.emit(kind, dict(flags=1, main_mem_in_address=src, main_mem_out_address=loc.f32, channels=n), row)
    lw.traced(out, "f32")


def softmax_refuses(g, node, opts):
    """The SDK's SOFTMAX normalises the whole tensor as one vector: fine when the softmax axis
    (opset >= 13), or the flattened axes from `axis` on (opset < 13), hold every element."""
    shape = g.shape(node.inputs[0])
    old = g.meta.get("opset", 13) < 13
    axis = node.attrs.get("axis", 1 if old else -1) % len(shape)
    rest = shape[1:axis] if old else [d for i, d in enumerate(shape) if i != axis]
    if any(d > 1 for d in rest):
        return f"softmax over axis {axis} of {shape}: the SDK's SOFTMAX normalises one vector"
    return None


@lowering("Softmax", unit=CPU_F32, check=softmax_refuses)
def softmax(lw, node):
    """The SDK's SOFTMAX (nncase v0.1) starts its max at FLT_MIN, the least positive float: where
    every logit of a sample is below about -87, exp underflows and the output is 0/0 = NaN
    (jomjol's digit classifiers, logits -85 .. -139; hunt 19). Softmax ignores a constant shift:
    where the calibrated logits reach below SOFTMAX_LOW, their own DEQUANTIZE shifts them by minus
    the calibrated minimum, so none is negative and the max the SOFTMAX finds is the logits' own
    (float logits: their float dense layer's bias, fc._softmax_shift)."""
    x, out = node.inputs[0], node.outputs[0]
    loc = lw.locs[x]
    lo = lw.rng(x)[0]
    if loc.f32 is not None or loc.pixels is not None or lo >= SOFTMAX_LOW:
        _vector_op(lw, node, "SOFTMAX", "float SOFTMAX")
        return
    n = int(np.prod(lw.shape(x)))
    row = lw.row(node, "float SOFTMAX", in_shape=lw.shape(x), out_shape=lw.shape(out))
    src = lw.need_u8(x, row)
    s, z = loc.quant
    shifted = lw.alloc(x, "f32shift", 4 * n)
    lw.emit("DEQUANTIZE", dict(flags=1, main_mem_in_address=src, mem_out_address=shifted, count=n, scale=s,
                               bias=-z * s - lo), row)
    row.notes.append(f"logits dequantized {-lo:+.4g}, none negative (softmax ignores a shift; the SDK's SOFTMAX "
                     "starts its max at FLT_MIN, and logits all under -87 would give NaN)")
    dst = lw.f32_out(out)
    lw.emit("SOFTMAX", dict(flags=1, main_mem_in_address=shifted, main_mem_out_address=dst.f32, channels=n), row)
    lw.main.free(f"{x}:f32shift")
    lw.traced(out, "f32")


def l2_refuses(g, node, opts):
    shape = g.shape(node.inputs[0])
    if node.attrs.get("p", 2) != 2 or sum(d > 1 for d in shape) > 1:
        return "only the L2 norm of a vector is lowered"
    return None


@lowering("LpNormalization", unit=CPU_F32, check=l2_refuses)
def l2_normalization(lw, node):
    _vector_op(lw, node, "L2_NORMALIZATION", "float L2_NORMALIZATION")


@lowering("Sigmoid", unit=CPU_F32)
def sigmoid(lw, node):
    x, out = node.inputs[0], node.outputs[0]
    row = lw.row(node, "float LOGISTIC", in_shape=lw.shape(x), out_shape=lw.shape(out))
    lw.need_f32(x, row)
    logistic(lw, x, out, row, node)

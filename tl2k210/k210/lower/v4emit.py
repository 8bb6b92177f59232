"""A lowering plan written as kmodel v4 (nncase v0.2's format, docs/kmodel-format.md#kmodel-v4).

The plan is the lowering's list of layers: SDK v3 layers (what `conv.py`, `cpu.py`, `fc.py` emit,
both formats share them) and v4-only nodes (`V4Op`, from the v4 lowerings). `assemble` turns each
v3 layer into the v4 node(s) that compute the same thing (one small function per layer type,
`@v3_layer`), places constants in the model's constants blob, and builds the header: a uint8
KPU-memory input when the model starts with a KPU conv on the image
(docs/kmodel-format.md#v4-inputs-and-outputs), else the image as uint8 pixels or a float vector
in main memory; float32 outputs in main memory.

Main memory is the lowering's first-fit allocation with lifetimes (buffers are reused once their
last reader ran); a v3 layer that needs more than one v4 node gets its temporaries in a scratch
area above that allocation, shared by all of them (each lives inside one layer only). Byte
layouts are `kmodel/v4.py`'s (the tables the reader uses), so what is written reads back the same.
"""
from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass, field

import numpy as np

from tl2k210.errors import UnsupportedOpError
from tl2k210.k210 import hardware as hw
from tl2k210.k210.kmodel import kpu as kpu_fmt, v3
from tl2k210.k210.kmodel.v4 import (DT_FLOAT32, DT_UINT8, MEM_CONST, MEM_KPU, MEM_MAIN, OPCODE_BY_NAME,
                                    KModelV4, Node, overlapping_io)

from .memory import PARK_BASE, float_slices

F32, U8 = DT_FLOAT32, DT_UINT8
BYTES = {F32: 4, U8: 1}
FLT_MAX = float(np.finfo(np.float32).max)
NO_CLAMP = (-FLT_MAX, FLT_MAX)           # fused_activation of an unclamped float op


def float_clamp(act):
    """fused_activation (min, max) of a ReLU / Clip, else None."""
    if act is None:
        return NO_CLAMP
    if act["op"] == "Relu":
        return (0.0, FLT_MAX)
    if act["op"] == "Clip":
        return (max(float(act.get("min", -FLT_MAX)), -FLT_MAX), min(float(act.get("max", FLT_MAX)), FLT_MAX))
    return None
NO_RANGE = (0, 0, 0, 0)                  # kpu_conv2d without a main-memory output
ALIGN = 8                                # main-memory and constant allocations (docs/kmodel-format.md)


@dataclass
class Const:
    """A constant operand: placed in the constants blob, referenced by a mem_const range."""
    value: np.ndarray
    dtype: int = F32

    def tobytes(self) -> bytes:
        return np.ascontiguousarray(self.value, "<f4" if self.dtype == F32 else "u1").tobytes()


@dataclass
class V4Op:
    """A v4 node before placement: `fields` has every struct field of the opcode (ranges as
    tuples or `Const`), `data` its variable tail (kmodel/v4.py `Node`)."""
    name: str
    fields: dict
    data: dict = field(default_factory=dict)
    conv: object = None
    part: bool = False       # writes a slice of its v3 layer's output (the trace joins the parts)


def main(dt: int, addr: int, count: int) -> tuple:
    """memory_range of `count` elements of datatype `dt` at byte `addr` of main memory."""
    return (MEM_MAIN, dt, int(addr), int(count) * BYTES[dt])


def kpu_range(line: int, lines: int) -> tuple:
    return (MEM_KPU, U8, line * hw.LINE_BYTES, lines * hw.LINE_BYTES)


def shape4(shape) -> tuple:
    """A per-sample shape (C, H, W) / (C,) / () as the runtime's NCHW runtime_shape_t."""
    s = tuple(int(v) for v in shape)
    if len(s) == 3:
        return (1,) + s
    return (1,) * (4 - len(s)) + s if len(s) <= 4 else None


def pad_scalar(value, dt: int) -> tuple:
    """The `scalar` of a pad node. The value is stored as float32 (what nncase writes, also for
    uint8 tensors; docs/kmodel-format.md#v4-opcodes). For uint8 a zero point z is stored as the float whose value
    truncates to z *and* whose first byte is z, so the runtime pads with z whether it converts
    the float or reads the storage's first byte."""
    if dt == U8 and int(value):
        z = int(value)
        bits = (struct.unpack("<I", struct.pack("<f", float(z)))[0] & ~0xFF) | z
        return (F32, struct.pack("<I", bits))
    return (F32, struct.pack("<f", float(value)))


def nnil_code(*ops) -> bytes:
    """NNIL byte code (docs/kmodel-format.md#v4-opcodes; the opcode table the emulator runs) from mnemonics; numbers
    become ldc_r4 immediates."""
    from tl2k210.k210.emulator.neutral import NNIL_BINARY, NNIL_UNARY
    table = {"nop": 0x00, "dup": 0x01, "pop": 0x02, "lda_0": 0x03, "ldc_r4_0": 0x04, "ldc_r4_1": 0x05,
             "clamp": 0x80, "ret": 0xA0}
    table.update({v: k for k, v in NNIL_UNARY.items()})
    table.update({v: k for k, v in NNIL_BINARY.items()})
    out = bytearray()
    for op in ops:
        if isinstance(op, str):
            out.append(table[op])
        else:
            out.append(0x06)
            out += struct.pack("<f", float(op))
    return bytes(out)


#: 1 / (1 + exp(-x)): the v3 LOGISTIC as one NNIL method
SIGMOID = ("ldc_r4_1", "lda_0", "neg", "exp", "ldc_r4_1", "add", "div", "ret")


# ---------------------------------------------------------------------------------------------
# pixels in main memory (a v4 model whose first layer runs on the CPU)
def pixel_affine(opts, c):
    sc = np.resize(np.asarray(opts.input_scale, np.float64), c)
    of = np.resize(np.asarray(opts.input_offset, np.float64), c)
    return sc, of


def pixel_zero(sc, of):
    """(z, residual) per channel of the preprocessing x = pixel * sc + of read as x = sc (q - z) +
    residual: z the one pixel code nearest every channel's zero (a KPU conv's pad value)."""
    z = int(np.clip(round(float(np.mean(-of / sc))), 0, 255))
    return z, of + sc * z


def pads_exactly(sc, resid) -> bool:
    """Does padding with z read every channel within half a pixel step of its 0?"""
    return not np.any(np.abs(resid) > sc / 2 * (1 + 1e-9))


def pixel_quant(opts, c):
    """(scale, zero point) when the preprocessing x = pixel * s + o is one affine map for every
    channel with an integer zero point -o/s: the pixels are then the tensor's uint8 form."""
    sc, of = pixel_affine(opts, c)
    z = -of[0] / sc[0]
    if np.allclose(sc, sc[0], rtol=1e-7, atol=0) and np.allclose(of, of[0], rtol=1e-7, atol=1e-12) \
            and abs(z - round(z)) < 1e-6 and 0 <= round(z) <= 255:
        return float(sc[0]), int(round(z))
    return None


def pixel_fold(lw, x, pads):
    """(scale, residual, zero point z, E[q - z] or None), per channel: x = scale (q - z) +
    residual, for a conv that reads the image's uint8 pixels in main memory (lw.pixel_main) and
    folds the preprocessing into its weights and bias; None where x is no such image, or where the
    conv pads and some channel's residual is over half a pixel step: a padded tap reads float 0
    where the fold assumes the residual (the pad value z does the same), an error under the
    pixels' own rounding only while |residual| <= scale / 2 (input range -1..1: scale / 2); there
    the image is requantized (an extra rounding of every pixel)."""
    loc = lw.locs[x]
    if x != lw.pixel_main or loc.pixels is None:
        return None
    sc, of = pixel_affine(lw.opts, loc.shape[0])
    z, resid = pixel_zero(sc, of)
    if not pads_exactly(sc, resid) and any(pads):
        return None
    mean = lw.opts.channel_means.get(x)
    return sc, resid, z, None if mean is None else (np.asarray(mean, np.float64) - resid) / sc


def dequantize_pixels(lw, t, row):
    """The float model input from the uint8 pixels: dequantize, then the per-channel affine map
    when the channels differ (a broadcasting mul, left out where every scale is 1, and add), each
    in place in the one float buffer (binary reads each element before it writes it,
    kmodel.v4.IN_PLACE): one float copy of the image, not one per step."""
    loc = lw.locs[t]
    c = loc.shape[0]
    n = int(np.prod(loc.shape))
    sc, of = pixel_affine(lw.opts, c)
    loc.f32 = lw.alloc(t, "f32", 4 * n)
    uniform = np.allclose(sc, sc[0], rtol=1e-7, atol=0) and np.allclose(of, of[0], rtol=1e-7, atol=1e-12)
    s, o = (float(sc[0]), float(of[0])) if uniform else (1.0, 0.0)
    # dequantize computes q * inv + (-zp * inv) with inv = 1.f / scale (docs/kmodel-format.md#v4-interpreter):
    # scale = 1/s, and the offset through zp only when it is an integer number of steps (else an
    # add follows)
    zp = -o / s
    if abs(zp - round(zp)) > 1e-6:
        zp, add = 0, o
    else:
        zp, add = int(round(zp)), 0.0
    shp = shape4(loc.shape)
    steps = []
    if not uniform:
        steps += [] if np.all(sc == 1.0) else [(Const(sc.astype(np.float32)), 2, (1, c, 1, 1))]
        steps += [(Const(of.astype(np.float32)), 0, (1, c, 1, 1))]
    elif add:
        steps += [(Const(np.float32([add])), 0, (1, 1, 1, 1))]
    f32 = main(F32, loc.f32, n)
    lw.emit_v4("dequantize", dict(input=main(U8, loc.pixels, n), output=f32, quant_param=(zp, 1.0 / s)), row)
    for b, op, b_shape in steps:
        lw.emit_v4("binary", dict(input_a=f32, input_b=b, binary_op=op, in_a_shape=shp, in_b_shape=b_shape,
                                  out_shape=shp, output=f32, fused_activation=NO_CLAMP), row)
    lw.traced(t, "f32")
    row.notes.append("image pixels dequantized to the float input")
    return loc.f32


def requantize_pixels(lw, t, row):
    """The image on its tensor's uint8 grid straight from the pixels where the preprocessing
    differs by channel: one 256-entry table a channel (REQUANTIZE: v4 table_lookup1d), pixel p of
    channel c to round((p * s_c + o_c) / s + z), exact to the grid's step. No float copy of the
    image (RetinaFace's per-channel BGR mean at 640x640 had three 4.8 MiB float buffers alive)."""
    loc = lw.locs[t]
    c, hw = loc.shape[0], int(np.prod(loc.shape[1:]))
    sc, of = pixel_affine(lw.opts, c)
    if loc.quant is None:
        loc.quant = lw.quant_of(t)
    s, z = loc.quant
    zp = round(z + lw.u8_offset.get(t, 0.0))       # the v4 quantize's integer zero point (_quant)
    loc.u8 = lw.alloc(t, "u8", c * hw)
    px = np.arange(np.iinfo(np.uint8).max + 1, dtype=np.float64)     # every pixel value: a table's index
    for ch in range(c):
        lw.emit("REQUANTIZE", dict(flags=0, main_mem_in_address=loc.pixels + ch * hw,
                                   main_mem_out_address=loc.u8 + ch * hw, count=hw), row,
                data={"table": np.clip(np.rint((px * sc[ch] + of[ch]) / s + zp), 0, px[-1]).astype(np.uint8)})
    lw.traced(t, "u8")
    row.notes.append(f"image pixels to the uint8 grid: a table a channel ({c} channels' own preprocessing)")
    return loc.u8


# ---------------------------------------------------------------------------------------------
# v3 layer -> v4 nodes. Each function returns the V4Ops of one layer; `ctx(nbytes)` gives a
# temporary of that layer (main memory above the lowering's allocation).
FROM_V3 = {}


def v3_layer(*names):
    def deco(fn):
        for n in names:
            FROM_V3[n] = fn
        return fn
    return deco


def _count(f):
    return f["count"]


@v3_layer("K210_CONV")
def _conv(layer, ctx):
    src = layer.conv
    conv = kpu_fmt.KpuConv(dict(src.args), src.weights, src.bn, src.act, src.reserved,
                           src.bn_reserved, src.act_reserved)
    if conv.weights.dtype.itemsize != 1:
        raise UnsupportedOpError("kmodel v4 has 8-bit KPU weights only (--weight-bits 8)")
    f = layer.fields
    out = main(U8, f["main_mem_out_address"], int(np.prod(conv.out_shape))) if f["flags"] & 1 else NO_RANGE
    return [V4Op("kpu_conv2d", dict(main_mem_output=out, batches=1, reserved0=0), conv=conv)]


@v3_layer("QUANTIZE", "DEQUANTIZE")
def _quant(layer, ctx):
    f = layer.fields
    s, b = f["scale"], f["bias"]                 # v3: x = q * s + b; v4: q = x * scale + zp
    qp = (int(round(-b / s)), 1.0 / s)
    if layer.name == "QUANTIZE":
        io = main(F32, f["main_mem_in_address"], _count(f)), main(U8, f["mem_out_address"], _count(f))
    else:
        io = main(U8, f["main_mem_in_address"], _count(f)), main(F32, f["mem_out_address"], _count(f))
    return [V4Op(layer.name.lower(), dict(input=io[0], output=io[1], quant_param=qp))]


@v3_layer("QUANTIZED_ADD")
def _qadd(layer, ctx):
    f = layer.fields
    n = _count(f)
    s = (1, 1, 1, n)
    # v3 shifts the sum when both shifts are equal, v4 each input: the same for the 0 shifts cpu.py writes
    assert f["in_a_shift"] == f["in_b_shift"] == 0, "QUANTIZED_ADD with input shifts"
    return [V4Op("quantized_binary", dict(
        input_a=main(U8, f["main_mem_in_a_address"], n), input_b=main(U8, f["main_mem_in_b_address"], n),
        output=main(U8, f["main_mem_out_address"], n), binary_op=0, in_a_shape=s, in_b_shape=s,
        out_shape=s, input_a_offset=f["in_a_offset"], input_a_mul=f["in_a_mul"],
        input_a_shift=f["in_a_shift"], input_b_offset=f["in_b_offset"], input_b_mul=f["in_b_mul"],
        input_b_shift=f["in_b_shift"], output_offset=f["out_offset"], output_mul=f["out_mul"],
        output_shift=f["out_shift"]))]


@v3_layer("ADD")
def _add(layer, ctx):
    f = layer.fields
    n = _count(f)
    s = (1, 1, 1, n)
    return [V4Op("binary", dict(
        input_a=main(F32, f["main_mem_in_a_address"], n), input_b=main(F32, f["main_mem_in_b_address"], n),
        output=main(F32, f["main_mem_out_address"], n), binary_op=0, in_a_shape=s, in_b_shape=s,
        out_shape=s, fused_activation=NO_CLAMP))]


@v3_layer("REQUANTIZE")
def _requantize(layer, ctx):
    f = layer.fields
    n = _count(f)
    return [V4Op("table_lookup1d", dict(input=main(U8, f["main_mem_in_address"], n),
                                        table=Const(np.asarray(layer.data["table"], np.uint8), U8),
                                        output=main(U8, f["main_mem_out_address"], n)))]


@v3_layer("QUANTIZED_CONCAT", "CONCAT")
def _concat(layer, ctx):
    """v3 concat = memcpy of byte ranges one after the other: a v4 concat with outer_size 1,
    inner_size 1 and each input's byte count as its dim."""
    dt = U8 if layer.name == "QUANTIZED_CONCAT" else F32
    ranges = layer.data["ranges"]
    total = sum(size for _, size in ranges)
    return [V4Op("concat", dict(output=(MEM_MAIN, dt, layer.fields["main_mem_out_address"], total),
                                inner_size=1, outer_size=1, inputs_count=len(ranges)),
                 data={"inputs": [(MEM_MAIN, dt, a, size) for a, size in ranges],
                       "dims": [size for _, size in ranges]})]


@v3_layer("QUANTIZED_RESIZE_NEAREST_NEIGHBOR", "RESIZE_NEAREST_NEIGHBOR")
def _resize(layer, ctx):
    f = layer.fields
    w, h, c = f["in_shape"]
    dt = U8 if layer.name.startswith("QUANTIZED") else F32
    ow, oh = f["out_width"], f["out_height"]
    return [V4Op("resize_image", dict(input=main(dt, f["main_mem_in_address"], w * h * c),
                                      output=main(dt, f["main_mem_out_address"], ow * oh * c),
                                      in_shape=(1, c, h, w), out_h=oh, out_w=ow, mode=1, align_corners=False))]


def _window(f, w, h, ow, oh):
    """reduce_window2d window fields for a v3 pool (in_origin = out * stride - padding, output
    size given): the padding after is what makes the runtime's output size the v3 one."""
    kh, kw, sh, sw = f["kernel_height"], f["kernel_width"], f["stride_height"], f["stride_width"]
    ph, pw = f["padding_height"], f["padding_width"]
    return dict(padding_h=(ph, (oh - 1) * sh + kh - h - ph), padding_w=(pw, (ow - 1) * sw + kw - w - pw),
                filter_h=kh, filter_w=kw, stride_h=sh, stride_w=sw, dilation_h=1, dilation_w=1)


@v3_layer("QUANTIZED_MAX_POOL2D")
def _max_pool(layer, ctx):
    f = layer.fields
    w, h, c = f["in_shape"]
    ow, oh, _ = f["out_shape"]
    src, dst = f["main_mem_in_address"], f["main_mem_out_address"]
    kh, kw, sh, sw = f["kernel_height"], f["kernel_width"], f["stride_height"], f["stride_width"]
    ph, pw = f["padding_height"], f["padding_width"]
    if (kh, kw) == (1, 1) and ph <= 0 and pw <= 0:        # a pick: every s-th pixel
        return [slice_op(main(U8, src, w * h * c), main(U8, dst, ow * oh * c), (1, c, h, w),
                         (0, 0, -ph, -pw), (1, c, -ph + (oh - 1) * sh + 1, -pw + (ow - 1) * sw + 1),
                         (1, 1, sh, sw))]
    # the v4 runtime pools float only: max commutes with q -> q (dequantize scale 1, zero point 0);
    # the float copies are made a slice of channels at a time (one channel in the smaller form)
    slices = float_slices(c, w * h, 4 * (w * h + ow * oh), (layer.data or {}).get("float_room"))
    k = max(c1 - c0 for c0, c1 in slices)
    a, b = ctx(4 * w * h * k), ctx(4 * ow * oh * k)
    ops = []
    for c0, c1 in slices:
        n, m = (c1 - c0) * w * h, (c1 - c0) * ow * oh
        ops += [V4Op("dequantize", dict(input=main(U8, src + c0 * w * h, n), output=main(F32, a, n),
                                        quant_param=(0, 1.0))),
                V4Op("reduce_window2d", dict(input=main(F32, a, n), output=main(F32, b, m), reduce_op=2,
                                             in_shape=(1, c1 - c0, h, w), init_value=-FLT_MAX,
                                             fused_activation=NO_CLAMP, **_window(f, w, h, ow, oh))),
                V4Op("quantize", dict(input=main(F32, b, m), output=main(U8, dst + c0 * ow * oh, m),
                                      quant_param=(0, 1.0)), part=True)]
    return ops


@v3_layer("AVERAGE_POOL2D")
def _avg_pool(layer, ctx):
    f = layer.fields
    w, h, c = f["in_shape"]
    ow, oh, _ = f["out_shape"]
    return [V4Op("reduce_window2d", dict(
        input=main(F32, f["main_mem_in_address"], w * h * c), output=main(F32, f["main_mem_out_address"], ow * oh * c),
        reduce_op=0, in_shape=(1, c, h, w), init_value=0.0, fused_activation=NO_CLAMP, **_window(f, w, h, ow, oh)))]


@v3_layer("GLOBAL_AVERAGE_POOL2D")
def _global_avg(layer, ctx):
    f = layer.fields
    k, c = f["kernel_size"], f["channels"]
    return [V4Op("reduce", dict(input=main(F32, f["main_mem_in_address"], k * c),
                                output=main(F32, f["main_mem_out_address"], c), reduce_op=0,
                                in_shape=(1, 1, c, k), out_shape=(1, 1, c, 1), init_value=0.0))]


@v3_layer("SOFTMAX")
def _softmax(layer, ctx):
    f = layer.fields
    n = f["channels"]
    return [V4Op("softmax", dict(input=main(F32, f["main_mem_in_address"], n),
                                 output=main(F32, f["main_mem_out_address"], n), inner_size=n,
                                 outer_size=1, beta=1.0))]


@v3_layer("LOGISTIC")
def _logistic(layer, ctx):
    f = layer.fields
    n = f["channels"]
    return [V4Op("nnil_unary_method", dict(input=main(F32, f["main_mem_in_address"], n),
                                           output=main(F32, f["main_mem_out_address"], n)),
                 data={"code": nnil_code(*SIGMOID)})]


@v3_layer("L2_NORMALIZATION")
def _l2(layer, ctx):
    """x / sqrt(max(sum x^2, 1e-10)) (the SDK's rule): square, reduce sum, max, rsqrt, mul."""
    f = layer.fields
    n = f["channels"]
    x, out = main(F32, f["main_mem_in_address"], n), main(F32, f["main_mem_out_address"], n)
    sq, s, r = ctx(4 * n), ctx(ALIGN), ctx(ALIGN)    # r: unary's kernel takes restrict pointers
    vec, one = (1, 1, 1, n), (1, 1, 1, 1)
    return [V4Op("unary", dict(input=x, output=main(F32, sq, n), unary_op=9)),
            V4Op("reduce", dict(input=main(F32, sq, n), output=main(F32, s, 1), reduce_op=3, in_shape=vec,
                                out_shape=one, init_value=0.0)),
            V4Op("binary", dict(input_a=main(F32, s, 1), input_b=Const(np.float32([1e-10])),
                                output=main(F32, s, 1), binary_op=5, in_a_shape=one, in_b_shape=one,
                                out_shape=one, fused_activation=NO_CLAMP)),
            V4Op("unary", dict(input=main(F32, s, 1), output=main(F32, r, 1), unary_op=7)),
            V4Op("binary", dict(input_a=x, input_b=main(F32, r, 1), output=out, binary_op=2, in_a_shape=vec,
                                in_b_shape=one, out_shape=vec, fused_activation=NO_CLAMP))]


FC_CLAMP = {0: NO_CLAMP, 1: (0.0, FLT_MAX), 2: (0.0, 6.0)}


@v3_layer("FULLY_CONNECTED")
def _fc(layer, ctx):
    f = layer.fields
    ci, co = f["in_channels"], f["out_channels"]
    W = np.asarray(layer.data["weights"], np.float32).reshape(co, ci)
    return [V4Op("matmul", dict(input_a=main(F32, f["main_mem_in_address"], ci), input_b=Const(W.T.copy()),
                                output=main(F32, f["main_mem_out_address"], co), a_rows=1, a_cols=ci,
                                b_cols=co, fused_activation=FC_CLAMP[f["act"]]),
                 data={"bias": np.asarray(layer.data["bias"], np.float32)})]


@v3_layer("TENSORFLOW_FLATTEN")
def _flatten(layer, ctx):
    f = layer.fields
    w, h, c = f["shape"]
    return [V4Op("transpose", dict(input=main(F32, f["main_mem_in_address"], w * h * c),
                                   output=main(F32, f["main_mem_out_address"], w * h * c),
                                   in_shape=(1, c, h, w), perm=(0, 2, 3, 1)))]


@v3_layer("K210_UPLOAD")
def _upload(layer, ctx):
    f = layer.fields
    w, h, c = f["width"], f["height"], f["channels"]
    return [V4Op("kpu_upload", dict(input=main(U8, f["main_mem_in_address"], w * h * c),
                                    output=kpu_range(f["kpu_mem_out_address"], hw.map_lines(c, h, w)),
                                    in_shape=(1, c, h, w)))]


@v3_layer("K210_ADD_PADDING")
def _add_padding(layer, ctx):
    """A vector into pixel (0, 0) of a 4x4 map per channel (nncase v0.2's dense layers): pad in
    main memory, then upload."""
    f = layer.fields
    c, m = f["channels"], hw.LIMITS["out_min"]
    tmp = ctx(c * m * m)
    return [V4Op("pad", dict(input=main(U8, f["main_mem_in_address"], c), output=main(U8, tmp, c * m * m),
                             in_shape=(1, c, 1, 1), paddings=(0, 0, 0, 0, 0, m - 1, 0, m - 1),
                             pad_value=pad_scalar(0, U8))),
            V4Op("kpu_upload", dict(input=main(U8, tmp, c * m * m),
                                    output=kpu_range(f["kpu_mem_out_address"], hw.map_lines(c, m, m)),
                                    in_shape=(1, c, m, m)))]


@v3_layer("K210_REMOVE_PADDING")
def _remove_padding(layer, ctx):
    f = layer.fields
    c, m = f["channels"], hw.LIMITS["out_min"]
    return [slice_op(main(U8, f["main_mem_in_address"], c * m * m), main(U8, f["main_mem_out_address"], c),
                     (1, c, m, m), (0, 0, 0, 0), (1, c, 1, 1), (1, 1, 1, 1))]


def through_float(lw, row, slices, src, dst, per_in, per_out, q_in, q_out, dq, op) -> list:
    """A float op on a uint8 map a slice of channels at a time: each slice (c0, c1) of the map at
    `src` (`per_in` bytes a channel) is dequantized (`q_in`) into the float buffer `dq`, `op(c0, c1)`
    computes from it and returns the address of its float result, which is quantized (`q_out`)
    into the uint8 map at `dst` (`per_out` a channel). Returns the quantize nodes' indices."""
    parts = []
    for c0, c1 in slices:
        ni, no = (c1 - c0) * per_in, (c1 - c0) * per_out
        lw.emit_v4("dequantize", dict(input=main(U8, src + c0 * per_in, ni), output=main(F32, dq, ni),
                                      quant_param=q_in), row)
        res = op(c0, c1)
        parts.append(lw.emit_v4("quantize", dict(input=main(F32, res, no), output=main(U8, dst + c0 * per_out, no),
                                                 quant_param=q_out), row))
    return parts


def slice_op(src, dst, in_shape, begin, end, strides) -> V4Op:
    return V4Op("strided_slice", dict(input=src, output=dst, in_shape=tuple(in_shape), begin=tuple(begin),
                                      end=tuple(end), strides=tuple(strides), begin_mask=0, end_mask=0,
                                      ellipsis_mask=0, new_axis_mask=0, shrink_axis_mask=0))


# ---------------------------------------------------------------------------------------------
class _Scratch:
    def __init__(self, base):
        self.base, self.used, self.high = base, 0, 0

    def __call__(self, nbytes):
        at = self.base + self.used
        self.used += -(-max(nbytes, 1) // ALIGN) * ALIGN
        self.high = max(self.high, self.used)
        return at

    def reset(self):
        self.used = 0


def scratch_need(layer) -> int:
    """Bytes of temporaries the v4 form of a v3 layer takes (0 for a v4 node)."""
    fn = FROM_V3.get(getattr(layer, "name", None)) if isinstance(layer, v3.Layer) else None
    if fn is None:
        return 0
    count = _Scratch(0)
    fn(layer, count)
    return count.high


class _Consts:
    def __init__(self):
        self.blob, self.at = bytearray(), {}

    def place(self, c: Const) -> tuple:
        raw = c.tobytes()
        key = hashlib.sha1(raw).digest() + bytes([c.dtype])
        if key not in self.at:
            self.at[key] = len(self.blob)
            self.blob += raw + bytes(-len(raw) % ALIGN)
        return (MEM_CONST, c.dtype, self.at[key], len(raw))


def _parked(r):
    """A main-memory range the plan put in KPU RAM (memory.PARK_BASE + its byte there) as a
    k210_kpu range."""
    if isinstance(r, tuple) and r[0] == MEM_MAIN and r[2] >= PARK_BASE:
        return (MEM_KPU, r[1], r[2] - PARK_BASE, r[3])
    return r


def _node(op: V4Op, consts: _Consts) -> Node:
    spec = OPCODE_BY_NAME[op.name]
    fields = {k: (consts.place(v) if isinstance(v, Const) else v) for k, v in op.fields.items()}
    for name, typ, _ in spec.struct.fields:
        if typ == "range":
            fields[name] = _parked(fields[name])
    missing = set(spec.struct.names) - set(fields)
    if missing:
        raise AssertionError(f"{op.name}: fields {sorted(missing)} missing")
    data = dict(op.data)
    if "inputs" in data:
        data["inputs"] = [consts.place(v) if isinstance(v, Const) else _parked(v) for v in data["inputs"]]
    return Node(spec.code, fields, data, conv=op.conv)


def _input(lw, nodes):
    """(input range, input shape) of the model (docs/kmodel-format.md#v4-inputs-and-outputs)."""
    x = lw.g.inputs[0]
    loc = lw.locs[x]
    shape = shape4(loc.shape)
    if lw.pixel_input == x:
        first = next(n for n in nodes if n.conv is not None)
        c, h, w = first.conv.in_shape
        return kpu_range(first.conv.args["image_src_addr"], hw.map_lines(c, h, w)), (1, c, h, w)
    if loc.pixels is not None:
        return main(U8, loc.pixels, int(np.prod(loc.shape))), shape
    return main(F32, loc.f32, int(np.prod(loc.shape))), shape


def assemble(lw, outs):
    """The lowering's plan as a KModelV4; re-indexes the receipt rows and the trace map from plan
    items to v4 nodes."""
    base = -(-lw.main.high // ALIGN) * ALIGN
    scratch, consts = _Scratch(base), _Consts()
    nodes, last = [], []              # last[i] = index of the final node of plan item i
    spans = []
    for item in lw.layers:
        if isinstance(item, v3.Layer):
            fn = FROM_V3.get(item.name)
            if fn is None:
                raise UnsupportedOpError(f"v3 layer {item.name} has no kmodel v4 form")
            scratch.reset()
            own = lw.scratch_at.get(len(spans))
            ops = fn(item, scratch if own is None else _Scratch(own))
        else:
            ops = [item]
        first = len(nodes)
        nodes += [_node(op, consts) for op in ops]
        spans.append(list(range(first, len(nodes))))
        parts = tuple(first + k for k, op in enumerate(ops) if op.part)
        last.append(parts if len(parts) > 1 else len(nodes) - 1)
    for r in lw.rows:
        r.layers = [j for i in r.layers for j in spans[i]]
    for t, (i, kind) in list(lw.trace_map.items()):     # an index, or a tuple of them (tiles, slices)
        idx = tuple(np.hstack([last[j] for j in i])) if isinstance(i, (tuple, list)) else last[i]
        lw.trace_map[t] = (tuple(int(j) for j in idx) if isinstance(idx, tuple) else idx, kind)
    rng, shape = _input(lw, nodes)
    outputs = [main(F32, addr, size // 4) for addr, size in outs]
    model = KModelV4(nodes, [rng], [shape], outputs, base + scratch.high, bytes(consts.blob), target=1,
                     compact=lw.opts.compact)
    clash = overlapping_io(model)
    if clash:   # nncase's kernels would read what they already wrote (docs/kmodel-format.md#v4-interpreter)
        raise AssertionError("internal error: the main-memory plan gives an op an output range over "
                             "one of its inputs: " + "; ".join(clash))
    lw.v4_scratch = scratch.high
    return model

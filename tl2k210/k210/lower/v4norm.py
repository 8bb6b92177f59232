"""A normalization over a whole map, a slice of channels at a time (kmodel v4, a smaller form).

OpenVINO's re-identification nets (and a LayerNorm over C, H, W) normalize a map by statistics of
all its values, in float: m = mean(x), d = x - m, v = mean(d * d), s = f(v) (+ eps, sqrt, one
NNIL method), y = d / s. Lowered op by op (reduce, float_binary, ...) the float d and d * d are
whole float copies of the map alive at once, four times a uint8 map each: twice or more the
8-bit ideal's live set. The smaller form (Options.small names "<first ReduceMean>/slices") reads
the uint8 map three times, a slice of channels at a time, through one float slice buffer:

  1. dequantize the slice, sum it (reduce), into one partial sum a slice; m = their sum / N;
  2. dequantize, subtract m, square, sum: v = the partial sums' sum / N; s = f(v);
  3. dequantize, subtract m, divide by s, quantize into y's uint8 map (or write y's float map
     where a float layer reads it).

The same float ops on the same values; only the sums' order differs (a sum of partial sums), a
rounding of float32 the receipt measures: so the plan takes it where the model does not fit, or
with --optimize size (fit.choose_forms), never to save bytes by default. Per-channel statistics
(InstanceNormalization) need none of this: their uint8 chain ends in a Div that
v4elementwise._sliced_binary slices."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tl2k210.graph import axes_of
from tl2k210.k210.kmodel.v4 import REDUCE_OPS

from .memory import SLICE_MIN_BYTES, SLICES, float_slices
from .registry import CPU_U8, NA, lowering
from .v4elementwise import BINARY, g4, nnil_ops
from .v4emit import F32, NO_CLAMP, Const, main, nnil_code

SUM = REDUCE_OPS.index("sum")
CHAIN_MAX = 6          # ops from the variance to the divisor (eps, sqrt, a clamp): more is not this pattern


@dataclass
class Norm:
    x: str            # the map (1, C, H, W)
    sub: object       # Sub(x, mean)
    square: object    # Mul(d, d)
    var: object       # ReduceMean(d * d)
    chain: list       # the elementwise ops from the variance to the divisor
    div: object       # Div(d, divisor)

    def nodes(self, first):
        return [first, self.sub, self.square, self.var, *self.chain, self.div]


def _all_axes(g, node) -> bool:
    """A ReduceMean over every axis of a (1, C, H, W) map, keeping them: a (1, 1, 1, 1) result."""
    if node.op != "ReduceMean" or not node.attrs.get("keepdims", 1) or g.const(node.inputs[0]) is not None:
        return False
    shape = g.shape(node.inputs[0])
    if shape is None or len(shape) != 4 or shape[0] != 1:
        return False
    axes = axes_of(g, node)
    if axes is None and ((len(node.inputs) > 1 and node.inputs[1]) or node.attrs.get("noop_with_empty_axes", 0)):
        return False
    return set(range(1, 4)) <= {a % 4 for a in (axes if axes is not None else range(4))}


def _only(g, t):
    """The single reader of `t`, or None (several, none, or a model output)."""
    cons = g.consumers(t)
    return cons[0] if len(cons) == 1 and t not in g.outputs else None


def pattern(g, node) -> Norm | None:
    """The whole-map normalization whose first ReduceMean is `node` (module docstring), or None."""
    if not _all_axes(g, node):
        return None
    x, m = node.inputs[0], node.outputs[0]
    sub = _only(g, m)
    if sub is None or sub.op != "Sub" or sub.inputs != [x, m]:
        return None
    d = sub.outputs[0]
    cons = g.consumers(d)
    if d in g.outputs or len(cons) != 2:
        return None
    square = next((c for c in cons if c.op == "Mul" and c.inputs == [d, d]), None)
    div = next((c for c in cons if c.op == "Div" and c.inputs[0] == d and c.inputs[1] != d), None)
    if square is None or div is None:
        return None
    var = _only(g, square.outputs[0])
    if var is None or not _all_axes(g, var):
        return None
    chain, t = [], var.outputs[0]
    while t != div.inputs[1]:
        c = _only(g, t)
        if c is None or len(chain) == CHAIN_MAX or nnil_ops(g, c, not chain) is None or \
                [i for i in c.inputs if g.const(i) is None] != [t]:
            return None
        chain.append(c)
        t = c.outputs[0]
    return Norm(x, sub, square, var, chain, div)


def norm_refuses(g, node, opts):
    if getattr(opts, "format", "v3") != "v4" or pattern(g, node) is None:
        return NA
    small = getattr(opts, "small", ())
    return None if "*" in small or node.name + SLICES in small else NA


@lowering("ReduceMean", unit=CPU_U8, check=norm_refuses, formats=("v4",), name="sliced_normalization")
def sliced_normalization(lw, node):
    g = lw.g
    p = pattern(g, node)
    x, y = p.x, p.div.outputs[0]
    _, c, h, w = g4(g, x)
    per, total = h * w, c * h * w
    row = lw.row(node, "normalization over the whole map: float, a slice of channels at a time, in 3 passes",
                 in_shape=lw.shape(x), out_shape=lw.shape(y))
    f32 = lw.locs[x].f32                  # a float map (a float layer made it) is read as it is
    src = None if f32 is not None else lw.need_u8(x, row)
    to_u8 = not lw.float_readers(y, lw.at + 1)
    out = lw.u8_out(y, lw.quant_of(y)) if to_u8 else lw.f32_out(y)
    room = lw.float_room(4 * (c + 3))   # beside y's map, the sums and 3 scalars: at least SLICE_MIN_BYTES
    slices = float_slices(c, per, 4 * per, None if room is None else max(room, SLICE_MIN_BYTES))
    k, n = max(c1 - c0 for c0, c1 in slices), len(slices)
    tag = f"{y}:norm"
    tmp, parts = lw.main.alloc(f"{tag}:slice", 4 * k * per), lw.main.alloc(f"{tag}:sums", 4 * n)
    mean, var, div = (lw.main.alloc(f"{tag}:{s}", 4) for s in ("mean", "var", "divisor"))
    one = (1, 1, 1, 1)
    inv_n = Const(np.array([np.float32(1) / np.float32(total)], np.float32))

    def binary(op, a, b, dst, count, b_shape, shape):
        lw.emit_v4("binary", dict(input_a=main(F32, a, count), input_b=b, output=main(F32, dst, count),
                                  binary_op=BINARY[op], in_a_shape=shape, in_b_shape=b_shape, out_shape=shape,
                                  fused_activation=NO_CLAMP), row)

    def total_sum(i, a, m, shape):
        lw.emit_v4("reduce", dict(input=main(F32, a, m), output=main(F32, parts + 4 * i, 1), reduce_op=SUM,
                                  in_shape=shape, out_shape=one, init_value=0.0), row)

    def mean_of_sums(dst):       # the partial sums' sum, times 1 / N (the reduce kernel's mean)
        lw.emit_v4("reduce", dict(input=main(F32, parts, n), output=main(F32, dst, 1), reduce_op=SUM,
                                  in_shape=(1, 1, 1, n), out_shape=one, init_value=0.0), row)
        binary("Mul", dst, inv_n, dst, 1, one, one)

    def each(body):              # body(slice index, its float values' address, first channel, count, shape)
        for i, (c0, c1) in enumerate(slices):
            m, shape, a = (c1 - c0) * per, (1, c1 - c0, h, w), tmp
            if f32 is None:
                s_x, z_x = lw.locs[x].quant
                lw.emit("DEQUANTIZE", dict(flags=1, main_mem_in_address=src + c0 * per, mem_out_address=tmp,
                                           count=m, scale=s_x, bias=-z_x * s_x), row)
            else:
                a = f32 + 4 * c0 * per
            body(i, a, c0, m, shape)

    each(lambda i, a, c0, m, shape: total_sum(i, a, m, shape))
    mean_of_sums(mean)

    def squares(i, a, c0, m, shape):
        binary("Sub", a, main(F32, mean, 1), tmp, m, one, shape)            # in place: kmodel.v4.IN_PLACE
        binary("Mul", tmp, main(F32, tmp, m), tmp, m, shape, shape)
        total_sum(i, tmp, m, shape)
    each(squares)
    mean_of_sums(var)
    first = nnil_ops(g, p.chain[0], True) if p.chain else []
    code = (first if "lda_0" in first else ["lda_0"] + first) + [op for cn in p.chain[1:] for op in nnil_ops(g, cn, False)]
    lw.emit_v4("nnil_unary_method", dict(input=main(F32, var, 1), output=main(F32, div, 1)), row,
               data={"code": nnil_code(*code, "ret")})
    idx = []

    def normalize(i, a, c0, m, shape):
        binary("Sub", a, main(F32, mean, 1), tmp, m, one, shape)
        binary("Div", tmp, main(F32, div, 1), tmp if to_u8 else out.f32 + 4 * c0 * per, m, one, shape)
        if to_u8:
            s_y, z_y = out.quant
            lw.emit("QUANTIZE", dict(flags=0, main_mem_in_address=tmp, mem_out_address=out.u8 + c0 * per, count=m,
                                     scale=s_y, bias=-(z_y + lw.u8_offset.get(y, 0.0)) * s_y), row)
        idx.append(len(lw.layers) - 1)
    each(normalize)
    for s in ("slice", "sums", "mean", "var", "divisor"):
        lw.main.free(f"{tag}:{s}")
    lw.trace_map[y] = (idx[0] if len(idx) == 1 else tuple(idx), "u8" if to_u8 else "f32")
    for nd in p.nodes(node)[1:]:
        lw.folded.add(nd.name)
        row.fused.append(nd.name)
    row.tensor = y
    row.form = (f"{n} slice(s) of <= {k} channel(s): one {4 * k * per:,} B float buffer, not two float "
                f"copies of the map ({8 * total:,} B)")
    row.notes.append(f"the smaller form: the map {'read' if f32 is not None else 'dequantized'} three times, "
                     f"{k} channel(s) of {h}x{w} at a time"
                     + (", quantized into the uint8 output" if to_u8 else ""))

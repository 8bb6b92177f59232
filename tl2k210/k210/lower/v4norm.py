"""A float normalization a slice of channels at a time (kmodel v4).

m = mean(x), d = x - m, v = mean(d * d), s = f(v) (+ eps, sqrt: one NNIL method), y = d / s in
float, the means over the whole map (OpenVINO's re-identification nets; a LayerNorm over C, H, W)
or over each channel (onnx.js's instance norm, its means over a (1, C, 1, H*W) reshape of x).
Lowered op by op (reduce, float_binary, ...), d and d * d are whole float copies of the map, four
times a uint8 map each, alive at once. Here they are slices, a few channels at a time:

* each channel's statistics (mode "channel"): one pass, each slice dequantized, its means, its
  centred values and their squares in two float slice buffers, normalized and quantized into y's
  uint8 map (or written into y's float map where a float layer reads it). The same sums in the
  same order: the same bytes as op by op, in more nodes (~0.8 KB of kmodel a slice);
* the whole map's (mode "all"): three passes over the map through one float slice buffer -- the
  slices' sums, m = their sum / N; the centred squares' sums, v likewise, s = f(v); the slices
  centred and divided. Only the sums' order differs (a sum of partial sums), a float32 rounding
  the receipt measures.
Both are the smaller form of the first ReduceMean (Options.small "<ReduceMean>/slices"), which
the plan takes where the model does not fit, or with --optimize size where the model shrinks
(fit.choose_forms): main memory for kmodel bytes (and, whole-map, time).

A Relu / Clip after y whose uint8 range lies within its bounds folds into the QUANTIZE, as
cpu.quantize_clamp does. InstanceNormalization's own decomposition (global_pool: uint8 means)
ends in a Div that v4elementwise._sliced_binary slices."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tl2k210.graph import RELABELS, reduce_axes
from tl2k210.k210.kmodel.v4 import REDUCE_OPS
from tl2k210.passes.fuse_activation import activation_of

from .cpu import act_bounds, saturation_clamps
from .memory import SLICE_MIN_BYTES, SLICES, float_slices
from .registry import CPU_U8, NA, lowering
from .v4elementwise import BINARY, chain_code, g4, nnil_ops
from .v4emit import F32, NO_CLAMP, Const, main

CHAIN_MAX = 6          # ops from the variance to the divisor (eps, sqrt, a clamp): more is not this pattern


@dataclass
class Norm:
    mode: str         # "all": statistics of the whole map; "channel": of each channel
    x: str            # the map (1, C, H, W)
    sub: object       # Sub(x, mean)
    square: object    # Mul(d, d)
    hops: list        # relabels of d * d before its mean (onnx.js: a (1, C, 1, H*W) reshape)
    var: object       # ReduceMean(d * d)
    chain: list       # the elementwise ops from the variance to the divisor
    div: object       # Div(d, divisor)

    def nodes(self, first):
        return [first, self.sub, self.square, *self.hops, self.var, *self.chain, self.div]


def _mean(g, node, x):
    """"all" or "channel" where ReduceMean `node` (keeping its axes) is the mean of all of map x's
    values or of each channel's, reading x or a relabel of it; else None."""
    if node.op != "ReduceMean" or not node.attrs.get("keepdims", 1):
        return None
    r = node.inputs[0]
    while r != x and (q := g.producer(r)) is not None and q.op in RELABELS:
        r = q.inputs[0]
    xs, s = g.shape(x), g.shape(node.inputs[0])
    if r != x or xs is None or len(xs) != 4 or xs[0] != 1 or s is None:
        return None
    axes = reduce_axes(g, node)
    if axes is None:
        return None
    axes = {a % len(s) for a in axes}
    kept = [i for i in range(len(s)) if i not in axes and s[i] != 1]
    n, out = int(np.prod([s[i] for i in kept])), g4(g, node.outputs[0])
    if n == 1 and out == (1, 1, 1, 1):
        return "all"
    # each channel's values, contiguous: the kept axes lead (reduced axes of size 1 aside: TF's
    # training-mode batch norm reduces the batch axis too) and count the channels
    big = [a for a in axes if s[a] != 1]
    return "channel" if n == xs[1] and big and all(i < min(big) for i in kept) and out == (1, xs[1], 1, 1) else None


def pattern(g, node) -> Norm | None:
    """The normalization whose first ReduceMean is `node` (module docstring), or None."""
    m = node.outputs[0]
    sub = g.single_consumer(m) if node.op == "ReduceMean" else None
    if sub is None or sub.op != "Sub" or sub.inputs[1] != m or g.const(sub.inputs[0]) is not None:
        return None
    x = sub.inputs[0]
    mode = _mean(g, node, x)
    d = sub.outputs[0]
    cons = g.consumers(d)
    if mode is None or d in g.outputs or len(cons) != 2:
        return None
    square = next((c for c in cons if c.op == "Mul" and c.inputs == [d, d]), None)
    div = next((c for c in cons if c.op == "Div" and c.inputs[0] == d and c.inputs[1] != d), None)
    if square is None or div is None:
        return None
    t, hops = square.outputs[0], []
    while (var := g.single_consumer(t)) is not None and var.op in RELABELS:
        hops.append(var)
        t = var.outputs[0]
    if var is None or _mean(g, var, square.outputs[0]) != mode:
        return None
    chain, t = [], var.outputs[0]
    while t != div.inputs[1]:
        c = g.single_consumer(t)
        if c is None or len(chain) == CHAIN_MAX or nnil_ops(g, c, not chain) is None or \
                [i for i in c.inputs if g.const(i) is None] != [t]:
            return None
        chain.append(c)
        t = c.outputs[0]
    return Norm(mode, x, sub, square, hops, var, chain, div)


def _clamp_after(lw, y):
    """The Relu / Clip that alone reads y where quantizing to its uint8 range is that clamp
    (cpu.quantize_clamp's rule: the range lies within its bounds): it folds into the QUANTIZE."""
    cons = lw.consumers(y)
    if len(cons) != 1 or y in lw.g.outputs or cons[0].op not in ("Relu", "Clip"):
        return None
    bounds = act_bounds(activation_of(lw.g, cons[0]))
    return cons[0] if bounds is not None and saturation_clamps(bounds, lw.quant_of(cons[0].outputs[0])) else None


def norm_refuses(g, node, opts):
    p = pattern(g, node) if getattr(opts, "format", "v3") == "v4" else None
    if p is None:
        return NA
    small = getattr(opts, "small", ())
    return None if "*" in small or node.name + SLICES in small else NA


@lowering("ReduceMean", unit=CPU_U8, check=norm_refuses, formats=("v4",), name="sliced_normalization")
def sliced_normalization(lw, node):
    g = lw.g
    p = pattern(g, node)
    x, y = p.x, p.div.outputs[0]
    _, c, h, w = g4(g, x)
    per, total, whole = h * w, c * h * w, p.mode == "all"
    row = lw.row(node, f"normalization over {'the whole map' if whole else 'each channel'}: float, a slice of "
                       f"channels at a time{', in 3 passes' if whole else ''}", in_shape=lw.shape(x), out_shape=lw.shape(y))
    f32 = lw.locs[x].f32                  # a float map (a float layer made it) is read as it is
    src = None if f32 is not None else lw.need_u8(x, row)
    to_u8 = not lw.float_readers(y, lw.at + 1)
    clamp = _clamp_after(lw, y) if to_u8 else None      # quantized to the clamp's range: one rounding
    out = lw.u8_out(y, lw.quant_of(clamp.outputs[0] if clamp else y)) if to_u8 else lw.f32_out(y)
    temps = 1 if whole else 2             # the centred slice (and its squares, per channel)
    room = lw.float_room(4 * 3 * c)       # beside y's map, the statistics: at least SLICE_MIN_BYTES
    slices = float_slices(c, per, 4 * temps * per, None if room is None else max(room, SLICE_MIN_BYTES))
    k, n = max(c1 - c0 for c0, c1 in slices), len(slices)
    tag = f"{y}:norm"
    names = ["slice", "sums" if whole else "squares", "mean", "var", "divisor"]
    sizes = [4 * k * per, 4 * n if whole else 4 * k * per] + [4 * (1 if whole else k)] * 3
    tmp, second, mean, var, div = (lw.main.alloc(f"{tag}:{nm}", size) for nm, size in zip(names, sizes))
    parts, sq = (second, None) if whole else (None, second)
    one = (1, 1, 1, 1)
    idx = []

    def binary(op, a, b, dst, count, b_shape, shape):
        lw.emit_v4("binary", dict(input_a=main(F32, a, count), input_b=b, output=main(F32, dst, count),
                                  binary_op=BINARY[op], in_a_shape=shape, in_b_shape=b_shape, out_shape=shape,
                                  fused_activation=NO_CLAMP), row)

    def reduce(op, a, m, shape, dst, out_shape):
        lw.emit_v4("reduce", dict(input=main(F32, a, m), output=main(F32, dst, int(np.prod(out_shape))),
                                  reduce_op=REDUCE_OPS.index(op), in_shape=shape, out_shape=out_shape,
                                  init_value=0.0), row)

    def divisor(count):           # the ops from the variance to the divisor: one NNIL method
        lw.emit_v4("nnil_unary_method", dict(input=main(F32, var, count), output=main(F32, div, count)), row,
                   data={"code": chain_code(g, p.chain)})

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

    def normalize(c0, m, shape, stat):
        binary("Div", tmp, stat, tmp if to_u8 else out.f32 + 4 * c0 * per, m, g4(g, p.div.inputs[1])
               if whole else (1, shape[1], 1, 1), shape)
        if to_u8:
            s_y, z_y = out.quant
            lw.emit("QUANTIZE", dict(flags=0, main_mem_in_address=tmp, mem_out_address=out.u8 + c0 * per, count=m,
                                     scale=s_y, bias=-(z_y + lw.u8_offset.get(y, 0.0)) * s_y), row)
        idx.append(len(lw.layers) - 1)

    if whole:
        inv_n = Const(np.array([np.float32(1) / np.float32(total)], np.float32))

        def mean_of_sums(dst):   # the partial sums' sum, times 1 / N (the reduce kernel's mean)
            reduce("sum", parts, n, (1, 1, 1, n), dst, one)
            binary("Mul", dst, inv_n, dst, 1, one, one)

        each(lambda i, a, c0, m, shape: reduce("sum", a, m, shape, parts + 4 * i, one))
        mean_of_sums(mean)

        def squares(i, a, c0, m, shape):
            binary("Sub", a, main(F32, mean, 1), tmp, m, one, shape)         # in place: kmodel.v4.IN_PLACE
            binary("Mul", tmp, main(F32, tmp, m), tmp, m, shape, shape)
            reduce("sum", tmp, m, shape, parts + 4 * i, one)
        each(squares)
        mean_of_sums(var)
        divisor(1)

        def centred(i, a, c0, m, shape):
            binary("Sub", a, main(F32, mean, 1), tmp, m, one, shape)
            normalize(c0, m, shape, main(F32, div, 1))
        each(centred)
    else:                         # each slice's channels are their own statistics: one pass
        def channels(i, a, c0, m, shape):
            cs = shape[1]
            stat = (1, cs, 1, 1)
            reduce("mean", a, m, shape, mean, stat)
            binary("Sub", a, main(F32, mean, cs), tmp, m, stat, shape)
            binary("Mul", tmp, main(F32, tmp, m), sq, m, shape, shape)
            reduce("mean", sq, m, shape, var, stat)
            divisor(cs)
            normalize(c0, m, shape, main(F32, div, cs))
        each(channels)
    for nm in names:
        lw.main.free(f"{tag}:{nm}")
    lw.trace_map[y] = (idx[0] if len(idx) == 1 else tuple(idx), "u8" if to_u8 else "f32")
    for nd in p.nodes(node)[1:]:
        lw.folded.add(nd.name)
        row.fused.append(nd.name)
    row.tensor = y
    if clamp is not None:
        lw.alias(clamp.outputs[0], y)
        lw.folded.add(clamp.name)
        row.fused.append(clamp.name)
        row.tensor = clamp.outputs[0]
        row.notes.append(f"{clamp.op} folded into the QUANTIZE (saturation is the clamp)")
    copies = "two float copies" if whole else "float copies"
    row.form = (f"{n} slice(s) of <= {k} channel(s): {temps} float buffer(s) of {4 * k * per:,} B, not {copies} "
                f"of the map ({8 * total:,} B)")
    read = "read" if f32 is not None else "dequantized"
    row.notes.append((f"the smaller form: the map {read} three times" if whole else f"the map {read} once")
                     + f", {k} channel(s) of {h}x{w} at a time" + (", quantized into the uint8 output" if to_u8 else ""))

"""kmodel v4 lowerings of data movement, reductions, pools and softmax (formats=("v4",)).

Data movement (transpose, strided_slice, pad, concat, memory_copy) is byte-exact and runs on the
form the tensor already has: uint8 (quantization unchanged) when it has one, else float32.
Reductions, pools and softmax run on float32 like the v0.2 runtime's kernels; a max / min of a
uint8 map goes through dequantize(scale 1, zero point 0) -> float op -> quantize(1, 0), which
gives back the same uint8 values (max commutes with the monotone dequantization), so the map
keeps its quantization.
"""
from __future__ import annotations

import numpy as np

from tl2k210.graph import axes_of, pads_of, same_pads
from tl2k210.k210.kmodel.v4 import MEM_MAIN

from .cpu import table
from .fc import CONCAT_MOVES, feeds_output
from .memory import SLICES, float_slices
from .registry import CPU_F32, CPU_U8, NA, lowering
from .v4emit import F32, FLT_MAX, NO_CLAMP, U8, Const, main, pad_scalar, slice_op, through_float
from .v4norm import pattern as norm_pattern

REDUCE = {"ReduceMean": 0, "ReduceMin": 1, "ReduceMax": 2, "ReduceSum": 3}
INIT = {0: 0.0, 1: FLT_MAX, 2: -FLT_MAX, 3: 0.0}


def g4(g, t):
    s = tuple(int(v) for v in g.shape(t))
    return (1,) * (4 - len(s)) + s


def nbytes(dt, n):
    return n * (4 if dt == F32 else 1)


def _form(lw, t):
    """U8 when the tensor has (or can cheaply get) a uint8 form, F32 when it is float only."""
    loc = lw.locs[t]
    if loc.u8 is not None or loc.kpu is not None or loc.pixels is not None:
        return U8
    return F32 if loc.f32 is not None else U8


def _src(lw, t, dt, row):
    return lw.need_u8(t, row) if dt == U8 else lw.need_f32(t, row)


def _out(lw, t, dt, like=None, shape=None):
    if dt == U8:
        return lw.u8_out(t, lw.locs[like].quant if like else None, shape).u8
    return lw.f32_out(t, shape).f32


def _count(lw, t):
    return int(np.prod(lw.shape(t)))


def _mark(lw, t, dt):
    lw.traced(t, "u8" if dt == U8 else "f32")


def _rank_ok(g, node):
    if any(len(g.shape(t)) > 4 for t in node.inputs[:1] + node.outputs if g.tensors[t].shape is not None):
        return ("more than 4 dimensions (the v4 runtime's shapes are 4-D): reshape to at most 4 "
                "dims in the model (merge adjacent axes)")
    return None


# ---------------------------------------------------------------------------------------------
# data movement
def compact_transpose(shape, perm):
    """(shape, perm) of the same data movement with the unit axes dropped and the input axes that
    stay neighbours in the output merged: a 5-D transpose of a map with unit axes is 4-D or less."""
    keep = [a for a in range(len(shape)) if shape[a] != 1]
    order = [a for a in perm if shape[a] != 1]          # the output's non-unit input axes
    groups = []
    for a in order:                                      # runs of consecutive input axes
        if groups and a == groups[-1][-1] + 1:
            groups[-1].append(a)
        else:
            groups.append([a])
    firsts = sorted(gr[0] for gr in groups)
    by_first = {gr[0]: gr for gr in groups}
    new_shape = tuple(int(np.prod([shape[a] for a in by_first[f]])) for f in firsts)
    new_perm = [firsts.index(gr[0]) for gr in groups]
    assert sum(len(gr) for gr in groups) == len(keep)
    return (new_shape or (1,)), (new_perm or [0])


def _perm(g, node):
    rank = len(g.shape(node.inputs[0]))
    return list(node.attrs.get("perm", range(rank)[::-1]))


def transpose_refuses(g, node, opts):
    why = _rank_ok(g, node)
    if why and len(compact_transpose(g.shape(node.inputs[0]), _perm(g, node))[0]) > 4:
        return why
    if any(len(g.shape(t)) == 4 and g.shape(t)[0] != 1 for t in node.inputs[:1] + node.outputs):
        return (f"{g.shape(node.inputs[0])} -> {g.shape(node.outputs[0])} moves data into the batch axis (a "
                "SpaceToBatch form): the kmodel's maps are batch 1")
    return None


@lowering("Transpose", unit=CPU_U8, check=transpose_refuses, formats=("v4",), name="transpose")
def transpose(lw, node):
    x, out = node.inputs[0], node.outputs[0]
    perm = _perm(lw.g, node)
    shape = tuple(lw.g.shape(x))
    if len(shape) > 4:              # unit axes dropped, neighbours merged (transpose_refuses)
        shape, perm_c = compact_transpose(shape, perm)
    else:
        perm_c = perm
    k = 4 - len(shape)
    perm4 = list(range(k)) + [p + k for p in perm_c]
    dt = _form(lw, x)
    row = lw.row(node, f"transpose {perm} on {'uint8' if dt == U8 else 'float32'}", out_shape=lw.shape(out))
    src = _src(lw, x, dt, row)
    dst = _out(lw, out, dt, x)
    n = _count(lw, x)
    lw.emit_v4("transpose", dict(input=main(dt, src, n), output=main(dt, dst, n), in_shape=(1,) * k + shape,
                                 perm=tuple(perm4)), row)
    _mark(lw, out, dt)


def space_depth_steps(op, mode, shape, r):
    """[(4-D in_shape, perm)]: the two transposes that are a DepthToSpace (mode "DCR" / "CRD") or
    a SpaceToDepth of a (C, H, W) map with block r. DCR: in (i, j, c, h, w) -> (c, h, w, i, j) ->
    out (c, h, i, w, j); CRD: in (c, i, j, h, w) -> (c, i, h, w, j) -> out; SpaceToDepth (ONNX's
    only order, DCR's inverse): in (c, h, i, w, j) -> (c, h, w, i, j) -> out (i, j, c, h, w)."""
    c, h, w = shape
    if op == "SpaceToDepth":
        h, w = h // r, w // r
        return [((c * h, r, w, r), (0, 2, 1, 3)), ((c, h, w, r * r), (3, 0, 1, 2))]
    c //= r * r
    if mode == "CRD":
        return [((c * r, r, h, w), (0, 2, 3, 1)), ((c, r, h, w * r), (0, 2, 1, 3))]
    return [((r * r, c, h, w), (1, 2, 3, 0)), ((c * h, w, r, r), (0, 2, 1, 3))]


def space_depth_refuses(g, node, opts):
    if len(g.shape(node.inputs[0]) or ()) != 4:
        return "only 4-D maps"
    if node.op == "DepthToSpace" and node.attrs.get("mode", "DCR") not in ("DCR", "CRD"):
        return f"mode {node.attrs['mode']!r}: DCR or CRD"
    return None


@lowering("DepthToSpace", "SpaceToDepth", unit=CPU_U8, check=space_depth_refuses, formats=("v4",),
          name="space_depth_transposes")
def space_depth(lw, node):
    """Pixel shuffles as data movement: two transposes on the form the map has (no weights)."""
    x, out = node.inputs[0], node.outputs[0]
    r, mode = int(node.attrs["blocksize"]), node.attrs.get("mode", "DCR")
    dt = _form(lw, x)
    what = f"{node.op} x{r}" + (f" ({mode})" if node.op == "DepthToSpace" else "")
    row = lw.row(node, f"{what}: two transposes on {'uint8' if dt == U8 else 'float32'}",
                 in_shape=lw.shape(x), out_shape=lw.shape(out))
    src = _src(lw, x, dt, row)
    n = _count(lw, x)
    tmp = f"{out}:shuffle"
    mid = lw.main.alloc(tmp, nbytes(dt, n))
    dst = _out(lw, out, dt, x)
    for (shape, perm), (a, b) in zip(space_depth_steps(node.op, mode, lw.shape(x), r), ((src, mid), (mid, dst))):
        lw.emit_v4("transpose", dict(input=main(dt, a, n), output=main(dt, b, n), in_shape=shape, perm=perm), row)
    lw.main.free(tmp)
    _mark(lw, out, dt)


def slice_params(g, node):
    """(begin, end, strides) in 4-D for an ONNX Slice, or a reason."""
    shape = g4(g, node.inputs[0])
    rank = len(g.shape(node.inputs[0]))
    k = 4 - rank
    ins = [g.const(t) if t else None for t in node.inputs[1:]]
    if any(t and v is None for t, v in zip(node.inputs[1:], ins)):
        return "starts/ends/axes/steps are not constants"
    starts, ends = (np.asarray(v, np.int64).reshape(-1) for v in ins[:2])
    axes = np.asarray(ins[2], np.int64).reshape(-1) if len(ins) > 2 and ins[2] is not None else np.arange(len(starts))
    steps = np.asarray(ins[3], np.int64).reshape(-1) if len(ins) > 3 and ins[3] is not None else np.ones(len(starts), np.int64)
    begin, end, strides = [0, 0, 0, 0], list(shape), [1, 1, 1, 1]
    for s, e, ax, st in zip(starts, ends, axes, steps):
        ax = int(ax) % rank + k
        d = shape[ax]
        if st == 0:
            return "step 0"
        s, e = int(s), int(e)
        s = s + d if s < 0 else s
        e = e + d if e < 0 else e
        if st > 0:
            s, e = min(max(s, 0), d), min(max(e, 0), d)
        else:
            s, e = min(max(s, 0), d - 1), min(max(e, -1), d - 1)
        begin[ax], end[ax], strides[ax] = s, e, int(st)
    return begin, end, strides


def slice_refuses(g, node, opts):
    why = _rank_ok(g, node)
    if why:
        return why
    p = slice_params(g, node)
    return p if isinstance(p, str) else None


def _copy_or_slice(lw, x, out, dt, begin, end, strides, row):
    src = _src(lw, x, dt, row)
    dst = _out(lw, out, dt, x)
    n_in, n_out = _count(lw, x), _count(lw, out)
    if n_in == n_out and tuple(strides) == (1, 1, 1, 1):
        lw.emit_v4("memory_copy", dict(input=main(dt, src, n_in), output=main(dt, dst, n_out)), row)
    else:
        lw.emit_v4(*_op(slice_op(main(dt, src, n_in), main(dt, dst, n_out), g4(lw.g, x), begin, end, strides)), row)
    _mark(lw, out, dt)


def _op(v):
    return v.name, v.fields


@lowering("Slice", unit=CPU_U8, check=slice_refuses, formats=("v4",), name="strided_slice")
def strided_slice(lw, node):
    x, out = node.inputs[0], node.outputs[0]
    begin, end, strides = slice_params(lw.g, node)
    dt = _form(lw, x)
    row = lw.row(node, f"slice on {'uint8' if dt == U8 else 'float32'}: strided_slice", in_shape=lw.shape(x),
                 out_shape=lw.shape(out))
    _copy_or_slice(lw, x, out, dt, begin, end, strides, row)


def split_sizes(g, node):
    shape = g.shape(node.inputs[0])
    axis = int(node.attrs.get("axis", 0)) % len(shape)
    if len(node.inputs) > 1 and node.inputs[1]:
        v = g.const(node.inputs[1])
        if v is None:
            return None, axis
        return [int(s) for s in np.asarray(v).reshape(-1)], axis
    if "split" in node.attrs:
        return [int(s) for s in node.attrs["split"]], axis
    n = len(node.outputs)
    d = shape[axis]
    step = -(-d // n)
    return [min(step, d - i * step) for i in range(n)], axis


def split_refuses(g, node, opts):
    why = _rank_ok(g, node)
    if why:
        return why
    sizes, _ = split_sizes(g, node)
    return "split sizes are not constants" if sizes is None else None


@lowering("Split", unit=CPU_U8, check=split_refuses, formats=("v4",), name="split")
def split(lw, node):
    x = node.inputs[0]
    sizes, axis = split_sizes(lw.g, node)
    rank = len(lw.g.shape(x))
    ax = axis + 4 - rank
    dt = _form(lw, x)
    row = lw.row(node, f"split into {len(sizes)} on axis {axis}: strided_slice each", in_shape=lw.shape(x))
    shape = g4(lw.g, x)
    at = 0
    for out, size in zip(node.outputs, sizes):
        begin, end = [0, 0, 0, 0], list(shape)
        begin[ax], end[ax] = at, at + size
        at += size
        if out:
            _copy_or_slice(lw, x, out, dt, begin, end, (1, 1, 1, 1), row)


def pad_refuses(g, node, opts):
    why = _rank_ok(g, node)
    if why:
        return why
    p = pads_of(g, node)
    if isinstance(p, str):
        return p
    pairs, value, mode = p
    if mode in ("edge", "reflect"):
        if any(a or b for a, b in pairs[:2]) or any(min(a, b) < 0 for a, b in pairs):
            return (f"{mode} padding of N or C, or a crop: only H / W borders are copied; pad "
                    "H and W only (ZeroPad2d/ReflectionPad2d/ReplicationPad2d do)")
        shape = g4(g, node.inputs[0])
        if mode == "reflect" and any(max(p) >= n for p, n in zip(pairs[2:], shape[2:])):
            return (f"reflect pads {pairs[2:]} reach past the {shape[2]}x{shape[3]} map (ONNX needs "
                    "pad < size); use a smaller pad or mode edge")
        return None
    if mode != "constant":
        return (f"Pad mode {mode}: the v4 pad is constant (edge and reflect padding are built from "
                "slices); use mode constant, edge or reflect")
    return None


@lowering("Pad", unit=CPU_U8, check=pad_refuses, formats=("v4",), name="pad")
def pad(lw, node):
    from .v4resize import edge_pad
    x, out = node.inputs[0], node.outputs[0]
    pairs, value, mode = pads_of(lw.g, node)
    dt = _form(lw, x)
    row = lw.row(node, f"{mode} pad", in_shape=lw.shape(x), out_shape=lw.shape(out))
    if mode in ("edge", "reflect"):
        src = _src(lw, x, dt, row)
        dst = _out(lw, out, dt, x)
        n_, c, h, w = g4(lw.g, x)
        oh, ow = h + sum(pairs[2]), w + sum(pairs[3])
        esz = nbytes(dt, 1)
        room = lw.float_room()
        slices = [(0, c)]
        if n_ == 1 and any(pairs[2]) and any(pairs[3]) and room is not None and c * oh * w * esz > room:
            # the rows-padded map between the two axes' concats, a slice of channels at a time
            # (Magenta's style net: a reflect pad of a 16x384x384 map held three maps at once)
            slices = float_slices(c, h * w, oh * w * esz, room)
            row.notes.append(f"padded {max(b - a for a, b in slices)} channels at a time")
        for c0, c1 in slices:
            cur, shape = edge_pad(lw, src + c0 * h * w * esz, (n_, c1 - c0, h, w), dt, pairs[2], pairs[3], row,
                                  out + ":edge", mode, dst + c0 * oh * ow * esz)
        if cur == src:      # nothing padded
            n = _count(lw, out)
            lw.emit_v4("memory_copy", dict(input=main(dt, cur, n), output=main(dt, dst, n)), row)
        _mark(lw, out, dt)
        return
    q = None
    if dt == U8:
        src = lw.need_u8(x, row)
        s, z = lw.locs[x].quant
        qv = value / s + z
        if abs(qv - round(qv)) < 1e-6 and 0 <= round(qv) <= 255:
            q = int(round(qv))
        else:
            dt = F32
            row.notes.append(f"pad value {value} is not on the uint8 grid: float pad")
    src = _src(lw, x, dt, row)
    dst = _out(lw, out, dt, x)
    flat = tuple(v for pr in pairs for v in pr)
    lw.emit_v4("pad", dict(input=main(dt, src, _count(lw, x)), output=main(dt, dst, _count(lw, out)),
                           in_shape=g4(lw.g, x), paddings=flat,
                           pad_value=pad_scalar(q if dt == U8 else value, dt)), row)
    _mark(lw, out, dt)


def concat_refuses(g, node, opts):
    why = _rank_ok(g, node)
    if why:
        return why
    if any(g.const(t) is not None for t in node.inputs):
        return "a constant input"
    return None


@lowering("Concat", unit=CPU_U8, check=concat_refuses, formats=("v4",), name="concat")
def concat(lw, node):
    """Concat on any axis: inputs requantized to the output's scale (tables), then one concat node
    copying, for each outer index, dims[i] x inner bytes of every input in turn."""
    out = node.outputs[0]
    rank = len(lw.g.shape(out))
    axis = int(node.attrs.get("axis", 1)) % rank
    ax = axis + 4 - rank
    shape = g4(lw.g, out)
    # float when every input is, or when it is a model output (scores next to boxes keep their
    # own steps instead of one uint8 grid over both), through other concats and transposes
    dt = F32 if feeds_output(lw.g, out, CONCAT_MOVES) or all(_form(lw, t) == F32 for t in node.inputs) else U8
    row = lw.row(node, f"concat on axis {axis} ({'float32' if dt == F32 else 'uint8'})", out_shape=lw.shape(out))
    so, zo = (None, None) if dt == F32 else lw.quant_of(out)
    parts, dims, tmp = [], [], []
    for t in node.inputs:
        n = _count(lw, t)
        if dt == F32:
            src = lw.need_f32(t, row)
        else:
            src = lw.need_u8(t, row)
            s_in, z_in = lw.locs[t].quant
            if abs(s_in - so) > 1e-9 * so or z_in != zo:
                name = f"{out}:rq{len(tmp)}"
                dst = lw.main.alloc(name, n)
                tmp.append(name)
                lw.emit("REQUANTIZE", dict(flags=1, main_mem_in_address=src, main_mem_out_address=dst, count=n),
                        row, data={"table": table(lambda v: v, s_in, z_in, so, zo)})
                src = dst
        parts.append((t, src, nbytes(dt, n)))
        dims.append(g4(lw.g, t)[ax])
    dst = lw.f32_out(out).f32 if dt == F32 else lw.u8_out(out, (so, zo)).u8
    inner, outer = int(np.prod(shape[ax + 1:])) * (4 if dt == F32 else 1), int(np.prod(shape[:ax]))
    dim = {a: d for (_, a, _), d in zip(parts, dims)}

    def copy(at, run):
        return lw.emit_v4("concat", dict(output=(MEM_MAIN, dt, at, sum(n for _, n in run)), inner_size=inner,
                                         outer_size=outer, inputs_count=len(run)), row,
                          data={"inputs": [(MEM_MAIN, dt, a, n) for a, n in run], "dims": [dim[a] for a, _ in run]})
    if outer == 1:       # each input one range of the output: producers may write it there
        kind = "f32" if dt == F32 else "u8"
        lw.concat_into(node, row, f"{out}:{kind}", dst, parts, kind, copy)
    else:
        copy(dst, [(a, n) for _, a, n in parts])
        _mark(lw, out, dt)
    for name in tmp:
        lw.main.free(name)


# ---------------------------------------------------------------------------------------------
# reductions and pools (float kernels)
def reduce_refuses(g, node, opts):
    why = _rank_ok(g, node)
    if why:
        return why
    if len(node.inputs) > 1 and node.inputs[1] and axes_of(g, node) is None:
        return "axes are not a constant"
    return None


@lowering(*REDUCE, unit=CPU_F32, check=reduce_refuses, formats=("v4",), name="reduce")
def reduce(lw, node):
    x, out = node.inputs[0], node.outputs[0]
    rank = len(lw.g.shape(x))
    axes = axes_of(lw.g, node)
    if axes is None:
        axes = [] if node.attrs.get("noop_with_empty_axes", 0) else list(range(rank))
    axes = sorted(a % rank + 4 - rank for a in axes)
    in4 = g4(lw.g, x)
    out4 = tuple(1 if i in axes else d for i, d in enumerate(in4))
    op = REDUCE[node.op]
    exact_u8 = op in (1, 2) and _form(lw, x) == U8
    row = lw.row(node, f"{node.op} over axes {axes}: float reduce", in_shape=lw.shape(x), out_shape=lw.shape(out))
    n_in, n_out = int(np.prod(in4)), int(np.prod(out4))
    if exact_u8:           # min / max of uint8 values: the same uint8 values, the same quantization
        src = lw.need_u8(x, row)
        a, b = lw.main.alloc(out + ":dq", 4 * n_in), lw.main.alloc(out + ":red", 4 * n_out)
        dst = _out(lw, out, U8, x)
        lw.emit_v4("dequantize", dict(input=main(U8, src, n_in), output=main(F32, a, n_in), quant_param=(0, 1.0)), row)
        lw.emit_v4("reduce", dict(input=main(F32, a, n_in), output=main(F32, b, n_out), reduce_op=op, in_shape=in4,
                                  out_shape=out4, init_value=INIT[op]), row)
        lw.emit_v4("quantize", dict(input=main(F32, b, n_out), output=main(U8, dst, n_out), quant_param=(0, 1.0)), row)
        lw.main.free(out + ":dq")
        lw.main.free(out + ":red")
        _mark(lw, out, U8)
        row.notes.append("on the uint8 values (exact; quantization unchanged)")
        return
    src = lw.need_f32(x, row)
    dst = lw.f32_out(out).f32
    lw.emit_v4("reduce", dict(input=main(F32, src, n_in), output=main(F32, dst, n_out), reduce_op=op, in_shape=in4,
                              out_shape=out4, init_value=INIT[op]), row)
    _mark(lw, out, F32)
    norm = norm_pattern(lw.g, node)
    if norm is not None:     # the smaller form: v4norm (the whole map's sums in another order)
        lw.smaller[node.name + SLICES] = norm.mode == "channel"


def window_pool(lw, x, out, kind, kernel, strides, pads, row, dtype=None, dilations=(1, 1), count_pads=False):
    """A pooling window on the CPU: reduce_window2d (float). A uint8 max pool keeps its values and
    quantization (dequantize 1/0, pool, quantize 1/0); a uint8 mean pool is dequantized and the
    result quantized to `out`'s range."""
    c, h, w = lw.locs[x].shape if x in lw.locs else lw.shape(x)
    oc, oh, ow = lw.shape(out)
    kh, kw = kernel
    sh, sw = strides
    dh, dw = dilations
    t, l, b, r = pads
    eff_h, eff_w = (kh - 1) * dh + 1, (kw - 1) * dw + 1
    pb, pr = (oh - 1) * sh + eff_h - h - t, (ow - 1) * sw + eff_w - w - l   # the runtime's floor size = oh, ow
    dt = dtype if dtype is not None else _form(lw, x)
    n_in, n_out = c * h * w, c * oh * ow
    win = dict(padding_h=(t, pb), padding_w=(l, pr), filter_h=kh, filter_w=kw, stride_h=sh, stride_w=sw,
               dilation_h=dh, dilation_w=dw)
    op = 2 if kind == "max" else (3 if count_pads else 0)
    init = -FLT_MAX if kind == "max" else 0.0
    shape = (1, c, h, w)
    if dt == F32:
        src = lw.need_f32(x, row)
        pre = lw.main.alloc(out + ":sum", 4 * n_out) if count_pads else None
        dst = lw.f32_out(out).f32
        lw.emit_v4("reduce_window2d", dict(input=main(F32, src, n_in), output=main(F32, pre if count_pads else dst, n_out),
                                           reduce_op=op, in_shape=shape, init_value=init, fused_activation=NO_CLAMP,
                                           **win), row)
        if count_pads:
            _scale(lw, pre, dst, n_out, 1.0 / (kh * kw), row)
            lw.main.free(out + ":sum")
        _mark(lw, out, F32)
        return
    src = lw.need_u8(x, row)
    s_in, z_in = lw.locs[x].quant
    if kind == "max":
        qin = qout = (0, 1.0)
        so = (s_in, z_in)
    else:
        so = lw.quant_of(out)
        qin, qout = (z_in, 1.0 / s_in), (so[1], 1.0 / so[0])
    slices = float_slices(c, h * w, 4 * (h * w + (1 + count_pads) * oh * ow))   # float copies, a few channels at a time
    k = max(c1 - c0 for c0, c1 in slices)
    a, bb = lw.main.alloc(out + ":dq", 4 * k * h * w), lw.main.alloc(out + ":pool", 4 * k * oh * ow)
    dst = lw.u8_out(out, so).u8
    scaled = lw.main.alloc(out + ":scaled", 4 * k * oh * ow) if count_pads else None

    def pool(c0, c1):
        ni, no = (c1 - c0) * h * w, (c1 - c0) * oh * ow
        lw.emit_v4("reduce_window2d", dict(input=main(F32, a, ni), output=main(F32, bb, no), reduce_op=op,
                                           in_shape=(1, c1 - c0, h, w), init_value=init, fused_activation=NO_CLAMP,
                                           **win), row)
        if count_pads:
            _scale(lw, bb, scaled, no, 1.0 / (kh * kw), row)
            return scaled
        return bb
    parts = through_float(lw, row, slices, src, dst, h * w, oh * ow, qin, qout, a, pool)
    for tag in (":dq", ":pool", ":scaled"):
        lw.main.free(out + tag)
    lw.trace_map[out] = (parts[0] if len(parts) == 1 else tuple(parts), "u8")
    if len(parts) > 1:
        row.notes.append(f"the float pool in {len(parts)} channel slices (a slice of float at a time)")


def _scale(lw, src, dst, n, k, row):
    one = (1, 1, 1, 1)
    lw.emit_v4("binary", dict(input_a=main(F32, src, n), input_b=Const(np.float32([k])), output=main(F32, dst, n),
                              binary_op=2, in_a_shape=(1, 1, 1, n), in_b_shape=one, out_shape=(1, 1, 1, n),
                              fused_activation=NO_CLAMP), row)


def _pool_pads(g, node):
    a = node.attrs
    k = list(a["kernel_shape"])
    s = list(a.get("strides", [1, 1]))
    d = list(a.get("dilations", [1, 1]))
    auto = a.get("auto_pad", "NOTSET")
    if auto != "NOTSET":
        return same_pads(g.shape(node.inputs[0])[2:], s, k, d, auto)
    return list(a.get("pads", [0, 0, 0, 0]))


def pool_refuses(g, node, opts):
    a = node.attrs
    if len(a.get("kernel_shape", ())) != 2:
        return "only 2-D pools"
    if node.op == "AveragePool" and a.get("count_include_pad", 0) and a.get("ceil_mode", 0):
        return "count_include_pad with ceil_mode"
    return None


@lowering("MaxPool", unit=CPU_U8, check=pool_refuses, formats=("v4",), name="reduce_window2d_max")
@lowering("AveragePool", unit=CPU_F32, check=pool_refuses, formats=("v4",), name="reduce_window2d_mean")
def pool(lw, node):
    x, out = node.inputs[0], node.outputs[0]
    a = node.attrs
    kind = "max" if node.op == "MaxPool" else "mean"
    row = lw.row(node, f"{node.op} {tuple(a['kernel_shape'])}: reduce_window2d", in_shape=lw.shape(x),
                 out_shape=lw.shape(out))
    window_pool(lw, x, out, kind, tuple(a["kernel_shape"]), tuple(a.get("strides", (1, 1))), _pool_pads(lw.g, node),
                row, dtype=None if kind == "max" else F32, dilations=tuple(a.get("dilations", (1, 1))),
                count_pads=bool(a.get("count_include_pad", 0)))


# ---------------------------------------------------------------------------------------------
def softmax_refuses(g, node, opts):
    return _rank_ok(g, node)


@lowering("Softmax", unit=CPU_F32, check=softmax_refuses, formats=("v4",), name="softmax_axis")
def softmax(lw, node):
    """Softmax over any axis: the runtime normalises contiguous runs of inner_size values, so an axis
    with data after it is moved last (transpose), normalised, and moved back. A uint8 map whose
    softmax no reader needs as float (`_sliced_softmax`) is dequantized, normalised and quantized a
    slice at a time."""
    x, out = node.inputs[0], node.outputs[0]
    rank = len(lw.g.shape(x))
    axis = int(node.attrs.get("axis", -1 if lw.g.meta.get("opset", 13) >= 13 else 1)) % rank + 4 - rank
    shape = g4(lw.g, x)
    n = int(np.prod(shape))
    row = lw.row(node, f"softmax over axis {axis - 4 + rank}", in_shape=lw.shape(x), out_shape=lw.shape(out))
    xl = lw.locs[x]
    if xl.f32 is None and xl.pixels is None and not lw.float_readers(out):
        _sliced_softmax(lw, x, out, shape, axis, row)
        return
    src = lw.need_f32(x, row)
    dst = lw.f32_out(out).f32
    if int(np.prod(shape[axis + 1:])) == 1:
        lw.emit_v4("softmax", dict(input=main(F32, src, n), output=main(F32, dst, n), inner_size=shape[axis],
                                   outer_size=n // shape[axis], beta=1.0), row)
    else:
        perm, back, moved = _axis_last(shape, axis)
        a, b = lw.main.alloc(out + ":t", 4 * n), lw.main.alloc(out + ":s", 4 * n)
        lw.emit_v4("transpose", dict(input=main(F32, src, n), output=main(F32, a, n), in_shape=shape,
                                     perm=perm), row)
        lw.emit_v4("softmax", dict(input=main(F32, a, n), output=main(F32, b, n), inner_size=shape[axis],
                                   outer_size=n // shape[axis], beta=1.0), row)
        lw.emit_v4("transpose", dict(input=main(F32, b, n), output=main(F32, dst, n), in_shape=moved,
                                     perm=back), row)
        lw.main.free(out + ":t")
        lw.main.free(out + ":s")
        row.notes.append("axis moved last and back (transpose)")
    _mark(lw, out, F32)


def _axis_last(shape, axis):
    """(perm, its inverse, the moved shape) of the 4-D transpose that puts `axis` last."""
    perm = tuple(i for i in range(4) if i != axis) + (axis,)
    return perm, tuple(perm.index(i) for i in range(4)), tuple(shape[p] for p in perm)


def _sliced_softmax(lw, x, out, shape, axis, row):
    """The softmax of the uint8 map `x` into a uint8 `out`: the axis moved last on the uint8 bytes
    (transpose; none when it is last), then a slice of its vectors at a time dequantized,
    normalised and quantized (float_slices: the float scratch within Lowering.float_room), and
    the bytes moved back. The float softmax of each vector is the one big op's, so the bytes are
    those of the float path quantized where its uint8 reader would (YOLOv8's DFL head: 4x16x756,
    four float copies of 194 KB at once before, 3.4x its live set)."""
    n, k = int(np.prod(shape)), shape[axis]
    s, z = lw.locs[x].quant
    src = lw.need_u8(x, row)
    last = int(np.prod(shape[axis + 1:])) == 1
    so, zo = lw.quant_of(out)
    if not last:            # the output is written by the last transpose: allocated then
        perm, back, moved = _axis_last(shape, axis)
        a_u8, b_u8 = lw.main.alloc(out + ":t", n), lw.main.alloc(out + ":s", n)
        lw.emit_v4("transpose", dict(input=main(U8, src, n), output=main(U8, a_u8, n), in_shape=shape,
                                     perm=perm), row)
        src, dst = a_u8, b_u8
    else:
        dst = lw.u8_out(out, (so, zo)).u8
    slices = float_slices(n // k, k, 8 * k, lw.float_room())
    m = max(v1 - v0 for v0, v1 in slices)
    fa, fb = lw.main.alloc(out + ":dq", 4 * m * k), lw.main.alloc(out + ":sm", 4 * m * k)
    for v0, v1 in slices:
        c = (v1 - v0) * k
        lw.emit("DEQUANTIZE", dict(flags=1, main_mem_in_address=src + v0 * k, mem_out_address=fa, count=c,
                                   scale=s, bias=-z * s), row)
        lw.emit_v4("softmax", dict(input=main(F32, fa, c), output=main(F32, fb, c), inner_size=k,
                                   outer_size=v1 - v0, beta=1.0), row)
        lw.emit("QUANTIZE", dict(flags=0, main_mem_in_address=fb, mem_out_address=dst + v0 * k, count=c,
                                 scale=so, bias=-zo * so), row)
    lw.main.free(out + ":dq")
    lw.main.free(out + ":sm")
    if not last:
        lw.main.free(out + ":t")
        loc = lw.u8_out(out, (so, zo))
        lw.emit_v4("transpose", dict(input=main(U8, dst, n), output=main(U8, loc.u8, n), in_shape=moved,
                                     perm=back), row)
        lw.main.free(out + ":s")
    row.notes.append(("axis moved last and back on the uint8 bytes (transpose); " if not last else "")
                     + f"dequantized, normalised and quantized {m} vectors of {k} at a time "
                     f"({8 * m * k:,} B of float scratch)")
    _mark(lw, out, U8)

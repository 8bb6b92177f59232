"""A nearest Resize of any size ratio as memory ops: a gather of rows, then of columns, with the
constant source indices ONNX defines (v4resize.onnx_nearest: every coordinate_transformation_mode
with a formula, every nearest_mode, clamped to the input).

Along an axis the output is runs of consecutive source rows (18 -> 20 rows: 0..4, 4..13,
13..17): each run a strided_slice into a temporary, then one concat of the runs in output order
(the concat takes a range more than once where a run recurs). No weights, no arithmetic: exact
on uint8 (and float) maps. The resize_image plans (v4resize) go first where one samples the same
coordinates; this takes what they cannot (tf_half_pixel_for_nn 18 -> 20, 96 -> 33 ...)."""
from __future__ import annotations

import numpy as np

from .registry import CPU_U8, NA, lowering
from .v4emit import BYTES, main, slice_op
from .v4ops import _form, _mark, _out, _src
from .v4resize import _attrs, _scales, onnx_nearest


def gather_indices(g, node):
    """(H indices, W indices) of a nearest Resize of an NCHW map, or the reason there are none."""
    mode, cmode, nmode = _attrs(g, node)
    x, y = g.shape(node.inputs[0]), g.shape(node.outputs[0])
    if len(x) != 4 or tuple(x[:2]) != tuple(y[:2]):
        return f"Resize of {tuple(x)} -> {tuple(y)}: only the H and W axes of an NCHW map are gathered"
    if nmode not in ("floor", "ceil", "round_prefer_floor", "round_prefer_ceil"):
        return f"nearest_mode {nmode}: not one ONNX defines"
    idx = [onnx_nearest(cmode, nmode, n, m, s) for n, m, s in zip(x[2:], y[2:], _scales(g, node))]
    if any(i is None for i in idx):
        return f"coordinate_transformation_mode {cmode}: no source index formula (tf_crop_and_resize needs rois)"
    return tuple(idx)


def gather_refuses(g, node, opts):
    if node.attrs.get("mode", "nearest") != "nearest":
        return NA
    if node.attrs.get("antialias", 0):
        return "antialias=1: a nearest resize with an antialiasing filter is not a gather"
    r = gather_indices(g, node)
    return r if isinstance(r, str) else None


def runs(idx):
    """[(first source row, count)] of consecutive source rows, in output order."""
    out = []
    for i in (int(v) for v in idx):
        if out and i == out[-1][0] + out[-1][1]:
            out[-1] = (out[-1][0], out[-1][1] + 1)
        else:
            out.append((i, 1))
    return out


def gather_axis(lw, dt, src, shape, axis, idx, dst, row, tag):
    """Write `src` (4-D `shape`) gathered along `axis` by `idx` to `dst`: strided_slices of the
    runs (the whole axis in one run is `src` itself), one concat."""
    esz, size = BYTES[dt], int(np.prod(shape))
    parts, temps = {}, []
    for r0, k in runs(idx):
        if (r0, k) in parts:
            continue
        if r0 == 0 and k == shape[axis]:
            parts[(r0, k)] = (src, size)
            continue
        sub = list(shape)
        sub[axis] = k
        n = int(np.prod(sub))
        name = f"{tag}:axis{axis}:{r0}+{k}"
        addr = lw.main.alloc(name, n * esz)
        temps.append(name)
        begin, end = [0, 0, 0, 0], list(shape)
        begin[axis], end[axis] = r0, r0 + k
        v = slice_op(main(dt, src, size), main(dt, addr, n), shape, begin, end, (1, 1, 1, 1))
        lw.emit_v4(v.name, v.fields, row)
        parts[(r0, k)] = (addr, n)
    seq = runs(idx)
    total = size // shape[axis] * len(idx)
    lw.emit_v4("concat", dict(output=main(dt, dst, total), inner_size=int(np.prod(shape[axis + 1:])) * esz,
                              outer_size=int(np.prod(shape[:axis])), inputs_count=len(seq)), row,
               data={"inputs": [main(dt, *parts[rk]) for rk in seq], "dims": [k for _, k in seq]})
    for name in temps:
        lw.main.free(name)
    return len(parts) - (1 if any(p[0] == src for p in parts.values()) else 0), len(seq)


@lowering("Resize", unit=CPU_U8, check=gather_refuses, formats=("v4",), name="resize_gather")
def resize_gather(lw, node):
    x, out = node.inputs[0], node.outputs[0]
    ih, iw = gather_indices(lw.g, node)
    c, h, w = lw.shape(x)
    dt = _form(lw, x)
    row = lw.row(node, f"nearest resize as a gather of rows and columns on {'uint8' if BYTES[dt] == 1 else 'float32'}"
                 " (strided_slice + concat)", in_shape=(c, h, w), out_shape=(c, len(ih), len(iw)))
    src = _src(lw, x, dt, row)
    dst = _out(lw, out, dt, x)
    tag = out + ":gather"
    steps = [(2, ih)] * (not np.array_equal(ih, np.arange(h))) + [(3, iw)] * (not np.array_equal(iw, np.arange(w)))
    shape, cur = (1, c, h, w), src
    if not steps:                                      # the identity: one copy
        lw.emit_v4("memory_copy", dict(input=main(dt, src, c * h * w), output=main(dt, dst, c * h * w)), row)
    for k, (axis, idx) in enumerate(steps):
        nxt = list(shape)
        nxt[axis] = len(idx)
        last = k == len(steps) - 1
        at = dst if last else lw.main.alloc(f"{tag}:rows", int(np.prod(nxt)) * BYTES[dt])
        slices, pieces = gather_axis(lw, dt, cur, shape, axis, idx, at, row, tag)
        row.notes.append(f"{'HW'[axis - 2]}: {shape[axis]} -> {len(idx)} from {pieces} runs of source "
                         f"{'rows' if axis == 2 else 'columns'} ({slices} strided_slices)")
        cur, shape = at, tuple(nxt)
    lw.main.free(f"{tag}:rows")
    _mark(lw, out, dt)

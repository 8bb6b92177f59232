"""ONNX linear Resize by a rational factor on uint8 maps, one axis at a time, as phases.

Where no resize_image plan samples ONNX's coordinates (v4resize: half_pixel at a scale such as
0.8 or 1.5, Keras' Resizing and TF2's resize to a fixed size), the float form is the axis's
interpolation matrix as a float matmul: W·W' + H·H' MACs a row and column, 4 bytes a value. On
one axis, ONNX's input coordinate of output o, c(o), is affine in o with a rational slope
in/out = p/q, so the outputs come in q phases: output q·k + j reads input samples
p·k + a_j and p·k + a_j + 1 with the same weights (1 − f_j, f_j) for every k. With the axis
edge-padded by one sample (a coordinate in [−1, 0) or (n − 1, n] then reads the edge twice:
ONNX's clamp), each phase is two strided_slices and one quantized_binary Add whose input
multipliers are the weights (a phase with f_j = 0 is the slice alone), and one concat
interleaves the q phases. About 5 passes over the output a phase axis instead of the matmul's
in-size MACs per output, and uint8 throughout: the output keeps the input's quantization (a
convex combination stays in its range), rounded once per axis. The plan is checked against
ONNX's interpolation matrix on every output (to 1e-3 a weight: a quarter of a uint8 step at most); more than MAX_PHASES phases (DeepLab's 33 -> 257)
keep the float matmul.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tl2k210.k210 import fixed_point as fx

from .registry import CPU_U8, NA, lowering
from .v4emit import U8, main, slice_op
from .v4resize import _attrs, _op, _scales, edge_pad, onnx_coords, onnx_linear_matrix, plan

MAX_PHASES = 8
ADD = 0                  # binary_op add (kmodel.v4 BINARY_OPS)
DOMAIN = 20              # the weighted sum in 2^20 steps of the input's scale
TOL = 1e-4               # coordinates: a float32 scale's drift (1e-5 at 300 outputs), far below a uint8 step


@dataclass(frozen=True)
class Phases:
    p: int                # padded-input step from one period to the next
    q: int                # outputs a period
    taps: tuple           # per phase j: (padded index of its first sample at k = 0, weight f_j of the second)

    def matrix(self, n: int, m: int) -> np.ndarray:
        """The (m, n) interpolation matrix this plan computes (padded index i reads i − 1, clamped)."""
        a = np.zeros((m, n))
        for o in range(m):
            k, j = divmod(o, self.q)
            i, f = self.taps[j]
            for idx, wt in ((i + self.p * k, 1 - f), (i + self.p * k + 1, f)):
                a[o, min(max(idx - 1, 0), n - 1)] += wt
        return a


def axis_phases(cmode, n: int, m: int, scale: float) -> Phases | None:
    """The phase plan of one axis (n -> m), or None (no resize on it, or none samples ONNX's)."""
    c = onnx_coords(cmode, n, m, scale)
    if c is None or n == m and np.allclose(c, np.arange(m)):
        return None
    if c.min() < -1 - TOL or c.max() > n + TOL:      # one edge sample each side covers ONNX's clamp
        return None
    c = np.round(c / TOL) * TOL      # a float32 scale (0.800000012) drifts the period by 1e-8 an output
    i0 = np.floor(c).astype(int)
    f = c - i0
    want = onnx_linear_matrix(cmode, n, m, scale)
    for q in range(1, MAX_PHASES + 1):
        if m % q or (m == q and q > 1):
            continue
        p = int(i0[q] - i0[0]) if m > q else 0
        o = np.arange(m)
        if not (np.allclose(f, f[o % q], atol=2 * TOL) and np.array_equal(i0 - i0[o % q], p * (o // q))):
            continue
        ph = Phases(p, q, tuple((int(i0[j]) + 1, round(float(f[j]), 4)) for j in range(q)))
        last = max(i + p * (m // q - 1) + (1 if wt else 0) for i, wt in ph.taps)
        if last <= n + 1 and np.allclose(ph.matrix(n, m), want, atol=10 * TOL):
            return ph
    return None


def phase_plan(g, node):
    """(Phases or None for H, for W) or the reason there is none."""
    mode, cmode, _ = _attrs(g, node)
    x, y = g.shape(node.inputs[0]), g.shape(node.outputs[0])
    if mode != "linear" or len(x) != 4 or tuple(x[:2]) != tuple(y[:2]):
        return NA
    if node.attrs.get("antialias", 0):
        return "antialias=1: ONNX's antialiasing filter is not two-sample phases"
    if not isinstance(plan(g, node), str):
        return "a resize_image or conv2d_transpose plan samples ONNX's coordinates on float32"
    axes = []
    for n, m, s in zip(x[2:], y[2:], _scales(g, node)):
        ph = axis_phases(cmode, n, m, s)
        if ph is None and n != m:
            return (f"{n} -> {m} ({cmode}) is not a ratio of at most {MAX_PHASES} phases of two "
                    "samples: the float matmul by ONNX's interpolation matrix")
        axes.append(ph)
    return tuple(axes) if any(axes) else NA      # no axis resized: a copy, not this form


def phases_refuse(g, node, opts):
    p = phase_plan(g, node)
    return p if isinstance(p, str) else None


@lowering("Resize", unit=CPU_U8, check=phases_refuse, formats=("v4",), name="resize_phases")
def resize_phases(lw, node):
    x, out = node.inputs[0], node.outputs[0]
    axes = phase_plan(lw.g, node)
    c, h, w = lw.shape(x)
    _, oh, ow = lw.shape(out)
    row = lw.row(node, "linear resize: uint8 phases (strided_slice + weighted quantized_binary + concat) "
                 "per axis", in_shape=(c, h, w), out_shape=(c, oh, ow))
    quant = lw.locs[x].quant
    cur, shape = lw.need_u8(x, row), (1, c, h, w)
    todo = [(axis, ph) for axis, ph in ((2, axes[0]), (3, axes[1])) if ph is not None]
    loc = lw.u8_out(out, quant)
    tag = out + ":phases"
    for i, (axis, ph) in enumerate(todo):
        last = i == len(todo) - 1
        m = (oh, ow)[axis - 2]
        dst = loc.u8 if last else lw.main.alloc(f"{tag}:{axis}", int(np.prod(shape)) // shape[axis] * m)
        shape = _axis(lw, cur, shape, axis, ph, m, quant, dst, row, f"{tag}{axis}")
        if i:
            lw.main.free(f"{tag}:{todo[0][0]}")
        cur = dst
        row.notes.append(f"axis {'HW'[axis - 2]}: {ph.q} phase{'s' if ph.q > 1 else ''} of stride {ph.p}, "
                         f"weights {', '.join(f'{1 - f:g}/{f:g}' for _, f in ph.taps)}")
    row.notes.append("output keeps the input's quantization (a convex combination of its samples)")
    lw.traced(out, "u8")


def _axis(lw, src, shape, axis, ph: Phases, m, quant, dst, row, tag):
    """Resize axis `axis` of the uint8 map at src (shape (1, C, H, W)) to m into dst: edge pad,
    the phases, one interleaving concat. Returns the new shape."""
    pads = (1, 0) if axis == 2 else (0, 1)
    cur, pshape = edge_pad(lw, src, shape, U8, *pads, row, tag)
    k = m // ph.q
    part = list(pshape)
    part[axis] = k
    n_part = int(np.prod(part))
    s, z = quant
    sc = s / (1 << DOMAIN)
    om, osh = fx.fixed_mul(sc / s, 32, 62)
    parts = []
    for j, (i, f) in enumerate(ph.taps):
        picks = []
        for t, start in enumerate((i, i + 1) if f else (i,)):
            addr = lw.main.alloc(f"{tag}:p{j}:{t}", n_part)
            begin, end, strides = [0, 0, 0, 0], list(pshape), [1, 1, 1, 1]
            begin[axis], end[axis], strides[axis] = start, start + ph.p * (k - 1) + 1, max(ph.p, 1)
            lw.emit_v4(*_op(slice_op(main(U8, cur, int(np.prod(pshape))), main(U8, addr, n_part), pshape,
                                     tuple(begin), tuple(end), tuple(strides))), row)
            picks.append(addr)
        if f:
            ma, sha = fx.fixed_mul((1 - f) * s / sc, 32, 62)
            mb, shb = fx.fixed_mul(f * s / sc, 32, 62)
            lw.emit_v4("quantized_binary", dict(
                input_a=main(U8, picks[0], n_part), input_b=main(U8, picks[1], n_part),
                output=main(U8, picks[0], n_part), binary_op=ADD, in_a_shape=tuple(part),
                in_b_shape=tuple(part), out_shape=tuple(part), input_a_offset=-z, input_a_mul=ma,
                input_a_shift=sha, input_b_offset=-z, input_b_mul=mb, input_b_shift=shb,
                output_offset=z, output_mul=om, output_shift=osh), row)
            lw.main.free(f"{tag}:p{j}:1")
        parts.append(picks[0])
    out_shape = list(shape)
    out_shape[axis] = m
    inner = int(np.prod(part[axis + 1:]))
    lw.emit_v4("concat", dict(output=main(U8, dst, int(np.prod(out_shape))), inner_size=inner,
                              outer_size=int(np.prod(part[:axis + 1])), inputs_count=ph.q), row,
               data={"inputs": [main(U8, a, n_part) for a in parts], "dims": [1] * ph.q})
    for j in range(ph.q):
        lw.main.free(f"{tag}:p{j}:0")
    lw.main.free(f"{tag}:pad{axis}")
    return tuple(out_shape)

"""ONNX Resize on kmodel v4: `resize_image` (bilinear, nearest), computing exactly what ONNX defines.

The v4 runtime (nncase v0.2 `resize_image`, docs/kmodel-format.md#v4-opcodes) samples input coordinate c = o * in/out
(align_corners: o * (in-1)/(out-1)); bilinear reads y0 = floor(c), y1 = min(y0 + 1, in - 1);
nearest reads min(floor(c), in - 1). ONNX Resize maps output o to a coordinate by its
`coordinate_transformation_mode` (half_pixel by default: (o + 0.5)/scale - 0.5; what Keras
UpSampling2D(interpolation="bilinear") and TF2 `tf.image.resize` write), clamps it to the input
(linear: edge values) and, for nearest, rounds it by `nearest_mode`.

Per axis the lowering finds a v4 plan that samples the same coordinates:
* direct: one resize_image (asymmetric or align_corners; nearest when the index maps agree);
* otherwise the input is edge-padded by one pixel (strided_slice + concat: the v4 pad is
  constant-only), resized to t x the target density and every t-th output from k is kept
  (strided_slice): coordinate (t*o + k) * (in + 2p) / size'' = c(o) + p for every o. half_pixel
  upsampling by an integer factor s takes t = 2, p = 1: 4x the bilinear evaluations of the direct
  form (the receipt shows the cost);
* nearest downscales whose index map is a progression are a strided_slice alone;
* bilinear 2x half_pixel upsampling takes the uint8 KPU form of v3resize.py where the KPU's
  limits allow (a registered KPU alternative, tried first);
* bilinear upsampling by an integer factor s that the direct form cannot sample (half_pixel:
  Keras UpSampling2D, TF2 resize) is, on the edge-padded input, a depthwise `conv2d_transpose`
  with the separable triangle kernel (2s x 2s taps, stride s): the same weights ONNX gives each
  input, about 4 MACs an output and no oversampled temporary (the resize_image + slice plan
  evaluates 4x the outputs and keeps a 16x-per-channel temporary);
* any other linear resize (half_pixel at a scale no plan above samples) is, where its ratio
  repeats within 8 outputs an axis (0.8, 1.25, 5/3: Keras' Resizing), uint8 phases of two
  samples (`v4phases.py`); else (DeepLab's logits 33 -> 257) ONNX's interpolation matrix of each
  axis as a float `matmul`, a `transpose` after each: exact weights at any scale, W·W' + H·H'
  MACs a row / column instead of about 4 an output.
The plan is checked numerically on every output coordinate (float32, as the runtime computes);
modes no plan matches (cubic, tf_crop_and_resize, antialias, ...) are refused with the reason.
Bilinear runs on float32 (the runtime's bilinear kernel is float; nncase's own files only use
nearest on uint8); nearest runs on uint8 (an index copy is exact on the quantized map).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from .memory import float_slices
from .registry import CPU_F32, CPU_U8, NA, lowering
from .v4emit import F32, NO_CLAMP, U8, Const, V4Op, main, slice_op, through_float

f32 = np.float32
MID_BYTES = 65_536         # the oversampled temporary is made for this many bytes of channels at a time


@dataclass(frozen=True)
class AxisPlan:
    pad: int          # edge pixels added on each side first
    size: int         # resize_image output size on this axis
    start: int        # keep outputs start, start + step, ...
    step: int
    align: bool = False

    @property
    def direct(self):
        return self.pad == 0 and self.start == 0 and self.step == 1


def _attrs(g, node):
    a = node.attrs
    return (a.get("mode", "nearest"), a.get("coordinate_transformation_mode", "half_pixel"),
            a.get("nearest_mode", "round_prefer_floor"))


def _scales(g, node):
    """Per-axis ONNX scale (as the operator uses it) of H and W, or None."""
    x, y = g.shape(node.inputs[0]), g.shape(node.outputs[0])
    sc = g.const(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] else None
    if sc is not None and np.asarray(sc).size == 4:
        return [float(v) for v in np.asarray(sc, np.float64)[2:]]
    return [y[2] / x[2], y[3] / x[3]]


def onnx_coords(mode, n, m, scale):
    """ONNX input coordinate of each output (float64), before clamping."""
    o = np.arange(m, dtype=np.float64)
    if mode == "half_pixel":
        return (o + 0.5) / scale - 0.5
    if mode == "pytorch_half_pixel":
        return (o + 0.5) / scale - 0.5 if m > 1 else np.zeros(m)
    if mode == "asymmetric":
        return o / scale
    if mode == "align_corners":
        return o * (n - 1) / (m - 1) if m > 1 else np.zeros(m)
    if mode == "tf_half_pixel_for_nn":
        return (o + 0.5) / scale
    if mode == "half_pixel_symmetric":          # opset 19
        adj = m / (n * scale)
        return n / 2 * (1 - adj) + (o + 0.5) / scale - 0.5
    return None


def _exact_coord(mode, n, m, s, o):
    """ONNX's input coordinate of output `o` in exact rational arithmetic (scale `s` a Fraction)."""
    half = Fraction(1, 2)
    if mode == "half_pixel" or (mode == "pytorch_half_pixel" and m > 1):
        return (o + half) / s - half
    if mode == "pytorch_half_pixel":
        return Fraction(0)
    if mode == "asymmetric":
        return Fraction(o) / s
    if mode == "align_corners":
        return Fraction(o * (n - 1), m - 1) if m > 1 else Fraction(0)
    if mode == "tf_half_pixel_for_nn":
        return (o + half) / s
    if mode == "half_pixel_symmetric":          # opset 19
        adj = Fraction(m) / (s * n)
        return Fraction(n, 2) * (1 - adj) + (o + half) / s - half
    return None


def onnx_nearest(mode, nearest, n, m, scale):
    """The source index of each output of a nearest resize, clamped to the input: ONNX's formula
    in exact arithmetic, as onnxruntime picks them at ties (18 -> 20 asymmetric round_prefer_ceil:
    output 15 is 13.5 -> 14, where float32 gives 13.499999). A scale that is out / in rounded to
    float32 (sizes, or tf2onnx's scales: 1.1111112) is taken as out / in exactly."""
    s = Fraction(m, n) if np.float32(scale) == f32(m) / f32(n) else Fraction(float(scale))
    if _exact_coord(mode, n, m, s, 0) is None:
        return None
    out = []
    for o in range(m):
        c = _exact_coord(mode, n, m, s, o)
        fl = math.floor(c)
        if nearest == "floor":
            i = fl
        elif nearest == "ceil":
            i = math.ceil(c)
        elif nearest == "round_prefer_ceil":
            i = fl + 1 if c - fl >= Fraction(1, 2) else fl
        else:   # round_prefer_floor
            i = fl + 1 if c - fl > Fraction(1, 2) else fl
        out.append(min(max(i, 0), n - 1))
    return np.array(out, np.int64)


def v4_coords(n, m, align):
    """What resize_image computes (float32): the sample coordinate of each output."""
    r = f32(n - 1) / f32(m - 1) if align and m > 1 else f32(n) / f32(m)
    return np.arange(m, dtype=f32) * r


def v4_nearest(n, m):
    return np.minimum(np.floor(v4_coords(n, m, False)).astype(np.int64), n - 1)


def _bilinear_axis(cmode, n, m, scale):
    """AxisPlan sampling ONNX's clamped coordinates on one axis, or None."""
    raw = onnx_coords(cmode, n, m, scale)
    if raw is None:
        return None
    want = np.clip(raw, 0, n - 1)
    tol = 1e-5 * max(n, 1)

    def same(plan):
        got = v4_coords(n + 2 * plan.pad, plan.size, plan.align)[plan.start::plan.step][:m]
        got = np.clip(got.astype(np.float64) - plan.pad, 0, n - 1)
        return got.size == m and np.max(np.abs(got - want)) <= tol

    cands = [AxisPlan(0, m, 0, 1, align) for align in (False, True)]
    for t in (1, 2, 3, 4):
        for p in (0, 1):
            npad = n + 2 * p
            # solve (t*o + k) * npad / size = a*o + b + p for the affine ONNX map a*o + b
            a = (raw[-1] - raw[0]) / (m - 1) if m > 1 else 1.0
            if a <= 0:
                continue
            size = t * npad / a
            if abs(size - round(size)) > 1e-6 or round(size) < 1:
                continue
            size = int(round(size))
            k = (raw[0] + p) * size / npad
            for kk in {int(np.floor(k)), int(np.ceil(k))}:
                if kk >= 0 and kk + t * (m - 1) < size:
                    cands.append(AxisPlan(p, size, kk, t))
    for plan in cands:
        if same(plan):
            return plan
    return None


def onnx_linear_matrix(cmode, n, m, scale):
    """ONNX linear Resize on one axis as an (m, n) matrix (coordinates clamped to the input)."""
    c = np.clip(onnx_coords(cmode, n, m, scale), 0, n - 1)
    i0 = np.floor(c).astype(int)
    i1 = np.minimum(i0 + 1, n - 1)
    A = np.zeros((m, n))
    np.add.at(A, (np.arange(m), i0), 1 - (c - i0))
    np.add.at(A, (np.arange(m), i1), c - i0)
    return A


def resize_as_mean(g, node):
    """((k, s) on H, (k, s) on W) where every output of a linear Resize is the mean of k adjacent
    inputs, the windows s apart from the first pixel (k = 2, s = 2: a 2x downscale with half-pixel
    centres; k = 1: every s-th pixel), or None (or an identity)."""
    mode, cmode, _ = _attrs(g, node)
    x, y = g.shape(node.inputs[0]), g.shape(node.outputs[0])
    if mode != "linear" or node.attrs.get("antialias") or len(x) != 4 or len(y) != 4 or x[:2] != y[:2]:
        return None
    axes = []
    for n, m, scale in zip(x[2:], y[2:], _scales(g, node)):
        if onnx_coords(cmode, n, m, scale) is None:
            return None
        A = onnx_linear_matrix(cmode, n, m, scale)
        for k, s in dict.fromkeys([(1, 1), (2, 2), (1, max(1, n // m)), (2, max(1, n // m))]):
            if m != (n - k) // s + 1:
                continue
            B = np.zeros((m, n))
            for j in range(k):
                B[np.arange(m), np.arange(m) * s + j] = 1.0 / k
            if np.allclose(A, B, rtol=0, atol=1e-6):
                axes.append((k, s))
                break
        else:
            return None
    return None if axes == [(1, 1), (1, 1)] else tuple(axes)


@dataclass(frozen=True)
class DeconvAxis:
    """Upsampling by `s` as conv2d_transpose of the input edge-padded by one pixel: kernel `k`
    (2s taps), padding (before, after) = (pad, 3s - pad)."""
    s: int
    pad: int
    k: tuple

    def matrix(self, n):
        """What the plan computes, as an (n*s, n) matrix."""
        E = np.zeros((n + 2, n))
        E[np.arange(n + 2), np.clip(np.arange(n + 2) - 1, 0, n - 1)] = 1
        D = np.zeros((n * self.s, n + 2))
        for j in range(n + 2):
            for t, kv in enumerate(self.k):
                o = j * self.s + t - self.pad
                if 0 <= o < n * self.s:
                    D[o, j] += kv
        return D @ E


def _deconv_axis(cmode, n, m, scale):
    """DeconvAxis computing ONNX's linear resize n -> m = n*s exactly, or None."""
    if m % n or m // n < 1 or onnx_coords(cmode, n, m, scale) is None:
        return None
    s = m // n
    pad = int(np.ceil(1.5 * s - 0.5))
    k = tuple(float(f32(max(0.0, 1 - abs((t - pad + 0.5) / s + 0.5)))) for t in range(2 * s))
    ax = DeconvAxis(s, pad, k)
    return ax if np.max(np.abs(ax.matrix(n) - onnx_linear_matrix(cmode, n, m, scale))) <= 1e-6 else None


def deconv_plan(g, node):
    """(DeconvAxis h, DeconvAxis w) when a linear Resize is an integer upsampling whose direct
    resize_image form does not sample ONNX's coordinates, else None."""
    mode, cmode, _ = _attrs(g, node)
    if mode != "linear" or node.attrs.get("antialias", 0):
        return None
    p = plan(g, node)
    if isinstance(p, str) or all(a.direct for a in p[1]):
        return None
    x, y = g.shape(node.inputs[0]), g.shape(node.outputs[0])
    axes = tuple(_deconv_axis(cmode, n, m, sc) for n, m, sc in zip(x[2:], y[2:], _scales(g, node)))
    return axes if all(axes) and any(a.s > 1 for a in axes) else None


#: nearest_mode as floor(c + beta) of the ONNX coordinate c (ceil-like modes just below the tie)
NEAREST_BETA = {"floor": 0.0, "round_prefer_ceil": 0.5, "round_prefer_floor": 0.5 - 1e-7, "ceil": 1 - 1e-7}


def _nearest_axis(cmode, nmode, n, m, scale):
    want = onnx_nearest(cmode, nmode, n, m, scale)
    raw = onnx_coords(cmode, n, m, scale)
    if want is None or nmode not in NEAREST_BETA:
        return None
    if np.array_equal(v4_nearest(n, m), want):
        return AxisPlan(0, m, 0, 1)
    d = np.diff(want)
    if m > 1 and d[0] >= 1 and np.all(d == d[0]):         # a progression: a strided slice alone
        return AxisPlan(0, 0, int(want[0]), int(d[0]))
    a = (raw[-1] - raw[0]) / (m - 1) if m > 1 else 1.0
    for t in (1, 2, 3, 4):
        for p in (0, 1):
            npad = n + 2 * p
            size = t * npad / a
            if a <= 0 or abs(size - round(size)) > 1e-6:
                continue
            size = int(round(size))
            k0 = (raw[0] + NEAREST_BETA[nmode] + p) * size / npad
            for k in sorted({int(np.floor(k0)), int(np.ceil(k0)), int(np.floor(k0)) - 1}):
                if k < 0 or k + t * (m - 1) >= size:
                    continue
                got = np.clip(v4_nearest(npad, size)[k::t][:m] - p, 0, n - 1)
                if np.array_equal(got, want):
                    return AxisPlan(p, size, k, t)
    return None


def plan(g, node):
    """(kind, (AxisPlan h, AxisPlan w)) or the reason there is none."""
    mode, cmode, nmode = _attrs(g, node)
    x, y = g.shape(node.inputs[0]), g.shape(node.outputs[0])
    if len(x) != 4 or tuple(x[:2]) != tuple(y[:2]):
        return f"Resize of {tuple(x)} -> {tuple(y)}: only the H and W axes of an NCHW map are resized"
    if node.attrs.get("antialias", 0):
        return "antialias=1: resize_image has no antialiasing filter"
    if mode not in ("linear", "nearest"):
        return f"mode {mode}: resize_image has bilinear and nearest only"
    if cmode == "tf_crop_and_resize":
        return "coordinate_transformation_mode tf_crop_and_resize: not expressible with resize_image"
    sc = _scales(g, node)
    axes = []
    for n, m, s in zip(x[2:], y[2:], sc):
        p = _bilinear_axis(cmode, n, m, s) if mode == "linear" else _nearest_axis(cmode, nmode, n, m, s)
        if p is None:
            return (f"{mode} resize {n} -> {m} with coordinate_transformation_mode {cmode}"
                    + (f", nearest_mode {nmode}" if mode == "nearest" else "")
                    + ": no resize_image + slice plan samples the ONNX coordinates")
        axes.append(p)
    return mode, tuple(axes)


def nearest_is_floor(g, node) -> bool:
    """Does this nearest Resize pick input min(floor(o * in/out), in - 1), what the SDK's v3
    RESIZE_NEAREST_NEIGHBOR (and v4's nearest resize_image) computes, on both axes?"""
    mode, cmode, nmode = _attrs(g, node)
    x, y = g.shape(node.inputs[0]), g.shape(node.outputs[0])
    for n, m, s in zip(x[2:], y[2:], _scales(g, node)):
        want = onnx_nearest(cmode, nmode, n, m, s)
        if want is None or not np.array_equal(v4_nearest(n, m), want):
            return False
    return True


def bilinear_refuses(g, node, opts):
    if node.attrs.get("mode", "nearest") == "nearest":
        return NA
    p = plan(g, node)
    return p if isinstance(p, str) else None


def nearest_refuses(g, node, opts):
    if node.attrs.get("mode", "nearest") != "nearest":
        return NA
    p = plan(g, node)
    return p if isinstance(p, str) else None


# ---------------------------------------------------------------------------------------------
def border_rows(n, before, after, mode="edge"):
    """The source index of every padded row along an axis of `n`: edge repeats the border
    (ONNX 'edge', PyTorch ReplicationPad), reflect mirrors without it (ONNX 'reflect',
    PyTorch ReflectionPad: x[2] x[1] | x[0] ... x[n-1] | x[n-2] x[n-3])."""
    if mode == "reflect":
        return list(range(before, 0, -1)), list(range(n - 2, n - 2 - after, -1))
    return [0] * before, [n - 1] * after


def edge_pad(lw, src, shape, dt, ph, pw, row, tag, mode="edge", dst=None):
    """(address, shape) of `src` (N, C, H, W) with its border rows / columns repeated (`mode`
    edge) or mirrored (reflect): ph, pw are a count for both sides or (before, after).
    strided_slices of the border rows and one concat per padded axis (the concat repeats a row's
    range where it recurs; the v4 pad is constant-only). Given `dst`, the last concat writes
    there (no copy of the padded map beside it); src itself where nothing is padded."""
    cur, cur_shape = src, tuple(shape)
    esz = 4 if dt == F32 else 1
    axes = [(axis, (p, p) if isinstance(p, int) else tuple(p)) for axis, p in ((2, ph), (3, pw))]
    axes = [(axis, p) for axis, p in axes if any(p)]
    for i, (axis, (before, after)) in enumerate(axes):
        size = int(np.prod(cur_shape))
        edge_shape = list(cur_shape)
        edge_shape[axis] = 1
        esize = int(np.prod(edge_shape))
        first, last = border_rows(cur_shape[axis], before, after, mode)
        rows = {}
        for r in first + last:
            if r in rows:
                continue
            addr = lw.main.alloc(f"{tag}:edge{axis}:{r}", esize * esz)
            begin, end = [0, 0, 0, 0], list(cur_shape)
            begin[axis], end[axis] = r, r + 1
            lw.emit_v4(*_op(slice_op(main(dt, cur, size), main(dt, addr, esize), cur_shape, begin, end,
                                     (1, 1, 1, 1))), row)
            rows[r] = addr
        out_shape = list(cur_shape)
        out_shape[axis] += before + after
        osize = int(np.prod(out_shape))
        out = dst if dst is not None and i == len(axes) - 1 else lw.main.alloc(f"{tag}:pad{axis}", osize * esz)
        outer = int(np.prod(cur_shape[:axis]))
        inner = int(np.prod(cur_shape[axis + 1:])) * esz
        ranges = [main(dt, rows[r], esize) for r in first] + [main(dt, cur, size)] + \
            [main(dt, rows[r], esize) for r in last]
        dims = [1] * before + [cur_shape[axis]] + [1] * after
        lw.emit_v4("concat", dict(output=main(dt, out, osize), inner_size=inner, outer_size=outer,
                                  inputs_count=len(ranges)), row, data={"inputs": ranges, "dims": dims})
        for r in rows:
            lw.main.free(f"{tag}:edge{axis}:{r}")
        if cur != src:
            lw.main.free(f"{tag}:pad2")
        cur, cur_shape = out, tuple(out_shape)
    return cur, cur_shape


def _op(v: V4Op):
    return v.name, v.fields


def _resize_deconv(lw, node, axes):
    """The float whole-map form; or, where its float copies would take main memory past
    MAIN_TARGET x the live set and no reader needs float, the same ops a slice of channels at a
    time (each channel is its own), each slice quantized into the uint8 output."""
    x, out = node.inputs[0], node.outputs[0]
    c, h, w = lw.shape(x)
    oc, oh, ow = lw.shape(out)
    row = lw.row(node, "bilinear upsampling: depthwise conv2d_transpose on float32", in_shape=(c, h, w),
                 out_shape=(oc, oh, ow))
    xl = lw.locs[x]
    per = 4 * (h * w + (h + 2) * w + (h + 2) * (w + 2) + oh * ow)   # float bytes a channel: input, pads, output
    to_u8 = not lw.float_readers(out)
    room = lw.float_room(oc * oh * ow) if to_u8 else None
    if xl.f32 is not None or xl.pixels is not None or room is None or c * per <= room:
        src = lw.need_f32(x, row)
        loc = lw.f32_out(out)
        _deconv(lw, src, loc.f32, c, h, w, oh, ow, axes, row, out + ":resize")
        lw.traced(out, "f32")
    else:
        slices = float_slices(c, h * w, per, room)
        n = max(b - a for a, b in slices)
        src = lw.need_u8(x, row)
        (s_in, z_in), loc = xl.quant, lw.u8_out(out, lw.quant_of(out))
        dq, res = lw.main.alloc(out + ":dq", 4 * n * h * w), lw.main.alloc(out + ":f32", 4 * n * oh * ow)

        def upsample(c0, c1):
            _deconv(lw, dq, res, c1 - c0, h, w, oh, ow, axes, row, out + ":resize")
            return res
        parts = through_float(lw, row, slices, src, loc.u8, h * w, oh * ow, (z_in, 1.0 / s_in),
                              (loc.quant[1], 1.0 / loc.quant[0]), dq, upsample)
        lw.main.free(out + ":dq")
        lw.main.free(out + ":f32")
        lw.trace_map[out] = (parts[0] if len(parts) == 1 else tuple(parts), "u8")
        row.notes.append(f"dequantized, upsampled and quantized into the uint8 output {n} channels at a time "
                         f"({n * per:,} B of float scratch)")
    row.notes.append("input edge-padded by (1, 1) (strided_slice + concat), then a {0}x{1} stride ({2}, {3}) "
                     "triangle kernel per channel: ONNX's interpolation weights".format(
                         2 * axes[0].s, 2 * axes[1].s, axes[0].s, axes[1].s))
    row.macs = c * (h + 2) * (w + 2) * 4 * axes[0].s * axes[1].s


def _deconv(lw, src, dst, c, h, w, oh, ow, axes, row, tag):
    """float (c, h, w) at src -> its bilinear upsampling (c, oh, ow) at dst: edge pad, then the
    depthwise conv2d_transpose with the separable triangle kernel."""
    ah, aw = axes
    cur, shape = edge_pad(lw, src, (1, c, h, w), F32, 1, 1, row, tag)
    kern = np.outer(np.float32(ah.k), np.float32(aw.k)).astype(np.float32)
    lw.emit_v4("conv2d_transpose", dict(
        input=main(F32, cur, int(np.prod(shape))), output=main(F32, dst, c * oh * ow), in_shape=shape,
        out_shape=(1, c, oh, ow), groups=c, padding_h=(ah.pad, 3 * ah.s - ah.pad),
        padding_w=(aw.pad, 3 * aw.s - aw.pad), filter_h=2 * ah.s, filter_w=2 * aw.s, stride_h=ah.s,
        stride_w=aw.s, dilation_h=1, dilation_w=1, fused_activation=NO_CLAMP), row,
        data={"weights": np.tile(kern.reshape(-1), c), "bias": np.zeros(c, np.float32)})
    for k in ("pad2", "pad3"):
        lw.main.free(f"{tag}:{k}")


def _resize(lw, node, kind):
    """The resize_image plan (+ edge pad, + slice); bilinear runs on float32: the whole map, or,
    where its float copies would take main memory past MAIN_TARGET x the live set and no reader
    needs float, a slice of channels at a time quantized into the uint8 output (as
    _resize_deconv)."""
    x, out = node.inputs[0], node.outputs[0]
    if kind == "bilinear":
        axes = deconv_plan(lw.g, node)
        if axes is not None:
            return _resize_deconv(lw, node, axes)
    mode, (ph, pw) = plan(lw.g, node)
    c, h, w = lw.shape(x)
    oc, oh, ow = lw.shape(out)
    dt = F32 if kind == "bilinear" else U8
    what = {"bilinear": "bilinear resize_image on float32", "nearest": "nearest resize_image on uint8"}[kind]
    row = lw.row(node, what, in_shape=(c, h, w), out_shape=(oc, oh, ow))
    tag = out + ":resize"
    if ph.pad or pw.pad:
        row.notes.append(f"input edge-padded by ({ph.pad}, {pw.pad}) (strided_slice + concat)")
    padded = (h + 2 * ph.pad) * (w + 2 * pw.pad)
    sizes = (ph.size or h + 2 * ph.pad, pw.size or w + 2 * pw.pad)   # size 0: no resize on this axis (a slice)
    direct = ph.direct and pw.direct
    xl = lw.locs[x]
    if dt == F32:
        per = 4 * (h * w + (padded if ph.pad or pw.pad else 0) + (0 if direct else sizes[0] * sizes[1]) + oh * ow)
        room = lw.float_room(oc * oh * ow) if not lw.float_readers(out) else None
        if xl.f32 is None and xl.pixels is None and room is not None and c * per > room:
            slices = float_slices(c, h * w, per, room)
            n = max(b - a for a, b in slices)
            src = lw.need_u8(x, row)
            (s_in, z_in), loc = xl.quant, lw.u8_out(out, lw.quant_of(out))
            dq, res = lw.main.alloc(out + ":dq", 4 * n * h * w), lw.main.alloc(out + ":f32", 4 * n * oh * ow)
            parts = through_float(lw, row, slices, src, loc.u8, h * w, oh * ow, (z_in, 1.0 / s_in),
                                  (loc.quant[1], 1.0 / loc.quant[0]), dq,
                                  lambda c0, c1: _resize_image(lw, dq, res, c1 - c0, (h, w), (oh, ow), ph, pw,
                                                               kind, row, tag, note=c0 == 0) or res)
            lw.main.free(out + ":dq")
            lw.main.free(out + ":f32")
            lw.trace_map[out] = (parts[0] if len(parts) == 1 else tuple(parts), "u8")
            row.notes.append(f"dequantized, resized and quantized into the uint8 output {n} channel{'s' if n > 1 else ''} at a time "
                             f"({n * per:,} B of float scratch)")
            return
    src = lw.need_f32(x, row) if dt == F32 else lw.need_u8(x, row)
    loc = lw.f32_out(out) if dt == F32 else lw.u8_out(out, xl.quant)
    _resize_image(lw, src, loc.f32 if dt == F32 else loc.u8, c, (h, w), (oh, ow), ph, pw, kind, row, tag)
    lw.traced(out, "f32" if dt == F32 else "u8")


def _resize_image(lw, src, dst, c, hw, ohw, ph, pw, kind, row, tag, note=True):
    """c channels (h, w) at src -> (oh, ow) at dst by the plan (ph, pw): edge pad, resize_image,
    pick (float32 for bilinear, uint8 for nearest); its temporaries freed. `note`: say how in the
    receipt (the first of a layer's channel slices does)."""
    (h, w), (oh, ow) = hw, ohw
    dt = F32 if kind == "bilinear" else U8
    cur, shape = edge_pad(lw, src, (1, c, h, w), dt, ph.pad, pw.pad, row, tag)
    sizes = (ph.size or shape[2], pw.size or shape[3])     # size 0: no resize on this axis (a slice)
    direct = ph.direct and pw.direct
    align = ph.align or pw.align
    esz = 4 if dt == F32 else 1
    hw_in = shape[2] * shape[3]
    begin, strides = (0, 0, ph.start, pw.start), (1, 1, ph.step, pw.step)

    def pick(src_addr, g, mid_shape, at):
        end = (1, g, ph.start + (oh - 1) * ph.step + 1, pw.start + (ow - 1) * pw.step + 1)
        lw.emit_v4(*_op(slice_op(main(dt, src_addr, int(np.prod(mid_shape))), main(dt, dst + at * esz, g * oh * ow),
                                 mid_shape, begin, end, strides)), row)

    if sizes == tuple(shape[2:]) and not align:               # slices only
        pick(cur, c, shape, 0)
    else:
        per_c = sizes[0] * sizes[1] * esz
        group = c if direct else max(1, min(c, MID_BYTES // per_c))   # channel groups bound the temporary
        mid = None if direct else lw.main.alloc(tag + ":mid", group * per_c)
        for c0 in range(0, c, group):
            g = min(group, c - c0)
            out_addr = dst + c0 * oh * ow * esz if direct else mid
            lw.emit_v4("resize_image", dict(input=main(dt, cur + c0 * hw_in * esz, g * hw_in),
                                            output=main(dt, out_addr, g * sizes[0] * sizes[1]),
                                            in_shape=(1, g) + tuple(shape[2:]), out_h=sizes[0], out_w=sizes[1],
                                            mode=0 if kind == "bilinear" else 1, align_corners=bool(align)), row)
            if not direct:
                pick(mid, g, (1, g, sizes[0], sizes[1]), c0 * oh * ow)
        if not direct and note:
            row.notes.append(f"resize_image to {sizes[0]}x{sizes[1]}, then every ({ph.step}, {pw.step})-th "
                             f"sample from ({ph.start}, {pw.start}): {sizes[0] * sizes[1] / max(oh * ow, 1):.1f}x "
                             "the samples of the output" + (f", {group} channel{'s' if group > 1 else ''} at a time" if group < c else ""))
    for k in ("mid", "pad2", "pad3"):
        lw.main.free(f"{tag}:{k}")


@lowering("Resize", unit=CPU_F32, check=bilinear_refuses, formats=("v4",), name="resize_bilinear")
def resize_bilinear(lw, node):
    _resize(lw, node, "bilinear")


def matrices_refuse(g, node, opts):
    mode, cmode, _ = _attrs(g, node)
    x, y = g.shape(node.inputs[0]), g.shape(node.outputs[0])
    if mode != "linear" or len(x) != 4 or tuple(x[:2]) != tuple(y[:2]):
        return NA
    if node.attrs.get("antialias", 0):
        return "antialias=1: ONNX's antialiasing filter is not the interpolation matrix"
    if any(onnx_coords(cmode, n, m, s) is None for n, m, s in zip(x[2:], y[2:], _scales(g, node))):
        return f"coordinate_transformation_mode {cmode}: no interpolation matrix for it"
    return None


@lowering("Resize", unit=CPU_F32, check=matrices_refuse, formats=("v4",), name="resize_matrices")
def resize_matrices(lw, node):
    """Each axis by ONNX's (out, in) interpolation matrix: the map as (C·H, W) rows times A_w^T,
    transposed to (C, W', H), times A_h^T, transposed back. Float32 sums of the two non-zero
    weights of each row in input order (the zeros add nothing)."""
    x, out = node.inputs[0], node.outputs[0]
    _, cmode, _ = _attrs(lw.g, node)
    c, h, w = lw.shape(x)
    _, oh, ow = lw.shape(out)
    sh, sw = _scales(lw.g, node)
    row = lw.row(node, "linear resize: float matmuls by ONNX's interpolation matrix of each axis",
                 in_shape=(c, h, w), out_shape=(c, oh, ow), macs=c * h * w * ow + c * ow * h * oh)
    src = lw.need_f32(x, row)
    loc = lw.f32_out(out)
    tag = out + ":resize"
    cur = src
    for axis, (n, m, scale, rows) in enumerate(((w, ow, sw, c * h), (h, oh, sh, c * ow))):
        a = onnx_linear_matrix(cmode, n, m, scale).T.astype(np.float32)       # (n, m)
        prod = lw.main.alloc(f"{tag}:mm{axis}", 4 * rows * m)
        lw.emit_v4("matmul", dict(input_a=main(F32, cur, rows * n), input_b=Const(np.ascontiguousarray(a)),
                                  output=main(F32, prod, rows * m), a_rows=rows, a_cols=n, b_cols=m,
                                  fused_activation=NO_CLAMP), row, data={"bias": np.zeros(m, np.float32)})
        if axis:
            lw.main.free(f"{tag}:t0")
        dst = loc.f32 if axis else lw.main.alloc(f"{tag}:t0", 4 * rows * m)
        lw.emit_v4("transpose", dict(input=main(F32, prod, rows * m), output=main(F32, dst, rows * m),
                                     in_shape=(1, c, rows // c, m), perm=(0, 1, 3, 2)), row)
        lw.main.free(f"{tag}:mm{axis}")
        cur = dst
    row.notes.append(f"{w}x{h} -> {ow}x{oh}: no resize_image plan samples ONNX's coordinates "
                     f"({cmode}); {c * h * w * ow + c * ow * h * oh:,} float MACs")
    lw.traced(out, "f32")


@lowering("Resize", unit=CPU_U8, check=nearest_refuses, formats=("v4",), name="resize_nearest_v4")
def resize_nearest_v4(lw, node):
    _resize(lw, node, "nearest")

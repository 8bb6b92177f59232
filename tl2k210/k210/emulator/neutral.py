"""The CPU kernels of the nncase v0.2 runtime (``kernels/neutral/neutral_kernels.h``,
``kernels/cpu/cpu_kernels.h``) as whole-array numpy functions, computing what the C loops compute.

Exactness rules (docs/kmodel-format.md#v4-interpreter):
* float kernels accumulate in float32 in the C loop order (``value = bias; value += x * w`` per
  tap, taps outside the input skipped, no fused multiply-add); each tap is one whole-array step;
* quantized kernels are integer (int64, exact), rounded by ``mul_and_carry_shift`` (add 2^(s-1),
  arithmetic shift; the shift is a ``uint8_t``, docs/kmodel-format.md#v4-interpreter) and cast to int32 like the C
  code; quantized_binary div is ``(a + b / 2) / b`` in C int32 arithmetic (docs/kmodel-format.md#v4-interpreter);
* transcendental unary ops are evaluated in float64 and rounded to float32 (the correctly
  rounded value, which is what glibc's float functions return in all but rare cases).

Every function takes and returns numpy arrays; the v4 interpreter (``v4.py``) does the memory
ranges. Shapes are NCHW unless the name says NHWC.
"""
from __future__ import annotations

import numpy as np

f32 = np.float32


# ---------------------------------------------------------------------------------------------
# integer helpers
def wrap_i32(v: np.ndarray) -> np.ndarray:
    """(int32_t) cast of an int64 value (two's complement wrap)."""
    return ((np.asarray(v, np.int64) + (1 << 31)) & 0xFFFF_FFFF) - (1 << 31)


def mul_and_carry_shift(value, mul: int, shift: int) -> np.ndarray:
    """nncase ``mul_and_carry_shift(int32 value, int32 mul, uint8_t shift)`` =
    (int32) carry_shift<int64, false>((int64)value * mul, shift) (runtime_op_utility.h).

    The shift arrives as ``uint8_t`` (docs/kmodel-format.md#v4-interpreter): a stored shift is taken modulo 256, so a
    "negative" shift is a large right shift, never a left shift. Shifts 1..63 are plain C; from 64
    on the C shift is undefined and the 64-bit shifters of both the K210 (RV64 sll/sra) and an
    x86-64 host use the count modulo 64: ``(v + (1 << ((s-1) & 63))) >> (s & 63)`` in wrapping
    int64 arithmetic, which is what is computed here."""
    v = np.asarray(value, np.int64) * np.int64(mul)
    s = int(shift) & 0xFF
    if s > 0:
        with np.errstate(over="ignore"):
            v = (v + (np.int64(1) << np.int64((s - 1) & 63))) >> np.int64(s & 63)
    return wrap_i32(v)


def clamp_u8(v) -> np.ndarray:
    return np.clip(v, 0, 255).astype(np.uint8)


FULL_RANGE = (f32(-3.4028234663852886e38), f32(3.4028234663852886e38))   # value_range<float>::full()


def activation(x: np.ndarray, vr) -> np.ndarray:
    """``apply_activation``: std::clamp(value, min, max) in float32."""
    lo, hi = f32(vr[0]), f32(vr[1])
    return np.minimum(np.maximum(x, lo), hi).astype(f32)


def windowed_size(size: int, filt: int, stride: int, dilation: int, pad) -> int:
    """``get_windowed_output_size`` (C integer division)."""
    eff = (filt - 1) * dilation + 1
    n = size + pad[0] + pad[1] - eff + stride
    return int(np.trunc(n / stride)) if stride else 0


def _taps(size_in: int, size_out: int, filt: int, stride: int, dilation: int, before: int):
    """For each filter index k: (valid output slice, matching input slice) along one axis.
    Output o reads input o*stride - before + k*dilation, when 0 <= that < size_in."""
    out = []
    for k in range(filt):
        o = np.arange(size_out)
        i = o * stride - before + k * dilation
        ok = np.nonzero((i >= 0) & (i < size_in))[0]
        if ok.size == 0:
            out.append(None)
            continue
        o0, o1 = int(ok[0]), int(ok[-1]) + 1
        i0 = int(i[o0])
        out.append((slice(o0, o1), slice(i0, i0 + (o1 - o0 - 1) * stride + 1, stride)))
    return out


# ---------------------------------------------------------------------------------------------
# elementwise / shape ops
BINARY = {
    "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
    "div": lambda a, b: a / b, "min": np.minimum, "max": np.maximum,
}


def binary(a, b, op: str, out_shape, vr) -> np.ndarray:
    """Float binary with broadcasting over 4-D shapes (a dimension of 1 repeats), then clamp."""
    with np.errstate(all="ignore"):
        y = BINARY[op](a.astype(f32), b.astype(f32)).astype(f32)
    return activation(np.broadcast_to(y, tuple(out_shape)), vr)


def c_div(a, b) -> np.ndarray:
    """C int32 ``a / b`` as the K210 computes it (RV64 ``divw``): the quotient truncated toward
    zero; division by zero gives -1 (all bits set) and INT32_MIN / -1 gives INT32_MIN, where the
    C standard leaves both undefined (a host x86 build would trap instead)."""
    a, b = np.asarray(a, np.int64), np.asarray(b, np.int64)
    safe = np.where(b == 0, 1, b)
    q = np.abs(a) // np.abs(safe)
    q = np.where((a < 0) != (safe < 0), -q, q)
    return wrap_i32(np.where(b == 0, -1, q))


def _int_op(op: str, a, b):
    if op == "div":  # binary_div: (a + b / 2) / b, int32 (docs/kmodel-format.md#v4-interpreter; b / 2 truncates too)
        return c_div(wrap_i32(a + c_div(b, 2)), b)
    return {"add": np.add, "sub": np.subtract, "mul": np.multiply, "min": np.minimum,
            "max": np.maximum}[op](a, b)


def quantized_binary(a, b, op: str, out_shape, f) -> np.ndarray:
    """uint8 binary: each input rescaled by mul_and_carry_shift, integer op, rescaled, clamped."""
    a = mul_and_carry_shift(wrap_i32(a.astype(np.int64) + f["input_a_offset"]), f["input_a_mul"], f["input_a_shift"])
    b = mul_and_carry_shift(wrap_i32(b.astype(np.int64) + f["input_b_offset"]), f["input_b_mul"], f["input_b_shift"])
    a, b = np.broadcast_arrays(a, b)
    v = wrap_i32(_int_op(op, a, b))
    v = wrap_i32(mul_and_carry_shift(v, f["output_mul"], f["output_shift"]) + f["output_offset"])
    return clamp_u8(np.broadcast_to(v, tuple(out_shape)))


def row_max(x: np.ndarray) -> np.ndarray:
    """``*std::max_element(row)`` per row of x (outer, inner): a running ``if (m < v) m = v`` from
    the first element, so a leading NaN stays and any later NaN is passed over."""
    with np.errstate(all="ignore"):
        return np.where(np.isnan(x[:, :1]), x[:, :1], np.fmax.reduce(x, axis=1, keepdims=True))


def softmax(x: np.ndarray, beta) -> np.ndarray:
    """softmax over the rows of x (outer, inner) when the output does not overlap the input:
    value = expf((x - max) * beta), sum += value in index order (float32), then value / sum."""
    x = x.astype(f32)
    if x.shape[1] == 0:
        return x
    with np.errstate(all="ignore"):
        e = softmax_exp(x, row_max(x), beta)
        return (e / np.cumsum(e, axis=1, dtype=f32)[:, -1:]).astype(f32)


def softmax_exp(x, m, beta) -> np.ndarray:
    """expf((x - max) * beta) in float32 (expf correctly rounded)."""
    with np.errstate(all="ignore"):
        d = ((x.astype(f32) - m) * f32(beta)).astype(f32)
        return np.exp(d.astype(np.float64)).astype(f32)


def _f64(fn):
    return lambda x: fn(x.astype(np.float64)).astype(f32)


UNARY = {
    "abs": np.abs, "ceil": np.ceil, "floor": np.floor, "neg": np.negative, "square": lambda x: x * x,
    "cos": _f64(np.cos), "exp": _f64(np.exp), "log": _f64(np.log), "sin": _f64(np.sin),
    "rsqrt": lambda x: f32(1) / np.sqrt(x),   # 1.f / sqrtf(x): sqrt is correctly rounded in f32
}


def unary(x, op: str) -> np.ndarray:
    with np.errstate(all="ignore"):
        return UNARY[op](x.astype(f32)).astype(f32)


# NNIL (nncase v0.2 runtime/nnil.h): 1-byte opcodes, a float stack machine run per element.
NNIL_UNARY = {0x20: "abs", 0x21: "ceil", 0x22: "cos", 0x23: "exp", 0x24: "floor", 0x25: "log",
              0x26: "neg", 0x27: "rsqrt", 0x28: "sin", 0x29: "square"}
NNIL_BINARY = {0x40: "add", 0x41: "sub", 0x42: "mul", 0x43: "div", 0x44: "min", 0x45: "max"}
NNIL_STACK = 64


class NnilError(ValueError):
    pass


def nnil(code: bytes, x: np.ndarray):
    """Run NNIL byte code on every element of x (vectorised: the program has no branches).
    Returns the float32 result, or None when the code ends without ``ret`` (the runtime then
    leaves the output untouched)."""
    x = x.astype(f32)
    stack, pc = [], 0

    def pop():
        if not stack:
            raise NnilError(f"NNIL stack underflow at byte {pc}")
        return stack.pop()

    while pc < len(code):
        op = code[pc]
        pc += 1
        if op == 0x00:
            pass
        elif op == 0x01:
            v = pop()
            stack += [v, v]
        elif op == 0x02:
            pop()
        elif op == 0x03:
            stack.append(x)
        elif op == 0x04:
            stack.append(np.full(x.shape, 0, f32))
        elif op == 0x05:
            stack.append(np.full(x.shape, 1, f32))
        elif op == 0x06:
            if pc + 4 > len(code):
                raise NnilError(f"NNIL ldc_r4 at byte {pc - 1} has no 4-byte immediate")
            stack.append(np.full(x.shape, np.frombuffer(code[pc:pc + 4], "<f4")[0], f32))
            pc += 4
        elif op in NNIL_UNARY:
            stack.append(unary(pop(), NNIL_UNARY[op]))
        elif op in NNIL_BINARY:
            b = pop()
            a = pop()
            with np.errstate(all="ignore"):
                stack.append(BINARY[NNIL_BINARY[op]](a, b).astype(f32))
        elif op == 0x80:  # clamp: high, low, v popped in that order
            hi, lo, v = pop(), pop(), pop()
            stack.append(np.minimum(np.maximum(v, lo), hi).astype(f32))
        elif op == 0xA0:
            return pop()
        else:
            raise NnilError(f"invalid NNIL opcode 0x{op:02x} at byte {pc - 1}")
        if len(stack) > NNIL_STACK:
            raise NnilError(f"NNIL stack overflow (more than {NNIL_STACK} values) at byte {pc}")
    return None


def pad(x: np.ndarray, paddings, value) -> np.ndarray:
    """4-D pad; negative padding crops (docs/kmodel-format.md#v4-interpreter)."""
    p = np.asarray(paddings, np.int64).reshape(4, 2)
    crop = tuple(slice(max(0, -b), s - max(0, -e)) for (b, e), s in zip(p, x.shape))
    return np.pad(x[crop], [(max(0, b), max(0, e)) for b, e in p], constant_values=value)


def strided_slice(x: np.ndarray, begin, end, strides) -> np.ndarray:
    """The runtime's loops: for d = begin; stride > 0 ? d < end : d > end; d += stride."""
    idx = []
    for b, e, s, n in zip(begin, end, strides, x.shape):
        if s == 0:
            raise ValueError("strided_slice with stride 0")
        r = np.arange(b, e, s)
        if r.size and (r.min() < 0 or r.max() >= n):
            raise ValueError(f"strided_slice index range {b}:{e}:{s} outside a dimension of {n}")
        idx.append(r)
    return x[np.ix_(*idx)]


def resize(x: np.ndarray, out_h: int, out_w: int, mode: str, align_corners: bool) -> np.ndarray:
    """resize_image (NCHW, float32 or uint8)."""
    n, c, h, w = x.shape
    hs, ws = f32(h) / f32(out_h), f32(w) / f32(out_w)
    if mode == "nearest_neighbor":   # align_corners is not used by the v0.2 nearest kernel
        ys = np.minimum(np.floor(np.arange(out_h, dtype=f32) * hs).astype(np.int64), h - 1)
        xs = np.minimum(np.floor(np.arange(out_w, dtype=f32) * ws).astype(np.int64), w - 1)
        return x[:, :, ys[:, None], xs[None, :]]
    if align_corners and out_h > 1:
        hs = f32(h - 1) / f32(out_h - 1)
    if align_corners and out_w > 1:
        ws = f32(w - 1) / f32(out_w - 1)
    fy = np.arange(out_h, dtype=f32) * hs
    fx = np.arange(out_w, dtype=f32) * ws
    y0 = np.floor(fy).astype(np.int64)
    x0 = np.floor(fx).astype(np.int64)
    y1, x1 = np.minimum(y0 + 1, h - 1), np.minimum(x0 + 1, w - 1)
    dy, dx = (fy - y0.astype(f32))[:, None], (fx - x0.astype(f32))[None, :]
    one = f32(1)
    a0, a1 = (one - dy) * (one - dx), dy * (one - dx)
    a2, a3 = (one - dy) * dx, dy * dx
    v = lambda yy, xx: x[:, :, yy[:, None], xx[None, :]].astype(f32)  # noqa: E731
    out = v(y0, x0) * a0 + v(y1, x0) * a1 + v(y0, x1) * a2 + v(y1, x1) * a3
    if x.dtype == np.uint8:  # T(float): truncation toward zero
        return np.trunc(out).astype(np.uint8)
    return out.astype(f32)


def reduce(x: np.ndarray, op: str, out_shape, init: float) -> np.ndarray:
    """reduce: out = init; out[reduced index] = op(out, x) in row-major input order; mean then
    multiplies by (float)out_size / in_size."""
    in_shape = x.shape
    out_shape = tuple(out_shape)
    red = [d for d in range(4) if out_shape[d] == 1 and in_shape[d] != 1]
    keep = [d for d in range(4) if d not in red]
    xt = x.astype(f32).transpose(keep + red).reshape(int(np.prod([in_shape[d] for d in keep])), -1)
    acc = np.full(xt.shape[0], init, f32)
    if op in ("mean", "sum"):
        acc = np.cumsum(np.concatenate([acc[:, None], xt], axis=1), axis=1, dtype=f32)[:, -1]
    elif op == "min":
        acc = np.minimum(acc, xt.min(axis=1)) if xt.shape[1] else acc
    else:
        acc = np.maximum(acc, xt.max(axis=1)) if xt.shape[1] else acc
    if op == "mean":
        acc = acc * (f32(int(np.prod(out_shape))) / f32(x.size))
    return acc.astype(f32).reshape(out_shape)


def reduce_window2d(x: np.ndarray, op: str, f, init: float, nhwc: bool = False) -> np.ndarray:
    """Pooling: value = init, op over the in-range taps in (ky, kx) order; mean divides by the
    count of in-range taps; then the fused clamp."""
    if nhwc:
        return reduce_window2d(x.transpose(0, 3, 1, 2), op, f, init).transpose(0, 2, 3, 1)
    n, c, h, w = x.shape
    oh = windowed_size(h, f["filter_h"], f["stride_h"], f["dilation_h"], f["padding_h"])
    ow = windowed_size(w, f["filter_w"], f["stride_w"], f["dilation_w"], f["padding_w"])
    ty = _taps(h, oh, f["filter_h"], f["stride_h"], f["dilation_h"], f["padding_h"][0])
    tx = _taps(w, ow, f["filter_w"], f["stride_w"], f["dilation_w"], f["padding_w"][0])
    val = np.full((n, c, oh, ow), init, f32)
    cnt = np.zeros((oh, ow), np.int64)
    x = x.astype(f32)
    for a in ty:
        for b in tx:
            if a is None or b is None:
                continue
            (oy, iy), (ox, ix) = a, b
            cur, tap = val[:, :, oy, ox], x[:, :, iy, ix]
            if op in ("mean", "sum"):
                val[:, :, oy, ox] = cur + tap
            elif op == "min":
                val[:, :, oy, ox] = np.minimum(cur, tap)
            else:
                val[:, :, oy, ox] = np.maximum(cur, tap)
            cnt[oy, ox] += 1
    if op == "mean":
        with np.errstate(all="ignore"):
            val = val / cnt.astype(f32)
    return activation(val, f["fused_activation"])


# ---------------------------------------------------------------------------------------------
# convolutions (NCHW; groups; float and quantized)
def conv2d(x, weights, bias, f, out_channels: int, vr) -> np.ndarray:
    """Float conv2d: value = bias; for ic, ky, kx: value += x * w (float32, C order)."""
    n, ci, h, w = x.shape
    g = f["groups"]
    gic, goc = ci // g, out_channels // g
    fh, fw = f["filter_h"], f["filter_w"]
    oh = windowed_size(h, fh, f["stride_h"], f["dilation_h"], f["padding_h"])
    ow = windowed_size(w, fw, f["stride_w"], f["dilation_w"], f["padding_w"])
    wt = np.asarray(weights, f32).reshape(g, goc, gic, fh, fw)
    out = np.empty((n, g, goc, oh, ow), f32)
    out[:] = np.asarray(bias, f32).reshape(1, g, goc, 1, 1)
    ty = _taps(h, oh, fh, f["stride_h"], f["dilation_h"], f["padding_h"][0])
    tx = _taps(w, ow, fw, f["stride_w"], f["dilation_w"], f["padding_w"][0])
    xg = x.astype(f32).reshape(n, g, gic, h, w)
    for ic in range(gic):
        for ky in range(fh):
            for kx in range(fw):
                if ty[ky] is None or tx[kx] is None:
                    continue
                (oy, iy), (ox, ix) = ty[ky], tx[kx]
                tap = xg[:, :, ic, iy, ix][:, :, None]                 # (n, g, 1, oh', ow')
                wk = wt[:, :, ic, ky, kx][None, :, :, None, None]       # (1, g, goc, 1, 1)
                out[:, :, :, oy, ox] += tap * wk
    return activation(out.reshape(n, out_channels, oh, ow), vr)


def conv2d_nhwc(x, weights, bias, f, out_channels: int, vr, depthwise: bool = False) -> np.ndarray:
    """cpu_conv2d / cpu_depthwise_conv2d (NHWC): value = bias; for ky, kx, (ic): value += x * w.
    Weights: OHWI (normal), [C][fh][fw] (depthwise)."""
    n, h, w, ci = x.shape
    fh, fw = f["filter_h"], f["filter_w"]
    oh = windowed_size(h, fh, f["stride_h"], f["dilation_h"], f["padding_h"])
    ow = windowed_size(w, fw, f["stride_w"], f["dilation_w"], f["padding_w"])
    ty = _taps(h, oh, fh, f["stride_h"], f["dilation_h"], f["padding_h"][0])
    tx = _taps(w, ow, fw, f["stride_w"], f["dilation_w"], f["padding_w"][0])
    x = x.astype(f32)
    oc = ci if depthwise else out_channels
    out = np.empty((n, oh, ow, oc), f32)
    out[:] = np.asarray(bias, f32)
    wt = np.asarray(weights, f32).reshape((ci, fh, fw) if depthwise else (oc, fh, fw, ci))
    for ky in range(fh):
        for kx in range(fw):
            if ty[ky] is None or tx[kx] is None:
                continue
            (oy, iy), (ox, ix) = ty[ky], tx[kx]
            tap = x[:, iy, ix]                                # (n, oh', ow', ci)
            if depthwise:
                out[:, oy, ox] += tap * wt[:, ky, kx]
            else:
                acc = out[:, oy, ox]
                for ic in range(ci):
                    acc += tap[..., ic:ic + 1] * wt[:, ky, kx, ic]
                out[:, oy, ox] = acc
    return activation(out, vr)


def _int_windows(x, f, filt, in_off: int):
    """(ky, kx, valid-output slices, input slices) over an offset int64 input (taps outside the
    input contribute nothing)."""
    h, w = x.shape[-2:]
    fh, fw = filt
    oh = windowed_size(h, fh, f["stride_h"], f["dilation_h"], f["padding_h"])
    ow = windowed_size(w, fw, f["stride_w"], f["dilation_w"], f["padding_w"])
    ty = _taps(h, oh, fh, f["stride_h"], f["dilation_h"], f["padding_h"][0])
    tx = _taps(w, ow, fw, f["stride_w"], f["dilation_w"], f["padding_w"][0])
    return oh, ow, ty, tx


def quantized_conv2d(x, weights, bias, f, out_channels: int, nhwc: bool = False,
                     depthwise: bool = False) -> np.ndarray:
    """uint8 conv: value = bias + Σ (x + input_offset)(w + filter_offset) (exact integers), then
    mul_and_carry_shift(output_mul, output_shift) + output_offset, clamped to uint8."""
    if nhwc:
        x = x.transpose(0, 3, 1, 2)
        ci = x.shape[1]
        fh, fw = f["filter_h"], f["filter_w"]
        if depthwise:
            wt = np.asarray(weights).reshape(ci, 1, fh, fw)
            g, oc = ci, ci
        else:
            wt = np.asarray(weights).reshape(out_channels, fh, fw, ci).transpose(0, 3, 1, 2)
            g, oc = 1, out_channels
        y = quantized_conv2d(x, wt, bias, dict(f, groups=g), oc)
        return y.transpose(0, 2, 3, 1)
    n, ci, h, w = x.shape
    g = f["groups"]
    gic, goc = ci // g, out_channels // g
    fh, fw = f["filter_h"], f["filter_w"]
    oh, ow, ty, tx = _int_windows(x, f, (fh, fw), f["input_offset"])
    xo = x.astype(np.int64).reshape(n, g, gic, h, w) + f["input_offset"]
    wo = np.asarray(weights, np.int64).reshape(g, goc, gic, fh, fw) + f["filter_offset"]
    acc = np.zeros((n, g, goc, oh, ow), np.int64)
    acc += np.asarray(bias, np.int64).reshape(1, g, goc, 1, 1)
    for ky in range(fh):
        for kx in range(fw):
            if ty[ky] is None or tx[kx] is None:
                continue
            (oy, iy), (ox, ix) = ty[ky], tx[kx]
            tap = xo[:, :, :, iy, ix]                             # (n, g, gic, oh', ow')
            acc[:, :, :, oy, ox] += np.einsum("ngihw,goi->ngohw", tap, wo[:, :, :, ky, kx])
    v = mul_and_carry_shift(wrap_i32(acc), f["output_mul"], f["output_shift"]) + f["output_offset"]
    return clamp_u8(v.reshape(n, out_channels, oh, ow))


def conv2d_transpose(x, weights, f, out_shape, vr) -> np.ndarray:
    """Float conv2d_transpose: output = 0; each input pixel scatters x * w into its window, in the
    C loop order (g, ic, iy, ix, oc, ky, kx); the bias is not applied by the v0.2 kernel."""
    n, ci, h, w = x.shape
    _, oc, oh, ow = out_shape
    g = f["groups"]
    gic, goc = ci // g, oc // g
    fh, fw = f["filter_h"], f["filter_w"]
    sh, sw, dh, dw = f["stride_h"], f["stride_w"], f["dilation_h"], f["dilation_w"]
    ph, pw = f["padding_h"][0], f["padding_w"][0]
    wt = np.asarray(weights, f32).reshape(g, goc, gic, fh, fw)
    out = np.zeros((n, g, goc, oh, ow), f32)
    xg = x.astype(f32).reshape(n, g, gic, h, w)
    # for one output pixel the contributions arrive in (ic, iy, ix) order = (ic, ky desc, kx desc)
    for ic in range(gic):
        for ky in reversed(range(fh)):
            iy = np.arange(h)
            oy = iy * sh - ph + ky * dh
            vy = (oy >= 0) & (oy < oh)
            if not vy.any():
                continue
            for kx in reversed(range(fw)):
                ix = np.arange(w)
                ox = ix * sw - pw + kx * dw
                vx = (ox >= 0) & (ox < ow)
                if not vx.any():
                    continue
                tap = xg[:, :, ic][:, :, None][..., iy[vy][:, None], ix[vx][None, :]]
                wk = wt[:, :, ic, ky, kx][None, :, :, None, None]
                sel = (slice(None), slice(None), slice(None), oy[vy][:, None], ox[vx][None, :])
                out[sel] = out[sel] + tap * wk
    y = out.reshape(n, oc, oh, ow)
    if tuple(np.asarray(vr, f32)) != FULL_RANGE:   # the kernel skips the clamp for full() only
        y = activation(y, vr)
    return y


def matmul(a, b, bias, vr) -> np.ndarray:
    """value = bias[col]; value += a[row, i] * b[i, col] for i in order (float32); clamp."""
    r, k = a.shape
    out = np.empty((r, b.shape[1]), f32)
    out[:] = np.asarray(bias, f32)
    a, b = a.astype(f32), b.astype(f32)
    for i in range(k):
        out += a[:, i:i + 1] * b[i][None, :]
    return activation(out, vr)


def quantized_matmul(a, b, bias, f) -> np.ndarray:
    acc = (a.astype(np.int64) + f["input_a_offset"]) @ (b.astype(np.int64) + f["input_b_offset"])
    acc += np.asarray(bias, np.int64)[None, :]
    v = mul_and_carry_shift(wrap_i32(acc), f["output_mul"], f["output_shift"]) + f["output_offset"]
    return clamp_u8(v)

"""A second, independent runner of kmodel v4 files: every CPU opcode written out from the C loops
of nncase v0.2.0-beta4 (runtime/neutral/neutral_ops.cpp, kernels/neutral/neutral_kernels.h, the
device kernels of kernels/riscv/neutral_kernels.h; docs/kmodel-format.md#v4-opcodes, #v4-interpreter),
scalar statement by scalar statement in float32 (no float64 shortcuts: the loops' own order of
additions), vectorised only across the outputs one statement updates. It has its own memories
(main, constants, KPU RAM in the docs/kpu.md#kpu-ram-layout layout) and its own NNIL stack machine.
Only the KPU conv itself is the emulator's (the bit-exact KPU, tested against the vendor simulator
elsewhere).

    outs, per_node = run(model, x)     # per_node[i] = what node i wrote (its output range)
"""
from __future__ import annotations

import struct

import numpy as np

from tl2k210.k210.kmodel import v4

f32 = np.float32
LINE = 64


def _kpu_addr(base, c, h, w):
    """Byte addresses of every (c, y, x) of a map at KPU line `base` (docs/kpu.md#kpu-ram-layout)."""
    g, p, L = (4, 16, 1) if w <= 16 else (2, 32, 1) if w <= 32 else (1, 64, -(-w // 64))
    cc, yy, xx = np.meshgrid(np.arange(c), np.arange(h), np.arange(w), indexing="ij")
    return LINE * (base + (cc // g) * L * h + yy * L) + (cc % g) * p + xx


class Mem:
    def __init__(self, model):
        self.main = np.zeros(model.main_mem + 8, np.uint8)
        self.kpu = np.zeros(2 * 1024 * 1024, np.uint8)
        self.const = np.frombuffer(model.constants, np.uint8).copy()

    def buf(self, mtype):
        return {v4.MEM_CONST: self.const, v4.MEM_MAIN: self.main, v4.MEM_KPU: self.kpu}[mtype]

    def get(self, rng):
        mtype, dt, start, size = rng
        return self.buf(mtype)[start:start + size].view(f32 if dt == v4.DT_FLOAT32 else np.uint8).copy()

    def put(self, rng, x):
        mtype, dt, start, size = rng
        b = np.ascontiguousarray(np.asarray(x).reshape(-1), f32 if dt == v4.DT_FLOAT32 else np.uint8).view(np.uint8)
        assert b.size == size, (b.size, size)
        self.buf(mtype)[start:start + size] = b


def i32(v):
    return ((np.asarray(v, np.int64) + 2 ** 31) % 2 ** 32) - 2 ** 31


def mcs(v, mul, shift):
    """mul_and_carry_shift(int32 v, int32 mul, uint8_t shift): carry_shift<int64>((int64)v * mul):
    shift = stored value mod 256; if nonzero, + 2^(shift-1), >> shift on a 64-bit shifter (count
    mod 64, as RV64 sll/sra and x86-64 do); then (int32)."""
    v = np.asarray(v, np.int64) * np.int64(mul)
    s = int(shift) % 256
    if s:
        with np.errstate(over="ignore"):
            v = (v + (np.int64(1) << np.int64((s - 1) % 64))) >> np.int64(s % 64)
    return i32(v)


def out_size(n, k, s, d, pad):
    return (n + pad[0] + pad[1] - ((k - 1) * d + 1) + s) // s


def _out_hw(h, w, f):
    """(out_h, out_w) of a window op: get_windowed_output_size."""
    oh = out_size(h, f["filter_h"], f["stride_h"], f["dilation_h"], f["padding_h"])
    ow = out_size(w, f["filter_w"], f["stride_w"], f["dilation_w"], f["padding_w"])
    return oh, ow


def conv2d_q(x, f, bias, weights, oc):
    """quantized_conv2d: value = bias + Σ (in + input_offset)(w + filter_offset) over in-range
    taps (exact integers, int32 wrap), mul_and_carry_shift, + output_offset, clamp."""
    n, ci, h, w = x.shape
    g = f["groups"]
    gic, goc = ci // g, oc // g
    fh, fw = f["filter_h"], f["filter_w"]
    oh, ow = _out_hw(h, w, f)
    wt = weights.astype(np.int64).reshape(g, goc, gic, fh, fw) + f["filter_offset"]
    xo = x.astype(np.int64).reshape(n, g, gic, h, w) + f["input_offset"]
    out = np.zeros((n, g, goc, oh, ow), np.int64) + bias.astype(np.int64).reshape(1, g, goc, 1, 1)
    for ky in range(fh):
        oy, iy = _taps(h, oh, ky, f["stride_h"], f["dilation_h"], f["padding_h"][0])
        for kx in range(fw):
            ox, ix = _taps(w, ow, kx, f["stride_w"], f["dilation_w"], f["padding_w"][0])
            for gg in range(g):
                tap = xo[:, gg][:, :, iy][:, :, :, ix]                    # (n, gic, oy, ox)
                out[:, gg][np.ix_(range(n), range(goc), oy, ox)] += np.einsum("nihw,oi->nohw", tap, wt[gg, :, :, ky, kx])
    v = i32(mcs(i32(out), f["output_mul"], f["output_shift"]) + f["output_offset"])
    return np.clip(v, 0, 255).astype(np.uint8).reshape(n, oc, oh, ow)


def _taps(n_in, n_out, k, s, d, before):
    """Per tap index: the output positions whose input position is inside [0, n_in), and those
    input positions (the C loops skip the others)."""
    o = np.arange(n_out)
    pos = o * s - before + k * d
    ok = (pos >= 0) & (pos < n_in)
    return o[ok], pos[ok]


def conv2d_f(x, f, weights, bias, oc):
    """conv2d: value = bias[oc]; for ic, ky, kx (in range): value += in * w; clamp (float32).
    One statement per (ic, ky, kx) updates every output of a group at once."""
    n, ci, h, w = x.shape
    g = f["groups"]
    gic, goc = ci // g, oc // g
    fh, fw = f["filter_h"], f["filter_w"]
    oh, ow = _out_hw(h, w, f)
    wt = weights.astype(f32).reshape(g, goc, gic, fh, fw)
    x = x.astype(f32).reshape(n, g, gic, h, w)
    out = np.empty((n, g, goc, oh, ow), f32)
    out[:] = bias.astype(f32).reshape(1, g, goc, 1, 1)
    for gg in range(g):
        acc = out[:, gg]
        for i in range(gic):
            for ky in range(fh):
                oy, iy = _taps(h, oh, ky, f["stride_h"], f["dilation_h"], f["padding_h"][0])
                for kx in range(fw):
                    ox, ix = _taps(w, ow, kx, f["stride_w"], f["dilation_w"], f["padding_w"][0])
                    sel = np.ix_(range(n), range(goc), oy, ox)
                    tap = x[:, gg, i][np.ix_(range(n), iy, ix)][:, None]
                    acc[sel] = acc[sel] + tap * wt[gg, :, i, ky, kx][None, :, None, None]
    return clamp(out.reshape(n, oc, oh, ow), f["fused_activation"])


def clamp(v, act):
    """apply_activation: std::clamp(value, min, max) in float32 (NaN passes through)."""
    lo, hi = f32(act[0]), f32(act[1])
    v = np.asarray(v, f32)
    return np.where(v < lo, lo, np.where(hi < v, hi, v)).astype(f32)


def reduce_window(x, f, op):
    """value = init; value = op(value, in) per in-range tap (ky, kx order); mean: value / count."""
    n, c, h, w = x.shape
    oh, ow = _out_hw(h, w, f)
    x = x.astype(f32)
    val = np.full((n, c, oh, ow), f32(f["init_value"]), f32)
    cnt = np.zeros((oh, ow), np.int64)
    fn = {0: np.add, 3: np.add, 1: np.minimum, 2: np.maximum}[op]
    for ky in range(f["filter_h"]):
        oy, iy = _taps(h, oh, ky, f["stride_h"], f["dilation_h"], f["padding_h"][0])
        for kx in range(f["filter_w"]):
            ox, ix = _taps(w, ow, kx, f["stride_w"], f["dilation_w"], f["padding_w"][0])
            o_sel, i_sel = np.ix_(range(n), range(c), oy, ox), np.ix_(range(n), range(c), iy, ix)
            if op in (1, 2):   # std::min / std::max(a, b): a unless b is the smaller / larger one
                a, b = val[o_sel], x[i_sel]
                val[o_sel] = np.where((b < a) if op == 1 else (a < b), b, a)
            else:
                val[o_sel] = fn(val[o_sel], x[i_sel])
            cnt[np.ix_(oy, ox)] += 1
    if op == 0:
        with np.errstate(all="ignore"):
            val = (val / cnt.astype(f32)).astype(f32)
    return clamp(val, f["fused_activation"])


def resize(x, f):
    """resize_nearest_neighbor / resize_bilinear, float32 statements; T(...) truncates for uint8."""
    n, c, h, w = x.shape
    oh, ow = f["out_h"], f["out_w"]
    ys_f, xs_f = f32(h) / f32(oh), f32(w) / f32(ow)
    if f["mode"] == 1:            # nearest: min(floor(o * in / out), in - 1)
        ys = np.minimum(np.floor(np.arange(oh).astype(f32) * ys_f).astype(int), h - 1)
        xs = np.minimum(np.floor(np.arange(ow).astype(f32) * xs_f).astype(int), w - 1)
        return x[:, :, ys][:, :, :, xs]
    if f["align_corners"] and oh > 1:
        ys_f = f32(h - 1) / f32(oh - 1)
    if f["align_corners"] and ow > 1:
        xs_f = f32(w - 1) / f32(ow - 1)
    one = f32(1)
    out = np.zeros((n, c, oh, ow), f32)
    xf = x.astype(f32)
    for oy in range(oh):
        in_y = f32(oy) * ys_f
        y0 = int(np.floor(in_y))
        y1, dy = min(y0 + 1, h - 1), f32(in_y - f32(y0))
        for ox in range(ow):
            in_x = f32(ox) * xs_f
            x0 = int(np.floor(in_x))
            x1, dx = min(x0 + 1, w - 1), f32(in_x - f32(x0))
            a0, a1 = f32((one - dy) * (one - dx)), f32(dy * (one - dx))
            a2, a3 = f32((one - dy) * dx), f32(dy * dx)
            v = xf[:, :, y0, x0] * a0 + xf[:, :, y1, x0] * a1
            v = v + xf[:, :, y0, x1] * a2
            out[:, :, oy, ox] = v + xf[:, :, y1, x1] * a3
    return np.trunc(out).astype(np.uint8) if x.dtype == np.uint8 else out


def _rounded(fn):
    """A libm float function: the float64 value rounded once to float32 (correctly rounded)."""
    return lambda v: fn(v.astype(np.float64)).astype(f32)


UNARY = {0x20: np.abs, 0x21: np.ceil, 0x22: _rounded(np.cos), 0x23: _rounded(np.exp), 0x24: np.floor,
         0x25: _rounded(np.log), 0x26: np.negative, 0x27: lambda v: f32(1) / np.sqrt(v),
         0x28: _rounded(np.sin), 0x29: lambda v: v * v}


def nnil(code, x):
    """The NNIL stack machine over float32 values (runtime/nnil.h)."""
    x = x.astype(f32)
    st, pc = [], 0
    bi = {0x40: np.add, 0x41: np.subtract, 0x42: np.multiply, 0x43: np.divide,
          0x44: lambda a, b: np.where(b < a, b, a), 0x45: lambda a, b: np.where(a < b, b, a)}
    with np.errstate(all="ignore"):
        while pc < len(code):
            op = code[pc]
            pc += 1
            if op == 0x01:
                st.append(st[-1])
            elif op == 0x02:
                st.pop()
            elif op == 0x03:
                st.append(x)
            elif op in (0x04, 0x05):
                st.append(np.full(x.shape, op - 4, f32))
            elif op == 0x06:
                st.append(np.full(x.shape, struct.unpack_from("<f", code, pc)[0], f32))
                pc += 4
            elif op in UNARY:
                st.append(UNARY[op](st.pop()).astype(f32))
            elif op in bi:
                b, a = st.pop(), st.pop()
                st.append(bi[op](a, b).astype(f32))
            elif op == 0x80:      # std::clamp(v, low, high)
                hi, lo, v = st.pop(), st.pop(), st.pop()
                st.append(np.where(v < lo, lo, np.where(hi < v, hi, v)).astype(f32))
            elif op == 0xA0:
                return st.pop()
    raise AssertionError("NNIL code without ret")


def c_div(a, b):
    """C int32 a / b on the K210 (RV64 divw): truncation; / 0 gives -1; INT32_MIN / -1 stays."""
    a, b = np.asarray(a, np.int64), np.asarray(b, np.int64)
    q = np.trunc(a / np.where(b == 0, 1, b).astype(np.float64)).astype(np.int64)
    return i32(np.where(b == 0, -1, q))


def _int_op(op, a, b):
    """neutral_ops.cpp quantized_binary lambdas on int32; div: (a + b / 2) / b
    (docs/kmodel-format.md#v4-interpreter)."""
    if op == 3:
        return c_div(i32(a + c_div(b, 2)), b)
    return [np.add, np.subtract, np.multiply, None, np.minimum, np.maximum][op](a, b)


def dequantize(q, zp, scale):
    """riscv_dequantize: scale' = 1.f / scale; zero = -zp * scale'; (float)q * scale' + zero."""
    inv = f32(1) / f32(scale)
    zero = f32(f32(-zp) * inv)
    return (q.astype(f32) * inv + zero).astype(f32)


def quantize(x, zp, scale):
    """riscv_quantize: v = x * scale + zp in float32; pairs by fcvt.w.s rne, an odd last value by
    roundf (half away from zero); clamp to 0..255 (NaN converts to INT32_MAX)."""
    with np.errstate(all="ignore"):
        v = (x.astype(f32) * f32(scale) + f32(zp)).astype(np.float64)
    r = np.rint(v)
    if v.size % 2:
        r[-1] = np.sign(v[-1]) * np.floor(abs(v[-1]) + 0.5)
    return np.clip(np.where(np.isnan(r), 255, np.nan_to_num(r)), 0, 255).astype(np.uint8)


def matmul(a, b, bias, act):
    """value = bias[ox]; for i: value += a[oy][i] * b[i][ox] (float32); clamp."""
    out = np.empty((a.shape[0], b.shape[1]), f32)
    out[:] = bias.astype(f32)
    for i in range(a.shape[1]):
        out = out + a[:, i:i + 1].astype(f32) * b[i].astype(f32)
    return clamp(out, act)


def reduce(x, out_shape, op, init):
    """output = init; for every input value in row-major order: out = reducer(out, value);
    mean multiplies by (float)out_size / in_size."""
    out_shape = tuple(out_shape)
    red = [d for d in range(4) if out_shape[d] == 1 and x.shape[d] != 1]
    keep = [d for d in range(4) if d not in red]
    xt = x.astype(f32).transpose(keep + red).reshape(int(np.prod([x.shape[d] for d in keep])), -1)
    acc = np.full(xt.shape[0], f32(init), f32)
    for k in range(xt.shape[1]):
        v = xt[:, k]
        acc = {0: lambda: acc + v, 3: lambda: acc + v, 1: lambda: np.where(v < acc, v, acc),
               2: lambda: np.where(acc < v, v, acc)}[op]().astype(f32)
    if op == 0:
        acc = acc * (f32(int(np.prod(out_shape))) / f32(x.size))
    return acc.astype(f32).reshape(out_shape)


def conv2d_transpose(x, f, weights, out_shape):
    """output = 0; for ic, iy, ix: in = *input++; for oc, ky, kx in range: out += in * w (the
    bias is read, never added: neutral_kernels.h conv2d_transpose, docs/kmodel-format.md#v4-interpreter); then the clamp
    unless fused_activation is value_range::full() (lowest, max)."""
    n, ci, h, w = x.shape
    _, oc, oh, ow = out_shape
    g = f["groups"]
    gic, goc = ci // g, oc // g
    fh, fw, sh, sw = f["filter_h"], f["filter_w"], f["stride_h"], f["stride_w"]
    dh, dw = f["dilation_h"], f["dilation_w"]
    wt = weights.astype(f32).reshape(g, goc, gic, fh, fw)
    out = np.zeros((n, g, goc, oh, ow), f32)
    x = x.astype(f32).reshape(n, g, gic, h, w)
    for b in range(n):
        for gg in range(g):
            for ic in range(gic):
                for iy in range(h):
                    y0 = iy * sh - f["padding_h"][0]
                    ky0, ky1 = max(0, -(y0 // dh)), min(fh, -((y0 - oh) // dh))
                    for ix in range(w):
                        x0 = ix * sw - f["padding_w"][0]
                        kx0, kx1 = max(0, -(x0 // dw)), min(fw, -((x0 - ow) // dw))
                        if ky0 >= ky1 or kx0 >= kx1:
                            continue
                        ys = slice(y0 + dh * ky0, y0 + dh * (ky1 - 1) + 1, dh)
                        xs = slice(x0 + dw * kx0, x0 + dw * (kx1 - 1) + 1, dw)
                        out[b, gg, :, ys, xs] += x[b, gg, ic, iy, ix] * wt[gg, :, ic, ky0:ky1, kx0:kx1]
    out = out.reshape(n, oc, oh, ow)
    full = (f32(-3.4028234663852886e38), f32(3.4028234663852886e38))
    act = tuple(f32(v) for v in f["fused_activation"])
    return out if act == full else clamp(out, act)


def softmax(mem, f):
    """neutral_kernels.h softmax on the live main memory, scalar by scalar: a row's values are
    read after the writes before them (an output range overlapping the input, docs/kmodel-format.md#v4-interpreter)."""
    buf = mem.buf(f["input"][0])
    src, dst, inner, beta = f["input"][2], f["output"][2], f["inner_size"], f32(f["beta"])
    get = lambda a: f32(struct.unpack_from("<f", buf, a)[0])   # noqa: E731
    put = lambda a, v: struct.pack_into("<f", buf, a, v)        # noqa: E731
    for r in range(f["outer_size"]):
        s, d = src + 4 * r * inner, dst + 4 * r * inner
        if inner == 0:
            continue
        m = get(s)
        for i in range(1, inner):          # *std::max_element: if (m < v) m = v
            v = get(s + 4 * i)
            if m < v:
                m = v
        total = f32(0)
        for i in range(inner):
            with np.errstate(all="ignore"):
                v = f32(np.exp(np.float64(f32((get(s + 4 * i) - m) * beta))))
                total = f32(total + v)
            put(d + 4 * i, v)
        for i in range(inner):
            with np.errstate(all="ignore"):
                put(d + 4 * i, f32(get(d + 4 * i) / total))
    return mem.get(f["output"])


def run_node(node, mem, prepared):
    """Execute one node on `mem`; returns (output range, value written) or None."""
    f, d, name = node.fields, node.data, node.name
    if name == "kpu_conv2d":
        conv = node.conv
        c, h, w = conv.in_shape
        oc, oh, ow = conv.out_shape
        src = _kpu_addr(conv.args["image_src_addr"], c, h, w)
        y = prepared[id(node)](mem.kpu[src])
        mem.kpu[_kpu_addr(conv.args["image_dst_addr"], oc, oh, ow)] = y
        if f["main_mem_output"][3]:
            mem.put(f["main_mem_output"], y)
            return f["main_mem_output"], y
        return None
    if name == "kpu_upload":
        n, c, h, w = f["in_shape"]
        mem.kpu[_kpu_addr(f["output"][2] // LINE, c, h, w)] = mem.get(f["input"]).reshape(c, h, w)
        return None
    if name == "concat":
        outer = f["outer_size"]
        parts = [mem.buf(r[0])[r[2]:r[2] + r[3]].reshape(outer, -1) for r in d["inputs"]]
        for r, dim in zip(d["inputs"], d["dims"]):
            assert r[3] == outer * dim * f["inner_size"], "concat: dims x inner_size bytes per outer index"
        y = np.concatenate(parts, axis=1).reshape(-1)
        mem.buf(f["output"][0])[f["output"][2]:f["output"][2] + f["output"][3]] = y
        return f["output"], y.view(f32 if f["output"][1] == v4.DT_FLOAT32 else np.uint8)
    if name in ("binary", "quantized_binary", "matmul", "quantized_matmul"):
        a, b = mem.get(f["input_a"]), mem.get(f["input_b"])
    else:
        x = mem.get(f["input"])
    if name == "softmax":
        return f["output"], softmax(mem, f)
    if name == "quantize":
        y = quantize(x, *f["quant_param"])
    elif name == "dequantize":
        y = dequantize(x, *f["quant_param"])
    elif name == "quantized_conv2d":
        y = conv2d_q(x.reshape(f["in_shape"]), f, d["bias"], d["weights"], f["out_channels"])
    elif name == "conv2d":
        y = conv2d_f(x.reshape(f["in_shape"]), f, d["weights"], d["bias"], f["out_channels"])
    elif name == "conv2d_transpose":
        y = conv2d_transpose(x.reshape(f["in_shape"]), f, d["weights"], f["out_shape"])
    elif name == "quantized_binary":
        av = mcs(i32(a.astype(np.int64).reshape(f["in_a_shape"]) + f["input_a_offset"]), f["input_a_mul"], f["input_a_shift"])
        bv = mcs(i32(b.astype(np.int64).reshape(f["in_b_shape"]) + f["input_b_offset"]), f["input_b_mul"], f["input_b_shift"])
        v = i32(_int_op(f["binary_op"], np.broadcast_to(av, f["out_shape"]), np.broadcast_to(bv, f["out_shape"])))
        y = np.clip(i32(mcs(v, f["output_mul"], f["output_shift"]) + f["output_offset"]), 0, 255)
    elif name == "binary":
        av, bv = a.astype(f32).reshape(f["in_a_shape"]), b.astype(f32).reshape(f["in_b_shape"])
        ops = [np.add, np.subtract, np.multiply, np.divide, lambda p, q: np.where(q < p, q, p),
               lambda p, q: np.where(p < q, q, p)]
        with np.errstate(all="ignore"):
            v = ops[f["binary_op"]](*np.broadcast_arrays(av, bv)).astype(f32)
        y = clamp(np.broadcast_to(v, f["out_shape"]), f["fused_activation"])
    elif name == "matmul":
        y = matmul(a.reshape(f["a_rows"], f["a_cols"]), b.reshape(f["a_cols"], f["b_cols"]), d["bias"],
                   f["fused_activation"])
    elif name == "quantized_matmul":
        v = (a.astype(np.int64).reshape(f["a_rows"], f["a_cols"]) + f["input_a_offset"]) @ \
            (b.astype(np.int64).reshape(f["a_cols"], f["b_cols"]) + f["input_b_offset"]) + d["bias"].astype(np.int64)
        y = np.clip(i32(mcs(i32(v), f["output_mul"], f["output_shift"]) + f["output_offset"]), 0, 255)
    elif name == "pad":
        p = np.asarray(f["paddings"]).reshape(4, 2)
        xs = x.reshape(f["in_shape"])
        crop = tuple(slice(max(0, -b), s - max(0, -e)) for (b, e), s in zip(p, xs.shape))
        value = struct.unpack("<f", f["pad_value"][1])[0]
        if xs.dtype == np.uint8:
            assert int(value) == f["pad_value"][1][0], "the uint8 pad value reads the same both ways"
            value = int(value)
        y = np.pad(xs[crop], [(max(0, b), max(0, e)) for b, e in p], constant_values=value)
    elif name == "transpose":
        y = x.reshape(f["in_shape"]).transpose(f["perm"])
    elif name == "strided_slice":
        xs = x.reshape(f["in_shape"])
        idx = [np.arange(b, e, s) for b, e, s in zip(f["begin"], f["end"], f["strides"])]
        y = xs[np.ix_(*idx)]
    elif name == "memory_copy":
        y = x
    elif name == "resize_image":
        y = resize(x.reshape(f["in_shape"]), f)
    elif name == "reduce":
        y = reduce(x.reshape(f["in_shape"]), f["out_shape"], f["reduce_op"], f["init_value"])
    elif name == "reduce_window2d":
        y = reduce_window(x.reshape(f["in_shape"]), f, f["reduce_op"])
    elif name == "unary":
        with np.errstate(all="ignore"):
            y = UNARY[0x20 + f["unary_op"]](x.astype(f32)).astype(f32)
    elif name == "nnil_unary_method":
        y = nnil(d["code"], x)
    elif name == "table_lookup1d":
        y = mem.get(f["table"])[x]
    else:
        raise AssertionError(f"no reference for {name}")
    mem.put(f["output"], y)
    return f["output"], np.asarray(y)


def run(model, x, prepared):
    """Run `model` (KModelV4) on input x; `prepared` = Emulator(model).prepared (the KPU convs)."""
    mem = Mem(model)
    rng, shape = model.inputs[0], model.input_shapes[0]
    if rng[0] == v4.MEM_KPU:
        n, c, h, w = shape
        mem.kpu[_kpu_addr(rng[2] // LINE, c, h, w)] = np.asarray(x, np.uint8).reshape(c, h, w)
    else:
        mem.put(rng, x)
    per_node = [run_node(nd, mem, prepared) for nd in model.nodes]
    return [mem.get(r) for r in model.outputs], per_node


def mismatches(emu, x):
    """Run the emulator (`emu`, an Emulator of a v4 model) and this runner on x; returns
    [(node index, node name, max |diff|)] for every node whose written output differs in any bit
    (NaNs equal when in the same places), with the model outputs as node -1."""
    model = emu.model
    outs, trace = emu.run(x, trace=True)
    r_outs, per_node = run(model, x, emu.prepared)
    bad = []

    def differ(got, want, dt):
        got = np.ascontiguousarray(got).reshape(-1)
        if dt == v4.DT_FLOAT32 and got.dtype == np.uint8:      # the emulator's concat returns bytes
            got = got.view(f32)
        want = np.asarray(want).reshape(-1).astype(got.dtype)
        if got.shape == want.shape and np.array_equal(got.view(np.uint8), want.view(np.uint8)):
            return None
        if got.shape != want.shape:
            return float("inf")
        return float(np.nanmax(np.abs(got.astype(np.float64) - want.astype(np.float64)), initial=0.0))

    for i, (nd, (_, got)) in enumerate(zip(model.nodes, trace)):
        if per_node[i] is not None:
            d = differ(got, per_node[i][1], per_node[i][0][1])
            if d is not None:
                bad.append((i, nd.name, d))
    for rng, o, r in zip(model.outputs, outs, r_outs):
        d = differ(o, r, rng[1])
        if d is not None:
            bad.append((-1, "output", d))
    return bad

"""A second, independent runner of kmodel v4 files for the writer's tests: every CPU opcode written
out from its definition (spec §4.3-4.5, nncase v0.2 runtime kernels) with plain numpy, its own
memories (main, constants, KPU RAM in the §2.3 layout) and its own NNIL stack machine. Only the
KPU conv itself is the emulator's (the bit-exact KPU, tested against the vendor simulator
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
    """Byte addresses of every (c, y, x) of a map at KPU line `base` (spec §2.3)."""
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


def mcs(v, mul, shift):
    """mul_and_carry_shift: (int64)v * mul, + 2^(shift-1), >> shift (negative shift: <<), to int32."""
    v = np.asarray(v, np.int64) * int(mul)
    if shift > 0:
        v = (v + (1 << (shift - 1))) >> shift
    elif shift < 0:
        v = v << -shift
    return ((v + 2 ** 31) % 2 ** 32) - 2 ** 31


def out_size(n, k, s, d, pad):
    return (n + pad[0] + pad[1] - ((k - 1) * d + 1) + s) // s


def _window_taps(h, w, f):
    """For each output (oy, ox) and tap (ky, kx): the input (iy, ix) or None."""
    oh = out_size(h, f["filter_h"], f["stride_h"], f["dilation_h"], f["padding_h"])
    ow = out_size(w, f["filter_w"], f["stride_w"], f["dilation_w"], f["padding_w"])
    return oh, ow


def conv2d_q(x, f, bias, weights, oc):
    n, ci, h, w = x.shape
    g = f["groups"]
    fh, fw = f["filter_h"], f["filter_w"]
    oh, ow = _window_taps(h, w, f)
    wt = weights.astype(np.int64).reshape(oc, ci // g, fh, fw) + f["filter_offset"]
    xo = x.astype(np.int64) + f["input_offset"]
    out = np.zeros((n, oc, oh, ow), np.int64)
    for o in range(oc):
        gi = o // (oc // g)
        for oy in range(oh):
            for ox in range(ow):
                acc = int(bias[o])
                for ky in range(fh):
                    iy = oy * f["stride_h"] - f["padding_h"][0] + ky * f["dilation_h"]
                    if not 0 <= iy < h:
                        continue
                    for kx in range(fw):
                        ix = ox * f["stride_w"] - f["padding_w"][0] + kx * f["dilation_w"]
                        if not 0 <= ix < w:
                            continue
                        acc += int(np.dot(xo[0, gi * (ci // g):(gi + 1) * (ci // g), iy, ix], wt[o, :, ky, kx]))
                out[0, o, oy, ox] = acc
    v = mcs(((out + 2 ** 31) % 2 ** 32) - 2 ** 31, f["output_mul"], f["output_shift"]) + f["output_offset"]
    return np.clip(v, 0, 255).astype(np.uint8)


def conv2d_f(x, f, weights, bias, oc):
    n, ci, h, w = x.shape
    g = f["groups"]
    fh, fw = f["filter_h"], f["filter_w"]
    oh, ow = _window_taps(h, w, f)
    wt = weights.astype(np.float64).reshape(oc, ci // g, fh, fw)
    xp = np.zeros((n, ci, h + 2 * 64, w + 2 * 64))      # zero outside: taps outside add nothing
    xp[:, :, 64:64 + h, 64:64 + w] = x
    out = np.zeros((n, oc, oh, ow))
    for o in range(oc):
        gi = o // (oc // g)
        for ky in range(fh):
            for kx in range(fw):
                ys = 64 + np.arange(oh) * f["stride_h"] - f["padding_h"][0] + ky * f["dilation_h"]
                xs = 64 + np.arange(ow) * f["stride_w"] - f["padding_w"][0] + kx * f["dilation_w"]
                tap = xp[0, gi * (ci // g):(gi + 1) * (ci // g)][:, ys][:, :, xs]
                out[0, o] += np.tensordot(wt[o, :, ky, kx], tap, axes=(0, 0))
        out[0, o] += bias[o]
    lo, hi = f["fused_activation"]
    return np.clip(out, lo, hi)


def reduce_window(x, f, op):
    n, c, h, w = x.shape
    oh, ow = _window_taps(h, w, f)
    out = np.zeros((n, c, oh, ow))
    for oy in range(oh):
        for ox in range(ow):
            taps = []
            for ky in range(f["filter_h"]):
                iy = oy * f["stride_h"] - f["padding_h"][0] + ky * f["dilation_h"]
                for kx in range(f["filter_w"]):
                    ix = ox * f["stride_w"] - f["padding_w"][0] + kx * f["dilation_w"]
                    if 0 <= iy < h and 0 <= ix < w:
                        taps.append(x[:, :, iy, ix].astype(np.float64))
            t = np.stack(taps) if taps else np.zeros((0, n, c))
            init = f["init_value"]
            if op == 0:
                out[:, :, oy, ox] = (init + t.sum(0)) / max(len(taps), 1)
            elif op == 3:
                out[:, :, oy, ox] = init + t.sum(0)
            elif op == 2:
                out[:, :, oy, ox] = np.maximum(init, t.max(0)) if taps else init
            else:
                out[:, :, oy, ox] = np.minimum(init, t.min(0)) if taps else init
    lo, hi = f["fused_activation"]
    return np.clip(out, lo, hi)


def resize(x, f):
    n, c, h, w = x.shape
    oh, ow = f["out_h"], f["out_w"]
    if f["mode"] == 1:            # nearest: min(floor(o * in / out), in - 1), scale in float32
        ys = np.minimum(np.floor(np.arange(oh, dtype=f32) * (f32(h) / f32(oh))).astype(int), h - 1)
        xs = np.minimum(np.floor(np.arange(ow, dtype=f32) * (f32(w) / f32(ow))).astype(int), w - 1)
        return x[:, :, ys][:, :, :, xs]
    ac = f["align_corners"]
    ry = f32(h - 1) / f32(oh - 1) if ac and oh > 1 else f32(h) / f32(oh)
    rx = f32(w - 1) / f32(ow - 1) if ac and ow > 1 else f32(w) / f32(ow)
    out = np.zeros((n, c, oh, ow))
    for oy in range(oh):
        cy = float(f32(oy) * ry)
        y0 = int(np.floor(cy))
        y1, dy = min(y0 + 1, h - 1), cy - y0
        for ox in range(ow):
            cx = float(f32(ox) * rx)
            x0 = int(np.floor(cx))
            x1, dx = min(x0 + 1, w - 1), cx - x0
            out[:, :, oy, ox] = ((1 - dy) * (1 - dx) * x[:, :, y0, x0] + dy * (1 - dx) * x[:, :, y1, x0]
                                 + (1 - dy) * dx * x[:, :, y0, x1] + dy * dx * x[:, :, y1, x1])
    return np.trunc(out).astype(np.uint8) if x.dtype == np.uint8 else out


def nnil(code, x):
    x = x.astype(np.float64)
    st, pc = [], 0
    un = {0x20: np.abs, 0x21: np.ceil, 0x22: np.cos, 0x23: np.exp, 0x24: np.floor, 0x25: np.log,
          0x26: np.negative, 0x27: lambda v: 1 / np.sqrt(v), 0x28: np.sin, 0x29: np.square}
    bi = {0x40: np.add, 0x41: np.subtract, 0x42: np.multiply, 0x43: np.divide, 0x44: np.minimum, 0x45: np.maximum}
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
                st.append(np.full(x.shape, float(op - 4)))
            elif op == 0x06:
                st.append(np.full(x.shape, struct.unpack_from("<f", code, pc)[0]))
                pc += 4
            elif op in un:
                st.append(un[op](st.pop()))
            elif op in bi:
                b, a = st.pop(), st.pop()
                st.append(bi[op](a, b))
            elif op == 0x80:
                hi, lo, v = st.pop(), st.pop(), st.pop()
                st.append(np.minimum(np.maximum(v, lo), hi))
            elif op == 0xA0:
                return st.pop()
    raise AssertionError("NNIL code without ret")


def _int_op(op, a, b):
    if op == 3:
        return np.where(b == 0, 0, np.trunc(a / np.where(b == 0, 1, b))).astype(np.int64)
    return [np.add, np.subtract, np.multiply, None, np.minimum, np.maximum][op](a, b)


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
    if name == "quantize":
        zp, scale = f["quant_param"]
        y = np.clip(np.rint(x.astype(f32) * f32(scale) + f32(zp)), 0, 255)
    elif name == "dequantize":
        zp, scale = f["quant_param"]
        y = (x.astype(np.float64) - zp) / scale
    elif name == "quantized_conv2d":
        y = conv2d_q(x.reshape(f["in_shape"]), f, d["bias"], d["weights"], f["out_channels"])
    elif name == "conv2d":
        y = conv2d_f(x.reshape(f["in_shape"]), f, d["weights"], d["bias"], f["out_channels"])
    elif name == "conv2d_transpose":
        n, ci, h, w = f["in_shape"]
        _, oc, oh, ow = f["out_shape"]
        g = f["groups"]
        wt = d["weights"].astype(np.float64).reshape(oc, ci // g, f["filter_h"], f["filter_w"])
        y = np.zeros((oc, oh, ow))
        xi = x.reshape(ci, h, w).astype(np.float64)
        for o in range(oc):
            gi = o // (oc // g)
            for i in range(ci // g):
                for ky in range(f["filter_h"]):
                    for kx in range(f["filter_w"]):
                        for iy in range(h):
                            oy = iy * f["stride_h"] - f["padding_h"][0] + ky * f["dilation_h"]
                            if not 0 <= oy < oh:
                                continue
                            for ix in range(w):
                                ox = ix * f["stride_w"] - f["padding_w"][0] + kx * f["dilation_w"]
                                if 0 <= ox < ow:
                                    y[o, oy, ox] += xi[gi * (ci // g) + i, iy, ix] * wt[o, i, ky, kx]
    elif name == "quantized_binary":
        av = mcs(a.astype(np.int64).reshape(f["in_a_shape"]) + f["input_a_offset"], f["input_a_mul"], f["input_a_shift"])
        bv = mcs(b.astype(np.int64).reshape(f["in_b_shape"]) + f["input_b_offset"], f["input_b_mul"], f["input_b_shift"])
        v = _int_op(f["binary_op"], np.broadcast_to(av, f["out_shape"]), np.broadcast_to(bv, f["out_shape"]))
        y = np.clip(mcs(((v + 2 ** 31) % 2 ** 32) - 2 ** 31, f["output_mul"], f["output_shift"]) + f["output_offset"], 0, 255)
    elif name == "binary":
        av, bv = a.astype(np.float64).reshape(f["in_a_shape"]), b.astype(np.float64).reshape(f["in_b_shape"])
        with np.errstate(all="ignore"):
            v = [np.add, np.subtract, np.multiply, np.divide, np.minimum, np.maximum][f["binary_op"]](av, bv)
        y = np.clip(np.broadcast_to(v, f["out_shape"]), *f["fused_activation"])
    elif name == "matmul":
        v = a.astype(np.float64).reshape(f["a_rows"], f["a_cols"]) @ b.astype(np.float64).reshape(f["a_cols"], f["b_cols"])
        y = np.clip(v + d["bias"], *f["fused_activation"])
    elif name == "quantized_matmul":
        v = (a.astype(np.int64).reshape(f["a_rows"], f["a_cols"]) + f["input_a_offset"]) @ \
            (b.astype(np.int64).reshape(f["a_cols"], f["b_cols"]) + f["input_b_offset"]) + d["bias"].astype(np.int64)
        y = np.clip(mcs(v, f["output_mul"], f["output_shift"]) + f["output_offset"], 0, 255)
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
        xs = x.reshape(f["in_shape"]).astype(np.float64)
        axes = tuple(i for i in range(4) if f["out_shape"][i] == 1 and f["in_shape"][i] != 1)
        op = f["reduce_op"]
        if op in (0, 3):
            y = f["init_value"] + xs.sum(axis=axes, keepdims=True)
            if op == 0:
                y = y / (xs.size / np.prod(f["out_shape"]))
        elif op == 2:
            y = np.maximum(f["init_value"], xs.max(axis=axes, keepdims=True))
        else:
            y = np.minimum(f["init_value"], xs.min(axis=axes, keepdims=True))
    elif name == "reduce_window2d":
        y = reduce_window(x.reshape(f["in_shape"]), f, f["reduce_op"])
    elif name == "unary":
        un = [np.abs, np.ceil, np.cos, np.exp, np.floor, np.log, np.negative, lambda v: 1 / np.sqrt(v), np.sin, np.square]
        with np.errstate(all="ignore"):
            y = un[f["unary_op"]](x.astype(np.float64))
    elif name == "nnil_unary_method":
        y = nnil(d["code"], x)
    elif name == "table_lookup1d":
        y = mem.get(f["table"])[x]
    elif name == "softmax":
        xs = x.reshape(f["outer_size"], f["inner_size"]).astype(np.float64) * f["beta"]
        e = np.exp(xs - xs.max(axis=1, keepdims=True))
        y = e / e.sum(axis=1, keepdims=True)
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

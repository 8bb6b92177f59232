"""kmodel v4 interpreter (nncase v0.2 runtime, spec §4.4-4.5): one function per opcode."""
from __future__ import annotations

import numpy as np

from tl2k210.errors import EmulatorError
from tl2k210.k210.emulator.memory import guarded
from tl2k210.k210 import hardware as hw
from tl2k210.k210.emulator.memory import KpuRam, MainMemory
from tl2k210.k210.kmodel import v4 as fmt

f32 = np.float32
OPS = {}


def op(*names):
    def deco(fn):
        for n in names:
            OPS[n] = fn
        return fn
    return deco


class Ctx:
    def __init__(self, model, prepared):
        self.model, self.prepared = model, prepared
        self.main = MainMemory(model.main_mem)
        self.kpu = KpuRam()
        self.const = np.frombuffer(model.constants, np.uint8)

    def _mem(self, rng, where):
        mtype, dtype, start, size = rng
        if mtype == fmt.MEM_CONST:
            buf = self.const
        elif mtype == fmt.MEM_MAIN:
            buf = self.main.mem
        elif mtype == fmt.MEM_KPU:
            buf = self.kpu.mem
        else:
            raise EmulatorError(f"{where}: unknown memory type {mtype}")
        if dtype not in fmt.DTYPES:
            raise EmulatorError(f"{where}: unknown datatype {dtype}")
        if start + size > buf.size:
            raise EmulatorError(f"{where}: range [{start}, {start + size}) outside its memory "
                                f"({buf.size} bytes)")
        return buf[start:start + size].view(fmt.DTYPES[dtype])

    def read(self, rng, where) -> np.ndarray:
        return self._mem(rng, where).copy()

    def write(self, rng, x, where):
        view = self._mem(rng, where)
        x = np.asarray(x).reshape(-1)
        if x.size != view.size:
            raise EmulatorError(f"{where}: writing {x.size} values into a {view.size}-value range")
        view[:] = x.astype(view.dtype)


def _clamp(x, vr):
    lo, hi = vr
    return np.minimum(np.maximum(x, f32(lo)), f32(hi))


@op("kpu_conv2d")
def kpu_conv2d(node, f, ctx, where):
    conv, a = node.conv, node.conv.args
    c, h, w = conv.in_shape
    oc, oh, ow = conv.out_shape
    in_lines, out_lines = hw.map_lines(c, h, w), hw.map_lines(oc, oh, ow)
    ys = []
    for n in range(max(1, f["batches"])):
        x = ctx.kpu.read(a["image_src_addr"] + n * in_lines, c, h, w, where)
        y = ctx.prepared[id(node)](x)
        ctx.kpu.write(a["image_dst_addr"] + n * out_lines, y, where)
        ys.append(y)
    y = np.stack(ys)
    if f["main_mem_output"][3]:
        ctx.write(f["main_mem_output"], y, where)
    return y


@op("kpu_upload")
def kpu_upload(node, f, ctx, where):
    n, c, h, w = f["in_shape"]
    x = ctx.read(f["input"], where).reshape(n, c, h, w)
    base = f["output"][2] // hw.LINE_BYTES
    for i in range(n):
        ctx.kpu.write(base + i * hw.map_lines(c, h, w), x[i], where)
    return x


@op("dequantize")
def dequantize(node, f, ctx, where):
    zp, scale = f["quant_param"]
    q = ctx.read(f["input"], where)
    # device kernel (riscv neutral_kernels.h): q * (1/scale) + (-zp/scale)
    out = q.astype(f32) * (f32(1) / f32(scale)) + (f32(-zp) / f32(scale))
    ctx.write(f["output"], out, where)
    return out


@op("quantize")
def quantize(node, f, ctx, where):
    zp, scale = f["quant_param"]
    x = ctx.read(f["input"], where)
    q = np.rint(x * f32(scale) + f32(zp))  # device: fcvt.w.s rne (round half to even)
    out = np.clip(q, 0, 255).astype(np.uint8)
    ctx.write(f["output"], out, where)
    return out


@op("transpose")
def transpose(node, f, ctx, where):
    x = ctx.read(f["input"], where).reshape(f["in_shape"])
    out = np.ascontiguousarray(x.transpose(f["perm"]))
    ctx.write(f["output"], out, where)
    return out


@op("matmul")
def matmul(node, f, ctx, where):
    r, k, n = f["a_rows"], f["a_cols"], f["b_cols"]
    a = ctx.read(f["input_a"], where).reshape(r, k)
    b = ctx.read(f["input_b"], where).reshape(k, n)
    # nncase loops: for each (row, col): sum over k in order, then + bias, then clamp
    prod = a[:, :, None].astype(f32) * b[None, :, :].astype(f32)
    out = np.cumsum(prod, axis=1, dtype=f32)[:, -1, :] + node.data["bias"].astype(f32)
    out = _clamp(out, f["fused_activation"])
    ctx.write(f["output"], out, where)
    return out


@op("pad")
def pad(node, f, ctx, where):
    shape = f["in_shape"]
    x = ctx.read(f["input"], where).reshape(shape)
    p = np.asarray(f["paddings"]).reshape(4, 2)
    value = np.frombuffer(f["pad_value"][1], "<f4")[0]  # stored as f32 even for u8 tensors
    crop = tuple(slice(max(0, -b), s - max(0, -e)) for (b, e), s in zip(p, shape))
    x = x[crop]
    out = np.pad(x, [(max(0, b), max(0, e)) for b, e in p], constant_values=value)
    ctx.write(f["output"], out, where)
    return out


@op("memory_copy")
def memory_copy(node, f, ctx, where):
    x = ctx.read(f["input"], where)
    ctx.write(f["output"], x, where)
    return x


@op("softmax")
def softmax(node, f, ctx, where):
    x = ctx.read(f["input"], where).reshape(f["outer_size"], f["inner_size"]).astype(f32)
    e = np.exp((x - x.max(axis=1, keepdims=True)) * f32(f["beta"])).astype(f32)
    out = e / np.cumsum(e, axis=1, dtype=f32)[:, -1:]
    ctx.write(f["output"], out, where)
    return out


@op("binary")
def binary(node, f, ctx, where):
    a = ctx.read(f["input_a"], where).reshape(f["in_a_shape"])
    b = ctx.read(f["input_b"], where).reshape(f["in_b_shape"])
    name = fmt.BINARY_OPS[f["binary_op"]]
    fn = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide,
          "min": np.minimum, "max": np.maximum}[name]
    out = _clamp(fn(a.astype(f32), b.astype(f32)), f["fused_activation"])
    ctx.write(f["output"], np.broadcast_to(out, f["out_shape"]), where)
    return out


@op("unary")
def unary(node, f, ctx, where):
    x = ctx.read(f["input"], where).astype(f32)
    name = fmt.UNARY_OPS[f["unary_op"]]
    fn = {"abs": np.abs, "ceil": np.ceil, "cos": np.cos, "exp": np.exp, "floor": np.floor,
          "log": np.log, "neg": np.negative, "rsqrt": lambda v: f32(1) / np.sqrt(v),
          "sin": np.sin, "square": np.square}[name]
    out = fn(x).astype(f32)
    ctx.write(f["output"], out, where)
    return out


@op("concat")
def concat(node, f, ctx, where):
    outer = f["outer_size"]  # each input holds outer x (dims[i] * inner_size) bytes (errata 4)
    parts = [ctx._mem(r, where).view(np.uint8).reshape(outer, -1) for r in node.data["inputs"]]
    out = np.concatenate(parts, axis=1)
    ctx._mem(f["output"], where).view(np.uint8)[:] = out.reshape(-1)
    return out


# ---------------------------------------------------------------------------------------------
def run(model, prepared: dict, x: np.ndarray, trace: bool):
    ctx = Ctx(model, prepared)
    if len(model.inputs) != 1:
        raise EmulatorError(f"model has {len(model.inputs)} inputs; the v4 runtime feeds input 0 only")
    rng, shape = model.inputs[0], model.input_shapes[0]
    x = np.asarray(x)
    if rng[0] == fmt.MEM_KPU:
        n, c, h, w = shape
        if x.size != n * c * h * w:
            raise EmulatorError(f"input has {x.size} values; the model takes uint8 {tuple(shape)} (NCHW)")
        if x.dtype != np.uint8 and (x.min() < 0 or x.max() > 255):
            raise EmulatorError("input must be uint8 pixels 0..255 (planar, NCHW)")
        xb = x.astype(np.uint8).reshape(n, c, h, w)
        for i in range(n):
            ctx.kpu.write(rng[2] // hw.LINE_BYTES + i * hw.map_lines(c, h, w), xb[i], "input")
    else:
        dt = fmt.DTYPES[rng[1]]
        count = rng[3] // np.dtype(dt).itemsize
        if x.size != count:
            raise EmulatorError(f"input has {x.size} values; the model takes {count} "
                                f"{np.dtype(dt).name} values, shape {tuple(shape)}")
        ctx.write(rng, x.astype(dt), "input")
    inter = []
    for i, node in enumerate(model.nodes):
        where = f"node {i} ({node.name})"
        fn = OPS.get(node.name)
        if fn is None:
            raise EmulatorError(f"{where}: opcode not emulated yet")
        y = guarded(fn, where, node, node.fields, ctx, where)
        if trace:
            inter.append((where, np.array(y, copy=True)))
    outs = [ctx.read(r, "output") for r in model.outputs]
    return outs, inter

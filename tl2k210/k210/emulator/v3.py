"""kmodel v3 runner: the SDK's ``kpu_run_kmodel`` / ``ai_step`` (docs/kmodel-format.md#v3-runner), one small function
per layer type in a registry. Float CPU layers compute in float32 like the RISC-V code."""
from __future__ import annotations

import numpy as np

from tl2k210.errors import EmulatorError
from tl2k210.k210.emulator.memory import guarded
from tl2k210.k210.emulator.kpu import carry_shift_nncase01
from tl2k210.k210.emulator.memory import KpuRam, MainMemory

f32 = np.float32
LAYERS = {}


def layer(*names):
    def deco(fn):
        for n in names:
            LAYERS[n] = fn
        return fn
    return deco


def _seqsum(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """float32 sum in index order (a C `for` loop), not numpy's pairwise summation."""
    return np.cumsum(x.astype(f32), axis=axis, dtype=f32).take(-1, axis=axis)


def _round_away(x: np.ndarray) -> np.ndarray:
    """C roundf: half away from zero."""
    x = np.asarray(x, np.float64)
    return np.trunc(x + np.copysign(0.5, x))


class Ctx:
    def __init__(self, model, main: MainMemory, kpu: KpuRam, prepared: dict):
        self.model, self.main, self.kpu, self.prepared = model, main, kpu, prepared


# ---------------------------------------------------------------------------------------------
@layer("K210_CONV")
def k210_conv(L, f, ctx: Ctx, where):
    conv, a = L.conv, L.conv.args
    c, h, w = conv.in_shape
    x = ctx.kpu.read(a["image_src_addr"], c, h, w, where)
    y = ctx.prepared[id(L)](x)
    ctx.kpu.write(a["image_dst_addr"], y, where)
    if f["flags"] & 1:  # KLF_MAIN_MEM_OUT: the output FIFO streamed to main memory, dense CHW
        ctx.main.write(f["main_mem_out_address"], y, where)
    return y


@layer("ADD")
def add(L, f, ctx, where):
    n = f["count"]
    a = ctx.main.read(f["main_mem_in_a_address"], n, f32, where)
    b = ctx.main.read(f["main_mem_in_b_address"], n, f32, where)
    out = a + b
    ctx.main.write(f["main_mem_out_address"], out, where)
    return out


@layer("QUANTIZED_ADD")
def quantized_add(L, f, ctx, where):
    n = -(-f["count"] // 8) * 8  # the SDK processes whole groups of 8
    a = ctx.main.read(f["main_mem_in_a_address"], n, np.uint8, where).astype(np.int64)
    b = ctx.main.read(f["main_mem_in_b_address"], n, np.uint8, where).astype(np.int64)
    a = (a + f["in_a_offset"]) * f["in_a_mul"]
    b = (b + f["in_b_offset"]) * f["in_b_mul"]
    if f["in_a_shift"] == f["in_b_shift"]:
        v = (a + b) >> f["in_a_shift"]
    else:
        v = (a >> f["in_a_shift"]) + (b >> f["in_b_shift"])
    v = carry_shift_nncase01(v * f["out_mul"], f["out_shift"]) + f["out_offset"]
    out = np.clip(v, 0, 255).astype(np.uint8)
    ctx.main.write(f["main_mem_out_address"], out, where)
    return out[:f["count"]]


@layer("GLOBAL_AVERAGE_POOL2D", "GLOBAL_MAX_POOL2D", "QUANTIZED_GLOBAL_AVERAGE_POOL2D",
       "QUANTIZED_GLOBAL_MAX_POOL2D")
def global_pool(L, f, ctx, where):
    k, c = f["kernel_size"], f["channels"]
    quant = L.name.startswith("QUANTIZED")
    x = ctx.main.read(f["main_mem_in_address"], k * c, np.uint8 if quant else f32, where).reshape(c, k)
    if "MAX" in L.name:
        out = x.max(axis=1)
    elif quant:  # not run by the SDK; rounded average (UNCERTAIN on device)
        out = ((x.astype(np.int64).sum(axis=1) + k // 2) // k).astype(np.uint8)
    else:
        out = _seqsum(x, 1) / f32(k)
    ctx.main.write(f["main_mem_out_address"], out, where)
    return out


def _pool_windows(f):
    iw, ih, c = f["in_shape"]
    ow, oh, oc = f["out_shape"]
    kw, kh, sw, sh = f["kernel_width"], f["kernel_height"], f["stride_width"], f["stride_height"]
    ys = np.arange(oh)[:, None] * sh - f["padding_height"] + np.arange(kh)[None, :]  # (oh, kh)
    xs = np.arange(ow)[:, None] * sw - f["padding_width"] + np.arange(kw)[None, :]   # (ow, kw)
    valid = (((ys >= 0) & (ys < ih))[:, None, :, None] & ((xs >= 0) & (xs < iw))[None, :, None, :])
    return (c, ih, iw), np.clip(ys, 0, ih - 1), np.clip(xs, 0, iw - 1), valid, (oc, oh, ow)


@layer("QUANTIZED_MAX_POOL2D", "MAX_POOL2D", "AVERAGE_POOL2D", "QUANTIZED_AVERAGE_POOL2D")
def pool2d(L, f, ctx, where):
    (c, ih, iw), ys, xs, valid, (oc, oh, ow) = _pool_windows(f)
    quant = L.name.startswith("QUANTIZED")
    x = ctx.main.read(f["main_mem_in_address"], c * ih * iw, np.uint8 if quant else f32,
                      where).reshape(c, ih, iw)
    win = x[:, ys[:, None, :, None], xs[None, :, None, :]]  # (c, oh, ow, kh, kw)
    if "MAX" in L.name:
        init = 0 if quant else -np.finfo(f32).max  # the SDK's quantized max starts at 0
        out = np.where(valid, win, init).reshape(c, oh, ow, -1).max(axis=-1).astype(x.dtype)
    else:
        cnt = valid.reshape(oh, ow, -1).sum(axis=-1)
        if quant:  # not run by the SDK; rounded average (UNCERTAIN on device)
            s = np.where(valid, win, 0).reshape(c, oh, ow, -1).astype(np.int64).sum(axis=-1)
            out = ((s + cnt // 2) // cnt).astype(np.uint8)
        else:  # the SDK ignores `act` here (docs/kmodel-format.md#v3-runner)
            out = _seqsum(np.where(valid, win, 0).reshape(c, oh, ow, -1), -1) / cnt.astype(f32)
    ctx.main.write(f["main_mem_out_address"], out, where)
    return out


@layer("QUANTIZE")
def quantize(L, f, ctx, where):
    x = ctx.main.read(f["main_mem_in_address"], f["count"], f32, where)
    q = _round_away((x - f32(f["bias"])) * (f32(1) / f32(f["scale"])))
    out = np.clip(q, 0, 255).astype(np.uint8)
    ctx.main.write(f["mem_out_address"], out, where)
    return out


@layer("DEQUANTIZE")
def dequantize(L, f, ctx, where):
    q = ctx.main.read(f["main_mem_in_address"], f["count"], np.uint8, where)
    out = q.astype(f32) * f32(f["scale"]) + f32(f["bias"])
    ctx.main.write(f["mem_out_address"], out, where)
    return out


@layer("CHANNELWISE_DEQUANTIZE")
def channelwise_dequantize(L, f, ctx, where):
    c, n = f["channels"], f["channel_size"]
    q = ctx.main.read(f["main_mem_in_address"], c * n, np.uint8, where).reshape(c, n)
    p = L.data["params"].astype(f32)
    out = q.astype(f32) * p[:, :1] + p[:, 1:]
    ctx.main.write(f["main_mem_out_address"], out, where)
    return out.reshape(-1)


@layer("REQUANTIZE")
def requantize(L, f, ctx, where):
    q = ctx.main.read(f["main_mem_in_address"], f["count"], np.uint8, where)
    out = np.asarray(L.data["table"], np.uint8)[q]
    ctx.main.write(f["main_mem_out_address"], out, where)
    return out


@layer("L2_NORMALIZATION", "SOFTMAX", "LOGISTIC")
def unary(L, f, ctx, where):
    x = ctx.main.read(f["main_mem_in_address"], f["channels"], f32, where)
    if L.name == "SOFTMAX":
        m = max(f32(np.finfo(f32).tiny), x.max()) if x.size else f32(0)
        e = np.exp(x - m).astype(f32)
        out = e / _seqsum(e)
    elif L.name == "LOGISTIC":
        out = f32(1) / (f32(1) + np.exp(-x).astype(f32))
    else:
        s = max(_seqsum(x * x), f32(1e-10))
        out = x / np.sqrt(f32(s))
    ctx.main.write(f["main_mem_out_address"], out.astype(f32), where)
    return out.astype(f32)


@layer("CONCAT", "QUANTIZED_CONCAT")
def concat(L, f, ctx, where):
    parts = [ctx.main.read(start, size, np.uint8, where) for start, size in L.data["ranges"]]
    out = np.concatenate(parts) if parts else np.zeros(0, np.uint8)
    ctx.main.write(f["main_mem_out_address"], out, where)
    return out.view(f32) if L.name == "CONCAT" and out.size % 4 == 0 else out


@layer("FULLY_CONNECTED")
def fully_connected(L, f, ctx, where):
    w, b = L.data["weights"].astype(f32), L.data["bias"].astype(f32)
    x = ctx.main.read(f["main_mem_in_address"], f["in_channels"], f32, where)
    out = _seqsum(w * x[None, :], 1) + b
    if f["act"] == 1:
        out = np.maximum(out, f32(0))
    elif f["act"] == 2:
        out = np.minimum(np.maximum(out, f32(0)), f32(6))
    ctx.main.write(f["main_mem_out_address"], out, where)
    return out


@layer("TENSORFLOW_FLATTEN", "QUANTIZED_TENSORFLOW_FLATTEN")
def flatten(L, f, ctx, where):
    w, h, c = f["shape"]
    dt = f32 if L.name == "TENSORFLOW_FLATTEN" else np.uint8
    x = ctx.main.read(f["main_mem_in_address"], c * h * w, dt, where).reshape(c, h, w)
    out = x.transpose(1, 2, 0).reshape(-1)
    ctx.main.write(f["main_mem_out_address"], out, where)
    return out


@layer("RESIZE_NEAREST_NEIGHBOR", "QUANTIZED_RESIZE_NEAREST_NEIGHBOR")
def resize_nearest(L, f, ctx, where):
    iw, ih, c = f["in_shape"]
    ow, oh = f["out_width"], f["out_height"]
    dt = f32 if L.name == "RESIZE_NEAREST_NEIGHBOR" else np.uint8
    x = ctx.main.read(f["main_mem_in_address"], c * ih * iw, dt, where).reshape(c, ih, iw)
    ys = np.minimum(np.floor(np.arange(oh, dtype=f32) * (f32(ih) / f32(oh))).astype(int), ih - 1)
    xs = np.minimum(np.floor(np.arange(ow, dtype=f32) * (f32(iw) / f32(ow))).astype(int), iw - 1)
    out = x[:, ys[:, None], xs[None, :]]
    ctx.main.write(f["main_mem_out_address"], out, where)
    return out


@layer("K210_UPLOAD")
def k210_upload(L, f, ctx, where):
    w, h, c = f["width"], f["height"], f["channels"]
    x = ctx.main.read(f["main_mem_in_address"], c * h * w, np.uint8, where).reshape(c, h, w)
    ctx.kpu.write(f["kpu_mem_out_address"], x, where)
    return x


@layer("K210_ADD_PADDING")
def k210_add_padding(L, f, ctx, where):
    c = f["channels"]
    x = ctx.main.read(f["main_mem_in_address"], c, np.uint8, where)
    ch = np.arange(c)
    addr = 64 * (f["kpu_mem_out_address"] + (ch // 4) * 4) + (ch % 4) * 16
    if c and (addr.max() >= ctx.kpu.mem.size or f["kpu_mem_out_address"] < 0):
        raise EmulatorError(f"{where}: padding {c} channels at KPU line "
                            f"{f['kpu_mem_out_address']} runs past KPU RAM")
    ctx.kpu.mem[addr] = x  # pixel (0,0) of each 4x4 channel; the other 15 are not written
    return x


@layer("K210_REMOVE_PADDING")
def k210_remove_padding(L, f, ctx, where):
    c = f["channels"]
    x = ctx.main.read(f["main_mem_in_address"], 16 * c, np.uint8, where)
    out = x[::16].copy()
    ctx.main.write(f["main_mem_out_address"], out, where)
    return out


# ---------------------------------------------------------------------------------------------
def run(model, prepared: dict, x: np.ndarray, trace: bool):
    main, kpu = MainMemory(model.main_mem_usage), KpuRam()
    ctx = Ctx(model, main, kpu, prepared)
    first = model.layers[0]
    if first.name == "K210_CONV":
        c, h, w = first.conv.in_shape
        x = _as_input(x, (c, h, w), np.uint8)
        kpu.write(first.conv.args["image_src_addr"], x, "input")
    elif first.name == "FULLY_CONNECTED":
        n = first.fields["in_channels"]
        x = _as_input(x, (n,), np.float32)
        main.write(first.fields["main_mem_in_address"], x, "input")
    else:  # the SDK refuses this model (kpu_run_kmodel returns -1)
        raise EmulatorError(f"layer 0 is {first.name}; the v3 runner needs K210_CONV or "
                            "FULLY_CONNECTED first (the SDK and MaixPy refuse this model)")
    inter = []
    for i, L in enumerate(model.layers):
        where = f"layer {i} ({L.name})"
        fn = LAYERS.get(L.name)
        if fn is None:
            raise EmulatorError(f"{where}: the SDK's v3 runner has no code for this layer type and "
                                "no source documents its body, so it cannot be emulated; MaixPy "
                                "firmware would stop here too")
        y = guarded(fn, where, L, L.fields, ctx, where)
        if trace:
            inter.append((where, np.array(y, copy=True)))
    outs = []
    for (addr, size), (dt, shape) in zip(model.outputs, model.output_specs()):
        count = int(np.prod(shape))
        outs.append(main.read(addr, count, dt, "output").reshape(shape))
    return outs, inter


def _as_input(x, shape, dtype) -> np.ndarray:
    x = np.asarray(x)
    if x.size != int(np.prod(shape)):
        raise EmulatorError(f"input has shape {x.shape} ({x.size} values); the model takes "
                            f"{shape} {np.dtype(dtype).name}")
    if dtype == np.uint8 and x.dtype != np.uint8:
        if x.min() < 0 or x.max() > 255:
            raise EmulatorError("input must be uint8 pixels 0..255 (planar RGB, CHW)")
        x = x.astype(np.uint8)
    return np.ascontiguousarray(x.reshape(shape), dtype=dtype)

"""kmodel v4 interpreter (nncase v0.2 runtime, docs/kmodel-format.md#v4-interpreter): one function per opcode."""
from __future__ import annotations

import numpy as np

from tl2k210.errors import EmulatorError
from tl2k210.k210.emulator import neutral as N
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

    def span(self, rng, where):
        """(byte buffer, start, size) of a memory range, checked against its memory."""
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
        return buf, start, size

    def _mem(self, rng, where):
        buf, start, size = self.span(rng, where)
        return buf[start:start + size].view(fmt.DTYPES[rng[1]])

    def read(self, rng, where) -> np.ndarray:
        return self._mem(rng, where).copy()

    def write(self, rng, x, where):
        view = self._mem(rng, where)
        x = np.asarray(x).reshape(-1)
        if x.size != view.size:
            raise EmulatorError(f"{where}: writing {x.size} values into a {view.size}-value range")
        view[:] = x.astype(view.dtype)


def _windows_ok(f, where):
    for k in ("stride_h", "stride_w", "dilation_h", "dilation_w", "filter_h", "filter_w"):
        if k in f and f[k] < 1:
            raise EmulatorError(f"{where}: {k} = {f[k]} (must be at least 1)")


def _io(ctx, f, where, shape=None):
    x = ctx.read(f["input"], where)
    return x.reshape(shape) if shape is not None else x


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
    y = ys[0][None] if len(ys) == 1 else np.stack(ys)   # one batch: a view, not a copy
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
    # device kernel (kernels/riscv/neutral_kernels.h, docs/kmodel-format.md#v4-interpreter): inv = 1.f / scale,
    # zero = -zp * inv, out = (float)q * inv + zero, every step in float32
    inv = f32(1) / f32(scale)
    with np.errstate(all="ignore"):
        out = q.astype(f32) * inv + f32(-zp) * inv
    ctx.write(f["output"], out, where)
    return out


def _to_u8(v):
    """std::clamp of the int32 result to 0..255; NaN (fcvt.w.s gives INT32_MAX) -> 255."""
    return np.where(np.isnan(v), 255, np.clip(np.nan_to_num(v), 0, 255)).astype(np.uint8)


@op("quantize")
def quantize(node, f, ctx, where):
    zp, scale = f["quant_param"]
    x = ctx.read(f["input"], where)
    with np.errstate(all="ignore"):
        v = x.astype(f32) * f32(scale) + f32(zp)
    # device kernel (docs/kmodel-format.md#v4-interpreter): pairs by fcvt.w.s rne (half to even), an odd last value by
    # roundf (half away from zero)
    q = np.rint(v)
    if v.size % 2:
        last = float(v[-1])
        q[-1] = np.copysign(np.floor(abs(last) + 0.5), last)   # exact in float64
    out = _to_u8(q)
    ctx.write(f["output"], out, where)
    return out


def _put(ctx, f, out, where, key="output"):
    ctx.write(f[key], out, where)
    return out


@op("transpose")
def transpose(node, f, ctx, where):
    return _put(ctx, f, np.ascontiguousarray(_io(ctx, f, where, f["in_shape"]).transpose(f["perm"])), where)


@op("pad")
def pad(node, f, ctx, where):
    x = _io(ctx, f, where, f["in_shape"])
    value = np.frombuffer(f["pad_value"][1], "<f4")[0]  # stored as f32 even for u8 tensors
    if x.dtype == np.uint8:
        value = np.uint8(int(value) & 0xFF) if np.isfinite(value) else np.uint8(0)
    return _put(ctx, f, N.pad(x, f["paddings"], value), where)


@op("memory_copy")
def memory_copy(node, f, ctx, where):
    return _put(ctx, f, ctx.read(f["input"], where), where)


@op("softmax")
def softmax(node, f, ctx, where):
    outer, inner, beta = f["outer_size"], f["inner_size"], f["beta"]
    if not fmt.overlap(f["input"], f["output"]):
        x = ctx.read(f["input"], where).reshape(outer, inner)
        return _put(ctx, f, N.softmax(x, beta), where)
    return _softmax_aliased(ctx, f, outer, inner, beta, where)


def _softmax_aliased(ctx, f, outer, inner, beta, where):
    """The kernel's loop on live memory when the output overlaps the input
    (docs/kmodel-format.md#v4-interpreter): row by row, max of the row as it is now, then value
    i = expf((src[i] - max) * beta) written to dest[i] before src[i + 1] is read, then dest /= sum.
    Values are computed `step` at a time: as many as can be read before the first write lands on a value still to be read."""
    (buf, src, n_in), (_, dst, n_out) = ctx.span(f["input"], where), ctx.span(f["output"], where)
    if min(n_in, n_out) < 4 * outer * inner:
        raise EmulatorError(f"{where}: a {outer}x{inner} softmax on ranges smaller than its values")
    delta = dst - src
    step = inner if delta <= 0 or delta >= 4 * inner else max(1, delta // 4)
    view = lambda a, n: buf[a:a + 4 * n].view(f32)  # noqa: E731  (unaligned views are fine)
    for r in range(outer if inner else 0):
        s, d = src + 4 * r * inner, dst + 4 * r * inner
        m = N.row_max(view(s, inner).copy()[None])[0, 0]
        total = f32(0)
        for i in range(0, inner, step):
            n = min(step, inner - i)
            e = N.softmax_exp(view(s + 4 * i, n).copy(), m, beta)
            total = np.cumsum(np.concatenate([[total], e]).astype(f32), dtype=f32)[-1]
            view(d + 4 * i, n)[:] = e
        with np.errstate(all="ignore"):
            view(d, inner)[:] = view(d, inner) / total
    return ctx.read(f["output"], where)


@op("binary")
def binary(node, f, ctx, where):
    a = ctx.read(f["input_a"], where).reshape(f["in_a_shape"])
    b = ctx.read(f["input_b"], where).reshape(f["in_b_shape"])
    out = N.binary(a, b, fmt.BINARY_OPS[f["binary_op"]], f["out_shape"], f["fused_activation"])
    return _put(ctx, f, out, where)


@op("quantized_binary")
def quantized_binary(node, f, ctx, where):
    a = ctx.read(f["input_a"], where).reshape(f["in_a_shape"])
    b = ctx.read(f["input_b"], where).reshape(f["in_b_shape"])
    out = N.quantized_binary(a, b, fmt.BINARY_OPS[f["binary_op"]], f["out_shape"], f)
    return _put(ctx, f, out, where)


@op("unary")
def unary(node, f, ctx, where):
    return _put(ctx, f, N.unary(ctx.read(f["input"], where), fmt.UNARY_OPS[f["unary_op"]]), where)


@op("nnil_unary_method")
def nnil_unary_method(node, f, ctx, where):
    try:
        out = N.nnil(node.data["code"], ctx.read(f["input"], where))
    except N.NnilError as exc:
        raise EmulatorError(f"{where}: {exc}") from None
    if out is None:  # the code never reaches ret: the runtime writes nothing
        return ctx.read(f["output"], where)
    return _put(ctx, f, out, where)


@op("table_lookup1d")
def table_lookup1d(node, f, ctx, where):
    table = ctx.read(f["table"], where).view(np.uint8)
    x = ctx.read(f["input"], where)
    if x.size and int(x.max()) >= table.size:
        raise EmulatorError(f"{where}: a {table.size}-entry table indexed with {int(x.max())}")
    return _put(ctx, f, table[x], where)


@op("concat")
def concat(node, f, ctx, where):
    # each input holds outer x (dims[i] * inner_size) bytes (docs/kmodel-format.md#v4-opcodes: concat)
    outer = f["outer_size"]
    parts = [ctx._mem(r, where).view(np.uint8).reshape(outer, -1) for r in node.data["inputs"]]
    out = np.concatenate(parts, axis=1)
    ctx._mem(f["output"], where).view(np.uint8)[:] = out.reshape(-1)
    return out


@op("strided_slice")
def strided_slice(node, f, ctx, where):
    x = _io(ctx, f, where, f["in_shape"])
    return _put(ctx, f, N.strided_slice(x, f["begin"], f["end"], f["strides"]), where)


@op("resize_image")
def resize_image(node, f, ctx, where):
    x = _io(ctx, f, where, f["in_shape"])
    mode = ("bilinear", "nearest_neighbor")[f["mode"]] if f["mode"] in (0, 1) else None
    if mode is None:
        raise EmulatorError(f"{where}: unknown resize mode {f['mode']}")
    return _put(ctx, f, N.resize(x, f["out_h"], f["out_w"], mode, f["align_corners"]), where)


@op("reduce")
def reduce(node, f, ctx, where):
    x = _io(ctx, f, where, f["in_shape"]).astype(f32)
    out_shape = tuple(f["out_shape"])
    if any(o not in (1, i) for o, i in zip(out_shape, f["in_shape"])):
        raise EmulatorError(f"{where}: out_shape {out_shape} is not a reduction of {f['in_shape']}")
    return _put(ctx, f, N.reduce(x, fmt.REDUCE_OPS[f["reduce_op"]], out_shape, f["init_value"]), where)


@op("reduce_window2d", "cpu_reduce_window2d")
def reduce_window2d(node, f, ctx, where):
    _windows_ok(f, where)
    x = _io(ctx, f, where, f["in_shape"]).astype(f32)
    out = N.reduce_window2d(x, fmt.REDUCE_OPS[f["reduce_op"]], f, f["init_value"],
                            nhwc=node.name.startswith("cpu_"))
    return _put(ctx, f, out, where)


@op("conv2d")
def conv2d(node, f, ctx, where):
    _windows_ok(f, where)
    x = _io(ctx, f, where, f["in_shape"]).astype(f32)
    out = N.conv2d(x, node.data["weights"], node.data["bias"], f, f["out_channels"], f["fused_activation"])
    return _put(ctx, f, out, where)


@op("cpu_conv2d", "cpu_depthwise_conv2d")
def cpu_conv2d(node, f, ctx, where):
    _windows_ok(f, where)
    x = _io(ctx, f, where, f["in_shape"]).astype(f32)
    dw = node.name == "cpu_depthwise_conv2d"
    out = N.conv2d_nhwc(x, node.data["weights"], node.data["bias"], f,
                        f["in_shape"][3] if dw else f["out_channels"], f["fused_activation"], dw)
    return _put(ctx, f, out, where)


@op("quantized_conv2d", "cpu_quantized_conv2d", "cpu_quantized_depthwise_conv2d")
def quantized_conv2d(node, f, ctx, where):
    _windows_ok(f, where)
    x = _io(ctx, f, where, f["in_shape"])
    nhwc = node.name.startswith("cpu_")
    dw = node.name == "cpu_quantized_depthwise_conv2d"
    oc = f["in_shape"][3] if dw else f["out_channels"]
    out = N.quantized_conv2d(x, node.data["weights"], node.data["bias"], f, oc, nhwc, dw)
    return _put(ctx, f, out, where)


@op("conv2d_transpose")
def conv2d_transpose(node, f, ctx, where):
    _windows_ok(f, where)
    x = _io(ctx, f, where, f["in_shape"]).astype(f32)
    out = N.conv2d_transpose(x, node.data["weights"], f, f["out_shape"], f["fused_activation"])
    return _put(ctx, f, out, where)


@op("matmul")
def matmul(node, f, ctx, where):
    r, k, n = f["a_rows"], f["a_cols"], f["b_cols"]
    a = ctx.read(f["input_a"], where).reshape(r, k)
    b = ctx.read(f["input_b"], where).reshape(k, n)
    return _put(ctx, f, N.matmul(a, b, node.data["bias"], f["fused_activation"]), where)


@op("quantized_matmul")
def quantized_matmul(node, f, ctx, where):
    r, k, n = f["a_rows"], f["a_cols"], f["b_cols"]
    a = ctx.read(f["input_a"], where).reshape(r, k)
    b = ctx.read(f["input_b"], where).reshape(k, n)
    return _put(ctx, f, N.quantized_matmul(a, b, node.data["bias"], f), where)


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

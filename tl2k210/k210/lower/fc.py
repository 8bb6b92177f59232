"""Dense layers: a 1x1 KPU conv on a 4x4-padded map (nncase v0.1's way) or float FULLY_CONNECTED.

The KPU is preferred; the float layer is chosen when the KPU cannot take the layer (over 1024
channels), when the layer reads the model's float input (the kmodel must then start with
FULLY_CONNECTED: a KPU dense layer would start it with QUANTIZE, which MaixPy and the SDK
refuse), when `--float-fc` asks for it, or when its input is already float and the cost model
prices the float layer cheaper than quantize + pad + KPU conv + unpad (not in a quantized model,
whose dense layer on the KPU rounds as TFLite does).
"""
from __future__ import annotations

import numpy as np

from tl2k210.graph import RELABELS, stage_names
from tl2k210.k210 import cost, hardware as hw

from . import kpu, registry
from .conv import dense_matrix, is_dense
from .registry import CPU_F32, KPU, NA, lowering
from .state import Loc
from .v4emit import F32, Const, float_clamp, main

FC_ACTS = {None: 0, "Relu": 1}


def source_unit(g, t, opts):
    """'input' if t is (a relabelling of) the model input, else the unit of its producer."""
    while True:
        if t in g.inputs:
            return "input"
        p = g.producer(t)
        if p is None:
            return None
        unit = registry.select(g, p, opts, getattr(opts, "format", "v3"))[0].unit
        if unit != registry.RELABEL:
            return unit
        t = p.inputs[0]


#: ops that only move bytes, through which a concat's inputs still reach a model output as they are
#: (a detector's heads concatenated per level, then across levels, then transposed)
CONCAT_MOVES = ("Concat", "Transpose")


def feeds_output(g, t, through=()):
    """Is t a model output, or relabelled into one (graph.RELABELS, and the ops `through`)?"""
    while True:
        if t in g.outputs:
            return True
        cons = g.consumers(t)
        if len(cons) != 1 or cons[0].op not in RELABELS + tuple(through):
            return False
        t = cons[0].outputs[0]


def dense_cycles(ci, co, weight_bits):
    """(KPU path, float path) cycle estimates of a dense layer (cost model constants)."""
    c = cost.CPU_CYCLES
    conv = (hw.LIMITS["out_min"] ** 2 * ci * co / cost.KPU_MACS_PER_CYCLE + cost.KPU_LAYER_OVERHEAD
            + ci * co * weight_bits // 8 / cost.DMA_BYTES_PER_CYCLE + hw.LIMITS["out_min"] ** 2 * co / cost.DMA_BYTES_PER_CYCLE)
    kpu_path = c["elem"] * ci + c["copy"] * ci + conv + c["elem"] * co
    return int(kpu_path), c["mac"] * ci * co


def kpu_fc_refuses(g, node, opts):
    if not is_dense(g, node):
        return NA
    ci, co = g.shape(node.inputs[0])[1], g.shape(node.outputs[0])[1]
    cmax = hw.LIMITS["channels"][1]
    if max(ci, co) > cmax:
        return f"{ci}->{co} features: the KPU allows {cmax} channels"
    if opts.float_fc:
        return "--float-fc asks for float dense layers"
    src = source_unit(g, node.inputs[0], opts)
    if src == "input" and getattr(opts, "format", "v3") != "v4":     # (kmodel v4 starts with any node)
        return ("it reads the model's float input: a KPU dense layer would start the kmodel with "
                "QUANTIZE, and MaixPy and the SDK need K210_CONV or FULLY_CONNECTED first in kmodel v3")
    # a quantized model's dense layer on the KPU gives TFLite's bytes (kpu.exact_requantize)
    if src == CPU_F32 and not g.meta.get("quant_ranges") and float_fc_refuses(g, node, opts) is None:
        k, f = dense_cycles(ci, co, opts.weight_bits)
        if f <= k:
            return (f"its input is float and the float layer is cheaper ({f:,} vs {k:,} cycles "
                    "for quantize + pad + KPU conv + unpad)")
    return None


def dense_rows(g, node):
    """How many vectors a MatMul / Gemm with constant weights multiplies (its input's leading dims)."""
    shape = g.shape(node.inputs[0]) if g.tensors[node.inputs[0]].shape is not None else None
    return int(np.prod(shape[:-1], dtype=np.int64)) if shape else 1


def float_fc_refuses(g, node, opts):
    if node.op == "Conv":
        if not is_dense(g, node):
            return NA
    else:
        W = g.const(node.inputs[1])
        if W is None or g.const(node.inputs[0]) is not None:
            return f"{node.op} of two activations has no v3 layer (only constant weights)"
        if dense_rows(g, node) > 1:
            return f"{dense_rows(g, node)} rows: FULLY_CONNECTED multiplies one vector"
        a = node.attrs
        if node.op == "Gemm" and (a.get("transA", 0) or a.get("alpha", 1.0) != 1.0 or a.get("beta", 1.0) != 1.0):
            return f"Gemm {a}: only transB and a bias"
    act = node.attrs.get("activation")
    op = act["op"] if act else None
    if op not in FC_ACTS and op != "Sigmoid" and not _relu6(act) and not _v4_clip(act, opts):
        return (f"activation {op} after a float dense layer has no v3 CPU layer; use Relu, Relu6 or Sigmoid"
                + (" (kmodel v4 fuses any Clip)" if op == "Clip" else ""))
    return None


def _v4_clip(act, opts) -> bool:
    """A Clip other than ReLU6 (an int8 model's ReLU6 at its grid's top, 5.78) on a v4 plan: its
    matmul clamps to any (min, max)."""
    return bool(act) and act["op"] == "Clip" and getattr(opts, "format", "v3") == "v4" and not _relu6(act)


def _relu6(act):
    return bool(act) and act["op"] == "Clip" and act.get("min", None) == 0 and act.get("max") == 6


@lowering("Conv", unit=KPU, check=kpu_fc_refuses, name="kpu_dense")
def kpu_dense(lw, node):
    """The vector is padded into pixel (0,0) of a 4x4 map per channel (K210_ADD_PADDING), a 1x1
    conv runs, and K210_REMOVE_PADDING reads pixel (0,0) of each output channel back."""
    x, w_name, b_name = node.inputs
    out = node.outputs[0]
    st = stage_names(node)
    W = dense_matrix(np.asarray(lw.g.tensors[w_name].value, np.float64), node.attrs.get("group", 1))
    B = np.asarray(lw.g.tensors[b_name].value, np.float64)
    co, ci = W.shape
    row = lw.row(node, "dense layer: 1x1 KPU conv on a 4x4-padded map (ADD_PADDING, conv, REMOVE_PADDING)",
                 in_shape=(ci,), out_shape=(co,))
    src = lw.need_u8(x, row)
    s_x, z_x = lw.locs[x].quant
    mean = lw.opts.channel_means.get(x)
    pad_map = (ci, hw.LIMITS["out_min"], hw.LIMITS["out_min"])
    lines = hw.map_lines(*pad_map)
    pad = Loc(pad_map)
    start = lw.kpu_alloc(pad, f"{out}:padded", lines, f"node {node.name!r}: padded input")
    lw.emit("K210_ADD_PADDING", dict(flags=0, main_mem_in_address=src, kpu_mem_out_address=start,
                                     channels=ci), row)
    lq = kpu.quantize_layer(W.reshape(co, ci, 1, 1) * s_x, B, None if mean is None else mean / s_x, z_x, 1,
                            lw.rng(st["conv"]), lw.rng(st["act"]), node.attrs.get("activation"),
                            lw.opts.weight_bits, row,
                            lw.quantized_model and lw.int8_rounding)
    conv, quant = kpu.tile_conv(lq, (0, ci), (0, co), pad_map, 0, False, node.name), lq.out_quant
    res = Loc(conv.out_shape)
    dst = lw.kpu_alloc(res, f"{out}:padded_out", kpu.out_lines(conv), f"node {node.name!r}: output",
                       keep=(pad.block,))
    kpu.place(conv, start, dst)
    padded = lw.alloc(out + ":pad", "u8", co * hw.LIMITS["out_min"] ** 2)
    idx = lw.emit("K210_CONV", dict(flags=1, main_mem_out_address=padded), row, conv=conv)
    lw.kpu_free(pad)
    lw.kpu_free(res)
    loc = lw.u8_out(out, quant)
    lw.emit("K210_REMOVE_PADDING", dict(flags=1, main_mem_in_address=padded,
                                        main_mem_out_address=loc.u8, channels=co), row)
    lw.main.free(f"{out}:pad:u8")
    lw.traced(out, "u8")
    row.macs, row.kpu_lines = conv.macs, lines + kpu.out_lines(conv)
    row.weight_bytes = lw.share_blocks(idx)


@lowering("Conv", unit=CPU_F32, check=float_fc_refuses, name="float_dense")
def float_dense(lw, node):
    _float_fc(lw, node)


@lowering("Gemm", "MatMul", unit=CPU_F32, check=float_fc_refuses, name="float_dense")
def float_gemm(lw, node):
    """A dense layer the KPU cannot take (matmul_to_conv kept it: over 1024 features)."""
    W = np.asarray(lw.g.tensors[node.inputs[1]].value, np.float32)
    if node.op == "Gemm":
        W = W if node.attrs.get("transB", 0) else W.T
    else:
        W = W.T
    bias = np.zeros(W.shape[0], np.float32)
    if len(node.inputs) > 2 and node.inputs[2]:
        bias = np.broadcast_to(np.asarray(lw.g.tensors[node.inputs[2]].value, np.float32), bias.shape)
    _float_fc(lw, node, W, bias)


def _float_fc(lw, node, W=None, B=None):
    x, out = node.inputs[0], node.outputs[0]
    if W is None:
        W = dense_matrix(np.asarray(lw.g.tensors[node.inputs[1]].value, np.float32), node.attrs.get("group", 1))
        B = np.asarray(lw.g.tensors[node.inputs[2]].value, np.float32)
    co = W.shape[0]
    W = W.reshape(co, -1)
    act = node.attrs.get("activation")
    op = act["op"] if act else None
    code = 2 if _relu6(act) else FC_ACTS.get(op)
    row = lw.row(node, "float FULLY_CONNECTED", in_shape=lw.shape(x), out_shape=(co,),
                 macs=W.size, weight_bytes=4 * (W.size + co))
    src = lw.need_f32(x, row)
    if op == "Clip" and not _relu6(act) and lw.format == "v4":      # the v4 matmul's clamp (_v4_clip)
        loc = lw.f32_out(out, lw.shape(out) if len(lw.shape(out)) else (co,))
        lw.emit_v4("matmul", dict(input_a=main(F32, src, W.shape[1]), input_b=Const(np.ascontiguousarray(W.T, np.float32)),
                                  output=main(F32, loc.f32, co), a_rows=1, a_cols=W.shape[1], b_cols=co,
                                  fused_activation=float_clamp(act)), row, data={"bias": np.asarray(B, np.float32)})
        lw.traced(out, "f32")
        return
    shift = _softmax_shift(lw, out) if code == 0 else 0.0
    if shift:
        B = np.asarray(B, np.float32) + np.float32(shift)
        row.notes.append(f"logits {shift:+.4g}, none negative, for the SDK's SOFTMAX (its max starts at FLT_MIN; "
                         "softmax ignores a shift)")
    # v3's LOGISTIC may run in place; a v4 op never writes over its input (docs/kmodel-format.md#v4-interpreter)
    pre = lw.alloc(out, "pre", 4 * co) if code is None and lw.format == "v4" else None
    loc = lw.f32_out(out, lw.shape(out) if len(lw.shape(out)) else (co,))
    lw.emit("FULLY_CONNECTED", dict(flags=0, main_mem_in_address=src, main_mem_out_address=loc.f32 if pre is None
                                    else pre, in_channels=W.shape[1], out_channels=co, act=code or 0),
            row, data={"weights": W, "bias": B})
    if not shift:      # (shifted logits are no trace of the float model's)
        lw.traced(out, "f32")
    if code is None:   # Sigmoid (float_fc_refuses let nothing else through)
        lw.emit("LOGISTIC", dict(flags=0, main_mem_in_address=loc.f32 if pre is None else pre,
                                 main_mem_out_address=loc.f32, channels=co), row)
        lw.traced(out, "f32")
        lw.main.free(f"{out}:pre")


#: logits below which the SDK's SOFTMAX may meet a sample whose every value is under -87 (exp
#: underflows to 0 in float32 once the max subtracted is FLT_MIN's ~0, not the logits' own); uint8
#: logits never fall below their calibrated minimum
SOFTMAX_LOW = -64.0


def _softmax_shift(lw, out) -> float:
    """What float logits `out` take on, minus their calibrated minimum, where their one reader
    (through relabels) is kmodel v3's SOFTMAX and they reach below SOFTMAX_LOW (cpu.softmax); else 0."""
    t, readers = out, lw.consumers(out)
    while len(readers) == 1 and readers[0].op in RELABELS and t not in lw.g.outputs:
        t = readers[0].outputs[0]
        readers = lw.consumers(t)
    if lw.format != "v3" or len(readers) != 1 or readers[0].op != "Softmax" or t in lw.g.outputs:
        return 0.0
    lo = lw.rng(out)[0]
    return -float(lo) if lo < SOFTMAX_LOW else 0.0


def logistic(lw, src, dst, row, node=None):
    """LOGISTIC of src's float copy into dst's; over src where `node` is its last reader (the
    loop reads each value once, to write its own index: kmodel.v3/v4 IN_PLACE)."""
    n = int(np.prod(lw.locs[src].shape))
    a = lw.locs[src].f32
    out = ((node is not None and lw.in_place(node, dst, src, kind="f32")) or
           lw.f32_out(dst, lw.locs[src].shape)).f32
    if out == a:
        row.notes.append("written over its input (its last reader)")
    lw.emit("LOGISTIC", dict(flags=0, main_mem_in_address=a, main_mem_out_address=out, channels=n), row)
    lw.traced(dst, "f32")

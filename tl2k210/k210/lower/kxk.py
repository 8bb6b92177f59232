"""K x K convs (5x5, 7x7, ..., and dilated 3x3) exactly on the KPU's 3x3 kernel.

A conv with K = 2R+1 reads input offsets u in [-R, R]^2. R-1 one-hot 3x3 "copy" stages build a
map holding every input channel shifted by each offset d in [-(R-1), R-1]^2 (stage r adds one
step t in {-1, 0, 1}^2 per axis: t = sign(d) where |d| = r, else 0), then one 3x3 conv reads
that map with the re-indexed weights: tap u is offset d = u - t at step t (t = sign(u) where
|u| = R). Off-map taps read the pad value, and a step leaves the map only when the whole offset
does, so this is exact: the copies are byte for byte (ACC = the picked byte, BN x1, identity
table, the input's quantization) and the last stage computes the K x K conv's accumulator with
its per-channel weights. Channels are grouped per input channel, so every stage is a group conv
(depthwise K x K stays grouped: 9 or 25 inputs per output); conv.py tiles each stage, choosing
the tile size by the cost model, and keeps the intermediate maps in KPU RAM when they fit.
"""
from __future__ import annotations

import numpy as np

from tl2k210.graph import Node
from tl2k210.k210 import hardware as hw

from . import kpu
from .conv import describe, emit_layer, geometry, input_terms, is_dense, kpu_conv_refuses, plan_for, quantize_conv
from .registry import KPU, NA, lowering


def _effective_kernel(a):
    k, d = tuple(a["kernel"]), tuple(a.get("dilations", (1, 1)))
    return (k[0] - 1) * d[0] + 1, k, d


def kxk_refuses(g, node, opts):
    if is_dense(g, node):
        return NA
    a = node.attrs
    K, k, d = _effective_kernel(a)
    if k in ((1, 1), (3, 3)) and d == (1, 1):
        return NA                            # kpu_conv's
    if k[0] != k[1] or d[0] != d[1]:
        return f"kernel {k} dilations {d}: only square kernels and equal dilations are decomposed"
    if K % 2 == 0:
        return f"kernel {k}: an even kernel has no centre tap; the KPU runs odd kernels (pad the weights)"
    R = K // 2
    _, ci, h, w = g.shape(node.inputs[0])
    grp = a.get("group", 1)
    per = (2 * R - 1) ** 2
    cmax = hw.LIMITS["channels"][1]
    if grp == 1 and ci * per > cmax:
        return (f"a {K}x{K} kernel on {ci} channels reads {ci * per} shifted channels; the KPU reads "
                f"{cmax}: at most {cmax // per} input channels (or a depthwise/group conv)")
    if any(p > R or p < 0 for p in a["pads"]):
        return f"pads {a['pads']} exceed the kernel's {R}-pixel border"
    shadow = Node("Conv", node.inputs, node.outputs, {**a, "kernel": (3, 3), "dilations": (1, 1),
                                                     "pads": [1, 1, 1, 1]}, node.name)
    return kpu_conv_refuses(g, shadow, opts)


def _offsets(r):
    return [(dy, dx) for dy in range(-r, r + 1) for dx in range(-r, r + 1)]


def _step(v, r):
    return int(np.sign(v)) if abs(v) == r else 0


@lowering("Conv", unit=KPU, check=kxk_refuses, name="kpu_conv_kxk")
def kpu_conv_kxk(lw, node):
    a = node.attrs
    x, out = node.inputs[0], node.outputs[0]
    K, k, d = _effective_kernel(a)
    R = K // 2
    ci, h, w = lw.shape(x)
    grp = a.get("group", 1)
    W = np.asarray(lw.g.tensors[node.inputs[1]].value, np.float64)
    co, m = W.shape[:2]
    if d != (1, 1):      # a dilated kernel is a K x K kernel with zeros between the taps
        We = np.zeros((co, m, K, K))
        We[:, :, ::d[0], ::d[1]] = W
        W = We
    B = np.asarray(lw.g.tensors[node.inputs[2]].value, np.float64)
    row = lw.row(node, "", in_shape=(ci, h, w), out_shape=lw.shape(out))
    sc, _, z_x, _ = input_terms(lw, x, ci)
    quant = (float(sc[0]), z_x) if x != lw.pixel_input and x not in lw.pixel_copy else (None, z_x)
    pixels = lw.pixel_copy.get(x, np.arange(ci) if x == lw.pixel_input else None)
    base = dict(kernel=(3, 3), strides=(1, 1), pads=[1, 1, 1, 1], dilations=(1, 1))
    stages, src, prev = [], x, [(0, 0)]
    for r in range(1, R):                   # copy stages: offsets grow by one pixel each
        offs = _offsets(r)
        onehot = np.zeros((ci * len(offs), len(prev), 3, 3), np.uint8)
        for j, (dy, dx) in enumerate(offs):
            ty, tx = _step(dy, r), _step(dx, r)
            onehot[j::len(offs), prev.index((dy - ty, dx - tx)), ty + 1, tx + 1] = 1
        z = f"{out}:shift{r}"
        lw.virtual_shapes[z] = (ci * len(offs), h, w)
        if pixels is not None:
            lw.pixel_copy[z] = np.repeat(pixels, len(offs))
        stages.append((Node("Conv", [src], [z], {**base, "group": ci}, f"{node.name}/shift{r}"),
                       kpu.copy_layer(onehot, quant, lw.opts.weight_bits, ci)))
        src, prev = z, offs
    per = len(prev)
    W2 = np.zeros((co, m * per, 3, 3))
    for uy in range(-R, R + 1):
        for ux in range(-R, R + 1):
            ty, tx = _step(uy, R), _step(ux, R)
            j = prev.index((uy - ty, ux - tx))
            W2[:, j::per, ty + 1, tx + 1] = W[:, :, uy + R, ux + R]
    final = Node("Conv", [src, node.inputs[1], node.inputs[2]], [out],
                 {**a, **base, "group": grp, "pick": (R - a["pads"][0], R - a["pads"][1], a["strides"][0])},
                 node.name, list(node.fused))
    for (prev_node, _), (nxt, _) in zip(stages, stages[1:] + [(final, None)]):
        lw.virtual_next[prev_node.outputs[0]] = nxt
    for stage, lq in stages:
        emit_layer(lw, stage, geometry(lw, stage), plan_for(lw, stage), lq, row)
        _drop(lw, stage.inputs[0])
    geo = geometry(lw, final)
    lq = quantize_conv(lw, final, geo, W2, B, row)
    emit_layer(lw, final, geo, plan_for(lw, final), lq, row)
    _drop(lw, src)
    row.why = (f" as {R} KPU stages ({R - 1} exact one-hot 3x3 shift stage{'s' if R > 2 else ''} to "
               f"{ci * per} channels, then a 3x3 conv with re-indexed weights)")
    describe(row, geo, plan_for(lw, final), k=K)
    for stage, _ in stages:
        p = plan_for(lw, stage)
        if p.why:
            row.notes.append(f"{stage.name}: {p.why}")
    if d != (1, 1):
        row.notes.append(f"dilation {d}: a {K}x{K} kernel with zeros between the taps")


def _drop(lw, t):
    """A stage's input, read by nobody else, leaves KPU RAM and main memory."""
    if t not in lw.virtual_shapes:
        return
    loc = lw.locs.get(t)
    if loc is not None:
        lw.kpu_free(loc)
        lw.main.free(f"{t}:u8")

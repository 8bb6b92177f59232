"""Conv on the KPU: one K210_CONV per IR Conv, keeping the float semantics.

Stride 2 and unusual paddings run the KPU conv at stride 1 and pick the wanted pixels: the KPU's
pick pools when the phase allows, the next 1x1 conv's pick for a depthwise conv, else a 1x1
QUANTIZED_MAX_POOL2D on the CPU; the receipt says what that cost.
"""
from __future__ import annotations

import numpy as np

from tl2k210.errors import UnsupportedOpError
from tl2k210.graph import stage_names
from tl2k210.k210 import hardware as hw

from . import kpu
from .registry import KPU, NA, lowering
from .state import Loc


def _dims(g, node):
    _, ci, h, w = g.shape(node.inputs[0])
    return ci, h, w, g.shape(node.outputs[0])[1]


def is_dense(g, node):
    """A 1x1 conv on a 1x1 map: a dense layer."""
    s = g.shape(node.inputs[0])
    return len(s) == 4 and tuple(s[2:]) == (1, 1) and tuple(node.attrs["kernel"]) == (1, 1)


def kpu_conv_refuses(g, node, opts):
    """Why the KPU cannot run this Conv as one layer (None if it can)."""
    a = node.attrs
    if is_dense(g, node):
        return NA     # a dense layer (fc.py)
    ci, h, w, co = _dims(g, node)
    k = tuple(a["kernel"])
    if k not in ((1, 1), (3, 3)):
        return f"kernel {k}: the KPU runs 1x1 and 3x3 only; split it into 3x3 convs"
    if tuple(a.get("dilations", (1, 1))) != (1, 1):
        return f"dilations {tuple(a['dilations'])}: the KPU has no dilated conv; use dilation 1"
    grp = a.get("group", 1)
    if grp != 1 and not (grp == ci == co):
        return f"group {grp}: the KPU runs normal (group 1) or depthwise (group = channels) convs"
    if any(p > k[0] // 2 for p in a["pads"]) or any(p < 0 for p in a["pads"]):
        return f"pads {a['pads']} exceed the KPU's {k[0] // 2}-pixel border"
    (wlo, whi), (hlo, hhi) = hw.LIMITS["in_w"], hw.LIMITS["in_h"]
    if not (wlo <= w <= whi and hlo <= h <= hhi):
        return f"input {w}x{h}: the KPU runs {wlo} <= W <= {whi}, {hlo} <= H <= {hhi} (nncase limit)"
    cmax = hw.LIMITS["channels"][1]
    if max(ci, co) > cmax:
        return f"{max(ci, co)} channels: the KPU allows {cmax}; split the layer"
    s = tuple(a["strides"])
    if any(v not in (1, 2) for v in s) or s[0] != s[1]:
        return f"strides {s}: only equal strides 1 and 2 are lowered"
    if a.get("pool") and kpu.pool_code(a["pool"]) is None and not _cpu_pool_ok(a["pool"]):
        return f"pool {a['pool']} has no KPU code and no uint8 CPU layer"
    return None


def _cpu_pool_ok(pool):
    return pool["kind"] == "max"


def _pick(node):
    """(row_offset, col_offset, stride) of the wanted pixels in the KPU stride-1 output."""
    a = node.attrs
    k = a["kernel"][0]
    return (k // 2 - a["pads"][0], k // 2 - a["pads"][1], a["strides"][0])


@lowering("Conv", unit=KPU, check=kpu_conv_refuses, name="kpu_conv")
def kpu_conv(lw, node):
    a = node.attrs
    x, w_name, b_name = node.inputs
    out = node.outputs[0]
    ci, h, w = lw.shape(x)
    if node.name in lw.pending_pick and x in lw.locs:
        ci, h, w = lw.locs[x].shape   # the stride-1 map of the depthwise conv before
    co = lw.shape(out)[0]
    depthwise = a.get("group", 1) == ci and ci > 1
    k = a["kernel"][0]
    st = stage_names(node)
    row = lw.row(node, "", in_shape=(ci, h, w))
    W = np.asarray(lw.g.tensors[w_name].value, np.float64)
    B = np.asarray(lw.g.tensors[b_name].value, np.float64)
    # --- input: fold its scale(s) into the weights so the KPU sees W'·(q − z_x)
    xloc = lw.locs[x]
    mean = lw.opts.channel_means.get(x)
    ch = (slice(None), None, None, None) if depthwise else (None, slice(None), None, None)
    keep = ()
    if x == lw.pixel_input:
        sc = np.resize(np.asarray(lw.opts.input_scale, np.float64), ci)
        of = np.resize(np.asarray(lw.opts.input_offset, np.float64), ci)
        z_x = int(np.clip(round(float(np.mean(-of / sc))), 0, np.iinfo(np.uint8).max))
        resid = of + sc * z_x                       # x = sc·(q − z_x) + resid
        B = B + (W.sum(axis=(2, 3)) * (resid[:, None] if depthwise else resid[None, :])).sum(axis=1)
        W = W * sc[ch]
        e = None if mean is None else (mean - resid) / sc     # E[q − z_x] per channel
        lines = hw.map_lines(ci, h, w)
        lw.kpu_alloc(xloc, f"{x}:kpu", lines, f"node {node.name!r}: input image {ci}x{h}x{w}")
        in_range = xloc.kpu
        row.notes.append(f"input: pixels, preprocessing folded into weights (pad value {z_x})")
    else:
        in_range = lw.need_kpu(x, row)          # may quantize a float input first
        s_in, z_x = xloc.quant
        W = W * s_in
        e = None if mean is None else mean / s_in
    keep = (xloc.block,)
    # --- pick pixels for stride 2 / unusual pads; pool codes
    dy, dx, s = _pick(node)
    pool = a.get("pool")
    code, cpu_pick, cpu_pool, pick_next = 0, None, None, False
    left_top, right_top = (next(p.code for p in hw.POOLS if p.kind == "pick" and p.stride == 2 and p.pick == d)
                           for d in ((0, 0), (0, 1)))
    if (dy, dx, s) != (0, 0, 1):
        if s == 2 and dy == 0 and dx in (0, 1) and not depthwise:
            code = left_top if dx == 0 else right_top
        elif s == 2 and dy == 0 and dx == 0 and depthwise and _next_pw_takes_pick(lw, node):
            pick_next = True
        else:
            cpu_pick = (dy, dx, s)
        if pool:
            cpu_pool = pool
    elif pool:
        if depthwise:
            cpu_pool = pool
        else:
            code = kpu.pool_code(pool)
            if code is None:
                raise UnsupportedOpError(f"node {node.name!r}: pool {pool} has no KPU code")
    if node.name in lw.pending_pick:
        lw.pending_pick.discard(node.name)
        if code or cpu_pick or cpu_pool:
            raise AssertionError("pick moved onto a conv that already pools")
        code = left_top
    conv, (s_z, z_z) = kpu.build_conv(
        W, B, e, z_x, (ci, h, w), code, depthwise, lw.rng(st["conv"]), lw.rng(st["act"]),
        a.get("activation"), lw.opts.weight_bits, node.name, row)
    co, ph, pw = conv.out_shape
    tensor = out if not (cpu_pick or cpu_pool) else out + ":kpu"
    loc = Loc((co, ph, pw), quant=(s_z, z_z))
    lw.locs[tensor] = loc
    dst = lw.kpu_alloc(loc, f"{tensor}:kpu", kpu.out_lines(conv),
                       f"node {node.name!r}: output map {co}x{ph}x{pw} (input {ci}x{h}x{w} resident)", keep)
    kpu.place(conv, in_range[0], dst)
    stream = cpu_pick or cpu_pool or _needs_main(lw, out)
    if stream:
        loc.u8 = lw.alloc(tensor, "u8", co * ph * pw)
    idx = lw.emit("K210_CONV", dict(flags=1 if stream else 0, main_mem_out_address=loc.u8 or 0), row, conv=conv)
    lw.trace_map[tensor] = (idx, "kpu")
    row.macs = conv.macs
    row.weight_bytes = len(conv.weight_bytes()) + 8 * co + hw.ACT_TABLE_BYTES
    row.kpu_lines = (in_range[1] - in_range[0]) + kpu.out_lines(conv)
    row.out_shape = lw.shape(out)
    kind = "depthwise " if depthwise else ""
    row.why = f"{kind}conv{k}x{k}" + (f" + {hw.POOL[code].name}" if code else "")
    if x == lw.pixel_input:
        lw.kpu_free(xloc)      # the image is read once
    if pick_next:
        lw.pending_pick.add(lw.consumers(out)[0].name)
        row.notes.append("stride 2 moved onto the next 1x1 conv (exact: pick commutes with it)")
    if cpu_pick:
        row.notes.append(f"stride {s} with pads {a['pads']}: KPU at stride 1 ({s * s}x the MACs), "
                         f"CPU picks rows from {dy}, columns from {dx}")
        cpu_pick_layer(lw, tensor, out, cpu_pick, None if cpu_pool else out, row)
        lw.main.free(f"{tensor}:u8")          # the full-resolution map is consumed
        lw.kpu_free(loc)
        if cpu_pool:
            cpu_pool_layer(lw, out + ":pick", out, cpu_pool, row)
            lw.main.free(f"{out}:pick:u8")
    elif cpu_pool:
        cpu_pool_layer(lw, tensor, out, cpu_pool, row)
        lw.main.free(f"{tensor}:u8")
        lw.kpu_free(loc)


def _next_pw_takes_pick(lw, node):
    cons = lw.consumers(node.outputs[0])
    if len(cons) != 1 or node.outputs[0] in lw.g.outputs:
        return False
    c = cons[0]
    return (c.op == "Conv" and lw.lowered_by(c) == "kpu_conv" and tuple(c.attrs["kernel"]) == (1, 1)
            and tuple(c.attrs["strides"]) == (1, 1) and c.attrs.get("group", 1) == 1 and not c.attrs.get("pool")
            and list(c.attrs["pads"]) == [0, 0, 0, 0])


def _needs_main(lw, t):
    """Must this conv output also stream to main memory? Yes unless its only consumer is a KPU
    conv emitted right after it (any conv in between could overwrite the map)."""
    cons = lw.consumers(t)
    if t in lw.g.outputs or len(cons) != 1:
        return True
    c = cons[0]
    if lw.lowered_by(c) != "kpu_conv":
        return True
    i = lw.order.index(lw.producer(t))
    nxt = next((n for n in lw.order[i + 1:] if n.op == "Conv"), None)
    return nxt is not c


def cpu_pick_layer(lw, src, dst, pick, final, row):
    """Every s-th pixel from (dy, dx): a 1x1 QUANTIZED_MAX_POOL2D with negative padding."""
    dy, dx, s = pick
    c, h, w = lw.locs[src].shape
    oc, oh, ow = lw.shape(dst) if final else (c, (h - dy + s - 1) // s, (w - dx + s - 1) // s)
    name = dst if final else dst + ":pick"
    loc = lw.u8_out(name, lw.locs[src].quant, (c, oh, ow))
    lw.emit("QUANTIZED_MAX_POOL2D", dict(
        flags=1, main_mem_in_address=lw.locs[src].u8, main_mem_out_address=loc.u8,
        in_shape=(w, h, c), out_shape=(ow, oh, c), kernel_width=1, kernel_height=1,
        stride_width=s, stride_height=s, padding_width=-dx, padding_height=-dy), row)
    lw.traced(name, "u8")


def cpu_pool_layer(lw, src, dst, pool, row):
    if pool["kind"] != "max":
        raise UnsupportedOpError(f"node {row.node!r}: average pooling after this conv would run "
                                 "in float on the CPU; not lowered yet")
    c, h, w = lw.locs[src].shape
    oc, oh, ow = lw.shape(dst)
    pads = pool.get("pads", [0, 0, 0, 0])
    loc = lw.u8_out(dst, lw.locs[src].quant, (c, oh, ow))
    lw.emit("QUANTIZED_MAX_POOL2D", dict(
        flags=1, main_mem_in_address=lw.locs[src].u8, main_mem_out_address=loc.u8,
        in_shape=(w, h, c), out_shape=(ow, oh, c), kernel_width=pool["size"],
        kernel_height=pool["size"], stride_width=pool["stride"], stride_height=pool["stride"],
        padding_width=pads[1], padding_height=pads[0]), row)
    lw.traced(dst, "u8")
    row.notes.append("max pool on the CPU (QUANTIZED_MAX_POOL2D)")

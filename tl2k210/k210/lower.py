"""IR → kmodel v3: KPU convs where the hardware can run them, SDK CPU layers for the rest.

Every IR node becomes one or more kmodel layers and a receipt row saying where it runs and why.
Tensors live in up to three places, materialised on demand: a uint8 map in KPU RAM (only from a
conv to the next conv), a dense CHW uint8 copy in main memory (KPU output streaming, CPU uint8
layers) and a float32 copy (float CPU layers, model outputs).

The float semantics of the graph are kept: stride-2 and unusual paddings run the KPU conv at
stride 1 and pick the wanted pixels (the KPU's pick pools when the phase allows, else a 1×1
QUANTIZED_MAX_POOL2D on the CPU), and the receipt says what that cost.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tl2k210.errors import KpuLimitError, UnsupportedOpError
from tl2k210.k210 import hardware as hw
from tl2k210.k210.kmodel import v3
from tl2k210.k210.kmodel.kpu import KpuConv
from tl2k210.k210.memory import KpuAllocator, MainAllocator
from tl2k210.quantize import fixed_point as fx

T = v3.TYPE_BY_NAME
POOL_CODES = {("max", 2, 2): 1, ("avg", 2, 2): 2, ("max", 4, 4): 3, ("avg", 4, 4): 4, ("max", 2, 1): 9}
FC_ACTS = {None: 0, "Relu": 1}


@dataclass
class Loc:
    shape: tuple                       # (C, H, W) or (N,)
    quant: tuple | None = None         # (scale, zero_point) of the uint8 forms
    kpu: tuple | None = None           # (start_line, end_line)
    u8: int | None = None
    f32: int | None = None


@dataclass
class Row:
    """One receipt line: an IR node and the kmodel layers it became."""
    node: str
    op: str
    unit: str
    why: str
    fused: list = field(default_factory=list)
    layers: list = field(default_factory=list)
    in_shape: tuple = ()
    out_shape: tuple = ()
    macs: int = 0
    weight_bytes: int = 0
    kpu_lines: int = 0
    notes: list = field(default_factory=list)
    tensor: str = ""        # the tensor this row produces (default: the node's output)


@dataclass
class Options:
    weight_bits: int = 8
    # preprocessing of the first (image) input: x_float = pixel * scale[c] + offset[c]
    input_scale: tuple = (1 / 255,)
    input_offset: tuple = (0.0,)
    channel_means: dict = field(default_factory=dict)   # tensor -> per-channel mean (bias correction)
    float_fc: bool = False      # dense layers as float FULLY_CONNECTED instead of the padded KPU conv


def _chw(shape):
    s = tuple(int(v) for v in shape)
    if len(s) == 4:
        return s[1:]
    if len(s) == 2:
        return (s[1],)
    return s[1:] if len(s) > 1 else s


class Lowering:
    def __init__(self, graph, ranges: dict, opts: Options | None = None):
        from tl2k210.graph import stage_names, toposort
        self.g, self.ranges, self.opts = graph, ranges, opts or Options()
        self.stage_names = stage_names
        self.order = toposort(graph)
        self.layers, self.rows, self.locs = [], [], {}
        self.kpu, self.main = KpuAllocator(), MainAllocator()
        self.kpu_live = None        # tensor whose map is valid in KPU RAM right now
        self.pixel_input = None     # the image input (uint8 pixels, preprocessing folded in)
        self.pending_pick = set()   # 1x1 convs that take over a depthwise conv's stride-2 pick
        self.folded = set()         # activation nodes already applied by their producer
        self.trace_map = {}         # tensor -> (layer index, kind) for SQNR from emulator traces
        self.uses = {}
        for n in self.order:
            for i in n.inputs:
                self.uses[i] = self.uses.get(i, 0) + 1
        for o in graph.outputs:
            self.uses[o] = self.uses.get(o, 0) + 1

    # ------------------------------------------------------------------ helpers
    def shape(self, t):
        return _chw(self.g.tensors[t].shape)

    def rng(self, t):
        if t not in self.ranges:
            raise KeyError(f"no calibration range for tensor {t}")
        return self.ranges[t]

    def quant_of(self, t):
        return fx.qparams(*self.rng(t))

    def emit(self, name, fields, row=None, **kw):
        lt = T[name]
        full = {k: 0 for k in lt.struct.names}
        full.update(fields)
        layer = v3.Layer(lt.id, full, **kw)
        self.layers.append(layer)
        if row is not None:
            row.layers.append(len(self.layers) - 1)
        return len(self.layers) - 1

    def alloc(self, t, kind, nbytes):
        return self.main.alloc(f"{t}:{kind}", nbytes)

    def consumers(self, t):
        return [n for n in self.order if t in n.inputs]

    def release(self, node):
        """Free main buffers of tensors whose last consumer was `node`."""
        for t in node.inputs:
            if t in self.uses:
                self.uses[t] -= 1
                if self.uses[t] == 0:
                    for kind in ("u8", "f32"):
                        self.main.free(f"{t}:{kind}")

    # ------------------------------------------------------------------ materialisation
    def need_u8(self, t, row):
        loc = self.locs[t]
        if loc.u8 is not None:
            return loc.u8
        if loc.f32 is not None:
            if loc.quant is None:
                loc.quant = self.quant_of(t)
            s, z = loc.quant
            n = int(np.prod(loc.shape))
            loc.u8 = self.alloc(t, "u8", n)
            self.emit("QUANTIZE", dict(flags=0, main_mem_in_address=loc.f32, mem_out_address=loc.u8,
                                       count=n, scale=s, bias=-z * s), row)
            row.notes.append("quantize to uint8")
            return loc.u8
        raise AssertionError(f"tensor {t} has no main-memory copy")

    def need_f32(self, t, row):
        loc = self.locs[t]
        if loc.f32 is not None:
            return loc.f32
        src = self.need_u8(t, row)
        s, z = loc.quant
        n = int(np.prod(loc.shape))
        loc.f32 = self.alloc(t, "f32", 4 * n)
        self.emit("DEQUANTIZE", dict(flags=1, main_mem_in_address=src, mem_out_address=loc.f32,
                                     count=n, scale=s, bias=-z * s), row)
        self.trace_map[t] = (len(self.layers) - 1, "f32")
        row.notes.append("dequantize to float")
        return loc.f32

    def need_kpu(self, t, row):
        """Line range of t's map in KPU RAM, uploading it from main memory if needed."""
        loc = self.locs[t]
        if self.kpu_live == t and loc.kpu is not None:
            return loc.kpu
        c, h, w = loc.shape
        src = self.need_u8(t, row)
        lines = hw.map_lines(c, h, w)
        start = self.kpu.place_input(lines, row.node)
        self.emit("K210_UPLOAD", dict(flags=0, main_mem_in_address=src, kpu_mem_out_address=start,
                                      width=w, height=h, channels=c), row)
        row.notes.append("upload to KPU RAM")
        loc.kpu = (start, start + lines)
        return loc.kpu

    # ------------------------------------------------------------------ entry
    def run(self):
        g = self.g
        if len(g.inputs) != 1:
            raise UnsupportedOpError(f"the model has {len(g.inputs)} inputs; K210 runtimes feed one")
        x = g.inputs[0]
        first = self.consumers(x)
        shape = self.shape(x)
        if len(shape) == 3 and first and all(n.op == "Conv" for n in first):
            if len(first) > 1:
                raise UnsupportedOpError(
                    f"the image input {x} feeds {len(first)} convs ({', '.join(n.name for n in first)}); "
                    "the runtime puts the image in KPU RAM once, for the first layer only: start the "
                    "model with one conv and branch after it")
            self.locs[x] = Loc(shape)
            self.pixel_input = x
        elif len(shape) == 1 or (len(shape) == 3 and shape[1:] == (1, 1)):
            self.locs[x] = Loc(shape, f32=self.alloc(x, "f32", 4 * int(np.prod(shape))))
        else:
            raise UnsupportedOpError(
                f"input {x} {shape} feeds {[n.op for n in first]}: MaixPy and the SDK run a kmodel "
                "whose first layer is a KPU conv (image input) or a dense layer (vector input)")
        for node in self.order:
            handler = getattr(self, "lower_" + node.op, None)
            if handler is None:
                ops = sorted(n[6:] for n in dir(self) if n.startswith("lower_") and n != "lower_fc")
                raise UnsupportedOpError(
                    f"node {node.name!r}: op {node.op} {dict(node.attrs)} has no K210 lowering; "
                    f"lowered ops: {', '.join(ops)}")
            handler(node)
            self.release(node)
        outs = []
        for o in g.outputs:
            row = Row(o, "output", "CPU", "model outputs are float32 in main memory")
            addr = self.need_f32(o, row)
            if row.layers:
                self.rows.append(row)
            outs.append((addr, 4 * int(np.prod(self.locs[o].shape))))
        first_layer = self.layers[0].name if self.layers else None
        if first_layer not in ("K210_CONV", "FULLY_CONNECTED"):
            raise UnsupportedOpError(f"the first kmodel layer would be {first_layer}; the SDK/MaixPy "
                                     "need K210_CONV or FULLY_CONNECTED first")
        model = v3.KModelV3(self.layers, outs, self.main.high, flags=1 if self.opts.weight_bits == 8 else 0,
                            max_start_address=self.kpu.lowest)
        return model

    # ------------------------------------------------------------------ Conv
    def lower_Conv(self, node):
        cin_shape = self.shape(node.inputs[0])
        a = node.attrs
        if len(cin_shape) == 3 and cin_shape[1:] == (1, 1) and tuple(a["kernel"]) == (1, 1):
            return self.lower_fc(node)
        reason = self._kpu_reason(node)
        if reason:
            raise UnsupportedOpError(f"node {node.name!r} (Conv {a.get('kernel')} strides "
                                     f"{a.get('strides')} pads {a.get('pads')} group {a.get('group')}): "
                                     f"{reason}")
        self._kpu_conv(node)

    def _kpu_reason(self, node):
        a = node.attrs
        ci, h, w = self.shape(node.inputs[0])
        co = self.shape(node.outputs[0])[0]
        k = tuple(a["kernel"])
        if k not in ((1, 1), (3, 3)):
            return f"kernel {k}: the KPU runs 1x1 and 3x3 only; split it into 3x3 convs"
        if tuple(a.get("dilations", (1, 1))) != (1, 1):
            return "dilated convs do not run on the KPU"
        g = a.get("group", 1)
        if g not in (1, ci) or (g == ci and co != ci and g != 1):
            return f"group {g}: the KPU runs normal (group 1) or depthwise (group = channels) convs"
        if any(p > k[0] // 2 for p in a["pads"]) or any(p < 0 for p in a["pads"]):
            return f"pads {a['pads']} exceed the KPU's {k[0] // 2}-pixel border"
        if not (4 <= w <= 512 and 4 <= h <= 256):
            return f"input {w}x{h}: the KPU runs 4 <= W <= 512, 4 <= H <= 256 (nncase limit)"
        if max(ci, co) > 1024:
            return f"{max(ci, co)} channels: the KPU allows 1024"
        if any(s not in (1, 2) for s in a["strides"]):
            return f"strides {a['strides']}: only 1 and 2 are lowered"
        return None

    def _pick(self, node):
        """(row_offset, col_offset, stride) of the wanted pixels in the KPU stride-1 output."""
        a = node.attrs
        k = a["kernel"][0]
        pt, pl = a["pads"][0], a["pads"][1]
        sh, sw = a["strides"]
        if sh != sw:
            raise UnsupportedOpError(f"node {node.name!r}: strides {a['strides']} must be equal")
        return (k // 2 - pt, k // 2 - pl, sh)

    def _kpu_conv(self, node):
        a = node.attrs
        x, w_name, b_name = node.inputs
        out = node.outputs[0]
        ci, h, w = self.shape(x)
        if node.name in self.pending_pick and x in self.locs:
            ci, h, w = self.locs[x].shape   # the stride-1 map of the depthwise conv before
        co = self.shape(out)[0]
        depthwise = a.get("group", 1) == ci and ci > 1
        k = a["kernel"][0]
        st = self.stage_names(node)
        row = Row(node.name, "Conv", "KPU", "", list(node.fused), in_shape=(ci, h, w))
        self.rows.append(row)
        W = np.asarray(self.g.tensors[w_name].value, np.float64)
        B = np.asarray(self.g.tensors[b_name].value, np.float64)
        # --- input: fold its scale(s) into the weights so the KPU sees W'·(q − z_x)
        xloc = self.locs[x]
        mean = self.opts.channel_means.get(x)
        ch = (slice(None), None, None, None) if depthwise else (None, slice(None), None, None)
        if x == self.pixel_input:
            sc = np.resize(np.asarray(self.opts.input_scale, np.float64), ci)
            of = np.resize(np.asarray(self.opts.input_offset, np.float64), ci)
            z_x = int(np.clip(round(float(np.mean(-of / sc))), 0, 255))
            resid = of + sc * z_x                       # x = sc·(q − z_x) + resid
            B = B + (W.sum(axis=(2, 3)) * (resid[:, None] if depthwise else resid[None, :])).sum(axis=1)
            W = W * sc[ch]
            e = None if mean is None else (mean - resid) / sc     # E[q − z_x] per channel
            start = self.kpu.place_input(hw.map_lines(ci, h, w), node.name)
            in_range = (start, start + hw.map_lines(ci, h, w))
            xloc.kpu = in_range
            self.kpu_live = x
            row.notes.append(f"input: pixels, preprocessing folded into weights (pad value {z_x})")
        else:
            in_range = self.need_kpu(x, row)          # may quantize a float input first
            s_in, z_x = xloc.quant
            W = W * s_in
            e = None if mean is None else mean / s_in
        # --- pick pixels for stride 2 / unusual pads; pool codes
        dy, dx, s = self._pick(node)
        pool = a.get("pool")
        code, cpu_pick, cpu_pool, pick_next = 0, None, None, False
        if (dy, dx, s) != (0, 0, 1):
            if s == 2 and dy == 0 and dx in (0, 1) and not depthwise:
                code = 5 + dx
            elif s == 2 and dy == 0 and dx == 0 and depthwise and self._next_pw_takes_pick(node):
                pick_next = True
            else:
                cpu_pick = (dy, dx, s)
            if pool:
                cpu_pool = pool
        elif pool:
            if depthwise:
                cpu_pool = pool
            else:
                key = (pool["kind"], pool["size"], pool["stride"])
                c = POOL_CODES.get(key)
                if key == ("max", 2, 1) and list(pool.get("pads", [0, 0, 1, 1])) != [0, 0, 1, 1]:
                    c = None
                if c is None:
                    raise UnsupportedOpError(f"node {node.name!r}: pool {pool} has no KPU code")
                code = c
        if node.name in self.pending_pick:
            self.pending_pick.discard(node.name)
            if code or cpu_pick or cpu_pool:
                raise AssertionError("pick moved onto a conv that already pools")
            code = 5
        conv, (s_z, z_z), dst, out_lines = self._build_conv(
            W, B, e, z_x, (ci, h, w), in_range, code, depthwise, self.rng(st["conv"]),
            self.rng(st["act"]), a.get("activation"), node.name, row)
        co, ph, pw = conv.out_shape
        loc = Loc((co, ph, pw), quant=(s_z, z_z), kpu=(dst, dst + out_lines))
        tensor = out if not (cpu_pick or cpu_pool) else out + ":kpu"
        self.locs[tensor] = loc
        stream = cpu_pick or cpu_pool or self._needs_main(out)
        if stream:
            loc.u8 = self.alloc(tensor, "u8", co * ph * pw)
        idx = self.emit("K210_CONV", dict(flags=1 if stream else 0,
                                          main_mem_out_address=loc.u8 or 0), row, conv=conv)
        self.trace_map[tensor] = (idx, "kpu")
        self.kpu_live = tensor
        row.macs = conv.macs
        row.weight_bytes = len(conv.weight_bytes()) + 8 * co + hw.ACT_TABLE_BYTES
        row.kpu_lines = (in_range[1] - in_range[0]) + out_lines
        row.out_shape = self.shape(out)
        kind = "depthwise " if depthwise else ""
        row.why = f"{kind}conv{k}x{k}" + (f" + {hw.POOL[code].name}" if code else "")
        if pick_next:
            self.pending_pick.add(self.consumers(out)[0].name)
            row.notes.append("stride 2 moved onto the next 1x1 conv (exact: pick commutes with it)")
        if cpu_pick:
            row.notes.append(f"stride {s} with pads {a['pads']}: KPU at stride 1 ({s * s}x the MACs), "
                             f"CPU picks rows from {dy}, columns from {dx}")
            self._cpu_pick(tensor, out, cpu_pick, None if cpu_pool else out, row)
            self.main.free(f"{tensor}:u8")          # the full-resolution map is consumed
            if cpu_pool:
                self._cpu_pool(out + ":pick", out, cpu_pool, row)
                self.main.free(f"{out}:pick:u8")
        elif cpu_pool:
            self._cpu_pool(tensor, out, cpu_pool, row)
            self.main.free(f"{tensor}:u8")

    def _build_conv(self, W, B, e, z_x, in_shape, in_range, code, depthwise, y_range, z_range, act_attr,
                    name, row):
        """One K210_CONV: per-channel weights (acting on q − z_x), bias correction, BN fixed
        point, activation table, registers and its output map in KPU RAM."""
        ci, h, w = in_shape
        co, k = W.shape[0], W.shape[2]
        Wq, zw, sw = fx.quantize_weights(W, self.opts.weight_bits)
        if e is not None:   # remove the mean shift the weight rounding causes (Nagel et al. 2019)
            dW = ((Wq.astype(np.float64) - zw) * sw[:, None, None, None] - W).sum(axis=(2, 3))
            B = B - (dW[:, 0] * e if depthwise else dW @ e)
            row.notes.append("bias corrected for weight rounding")
        y_lo, y_hi = y_range
        s_z, z_z = fx.qparams(*z_range)
        s_v = fx.choose_v_scale(1.0, sw, B, max(abs(y_lo), abs(y_hi)) * 2)
        bn = fx.bn_params(1.0, sw, B, s_v)
        act = fx.activation_table(act_attr, y_lo, y_hi, s_v, s_z, z_z)
        ph, pw = hw.POOL[code].out_size(h, w)
        if min(ph, pw) < hw.LIMITS["out_min"]:
            raise KpuLimitError(f"node {name!r}: KPU output {pw}x{ph} after {hw.POOL[code].name}; "
                                f"the KPU writes maps of at least {hw.LIMITS['out_min']}x"
                                f"{hw.LIMITS['out_min']} (spec §2.7): use a larger input or pool later")
        out_lines = hw.map_lines(co, ph, pw)
        dst = self.kpu.place_output(in_range, out_lines, name)
        per_oc = k * k * (1 if depthwise else ci)
        wbytes = self.opts.weight_bits // 8
        if depthwise:
            n_oc, load_time = co, 0
        else:
            n_oc = max(1, min(co, hw.WEIGHT_LOAD_BUDGET[self.opts.weight_bits] // (per_oc * wbytes)))
            load_time = -(-co // n_oc) - 1
        if load_time > hw.LIMITS["load_time_max"] or n_oc * per_oc * wbytes > hw.LIMITS["para_size_max"]:
            raise KpuLimitError(f"node {name!r}: {co}x{per_oc} weights need {load_time + 1} "
                                "weight loads; the KPU allows 64")
        g_in, _, L_in = hw.row_layout(w)
        g_out, _, L_out = hw.row_layout(pw)
        args = dict(hw.LAYER_DEFAULTS)
        args.update(
            depth_wise_layer=int(depthwise), image_src_addr=in_range[0], image_dst_addr=dst,
            i_ch_num=ci - 1, o_ch_num=co - 1, o_ch_num_coef=n_oc - 1,
            i_row_wid=w - 1, i_col_high=h - 1, o_row_wid=pw - 1, o_col_high=ph - 1,
            kernel_type=0 if k == 1 else 1, pool_type=code, pad_value=z_x,
            load_time=load_time, para_size=n_oc * per_oc * wbytes,
            channel_switch_addr=L_in * h, row_switch_addr=L_in, coef_group=g_in,
            wb_channel_switch_addr=L_out * ph, wb_row_switch_addr=L_out, wb_group=g_out,
            arg_x=-zw, shr_x=0, arg_w=-z_x, shr_w=0, arg_add=k * k * z_x * zw,
            channel_byte_num=ph * pw - 1, dma_total_byte=co * ph * pw - 1,
            bwsx_base_addr=0, para_start_addr=0, active_addr=0)
        return KpuConv(args, Wq.reshape(-1), bn, act), (s_z, z_z), dst, out_lines

    def _next_pw_takes_pick(self, node):
        cons = self.consumers(node.outputs[0])
        if len(cons) != 1 or node.outputs[0] in self.g.outputs:
            return False
        c = cons[0]
        return (c.op == "Conv" and tuple(c.attrs["kernel"]) == (1, 1) and tuple(c.attrs["strides"]) == (1, 1)
                and c.attrs.get("group", 1) == 1 and not c.attrs.get("pool")
                and list(c.attrs["pads"]) == [0, 0, 0, 0])

    def _needs_main(self, t):
        """Must this conv output also stream to main memory? Yes unless its only consumer is a
        KPU conv emitted right after it (any conv in between would overwrite the map)."""
        cons = self.consumers(t)
        if t in self.g.outputs or len(cons) != 1:
            return True
        c = cons[0]
        if c.op != "Conv" or self._kpu_reason(c) or self.shape(t)[1:] == (1, 1):
            return True
        i = self.order.index(self._producer(t))
        nxt = next((n for n in self.order[i + 1:] if n.op == "Conv"), None)
        return nxt is not c

    def _producer(self, t):
        return next((n for n in self.order if t in n.outputs), None)

    def _cpu_pick(self, src, dst, pick, final, row):
        dy, dx, s = pick
        c, h, w = self.locs[src].shape
        oc, oh, ow = self.shape(dst) if final else (c, (h - dy + s - 1) // s, (w - dx + s - 1) // s)
        name = dst if final else dst + ":pick"
        loc = Loc((c, oh, ow), quant=self.locs[src].quant)
        loc.u8 = self.alloc(name, "u8", c * oh * ow)
        self.emit("QUANTIZED_MAX_POOL2D", dict(
            flags=1, main_mem_in_address=self.locs[src].u8, main_mem_out_address=loc.u8,
            in_shape=(w, h, c), out_shape=(ow, oh, c), kernel_width=1, kernel_height=1,
            stride_width=s, stride_height=s, padding_width=-dx, padding_height=-dy), row)
        self.locs[name] = loc
        self.trace_map[name] = (len(self.layers) - 1, "u8")

    def _cpu_pool(self, src, dst, pool, row):
        if pool["kind"] != "max":
            raise UnsupportedOpError(f"node {row.node!r}: average pooling after this conv would run "
                                     "in float on the CPU; not lowered yet")
        c, h, w = self.locs[src].shape
        oc, oh, ow = self.shape(dst)
        pads = pool.get("pads", [0, 0, 0, 0])
        loc = Loc((c, oh, ow), quant=self.locs[src].quant)
        loc.u8 = self.alloc(dst, "u8", c * oh * ow)
        self.emit("QUANTIZED_MAX_POOL2D", dict(
            flags=1, main_mem_in_address=self.locs[src].u8, main_mem_out_address=loc.u8,
            in_shape=(w, h, c), out_shape=(ow, oh, c), kernel_width=pool["size"],
            kernel_height=pool["size"], stride_width=pool["stride"], stride_height=pool["stride"],
            padding_width=pads[1], padding_height=pads[0]), row)
        self.locs[dst] = loc
        self.trace_map[dst] = (len(self.layers) - 1, "u8")
        row.notes.append("max pool on the CPU (QUANTIZED_MAX_POOL2D)")

    # ------------------------------------------------------------------ float dense layers
    def lower_fc(self, node):
        x = node.inputs[0]
        co, ci = self.shape(node.outputs[0])[0], self.shape(x)[0]
        if not self.opts.float_fc and max(ci, co) <= 1024 and x != self.pixel_input:
            return self._kpu_fc(node)
        return self._float_fc(node)

    def _kpu_fc(self, node):
        """Dense layer on the KPU as nncase v0.1 did: the vector is padded into pixel (0,0) of a
        4x4 map per channel (K210_ADD_PADDING), a 1x1 conv runs, and K210_REMOVE_PADDING reads
        pixel (0,0) of each output channel back."""
        x, w_name, b_name = node.inputs
        out = node.outputs[0]
        st = self.stage_names(node)
        W = np.asarray(self.g.tensors[w_name].value, np.float64)
        B = np.asarray(self.g.tensors[b_name].value, np.float64)
        co, ci = W.shape[0], W.shape[1]
        row = Row(node.name, "Conv/Gemm", "KPU", "dense layer: 1x1 KPU conv on a 4x4-padded map "
                  "(ADD_PADDING, conv, REMOVE_PADDING)", list(node.fused), in_shape=(ci,), out_shape=(co,))
        self.rows.append(row)
        src = self.need_u8(x, row)
        s_x, z_x = self.locs[x].quant
        mean = self.opts.channel_means.get(x)
        lines = hw.map_lines(ci, 4, 4)
        start = self.kpu.place_input(lines, node.name)
        self.emit("K210_ADD_PADDING", dict(flags=0, main_mem_in_address=src, kpu_mem_out_address=start,
                                           channels=ci), row)
        conv, quant, dst, out_lines = self._build_conv(
            W.reshape(co, ci, 1, 1) * s_x, B, None if mean is None else mean / s_x, z_x, (ci, 4, 4),
            (start, start + lines), 0, False, self.rng(st["conv"]), self.rng(st["act"]),
            node.attrs.get("activation"), node.name, row)
        padded = self.alloc(out + ":pad", "u8", co * 16)
        self.emit("K210_CONV", dict(flags=1, main_mem_out_address=padded), row, conv=conv)
        self.kpu_live = None
        loc = self._u8_out(out, quant)
        self.emit("K210_REMOVE_PADDING", dict(flags=1, main_mem_in_address=padded,
                                              main_mem_out_address=loc.u8, channels=co), row)
        self.main.free(f"{out}:pad:u8")
        self.trace_map[out] = (len(self.layers) - 1, "u8")
        row.macs, row.kpu_lines = conv.macs, lines + out_lines
        row.weight_bytes = len(conv.weight_bytes()) + 8 * co + hw.ACT_TABLE_BYTES

    def _float_fc(self, node, W=None, B=None):
        x, out = node.inputs[0], node.outputs[0]
        if W is None:
            W = np.asarray(self.g.tensors[node.inputs[1]].value, np.float32)
            B = np.asarray(self.g.tensors[node.inputs[2]].value, np.float32)
        co = W.shape[0]
        W = W.reshape(co, -1)
        act = node.attrs.get("activation")
        op = act["op"] if act else None
        code = FC_ACTS.get(op)
        if op == "Clip" and act.get("min", None) == 0 and act.get("max") == 6:
            code = 2
        why = ("--float-fc: float FULLY_CONNECTED" if self.opts.float_fc and W.shape[1] <= 1024 and co <= 1024
               else "dense layer: float FULLY_CONNECTED (vector input, or over the KPU's 1024 channels)")
        row = Row(node.name, node.op, "CPU", why,
                  list(node.fused), in_shape=self.shape(x), out_shape=(co,),
                  macs=W.size, weight_bytes=4 * (W.size + co))
        self.rows.append(row)
        src = self.need_f32(x, row)
        loc = Loc(self.shape(out) if len(self.shape(out)) else (co,))
        loc.f32 = self.alloc(out, "f32", 4 * co)
        self.emit("FULLY_CONNECTED", dict(flags=0, main_mem_in_address=src, main_mem_out_address=loc.f32,
                                          in_channels=W.shape[1], out_channels=co, act=code or 0),
                  row, data={"weights": W, "bias": B})
        self.locs[out] = loc
        self.trace_map[out] = (len(self.layers) - 1, "f32")
        if code is None:   # activation the FC layer cannot apply
            if op == "Sigmoid":
                self._logistic(out, out, row, in_place=True)
            else:
                raise UnsupportedOpError(f"node {node.name!r}: activation {op} after a dense layer "
                                         "has no v3 CPU layer; use Relu, Relu6 or Sigmoid")

    def lower_MatMul(self, node):
        self.lower_Gemm(node)

    def lower_Gemm(self, node):
        """A dense layer the KPU cannot take (over 1024 features): float FULLY_CONNECTED."""
        x, w = node.inputs[0], node.inputs[1]
        W = self.g.tensors[w].value
        if W is None or self.g.tensors[x].value is not None:
            raise UnsupportedOpError(f"node {node.name!r}: {node.op} of two activations has no v3 layer")
        a = node.attrs
        W = np.asarray(W, np.float32)
        if node.op == "Gemm":
            if a.get("transA", 0) or a.get("alpha", 1.0) != 1.0 or a.get("beta", 1.0) != 1.0:
                raise UnsupportedOpError(f"node {node.name!r}: Gemm {a} (only transB and a bias)")
            W = W if a.get("transB", 0) else W.T
        else:
            W = W.T
        bias = np.zeros(W.shape[0], np.float32)
        if len(node.inputs) > 2 and node.inputs[2]:
            bias = np.broadcast_to(np.asarray(self.g.tensors[node.inputs[2]].value, np.float32), bias.shape)
        self._float_fc(node, W, bias)

    def _logistic(self, src, dst, row, in_place=False):
        n = int(np.prod(self.locs[src].shape))
        a = self.locs[src].f32
        out = a if in_place else self.alloc(dst, "f32", 4 * n)
        self.emit("LOGISTIC", dict(flags=0, main_mem_in_address=a, main_mem_out_address=out, channels=n), row)
        if not in_place:
            self.locs[dst] = Loc(self.locs[src].shape, f32=out)
        self.trace_map[dst] = (len(self.layers) - 1, "f32")

    # ------------------------------------------------------------------ CPU uint8 layers
    def _u8_out(self, t, quant=None):
        loc = Loc(self.shape(t), quant=quant or self.quant_of(t))
        loc.u8 = self.alloc(t, "u8", int(np.prod(loc.shape)))
        self.locs[t] = loc
        return loc

    def lower_Add(self, node):
        a_name, b_name = node.inputs
        out = node.outputs[0]
        row = Row(node.name, "Add", "CPU", "residual add: QUANTIZED_ADD on uint8 (no KPU add)",
                  list(node.fused), in_shape=self.shape(a_name), out_shape=self.shape(out))
        self.rows.append(row)
        if any(self.g.tensors[i].is_const for i in node.inputs):
            raise UnsupportedOpError(f"node {node.name!r}: Add of a constant should have been folded")
        pa, pb = self.need_u8(a_name, row), self.need_u8(b_name, row)
        (sa, za), (sb, zb) = self.locs[a_name].quant, self.locs[b_name].quant
        cons = self.consumers(out)
        relu = len(cons) == 1 and cons[0].op in ("Relu", "Clip") and out not in self.g.outputs
        rng_t = cons[0].outputs[0] if relu else out
        so, zo = self.quant_of(rng_t)
        smax = max(sa, sb)
        ma, mb = int(round(sa / smax * 4096)), int(round(sb / smax * 4096))
        mul, sh = fx.fixed_mul(smax / 4096 / so, 10, 31)   # keeps every product inside int32
        loc = self._u8_out(out, (so, zo))
        n = int(np.prod(loc.shape))
        self.emit("QUANTIZED_ADD", dict(
            flags=1, main_mem_in_a_address=pa, main_mem_in_b_address=pb, main_mem_out_address=loc.u8,
            count=n, in_a_offset=-za, in_a_mul=ma, in_a_shift=0, in_b_offset=-zb, in_b_mul=mb,
            in_b_shift=0, out_offset=zo, out_mul=mul, out_shift=sh), row)
        if relu:
            self.trace_map[cons[0].outputs[0]] = (len(self.layers) - 1, "u8")
            row.tensor = cons[0].outputs[0]
            self._alias(cons[0].outputs[0], out)
            row.notes.append(f"{cons[0].op} folded into the uint8 clamp")
            self.folded.add(cons[0].name)

    def _alias(self, new, old):
        self.locs[new] = self.locs[old]
        if old in self.trace_map and new not in self.trace_map:
            self.trace_map[new] = self.trace_map[old]
        self.uses[old] = self.uses.get(old, 0) + self.uses.get(new, 0)

    def lower_Relu(self, node):
        if node.name in self.folded:
            return
        self._standalone_act(node, {"op": "Relu"})

    def lower_Clip(self, node):
        if node.name in self.folded:
            return
        self._standalone_act(node, {"op": "Clip", **{k: v for k, v in node.attrs.items()}})

    def _standalone_act(self, node, act):
        x, out = node.inputs[0], node.outputs[0]
        row = Row(node.name, node.op, "CPU", "activation on uint8: REQUANTIZE table",
                  list(node.fused), in_shape=self.shape(x), out_shape=self.shape(out))
        self.rows.append(row)
        src = self.need_u8(x, row)
        s_in, z_in = self.locs[x].quant
        so, zo = self.quant_of(out)
        f, _ = fx.act_function(act)
        table = np.clip(np.rint(f(s_in * (np.arange(256) - z_in)) / so + zo), 0, 255).astype(np.uint8)
        loc = self._u8_out(out, (so, zo))
        self.emit("REQUANTIZE", dict(flags=1, main_mem_in_address=src, main_mem_out_address=loc.u8,
                                     count=int(np.prod(loc.shape))), row, data={"table": table})
        self.trace_map[out] = (len(self.layers) - 1, "u8")

    def lower_Concat(self, node):
        out = node.outputs[0]
        if node.attrs.get("axis", 1) not in (1, -3):
            raise UnsupportedOpError(f"node {node.name!r}: Concat on axis {node.attrs.get('axis')}; "
                                     "only channel concat (axis 1) is lowered")
        row = Row(node.name, "Concat", "CPU", "channel concat: QUANTIZED_CONCAT (memcpy) after "
                  "requantizing inputs to one scale", list(node.fused), out_shape=self.shape(out))
        self.rows.append(row)
        so, zo = self.quant_of(out)
        ranges = []
        for t in node.inputs:
            src = self.need_u8(t, row)
            s_in, z_in = self.locs[t].quant
            n = int(np.prod(self.locs[t].shape))
            if abs(s_in - so) > 1e-9 * so or z_in != zo:
                table = np.clip(np.rint(s_in * (np.arange(256) - z_in) / so + zo), 0, 255).astype(np.uint8)
                dst = self.alloc(t + ":rq", "u8", n)
                self.emit("REQUANTIZE", dict(flags=1, main_mem_in_address=src, main_mem_out_address=dst,
                                             count=n), row, data={"table": table})
                src = dst
            ranges.append((src, n))
        loc = self._u8_out(out, (so, zo))
        self.emit("QUANTIZED_CONCAT", dict(flags=1, main_mem_out_address=loc.u8, input_count=len(ranges)),
                  row, data={"ranges": ranges})
        self.trace_map[out] = (len(self.layers) - 1, "u8")
        for t in node.inputs:
            self.main.free(t + ":rq:u8")

    def lower_Resize(self, node):
        x, out = node.inputs[0], node.outputs[0]
        if node.attrs.get("mode", "nearest") != "nearest":
            raise UnsupportedOpError(f"node {node.name!r}: Resize mode {node.attrs.get('mode')}; the "
                                     "SDK has nearest-neighbour only")
        c, h, w = self.shape(x)
        oc, oh, ow = self.shape(out)
        if oh % h or ow % w:
            raise UnsupportedOpError(f"node {node.name!r}: {h}x{w} -> {oh}x{ow} is not an integer scale")
        row = Row(node.name, "Resize", "CPU", "nearest upsampling: QUANTIZED_RESIZE_NEAREST_NEIGHBOR",
                  list(node.fused), in_shape=(c, h, w), out_shape=(oc, oh, ow))
        self.rows.append(row)
        src = self.need_u8(x, row)
        loc = self._u8_out(out, self.locs[x].quant)
        self.emit("QUANTIZED_RESIZE_NEAREST_NEIGHBOR", dict(
            flags=1, main_mem_in_address=src, main_mem_out_address=loc.u8, in_shape=(w, h, c),
            out_width=ow, out_height=oh, align_corners=0), row)
        self.trace_map[out] = (len(self.layers) - 1, "u8")

    def lower_MaxPool(self, node):
        x, out = node.inputs[0], node.outputs[0]
        a = node.attrs
        row = Row(node.name, "MaxPool", "CPU", "max pool not fusable into a KPU conv: QUANTIZED_MAX_POOL2D",
                  list(node.fused), in_shape=self.shape(x), out_shape=self.shape(out))
        self.rows.append(row)
        self.need_u8(x, row)
        k, s = a["kernel_shape"], a.get("strides", [1, 1])
        self._cpu_pool(x, out, {"kind": "max", "size": k[0], "stride": s[0],
                                "pads": list(a.get("pads", [0, 0, 0, 0]))}, row)

    def lower_GlobalMaxPool(self, node):
        """Global max pool: QUANTIZED_MAX_POOL2D with a whole-map window (the SDK runs no global
        max pool; max commutes with the uint8 quantization, so this is exact)."""
        x, out = node.inputs[0], node.outputs[0]
        c, h, w = self.shape(x)
        row = Row(node.name, "GlobalMaxPool", "CPU", "global max pool: QUANTIZED_MAX_POOL2D over "
                  "the whole map", list(node.fused), in_shape=(c, h, w), out_shape=(c,))
        self.rows.append(row)
        src = self.need_u8(x, row)
        loc = self._u8_out(out, self.locs[x].quant)
        self.emit("QUANTIZED_MAX_POOL2D", dict(
            flags=1, main_mem_in_address=src, main_mem_out_address=loc.u8, in_shape=(w, h, c),
            out_shape=(1, 1, c), kernel_width=w, kernel_height=h, stride_width=1, stride_height=1,
            padding_width=0, padding_height=0), row)
        self.trace_map[out] = (len(self.layers) - 1, "u8")

    def lower_AveragePool(self, node):
        """An average pool the KPU cannot take: float AVERAGE_POOL2D (in-range taps only, as
        ONNX count_include_pad=0)."""
        x, out = node.inputs[0], node.outputs[0]
        a = node.attrs
        if a.get("count_include_pad", 0):
            raise UnsupportedOpError(f"node {node.name!r}: AveragePool with count_include_pad=1; the "
                                     "SDK averages in-range taps only")
        c, h, w = self.shape(x)
        oc, oh, ow = self.shape(out)
        k, st = a["kernel_shape"], a.get("strides", [1, 1])
        pads = list(a.get("pads", [0, 0, 0, 0]))
        row = Row(node.name, "AveragePool", "CPU", "average pool: float AVERAGE_POOL2D (no uint8 "
                  "version in the SDK)", list(node.fused), in_shape=(c, h, w), out_shape=(oc, oh, ow))
        self.rows.append(row)
        src = self.need_f32(x, row)
        loc = Loc((oc, oh, ow), f32=self.alloc(out, "f32", 4 * oc * oh * ow))
        self.emit("AVERAGE_POOL2D", dict(
            flags=1, main_mem_in_address=src, main_mem_out_address=loc.f32, in_shape=(w, h, c),
            out_shape=(ow, oh, oc), kernel_width=k[1], kernel_height=k[0], stride_width=st[1],
            stride_height=st[0], padding_width=pads[1], padding_height=pads[0], act=0), row)
        self.locs[out] = loc
        self.trace_map[out] = (len(self.layers) - 1, "f32")

    # ------------------------------------------------------------------ float CPU layers
    def lower_GlobalAveragePool(self, node):
        x, out = node.inputs[0], node.outputs[0]
        c, h, w = self.shape(x)
        row = Row(node.name, "GlobalAveragePool", "CPU", "global average pool: float "
                  "GLOBAL_AVERAGE_POOL2D (the SDK has no uint8 version)", list(node.fused),
                  in_shape=(c, h, w), out_shape=(c,))
        self.rows.append(row)
        src = self.need_f32(x, row)
        loc = Loc(self.shape(out), f32=self.alloc(out, "f32", 4 * c))
        self.emit("GLOBAL_AVERAGE_POOL2D", dict(flags=1, main_mem_in_address=src,
                                                main_mem_out_address=loc.f32, kernel_size=h * w,
                                                channels=c), row)
        self.locs[out] = loc
        self.trace_map[out] = (len(self.layers) - 1, "f32")

    def lower_Softmax(self, node):
        x, out = node.inputs[0], node.outputs[0]
        n = int(np.prod(self.shape(x)))
        row = Row(node.name, "Softmax", "CPU", "float SOFTMAX", list(node.fused),
                  in_shape=self.shape(x), out_shape=self.shape(out))
        self.rows.append(row)
        src = self.need_f32(x, row)
        loc = Loc(self.shape(out), f32=self.alloc(out, "f32", 4 * n))
        self.emit("SOFTMAX", dict(flags=1, main_mem_in_address=src, main_mem_out_address=loc.f32,
                                  channels=n), row)
        self.locs[out] = loc
        self.trace_map[out] = (len(self.layers) - 1, "f32")

    def lower_LpNormalization(self, node):
        x, out = node.inputs[0], node.outputs[0]
        n = int(np.prod(self.shape(x)))
        if node.attrs.get("p", 2) != 2 or max(self.shape(x)) != n:
            raise UnsupportedOpError(f"node {node.name!r}: only the L2 norm of a vector is lowered")
        row = Row(node.name, "LpNormalization", "CPU", "float L2_NORMALIZATION", list(node.fused),
                  in_shape=self.shape(x), out_shape=self.shape(out))
        self.rows.append(row)
        src = self.need_f32(x, row)
        loc = Loc(self.shape(out), f32=self.alloc(out, "f32", 4 * n))
        self.emit("L2_NORMALIZATION", dict(flags=1, main_mem_in_address=src, main_mem_out_address=loc.f32,
                                           channels=n), row)
        self.locs[out] = loc
        self.trace_map[out] = (len(self.layers) - 1, "f32")

    def lower_Sigmoid(self, node):
        x, out = node.inputs[0], node.outputs[0]
        row = Row(node.name, "Sigmoid", "CPU", "float LOGISTIC", list(node.fused),
                  in_shape=self.shape(x), out_shape=self.shape(out))
        self.rows.append(row)
        self.need_f32(x, row)
        self._logistic(x, out, row)

    def _reshape_alias(self, node):
        x, out = node.inputs[0], node.outputs[0]
        self._alias(out, x)
        self.locs[out] = Loc(self.shape(out), self.locs[x].quant, self.locs[x].kpu,
                             self.locs[x].u8, self.locs[x].f32)
        if self.kpu_live == x:
            self.kpu_live = out

    def lower_Flatten(self, node):
        self._reshape_alias(node)   # NCHW flatten = CHW byte order: no data movement

    def lower_Reshape(self, node):
        a, b = self.shape(node.inputs[0]), self.shape(node.outputs[0])
        if int(np.prod(a)) != int(np.prod(b)):
            raise UnsupportedOpError(f"node {node.name!r}: reshape {a} -> {b}")
        self._reshape_alias(node)

    def lower_Transpose(self, node):
        x, out = node.inputs[0], node.outputs[0]
        perm = tuple(node.attrs.get("perm", ()))
        if perm != (0, 2, 3, 1):
            raise UnsupportedOpError(f"node {node.name!r}: Transpose {perm}; only NCHW->NHWC before "
                                     "a flatten is lowered (TENSORFLOW_FLATTEN)")
        c, h, w = self.shape(x)
        row = Row(node.name, "Transpose", "CPU", "NCHW->NHWC: float TENSORFLOW_FLATTEN",
                  list(node.fused), in_shape=(c, h, w), out_shape=self.shape(out))
        self.rows.append(row)
        src = self.need_f32(x, row)
        loc = Loc(self.shape(out), f32=self.alloc(out, "f32", 4 * c * h * w))
        self.emit("TENSORFLOW_FLATTEN", dict(flags=1, main_mem_in_address=src,
                                             main_mem_out_address=loc.f32, shape=(w, h, c)), row)
        self.locs[out] = loc
        self.trace_map[out] = (len(self.layers) - 1, "f32")


def lower(graph, ranges, opts: Options | None = None):
    """Returns (KModelV3, receipt rows, trace map {tensor: (layer index, kind)}, lowering)."""
    lw = Lowering(graph, ranges, opts)
    model = lw.run()
    return model, lw.rows, lw.trace_map, lw

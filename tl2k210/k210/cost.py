"""Latency model of the K210 (KPU and CPU at 400 MHz) for ANY v3/v4 kmodel, one small function
per layer type / opcode (registries like the emulator's), each with the basis of its figure.

    est = cost.estimate(model)        # Estimate(ms, kpu_ms, cpu_ms, rows)
    print(est.ms, est.rows[0])        # rows: (index, name, "KPU"/"CPU", cycles, basis)

Basis and known error (nobody publishes per-layer K210 timings; these are fitted, not measured
by us on silicon):

* KPU conv = MACs / 32 per cycle + 2000 cycles per layer (argument push, interrupt) + weight DMA
  at 8 B/cycle, + 8 B/cycle to stream an output to main memory. 32 MACs/cycle is calibrated so
  the MaixPy face detector (facedetect_320x240_v3, 205.6 M MACs) lands at ~16 ms = the 50-70 fps
  Sipeed quotes for it (landscape-and-user-pains.md). Cross-checks: MobileNetV1 1.0 at 224
  (569 M MACs) gives 44 ms against the 40 ms forward measured from RAM (bbs.sipeed.com/t/1811,
  +10 %); a MobileNet-0.75 YOLOv2 at 224 (531 M MACs, e.g. the corpus person detector) gives
  41.5 ms, i.e. a 2-camera-frame loop = 15 fps against the 13.3 fps (74.9 ms) of MaixPy-v1 #242
  (+12 %). Known error of KPU-bound models: about +-30 %.
* CPU layers run on one RV64GC core at 400 MHz with the runtimes' plain C loops (nncase v0.1
  SDK runtime for v3, nncase v0.2 reference kernels for v4): cycles per element or per MAC from
  CPU_CYCLES below (loads + FPU latency of an in-order core, no SIMD). Not calibrated against a
  board: the known error is about a factor of 2 (nncase #148's 30 ms -> 200 ms when MobileNetV2's
  residual adds leave the KPU shows how much CPU layers can cost).
* The NHWC cpu_* opcodes (nncase v0.2 runtime/cpu) cost what their NCHW neutral twins cost
  (the same loops over another memory order). An opcode without a cost function counts 0 with
  basis "unknown" - the estimate is then a lower bound and says so.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from tl2k210.k210 import hardware as hw

KPU_MACS_PER_CYCLE = 32.0
KPU_LAYER_OVERHEAD = 2000
DMA_BYTES_PER_CYCLE = 8
#: cycles per unit of work on the CPU (basis: in-order RV64GC, single-precision FPU, C loops)
CPU_CYCLES = {
    "mac": 4,          # v3 float FULLY_CONNECTED inner loop (fmadd.s + 2 loads)
    "fmac": 8,         # v4 reference conv2d / matmul: padding checks and index math per MAC
    "qmac": 6,         # v4 quantized conv2d / matmul: offsets, widening multiply
    "elem": 6,         # quantize/dequantize/requantize/add-style per-element loops
    "felem": 8,        # float binary op with broadcasting index math
    "qelem": 12,       # quantized binary: two requantizations per element
    "transc": 40,      # expf/logf/sinf/rsqrt per element (softmax, logistic, unary)
    "window": 4,       # per element of a pooling window
    "resize": 20,      # per output element, bilinear (nearest: "copy" * 3)
    "copy": 2,         # per byte copied / re-laid out (concat, upload, pad, transpose)
}


@dataclass
class Estimate:
    cycles: int
    kpu_cycles: int
    cpu_cycles: int
    rows: list = field(default_factory=list)   # (index, name, unit, cycles, basis)
    unknown: list = field(default_factory=list)

    @property
    def ms(self) -> float:
        return ms(self.cycles)

    @property
    def kpu_ms(self) -> float:
        return ms(self.kpu_cycles)

    @property
    def cpu_ms(self) -> float:
        return ms(self.cpu_cycles)


def ms(cycles: int) -> float:
    return 1000.0 * cycles / hw.KPU_FREQ_HZ


def kpu_conv_cycles(conv, streams_out: bool) -> int:
    c, h, w = conv.out_shape
    cycles = conv.macs / KPU_MACS_PER_CYCLE + KPU_LAYER_OVERHEAD
    cycles += conv.weights.nbytes / DMA_BYTES_PER_CYCLE
    if streams_out:
        cycles += c * h * w / DMA_BYTES_PER_CYCLE
    return int(cycles)


# ---------------------------------------------------------------------------------------------
# v3 CPU layers (SDK kpu.c runtime). The compiler's receipts and the zoo READMEs quote these.
def cpu_layer_cycles(layer) -> int:
    return _v3_row(layer)[0]


def _v3_row(layer):
    f, name = layer.fields, layer.name
    if name == "FULLY_CONNECTED":
        return CPU_CYCLES["mac"] * f["in_channels"] * f["out_channels"], "in x out float MACs"
    if name == "K210_UPLOAD":
        return CPU_CYCLES["copy"] * f["width"] * f["height"] * f["channels"], "bytes into KPU RAM"
    if name in ("QUANTIZED_CONCAT", "CONCAT"):
        return CPU_CYCLES["copy"] * sum(size for _, size in layer.data.get("ranges", [])), "bytes copied"
    if name == "GLOBAL_AVERAGE_POOL2D":
        return CPU_CYCLES["elem"] * f["kernel_size"] * f["channels"], "input elements"
    n = f.get("count") or f.get("channels") or 0
    if "in_shape" in f:
        w, h, c = f["in_shape"]
        n = w * h * c
    return CPU_CYCLES["elem"] * n, "elements"


def layer_cycles(layer) -> int:
    if layer.conv is not None:
        return kpu_conv_cycles(layer.conv, bool(layer.fields["flags"] & 1))
    return cpu_layer_cycles(layer)


# ---------------------------------------------------------------------------------------------
# v4 opcodes (nncase v0.2 runtime)
_V4 = {}


def _prod(shape):
    n = 1
    for d in shape:
        n *= int(d)
    return n


def _v4(*names):
    def deco(fn):
        for n in names:
            _V4[n] = fn
        return fn
    return deco


def _elems(rng) -> int:
    """Elements of a memory range (memory_type, datatype, start, size in bytes)."""
    _, dtype, _, size = rng
    return size // (4 if dtype == 0 else 1)


@_v4("kpu_upload")
def _v4_upload(f, d):
    return CPU_CYCLES["copy"] * _prod(f["in_shape"]), "bytes into KPU RAM"


@_v4("dequantize", "quantize")
def _v4_quant(f, d):
    return CPU_CYCLES["elem"] * max(_elems(f["input"]), _elems(f["output"])), "elements"


@_v4("binary")
def _v4_binary(f, d):
    return CPU_CYCLES["felem"] * _prod(f["out_shape"]), "output elements"


@_v4("quantized_binary")
def _v4_qbinary(f, d):
    return CPU_CYCLES["qelem"] * _prod(f["out_shape"]), "output elements"


_TRANSC_UNARY = {"exp", "log", "sin", "cos", "rsqrt"}


@_v4("unary")
def _v4_unary(f, d):
    from tl2k210.k210.kmodel.v4 import UNARY_OPS
    op = UNARY_OPS[f["unary_op"]] if f["unary_op"] < len(UNARY_OPS) else "?"
    per = CPU_CYCLES["transc"] if op in _TRANSC_UNARY else CPU_CYCLES["elem"]
    return per * _elems(f["output"]), f"elements x {op}"


def conv_out_shape(f, oc):
    """(n, oc, oh, ow) of an NCHW conv2d/quantized_conv2d node's fields."""
    n, ic, h, w = f["in_shape"]
    oh = (h + f["padding_h"][0] + f["padding_h"][1]
          - f["dilation_h"] * (f["filter_h"] - 1) - 1) // max(1, f["stride_h"]) + 1
    ow = (w + f["padding_w"][0] + f["padding_w"][1]
          - f["dilation_w"] * (f["filter_w"] - 1) - 1) // max(1, f["stride_w"]) + 1
    return n, oc, oh, ow


def _conv_macs(f, oc):
    ic = f["in_shape"][1]
    return max(0, _prod(conv_out_shape(f, oc)) * (ic // max(1, f["groups"])) * f["filter_h"] * f["filter_w"])


def _nhwc_conv_macs(f, oc, per_group_ic):
    n, h, w, _ = f["in_shape"]
    oh = (h + sum(f["padding_h"]) - f["dilation_h"] * (f["filter_h"] - 1) - 1) // max(1, f["stride_h"]) + 1
    ow = (w + sum(f["padding_w"]) - f["dilation_w"] * (f["filter_w"] - 1) - 1) // max(1, f["stride_w"]) + 1
    return max(0, n * oh * ow * oc * per_group_ic * f["filter_h"] * f["filter_w"])


def _convt_macs(f):
    n, ic, h, w = f["in_shape"]
    return n * h * w * f["out_shape"][1] * (ic // max(1, f["groups"])) * f["filter_h"] * f["filter_w"]


#: The v4 ops that multiply-accumulate on the CPU: their MACs from the node's fields. Their cost is
#: the MACs x CPU_CYCLES["qmac"] (the quantized ones) or ["fmac"]; node_macs counts them for inspect.
_MACS = {
    "conv2d": lambda f: _conv_macs(f, f["out_channels"]),
    "quantized_conv2d": lambda f: _conv_macs(f, f["out_channels"]),
    "cpu_conv2d": lambda f: _nhwc_conv_macs(f, f["out_channels"], f["in_shape"][3]),
    "cpu_quantized_conv2d": lambda f: _nhwc_conv_macs(f, f["out_channels"], f["in_shape"][3]),
    "cpu_depthwise_conv2d": lambda f: _nhwc_conv_macs(f, f["in_shape"][3], 1),
    "cpu_quantized_depthwise_conv2d": lambda f: _nhwc_conv_macs(f, f["in_shape"][3], 1),
    "conv2d_transpose": _convt_macs,
    "matmul": lambda f: f["a_rows"] * f["a_cols"] * f["b_cols"],
    "quantized_matmul": lambda f: f["a_rows"] * f["a_cols"] * f["b_cols"],
}


def _mac_cost(macs, quantized):
    unit, basis = ("qmac", "uint8 MACs on the CPU") if quantized else ("fmac", "float MACs on the CPU")
    return lambda f, d: (CPU_CYCLES[unit] * macs(f), basis)


for _name, _macs in _MACS.items():
    _v4(_name)(_mac_cost(_macs, "quantized" in _name))


@_v4("pad", "transpose", "memory_copy", "concat", "strided_slice")
def _v4_copy(f, d):
    rng = f.get("output") or f.get("input")
    return CPU_CYCLES["copy"] * rng[3], "bytes moved"


@_v4("softmax")
def _v4_softmax(f, d):
    return CPU_CYCLES["transc"] * f["inner_size"] * f["outer_size"], "elements x expf"


@_v4("reduce")
def _v4_reduce(f, d):
    return CPU_CYCLES["window"] * _prod(f["in_shape"]), "input elements"


@_v4("reduce_window2d", "cpu_reduce_window2d")
def _v4_reduce_window(f, d):
    return (CPU_CYCLES["window"] * _elems(f["output"]) * f["filter_h"] * f["filter_w"],
            "output elements x window")


@_v4("resize_image")
def _v4_resize(f, d):
    n, c = f["in_shape"][0], f["in_shape"][1]
    per = CPU_CYCLES["resize"] if f["mode"] == 0 else 3 * CPU_CYCLES["copy"]
    return per * n * c * f["out_h"] * f["out_w"], "output elements"


@_v4("table_lookup1d")
def _v4_lut(f, d):
    return CPU_CYCLES["copy"] * _elems(f["output"]), "elements"


@_v4("nnil_unary_method")
def _v4_nnil(f, d):
    return CPU_CYCLES["transc"] * _elems(f["output"]), "elements x interpreted method"


def node_macs(node) -> int:
    """Multiply-accumulates of one v4 node (its KPU conv, or a CPU conv/matmul; 0 for the rest)."""
    if node.conv is not None:
        return node.conv.macs
    fn = _MACS.get(node.name)
    return int(fn(node.fields)) if fn is not None and node.fields else 0


def node_row(node):
    """(cycles, unit, basis) of one v4 node."""
    if node.conv is not None:
        streams = node.fields["main_mem_output"][3] > 0
        return kpu_conv_cycles(node.conv, streams), "KPU", "MACs / 32 + layer overhead + DMA"
    fn = _V4.get(node.name)
    if fn is None or not node.fields:
        return 0, "CPU", "unknown"
    cycles, basis = fn(node.fields, node.data)
    return int(cycles), "CPU", basis


def estimate(model) -> Estimate:
    """Latency of one whole run of `model` (v3 or v4)."""
    rows, kpu_c, cpu_c, unknown = [], 0, 0, []
    if model.version == 3:
        for i, layer in enumerate(model.layers):
            if layer.conv is not None:
                c, unit, basis = layer_cycles(layer), "KPU", "MACs / 32 + layer overhead + DMA"
            else:
                c, basis = _v3_row(layer)
                c, unit = int(c), "CPU"
            rows.append((i, layer.name, unit, c, basis))
    else:
        for i, node in enumerate(model.nodes):
            c, unit, basis = node_row(node)
            if basis == "unknown":
                unknown.append(f"node {i} ({node.name})")
            rows.append((i, node.name, unit, c, basis))
    for _, _, unit, c, _ in rows:
        if unit == "KPU":
            kpu_c += c
        else:
            cpu_c += c
    return Estimate(kpu_c + cpu_c, kpu_c, cpu_c, rows, unknown)


def partial(est: Estimate, upto: int) -> Estimate:
    """The estimate of a run stopped after item `upto` (kpu.set_layers)."""
    rows = est.rows[:upto + 1]
    k = sum(r[3] for r in rows if r[2] == "KPU")
    c = sum(r[3] for r in rows if r[2] != "KPU")
    return Estimate(k + c, k, c, rows, est.unknown)

"""A first-order latency model of the K210 at 400 MHz, per kmodel layer.

Basis (documented, not measured on silicon by us):
* KPU conv: the KPU computes a 3x3 window over 64 channels per cycle group; we model
  ``MACs / KPU_MACS_PER_CYCLE`` plus a fixed per-layer overhead (argument push, weight load
  DMA at 8 bytes/cycle, interrupt). KPU_MACS_PER_CYCLE is calibrated so that the real
  facedetect_320x240_v3.kmodel (205.6 M MACs) lands at ≈ 16 ms, the ~60 fps MaixPy users
  report for it (50–70 fps, issue #2).
* Streaming a KPU output to main memory: 8 bytes per cycle (64-bit DMA).
* CPU layers run on the 400 MHz RV64GC core: ~4 cycles per float multiply-add (FPU, loads),
  ~6 cycles per uint8 element for table/requantize/add-style loops, ~2 per byte copied.
"""
from __future__ import annotations

from tl2k210.k210 import hardware as hw

KPU_MACS_PER_CYCLE = 32.0
KPU_LAYER_OVERHEAD = 2000
DMA_BYTES_PER_CYCLE = 8
CPU_CYCLES = {"mac": 4, "elem": 6, "copy": 2}


def kpu_conv_cycles(conv, streams_out: bool) -> int:
    c, h, w = conv.out_shape
    cycles = conv.macs / KPU_MACS_PER_CYCLE + KPU_LAYER_OVERHEAD
    cycles += conv.weights.nbytes / DMA_BYTES_PER_CYCLE
    if streams_out:
        cycles += c * h * w / DMA_BYTES_PER_CYCLE
    return int(cycles)


def cpu_layer_cycles(layer) -> int:
    f, name = layer.fields, layer.name
    if name == "FULLY_CONNECTED":
        return CPU_CYCLES["mac"] * f["in_channels"] * f["out_channels"]
    if name in ("K210_UPLOAD",):
        return CPU_CYCLES["copy"] * f["width"] * f["height"] * f["channels"]
    n = f.get("count") or f.get("channels") or 0
    if "in_shape" in f:
        w, h, c = f["in_shape"]
        n = w * h * c
    if name == "GLOBAL_AVERAGE_POOL2D":
        n = f["kernel_size"] * f["channels"]
    if name in ("QUANTIZED_CONCAT", "CONCAT"):
        n = sum(size for _, size in layer.data.get("ranges", []))
        return CPU_CYCLES["copy"] * n
    return CPU_CYCLES["elem"] * n


def layer_cycles(layer) -> int:
    if layer.conv is not None:
        return kpu_conv_cycles(layer.conv, bool(layer.fields["flags"] & 1))
    return cpu_layer_cycles(layer)


def ms(cycles: int) -> float:
    return 1000.0 * cycles / hw.KPU_FREQ_HZ

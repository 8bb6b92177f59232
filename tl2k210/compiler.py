"""`convert`: any supported model → quantized kmodel v3 (or v4), with a per-layer receipt.

    frontends → ONNX → graph IR → passes → calibration → k210.lower → kmodel v3 / v4
                                                       ↘ emulator trace vs float → SQNR per layer
"""
from __future__ import annotations

import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

from tl2k210.errors import KpuLimitError, QualityError, Tl2k210Error, UnsupportedOpError, nearest
from tl2k210.graph import RELABELS, describe, stage_names
from tl2k210.k210 import cost, firmware, hardware as hw
from tl2k210.k210.fit import BudgetError, FormatError  # noqa: F401  (raised by convert)
from tl2k210.k210.kmodel import atomic_write, dumps, v3
from tl2k210.k210.lower.concat_ranges import share_concat_ranges
from tl2k210.k210.lower.state import check_one_input
from tl2k210.quality import excused, finite_sqnr, ideal_text, ideal_words, quality_gate, sqnr_text
from tl2k210.tables import text_table

# what each firmware leaves for model file + main memory: one table, tl2k210/k210/firmware.py
RUNTIME_BUDGET = {name: r.model_budget for name, r in firmware.RUNTIMES.items()}


@dataclass
class ConvertOptions:
    dataset: str | None = None            # folder of images, or .npy/.npz
    input_range: tuple | None = None      # None: a quantized model's own input scale, else (0, 1)
    mean: tuple = (0.0,)
    std: tuple = (1.0,)
    channel_order: str = "RGB"
    method: str = "minmax"                # minmax | percentile | kld
    weight_bits: int = 8
    float_fc: bool = False                # dense layers as float CPU layers instead of KPU convs
    kpu_padding: bool = False
    runtime: str = "maixpy"
    calib_limit: int = 100
    sqnr_samples: int = 8
    input_shape: tuple | None = None      # NCHW, for models with symbolic dims
    input_values: tuple = ()              # ((input name, values), ...): inputs pinned to constants
    outputs: tuple | None = None          # end the model at these tensors (a decoder after them stays out)
    inputs: str | None = None             # start the model at this tensor (a front end before it stays out)
    network: object = None                # TensorLayer network for weight files
    format: str = "auto"                  # kmodel v3 | v4 | auto (v3 when every layer has a v3 form)
    optimize: str = "latency"             # latency: the fastest forms that fit (fit.LATENCY_SLACK) | size: the smallest
    weights: str | None = None            # weights .h5 of a Keras architecture .json
    progress: bool = True
    metadata: dict | None = None          # task, anchors, labels, decode, script, flash_address
                                          # for MODEL.kmodel.json (tl2k210/metadata.py)
    int8_rounding: str = "single"         # a quantized model's requantization: "single" (the desktop
                                          # TFLite interpreter's XNNPACK, ONNX Runtime) | "reference"
                                          # (TFLite's reference kernels = TFLite Micro: two roundings)
    min_sqnr: float = 15.0                # refuse outputs below this SQNR vs float, or not finite;
                                          # 0 accepts anything


def _times(ours: int, ideal: int, what: str) -> str:
    """ours as a multiple of its ideal ("1.15x the weights"); n/a for an ideal of nothing (a graph
    without weights)."""
    return f"{ours / ideal:.2f}x {what}" if ideal else f"n/a (no {what.removeprefix('the ')} in the ideal)"


@dataclass
class Receipt:
    source: str
    output: str
    file_size: int
    peak_kpu_ram: int
    main_memory: int
    latency_ms: float
    layers: list
    totals: dict = field(default_factory=dict)
    passes: list = field(default_factory=list)
    ideal: dict = field(default_factory=dict)     # the 8-bit ideal (k210/ideal.py): totals and per layer
    trades: list = field(default_factory=list)    # layers given a smaller, slower form to fit (fit.py)

    def table(self) -> str:
        cols = ("node", "unit", "why", "in", "out", "MACs", "weights", "ideal", "KPU lines", "cycles", "SQNR dB")
        rows, seen = [], set()
        for r in self.layers:
            ideal_w = "" if r["node"] in seen else f"{r.get('ideal_weight_bytes', 0):,}"
            seen.add(r["node"])
            rows.append((r["node"][:28], r["unit"], r["why"][:44], "x".join(map(str, r["in_shape"])),
                         "x".join(map(str, r["out_shape"])), f"{r['macs']:,}", f"{r['weight_bytes']:,}", ideal_w,
                         str(r["kpu_lines"] or "-"), f"{r['cycles']:,}",
                         sqnr_text(r.get("sqnr_db"), r.get("sqnr_note"))))
        lines = text_table(cols, rows)
        for r in self.layers:
            for note in r.get("notes", []):
                lines.append(f"  note {r['node']}: {note}")
        t = self.totals
        lines += ["",
                  f"file {self.output}: {self.file_size:,} bytes (kmodel {t.get('format', 'v3')}, "
                  f"{t.get('weights', '8-bit')} weights)",
                  f"KPU layers {t['kpu_layers']}, CPU layers {t['cpu_layers']}, MACs {t['macs']:,}"
                  + _overhead(self.file_size, self.layers, t),
                  f"peak KPU RAM {self.peak_kpu_ram:,} B of {hw.KPU_RAM_BYTES:,}; main memory "
                  f"{self.main_memory:,} B; runtime '{t['runtime']}' budget {t['budget']:,} B "
                  f"(model + main memory {self.file_size + self.main_memory:,} B)",
                  f"estimated latency {self.latency_ms:.2f} ms at 400 MHz (model in tl2k210/k210/cost.py)"]
        short = firmware.RUNTIMES[t["runtime"]].short_of(self.file_size + self.main_memory) \
            if t.get("runtime") in firmware.RUNTIMES else None
        lines += [f"warning: {short}"] if short else []
        if self.ideal:
            i, ours = self.ideal, self.file_size + self.main_memory
            lines.append(f"ideal at {i['weight_bits']} bits: weights {i['weight_bytes']:,} B + maps "
                         f"{i['live_bytes']:,} B (live at {i['peak_at']}) = {i['total']:,} B; ours: kmodel "
                         f"{_times(self.file_size, i['weight_bytes'], 'the weights')}, main memory "
                         f"{_times(self.main_memory, i['live_bytes'], 'the maps')}"
                         + (f" ({fo:,} B of it the float32 outputs the runtime returns; the ideal counts "
                            "them at 8 bits)" if (fo := t.get("float_outputs", 0)) >= self.main_memory / 10 else "")
                         + f", total {ours / max(1, i['total']):.2f}x")
        if self.trades and t.get("fastest_need"):     # what the trades bought, in the budget's terms
            lines.append(f"traded in all: model + main memory {t['fastest_need']:,} B in each layer's fastest "
                         f"forms, {self.file_size + self.main_memory:,} B in these; est. {t['fastest_ms']:.2f} -> "
                         f"{self.latency_ms:.2f} ms")
        lines += [f"traded: {line}" for line in self.trades]
        if t.get("format_why"):
            lines.append(t["format_why"])
        if t.get("kpu_padding_effect"):
            for name, e in t["kpu_padding_effect"].items():
                lines.append(f"--kpu-padding changed the float model: output {name} SQNR "
                             f"{e['sqnr_db']:.1f} dB, cosine {e['cosine']:.4f} vs the exact graph")
        if t.get("input_range_note"):
            lines.append(t["input_range_note"])
        if t.get("calibration_note"):
            lines.append(t["calibration_note"])
        if t.get("input_note"):
            lines.append(t["input_note"])
        for key in ("layout_note", "constants_note"):
            if t.get(key):
                lines.append(t[key])
        outs = t.get("outputs", {})
        for name, o in outs.items() if len(outs) > 1 or t.get("output_sqnr_db") is None else ():
            v = o["sqnr_db"]
            lines.append(f"output {name}: SQNR vs float " + (f"{v:.1f} dB" if v is not None else o["sqnr_note"])
                         + ideal_text(o))
        if t.get("output_sqnr_db") is not None:
            part = t.get("calib_samples", 0) > t["sqnr_samples"]     # the first N of them
            said = ["the lowest"] if len(outs) > 1 else [ideal_words(o) for o in outs.values() if ideal_words(o)]
            said += ["--sqnr-samples N measures more"] if part else []
            n = f"the first {t['sqnr_samples']} of {t['calib_samples']}" if part else f"{t['sqnr_samples']}"
            lines.append(f"output SQNR vs float {t['output_sqnr_db']:.1f} dB on {n} calibration samples"
                         + (f" ({'; '.join(said)})" if said else ""))
        if t.get("input_ignored"):
            lines.append(f"warning: the float model gives the same outputs for all {t['sqnr_samples']} calibration "
                         "samples: its outputs do not depend on its input (a graph cut off from its input, weights "
                         "never trained, or preprocessing that flattens every image: check --input-range, --mean "
                         "and --std); the SQNR above says nothing about the input")
        passed = excused(t, t.get("min_sqnr", 0))
        if passed:        # the gate let them through: at their ideal with the model's own int8 ranges
            lines.append(f"warning: output {', '.join(passed)} below --min-sqnr {t['min_sqnr']:g} dB passed "
                         "because the float model with the model's own int8 ranges loses as much (its 8-bit "
                         "ideal): the int8 model's own loss on these samples, or ranges that do not fit them; "
                         "check the kmodel against the source model (tl2k210 compare) before trusting it")
        return "\n".join(lines)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, default=_json_default)


WEIGHT_OPS = ("Conv", "ConvTranspose", "Gemm", "MatMul")
_SAME_SIZE = ("Transpose", "Reshape", "Cast", "Identity", "DequantizeLinear", "Squeeze", "Unsqueeze", "Flatten")


def weight_census(onnx_model):
    """[(node name, op, parameters)] of every Conv/ConvTranspose/Gemm/MatMul weight, counted from
    initializer dims and ConstantOfShape shapes without materialising a single weight (the ONNX
    zoo's files build their weights with ConstantOfShape: VGG-19 would be 548 MB of floats)."""
    from onnx import numpy_helper
    gp = onnx_model.graph
    size, value = {}, {}
    for t in gp.initializer:
        size[t.name] = int(np.prod(t.dims))
        if t.data_type == 7 and size[t.name] <= 8:       # small int64 shape operands
            value[t.name] = numpy_helper.to_array(t)
    for n in gp.node:
        if n.op_type == "Constant":
            for a in n.attribute:
                if a.name == "value":
                    size[n.output[0]] = int(np.prod(a.t.dims))
                    if a.t.data_type == 7 and size[n.output[0]] <= 8:
                        value[n.output[0]] = numpy_helper.to_array(a.t)
        elif n.op_type == "ConstantOfShape" and n.input and n.input[0] in value:
            size[n.output[0]] = int(np.prod(value[n.input[0]]))
        elif n.op_type in _SAME_SIZE and n.input and n.input[0] in size:
            size[n.output[0]] = size[n.input[0]]
    return [(n.name or n.output[0], n.op_type, size[n.input[1]]) for n in gp.node
            if n.op_type in WEIGHT_OPS and len(n.input) > 1 and n.input[1] in size]


def _and(items) -> str:
    return " and ".join(items) if len(items) < 3 else ", ".join(items[:-1]) + " and " + items[-1]


def check_weight_budget(onnx_model, opts, where):
    """Refuse at once (before shape inference, folding or calibration) a model whose weights
    alone, at the chosen bits, exceed what the runtime leaves for model + main memory (the rest
    of the ideal, k210/ideal.py, needs the graph: fit.check_ideal, after the passes)."""
    census = weight_census(onnx_model)
    params = sum(c for _, _, c in census)
    need = params * opts.weight_bits // 8
    budget = RUNTIME_BUDGET[opts.runtime]
    if need <= budget:
        return params
    top = sorted(census, key=lambda r: -r[2])[:3]
    bigger = sorted((k for k, v in RUNTIME_BUDGET.items() if v >= need), key=RUNTIME_BUDGET.get)
    raise BudgetError(
        f"{where}: {params:,} weights = {need:,} B at {opts.weight_bits} bits (the ideal's weights alone, "
        "before its maps), more than the "
        f"{budget:,} B '{opts.runtime}' firmware leaves for model + main memory (largest: "
        + ", ".join(f"{name} {op} {c:,}" for name, op, c in top) + "); "
        + (f"{_and([f'{b} ({RUNTIME_BUDGET[b]:,} B)' for b in bigger])} hold the weights: try "
           f"--runtime {bigger[-1]}, the largest (its maps and kmodel version are checked next)" if bigger else
           "no K210 runtime holds it: use a smaller network (fewer channels, no big dense layers) or prune it")
        + ". Nothing was written.")


def check_map_budget(graph, where):
    """Refuse, before any calibration data is read or any tensor allocated, a model one of whose
    feature maps alone (8-bit, as the K210 holds it) exceeds the chip's whole memory (main SRAM +
    KPU RAM): a [1,3,100000,100000] input would otherwise fail only by running out of memory."""
    from tl2k210.k210 import hardware as hw
    budget = hw.MAIN_SRAM_BYTES + hw.KPU_RAM_BYTES
    for name in list(graph.inputs) + [o for n in graph.nodes for o in n.outputs]:
        t = graph.tensors.get(name)
        shape = t.shape if t is not None and not t.is_const else None
        if not shape or any(not isinstance(d, (int, np.integer)) for d in shape):
            continue
        size = math.prod(int(d) for d in shape)
        if size > budget:
            raise BudgetError(
                f"{where}: tensor {name!r} of shape {'x'.join(map(str, shape))} is {size:,} B even "
                f"at 8 bits, more than a K210's {budget >> 20} MiB of memory; use a smaller input "
                f"size: --input-shape{_smaller_input(graph, size)} where the model runs at any size (MTCNN's "
                "P-Net exported at 1280x960, AnimeGAN: hunt 22), else export it smaller. Nothing was written.")


def _smaller_input(graph, size) -> str:
    """' N,C,H,W' (in the input's own order): its spatial dims scaled so that a map of `size`
    bytes, which grows with them, keeps to full MaixPy's budget, in steps of 16; '' where the
    input is no 4-D image."""
    shape = graph.shape(graph.inputs[0]) if graph.inputs else None
    if not shape or len(shape) != 4 or any(not isinstance(d, (int, np.integer)) for d in shape):
        return ""
    budget = firmware.RUNTIMES["maixpy"].model_budget
    f = math.sqrt(budget / size)
    hw = (2, 3) if shape[1] <= 4 else (1, 2)        # NCHW: channels first (3, 1 or 4); else NHWC
    dims = [max(16, int(shape[i] * f) // 16 * 16) if i in hw else int(shape[i]) for i in range(4)]
    return " " + ",".join(map(str, dims)) + f" (this tensor then about {budget / firmware.MiB:g} MiB)"


def source_name(source):
    """What to call a model in messages: its path, or the name of a model object."""
    if isinstance(source, (str, os.PathLike)):
        return str(source)
    if hasattr(source, "graph") and hasattr(source.graph, "name"):       # onnx.ModelProto
        return f"ONNX model {source.graph.name or '(unnamed)'}"
    return str(getattr(source, "name", type(source).__name__))


def _json_default(o):
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    return str(o)


def _format_why(model, lw, opts, note="") -> str:
    if lw.format == "v3":
        why = "kmodel v3: every layer has a v3 form (loads on every MaixPy build)" if opts.format == "auto" else ""
        if model.compact:
            why += ("; " if why else "kmodel v3: ") + (
                f"K210_CONV weights and BN tables at {v3.COMPACT_ALIGN['weights']}-byte file offsets (nncase "
                f"v0.1's alignment, as in MaixPy's own face detection model; {v3.DEFAULT_ALIGN['weights']} "
                "unless --optimize size, or the model needs it to fit)")
        return why
    from tl2k210.k210.fit import forced_text
    if opts.format == "auto" and note:
        return note
    if opts.format == "auto" and lw.forced_by:      # a node v3 has no form for, or a whole-model reason
        return (f"kmodel v4 (--format auto): v3 cannot express {forced_text(lw.forced_by)}" if lw.forced_by[0]
                else f"kmodel v4 (--format auto): not v3, as {lw.forced_by[1]}")
    return "kmodel v4 (--format v4)"


def _say(opts, msg):
    if opts.progress:
        print(msg, file=sys.stderr, flush=True)


def pixel_mapping(opts: ConvertOptions, channels: int, graph=None):
    """x_float = pixel * scale[c] + offset[c], the preprocessing as one affine map per channel:
    the user's (--input-range, --mean, --std) followed by the model's own in-graph preprocessing
    that passes.input_affine took out of `graph`."""
    lo, hi = opts.input_range or (0.0, 1.0)
    for flag, v in (("--mean", opts.mean), ("--std", opts.std)):
        if len(v) not in (1, channels):
            raise Tl2k210Error(f"{flag} has {len(v)} values; the model input has {channels} "
                               f"channel(s): give 1 value or {channels}")
    mean = np.resize(np.asarray(opts.mean, np.float64), channels)
    std = np.resize(np.asarray(opts.std, np.float64), channels)
    scale = (hi - lo) / 255.0 / std
    offset = (lo - mean) / std
    if opts.channel_order.upper() == "BGR":
        scale, offset = scale[::-1], offset[::-1]
    if graph is not None:
        a, b = input_affine(graph, channels)
        scale, offset = scale * a, offset * a + b
    return scale, offset


def load_pixels(path: str, chw, limit: int, opts: ConvertOptions, flat: str | None = None) -> np.ndarray:
    """(N, C, H, W) uint8 pixels from a folder of images (resized like the runtime), or arrays
    from .npy/.npz (NCHW or NHWC): uint8 arrays are pixels (in the model's channel order), others
    float32 model input (already preprocessed)."""
    from PIL import Image

    from tl2k210.imaging import open_image
    from tl2k210.quantize.dataset import array_files, image_files, load_arrays
    p = Path(path)
    if not p.exists():
        raise Tl2k210Error(f"dataset {path}: no such file or folder; check the path")
    c, h, w = chw
    if p.is_dir() and not array_files(p):
        out = []
        for f in image_files(p)[:limit]:
            img = open_image(f, "L" if c == 1 else "RGB")
            if img.size != (w, h):
                img = img.resize((w, h), Image.BILINEAR)
            a = np.asarray(img)
            a = a[None] if c == 1 else a.transpose(2, 0, 1)
            if opts.channel_order.upper() == "BGR" and c == 3:
                a = a[::-1]
            out.append(a)
        return np.stack(out).astype(np.uint8)
    arrays = load_arrays(p, (1, c, h, w), keep_dtype=True, flat=flat)[:limit]
    if all(a.dtype == np.uint8 for a in arrays):
        return np.concatenate(arrays)
    return np.concatenate(arrays).astype(np.float32)


def input_affine(graph, channels):
    """(a[C], b[C]) of the model's in-graph preprocessing taken out by passes.input_affine: the
    IR's input is (model input) * a + b. Identity when there was none."""
    if "input_affine" not in graph.meta:
        return np.ones(channels), np.zeros(channels)
    return tuple(np.resize(np.asarray(v, np.float64), channels) for v in graph.meta["input_affine"])


#: ops between an image input and its first arithmetic that move or resample pixels only
_PIXEL_MOVES = ("Transpose", "Reshape", "Resize", "Identity", "Cast")


def pixel_rescaling(graph) -> str | None:
    """What the model's own first op does where it scales 0..255 pixels itself (Keras' Rescaling(1/255)
    or Rescaling(1/127.5, offset=-1), the TF tutorials' preprocessing layers inside the model: a
    Mul by 1/255 or 2/255, a Div by 255 or 127.5, after moves or a resize), else None: its input is
    then 0..255, not the (0, 1) a float model defaults to, which would divide the pixels twice."""
    x = graph.inputs[0]
    if len(graph.shape(x) or ()) != 4 or x in graph.meta.get("input_quant", {}):
        return None
    t = x
    while len(users := graph.consumers(t)) == 1 and users[0].op in _PIXEL_MOVES and users[0].inputs[0] == t:
        t = users[0].outputs[0]
    for n in graph.consumers(t):
        if n.op not in ("Mul", "Div") or len(n.inputs) != 2 or (n.op == "Div" and n.inputs[0] != t):
            continue
        c = graph.const(n.inputs[1] if n.inputs[0] == t else n.inputs[0])
        if c is None or np.size(c) != 1:
            continue
        k = float(np.ravel(c)[0]) * 255 if n.op == "Mul" else 255 / float(np.ravel(c)[0] or np.inf)
        if any(abs(k - v) <= 1e-4 * v for v in (1.0, 2.0)):
            return (f"{n.op} {n.name!r} scales the input by {'1' if abs(k - 1) < 0.01 else '2'}/255 itself "
                    "(a Rescaling layer): its input is the pixels 0..255")
    return None


#: the input ranges a float-input int8 model's first QuantizeLinear is read as, within two of its steps
#: (zye1996's MobileFaceNet: 1/128, zero point -1, -0.992..1: -1,1)
FLOAT_INPUT_RANGES = ((0.0, 1.0), (-1.0, 1.0), (0.0, 255.0))


def _integer_input_range(q) -> tuple:
    """(lo, hi) the kmodel's input codes 0..255 stand for, from a quantized model's integer input
    quantization `q` (scale, zero point, dtype): uint8 q -> (q - zp) * scale, int8 q = code - 128."""
    scale, zp, dtype = q
    zp_u8 = zp + 128 if dtype == "int8" else zp
    return -zp_u8 * scale, (255 - zp_u8) * scale


def _reaches_past(own, given) -> bool:
    """Does range `given` reach past `own` by more than half own's width (what its quantization
    saturates)?"""
    (lo, hi), (a, b) = own, given
    return max(0.0, lo - a) + max(0.0, b - hi) > 0.5 * (hi - lo)


#: the share of a quantized input's range under which the input given is not what it was made for
NARROW_INPUT = 0.1


def _narrow(own, given) -> bool:
    """Does range `given` span under NARROW_INPUT of `own`, the range a model's input quantization
    stands for (PINTO's int8 PoseNet: 0..255 at scale 1, given -1,1: TFLite rounds that to 3 of its
    256 input levels, and the kmodel and the model disagree at -30 dB where the receipt read 27 dB;
    hunt 22)?"""
    (lo, hi), (a, b) = own, given
    return b - a < NARROW_INPUT * (hi - lo)


def _integer_input_mismatch(q, opts: ConvertOptions) -> str | None:
    """The warning for an --input-range that reaches past what a quantized model's integer input
    stands for (cifar int8 at 0..1 given -1,1: the negative half saturated silently;
    ModelRanges.input_mismatch says it for a float input quantized first)."""
    if q is None or opts.input_range is None:
        return None
    own = _integer_input_range(q)
    past = _reaches_past(own, opts.input_range)
    if not past and not _narrow(own, opts.input_range):
        return None
    scale, zp, dtype = q
    (lo, hi), (a, b) = own, opts.input_range
    return (f"warning: --input-range {a:g},{b:g} {'reaches past' if past else 'spans a sliver of'} what the "
            f"model's {dtype} input stands for ({lo:.4g}..{hi:.4g}: scale {scale:.6g}, zero point {zp})"
            f"{', which saturates the rest' if past else ''}; without --input-range the kmodel takes that range")


def model_input_range(graph, opts: ConvertOptions):
    """opts with input_range resolved: the user's, else the pixel values of a decoded image the
    front end cut off (frozen_pb), else what a quantized model's integer input stands for (uint8 q -> (q - zp) * scale: pixels 0..255 -> [-zp*s, (255-zp)*s]),
    else the common range (FLOAT_INPUT_RANGES) its first QuantizeLinear of a float input stands for, else
    (no --mean/--std given) that range itself (a wake word's spectrogram: -5.99..3.86; 0..1 had
    clipped 92 % of it), else (0, 1).
    Returns (opts, note or None)."""
    q = graph.meta.get("input_quant", {}).get(graph.inputs[0])
    if opts.input_range is not None:
        return opts, _integer_input_mismatch(q, opts)
    if "input_range" in graph.meta:
        rng = graph.meta["input_range"]
        why = graph.meta.get("input_range_why") or ("the decoded image's pixel values, which the graph's "
                                                      "own decoder gave its network")
        return replace(opts, input_range=rng), (
            f"input range {rng[0]:g},{rng[1]:g}: {why}; override with --input-range")
    own = graph.meta.get("quant_ranges", {}).get(graph.inputs[0])
    if q is None and own is not None:       # a float input the model quantizes first (int8 with float I/O)
        step = (own[1] - own[0]) / 255
        rng = next((r for r in FLOAT_INPUT_RANGES if abs(r[0] - own[0]) <= 2 * step and abs(r[1] - own[1]) <= 2 * step),
                   None)
        if rng is not None:
            return replace(opts, input_range=rng), (
                f"input range {rng[0]:g},{rng[1]:g}: what the model's first QuantizeLinear of its float input "
                f"stands for ({own[0]:.6g}..{own[1]:.6g}); override with --input-range")
        if opts.mean == (0.0,) and opts.std == (1.0,):     # a spectrogram, a sensor's values: no image's
            rng = (float(own[0]), float(own[1]))
            return replace(opts, input_range=rng), (
                f"input range {rng[0]:.6g},{rng[1]:.6g}: what the model's first QuantizeLinear of its float "
                "input stands for (none of 0..1, -1..1, 0..255): the kmodel's input codes 0..255 are the "
                "model's int8 input + 128; for pixels the model normalizes otherwise, give --mean/--std or "
                "--input-range")
    if q is None:
        image = len(graph.shape(graph.inputs[0]) or ()) == 4
        return replace(opts, input_range=(0.0, 1.0)), (
            "input range 0,1: a float model's default (the pixels / 255); for a model trained on other "
            "input give --input-range (0,255: the pixels as they are), --mean/--std and --bgr as it was"
            if image and opts.mean == (0.0,) and opts.std == (1.0,) else None)
    scale, zp, dtype = q
    rng = _integer_input_range(q)
    how = (f"quantization (scale {scale:.6g}, zero point {zp})" if dtype in ("uint8", "int8") else
           "values as the model casts them to float" if (scale, zp) == (1, 0) else
           f"scale {scale:.6g}, zero point {zp}")
    return replace(opts, input_range=rng), (f"input range {rng[0]:.6g},{rng[1]:.6g} taken from the model's "
                                            f"{dtype} input {how}; override with --input-range")


def _flat_order(graph):
    """The order samples of an input sized without a batch axis, or reshaped for its first conv
    (passes.input_nchw), come in when in the source's own shape: "NHWC" where input_nchw made
    the source's NHWC input NCHW, else "NCHW"; None for any other input (no such samples)."""
    x = graph.inputs[0]
    if x not in graph.meta.get("unbatched", ()) and x not in graph.meta.get("relabelled", ()):
        return None
    return "NHWC" if graph.meta.get("input_layout", {}).get(x) == "NHWC->NCHW" else "NCHW"


def _feature_range(graph, opts: ConvertOptions):
    """(opts, note) with the --dataset arrays' min and max as the input range, for a float vector
    input the model reshapes into the map its first conv reads (passes.input_nchw: the kmodel reads
    that map as codes 0..255, as it would an image) where no --input-range, --mean/--std or own
    quantization says what its values stand for: features, not pixels (a keyword spotter's
    MFCCs, -61..14, had been refused as "96 % outside 0..1"). Else None."""
    from tl2k210.quantize.dataset import array_files, load_arrays
    x = graph.inputs[0]
    was = graph.meta.get("relabelled", {}).get(x)
    if (was is None or opts.input_range is not None or opts.dataset is None or opts.mean != (0.0,)
            or opts.std != (1.0,) or x in graph.meta.get("input_quant", {}) or x in graph.meta.get("quant_ranges", {})):
        return None
    p = Path(opts.dataset)
    if not (p.is_file() and p.suffix in (".npy", ".npz") or p.is_dir() and array_files(p)):
        return None
    data = np.concatenate(load_arrays(p, tuple(graph.shape(x)), flat=_flat_order(graph)))[:opts.calib_limit]
    if data.dtype == np.uint8 or not data.size:
        return None
    rng = (float(data.min()), float(data.max()))
    if not rng[0] < rng[1]:
        return None
    return replace(opts, input_range=rng), (
        f"input range {rng[0]:.6g},{rng[1]:.6g}: the --dataset arrays' min and max (the model's {was} input is "
        f"features, not pixels; the kmodel reads them as codes 0..255 over that range); override with --input-range")


class ModelRanges:
    """The activation ranges a quantized model states itself (passes.dequantize kept them in
    graph.meta["quant_ranges"]: what each int8/uint8 tensor stood for). Without --dataset they
    are the calibration (`samples`: a few smooth synthetic images, or values over the range of
    an input that is no image, only for the tensors the model states no range for and for the
    receipt's SQNR); with one, a check against it."""

    SYNTHETIC = 16

    def __init__(self, graph, samples=None):
        self.quantized = bool(graph.meta.get("quant_ranges"))
        self.own = {t: r for t, r in graph.meta.get("quant_ranges", {}).items() if t in graph.tensors}
        by_node = graph.meta.get("quant_ranges_by_node", {})
        for n in graph.nodes:      # a fused node's output: the range of the last node fused into it
            chain = list(n.fused) or [n.name]
            act = (n.attrs.get("activation") or {}).get("op")
            if act not in (None, "Relu", "Clip") and n.outputs:
                # a Sigmoid (Tanh, ...) fused into the op that feeds it: MoveNet's heat maps. What it
                # reads is the op's own range (the logits, -68..3.7: the table fitted to 16
                # synthetic images' -7..-1.6 had flattened every peak; only for an op and one
                # activation node: a hard-swish's fused HardSigmoid and Mul range otherwise), and
                # what it writes is its own, or none: not the logits' (a kept name can carry theirs)
                if len(chain) == 2 and chain[0] in by_node and not n.attrs.get("pool"):
                    self.own.setdefault(stage_names(n)["conv"], by_node[chain[0]])
                if chain[-1] in by_node:
                    self.own[n.outputs[0]] = by_node[chain[-1]]
                else:
                    self.own.pop(n.outputs[0], None)
                continue
            names = [m for m in [n.name] + list(n.fused) if m in by_node]
            if names and n.outputs and n.outputs[0] not in self.own:
                self.own[n.outputs[0]] = by_node[names[-1]]
            if n.attrs.get("pool") and n.outputs[0] in self.own:
                # a pool fused into its conv: the layer requantizes onto the grid of what the pool
                # reads (stage "act"), the model's range of the node before the pool; a max pool
                # keeps its input's range (TinyML Cookbook's int8 CIFAR-10: that stage took the 16
                # synthetic images' range, 12 % of the pooled bytes 1 LSB off TFLite, a few 57)
                before = [m for m in names if m != chain[-1]]
                if before or n.attrs["pool"]["kind"] == "max":
                    self.own.setdefault(stage_names(n)["act"],
                                        by_node[before[-1]] if before else self.own[n.outputs[0]])
        for n in graph.nodes:
            # a Clip that stands for an int8 output's saturation (passes.dequantize) and did not
            # fuse into its op: the op writes that grid too, through the moves between them (a
            # cifar int8 TFLite's dense layer: conv + reshape; without --dataset the 16 synthetic
            # images' range had clipped its logits to -7.8..2.7 of the file's -13..10.8)
            t = n.inputs[0] if n.op == "Clip" and n.outputs[0] in self.own else None
            while t is not None and t not in self.own and t not in graph.inputs:
                self.own[t] = self.own[n.outputs[0]]
                p = graph.producer(t)
                t = p.inputs[0] if p is not None and p.op in RELABELS else None
        self.samples = samples

    def input_mismatch(self, graph, ranges) -> str | None:
        """Where the model states what its float input stands for (a first QuantizeLinear: -1..1
        for zye1996's MobileFaceNet) and the calibrated input reaches beyond it by more than half
        its width: the samples are not what the model takes, and its first QuantizeLinear saturates
        them (a 0.0 dB kmodel passed the gate as 'the model's own loss'). The warning, else None."""
        x = graph.inputs[0]
        if x not in self.own or x not in ranges:
            return None
        (lo, hi), (a, b) = self.own[x], ranges[x]
        if _reaches_past((lo, hi), (a, b)):
            why = "its first QuantizeLinear saturates the rest, as the source model does"
        elif _narrow((lo, hi), (a, b)):
            why = (f"the samples use {(b - a) / (hi - lo):.1%} of it: the source model rounds them to a few of its "
                   "input levels, and the kmodel's outputs stand for what it was not made for")
        else:
            return None
        return (f"warning: the samples reach {a:.4g}..{b:.4g} at the model input, but the model's own input "
                f"quantization stands for {lo:.4g}..{hi:.4g} ({why}): convert with --input-range {lo:.4g},{hi:.4g} "
                "(or the --mean/--std that map the pixels there)")

    def apply(self, ranges, from_model):
        """Use the model's own ranges in `ranges` (with --dataset: compared to the calibrated ones
        first); the receipt's note, or None for a float model."""
        both = [t for t in self.own if t in ranges]
        if not both:
            return None
        ratio = {t: (ranges[t][1] - ranges[t][0]) / max(self.own[t][1] - self.own[t][0], 1e-12) for t in both}
        ranges.update({t: self.own[t] for t in both})    # the model's grid: its layers round as TFLite's
        if from_model:
            return (f"calibration: the model's own int8 ranges for {len(both)} of {len(ranges)} tensors "
                    f"(no --dataset); the other tensors and the SQNR below from {self.SYNTHETIC} "
                    "synthetic samples")
        lo, hi = min(ratio, key=ratio.get), max(ratio, key=ratio.get)
        return (f"the model's own int8 ranges vs --dataset's for {len(both)} tensors: calibrated width / "
                f"the model's {np.median(list(ratio.values())):.2f} median, {ratio[lo]:.2f} at {lo[:40]}, "
                f"{ratio[hi]:.2f} at {hi[:40]} (the model's are used: on them the kmodel rounds as the "
                "TFLite model does; --dataset gives the other tensors' ranges)")


def model_ranges(graph, opts: ConvertOptions, where):
    """ModelRanges of `graph`; without --dataset, a fully quantized model gets synthetic samples
    (written to a temporary .npy), any other model is refused."""
    own = ModelRanges(graph)
    if opts.dataset is not None:
        return own
    if not own.quantized:
        raise Tl2k210Error(f"{where}: convert needs calibration data: --dataset DIR (images) or "
                           "FILE.npy/.npz (only a fully quantized model, whose own scales give the "
                           "ranges, converts without)")
    from tl2k210.passes.input_nchw import input_layout
    shape = graph.shape(graph.inputs[0])
    rng = np.random.default_rng(0)
    layout = input_layout(graph)
    if layout is None:     # no image (a feature vector, a spectrogram): values over the input's range
        lo, hi = opts.input_range
        return _synthetic(own, rng.uniform(lo, hi, (ModelRanges.SYNTHETIC, *shape[1:])).astype(np.float32))
    c, h, w = shape[1:] if layout == "NCHW" else (shape[3], shape[1], shape[2])
    coarse = rng.uniform(0, 255, (ModelRanges.SYNTHETIC, c, 4, 4))
    yy, xx = np.linspace(0, 3, h), np.linspace(0, 3, w)
    y0, x0 = np.minimum(yy.astype(int), 2), np.minimum(xx.astype(int), 2)
    fy, fx = (yy - y0)[:, None], (xx - x0)[None, :]
    img = (coarse[:, :, y0][:, :, :, x0] * (1 - fy) * (1 - fx) + coarse[:, :, y0 + 1][:, :, :, x0] * fy * (1 - fx)
           + coarse[:, :, y0][:, :, :, x0 + 1] * (1 - fy) * fx + coarse[:, :, y0 + 1][:, :, :, x0 + 1] * fy * fx)
    img += rng.normal(0, 8, img.shape)
    return _synthetic(own, np.clip(np.rint(img), 0, 255).astype(np.uint8))


def _synthetic(own: ModelRanges, samples: np.ndarray) -> ModelRanges:
    """`own` with `samples` written to a temporary .npy (calibrate deletes it)."""
    import tempfile
    fd, path = tempfile.mkstemp(suffix=".npy", prefix="tl2k210-synthetic-")
    os.close(fd)
    np.save(path, samples)
    own.samples = path
    return own


#: the share of float calibration values outside the input's 0..255 codes above which convert refuses
CLIPPED_REFUSED = 0.10


def model_inputs(graph, dataset, limit, opts: ConvertOptions):
    """(floats (N, *input_shape[1:]) float32 in the graph's input layout, pixels uint8 in the
    same order -- what the kmodel reads, (N, C, H, W) once passes.input_nchw ran -- or None). Image models see exactly the pixels the device gets: the float input is
    recomputed from them. The layout (NCHW/NHWC) and the size (H may differ from W) are read
    from the graph's input."""
    from tl2k210.passes.input_nchw import input_chw, input_layout
    from tl2k210.quantize.dataset import array_files, load_arrays
    shape = tuple(graph.tensors[graph.inputs[0]].shape)
    p = Path(dataset)
    if not p.exists():
        raise Tl2k210Error(f"dataset {dataset}: no such file or folder; check the path")
    layout, chw = input_layout(graph), input_chw(graph)
    was = graph.meta.get("relabelled", {}).get(graph.inputs[0])     # a vector the model reshapes: no image
    if (chw is None or chw[0] not in (1, 3) or was) and p.is_dir() and not array_files(p):
        shape = was or shape
        as_image = "" if chw is None or was else " ({}x{}x{} CxHxW)".format(*chw)
        last = "" if chw is None or was else " or channels-last (N, {1}, {2}, {0})".format(*chw)
        raise Tl2k210Error(f"dataset {dataset} has no .npy/.npz arrays, and images give 1 (gray) or 3 (RGB) "
                           f"channels, but the model's input {shape}{as_image} is no image: give .npy/.npz arrays "
                           f"of shape (N, {', '.join(str(d) for d in shape[1:])}){last} (a fully quantized model "
                           "also converts without --dataset: its own scales give the ranges)")
    if layout is None:
        return np.concatenate(load_arrays(p, shape))[:limit].astype(np.float32), None
    data = load_pixels(dataset, chw, limit, opts, _flat_order(graph))
    scale, offset = pixel_mapping(opts, chw[0], graph)
    s4, o4 = scale[None, :, None, None], offset[None, :, None, None]
    if data.dtype == np.uint8:
        pixels = data
    else:    # float arrays are model inputs: apply the model's own preprocessing, then invert ours
        a, b = input_affine(graph, chw[0])
        raw = np.rint((data * a[None, :, None, None] + b[None, :, None, None] - o4) / s4)
        clipped = float(np.mean((raw < 0) | (raw > 255)))
        if clipped > 0.01:
            lo, hi = opts.input_range or (0.0, 1.0)
            own = "" if np.any(np.asarray(opts.mean) != 0) or np.any(np.asarray(opts.std) != 1) else (
                f"; if they are the model's own features, not pixels (MFCCs, a spectrogram), give their range: "
                f"--input-range {float(data.min()):.4g},{float(data.max()):.4g} (the arrays' min and max)")
            what = (f"{clipped:.0%} of the dataset values lie outside what 0..255 pixels become with "
                    f"--input-range {lo:g},{hi:g} --mean/--std; float arrays are taken as preprocessed model "
                    f"input: pass uint8 pixel arrays, or check those flags{own}")
            if clipped > CLIPPED_REFUSED and opts.min_sqnr > 0:
                # (MLPerf Tiny's keyword spotter on MFCCs at 0..1: 93 % clipped, a 50.5 dB receipt
                # measured on the clipped values, the kmodel unable to take its input; 26.0 dB at its range)
                raise QualityError(f"{what}. The kmodel could not take such input, and its SQNR would be "
                                   "measured on the clipped values. Nothing was written; --min-sqnr 0 converts "
                                   "it anyway")
            print(f"warning: {what}. They are clipped to it, and the SQNR below is measured on the clipped "
                  "values", file=sys.stderr)
        pixels = np.clip(raw, 0, 255).astype(np.uint8)
    floats = (pixels * s4 + o4).astype(np.float32)
    if graph.meta.get("bgr_folded"):     # the model's B, G, R planes -> the camera's R, G, B, which it now reads
        floats, pixels = np.ascontiguousarray(floats[:, ::-1]), np.ascontiguousarray(pixels[:, ::-1])
    if layout == "NCHW":
        return floats, pixels
    # an input the passes left channels-last (no layout change below it): the kmodel reads it in
    # the graph's order, so the device gets the pixels in that order too
    return (np.ascontiguousarray(floats.transpose(0, 2, 3, 1)),
            np.ascontiguousarray(pixels.transpose(0, 2, 3, 1)))


def calibrated_ranges(graph, batches, method, pixel_map=None):
    """{tensor: (lo, hi)} by `method` over the calibration batches; with an image input's
    pixel_map (scale, offset), the identity entry conv carries the whole pixel range."""
    from tl2k210.quantize import calibrate
    ranges = calibrate.ranges(calibrate.collect(graph, batches, histograms=method != "minmax"), method)
    entry = graph.meta.get("entry_conv")
    if pixel_map is not None and entry in ranges:
        scale, offset = (np.asarray(v, np.float64) for v in pixel_map)
        ends = np.concatenate([offset, 255 * scale + offset])
        ranges[entry] = (float(ends.min()), float(ends.max()))
    return ranges


def channel_means(graph, batches, limit: int = 32):
    """Per-channel means of every Conv input over (up to `limit` of) the calibration batches:
    what bias correction needs (snapped as the ranges are: the same on every CPU)."""
    from tl2k210.quantize.calibrate import FloatRunner, snap_values
    run = FloatRunner(graph)
    inputs = {n.inputs[0] for n in graph.nodes if n.op == "Conv"}
    sums, n = {}, 0
    for x in batches[:limit]:
        r = run(x)
        n += 1
        for t in inputs:
            v = r.get(t)
            if v is not None and v.ndim == 4:
                sums[t] = sums.get(t, 0) + v.mean(axis=(0, 2, 3))
    return {k: snap_values(v / n) for k, v in sums.items()}


def _fold_channel_swap(graph):
    """--bgr: the camera gives R, G, B planes and MaixPy's kpu.forward feeds them as they are, so the
    kmodel takes them so: the first layers reading a 3-channel image input read its channels
    reversed (a group-1 conv's weights permuted; a depthwise one, such as the entry conv, made a
    group-1 conv first), and graph.meta["bgr_folded"] says the input is now R, G, B. (The swap had
    been done only by the host tools: on the board a --bgr kmodel computed on RGB, an edgetpu
    MobileNet's top class 830 where the model fed BGR says 875.)"""
    x = graph.inputs[0]
    shape = graph.shape(x) or ()
    users = graph.consumers(x)
    if len(shape) == 4 and shape[1] == 1:
        return          # a gray image: nothing to swap (as --bgr always did there)
    if len(shape) != 4 or shape[1] != 3 or not users or any(
            u.op != "Conv" or u.inputs[0] != x or x in u.inputs[1:] or graph.const(u.inputs[1]) is None for u in users):
        raise Tl2k210Error(f"--bgr: input {x!r} {tuple(shape)} is not a 3-channel image that convs read; convert "
                           "without --bgr and swap the channels in the application")
    for u in users:
        w = graph.const(u.inputs[1])
        g = u.attrs.get("group", 1)
        if g != 1:      # depthwise over the 3 channels (m outputs each): the same conv with group 1
            dense = np.zeros((w.shape[0], 3) + w.shape[2:], w.dtype)
            dense[np.arange(w.shape[0]), np.arange(w.shape[0]) // (w.shape[0] // g)] = w[:, 0]
            w = dense
            u.attrs["group"] = 1
        u.inputs[1] = graph.add_const(np.ascontiguousarray(w[:, ::-1]), u.inputs[1] + "/rgb")
    graph.meta["bgr_folded"] = True


def _check_float_input(graph):
    """An integer input the passes left integer (no quantization or cast to float stands for its
    values: the model computes on the integers) has no kmodel form: refuse, naming it (an int32
    mirror-pad test model met onnxruntime's type error on tl2k210's own entry conv, 'fix the
    model')."""
    x = graph.inputs[0]
    dt = graph.tensors[x].dtype
    if dt.kind in "iub":
        users = [u for n in graph.consumers(x) for u in (graph.consumers(n.outputs[0])
                 if n.outputs[0] == graph.meta.get("entry_conv") else [n])]     # not the entry conv it got
        readers = ", ".join(f"{n.name!r} ({n.op})" for n in users[:3])
        raise UnsupportedOpError(
            f"input {x!r} is {dt.name} and the model computes on its integers ({readers} read it): a kmodel "
            "reads camera pixels or float arrays; export the model with a float input, or with a uint8 "
            "image input that it casts or dequantizes to float first")


def _check_unbatched_vector(graph):
    """A 1-D input of n > 1 values has no batch axis: the calibration data's first axis would be
    read as samples of it. Refuse, naming the node that reads it."""
    x = graph.inputs[0]
    shape = graph.shape(x) or ()
    if len(shape) == 1 and shape[0] > 1:
        n = (graph.consumers(x) or [None])[0]
        at = f"node {n.name!r} ({describe(n)}) reads " if n is not None else ""
        raise UnsupportedOpError(
            f"{at}input {x!r} of shape {tuple(shape)}: a vector without a batch axis, so its first "
            f"axis cannot be told from the samples; give it one with --input-shape 1,{shape[0]}, or export "
            f"the model with a (1, {shape[0]}) input (a batch of one)")


# ---- convert, stage by stage: load -> optimise -> calibrate -> plan/lower -> verify -> write ----
@dataclass
class Loaded:
    """Stage 1: the source model as the float graph IR."""
    graph: object
    where: str                 # the source's name, for messages
    input_note: str            # what the front end cut off the input, what a fixed export batch became
    seconds: float


@dataclass
class Optimised:
    """Stage 2: the graph after the K210 flow's passes, its kmodel format and 8-bit ideal."""
    graph: object
    exact_graph: object        # before the passes (the opt-in kpu_padding is measured against it)
    log: list                  # the passes' log
    ideal: object              # tl2k210.k210.ideal.Ideal
    plan: tuple                # (kmodel format, the node that forced v4 and why): the flow's answer


@dataclass
class Calibration:
    """Stage 3: calibration samples, activation ranges and the input's pixel mapping."""
    opts: ConvertOptions       # with the input range the model itself gives, if it gives one
    floats: np.ndarray         # the model-input samples
    pixels: np.ndarray | None  # their camera pixels (uint8 CHW), None for a non-image input
    scale: tuple
    offset: tuple
    ranges: dict
    means: dict                # per-channel means of every conv input (bias correction; the ideal)
    range_note: str | None
    calib_note: str | None
    padding_effect: dict | None
    correct_bias: bool = True  # the lowering corrects biases for weight rounding (fake_quant.ideal_choice)
    ideal: dict | None = None  # {output: the 8-bit ideal's dB} at these ranges on the first sqnr_samples floats
    input_mismatch: str | None = None   # the samples lie outside the input range the model states (ModelRanges)

    @property
    def image(self) -> bool:
        return self.pixels is not None


def input_dims(x, shape: tuple) -> tuple:
    """--input-shape's N,C,H,W in the layout of ONNX graph input `x`: (N, H, W, C) where the dims
    the input declares fit only that order (a TFLite or Keras export's NHWC input, e.g. (?, ?, ?, 3)),
    or, where they fit neither (a fixed size given another: MTCNN's P-Net, exported at 1280x960
    and run at any), where only its last dim holds the channels; else as given."""
    dims = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None
            for d in x.type.tensor_type.shape.dim]
    if len(dims) != 4 or len(shape) != 4:
        return shape
    nhwc = (shape[0], shape[2], shape[3], shape[1])

    def fits(s, axes=range(4)):
        return all(dims[i] is None or dims[i] == s[i] for i in axes)
    if fits(shape) or fits(nhwc):
        return nhwc if not fits(shape) else shape
    return nhwc if fits(nhwc, [3]) and not fits(shape, [1]) else shape


def load(source, opts: ConvertOptions) -> Loaded:
    """Front-end: any supported model (path or object) -> the IR, with the checks that need no
    calibration (weights and maps against the budget, one sample per input)."""
    from tl2k210 import frontends
    t0 = time.perf_counter()
    where = source_name(source)
    _say(opts, f"[1/6] loading {where} ...")
    onnx_model = frontends.load_model(source, **load_options(opts))
    check_weight_budget(onnx_model, opts, where)
    graph = source_graph(onnx_model, opts)
    cut = cut_outputs(graph, opts.outputs, where)
    _check_unbatched_vector(graph)
    check_map_budget(graph, where)
    props = {p.key: p.value for p in onnx_model.metadata_props}
    if frontends.INPUT_RANGE in props:      # a decoded image's pixels (frozen_pb's image decoders)
        graph.meta["input_range"] = tuple(float(v) for v in props[frontends.INPUT_RANGE].split(","))
    elif (scaling := pixel_rescaling(graph)) is not None:
        graph.meta["input_range"], graph.meta["input_range_why"] = (0.0, 255.0), scaling
    if frontends.FILE_TENSORS in props:     # what --outputs takes (fit.end_before's advice names them)
        graph.meta["file_tensors"] = frozenset(json.loads(props[frontends.FILE_TENSORS]))
    notes = [props[frontends.INPUT_NOTE]] if frontends.INPUT_NOTE in props else []
    notes += [cut] if cut else []
    notes += [f"the model starts at {graph.inputs[0]!r} (--inputs): what computes it is the application's, "
              "and the kmodel is fed what it holds"] if opts.inputs else []
    notes += [f"input {x!r} pinned to {_values(v)} (--input-value): the kmodel is fed the other"
              for x, v in opts.input_values]
    notes += [f"input {x!r} was exported with a fixed batch of {n}: the kmodel takes one sample (the K210 "
              "runs one at a time)" for x, n in graph.meta.get("rebatched", {}).items()]
    resized = graph.meta.get("resized_reshapes", {})
    if resized:     # (a ShuffleNet's channel shuffles written for the exported size: yolov8-lite's)
        (name, (was, now)), more = next(iter(resized.items())), len(resized) - 1
        notes += [f"--input-shape: {len(resized)} Reshape target(s) the file fixes at its exported size take the "
                  f"new size, their dims grouped as there ({name!r}: {was} -> {now}"
                  f"{f', and {more} more' if more else ''})"]
    for note in notes:
        _say(opts, "      " + note)
    return Loaded(graph, where, "; ".join(notes), time.perf_counter() - t0)


def load_options(opts: ConvertOptions) -> dict:
    """frontends.load_model's options from convert's (compare and validate read the float model
    as convert did)."""
    kw = {"network": opts.network} if opts.network is not None else {}
    if opts.weights is not None:
        kw["weights"] = opts.weights
    if opts.outputs:
        kw["outputs"] = tuple(opts.outputs)      # a .tflite: cut before TFLite's reader meets a custom op
    if opts.inputs:
        kw["start"] = opts.inputs                # a .tflite: cut before TFLite's reader meets an FFT
    if opts.input_shape:
        kw["nchw_input_shape"] = tuple(opts.input_shape)    # a .pb's shapeless Placeholder
    if opts.input_values:
        kw["input_values"] = dict(opts.input_values)        # a .pb's other Placeholders
    return kw


def source_graph(onnx_model, opts: ConvertOptions):
    """The IR of the source model as convert reads it (compare and validate too): --input-shape
    sizes the input the kmodel is fed (the first one neither a weight nor pinned), --input-value
    makes its inputs constants, and any other input is refused (a kmodel has one)."""
    from tl2k210.graph import from_onnx
    shapes = None
    if opts.input_shape:
        pinned = {x for x, _ in opts.input_values} | {t.name for t in onnx_model.graph.initializer}
        x = next((v for v in onnx_model.graph.input if v.name not in pinned), onnx_model.graph.input[0])
        shapes = {x.name: input_dims(x, tuple(opts.input_shape))}
    graph = from_onnx(onnx_model, input_shapes=shapes, input_values=dict(opts.input_values) or None)
    check_one_input(graph)
    return graph


def _values(v) -> str:
    shown = ", ".join(f"{float(a):g}" for a in v[:4])
    return f"{shown}, ... ({len(v)} values)" if len(v) > 4 else shown


def cut_outputs(graph, names, where: str) -> str:
    """--outputs: `graph` ends at the tensors `names` (in that order), the nodes after them gone
    (an ArgMax, a decoder, post-processing the application does); the note for the receipt, or ""
    when `names` is empty. A name the graph does not have is refused, with the nearest ones."""
    if not names:
        return ""
    computed = [t for n in graph.nodes for t in n.outputs if t]
    names = [x + ":0" if x not in computed and x + ":0" in computed else x for x in names]   # a TF tensor's op name
    for name in names:
        if name in graph.inputs:
            raise Tl2k210Error(f"{where}: --outputs {name!r} is the model's input; name tensors its layers compute")
        if name not in computed:
            raise Tl2k210Error(f"{where}: --outputs {name!r}: the model has no such tensor{nearest(name, computed)}"
                               + f" (its outputs: {', '.join(map(repr, graph.outputs))}); give tensor "
                               "names as the model file has them (netron shows them; a Keras model's layer "
                               "names too)")
    graph.outputs = list(dict.fromkeys(names))
    graph.prune()
    return f"the model ends at {', '.join(map(repr, graph.outputs))} (--outputs): what follows is the application's"


#: passes whose forms are the fast ones, each with a smaller alternative that `optimise(small=True)`
#: takes: a per-channel PReLU's residual form (pass prelu_residual on) for prelu_split's pair; a
#: transposed conv's exact phases (pass conv_transpose) for conv_transpose_3x3's (off); a CPU conv
#: with unequal strides for unequal_strides' KPU conv + strided slice (off: no map of twice the rows);
#: a CPU conv for a wide dilated conv's KPU conv over a mosaic of its sub-grids (dilated_mosaic); a
#: K x K conv on the whole map for its row bands (kxk_bands: each band stores the weights again)
FAST_FORMS = ("prelu_split", "conv_transpose_3x3", "unequal_strides", "dilated_mosaic", "kxk_bands")


def optimise(loaded: Loaded, opts: ConvertOptions, small: bool = False, prelus: str = "residual") -> Optimised:
    """The K210 flow's passes; the kmodel format the runtime must load and the 8-bit ideal, both
    refused here, before calibration, when the runtime cannot take them. `small`: the graph's
    smaller forms (FAST_FORMS' alternatives: conv_transpose_3x3, unequal_strides, dilated_mosaic and
    kxk_bands off, and the PReLUs' residual form: `prelus` "residual" where the pair needs a layer
    of its own (pass prelu_residual), "grouped" where a grouped conv reads it too
    (prelu_residual_grouped), "every" for every PReLU (prelu_residual_every))."""
    from tl2k210.k210 import fit
    from tl2k210.k210.flow import network_ideal, run_pipeline
    from tl2k210.k210.lower import Options
    _say(opts, f"[2/6] passes ({len(loaded.graph.nodes)} nodes) ...")
    residual = {"residual": "prelu_residual", "grouped": "prelu_residual_grouped", "every": "prelu_residual_every"}
    passes = {"kpu_padding": opts.kpu_padding, "conv_transpose_3x3": not small, "unequal_strides": not small,
              "dilated_mosaic": not small, "kxk_bands": not small,
              **{name: small and kind == prelus for kind, name in residual.items()}}
    target = Options(format=opts.format, weight_bits=opts.weight_bits, float_fc=opts.float_fc,
                     v3_only=not fit.loads_format(opts.runtime, "v4"))
    try:
        graph, plog = run_pipeline(loaded.graph, passes, target=target)
    except UnsupportedOpError as e:
        tip = None if "--outputs" in str(e) else fit.end_before(loaded.graph, getattr(e, "node", None))
        if tip is None:
            raise
        raise UnsupportedOpError(f"{e}\n  {tip}") from None
    _check_float_input(graph)
    if opts.channel_order.upper() == "BGR":
        _fold_channel_swap(graph)
    fmt, forced = graph.meta["plan"]
    ide = network_ideal(loaded.graph, graph, plog, passes, target, opts.weight_bits)
    fit.check_format(fmt, forced, opts.runtime, ide.floor, graph, loaded.graph)
    fit.check_ideal(ide, opts.runtime, loaded.where, fmt, loaded.graph)
    return Optimised(graph, loaded.graph, plog, ide, (fmt, forced))


def _bounded_note(graph, widened: dict, ranges: dict) -> str | None:
    """The receipt's line for the outputs calibrate.bounded_outputs gave their activation's range."""
    far = {y: r for y, r in widened.items() if r[1] - r[0] < 0.9 * (ranges[y][1] - ranges[y][0])}
    if not far:      # (a classifier's softmax calibrated at 0..0.99: nothing to say)
        return None
    each = ", ".join(f"{graph.source_name(y)} {ranges[y][0]:g}..{ranges[y][1]:g} (calibrated {lo:.3g}..{hi:.3g})"
                     for y, (lo, hi) in far.items())
    return f"outputs at their activation's whole range, so that no score clips at the calibration's maximum: {each}"


def calibrate(opt: Optimised, opts: ConvertOptions, where: str) -> Calibration:
    """Samples (--dataset, or what a quantized model's own ranges stand for), activation ranges,
    per-channel means, and the measured effect of the opt-in kpu_padding rewrite."""
    from tl2k210.k210.flow import run_pipeline
    from tl2k210.k210.passes.entry_conv import pixel_entry
    from tl2k210.passes.input_nchw import input_chw
    from tl2k210.quantize import calibrate as calib
    from tl2k210.quantize.fake_quant import ideal_choice
    graph = opt.graph
    _say(opts, f"[3/6] calibration ({opts.method}) ...")
    opts, range_note = _feature_range(graph, opts) or model_input_range(graph, opts)
    if range_note:
        _say(opts, "      " + range_note)
    own = model_ranges(graph, opts, where)
    try:
        floats, pixels = model_inputs(graph, opts.dataset or own.samples, opts.calib_limit, opts)
    finally:
        if own.samples:
            Path(own.samples).unlink(missing_ok=True)
    image = pixels is not None
    scale, offset = pixel_mapping(opts, input_chw(graph)[0], graph) if image else ((1.0,), (0.0,))
    if image and graph.meta.get("bgr_folded"):
        scale, offset = scale[::-1], offset[::-1]
    entry_note = pixel_entry(graph, scale, offset) if image else None
    if entry_note:
        _say(opts, "      " + entry_note)
    batches = [f[None] for f in floats]
    ranges = calibrated_ranges(graph, batches, opts.method, (scale, offset) if image else None)
    mismatch = own.input_mismatch(graph, ranges) if opts.dataset is not None else None
    calib_note = own.apply(ranges, opts.dataset is None)
    widened = calib.bounded_outputs(graph, ranges, own.own)
    few = (f"calibration on {len(floats)} sample(s): the ranges fit them alone and the SQNR below is measured on "
           f"them, so other data will score lower (a cifar net at --calib-limit 2: 42.6 dB here, 10.9 on other "
           f"photos); give {opts.sqnr_samples} or more (--dataset, --calib-limit)"
           if opts.dataset is not None and len(floats) < opts.sqnr_samples else None)
    calib_note = "; ".join(n for n in (calib_note, mismatch, _bounded_note(graph, widened, ranges), few) if n) or None
    share_concat_ranges(graph, ranges)
    if calib_note:
        _say(opts, "      " + calib_note)
    means = channel_means(graph, batches)
    ideal, costs = ideal_choice(graph, ranges, floats[:opts.sqnr_samples], opts.weight_bits, not image, means)
    if costs is not None:       # the back-end's bias correction costs this model: build without it
        note = (f"no bias correction for weight rounding: on the calibration samples the 8-bit ideal's "
                f"lowest output is {costs[0]:.1f} dB without it, {costs[1]:.1f} dB with it")
        calib_note = f"{calib_note}; {note}" if calib_note else note
    padding_effect = None
    if opts.kpu_padding and any(p["pass"] == "kpu_padding" and p["changes"] for p in opt.log):
        # the opt-in rewrite changes the float math: measure it against the exact graph
        exact, _ = run_pipeline(opt.exact_graph)
        if graph.meta.get("bgr_folded"):       # fed the same R, G, B floats
            _fold_channel_swap(exact)
        padding_effect = calib.compare_graphs(exact, graph, batches[:opts.sqnr_samples * 4])
    return Calibration(opts, floats, pixels, scale, offset, ranges, means, range_note, calib_note,
                       padding_effect, correct_bias=costs is None, ideal=ideal, input_mismatch=mismatch)


def plan_and_lower(opt: Optimised, cal: Calibration):
    """The kmodel: each layer's fastest exact form such that the model fits the runtime (or the
    smallest with --optimize size); refused, naming the biggest buffers, when none fits."""
    from tl2k210 import metadata
    from tl2k210.k210 import fit
    from tl2k210.k210.lower import Options, lower
    opts, graph = cal.opts, opt.graph
    _say(opts, "[4/6] lowering to the KPU ...")

    v3_only = not fit.loads_format(opts.runtime, "v4")

    def builder(fmt, compact):
        def build(small):
            model, rows, trace_map, lw = lower(graph, dict(cal.ranges), Options(
                weight_bits=opts.weight_bits, input_scale=tuple(cal.scale), input_offset=tuple(cal.offset),
                channel_means=dict(cal.means) if cal.correct_bias else {}, float_fc=opts.float_fc, int8_rounding=opts.int8_rounding,
                format=fmt, small=small, v3_only=v3_only, compact=compact),
                planned=None if small or fmt != opts.format else opt.plan)  # a smaller form may need another format
            fit.check_format(lw.format, lw.forced_by, opts.runtime, opt.ideal.floor, graph, opt.exact_graph)
            metadata.check_decode(model, opts.metadata)
            return fit.Built(model, dumps(model), rows, trace_map, lw)
        return build
    v4 = opts.format == "auto" and not v3_only
    budget = RUNTIME_BUDGET[opts.runtime]

    def search(compact):
        return fit.choose_forms(builder(opts.format, compact), budget, opts.optimize,
                                v4=builder("v4", compact) if v4 else None, ideal=opt.ideal)
    choice = search(opts.optimize == "size")
    if opts.optimize == "latency" and choice.fastest_need > budget and choice.fastest_format == "v3":
        # the fastest forms did not fit: kmodel v3's least block alignment costs no time, so the
        # search runs again with it and is kept where it fits with faster forms
        other = _or_none(search, True)
        b0, b1 = choice.built, other and other.built
        if b1 is not None and b1.need <= budget and (b0.need > budget or b1.est.cycles < b0.est.cycles):
            choice = other
    b = choice.built
    fit.check_budget(b.model, len(b.data), opts.runtime, b.lw, b.rows, opt.ideal, choice.v3_error)
    return choice


def _or_none(fn, *args):
    """fn(*args), or None where it refuses (a Tl2k210Error)."""
    try:
        return fn(*args)
    except Tl2k210Error:
        return None


def optimise_to_fit(loaded: Loaded, opts: ConvertOptions):
    """(Optimised, Calibration, fit.Choice) with the graph forms that --optimize asks for
    (`_fastest_that_fits`); where no combination of the default's forms fits but the 8-bit ideal
    does, the smallest forms, as --optimize size gives them, the receipt's trades saying so
    (zye1996's int8 MobileFaceNet 112x96: refused for full MaixPy at 3.20 MB, ideal 1.54 MB; its
    smallest forms take 1.65 MB)."""
    from tl2k210.k210 import fit
    if opts.optimize == "size":
        return _smallest(loaded, opts)
    try:
        return _fastest_that_fits(loaded, opts)
    except fit.BudgetError as e:
        if not e.ideal_fits:
            raise
        refused = e
    try:
        opt, cal, choice = _smallest(loaded, replace(opts, optimize="size"))
    except (fit.BudgetError, KpuLimitError):
        raise refused from None
    choice.trades.append(f"every form: the smallest, as --optimize size gives them; the default's forms fit "
                         f"in no combination: {str(refused).split('; ')[0]}")
    return opt, cal, choice


def _smallest(loaded: Loaded, opts: ConvertOptions):
    opt = optimise(loaded, opts, True, prelus="every")
    cal = calibrate(opt, opts, loaded.where)
    return opt, cal, plan_and_lower(opt, cal)


def _fastest_that_fits(loaded: Loaded, opts: ConvertOptions):
    """(Optimised, Calibration, fit.Choice) with the default's graph forms: where
    a smaller form replaces a fast one (FAST_FORMS: a per-channel PReLU's residual
    form, O(c) bytes and its adds on the CPU, for the pair of split / join layers of ~c²/8 bytes on
    the KPU; a transposed conv's exact phases, a CPU conv, for its 3x3 KPU phases), the model is
    planned both ways and takes the small one where the fast one does not fit or is not faster
    (--optimize size: always). The receipt's trades say which and why."""
    from tl2k210.k210 import fit
    pair = refused = first = None
    try:
        first = optimise(loaded, opts)
        cal = calibrate(first, opts, loaded.where)
        pair = first, cal, plan_and_lower(first, cal)
    except (fit.BudgetError, KpuLimitError) as e:    # too big for the runtime, or for the KPU
        refused = e
    fast = {} if first is None else {p["pass"]: p["changes"] for p in first.log if p["pass"] in FAST_FORMS}
    if pair is not None and not any(fast.values()):
        return pair                 # no form with a smaller alternative
    try:
        # the PReLUs grouped convs read too where the fast form's group convs exceed the KPU (a
        # residual form elsewhere only where the pair does not fit or is slower: its maps differ)
        opt = optimise(loaded, opts, True, prelus="grouped" if isinstance(refused, KpuLimitError) else "residual")
        changed = next(p["changes"] for p in opt.log if p["pass"].startswith("prelu_residual"))
        if not changed and not any(fast.get(f) for f in FAST_FORMS if f != "prelu_split"):    # the same graph
            if refused is not None:
                raise refused
            return pair
        cal = calibrate(opt, opts, loaded.where)
        res = opt, cal, plan_and_lower(opt, cal)
    except (fit.BudgetError, KpuLimitError):
        if pair is None:
            raise
        return pair
    forms = ([f"{len(changed)} per-channel PReLU(s): the residual form, y ± relu(-|1 - a|·y) (1x1 "
              "depthwise convs and residual adds)"] if changed else []) + \
        ([f"{len(fast['conv_transpose_3x3'])} transposed conv(s): their exact phases (a CPU conv), not "
          "3x3 KPU phases"] if fast.get("conv_transpose_3x3") else []) + \
        ([f"{len(fast['unequal_strides'])} conv(s) with unequal strides: CPU convs, not the KPU conv at equal "
          "strides and a strided slice"] if fast.get("unequal_strides") else []) + \
        ([f"{len(fast['dilated_mosaic'])} dilated conv(s): CPU convs, not a 3x3 KPU conv over a mosaic of their "
          "sub-grids"] if fast.get("dilated_mosaic") else []) + \
        ([f"{len(fast['kxk_bands'])} K x K conv(s) on the whole map, not in row bands (each band stores the "
          "weights again)"] if fast.get("kxk_bands") else [])
    form = "; ".join(forms)
    if pair is None:
        res[2].trades.append(f"{form}; the fast form did not fit: {str(refused).split('; ')[0]}")
        return res
    p, r = pair[2], res[2]
    pc, rc = p.built.est.cycles, r.built.est.cycles
    if rc < pc:     # not merely smaller: its uint8 maps differ from the pair's (iris landmarks: -4.4 dB)
        r.trades.append(f"{form}, {r.built.need:,} B, est. {cost.ms(rc):.2f} ms; the fast form would take "
                        f"{p.built.need:,} B, {cost.ms(pc):.2f} ms")
        return res
    return pair


def traced(trace, idx, kind, loc) -> np.ndarray:
    """A tensor's values (flat float64) in an emulator trace: the layers `idx` of trace_map's
    entry, uint8 ones ("kpu", "u8") dequantized with the tensor's location `loc` (lw.locs)."""
    val = np.concatenate([np.asarray(trace[i][1]).reshape(-1) for i in np.atleast_1d(idx)]).astype(np.float64)
    if kind in ("kpu", "u8") and loc is not None and loc.quant:
        s, z = loc.quant
        val = (val - z) * s
    return val


def _measure(graph, built, cal: Calibration, emu):
    """Float model (onnxruntime) against the kmodel (the emulator `emu`) on the first calibration
    samples: ({tensor or "__out__"+output: SQNR dB}, {output: non-finite values}, samples). The
    kmodel is fed what it reads: pixels, or the model's float values where it starts with a float
    layer (a v3 FULLY_CONNECTED reading a 1x1 map of features, fc.py)."""
    from tl2k210.quantize import calibrate as calib
    from tl2k210.quantize.metrics import sqnr_db
    opts, floats, pixels = cal.opts, cal.floats, cal.pixels
    image = cal.image and emu.input_spec()[1] == np.uint8
    trace_map, lw = built.trace_map, built.lw
    _say(opts, f"[5/6] measuring per-layer SQNR on the emulator ({opts.sqnr_samples} samples) ...")
    runner = calib.FloatRunner(graph)
    refs, tests, nonfinite = {}, {}, {o: 0 for o in graph.outputs}
    n = min(opts.sqnr_samples, len(floats))
    for i in range(n):
        ref = runner(floats[i][None])
        outs, trace = emu.run(pixels[i] if image else floats[i].reshape(-1), trace=True)
        for t, (idx, kind) in trace_map.items():
            if t not in ref:
                continue
            r = np.asarray(ref[t], np.float64).reshape(-1)
            v = traced(trace, idx, kind, lw.locs.get(t))
            if r.size != v.size:
                continue
            refs.setdefault(t, []).append(r)
            tests.setdefault(t, []).append(v)
        for o, out in zip(graph.outputs, outs):
            if np.size(out) != np.size(ref[o]):   # a lowering bug: refuse rather than write it
                raise UnsupportedOpError(
                    f"internal error: the kmodel's output {o} has {np.size(out):,} values, the float "
                    f"model's {np.size(ref[o]):,} {tuple(np.shape(ref[o]))}; nothing was written -- please "
                    "report it with the model")
            nonfinite[o] += int(np.size(out) - np.isfinite(out).sum())
            refs.setdefault("__out__" + o, []).append(np.asarray(ref[o], np.float64).reshape(-1))
            tests.setdefault("__out__" + o, []).append(np.asarray(out, np.float64).reshape(-1))
    sq = {t: sqnr_db(np.concatenate(refs[t]), np.concatenate(tests[t])) for t in refs}
    return sq, nonfinite, n, _input_ignored(floats[:n], [refs["__out__" + o] for o in graph.outputs])


def _input_ignored(samples, outs) -> bool:
    """Do distinct samples give the float model the same outputs, every one of them? (A graph cut
    off from its input, weights never trained, or preprocessing that flattens every image: the
    SQNR then says nothing about the input.)"""
    distinct = len(samples) > 1 and any(not np.array_equal(samples[0], x) for x in samples[1:])
    return distinct and all(all(np.array_equal(o[0], v) for v in o[1:]) for o in outs)


def _overhead(size, layers, totals) -> str:
    """'; of the file, N B its layers' arguments, tables and headers': what the rows' weights
    leave out of the kmodel (hunt 22: 31 % of a hand-landmark kmodel for the sdk, 2,797 kmodel
    layers behind 247 rows, a 5x5 depthwise conv's shift stages some 129 of them), where it is
    over a tenth of the file."""
    rest = size - sum(r.get("weight_bytes") or 0 for r in layers)
    n = totals["kpu_layers"] + totals["cpu_layers"]
    return (f"; of the file, {rest:,} B ({rest / max(1, size):.0%}) are its {n:,} layers' arguments, batch-norm "
            "and activation tables and headers, not in the rows' weights" if rest > size / 10 else "")


def _constants_note(graph) -> str | None:
    """The receipt's line for the source model's constant outputs (passes.constant_outputs), which
    the kmodel leaves out, so that its outputs' order differs from the source's."""
    from tl2k210.metadata import MAX_CONSTANT_VALUES
    cs = graph.meta.get("constant_outputs", {})
    if not cs:
        return None
    kept = [o for o, v in cs.items() if np.size(v) <= MAX_CONSTANT_VALUES]
    return (f"constant outputs left out of the kmodel (it computes maps): "
            + ", ".join(f"{o} {tuple(np.shape(v))}" for o, v in cs.items())
            + (" (their values are in the metadata's constants)" if len(kept) == len(cs) else
               f" ({', '.join(kept) or 'none'} in the metadata's constants; the rest, over "
               f"{MAX_CONSTANT_VALUES:,} values, take from the source model)")
            + f"; the kmodel's outputs, in order: {', '.join(graph.outputs)}")


def _layout_note(graph) -> str | None:
    """The receipt's line for the outputs passes.output_nchw made NCHW: a source that writes them
    NHWC is decoded otherwise (MTCNN P-Net's box map: the repo's NHWC post-processing would read
    the kmodel's channel-major values as garbage, and nothing said the layout had changed)."""
    moved = [o for o in graph.outputs if graph.meta.get("output_layout", {}).get(o) == "NHWC->NCHW"]
    if not moved:
        return None
    return ("channel-major outputs: " + ", ".join(
        f"{graph.source_name(o)} {tuple(graph.shape(o))}" for o in moved)
        + f" {'is' if len(moved) == 1 else 'are'} NCHW in the kmodel, NHWC in the source model (its last Transpose dropped: the K210 "
        "writes channel-major maps); decode them as (C, H, W), or transpose them back")


def verify(loaded: Loaded, opt: Optimised, cal: Calibration, choice, output, t0) -> Receipt:
    """The receipt: per layer where it runs and why, cycles, SQNR against the float model and the
    8-bit ideal; then the gate (NaN/Inf outputs, SQNR below --min-sqnr) refuses a bad kmodel."""
    opts, graph, ide = cal.opts, opt.graph, opt.ideal
    model, data_bytes, rows, lw, est = (choice.built.model, choice.built.data, choice.built.rows,
                                        choice.built.lw, choice.built.est)
    items = model.items
    main_mem = model.main_memory
    from tl2k210.k210.emulator import Emulator
    emu = Emulator(model)
    sq, nonfinite, n, ignored = _measure(graph, choice.built, cal, emu)
    layer_rows = []
    for r in rows:
        cyc = sum(est.rows[i][3] for i in r.layers)
        node = next((nd for nd in graph.nodes if nd.name == r.node), None)
        out_t = r.tensor or (node.outputs[0] if node is not None else r.node)
        d = asdict(r)
        v, note = finite_sqnr(sq.get(out_t)) if out_t in sq else (None, "not measured: the emulator "
                                                                   "trace has no copy of this tensor alone")
        d.update(cycles=cyc, sqnr_db=v, kmodel_layers=[items[i].name for i in r.layers])
        if note:
            d["sqnr_note"] = note
        li = ide.layer(r.node)
        d.update(ideal_weight_bytes=li.weight_bytes if li else 0, ideal_live_bytes=li.live_bytes if li else 0)
        layer_rows.append(d)
    total_cycles = est.cycles
    ideal = cal.ideal           # calibrate's, on these samples at these ranges
    outputs = {}
    for o in graph.outputs:
        v, note = finite_sqnr(sq["__out__" + o])
        outputs[o] = {"sqnr_db": v, **({"sqnr_note": note} if note else {}), "ideal_db": finite_sqnr(ideal[o])[0],
                      **({"ideal_weight_bits": opts.weight_bits} if opts.weight_bits != 8 else {})}
    out_sqnr = min((o["sqnr_db"] for o in outputs.values() if o["sqnr_db"] is not None), default=None)
    receipt = Receipt(
        source=loaded.where, output=str(output), file_size=len(data_bytes),
        peak_kpu_ram=64 * lw.kpu.peak, main_memory=main_mem,
        latency_ms=cost.ms(total_cycles), layers=layer_rows,
        totals={"kpu_layers": sum(L.conv is not None for L in items),
                "cpu_layers": sum(L.conv is None for L in items),
                "format": f"v{model.version}", "format_why": _format_why(model, lw, opts, choice.format_note),
                "macs": sum(r["macs"] for r in layer_rows), "runtime": opts.runtime,
                "budget": RUNTIME_BUDGET[opts.runtime],
                "weights": f"{opts.weight_bits}-bit", "output_sqnr_db": out_sqnr, "sqnr_samples": n,
                "calib_samples": len(cal.floats), "input_dtype": np.dtype(emu.input_spec()[1]).name,
                "outputs": outputs, "min_sqnr": opts.min_sqnr, "input_ignored": ignored,
                "own_quantization": bool(graph.meta.get("quant_ranges")),
                "input_mismatch": cal.input_mismatch,
                "cycles": total_cycles, "frontend_s": round(loaded.seconds, 2),
                "total_s": round(time.perf_counter() - t0, 2), "method": opts.method,
                "kpu_padding": opts.kpu_padding, "kpu_padding_effect": cal.padding_effect,
                "optimize": opts.optimize, "fastest_need": choice.fastest_need,
                "fastest_ms": cost.ms(choice.fastest_cycles),
                "input_range": list(opts.input_range), "input_range_note": cal.range_note,
                "calibration_note": cal.calib_note,
                "input_note": loaded.input_note or None,
                "layout_note": _layout_note(graph), "constants_note": _constants_note(graph),
                "float_outputs": sum(4 * int(np.prod(lw.locs[o].shape)) for o in lw.g.outputs)},
        passes=[{"pass": p["pass"], "exact": p["exact"], "nodes": p["nodes"],
                 "changes": [f"{a}: {b}" for a, b in p["changes"]]} for p in opt.log],
        ideal={**ide.to_dict(), "layers": [asdict(li) for li in ide.layers]}, trades=choice.trades)
    quality_gate(receipt, nonfinite, opts.min_sqnr)
    return receipt


def write(output, data: bytes, graph, cal: Calibration, receipt: Receipt):
    """The kmodel and its metadata, each atomically (only after every check passed)."""
    from tl2k210 import metadata
    opts = cal.opts
    need = len(data) + receipt.main_memory
    pixels = cal.image and receipt.totals["input_dtype"] == "uint8"     # (not a float first layer's input)
    meta = metadata.for_conversion(data, output, graph, opts, pixels, RUNTIME_BUDGET[opts.runtime], need,
                                   receipt.source)
    _say(opts, f"[6/6] writing {output} and {metadata.path_for(output).name}")
    atomic_write(output, data)
    metadata.write_for(output, meta)


def convert(source, output, opts: ConvertOptions | None = None) -> Receipt:
    """Convert `source` (path or model object) to a kmodel at `output`: v3 when every layer has a
    v3 form (--format auto), else v4 if the --runtime loads it. Nothing is written unless every
    stage succeeds (atomic rename)."""
    from tl2k210.fileio import check_outputs
    opts = opts or ConvertOptions()
    check_outputs([("output", output)], [source if isinstance(source, (str, os.PathLike)) else None,
                                         opts.dataset])
    if opts.runtime not in RUNTIME_BUDGET:
        raise Tl2k210Error(f"--runtime {opts.runtime!r}: choose from {sorted(RUNTIME_BUDGET)}")
    t0 = time.perf_counter()
    loaded = load(source, opts)
    opt, cal, choice = optimise_to_fit(loaded, opts)
    receipt = verify(loaded, opt, cal, choice, output, t0)
    write(output, choice.built.data, opt.graph, cal, receipt)
    return receipt


def held_out_ideal(source, held, opts: ConvertOptions, limit: int = 100) -> dict:
    """{output: dB} of the 8-bit ideal on the held-out samples `held` (a folder or file, as
    --dataset): the graph and calibrated ranges `convert` would use with `opts`, with fake
    quantization (quantize/fake_quant.py) against the float graph -- what `compare` on the kmodel
    measures ours against (bench/quantize.py, the issue-24 gap tests)."""
    from tl2k210.quantize.fake_quant import ideal_sqnr
    loaded = load(source, opts)
    opt = optimise(loaded, opts)
    cal = calibrate(opt, opts, loaded.where)
    ev, _ = model_inputs(opt.graph, str(held), limit, cal.opts)
    return ideal_sqnr(opt.graph, cal.ranges, ev, opts.weight_bits, vector_input=not cal.image, means=cal.means)


def convert_file(source, output, dataset=None, **options) -> str:
    """Convert with default options (used by `tl2k210 deploy`); returns the output path."""
    if dataset is None:
        raise Tl2k210Error(f"converting {source} needs calibration data: pass --dataset DIR (images "
                           "like the camera sees) or convert it first with `tl2k210 convert`")
    convert(source, output, ConvertOptions(dataset=str(dataset), **options))
    return str(output)

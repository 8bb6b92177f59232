"""kmodel v3 (nncase v0.1, every MaixPy build): reader and writer.

Layout (docs/kmodel-format.md#kmodel-v3): 28-byte header + outputs table + layer headers + bodies; each body padded so
the next starts at an absolute multiple of 8. K210_CONV bodies carry absolute file offsets of
their layer argument, weights, BN and activation blocks.
"""
from __future__ import annotations

import collections
import dataclasses
from dataclasses import dataclass, field
from itertools import count, permutations

import numpy as np

from tl2k210.errors import KmodelFormatError, Tl2k210Error
from tl2k210.k210 import hardware as hw
from tl2k210.k210.board_facts import SRAM_BYTES
from tl2k210.k210.kmodel import kpu
from tl2k210.k210.kmodel.binio import Notes, Reader, Struct, align_up, check, drop_tail, padded_body

HEADER = Struct("version:u32 flags:u32 arch:u32 layers_length:u32 max_start_address:u32 "
                "main_mem_usage:u32 output_count:u32")
OUTPUT = Struct("address:u32 size:u32")
LAYER_HEADER = Struct("type:u32 body_size:u32")

_POOL = "flags:u32 main_mem_in_address:u32 main_mem_out_address:u32 in_shape:shape3 out_shape:shape3 " \
        "kernel_width:u32 kernel_height:u32 stride_width:u32 stride_height:u32 " \
        "padding_width:i32 padding_height:i32"   # int in the SDK's arithmetic: negative = crop
_GPOOL = "flags:u32 main_mem_in_address:u32 main_mem_out_address:u32 kernel_size:u32 channels:u32"
_UNARY = "flags:u32 main_mem_in_address:u32 main_mem_out_address:u32 channels:u32"
_QUANT = "flags:u32 main_mem_in_address:u32 mem_out_address:u32 count:u32 scale:f32 bias:f32"
_RESIZE = "flags:u32 main_mem_in_address:u32 main_mem_out_address:u32 in_shape:shape3 " \
          "out_width:u32 out_height:u32 align_corners:i32"
_FLATTEN = "flags:u32 main_mem_in_address:u32 main_mem_out_address:u32 shape:shape3"


@dataclass(frozen=True)
class Tail:
    """One array after a body's fixed struct: ``data[key]``, ``count(fields)`` items of
    ``dtype``, stored in ``data`` with ``shape(fields)``; ``sets(array)`` gives the fields the
    writer derives from the array (so a new layer needs only its arrays)."""
    key: str
    dtype: str
    count: object
    shape: object = None
    sets: object = None


TAILS = {   # the variable part of each body kind, read and written from this one description
    "table": (Tail("table", "u1", lambda f: 256),),
    "ranges": (Tail("ranges", "<u4", lambda f: 2 * f["input_count"], lambda f: (-1, 2),
                    lambda a: {"input_count": len(a)}),),
    "fc": (Tail("weights", "<f4", lambda f: f["in_channels"] * f["out_channels"],
                lambda f: (f["out_channels"], f["in_channels"]),
                lambda a: {"out_channels": a.shape[0], "in_channels": a.shape[1]}),
           Tail("bias", "<f4", lambda f: f["out_channels"])),
    "chdq": (Tail("params", "<f4", lambda f: 2 * f["channels"], lambda f: (f["channels"], 2),
                  lambda a: {"channels": a.shape[0]}),),
}


@dataclass(frozen=True)
class LayerType:
    id: int
    name: str
    struct: Struct | None  # None: no source documents the body; it is kept as raw bytes
    in_sdk: bool  # the standalone SDK v3 runner executes it (docs/kmodel-format.md#v3-layer-types)
    tail: str = ""  # variable part after the fixed struct: a TAILS key or "conv"


LAYER_TYPES = {t.id: t for t in (
    LayerType(1, "ADD", Struct("flags:u32 main_mem_in_a_address:u32 main_mem_in_b_address:u32 "
                               "main_mem_out_address:u32 count:u32"), True),
    LayerType(2, "QUANTIZED_ADD", Struct(
        "flags:u32 main_mem_in_a_address:u32 main_mem_in_b_address:u32 main_mem_out_address:u32 "
        "count:u32 in_a_offset:i32 in_a_mul:i32 in_a_shift:i32 in_b_offset:i32 in_b_mul:i32 "
        "in_b_shift:i32 out_offset:i32 out_mul:i32 out_shift:i32"), True),
    LayerType(3, "GLOBAL_MAX_POOL2D", Struct(_GPOOL), False),
    LayerType(4, "QUANTIZED_GLOBAL_MAX_POOL2D", Struct(_GPOOL), False),
    LayerType(5, "GLOBAL_AVERAGE_POOL2D", Struct(_GPOOL), True),
    LayerType(6, "QUANTIZED_GLOBAL_AVERAGE_POOL2D", Struct(_GPOOL), False),
    LayerType(7, "MAX_POOL2D", Struct(_POOL), False),
    LayerType(8, "QUANTIZED_MAX_POOL2D", Struct(_POOL), True),
    LayerType(9, "AVERAGE_POOL2D", Struct(_POOL + " act:u32"), True),
    LayerType(10, "QUANTIZED_AVERAGE_POOL2D", Struct(_POOL), False),
    LayerType(11, "QUANTIZE", Struct(_QUANT), True),
    LayerType(12, "DEQUANTIZE", Struct(_QUANT), True),
    LayerType(13, "REQUANTIZE", Struct("flags:u32 main_mem_in_address:u32 main_mem_out_address:u32 "
                                       "count:u32"), True, "table"),
    LayerType(14, "L2_NORMALIZATION", Struct(_UNARY), True),
    LayerType(15, "SOFTMAX", Struct(_UNARY), True),
    LayerType(16, "CONCAT", Struct("flags:u32 main_mem_out_address:u32 input_count:u32"), True,
              "ranges"),
    LayerType(17, "QUANTIZED_CONCAT", Struct("flags:u32 main_mem_out_address:u32 input_count:u32"),
              True, "ranges"),
    LayerType(18, "FULLY_CONNECTED", Struct(
        "flags:u32 main_mem_in_address:u32 main_mem_out_address:u32 in_channels:u32 "
        "out_channels:u32 act:u32"), True, "fc"),
    LayerType(19, "QUANTIZED_FULLY_CONNECTED", None, False),
    LayerType(20, "TENSORFLOW_FLATTEN", Struct(_FLATTEN), True),
    LayerType(21, "QUANTIZED_TENSORFLOW_FLATTEN", Struct(_FLATTEN), False),
    LayerType(22, "RESIZE_NEAREST_NEIGHBOR", Struct(_RESIZE), True),
    LayerType(23, "QUANTIZED_RESIZE_NEAREST_NEIGHBOR", Struct(_RESIZE), True),
    LayerType(24, "CHANNELWISE_DEQUANTIZE", Struct(
        "flags:u32 main_mem_in_address:u32 main_mem_out_address:u32 channels:u32 "
        "channel_size:u32"), True, "chdq"),
    LayerType(25, "LOGISTIC", Struct(_UNARY), True),
    LayerType(10240, "K210_CONV", Struct("flags:u32 main_mem_out_address:u32 layer_offset:u32 "
                                         "weights_offset:u32 bn_offset:u32 act_offset:u32"), True,
              "conv"),
    LayerType(10241, "K210_ADD_PADDING", Struct("flags:u32 main_mem_in_address:u32 "
                                                "kpu_mem_out_address:u32 channels:u32"), True),
    LayerType(10242, "K210_REMOVE_PADDING", Struct("flags:u32 main_mem_in_address:u32 "
                                                   "main_mem_out_address:u32 channels:u32"), True),
    LayerType(10243, "K210_UPLOAD", Struct("flags:u32 main_mem_in_address:u32 "
                                           "kpu_mem_out_address:u32 width:u32 height:u32 "
                                           "channels:u32"), True),
)}
TYPE_BY_NAME = {t.name: t for t in LAYER_TYPES.values()}
KLF_MAIN_MEM_OUT = 1

#: v3 conv block order and nncase v0.1's alignment of each
#: (docs/kmodel-format.md#v3-conv-parameter-placement); new files use 256.
CONV_BLOCKS = ("layer", "weights", "bn", "act")
NN01_ALIGN = {"layer": 8, "weights": 128, "bn": 128, "act": 256}
DEFAULT_ALIGN = {"layer": 8, "weights": 256, "bn": 256, "act": 256}
#: a ``compact`` packed file's (--optimize size): the least the spec allows, nncase v0.1's, as the
#: face detector MaixPy users flash (face_model_at_0x300000.kfpkg) has its weights and BN blocks
COMPACT_ALIGN = NN01_ALIGN
#: the reader's notes on K210_CONV blocks placed otherwise than nncase does (none for a packed file)
OUT_OF_BODY = ("K210_CONV parameter blocks outside their body or out of order: the SDK reads them anyway; "
               "a rewrite places them inside the body in nncase order")
BELOW_ALIGN = "K210_CONV parameter blocks below nncase's alignment (layer 8, weights/bn 128, act 256); the SDK loads them"


@dataclass
class Layer:
    """One v3 layer: the fixed struct's values plus its variable tail.

    To write a new layer, fill ``fields`` with every name of ``LAYER_TYPES[type].struct`` (the
    tail counts - input_count, in/out_channels, channels - are recomputed from ``data``) and,
    for K210_CONV, set ``conv``; the four *_offset fields are computed by the writer.
    """
    type: int
    fields: dict                    # the fixed struct's values
    conv: kpu.KpuConv | None = None  # K210_CONV
    data: dict = field(default_factory=dict)  # variable tails: table / ranges / weights,bias / pairs
    align: dict | None = None       # K210_CONV block alignments (None = DEFAULT_ALIGN)
    gaps: dict | None = None        # K210_CONV blocks placed at a byte gap, not an alignment
    shared: dict | None = None      # K210_CONV blocks stored once, by an earlier layer: {block: its index}
    body_size: int | None = None    # as read: kept when it is not the 8-aligned size (Maix-EMC)

    @property
    def name(self) -> str:
        return LAYER_TYPES[self.type].name


@dataclass
class KModelV3:
    layers: list
    outputs: list                   # [(address, size)]
    main_mem_usage: int
    flags: int = 1                  # bit0: 8-bit weights
    arch: int = 0
    max_start_address: int = 0
    omitted_tail: int = 0           # trailing padding bytes the source file lacked (nncase v0.1)
    packed: bool = False            # K210_CONV blocks packed into the padding before them (`_pack`)
    compact: bool = False           # ... at COMPACT_ALIGN, else at DEFAULT_ALIGN
    version: int = 3
    notes: list = field(default_factory=list)  # deviations from nncase's writer habits (read only)

    # the interface both kmodel versions answer (KModelV4 has the same names)
    item_kind = "layer"

    @property
    def items(self) -> list:
        """The layers, in run order."""
        return self.layers

    @property
    def main_memory(self) -> int:
        """Bytes of main memory the runtime allocates for the model's buffers."""
        return self.main_mem_usage

    @property
    def eight_bit(self) -> bool:
        return bool(self.flags & 1)

    def output_specs(self) -> list:
        """(dtype, shape) of each model output: uint8 map if a K210_CONV streams it, else float32."""
        specs = []
        for addr, size in self.outputs:
            spec = (np.float32, (size // 4,))
            for L in self.layers:
                if L.name == "K210_CONV" and L.fields["flags"] & 1 and L.fields["main_mem_out_address"] == addr:
                    spec = (np.uint8, L.conv.out_shape)
                elif L.name in ("QUANTIZE", "QUANTIZED_ADD", "REQUANTIZE", "K210_REMOVE_PADDING",
                                "QUANTIZED_CONCAT", "QUANTIZED_MAX_POOL2D") and \
                        L.fields.get("main_mem_out_address", L.fields.get("mem_out_address")) == addr:
                    spec = (np.uint8, (size,))
                elif L.fields.get("main_mem_out_address", L.fields.get("mem_out_address")) == addr:
                    spec = (np.float32, (size // 4,))
            specs.append(spec)
        return specs

    def output_size(self) -> int:
        """Values in output 0, known from the model before running it."""
        if not self.outputs:
            raise Tl2k210Error("the model declares no output")
        return int(np.prod(self.output_specs()[0][1]))

    def output_bytes(self) -> int:
        """Bytes of all outputs of one run, known from the header before running."""
        return sum(int(size) for _, size in self.outputs)


def _count_ranges(f: dict, ins: tuple, out: str, bytes_in: int = 1, bytes_out: int = 1):
    n = f["count"]
    return [(k, f[k], n * bytes_in) for k in ins], (out, f[out], n * bytes_out)


#: main-memory (input ranges, output range) of the v3 CPU layers whose output may be placed over
#: an input (the others' are not checked: the lowering never aliases them)
IO_RANGES = {
    "QUANTIZED_ADD": lambda f: _count_ranges(f, ("main_mem_in_a_address", "main_mem_in_b_address"),
                                             "main_mem_out_address"),
    "ADD": lambda f: _count_ranges(f, ("main_mem_in_a_address", "main_mem_in_b_address"),
                                   "main_mem_out_address", 4, 4),
    "QUANTIZED_MAX_POOL2D": lambda f: ([("main_mem_in_address", f["main_mem_in_address"],
                                         int(np.prod(f["in_shape"])))],
                                        ("main_mem_out_address", f["main_mem_out_address"],
                                         int(np.prod(f["out_shape"])))),
    "QUANTIZE": lambda f: _count_ranges(f, ("main_mem_in_address",), "mem_out_address", 4, 1),
    "DEQUANTIZE": lambda f: _count_ranges(f, ("main_mem_in_address",), "mem_out_address", 1, 4),
    "REQUANTIZE": lambda f: _count_ranges(f, ("main_mem_in_address",), "main_mem_out_address"),
    "LOGISTIC": lambda f: _count_ranges({**f, "count": f["channels"]}, ("main_mem_in_address",),
                                        "main_mem_out_address", 4, 4),
}

def pool_reads_ahead(f: dict) -> bool:
    """Does every output (c, y, x) of a QUANTIZED_MAX_POOL2D read only input bytes at or after
    its own index, with the output at the input's address? The SDK's kpu_quantized_max_pool2d
    (lib/drivers/kpu.c) loops channel, row, column, reads a window and then writes one byte, so
    it then never reads a byte it has already written: a crop or a pick in place."""
    (w, h, c), (ow, oh, oc) = f["in_shape"], f["out_shape"]
    if oc != c or oh * ow > h * w:
        return False
    rows = np.clip(np.arange(oh) * f["stride_height"] - f["padding_height"], 0, h - 1)
    cols = np.clip(np.arange(ow) * f["stride_width"] - f["padding_width"], 0, w - 1)
    first = rows[:, None] * w + cols[None, :]          # channel 0; each later one gains h*w - oh*ow
    return bool(np.all(first >= np.arange(oh * ow).reshape(oh, ow)))


#: which output may be an input, per layer type (fields, input field, input address, output
#: address): the standalone SDK's kpu_quantized_add (lib/drivers/kpu.c) reads 8 values of each
#: input, then writes those 8 outputs, block by block in order, so an output that *is* one of its
#: inputs (same address) is safe; so is kpu_requantize's `dest[oc] = table[src[oc]]` (each byte
#: read once, to write its own index); so is kpu_logistic's `dest[oc] = 1 / (1 + exp(-src[oc]))`
#: (nncase v0.1's reference Forward is the same loop); kpu_quantized_max_pool2d when
#: pool_reads_ahead; no other
IN_PLACE = {"QUANTIZED_ADD": lambda f, k, a, o: a == o,
            "REQUANTIZE": lambda f, k, a, o: a == o,
            "LOGISTIC": lambda f, k, a, o: a == o,
            "QUANTIZED_MAX_POOL2D": lambda f, k, a, o: a == o and pool_reads_ahead(f)}


def overlapping_io(model: KModelV3) -> list[str]:
    """One line per layer whose output range shares main-memory bytes with one of its inputs
    where IN_PLACE does not say the SDK's loop is safe with it (the layers of IO_RANGES)."""
    lines = []
    for i, L in enumerate(model.layers):
        io = IO_RANGES.get(L.name)
        if io is None:
            continue
        ins, (on, o, n) = io(L.fields)
        safe = IN_PLACE.get(L.name, lambda *_: False)
        for k, a, m in ins:
            if a < o + n and o < a + m and not safe(L.fields, k, a, o):
                lines.append(f"layer {i} ({L.name}): {on} [{o}, {o + n}) overlaps {k} [{a}, {a + m})")
    return lines


# ---------------------------------------------------------------------------------------------
CHUNK = 1 << 16  # header entries validated per numpy pass
MAX_MAIN_MEM = SRAM_BYTES  # the loader mallocs main_mem_usage: no K210 has more SRAM


def _packing(model: KModelV3, data: bytes):
    """Does `_pack` lay the model's layers out as `data` has them? None, else its ``compact``."""
    if model.omitted_tail:
        return None
    for compact in (False, True):
        try:
            if write(dataclasses.replace(model, packed=True, compact=compact)) == data:
                return compact
        except KmodelFormatError:
            return None
    return None


def _check_headers(data: bytes, n_out: int, n_layers: int):
    """Validate every count, size and offset the header claims against the file length, on
    numpy views (no per-entry object), before anything is built."""
    size = len(data)
    table_end = HEADER.size + 8 * n_out + 8 * n_layers
    check(HEADER.size + 8 * n_out <= size,
          f"output_count {n_out} claims an outputs table of {8 * n_out:,} bytes at offset "
          f"{HEADER.size}; the file has {size:,} bytes", 24, "output_count")
    check(table_end <= size,
          f"layers_length {n_layers} claims {8 * n_layers:,} bytes of layer headers at offset "
          f"{HEADER.size + 8 * n_out}; the file has {size:,} bytes", 12, "layers_length")
    check(n_layers > 0, "layers_length is 0: the SDK runner needs at least one layer", 12,
          "layers_length")
    hdr = np.frombuffer(data, "<u4", 2 * n_layers, HEADER.size + 8 * n_out).reshape(-1, 2)
    base = HEADER.size + 8 * n_out
    known_types = np.array(list(LAYER_TYPES), np.uint32)
    total = table_end
    for c0 in range(0, n_layers, CHUNK):   # bounded temporaries however large the claim
        types, sizes = hdr[c0:c0 + CHUNK, 0], hdr[c0:c0 + CHUNK, 1].astype(np.int64)
        known = np.isin(types, known_types)
        if not known.all():
            i = c0 + int(np.argmin(known))
            check(False, f"layer {i}: unknown v3 layer type {int(hdr[i, 0])}", base + 8 * i,
                  f"layer {i} type")
        bad = (sizes <= 0) | (sizes >= 1 << 31)  # MaixPy reads body_size as int: <= 0 is refused
        if bad.any():
            i = c0 + int(np.argmax(bad))
            check(False, f"layer {i} ({LAYER_TYPES[int(hdr[i, 0])].name}): body_size "
                  f"{int(hdr[i, 1])} <= 0 as the loader's int (MaixPy: ERR_KMODEL_FORMAT)",
                  base + 8 * i + 4, f"layer {i} body_size")
        ends = total + np.cumsum(sizes)
        over = ends > size + 7
        if over.any():
            i = int(np.argmax(over))
            check(False, f"layer {c0 + i}: bodies up to this one claim {int(ends[i]):,} bytes, the "
                  f"file has {size:,}", base + 8 * (c0 + i) + 4, f"layer {c0 + i} body_size")
        total = int(ends[-1])
    return hdr, table_end


def read(data: bytes) -> KModelV3:
    r = Reader(data)
    h = r.struct(HEADER, "v3 header")
    check(h["version"] == 3, f"not a kmodel v3 (version {h['version']})", 0, "version")
    check(h["arch"] == 0, f"kmodel v3 arch must be 0 (the SDK loader refuses {h['arch']})", 8, "arch")
    check(h["main_mem_usage"] <= MAX_MAIN_MEM,
          f"main_mem_usage {h['main_mem_usage']:,} bytes: the loader mallocs it and a K210 has "
          f"{MAX_MAIN_MEM:,} bytes of SRAM", 20, "main_mem_usage")
    n_out, n_layers = h["output_count"], h["layers_length"]
    hdr, pos = _check_headers(data, n_out, n_layers)
    outputs = [tuple(int(v) for v in pair) for pair in
               np.frombuffer(data, "<u4", 2 * n_out, HEADER.size).reshape(-1, 2)]
    eight_bit = bool(h["flags"] & 1)
    model = KModelV3([], outputs, h["main_mem_usage"], h["flags"], h["arch"],
                     h["max_start_address"])
    model.pending, model.owners = Notes(), {}
    total = pos + int(hdr[:, 1].astype(np.int64).sum())
    model.omitted_tail = max(0, total - len(data))
    if model.omitted_tail:
        model.notes.append(f"the file ends {model.omitted_tail} bytes before the last body's "
                           "padding (nncase v0.1 habit; the SDK copies the full sum of body sizes)")
    head_at = HEADER.size + 8 * n_out
    unaligned = []
    for i, (typ, size) in enumerate(hdr.tolist()):
        where = f"layer {i}"
        t = LAYER_TYPES[typ]
        end = pos + size
        if pos % 8 and i:  # the first body follows the 28+8k-byte header: 4 mod 8 is normal
            unaligned.append((i, pos))
        if t.struct is None:
            model.layers.append(Layer(typ, {}, data={"raw": r.bytes(min(size, len(data) - pos),
                                                                     f"{where} ({t.name}) body", pos)}))
            pos = end
            continue
        r.need(t.struct.size, f"{where} ({t.name}) body", pos)
        check(t.struct.size <= size, f"{where} ({t.name}): body_size {size} < {t.struct.size}",
              head_at + 8 * i + 4, f"{where} body_size")
        layer = Layer(typ, t.struct.unpack(r.data, pos))
        content = _read_tail(r, t, layer, pos + t.struct.size, end, eight_bit, f"{where} ({t.name})",
                             model)
        if size != align_up(content, 8) - pos:
            layer.body_size = size  # not what the writer would produce: keep it (Maix-EMC)
        model.layers.append(layer)
        pos = end
    compact = None
    if OUT_OF_BODY in model.pending.kinds or BELOW_ALIGN in model.pending.kinds:
        compact = _packing(model, data)
    if compact is not None:         # written by `_pack`: the same bytes again, no placement to note
        model.packed, model.compact = True, compact
        for kind in (OUT_OF_BODY, BELOW_ALIGN):
            model.pending.kinds.pop(kind, None)
        for layer in model.layers:
            layer.align = layer.gaps = layer.body_size = None
    model.notes += model.pending.lines()
    del model.pending, model.owners
    if unaligned:
        at = ", ".join(f"{i}@{p}" for i, p in unaligned[:6]) + (" ..." if len(unaligned) > 6 else "")
        model.notes.append(f"{len(unaligned)} bodies start at an unaligned offset (layer@offset: {at}):"
                           " Maix-EMC layout; the SDK loads it (nncase pads every body to 8 bytes)")
    return model


def _read_tail(r: Reader, t: LayerType, layer: Layer, at: int, end: int, eight_bit: bool, where,
               model) -> int:
    """Read the variable part after the fixed struct; returns where the body's content ends."""
    if t.tail == "conv":
        return _read_conv(r, layer, at - t.struct.size, end, eight_bit, where, model)
    f = layer.fields
    for tl in TAILS.get(t.tail, ()):
        n = tl.count(f)
        size = n * np.dtype(tl.dtype).itemsize
        check(at + size <= end, f"{where}: {tl.key} ({n} x {tl.dtype}, from the fields "
              f"{sorted(k for k in f if k in ('input_count', 'in_channels', 'out_channels', 'channels'))})"
              " exceeds the body", at, tl.key)
        a = r.array(tl.dtype, n, f"{where} {tl.key}", at)
        if tl.shape is not None:
            a = a.reshape(tl.shape(f))
        layer.data[tl.key] = [tuple(int(v) for v in row) for row in a] if tl.key == "ranges" else a
        at += size
    return at


def _read_conv(r: Reader, layer: Layer, body: int, end: int, eight_bit: bool, where: str, model):
    """The four blocks sit at absolute file offsets. nncase puts them in order inside the body at
    fixed alignments; any other placement inside the file is loaded by the SDK too (noted)."""
    f = layer.fields
    offs = {b: f[b + "_offset"] for b in CONV_BLOCKS}
    args, reserved = kpu.read_layer_args(r, offs["layer"], where)
    kpu.validate_geometry(args, where, offs["layer"])
    conv = kpu.KpuConv(args, None, None, None, reserved)
    wsize = 1 if eight_bit else 2
    sizes = {"layer": hw.LAYER_ARG_BYTES, "weights": conv.weight_count() * wsize,
             "bn": 8 * conv.out_shape[0], "act": hw.ACT_TABLE_BYTES}
    for b in CONV_BLOCKS:
        r.need(sizes[b], f"{where} {b} block", offs[b])
    conv.weights = r.array("u1" if eight_bit else "<u2", conv.weight_count(), f"{where} weights",
                           offs["weights"])
    conv.bn, conv.bn_reserved = kpu.read_bn(r, offs["bn"], conv.out_shape[0], where)
    conv.act, conv.act_reserved = kpu.read_act(r, offs["act"], where)
    layer.conv = conv
    layer.shared = _shared_blocks(model.owners, offs, len(model.layers)) or None
    prev, align, gaps = body + 24, {}, {}
    for b in CONV_BLOCKS:
        if b in (layer.shared or ()):
            continue
        a = kpu.infer_align(prev, offs[b])
        if a is None:
            gaps[b] = offs[b] - prev
        else:
            align[b] = a
        prev = offs[b] + sizes[b]
    in_body = all(g >= 0 for g in gaps.values()) and prev <= end
    content = prev if in_body else body + 24
    if not in_body:
        model.pending.add(OUT_OF_BODY, f"{where} {offs}")
        align, gaps = None, None
    else:
        nn01 = all(align.get(b, 0) >= a for b, a in NN01_ALIGN.items() if b not in (layer.shared or ()))
        if not nn01:
            odd = [f"{b}@{offs[b]}" for b in CONV_BLOCKS if align.get(b, 0) < NN01_ALIGN[b] and b in align]
            model.pending.add(BELOW_ALIGN, f"{where}: {', '.join(odd)}")
    layer.align, layer.gaps = align, (gaps or None)
    if args["arg_x"] % (1 << args["shr_x"]) or args["arg_w"] % (1 << args["shr_w"]):
        model.pending.add("fractional zero points (Maix-EMC): the emulator's default silicon Σ rule "
                          "applies (docs/kpu.md#sum-rule)", f"{where.split(' (')[0]} arg_x {args['arg_x']} >> "
                          f"{args['shr_x']}, arg_w {args['arg_w']} >> {args['shr_w']}")
    return content


def _shared_blocks(owners: dict, offs: dict, i: int) -> dict:
    """{block: index of the earlier K210_CONV that stores it} for the blocks of conv `i` at the
    offset of an earlier conv's same block (tl2k210 stores each distinct weights, BN and
    activation block once: row bands, tables that come out alike; the SDK reads blocks at any file
    offset). `owners`: (block, offset) -> the first conv there, updated with conv `i`'s own."""
    shared = {}
    for b in CONV_BLOCKS[1:]:
        j = owners.setdefault((b, offs[b]), i)
        if j != i:
            shared[b] = j
    return shared


# ---------------------------------------------------------------------------------------------
def write(model: KModelV3) -> bytes:
    """Serialise; every body is padded so the next starts 8-aligned, trailing padding included,
    unless the layer keeps the ``body_size`` it was read with (Maix-EMC files) or the model was
    read from a file that lacked its final padding (``omitted_tail``, nncase v0.1). A ``packed``
    model places its K210_CONV blocks with `_pack`."""
    n = len(model.layers)
    head_size = HEADER.size + OUTPUT.size * len(model.outputs) + LAYER_HEADER.size * n
    bodies, pad = (_pack if model.packed else _bodies)(model, head_size)
    out = bytearray(HEADER.pack(dict(
        version=3, flags=model.flags, arch=model.arch, layers_length=n,
        max_start_address=model.max_start_address, main_mem_usage=model.main_mem_usage,
        output_count=len(model.outputs))))
    for addr, size in model.outputs:
        out += OUTPUT.pack(dict(address=addr, size=size))
    for layer, body in zip(model.layers, bodies):
        out += LAYER_HEADER.pack(dict(type=layer.type, body_size=len(body)))
    for body in bodies:
        out += body
    return drop_tail(bytes(out), model.omitted_tail, pad)


def _bodies(model: KModelV3, head_size: int):
    """Each body in turn, its K210_CONV blocks inside it in nncase order (or shared): (bodies,
    the last one's padding)."""
    bodies, pos, pad, stored = [], head_size, 0, {}
    for i, layer in enumerate(model.layers):
        body, pad = padded_body(_body_bytes(layer, pos, model.eight_bit, f"layer {i}", stored, i), pos,
                                layer.body_size)
        bodies.append(body)
        pos += len(body)
    return bodies, pad


#: the padding `_pack_stream` accepts before a 256-aligned block rather than let the next body
#: cross the multiple of 256 (the least total on the corpus's v3 models, of 0, 32, ..., 256)
SLACK = 64


def _pack(model: KModelV3, head_size: int):
    """The bodies with every K210_CONV block placed, at its alignment (DEFAULT_ALIGN; a ``compact``
    model may also take COMPACT_ALIGN), into room the file has anyway (the runner finds a block
    at its absolute file offset, wherever it is: docs/kpu.md): the shortest of two layouts (of
    four for a compact model: each at either alignment), the first on a tie. Shared blocks point
    at their first layer's. A pure function of the layers, so the reader recognises a packed file (`read`).
    Returns (bodies, 0)."""
    blocks = _conv_blocks(model)        # every layout places the same bytes
    tried = (DEFAULT_ALIGN, COMPACT_ALIGN) if model.compact else (DEFAULT_ALIGN,)
    layouts = [pack(model, head_size, blocks, aligns) for aligns in tried for pack in (_pack_holes, _pack_stream)]
    return min(layouts, key=lambda t: sum(map(len, t[0])))


def _pack_stream(model: KModelV3, head_size: int, block_bytes: dict, aligns: dict):
    """The second layout `_pack` tries: the bodies in order, each K210_CONV block waiting, from
    its layer's 24-byte header on, for a file offset of its alignment (`aligns`); before a
    multiple of it that a waiting block takes, the space is filled with the next bodies while they fit before it,
    then with the waiting 96-byte layer arguments (8-aligned); a body that does not fit crosses
    the multiple unless at most SLACK bytes of padding are left before it."""
    buf, starts, args, offs, refs, stored = bytearray(), [], [], {}, [], {}
    waiting = {}     # alignment -> the blocks waiting for it, first come first: (arrival, i, block, data)
    arrivals = count()

    def pos():
        return head_size + len(buf)

    def put(at, data=b""):
        buf.extend(bytes(at - pos()) + data)

    def fill(end):
        """The waiting layer arguments into [pos, end), first come first placed."""
        for a in list(args):
            at = align_up(pos(), 8)
            if at + len(a[2]) <= end:
                put(at, a[2])
                offs[a[0]][a[1]] = at
                args.remove(a)

    def flush(next_len):
        """Place waiting blocks until the next body (`next_len` bytes; None: none) goes first."""
        while any(waiting.values()):
            # the block the soonest offset takes, the first to arrive of those on a tie
            at, _, align = min((align_up(pos(), a), q[0][0], a) for a, q in waiting.items() if q)
            if next_len is not None and align_up(pos(), 8) + next_len <= at:
                return
            fill(at)
            if next_len is not None and at - pos() > SLACK:
                return
            _, i, b, data = waiting[align].popleft()
            put(at, data)
            offs[i][b] = at
        if next_len is None:
            fill(1 << 62)

    for i, layer in enumerate(model.layers):
        where = f"layer {i}"
        conv = LAYER_TYPES[layer.type].tail == "conv"
        body = bytes(24) if conv else _body_bytes(layer, pos(), model.eight_bit, where, stored, i)
        flush(len(body))
        put(align_up(pos(), 8) if buf else pos())
        starts.append(len(buf))
        buf.extend(padded_body(body, pos(), 0)[0])     # a body's size is the layout's, not one read
        if not conv:
            continue
        _check_bits(layer.conv, model.eight_bit, where)
        offs[i], blocks = {}, block_bytes[i]
        for b in CONV_BLOCKS:
            j = (layer.shared or {}).get(b)
            if j is not None:
                _check_shared(blocks[b], b, stored.get(j), j, where)
                refs.append((i, b, j))
            elif aligns[b] > 8:
                waiting.setdefault(aligns[b], collections.deque()).append((next(arrivals), i, b, blocks[b]))
            else:
                args.append((i, b, blocks[b]))
        stored[i] = (layer.conv, offs[i])
    flush(None)
    put(align_up(pos(), 8))
    for i, b, j in refs:
        offs[i][b] = offs[j][b]
    for i, o in offs.items():
        layer = model.layers[i]
        buf[starts[i]:starts[i] + 24] = LAYER_TYPES[layer.type].struct.pack(
            dict(layer.fields, **{b + "_offset": o[b] for b in CONV_BLOCKS}))
    return [bytes(buf[a:b]) for a, b in zip(starts, starts[1:] + [len(buf)])], 0


def _pack_holes(model: KModelV3, head_size: int, block_bytes: dict, aligns: dict):
    """The first layout `_pack` tries: each K210_CONV's aligned blocks (`aligns`) appended to its
    own body, in the order of them that ends it soonest, and its 96-byte layer argument (8-aligned)
    in the lowest hole of the padding so far where it fits (the aligned blocks are not tried in
    holes: a hole ends at the first multiple of its block's alignment), else appended."""
    buf, holes, stored, starts = bytearray(), [], {}, []      # holes: [start, end) where an argument fits
    for i, layer in enumerate(model.layers):
        pos = head_size + len(buf)
        starts.append(len(buf))
        if LAYER_TYPES[layer.type].tail != "conv":
            buf += padded_body(_body_bytes(layer, pos, model.eight_bit, f"layer {i}", stored, i), pos, 0)[0]
            continue
        f, blocks = dict(layer.fields), block_bytes[i]
        _check_bits(layer.conv, model.eight_bit, f"layer {i}")
        own = [b for b in CONV_BLOCKS if not _shared_offset(layer, b, blocks, stored, f, f"layer {i}")]
        sizes = {b: len(blocks[b]) for b in own}
        end, first, new, at = min((_place(order, sizes, holes[:1], pos + 24, aligns)
                                   for order in _orders(own, aligns)),
                                  key=lambda t: t[0])
        holes = first + holes[1:] + new
        buf += bytes(end - head_size - len(buf))
        for b, o in at.items():
            buf[o - head_size:o - head_size + sizes[b]] = blocks[b]
            f[b + "_offset"] = o
        buf += bytes(align_up(end, 8) - head_size - len(buf))
        buf[pos - head_size:pos - head_size + 24] = LAYER_TYPES[layer.type].struct.pack(f)
        stored[i] = (layer.conv, {b: f[b + "_offset"] for b in CONV_BLOCKS})
    ends = starts[1:] + [len(buf)]
    return [bytes(buf[a:b]) for a, b in zip(starts, ends)], 0


def _orders(own, aligns):
    """The orders `_pack` tries for a conv's own blocks: every order of the aligned ones (over 8
    bytes), then the 8-aligned layer argument."""
    aligned = [b for b in own if aligns[b] > 8]
    return [list(p) + [b for b in own if b not in aligned] for p in permutations(aligned)]


def _place(order, sizes, first, end, aligns):
    """Append the aligned blocks of `order` from `end` (at `aligns`), and put the layer argument into the
    lowest hole of `first` (the padding so far) and the holes the appending leaves, else after
    them: (the new end, what is left of `first`, the new holes, {block: offset})."""
    first, new, at = [list(h) for h in first], [], {}
    for b in order:
        a, n = aligns[b], sizes[b]
        o = _first_fit(first, a, n) if a == 8 else None
        if o is None and a == 8:
            o = _first_fit(new, a, n)
        if o is None:
            o = align_up(end, a)
            if _fits(end, o):
                new.append([end, o])
            end = o + n
        at[b] = o
    return end, first, new, at


def _fits(h0: int, h1: int) -> bool:
    """Does a layer argument (8-aligned) fit the hole [h0, h1)?"""
    return align_up(h0, 8) + hw.LAYER_ARG_BYTES <= h1


def _first_fit(holes: list, align: int, n: int):
    """The lowest offset of a hole where `n` bytes fit at `align`; the hole is split around them
    (a remainder kept only while a layer argument fits it)."""
    for k, (h0, h1) in enumerate(holes):
        at = align_up(h0, align)
        if at + n <= h1:
            holes[k:k + 1] = [h for h in ([h0, at], [at + n, h1]) if _fits(*h)]
            return at
    return None


def _body_bytes(layer: Layer, pos: int, eight_bit: bool, where: str, stored: dict, i: int) -> bytes:
    t = LAYER_TYPES[layer.type]
    if t.struct is None:
        return layer.data["raw"]
    f = dict(layer.fields)
    if t.tail == "conv":
        body = _conv_body(layer, f, pos, eight_bit, where, stored)
        stored[i] = (layer.conv, {b: f[b + "_offset"] for b in CONV_BLOCKS})
        return body
    tail = b""
    for tl in TAILS.get(t.tail, ()):
        a = np.asarray(layer.data[tl.key], tl.dtype)
        if tl.sets is not None:
            f.update(tl.sets(a))   # counts follow the arrays (given in their natural shape)
        check(a.size == tl.count(f), f"{where}: data[{tl.key!r}] has {a.size} items, the fields "
              f"imply {tl.count(f)}", None, tl.key)
        tail += a.tobytes()
    return t.struct.pack(f) + tail


def param_blocks(conv) -> dict:
    """The blocks of a K210_CONV that another may share: {"weights", "bn", "act": bytes}."""
    return {"weights": conv.weight_bytes(), "bn": conv.bn_bytes(), "act": conv.act_bytes()}


def _block_bytes(conv) -> dict:
    return {"layer": conv.layer_bytes(), **param_blocks(conv)}


def _conv_blocks(model) -> dict:
    """{layer index: its K210_CONV blocks' bytes}."""
    return {i: _block_bytes(layer.conv) for i, layer in enumerate(model.layers) if LAYER_TYPES[layer.type].tail == "conv"}


def _check_bits(conv, eight_bit: bool, where: str):
    if (conv.weights.dtype.itemsize == 1) != eight_bit:
        raise KmodelFormatError(f"{where}: weights are {conv.weights.dtype} but the model flags "
                                f"say {'8' if eight_bit else '16'}-bit weights")


def _check_shared(data: bytes, b: str, theirs, j: int, where: str):
    """KmodelFormatError unless layer `j` (`theirs`: its (conv, offsets) as stored so far), an
    earlier K210_CONV, has block `b` with the bytes `data`."""
    if theirs is None or _block_bytes(theirs[0])[b] != data:
        raise KmodelFormatError(f"{where}: its {b} block is shared with layer {j}, which does not "
                                "store the same bytes before it")


def _shared_offset(layer: Layer, b: str, blocks: dict, stored: dict, f: dict, where: str) -> bool:
    """Is block `b` stored once by an earlier layer (the same bytes)? Then its offset is set in `f`."""
    j = (layer.shared or {}).get(b)
    if j is None:
        return False
    _check_shared(blocks[b], b, stored.get(j), j, where)
    f[b + "_offset"] = stored[j][1][b]
    return True


def _conv_body(layer: Layer, f: dict, pos: int, eight_bit: bool, where: str, stored: dict) -> bytes:
    conv = layer.conv
    _check_bits(conv, eight_bit, where)
    align, gaps = layer.align or DEFAULT_ALIGN, layer.gaps or {}
    blocks = _block_bytes(conv)
    buf = bytearray(24)
    for b in CONV_BLOCKS:
        if _shared_offset(layer, b, blocks, stored, f, where):
            continue
        at = pos + len(buf) + gaps[b] if b in gaps else align_up(pos + len(buf), align.get(b, 8))
        buf += bytes(at - pos - len(buf))
        f[b + "_offset"] = at
        buf += blocks[b]
    buf[:24] = LAYER_TYPES[layer.type].struct.pack(f)
    return bytes(buf)

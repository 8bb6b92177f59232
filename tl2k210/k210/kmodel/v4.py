"""kmodel v4 (nncase v0.2, 'KMDL' version 4): reader and writer.

Layout (docs/kmodel-format.md#kmodel-v4): 40-byte header, input ranges, input shapes, output ranges, constants blob,
node headers, bodies (each padded to an absolute multiple of 8). kpu_conv2d bodies store, in
the three address fields of the layer argument, the padding skipped before the BN table,
the activation table and the weights (each block 256-aligned in the file).

One description per body serves the reader and the writer: ``OPCODES[code].struct`` (the fixed
fields, in file order) and ``OPCODES[code].arrays`` (the tail arrays and the fields their
lengths come from). Writing a model, e.g. from a lowering::

    add = Node(OPCODE_BY_NAME["quantized_binary"].code, {
        "input_a": (MEM_MAIN, DT_UINT8, 0, 64), "input_b": (MEM_MAIN, DT_UINT8, 64, 64),
        "output": (MEM_MAIN, DT_UINT8, 128, 64), "binary_op": BINARY_OPS.index("add"),
        "in_a_shape": (1, 4, 4, 4), "in_b_shape": (1, 4, 4, 4), "out_shape": (1, 4, 4, 4),
        "input_a_offset": -3, "input_a_mul": 1 << 20, "input_a_shift": 20, ...})
    conv = Node(OPCODE_BY_NAME["conv2d"].code, fields, {"weights": w, "bias": b})
    model = KModelV4([add, conv], inputs=[...], input_shapes=[(1, 3, 224, 224)], outputs=[...],
                     main_mem=n_bytes, constants=blob)
    tl2k210.k210.kmodel.save(model, "out.kmodel")      # atomic; bodies padded to 8 bytes

A missing field or an array whose length disagrees with the fields raises KmodelFormatError.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tl2k210.errors import Tl2k210Error
from tl2k210.k210 import hardware as hw
from tl2k210.k210.kmodel import kpu
from tl2k210.k210.kmodel.binio import Notes, Reader, Struct, align_up, check, drop_tail, padded_body

IDENTIFIER = 0x4B4D444C  # 'KMDL'
HEADER = Struct("identifier:u32 version:u32 flags:u32 target:u32 constants:u32 main_mem:u32 "
                "nodes:u32 inputs:u32 outputs:u32 reserved0:u32")
RANGE = Struct("r:range")
SHAPE = Struct("s:shape4")
NODE_HEADER = Struct("opcode:u32 body_size:u32")

MEM_CONST, MEM_MAIN, MEM_KPU = 0, 1, 2
CHUNK = 1 << 16  # header entries validated per numpy pass
DT_FLOAT32, DT_UINT8 = 0, 1
DTYPES = {DT_FLOAT32: np.float32, DT_UINT8: np.uint8}
BINARY_OPS = ("add", "sub", "mul", "div", "min", "max")
UNARY_OPS = ("abs", "ceil", "cos", "exp", "floor", "log", "neg", "rsqrt", "sin", "square")
REDUCE_OPS = ("mean", "min", "max", "sum")

_IO = "input:range output:range"
_WIN = "padding_h:padding padding_w:padding filter_h:i32 filter_w:i32 stride_h:i32 stride_w:i32 " \
       "dilation_h:i32 dilation_w:i32"


def _nchw_weights(f: dict, oc: int) -> int:
    """Weight count of an NCHW conv-like body: oc * (ic / groups) * fh * fw."""
    ic, g = f["in_shape"][1], f["groups"]
    check(g > 0 and ic % g == 0, f"groups {g} does not divide {ic} input channels")
    return oc * (ic // g) * f["filter_h"] * f["filter_w"]


# Variable tails: (data key, dtype, item count from the fixed fields). The reader reads and the
# writer writes exactly these, in this order, right after the fixed struct.
_OC = lambda f: f["out_channels"]  # noqa: E731
_NHWC_C = lambda f: f["in_shape"][3]  # noqa: E731
_TAILS = {
    "conv2d": (("weights", "<f4", lambda f: _nchw_weights(f, f["out_channels"])), ("bias", "<f4", _OC)),
    "conv2d_transpose": (("weights", "<f4", lambda f: _nchw_weights(f, f["out_shape"][1])),
                         ("bias", "<f4", lambda f: f["out_shape"][1])),
    "matmul": (("bias", "<f4", lambda f: f["b_cols"]),),
    "quantized_matmul": (("bias", "<i4", lambda f: f["b_cols"]),),
    "quantized_conv2d": (("bias", "<i4", _OC),
                         ("weights", "u1", lambda f: _nchw_weights(f, f["out_channels"]))),
    # NHWC variants (nncase v0.2 runtime/cpu/cpu_ops_body.h): OHWI weights, depthwise [C][fh][fw]
    "cpu_conv2d": (("weights", "<f4", lambda f: f["out_channels"] * f["filter_h"] * f["filter_w"]
                    * f["in_shape"][3]), ("bias", "<f4", _OC)),
    "cpu_depthwise_conv2d": (("weights", "<f4", lambda f: _NHWC_C(f) * f["filter_h"] * f["filter_w"]),
                             ("bias", "<f4", _NHWC_C)),
    "cpu_quantized_conv2d": (("bias", "<i4", _OC),
                             ("weights", "u1", lambda f: f["out_channels"] * f["filter_h"]
                              * f["filter_w"] * f["in_shape"][3])),
    "cpu_quantized_depthwise_conv2d": (("bias", "<i4", _NHWC_C),
                                       ("weights", "u1", lambda f: _NHWC_C(f) * f["filter_h"]
                                        * f["filter_w"])),
}
_QCONV = "input_offset:i32 filter_offset:i32 output_mul:i32 output_shift:i32 output_offset:i32"


@dataclass(frozen=True)
class Opcode:
    code: int
    name: str
    struct: Struct | None  # None: body kept opaque
    tail: str = ""         # "" | "arrays" (see _TAILS) | "concat" | "rest" | "kpu_conv"

    @property
    def arrays(self) -> tuple:
        return _TAILS.get(self.name, ())


def _op(code, name, spec, tail=""):
    return Opcode(code, name, Struct(spec), tail or ("arrays" if name in _TAILS else ""))


OPCODES = {o.code: o for o in (
    _op(0x00, "binary", "input_a:range input_b:range output:range binary_op:u32 "
        "in_a_shape:shape4 in_b_shape:shape4 out_shape:shape4 fused_activation:vrange"),
    _op(0x01, "concat", "output:range inner_size:u32 outer_size:u32 inputs_count:u32", "concat"),
    _op(0x02, "conv2d", f"{_IO} in_shape:shape4 groups:i32 out_channels:i32 {_WIN} "
        "fused_activation:vrange"),
    _op(0x03, "dequantize", f"{_IO} quant_param:qparam"),
    _op(0x04, "matmul", "input_a:range input_b:range output:range a_rows:i32 a_cols:i32 "
        "b_cols:i32 fused_activation:vrange"),
    _op(0x05, "pad", f"{_IO} in_shape:shape4 paddings:pad4 pad_value:scalar"),
    _op(0x06, "quantize", f"{_IO} quant_param:qparam"),
    _op(0x07, "reduce", f"{_IO} reduce_op:u32 in_shape:shape4 out_shape:shape4 init_value:f32"),
    _op(0x08, "reduce_window2d", f"{_IO} reduce_op:u32 in_shape:shape4 {_WIN} init_value:f32 "
        "fused_activation:vrange"),
    _op(0x09, "memory_copy", _IO),
    _op(0x0A, "resize_image", f"{_IO} in_shape:shape4 out_h:i32 out_w:i32 mode:u32 "
        "align_corners:bool"),
    _op(0x0B, "softmax", f"{_IO} inner_size:i32 outer_size:i32 beta:f32"),
    _op(0x0C, "transpose", f"{_IO} in_shape:shape4 perm:shape4"),
    _op(0x0D, "strided_slice", f"{_IO} in_shape:shape4 begin:shape4 end:shape4 strides:shape4 "
        "begin_mask:i32 end_mask:i32 ellipsis_mask:i32 new_axis_mask:i32 shrink_axis_mask:i32"),
    _op(0x0E, "unary", f"{_IO} unary_op:u32"),
    _op(0x0F, "quantized_conv2d", f"{_IO} in_shape:shape4 groups:i32 out_channels:i32 {_WIN} "
        + _QCONV),
    _op(0x10, "quantized_matmul", "input_a:range input_b:range output:range a_rows:i32 "
        "a_cols:i32 b_cols:i32 input_a_offset:i32 input_b_offset:i32 output_mul:i32 "
        "output_shift:i32 output_offset:i32"),
    _op(0x11, "quantized_binary", "input_a:range input_b:range output:range binary_op:u32 "
        "in_a_shape:shape4 in_b_shape:shape4 out_shape:shape4 input_a_offset:i32 "
        "input_a_mul:i32 input_a_shift:i32 input_b_offset:i32 input_b_mul:i32 input_b_shift:i32 "
        "output_offset:i32 output_mul:i32 output_shift:i32"),   # docs/kmodel-format.md#v4-opcodes: this order
    _op(0x12, "table_lookup1d", "input:range table:range output:range"),
    _op(0x13, "conv2d_transpose", f"{_IO} in_shape:shape4 out_shape:shape4 groups:i32 {_WIN} "
        "fused_activation:vrange"),
    _op(0x14, "nnil_unary_method", _IO, "rest"),
    _op(0x1001, "cpu_conv2d", f"{_IO} in_shape:shape4 out_channels:i32 {_WIN} "
        "fused_activation:vrange"),
    _op(0x1002, "cpu_depthwise_conv2d", f"{_IO} in_shape:shape4 {_WIN} fused_activation:vrange"),
    _op(0x1003, "cpu_reduce_window2d", f"{_IO} reduce_op:u32 in_shape:shape4 {_WIN} "
        "init_value:f32 fused_activation:vrange"),
    _op(0x1004, "cpu_quantized_conv2d", f"{_IO} in_shape:shape4 out_channels:i32 {_WIN} " + _QCONV),
    _op(0x1005, "cpu_quantized_depthwise_conv2d", f"{_IO} in_shape:shape4 {_WIN} " + _QCONV),
    _op(0x2001, "kpu_upload", f"{_IO} in_shape:shape4"),
    _op(0x2002, "kpu_conv2d", "main_mem_output:range batches:i32 reserved0:i32", "kpu_conv"),
)}
OPCODE_BY_NAME = {o.name: o for o in OPCODES.values()}
#: kpu_conv2d block order in the body and the layer-argument field holding each block's skip
KPU_BLOCKS = (("bn", "bwsx_base_addr"), ("act", "active_addr"), ("weights", "para_start_addr"))
#: each block's file alignment: nncase v0.2's 256 for all three, or a ``compact`` model's
#: (--optimize size) least the silicon takes, as in kmodel v3 (v3.COMPACT_ALIGN: BN and weights
#: 128, the activation table 256; docs/kmodel-format.md#v3-conv-parameter-placement)
DEFAULT_ALIGN = {"bn": 256, "act": 256, "weights": 256}
COMPACT_ALIGN = {"bn": 128, "act": 256, "weights": 128}


@dataclass
class Node:
    """One v4 node. To write a new one: ``Node(OPCODE_BY_NAME[name].code, fields, data)`` with
    every name of the opcode's struct in ``fields`` and, for opcodes with a tail, the arrays named
    in ``Opcode.arrays`` in ``data`` (their lengths must match the counts the fields imply);
    concat takes ``data["inputs"]`` (ranges) and ``data["dims"]``, nnil_unary_method
    ``data["code"]`` (bytes), kpu_conv2d ``conv`` (its three skip fields are computed)."""
    opcode: int
    fields: dict
    data: dict = field(default_factory=dict)
    conv: kpu.KpuConv | None = None
    raw: bytes | None = None  # opaque body
    body_size: int | None = None  # as read, when not the writer's 8-aligned size
    skips: tuple | None = None    # kpu_conv2d block skips as read, when not the 256-aligned ones

    @property
    def name(self) -> str:
        o = OPCODES.get(self.opcode)
        return o.name if o else f"opcode_0x{self.opcode:x}"


@dataclass
class KModelV4:
    nodes: list
    inputs: list          # [(memory_type, datatype, start, size)]
    input_shapes: list    # [(N, C, H, W)]
    outputs: list
    main_mem: int
    constants: bytes = b""
    target: int = 1
    flags: int = 0
    reserved0: int = 0
    omitted_tail: int = 0
    trailer: bytes = b""  # bytes after the last body (ignored by the runtime)
    version: int = 4
    notes: list = field(default_factory=list)  # deviations from nncase's writer habits (read only)
    compact: bool = False  # kpu_conv2d blocks at COMPACT_ALIGN, else at DEFAULT_ALIGN

    # the interface both kmodel versions answer (KModelV3 has the same names)
    item_kind = "node"

    @property
    def items(self) -> list:
        """The nodes, in run order."""
        return self.nodes

    @property
    def main_memory(self) -> int:
        """Bytes of main memory the runtime allocates for the model's buffers."""
        return self.main_mem

    def output_size(self) -> int:
        """Values in output 0, known from the model before running it."""
        if not self.outputs:
            raise Tl2k210Error("the model declares no output")
        rng = self.outputs[0]
        return rng[3] // np.dtype(DTYPES.get(rng[1], np.uint8)).itemsize

    def output_bytes(self) -> int:
        """Bytes of all outputs of one run, known from the header before running."""
        return sum(int(r[3]) for r in self.outputs)


# ---------------------------------------------------------------------------------------------
INPUT_FIELDS = ("input", "input_a", "input_b", "table")
OUTPUT_FIELDS = ("output", "main_mem_output")


def node_ranges(node: Node) -> tuple[list, list]:
    """(inputs, outputs) of a node: [(name, memory_range)], concat's inputs named inputs[i]."""
    f = node.fields
    ins = [(k, f[k]) for k in INPUT_FIELDS if k in f]
    ins += [(f"inputs[{i}]", r) for i, r in enumerate(node.data.get("inputs", ()))]
    return ins, [(k, f[k]) for k in OUTPUT_FIELDS if k in f]


def overlap(a, b) -> bool:
    """Two memory ranges share bytes (same memory, both non-empty)."""
    return a[0] == b[0] and a[3] > 0 and b[3] > 0 and a[2] < b[2] + b[3] and b[2] < a[2] + a[3]


def _elementwise_in_place(node: Node, iname: str, r, o) -> bool:
    """nncase v0.2.0-beta4 `kernels::neutral::binary` / `quantized_binary` (neutral_kernels.h, no
    CXX_RESTRICT): element i of each input is read, then output[i] written, in index order (the
    broadcast fallback too, at offset(out_shape, i)). An output that *is* an input of the output's
    shape (same bytes, same shape) is therefore safe: each element is read before it is replaced
    and never read again. Any other overlap (a shifted range, a broadcast input) is not."""
    f = node.fields
    shape = {"input_a": "in_a_shape", "input_b": "in_b_shape"}.get(iname)
    return shape is not None and tuple(r) == tuple(o) and tuple(f[shape]) == tuple(f["out_shape"])


def _lookup_in_place(node: Node, iname: str, r, o) -> bool:
    """nncase v0.2.0-beta4 `kernels::neutral::table_lookup1d`: `output[i] = table[input[i]]`.
    Its pointers are CXX_RESTRICT, but output[i] is a function of input[i] alone, so no order
    of its loads and stores a compiler may choose reads a byte after its own store: the output
    may be the input (same range); the table may not."""
    return iname == "input" and tuple(r) == tuple(o)
# nnil_unary_method (the same release, kernels::neutral): for each i, its program's lda_0 pushes
# input[i] (maybe several times) and ret stores output[i] last, no CXX_RESTRICT: the same rule


#: the per-op facts of which output may overlap which input (checked against each kernel's loop in
#: nncase v0.2.0-beta4; an op missing here may not overlap its inputs at all: most kernels take
#: CXX_RESTRICT pointers or read an input after writing the output, e.g. softmax, issue 29)
IN_PLACE = {"binary": _elementwise_in_place, "quantized_binary": _elementwise_in_place,
            "table_lookup1d": _lookup_in_place, "nnil_unary_method": _lookup_in_place}


def overlapping_io(model: KModelV4) -> list[str]:
    """One line per node whose output range shares bytes of memory with one of its input
    ranges, unless IN_PLACE says the kernel is safe with that alias. nncase's kernels then read
    inputs they already overwrote (a softmax reads its own results,
    docs/kmodel-format.md#v4-interpreter): a writer must never produce this; files from
    elsewhere may have it. A cheap check on any parsed v4 model."""
    lines = []
    for i, node in enumerate(model.nodes):
        ins, outs = node_ranges(node)
        safe = IN_PLACE.get(node.name)
        for on, o in outs:
            for iname, r in ins:
                if o[0] != MEM_CONST and overlap(o, r) and not (safe and safe(node, iname, r, o)):
                    lines.append(f"node {i} ({node.name}): {on} [{o[2]}, {o[2] + o[3]}) overlaps "
                                 f"{iname} [{r[2]}, {r[2] + r[3]}) in "
                                 + ("main memory" if o[0] == MEM_MAIN else "KPU RAM"))
    return lines


# ---------------------------------------------------------------------------------------------
def _check_headers(data: bytes, h: dict):
    """Every count and size of the header against the file length, on numpy views, before any
    per-entry object is built."""
    size = len(data)
    ni, no, nn, nc = h["inputs"], h["outputs"], h["nodes"], h["constants"]
    at = HEADER.size
    for count, per, name, off in ((ni, 32, "inputs", 28), (no, 16, "outputs", 32)):
        check(at + count * per <= size, f"{name} {count} claims {count * per:,} bytes of "
              f"{name} tables at offset {at}; the file has {size:,} bytes", off, name)
        at += count * per
    check(at + nc <= size, f"constants {nc:,} claims a constants blob at offset {at}; the file has "
          f"{size:,} bytes", 16, "constants")
    at += nc
    check(at + 8 * nn <= size, f"nodes {nn} claims {8 * nn:,} bytes of node headers at offset {at}; "
          f"the file has {size:,} bytes", 24, "nodes")
    hdr = np.frombuffer(data, "<u4", 2 * nn, at).reshape(-1, 2)
    codes = np.array(sorted(OPCODES), np.uint32)
    mins = np.array([OPCODES[int(c)].struct.size for c in codes], np.int64)
    body0 = total = at + 8 * nn
    for c0 in range(0, nn, CHUNK):   # bounded temporaries however large the claim
        ops, sizes = hdr[c0:c0 + CHUNK, 0], hdr[c0:c0 + CHUNK, 1].astype(np.int64)
        known = np.isin(ops, codes)
        if not known.all():
            i = c0 + int(np.argmin(known))
            check(False, f"node {i}: unknown v4 opcode 0x{int(hdr[i, 0]):x} (the runtime fails with "
                  "'Unknown opcode')", at + 8 * i, f"node {i} opcode")
        short = sizes < mins[np.searchsorted(codes, ops)]
        if short.any():
            i = c0 + int(np.argmax(short))
            check(False, f"node {i} ({OPCODES[int(hdr[i, 0])].name}): body_size {int(hdr[i, 1])} is "
                  "smaller than its fixed part", at + 8 * i + 4, f"node {i} body_size")
        ends = total + np.cumsum(sizes)
        over = ends > size + 7
        if over.any():
            i = int(np.argmax(over))
            check(False, f"node {c0 + i}: bodies up to this one claim {int(ends[i]):,} bytes, the "
                  f"file has {size:,}", at + 8 * (c0 + i) + 4, f"node {c0 + i} body_size")
        total = int(ends[-1])
    return hdr, body0


def read(data: bytes) -> KModelV4:
    r = Reader(data)
    h = r.struct(HEADER, "v4 header")
    check(h["identifier"] == IDENTIFIER, "not a kmodel v4 (no 'KMDL' identifier)", 0, "identifier")
    check(h["version"] == 4, f"not a kmodel v4 (version {h['version']})", 4, "version")
    check(h["target"] in (0, 1), f"target {h['target']} is neither CPU (0) nor K210 (1) "
          "(the loader refuses it)", 12, "target")
    hdr, pos = _check_headers(data, h)
    ni, no = h["inputs"], h["outputs"]
    inputs = [r.struct(RANGE, f"input {i} range")["r"] for i in range(ni)]
    shapes = [r.struct(SHAPE, f"input {i} shape")["s"] for i in range(ni)]
    outputs = [r.struct(RANGE, f"output {i} range")["r"] for i in range(no)]
    constants = r.bytes(h["constants"], "constants blob")
    model = KModelV4([], inputs, shapes, outputs, h["main_mem"], constants, h["target"],
                     h["flags"], h["reserved0"])
    model.pending, model.kpu_layouts = Notes(), []
    end_all = pos + int(hdr[:, 1].astype(np.int64).sum())
    model.omitted_tail = max(0, end_all - len(data))
    if model.omitted_tail:
        model.notes.append(f"the file ends {model.omitted_tail} bytes before the last body's "
                           "padding (the runtime reads only the body contents)")
    unaligned = []
    for i, (code, size) in enumerate(hdr.tolist()):
        op = OPCODES[code]
        where = f"node {i} ({op.name})"
        end = pos + size
        if pos % 8 and i:
            unaligned.append(i)
        node = Node(op.code, op.struct.unpack(r.data, pos))
        content = _read_tail(r, op, node, pos + op.struct.size, min(end, len(data)), where, model)
        if size != align_up(content, 8) - pos:
            node.body_size = size
        model.nodes.append(node)
        pos = end
    _kpu_layout(model)
    model.notes += model.pending.lines()
    del model.pending
    if unaligned:
        model.notes.append(f"{len(unaligned)} bodies start at an offset that is not 8-aligned "
                           f"(nodes {unaligned[:6]}{' ...' if len(unaligned) > 6 else ''}); "
                           "nncase pads every body to 8 bytes")
    model.trailer = bytes(r.data[pos:]) if pos < len(data) else b""
    if model.trailer:
        model.notes.append(f"{len(model.trailer)} bytes after the last body (ignored by the runtime)")
    return model


def _read_tail(r: Reader, op: Opcode, node: Node, at: int, end: int, where: str, model) -> int:
    """The variable part after the fixed struct; returns where the content ends."""
    f, d = node.fields, node.data

    def arr(dtype, count, name, off):
        check(0 <= count and off + count * np.dtype(dtype).itemsize <= end,
              f"{where}: {name} ({count} items) exceeds the body", off, name)
        return r.array(dtype, count, f"{where} {name}", off)

    if op.tail == "arrays":
        for name, dtype, count in op.arrays:
            n = count(f)
            d[name] = arr(dtype, n, name, at)
            at += n * np.dtype(dtype).itemsize
    elif op.tail == "concat":
        n = f["inputs_count"]
        check(20 * n <= end - at, f"{where}: inputs_count {n} exceeds the body", at - 4,
              "inputs_count")
        d["inputs"] = [tuple(int(v) for v in rng) for rng in arr("<u4", 4 * n, "inputs", at).reshape(-1, 4)]
        d["dims"] = [int(v) for v in arr("<i4", n, "dims", at + 16 * n)]
        at += 20 * n
    elif op.tail == "rest":
        d["code"] = r.bytes(end - at, f"{where} NNIL code", at)
        at = end
    elif op.tail == "kpu_conv":
        at = _read_kpu_conv(r, node, at, end, where, model)
    return at


def _read_kpu_conv(r: Reader, node: Node, at: int, end: int, where: str, model) -> int:
    args, reserved = kpu.read_layer_args(r, at, where)
    kpu.validate_geometry(args, where, at)
    conv = kpu.KpuConv(args, None, None, None, reserved)
    pos = at + hw.LAYER_ARG_BYTES
    sizes = {"bn": 8 * conv.out_shape[0], "act": hw.ACT_TABLE_BYTES, "weights": conv.weight_count()}
    offs = {}
    for block, skip_field in KPU_BLOCKS:
        offs[block] = pos + args[skip_field]
        pos = offs[block] + sizes[block]
    check(pos <= end, f"{where}: parameter blocks end at {pos}, past the body end {end}", at,
          "body_size")
    conv.bn, conv.bn_reserved = kpu.read_bn(r, offs["bn"], conv.out_shape[0], where)
    conv.act, conv.act_reserved = kpu.read_act(r, offs["act"], where)
    conv.weights = r.array("u1", conv.weight_count(), f"{where} weights", offs["weights"])
    node.conv = conv
    # the writer that placed them: nncase's 256 (default), the compact one, or neither (read() decides)
    fits = [all(args[k] == skip_of(b, offs[b] - args[k], compact) for b, k in KPU_BLOCKS) for compact in (False, True)]
    odd = [f"{b}@{o}" for b, o in offs.items() if o % DEFAULT_ALIGN[b]]
    model.kpu_layouts.append((node, *fits, f"{where.split(' (')[0]} {', '.join(odd)}"))
    return pos


def _kpu_layout(model):
    """A model is ``compact`` where every kpu_conv2d body has a compact writer's skips and one at
    least differs from nncase's; a body neither writer reproduces keeps its skips as read, noted."""
    bodies = model.kpu_layouts
    del model.kpu_layouts
    model.compact = any(not default for _, default, _, _ in bodies) and all(c for _, _, c, _ in bodies)
    for node, default, compact, odd in bodies:
        if not (compact if model.compact else default):
            node.skips = tuple(node.conv.args[k] for _, k in KPU_BLOCKS)
            model.pending.add("kpu_conv2d parameter blocks placed as neither nncase (each at the next "
                              "256) nor a compact writer (BN and weights 128, activation table 256) "
                              "places them; the nncase v0 runtime uses them as they are", odd)


# ---------------------------------------------------------------------------------------------
def write(model: KModelV4) -> bytes:
    head = bytearray(HEADER.pack(dict(
        identifier=IDENTIFIER, version=4, flags=model.flags, target=model.target,
        constants=len(model.constants), main_mem=model.main_mem, nodes=len(model.nodes),
        inputs=len(model.inputs), outputs=len(model.outputs), reserved0=model.reserved0)))
    for rng in model.inputs:
        head += RANGE.pack({"r": rng})
    for s in model.input_shapes:
        head += SHAPE.pack({"s": s})
    for rng in model.outputs:
        head += RANGE.pack({"r": rng})
    head += model.constants
    pos = len(head) + NODE_HEADER.size * len(model.nodes)
    bodies, pad = [], 0
    for node in model.nodes:
        body, pad = padded_body(_body_bytes(node, pos, model.compact), pos, node.body_size)
        bodies.append(body)
        pos += len(body)
    for node, body in zip(model.nodes, bodies):
        head += NODE_HEADER.pack(dict(opcode=node.opcode, body_size=len(body)))
    out = bytes(head) + b"".join(bodies)
    return out + model.trailer if model.trailer else drop_tail(out, model.omitted_tail, pad)


def _body_bytes(node: Node, pos: int, compact: bool = False) -> bytes:
    op = OPCODES[node.opcode]
    if op.struct is None:
        return node.raw
    f, d = dict(node.fields), node.data
    tail = b""
    if op.tail == "arrays":
        for name, dtype, count in op.arrays:
            a = np.asarray(d[name]).reshape(-1)
            check(a.size == count(f), f"{op.name}: data[{name!r}] has {a.size} items, the fields "
                  f"imply {count(f)}", None, name)
            tail += a.astype(dtype).tobytes()
    elif op.tail == "concat":
        f["inputs_count"] = len(d["inputs"])
        tail = (np.asarray(d["inputs"], "<u4").reshape(-1).tobytes()
                + np.asarray(d["dims"], "<i4").tobytes())
    elif op.tail == "rest":
        tail = d["code"]
    elif op.tail == "kpu_conv":
        return _kpu_conv_body(node, f, pos, compact)
    return op.struct.pack(f) + tail


def skip_of(block: str, cur: int, compact: bool) -> int:
    """The zero bytes before `block` at file offset `cur`: to its alignment."""
    return align_up(cur, (COMPACT_ALIGN if compact else DEFAULT_ALIGN)[block]) - cur


def _kpu_conv_body(node: Node, f: dict, pos: int, compact: bool = False) -> bytes:
    conv = node.conv
    blocks = {"bn": conv.bn_bytes(), "act": conv.act_bytes(), "weights": conv.weight_bytes()}
    args = dict(conv.args)
    cur = pos + OPCODES[node.opcode].struct.size + hw.LAYER_ARG_BYTES
    payload = b""
    for i, (block, skip_field) in enumerate(KPU_BLOCKS):
        skip = node.skips[i] if node.skips else skip_of(block, cur, compact)
        args[skip_field] = skip
        payload += bytes(skip) + blocks[block]
        cur += skip + len(blocks[block])
    conv.args = args
    return OPCODES[node.opcode].struct.pack(f) + conv.layer_bytes() + payload

"""kmodel v4 (nncase v0.2, 'KMDL' version 4): reader and writer.

Layout (spec §4): 40-byte header, input ranges, input shapes, output ranges, constants blob,
node headers, bodies (each padded to an absolute multiple of 8). kpu_conv2d bodies store, in
the three address fields of the layer argument, the padding skipped before the BN table,
the activation table and the weights (each block 256-aligned in the file).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tl2k210.k210 import hardware as hw
from tl2k210.k210.kmodel import kpu
from tl2k210.k210.kmodel.binio import Reader, Struct, align_up, check

IDENTIFIER = 0x4B4D444C  # 'KMDL'
HEADER = Struct("identifier:u32 version:u32 flags:u32 target:u32 constants:u32 main_mem:u32 "
                "nodes:u32 inputs:u32 outputs:u32 reserved0:u32")
RANGE = Struct("r:range")
SHAPE = Struct("s:shape4")
NODE_HEADER = Struct("opcode:u32 body_size:u32")

MEM_CONST, MEM_MAIN, MEM_KPU = 0, 1, 2
DT_FLOAT32, DT_UINT8 = 0, 1
DTYPES = {DT_FLOAT32: np.float32, DT_UINT8: np.uint8}
BINARY_OPS = ("add", "sub", "mul", "div", "min", "max")
UNARY_OPS = ("abs", "ceil", "cos", "exp", "floor", "log", "neg", "rsqrt", "sin", "square")
REDUCE_OPS = ("mean", "min", "max", "sum")

_IO = "input:range output:range"
_WIN = "padding_h:padding padding_w:padding filter_h:i32 filter_w:i32 stride_h:i32 stride_w:i32 " \
       "dilation_h:i32 dilation_w:i32"


@dataclass(frozen=True)
class Opcode:
    code: int
    name: str
    struct: Struct | None  # None: body kept opaque (layout not in the spec; emulator refuses it)
    tail: str = ""


OPCODES = {o.code: o for o in (
    Opcode(0x00, "binary", Struct("input_a:range input_b:range output:range binary_op:u32 "
                                  "in_a_shape:shape4 in_b_shape:shape4 out_shape:shape4 "
                                  "fused_activation:vrange")),
    Opcode(0x01, "concat", Struct("output:range inner_size:u32 outer_size:u32 inputs_count:u32"),
           "concat"),
    Opcode(0x02, "conv2d", Struct(f"{_IO} in_shape:shape4 groups:i32 out_channels:i32 {_WIN} "
                                  "fused_activation:vrange"), "conv2d"),
    Opcode(0x03, "dequantize", Struct(f"{_IO} quant_param:qparam")),
    Opcode(0x04, "matmul", Struct("input_a:range input_b:range output:range a_rows:i32 a_cols:i32 "
                                  "b_cols:i32 fused_activation:vrange"), "matmul"),
    Opcode(0x05, "pad", Struct(f"{_IO} in_shape:shape4 paddings:pad4 pad_value:scalar")),
    Opcode(0x06, "quantize", Struct(f"{_IO} quant_param:qparam")),
    Opcode(0x07, "reduce", Struct(f"{_IO} reduce_op:u32 in_shape:shape4 out_shape:shape4 "
                                  "init_value:f32")),
    Opcode(0x08, "reduce_window2d", Struct(f"{_IO} reduce_op:u32 in_shape:shape4 {_WIN} "
                                           "init_value:f32 fused_activation:vrange")),
    Opcode(0x09, "memory_copy", Struct(_IO)),
    Opcode(0x0A, "resize_image", Struct(f"{_IO} in_shape:shape4 out_h:i32 out_w:i32 mode:u32 "
                                        "align_corners:bool")),
    Opcode(0x0B, "softmax", Struct(f"{_IO} inner_size:i32 outer_size:i32 beta:f32")),
    Opcode(0x0C, "transpose", Struct(f"{_IO} in_shape:shape4 perm:shape4")),
    Opcode(0x0D, "strided_slice", Struct(f"{_IO} in_shape:shape4 begin:shape4 end:shape4 "
                                         "strides:shape4 begin_mask:i32 end_mask:i32 "
                                         "ellipsis_mask:i32 new_axis_mask:i32 "
                                         "shrink_axis_mask:i32")),
    Opcode(0x0E, "unary", Struct(f"{_IO} unary_op:u32")),
    Opcode(0x0F, "quantized_conv2d", Struct(
        f"{_IO} in_shape:shape4 groups:i32 out_channels:i32 {_WIN} input_offset:i32 "
        "filter_offset:i32 output_mul:i32 output_shift:i32 output_offset:i32"), "qconv2d"),
    Opcode(0x10, "quantized_matmul", Struct(
        "input_a:range input_b:range output:range a_rows:i32 a_cols:i32 b_cols:i32 "
        "input_a_offset:i32 input_b_offset:i32 output_mul:i32 output_shift:i32 "
        "output_offset:i32"), "qmatmul"),
    Opcode(0x11, "quantized_binary", Struct(
        "input_a:range input_b:range output:range binary_op:u32 in_a_shape:shape4 "
        "in_b_shape:shape4 out_shape:shape4 input_a_offset:i32 input_a_mul:i32 "
        "input_a_shift:i32 input_b_offset:i32 input_b_mul:i32 input_b_shift:i32 "
        "output_offset:i32 output_mul:i32 output_shift:i32")),
    Opcode(0x12, "table_lookup1d", Struct("input:range table:range output:range")),
    Opcode(0x13, "conv2d_transpose", Struct(
        f"{_IO} in_shape:shape4 out_shape:shape4 groups:i32 {_WIN} fused_activation:vrange"),
        "conv2d_transpose"),
    Opcode(0x14, "nnil_unary_method", Struct(_IO), "rest"),
    Opcode(0x1001, "cpu_conv2d", None),
    Opcode(0x1002, "cpu_depthwise_conv2d", None),
    Opcode(0x1003, "cpu_reduce_window2d", None),
    Opcode(0x1004, "cpu_quantized_conv2d", None),
    Opcode(0x1005, "cpu_quantized_depthwise_conv2d", None),
    Opcode(0x2001, "kpu_upload", Struct(f"{_IO} in_shape:shape4")),
    Opcode(0x2002, "kpu_conv2d", Struct("main_mem_output:range batches:i32 reserved0:i32"),
           "kpu_conv"),
)}
OPCODE_BY_NAME = {o.name: o for o in OPCODES.values()}
#: kpu_conv2d block order in the body and the layer-argument field holding each block's skip
KPU_BLOCKS = (("bn", "bwsx_base_addr"), ("act", "active_addr"), ("weights", "para_start_addr"))


@dataclass
class Node:
    opcode: int
    fields: dict
    data: dict = field(default_factory=dict)
    conv: kpu.KpuConv | None = None
    raw: bytes | None = None  # opaque body (opcodes whose layout the spec does not give)

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


# ---------------------------------------------------------------------------------------------
def read(data: bytes) -> KModelV4:
    r = Reader(data)
    h = r.struct(HEADER, "v4 header")
    check(h["identifier"] == IDENTIFIER, "not a kmodel v4 (no 'KMDL' identifier)", 0, "identifier")
    check(h["version"] == 4, f"not a kmodel v4 (version {h['version']})", 4, "version")
    check(h["target"] in (0, 1), f"target {h['target']} is neither CPU (0) nor K210 (1) "
          "(the loader refuses it)", 12, "target")
    ni, no, nn = h["inputs"], h["outputs"], h["nodes"]
    r.need(32 * ni + 16 * no, "input/output tables")
    inputs = [r.struct(RANGE, f"input {i} range")["r"] for i in range(ni)]
    shapes = [r.struct(SHAPE, f"input {i} shape")["s"] for i in range(ni)]
    outputs = [r.struct(RANGE, f"output {i} range")["r"] for i in range(no)]
    constants = r.bytes(h["constants"], "constants blob")
    r.need(8 * nn, "node headers")
    headers = [r.struct(NODE_HEADER, f"node {i} header") for i in range(nn)]
    pos = r.pos
    end_all = pos + sum(x["body_size"] for x in headers)
    omitted = max(0, end_all - len(data))
    check(omitted <= 7, f"bodies claim {end_all} bytes, file has {len(data)}", len(data),
          "node bodies")
    nodes = []
    for i, nh in enumerate(headers):
        where = f"node {i}"
        op = OPCODES.get(nh["opcode"])
        hdr_at = pos - 8 * (nn - i)
        check(op is not None, f"{where}: unknown v4 opcode 0x{nh['opcode']:x}", hdr_at, "opcode")
        size = nh["body_size"]
        end = pos + size
        where = f"{where} ({op.name})"
        if op.struct is None:
            nodes.append(Node(op.code, {}, raw=r.bytes(min(size, len(data) - pos), where, pos)))
        else:
            r.need(op.struct.size, f"{where} body", pos)
            check(op.struct.size <= size, f"{where}: body_size {size} < {op.struct.size}", hdr_at + 4,
                  "body_size")
            node = Node(op.code, op.struct.unpack(r.data, pos))
            _read_tail(r, op, node, pos, pos + op.struct.size, min(end, len(data)), where)
            nodes.append(node)
        pos = end
    trailer = bytes(r.data[pos:]) if pos < len(data) else b""
    return KModelV4(nodes, inputs, shapes, outputs, h["main_mem"], constants, h["target"],
                    h["flags"], h["reserved0"], omitted, trailer)


def _weights_count(f: dict, key_ic: int, oc: int) -> int:
    g = f["groups"]
    check(g > 0 and key_ic % g == 0 and oc >= 0, f"groups {g} does not divide {key_ic} channels")
    return oc * (key_ic // g) * f["filter_h"] * f["filter_w"]


def _read_tail(r: Reader, op: Opcode, node: Node, body: int, at: int, end: int, where: str):
    f, d = node.fields, node.data
    room = end - at

    def arr(dtype, count, name, off):
        check(0 <= count and off + count * np.dtype(dtype).itemsize <= end,
              f"{where}: {name} ({count} items) exceeds the body", off, name)
        return r.array(dtype, count, f"{where} {name}", off)

    if op.tail == "concat":
        n = f["inputs_count"]
        check(20 * n <= room, f"{where}: inputs_count {n} exceeds the body", at - 4, "inputs_count")
        d["inputs"] = [tuple(int(v) for v in arr("<u4", 4, "input range", at + 16 * j))
                       for j in range(n)]
        d["dims"] = [int(v) for v in arr("<i4", n, "dims", at + 16 * n)]
    elif op.tail == "conv2d":
        n = _weights_count(f, f["in_shape"][1], f["out_channels"])
        d["weights"] = arr("<f4", n, "weights", at)
        d["bias"] = arr("<f4", f["out_channels"], "bias", at + 4 * n)
    elif op.tail == "conv2d_transpose":
        n = _weights_count(f, f["in_shape"][1], f["out_shape"][1])
        d["weights"] = arr("<f4", n, "weights", at)
        d["bias"] = arr("<f4", f["out_shape"][1], "bias", at + 4 * n)
    elif op.tail == "matmul":
        d["bias"] = arr("<f4", f["b_cols"], "bias", at)
    elif op.tail == "qmatmul":
        d["bias"] = arr("<i4", f["b_cols"], "bias", at)
    elif op.tail == "qconv2d":
        oc = f["out_channels"]
        d["bias"] = arr("<i4", oc, "bias", at)
        d["weights"] = arr("u1", _weights_count(f, f["in_shape"][1], oc), "weights", at + 4 * oc)
    elif op.tail == "rest":
        d["code"] = r.bytes(room, f"{where} NNIL code", at)
    elif op.tail == "kpu_conv":
        _read_kpu_conv(r, node, at, end, where)


def _read_kpu_conv(r: Reader, node: Node, at: int, end: int, where: str):
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
    bodies = []
    for node in model.nodes:
        body = _body_bytes(node, pos)
        body += bytes(align_up(pos + len(body), 8) - pos - len(body))
        bodies.append(body)
        pos += len(body)
    for node, body in zip(model.nodes, bodies):
        head += NODE_HEADER.pack(dict(opcode=node.opcode, body_size=len(body)))
    out = bytes(head) + b"".join(bodies)
    return out + model.trailer


def _body_bytes(node: Node, pos: int) -> bytes:
    op = OPCODES[node.opcode]
    if op.struct is None:
        return node.raw
    f, d = dict(node.fields), node.data
    tail = b""
    if op.tail == "concat":
        f["inputs_count"] = len(d["inputs"])
        tail = (np.asarray(d["inputs"], "<u4").reshape(-1).tobytes()
                + np.asarray(d["dims"], "<i4").tobytes())
    elif op.tail in ("conv2d", "conv2d_transpose"):
        tail = np.asarray(d["weights"], "<f4").tobytes() + np.asarray(d["bias"], "<f4").tobytes()
    elif op.tail == "matmul":
        tail = np.asarray(d["bias"], "<f4").tobytes()
    elif op.tail == "qmatmul":
        tail = np.asarray(d["bias"], "<i4").tobytes()
    elif op.tail == "qconv2d":
        tail = np.asarray(d["bias"], "<i4").tobytes() + np.asarray(d["weights"], "u1").tobytes()
    elif op.tail == "rest":
        tail = d["code"]
    elif op.tail == "kpu_conv":
        return _kpu_conv_body(node, f, pos)
    return op.struct.pack(f) + tail


def _kpu_conv_body(node: Node, f: dict, pos: int) -> bytes:
    conv = node.conv
    blocks = {"bn": conv.bn_bytes(), "act": conv.act_bytes(), "weights": conv.weight_bytes()}
    args = dict(conv.args)
    cur = pos + OPCODES[node.opcode].struct.size + hw.LAYER_ARG_BYTES
    payload = b""
    for block, skip_field in KPU_BLOCKS:
        skip = align_up(cur, 256) - cur
        args[skip_field] = skip
        payload += bytes(skip) + blocks[block]
        cur += skip + len(blocks[block])
    conv.args = args
    return OPCODES[node.opcode].struct.pack(f) + conv.layer_bytes() + payload

"""The 8-bit ideal of a graph: what the same network needs at 8 bits, computed from the graph after
the passes (before calibration), the yardstick of every receipt and refusal.

    ide = ideal(graph, weight_bits=8)
    ide.weight_bytes, ide.live_bytes, ide.total, ide.peak_at, ide.layers[0]

* weights: every Conv/ConvTranspose/Gemm/MatMul weight at `weight_bits` (8 or 16), its bias at
  4 B a channel (an int32 accumulator term), any other constant operand of an op that computes
  with it (an Add's constant, a Mul's scale) at 1 B an element, and 256 B (a uint8 lookup
  table) for each non piecewise-linear activation, fused or standalone. Shape operands (Reshape's
  shape, Resize's scales, Pad's pads...) are metadata, not weights. Each weight op also counts the
  fixed bytes of the smallest kmodel layer any 8-bit form of it has (`LAYER_BYTES`: a kmodel v4
  node header + the fixed body of quantized_conv2d, 116 B, or quantized_matmul, 80 B;
  docs/kmodel-format.md#v4-opcodes): no form stores a conv's weights without its arguments (a
  KPU conv needs more: 96 B of layer arguments, a 144 B activation table, 8 B of BN a channel).
* maps (the live-set lower bound): every map a uint8 byte an element; a map lives from the op
  that writes it (the model input: from the start) to the last op that reads it (a model output:
  to the end); at each op its inputs and outputs are live together (no in-place). A relabel
  (Reshape, Flatten, Squeeze, Unsqueeze, Identity) writes no new map: its output is its input's
  buffer; nor does a PReLU that alone reads a conv's output (the conv's activation at 8 bits: the
  graph `flow.network_ideal` measures keeps PReLUs whole). The bound is the largest sum of maps
  live at one op.

The ideal (weights + maps) is the yardstick: a model whose ideal fits a runtime's budget should
convert for it. It is not quite a floor, for maps may live in the 2 MiB KPU RAM instead of main
memory: `floor` is, the weights + at the op where it is most what of the live set the KPU RAM
cannot hold (a map larger than the KPU RAM is in main memory whole; the others there at most
its size), and a model whose floor exceeds what a runtime leaves cannot fit it in any form:
`convert` refuses it before calibration (fit.check_ideal).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tl2k210.graph import RELABELS
from tl2k210.k210 import hardware as hw

WEIGHT_OPS = ("Conv", "ConvTranspose", "Gemm", "MatMul")
#: ops whose constant operands say how (shapes, scales, bounds, indices), not what to compute with
SHAPE_OPERANDS = ("Reshape", "Resize", "Upsample", "Pad", "Slice", "Clip", "Expand", "Tile", "Squeeze",
                  "Unsqueeze", "Split", "Gather", "ReduceMean", "ReduceMax", "ReduceSum", "ReduceMin",
                  "TopK", "ConstantOfShape", "Range")
LINEAR_ACTS = (None, "Relu", "Clip", "LeakyRelu", "PRelu")
TABLE_OPS = ("Sigmoid", "Tanh", "Exp", "Log", "Elu", "Selu", "Softplus", "HardSigmoid", "HardSwish",
             "Swish", "Mish", "Sqrt", "Reciprocal", "Erf", "Gelu", "Softsign")
TABLE_BYTES = 256
BIAS_BYTES = 4
NODE_HEADER_BYTES = 8
#: the fixed bytes of the smallest layer of each weight op (v4 quantized_conv2d / quantized_matmul)
LAYER_BYTES = {"Conv": NODE_HEADER_BYTES + 116, "ConvTranspose": NODE_HEADER_BYTES + 116,
               "Gemm": NODE_HEADER_BYTES + 80, "MatMul": NODE_HEADER_BYTES + 80}


@dataclass
class LayerIdeal:
    node: str
    op: str
    weight_bytes: int      # this op's weights/bias/table at the ideal
    live_bytes: int        # uint8 maps live while this op runs
    main_bytes: int = 0    # the least of them main memory holds (what the KPU RAM cannot)


@dataclass
class Ideal:
    weight_bits: int
    weight_bytes: int
    live_bytes: int        # the live-set lower bound of main memory
    peak_at: str           # the op where it is reached
    layers: list = field(default_factory=list)

    @property
    def total(self) -> int:
        return self.weight_bytes + self.live_bytes

    @property
    def floor(self) -> int:
        """The least kmodel + main memory of any form: the maps the KPU RAM cannot hold are in main memory."""
        return self.weight_bytes + max((r.main_bytes for r in self.layers), default=0)

    def layer(self, node) -> LayerIdeal | None:
        return next((r for r in self.layers if r.node == node), None)

    def text(self) -> str:
        return (f"ideal at {self.weight_bits} bits {mb(self.total)} (weights {mb(self.weight_bytes)} + "
                f"maps {mb(self.live_bytes)} live at {self.peak_at})")

    def to_dict(self) -> dict:
        return {"weight_bits": self.weight_bits, "weight_bytes": self.weight_bytes,
                "live_bytes": self.live_bytes, "total": self.total, "floor": self.floor, "peak_at": self.peak_at}


def mb(n: int) -> str:
    """'0.87 MB' (10 kB and up: the issue's unit), else '248 B'."""
    return f"{n / 1e6:.2f} MB" if n >= 10_000 else f"{n:,} B"


def _elements(shape) -> int:
    return int(np.prod([int(d) for d in shape])) if shape else 1


def node_weight_bytes(g, node, weight_bits: int = 8, fixed: bool = True, seen: set | None = None) -> int:
    """`fixed`: with the op's layer bytes and activation table (False for the second and later
    parts of one op that a pass split: g.meta["parts_of"]). `seen`: the constants counted at
    earlier nodes, stored once (a guided filter's 512x512 box-count map divides seven maps)."""
    total = 0
    for k, name in enumerate(node.inputs):
        v = g.const(name) if name else None
        if v is None or not np.issubdtype(np.asarray(v).dtype, np.floating) or seen is not None and name in seen:
            continue
        if seen is not None:
            seen.add(name)
        if node.op in WEIGHT_OPS and k == 1:
            total += -(-v.size * weight_bits // 8) + (LAYER_BYTES[node.op] if fixed else 0)
        elif node.op in WEIGHT_OPS and k == 2:
            total += BIAS_BYTES * v.size
        elif node.op not in SHAPE_OPERANDS and v.size > 1:
            total += v.size
    act = (node.attrs.get("activation") or {}).get("op") if isinstance(node.attrs.get("activation"), dict) else None
    if fixed and (act not in LINEAR_ACTS or node.op in TABLE_OPS):
        total += TABLE_BYTES
    return total


def ideal(g, weight_bits: int = 8) -> Ideal:
    """The ideal of graph `g` (after the passes) at `weight_bits`."""
    from tl2k210.graph import toposort
    order = toposort(g)
    alias = {}                                   # relabel output -> the buffer it names

    def buf(t):
        while t in alias:
            t = alias[t]
        return t
    readers = {}
    for n in order:
        for t in n.inputs:
            readers[t] = readers.get(t, 0) + 1
    made_by = {t: n.op for n in order for t in n.outputs}
    for n in order:
        if n.op in RELABELS and n.inputs and not g.tensors[n.inputs[0]].is_const:
            alias[n.outputs[0]] = n.inputs[0]
        elif n.op == "PRelu" and made_by.get(n.inputs[0]) == "Conv" and readers[n.inputs[0]] == 1 \
                and n.inputs[0] not in g.outputs:
            alias[n.outputs[0]] = n.inputs[0]        # the conv's activation, one slope a channel
    views = g.meta.get("strided_views", {})      # a pass's denser conv + strided Slice (unequal_strides):
    for dense, out in views.items():             # the source's conv output, one map of its size
        alias[out] = dense
    birth, death, size = {}, {}, {}
    for x in g.inputs:
        b = buf(x)
        birth[b], death[b] = -1, -1
    for i, n in enumerate(order):
        for t in n.inputs:
            if t and t in g.tensors and not g.tensors[t].is_const:
                death[buf(t)] = max(death.get(buf(t), i), i)
        for t in n.outputs:
            b = buf(t)
            birth.setdefault(b, i)
            death[b] = max(death.get(b, i), i)
    for t in g.outputs:
        death[buf(t)] = len(order)
    for t in birth:
        shape = g.tensors[views.get(t, t)].shape
        size[t] = _elements(shape) if shape else 0
    layers, peak, peak_at = [], 0, order[0].name if order else ""
    # a split op's parts: its fixed bytes once; a constant read by several ops: once
    parts_of, counted, seen = g.meta.get("parts_of", {}), set(), set()
    for i, n in enumerate(order):
        maps = [s for t, s in size.items() if birth[t] <= i <= death[t]]
        live = sum(maps)
        kpu = min(hw.KPU_RAM_BYTES, sum(s for s in maps if s <= hw.KPU_RAM_BYTES))
        origin = parts_of.get(n.name, n.name)
        layers.append(LayerIdeal(n.name, n.op, node_weight_bytes(g, n, weight_bits, origin not in counted, seen),
                                 live, live - kpu))
        counted.add(origin)
        if live > peak:
            peak, peak_at = live, n.name
    return Ideal(weight_bits, sum(r.weight_bytes for r in layers), peak, peak_at, layers)

"""The float graph IR: small dataclasses, ONNX in and out, shapes inferred.

Layout is NCHW (the ONNX convention), batch 1. Every tensor has a concrete shape after
`infer_shapes`. Constants (weights, biases, shape operands) are `Tensor`s with a `value`.

IR op vocabulary (what `k210.flow.run_pipeline` leaves for the K210 lowering; attrs are plain Python):

  Conv       inputs [X, W(Co,Ci/g,kh,kw), B(Co)] (B always present after the pipeline)
             kernel (kh,kw), strides (sh,sw), pads [top,left,bottom,right], group, dilations
             optional after fusion:
               activation {"op": "Relu"} | {"op": "Clip", "min": a, "max": b}
                          | {"op": "LeakyRelu", "alpha": a} | {"op": "Sigmoid"} | {"op": "Tanh"}
                          | {"op": "HardSigmoid", "alpha": a, "beta": b} | {"op": "HardSwish"}
                          | {"op": "Swish"}            (x * sigmoid(x))
                          | {"op": "Elu", "alpha": a} | {"op": "Selu", ...} | {"op": "Softplus"}
                          | {"op": "Mish"}             (x * tanh(softplus(x)))
               pool {"kind": "max"|"avg", "size": 2|4, "stride": 2|4|1, "pads": [t,l,b,r]}
             (ONNX semantics: conv -> +bias -> activation -> pool.)
  Every other op keeps its ONNX form: attrs under their ONNX names, operands such as Pad pads,
  Slice starts/ends/axes/steps, Resize scales, Reshape shape, Clip bounds as constant inputs
  (read them with `graph.const(name)`). What the pipeline may leave is what the K210 back-end
  lowers (`tl2k210.k210.lower.supported_ops()`, checked by the flow's check_supported): Add/Sub of two
  maps, Concat(axis), Resize (mode "nearest"; scales input, or sizes), GlobalAveragePool,
  GlobalMaxPool, MaxPool/AveragePool (kernel_shape, strides, pads) when not fused, Gemm/MatMul
  (only if wider than the KPU's 1024 channels), Softmax(axis), standalone activations,
  LpNormalization, Flatten/Reshape/Squeeze/Unsqueeze/Identity, Transpose(perm). Constant
  affines, Pads and PReLU are rewritten into Convs by the passes.

graph.meta: "opset"; "producer" (the ONNX producer_name: "pytorch", "tf2onnx", ...);
"input_layout"/"output_layout" {name: "NHWC->NCHW"} where a pass changed a TF model's NHWC
input/output to NCHW (feed the IR NCHW data; transpose the source's output); "rebatched"
{input: N} where a fixed batch N > 1 was read as one sample.

Nodes keep `fused`: the names/op types of the source ONNX nodes folded into them, for the
per-layer receipt. A fused Conv exposes its internal stages when exported with `to_onnx`:
`<out>:conv` (conv + bias, before activation) and `<out>:act` (after activation, before pool),
see `stage_names`.
"""
from __future__ import annotations

import copy
import dataclasses
import re
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper, numpy_helper, TensorProto

from tl2k210 import qlinear
from tl2k210.errors import ModelLoadError, nearest

OPSET = 18   # the IR's opset: what tf2onnx 1.17 writes at most (onnxruntime 1.32 runs up to 23)
MIN_OPSET = 13   # older ONNX files are upgraded to OPSET first (onnx.version_converter)
#: ops that relabel a tensor (same values, another shape): no new map, no rounding
RELABELS = ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity")
#: what carries a tensor's value unchanged to one a source file names (Graph.file_names): a
#: .tflite's int8 tensor is tf2onnx's float `X_prequant` (or a fused activation's `Relu__14:0`)
#: quantized, then transposed
FILE_CARRIERS = ("QuantizeLinear", "Transpose") + RELABELS
#: ops whose output holds their input's values, moved: a relabel or a transpose
MOVES = RELABELS + ("Transpose",)


@dataclass
class Tensor:
    name: str
    shape: tuple | None = None
    dtype: np.dtype = np.dtype(np.float32)
    value: np.ndarray | None = None

    @property
    def is_const(self):
        return self.value is not None


@dataclass
class Node:
    op: str
    inputs: list
    outputs: list
    attrs: dict = field(default_factory=dict)
    name: str = ""
    fused: list = field(default_factory=list)

    def __repr__(self):
        extra = {k: v for k, v in self.attrs.items() if k in ("activation", "pool", "strides", "pads")}
        return f"Node({self.op} {self.name} {self.inputs}->{self.outputs} {extra})"


@dataclass
class Graph:
    inputs: list
    outputs: list
    nodes: list
    tensors: dict  # name -> Tensor (activations and constants)
    meta: dict = field(default_factory=dict)

    # --- queries -----------------------------------------------------------------------
    @property
    def initializers(self):
        return {n: t for n, t in self.tensors.items() if t.is_const}

    def const(self, name):
        t = self.tensors.get(name)
        return None if t is None else t.value

    def shape(self, name):
        return self.tensors[name].shape

    def producer(self, name):
        for n in self.nodes:
            if name in n.outputs:
                return n
        return None

    def consumers(self, name):
        return [n for n in self.nodes if name in n.inputs]

    def single_consumer(self, name):
        """The only consumer of `name`, or None if it has several or is a graph output."""
        cs = self.consumers(name)
        return cs[0] if len(cs) == 1 and name not in self.outputs else None

    def copy(self):
        """A graph whose edits do not reach this one: nodes, tensors and meta's dicts, sets and
        lists are copies (a range recorded by name in a copy must not name another tensor here)."""
        meta = {k: copy.copy(v) if isinstance(v, (dict, set, list)) else v for k, v in self.meta.items()}
        return Graph(list(self.inputs), list(self.outputs),
                     [dataclasses.replace(n, inputs=list(n.inputs), outputs=list(n.outputs),
                                          attrs=dict(n.attrs), fused=list(n.fused)) for n in self.nodes],
                     {k: dataclasses.replace(t) for k, t in self.tensors.items()}, meta)

    # --- edits -------------------------------------------------------------------------
    def add_const(self, value, hint):
        value = np.asarray(value)
        name = self.unique(hint)
        self.tensors[name] = Tensor(name, tuple(value.shape), value.dtype, value)
        return name

    def add_tensor(self, hint, shape=None, dtype=np.float32):
        name = self.unique(hint)
        self.tensors[name] = Tensor(name, None if shape is None else tuple(shape), np.dtype(dtype))
        return name

    def unique(self, hint):
        name, i = hint, 0
        while name in self.tensors:
            i += 1
            name = f"{hint}_{i}"
        return name

    def replace_uses(self, old, new):
        """Consumers of `old` read `new`. Remove the node that produced `old` first. A graph
        output keeps its public name: `new`'s producer is renamed to write it (or an Identity).
        `new` now holds `old`'s values (a conv that took the Add or BN after it in: the conv's
        tensor), so the range a quantized model states for `old` (meta["quant_ranges"]) is `new`'s,
        and `new`'s values are those the source model calls `old` (meta["source_names"], for
        messages that tell the user a tensor name: `source_name`)."""
        ranges = self.meta.get("quant_ranges")
        if ranges and old in ranges:
            ranges[new] = ranges[old]
        names = self.meta.setdefault("source_names", {})
        names[new] = names.get(old, old)
        for n in self.nodes:
            n.inputs = [new if i == old else i for i in n.inputs]
        if old not in self.outputs:
            return
        p = self.producer(new)
        if p is not None and new not in self.inputs and new not in self.outputs:
            for n in self.nodes:
                n.outputs = [old if o == new else o for o in n.outputs]
                n.inputs = [old if i == new else i for i in n.inputs]
            self.tensors[old] = dataclasses.replace(self.tensors[new], name=old)
        else:
            self.nodes.append(Node("Identity", [new], [old], {}, self.unique(old + "/identity")))

    def source_name(self, t):
        """The source model's name of the values tensor `t` holds (a fused conv's tensor holds
        what its activation wrote): what --outputs takes."""
        return self.meta.get("source_names", {}).get(t, t)

    def file_names(self, ts) -> list | None:
        """Tensors `ts` as the source file names them, where only its own names are --outputs'
        (a .tflite: meta["file_tensors"]): each the file's tensor tf2onnx wrote as `<name>_prequant`
        (or `<name>_Gemm__134:0`), or the nearest of the file's tensors that carries its value
        (FILE_CARRIERS; hunt 21's advice named tf2onnx's `StridedSlice3_prequant`, which --outputs
        refused); None where one has none."""
        names = self.meta.get("file_tensors")
        if names is None:
            return [self.source_name(t) for t in ts]
        out = []
        for t in ts:
            bare = t          # tf2onnx's names of a file's tensor: X:0, X_prequant, X_Gemm__134:0
            for suffix in (r":\d+$", r"_prequant$", r"(_[A-Za-z]+)?__\d+$"):
                bare = bare if bare in names else re.sub(suffix, "", bare)
            seen, todo = {t}, [bare if bare in names else t]
            while todo and todo[0] not in names:
                todo += [o for n in self.consumers(todo.pop(0)) if n.op in FILE_CARRIERS for o in n.outputs[:1]
                         if o not in seen and not seen.add(o)]
            if not todo:
                return None
            out.append(todo[0])
        return list(dict.fromkeys(out))

    def prune(self):
        """Drop nodes whose outputs are unused and tensors nobody references; topo-sort."""
        live = set(self.outputs)
        keep = []
        for n in reversed(toposort(self)):
            if any(o in live for o in n.outputs):
                keep.append(n)
                live.update(i for i in n.inputs if i)
        self.nodes = keep[::-1]
        used = live | set(self.inputs) | {o for n in self.nodes for o in n.outputs}
        self.tensors = {k: t for k, t in self.tensors.items() if k in used}
        return self

    def op_counts(self):
        c = {}
        for n in self.nodes:
            c[n.op] = c.get(n.op, 0) + 1
        return c


def toposort(g):
    ready = set(g.inputs) | {k for k, t in g.tensors.items() if t.is_const} | {""}
    pending, out = list(g.nodes), []
    while pending:
        rest = []
        for n in pending:
            if all(i in ready for i in n.inputs):
                out.append(n)
                ready.update(n.outputs)
            else:
                rest.append(n)
        if len(rest) == len(pending):
            missing = sorted({i for n in rest for i in n.inputs if i not in ready})
            from tl2k210.errors import ModelLoadError
            raise ModelLoadError(f"graph has a cycle or reads undefined tensors: {missing[:5]} (read by "
                                 f"{', '.join(repr(n.name) for n in rest[:3])}); is the model file complete?")
        pending = rest
    return out


# ------------------------------------------------------------------------------------------
# ONNX -> IR
_DT = {TensorProto.FLOAT: np.float32, TensorProto.INT64: np.int64, TensorProto.INT32: np.int32,
       TensorProto.BOOL: np.bool_, TensorProto.DOUBLE: np.float64, TensorProto.UINT8: np.uint8,
       TensorProto.INT8: np.int8, TensorProto.FLOAT16: np.float16}


def _attr_value(a):
    v = helper.get_attribute_value(a)
    if isinstance(v, bytes):
        return v.decode()
    if isinstance(v, onnx.TensorProto):
        return numpy_helper.to_array(v)
    if isinstance(v, list):
        return [x.decode() if isinstance(x, bytes) else x for x in v]
    return v


def default_opset(model):
    return max([o.version for o in model.opset_import if o.domain in ("", "ai.onnx")] or [OPSET])


def ir4_if_initializers_unlisted(model):
    """IR < 4 wants every initializer listed as an input too; files (and tools) that skip that
    are IR-4 files in practice: read them as such (a copy; the model is not changed)."""
    names = {i.name for i in model.graph.input}
    if model.ir_version < 4 and any(t.name not in names for t in model.graph.initializer):
        copy = onnx.ModelProto()
        copy.CopyFrom(model)
        copy.ir_version = 4
        return copy
    return model


def float32_model(model):
    """A float16 model (Windows ML's *_fp16 zoo files) as float32: initializers, Constant
    values, Cast targets and the declared input / output / value types (a copy; float16 only
    stores what float32 computes here). The model itself where nothing is float16."""
    f16, f32 = TensorProto.FLOAT16, TensorProto.FLOAT
    g = model.graph
    infos = list(g.input) + list(g.output) + list(g.value_info)
    if not any(t.data_type == f16 for t in g.initializer) and not any(
            vi.type.tensor_type.elem_type == f16 for vi in infos) and not any(
            a.type == onnx.AttributeProto.TENSOR and a.t.data_type == f16 for n in g.node for a in n.attribute):
        return model
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph

    def widen(t):
        t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float32), t.name))
    for t in g.initializer:
        if t.data_type == f16:
            widen(t)
    for vi in list(g.input) + list(g.output) + list(g.value_info):
        if vi.type.tensor_type.elem_type == f16:
            vi.type.tensor_type.elem_type = f32
    for n in g.node:
        for a in n.attribute:
            if a.type == onnx.AttributeProto.TENSOR and a.t.data_type == f16:
                widen(a.t)
            elif n.op_type == "Cast" and a.name == "to" and a.i == f16:
                a.i = f32
    return m


def upgrade_opset(model):
    """A model older than MIN_OPSET (e.g. the opset-9 files of the ONNX model zoo) rewritten to
    OPSET, so the passes see one set of op forms (Clip bounds, Squeeze axes, Resize as inputs)."""
    if default_opset(model) >= MIN_OPSET:
        return model
    from onnx import version_converter
    model = ir4_if_initializers_unlisted(_experimental_ops(model))
    if default_opset(model) < 7:
        model = _legacy_prelu_slopes(model)
    model = _spatial_batchnorm(model)
    try:
        return version_converter.convert_version(model, OPSET)
    except Exception as e:  # the converter raises several kinds
        from tl2k210.errors import UnsupportedOpError
        raise UnsupportedOpError(f"ONNX opset {default_opset(model)} model: onnx.version_converter could not "
                                 f"upgrade it to opset {OPSET} ({type(e).__name__}: "
                                 f"{str(e).strip().splitlines()[0] if str(e).strip() else ''}); re-export it "
                                 f"with opset_version={OPSET}") from e


EXPERIMENTAL = ("ImageScaler", "Affine", "Crop")


def _experimental_ops(model):
    """The opset-1..8 experimental ops no later opset has, which version_converter cannot carry
    (Windows ML's style transfer nets, the model zoo's Tiny YOLOv2), as standard ones (a copy;
    the model itself where it has none): ImageScaler y = scale * x + bias[c] and Affine
    y = alpha * x + beta as Mul and Add of constants, Crop as a Slice of H and W (its border
    [left, top, right, bottom], or [top, left] and its scale (height, width))."""
    if not any(n.op_type in EXPERIMENTAL for n in model.graph.node):
        return model
    m = onnx.ModelProto()
    m.CopyFrom(model)
    nodes = []
    for i, n in enumerate(m.graph.node):
        if n.op_type not in EXPERIMENTAL:
            nodes.append(n)
            continue
        a = {x.name: helper.get_attribute_value(x) for x in n.attribute}
        tag = f"{n.name or n.output[0]}/{n.op_type}{i}"
        if n.op_type == "Crop":
            left, top, right, bottom = (list(a.get("border", [])) + [0] * 4)[:4]
            scale = a.get("scale")
            ends = [top + scale[0], left + scale[1]] if scale else [-bottom or 2 ** 31 - 1, -right or 2 ** 31 - 1]
            nodes.append(helper.make_node("Slice", [n.input[0]], list(n.output), name=n.name or tag,
                                          axes=[2, 3], starts=[top, left], ends=ends))
            continue
        scale, bias = (a.get("scale", 1.0), np.asarray(a.get("bias", [0.0]), np.float32).reshape(1, -1, 1, 1)) \
            if n.op_type == "ImageScaler" else (a.get("alpha", 1.0), np.array(a.get("beta", 0.0), np.float32))
        m.graph.initializer.extend([numpy_helper.from_array(np.array(scale, np.float32), tag + "/scale"),
                                    numpy_helper.from_array(bias, tag + "/bias")])
        nodes += [helper.make_node("Mul", [n.input[0], tag + "/scale"], [tag + "/scaled"], name=tag + "/mul"),
                  helper.make_node("Add", [tag + "/scaled", tag + "/bias"], list(n.output), name=n.name or tag)]
    del m.graph.node[:]
    m.graph.node.extend(nodes)
    return m


def _spatial_batchnorm(model):
    """Before opset 9 BatchNormalization had `spatial`; 0 (statistics per activation) with
    parameters of shape (C,) computes what 1 does, and version_converter refuses to carry it (an
    MXNet export of a pose net writes it on every BN). Dropped there (a copy; the model itself
    where no BN has it)."""
    inits = {t.name: t for t in model.graph.initializer}

    def per_channel(n):
        return (n.op_type == "BatchNormalization" and any(a.name == "spatial" and a.i == 0 for a in n.attribute)
                and all(x in inits and len(inits[x].dims) == 1 for x in n.input[1:5]))
    if not any(per_channel(n) for n in model.graph.node):
        return model
    m = onnx.ModelProto()
    m.CopyFrom(model)
    for n in m.graph.node:
        if per_channel(n):
            kept = [a for a in n.attribute if a.name != "spatial"]
            del n.attribute[:]
            n.attribute.extend(kept)
    return m


def _legacy_prelu_slopes(model):
    """Before opset 7 a PRelu slope of shape (C,) is per channel (axis 1, Caffe's PReLU: PyTorch's
    nn.PReLU(C) exports so); from opset 7 on it broadcasts from the last axis. Reshape such slopes
    to (C, 1, ..., 1) so the upgraded model means what the exporter meant."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    try:
        inferred = onnx.shape_inference.infer_shapes(m, strict_mode=False)
    except Exception:   # rank unknown: 4-D maps assumed below
        inferred = m
    rank = {vi.name: len(vi.type.tensor_type.shape.dim) for vi in
            list(inferred.graph.value_info) + list(inferred.graph.input) if vi.type.tensor_type.HasField("shape")}
    inits = {t.name: t for t in m.graph.initializer}
    for n in m.graph.node:
        if n.op_type != "PRelu" or len(n.input) < 2 or n.input[1] not in inits:
            continue
        t = inits[n.input[1]]
        r = rank.get(n.input[0], 4)
        if len(t.dims) == 1 and t.dims[0] > 1 and r >= 3:
            v = numpy_helper.to_array(t).reshape((t.dims[0],) + (1,) * (r - 2))
            t.CopyFrom(numpy_helper.from_array(v, t.name))
            for vi in m.graph.input:        # an IR-3 file lists its initializers as inputs too
                if vi.name == t.name:
                    vi.CopyFrom(helper.make_tensor_value_info(t.name, t.data_type, v.shape))
    return m


def axes_of(g, n):
    """The `axes` of a Reduce*/Squeeze/Unsqueeze node, attribute (old opsets) or constant input
    (newer ones), as a list of ints; None when absent (all axes) or not constant."""
    if "axes" in n.attrs:
        return [int(a) for a in n.attrs["axes"]]
    if len(n.inputs) > 1 and n.inputs[1]:
        v = g.const(n.inputs[1])
        return None if v is None else [int(a) for a in np.asarray(v).reshape(-1)]
    return None


def through_relabels(g, t):
    """(the producer, the tensor) where `t`'s relabels start (the producer None: a graph input or
    a constant)."""
    while (p := g.producer(t)) is not None and p.op in RELABELS:
        t = p.inputs[0]
    return p, t


def reduce_axes(g, n):
    """A reduction's axes; every axis where it names none (ONNX's default), None where unknown."""
    axes = axes_of(g, n)
    if axes is not None or (len(n.inputs) > 1 and n.inputs[1]) or n.attrs.get("noop_with_empty_axes", 0):
        return axes
    shape = g.shape(n.inputs[0])
    return None if shape is None else list(range(len(shape)))


def pads_of(g, node):
    """((before, after) x 4) of an ONNX Pad (a lower rank gets (0, 0) in front), its constant value
    and mode; or a reason why not (pads, value or axes not constants)."""
    rank = len(g.shape(node.inputs[0]))
    if "pads" in node.attrs:
        pads = list(node.attrs["pads"])
        value = float(node.attrs.get("value", 0.0))
    else:
        p = g.const(node.inputs[1]) if len(node.inputs) > 1 else None
        if p is None:
            return "pads are not a constant"
        pads = [int(v) for v in np.asarray(p).reshape(-1)]
        value = 0.0
        if len(node.inputs) > 2 and node.inputs[2]:
            v = g.const(node.inputs[2])
            if v is None:
                return "the pad value is not a constant"
            value = float(np.asarray(v).reshape(-1)[0])
        if len(node.inputs) > 3 and node.inputs[3]:
            ax = g.const(node.inputs[3])
            if ax is None:
                return "the pad axes are not a constant"
            full = [0] * (2 * rank)
            ax = [int(a) % rank for a in np.asarray(ax).reshape(-1)]
            for i, a in enumerate(ax):
                full[a], full[a + rank] = pads[i], pads[i + len(ax)]
            pads = full
    k = 4 - rank
    pairs = [(0, 0)] * k + [(pads[i], pads[i + rank]) for i in range(rank)]
    return pairs, value, node.attrs.get("mode", "constant")


def set_axes(g, n, axes):
    """Write `axes` in the form the node already uses (attribute or constant input)."""
    if "axes" in n.attrs or len(n.inputs) < 2 or not n.inputs[1]:
        n.attrs["axes"] = list(axes)
    else:
        n.inputs[1] = g.add_const(np.array(axes, np.int64), n.name + "/axes")


def from_onnx(model, batch=1, input_shapes=None, input_values=None):
    """Read an onnx.ModelProto into a Graph; shapes inferred. A symbolic batch dim becomes `batch`;
    other symbolic dims need `input_shapes` {input_name: shape}. `input_values` {input_name:
    values}: those inputs become constants (pin_input)."""
    model = upgrade_opset(qlinear.dynamic_to_float(qlinear.to_qdq(float32_model(model))))
    gp = model.graph
    tensors = {}
    for init in gp.initializer:
        v = numpy_helper.to_array(init)
        tensors[init.name] = Tensor(init.name, tuple(v.shape), v.dtype, v)
    if input_values:
        tensors.update(_pins(gp, tensors, input_values, batch))
    nodes = []
    for i, n in enumerate(gp.node):
        if n.domain not in ("", "ai.onnx"):
            from tl2k210.errors import UnsupportedOpError
            raise UnsupportedOpError(f"node {n.name!r}: op {n.domain}.{n.op_type} is a custom-domain op; "
                                     "only standard ONNX ops can be converted" + qlinear.custom_domain_hint(n.domain))
        attrs = {a.name: _attr_value(a) for a in n.attribute}
        if n.op_type == "Constant":
            v = attrs.get("value")
            if v is None:
                for k in ("value_float", "value_floats", "value_int", "value_ints"):
                    if k in attrs:
                        v = np.asarray(attrs[k], np.float32 if "float" in k else np.int64)
            tensors[n.output[0]] = Tensor(n.output[0], tuple(v.shape), v.dtype, v)
            continue
        name = n.name or f"{n.op_type}_{i}"
        nodes.append(Node(n.op_type, list(n.input), list(n.output), attrs, name, [name]))
    inputs, rebatched, unbatched = [], {}, {}
    feeds = [v.name for v in gp.input if v.name not in tensors]     # (not the weights nor pinned ones)
    for vi in gp.input:
        if vi.name in tensors:
            continue
        tt = vi.type.tensor_type
        rank = len(tt.shape.dim)        # a 1-D input's only dim is no batch (hunt 22: a box vector [?])
        shape = tuple((input_shapes or {}).get(vi.name) or
                      (d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else
                       batch if i == 0 and rank > 1 else None for i, d in enumerate(tt.shape.dim)))
        if None in shape:
            from tl2k210.errors import ModelLoadError
            dims = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else "?" for d in tt.shape.dim]
            example = ",".join("1" if i == 0 and d == "?" and rank > 1 else str(d) for i, d in enumerate(dims))
            how = ("--input-shape N,C,H,W, e.g. --input-shape 1,3,224,224 (in Python: input_shapes={name: "
                   "(1, C, H, W)})" if len(dims) == 4 else
                   f"--input-shape {example}, each ? replaced by the size it runs at (in Python: "
                   f"input_shapes={{name: ({', '.join(map(str, dims))})}} likewise)")
            more = (f". But first: the model has {len(feeds)} inputs ({', '.join(map(repr, feeds))}) and a "
                    "kmodel has one (K210 runtimes feed it one image or array): pin the others with "
                    "--input-value NAME=VALUE, or export the model with one input" if len(feeds) > 1 else "")
            raise ModelLoadError(f"input {vi.name!r} has dims of no fixed size: {dims} as the file stores them "
                                 f"('?': any); give the size the model runs at with {how}{more}")
        if batch == 1 and not (input_shapes or {}).get(vi.name) and len(shape) >= 2 and shape[0] > 1:
            rebatched[vi.name] = shape[0]        # a K210 runs one sample at a time
            shape = (1,) + shape[1:]
        elif batch == 1 and (input_shapes or {}).get(vi.name) and shape[0] > 1:
            unbatched[vi.name] = shape           # sized whole by --input-shape: no batch axis
            shape = (1,) + shape
        tensors[vi.name] = Tensor(vi.name, shape, np.dtype(_DT.get(tt.elem_type, np.float32)))
        inputs.append(vi.name)
    for n in nodes:
        for o in n.outputs:
            tensors.setdefault(o, Tensor(o))
    g = Graph(inputs, [o.name for o in gp.output], nodes, tensors,
              {"opset": default_opset(model), "producer": model.producer_name})
    g.prune()
    if rebatched:
        _single_sample(g, rebatched)
    for x, shape in unbatched.items():
        _add_batch_axis(g, x, shape)
    # the size each input was exported at: fixed dims, a symbolic batch taken as `batch` (a Keras
    # TFLite's [-1, 96, 96, 3]: its SAME pads at another --input-shape had been kept)
    exported = {vi.name: [d.dim_value if d.dim_value > 0 else None for d in vi.type.tensor_type.shape.dim]
                for vi in gp.input if vi.name in inputs}
    fixed = {x: tuple([batch if d[0] is None else d[0]] + d[1:]) for x, d in exported.items()
             if d and None not in d[1:]}
    resized = {x: s for x, s in (input_shapes or {}).items() if x in fixed and tuple(s) != fixed[x]}
    g.meta["sized_by_user"] = any(x in inputs and fixed.get(x) != tuple(s) for x, s in (input_shapes or {}).items())
    at_export = from_onnx(model, batch, input_values=input_values) if resized else None
    tf_resized = resized and str(model.producer_name).startswith(TF_PRODUCERS)
    infer_shapes(g, relabels=_relabel_reshapes(at_export) if resized else None, check=not tf_resized)
    if rebatched:
        _check_single_sample(g, rebatched)
    normalize_convs(g)
    if tf_resized:
        _same_pads_resized(g, at_export)
    return g


#: converters of TensorFlow models: they write TF's 'SAME' as the explicit pads of the size exported
TF_PRODUCERS = ("tf2onnx", "keras2onnx")


def _window(n):
    """(kernel, strides, dilations, pads) of a 2-D Conv (IR attrs) or pool (ONNX attrs), else None."""
    a = n.attrs
    if n.op == "Conv" and "kernel" in a:
        return tuple(a["kernel"]), tuple(a["strides"]), tuple(a["dilations"]), list(a["pads"])
    if n.op in ("MaxPool", "AveragePool") and len(a.get("kernel_shape", ())) == 2 and "auto_pad" not in a:
        return (tuple(a["kernel_shape"]), tuple(a.get("strides", (1, 1))), tuple(a.get("dilations", (1, 1))),
                list(a.get("pads", (0, 0, 0, 0))))
    return None


def _same_pads_resized(g, exported):
    """A TF model read at another input size (--input-shape) than its file's: tf2onnx wrote each
    'SAME' conv and pool as the explicit pads of the exported size, which at another size are not
    TF's (PoseNet 1280x720 at 225x321: every stride-2 stage a pixel off, 9.9 dB against TFLite at
    that size while the receipt, measured against the same graph, said 26.5). Each window whose
    pads were SAME's at the exported size gets SAME's at this one, in order (each changes the
    sizes after it). A window that padded nothing either way there (no wider than its stride: a
    2x2 pool on an even map) keeps no pads: VALID."""
    before = {n.name: n for n in exported.nodes}
    for _ in range(len(g.nodes)):
        changed = False
        for n in toposort(g):
            w, o = _window(n), before.get(n.name)
            if w is None or o is None or _window(o) is None:
                continue
            k, s, d, pads = w
            if exported.shape(o.inputs[0]) is None or g.shape(n.inputs[0]) is None:
                continue
            hw0, hw = exported.shape(o.inputs[0])[2:], g.shape(n.inputs[0])[2:]
            was, now = same_pads(hw0, s, k, d, "SAME_UPPER"), same_pads(hw, s, k, d, "SAME_UPPER")
            if list(_window(o)[3]) != was or now == pads or not any(was):
                continue        # VALID, or SAME's at any size, or a window no wider than its stride that
                # padded nothing either way there: VALID, as Keras' and TF-slim's pools default to
                # (DeepLab's 33x33 image pooling at 321x321 is TFLite's 1x1, not SAME's 2x2)
            n.attrs["pads"] = now
            changed = True
            break           # the sizes after it change: infer them before the next window
        if not changed:
            break
        infer_shapes(g, check=False)
    infer_shapes(g)


def _pins(gp, tensors, input_values, batch):
    """{name: constant Tensor} of the inputs `input_values` names; ModelLoadError naming an input
    the model has not, or when no input would be left to feed."""
    feeds = [vi.name for vi in gp.input if vi.name not in tensors]
    input_values = {(k + ":0" if k not in feeds and k + ":0" in feeds else k): v    # a TF tensor's op name
                    for k, v in input_values.items()}
    for name in input_values:
        if name not in feeds:
            raise ModelLoadError(f"--input-value {name}: the model has no input {name!r}{nearest(name, feeds)}; "
                                 f"give one of its inputs ({', '.join(map(repr, feeds))})")
    if not set(feeds) - set(input_values):
        raise ModelLoadError(f"--input-value pins every input ({', '.join(map(repr, feeds))}): pin only the "
                             "others; the kmodel must be fed one (the image or array)")
    return {vi.name: pin_input(vi, input_values[vi.name], batch) for vi in gp.input if vi.name in input_values}


def pin_input(vi, values, batch=1):
    """The constant Tensor that graph input `vi` (an onnx ValueInfoProto) becomes with `values`
    (one value fills it; else one per element; a dim of no fixed size: `batch` for the first, else
    what the values' count leaves), in the input's dtype. ModelLoadError when they do not fit."""
    tt = vi.type.tensor_type
    dtype = np.dtype(_DT.get(tt.elem_type, np.float32))
    values = np.asarray(values, np.float64).reshape(-1)
    dims = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None for d in tt.shape.dim]
    if dims and dims[0] is None:
        dims[0] = batch
    known = int(np.prod([d for d in dims if d is not None], dtype=np.int64))
    free = dims.count(None)
    if free:    # the values' count decides one free dim; more than one: each 1
        dims = [(values.size // known if free == 1 and values.size > 1 else 1) if d is None else d for d in dims]
    shape, n = tuple(dims), int(np.prod(dims, dtype=np.int64))
    if values.size not in (1, n) or n == 0:
        raise ModelLoadError(f"--input-value {vi.name}: {values.size} values for input {vi.name!r} of shape "
                             f"{shape}: give 1 value (it fills the input)" + (f" or {n}" if n > 1 else ""))
    if dtype.kind in "iub" and not np.all(values == np.round(values)):
        raise ModelLoadError(f"--input-value {vi.name}: input {vi.name!r} is {dtype.name}: give whole numbers")
    if dtype.kind in "iu" and (values.min() < np.iinfo(dtype).min or values.max() > np.iinfo(dtype).max):
        raise ModelLoadError(f"--input-value {vi.name}: a value is outside {dtype.name}'s range")
    v = np.broadcast_to(values, (n,)).reshape(shape).astype(dtype)
    return Tensor(vi.name, shape, dtype, v)


def normalize_convs(g):
    """_normalize_conv on every Conv still in ONNX form, and explicit pads for every 2-D pool's
    auto_pad (keras2onnx's MTCNN: MaxPool SAME_UPPER, which the uint8 and KPU pools refused, so
    every net went to kmodel v4). A 'SAME' conv or pool whose input shape is not known yet (a TF
    export that computes a crop's size at run time: Shape, Gather, Equal...) keeps its ONNX
    attributes until passes.fold_constants has made that arithmetic constants."""
    for n in g.nodes:
        if n.op == "Conv" and "kernel" not in n.attrs:
            _normalize_conv(g, n)
        elif n.op in ("MaxPool", "AveragePool") and n.attrs.get("auto_pad", "NOTSET") != "NOTSET":
            a, shape = n.attrs, g.tensors[n.inputs[0]].shape
            k = tuple(a.get("kernel_shape", ()))
            if len(k) != 2 or shape is None or len(shape) != 4:
                continue
            a["pads"] = same_pads(shape[2:], a.get("strides", (1, 1)), k, a.get("dilations", (1, 1)),
                                  a.pop("auto_pad"))
        if n.op in ("MaxPool", "AveragePool") and n.attrs.get("ceil_mode") and "auto_pad" not in n.attrs:
            _ceil_as_pads(g, n)


def _ceil_as_pads(g, n):
    """A 2-D pool's ceil_mode as the end pads that give floor mode its outputs (PyTorch's MaxPool2d
    ceil_mode=True, yolov8-lite's: on an even map the same windows, and the KPU and uint8 pools
    take no ceil_mode, so it ran in float on the CPU and forced kmodel v4). A max pool ignores
    padding, as an average pool that counts no pads does (ceil mode's last windows divide by
    the taps inside the map); one that counts them keeps ceil_mode."""
    a, shape = n.attrs, g.tensors[n.inputs[0]].shape
    k = tuple(a.get("kernel_shape", ()))
    if len(k) != 2 or shape is None or len(shape) != 4 or n.op == "AveragePool" and a.get("count_include_pad", 0):
        return
    s, d = tuple(a.get("strides", (1, 1))), tuple(a.get("dilations", (1, 1)))
    pads = list(a.get("pads", (0, 0, 0, 0)))
    for i, x in enumerate(shape[2:]):
        span = (k[i] - 1) * d[i] + 1
        padded = x + pads[i] + pads[i + 2]
        out = -(-(padded - span) // s[i]) + 1
        if (out - 1) * s[i] >= x + pads[i]:     # no window starts in the end padding (ONNX, PyTorch)
            out -= 1
        pads[i + 2] += max(0, (out - 1) * s[i] + span - padded)
    a["pads"], a["ceil_mode"] = pads, 0


def same_pads(hw, strides, kernel, dilations, auto) -> list:
    """[top, left, bottom, right] of ONNX auto_pad `auto` (SAME_UPPER: the odd pixel at the end,
    SAME_LOWER: at the start, VALID: none) on an (H, W) input."""
    if auto not in ("SAME_UPPER", "SAME_LOWER"):
        return [0, 0, 0, 0]
    tot = [max((-(-x // s) - 1) * s + (k - 1) * d + 1 - x, 0) for x, s, k, d in zip(hw, strides, kernel, dilations)]
    lo = [t // 2 if auto == "SAME_UPPER" else t - t // 2 for t in tot]
    return [lo[0], lo[1], tot[0] - lo[0], tot[1] - lo[1]]


def _add_batch_axis(g, x, shape):
    """Input `x`, sized by the user as `shape` whose first dim is not a batch (a TF1 keyword
    spotter's [T, 40] filterbank frames, sized --input-shape 80,40), gets a batch axis of one: the
    graph reads (1, *shape) and reshapes it to what its nodes read (a K210 runs one sample)."""
    from tl2k210.errors import ModelLoadError
    if len(shape) >= 4:
        raise ModelLoadError(f"--input-shape {','.join(map(str, shape))} for input {x!r}: a kmodel runs one sample "
                             f"at a time; give a batch of one: --input-shape 1,{','.join(map(str, shape[1:]))}")
    inner = x + "/unbatched"
    for n in g.nodes:
        n.inputs = [inner if i == x else i for i in n.inputs]
    g.outputs = [inner if o == x else o for o in g.outputs]
    g.tensors[inner] = Tensor(inner)
    g.nodes.insert(0, Node("Reshape", [x, g.add_const(np.array(shape, np.int64), x + "/unbatched_shape")], [inner],
                           {}, inner, [inner]))
    g.meta.setdefault("unbatched", {})[x] = tuple(shape)


def _single_sample(g, rebatched):
    """The graph of a model exported with a fixed batch N > 1, run on one sample: Reshape targets
    that spell the batch (PyTorch's `x.view(N, -1)`) get 1 instead."""
    n_batch = set(rebatched.values())
    for n in g.nodes:
        if n.op == "Reshape" and len(n.inputs) > 1 and g.const(n.inputs[1]) is not None:
            target = np.asarray(g.const(n.inputs[1])).copy()
            if target.size and int(target[0]) in n_batch:
                target[0] = 1
                n.inputs[1] = g.add_const(target.astype(np.int64), n.name + "/single_sample_shape")
    g.meta["rebatched"] = dict(rebatched)


def _check_single_sample(g, rebatched):
    """Refuse a rebatched graph whose nodes work across the samples of its batch (a split, concat
    or reduction over axis 0, a constant the size of the batch): one sample cannot be its input."""
    from tl2k210.errors import ModelLoadError
    x, n_batch = next(iter(rebatched.items()))
    live = set(rebatched)                  # tensors computed from the rebatched inputs
    for n in toposort(g):
        if not live.intersection(n.inputs):
            continue                        # constants only: folded, whatever their shape
        live.update(n.outputs)
        axes = [n.attrs["axis"]] if "axis" in n.attrs else list(n.attrs.get("axes", ()))
        ins = [g.tensors[i].shape for i in n.inputs if i in live]
        rank = len(ins[0]) if ins and ins[0] is not None else 0
        across = rank >= 2 and n.op != "Flatten" and any(int(a) % rank == 0 for a in axes)
        outs = [g.tensors[o].shape for o in n.outputs]
        if across or any(s is None or (len(s) > 1 and s[0] != 1) for s in outs):
            raise ModelLoadError(
                f"node {n.name!r} ({describe(n)}): input {x!r} has a fixed batch of {n_batch} and this "
                f"node works across the samples of the batch (outputs {outs} for one sample); a K210 "
                "runs one sample at a time: export the model with batch 1 (torch.onnx.export with a "
                "(1, ...) example input), or give --input-shape")


def _normalize_conv(g, n):
    """ONNX Conv attrs -> IR Conv attrs (kernel, strides, pads, group, dilations; explicit bias)."""
    a = n.attrs
    onnx_attrs = dict(a)
    w = g.tensors[n.inputs[1]]
    k = tuple(a.get("kernel_shape", w.shape[2:]))
    if len(k) != 2:
        return          # 1-D (passes.spatial_1d makes it 2-D) or volumetric: the ONNX attributes stay
    a.pop("kernel_shape", None)
    strides, dil = tuple(a.pop("strides", (1, 1))), tuple(a.pop("dilations", (1, 1)))
    pads = list(a.pop("pads", (0, 0, 0, 0)))
    auto = a.pop("auto_pad", "NOTSET")
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        if g.tensors[n.inputs[0]].shape is None:
            a.clear()
            a.update(onnx_attrs)
            return      # normalize_convs again once the shape is known
        pads = same_pads(g.tensors[n.inputs[0]].shape[2:], strides, k, dil, auto)
    a.update(kernel=k, strides=strides, pads=pads, group=int(a.pop("group", 1)), dilations=dil)
    if len(n.inputs) < 3 or not n.inputs[2]:
        n.inputs = n.inputs[:2] + [g.add_const(np.zeros(w.shape[0], np.float32), n.name + "/bias")]


# ------------------------------------------------------------------------------------------
# IR -> ONNX
def stage_names(node):
    """Names of a fused Conv's internal tensors as exported by to_onnx (conv, act, out)."""
    out = node.outputs[0]
    act, pool = node.attrs.get("activation"), node.attrs.get("pool")
    conv = f"{out}:conv" if (act or pool) else out
    a = (f"{out}:act" if pool else out) if act else conv
    return {"conv": conv, "act": a, "out": out}


def _activation_nodes(act, x, y, name):
    op = act["op"]
    if op == "Clip":
        mn, mx = f"{name}:min", f"{name}:max"
        return [helper.make_node("Clip", [x, mn, mx], [y], name=name)], [
            numpy_helper.from_array(np.array(act.get("min", -np.inf), np.float32), mn),
            numpy_helper.from_array(np.array(act.get("max", np.inf), np.float32), mx)]
    if op == "Swish":
        s = f"{name}:sigmoid"
        return [helper.make_node("Sigmoid", [x], [s], name=name + "/sigmoid"),
                helper.make_node("Mul", [x, s], [y], name=name)], []
    if op == "Mish":   # an opset-18 op: as Softplus, Tanh, Mul for any opset
        sp, th = f"{name}:softplus", f"{name}:tanh"
        return [helper.make_node("Softplus", [x], [sp], name=name + "/softplus"),
                helper.make_node("Tanh", [sp], [th], name=name + "/tanh"),
                helper.make_node("Mul", [x, th], [y], name=name)], []
    params = {k: v for k, v in act.items() if k != "op"}
    return [helper.make_node(op, [x], [y], name=name, **params)], []


def _pool_node(pool, x, y, name):
    op = "MaxPool" if pool["kind"] == "max" else "AveragePool"
    k, s = pool["size"], pool["stride"]
    return helper.make_node(op, [x], [y], name=name, kernel_shape=[k, k], strides=[s, s],
                            pads=list(pool.get("pads", [0, 0, 0, 0])))


_CONV_ATTRS = {"kernel": "kernel_shape", "strides": "strides", "pads": "pads", "group": "group",
               "dilations": "dilations"}


def _onnx_attrs(node):
    if node.op == "Conv":
        return {_CONV_ATTRS.get(k, k): v for k, v in node.attrs.items() if k not in ("activation", "pool")}
    return {k: (numpy_helper.from_array(v) if isinstance(v, np.ndarray) else v)
            for k, v in node.attrs.items()}


SHAPE_ONLY_ELEMENTS = 4096   # for shape inference, bigger float constants go without their values


def to_onnx(g, expose_all=False, name="tl2k210", shapes_only=False):
    """Export a Graph (incl. fused Convs, expanded to standard ops) as an onnx.ModelProto.

    expose_all: every intermediate float tensor (and fused-stage tensor) becomes a graph output,
    which is how calibration and per-layer references read them from onnxruntime.
    shapes_only: float constants over SHAPE_ONLY_ELEMENTS become typed inputs without values
    (weights: only their shapes matter to shape inference; serialising them per pass is slow), and
    outputs are left untyped (inference gives them their producers' type: a uint8 output is uint8)."""
    nodes, inits = [], []
    for n in toposort(g):
        if n.op == "Conv" and (n.attrs.get("activation") or n.attrs.get("pool")):
            st = stage_names(n)
            nodes.append(helper.make_node("Conv", n.inputs, [st["conv"]], name=n.name, **_onnx_attrs(n)))
            if n.attrs.get("activation"):
                ns, its = _activation_nodes(n.attrs["activation"], st["conv"], st["act"], n.name + "/act")
                nodes += ns
                inits += its
            if n.attrs.get("pool"):
                nodes.append(_pool_node(n.attrs["pool"], st["act"], st["out"], n.name + "/pool"))
        elif n.op == "Swish":          # an IR op (fuse_activation): x * sigmoid(x) in standard ops
            nodes += _activation_nodes({"op": "Swish"}, n.inputs[0], n.outputs[0], n.name)[0]
        else:
            nodes.append(helper.make_node(n.op, n.inputs, n.outputs, name=n.name, **_onnx_attrs(n)))
    light = []
    for k, t in g.tensors.items():
        if t.is_const:
            v = np.asarray(t.value)
            if shapes_only and v.size > SHAPE_ONLY_ELEMENTS and v.dtype.kind == "f":
                light.append(helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), list(v.shape)))
            else:
                inits.append(numpy_helper.from_array(v, k))

    def vi(nm, shape=True, typed=True):
        t = g.tensors.get(nm)
        dt = helper.np_dtype_to_tensor_dtype(t.dtype if t is not None else np.dtype(np.float32)) if typed \
            else onnx.TensorProto.UNDEFINED
        return helper.make_tensor_value_info(nm, dt, list(t.shape) if (shape and t and t.shape is not None) else None)

    outs = list(g.outputs)
    if expose_all:
        for nd in nodes:
            for o in nd.output:
                t = g.tensors.get(o)
                if o not in outs and (t is None or t.dtype == np.float32):
                    outs.append(o)
    graph = helper.make_graph(nodes, name, [vi(i) for i in g.inputs] + light,
                              [vi(o, shape=o in g.outputs, typed=not shapes_only) for o in outs], inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", g.meta.get("opset", OPSET))],
                          producer_name="tl2k210")
    m.ir_version = min(m.ir_version, 9)
    return m


def infer_shapes(g, relabels=None, check=True):
    """Fill Tensor.shape/dtype for every activation via onnx.shape_inference on to_onnx(g).
    `relabels` (a fixed-size input given another size: _relabel_reshapes of the graph at the size
    it was exported with): a Reshape there that only moved size-1 dims, whose constant target
    now cannot hold its input, takes the input's new dims in the same places. `check`: refuse
    shapes no node can have (a window larger than its input, a Reshape or broadcast that cannot
    be)."""
    while True:
        m = onnx.shape_inference.infer_shapes(to_onnx(g, shapes_only=True), strict_mode=False, data_prop=True)
        for vi in list(m.graph.value_info) + list(m.graph.output):
            t = g.tensors.get(vi.name)
            if t is None or t.is_const:
                continue
            tt = vi.type.tensor_type
            if tt.HasField("shape") and all(d.HasField("dim_value") for d in tt.shape.dim):
                t.shape = tuple(d.dim_value for d in tt.shape.dim)
            t.dtype = np.dtype(_DT.get(tt.elem_type, np.float32))
        if _resize_sizes(g):
            continue        # a float32 scale a hair under an integer size: inferred again with the size
        if not relabels or not _follow_relabels(g, relabels):
            break
        for t in g.tensors.values():            # shapes from the old target: inferred again
            if not t.is_const and t.name not in g.inputs:
                t.shape = None
    for n in g.nodes if check else ():
        _check_window(g, n)
        if (op_check := SHAPE_CHECKS.get(n.op)) is not None:
            op_check(g, n)
    return g


def _check_window(g, n):
    """A node whose output comes out with a negative dim (onnx's lenient inference of a pool or
    conv window larger than its padded input): Coral's DeepLab at --input-shape 1,3,257,257, whose
    33x33 image-pooling AvgPool meets a 17x17 map, was refused at the Reshape after it, 'fix the
    target shape in the model'."""
    out = g.tensors.get(n.outputs[0]) if n.outputs else None
    if out is None or not out.shape or min(out.shape) >= 0:
        return
    src = g.shape(n.inputs[0]) if n.inputs else None
    raise ModelLoadError(
        f"node {n.name!r} ({describe(n)}) reads {n.inputs[0]} {tuple(src or ())} and would write "
        f"{tuple(out.shape)}: its window is larger than its input at this input size. The model's "
        "layers fix the sizes it takes: convert at the input size it was exported with (no "
        "--input-shape), or one that keeps this layer's input at least as large as its window")


def _resize_sizes(g) -> bool:
    """Give a Resize whose constant scales, times its input's dims, come within 1e-4 of whole sizes
    those sizes instead (True if any): tf2onnx writes a Keras Resizing(32, 32) of 124x129 as scales
    32/124 and 32/129 in float32, 124 x 0.2580645 = 31.999998, which onnx's inference floors to 31
    (onnxruntime and TFLite give 32: a Reshape after it was refused, 'export it again')."""
    changed = False
    for n in g.nodes:
        if n.op != "Resize" or len(n.inputs) < 3 or not n.inputs[2] or (len(n.inputs) > 3 and n.inputs[3]):
            continue
        scales, x = g.const(n.inputs[2]), g.tensors.get(n.inputs[0])
        if scales is None or x is None or not x.shape or scales.size != len(x.shape):
            continue
        want = np.asarray(x.shape, np.float64) * scales.astype(np.float64)
        sizes = np.rint(want)
        if np.all(np.abs(want - sizes) < 1e-4) and np.any(np.floor(want) != sizes):
            n.inputs = [n.inputs[0], n.inputs[1] if len(n.inputs) > 1 else "", "",
                        g.add_const(sizes.astype(np.int64), n.name + "/sizes")]
            changed = True
    return changed


def _squeezed(shape):
    return [d for d in shape if d != 1]


def _blocks(a, b):
    """For a Reshape of dims `a` into `b` (size-1 dims move freely): the smallest runs of adjacent
    non-1 dims whose products match, [(indices into _squeezed(a), indices into _squeezed(b))], else
    None. (1, H, W, 2, C) -> (1, H, 2W, C): ([0], [0]), ([1, 2], [1]), ([3], [2]); a pixel
    shuffle's (1, 9, H, W) -> (1, 1, 3, 3, H, W): ([0], [0, 1]), ([1], [2]), ([2], [3])."""
    src, dst = _squeezed(a), _squeezed(b)
    blocks, i, j = [], 0, 0
    while i < len(src) and j < len(dst):
        ia, jb, pa, pb = [i], [j], src[i], dst[j]
        i, j = i + 1, j + 1
        while pa != pb:
            if pa < pb and i < len(src):
                ia.append(i)
                pa, i = pa * src[i], i + 1
            elif pb < pa and j < len(dst):
                jb.append(j)
                pb, j = pb * dst[j], j + 1
            else:
                return None
        blocks.append((ia, jb))
    return blocks if i == len(src) and j == len(dst) else None


def _relabel_reshapes(g0) -> dict:
    """{Reshape node name: its input and output dims} for the Reshapes of `g0` (the graph at its
    exported size) with a constant target that only move size-1 dims (a NHWC <-> NCHW transpose
    of a one-channel map, which tf2onnx writes as a Reshape), merge adjacent dims of a map (TF's
    Object Detection API's nearest upsampling: a map stacked with itself, (1, H, W, 2, C) -> (1, H,
    2W, C)) or split dims the input size does not change (a pixel shuffle's channels); not a
    flatten into a vector or rows, which the dense layer after it reads at its exported size."""
    out = {}
    for n in g0.nodes:
        if n.op == "Reshape" and len(n.inputs) > 1 and g0.const(n.inputs[1]) is not None:
            a, b = g0.shape(n.inputs[0]), g0.shape(n.outputs[0])
            blocks = _blocks(a, b) if a and b else None
            if blocks is not None and (len(b) >= 3 or all(len(x) == len(y) == 1 for x, y in blocks)):
                out[n.name] = (tuple(a), tuple(b))
    return out


def _regrouped(a0, b0, a1):
    """The target a Reshape of `a0` into `b0` has for input dims `a1` (another input size): each
    block of _blocks(a0, b0) whose input dims kept their sizes keeps its output dims, one that
    merges into one dim takes their new product; None where the sizes cannot say (a changed dim
    split in two, a dim that became 1)."""
    s0, s1 = _squeezed(a0), _squeezed(a1)
    if len(s0) != len(s1):
        return None
    d0, d1 = _squeezed(b0), []
    for ia, jb in _blocks(a0, b0):
        if all(s0[i] == s1[i] for i in ia):
            d1 += [d0[j] for j in jb]
        elif len(jb) == 1:
            d1.append(int(np.prod([s1[i] for i in ia])))
        else:
            return None
    it = iter(d1)
    return [1 if d == 1 else next(it) for d in b0]


def _follow_relabels(g, relabels) -> bool:
    """Give the first relabelling Reshape whose target no longer holds its input its input's dims,
    grouped as at the exported size (infer_shapes); True where one changed (shapes to infer again)."""
    for n in g.nodes:
        if n.name not in relabels:
            continue
        src = g.shape(n.inputs[0])
        target = [int(d) for d in np.asarray(g.const(n.inputs[1])).reshape(-1)]
        if not src or int(np.prod(src)) == int(np.prod([d for d in target if d > 0])) and -1 not in target:
            continue
        new = _regrouped(*relabels[n.name], src)
        if new is None:
            return False
        if new == target:
            continue
        n.inputs[1] = g.add_const(np.array(new, np.int64), n.name + "/shape")
        g.meta.setdefault("resized_reshapes", {})[n.name] = (target, new)
        return True
    return False


_BROADCASTING = {"Add", "Sub", "Mul", "Div", "Max", "Min", "Pow", "Sum", "Mean", "PRelu", "Where",
                 "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "And", "Or"}


def fixed_sizes(g) -> list:
    """Nodes whose output size the file fixes whatever the input's: a ConvTranspose's output_shape,
    a Resize to constant sizes (a style net's 722x722 upsampling at any --input-shape)."""
    return [n.name for n in g.nodes if (n.op == "ConvTranspose" and n.attrs.get("output_shape")) or
            (n.op == "Resize" and len(n.inputs) > 3 and n.inputs[3] and g.const(n.inputs[3]) is not None)]


def _check_broadcast(g, n):
    """An elementwise node whose inputs' shapes do not broadcast (onnx's lenient inference leaves
    its output shapeless): typically a model given an --input-shape its strides do not divide, so an
    upsampled map meets one of another size."""
    shapes = [g.shape(i) for i in n.inputs if i]
    if None in shapes:
        return
    try:
        np.broadcast_shapes(*shapes)
    except ValueError:
        sizes = ' and '.join('x'.join(map(str, s)) for s in shapes)
        fixed = fixed_sizes(g)
        const = next((i for i in n.inputs if i and _input_free(g, i)), None)
        maps = [i for i in n.inputs if i and i != const]
        why = ("with this input size the model's maps do not line up: " + (
            f"{const!r} ({'x'.join(map(str, g.shape(const)))}) is computed from constants alone (an SSD's "
            "anchors, baked in at the size the model was exported with), so no other input size meets it: "
            f"end the model before this node (--outputs {','.join(maps + outputs_not_after(g, n))}) and do "
            "what follows in the application" if const else
            f"{', '.join(map(repr, fixed[:3]))} output a size the file fixes (a Resize to constant sizes, a "
            "ConvTranspose's output_shape), which other maps meet only at the size it was exported with: "
            "export the model at the size it is to run at" if fixed else
            "give an input shape that its strides divide (the size it was exported with works)")) \
            if g.meta.get("sized_by_user", True) else (
            f"at the input size the file itself fixes, so the graph read from it (made by "
            f"{g.meta.get('producer') or 'its exporter'}) is inconsistent there: convert the model from another "
            "of its files (its SavedModel or Keras model rather than a .tflite), or report it with the model")
        raise ModelLoadError(f"{n.op} node {n.name or n.outputs[0]!r}: its inputs' shapes {sizes} do not "
                             f"match; {why}") from None


def nodes_after(g, node) -> list:
    """The nodes that depend on `node`'s outputs, each once."""
    seen, out, todo = set(), [], list(node.outputs)
    while todo:
        for c in g.consumers(todo.pop()):
            if id(c) not in seen:
                seen.add(id(c))
                out.append(c)
                todo += c.outputs
    return out


def outputs_not_after(g, node) -> list:
    """The graph outputs that do not depend on `node`."""
    after = {t for n in [node] + nodes_after(g, node) for t in n.outputs}
    return [o for o in g.outputs if o not in after]


def _input_free(g, t, seen=None) -> bool:
    """Is `t` a constant, or computed from constants alone (no graph input upstream)?"""
    seen = set() if seen is None else seen
    if t in seen or g.tensors[t].is_const:
        return True
    seen.add(t)
    p = g.producer(t)
    return p is not None and all(_input_free(g, i, seen) for i in p.inputs if i)


def _resized_fix(g, other: str) -> str:
    """What to do about shapes that cannot be: at a user's --input-shape, the size the model was
    exported with; with an input whose first dim was read as a fixed batch (_single_sample), the
    whole shape as one sample's (hunt 21: KWT's (98, 40) features, --inputs' tensor inside the
    model, no batch axis); else `other`."""
    if g.meta.get("sized_by_user"):
        return ("at this --input-shape the maps before it are not the size the model was built for: give "
                "the size it was exported with, or one its layers reduce to the same map here")
    x, n = next(iter(g.meta.get("rebatched", {}).items()), (None, 0))
    if x is not None:
        whole = (n,) + tuple(g.shape(x)[1:])
        return (f"the input {x!r} {whole} was read as a batch of {n} (a K210 runs one sample); if it is one "
                f"sample with no batch axis (a tensor inside the model, as --inputs names), give --input-shape "
                f"{','.join(map(str, whole))}; else {other}")
    return other


def dense_weights(g, n):
    """(N, K) weights and (N,) bias of MatMul/Gemm `n` by float32 constants (Gemm's transB, alpha
    and beta applied), or None (transA, a weight computed at run time, a bias of another size)."""
    w = g.const(n.inputs[1])
    if w is None or w.ndim != 2 or w.dtype != np.float32:
        return None
    if n.op == "MatMul":
        return w.T, np.zeros(w.shape[1], np.float32)
    a = n.attrs
    if a.get("transA"):
        return None
    w = (w if a.get("transB") else w.T) * a.get("alpha", 1.0)
    b = g.const(n.inputs[2]) if len(n.inputs) > 2 and n.inputs[2] else np.zeros(w.shape[0], np.float32)
    if b is None or b.size not in (1, w.shape[0]):
        return None
    return w, np.broadcast_to(b.reshape(-1) * a.get("beta", 1.0), (w.shape[0],)).astype(np.float32)


def _check_dense(g, n):
    """A dense layer whose constant weights take another number of inputs than it is given (MTCNN
    R-Net at --input-shape 1,3,48,48: its Flatten gives 5,184 values to a 576-input Dense; a pass
    failed on it with 'please report it')."""
    a, w = g.tensors.get(n.inputs[0]), g.const(n.inputs[1]) if len(n.inputs) > 1 else None
    if a is None or not a.shape or w is None or w.ndim != 2 or n.attrs.get("transA"):
        return
    k = w.shape[1] if n.op == "Gemm" and n.attrs.get("transB") else w.shape[0]
    if a.shape[-1] != k:
        raise ModelLoadError(
            f"{n.op} node {n.name!r} reads {n.inputs[0]} {tuple(a.shape)} ({a.shape[-1]:,} values a row), but its "
            f"weights take {k:,}: " + _resized_fix(g, "the model's shapes disagree: export it again"))


def _check_concat(g, n):
    """A Concat whose inputs differ off its axis (PEFM's CPM at --input-shape 200x200: a branch of
    fixed size meets one of the new size, 24 against 25; a pass then failed on the Concat's unknown
    shape with 'please report it')."""
    shapes = [g.tensors[t].shape for t in n.inputs if t in g.tensors]
    if len(shapes) < 2 or any(not sh for sh in shapes) or len({len(sh) for sh in shapes}) != 1:
        return
    axis = n.attrs.get("axis", 0) % len(shapes[0])
    if len({tuple(d for i, d in enumerate(sh) if i != axis) for sh in shapes}) > 1:
        raise ModelLoadError(
            f"Concat node {n.name!r} joins {', '.join(f'{t} {tuple(sh)}' for t, sh in zip(n.inputs, shapes))} on axis "
            f"{axis}; they differ on another axis: " + _resized_fix(g, "the model's shapes disagree: export it again"))


def _check_reshape(g, n):
    """A Reshape whose target cannot hold its input (onnx's lenient inference lets it pass)."""
    src = g.tensors.get(n.inputs[0])
    target = g.const(n.inputs[1]) if len(n.inputs) > 1 else None
    if src is None or not src.shape or target is None:
        return
    size = int(np.prod(src.shape))
    dims = [int(d) for d in np.asarray(target).reshape(-1)]
    if not n.attrs.get("allowzero"):
        dims = [src.shape[i] if d == 0 and i < len(src.shape) else d for i, d in enumerate(dims)]
    known = int(np.prod([d for d in dims if d != -1]))
    ok = size % known == 0 if -1 in dims and known > 0 else known == size
    if not ok or dims.count(-1) > 1 or any(d < -1 for d in dims):
        fix = _resized_fix(g, "fix the target shape in the model (export it again)")
        raise ModelLoadError(
            f"Reshape node {n.name or n.outputs[0]!r}: cannot reshape {n.inputs[0]} "
            f"{'x'.join(map(str, src.shape))} ({size:,} values) into {dims}: {fix}")


#: what onnx's lenient shape inference lets through, refused by op with the node named (infer_shapes)
SHAPE_CHECKS = {"MatMul": _check_dense, "Gemm": _check_dense, "Concat": _check_concat, "Reshape": _check_reshape,
                **dict.fromkeys(_BROADCASTING, _check_broadcast)}


class FloatSession:
    """An onnxruntime session over the ONNX model `m` (every optimisation off: each tensor stays
    as the graph has it). What onnxruntime refuses -- an opset it does not know, a node whose
    shapes do not fit -- is a ModelLoadError with its cause (exit 2), not a crash, and its
    coloured log lines stay off the terminal unless --verbose."""

    def __init__(self, m):
        from tl2k210 import quiet
        ort = quiet.onnxruntime()
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        so.log_severity_level = 3 if quiet.verbose() else 4
        self.sess = self._ort(ort.InferenceSession, m.SerializeToString(), so,
                              providers=["CPUExecutionProvider"])

    def run(self, names, feeds):
        return self._ort(self.sess.run, names, feeds)

    def get_outputs(self):
        return self.sess.get_outputs()

    @staticmethod
    def _ort(fn, *args, **kw):
        try:
            return fn(*args, **kw)
        except Exception as exc:
            if not type(exc).__module__.startswith("onnxruntime"):
                raise
            import re
            why = re.sub(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ", "", str(exc).strip())
            why = re.sub(r"^\S+\.(?:h|cc|cpp):\d+ [^(]*\([^)]*\) ", "", why)    # C++ source place
            why = " ".join(why.split())
            raise ModelLoadError(f"onnxruntime cannot run the model: {why[:400]}; fix the model "
                                 "(export it again, with a released opset)") from None


def run(g, feeds, outputs=None, expose_all=False):
    """Run a Graph in onnxruntime; returns {name: array} for `outputs` (default: graph outputs)."""
    m = to_onnx(g, expose_all=expose_all or outputs is not None)
    sess = FloatSession(m)
    names = outputs or ([o.name for o in m.graph.output] if expose_all else g.outputs)
    if isinstance(feeds, np.ndarray):
        feeds = {g.inputs[0]: feeds}
    return dict(zip(names, sess.run(names, feeds)))


def describe(node) -> str:
    """'Conv kernel=(5, 5) strides=(1, 1) ...': the op and its small attributes, for messages."""
    parts = []
    for k, v in node.attrs.items():
        if isinstance(v, np.ndarray):
            if v.size > 8:
                continue
            v = v.tolist()
        if isinstance(v, onnx.GraphProto):     # a Loop/If/Scan body: its size, not its text
            v = f"<graph of {len(v.node)} nodes>"
        parts.append(f"{k}={v}")
    return f"{node.op} {' '.join(parts)}".strip()

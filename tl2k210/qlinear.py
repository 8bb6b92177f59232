"""onnxruntime's QOperator format (`quantize_static(..., quant_format=QuantFormat.QOperator)`, the
format of its older releases and of many published int8 .onnx files) -> the QDQ form the rest of
tl2k210 reads: each QLinear op becomes DequantizeLinear of its quantized inputs, the float op,
and QuantizeLinear of its output, on the op's own scales and zero points; constant weights and
int32 biases become float constants directly ((w - zp) * scale, bias * x_scale * w_scale).

Ops (onnxruntime's contrib-op spec for the com.microsoft ones): QLinearConv, QLinearMatMul
(standard ONNX); QLinearAdd, QLinearMul, QLinearSigmoid, QLinearLeakyRelu, QLinearAveragePool,
QLinearGlobalAveragePool, QLinearConcat, QLinearSoftmax, QGemm (com.microsoft; channels_last pools
are refused by name).
The passes then drop the Q/DQ pairs as for any QDQ model (`passes/dequantize.py`)."""
import numpy as np
from onnx import ModelProto, helper, numpy_helper

from tl2k210.errors import UnsupportedOpError

MS = "com.microsoft"


def _unary(float_op, keep=()):
    """X, x_scale, x_zp, y_scale, y_zp -> float_op(X); keeps the attributes named in `keep`."""
    return lambda ins, attrs: ([ins[0:3]], float_op, ins[3:5], {k: v for k, v in attrs.items() if k in keep})


def _binary(float_op):
    """A, a_scale, a_zp, B, b_scale, b_zp, c_scale, c_zp -> float_op(A, B)."""
    return lambda ins, attrs: ([ins[0:3], ins[3:6]], float_op, ins[6:8], {})


def _concat(ins, attrs):
    """Y_scale, Y_zp, then X_i, X_i_scale, X_i_zp for each input."""
    return [ins[i:i + 3] for i in range(2, len(ins), 3)], "Concat", ins[0:2], {"axis": attrs["axis"]}


def _conv(ins, attrs):
    """x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp[, B int32]: B's float is B * x_scale * w_scale."""
    return [ins[0:3], ins[3:6]] + ([ins[8:9] + [(ins[1], ins[4])]] if len(ins) > 8 and ins[8] else []), \
        "Conv", ins[6:8], attrs


def _gemm(ins, attrs):
    """A, a_scale, a_zp, B, b_scale, b_zp[, C int32][, y_scale, y_zp]: C's float is C * a_scale * b_scale;
    without y_scale the output is float."""
    bias = [[ins[6], (ins[1], ins[4])]] if len(ins) > 6 and ins[6] else []
    return [ins[0:3], ins[3:6]] + bias, "Gemm", [i for i in ins[7:9] if i], attrs


POOL = ("auto_pad", "ceil_mode", "count_include_pad", "kernel_shape", "pads", "strides")
#: (domain, op) -> fn(inputs, attrs) -> ([quantized input triples], float op, [y_scale, y_zp], float attrs)
OPS = {
    ("", "QLinearConv"): _conv,
    ("", "QLinearMatMul"): _binary("MatMul"),
    (MS, "QLinearAdd"): _binary("Add"),
    (MS, "QLinearMul"): _binary("Mul"),
    (MS, "QLinearSigmoid"): _unary("Sigmoid"),
    (MS, "QLinearLeakyRelu"): _unary("LeakyRelu", ("alpha",)),
    (MS, "QLinearAveragePool"): _unary("AveragePool", POOL),
    (MS, "QLinearGlobalAveragePool"): _unary("GlobalAveragePool"),
    (MS, "QLinearConcat"): _concat,
    (MS, "QGemm"): _gemm,
    (MS, "QLinearSoftmax"): _unary("Softmax", ("axis",)),
}


#: custom domains whose ops are a host's pre/post-processing, not the network
HOST_DOMAINS = ("ai.onnx.contrib", "com.microsoft.extensions")


def custom_domain_hint(domain):
    """The end of the refusal of a custom-domain op: what to do instead."""
    if domain in HOST_DOMAINS:
        return (": onnxruntime-extensions' pre/post-processing (image decoding and encoding, tokenizers) runs "
                "on the host; convert the network as exported before that processing was added")
    if domain == MS:
        return (f"; of onnxruntime's {MS} ops the quantized {', '.join(op for d, op in OPS if d == MS)} "
                "are read, and FusedConv and FusedGemm with a Relu, LeakyRelu, Tanh, Sigmoid, Clip or "
                "HardSigmoid activation; export the model again without onnxruntime's graph optimizations")
    if domain.startswith(("onnx.brevitas", "qonnx")):      # (hunt 22: QONNX's ESPCN)
        return ("; Brevitas / QONNX quantizers: export with QuantizeLinear/DequantizeLinear (QCDQ: "
                "qonnx's QuantToQCDQ, Brevitas' export_onnx_qcdq) or the float model, and convert that")
    return ""


def _copy(model):
    m = ModelProto()
    m.CopyFrom(model)
    return m


def _const(consts, name):
    return consts.get(name) if name else None


def _dequantized(consts, triple, axis):
    """The float value of a constant quantized input, or None. A bias triple is (B, (x_scale, w_scale))."""
    t, s = triple[0], triple[1]
    v = _const(consts, t)
    if v is None:
        return None
    if isinstance(s, tuple):           # an int32 bias: its scale is x_scale * w_scale (per output channel)
        xs, ws = (_const(consts, n) for n in s)
        return None if xs is None or ws is None else (v.astype(np.float64) * xs * ws).astype(np.float32)
    scale, zp = _const(consts, s), _const(consts, triple[2]) if len(triple) > 2 else None
    if scale is None:
        return None
    zp = np.zeros((), np.int64) if zp is None else zp.astype(np.int64)
    shape = [1] * v.ndim
    if scale.size > 1:        # per channel: along the output channels (conv: axis 0, matmul B: the last)
        shape[axis] = scale.size
    return ((v.astype(np.int64) - zp.reshape(shape if zp.size > 1 else ())) *
            scale.astype(np.float64).reshape(shape if scale.size > 1 else ())).astype(np.float32)


def _constants(g) -> dict:
    """name -> array of the graph's initializers and Constant nodes."""
    consts = {i.name: numpy_helper.to_array(i) for i in g.initializer}
    for n in g.node:
        if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value":
            consts[n.output[0]] = numpy_helper.to_array(n.attribute[0].t)
    return consts


def _rebuild(g, nodes, inits):
    """g's nodes become `nodes`; its initializers those still read, a new one (`inits`) in place
    of an old one of its name."""
    used = {i for n in nodes for i in n.input}
    made = {i.name for i in inits}
    kept = [i for i in g.initializer if i.name in used and i.name not in made] + \
        [i for i in inits if i.name in used]
    del g.initializer[:], g.node[:]
    g.initializer.extend(kept)
    g.node.extend(nodes)


def to_qdq(model):
    """A copy of `model` with its QLinear ops (OPS) as DequantizeLinear / float op / QuantizeLinear;
    a model without them is returned as it is."""
    if not any((n.domain if n.domain != "ai.onnx" else "", n.op_type) in OPS for n in model.graph.node):
        return model
    model = _copy(model)
    g = model.graph
    consts = _constants(g)
    nodes, inits = [], []
    for n in g.node:
        key = (n.domain if n.domain != "ai.onnx" else "", n.op_type)
        if key not in OPS:
            nodes.append(n)
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
        if attrs.pop("channels_last", 0):
            raise UnsupportedOpError(f"node {n.name!r}: {n.op_type} with channels_last=1 (an NHWC quantized "
                                     "pool) has no NCHW form here; quantize the model with channels_last=0")
        triples, op, out_q, float_attrs = OPS[key](list(n.input), attrs)
        base, floats = n.name or n.output[0], []
        for k, tr in enumerate(triples):
            axis = 0 if op == "Conv" or op == "Gemm" and attrs.get("transB") else -1   # B's output channels
            v = _dequantized(consts, tr, axis)
            name = f"{base}/float{k}"
            if v is not None:
                inits.append(numpy_helper.from_array(v, name))
            elif isinstance(tr[1], tuple) or _const(consts, tr[1]) is None or _const(consts, tr[1]).size > 1:
                raise UnsupportedOpError(f"node {n.name!r}: {n.op_type}'s input {tr[0]!r} is a map with "
                                         "computed or per-channel quantization parameters; only per-tensor "
                                         "constant scales are read")
            else:
                nodes.append(helper.make_node("DequantizeLinear", list(tr), [name], name=name))
            floats.append(name)
        if not out_q:          # a float output (QGemm without y_scale)
            nodes.append(helper.make_node(op, floats, list(n.output), name=n.name, **float_attrs))
            continue
        y = f"{base}/float"
        nodes.append(helper.make_node(op, floats, [y], name=y, **float_attrs))
        nodes.append(helper.make_node("QuantizeLinear", [y] + out_q, list(n.output), name=n.name))
    _rebuild(g, nodes, inits)
    return model


def _int_weight(consts, n, w, zp, axis):
    """ConvInteger / MatMulInteger's constant integer weight less its zero point, as float."""
    v = _const(consts, w)
    if v is None:
        raise UnsupportedOpError(f"node {n.name!r}: {n.op_type}'s weight {w!r} is computed; only a constant "
                                 "quantized weight (onnxruntime's quantize_dynamic) is read")
    z = _const(consts, zp)
    z = np.zeros((), np.int64) if z is None else z.astype(np.int64)
    if z.size > 1:
        shape = [1] * v.ndim
        shape[axis] = z.size
        z = z.reshape(shape)
    return (v.astype(np.int64) - z).astype(np.float32)


def dynamic_to_float(model):
    """onnxruntime's `quantize_dynamic` form -> a float model on the same integer weights:
    DynamicQuantizeLinear(x) -> (x, 1.0, 0), so ConvInteger / MatMulInteger of it becomes Conv /
    MatMul of x by the weight less its zero point, and the Cast and the Mul by x_scale * w_scale
    after it give the float layer back (the K210 quantizes activations from calibration anyway).
    A model without ConvInteger / MatMulInteger is returned as it is."""
    ints = ("ConvInteger", "MatMulInteger")
    if not any(n.op_type in ints and n.domain in ("", "ai.onnx") for n in model.graph.node):
        return model
    model = _copy(model)
    g = model.graph
    consts = _constants(g)
    readers = {}
    for m in g.node:
        for i in m.input:
            readers.setdefault(i, []).append(m.op_type)
    floats = {}                       # DynamicQuantizeLinear's quantized output -> its float input
    nodes, inits = [], []
    for n in g.node:
        # one read only by integer ops (a DequantizeLinear pair is passes/dequantize.py's)
        if n.op_type == "DynamicQuantizeLinear" and readers.get(n.output[0]) and \
                all(op in ints for op in readers[n.output[0]]):
            floats[n.output[0]] = n.input[0]
            if len(n.output) > 1 and n.output[1]:
                inits.append(numpy_helper.from_array(np.array(1.0, np.float32), n.output[1]))
            if len(n.output) > 2 and n.output[2]:
                inits.append(numpy_helper.from_array(np.array(0, np.uint8), n.output[2]))
            continue
        if n.op_type in ("ConvInteger", "MatMulInteger"):
            ins = list(n.input) + [""] * (4 - len(n.input))
            x = floats.get(ins[0])
            if x is None:
                raise UnsupportedOpError(f"node {n.name!r}: {n.op_type} of {ins[0]!r}, which is not a "
                                         "DynamicQuantizeLinear read by integer ops alone; only onnxruntime's quantize_dynamic "
                                         "form (DynamicQuantizeLinear -> ConvInteger / MatMulInteger) is read: convert the "
                                         "float model the file was quantized from (tl2k210 quantizes it itself), or a QDQ export")
            conv = n.op_type == "ConvInteger"
            w = _int_weight(consts, n, ins[1], ins[3], 0 if conv else -1)
            name = f"{n.name or n.output[0]}/float_weight"
            inits.append(numpy_helper.from_array(w, name))
            attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
            nodes.append(helper.make_node("Conv" if conv else "MatMul", [x, name], list(n.output),
                                          name=n.name, **attrs))
            continue
        nodes.append(n)
    _rebuild(g, nodes, inits)
    return model

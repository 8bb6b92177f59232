"""Nodes that exporters write but ONNX does not define, rewritten as the ONNX ops they mean.

  * Erfc (tf2onnx writes TF's Erfc as it is, e.g. for Keras' exact gelu, 0.5 * x * erfc(-x / sqrt(2)),
    but ONNX has no Erfc op at any opset, so the checker refuses the file): 1 - Erf(x).
  * onnxruntime's com.microsoft FusedConv and FusedGemm (what a model saved after onnxruntime's
    graph optimizations holds, e.g. `SessionOptions.optimized_model_filepath`): the Conv or Gemm,
    FusedConv's optional sum input Z added, then the activation the node names (Relu, LeakyRelu,
    Tanh, Sigmoid, Clip, HardSigmoid: the MLAS activations onnxruntime fuses) with its parameters.
  * ConvTranspose with negative end pads (tf2onnx's TFLite TRANSPOSE_CONV where SAME's output,
    s x the input, is longer than (in - 1) s + k: ESRGAN's 3x3 stride-4 upsampler, pads -1;
    ONNX pads must not be negative, and onnxruntime and shape inference refuse them): the same
    output as `output_padding` (extra end rows and columns, which no tap reaches: the bias).

`repair(model)` returns the model itself when it has none of them, else a rewritten copy.
"""
import numpy as np
import onnx
from onnx import helper, numpy_helper

MS = "com.microsoft"


def _elem_type(g, name):
    for v in (*g.input, *g.value_info, *g.output):
        if v.name == name and v.type.tensor_type.elem_type:
            return v.type.tensor_type.elem_type
    return onnx.TensorProto.FLOAT


def _np_dtype(g, n):
    return helper.tensor_dtype_to_np_dtype(_elem_type(g, n.input[0]) or _elem_type(g, n.output[0]))


def _erfc(g, n, opset):
    """Erfc(x) -> Sub(1, Erf(x)); returns (nodes, initializers)."""
    name = n.name or n.output[0]
    one = numpy_helper.from_array(np.asarray(1, _np_dtype(g, n)), f"{name}/one")
    return [helper.make_node("Erf", [n.input[0]], [f"{name}/erf"], name=f"{name}/erf"),
            helper.make_node("Sub", [one.name, f"{name}/erf"], list(n.output), name=name)], [one]


def _activation(g, n, opset, x, kind, params):
    """The nodes and initializers of onnxruntime's fused activation `kind` (its name as bytes or
    str) of x into n's output, `params` as the fused node lists them."""
    kind = kind.decode() if isinstance(kind, bytes) else kind
    name, out = n.name or n.output[0], list(n.output)
    if kind in ("", "Identity"):
        return [helper.make_node("Identity", [x], out, name=f"{name}/act")], []
    if kind in ("Relu", "Tanh", "Sigmoid"):
        return [helper.make_node(kind, [x], out, name=f"{name}/act")], []
    if kind == "LeakyRelu":
        return [helper.make_node(kind, [x], out, name=f"{name}/act", alpha=float(params[0]))], []
    if kind == "HardSigmoid":
        return [helper.make_node(kind, [x], out, name=f"{name}/act", alpha=float(params[0]),
                                 beta=float(params[1]))], []
    if kind == "Clip":
        lo, hi = (float(p) for p in params[:2])
        if opset < 11:
            return [helper.make_node("Clip", [x], out, name=f"{name}/act", min=lo, max=hi)], []
        dt = _np_dtype(g, n)
        inits = [numpy_helper.from_array(np.asarray(v, dt), f"{name}/{k}") for k, v in (("min", lo), ("max", hi))]
        return [helper.make_node("Clip", [x, *(i.name for i in inits)], out, name=f"{name}/act")], inits
    raise _Unknown(f"activation {kind!r}")


class _Unknown(Exception):
    """A node this module cannot rewrite (a fused activation it does not know, pads past what
    output_padding says): the node stays, and is refused by name."""


def _attrs(n):
    return {a.name: helper.get_attribute_value(a) for a in n.attribute}


def _fused_conv(g, n, opset):
    """com.microsoft FusedConv(X, W[, B[, Z]]) -> Conv(X, W, B) [+ Z] -> activation."""
    a = _attrs(n)
    kind, params = a.pop("activation", b""), a.pop("activation_params", [])
    name = n.name or n.output[0]
    inputs = list(n.input)
    z = inputs[3] if len(inputs) > 3 and inputs[3] else None
    nodes = [helper.make_node("Conv", inputs[:3], [f"{name}/conv"], name=f"{name}/conv", **a)]
    x = f"{name}/conv"
    if z:
        nodes.append(helper.make_node("Add", [x, z], [f"{name}/sum"], name=f"{name}/sum"))
        x = f"{name}/sum"
    act, inits = _activation(g, n, opset, x, kind, params)
    return nodes + act, inits


def _fused_gemm(g, n, opset):
    """com.microsoft FusedGemm(A, B[, C]) -> Gemm -> activation (activation_alpha/_beta its parameters)."""
    a = _attrs(n)
    kind = a.pop("activation", b"")
    params = [a.pop(k) for k in ("activation_alpha", "activation_beta", "activation_gamma") if k in a]
    name = n.name or n.output[0]
    gemm = helper.make_node("Gemm", list(n.input), [f"{name}/gemm"], name=f"{name}/gemm", **a)
    act, inits = _activation(g, n, opset, f"{name}/gemm", kind, params)
    return [gemm, *act], inits


def _negative_end_pads(n) -> bool:
    pads = list(_attrs(n).get("pads", []))
    return any(p < 0 for p in pads[len(pads) // 2:]) and all(p >= 0 for p in pads[:len(pads) // 2])


def _convt_end_pads(g, n, opset):
    """ConvTranspose(pads with negative ends) -> the same node with those ends as output_padding."""
    a = _attrs(n)
    pads = list(a["pads"])
    half = len(pads) // 2
    strides = list(a.get("strides", [1] * half))
    extra = [max(0, -p) for p in pads[half:]]
    out_pad = [int(o) + e for o, e in zip(a.get("output_padding", [0] * half), extra)]
    if any(o >= s for o, s in zip(out_pad, strides)):     # more than output_padding may say
        raise _Unknown
    a.update(pads=pads[:half] + [max(0, p) for p in pads[half:]], output_padding=out_pad)
    return [helper.make_node("ConvTranspose", list(n.input), list(n.output), name=n.name, **a)], []


#: (domain, op type) -> rewrite(graph, node, default-domain opset) -> (nodes, initializers)
REWRITES = {("", "Erfc"): _erfc, (MS, "FusedConv"): _fused_conv, (MS, "FusedGemm"): _fused_gemm,
            ("", "ConvTranspose"): _convt_end_pads}
#: the nodes of an op type in REWRITES that need it (default: all)
NEEDS = {("", "ConvTranspose"): _negative_end_pads}


def _key(n):
    return ("" if n.domain == "ai.onnx" else n.domain, n.op_type)


def _needs(n) -> bool:
    return _key(n) in REWRITES and NEEDS.get(_key(n), lambda _: True)(n)


def _opset(model):
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)


def repair(model):
    if not any(_needs(n) for n in model.graph.node):
        return model
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    g, new, opset = copy.graph, [], _opset(model)
    for n in g.node:
        try:
            nodes, inits = REWRITES[_key(n)](g, n, opset) if _needs(n) else ([n], [])
        except _Unknown:
            nodes, inits = [n], []
        new += nodes
        g.initializer.extend(inits)
    del g.node[:]
    g.node.extend(new)
    return copy

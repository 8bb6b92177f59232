"""TFLite builtin ops tf2onnx has no conversion for, in standard ONNX. No TensorFlow here.

The TFLite front-end (`tflite.py`) hands these ops to tf2onnx as nodes of domain DOMAIN (op
type "TFL_" + the builtin name, the builtin options as attributes, snake_case); `to_standard_ops`
replaces them by the ONNX ops that compute them:
  * GELU (TFLite's kernel, tensorflow/lite/kernels/gelu.cc, float):
      approximate=false: 0.5 * x * (1 + erf(x / sqrt(2)))
      approximate=true:  0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3)))
  * BROADCAST_ARGS (the broadcast shape of two shape vectors; Keras' GroupNormalization writes
    it): Shape(ConstantOfShape(s0) + ConstantOfShape(s1)), cast back to the inputs' integer
    type; fold_constants makes it a constant where the shapes are known.
"""
import math

import numpy as np
from onnx import helper, numpy_helper

from tl2k210.errors import ModelLoadError

DOMAIN = "tl2k210.tflite"
OPS = ("GELU", "BROADCAST_ARGS")


def tf2onnx_custom_ops():
    """tf2onnx's `custom_ops` entries that keep the ops as nodes of DOMAIN."""
    return {"TFL_" + op: DOMAIN for op in OPS}


def gelu_nodes(x, y, name, approximate=False):
    """The ONNX nodes and initializers that compute y = GELU(x) (float32), named after `name`."""
    def c(v, k):
        inits.append(numpy_helper.from_array(np.asarray(v, np.float32), f"{name}/{k}"))
        return f"{name}/{k}"

    inits, t = [], lambda k: f"{name}/{k}"
    if approximate:
        nodes = [helper.make_node("Mul", [x, x], [t("x2")], name=t("x2")),
                 helper.make_node("Mul", [t("x2"), x], [t("x3")], name=t("x3")),
                 helper.make_node("Mul", [t("x3"), c(0.044715, "k")], [t("kx3")], name=t("kx3")),
                 helper.make_node("Add", [x, t("kx3")], [t("inner")], name=t("inner")),
                 helper.make_node("Mul", [t("inner"), c(math.sqrt(2 / math.pi), "s")], [t("arg")], name=t("arg")),
                 helper.make_node("Tanh", [t("arg")], [t("f")], name=t("f"))]
    else:
        nodes = [helper.make_node("Mul", [x, c(1 / math.sqrt(2), "s")], [t("arg")], name=t("arg")),
                 helper.make_node("Erf", [t("arg")], [t("f")], name=t("f"))]
    nodes += [helper.make_node("Add", [t("f"), c(1.0, "one")], [t("f1")], name=t("f1")),
              helper.make_node("Mul", [x, c(0.5, "half")], [t("hx")], name=t("hx")),
              helper.make_node("Mul", [t("hx"), t("f1")], [y], name=name)]
    return nodes, inits


def _gelu(n, where):
    a = {x.name: helper.get_attribute_value(x) for x in n.attribute}
    if len(n.input) != 1 or len(n.output) != 1:
        raise ModelLoadError(f"{where}: GELU {n.output[0]!r} with {len(n.input)} inputs and {len(n.output)} "
                             "outputs; TFLite's GELU has one of each")
    return gelu_nodes(n.input[0], n.output[0], n.name or n.output[0], bool(a.get("approximate", 0)))


def _broadcast_args(n, where):
    if len(n.input) != 2 or len(n.output) != 1:
        raise ModelLoadError(f"{where}: BROADCAST_ARGS {n.output[0]!r} with {len(n.input)} inputs and "
                             f"{len(n.output)} outputs; TFLite's has two shape inputs and one output")
    name = n.name or n.output[0]
    t = lambda k: f"{name}/{k}"  # noqa: E731
    nodes = []
    for k, s in enumerate(n.input):
        nodes += [helper.make_node("Cast", [s], [t(f"s{k}")], name=t(f"s{k}"), to=7),
                  helper.make_node("ConstantOfShape", [t(f"s{k}")], [t(f"z{k}")], name=t(f"z{k}"))]
    nodes += [helper.make_node("Add", [t("z0"), t("z1")], [t("z")], name=t("z")),
              helper.make_node("Shape", [t("z")], [t("shape")], name=t("shape")),
              helper.make_node("CastLike", [t("shape"), n.input[0]], [n.output[0]], name=name)]
    return nodes, []


MAP = {"TFL_GELU": _gelu, "TFL_BROADCAST_ARGS": _broadcast_args}


def to_standard_ops(model, where):
    """`model` (an onnx.ModelProto from tf2onnx) with its DOMAIN nodes in standard ONNX ops (in
    place; returned)."""
    g = model.graph
    if not any(n.domain == DOMAIN for n in g.node):
        return model
    new, inits = [], []
    for n in g.node:
        if n.domain != DOMAIN:
            new.append(n)
            continue
        if n.op_type not in MAP:
            raise ModelLoadError(f"{where}: {n.op_type} {n.output[0]!r} of domain {DOMAIN} has no ONNX form")
        nodes, i = MAP[n.op_type](n, where)
        new += nodes
        inits += i
    del g.node[:]
    g.node.extend(new)
    g.initializer.extend(inits)
    imports = [o for o in model.opset_import if o.domain != DOMAIN]
    del model.opset_import[:]
    model.opset_import.extend(imports)
    return model

"""Nodes that exporters write but ONNX does not define, rewritten as the ONNX ops they mean.

  * Erfc (tf2onnx writes TF's Erfc as it is, e.g. for Keras' exact gelu, 0.5 * x * erfc(-x / sqrt(2)),
    but ONNX has no Erfc op at any opset, so the checker refuses the file): 1 - Erf(x).

`repair(model)` returns the model itself when it has none of them, else a rewritten copy.
"""
import numpy as np
import onnx
from onnx import helper, numpy_helper


def _elem_type(g, name):
    for v in (*g.input, *g.value_info, *g.output):
        if v.name == name and v.type.tensor_type.elem_type:
            return v.type.tensor_type.elem_type
    return onnx.TensorProto.FLOAT


def _erfc(g, n):
    """Erfc(x) -> Sub(1, Erf(x)); returns (nodes, initializers)."""
    name = n.name or n.output[0]
    dtype = helper.tensor_dtype_to_np_dtype(_elem_type(g, n.input[0]) or _elem_type(g, n.output[0]))
    one = numpy_helper.from_array(np.asarray(1, dtype), f"{name}/one")
    return [helper.make_node("Erf", [n.input[0]], [f"{name}/erf"], name=f"{name}/erf"),
            helper.make_node("Sub", [one.name, f"{name}/erf"], list(n.output), name=name)], [one]


#: op type (default domain) -> rewrite(graph, node) -> (nodes, initializers)
REWRITES = {"Erfc": _erfc}


def repair(model):
    g = model.graph
    if not any(n.op_type in REWRITES and n.domain in ("", "ai.onnx") for n in g.node):
        return model
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    g, new = copy.graph, []
    for n in g.node:
        if n.op_type in REWRITES and n.domain in ("", "ai.onnx"):
            nodes, inits = REWRITES[n.op_type](g, n)
            new += nodes
            g.initializer.extend(inits)
        else:
            new.append(n)
    del g.node[:]
    g.node.extend(new)
    return copy

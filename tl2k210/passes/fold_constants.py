"""Evaluate nodes whose inputs are all constants (and Shape of known shapes); drop Identity/Dropout."""
import numpy as np
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from tl2k210.graph import _onnx_attrs, infer_shapes


def _eval(g, n):
    inits = [numpy_helper.from_array(np.asarray(g.const(i)), i) for i in n.inputs if i]
    node = helper.make_node(n.op, n.inputs, n.outputs, **_onnx_attrs(n))
    outs = [helper.make_tensor_value_info(o, 0, None) for o in n.outputs]
    model = helper.make_model(helper.make_graph([node], "fold", [], outs, inits),
                              opset_imports=[helper.make_opsetid("", g.meta.get("opset", 13))])
    return ReferenceEvaluator(model).run(None, {})


def fold_constants(g, log):
    """Repeat: fold everything foldable, re-infer shapes (a folded Reshape target makes the next
    Shape foldable: TF graphs with a dynamic batch compute their shapes at run time)."""
    changed = True
    while changed:
        changed = _fold_round(g, log)
        if changed:
            g.prune()
            infer_shapes(g)
    return g


def _fold_round(g, log):
    changed = True
    any_change = False
    while changed:
        changed = False
        for n in list(g.nodes):
            src = n.inputs[0] if n.inputs else ""
            keeps_name = n.outputs[0] in g.outputs and (src in g.inputs or src in g.outputs or g.const(src) is not None)
            if n.op in ("Identity", "Dropout") and not keeps_name and not any(g.consumers(o) for o in n.outputs[1:]):
                g.nodes.remove(n)
                g.replace_uses(n.outputs[0], n.inputs[0])
                log(n.name, f"removed {n.op}")
                changed = any_change = True
                continue
            if n.op == "Shape" and g.shape(n.inputs[0]) is not None and not n.attrs:
                values = [np.array(g.shape(n.inputs[0]), np.int64)]
            elif n.inputs and all(i == "" or g.const(i) is not None for i in n.inputs) and n.op not in (
                    "RandomNormal", "RandomUniform"):
                values = _eval(g, n)
            else:
                continue
            g.nodes.remove(n)
            for o, v in zip(n.outputs, values):
                v = np.asarray(v)
                g.tensors[o].value, g.tensors[o].shape, g.tensors[o].dtype = v, tuple(v.shape), v.dtype
            log(n.name, f"folded constant {n.op}")
            changed = any_change = True
    return any_change

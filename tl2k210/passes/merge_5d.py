"""5-D maps made 4-D by merging two adjacent axes that every op treats alike. Keras'
GroupNormalization (TF, in a .h5, .keras, tf2onnx or TFLite file) reshapes an NHWC map to
(1, H, W, G, C/G), sums over H, W and C/G for each group's moments, and reshapes back; the v4
runtime's shapes are 4-D. H and W are reduced together and broadcast together, so each 5-D
tensor of such a region is seen as (1, H*W, G, C/G): the data are not moved (a merge of
adjacent axes is a Reshape), the reductions run over the merged axis, and constants merge the
same two axes. A region is rewritten only when every op on its 5-D tensors is elementwise, a
keepdims reduction or a Reshape / Expand and every tensor has both axes full or both 1: else it
stays and the lowering refuses it naming the node."""
import numpy as np

from tl2k210.graph import infer_shapes

_ELEMENTWISE = {"Add", "Sub", "Mul", "Div", "Sqrt", "Reciprocal", "Neg", "Relu", "Abs", "Exp", "Log",
                "Max", "Min", "Pow", "Sigmoid", "Tanh", "Where", "Identity", "Clip", "Erf"}
_REDUCE = {"ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin"}


def _merged(shape, a):
    return tuple(shape[:a]) + (shape[a] * shape[a + 1],) + tuple(shape[a + 2:])


def _axes(g, n):
    if "axes" in n.attrs:
        return list(n.attrs["axes"]), None
    if len(n.inputs) > 1 and n.inputs[1]:
        v = g.const(n.inputs[1])
        return (None, None) if v is None else ([int(x) for x in np.ravel(v)], n.inputs[1])
    return None, None


def _plan(g, a):
    """The nodes to rewrite for merging axes a, a+1 of every 5-D tensor, or None."""
    five = {t for t, v in g.tensors.items() if v.shape is not None and len(v.shape) == 5 and not v.is_const}
    if not five:
        return None
    nodes = [n for n in g.nodes if five.intersection(n.inputs) or five.intersection(n.outputs)]
    if five.intersection(g.inputs) or five.intersection(g.outputs):
        return None

    def alike(shape, full):
        return len(shape) != 5 or (shape[a] == full[a] and shape[a + 1] == full[a + 1]) or \
            (shape[a] == 1 and shape[a + 1] == 1)
    for n in nodes:
        shapes = [g.shape(i) for i in n.inputs if i] + [g.shape(o) for o in n.outputs]
        if any(s is None for s in shapes):
            return None
        big = [s for s in shapes if len(s) == 5]
        ref = max(big, key=lambda s: int(np.prod(s)))
        if n.op in _ELEMENTWISE:
            if not all(alike(s, ref) for s in shapes if len(s) == 5) or \
                    any(0 < len(s) < 5 and s != (1,) for s in shapes):
                return None
        elif n.op in _REDUCE:
            axes, _ = _axes(g, n)
            if axes is None or not n.attrs.get("keepdims", 1):
                return None
            axes = {x % 5 for x in axes}
            if (a in axes) != (a + 1 in axes):
                return None
        elif n.op == "Reshape":
            if g.const(n.inputs[1]) is None:
                return None
        elif n.op == "Expand":
            if g.const(n.inputs[1]) is None or not all(alike(s, ref) for s in shapes if len(s) == 5):
                return None
        else:
            return None
    return nodes


def merge_5d(g, log):
    for a in (1, 2, 3):
        nodes = _plan(g, a)
        if nodes:
            break
    else:
        return g
    five = {t for t, v in g.tensors.items() if v.shape is not None and len(v.shape) == 5 and not v.is_const}
    for n in nodes:
        if n.op == "Reshape" and n.outputs[0] in five:
            target = tuple(int(d) for d in g.shape(n.outputs[0]))
            n.inputs[1] = g.add_const(np.array(_merged(target, a), np.int64), n.name + "/merged_shape")
        elif n.op == "Expand":
            s = np.asarray(g.const(n.inputs[1]))
            if s.size == 5:
                n.inputs[1] = g.add_const(np.array(_merged(tuple(int(d) for d in s), a), np.int64),
                                          n.name + "/merged_shape")
        elif n.op in _REDUCE:
            axes, src = _axes(g, n)
            new = sorted({x % 5 if x % 5 <= a else x % 5 - 1 for x in axes})
            if src is None:
                n.attrs["axes"] = new
            else:
                n.inputs[1] = g.add_const(np.array(new, np.int64), n.name + "/merged_axes")
        else:
            for k, i in enumerate(n.inputs):
                v = g.const(i) if i else None
                if v is not None and np.ndim(v) == 5:
                    n.inputs[k] = g.add_const(np.asarray(v).reshape(_merged(np.shape(v), a)), n.name + "/merged")
        log(n.name, f"5-D {n.op} as 4-D: axes {a} and {a + 1} merged")
    for t in five:
        g.tensors[t].shape = None
    infer_shapes(g)
    return g

"""Concat of a map with constant blocks of one value at its ends -> Pad with that value: the
channel zero-padding that tflite2onnx and tf2onnx 1.7 write for TFLite's channel PAD (BlazeFace's
and FaceMesh's residual blocks widen a map as Concat(x, ConstantOfShape(0))). The same values,
in the op the back-end lowers (a constant map has no place in memory for a concat to copy).

concat_copies: a Concat of one map with itself k times -> Tile (k on the axis): TF's Object
Detection API upsamples each FPN level by stacking a map with itself on a new axis and merging it
with the next (`nearest_neighbor_upsampling`: Unsqueeze, Concat(x, x), Reshape, on the rows then
the columns), which pass upsample_to_resize then reads as the 2x nearest Resize it is."""
import numpy as np

from tl2k210.graph import Node


def _fill(g, t):
    """The one value of constant tensor `t`, or None (not a constant, or not uniform)."""
    v = g.const(t)
    if v is None or np.asarray(v).size == 0:
        return None
    v = np.asarray(v, np.float64).reshape(-1)
    return float(v[0]) if np.all(v == v[0]) else None


def concat_pad(g, log):
    for n in [n for n in g.nodes if n.op == "Concat"]:
        shape = g.shape(n.outputs[0])
        maps = [i for i, t in enumerate(n.inputs) if g.const(t) is None]
        if shape is None or len(maps) != 1 or len(n.inputs) < 2:
            continue
        k, axis = maps[0], n.attrs.get("axis", 0) % len(shape)
        fills = {_fill(g, t) for i, t in enumerate(n.inputs) if i != k}
        if len(fills) != 1 or None in fills or any(g.shape(t) is None for t in n.inputs):
            continue
        value = fills.pop()
        before = sum(g.shape(t)[axis] for t in n.inputs[:k])
        after = sum(g.shape(t)[axis] for t in n.inputs[k + 1:])
        pads = [0] * (2 * len(shape))
        pads[axis], pads[axis + len(shape)] = before, after
        x = n.inputs[k]
        i = g.nodes.index(n)
        g.nodes[i] = Node("Pad", [x, g.add_const(np.array(pads, np.int64), n.name + "/pads"),
                                  g.add_const(np.array(value, np.float32), n.name + "/value")],
                          list(n.outputs), {"mode": "constant"}, n.name, list(n.fused))
        log(n.name, f"Concat of {x} with constant {value:g} blocks ({before} before, {after} after on axis "
                    f"{axis}) -> Pad")
    return g


def concat_copies(g, log):
    for n in [n for n in g.nodes if n.op == "Concat"]:
        shape = g.shape(n.outputs[0])
        if shape is None or len(n.inputs) < 2 or len(set(n.inputs)) != 1 or g.const(n.inputs[0]) is not None:
            continue
        axis = n.attrs.get("axis", 0) % len(shape)
        reps = [1] * len(shape)
        reps[axis] = len(n.inputs)
        i = g.nodes.index(n)
        g.nodes[i] = Node("Tile", [n.inputs[0], g.add_const(np.array(reps, np.int64), n.name + "/repeats")],
                          list(n.outputs), {}, n.name, list(n.fused))
        log(n.name, f"Concat of {n.inputs[0]} with itself ({len(n.inputs)} copies on axis {axis}) -> Tile")
    return g

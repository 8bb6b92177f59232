"""A Keras Dense applied to a 4-D map (its Tensordot, as tf2onnx writes it, or a TFLite
FULLY_CONNECTED on it): Transpose to NHWC, Reshape to (H*W, C) rows, MatMul/Gemm by constant
weights -> a 1x1 Conv on the NCHW map, then a Transpose to NHWC and a Reshape to the same rows,
which later passes move on or fold. Equal in float; the KPU runs the conv where a CPU dense layer
ran over the rows, and kmodel v3 has a form for it (Edge Impulse's image classifiers: a Dense(8)
on a 3x3 map of 1280 channels; hunt 19)."""
import numpy as np

from tl2k210.graph import Node, dense_weights

TO_NHWC = (0, 2, 3, 1)


def _rows(g, n):
    """(the Reshape, the Transpose) through which MatMul/Gemm `n` reads the (H*W, C) rows of the
    NHWC transpose of a (1, C, H, W) map, each read by the next alone; else None."""
    r = g.producer(n.inputs[0])
    if r is None or r.op != "Reshape" or g.single_consumer(r.outputs[0]) is not n:
        return None
    t = g.producer(r.inputs[0])
    if t is None or t.op != "Transpose" or tuple(t.attrs.get("perm", ())) != TO_NHWC \
            or g.single_consumer(t.outputs[0]) is not r:
        return None
    shape = g.shape(t.inputs[0])
    if len(shape or ()) != 4 or shape[0] != 1 or g.shape(r.outputs[0]) != (shape[2] * shape[3], shape[1]):
        return None
    return r, t


def tensordot(g, log):
    for n in [n for n in g.nodes if n.op in ("MatMul", "Gemm")]:
        wb, rows = dense_weights(g, n), _rows(g, n)
        if wb is None or rows is None:
            continue
        (w, b), (r, t) = wb, rows
        x = t.inputs[0]
        (_, c, h, wd), k = g.shape(x), w.shape[0]
        y = g.add_tensor(n.name + "/nchw", (1, k, h, wd))
        nhwc = g.add_tensor(n.name + "/nhwc", (1, h, wd, k))
        new = [Node("Conv", [x, g.add_const(np.ascontiguousarray(w).reshape(k, c, 1, 1), n.name + "/W"),
                             g.add_const(np.array(b, np.float32), n.name + "/B")], [y],
                    {"kernel": (1, 1), "strides": (1, 1), "pads": [0, 0, 0, 0], "dilations": (1, 1), "group": 1},
                    n.name, [n.name]),
               Node("Transpose", [y], [nhwc], {"perm": list(TO_NHWC)}, g.unique(n.name + "/to_nhwc")),
               Node("Reshape", [nhwc, g.add_const(np.array([h * wd, k], np.int64), n.name + "/rows")], n.outputs,
                    {}, g.unique(n.name + "/to_rows"))]
        at = g.nodes.index(n)
        g.nodes[at:at + 1] = new
        g.nodes = [v for v in g.nodes if v is not r and v is not t]
        log(n.name, f"a Dense on the rows of a {h}x{wd} map (Tensordot) -> 1x1 conv {c} -> {k} on the map")
    return g

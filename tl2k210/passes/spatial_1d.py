"""1-D convs, pools, batch norms and PReLUs on (N, C, L) -- PyTorch's Conv1d/MaxPool1d/AvgPool1d/
BatchNorm1d/PReLU on audio and sensor signals -- as their 2-D forms on a (N, C, 1, L) map:

    x (N,C,L) -> Unsqueeze(axis 2) -> Conv kernel (1, k), pads (0, b, 0, e) -> Squeeze(axis 2)

exact in float (a 1 x k kernel over one row is the 1-D op); the KPU then runs them like any 2-D
layer, and a Squeeze followed by an Unsqueeze of the same axis between two such ops cancels.
Volumetric (3-D: Conv3d, MaxPool3d, ...) ops on (N, C, D, H, W) have no K210 form: refused here
with the node and what to change, before any lowering sees a 5-D map."""
import numpy as np

from tl2k210.errors import UnsupportedOpError
from tl2k210.graph import Node, _normalize_conv, describe

OPS = ("Conv", "MaxPool", "AveragePool", "BatchNormalization", "PRelu", "LpPool")
VOLUMETRIC = ("Conv", "ConvTranspose", "MaxPool", "AveragePool", "BatchNormalization", "PRelu", "LpPool")


def _as_2d(n):
    a = n.attrs
    for k in ("kernel_shape", "strides", "dilations"):
        if k in a:
            a[k] = [1] + [int(v) for v in a[k]]
    if "pads" in a:
        b, e = (int(v) for v in a["pads"])
        a["pads"] = [0, b, 0, e]


def spatial_1d(g, log):
    for x in g.inputs + g.outputs:
        shape = g.shape(x)
        if shape is not None and len(shape) > 5:
            n = (g.consumers(x) or [None])[0] if x in g.inputs else g.producer(x)
            at = f"node {n.name!r} ({describe(n)}) " if n is not None else ""
            raise UnsupportedOpError(
                f"{at}{'reads' if x in g.inputs else 'writes'} the model's {'input' if x in g.inputs else 'output'} "
                f"{x!r} of {len(shape)} dims {tuple(shape)}; kmodel tensors have at most 4 (N, C, H, W): "
                "reshape it to at most 4 dims in the model before the export")
    for n in list(g.nodes):
        shape = g.shape(n.inputs[0]) if n.inputs else None
        if shape is None or n.op not in VOLUMETRIC:
            continue
        if len(shape) == 5:
            raise UnsupportedOpError(
                f"node {n.name!r}: op {describe(n)} is a volumetric (3-D) op on a {tuple(shape)} "
                "(N, C, D, H, W) input; the KPU convolves 2-D maps: fold the depth into the "
                "channels (a 2-D op on (N, C*D, H, W)) or run the 2-D op on each depth slice")
        if len(shape) != 3 or n.op not in OPS or g.const(n.inputs[0]) is not None:
            continue
        if n.op in ("Conv",) and g.const(n.inputs[1]) is None:
            continue
        x, y = n.inputs[0], n.outputs[0]
        x4 = g.add_tensor(x + "/2d", (shape[0], shape[1], 1, shape[2]))
        y4 = g.add_tensor(y + "/2d")
        unsq = Node("Unsqueeze", [x, g.add_const(np.array([2], np.int64), n.name + "/axes")], [x4], {},
                    n.name + "/to_2d")
        sq = Node("Squeeze", [y4, g.add_const(np.array([2], np.int64), n.name + "/axes")], [y], {},
                  n.name + "/to_1d")
        if n.op == "Conv":
            w = np.asarray(g.const(n.inputs[1]))
            n.inputs[1] = g.add_const(w[:, :, None, :], n.name + "/weight_2d")
        elif n.op == "PRelu":
            s = np.asarray(g.const(n.inputs[1]))
            if s.ndim >= 2:          # (C, 1) per channel, or (1, L) along the signal
                n.inputs[1] = g.add_const(s.reshape(s.shape[:-1] + (1, s.shape[-1])), n.name + "/slope_2d")
        _as_2d(n)
        n.inputs[0], n.outputs[0] = x4, y4
        i = g.nodes.index(n)
        g.nodes[i:i + 1] = [unsq, n, sq]
        if n.op == "Conv":
            g.tensors[y4].shape = None
            _normalize_conv(g, n)
        log(n.name, f"1-D {n.op} on {tuple(shape)} -> 2-D on {(shape[0], shape[1], 1, shape[2])}")
    _cancel_pairs(g, log)
    return g


ELEMENTWISE = {"Relu", "LeakyRelu", "Sigmoid", "Tanh", "Clip", "Elu", "Selu", "HardSigmoid", "HardSwish",
               "Softplus", "Softsign", "Neg", "Abs", "Exp", "Identity", "Dropout", "Celu", "Mish"}
BINARY = ("Add", "Sub", "Mul", "Div")


def _cancel_pairs(g, log):
    """Each Squeeze(axis 2) moves below the elementwise ops after it (one input, or a constant
    operand that broadcasts over the map: Keras' Conv1D writes its bias as an Add after the
    Squeeze, which then folds into the conv), and meets an Unsqueeze(axis 2) there: the pair
    is gone."""
    from tl2k210.graph import axes_of
    for sq in [n for n in g.nodes if n.op == "Squeeze" and axes_of(g, n) == [2]]:
        sunk = []
        while (c := g.single_consumer(sq.outputs[0])) is not None and _sink(g, sq, c):
            sunk.append(c.op)
        c = g.single_consumer(sq.outputs[0])
        if c is not None and c.op == "Unsqueeze" and axes_of(g, c) == [2]:
            g.nodes.remove(sq)
            g.nodes.remove(c)
            g.replace_uses(c.outputs[0], sq.inputs[0])
            log(sq.name, "Squeeze + Unsqueeze of axis 2 between two 1-D ops cancelled"
                + (f" ({', '.join(sunk)} on the 2-D map)" if sunk else ""))
        elif sunk:
            log(sq.name, f"Squeeze of axis 2 after {', '.join(sunk)} (they run on the 2-D map)")


def _sink(g, sq, c) -> bool:
    """Run `c`, the only reader of Squeeze `sq`'s output, on its 4-D input instead, and squeeze
    c's output; False where c is no elementwise op on that map alone."""
    x4, t = sq.inputs[0], sq.outputs[0]
    s3 = g.shape(t)
    if s3 is None or len(s3) != 3 or c.inputs[0] != t and c.op not in BINARY:
        return False
    shape = tuple(s3[:2]) + (1,) + tuple(s3[2:])
    if c.op in ELEMENTWISE:
        if c.inputs[0] != t or any(g.const(i) is None for i in c.inputs[1:] if i):
            return False
        inputs = [x4] + c.inputs[1:]
    elif c.op in BINARY and len(c.inputs) == 2 and t in c.inputs:
        k = g.const(c.inputs[1 - c.inputs.index(t)])
        if k is None or np.ndim(k) > 3:
            return False
        k4 = np.expand_dims(np.reshape(k, (1,) * (3 - np.ndim(k)) + np.shape(k)), 2)
        try:
            if np.broadcast_shapes(shape, k4.shape) != tuple(shape):
                return False
        except ValueError:
            return False
        k4 = g.add_const(np.ascontiguousarray(k4), c.name + "/2d")
        inputs = [x4, k4] if c.inputs[0] == t else [k4, x4]
    else:
        return False
    y = c.outputs[0]
    y4 = g.add_tensor(y + "/2d", shape, g.tensors[y].dtype)
    c.inputs, c.outputs, sq.inputs[0], sq.outputs[0] = inputs, [y4], y4, y
    g.nodes.remove(sq)
    g.nodes.insert(g.nodes.index(c) + 1, sq)
    return True

"""Move Transposes below elementwise ops and spatial reductions, so the NHWC<->NCHW pairs that
tf2onnx leaves (its own transpose optimiser gives up on some graphs, e.g. Keras 3 hard_sigmoid)
meet and cancel (upsample_to_resize removes identity chains).

An elementwise op whose every non-constant input is Transpose(perm P) (or, beside one, a Reshape
that moves only size-1 axes as P would, or a tensor of size-1 axes only) is rewritten on the untransposed tensors (constants
permuted by P^-1) and followed by one Transpose(P).
ReduceMean/ReduceMax over axes A of Transpose(P)(x) become reductions over P[A] of x.
A Pad of Transpose(P)(x) (Keras' ZeroPadding2D between tf2onnx's NHWC pairs) becomes Transpose(P)
of x padded on the axes P names, so the pair cancels and the Pad can fold into the conv after it."""
import numpy as np

from tl2k210.graph import Node, reduce_axes, set_axes

UNARY = {"Relu", "Clip", "Sigmoid", "Tanh", "LeakyRelu", "HardSigmoid", "HardSwish", "Identity", "Neg", "Abs",
         "Exp", "Softplus", "Elu", "Selu", "Mish"}
BINARY = {"Add", "Sub", "Mul", "Div", "Max", "Min", "PRelu"}
REDUCE = {"ReduceMean", "ReduceMax"}


def _perm(g, name):
    p = g.producer(name)
    return tuple(p.attrs["perm"]) if p is not None and p.op == "Transpose" and "perm" in p.attrs else None


def _reshaped_as(g, name, perm):
    """The tensor x when `name` is a Reshape of x that is Transpose(perm)(x) (it moves only size-1
    axes: tf2onnx's (1, C, 1, 1) -> (1, 1, 1, C) for a squeeze-and-excite scale), else None."""
    r = g.producer(name)
    if r is None or r.op != "Reshape" or g.const(r.inputs[1]) is None:
        return None
    x = r.inputs[0]
    shape, out = g.shape(x), g.shape(name)
    if shape is None or out is None or len(shape) != len(perm):
        return None
    moved = tuple(shape[a] for a in perm)
    same_order = [a for a in perm if shape[a] != 1] == [a for a in range(len(shape)) if shape[a] != 1]
    return x if moved == tuple(out) and same_order else None


def _unmoved(g, name, perm):
    """`name` itself when every axis of it has size 1 (a computed scalar: a normalization's
    deviation, (1, 1, 1, 1)), which Transpose(perm) leaves as it is, else None."""
    shape = g.shape(name)
    return name if shape is not None and len(shape) == len(perm) and all(d == 1 for d in shape) else None


def _small(g, name, perm):
    """A computed per-channel operand (1, 1, 1, C) of a binary op (a layer norm's scale and shift
    over an NHWC map: AnimeGANv2, hunt 22): what it is in the untransposed order, through a
    Transpose of its few values (a relabel where one axis is over 1); None for a map."""
    shape = g.shape(name)
    if shape is None or len(shape) != len(perm) or sum(d != 1 for d in shape) > 1:
        return None     # (checked before a node is added)
    inv = [int(a) for a in np.argsort(perm)]
    out = g.add_tensor(name + "/untransposed", tuple(shape[a] for a in inv))
    g.nodes.append(Node("Transpose", [name], [out], {"perm": inv}, g.unique(name + "/untranspose")))
    return out


def _const_for(g, c, inv, rank):
    v = g.const(c)
    if v.ndim > rank:
        return None
    return np.transpose(v.reshape((1,) * (rank - v.ndim) + v.shape), inv)


def push_transposes(g, log):
    changed = True
    while changed:
        changed = False
        for n in list(g.nodes):
            if n.op in UNARY:
                data = [n.inputs[0]]
            elif n.op in BINARY:
                data = [i for i in n.inputs if g.const(i) is None]
            elif n.op in REDUCE and reduce_axes(g, n) is not None:
                data = [n.inputs[0]]
            elif n.op == "Pad":
                changed |= _pad(g, n, log)
                continue
            else:
                continue
            perms = {_perm(g, i) for i in data} - ({None} if n.op in BINARY else set())
            if len(perms) != 1 or None in perms or not data:
                continue
            p = next(iter(perms))
            src = {i: g.producer(i).inputs[0] if _perm(g, i) == p else _reshaped_as(g, i, p) or _unmoved(g, i, p)
                   for i in data}
            if n.op in BINARY and len(data) == 2 and None in src.values():     # (the other one is Transpose(p)'s)
                i = next(i for i, v in src.items() if v is None)
                src[i] = _small(g, i, p)
            if None in src.values():
                continue
            inv = tuple(np.argsort(p))
            if n.op in REDUCE:
                changed |= _reduce(g, n, p, log)
                continue
            new_inputs = []
            for i in n.inputs:
                if i in data:
                    new_inputs.append(src[i])
                elif n.op in BINARY:
                    c = _const_for(g, i, inv, len(p))
                    if c is None:
                        break
                    new_inputs.append(g.add_const(c, i + "/untransposed"))
                else:
                    new_inputs.append(i)  # Clip bounds
            else:
                out = n.outputs[0]
                mid = g.add_tensor(out + "/pre_transpose")
                n.inputs, n.outputs = new_inputs, [mid]
                g.nodes.append(Node("Transpose", [mid], [out], {"perm": list(p)}, g.unique(n.name + "/transpose")))
                log(n.name, f"moved Transpose{list(p)} below {n.op}")
                changed = True
    return g


def _reduce(g, n, p, log):
    rank = len(p)
    axes = [a % rank for a in reduce_axes(g, n)]
    keep = n.attrs.get("keepdims", 1)
    new_axes = sorted(p[a] for a in axes)
    if keep:
        after = list(p)
    else:
        rest = [p[i] for i in range(rank) if i not in axes]
        after = [sorted(rest).index(r) for r in rest]
    out = n.outputs[0]
    n.inputs = [g.producer(n.inputs[0]).inputs[0]] + n.inputs[1:]
    set_axes(g, n, new_axes)
    if after != sorted(after):
        mid = g.add_tensor(out + "/pre_transpose")
        n.outputs = [mid]
        g.nodes.append(Node("Transpose", [mid], [out], {"perm": after}, g.unique(n.name + "/transpose")))
    log(n.name, f"{n.op} now reduces axes {new_axes} of the untransposed tensor")
    return True


def _pad(g, n, log):
    """Pad(Transpose(P)(x)) -> Transpose(P)(Pad'(x)): output axis i of the Pad is axis P[i] of x."""
    p = _perm(g, n.inputs[0])
    pads = n.attrs.get("pads") if len(n.inputs) < 2 else g.const(n.inputs[1])
    if p is None or pads is None or len(n.inputs) > 3 and n.inputs[3] or len(pads) != 2 * len(p):
        return False
    r = len(p)
    moved = [0] * (2 * r)
    for i, a in enumerate(p):
        moved[a], moved[r + a] = int(pads[i]), int(pads[r + i])
    x, out = g.producer(n.inputs[0]).inputs[0], n.outputs[0]
    mid = g.add_tensor(out + "/pre_transpose")
    if len(n.inputs) < 2:
        n.attrs["pads"] = moved
        n.inputs = [x]
    else:
        n.inputs = [x, g.add_const(np.array(moved, np.int64), n.inputs[1] + "/untransposed")] + n.inputs[2:]
    n.outputs = [mid]
    g.nodes.append(Node("Transpose", [mid], [out], {"perm": list(p)}, g.unique(n.name + "/transpose")))
    log(n.name, f"moved Transpose{list(p)} below Pad")
    return True

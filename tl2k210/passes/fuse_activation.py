"""Fuse the activation that follows a Conv into its `activation` attr (KPU activation table):
any function of one value (ReLU, ReLU6/Clip, LeakyReLU, ELU, SELU, Sigmoid, Tanh, HardSigmoid,
HardSwish, Softplus, Swish x*sigmoid(x), Mish x*tanh(softplus(x))) becomes a fitted 16-segment table.
A DepthToSpace between them (a transposed conv's phases) is looked through: a function of one
value commutes with moving values, and the conv's output grid then spans the activation's range
(a ReLU after the shuffle would leave the negative half of the conv's uint8 levels unused).
An x*sigmoid(x) left after any other op (a Gemm over the KPU's channels, an add) becomes one
`Swish` node: a function of one value too (one uint8 table, or one float NNIL method), where the
Sigmoid and the Mul of two maps would round twice."""
import numpy as np

from tl2k210.graph import Node


def activation_of(g, n):
    """IR activation dict of a standalone activation node, or None."""
    op, a = n.op, n.attrs
    if op in ("Relu", "Sigmoid", "Tanh", "HardSwish", "Softplus", "Mish", "Swish"):
        return {"op": op}
    if op == "LeakyRelu":
        return {"op": op, "alpha": float(a.get("alpha", 0.01))}
    if op == "Elu":
        return {"op": op, "alpha": float(a.get("alpha", 1.0))}
    if op == "Selu":
        return {"op": op, **{k: float(a[k]) for k in ("alpha", "gamma") if k in a}}
    if op == "HardSigmoid":
        return {"op": op, "alpha": float(a.get("alpha", 0.2)), "beta": float(a.get("beta", 0.5))}
    if op == "Clip":
        lo = g.const(n.inputs[1]) if len(n.inputs) > 1 and n.inputs[1] else a.get("min", -np.inf)
        hi = g.const(n.inputs[2]) if len(n.inputs) > 2 and n.inputs[2] else a.get("max", np.inf)
        if lo is None or hi is None:
            return None
        return {"op": "Clip", "min": float(lo), "max": float(hi)}
    return None


def activation_node(act, x, y, name, fused=()):
    """The standalone node of an IR activation dict (the inverse of activation_of)."""
    return Node(act["op"], [x], [y], {k: v for k, v in act.items() if k != "op"}, name, list(fused))


def _swish(g, conv):
    """Conv -> Sigmoid(y), Mul(y, sigmoid): returns (sigmoid node, mul node) or None."""
    y = conv.outputs[0]
    cs = g.consumers(y)
    if len(cs) != 2 or y in g.outputs:
        return None
    sig = next((c for c in cs if c.op == "Sigmoid"), None)
    mul = next((c for c in cs if c.op == "Mul"), None)
    if sig is None or mul is None or sorted(mul.inputs) != sorted([y, sig.outputs[0]]):
        return None
    return (sig, mul) if g.single_consumer(sig.outputs[0]) is mul else None


def _mish(g, conv):
    """Conv -> Softplus(y) -> Tanh -> Mul(y, tanh): returns the three nodes or None (tf2onnx's Mish)."""
    y = conv.outputs[0]
    cs = g.consumers(y)
    if len(cs) != 2 or y in g.outputs:
        return None
    sp = next((c for c in cs if c.op == "Softplus"), None)
    mul = next((c for c in cs if c.op == "Mul"), None)
    th = g.single_consumer(sp.outputs[0]) if sp is not None else None
    if mul is None or th is None or th.op != "Tanh" or sorted(mul.inputs) != sorted([y, th.outputs[0]]):
        return None
    return (sp, th, mul) if g.single_consumer(th.outputs[0]) is mul else None


def fuse_activation(g, log):
    for conv in [n for n in g.nodes if n.op == "Conv"]:
        if conv.attrs.get("activation") or conv.attrs.get("pool"):
            continue
        sw, mi = _swish(g, conv), _mish(g, conv)
        if sw:
            act, gone = {"op": "Swish"}, list(sw)
        elif mi:
            act, gone = {"op": "Mish"}, list(mi)
        else:
            nxt = g.single_consumer(conv.outputs[0])
            via = conv.outputs[0]
            if nxt is not None and nxt.op == "DepthToSpace" and nxt.outputs[0] not in g.outputs:
                via, nxt = nxt.outputs[0], g.single_consumer(nxt.outputs[0])
            act = activation_of(g, nxt) if nxt is not None else None
            gone = [nxt]
        if act is None:
            continue
        for n in gone:
            g.nodes.remove(n)
        g.replace_uses(gone[-1].outputs[0], conv.outputs[0] if sw or mi else via)
        conv.attrs["activation"] = act
        conv.fused += [n.name for n in gone]
        log(conv.name, f"fused activation {act}")
    for sig in [n for n in g.nodes if n.op == "Sigmoid"]:
        x = sig.inputs[0]
        mul = g.single_consumer(sig.outputs[0])
        if mul is None or mul.op != "Mul" or sorted(mul.inputs) != sorted([x, sig.outputs[0]]) or \
                sig.outputs[0] in g.outputs:
            continue
        g.nodes.remove(sig)
        g.nodes.remove(mul)
        g.nodes.append(Node("Swish", [x], [mul.outputs[0]], {}, mul.name, [sig.name, mul.name]))
        log(mul.name, "x * Sigmoid(x) -> Swish")
    return g

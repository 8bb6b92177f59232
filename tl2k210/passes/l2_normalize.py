"""TF's l2_normalize / Keras UnitNormalization arrive as x * 1/sqrt(max(sum(x*x), eps)) (Mul,
ReduceSum, Max|-, Sqrt, Reciprocal|Div, Min|-, Mul): make them one LpNormalization(p=2) node, which the
K210 back-end runs as the SDK's L2_NORMALIZATION layer (that layer also clamps the sum at 1e-10)."""
from tl2k210.graph import Node


def _chain_to_sumsq(g, t):
    """Follow t back through [Min(cap)] <- [Reciprocal] <- Sqrt <- [Max(eps)] <- ReduceSum <-
    Mul(x, x); return (x, nodes)."""
    nodes = []
    n = g.producer(t)
    if n is not None and n.op == "Min" and any(g.const(i) is not None for i in n.inputs):
        nodes.append(n)   # Keras UnitNormalization caps 1/norm (its epsilon)
        n = g.producer(next(i for i in n.inputs if g.const(i) is None))
    if n is not None and n.op == "Reciprocal":
        nodes.append(n)
        n = g.producer(n.inputs[0])
    if n is None or n.op != "Sqrt":
        return None, []
    nodes.append(n)
    n = g.producer(n.inputs[0])
    if n is not None and n.op == "Max" and any(g.const(i) is not None for i in n.inputs):
        nodes.append(n)
        n = g.producer(next(i for i in n.inputs if g.const(i) is None))
    if n is None or n.op != "ReduceSum":
        return None, []
    nodes.append(n)
    sq = g.producer(n.inputs[0])
    if sq is None or sq.op != "Mul" or sq.inputs[0] != sq.inputs[1]:
        return None, []
    return sq.inputs[0], nodes + [sq]


def l2_normalize(g, log):
    for top in [n for n in g.nodes if n.op in ("Mul", "Div")]:
        if top not in g.nodes:
            continue
        for xi, ri in ((0, 1), (1, 0)) if top.op == "Mul" else ((0, 1),):
            x, chain = _chain_to_sumsq(g, top.inputs[ri])
            if x is None or x != top.inputs[xi]:
                continue
            if (top.op == "Mul") != any(c.op == "Reciprocal" for c in chain):
                continue
            shape = g.shape(x)
            if shape is None or sum(d > 1 for d in shape) > 1:
                continue   # only vectors (embeddings): the SDK layer normalises one vector
            if any(len(g.consumers(c.outputs[0])) != 1 for c in chain):
                continue
            node = Node("LpNormalization", [x], [top.outputs[0]], {"axis": -1, "p": 2}, top.name,
                        [c.name for c in chain] + [top.name])
            for c in chain + [top]:
                g.nodes.remove(c)
            g.nodes.append(node)
            log(node.name, "x / sqrt(max(sum(x^2), eps)) -> LpNormalization(p=2)")
            break
    return g

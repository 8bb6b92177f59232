"""Layers wider than the KPU's 1024 channels (MobileNetV2's last 1x1 conv has 1280 outputs and its
classifier 1280 inputs), split so every part fits -- exact in float:

  * a Conv with more than 1024 output channels -> convs on equal slices of its filters + Concat;
  * a global pool of such a Concat -> the Concat of the pooled slices (pools are per channel);
  * a dense layer (MatMul/Gemm with constant weights, or a 1x1 Conv on a 1x1 map) whose input is a
    Concat of slices -> one 1x1 conv per slice on the matching weight columns, summed (Add).
"""
import numpy as np

from tl2k210.graph import Node, dense_weights
from tl2k210.k210 import hardware as hw


MAX = hw.LIMITS["channels"][1]


def _chunks(n, most=MAX):
    """[(lo, hi)]: the fewest equal ranges of n with at most `most` each."""
    k = -(-n // most)
    edges = np.linspace(0, n, k + 1).round().astype(int)
    return list(zip(edges[:-1], edges[1:]))


def _split_conv(g, n, log):
    w, b = g.const(n.inputs[1]), g.const(n.inputs[2])
    co = w.shape[0]
    out = n.outputs[0]
    shape = g.shape(out)
    parts = []
    for k, (lo, hi) in enumerate(_chunks(co)):
        y = g.add_tensor(f"{out}/part{k}", (shape[0], hi - lo, *shape[2:]))
        parts.append(Node("Conv", [n.inputs[0], g.add_const(w[lo:hi], f"{n.inputs[1]}/part{k}"),
                                   g.add_const(b[lo:hi], f"{n.inputs[2]}/part{k}")], [y], dict(n.attrs),
                          f"{n.name}/part{k}", list(n.fused)))
        g.meta["parts_of"] = {**g.meta.get("parts_of", {}), parts[-1].name: n.name}      # ideal.py: one op's fixed bytes
    i = g.nodes.index(n)
    g.nodes[i:i + 1] = parts + [Node("Concat", [p.outputs[0] for p in parts], [out], {"axis": 1},
                                     n.name + "/concat", [n.name])]
    log(n.name, f"{co} output channels split into {len(parts)} convs of <= {MAX} (+ Concat)")


def _concat_parts(g, t):
    c = g.producer(t)
    if c is None or c.op != "Concat" or c.attrs.get("axis", 1) % 4 != 1 or t in g.outputs:
        return None
    return c


def _pool_through(g, n, log):
    c = _concat_parts(g, n.inputs[0])
    if c is None or len(g.consumers(c.outputs[0])) != 1:
        return False
    pooled = []
    for k, p in enumerate(c.inputs):
        y = g.add_tensor(f"{n.outputs[0]}/part{k}", (1, g.shape(p)[1], 1, 1))
        g.nodes.append(Node(n.op, [p], [y], dict(n.attrs), f"{n.name}/part{k}", [n.name]))
        pooled.append(y)
    g.nodes.remove(n)
    g.nodes.append(Node("Concat", pooled, [n.outputs[0]], {"axis": 1}, n.name + "/concat", [n.name]))
    log(n.name, f"{n.op} moved onto the {len(pooled)} slices of {c.name}")
    return True


def _dense_weights(g, n):
    """(W (N, K), bias (N,)) of a dense node on a flat or 1x1 input, or None."""
    if n.op == "Conv":
        w = g.const(n.inputs[1])
        shape = g.shape(n.inputs[0])
        if w is None or tuple(n.attrs.get("kernel", ())) != (1, 1) or n.attrs.get("group", 1) != 1 or \
                shape is None or tuple(shape[2:]) != (1, 1) or n.attrs.get("activation") or n.attrs.get("pool"):
            return None
        return w[:, :, 0, 0], g.const(n.inputs[2])
    return dense_weights(g, n)


def _dense_through(g, n, log):
    src = n.inputs[0]
    flat = g.producer(src) if n.op != "Conv" else None
    if flat is not None and flat.op in ("Flatten", "Reshape") and len(g.consumers(src)) == 1:
        src = flat.inputs[0]
    c = _concat_parts(g, src)
    wb = _dense_weights(g, n)
    if c is None or wb is None or wb[1] is None:
        return False
    w, b = wb
    if w.shape[1] <= MAX:
        return False
    shapes = [g.shape(p) for p in c.inputs]
    if any(s is None or len(s) != 4 or tuple(s[2:]) != (1, 1) for s in shapes) or w.shape[0] > MAX:
        return False
    out, acc, lo = n.outputs[0], None, 0
    for k, (p, s) in enumerate(zip(c.inputs, shapes)):
        hi = lo + s[1]
        y = g.add_tensor(f"{out}/part{k}", (1, w.shape[0], 1, 1))
        bias = b if k == 0 else np.zeros_like(b)
        g.nodes.append(Node("Conv", [p, g.add_const(w[:, lo:hi, None, None].astype(np.float32), f"{n.name}/W{k}"),
                                     g.add_const(bias.astype(np.float32), f"{n.name}/B{k}")], [y],
                            {"kernel": (1, 1), "strides": (1, 1), "pads": [0, 0, 0, 0], "group": 1,
                             "dilations": (1, 1)}, f"{n.name}/part{k}", [n.name]))
        if acc is None:
            acc = y
        else:
            s_ = g.add_tensor(f"{out}/sum{k}", (1, w.shape[0], 1, 1))
            g.nodes.append(Node("Add", [acc, y], [s_], {}, f"{n.name}/sum{k}", [n.name]))
            acc = s_
        lo = hi
    g.nodes.remove(n)
    shape = g.shape(out)
    if len(shape) == 4:
        g.replace_uses(out, acc)
    else:
        g.nodes.append(Node("Flatten", [acc], [out], {"axis": 1}, n.name + "/flatten", [n.name]))
    log(n.name, f"dense layer on {w.shape[1]} inputs split over the {len(c.inputs)} slices of {c.name} (+ Add)")
    return True


def wide_channels(g, log):
    for n in [n for n in g.nodes if n.op == "Conv"]:
        w = g.const(n.inputs[1])
        if w is not None and w.shape[0] > MAX and n.attrs.get("group", 1) == 1 and len(n.inputs) > 2 and \
                g.const(n.inputs[2]) is not None:
            _split_conv(g, n, log)
    changed = True
    while changed:
        changed = False
        for n in list(g.nodes):
            if n not in g.nodes:
                continue
            if n.op in ("GlobalAveragePool", "GlobalMaxPool"):
                changed |= _pool_through(g, n, log)
            elif n.op in ("MatMul", "Gemm", "Conv"):
                changed |= _dense_through(g, n, log)
    return g

"""Layers wider than the KPU's 1024 channels (MobileNetV2's last 1x1 conv has 1280 outputs and its
classifier 1280 inputs), split so every part fits -- exact in float:

  * a Conv with more than 1024 output channels -> convs on equal slices of its filters + Concat;
  * a global pool or a depthwise conv of such a Concat -> the Concat of the pooled or convolved
    slices (both are per channel);
  * a conv (any kernel) or a dense layer (MatMul/Gemm with constant weights) whose input is a
    Concat of slices -> one conv per slice on the matching weight columns, summed (Add), then its
    activation: MnasNet's and EfficientNet-lite's 1152-channel depthwise and projection convs
    (AutoML Vision Edge's flowers: 94 % of its 892 ms on the CPU before).
"""
import numpy as np

from tl2k210.graph import Node, dense_weights
from tl2k210.k210 import hardware as hw
from tl2k210.passes.fuse_activation import activation_node


MAX = hw.LIMITS["channels"][1]


def _chunks(n, most=MAX):
    """[(lo, hi)]: the fewest equal ranges of n with at most `most` each."""
    k = -(-n // most)
    edges = np.linspace(0, n, k + 1).round().astype(int)
    return list(zip(edges[:-1], edges[1:]))


def _split_conv(g, n, w, b, log):
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


def _slices(g, c):
    """[(part, lo, hi)]: the channel range of each input of Concat `c`, or None where one is
    wider than the KPU's channels."""
    out, lo = [], 0
    for p in c.inputs:
        s = g.shape(p)
        if s is None or len(s) != 4 or s[1] > MAX:
            return None
        out.append((p, lo, lo + s[1]))
        lo += s[1]
    return out


def _part(g, n, k):
    """The name of part k of node n, recorded as a part of it (ideal.py: one op's fixed bytes)."""
    name = f"{n.name}/part{k}"
    g.meta["parts_of"] = {**g.meta.get("parts_of", {}), name: n.name}
    return name


def _conv_weights(g, n):
    """(W, bias) of a Conv with constant weights and bias and no fused pool, else None."""
    if n.op != "Conv" or len(n.inputs) < 3 or n.attrs.get("pool"):
        return None
    w, b = g.const(n.inputs[1]), g.const(n.inputs[2])
    return None if w is None or b is None else (w, b)


def _depthwise_through(g, n, log):
    wb, c = _conv_weights(g, n), _concat_parts(g, n.inputs[0])
    cin = (g.shape(n.inputs[0]) or (0, 0))[1]
    if wb is None or c is None or cin <= MAX or n.attrs.get("group", 1) != cin or wb[0].shape[0] != cin:
        return False
    parts = _slices(g, c)
    if parts is None:
        return False
    (w, b), out, shape, ys = wb, n.outputs[0], g.shape(n.outputs[0]), []
    for k, (p, lo, hi) in enumerate(parts):
        y = g.add_tensor(f"{out}/part{k}", (shape[0], hi - lo, *shape[2:]))
        g.nodes.append(Node("Conv", [p, g.add_const(w[lo:hi], f"{n.inputs[1]}/part{k}"),
                                     g.add_const(b[lo:hi], f"{n.inputs[2]}/part{k}")], [y],
                            {**n.attrs, "group": hi - lo}, _part(g, n, k), list(n.fused)))
        ys.append(y)
    g.nodes.remove(n)
    g.nodes.append(Node("Concat", ys, [out], {"axis": 1}, n.name + "/concat", [n.name]))
    log(n.name, f"depthwise conv over {cin} channels moved onto the {len(ys)} slices of {c.name}")
    return True


def _summed(g, n, parts, w, b, attrs, out, log, what):
    """One conv per slice (p, lo, hi) of n's input on the weight columns w[:, lo:hi], the bias in
    the first, summed by Adds into `out`, then the activation in `attrs`."""
    act = attrs.get("activation")
    attrs = {k: v for k, v in attrs.items() if k != "activation"}
    shape = g.shape(out) if len(g.shape(out)) == 4 else (1, w.shape[0], 1, 1)
    acc = None
    for k, (p, lo, hi) in enumerate(parts):
        y = g.add_tensor(f"{out}/part{k}", shape)
        g.nodes.append(Node("Conv", [p, g.add_const(w[:, lo:hi].astype(np.float32), f"{n.name}/W{k}"),
                                     g.add_const((b if k == 0 else np.zeros_like(b)).astype(np.float32),
                                                 f"{n.name}/B{k}")], [y], attrs, _part(g, n, k), [n.name]))
        if acc is not None:
            s = g.add_tensor(f"{out}/sum{k}", shape)
            g.nodes.append(Node("Add", [acc, y], [s], {}, f"{n.name}/sum{k}", [n.name]))
            y = s
        acc = y
    g.nodes.remove(n)
    if act:
        y = g.add_tensor(f"{out}/{act['op']}", shape)
        g.nodes.append(activation_node(act, acc, y, f"{n.name}/{act['op']}", [n.name]))
        acc = y
    if len(g.shape(out)) == 4:
        g.replace_uses(out, acc)
    else:
        g.nodes.append(Node("Flatten", [acc], [out], {"axis": 1}, n.name + "/flatten", [n.name]))
    log(n.name, f"{what} on {w.shape[1]} input channels split over the {len(parts)} slices of its Concat (+ Add)")
    return True


def _conv_through(g, n, log):
    wb, c = _conv_weights(g, n), _concat_parts(g, n.inputs[0])
    if wb is None or c is None or n.attrs.get("group", 1) != 1 or wb[0].shape[1] <= MAX or wb[0].shape[0] > MAX:
        return False
    parts = _slices(g, c)
    return parts is not None and _summed(g, n, parts, wb[0], wb[1], n.attrs, n.outputs[0], log, "conv")


def _dense_through(g, n, log):
    src = n.inputs[0]
    flat = g.producer(src)
    if flat is not None and flat.op in ("Flatten", "Reshape") and len(g.consumers(src)) == 1:
        src = flat.inputs[0]
    c = _concat_parts(g, src)
    wb = dense_weights(g, n)
    if c is None or wb is None or wb[1] is None or wb[0].shape[1] <= MAX or wb[0].shape[0] > MAX:
        return False
    parts = _slices(g, c)
    if parts is None or any(tuple(g.shape(p)[2:]) != (1, 1) for p, _, _ in parts):
        return False
    w = wb[0][:, :, None, None]
    attrs = {"kernel": (1, 1), "strides": (1, 1), "pads": [0, 0, 0, 0], "group": 1, "dilations": (1, 1)}
    return _summed(g, n, parts, w, wb[1], attrs, n.outputs[0], log, "dense layer")


def wide_channels(g, log):
    for n in [n for n in g.nodes if n.op == "Conv"]:
        wb = _conv_weights(g, n)        # (fuse_pool, later in the flow, has fused no pool yet)
        if wb is not None and wb[0].shape[0] > MAX and n.attrs.get("group", 1) == 1:
            _split_conv(g, n, *wb, log)
    changed = True
    while changed:
        changed = False
        for n in list(g.nodes):
            if n not in g.nodes:
                continue
            if n.op in ("GlobalAveragePool", "GlobalMaxPool"):
                changed |= _pool_through(g, n, log)
            elif n.op in ("MatMul", "Gemm"):
                changed |= _dense_through(g, n, log)
            elif n.op == "Conv":
                changed |= _depthwise_through(g, n, log) or _conv_through(g, n, log)
    return g

"""Constant spatial Pad before a Conv or MaxPool -> their own padding (ZeroPad2d + VALID).

Conv: pads add to the conv's; a non-zero pad value v is exact too: conv(pad_v(x)) =
  conv(pad_0(x - v)) + v·ΣW, so the Pad becomes an Add(-v) (folded into the layer before, or a
  1x1 depthwise conv) and the conv's bias grows by v·ΣW.
MaxPool: pads add to the pool's (its padding never wins a max) when the value is -inf, or 0 on an
  input that cannot be negative (after ReLU, ReLU6, Sigmoid, HardSigmoid)."""
import numpy as np

from tl2k210.graph import Node, pads_of

NONNEG = {"Relu", "Sigmoid", "HardSigmoid", "Softplus"}


def constant_pads(g, pad):
    """([top, left, bottom, right], value) of a constant NCHW Pad on H and W only (opset 18's
    `axes` input included: PyTorch 2's exports), or None."""
    if len(g.shape(pad.inputs[0]) or ()) != 4:
        return None
    r = pads_of(g, pad)
    if isinstance(r, str) or r[2] != "constant":
        return None
    (n, c, h, w), value, _ = r
    if any(n) or any(c) or min(h + w) < 0:
        return None
    return [h[0], w[0], h[1], w[1]], value


def spatial_zero_pads(g, pad):
    """[top, left, bottom, right] of a constant-zero NCHW Pad node, or None."""
    r = constant_pads(g, pad)
    return r[0] if r is not None and r[1] == 0 else None


def _nonneg(g, t):
    p = g.producer(t)
    if p is None:
        return False
    act = p.attrs.get("activation") if p.op == "Conv" else {"op": p.op, **p.attrs}
    if p.op == "Clip" and len(p.inputs) > 1 and p.inputs[1]:
        lo = g.const(p.inputs[1])
        return lo is not None and float(lo) >= 0
    if act and act["op"] == "Clip":
        return act.get("min", -1) >= 0
    return bool(act) and act["op"] in NONNEG


def nonnegative(g, t):
    """Is tensor `t` >= 0 by construction: an activation's output that cannot be negative, or a
    max pool of one? (Its uint8 range then starts at 0: zero point code 0.)"""
    while g.producer(t) is not None and g.producer(t).op == "MaxPool":
        t = g.producer(t).inputs[0]
    return _nonneg(g, t)


def pad_into_conv(g, log, repeat=True):
    """Until no Pad folds (`repeat`): a Pad feeding a Pad (TF's explicit ZeroPadding2D before the
    zero paddings of a dilated conv's SpaceToBatchND) folds once the Pad after it has. Without
    `repeat` (one round: where kmodel v4's CPU pad can stay) such an outer Pad stays a layer: in
    a dilated K x K conv its pixels would widen every shift stage (SemanticSegmentation: 13.7 ->
    15.6 ms, 922 -> 1,046 KB), which only kmodel v3, without a pad layer, must pay."""
    while _fold_pads(g, log) and repeat:
        pass
    return g


def _fold_pads(g, log):
    folded = False
    for pad in [n for n in g.nodes if n.op == "Pad"]:
        r = constant_pads(g, pad)
        users = g.consumers(pad.outputs[0])
        if r is None or not users or pad.outputs[0] in g.outputs:
            continue
        pads, value = r
        if all(u.op == "Conv" and g.const(u.inputs[1]) is not None for u in users):
            x = pad.inputs[0]
            if value:
                shifted = g.add_tensor(pad.name + "/shifted", g.shape(x))
                g.nodes.insert(g.nodes.index(pad), Node(
                    "Add", [x, g.add_const(np.array(-value, np.float32), pad.name + "/minus_value")], [shifted],
                    {}, pad.name + "/shift", [pad.name]))
                x = shifted
            for conv in users:
                conv.attrs["pads"] = [a + b for a, b in zip(conv.attrs["pads"], pads)]
                conv.inputs[0] = x
                if value:
                    w = g.const(conv.inputs[1]).astype(np.float64)
                    b = g.const(conv.inputs[2]).astype(np.float64) + value * w.sum(axis=(1, 2, 3))
                    conv.inputs[2] = g.add_const(b.astype(np.float32), conv.name + "/B_pad")
                conv.fused.append(pad.name)
                log(conv.name, f"absorbed Pad {pad.name} {pads}" + (f" value {value:g} (as Add {-value:g} "
                                                                    "before, bias + value*sum(W))" if value else "")
                    + f"; pads now {conv.attrs['pads']}")
            g.nodes.remove(pad)
            folded = True
        elif all(u.op == "MaxPool" and u.inputs[0] == pad.outputs[0] for u in users) and \
                (value == -np.inf or value == 0 and _nonneg(g, pad.inputs[0])):
            for pool in users:
                old = list(pool.attrs.get("pads", [0, 0, 0, 0]))
                pool.attrs["pads"] = [a + b for a, b in zip(old, pads)]
                pool.inputs[0] = pad.inputs[0]
                pool.fused.append(pad.name)
                log(pool.name, f"absorbed Pad {pad.name} {pads} value {value:g} (never the max)")
            g.nodes.remove(pad)
            folded = True
    return folded

"""Explicit zero Pad (spatial only) + Conv -> Conv with the pads added (ZeroPad2d + VALID)."""
import numpy as np


def spatial_zero_pads(g, pad):
    """[top, left, bottom, right] of a constant-zero NCHW Pad node, or None."""
    if pad.attrs.get("mode", "constant") != "constant":
        return None
    p = pad.attrs.get("pads") if len(pad.inputs) < 2 else g.const(pad.inputs[1])
    if p is None or len(p) != 8 or len(pad.inputs) > 3 and pad.inputs[3]:
        return None
    value = g.const(pad.inputs[2]) if len(pad.inputs) > 2 and pad.inputs[2] else 0.0
    if value is None or np.any(np.asarray(value) != 0):
        return None
    p = [int(v) for v in p]
    if p[0] or p[1] or p[4] or p[5] or min(p) < 0:
        return None
    return [p[2], p[3], p[6], p[7]]


def pad_into_conv(g, log):
    for pad in [n for n in g.nodes if n.op == "Pad"]:
        pads = spatial_zero_pads(g, pad)
        users = g.consumers(pad.outputs[0])
        if pads is None or not users or pad.outputs[0] in g.outputs or any(u.op != "Conv" for u in users):
            continue
        for conv in users:
            conv.attrs["pads"] = [a + b for a, b in zip(conv.attrs["pads"], pads)]
            conv.inputs[0] = pad.inputs[0]
            conv.fused.append(pad.name)
            log(conv.name, f"absorbed Pad {pad.name} {pads}; pads now {conv.attrs['pads']}")
        g.nodes.remove(pad)
    return g

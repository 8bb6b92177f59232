"""Stride-2 Conv with asymmetric padding -> [Pad] + stride-1 Conv with symmetric pads (k-1)/2 +
Slice(step 2). Exactly equivalent in float; every Conv left is KPU-shaped (stride 1, symmetric),
the Slice is a KPU pick-pool (phase 0 or 1) or a CPU crop, as the backend decides."""
import numpy as np

from tl2k210.graph import Node


def _axis_plan(size, k, pad_before, n_out):
    """(extra_before, extra_after, slice_start) along one axis for a stride-2 conv."""
    p = k // 2
    extra_b = max(0, pad_before - p)
    start = -pad_before + extra_b + p  # stride-1 output index of the first window
    last = start + 2 * (n_out - 1)
    extra_a = max(0, last - (size + extra_b - 1))
    return extra_b, extra_a, start


def split_stride2(g, log):
    for conv in [n for n in g.nodes if n.op == "Conv"]:
        a = conv.attrs
        t, l, b, r = a["pads"]
        kh, kw = a["kernel"]
        if tuple(a["strides"]) != (2, 2) or (t, l) == (b, r) or kh % 2 == 0 or kw % 2 == 0 \
                or tuple(a["dilations"]) != (1, 1) or a.get("pool"):
            continue
        _, _, h, w = g.shape(conv.inputs[0])
        _, _, ho, wo = g.shape(conv.outputs[0])
        eh0, eh1, sh = _axis_plan(h, kh, t, ho)
        ew0, ew1, sw = _axis_plan(w, kw, l, wo)
        x = conv.inputs[0]
        new = []
        if eh0 or eh1 or ew0 or ew1:
            xp = g.add_tensor(conv.name + "/padded")
            new.append(Node("Pad", [x, g.add_const(np.array([0, 0, eh0, ew0, 0, 0, eh1, ew1], np.int64),
                                                    conv.name + "/pads")], [xp], {"mode": "constant"},
                            conv.name + "/pad"))
            x = xp
        full = g.add_tensor(conv.name + "/stride1")
        out = conv.outputs[0]
        conv.inputs[0], conv.outputs = x, [full]
        a["strides"], a["pads"] = (1, 1), [kh // 2, kw // 2, kh // 2, kw // 2]
        c = lambda v, s: g.add_const(np.array(v, np.int64), conv.name + "/" + s)
        new.append(Node("Slice", [full, c([sh, sw], "starts"), c([sh + 2 * ho - 1, sw + 2 * wo - 1], "ends"),
                                  c([2, 3], "axes"), c([2, 2], "steps")], [out], {}, conv.name + "/slice"))
        i = g.nodes.index(conv)
        g.nodes[i + 1:i + 1] = new[-1:]
        g.nodes[i:i] = new[:-1]
        log(conv.name, f"stride 2 pads {[t, l, b, r]} -> {'Pad ' + str([eh0, ew0, eh1, ew1]) + ' + ' if len(new) > 1 else ''}"
                       f"stride-1 conv + Slice start ({sh},{sw}) step 2")
    return g

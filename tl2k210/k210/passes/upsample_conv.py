"""Nearest 2x upsampling then a 3x3 conv (ESPCN's nearest-resize head, upsample-conv decoders) as
one 3x3 conv on the small map to the four output phases + DepthToSpace, where the upsampled map
and the conv's output do not fit the KPU RAM together (ESPCN at 128x128: a 2 MiB 32x256x256 map,
parked in KPU RAM with its 3x3 conv on the CPU, 0.85 s of its 0.98 s).

Per axis, output row Y = 2i + a of the conv reads upsampled rows Y - 1, Y, Y + 1, that is input
rows i - 1, i, i (a = 0) or i, i, i + 1 (a = 1): phase a is a 3x3 conv on the input with the
kernel's rows summed onto taps A_a (rows: input offset -1, 0, +1; columns: kernel row 0, 1, 2)

    A_0 = [[1, 0, 0], [0, 1, 1], [0, 0, 0]]      A_1 = [[0, 0, 0], [1, 1, 0], [0, 0, 1]]

and the same on the columns; the zero padding of the upsampled map is the input's. The phases of
output channel o are channels 4 o + 2 a + b, which DepthToSpace (CRD) interleaves: exact in float,
the same products summed in other groups; the weights are 4x the conv's (a form: flow.FORM_PASSES
keeps the network's own graph for its 8-bit ideal), the 4x bigger map never exists.
"""
import numpy as np

from tl2k210.graph import Node
from tl2k210.k210 import hardware as hw
from tl2k210.k210.lower.v4resize import nearest_is_floor

PHASE = np.array([[[1, 0, 0], [0, 1, 1], [0, 0, 0]],
                  [[0, 0, 0], [1, 1, 0], [0, 0, 1]]], np.float64)


def _head(g, conv):
    """The nearest 2x Resize a 3x3, stride-1, pad-1, ungrouped conv alone reads, or None."""
    a = conv.attrs
    up = g.producer(conv.inputs[0])
    if up is None or up.op != "Resize" or up.attrs.get("mode", "nearest") != "nearest" or \
            len(g.consumers(up.outputs[0])) != 1 or up.outputs[0] in g.outputs:
        return None
    if tuple(a.get("kernel", ())) != (3, 3) or tuple(a.get("strides", (1, 1))) != (1, 1) or \
            list(a.get("pads", ())) != [1, 1, 1, 1] or tuple(a.get("dilations", (1, 1))) != (1, 1) or \
            a.get("group", 1) != 1 or a.get("pool") or len(conv.inputs) < 3:
        return None
    x, y = g.shape(up.inputs[0]), g.shape(up.outputs[0])
    if x is None or y is None or len(x) != 4 or tuple(y) != (x[0], x[1], 2 * x[2], 2 * x[3]) or \
            not nearest_is_floor(g, up) or g.const(conv.inputs[1]) is None or g.const(conv.inputs[2]) is None:
        return None
    co = g.shape(conv.outputs[0])[1]
    big = hw.map_lines(x[1], y[2], y[3]) + hw.map_lines(co, y[2], y[3]) > hw.KPU_RAM_LINES
    return up if big else None


def phase_weights(W):
    """(4 Co, Ci, 3, 3): output channel o's phase (a, b) at 4 o + 2 a + b."""
    co, ci = W.shape[:2]
    out = np.einsum("ayk,bxl,oikl->oabiyx", PHASE, PHASE, W.astype(np.float64))
    return out.reshape(co * 4, ci, 3, 3).astype(np.float32)


def upsample_conv(g, log, v4=True):
    """`v4`: kmodel v4 (kmodel v3 has no DepthToSpace: its row bands take the upsampled map)."""
    for conv in [n for n in g.nodes if n.op == "Conv"] if v4 else ():
        up = _head(g, conv)
        if up is None:
            continue
        W, B = g.const(conv.inputs[1]), g.const(conv.inputs[2])
        out = conv.outputs[0]
        z = g.add_tensor(out + "/phases")
        i = g.nodes.index(conv)
        g.nodes[i:i + 1] = [
            Node("Conv", [up.inputs[0], g.add_const(phase_weights(W), conv.name + "/phase_weights"),
                          g.add_const(np.repeat(np.asarray(B, np.float32), 4), conv.name + "/phase_bias")], [z],
                 dict(conv.attrs), conv.name, list(conv.fused) + [up.name]),
            Node("DepthToSpace", [z], [out], {"blocksize": 2, "mode": "CRD"}, conv.name + "/shuffle")]
        g.nodes.remove(up)
        log(conv.name, f"nearest 2x {up.name} + 3x3 conv: one 3x3 conv to the {4 * W.shape[0]} phases on the "
                       f"{tuple(g.shape(up.inputs[0])[2:])} map + DepthToSpace (the upsampled map does not fit the "
                       "KPU RAM beside the conv's output)")
    return g

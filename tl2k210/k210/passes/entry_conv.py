"""MaixPy and the SDK start a kmodel with a KPU conv that reads the camera image. A model whose image
input feeds something else first (a pool, an add, several branches: e.g. a U-Net that max-pools
its input for a skip path) gets an identity 1x1 depthwise conv in front (weights 1, bias 0): exact
in float; on the KPU it passes the pixels on (its output range is the input's) and a pool right
after it can fuse into it. graph.meta["entry_conv"] names its output. pixel_entry: the same conv
where a first conv that pads cannot fold the pixels' per-channel preprocessing exactly."""
import numpy as np

from tl2k210.graph import Node
from tl2k210.k210.lower.v4emit import pads_exactly, pixel_zero


def entry_conv(g, log):
    if len(g.inputs) != 1:
        return g
    x = g.inputs[0]
    shape = g.shape(x)
    users = g.consumers(x)
    if len(shape or ()) != 4 or not users or x in g.outputs or shape[1] not in (1, 3):
        return g   # only camera images (gray or RGB) are fed to the KPU
    if len(users) == 1 and users[0].op == "Conv" and users[0].inputs[0] == x:
        return g
    _add(g, x, users)
    log("entry_conv", f"input {x} feeds {', '.join(sorted({u.op for u in users}))}: identity 1x1 depthwise "
        "conv in front (the K210 runtimes start with a KPU conv)")
    return g


def pixel_entry(g, scale, offset) -> str | None:
    """The entry conv for an image whose first conv pads where the pixels' preprocessing differs
    by channel (ImageNet's --mean/--std, an input BatchNormalization): that conv reads the pixels
    with the preprocessing folded in and pads with one value, the pixel nearest every channel's
    zero, so its border taps read a channel's residual where the normalised image has 0 (one
    5x5 'same' conv: 25.8 dB against an 8-bit ideal of 35.5; hunt 19). Unpadded, the entry conv
    folds them exactly and writes the normalised image, whose zero point pads exactly. Returns
    the note, or None where no entry conv is needed (or there is one)."""
    x = g.inputs[0]
    users = g.consumers(x)
    if g.meta.get("entry_conv") or len(users) != 1 or users[0].op != "Conv" or not any(users[0].attrs["pads"]):
        return None
    sc = np.asarray(scale, np.float64)
    if pads_exactly(sc, pixel_zero(sc, np.asarray(offset, np.float64))[1]):
        return None
    _add(g, x, users)
    return (f"identity 1x1 depthwise conv in front of {users[0].name!r}: the channels' preprocessing differs, "
            "and a conv that pads reads the normalised image's zero only there")


def _add(g, x, users):
    c = g.shape(x)[1]
    y = g.add_tensor(x + "/entry", g.shape(x))
    w = g.add_const(np.ones((c, 1, 1, 1), np.float32), x + "/entry_w")
    b = g.add_const(np.zeros(c, np.float32), x + "/entry_b")
    for u in users:
        u.inputs = [y if i == x else i for i in u.inputs]
    g.nodes.insert(0, Node("Conv", [x, w, b], [y], {"kernel": (1, 1), "strides": (1, 1), "pads": [0, 0, 0, 0],
                                                    "group": c, "dilations": (1, 1)}, g.unique("entry_conv")))
    g.meta["entry_conv"] = y

"""MaixPy and the SDK start a kmodel with a KPU conv that reads the camera image. A model whose image
input feeds something else first (a pool, an add, several branches: e.g. a U-Net that max-pools
its input for a skip path) gets an identity 1x1 depthwise conv in front (weights 1, bias 0): exact
in float; on the KPU it passes the pixels on (its output range is the input's) and a pool right
after it can fuse into it. graph.meta["entry_conv"] names its output."""
import numpy as np

from tl2k210.graph import Node


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
    c = shape[1]
    y = g.add_tensor(x + "/entry", shape)
    w = g.add_const(np.ones((c, 1, 1, 1), np.float32), x + "/entry_w")
    b = g.add_const(np.zeros(c, np.float32), x + "/entry_b")
    for u in users:
        u.inputs = [y if i == x else i for i in u.inputs]
    g.nodes.insert(0, Node("Conv", [x, w, b], [y], {"kernel": (1, 1), "strides": (1, 1), "pads": [0, 0, 0, 0],
                                                    "group": c, "dilations": (1, 1)}, g.unique("entry_conv")))
    g.meta["entry_conv"] = y
    log("entry_conv", f"input {x} feeds {', '.join(sorted({u.op for u in users}))}: identity 1x1 depthwise "
        "conv in front (the K210 runtimes start with a KPU conv)")
    return g

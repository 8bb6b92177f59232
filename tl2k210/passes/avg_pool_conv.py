"""A 3x3 AveragePool whose every window divides by 9 (count_include_pad=1, or no pads), stride
1 or 2, that fuse_pool left alone: a depthwise 3x3 conv of weights 1/9 over the zero-padded map,
exact in float. PyTorch's AvgPool2d(3, 1, 1) (count_include_pad is its default; hunt 20) had run
as a uint8 CPU conv, kmodel v4 only and 2.48 ms on a 16x32x32 map; the KPU runs it, in v3."""
import numpy as np

from tl2k210.graph import Node


def avg_pool_conv(g, log):
    for n in list(g.nodes):
        a = n.attrs
        if n.op != "AveragePool" or a.get("ceil_mode") or a.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
            continue
        pads, shape = list(a.get("pads", (0, 0, 0, 0))), g.shape(n.inputs[0])
        if list(a.get("kernel_shape", ())) != [3, 3] or list(a.get("strides", (1, 1))) not in ([1, 1], [2, 2]) \
                or any(d != 1 for d in a.get("dilations", (1, 1))) or pads not in ([0] * 4, [1] * 4) \
                or any(pads) and not a.get("count_include_pad", 0) or shape is None or len(shape) != 4:
            continue
        c = shape[1]
        w = g.add_const(np.full((c, 1, 3, 3), 1 / 9, np.float32), n.name + "/mean_weights")
        b = g.add_const(np.zeros(c, np.float32), n.name + "/mean_bias")
        i = g.nodes.index(n)
        g.nodes[i] = Node("Conv", [n.inputs[0], w, b], list(n.outputs),
                          {"kernel": (3, 3), "strides": tuple(a.get("strides", (1, 1))), "pads": pads,
                           "dilations": (1, 1), "group": c}, n.name, [n.name])
        log(n.name, f"3x3 average pool (every window / 9) -> depthwise conv of weights 1/9 on {c} channels")
    return g

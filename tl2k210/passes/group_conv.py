"""Grouped convs the KPU cannot run (1 < group < channels, e.g. ShuffleNet's 1x1 group-4 convs, or
a depthwise conv with a channel multiplier) -> one normal conv with block-diagonal weights.
Exact (the added weights are zeros); costs group x the weights and MACs, which the receipt shows."""
import numpy as np


def group_conv(g, log):
    for n in [n for n in g.nodes if n.op == "Conv"]:
        groups = n.attrs.get("group", 1)
        w = g.const(n.inputs[1])
        ci = g.shape(n.inputs[0])[1] if g.shape(n.inputs[0]) else None
        if groups == 1 or w is None or ci is None or (groups == ci and w.shape[0] == ci):
            continue   # normal or depthwise: the KPU runs both
        co, cig = w.shape[0], w.shape[1]
        dense = np.zeros((co, ci) + w.shape[2:], w.dtype)
        cog = co // groups
        for k in range(groups):
            dense[k * cog:(k + 1) * cog, k * cig:(k + 1) * cig] = w[k * cog:(k + 1) * cog]
        n.inputs[1] = g.add_const(dense, n.inputs[1] + "/dense")
        n.attrs["group"] = 1
        log(n.name, f"group {groups} conv -> normal conv with block-diagonal weights ({groups}x the MACs)")
    return g

"""Grouped conv -> the same conv with block-diagonal dense weights (group 1). Exact (the added
weights are zeros). Not a pipeline pass -- the lowering runs grouped convs as cheaper
block-diagonal tiles of a few groups -- but what channel_shuffle needs before it reorders a
grouped conv's output channels across its groups."""
import numpy as np


def block_diagonal(w, groups: int) -> np.ndarray:
    """A grouped conv's weights (Co, Ci/groups, ...) as the group-1 conv's (Co, Ci, ...)."""
    w = np.asarray(w)
    co, cig = w.shape[0], w.shape[1]
    dense = np.zeros((co, cig * groups) + w.shape[2:], w.dtype)
    cog = co // groups
    for k in range(groups):
        dense[k * cog:(k + 1) * cog, k * cig:(k + 1) * cig] = w[k * cog:(k + 1) * cog]
    return dense


def to_dense(g, n, log):
    groups = n.attrs.get("group", 1)
    n.inputs[1] = g.add_const(block_diagonal(g.const(n.inputs[1]), groups), n.inputs[1] + "/dense")
    n.attrs["group"] = 1
    log(n.name, f"group {groups} conv -> normal conv with block-diagonal weights ({groups}x the MACs)")

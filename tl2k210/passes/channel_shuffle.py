"""A channel shuffle (ShuffleNet's Reshape(1,g,C/g,H,W) -> Transpose(0,2,1,3,4) -> Reshape(1,C,H,W),
or any data-movement chain that only permutes the channels of a (1,C,H,W) map) folded into the
conv that produces the map (its output channels reordered; a grouped producer first becomes
block-diagonal dense, since the shuffle mixes its groups) or, failing that, into the normal convs
that read it (their input channels reordered). Exact: no data moves at run time."""
import numpy as np

from .group_conv import to_dense
from .layout import chains


def _channel_perm(x, y):
    """perm with y[:, c] == x[:, perm[c]] for index probes x, y of a (1,C,H,W) map, or None."""
    if x.ndim != 4 or y.shape != x.shape:
        return None
    c = x.shape[1]
    plane = x.shape[2] * x.shape[3]
    src = y[0].reshape(c, -1)
    perm = src[:, 0] // plane
    if not np.array_equal(src, x[0].reshape(c, -1)[perm]):
        return None
    return perm


def channel_shuffle(g, log):
    for chain, x, outs in list(chains(g)):
        if any(n not in g.nodes for n in chain):
            continue
        perm = _channel_perm(x, outs[-1])
        if perm is None or np.array_equal(perm, np.arange(len(perm))):
            continue
        src, out = chain[0].inputs[0], chain[-1].outputs[0]
        prod, users = g.producer(src), g.consumers(out)
        names = [n.name for n in chain]
        if prod is not None and prod.op == "Conv" and g.single_consumer(src) is chain[0] and \
                g.const(prod.inputs[1]) is not None and (prod.attrs.get("group", 1) == 1 or
                                                         g.const(prod.inputs[1]).shape[1] > 1):
            if prod.attrs.get("group", 1) != 1:
                to_dense(g, prod, log)
            w, b = g.const(prod.inputs[1]), g.const(prod.inputs[2])
            prod.inputs[1] = g.add_const(w[perm], prod.inputs[1] + "/shuffled")
            prod.inputs[2] = g.add_const(b[perm], prod.inputs[2] + "/shuffled")
            where = f"output channels of {prod.name}"
        elif users and out not in g.outputs and all(
                u.op == "Conv" and u.inputs[0] == out and u.attrs.get("group", 1) == 1 and
                g.const(u.inputs[1]) is not None for u in users):
            inv = np.argsort(perm)
            for u in users:
                u.inputs[1] = g.add_const(g.const(u.inputs[1])[:, inv], u.inputs[1] + "/shuffled")
                u.inputs[0] = src
            where = f"input channels of {', '.join(u.name for u in users)}"
        else:
            continue
        for n in chain:
            g.nodes.remove(n)
        g.replace_uses(out, src)
        log(chain[-1].name, f"channel shuffle {names} folded into the {where}")
    _shuffles_in_4d(g, log)
    return g


def _shuffles_in_4d(g, log):
    """A shuffle left (ShuffleNetV2's, between a Concat and the Slices that split it: no conv to
    fold it into) is a data move: its 5-D Transpose (0, 2, 1, 3, 4) of (1, g, C/g, H, W) becomes
    the 4-D (0, 2, 1, 3) of (1, g, C/g, H*W), the same element order, which kmodel v4's transpose
    runs (H and W never move apart)."""
    for t in [n for n in g.nodes if n.op == "Transpose" and list(n.attrs.get("perm", ())) == [0, 2, 1, 3, 4]]:
        r = g.producer(t.inputs[0])
        shape = g.shape(t.inputs[0])
        if r is None or r.op != "Reshape" or g.single_consumer(r.outputs[0]) is not t or shape is None \
                or len(shape) != 5 or shape[0] != 1:
            continue
        flat = (1, shape[1], shape[2], shape[3] * shape[4])
        r.inputs[1] = g.add_const(np.array(flat, np.int64), r.inputs[1] + "/4d")
        g.tensors[r.outputs[0]].shape = flat
        t.attrs["perm"] = [0, 2, 1, 3]
        g.tensors[t.outputs[0]].shape = (1, shape[2], shape[1], flat[3])
        log(t.name, f"channel shuffle of {shape} as the 4-D transpose (0, 2, 1, 3) of {flat}")

"""Per-channel affines that fold_batchnorm could not fold into the Conv before them
(BatchNormalization, Mul/Add/Sub/Div by a per-channel or scalar constant):

fold_affine_into_conv: into the Conv(s) after them, where that is exact: a scale always (zero
  padding stays zero), a shift only when the consumers pad nothing (1x1 convs, dense layers).
affine_to_conv: the rest become a 1x1 depthwise Conv (a 1x1 dense Conv on vectors), which the KPU
  runs exactly as it runs any conv; affines after it fold into it.
Both exact in float (up to rounding)."""
import numpy as np

from tl2k210.graph import Node

from .fold_batchnorm import _bn, fold_batchnorm


def _nchw_or_nc(shape) -> bool:
    """A map (N, C, H, W) or a vector (1, C): a 2-D tensor of more rows is no batch of vectors
    (the graph runs one sample) but a (rows, values) table, whose axis 1 is no channel."""
    return shape is not None and (len(shape) == 4 or len(shape) == 2 and shape[0] == 1)


def affine_of(g, n):
    """(x, scale (C,), shift (C,)) if n computes scale[c]*x + shift[c] on an NCHW/NC tensor x."""
    if len(n.outputs) != 1:
        return None
    if n.op == "BatchNormalization":
        x = n.inputs[0]
        r = _bn(g, n)
        shape = g.shape(x)
        if r is None or g.const(x) is not None or not _nchw_or_nc(shape):
            return None
        return x, r[0].astype(np.float64), r[1].astype(np.float64)
    if n.op not in ("Mul", "Add", "Sub", "Div") or len(n.inputs) != 2:
        return None
    a, b = n.inputs
    ca, cb = g.const(a), g.const(b)
    if (ca is None) == (cb is None):
        return None
    x, k, const_first = (b, ca, True) if cb is None else (a, cb, False)
    shape = g.shape(x)
    if not _nchw_or_nc(shape) or not np.issubdtype(np.asarray(k).dtype, np.floating):
        return None
    v = _channel_vector(np.asarray(k, np.float64), shape)
    if v is None or (n.op == "Div" and (const_first or np.any(v == 0))):
        return None
    one, zero = np.ones_like(v), np.zeros_like(v)
    if n.op == "Mul":
        return x, v, zero
    if n.op == "Div":
        return x, 1 / v, zero
    return (x, one, v) if n.op == "Add" else (x, -one, v) if const_first else (x, one, -v)


def _channel_vector(k, shape):
    """A constant broadcasting per channel (or as a scalar) on `shape`, as a (C,) vector."""
    c = shape[1]
    if k.size == 1:
        return np.full(c, float(k.reshape(())))
    full = (1,) * (len(shape) - k.ndim) + k.shape
    if k.size == c and len(full) == len(shape) and full[1] == c:
        return k.reshape(c)
    return None


def fold_affine_into_conv(g, log):
    changed = True
    while changed:
        changed = False
        for n in list(g.nodes):
            aff = affine_of(g, n)
            if aff is None or n.outputs[0] in g.outputs:
                continue
            x, s, t = aff
            users = g.consumers(n.outputs[0])
            if not users or any(not _absorbs(g, u, n.outputs[0], t) for u in users):
                continue
            for u in users:
                w, b = g.const(u.inputs[1]).astype(np.float64), g.const(u.inputs[2]).astype(np.float64)
                grp = u.attrs.get("group", 1)
                co, m = w.shape[:2]
                src = (np.arange(co) // (co // grp))[:, None] * m + np.arange(m)[None, :]   # input channel
                b = b + (w.sum(axis=(2, 3)) * t[src]).sum(axis=1)
                w = w * s[src][:, :, None, None]
                u.inputs[0] = x
                u.inputs[1] = g.add_const(w.astype(np.float32), u.name + "/W_in")
                u.inputs[2] = g.add_const(b.astype(np.float32), u.name + "/B_in")
                u.fused.append(n.name)
                log(u.name, f"folded the {n.op} {n.name} before it into its weights")
            g.nodes.remove(n)
            changed = True
    return g


def _absorbs(g, u, t, shift):
    """Can Conv u take the affine on its input t exactly? (the shift needs no zero padding)"""
    if u.op != "Conv" or u.inputs[0] != t or g.const(u.inputs[1]) is None or g.const(u.inputs[2]) is None:
        return False
    return not np.any(shift) or not any(u.attrs["pads"])


def _under_root(g, n):
    """A normalization's var + eps (read only by a Sqrt): it stays an elementwise op on the
    statistic, which is float; a conv would put the variance on a uint8 grid, where a flat
    map's 0 + eps rounds to 0 and its root to a zero divisor."""
    readers = g.consumers(n.outputs[0])
    return n.op == "Add" and bool(readers) and all(r.op == "Sqrt" for r in readers)


def affine_to_conv(g, log):
    g = fold_batchnorm(g, log)      # an affine a pass just made (pad_into_conv) after a Conv
    for n in list(g.nodes):
        if n not in g.nodes:
            continue
        aff = affine_of(g, n)
        if aff is None or _under_root(g, n):
            continue
        x, s, t = aff
        shape = g.shape(x)
        c, out = shape[1], n.outputs[0]
        attrs = {"kernel": (1, 1), "strides": (1, 1), "pads": [0, 0, 0, 0], "dilations": (1, 1)}
        if len(shape) == 4 and shape[2:] != (1, 1):
            w, attrs["group"] = s.reshape(c, 1, 1, 1), c
            new = [Node("Conv", [x, g.add_const(w.astype(np.float32), n.name + "/W"),
                                 g.add_const(t.astype(np.float32), n.name + "/B")], [out], attrs, n.name, [n.name])]
        else:   # a vector: a depthwise 1x1 conv on a (1, C, 1, 1) map (c weights, not a c x c diagonal)
            attrs["group"] = c
            w = s.reshape(c, 1, 1, 1)
            r4 = g.add_tensor(n.name + "/nchw", (1, c, 1, 1))
            co = g.add_tensor(n.name + "/conv", (1, c, 1, 1))
            new = [Node("Reshape", [x, g.add_const(np.array([1, c, 1, 1], np.int64), n.name + "/shape4")], [r4],
                        {}, n.name + "/to_nchw"),
                   Node("Conv", [r4, g.add_const(w.astype(np.float32), n.name + "/W"),
                                 g.add_const(t.astype(np.float32), n.name + "/B")], [co], attrs, n.name, [n.name]),
                   Node("Reshape", [co, g.add_const(np.array(shape, np.int64), n.name + "/shape")], [out], {},
                        n.name + "/back")]
            if len(shape) == 4:
                new = new[1:2]
                new[0].inputs[0], new[0].outputs = x, [out]
        i = g.nodes.index(n)
        g.nodes[i:i + 1] = new
        log(n.name, f"standalone {n.op} -> 1x1 {'depthwise ' if attrs['group'] > 1 else ''}Conv (runs on the KPU)")
        g = fold_batchnorm(g, log)    # the affines right after it fold into it
    return g

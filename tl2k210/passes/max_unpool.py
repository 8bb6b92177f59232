"""MaxUnpool of a MaxPool's own Indices (SegNet's decoders; MediaPipe's MaxUnpooling2D after the
TFLite front-end) without a scatter, in ops the K210 back-end lowers.

For a k x k pool of stride k, no padding, on an H x W map that k divides, and an unpooling back
to H x W, each window's k*k pixels are the k*k phases of the map (SpaceToDepth, phase
q = i*k + j, DCR order); the unpooled map puts v where the phase holds the window's maximum --
the first such phase, as MaxPool's Indices do (onnxruntime, TF and MediaPipe keep the first
maximum, so ties, frequent after a ReLU, resolve the same way):

    X  = SpaceToDepth(x, k)                         # [1, k*k*C, H/k, W/k]: phase q in block q
    S  = Sign(P - X)                                # P = MaxPool(x): 0 at a maximum, else 1
    M  = Relu(1 - q - S_q + sum_{r<q} S_r)          # a 1x1 Conv on S: 1 at the first maximum only
    y  = DepthToSpace(v * M, k)                     # v at that phase, 0 elsewhere

(P and v broadcast over the phases: the maps are seen as [1, k*k, C, H*W/(k*k)] by Reshapes,
which move no data.)
M is exact: with S in {0, 1}, 1 - q + (number of earlier phases below the maximum) - S_q is 1
when no earlier phase holds the maximum and this one does, else <= 0; in float every step is
exact (P equals one of its window's values, so the difference is 0 exactly there). On the
uint8 grid P and X share one quantization (a max pool and SpaceToDepth keep their input's; no
Concat requantizes them), so the difference of equal codes is 0 and of unequal ones at least a
step: the Sign table is exact too.

Anything else (overlapping or padded windows, a map k does not divide, indices read by another
op) has no exact form here: refused naming the node.
"""
import numpy as np

from tl2k210.errors import UnsupportedOpError
from tl2k210.graph import Node, describe


def _refuses(g, n, pool):
    """Why MaxUnpool `n` of MaxPool `pool` has no phase form, or None."""
    if pool is None or pool.op != "MaxPool" or len(pool.outputs) < 2 or n.inputs[1] != pool.outputs[1]:
        return "its indices are not a MaxPool's Indices output"
    a = pool.attrs
    k = list(a.get("kernel_shape", ()))
    if len(k) != 2 or k[0] != k[1] or list(a.get("strides", (1, 1))) != k:
        return f"the pool's {k} window with strides {list(a.get('strides', (1, 1)))} is not square and as long " \
               "as its stride (windows that overlap or skip pixels)"
    if any(a.get("pads", (0, 0, 0, 0))) or a.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID") \
            or a.get("ceil_mode", 0) or any(d != 1 for d in a.get("dilations", (1, 1))) or a.get("storage_order", 0):
        return "the pool pads, rounds up, dilates or stores indices column-major"
    x = pool.inputs[0]
    xs, ys = g.shape(x), g.shape(n.outputs[0])
    if ys is None and len(n.inputs) > 2 and g.const(n.inputs[2]) is not None:
        ys = tuple(int(d) for d in g.const(n.inputs[2]))       # onnx infers no shape from output_shape
    if xs is None or len(xs) != 4 or xs[2] % k[0] or xs[3] % k[1]:
        return f"the pooled map {xs} is not a multiple of the {k[0]}x{k[1]} window"
    if tuple(ys or ()) != tuple(xs):
        return f"it unpools into {ys}, not the pooled map's {xs}"
    readers = [c for c in g.consumers(pool.outputs[1]) if c.op != "MaxUnpool"]
    if readers or pool.outputs[1] in g.outputs:
        return f"the indices are also read by {readers[0].name if readers else 'a graph output'}"
    return None


def _tie_break(k2, c):
    """1x1 Conv weights and bias of M = Relu(W * S + b) (phase-major channels q*c + ch)."""
    w = np.zeros((k2 * c, k2 * c, 1, 1), np.float32)
    for q in range(k2):
        for r in range(q + 1):
            w[q * c + np.arange(c), r * c + np.arange(c), 0, 0] = -1.0 if r == q else 1.0
    return w, np.repeat(1.0 - np.arange(k2, dtype=np.float32), c)


def max_unpool(g, log):
    for n in [n for n in g.nodes if n.op == "MaxUnpool"]:
        pool = g.producer(n.inputs[1])
        why = _refuses(g, n, pool)
        if why:
            raise UnsupportedOpError(
                f"node {n.name!r} ({describe(n)}): {why}; a K210 has no scatter, so only MaxUnpool of a "
                "square, unpadded, non-overlapping MaxPool's own indices back to the pooled map's size is "
                "lowered (as phases and masks): pool and unpool in that form, or unpool with Resize")
        x, v, y, k = pool.inputs[0], n.inputs[0], n.outputs[0], int(pool.attrs["kernel_shape"][0])
        _, c, h, w = g.shape(x)
        k2, hw = k * k, (h // k) * (w // k)
        rows, one_row, maps = (g.add_const(np.array(s, np.int64), f"{y}/{nm}") for s, nm in (
            ((1, k2, c, hw), "rows_shape"), ((1, 1, c, hw), "row_shape"), ((1, k2 * c, h // k, w // k), "map_shape")))
        wt, b = (g.add_const(a, f"{y}/tie_break_{nm}") for a, nm in zip(_tie_break(k2, c), "wb"))
        conv = dict(kernel=(1, 1), strides=(1, 1), pads=[0, 0, 0, 0], group=1, dilations=(1, 1))
        t = {}

        def node(op, ins, out, attrs=None):     # `out` names a new tensor, t[out], and the node
            t[out] = g.add_tensor(f"{y}/{out}")
            return Node(op, ins, [t[out]], attrs or {}, f"{n.name}/{out}")
        # maps seen as [1, k*k, C, HW/(k*k)] rows: the maxima and values broadcast over the phases
        new = [node("SpaceToDepth", [x], "phases", {"blocksize": k}),
               node("Reshape", [t["phases"], rows], "phase_rows"),
               node("Reshape", [pool.outputs[0], one_row], "max_rows"),
               node("Sub", [t["max_rows"], t["phase_rows"]], "below_max"),
               node("Sign", [t["below_max"]], "is_below"),
               node("Reshape", [t["is_below"], maps], "is_below_map"),
               node("Conv", [t["is_below_map"], wt, b], "first", conv),
               node("Relu", [t["first"]], "first_max"),
               node("Reshape", [t["first_max"], rows], "first_rows"),
               node("Reshape", [v, one_row], "value_rows"),
               node("Mul", [t["value_rows"], t["first_rows"]], "placed"),
               node("Reshape", [t["placed"], maps], "placed_map"),
               Node("DepthToSpace", [t["placed_map"]], [y], {"blocksize": k, "mode": "DCR"}, n.name, n.fused)]
        i = g.nodes.index(n)
        g.nodes[i:i + 1] = new
        if not [c for c in g.consumers(pool.outputs[1]) if c.op == "MaxUnpool"]:
            pool.outputs = pool.outputs[:1]
        log(n.name, f"MaxUnpool of {pool.name}'s {k}x{k} indices: phases (SpaceToDepth), first-maximum masks "
                    "(Sub, Sign, 1x1 Conv, Relu), Mul, DepthToSpace")
    return g

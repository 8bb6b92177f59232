"""A dilated 3x3 conv too wide for the shift stages, as one plain 3x3 conv over a mosaic of its
sub-grids.

lower/kxk.py runs a dilated 3x3 as one-hot copy stages that hold each input channel shifted by
each of its 9 taps, then a 3x3 conv over that map; one KPU layer reads 1,024 channels, so a
conv on more than 113 (OpenCV's res10 SSD face detector: 128 channels, dilation 2, at 19x19)
fell to the CPU: 1.6 s of its 1.8 s. With dilation b and pads b, output (b u + i, b v + j)
reads only the input sub-grid (i, j) -- rows b t + i, columns b s + j -- at (u, v) and its 8
neighbours: a plain 3x3 conv with pads 1 on that sub-grid. The b x b sub-grids, each padded
below and right by one zero row and column, are laid side by side (Slice with steps, Pad,
Concat), one 3x3 KPU conv with pads 1 runs over the mosaic (a zero gutter between tiles is the
padding each one needs), and the tiles of its output are interleaved back (Slice, Concat in
DepthToSpace's DCR order, DepthToSpace) and cropped. Exact: every output sums the same
products; the moves copy bytes. kmodel v4 only (v3 has no Slice); the weights once. DeepLab's
atrous depthwise convs (960 channels, dilation 2 and 4) likewise.
"""
import numpy as np

from tl2k210.graph import Node
from tl2k210.k210.lower.kxk import forms


def _mosaic_conv(g, n):
    """The dilation b of a stride-1 3x3 conv (dense, depthwise or grouped) with pads b on every
    side that no kxk form runs whole (a grouped one's channel windows store every shifted copy's
    one-hot weights: DeepLab's 99 KiB a layer against 2.5 KB), else None."""
    a = n.attrs
    shape = g.shape(n.inputs[0])
    d = tuple(a.get("dilations", (1, 1)))
    if n.op != "Conv" or tuple(a.get("kernel", ())) != (3, 3) or d[0] != d[1] or d[0] < 2 \
            or tuple(a.get("strides", (1, 1))) != (1, 1) or a.get("pool") \
            or list(a.get("pads", ())) != [d[0]] * 4 or shape is None or len(shape) != 4 \
            or g.const(n.inputs[1]) is None or forms(g, n, "v4"):
        return None
    return d[0]


def dilated_mosaic(g, log, v4=True):
    """`v4`: the plan may use kmodel v4 (k210/flow.py binds False for a v3 target or runtime)."""
    for n in [n for n in g.nodes if n.op == "Conv"] if v4 else ():
        b = _mosaic_conv(g, n)
        if b is None:
            continue
        x, y = n.inputs[0], n.outputs[0]
        _, c, H, W = g.shape(x)
        co = g.shape(y)[1]
        h, w = -(-H // b), -(-W // b)
        new = []

        def op(kind, inputs, shape, attrs=None, tag="", channels=c):
            t = g.add_tensor(f"{y}/mosaic/{tag}", (1, channels, *shape))
            new.append(Node(kind, inputs, [t], attrs or {}, f"{n.name}/mosaic/{tag}", [n.name]))
            return t

        def const(v, tag):
            return g.add_const(np.array(v, np.int64), f"{n.name}/mosaic/{tag}")
        rows = []
        for i in range(b):
            tiles = []
            for j in range(b):
                hi, wj = len(range(i, H, b)), len(range(j, W, b))
                sub = op("Slice", [x, const([i, j], "s"), const([H, W], "e"), const([2, 3], "a"), const([b, b], "st")],
                         (hi, wj), tag=f"sub{i}{j}")
                tiles.append(op("Pad", [sub, const([0, 0, 0, 0, 0, 0, h + 1 - hi, w + 1 - wj], "p")],
                                (h + 1, w + 1), {"mode": "constant"}, f"tile{i}{j}"))
            rows.append(op("Concat", tiles, (h + 1, b * (w + 1)), {"axis": 3}, f"row{i}"))
        m = op("Concat", rows, (b * (h + 1), b * (w + 1)), {"axis": 2}, "map")
        out = op("Conv", [m] + n.inputs[1:], (b * (h + 1), b * (w + 1)),
                 {**n.attrs, "dilations": (1, 1), "pads": [1, 1, 1, 1]}, "conv", co)
        new[-1].fused = list(n.fused)
        parts = [op("Slice", [out, const([i * (h + 1), j * (w + 1)], "s"),
                              const([i * (h + 1) + h, j * (w + 1) + w], "e"), const([2, 3], "a")],
                    (h, w), tag=f"out{i}{j}", channels=co)
                 for i in range(b) for j in range(b)]
        phases = op("Concat", parts, (h, w), {"axis": 1}, "phases", b * b * co)
        full = op("DepthToSpace", [phases], (b * h, b * w), {"blocksize": b, "mode": "DCR"}, "interleaved", co)
        if (b * h, b * w) != (H, W):
            new.append(Node("Slice", [full, const([0, 0], "cs"), const([H, W], "ce"), const([2, 3], "ca")], [y], {},
                            f"{n.name}/mosaic/crop", [n.name]))
        else:
            new[-1].outputs = [y]
        i = g.nodes.index(n)
        g.nodes[i:i + 1] = new
        log(n.name, f"dilation-{b} 3x3 conv on {c} channels (too many for the shift stages) as one 3x3 conv "
                    f"over a {b}x{b} mosaic of its sub-grids ({b * (h + 1)}x{b * (w + 1)})")
    return g

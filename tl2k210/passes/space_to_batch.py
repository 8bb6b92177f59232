"""TF's dilated convolution (SpaceToBatchND -> Conv -> BatchToSpaceND, what TFLite files keep of
`Conv2D(dilation_rate=b)`) as the one dilated Conv it computes.

tf2onnx writes SpaceToBatchND with block b on a batch of one as Transpose(1,0,2,3) ->
SpaceToDepth(b) -> Transpose(1,0,2,3), and BatchToSpaceND as the mirror (Transpose,
DepthToSpace, then TF's crop as a Slice of H/W, Transpose back): the
batch index is i*b + j for the sub-grid offset (i, j), so

    y_batch[i*b + j][o, y, x] = sum W[o, c, ky, kx] * X[c, (y + ky - pt)*b + i, (x + kx - pl)*b + j]
    Y[o, y*b + i, x*b + j]    = y_batch[i*b + j][o, y, x]

is Conv(X, W, dilations b, pads p*b) exactly (a sub-grid position outside the grid is a position
outside X). The Pad before and the Slice (TF's paddings/crops) stay as they are, but a crop of
zero rows and columns (`_crops_nothing`) goes.
"""
import numpy as np

from tl2k210.graph import Node

from .layout import relaid_const

SWAP = [1, 0, 2, 3]
#: element-wise ops with scalar parameters that may come between TF's bias and the last
#: Transpose (a depthwise conv's activation: tf2onnx leaves it in the swapped layout)
POINTWISE = ("Relu", "Clip", "LeakyRelu", "Sigmoid", "Tanh", "HardSigmoid", "HardSwish", "Elu")


def _swap(g, t):
    """The Transpose(1,0,2,3) reading tensor `t` alone, or None."""
    n = g.single_consumer(t)
    return n if n is not None and n.op == "Transpose" and list(n.attrs.get("perm", ())) == SWAP else None


def _chain(g, t1):
    """(b, [T, SpaceToDepth, T], [(Conv, [T, DepthToSpace, T], crop Slice or None, bias or None,
    [activations]) per conv]) starting at Transpose `t1`; else None. The batch of sub-grids may
    feed several convs (a full-int8 TFLite ASPP: a dilation-2 conv and a dilation-2 depthwise conv
    share one SpaceToBatchND); each must end in its own BatchToSpaceND. The last Transpose may
    also change the layout (TF's NHWC output: (1, 2, 3, 0) = the swap, then NCHW -> NHWC), and
    TF's bias may come between it and the crop (an Add or Mul of a constant, in the swapped
    layout), then element-wise activations (POINTWISE: a TFLite DepthwiseConv2D's fused ReLU6)."""
    s2d = g.single_consumer(t1.outputs[0])
    if s2d is None or s2d.op != "SpaceToDepth" or (g.shape(t1.inputs[0]) or (0,))[0] != 1:
        return None
    b = int(s2d.attrs["blocksize"])
    t2 = _swap(g, s2d.outputs[0])
    convs = g.consumers(t2.outputs[0]) if t2 and t2.outputs[0] not in g.outputs else []
    tails = [_tail(g, conv, t2, b) for conv in convs]
    return (b, [t1, s2d, t2], tails) if tails and None not in tails else None


def _tail(g, conv, t2, b):
    """(Conv, [T, DepthToSpace, T], crop, bias, [activations]) after the swap `t2`, else None."""
    if conv.op != "Conv" or conv.inputs[0] != t2.outputs[0] or t2.outputs[0] in conv.inputs[1:]:
        return None
    a = conv.attrs
    if tuple(a.get("strides", (1, 1))) != (1, 1) or tuple(a.get("dilations", (1, 1))) != (1, 1) \
            or "kernel" not in a:
        return None
    t3 = _swap(g, conv.outputs[0])
    d2s = g.single_consumer(t3.outputs[0]) if t3 else None
    if d2s is None or d2s.op != "DepthToSpace" or int(d2s.attrs["blocksize"]) != b \
            or d2s.attrs.get("mode", "DCR") != "DCR":
        return None
    crop = g.single_consumer(d2s.outputs[0])
    axes = g.const(crop.inputs[3]) if crop is not None and crop.op == "Slice" and len(crop.inputs) > 3 else None
    if axes is None or not set(np.asarray(axes).reshape(-1).tolist()) <= {2, 3, -1, -2} \
            or (len(crop.inputs) > 4 and crop.inputs[4]):
        crop = None
    t = (crop or d2s).outputs[0]
    bias = g.single_consumer(t)
    if bias is None or bias.op not in ("Add", "Mul") or bias.inputs[0] != t or \
            relaid_const(g, bias.inputs[1], SWAP) is None:
        bias = None
    acts, t = [], (bias or crop or d2s).outputs[0]
    while (n := g.single_consumer(t)) is not None and n.op in POINTWISE and n.inputs[0] == t and \
            all(not i or g.const(i) is not None and np.size(g.const(i)) == 1 for i in n.inputs[1:]):
        acts.append(n)
        t = n.outputs[0]
    t4 = g.single_consumer(t)
    if t4 is None or t4.op != "Transpose" or sorted(t4.attrs.get("perm", ())) != [0, 1, 2, 3]:
        return None
    return conv, [t3, d2s, t4], crop, bias, acts


def _crops_nothing(g, crop):
    """Does the crop Slice keep every row and column (TF's crops of zero)?"""
    shape = g.shape(crop.inputs[0])
    starts, ends, axes = (np.asarray(g.const(t)).reshape(-1) for t in crop.inputs[1:4])
    return shape is not None and all(s == 0 and e >= shape[a] for s, e, a in zip(starts, ends, axes))


def space_to_batch(g, log):
    for t1 in [n for n in g.nodes if n.op == "Transpose" and list(n.attrs.get("perm", ())) == SWAP]:
        if t1 not in g.nodes:
            continue
        found = _chain(g, t1)
        if found is None:
            continue
        b, head, tails = found
        new = []
        for conv, tail, crop, bias, acts in tails:
            if crop is not None and _crops_nothing(g, crop):
                g.replace_uses(crop.outputs[0], crop.inputs[0])     # TF's zero crops: no Slice
                g.nodes.remove(crop)
                crop = None
            t4, out = tail[-1], tail[-1].outputs[0]
            rest = [SWAP.index(p) for p in t4.attrs["perm"]]          # t4 = the swap, then `rest`
            d = 1 if tuple(conv.attrs["kernel"]) == (1, 1) else b      # a 1x1 conv has no dilation
            a = dict(conv.attrs, dilations=(d, d), pads=[p * b for p in conv.attrs["pads"]])
            steps = [n for n in (crop, bias) if n is not None] + acts + ([t4] if rest != [0, 1, 2, 3] else [])
            y = g.add_tensor(conv.outputs[0] + "/dilated") if steps else out
            moved = (head if conv is tails[0][0] else []) + tail
            new.append(Node("Conv", [t1.inputs[0]] + conv.inputs[1:], [y], a, conv.name,
                            fused=conv.fused + [n.name for n in moved if n not in steps]))
            for k, n in enumerate(steps):
                z = out if k == len(steps) - 1 else g.add_tensor(n.outputs[0] + "/nchw")
                if n is t4:
                    new.append(Node("Transpose", [y], [z], {"perm": rest}, n.name, n.fused))
                elif n is bias:
                    c = g.add_const(relaid_const(g, n.inputs[1], SWAP), n.inputs[1] + "/nchw")
                    new.append(Node(n.op, [y, c], [z], dict(n.attrs), n.name, n.fused))
                else:       # the crop, an activation
                    new.append(Node(n.op, [y] + n.inputs[1:], [z], dict(n.attrs), n.name, n.fused))
                y = z
            for n in [crop, bias, conv] + acts + tail:
                if n is not None:
                    g.nodes.remove(n)
            log(conv.name, f"SpaceToBatchND -> Conv -> BatchToSpaceND (block {b}) as one Conv with dilations {b}")
        i = g.nodes.index(t1)
        for n in head:
            g.nodes.remove(n)
        g.nodes[i:i] = new
    return g

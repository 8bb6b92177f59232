"""PixelShuffle / DepthToSpace (sub-pixel upsampling of super-resolution and segmentation heads) as
a one-hot grouped ConvTranspose, kernel r x r, stride r:

    out[c, h*r + i, w*r + j] = in[c*r*r + i*r + j, h, w]        (PyTorch PixelShuffle, ONNX CRD)
    out[c, h*r + i, w*r + j] = in[(i*r + j)*C + c, h, w]        (ONNX DCR, TF depth_to_space)

PyTorch exports PixelShuffle as Reshape (1, C, r, r, H, W) -> Transpose [0, 1, 4, 2, 5, 3] ->
Reshape (1, C, H*r, W*r): 6-D tensors no kmodel holds. The ConvTranspose with 0/1 weights is the
same permutation exactly (each output takes one input times 1), on 4-D maps."""
import numpy as np

from tl2k210.graph import Node

PERMS = {(0, 1, 4, 2, 5, 3): "CRD", (0, 3, 4, 1, 5, 2): "DCR"}


def _weights(c, r, mode):
    """(C*r*r, 1, r, r) for group = C (CRD) or (C*r*r, C, r, r) dense (DCR)."""
    if mode == "CRD":
        w = np.zeros((c * r * r, 1, r, r), np.float32)
        for k in range(c * r * r):
            w[k, 0, (k % (r * r)) // r, k % r] = 1.0
        return w, c
    w = np.zeros((c * r * r, c, r, r), np.float32)
    for k in range(c * r * r):
        w[k, k % c, (k // c) // r, (k // c) % r] = 1.0
    return w, 1


def _shuffle_chain(g, first):
    """(x, y, r, mode, nodes) when `first` starts Reshape -> Transpose -> Reshape of a pixel shuffle."""
    if first.op != "Reshape":
        return None
    x = first.inputs[0]
    xs, mid = g.shape(x), g.shape(first.outputs[0])
    tr = g.single_consumer(first.outputs[0])
    if xs is None or mid is None or len(xs) != 4 or len(mid) != 6 or tr is None or tr.op != "Transpose":
        return None
    mode = PERMS.get(tuple(tr.attrs.get("perm", ())))
    last = g.single_consumer(tr.outputs[0])
    if mode is None or last is None or last.op != "Reshape":
        return None
    n, cin, h, w = xs
    r = mid[2] if mode == "CRD" else mid[1]
    c = cin // (r * r) if r else 0
    want_mid = (n, c, r, r, h, w) if mode == "CRD" else (n, r, r, c, h, w)
    if r < 2 or c * r * r != cin or tuple(mid) != want_mid or tuple(g.shape(last.outputs[0]) or ()) != (n, c, h * r, w * r):
        return None
    return x, last.outputs[0], r, mode, [first, tr, last]


def pixel_shuffle(g, log):
    for n in list(g.nodes):
        if n not in g.nodes:
            continue
        if n.op == "DepthToSpace" and len(g.shape(n.inputs[0]) or ()) == 4:
            x, y, r = n.inputs[0], n.outputs[0], int(n.attrs["blocksize"])
            mode, old = n.attrs.get("mode", "DCR"), [n]
        else:
            found = _shuffle_chain(g, n)
            if found is None:
                continue
            x, y, r, mode, old = found
        c = g.shape(x)[1] // (r * r)
        w, groups = _weights(c, r, mode)
        conv = Node("ConvTranspose", [x, g.add_const(w, old[0].name + "/one_hot"),
                                      g.add_const(np.zeros(c, np.float32), old[0].name + "/bias")], [y],
                    {"kernel_shape": [r, r], "strides": [r, r], "group": groups}, old[-1].name,
                    [o.name for o in old])
        i = g.nodes.index(old[0])
        for o in old:
            g.nodes.remove(o)
        g.nodes.insert(i, conv)
        log(conv.name, f"pixel shuffle ({mode}, x{r}) of {g.shape(x)} -> one-hot ConvTranspose "
                       f"{r}x{r} stride {r}, group {groups}")
    return g

"""PixelShuffle (sub-pixel upsampling of super-resolution and segmentation heads) as one ONNX
DepthToSpace node, which the lowering runs as data movement (two 4-D transposes, no weights):

    out[c, h*r + i, w*r + j] = in[c*r*r + i*r + j, h, w]        (PyTorch PixelShuffle, ONNX CRD)
    out[c, h*r + i, w*r + j] = in[(i*r + j)*C + c, h, w]        (ONNX DCR, TF depth_to_space)

PyTorch exports PixelShuffle as Reshape (1, C, r, r, H, W) -> Transpose [0, 1, 4, 2, 5, 3] ->
Reshape (1, C, H*r, W*r): 6-D tensors no kmodel holds; the DepthToSpace node is the same
permutation on 4-D maps."""
from tl2k210.graph import Node

PERMS = {(0, 1, 4, 2, 5, 3): "CRD", (0, 3, 4, 1, 5, 2): "DCR"}


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
        found = _shuffle_chain(g, n)
        if found is None:
            continue
        x, y, r, mode, old = found
        d2s = Node("DepthToSpace", [x], [y], {"blocksize": r, "mode": mode}, old[-1].name, [o.name for o in old])
        i = g.nodes.index(old[0])
        for o in old:
            g.nodes.remove(o)
        g.nodes.insert(i, d2s)
        log(d2s.name, f"pixel shuffle ({mode}, x{r}) of {g.shape(x)}: Reshape 6-D, Transpose, Reshape -> "
                      "DepthToSpace")
    return g

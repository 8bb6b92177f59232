"""PixelShuffle (sub-pixel upsampling of super-resolution and segmentation heads) as one ONNX
DepthToSpace node, which the lowering runs as data movement (two 4-D transposes, no weights):

    out[c, h*r + i, w*r + j] = in[c*r*r + i*r + j, h, w]        (PyTorch PixelShuffle, ONNX CRD)
    out[c, h*r + i, w*r + j] = in[(i*r + j)*C + c, h, w]        (ONNX DCR, TF depth_to_space)

PyTorch exports PixelShuffle as Reshape (1, C, r, r, H, W) -> Transpose [0, 1, 4, 2, 5, 3] ->
Reshape (1, C, H*r, W*r): 6-D tensors no kmodel holds; the DepthToSpace node is the same
permutation on 4-D maps.

PixelUnshuffle (its inverse, out[c*r*r + i*r + j, h, w] = in[c, h*r + i, w*r + j]) exports as
Reshape (1, C, H/r, r, W/r, r) -> Transpose [0, 1, 3, 5, 2, 4] -> Reshape (1, C*r*r, H/r, W/r);
ONNX's SpaceToDepth has only the DCR order (channel (i*r + j)*C + c), so it becomes SpaceToDepth
and the channel shuffle from DCR to CRD (Reshape (1, r*r, C, H/r, W/r) -> Transpose (0, 2, 1, 3,
4) -> Reshape), which passes/channel_shuffle.py folds into the conv that reads it."""
import numpy as np

from tl2k210.graph import Node

PERMS = {(0, 1, 4, 2, 5, 3): "CRD", (0, 3, 4, 1, 5, 2): "DCR"}


def _reshape_chain(g, first):
    """(x, shape of x, 6-D shape, perm, nodes) when `first` starts Reshape (4-D -> 6-D) ->
    Transpose -> Reshape, each the only reader of the one before."""
    if first.op != "Reshape":
        return None
    x = first.inputs[0]
    xs, mid = g.shape(x), g.shape(first.outputs[0])
    tr = g.single_consumer(first.outputs[0])
    if xs is None or mid is None or len(xs) != 4 or len(mid) != 6 or tr is None or tr.op != "Transpose":
        return None
    last = g.single_consumer(tr.outputs[0])
    if last is None or last.op != "Reshape":
        return None
    return x, tuple(xs), tuple(mid), tuple(tr.attrs.get("perm", ())), [first, tr, last]


def _shuffle_chain(g, first):
    """(x, y, r, mode, nodes) when `first` starts Reshape -> Transpose -> Reshape of a pixel shuffle."""
    found = _reshape_chain(g, first)
    mode = PERMS.get(found[3]) if found else None
    if mode is None:
        return None
    x, (n, cin, h, w), mid, _, nodes = found
    r = mid[2] if mode == "CRD" else mid[1]
    c = cin // (r * r) if r else 0
    want_mid = (n, c, r, r, h, w) if mode == "CRD" else (n, r, r, c, h, w)
    y = nodes[-1].outputs[0]
    if r < 2 or c * r * r != cin or mid != want_mid or tuple(g.shape(y) or ()) != (n, c, h * r, w * r):
        return None
    return x, y, r, mode, nodes


def _unshuffle_chain(g, first):
    """(x, y, r, nodes) when `first` starts Reshape -> Transpose -> Reshape of a pixel unshuffle."""
    found = _reshape_chain(g, first)
    if found is None or found[3] != (0, 1, 3, 5, 2, 4):
        return None
    x, (n, c, h, w), mid, _, nodes = found
    r = mid[3]
    y = nodes[-1].outputs[0]
    if r < 2 or h % r or w % r or mid != (n, c, h // r, r, w // r, r) or \
            tuple(g.shape(y) or ()) != (n, c * r * r, h // r, w // r):
        return None
    return x, y, r, nodes


def _unshuffle(g, n, log):
    found = _unshuffle_chain(g, n)
    if found is None:
        return
    x, y, r, old = found
    b, c, h, w = g.shape(x)
    h, w = h // r, w // r
    t = [g.add_tensor(f"{y}/{k}", s) for k, s in (("dcr", (b, r * r * c, h, w)), ("groups", (b, r * r, c, h, w)),
                                                    ("crd", (b, c, r * r, h, w)))]
    five, four = (g.add_const(np.array(s, np.int64), f"{y}/{k}") for k, s in
                  (("groups_shape", (b, r * r, c, h, w)), ("map_shape", (b, c * r * r, h, w))))
    new = [Node("SpaceToDepth", [x], [t[0]], {"blocksize": r}, f"{old[-1].name}/space_to_depth"),
           Node("Reshape", [t[0], five], [t[1]], {}, f"{old[-1].name}/groups"),
           Node("Transpose", [t[1]], [t[2]], {"perm": [0, 2, 1, 3, 4]}, f"{old[-1].name}/dcr_to_crd"),
           Node("Reshape", [t[2], four], [y], {}, old[-1].name, [o.name for o in old])]
    i = g.nodes.index(old[0])
    for o in old:
        g.nodes.remove(o)
    g.nodes[i:i] = new
    log(old[-1].name, f"pixel unshuffle (x{r}) of {g.shape(x)}: Reshape 6-D, Transpose, Reshape -> "
                      "SpaceToDepth and a DCR-to-CRD channel shuffle")


def pixel_shuffle(g, log):
    for n in list(g.nodes):
        if n not in g.nodes:
            continue
        _unshuffle(g, n, log)
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

"""In-graph preprocessing on the image input (a Keras `Rescaling`/`Normalization` layer, a TFLite
model's `x * (1/127.5) - 1`, a Caffe model's BatchNorm on the image, OpenCV's res10 face
detector's `data_bn`): per-channel Mul/Div/Add/Sub by constants and batch norms right after the input are
taken out of the graph into graph.meta["input_affine"] = (scale[C], offset[C]) -- the graph input
becomes their result, and the compiler folds the affine map into the pixel mapping the KPU's
first conv applies (exact: the same function of the pixels, and the KPU pads with the pixel value
whose preprocessed value is 0, as the graph's zero padding after the preprocessing does)."""
import numpy as np

from .fold_affine import affine_of


def _per_channel(g, name, c):
    v = g.const(name)
    if v is None or not np.issubdtype(v.dtype, np.floating) or v.ndim > 4:
        return None
    full = v.reshape((1,) * (4 - v.ndim) + v.shape)
    if full.shape[0] != 1 or full.shape[2:] != (1, 1) or full.shape[1] not in (1, c):
        return None
    return np.broadcast_to(full.reshape(-1), (c,)).astype(np.float64)


def input_affine(g, log):
    if len(g.inputs) != 1:
        return g
    x = g.inputs[0]
    shape = g.shape(x)
    if len(shape or ()) != 4 or shape[1] not in (1, 3):
        return g
    c = shape[1]
    scale, offset = np.ones(c), np.zeros(c)
    if "input_affine" in g.meta:
        scale, offset = (np.asarray(v, np.float64) for v in g.meta["input_affine"])
    changed = True
    while changed:
        changed = False
        users = g.consumers(x)
        if len(users) != 1 or x in g.outputs:
            break
        n = users[0]
        if n.op not in ("Mul", "Div", "Add", "Sub", "BatchNormalization") or n.outputs[0] in g.outputs:
            break
        if n.op == "BatchNormalization":
            bn = affine_of(g, n)
            if bn is None or len(bn[1]) not in (1, c):
                break
            scale, offset = scale * bn[1], offset * bn[1] + bn[2]
            _drop(g, n, x, log)
            changed = True
            continue
        k, other = (1, n.inputs[1]) if n.inputs[0] == x else (0, n.inputs[0])
        v = _per_channel(g, other, c)
        if v is None or (n.op == "Div" and k == 0):
            break
        if n.op == "Mul":
            scale, offset = scale * v, offset * v
        elif n.op == "Div":
            scale, offset = scale / v, offset / v
        elif n.op == "Add":
            offset = offset + v
        elif k == 1:           # x - v
            offset = offset - v
        else:                  # v - x
            scale, offset = -scale, v - offset
        _drop(g, n, x, log)
        changed = True
    if not np.array_equal(scale, np.ones(c)) or not np.array_equal(offset, np.zeros(c)):
        g.meta["input_affine"] = (scale.tolist(), offset.tolist())
    return g


def _drop(g, n, x, log):
    g.nodes.remove(n)
    g.replace_uses(n.outputs[0], x)
    log(n.name, f"{n.op} by constants on input {x} folded into the input preprocessing")

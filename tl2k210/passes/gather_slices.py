"""Gather with constant indices on a data tensor (a channel pick or reorder, TF's tf.gather on
feature maps, ONNX exports of `x[:, [2, 0, 1]]`) -> the Slices of its runs of consecutive
indices, concatenated along the axis: the same values, in ops the back-end lowers. A scalar
index also drops its axis (Squeeze). On a leading axis of a tensor of more than 4 dims (the
runtime's shapes are 4-D) the picks are rows of its 2-D view, reshaped back."""
import numpy as np

from tl2k210.graph import Node


def _runs(idx):
    """[(start, stop)] of consecutive ascending indices, in order."""
    runs = []
    for i in idx:
        if runs and runs[-1][1] == i:
            runs[-1][1] = i + 1
        else:
            runs.append([i, i + 1])
    return runs


def gather_slices(g, log):
    for n in [n for n in g.nodes if n.op == "Gather"]:
        idx, shape = g.const(n.inputs[1]), g.shape(n.inputs[0])
        if idx is None or shape is None or g.const(n.inputs[0]) is not None or idx.ndim > 1 or idx.size == 0:
            continue
        axis = n.attrs.get("axis", 0) % len(shape)
        flat = [int(i) % shape[axis] for i in idx.reshape(-1)]
        runs, out = _runs(flat), n.outputs[0]
        new, parts, src = [], [], n.inputs[0]
        rows = len(shape) > 4 and int(np.prod(shape[:axis])) == 1
        if rows:    # a leading axis of a 5-D+ tensor (ShuffleNetV2's x.reshape(2, -1, c/2, h, w)[0]):
            src = g.add_tensor(f"{n.name}/rows")      # contiguous rows of a 2-D view, in 4-D shapes
            new.append(Node("Reshape", [n.inputs[0], g.add_const(np.array([shape[axis], -1], np.int64), f"{n.name}/rows_shape")],
                            [src], {}, f"{n.name}/rows", [n.name]))
        for k, (a, b) in enumerate(runs):
            part = out if len(runs) == 1 and idx.ndim == 1 and not rows else g.add_tensor(f"{out}/run{k}")
            consts = [g.add_const(np.array([v], np.int64), f"{n.name}/{what}{k}")
                      for what, v in (("start", a), ("end", b), ("axis", 0 if rows else axis))]
            new.append(Node("Slice", [src] + consts, [part], {}, f"{n.name}/slice{k}", [n.name]))
            parts.append(part)
        if len(parts) > 1:
            cat = out if idx.ndim == 1 and not rows else g.add_tensor(f"{out}/concat")
            new.append(Node("Concat", parts, [cat], {"axis": 0 if rows else axis}, f"{n.name}/concat", [n.name]))
            parts = [cat]
        if rows:
            dims = list(shape[:axis]) + ([len(flat)] if idx.ndim == 1 else []) + list(shape[axis + 1:])
            new.append(Node("Reshape", [parts[0], g.add_const(np.array(dims, np.int64), f"{n.name}/shape")], [out], {},
                            f"{n.name}/reshape", [n.name]))
        elif idx.ndim == 0:
            new.append(Node("Squeeze", [parts[0], g.add_const(np.array([axis], np.int64), f"{n.name}/axes")],
                            [out], {}, f"{n.name}/squeeze", [n.name]))
        i = g.nodes.index(n)
        g.nodes[i:i + 1] = new
        log(n.name, f"Gather of constant indices {flat[:8]}{'...' if len(flat) > 8 else ''} on axis {axis} "
                    f"-> {len(runs)} Slice(s)" + (" + Concat" if len(runs) > 1 else ""))
    return g

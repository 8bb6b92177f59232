"""Pure data-movement chains (Transpose/Reshape/Unsqueeze/Squeeze/Tile/Flatten) recognised by an
index probe: push np.arange through the chain and look at where every element went.

upsample_to_resize: a chain X -> Y that is the identity is removed; one that is a nearest
  upsampling by integer factors (the Keras 3 UpSampling2D form Unsqueeze/Tile/Reshape, with
  tf2onnx's transposes around it) becomes one Resize(nearest).
normalize_flatten: a chain X(1,C,H,W) -> Y(1,C*H*W) feeding MatMul/Gemm with constant weights (the
  Keras NHWC Flatten: Transpose + Reshape) becomes Flatten(X) with the weight rows permuted.
"""
import numpy as np

from tl2k210.graph import axes_of

MOVES = ("Transpose", "Reshape", "Unsqueeze", "Squeeze", "Tile", "Flatten", "Identity")


def relaid_const(g, name, perm):
    """Constant operand `name` as the 4-D array it broadcasts as, transposed by `perm`: what
    broadcasts the same against the tensor transposed by `perm`. None if it is no constant or
    has more than 4 axes."""
    v = g.const(name)
    if v is None or v.ndim > 4:
        return None
    return np.transpose(v.reshape((1,) * (4 - v.ndim) + v.shape), perm)


def _apply(g, n, x):
    op = n.op
    if op == "Transpose":
        return np.transpose(x, n.attrs.get("perm"))
    if op == "Reshape":
        shape = [int(s) for s in g.const(n.inputs[1])]
        shape = [x.shape[i] if s == 0 and not n.attrs.get("allowzero") else s for i, s in enumerate(shape)]
        return x.reshape(shape)
    if op == "Unsqueeze":
        return np.expand_dims(x, tuple(a % (x.ndim + len(axes_of(g, n))) for a in axes_of(g, n)))
    if op == "Squeeze":
        ax = axes_of(g, n)
        return np.squeeze(x, None if ax is None else tuple(ax))
    if op == "Tile":
        return np.tile(x, [int(r) for r in g.const(n.inputs[1])])
    if op == "Flatten":
        a = n.attrs.get("axis", 1)
        return x.reshape(int(np.prod(x.shape[:a])), -1)
    return x


def _movable(g, n):
    return n.op in MOVES and all(g.const(i) is not None for i in n.inputs[1:] if i)


def chains(g):
    """Yield (chain_nodes, probe_in, probe_outs) for maximal single-consumer movement chains."""
    for start in list(g.nodes):
        if not _movable(g, start) or g.tensors[start.inputs[0]].shape is None:
            continue
        p = g.producer(start.inputs[0])
        if p is not None and _movable(g, p) and g.single_consumer(start.inputs[0]) is start:
            continue  # not the start of a chain
        x = np.arange(int(np.prod(g.shape(start.inputs[0])))).reshape(g.shape(start.inputs[0]))
        chain, outs, y, n = [], [], x, start
        while n is not None and _movable(g, n):
            y = _apply(g, n, y)
            chain.append(n)
            outs.append(y)
            n = g.single_consumer(n.outputs[0])
        yield chain, x, outs


def _replace(g, chain, new_nodes):
    for n in chain:
        g.nodes.remove(n)
    g.nodes.extend(new_nodes)


def upsample_to_resize(g, log):
    for chain, x, outs in list(chains(g)):
        if any(n not in g.nodes for n in chain):
            continue
        for k in range(len(chain), 0, -1):  # longest recognised prefix
            y, last, src = outs[k - 1], chain[k - 1], chain[0].inputs[0]
            names = [n.name for n in chain[:k]]
            if y.shape == x.shape and np.array_equal(y, x):
                _replace(g, chain[:k], [])
                g.replace_uses(last.outputs[0], src)
                log(last.name, f"removed identity data-movement chain {names}")
                break
            up = _nearest_factor(x, y)
            if up:
                from tl2k210.graph import Node
                scales = g.add_const(np.array([1, 1, *up], np.float32), last.name + "/scales")
                node = Node("Resize", [src, "", scales], [last.outputs[0]],
                            {"mode": "nearest", "coordinate_transformation_mode": "asymmetric",
                             "nearest_mode": "floor"}, last.name + "/resize", names)
                _replace(g, chain[:k], [node])
                log(node.name, f"nearest upsampling x{up} from {names}")
                break
    return g


def _nearest_factor(x, y):
    if x.ndim != 4 or y.ndim != 4 or y.shape[:2] != x.shape[:2]:
        return None
    sh, sw = y.shape[2] // x.shape[2], y.shape[3] // x.shape[3]
    if (sh, sw) == (1, 1) or y.shape[2:] != (x.shape[2] * sh, x.shape[3] * sw):
        return None
    return (sh, sw) if np.array_equal(x.repeat(sh, 2).repeat(sw, 3), y) else None


def normalize_flatten(g, log):
    from tl2k210.graph import Node
    for chain, x, outs in list(chains(g)):
        y, last = outs[-1], chain[-1]
        if x.ndim != 4 or y.ndim != 2 or y.shape[0] != 1 or y.size != x.size:
            continue
        if np.array_equal(y.ravel(), x.ravel()) and len(chain) == 1 and last.op == "Flatten":
            continue
        users = g.consumers(last.outputs[0])
        ok = all(u.op in ("MatMul", "Gemm") and u.inputs[0] == last.outputs[0] and g.const(u.inputs[1]) is not None
                 and not (u.op == "Gemm" and u.attrs.get("transA")) for u in users) and last.outputs[0] not in g.outputs
        if not ok or not users:
            continue
        perm = y.ravel()  # Y[k] = Xflat[perm[k]]
        for u in users:
            w = g.const(u.inputs[1])
            tb = u.op == "Gemm" and u.attrs.get("transB")
            w2 = np.empty_like(w)
            if tb:
                w2[:, perm] = w
            else:
                w2[perm] = w
            u.inputs[1] = g.add_const(w2, u.inputs[1] + "/flatten_order")
        node = Node("Flatten", [chain[0].inputs[0]], [last.outputs[0]], {"axis": 1}, last.name + "/flatten",
                    [n.name for n in chain])
        _replace(g, chain, [node])
        log(node.name, f"{[n.op for n in chain]} -> Flatten, permuted the rows of {len(users)} weight(s)")
    return g

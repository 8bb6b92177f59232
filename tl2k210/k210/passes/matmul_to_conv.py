"""MatMul/Gemm with constant weights on a (1, K) input (+ a constant bias Add) -> Reshape to
(1, K, 1, 1), 1x1 Conv, Reshape back to (1, N). The backend pads the 1x1 map to 4x4 for the KPU.
Only where the KPU limits allow it (K, N <= 1024); larger ones stay Gemm/MatMul for the CPU."""
import numpy as np

from tl2k210.graph import Node, dense_weights
from tl2k210.k210 import hardware as hw

from tl2k210.passes.fuse_activation import activation_of

MAX_CHANNELS = hw.LIMITS["channels"][1]


def matmul_to_conv(g, log):
    for n in [n for n in g.nodes if n.op in ("MatMul", "Gemm")]:
        x = g.tensors[n.inputs[0]]
        wb = dense_weights(g, n)
        if wb is None or x.shape is None or len(x.shape) != 2 or x.shape[0] != 1:
            continue
        w, b = wb
        (nout, k), fused, out = w.shape, [n.name], n.outputs[0]
        add = g.single_consumer(out)
        if add is not None and add.op == "Add" and n.op == "MatMul":
            c = g.const(add.inputs[1] if add.inputs[0] == out else add.inputs[0])
            if c is not None and c.size == nout and c.shape[-1] == nout:
                b = b + c.reshape(-1).astype(np.float32)
                g.nodes.remove(add)
                g.replace_uses(add.outputs[0], out)
                fused.append(add.name)
                out = n.outputs[0]  # took over the Add's name if that was a graph output
        if k > MAX_CHANNELS or nout > MAX_CHANNELS:
            if len(fused) > 1:   # the bias in the dense layer (wide_channels splits it), not a layer of its own
                g.nodes[g.nodes.index(n)] = Node("Gemm", [n.inputs[0], g.add_const(w.T.copy(), n.name + "/W"),
                                                          g.add_const(b, n.name + "/B")], [out], {}, n.name, fused)
            log(n.name, f"kept {'+'.join(fused)} {k}->{nout}: over the KPU's {MAX_CHANNELS} channels")
            continue
        r4 = g.add_tensor(n.name + "/nchw", (1, k, 1, 1))
        co = g.add_tensor(n.name + "/conv", (1, nout, 1, 1))
        conv = Node("Conv", [r4, g.add_const(w.reshape(nout, k, 1, 1).astype(np.float32), n.name + "/W"),
                             g.add_const(b.astype(np.float32), n.name + "/B")], [co],
                    {"kernel": (1, 1), "strides": (1, 1), "pads": [0, 0, 0, 0], "group": 1, "dilations": (1, 1)},
                    n.name, fused)
        act = g.single_consumer(out)
        if act is not None and activation_of(g, act) is not None:  # keep Dense+activation together
            act_out, act.inputs[0] = act.outputs[0], co
            co = act.outputs[0] = g.add_tensor(n.name + "/act", (1, nout, 1, 1))
            out = act_out
        i = g.nodes.index(n)
        g.nodes[i:i + 1] = [
            Node("Reshape", [n.inputs[0], g.add_const(np.array([1, k, 1, 1], np.int64), n.name + "/shape4")], [r4],
                 {}, n.name + "/to_nchw"),
            conv,
            Node("Reshape", [co, g.add_const(np.array([1, nout], np.int64), n.name + "/shape2")], [out], {},
                 n.name + "/to_2d")]
        log(n.name, f"{'+'.join(fused)} ({k}->{nout}) -> 1x1 Conv on a {k}x1x1 map")
    return g


def covers_map(g, n) -> bool:
    """Is `n` a Conv with constant weights whose kernel covers its unpadded input exactly (one
    group, no dilation): a dense layer on the flattened map?"""
    if n.op != "Conv" or len(n.inputs) < 2 or g.const(n.inputs[1]) is None:
        return False
    a, xs = n.attrs, g.shape(n.inputs[0])
    return (xs is not None and len(xs) == 4 and tuple(a.get("kernel", ())) == tuple(xs[2:])
            and not any(a.get("pads", (0,) * 4)) and a.get("group", 1) == 1
            and tuple(a.get("dilations", (1, 1))) == (1, 1))


def conv_as_dense(g, log):
    """A Conv whose kernel covers its unpadded input exactly (a 2x2 VALID conv on a 2x2 map, a
    7x7 on a 7x7 head) is a dense layer on the flattened map: NCHW flattening is (C, kh, kw)
    order, the weights' own. -> Reshape to (1, C*H*W, 1, 1) + 1x1 Conv on the (Co, C*kh*kw)
    weights: one uint8 weight per tap on the KPU, where the conv as it was becomes a padded 3x3
    or K x K form storing the kernel several times. Only while C*H*W fits the KPU's channels."""
    for n in list(g.nodes):
        xs = g.shape(n.inputs[0]) if n.inputs else None
        if not covers_map(g, n) or xs[2] * xs[3] == 1:
            continue
        k = xs[1] * xs[2] * xs[3]
        if k > MAX_CHANNELS:
            continue
        w = np.asarray(g.const(n.inputs[1]))
        flat = g.add_tensor(n.name + "/flat", (1, k, 1, 1))
        i = g.nodes.index(n)
        g.nodes.insert(i, Node("Reshape", [n.inputs[0], g.add_const(np.array([1, k, 1, 1], np.int64),
                                                                     n.name + "/shape_flat")], [flat], {},
                               n.name + "/flatten"))
        n.inputs[0], n.inputs[1] = flat, g.add_const(w.reshape(w.shape[0], k, 1, 1), n.name + "/W_dense")
        n.attrs["kernel"], n.attrs["strides"] = (1, 1), (1, 1)
        log(n.name, f"{xs[2]}x{xs[3]} kernel on a {xs[1]}x{xs[2]}x{xs[3]} map -> dense ({k}->{w.shape[0]}): "
                    "Reshape + 1x1 Conv")
    return g

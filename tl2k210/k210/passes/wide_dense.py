"""A dense layer on more inputs than the KPU's 1024 channels as one 3x3 KPU conv on a 3x3 map.

A Keras CNN's Flatten -> Dense on a 16x16x16 map has 4,096 inputs; PFLD's 7x7 conv on a 7x7x32 map
(a dense layer: the kernel covers the map) has 1,568. matmul_to_conv and conv_as_dense leave them:
the first ran as a float FULLY_CONNECTED (4 bytes a weight), the second as K x K shift stages
(lower/kxk.py: the 7x7 kernel stored as a 9x9 one, 1.65x its weights). A 3x3 conv on a 3x3 map,
unpadded, has one output pixel, which sums all 9 taps of every channel: the dense layer's K inputs
laid out as ceil(K / 9) channels of 3x3 (NCHW order, a Reshape of the flat vector; up to 8
trailing zeros, a Pad) and its (N, K) weights the same way are that conv, exactly, one uint8 byte
a weight (+ the zero weights of the padding), up to 9 x 1024 = 9,216 inputs:

    x -> Reshape (1, K, 1, 1) [-> Pad channels to 9C] -> Reshape (1, C, 3, 3) -> Conv 3x3 -> (1, N, 1, 1)

The KPU runs the 3x3 map grown to 4x4 (lower/conv.small_map_refuses), and the CPU keeps the one
pixel. One sum of all K products, where wide_channels' split (a 1x1 conv per slice of a Concat,
for more than 9,216 inputs) adds partial sums rounded to uint8. A dense layer on the model's float
input or a float dense layer's output keeps its float form (lower/fc.py); one followed by a curved
activation (Swish, Sigmoid, Tanh), which the KPU would fit with 16 line segments, keeps kmodel v4's
quantized_matmul and a 256-entry table of it.
"""
import numpy as np

from tl2k210.graph import Node, dense_weights, through_relabels
from tl2k210.k210 import hardware as hw
from tl2k210.passes.fuse_activation import activation_of

from .matmul_to_conv import covers_map

MAX = hw.LIMITS["channels"][1]
TAPS = 9        # a 3x3 kernel
LINEAR_PIECES = ("Relu", "Clip", "LeakyRelu", "HardSigmoid")     # the KPU's segments are exact for these


def _covering(g, n):
    """(W (N, K), bias (N,)) of a Conv whose kernel covers its unpadded input exactly, else None."""
    if not covers_map(g, n) or n.attrs.get("activation") or n.attrs.get("pool"):
        return None
    w = g.const(n.inputs[1])
    b = g.const(n.inputs[2]) if len(n.inputs) > 2 and n.inputs[2] else np.zeros(w.shape[0], np.float32)
    return (None if b is None else
            (np.asarray(w, np.float32).reshape(w.shape[0], -1), np.asarray(b, np.float32).reshape(-1)))


def _float_source(g, t) -> bool:
    """Is t, through relabels, the model input or a float dense layer's output?"""
    p, _ = through_relabels(g, t)
    return p is None or p.op in ("Gemm", "MatMul")


def _curved_after(g, n) -> bool:
    """Is dense node `n` followed by an activation that is not a few straight pieces?"""
    nxt = g.single_consumer(n.outputs[0])
    act = activation_of(g, nxt) if nxt is not None else None
    return any(c.op == "Sigmoid" for c in g.consumers(n.outputs[0])) or \
        act is not None and act["op"] not in LINEAR_PIECES


def _dense(g, n):
    """(W (N, K), bias (N,)) of a dense node over K > MAX inputs that this pass takes, else None."""
    if n.op in ("Gemm", "MatMul"):
        xs = g.shape(n.inputs[0])
        wb = dense_weights(g, n) if xs is not None and len(xs) == 2 and xs[0] == 1 else None
    elif n.op == "Conv":
        wb = _covering(g, n)
    else:
        return None
    if wb is None or not MAX < wb[0].shape[1] <= TAPS * MAX or wb[0].shape[0] > MAX \
            or _float_source(g, n.inputs[0]) or _curved_after(g, n):
        return None
    return wb


def wide_dense(g, log, float_fc=False):
    """`float_fc` (--float-fc): every dense layer stays float, these too."""
    if float_fc:
        return g
    for n in [n for n in g.nodes if n.op in ("Gemm", "MatMul", "Conv")]:
        wb = _dense(g, n)
        if wb is None:
            continue
        w, b = wb
        (nout, k), c = w.shape, -(-w.shape[1] // TAPS)
        pad = TAPS * c - k
        flat = g.add_tensor(n.name + "/flat", (1, k, 1, 1))
        nodes = [Node("Reshape", [n.inputs[0], g.add_const(np.array([1, k, 1, 1], np.int64), n.name + "/shape_flat")],
                      [flat], {}, n.name + "/flatten")]
        if pad:
            padded = g.add_tensor(n.name + "/padded", (1, TAPS * c, 1, 1))
            nodes.append(Node("Pad", [flat, g.add_const(np.array([0, 0, 0, 0, 0, pad, 0, 0], np.int64),
                                                        n.name + "/pads")], [padded], {"mode": "constant"},
                              n.name + "/pad"))
            flat = padded
        taps = g.add_tensor(n.name + "/taps", (1, c, 3, 3))
        nodes.append(Node("Reshape", [flat, g.add_const(np.array([1, c, 3, 3], np.int64), n.name + "/shape_taps")],
                          [taps], {}, n.name + "/taps"))
        w9 = np.concatenate([w, np.zeros((nout, pad), np.float32)], axis=1).reshape(nout, c, 3, 3)
        out = n.outputs[0]
        y = out if len(g.shape(out)) == 4 else g.add_tensor(n.name + "/conv", (1, nout, 1, 1))
        nodes.append(Node("Conv", [taps, g.add_const(w9, n.name + "/W_taps"), g.add_const(b, n.name + "/B_taps")],
                          [y], {"kernel": (3, 3), "strides": (1, 1), "pads": [0, 0, 0, 0], "group": 1,
                                "dilations": (1, 1)}, n.name, list(n.fused)))
        if y != out:
            nodes.append(Node("Reshape", [y, g.add_const(np.array(g.shape(out), np.int64), n.name + "/shape_out")],
                              [out], {}, n.name + "/to_2d"))
        i = g.nodes.index(n)
        g.nodes[i:i + 1] = nodes
        log(n.name, f"dense layer on {k} inputs (over the KPU's {MAX} channels) -> 3x3 conv on a {c}x3x3 map"
                    + (f" ({pad} zero inputs padded)" if pad else ""))
    return g

"""TF front-ends give NHWC inputs that reach the NCHW graph through Transpose(0,3,1,2), a Reshape
doing the same (one-channel inputs: tf2onnx writes (1,H,W,1) -> (1,1,H,W)), or only after
layout-agnostic ops (a ZeroPadding2D `Pad`, a Rescaling `Mul`/`Add`, an activation): make the
graph input NCHW. Those ops are moved below the layout change (their pads / constants permuted),
so the input is recorded in graph.meta["input_layout"] = {name: "NHWC->NCHW"}.

An input of rank < 4 -- a batch of one (an MLPerf keyword spotter's (1, 490) MFCCs, reshaped to
(1, 1, 49, 10)), or --input-shape sized without a batch axis (graph.meta["unbatched"]: (T, F)
frames, given one) -- that reaches the graph through one chain of relabels ending at a 4-D
(1, C, H, W) map its first convs read becomes that map: its bytes are the same, and the first
layer reads the input (kmodel v3 can start with it). graph.meta["relabelled"] keeps the shape it
had, in which calibration arrays may come.

A TF model's NHWC input that no layout change reads (a Flatten + Dense first layer) still becomes
the planar (1, C, H, W) image the camera gives, followed by a Transpose back to NHWC that later
passes fold (into the Dense weights) or lower as a relabel (one channel).
"""
import numpy as np

from tl2k210.graph import RELABELS, Node

from .layout import relaid_const

TO_NCHW = (0, 3, 1, 2)
UNARY = {"Relu", "Clip", "LeakyRelu", "Sigmoid", "Tanh", "HardSigmoid", "HardSwish", "Identity", "Neg", "Abs"}
BINARY = {"Add", "Sub", "Mul", "Div"}


def to_nchw(g, node, shape):
    """Is `node` a layout change NHWC `shape` -> NCHW (Transpose, or a Reshape that moves the
    elements the same way)?"""
    if node.op == "Transpose":
        return tuple(node.attrs.get("perm", ())) == TO_NCHW
    # (a 5-D reader is no image's: tf2onnx writes a 1-channel change as Unsqueeze to 5-D + Reshape)
    if node.op == "Reshape" and len(node.inputs) > 1 and g.const(node.inputs[1]) is not None \
            and len(shape or ()) == 4:
        new = [int(v) for v in g.const(node.inputs[1])]
        x = np.arange(int(np.prod(shape))).reshape(shape)
        try:
            y = x.reshape([x.shape[i] if v == 0 else v for i, v in enumerate(new)])
        except ValueError:
            return False
        return y.shape == x.transpose(TO_NCHW).shape and np.array_equal(y, x.transpose(TO_NCHW))
    return False


def _pull_up(g, x, log, nhwc=False):
    """Move one layout-agnostic consumer of the NHWC tensor `x` below the layout change that all
    its own consumers do; where the input is known to be NHWC (`nhwc`, input_layout), below any
    Transposes its consumers are (each left as the rest of its perm after the layout change).
    Returns True if the graph changed."""
    shape = g.shape(x)
    for n in g.consumers(x):
        if n.inputs[0] != x or x in g.outputs or n.outputs[0] in g.outputs:
            continue
        users = g.consumers(n.outputs[0])
        # each reader: a layout change to drop, or (a known-NHWC input) a Transpose to keep as its
        # perm's rest; decided on the shape it reads, before anything changes
        changes = [to_nchw(g, u, g.shape(n.outputs[0]) or shape) for u in users]
        if not users or not all(c or nhwc and _rest_of(u) for c, u in zip(changes, users)):
            continue
        if n.op in UNARY:
            inputs = list(n.inputs)
        elif n.op in BINARY and (v := relaid_const(g, n.inputs[1], TO_NCHW)) is not None:
            inputs = [n.inputs[0], g.add_const(v, n.inputs[1] + "/nchw")]
        elif n.op == "Pad" and len(n.inputs) > 1 and g.const(n.inputs[1]) is not None and \
                not (len(n.inputs) > 3 and n.inputs[3]) and len(g.const(n.inputs[1])) == 8:
            p = [int(v) for v in g.const(n.inputs[1])]
            p = [p[i] for i in (0, 3, 1, 2, 4, 7, 5, 6)]
            inputs = [n.inputs[0], g.add_const(np.array(p, np.int64), n.inputs[1] + "/nchw")] + n.inputs[2:]
        else:
            continue
        nchw = g.add_tensor(x + "/nchw", tuple(shape[i] for i in TO_NCHW), g.tensors[x].dtype)
        g.nodes.insert(g.nodes.index(n), Node("Transpose", [x], [nchw], {"perm": list(TO_NCHW)},
                                              g.unique(n.name + "/to_nchw")))
        n.inputs = [nchw] + inputs[1:]
        out = n.outputs[0]
        t = g.tensors[out]
        if t.shape is not None and len(t.shape) == 4:
            t.shape = tuple(t.shape[i] for i in TO_NCHW)
        for c, u in zip(changes, users):
            if c:
                g.nodes.remove(u)
                g.replace_uses(u.outputs[0], out)
            else:
                u.attrs["perm"] = _rest_of(u)
        log(n.name, f"{n.op} moved below the NHWC->NCHW layout change of input {x}")
        return True
    return False


def _rest_of(u):
    """For a 4-D Transpose `u` of an NHWC tensor: the perm Q that does the same on its NCHW
    layout (perm = TO_NCHW then Q; TF's SpaceToBatch, NHWC -> CNHW, is NCHW then (1, 0, 2, 3)),
    else None."""
    perm = list(u.attrs.get("perm", ())) if u.op == "Transpose" else []
    return [TO_NCHW.index(p) for p in perm] if sorted(perm) == [0, 1, 2, 3] else None


def _pull_region(g, x, log, nhwc=False):
    """One _pull_up anywhere in the layout-agnostic region below `x` (deepest ops move first)."""
    frontier, seen = [x], set()
    while frontier:
        t = frontier.pop()
        if t in seen or len(g.shape(t) or ()) != 4:
            continue
        seen.add(t)
        if _pull_up(g, t, log, nhwc):
            return True
        frontier += [c.outputs[0] for c in g.consumers(t) if c.inputs[0] == t and c.op in UNARY | BINARY | {"Pad"}]
    return False


def _relabelled_to_4d(g, x, log):
    """Input `x` of rank < 4 read only through one chain of relabels ending at a 4-D map with a
    batch of one that convs read (or a layout change to NCHW): make `x` that map, drop the chain."""
    chain, cur = [], x
    while len(g.shape(cur) or ()) != 4:
        cs = g.consumers(cur)
        if cur in g.outputs or len(cs) != 1 or cs[0].op not in RELABELS or cs[0].inputs[0] != cur:
            return
        chain.append(cs[0])
        cur = cs[0].outputs[0]
    shape = g.shape(cur)
    readers = g.consumers(cur)
    if not chain or cur in g.outputs or shape[0] != 1 or not readers or not all(
            (r.op == "Conv" and r.inputs[0] == cur) or to_nchw(g, r, shape) for r in readers):
        return          # a map no conv reads as an image (a transformer's heads): the input stays
    was = g.shape(x)
    for n in chain:
        g.nodes.remove(n)
    g.replace_uses(cur, x)
    g.tensors[x].shape = tuple(shape)
    g.meta.setdefault("relabelled", {})[x] = tuple(was)
    log(x, f"input {x} {tuple(was)} is now {tuple(shape)} (removed {'/'.join(n.op for n in chain)}: the same bytes)")


def input_nchw(g, log):
    for x in g.inputs:
        shape = g.shape(x) or ()
        if 0 < len(shape) < 4 and (x in g.meta.get("unbatched", ()) or len(shape) > 1 and shape[0] == 1):
            _relabelled_to_4d(g, x, log)
        t = g.tensors[x]
        if len(t.shape or ()) != 4 or x in g.outputs:
            continue
        nhwc = input_layout(g, x) == "NHWC"
        while _pull_region(g, x, log, nhwc):
            pass
        cs = g.consumers(x)
        n, h, w, c = t.shape
        if cs and all(to_nchw(g, u, t.shape) for u in cs):
            for tr in cs:
                g.nodes.remove(tr)
                g.replace_uses(tr.outputs[0], x)
            what = f"removed {len(cs)} {'/'.join({u.op for u in cs})}"
        elif cs and g.meta.get("producer") == "tf2onnx" and input_layout(g, x) == "NHWC":
            nhwc = g.add_tensor(x + "/nhwc", t.shape, t.dtype)
            g.replace_uses(x, nhwc)
            g.nodes.insert(0, Node("Transpose", [x], [nhwc], {"perm": [0, 2, 3, 1]}, g.unique(x + "/to_nhwc")))
            what = "a Transpose to NHWC below it for the layers that read NHWC"
        else:
            continue
        t.shape = (n, c, h, w)
        g.meta.setdefault("input_layout", {})[x] = "NHWC->NCHW"
        log(x, f"input {x} is now NCHW {t.shape} (was NHWC; {what})")
    return g


def input_chw(g):
    """(C, H, W) of the graph's first input read as an image, in the layout the graph gives it
    (input_layout); None for an input that is not 4-D."""
    layout, shape = input_layout(g), g.shape(g.inputs[0])
    if layout is None:
        return None
    return tuple(shape[1:]) if layout == "NCHW" else (shape[3], shape[1], shape[2])


def input_layout(g, x=None):
    """"NCHW" or "NHWC": how the graph reads its 4-D input `x` (default: the first), decided from
    the graph -- an input input_nchw made NCHW is NCHW, a layout change to NCHW below it means
    NHWC, a Conv reading it (through layout-agnostic ops) means NCHW; a graph with neither: a
    PyTorch export is NCHW, else the one of axes 1 and 3 that can be an image's channels (1/3/4
    of them, the other not) decides -- a TFLite file onnx-tf made keeps its NCHW input -- else
    the producer's convention (TensorFlow/TFLite through tf2onnx NHWC). None for inputs that
    are not 4-D."""
    x = x or g.inputs[0]
    shape = g.shape(x)
    if len(shape or ()) != 4:
        return None
    if x in g.meta.get("input_layout", {}):
        return "NCHW"
    frontier, seen = [x], set()
    while frontier:
        t = frontier.pop()
        if t in seen:
            continue
        seen.add(t)
        for c in g.consumers(t):
            if to_nchw(g, c, g.shape(t) or shape):
                return "NHWC"
            if c.op in ("Conv", "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "BatchNormalization") \
                    and c.inputs[0] == t:
                return "NCHW"
            if c.op in UNARY | BINARY | {"Pad"} and c.inputs[0] == t:
                frontier.append(c.outputs[0])
    if g.meta.get("producer") == "pytorch":     # torch.onnx.export: NCHW by convention
        return "NCHW"
    image = [a for a in (1, 3) if shape[a] in (1, 3, 4) and shape[4 - a] not in (1, 3, 4)]
    if image:       # one axis only can be an image's channels: a TFLite file onnx-tf made keeps NCHW
        return "NCHW" if image == [1] else "NHWC"
    return "NHWC" if g.meta.get("producer") == "tf2onnx" else "NCHW"    # TensorFlow, Keras, TFLite: channels-last

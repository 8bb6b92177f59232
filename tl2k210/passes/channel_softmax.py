"""A two-class softmax over the channels of a conv's output map (detector score heads: LFFD,
ULFFD, RetinaFace...), as TF writes it -- exp(x - max(x)) / sum(exp(x - max(x))), ReduceMax / Sub /
Exp / ReduceSum / Div, with tf2onnx's transposes before the Div -- or as one Softmax node, becomes
the conv itself with a sigmoid: softmax(a, b) = (sigmoid(a - b), sigmoid(b - a)), so the conv gets
weights (W0 - W1, W1 - W0), bias (b0 - b1, b1 - b0) and a Sigmoid activation. Exact in float; one
KPU layer instead of five CPU ops the v3 format does not have. The same for the score heads of
SSD-style detectors (ULFD), Softmax(Concat(Reshape(Transpose(conv)))) over each anchor's two
classes, channels 2j and 2j + 1 of its head's conv: each conv gets the pairs' differences."""
import numpy as np

from tl2k210.graph import Node, axes_of

from .layout import MOVES, _apply


def _axis(g, n):
    """The one axis `n` reduces over, or None (several, or an input of unknown rank: a loop's)."""
    ax, shape = axes_of(g, n), g.shape(n.inputs[0])
    return None if ax is None or len(ax) != 1 or shape is None else ax[0] % len(shape)


def _moved(g, t):
    """(source tensor, movement nodes) following `t` back through data movement with constant operands."""
    chain = []
    while True:
        p = g.producer(t)
        if p is None or p.op not in MOVES or any(g.const(i) is None for i in p.inputs[1:] if i):
            return t, chain[::-1]
        chain.append(p)
        t = p.inputs[0]


def _decomposed(g, div):
    """Match Div(T(exp), R(sum)) of the TF softmax; returns (x, axis, exp node, T nodes) or None."""
    if div.op != "Div":
        return None
    e_t, t_chain = _moved(g, div.inputs[0])
    s_t, r_chain = _moved(g, div.inputs[1])
    e, s = g.producer(e_t), g.producer(s_t)
    if e is None or s is None or e.op != "Exp" or s.op != "ReduceSum" or s.inputs[0] != e_t:
        return None
    axis = _axis(g, s)
    if axis is None or not s.attrs.get("keepdims", 1):
        return None
    sub = g.producer(e.inputs[0])
    x, pattern = e.inputs[0], [e]
    if sub is not None and sub.op == "Sub":
        mx = g.producer(sub.inputs[1])
        if mx is not None and mx.op == "ReduceMax" and mx.inputs[0] == sub.inputs[0] and _axis(g, mx) == axis:
            x, pattern = sub.inputs[0], [sub, mx]
    # the two movements must lay out the sum as the numerator's broadcast partner
    ss = g.shape(s_t)
    probe = np.arange(int(np.prod(ss))).reshape(ss)
    r, t = probe, np.broadcast_to(probe, g.shape(e_t))
    for n in r_chain:
        r = _apply(g, n, r)
    for n in t_chain:
        t = _apply(g, n, t)
    if r.ndim != t.ndim or not np.array_equal(np.broadcast_to(r, t.shape), t):
        return None
    return x, axis, pattern, t_chain


def _pairable(g, conv, x, readers):
    """Can `conv` (producing `x`, read only by `readers`) take a softmax over its channel pairs?"""
    return conv is not None and conv.op == "Conv" and not conv.attrs.get("activation") and \
        not conv.attrs.get("pool") and x not in g.outputs and all(c in readers for c in g.consumers(x)) and \
        g.const(conv.inputs[1]) is not None and len(conv.inputs) > 2 and g.const(conv.inputs[2]) is not None


def _pairs_into_conv(g, conv, log, name):
    """The softmax over each channel pair (2j, 2j + 1) of the conv's output, as the conv with the
    pairs' differences and a Sigmoid."""
    w, b = g.const(conv.inputs[1]), g.const(conv.inputs[2])
    d = np.kron(np.eye(w.shape[0] // 2, dtype=np.float32), np.array([[1, -1], [-1, 1]], np.float32))
    conv.inputs[1] = g.add_const(np.tensordot(d, w, 1).astype(np.float32), conv.inputs[1] + "/softmax2")
    conv.inputs[2] = g.add_const((d @ b).astype(np.float32), conv.inputs[2] + "/softmax2")
    conv.attrs["activation"] = {"op": "Sigmoid"}
    conv.fused.append(name)
    # a quantized model's range of the conv's logits is not that of their differences, which the
    # sigmoid now reads (a QDQ visual wake word's p(person) never went below 0.07: its table
    # spanned the logits' -2.6..2.6, the differences reach -11)
    g.meta.get("quant_ranges_by_node", {}).pop(conv.name, None)
    g.meta.get("quant_ranges", {}).pop(conv.outputs[0], None)
    log(conv.name, f"2-class {'channel ' if w.shape[0] == 2 else 'channel-pair '}softmax {name} -> sigmoid "
                   "of the class differences, in the conv")


def _fold_into_conv(g, x, axis, readers, log, name):
    """Give the conv producing `x` the softmax (if `readers` are x's only consumers)."""
    conv = g.producer(x)
    shape = g.shape(x)
    if len(shape) != 4 or axis != 1 or shape[1] != 2 or not _pairable(g, conv, x, readers):
        return False
    _pairs_into_conv(g, conv, log, name)
    return True


def _head(g, t):
    """The conv whose output `t` is, as Reshape(1, -1, 2) of its NHWC Transpose (a detector's
    score head: each anchor's two classes are channels 2j, 2j + 1), or None."""
    r = g.producer(t)
    tr = g.producer(r.inputs[0]) if r is not None and r.op == "Reshape" else None
    if tr is None or tr.op != "Transpose" or list(tr.attrs.get("perm", ())) != [0, 2, 3, 1] or \
            g.consumers(r.inputs[0]) != [r] or g.shape(t)[-1] != 2:
        return None
    conv = g.producer(tr.inputs[0])
    shape = g.shape(tr.inputs[0])
    if len(shape) != 4 or shape[1] % 2 or not _pairable(g, conv, tr.inputs[0], [tr]):
        return None
    return conv


def _concat_heads(g, sm):
    """A two-class Softmax over the last axis of score heads concatenated on another axis
    (Softmax(Concat(Reshape(Transpose(Conv)) ...)): ULFD, SSD): the heads' convs, or None.
    Each row's softmax reads only its own two values, so it runs in each head's conv."""
    x = sm.inputs[0]
    shape = g.shape(x)
    old = g.meta.get("opset", 13) < 13
    if not shape or len(shape) < 2 or shape[-1] != 2 or \
            sm.attrs.get("axis", 1 if old else -1) % len(shape) != len(shape) - 1:
        return None
    cat = g.producer(x)
    parts, reader = [x], sm
    if cat is not None and cat.op == "Concat" and cat.attrs.get("axis", 0) % len(shape) != len(shape) - 1:
        if x in g.outputs or g.consumers(x) != [sm]:
            return None
        parts, reader = cat.inputs, cat
    heads = [_head(g, t) for t in parts]
    if None in heads or any(g.consumers(t) != [reader] for t in parts):
        return None
    return heads


def _as_softmax(g, div, x, axis, log):
    """The written-out softmax no conv takes (TF MTCNN's class scores, (1, 2) after a dense layer:
    ReduceMax, Sub, Exp, ReduceSum, Div, which kmodel v3 has not, so the model went v4; hunt 22)
    as one Softmax node over `axis` (v3 SOFTMAX), where nothing else reads its steps."""
    e, s = g.producer(div.inputs[0]), g.producer(div.inputs[1])
    steps = [e, s]
    sub = g.producer(e.inputs[0])
    if sub is not None and sub.op == "Sub" and sub.inputs[0] == x:
        steps += [sub, g.producer(sub.inputs[1])]
    inside = {id(m) for m in steps} | {id(div)}
    if any(t in g.outputs or any(id(c) not in inside for c in g.consumers(t)) for m in steps for t in m.outputs):
        return
    for m in steps:
        g.nodes.remove(m)
    g.nodes[g.nodes.index(div)] = Node("Softmax", [x], list(div.outputs), {"axis": axis}, div.name,
                                        [m.name for m in steps] + [div.name])
    log(div.name, f"exp(x - max(x)) / sum(exp(...)) over axis {axis} -> Softmax")


def channel_softmax(g, log):
    for n in list(g.nodes):
        if n not in g.nodes:
            continue
        if n.op == "Softmax":
            x, axis = n.inputs[0], n.attrs.get("axis", -1) % len(g.shape(n.inputs[0]))
            folded = _fold_into_conv(g, x, axis, [n], log, n.name)
            heads = [] if folded else _concat_heads(g, n) or []
            for conv in heads:
                _pairs_into_conv(g, conv, log, n.name)
            if folded or heads:
                g.nodes.remove(n)
                g.replace_uses(n.outputs[0], x)
            continue
        m = _decomposed(g, n)
        if m is None:
            continue
        x, axis, pattern, t_chain = m
        if not _fold_into_conv(g, x, axis, pattern, log, n.name):
            if not t_chain:
                _as_softmax(g, n, x, axis, log)
            continue
        out = n.outputs[0]
        g.nodes.remove(n)
        if t_chain:   # the numerator's movement now carries the probabilities
            t_chain[0].inputs[0] = x
            g.replace_uses(out, t_chain[-1].outputs[0])
        else:
            g.replace_uses(out, x)
    return g


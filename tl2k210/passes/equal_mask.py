"""An Equal of two float maps read only as a 0 / 1 float mask (Cast to float): CenterNet's peak
trick, heat * (MaxPool3x3(heat) == heat), which keeps a heatmap's local maxima. The K210 has no
comparison, so the mask is computed in ops it lowers:

    mask = 1 - Sign(Abs(a - b))          # 1 where a == b, else 0

exact in float (a - b is 0 exactly where a == b). On the uint8 grid, a MaxPool keeps its input's
quantization, so equal codes differ by exactly 0 and unequal ones by at least a step: the mask
is the quantized model's own (ties of a flat quantized plateau all count as peaks, as they do
when an int8 TFLite file runs this Equal). Where(a == b, x, 0) and Where(a == b, 0, x) are read
as x times the mask (or 1 - the mask) first. An Equal read as another boolean (a Where between two
maps, Not, And) stays and is refused by the lowering naming it."""
import numpy as np

from tl2k210.graph import Node

_FLOAT = 1          # onnx.TensorProto.FLOAT


def _mask_readers(g, n):
    """The Cast-to-float nodes that are Equal n's only readers, or None."""
    out = n.outputs[0]
    readers = g.consumers(out)
    if out in g.outputs or not readers or any(c.op != "Cast" or c.attrs.get("to") != _FLOAT for c in readers):
        return None
    if any(g.tensors[i].dtype != np.float32 or g.const(i) is not None for i in n.inputs):
        return None
    return readers


def _zero(g, t):
    v = g.const(t)
    return v is not None and np.asarray(v).dtype.kind == "f" and not np.any(v)


def _where_as_product(g, log):
    """Where(a == b, x, 0) -> x * Cast(a == b); Where(a == b, 0, x) -> x * (1 - Cast(a == b)):
    the same masks read through a Cast (a TF tf.where(hmax == heat, heat, 0))."""
    for w in [w for w in g.nodes if w.op == "Where"]:
        eq = g.producer(w.inputs[0])
        if eq is None or eq.op != "Equal" or not (_zero(g, w.inputs[2]) or _zero(g, w.inputs[1])):
            continue
        keep_where_equal = _zero(g, w.inputs[2])
        x, y = (w.inputs[1] if keep_where_equal else w.inputs[2]), w.outputs[0]
        if g.shape(x) is None or g.shape(x) != g.shape(y):
            continue
        m = g.add_tensor(f"{y}/mask")
        new = [Node("Cast", [w.inputs[0]], [m], {"to": _FLOAT}, f"{w.name}/mask")]
        if not keep_where_equal:
            neg, one = (g.add_const(np.array(v, np.float32), f"{y}/{k}")
                        for v, k in ((-1.0, "minus_one"), (1.0, "one")))
            nm, inv = g.add_tensor(f"{y}/minus_mask"), g.add_tensor(f"{y}/inverse_mask")
            new += [Node("Mul", [m, neg], [nm], {}, f"{w.name}/minus_mask"),
                    Node("Add", [nm, one], [inv], {}, f"{w.name}/inverse_mask")]
            m = inv
        new.append(Node("Mul", [x, m], [y], {}, w.name, w.fused))
        i = g.nodes.index(w)
        g.nodes[i:i + 1] = new
        log(w.name, f"Where(Equal, {'x, 0' if keep_where_equal else '0, x'}) -> x * mask")


def equal_mask(g, log):
    _where_as_product(g, log)
    for n in [n for n in g.nodes if n.op == "Equal"]:
        casts = _mask_readers(g, n)
        if not casts:
            continue
        y = casts[0].outputs[0]
        t = {}

        def node(op, ins, out, attrs=None):
            t[out] = g.add_tensor(f"{y}/{out}")
            return Node(op, ins, [t[out]], attrs or {}, f"{n.name}/{out}")
        neg, one = (g.add_const(np.array(v, np.float32), f"{y}/{k}") for v, k in ((-1.0, "minus_one"), (1.0, "one")))
        new = [node("Sub", list(n.inputs), "diff"), node("Abs", [t["diff"]], "dist"),
               node("Sign", [t["dist"]], "differs"), node("Mul", [t["differs"], neg], "minus_differs"),
               Node("Add", [t["minus_differs"], one], [y], {}, n.name)]
        i = g.nodes.index(n)
        g.nodes[i:i + 1] = new
        for c in casts[1:]:
            g.replace_uses(c.outputs[0], y)
        for c in casts:
            g.nodes.remove(c)
        g.tensors[y].dtype = np.dtype(np.float32)
        log(n.name, "Equal read as a float mask: 1 - Sign(Abs(a - b))")
    return g

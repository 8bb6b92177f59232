"""Keras 3 writes hard_sigmoid as relu6(x + 3) / 6 (Add, Clip, Mul|Div) and hard_swish as
x * hard_sigmoid(x): make them HardSigmoid / HardSwish nodes (one KPU activation each). Runs before
fold_batchnorm, which would otherwise fold the Add into the preceding Conv's bias."""
from tl2k210.graph import Node

from .fuse_activation import activation_of


def _scalar(g, name):
    v = g.const(name)
    return float(v.reshape(())) if v is not None and v.size == 1 else None


def hard_activations(g, log):
    for clip in [n for n in g.nodes if n.op == "Clip"]:
        add, act = g.producer(clip.inputs[0]), activation_of(g, clip)
        scale = g.single_consumer(clip.outputs[0])
        if add is None or add.op != "Add" or act is None or act["min"] != 0 or scale is None or \
                g.single_consumer(add.outputs[0]) is not clip or scale.op not in ("Mul", "Div"):
            continue
        c = _scalar(g, add.inputs[1]) if g.const(add.inputs[0]) is None else _scalar(g, add.inputs[0])
        k = _scalar(g, scale.inputs[1]) if scale.inputs[0] == clip.outputs[0] else None
        if scale.op == "Mul" and k is None:
            k = _scalar(g, scale.inputs[0])
        if c is None or not k:
            continue
        k = k if scale.op == "Mul" else 1 / k
        if abs(act["max"] * k - 1) > 1e-6:
            continue
        x = add.inputs[0] if g.const(add.inputs[0]) is None else add.inputs[1]
        hs = Node("HardSigmoid", [x], [scale.outputs[0]], {"alpha": k, "beta": c * k}, clip.name,
                  [add.name, clip.name, scale.name])
        for n in (add, clip, scale):
            g.nodes.remove(n)
        g.nodes.append(hs)
        log(hs.name, f"Add/Clip/{scale.op} -> HardSigmoid(alpha={k:.6g}, beta={c * k:.6g})")
        mul = g.single_consumer(hs.outputs[0])
        if mul is not None and mul.op == "Mul" and sorted(mul.inputs) == sorted([x, hs.outputs[0]]) and \
                abs(k - 1 / 6) < 1e-6 and abs(c * k - 0.5) < 1e-6:
            g.nodes.remove(mul)
            g.nodes.remove(hs)
            g.nodes.append(Node("HardSwish", [x], [mul.outputs[0]], {}, mul.name, hs.fused + [mul.name]))
            g.meta["opset"] = max(g.meta.get("opset", 13), 14)
            log(mul.name, "x * HardSigmoid(x) -> HardSwish")
    return g

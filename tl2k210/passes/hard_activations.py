"""Keras 3 writes hard_sigmoid as relu6(x + 3) / 6 (Add, Clip, Mul|Div) and hard_swish as
x * hard_sigmoid(x); tf_keras (Keras 2) writes hard_sigmoid as clip(0.2 x + 0.5, 0, 1) (Mul, Add,
then Minimum(1) and Relu / Maximum(0), or a Clip): make them HardSigmoid / HardSwish nodes (one
KPU activation each, where an affine and two clamps rounded in turn). Runs before fold_batchnorm,
which would otherwise fold the Add into the preceding Conv's bias. Then the clamps left by a
scalar Minimum / Maximum (TF1's clip_by_value) become Clip nodes, one a chain."""
import numpy as np

from tl2k210.graph import Node

from .fuse_activation import activation_of


def _scalar(g, name):
    v = g.const(name)
    return float(v.reshape(())) if v is not None and v.size == 1 else None


def _operand(g, n):
    """(tensor, scalar constant) of a binary op with one scalar constant operand, else None."""
    if len(n.inputs) != 2:
        return None
    for t, c in (n.inputs, n.inputs[::-1]):
        k = _scalar(g, c)
        if k is not None and g.const(t) is None:
            return t, k
    return None


def _clamp(g, n):
    """(lo, hi) of a clamp node: Relu, Clip of constants, Min / Max of a scalar constant; else None."""
    if n.op in ("Min", "Max"):
        r = _operand(g, n)
        return None if r is None else ((-np.inf, r[1]) if n.op == "Min" else (r[1], np.inf))
    act = activation_of(g, n) if n.op in ("Relu", "Clip") else None
    return None if act is None else (act.get("min", 0.0), act.get("max", np.inf))


def _keras2_hard_sigmoids(g, log):
    """Mul(x, a) -> Add(b) -> clamps to [0, 1] (one Clip, or Minimum(1) and Relu / Maximum(0) in
    either order) -> HardSigmoid(alpha=a, beta=b). A full-int8 file's clamp is at its constant 1 on
    that constant's grid (1.0012, 1.0084): left as it is (as one HardSigmoid, mnv3_large112_int8io
    fell from 30.4 to 28.1 dB, pp_lcnet96_int8io from 16.3 to 14.1; not understood yet)."""
    for last in [n for n in g.nodes if n.op in ("Relu", "Clip", "Min", "Max")]:
        if last not in g.nodes or _clamp(g, last) is None:
            continue
        clamps, lo, hi, n = [last], *_clamp(g, last), g.producer(last.inputs[0])
        if n is not None and n.op in ("Relu", "Clip", "Min", "Max") and _clamp(g, n) is not None \
                and g.single_consumer(n.outputs[0]) is last:
            a, b = _clamp(g, n)      # clamp then clamp: [max(lo, a) ... ] for ranges that overlap
            lo, hi = max(lo, a), min(hi, b)
            clamps.insert(0, n)
        add = g.producer(clamps[0].inputs[0])
        if (lo, hi) != (0.0, 1.0) or add is None or add.op != "Add" or _operand(g, add) is None \
                or g.single_consumer(add.outputs[0]) is not clamps[0]:
            continue
        x, beta = _operand(g, add)
        mul = g.producer(x)
        if mul is None or mul.op != "Mul" or _operand(g, mul) is None or g.single_consumer(x) is not add:
            continue
        x, alpha = _operand(g, mul)
        if alpha <= 0:
            continue
        gone = [mul, add] + clamps
        hs = Node("HardSigmoid", [x], [last.outputs[0]], {"alpha": alpha, "beta": beta}, last.name,
                  [n.name for n in gone])
        g.nodes.insert(g.nodes.index(mul), hs)
        for n in gone:
            g.nodes.remove(n)
        log(hs.name, f"Mul/Add/{'/'.join(n.op for n in clamps)} -> HardSigmoid(alpha={alpha:.6g}, beta={beta:.6g})")


def _hard_swishes(g, log):
    """x * HardSigmoid(x; 1/6, 0.5) -> HardSwish. (tf_keras's x * HardSigmoid(x; 0.2, 0.5) stays a
    Mul of two maps: as HardSwish(1.2 x) / 1.2 its table rounds worse than the HardSigmoid table
    and the product do -- hswish_se96 of round 44 loses 1-2 dB, round 45's pp_lcnet gains 2.)"""
    for hs in [n for n in g.nodes if n.op == "HardSigmoid"]:
        x, k, c = hs.inputs[0], float(hs.attrs.get("alpha", 0.2)), float(hs.attrs.get("beta", 0.5))
        mul = g.single_consumer(hs.outputs[0])
        if mul is None or mul.op != "Mul" or sorted(mul.inputs) != sorted([x, hs.outputs[0]]) or \
                abs(c - 0.5) > 1e-6 or abs(k - 1 / 6) > 1e-6 or hs.outputs[0] in g.outputs:
            continue
        g.nodes.remove(hs)
        i = g.nodes.index(mul)
        g.nodes.remove(mul)
        g.nodes.insert(i, Node("HardSwish", [x], [mul.outputs[0]], {}, mul.name, hs.fused + [mul.name]))
        g.meta["opset"] = max(g.meta.get("opset", 13), 14)
        log(mul.name, "x * HardSigmoid(x) -> HardSwish")


def _scalar_clamps(g, log):
    """Minimum / Maximum of a scalar constant, and a chain of such clamps (TF1's clip_by_value
    and ReLU6 in frozen graphs: Minimum(x, 6) then Maximum(0)) -> one Clip, which fuses into the
    conv before it as the KPU's activation, where each had been a CPU table of its own."""
    def data(n):
        return n.inputs[0] if n.op in ("Relu", "Clip") else _operand(g, n)[0]
    for last in reversed([n for n in g.nodes if n.op in ("Relu", "Clip", "Min", "Max")]):   # last of a chain first
        if last not in g.nodes or _clamp(g, last) is None:
            continue
        chain, (lo, hi) = [last], _clamp(g, last)
        while (n := g.producer(data(chain[0]))) is not None and n.op in ("Relu", "Clip", "Min", "Max") \
                and _clamp(g, n) is not None and g.single_consumer(n.outputs[0]) is chain[0] \
                and n.outputs[0] not in g.outputs:
            a, b = _clamp(g, n)
            lo, hi = max(lo, a), min(hi, b)
            chain.insert(0, n)
        p = g.producer(data(chain[0]))
        if len(chain) == 1 and (chain[0].op in ("Relu", "Clip") or p is None or p.op != "Conv") or lo > hi:
            continue        # one clamp: a Min / Max only where it fuses (l2_normalize reads Max(sum, eps))
        x = data(chain[0])
        bounds = [g.add_const(np.array(v, np.float32), f"{last.name}/{k}") if np.isfinite(v) else ""
                  for k, v in (("min", lo), ("max", hi))]
        clip = Node("Clip", [x] + bounds, [last.outputs[0]], {}, last.name, [n.name for n in chain])
        g.nodes.insert(g.nodes.index(chain[0]), clip)
        for n in chain:
            g.nodes.remove(n)
        log(clip.name, f"{'/'.join(n.op for n in chain)} -> Clip({lo:g}, {hi:g})")


def hard_activations(g, log):
    for clip in [n for n in g.nodes if n.op == "Clip"]:
        if clip not in g.nodes:
            continue
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
    _keras2_hard_sigmoids(g, log)
    _hard_swishes(g, log)
    _scalar_clamps(g, log)
    return g

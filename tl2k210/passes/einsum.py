"""Einsum of an activation and a constant (Keras' EinsumDense, MultiHeadAttention's output
projection "abcd,cde->abe" through tf2onnx) -> Transpose, Reshape, MatMul, Reshape, Transpose: the
activation's free axes and the contracted ones each merged into one, the constant reshaped (and
transposed) to the (K, N) weight matrix it is. Equal in float."""
import numpy as np

from tl2k210.graph import Node


def _parse(eq):
    """'abcd,cde->abe' -> (['abcd', 'cde'], 'abe'), or None for ellipses / implicit outputs."""
    eq = eq.replace(" ", "")
    if "->" not in eq or "." in eq:
        return None
    ins, out = eq.split("->")
    ins = ins.split(",")
    if len(ins) != 2 or any(len(set(s)) != len(s) for s in (*ins, out)):
        return None
    return ins, out


def plan(eq, shape_a, shape_b):
    """(perm_a, (rows..., K), W perm, (K, N), out dims, out perm) of A x B, or a reason why not."""
    p = _parse(eq)
    if p is None:
        return "only two operands, explicit outputs, no ellipsis nor repeated index"
    (a, b), out = p
    if len(a) != len(shape_a) or len(b) != len(shape_b):
        return f"equation {eq} does not match the shapes {shape_a}, {shape_b}"
    if set(out) - set(a) - set(b) or any(ch in a and ch in b and ch in out for ch in out):
        return "an index in both operands and the output (a batched product)"
    free_a = [ch for ch in out if ch in a]
    contract = [ch for ch in a if ch in b and ch not in out]
    free_b = [ch for ch in out if ch in b]
    if set(a) - set(free_a) - set(contract) or set(b) - set(free_b) - set(contract):
        return "an index summed over one operand only"
    dim = {**dict(zip(a, shape_a)), **dict(zip(b, shape_b))}
    if any(dict(zip(a, shape_a))[ch] != dict(zip(b, shape_b))[ch] for ch in contract):
        return "contracted dimensions differ"
    k = int(np.prod([dim[ch] for ch in contract], dtype=np.int64))
    n = int(np.prod([dim[ch] for ch in free_b], dtype=np.int64))
    perm_a = [a.index(ch) for ch in free_a + contract]
    perm_w = [b.index(ch) for ch in contract + free_b]
    mid = free_a + free_b
    return dict(perm_a=perm_a, rows=[dim[ch] for ch in free_a], k=k, n=n, perm_w=perm_w,
                mid=[dim[ch] for ch in mid], perm_out=[mid.index(ch) for ch in out])


def einsum_dense(g, log):
    for node in [n for n in g.nodes if n.op == "Einsum"]:
        if len(node.inputs) != 2 or g.const(node.inputs[1]) is None or g.const(node.inputs[0]) is not None:
            continue
        x, y, nm = node.inputs[0], node.outputs[0], node.name
        eq = node.attrs.get("equation", "")
        eq = eq.decode() if isinstance(eq, bytes) else eq
        B = np.asarray(g.const(node.inputs[1]), np.float32)
        if g.shape(x) is None:
            continue
        p = plan(eq, tuple(g.shape(x)), B.shape)
        if isinstance(p, str):
            continue
        new, cur = [], x

        def step(op, ins, attrs, k, shape):
            nonlocal cur
            t = y if k == "out" else g.add_tensor(f"{y}/{k}", shape)
            new.append(Node(op, [cur] + ins, [t], attrs, nm if k == "out" else f"{nm}/{k}", [nm]))
            cur = t

        if p["perm_a"] != sorted(p["perm_a"]):
            step("Transpose", [], {"perm": p["perm_a"]}, "a", [g.shape(x)[i] for i in p["perm_a"]])
        step("Reshape", [g.add_const(np.array(p["rows"] + [p["k"]], np.int64), nm + "/a_shape")], {}, "a2d",
             p["rows"] + [p["k"]])
        W = np.ascontiguousarray(B.transpose(p["perm_w"]).reshape(p["k"], p["n"]))
        step("MatMul", [g.add_const(W, nm + "/weights")], {}, "mm", p["rows"] + [p["n"]])
        last = p["perm_out"] == sorted(p["perm_out"])
        step("Reshape", [g.add_const(np.array(p["mid"], np.int64), nm + "/out_shape")], {}, "out" if last else "mid",
             p["mid"])
        if not last:
            step("Transpose", [], {"perm": p["perm_out"]}, "out", None)
        i = g.nodes.index(node)
        g.nodes[i:i + 1] = new
        log(nm, f"Einsum {eq} with constant weights -> MatMul of ({'x'.join(map(str, p['rows']))}, {p['k']}) "
                f"by ({p['k']}, {p['n']})")
    return g

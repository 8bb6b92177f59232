"""Per-channel PReLU exactly on the KPU, whose activation table is one function per layer.

The fastest form (pass `prelu_split`):

    PReLU(y) = relu(y) - sign(a)·relu(-|a|·y)        (per channel c, slope a = a_c)

The layer before computes both y and -|a|·y (its weights and bias doubled, channels interleaved
[y_c, -|a_c|·y_c], a plain ReLU table for all), and the convs after it read the pair with weights
[W, -sign(a)·W]; a depthwise consumer becomes a group conv of two inputs per channel. When the PReLU
is not after a conv, a 1x1 group conv (1 -> 2 per channel, ReLU) makes the pair; when something
else than a conv reads it, a 1x1 group conv (2 -> 1, weights [1, -sign(a)]) joins it back.

Those group convs run as block-diagonal dense tiles (~c²/8 weight bytes each), and the pair doubles
every reader's weights. The smaller form (pass `prelu_residual`, which the compiler takes where the
pair does not fit or is slower: compiler.optimise_to_fit) takes every PReLU that would need one
of them:

    PReLU(y) = y + relu(-(1 - a)⁺·y) - relu(-(a - 1)⁺·y)

one 1x1 depthwise conv with a ReLU for the slopes under 1 and one for those over 1 (c weights
each: the KPU's native depthwise layer; each term one-signed, so its uint8 range is as fine as a
ReLU's), added to / subtracted from y on the CPU (residual adds); the readers read one c-channel map.

Exact in float; every layer then quantizes as any KPU conv or residual add."""
import numpy as np

from tl2k210.graph import RELABELS, Node

CONV = {"kernel": (1, 1), "strides": (1, 1), "pads": [0, 0, 0, 0], "dilations": (1, 1)}


def _slopes(g, n):
    x, s = n.inputs
    a = g.const(s)
    shape = g.shape(x)
    if a is None or shape is None or len(shape) != 4 or g.const(x) is not None:
        return None
    c = shape[1]
    a = np.asarray(a, np.float64)
    if a.ndim > 4:
        return None
    a = a.reshape((1,) * (4 - a.ndim) + a.shape)     # one slope per channel, maybe repeated over the map
    if a.shape[0] != 1 or a.shape[1] not in (1, c) or not np.array_equal(a, np.broadcast_to(a[:, :, :1, :1], a.shape)):
        return None
    return np.broadcast_to(a[0, :, 0, 0], (c,)).copy()


def _interleave(w_pos, w_neg):
    out = np.empty((2 * w_pos.shape[0],) + w_pos.shape[1:], np.float64)
    out[0::2], out[1::2] = w_pos, w_neg
    return out


def _const_conv(g, c):
    return c.op == "Conv" and g.const(c.inputs[1]) is not None and g.const(c.inputs[2]) is not None \
        and not c.attrs.get("activation") and not c.attrs.get("pool")


def prelu_pattern(g, log):
    """relu(y) + c·relu(-y) (Keras 3 PReLU through tf2onnx: Relu, Neg, Relu, Mul, Add; or with Sub
    and c = a; or TF MTCNN's relu(y) + a·(-relu(-y)), one more Neg) -> PRelu(y, -c); max(y, a·y)
    with slopes a <= 1 -> PRelu(y, a)."""
    for top in [n for n in g.nodes if n.op in ("Add", "Sub") and len(n.inputs) == 2]:
        for pos_t, neg_t in ((0, 1), (1, 0)) if top.op == "Add" else ((0, 1),):
            pos, mul = g.producer(top.inputs[pos_t]), g.producer(top.inputs[neg_t])
            if pos is None or mul is None or pos.op != "Relu" or mul.op != "Mul":
                continue
            y = pos.inputs[0]
            c_name = next((i for i in mul.inputs if g.const(i) is not None), None)
            r_name = next((i for i in mul.inputs if g.const(i) is None), None)
            r = g.producer(r_name) if r_name else None
            # TF MTCNN's prelu (facenet's detect_face, in every MTCNN port): alpha * -relu(-y)
            flip = r if r is not None and r.op == "Neg" else None
            r = g.producer(flip.inputs[0]) if flip is not None else r
            neg = g.producer(r.inputs[0]) if r is not None and r.op == "Relu" else None
            if c_name is None or neg is None or neg.op != "Neg" or neg.inputs[0] != y:
                continue
            chain = [pos, neg, r] + ([flip] if flip is not None else []) + [mul]
            if any(len(g.consumers(n.outputs[0])) != 1 or n.outputs[0] in g.outputs for n in chain):
                continue
            c = np.asarray(g.const(c_name), np.float32)
            slope = (-c if top.op == "Add" else c) * (-1 if flip is not None else 1)
            node = Node("PRelu", [y, g.add_const(slope, top.name + "/slope")], [top.outputs[0]], {}, top.name,
                        [n.name for n in chain + [top]])
            for n in chain + [top]:
                g.nodes.remove(n)
            g.nodes.append(node)
            log(node.name, f"relu(y) {'+' if top.op == 'Add' else '-'} c*{'-' if flip else ''}relu(-y) -> PRelu")
            break
    for top in [n for n in g.nodes if n.op == "Max" and len(n.inputs) == 2]:
        # max(y, a·y) with a <= 1: y where y >= 0, a·y below (PINTO's int8 FaceMesh: PReLU as MUL
        # and MAXIMUM, hunt 22; its learned slopes are also negative)
        for y, m in (top.inputs, top.inputs[::-1]):
            mul = g.producer(m)
            a = next((g.const(i) for i in mul.inputs if g.const(i) is not None), None) if mul and mul.op == "Mul" \
                else None
            if a is None or y not in mul.inputs or len(g.consumers(m)) != 1 or m in g.outputs:
                continue
            a = np.asarray(a, np.float32)
            shape = g.shape(y) or ()
            full = a.reshape((1,) * (len(shape) - a.ndim) + a.shape) if a.ndim <= len(shape) else a
            if len(shape) < 2 or full.ndim != len(shape) or any(d != 1 for i, d in enumerate(full.shape) if i != 1) \
                    or full.shape[1] not in (1, shape[1]):
                continue        # one slope per channel (or one for all), as PRelu's, as it broadcasts
            a = full
            # a slope a_c > 1: a_c·y where y >= 0, y below = a_c·PReLU(y, 1/a_c): the conv writing y
            # scaled by a_c where the pattern alone reads it, else a Mul by a_c after (folded onward)
            after = a.max() > 1 and not _scale_producer(g, y, {id(mul), id(top)}, a)
            out = g.add_tensor(top.outputs[0] + "/prelu", g.shape(top.outputs[0])) if after else top.outputs[0]
            slope = np.where(a > 1, 1 / a, a).astype(np.float32)
            node = Node("PRelu", [y, g.add_const(slope, top.name + "/slope")], [out], {}, top.name,
                        [mul.name, top.name])
            g.nodes.remove(mul)
            g.nodes[g.nodes.index(top)] = node
            if after:
                scale = g.add_const(np.maximum(a, 1).astype(np.float32), top.name + "/scale")
                g.nodes.insert(g.nodes.index(node) + 1, Node("Mul", [out, scale], [top.outputs[0]], {},
                                                             top.name + "/scale"))
            log(node.name, "max(y, a*y), a <= 1 -> PRelu")
            break
    return g


def _scale_producer(g, y, readers, a) -> bool:
    """Scale channel c of the conv writing y by a_c where a_c > 1 (max(y, a·y) = PReLU(a_c·y, 1/a_c)
    there), where it has constant weights, no activation, and the pattern (`readers`, node ids)
    alone reads y. True if scaled."""
    p = g.producer(y)
    if p is None or p.op != "Conv" or p.attrs.get("activation") or p.attrs.get("pool") or y in g.outputs \
            or {id(n) for n in g.consumers(y)} != readers or g.const(p.inputs[1]) is None \
            or (len(p.inputs) > 2 and p.inputs[2] and g.const(p.inputs[2]) is None):
        return False
    w = np.asarray(g.const(p.inputs[1]), np.float32)
    m = np.where(a > 1, a, 1).reshape(-1).astype(np.float32)
    if m.size not in (1, w.shape[0]):
        return False
    m = np.broadcast_to(m, (w.shape[0],))
    p.inputs[1] = g.add_const(w * m.reshape((-1,) + (1,) * (w.ndim - 1)), p.name + "/prelu_scaled_w")
    if len(p.inputs) > 2 and p.inputs[2]:
        p.inputs[2] = g.add_const(np.asarray(g.const(p.inputs[2]), np.float32) * m, p.name + "/prelu_scaled_b")
    return True


def _onto_map(g, n) -> bool:
    """A PRelu of a tensor that is no NCHW map -- a (1, C) vector (Keras' PReLU after a Dense or a
    global pool), a (1, C, 1) one (OpenVINO's re-identification nets after their batch norm) --
    runs on the (1, N, 1, 1) map of its N values, each with its slope broadcast to it -- the map a
    relabel made it from, else a Reshape's -- and a Reshape makes its shape again: the split and
    join below then run on the map. True if rewired."""
    x = n.inputs[0]
    shape, p, a = g.shape(x), g.producer(x), g.const(n.inputs[1])
    if shape is None or len(shape) not in (2, 3) or shape[0] != 1 or a is None:
        return False
    try:
        slopes = np.broadcast_to(np.asarray(a, np.float32), shape).reshape(-1)
    except ValueError:
        return False
    c, src = slopes.size, x
    if p is not None and p.op in RELABELS and tuple(g.shape(p.inputs[0]) or ()) == (1, c, 1, 1):
        src = p.inputs[0]
    else:
        src = g.add_tensor(x + "/map", (1, c, 1, 1))
        g.nodes.insert(g.nodes.index(n), Node(
            "Reshape", [x, g.add_const(np.array([1, c, 1, 1], np.int64), n.name + "/shape4")], [src], {},
            n.name + "/to_nchw", [n.name]))
    out = n.outputs[0]
    mapped = g.add_tensor(out + "/map", (1, c, 1, 1))
    n.inputs = [src, g.add_const(slopes.reshape(-1, 1, 1), n.name + "/slope_map")]
    n.outputs = [mapped]
    g.nodes.insert(g.nodes.index(n) + 1, Node(
        "Reshape", [mapped, g.add_const(np.array(shape, np.int64), n.name + "/shape2")], [out], {},
        n.name + "/to_2d", [n.name]))
    return True


def prelu_split(g, log):
    for n in [n for n in g.nodes if n.op == "PRelu"]:
        if _slopes(g, n) is None and _onto_map(g, n):
            log(n.name, f"PReLU of a {g.shape(n.inputs[0])[1]}-vector -> on its 1x1 map")
        a = _slopes(g, n)
        if a is None:
            continue
        x, out = n.inputs[0], n.outputs[0]
        c = len(a)
        neg = -np.sign(a)                 # the weight the consumers give the negative half
        pair = g.add_tensor(out + "/pair")
        p = g.producer(x)
        if p is not None and _const_conv(g, p) and g.single_consumer(x) is n:
            w, b = g.const(p.inputs[1]).astype(np.float64), g.const(p.inputs[2]).astype(np.float64)
            s = np.abs(a).reshape(-1, *([1] * (w.ndim - 1)))
            p.inputs[1] = g.add_const(_interleave(w, -s * w).astype(np.float32), p.name + "/W_prelu")
            p.inputs[2] = g.add_const(_interleave(b, -np.abs(a) * b).astype(np.float32), p.name + "/B_prelu")
            grp = p.attrs.get("group", 1)
            p.attrs["activation"] = {"op": "Relu"}
            p.outputs = [pair]
            p.fused.append(n.name)
            how = f"{p.name} computes y and -|a|·y ({2 * c} channels{', group ' + str(grp) if grp > 1 else ''})"
        else:
            w = _interleave(np.ones((c, 1, 1, 1)), -np.abs(a).reshape(c, 1, 1, 1))
            g.nodes.insert(g.nodes.index(n), Node(
                "Conv", [x, g.add_const(w.astype(np.float32), n.name + "/W_split"),
                         g.add_const(np.zeros(2 * c, np.float32), n.name + "/B_split")], [pair],
                {**CONV, "group": c, "activation": {"op": "Relu"}}, n.name + "/split", [n.name]))
            how = f"a 1x1 group conv makes y and -|a|·y ({2 * c} channels)"
        g.tensors[pair].shape = (1, 2 * c) + tuple(g.shape(x)[2:])
        joined = None
        for u in g.consumers(out):
            if _const_conv(g, u) and u.inputs[0] == out:
                w = g.const(u.inputs[1]).astype(np.float64)           # (Co, Ci/group, k, k)
                grp = u.attrs.get("group", 1)
                m = w.shape[1]
                base = (np.arange(w.shape[0]) // (w.shape[0] // grp)) * m     # first input of the group
                sign = neg[base[:, None] + np.arange(m)[None, :]][:, :, None, None]
                w2 = np.empty((w.shape[0], 2 * m) + w.shape[2:])
                w2[:, 0::2], w2[:, 1::2] = w, sign * w
                u.inputs[0] = pair
                u.inputs[1] = g.add_const(w2.astype(np.float32), u.name + "/W_prelu")
                u.fused.append(n.name)
            else:
                if joined is None:
                    w = np.stack([np.ones(c), neg], axis=1).reshape(c, 2, 1, 1)
                    joined = g.add_tensor(out + "/joined", g.shape(out))
                    g.nodes.insert(g.nodes.index(n), Node(
                        "Conv", [pair, g.add_const(w.astype(np.float32), n.name + "/W_join"),
                                 g.add_const(np.zeros(c, np.float32), n.name + "/B_join")], [joined],
                        {**CONV, "group": c}, n.name + "/join", [n.name]))
                u.inputs = [joined if i == out else i for i in u.inputs]
        if out in g.outputs:
            if joined is None:
                w = np.stack([np.ones(c), neg], axis=1).reshape(c, 2, 1, 1)
                g.nodes.insert(g.nodes.index(n), Node(
                    "Conv", [pair, g.add_const(w.astype(np.float32), n.name + "/W_join"),
                             g.add_const(np.zeros(c, np.float32), n.name + "/B_join")], [out],
                    {**CONV, "group": c}, n.name + "/join", [n.name]))
            else:
                g.replace_uses(out, joined)
        g.nodes.remove(n)
        log(n.name, f"per-channel PReLU: {how}; the convs after it take [W, -sign(a)·W]"
                    + ("; a 1x1 group conv joins the pair for the other readers" if joined else ""))
    return g


def _fused(g, n, x, grouped=True):
    """Does a conv make y and convs alone read the PReLU (the pair needs no layer of its own)?
    `grouped` False: ungrouped convs alone -- a grouped reader of the pair is a group conv of two
    inputs per channel, block-diagonal dense tiles of (2c)² taps, which for MiniFASNet's
    231-channel depthwise conv needed more weight loads than the KPU has."""
    p, out = g.producer(x), n.outputs[0]
    return p is not None and _const_conv(g, p) and g.single_consumer(x) is n and out not in g.outputs \
        and all(_const_conv(g, u) and u.inputs[0] == out and (grouped or u.attrs.get("group", 1) == 1)
                for u in g.consumers(out))


def _residual(g, n, a):
    """PReLU(y) = y + relu(-(1 - a)⁺·y) - relu(-(a - 1)⁺·y) (module docstring); returns how."""
    x, out = n.inputs[0], n.outputs[0]
    c, acc = len(a), x
    terms = [(w, op) for w, op in ((np.maximum(1 - a, 0), "Add"), (np.maximum(a - 1, 0), "Sub")) if w.any()]
    for i, (w, op) in enumerate(terms):
        t, tag = g.add_tensor(f"{out}/{op.lower()}", g.shape(x)), f"{n.name}/{op.lower()}"
        last = i == len(terms) - 1
        s = out if last else g.add_tensor(out + "/partial", g.shape(x))
        g.nodes[g.nodes.index(n):g.nodes.index(n)] = [
            Node("Conv", [x, g.add_const(-w.reshape(c, 1, 1, 1).astype(np.float32), tag + "/W"),
                          g.add_const(np.zeros(c, np.float32), tag + "/B")], [t],
                 {**CONV, "group": c, "activation": {"op": "Relu"}}, tag, [n.name]),
            Node(op, [acc, t], [s], {}, n.name if last else n.name + "/partial", [n.name])]
        acc = s
    g.nodes.remove(n)
    if not terms:           # every slope 1: the identity
        g.replace_uses(out, x)
    return (f"y {' '.join(('+' if op == 'Add' else '-') + ' relu(-|1 - a|·y)' for _, op in terms) or 'itself'}: "
            f"{len(terms)} 1x1 depthwise conv(s) of {c} weights and residual add(s)")


def prelu_residual(g, log, grouped=True, every=False):
    """Every PReLU that the pair form would make or join with a layer of its own takes the
    residual form (module docstring); `grouped` False (pass prelu_residual_grouped): those a
    grouped conv reads too; `every` (pass prelu_residual_every): every PReLU."""
    for n in [n for n in g.nodes if n.op == "PRelu"]:
        a = _slopes(g, n)
        if a is not None and (every or not _fused(g, n, n.inputs[0], grouped)):
            log(n.name, "per-channel PReLU: " + _residual(g, n, a))
    return g


def prelu_residual_grouped(g, log):
    """prelu_residual, and the PReLUs a grouped conv reads: the compiler's choice where the fast
    form's group convs do not fit the KPU (MiniFASNet's 231-channel depthwise convs)."""
    return prelu_residual(g, log, grouped=False)


def prelu_residual_every(g, log):
    """Every PReLU in the residual form: --optimize size's. The pair doubles the weights of the
    conv before the PReLU and of the convs after it (a depthwise conv before it becomes a group
    conv of two outputs a channel: MiniFASNet's, one block-diagonal tile); the residual form adds
    O(c) bytes. MobileFaceNet 358,816 -> 274,080 B (1.11x its ideal), MiniFASNet 3,017,376 ->
    599,456 B, each faster too."""
    return prelu_residual(g, log, every=True)

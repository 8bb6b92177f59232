"""Ops with no kmodel layer of their own, as the ops they are made of (equal in float):
LogSoftmax -> Softmax + Log; InstanceNormalization -> reduce and broadcast binary ops; Tile
(torch's repeat) -> Concat of copies; ReduceSumSquare -> Mul + ReduceSum; BatchNormalization of
computed statistics -> broadcast binary ops; LRN -> a square, a 1x1 conv summing the channel
window, Log, Mul, Exp and a Div; Where of a constant condition -> the side it picks; Expand ->
Mul by ones; GroupNormalization -> Reshape + InstanceNormalization + Reshape + Mul + Add; TF's
batch-norm formula of a LayerNormalization -> the centred form of the others."""
import numpy as np

from tl2k210.graph import Node, reduce_axes, through_relabels


def log_softmax(g, log):
    """LogSoftmax (PyTorch classifiers' last layer, F.log_softmax) -> d = x - max(x); d - log(sum(exp(d)))
    on the same axis (ReduceMax, Sub, Exp, ReduceSum, Log, Sub): finite for any range, where
    Log(Softmax(x)) gives -inf once a probability underflows float32."""
    for n in [n for n in g.nodes if n.op == "LogSoftmax"]:
        x, y, nm = n.inputs[0], n.outputs[0], n.name
        shape = g.shape(x)
        if shape is None:
            continue
        axis = n.attrs.get("axis", -1 if g.meta.get("opset", 13) >= 13 else 1) % len(shape)
        if g.meta.get("opset", 13) < 13 and any(d > 1 for d in shape[axis + 1:]):
            continue          # opset < 13 normalises the flattened axes from `axis` on
        red = g.shape(x)[:axis] + (1,) + g.shape(x)[axis + 1:]
        t = {k: g.add_tensor(f"{y}/{k}", red if k in ("max", "sum", "logsum") else shape)
             for k in ("max", "d", "exp", "sum", "logsum")}
        ax = g.add_const(np.array([axis], np.int64), nm + "/axes")

        def reduce(op, src, dst):
            new_style = g.meta.get("opset", 18) >= (18 if op == "ReduceMax" else 13)
            return Node(op, [src] + ([ax] if new_style else []), [dst],
                        {"keepdims": 1, **({} if new_style else {"axes": [axis]})}, f"{nm}/{op[6:].lower()}", [nm])
        i = g.nodes.index(n)
        g.nodes[i:i + 1] = [reduce("ReduceMax", x, t["max"]),
                            Node("Sub", [x, t["max"]], [t["d"]], {}, nm + "/shift", [nm]),
                            Node("Exp", [t["d"]], [t["exp"]], {}, nm + "/exp", [nm]),
                            reduce("ReduceSum", t["exp"], t["sum"]),
                            Node("Log", [t["sum"]], [t["logsum"]], {}, nm + "/log", [nm]),
                            Node("Sub", [t["d"], t["logsum"]], [y], {}, nm, [nm])]
        log(nm, f"LogSoftmax axis {axis} -> x - max - log(sum(exp(x - max)))")
    return g


def _normalized(g, nm, y, d, var, eps, scale, bias, t):
    """The nodes of y = d / sqrt(var + eps) * scale + bias, the tail of every normalization here
    (d: the centred map; `t`: the tensors var_eps, std, norm and scaled, made by the caller)."""
    return [Node("Add", [var, g.add_const(np.array(eps, np.float32), nm + "/eps")], [t["var_eps"]], {}, nm + "/eps", [nm]),
            Node("Sqrt", [t["var_eps"]], [t["std"]], {}, nm + "/std", [nm]),
            Node("Div", [d, t["std"]], [t["norm"]], {}, nm + "/normalize", [nm]),
            Node("Mul", [t["norm"], scale], [t["scaled"]], {}, nm + "/scale", [nm]),
            Node("Add", [t["scaled"], bias], [y], {}, nm, [nm])]


def instance_norm(g, log):
    """InstanceNormalization (style-transfer and GAN generators) as the ops it is made of, per
    sample and channel over H, W: d = x - mean(x); y = d / sqrt(mean(d*d) + eps) * scale + bias
    (ReduceMean, Sub, Mul, Add, Sqrt, Div: v4 reduce and broadcast binary ops). A 3-D input
    (1, G, N) is PyTorch's GroupNorm export (a Reshape to (1, G, -1) before it): over N."""
    for n in [n for n in g.nodes if n.op == "InstanceNormalization"]:
        x, sc, b = n.inputs
        shape = g.shape(x)
        if shape is None or len(shape) not in (3, 4) or g.const(sc) is None or g.const(b) is None:
            continue
        c, y, nm = shape[1], n.outputs[0], n.name
        spatial = list(range(2, len(shape)))     # (1, G, C/G*H*W): PyTorch's GroupNorm export
        per_channel = (1, c) + (1,) * len(spatial)
        t = {k: g.add_tensor(f"{y}/{k}") for k in ("mean", "d", "d2", "var", "var_eps", "std", "norm", "scaled")}
        if g.meta.get("opset", 18) >= 18:       # axes an input from opset 18, an attribute before
            axes, red = [g.add_const(np.array(spatial, np.int64), nm + "/axes")], {"keepdims": 1}
        else:
            axes, red = [], {"keepdims": 1, "axes": spatial}
        new = [Node("ReduceMean", [x] + axes, [t["mean"]], dict(red), nm + "/mean", [nm]),
               Node("Sub", [x, t["mean"]], [t["d"]], {}, nm + "/center", [nm]),
               Node("Mul", [t["d"], t["d"]], [t["d2"]], {}, nm + "/square", [nm]),
               Node("ReduceMean", [t["d2"]] + axes, [t["var"]], dict(red), nm + "/var", [nm])]
        scale, bias = (g.add_const(np.asarray(g.const(v), np.float32).reshape(per_channel), f"{nm}/{k}")
                       for v, k in ((sc, "scale"), (b, "bias")))
        new += _normalized(g, nm, y, t["d"], t["var"], n.attrs.get("epsilon", 1e-5), scale, bias, t)
        i = g.nodes.index(n)
        g.nodes[i:i + 1] = new
        log(nm, "InstanceNormalization -> ReduceMean, Sub, Mul, ReduceMean, Add, Sqrt, Div, Mul, Add")
    return g


def tile(g, log):
    """Tile with constant repeats (PyTorch `x.repeat(...)`) -> one Concat of r copies per repeated
    axis (the v4 concat takes a range more than once)."""
    for n in [n for n in g.nodes if n.op == "Tile"]:
        reps = g.const(n.inputs[1])
        shape = g.shape(n.inputs[0])
        if reps is None or shape is None or len(reps) != len(shape) or len(shape) > 4:
            continue
        cur, new, y = n.inputs[0], [], n.outputs[0]
        todo = [(a, int(r)) for a, r in enumerate(np.asarray(reps).reshape(-1)) if int(r) > 1]
        for k, (axis, r) in enumerate(todo):
            out = y if k == len(todo) - 1 else g.add_tensor(f"{y}/tile{axis}")
            new.append(Node("Concat", [cur] * r, [out], {"axis": axis}, f"{n.name}/axis{axis}" if out != y else n.name,
                            [n.name]))
            cur = out
        if not new:
            new = [Node("Identity", [cur], [y], {}, n.name, [n.name])]
        i = g.nodes.index(n)
        g.nodes[i:i + 1] = new
        log(n.name, f"Tile {np.asarray(reps).tolist()} -> {len(todo)} Concat(s)")
    return g


def reduce_sum_square(g, log):
    """ReduceSumSquare (tf2onnx's LayerNormalization over a reshaped batch) -> Mul(x, x) and a
    ReduceSum on the same axes (any, the batch axis too), keepdims and noop_with_empty_axes kept."""
    for n in [n for n in g.nodes if n.op == "ReduceSumSquare"]:
        x, y, nm = n.inputs[0], n.outputs[0], n.name
        if len(n.inputs) > 1 and n.inputs[1]:
            axes = g.const(n.inputs[1])
            if axes is None:
                continue
            axes = [int(a) for a in np.asarray(axes).reshape(-1)]
        else:
            axes = list(n.attrs.get("axes", []))
        attrs = {k: n.attrs[k] for k in ("keepdims", "noop_with_empty_axes") if k in n.attrs}
        sq = g.add_tensor(f"{y}/square", g.shape(x))
        if g.meta.get("opset", 13) >= 13:            # ReduceSum's axes an input from opset 13
            ins = [sq] + ([g.add_const(np.array(axes, np.int64), nm + "/axes")] if axes else [])
        else:
            ins, attrs = [sq], {**attrs, **({"axes": axes} if axes else {})}
        i = g.nodes.index(n)
        g.nodes[i:i + 1] = [Node("Mul", [x, x], [sq], {}, nm + "/square", [nm]),
                            Node("ReduceSum", ins, [y], attrs, nm, [nm])]
        log(nm, f"ReduceSumSquare axes {axes} -> Mul(x, x) + ReduceSum")
    return g


def batchnorm_of_activations(g, log):
    """BatchNormalization whose mean or variance is computed (tf2onnx's LayerNormalization: the
    statistics of each row, as a batch norm over a reshaped map) -> (x - mean) / sqrt(var + eps)
    * scale + bias, each vector reshaped to broadcast over the channel axis 1 (Reshape, Sub,
    Add, Sqrt, Div, Mul, Add). A batch norm of constants is fold_batchnorm's."""
    for n in [n for n in g.nodes if n.op == "BatchNormalization"]:
        if len(n.inputs) != 5 or len(n.outputs) != 1 or (g.const(n.inputs[3]) is not None
                                                         and g.const(n.inputs[4]) is not None):
            continue
        x, y, nm = n.inputs[0], n.outputs[0], n.name
        shape = g.shape(x)
        if shape is None or len(shape) < 2:
            continue
        c, bshape = shape[1], (shape[1],) + (1,) * (len(shape) - 2)
        stats = _batch_stats(g, n)
        if stats is not None:          # TF's training-mode batch norm: the map's own statistics
            _own_statistics(g, n, *stats)
            log(nm, f"BatchNormalization of its input's own statistics ({c} channels, training mode) -> "
                    "(x - mean) / sqrt(mean((x - mean)^2) + eps) * scale + bias on the centred map")
            continue
        new = []

        def vec(t, k):
            """The [C] vector `t` as a [C, 1, ...] tensor (a constant, or a Reshape node)."""
            if g.const(t) is not None:
                return g.add_const(np.asarray(g.const(t), np.float32).reshape(bshape), f"{nm}/{k}")
            r = g.add_tensor(f"{y}/{k}", bshape)
            new.append(Node("Reshape", [t, g.add_const(np.array(bshape, np.int64), f"{nm}/{k}_shape")], [r], {},
                            f"{nm}/{k}", [nm]))
            return r

        scale, bias, mean, var = (vec(t, k) for t, k in zip(n.inputs[1:], ("scale", "bias", "mean", "var")))
        t = {k: g.add_tensor(f"{y}/{k}", shape if k in ("d", "norm", "scaled") else bshape)
             for k in ("d", "var_eps", "std", "norm", "scaled")}
        new.append(Node("Sub", [x, mean], [t["d"]], {}, nm + "/center", [nm]))
        new += _normalized(g, nm, y, t["d"], var, n.attrs.get("epsilon", 1e-5), scale, bias, t)
        i = g.nodes.index(n)
        g.nodes[i:i + 1] = new
        log(nm, f"BatchNormalization of computed statistics ({c} channels) -> Sub, Add, Sqrt, Div, Mul, Add")
    return g


def _batch_stats(g, n):
    """(mean node, centred map d, d * d) where BatchNormalization n's mean is the ReduceMean of
    its own input over every axis but the channels (kept, then squeezed or reshaped to a vector)
    and its variance that of d * d, d = x - mean (TF1's FusedBatchNorm with is_training=True, as
    tf2onnx writes it: ReduceSumSquare, or Mul + ReduceSum, divided by the count); else None."""
    x, shape = n.inputs[0], g.shape(n.inputs[0])
    (rm, _), (dv, _) = through_relabels(g, n.inputs[3]), through_relabels(g, n.inputs[4])
    if rm is None or dv is None or rm.op != "ReduceMean" or rm.inputs[0] != x or not rm.attrs.get("keepdims", 1) \
            or dv.op not in ("Div", "Mul") or any(g.const(i) is None for i in (n.inputs[1], n.inputs[2], dv.inputs[1])):
        return None
    axes, others = reduce_axes(g, rm), [i for i in range(len(shape)) if i != 1]
    if axes is None or sorted(a % len(shape) for a in axes) != others:
        return None
    count, k = int(np.prod([shape[i] for i in others])), np.asarray(g.const(dv.inputs[1]), np.float64)
    if k.size != 1 or not np.isclose(float(k.reshape(())), count if dv.op == "Div" else 1 / count, rtol=1e-6):
        return None
    rs = g.producer(dv.inputs[0])
    sq = g.producer(rs.inputs[0]) if rs is not None and rs.op == "ReduceSum" else None
    if sq is None or sq.op != "Mul" or sq.inputs[0] != sq.inputs[1] or sorted(
            a % len(shape) for a in (reduce_axes(g, rs) or [])) != sorted(a % len(shape) for a in axes):
        return None
    d = g.producer(sq.inputs[0])
    if d is None or d.op != "Sub" or d.inputs != [x, rm.outputs[0]]:
        return None
    return rm, d.outputs[0], sq.outputs[0]


def _own_statistics(g, n, rm, d, d2):
    """Replace BatchNormalization n (_batch_stats) by the centred normalization on d: the
    variance a keepdims ReduceMean of d * d (the form instance norms take, which v4's sliced
    normalization reads), then / sqrt(var + eps) * scale + bias per channel."""
    x, y, nm = n.inputs[0], n.outputs[0], n.name
    shape = g.shape(x)
    per = (1, shape[1]) + (1,) * (len(shape) - 2)
    t = {k: g.add_tensor(f"{y}/{k}", per if k in ("var", "var_eps", "std") else shape)
         for k in ("var", "var_eps", "std", "norm", "scaled")}
    vec = {k: g.add_const(np.asarray(g.const(i), np.float32).reshape(per), f"{nm}/{k}")
           for k, i in (("scale", n.inputs[1]), ("bias", n.inputs[2]))}
    new = [Node("ReduceMean", [d2] + rm.inputs[1:], [t["var"]], dict(rm.attrs), nm + "/var", [nm])]
    new += _normalized(g, nm, y, d, t["var"], n.attrs.get("epsilon", 1e-5), vec["scale"], vec["bias"], t)
    i = g.nodes.index(n)
    g.nodes[i:i + 1] = new


_EXPAND_ONES_MAX = 4096     # values of a ones constant an Expand becomes a Mul by; a larger one stays


def _broadcast_anyway(g, y, src):
    """Every reader of Expand output y is a broadcasting binary op whose output shape is the same
    with the Expand's input `src` in its place."""
    readers = g.consumers(y)
    if y in g.outputs or not readers:
        return False
    for c in readers:
        if c.op not in ("Add", "Sub", "Mul", "Div", "Max", "Min", "Pow") or g.shape(c.outputs[0]) is None:
            return False
        shapes = [src if i == y else g.shape(i) for i in c.inputs]
        try:
            if None in shapes or tuple(np.broadcast_shapes(*shapes)) != tuple(g.shape(c.outputs[0])):
                return False
        except ValueError:
            return False
    return True


def static_where(g, log):
    """Where with a constant condition that picks one side everywhere (TF's div_no_nan by a
    constant count: Where(count == 0, 0, sum / count), in Keras' GroupNormalization) -> that
    side, where it already has the output's shape; and Expand to a shape (the same layer's
    (1, 1, G, 1) -> (1, 1, G, C/G)) -> nothing where its readers broadcast to that shape anyway,
    else a Mul by ones of that shape (the same broadcast) where those are few."""
    for n in [n for n in g.nodes if n.op in ("Where", "Expand")]:
        if n.op == "Where":
            cond = g.const(n.inputs[0])
            if cond is None or not (np.all(cond) or not np.any(cond)):
                continue
            pick = n.inputs[1] if np.all(cond) else n.inputs[2]
            if g.shape(pick) is None or g.shape(pick) != g.shape(n.outputs[0]):
                continue
            g.nodes.remove(n)
            g.replace_uses(n.outputs[0], pick)
            log(n.name, f"Where of a constant condition: its {'first' if np.all(cond) else 'second'} value")
        else:
            shape, out, src = g.const(n.inputs[1]), g.shape(n.outputs[0]), g.shape(n.inputs[0])
            if shape is None or out is None or src is None:
                continue
            if _broadcast_anyway(g, n.outputs[0], src):
                g.nodes.remove(n)
                g.replace_uses(n.outputs[0], n.inputs[0])
                log(n.name, f"Expand to {list(out)} dropped: its readers broadcast to that shape anyway")
                continue
            if int(np.prod(out)) > _EXPAND_ONES_MAX:
                continue
            ones = g.add_const(np.ones(out, np.float32), n.name + "/ones")
            g.nodes[g.nodes.index(n)] = Node("Mul", [n.inputs[0], ones], list(n.outputs), {}, n.name, n.fused)
            log(n.name, f"Expand to {list(out)} -> Mul by ones")
    return g


def group_norm(g, log):
    """ONNX GroupNormalization (opset 18: scale and bias per group; 21: per channel) -> what
    torch.onnx wrote before it: Reshape to (1, G, C/G*H*W), InstanceNormalization (unit scale),
    Reshape back, Mul by the scale and Add the bias per channel (then pass instance_norm)."""
    for n in [n for n in g.nodes if n.op == "GroupNormalization"]:
        x, sc, b = n.inputs[:3]
        shape, groups = g.shape(x), int(n.attrs.get("num_groups", 0))
        if shape is None or len(shape) < 3 or g.const(sc) is None or g.const(b) is None or not groups \
                or shape[1] % groups:
            continue
        c, y, nm = shape[1], n.outputs[0], n.name
        scale, bias = (np.asarray(g.const(v), np.float32).ravel() for v in (sc, b))
        if scale.size == groups != c:       # opset 18's per-group parameters
            scale, bias = np.repeat(scale, c // groups), np.repeat(bias, c // groups)
        if scale.size != c or bias.size != c:
            continue
        per_channel = (1, c) + (1,) * (len(shape) - 2)
        t = {k: g.add_tensor(f"{y}/{k}") for k in ("groups", "normed", "back", "scaled")}
        k = g.add_const
        new = [Node("Reshape", [x, k(np.array([1, groups, -1], np.int64), nm + "/group_shape")], [t["groups"]],
                    {}, nm + "/to_groups", [nm]),
               Node("InstanceNormalization", [t["groups"], k(np.ones(groups, np.float32), nm + "/unit_scale"),
                                              k(np.zeros(groups, np.float32), nm + "/zero_bias")], [t["normed"]],
                    {"epsilon": float(n.attrs.get("epsilon", 1e-5))}, nm + "/normalize", [nm]),
               Node("Reshape", [t["normed"], k(np.array(shape, np.int64), nm + "/shape")], [t["back"]], {},
                    nm + "/back", [nm]),
               Node("Mul", [t["back"], k(scale.reshape(per_channel), nm + "/scale")], [t["scaled"]], {},
                    nm + "/scale", [nm]),
               Node("Add", [t["scaled"], k(bias.reshape(per_channel), nm + "/bias")], [y], {}, nm, [nm])]
        i = g.nodes.index(n)
        g.nodes[i:i + 1] = new
        log(nm, f"GroupNormalization ({groups} groups) -> Reshape, InstanceNormalization, Reshape, Mul, Add")
    return g


def lrn(g, log):
    """LRN (AlexNet, GoogLeNet v1, ZFNet: Caffe's cross-channel local response normalisation),
    y = x / (bias + alpha / size * sum of x^2 over the channel window) ^ beta, the window the size
    channels from c - floor((size - 1) / 2) to c + ceil((size - 1) / 2) (ONNX's) -> Mul(x, x); a 1x1
    Conv whose C x C band of weights alpha / size sums the window, with bias as its bias; the
    power as Exp(beta * Log(d)) (d >= bias > 0); Div(x, that)."""
    for n in [n for n in g.nodes if n.op == "LRN"]:
        x, y, nm = n.inputs[0], n.outputs[0], n.name
        shape = g.shape(x)
        if shape is None or len(shape) != 4:
            continue
        c = shape[1]
        size = int(n.attrs["size"])
        alpha, beta, bias = (float(n.attrs.get(k, d)) for k, d in (("alpha", 1e-4), ("beta", 0.75), ("bias", 1.0)))
        if bias <= 0:
            continue          # the Log needs d > 0
        lo, hi = (size - 1) // 2, size - 1 - (size - 1) // 2
        w = np.zeros((c, c, 1, 1), np.float32)
        for o in range(c):
            w[o, max(0, o - lo):min(c, o + hi + 1)] = alpha / size
        t = {k: g.add_tensor(f"{y}/{k}", shape) for k in ("square", "d", "log", "scaled", "power")}
        new = [Node("Mul", [x, x], [t["square"]], {}, nm + "/square", [nm]),
               Node("Conv", [t["square"], g.add_const(w, nm + "/window"),
                             g.add_const(np.full(c, bias, np.float32), nm + "/bias")], [t["d"]],
                    {"kernel": (1, 1), "strides": (1, 1), "pads": [0, 0, 0, 0], "dilations": (1, 1), "group": 1},
                    nm + "/window", [nm]),
               Node("Log", [t["d"]], [t["log"]], {}, nm + "/log", [nm]),
               Node("Mul", [t["log"], g.add_const(np.array(beta, np.float32), nm + "/beta")], [t["scaled"]], {},
                    nm + "/beta", [nm]),
               Node("Exp", [t["scaled"]], [t["power"]], {}, nm + "/power", [nm]),
               Node("Div", [x, t["power"]], [y], {}, nm, [nm])]
        i = g.nodes.index(n)
        g.nodes[i:i + 1] = new
        log(nm, f"LRN size {size} -> Mul, 1x1 Conv over the channel window, Log, Mul, Exp, Div")
    return g


def _prod(g, t, op):
    p = g.producer(t)
    return p if p is not None and p.op == op else None


def _other(n, t):
    """The input of binary n that is not t (None when t is not one of them)."""
    a, b = n.inputs
    return b if a == t else a if b == t else None


def centered_norm(g, log):
    """TF's batch-norm formula of a normalization (tf2onnx's Keras LayerNormalization: Rsqrt as
    Sqrt + Reciprocal), y = x * s + (beta - mean * s) with s = gamma / sqrt(var + eps), ->
    y = (x - mean) / sqrt(var + eps) * gamma + beta, the form the other normalizations take
    (equal in float). The formula subtracts two products that the scale s (up to 1/sqrt(eps)
    where a map is flat) makes large, a cancellation that 8-bit maps do not survive; the centred
    form divides a small difference by the deviation instead."""
    for n in [n for n in g.nodes if n.op == "Add" and len(n.inputs) == 2]:
        for xs_t, rest_t in (n.inputs, n.inputs[::-1]):
            xs, rest = _prod(g, xs_t, "Mul"), g.producer(rest_t)
            if xs is None or rest is None or rest.op not in ("Neg", "Sub"):
                continue
            ms_t = rest.inputs[0] if rest.op == "Neg" else rest.inputs[1]
            beta = None if rest.op == "Neg" else rest.inputs[0]
            ms = _prod(g, ms_t, "Mul")
            if ms is None or (beta is not None and g.const(beta) is None):
                continue
            s = next((t for t in xs.inputs if t in ms.inputs), None)
            x, m = (_other(xs, s), _other(ms, s)) if s is not None else (None, None)
            gamma, r = None, s
            mul = _prod(g, s, "Mul") if s is not None else None
            if mul is not None and any(g.const(t) is not None for t in mul.inputs):
                gamma = next(t for t in mul.inputs if g.const(t) is not None)
                r = _other(mul, gamma)
            rec = _prod(g, r, "Reciprocal") if r is not None else None
            sq = _prod(g, rec.inputs[0], "Sqrt") if rec is not None else None
            if sq is None or x is None or m is None or x == m or g.const(x) is not None:
                continue
            rm = _prod(g, m, "ReduceMean")
            if rm is None or rm.inputs[0] != x:
                continue
            y, nm = n.outputs[0], n.name
            d, norm = g.add_tensor(f"{y}/d", g.shape(x)), g.add_tensor(f"{y}/norm", g.shape(x))
            new = [Node("Sub", [x, m], [d], {}, nm + "/center", [nm]),
                   Node("Div", [d, sq.outputs[0]], [norm], {}, nm + "/normalize", [nm])]
            last = norm
            for k, op, v in (("scaled", "Mul", gamma), ("shifted", "Add", beta)):
                if v is not None:
                    new.append(Node(op, [last, v], [g.add_tensor(f"{y}/{k}")], {}, f"{nm}/{k}", [nm]))
                    last = new[-1].outputs[0]
            new[-1].outputs, new[-1].name = [y], nm
            i = g.nodes.index(n)
            g.nodes[i:i + 1] = new
            log(nm, "x * s + (beta - mean * s), s = gamma / sqrt(var + eps) -> (x - mean) / sqrt(var + eps)"
                    " * gamma + beta")
            break
    return g

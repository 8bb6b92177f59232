"""The float graph with ideal 8-bit quantization simulated (fake quantization): per-channel
symmetric weights rounded as the K210 back-end rounds them, and every tensor the back-end keeps as
uint8 (conv, add, concat, max-pool and resize outputs, and any other map -- a pooled vector, an
SE gate's product, a standalone activation -- that an integer conv or dense layer reads)
quantized with its calibrated range -- or, given a range (lo[C], hi[C]), each channel on its own grid (what per-channel activation scales would buy: bench/fit_limits.py). A
dense layer (a conv on a 1x1 map) that reads the model input or a float dense layer's output stays float, weights and output, as the
back-end's float FULLY_CONNECTED computes it (k210/lower/fc.py): rounding it would also clamp it to its calibrated
range, a denoiser no float layer applies. In a model quantized by its own int8 scales every dense
layer, MatMul included, is integer as the model states it (TFLite's int8 FULLY_CONNECTED), and
every other tensor the file rounds to its integers is rounded too (`_file_rounded`).

It answers "how much of the error is the quantization itself, and how much the way we map it
onto the KPU": on seeded (untrained) deep networks the first part is most of it -- compare the
kmodel's SQNR against this graph's.
"""
import numpy as np

from tl2k210.graph import MOVES, RELABELS, through_relabels

from . import uniform as fx
from .bias_correction import mean_shift

U8_OPS = ("Conv", "Add", "Concat", "MaxPool", "Resize")
POOLS = ("GlobalAveragePool", "AveragePool")   # CPU float ops: uint8 (QUANTIZE) only before the KPU
FLOAT_DENSE = ("MatMul", "Gemm")                 # left by matmul_to_conv: float FULLY_CONNECTED


def float_dense_convs(g):
    """Names of the dense convs (1x1 output map) fed by the model input or a float dense layer,
    through relabels: the back-end keeps them float (k210/lower/fc.py), and so does the ideal."""
    floats = set()
    for n in g.nodes:
        if n.op != "Conv" or any(d != 1 for d in (g.shape(n.outputs[0]) or (0, 0, 0))[2:]):
            continue
        p, t = through_relabels(g, n.inputs[0])
        if p is None and t in g.inputs or p is not None and (p.op in FLOAT_DENSE or p.name in floats):
            floats.add(n.name)
    return floats


HEAD_OPS = ("Sigmoid",)      # float CPU functions of a model output that magnify its input's rounding
HEAD_WEIGHTS_MAX = 4096      # weights of a conv small enough to run in float on the CPU at little cost


def _only_to_head(g, t):
    """Is t read only (through relabels and transposes) by a Sigmoid that is a model output?"""
    users = g.consumers(t)
    if t in g.outputs or not users:
        return False
    for u in users:
        if u.op in MOVES:
            if not _only_to_head(g, u.outputs[0]):
                return False
        elif u.op in HEAD_OPS:
            y = u.outputs[0]
            while y not in g.outputs:
                nxt = g.consumers(y)
                if len(nxt) != 1 or nxt[0].op not in RELABELS:
                    return False
                y = nxt[0].outputs[0]
        else:
            return False
    return True


def float_head(g, node) -> bool:
    """Is `node` a small conv whose output is a model output's logit (read only by a Sigmoid
    that is a model output: a detector's objectness or class map), or a small conv read only by
    such convs? A sigmoid magnifies the uint8 rounding of the rare large logits (a face in a map
    of background) and the map it reads carries its own rounding through the head's large
    weights: no range choice avoids either, float on the CPU does (kmodel v4 conv2d). Not in a
    model quantized by its own int8 scales: its head is the integers it rounds to."""
    if g.meta.get("quant_ranges"):
        return False
    w = g.const(node.inputs[1]) if node.op == "Conv" and len(node.inputs) > 1 else None
    if w is None or w.size > HEAD_WEIGHTS_MAX:
        return False
    t = node.outputs[0]
    if _only_to_head(g, t):
        return True
    users = g.consumers(t)
    return bool(users) and t not in g.outputs and all(
        u.op == "Conv" and u.inputs[0] == t and t not in u.inputs[1:] and float_head(g, u) for u in users)


def _reads_u8(g, t, ops, floats) -> bool:
    """Does a layer of `ops` outside `floats` read t (through relabels)?"""
    for u in g.consumers(t):
        if u.op in RELABELS and _reads_u8(g, u.outputs[0], ops, floats) or u.op in ops and u.name not in floats:
            return True
    return False


def fake_quant_graph(graph, ranges, weight_bits=8, vector_input=False, means=None):
    """`vector_input`: the model input is no camera image but float values that the kmodel rounds
    to uint8 itself (its QUANTIZE) where an integer layer reads them: rounded here too.
    `means` ({tensor: per-channel mean}, compiler.channel_means): a conv's bias takes back the mean
    shift its weights' rounding causes on its input's channel means, as the back-end's does
    (kpu.quantize_layer; Nagel et al. 2019): without it the ideal of a network whose maps have
    large means (MLPerf's float ResNet-8) sits far under what the kmodel reaches."""
    from tl2k210.graph import Node, stage_names
    g = graph.copy()
    own = bool(g.meta.get("quant_ranges"))    # a model quantized by its own int8 scales: no float layer
    floats = set() if own else set(g.meta.get("float_dense", float_dense_convs(g)))   # k210/flow.py's choice
    if g.meta.get("plan", ("v3",))[0] == "v4":     # the v4 back-end runs them as float conv2d
        floats |= {n.name for n in g.nodes if float_head(g, n)}
    dense = FLOAT_DENSE if own else ()            # its FULLY_CONNECTED layers are integer too
    u8_ops = U8_OPS + dense
    for n in g.nodes:
        if n.op in ("Conv",) + dense and n.name not in floats and g.const(n.inputs[1]) is not None:
            _fake_quant_weights(g, n, weight_bits, (means or {}).get(n.inputs[0]) if n.op == "Conv" else None)
    kpu_fed = [n for n in g.nodes if n.op in POOLS and any(c.op == "Conv" for c in g.consumers(n.outputs[0]))]
    rounded = [(n, stage_names(n)["out"] if n.op == "Conv" else n.outputs[0])
               for n in [n for n in g.nodes if n.op in u8_ops and n.name not in floats] + kpu_fed
               + _file_rounded(g, u8_ops)]
    rounded += _conv_read(g, {t for _, t in rounded}, floats)
    rounded += [(None, x) for x in g.inputs if vector_input and _reads_u8(g, x, ("Conv",) + dense, floats)]
    for n, out in rounded:
        if out not in ranges or g.shape(out) is None:
            continue
        lo, hi = np.broadcast_arrays(*ranges[out])        # (lo[C], hi[C]): channel c on its own grid
        s, z = np.array([fx.qparams(a, b) for a, b in zip(lo.ravel(), hi.ravel())]).T.reshape(2, *lo.shape)
        if n is None:       # a model input: its readers take the rounded copy
            raw, out = out, g.add_tensor(out + "/fq", g.shape(out))
            for u in g.nodes:
                u.inputs = [out if i == raw else i for i in u.inputs]
        else:
            raw = g.add_tensor(out + "/float", g.shape(out))
            n.outputs = [raw if o == out else o for o in n.outputs]
        sc, zp = g.add_const(s.astype(np.float32), out + "/s"), g.add_const(z.astype(np.uint8), out + "/z")
        q = g.add_tensor(out + "/q", g.shape(out), np.uint8)
        axis = {"axis": 1} if s.ndim else {}
        g.nodes += [Node("QuantizeLinear", [raw, sc, zp], [q], axis, out + "/quantize"),
                    Node("DequantizeLinear", [q, sc, zp], [out], axis, out + "/dequantize")]
    return g



#: data movement the back-end does on the uint8 bytes of a rounded map (no new grid)
BYTE_MOVES = ("Slice", "Transpose")


def _conv_read(g, done, floats) -> list:
    """(producer, tensor) for each map an integer conv reads that nothing rounded yet (an SE
    gate's Mul, a standalone activation, a Sub): the KPU and the uint8 CPU conv read uint8. A
    slice or transpose of a rounded map is on its grid already (the back-end moves its bytes:
    the channel windows of k210/passes/kxk_windows.py), not rounded again."""
    out, seen = [], set(done)
    for n in g.nodes:
        if n.op != "Conv" or n.name in floats:
            continue
        p, t = through_relabels(g, n.inputs[0])
        if p is not None and p.op in BYTE_MOVES and through_relabels(g, p.inputs[0])[1] in seen:
            continue
        if p is not None and t not in seen:
            seen.add(t)
            out.append((p, t))
    return out


def _file_rounded(g, u8_ops) -> list:
    """In a model quantized by its own int8 scales, the other nodes whose output the file itself
    rounds to its integers (an SE gate's Mul, a Sub, a Mean): its 8-bit arithmetic is the ideal."""
    own, by_node = g.meta.get("quant_ranges", {}), g.meta.get("quant_ranges_by_node", {})
    return [n for n in g.nodes if n.op not in u8_ops + RELABELS + POOLS and n.outputs
            and (n.outputs[0] in own or n.name in by_node)]


def _fake_quant_weights(g, n, weight_bits, mean=None):
    """`n`'s constant weights on the back-end's per-output-channel grid: a Conv's axis 0, a MatMul's
    last axis (K, N), a Gemm's by transB; a Conv's bias corrected for the rounding on its input's
    channel `mean` (fake_quant_graph)."""
    w = g.const(n.inputs[1])
    out_last = n.op == "MatMul" or n.op == "Gemm" and not n.attrs.get("transB", 0)
    wo = w.T if out_last else w
    wq, zw, sw = fx.quantize_weights(wo, weight_bits)
    deq = (wq.astype(np.float64) - zw) * sw.reshape(-1, *[1] * (wo.ndim - 1))
    n.inputs[1] = g.add_const((deq.T if out_last else deq).astype(np.float32), n.inputs[1] + "/fq")
    if mean is None or wo.ndim != 4:
        return
    shift = mean_shift(deq - np.asarray(w, np.float64), mean, int(n.attrs.get("group", 1)))
    b = g.const(n.inputs[2]) if len(n.inputs) > 2 and n.inputs[2] else np.zeros(wo.shape[0])
    name = (n.inputs[2] if len(n.inputs) > 2 and n.inputs[2] else n.name + "/bias") + "/fq"
    n.inputs[2:3] = [g.add_const((np.asarray(b, np.float64) - shift).astype(np.float32), name)]


def ideal_graphs(graph, ranges, weight_bits=8, vector_input=False, means=None) -> list:
    """The fake-quantized graphs the 8-bit ideal is the best of, output by output: the weights'
    rounding left as it falls, and (given `means`) with its mean shift taken out of the biases.
    The correction is what the back-end applies; it lifts an ideal far (MLPerf's float ResNet-8:
    13.8 -> 27.0 dB) but can also cost (gender_mini_XCEPTION: 32.1 -> 28.9 dB), so neither alone
    is what no 8-bit form beats."""
    plain = fake_quant_graph(graph, ranges, weight_bits, vector_input)
    return [plain] if not means else [plain, fake_quant_graph(graph, ranges, weight_bits, vector_input, means)]


def _each_ideal(graph, ranges, floats, weight_bits, vector_input, means) -> list:
    """[{output: dB}] of each of `ideal_graphs` on `floats`."""
    from . import calibrate
    from .metrics import sqnr_db
    ref = calibrate.FloatRunner(graph, False)
    r = [ref(x[None]) for x in floats]
    out = []
    for fg in ideal_graphs(graph, ranges, weight_bits, vector_input, means):
        fq = calibrate.FloatRunner(fg, False)
        q = [fq(x[None]) for x in floats]
        out.append({o: sqnr_db(np.stack([a[o] for a in r]), np.stack([b[o] for b in q])) for o in graph.outputs})
    return out


def ideal_sqnr(graph, ranges, floats, weight_bits=8, vector_input=False, means=None):
    """{output: dB} of the 8-bit ideal on `floats` (model inputs, one per sample): the float graph
    against itself with fake quantization at `ranges` (the best of `ideal_graphs`) -- what no
    kmodel keeping those tensors in uint8 can beat, and what ours should come within a dB of."""
    return ideal_choice(graph, ranges, floats, weight_bits, vector_input, means)[0]


#: dB by which the lowest output of the uncorrected ideal must beat the corrected one to build without
CORRECTION_COSTS_DB = 1.0


def ideal_choice(graph, ranges, floats, weight_bits=8, vector_input=False, means=None):
    """(ideal_sqnr's {output: dB}, costs): costs = (plain dB, corrected dB), the two ideals' lowest
    outputs on `floats`, where the bias correction costs more than CORRECTION_COSTS_DB there: the
    back-end then builds without it (gender_mini_XCEPTION: 34.0 against 28.5 on its calibration
    photos; its kmodel without the correction 31.9 dB held out, with it 28.1); None where the
    correction is kept."""
    each = _each_ideal(graph, ranges, floats, weight_bits, vector_input, means)
    best = {o: max(e[o] for e in each) for o in graph.outputs}
    if len(each) == 2:
        plain, corrected = (min(e.values()) for e in each)
        if plain > corrected + CORRECTION_COSTS_DB:
            return best, (plain, corrected)
    return best, None

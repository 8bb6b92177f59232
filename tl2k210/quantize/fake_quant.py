"""The float graph with ideal 8-bit quantization simulated (fake quantization): per-channel
symmetric weights rounded as the K210 back-end rounds them, and every tensor the back-end keeps as
uint8 (conv, add, concat, max-pool and resize outputs, and a pooled vector that a KPU conv or
dense layer reads) quantized with its calibrated range. A dense layer (a conv on a 1x1 map) that
reads the model input or a float dense layer's output stays float, weights and output, as the
back-end's float FULLY_CONNECTED computes it (k210/lower/fc.py): rounding it would also clamp it to its calibrated
range, a denoiser no float layer applies.

It answers "how much of the error is the quantization itself, and how much the way we map it
onto the KPU": on seeded (untrained) deep networks the first part is most of it -- compare the
kmodel's SQNR against this graph's.
"""
import numpy as np

from tl2k210.graph import RELABELS

from . import uniform as fx

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
        t = n.inputs[0]
        while (p := g.producer(t)) is not None and p.op in RELABELS:
            t = p.inputs[0]
        if p is None and t in g.inputs or p is not None and (p.op in FLOAT_DENSE or p.name in floats):
            floats.add(n.name)
    return floats


def fake_quant_graph(graph, ranges, weight_bits=8):
    from tl2k210.graph import Node, stage_names
    g = graph.copy()
    floats = float_dense_convs(g)
    for n in g.nodes:
        if n.op == "Conv" and g.const(n.inputs[1]) is not None and n.name not in floats:
            w = g.const(n.inputs[1])
            wq, zw, sw = fx.quantize_weights(w, weight_bits)
            deq = (wq.astype(np.float64) - zw) * sw.reshape(-1, *[1] * (w.ndim - 1))
            n.inputs[1] = g.add_const(deq.astype(np.float32), n.inputs[1] + "/fq")
    kpu_fed = [n for n in g.nodes if n.op in POOLS and any(c.op == "Conv" for c in g.consumers(n.outputs[0]))]
    for n in [n for n in g.nodes if n.op in U8_OPS and n.name not in floats] + kpu_fed:
        out = stage_names(n)["out"] if n.op == "Conv" else n.outputs[0]
        if out not in ranges or g.shape(out) is None:
            continue
        s, z = fx.qparams(*ranges[out])
        raw = g.add_tensor(out + "/float", g.shape(out))
        n.outputs = [raw if o == out else o for o in n.outputs]
        sc, zp = g.add_const(np.array(s, np.float32), out + "/s"), g.add_const(np.array(z, np.uint8), out + "/z")
        q = g.add_tensor(out + "/q", g.shape(out), np.uint8)
        g.nodes += [Node("QuantizeLinear", [raw, sc, zp], [q], {}, out + "/quantize"),
                    Node("DequantizeLinear", [q, sc, zp], [out], {}, out + "/dequantize")]
    return g



def ideal_sqnr(graph, ranges, floats, weight_bits=8):
    """{output: dB} of the 8-bit ideal on `floats` (model inputs, one per sample): the float graph
    against itself with fake quantization at `ranges` -- what no kmodel keeping those tensors
    in uint8 can beat, and what ours should come within a dB of."""
    from . import calibrate
    from .metrics import sqnr_db
    ref = calibrate.FloatRunner(graph, False)
    fq = calibrate.FloatRunner(fake_quant_graph(graph, ranges, weight_bits), False)
    r, q = [ref(x[None]) for x in floats], [fq(x[None]) for x in floats]
    return {o: sqnr_db(np.stack([a[o] for a in r]), np.stack([b[o] for b in q])) for o in graph.outputs}

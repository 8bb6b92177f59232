"""Quantized models (TFLite int8/uint8 through tf2onnx, QDQ ONNX exports) -> the float model their
integers stand for, which the K210 back-end then quantizes its own way (per-channel KPU scales).

After fold_constants has turned weight/bias DequantizeLinear into float constants, what is left
is fake quantization of activations:
  * QuantizeLinear -> DequantizeLinear pairs on a float tensor, also with data-movement ops
    between them (tf2onnx puts its NHWC<->NCHW Transposes there): removed (the identity they
    approximate);
  * an integer graph input read through DequantizeLinear: the input becomes that float value;
    its (scale, zero point) is kept in graph.meta["input_quant"] {input: (scale, zp, dtype)} --
    it says which float range the model's 0..255 (or -128..127) input stands for;
  * a graph output written by QuantizeLinear: the output becomes the float value
    (graph.meta["output_quant"] keeps its parameters).
"""
import numpy as np


def _scalar(g, name):
    v = g.const(name) if name else None
    return None if v is None or v.size != 1 else v.reshape(()).item()


MOVES = ("Transpose", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity")


def _quantize_above(g, d):
    """The QuantizeLinear feeding DequantizeLinear `d`, directly or through single-use data
    movement, and the movement nodes between them (or None, [])."""
    chain, t = [], d.inputs[0]
    while True:
        p = g.producer(t)
        if p is None or t in g.outputs or len(g.consumers(t)) != 1:
            return None, []
        if p.op == "QuantizeLinear":
            return p, chain
        if p.op not in MOVES:
            return None, []
        chain.append(p)
        t = p.inputs[0]


def dequantize(g, log):
    for d in [n for n in g.nodes if n.op == "DequantizeLinear"]:
        q, chain = _quantize_above(g, d)
        if q is None:
            continue
        g.nodes.remove(d)
        if chain:   # the movement now carries the float tensor; d's output is its result
            chain[-1].inputs[0] = q.inputs[0]
            g.replace_uses(d.outputs[0], d.inputs[0])
        else:
            g.replace_uses(d.outputs[0], q.inputs[0])
        if not g.consumers(q.outputs[0]) and q.outputs[0] not in g.outputs:
            g.nodes.remove(q)
        for n in chain:
            g.tensors[n.outputs[0]].dtype = np.dtype(np.float32)
        log(q.name, f"removed fake quantization QuantizeLinear/DequantizeLinear of {q.inputs[0]}")
    for x in list(g.inputs):
        t = g.tensors[x]
        users = g.consumers(x)
        if t.dtype.kind not in "iu" or not users or any(u.op != "DequantizeLinear" for u in users):
            continue
        scale, zp = _scalar(g, users[0].inputs[1]), _scalar(g, users[0].inputs[2]) if len(users[0].inputs) > 2 else 0
        if scale is None or zp is None:
            continue
        g.meta.setdefault("input_quant", {})[x] = (float(scale), int(zp), str(t.dtype))
        t.dtype = np.dtype(np.float32)
        for d in users:
            g.nodes.remove(d)
            g.replace_uses(d.outputs[0], x)
        log(x, f"input {x} is now float: {t.dtype} input q stood for (q - {zp}) * {scale:.6g}")
    for i, o in enumerate(list(g.outputs)):
        q = g.producer(o)
        if q is None or q.op != "QuantizeLinear" or q.inputs[0] in g.inputs:
            continue
        scale = _scalar(g, q.inputs[1])
        zp = _scalar(g, q.inputs[2]) if len(q.inputs) > 2 and q.inputs[2] else 0
        g.meta.setdefault("output_quant", {})[o] = (scale, zp, str(g.tensors[o].dtype))
        g.nodes.remove(q)
        src = q.inputs[0]
        for n in g.nodes:   # the float producer now writes the public output name
            n.outputs = [o if v == src else v for v in n.outputs]
            n.inputs = [o if v == src else v for v in n.inputs]
        g.tensors[o].dtype = np.dtype(np.float32)
        log(o, f"output {o} is now float (dropped its QuantizeLinear)")
    return g

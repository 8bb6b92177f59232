"""A dense layer on more inputs than an exact integer sum holds -> the sum of dense layers on
slices of its input.

kmodel v4's quantized_matmul sums uint8 x uint8 products in an int32: at most ACC_TAPS_MAX
(33,025) inputs per output. A longer dense layer (TensorFlow's speech-commands conv net: a
64x50x20 map flattened into 64,000 inputs of its classifier) stayed a float FULLY_CONNECTED, four
bytes a weight (3,000 KiB where its 8-bit weights are 750 KiB). Split into the fewest equal
slices within the limit, each a dense layer on its weight columns (the bias in the first),
summed by Adds: exact in float; each part then lowers as any dense layer (quantized_matmul: one
byte a weight), the parts' sums rounded to uint8 at their calibrated ranges before the adds.

    x -> Slice [0, k1) -> Gemm W[:, 0:k1] + b -> Add -> ... -> y
      -> Slice [k1, k2) -> Gemm W[:, k1:k2]   ---^
"""
import numpy as np

from tl2k210.graph import Node, dense_weights
from tl2k210.k210.lower.v4conv import ACC_TAPS_MAX

from .wide_channels import _chunks
from .wide_dense import _float_source


def long_dense(g, log, v4=True):
    """(kmodel v3 has no quantized_matmul, nor a slice: there the float layer stays; so it does on
    the model's float input or a float layer's output.)"""
    if not v4:
        return g
    for n in [n for n in g.nodes if n.op in ("MatMul", "Gemm")]:
        xs, wb = g.shape(n.inputs[0]), dense_weights(g, n)
        if wb is None or xs is None or len(xs) != 2 or xs[0] != 1 or wb[0].shape[1] <= ACC_TAPS_MAX \
                or _float_source(g, n.inputs[0]):        # a float input: the float layer reads it whole
            continue
        (w, b), out = wb, n.outputs[0]
        nout, k = w.shape
        parts = _chunks(k, ACC_TAPS_MAX)
        nodes, sums = [], []
        for i, (lo, hi) in enumerate(parts):
            xi = g.add_tensor(f"{n.name}/x{i}", (1, hi - lo))
            yi = g.add_tensor(f"{n.name}/part{i}", (1, nout))
            consts = [g.add_const(np.array([v], np.int64), f"{n.name}/{what}{i}")
                      for what, v in (("start", lo), ("end", hi), ("axis", 1))]
            nodes += [Node("Slice", [n.inputs[0]] + consts, [xi], {}, f"{n.name}/slice{i}", [n.name]),
                      Node("Gemm", [xi, g.add_const(np.ascontiguousarray(w[:, lo:hi]), f"{n.name}/W{i}"),
                                    g.add_const(b if i == 0 else np.zeros_like(b), f"{n.name}/B{i}")], [yi],
                           {"transB": 1}, f"{n.name}/part{i}", list(n.fused) if i == 0 else [n.name])]
            g.meta["parts_of"] = {**g.meta.get("parts_of", {}), nodes[-1].name: n.name}   # ideal.py: one op's fixed bytes
            if sums:
                s = out if hi == k else g.add_tensor(f"{n.name}/sum{i}", (1, nout))
                nodes.append(Node("Add", [sums[-1], yi], [s], {}, f"{n.name}/add{i}", [n.name]))
                yi = s
            sums.append(yi)
        i = g.nodes.index(n)
        g.nodes[i:i + 1] = nodes
        log(n.name, f"dense layer on {k:,} inputs (an exact int32 sum holds {ACC_TAPS_MAX:,}) -> "
                    f"{len(parts)} dense layers on slices of its input, summed")
    return g

"""A max pool the KPU can do, as a KPU layer of its own (kmodel v4): a 1x1 conv that copies every
channel byte for byte (weights 1 on the diagonal, BN x1, identity activation: kpu.copy_layer),
then the KPU's max pool. Max commutes with the uint8 quantization, so the output bytes are those
of the CPU pool; where the v3 runtime pools uint8 on the CPU (QUANTIZED_MAX_POOL2D), nncase
v0.2's pools are float only: dequantize, reduce_window2d and quantize, with float temporaries of
4 B a value (or a node triple per channel slice). This form keeps the map uint8 in KPU RAM and
stores C x C weight bytes. It is the pool after a depthwise conv (the KPU's pool is not fused
into a depthwise layer: fuse_pool) or after a layer that stays on the CPU.

Only the pools whose silicon behaviour is settled: max 2x2 at stride 2 and 4x4 at stride 4,
unpadded (the stride-1 pool's border rule is not, docs/kpu.md)."""
from __future__ import annotations

import numpy as np

from tl2k210.graph import Node
from tl2k210.k210 import hardware as hw
from tl2k210.passes.fuse_pool import pool_of

from . import kpu
from .conv import emit_layer, geometry, input_terms, kpu_conv_refuses, plan_for
from .registry import KPU, NA, lowering
from .state import SMALLER_TAKEN, wants_small


def _copy_conv(node, pool):
    """The 1x1 copy conv with the pool fused, as the KPU layer the pool becomes."""
    attrs = dict(kernel=(1, 1), strides=(1, 1), pads=[0, 0, 0, 0], dilations=(1, 1), group=1, pool=pool)
    return Node("Conv", [node.inputs[0]], [node.outputs[0]], attrs, node.name)


def kpu_pool_refuses(g, node, opts):
    """Why this max pool does not run as its own KPU layer (None if it does)."""
    pool = pool_of(node)
    if pool is None or pool["kind"] != "max" or pool["size"] != pool["stride"] or any(pool["pads"]):
        return NA       # not a pool the KPU does (the CPU pools it)
    if getattr(opts, "format", "v3") != "v4" or node.inputs[0] in g.inputs:
        return NA       # v3 pools uint8 on the CPU, and so does v4 a pool of the image itself
    if wants_small(opts, node):
        return f"{SMALLER_TAKEN}: the CPU pool stores no weights"
    h, w = g.shape(node.outputs[0])[2:]
    if min(h, w) < hw.LIMITS["out_min"]:
        return NA
    return kpu_conv_refuses(g, _copy_conv(node, pool), opts)


@lowering("MaxPool", unit=KPU, check=kpu_pool_refuses, formats=("v4",), name="kpu_pool")
def kpu_pool(lw, node):
    x = node.inputs[0]
    c = lw.shape(x)[0]
    pool = pool_of(node)
    conv = _copy_conv(node, pool)
    k = pool["size"]
    row = lw.row(node, f"max pool {k}x{k}/{k} on the KPU: a 1x1 copy of its {c} channels, then the KPU's pool "
                       "(v4 pools in float on the CPU)", in_shape=lw.shape(x),
                 out_shape=lw.shape(node.outputs[0]))
    s, _, z, _ = input_terms(lw, x, c)
    lq = kpu.copy_layer(np.eye(c, dtype=np.uint8).reshape(c, c, 1, 1), (float(s[0]), z), lw.opts.weight_bits)
    emit_layer(lw, conv, geometry(lw, conv), plan_for(lw, conv), lq, row)
    lw.smaller[node.name] = True      # the CPU pool: the same max, the same output bytes

"""One scale for a concat and the inputs only it reads: their producers write at the concat's
quantization, so the concat is a plain copy instead of a REQUANTIZE table (256 B and a pass over
the map) per input, and no value is rounded twice.

    ranges = shared_concat_ranges(graph, ranges)      # a new dict; the caller's is unchanged

For each Concat of uint8 maps (not one feeding a model output, which concatenates floats), each
input is followed up through the ops whose uint8 output keeps its input's quantization (max pools,
nearest resizes, relabels, a KPU conv's own pool) to the tensor that sets it. The tensors on that
way take the concat's range when:
* each is read by the next one only (the concat reads the first): no other layer sees coarser
  steps (a branch read elsewhere too keeps its own scale and its REQUANTIZE);
* the first can be written at any scale (not the model input, nor the entry conv that carries
  the pixel range), and its range lies inside the concat's.
Concats are visited last first, so a concat read only by a later one passes that one's range on.
Measured (bench/layer_gap.py --draws): SemanticSegmentation4M5StickV +0.24 dB at its output over
4 drawn builds, every concat +0.14..0.33 dB; DAE_for_M5StickV 20 -> 13 REQUANTIZE layers,
-0.16 dB over 8 builds.
"""
from __future__ import annotations

from tl2k210.graph import RELABELS, feeds_output, stage_names, toposort

#: ops whose uint8 output has its input's quantization (lower/cpu.py: max_pool, resize_nearest)
KEEPS_SCALE = ("MaxPool", "GlobalMaxPool", "Resize", *RELABELS)


def shared_concat_ranges(g, ranges: dict) -> dict:
    out = dict(ranges)
    fixed = set(g.inputs) | set(g.outputs) | {g.meta.get("entry_conv")}
    for n in reversed(toposort(g)):
        if n.op != "Concat" or feeds_output(g, n.outputs[0]) or n.outputs[0] not in out:
            continue
        lo, hi = out[n.outputs[0]]
        for t in n.inputs:
            chain = [x for x in _chain(g, t) or () if x in out]
            if not chain or any(x in fixed for x in chain):
                continue
            rlo, rhi = out[chain[-1]]
            if lo <= rlo and rhi <= hi:
                for x in chain:
                    out[x] = (lo, hi)
    return out


def _chain(g, t) -> list | None:
    """t, then the inputs of the scale-keeping ops that lead to it, up to the tensor that sets
    its quantization (a KPU conv's pre-pool activation when the conv pools); None when one of
    them is read by another layer too."""
    chain = [t]
    while True:
        if len(g.consumers(chain[-1])) != 1:
            return None
        p = g.producer(chain[-1])
        if p is not None and p.op in KEEPS_SCALE and p.inputs and not g.tensors[p.inputs[0]].is_const:
            chain.append(p.inputs[0])
            continue
        if p is not None and p.attrs.get("pool"):
            chain.append(stage_names(p)["act"])
        return chain

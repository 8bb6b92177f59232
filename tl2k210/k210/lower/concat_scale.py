"""One scale for a concat and its inputs: each input's producer writes at the concat's
quantization, so the concat is a plain copy instead of a REQUANTIZE table (256 B and a pass over
the map) per input, and no value is rounded twice.

    ranges = shared_concat_ranges(graph, ranges)      # a new dict; the caller's is unchanged

For each Concat of uint8 maps (not one feeding a model output, which concatenates floats), each
input is followed up through the ops whose uint8 output keeps its input's quantization (max pools,
nearest resizes, relabels, a KPU conv's own pool) to the tensor that sets it. That tensor and the ones in between take
the concat's range when:
* its producer can write any scale (not the model input, nor the entry conv that carries the pixel range);
* its own range lies inside the concat's (min/max calibration: always), and spans at least
  MIN_SHARE of it: its other readers then see at most two bits fewer. A narrower map keeps its
  own finer steps and its REQUANTIZE.
This is what TFLite's quantizer does for a concat (inputs and output on one scale).
"""
from __future__ import annotations

from tl2k210.graph import RELABELS, feeds_output, stage_names, toposort

MIN_SHARE = 0.25
#: ops whose uint8 output has its input's quantization (lower/cpu.py: max_pool, resize_nearest)
KEEPS_SCALE = ("MaxPool", "GlobalMaxPool", "Resize", *RELABELS)


def shared_concat_ranges(g, ranges: dict) -> dict:
    out = dict(ranges)
    fixed = set(g.inputs) | {g.meta.get("entry_conv")}
    for n in reversed(toposort(g)):    # last first: a concat read by a later one takes its range first
        if n.op != "Concat" or feeds_output(g, n.outputs[0]) or n.outputs[0] not in out:
            continue
        lo, hi = out[n.outputs[0]]
        for t in n.inputs:
            chain = _chain(g, t)
            root = chain[-1]
            if root in fixed or root not in out or g.tensors[root].is_const:
                continue
            p = g.producer(root)
            if p is not None and p.attrs.get("pool"):   # a KPU conv's pool keeps its activation's scale
                chain.append(stage_names(p)["act"])
            rlo, rhi = out[chain[-1]] if chain[-1] in out else out[root]
            if lo <= rlo and rhi <= hi and rhi - rlo >= MIN_SHARE * (hi - lo):
                for x in chain:
                    out[x] = (lo, hi)
    return out


def _chain(g, t) -> list:
    """t, then the inputs of the scale-keeping ops that lead to it, up to the tensor that sets it."""
    chain = [t]
    while True:
        p = g.producer(chain[-1])
        if p is None or p.op not in KEEPS_SCALE or not p.inputs or g.tensors[p.inputs[0]].is_const:
            return chain
        chain.append(p.inputs[0])

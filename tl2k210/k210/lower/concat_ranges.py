"""One grid for a channel concat and the maps it copies.

QUANTIZED_CONCAT copies bytes, so every input on another grid than the concat's output is first
requantized (a 256-byte REQUANTIZE table and a pass over the map, rounding the map a second time).
Where an input is the only reader of a map whose grid its producer chooses (a conv, an add: they
write at any scale), that map may as well be written on the concat's grid, as TFLite's int8
converter makes them: one rounding instead of two, no table, and the producer can write into the
concat's buffer. The output range is the union of the inputs' (min/max calibration), so each such
map's range widens to it. The walk back from an input passes ops whose output keeps their input's
grid (max pools, nearest resizes, relabels), each the only reader of its input; it stops at the
model input (its pixel grid is fixed). A concat that feeds a model output, also through other
concats and transposes (a detector's heads per level, then across levels), stays float (scores
beside boxes keep their own steps) and is left alone."""
from __future__ import annotations

from tl2k210.graph import RELABELS, toposort

from .cpu import concat_refuses
from .fc import CONCAT_MOVES, feeds_output

#: ops whose uint8 output keeps their input's scale and zero point in the lowering
SAME_GRID = ("MaxPool", "GlobalMaxPool") + tuple(RELABELS)


def _keeps_grid(node) -> bool:
    return node.op in SAME_GRID or node.op == "Resize" and node.attrs.get("mode", "nearest") == "nearest"


def _path(g, t):
    """The tensors from t back to the map whose grid its producer chooses, each read only by the
    next; None where the walk meets the model input, a constant or a shared map."""
    path = []
    while True:
        if t in g.inputs or t in g.outputs or len(g.consumers(t)) != 1 or g.tensors[t].is_const:
            return None
        path.append(t)
        p = g.producer(t)
        if p is None:
            return None
        if not _keeps_grid(p):
            return path
        t = p.inputs[0]


def share_concat_ranges(g, ranges: dict) -> int:
    """Give each channel concat's inputs its output range where they may take it (module doc);
    returns how many maps moved to a concat's grid. The row bands of one conv (passes/kxk_bands:
    g.meta["row_bands"], their Concats) always take it, on any axis, clipped as the whole conv's
    output would be: each band then writes the whole conv's bytes."""
    moved, bands = 0, g.meta.get("row_bands", ())
    for node in reversed(toposort(g)):           # a concat feeding a concat: the outer one first
        out = node.outputs[0] if node.op == "Concat" else None
        band = node.name in bands
        if out is None or out not in ranges or not band and (
                concat_refuses(g, node, None) or feeds_output(g, out, CONCAT_MOVES)):
            continue
        lo, hi = ranges[out]
        for t in set(node.inputs):
            if node.inputs.count(t) != 1:
                continue
            path = _path(g, t)
            if not path or any(m not in ranges for m in path):
                continue
            if not band and any(ranges[m][0] < lo or ranges[m][1] > hi for m in path) or \
                    all(tuple(ranges[m]) == (lo, hi) for m in path):
                continue
            for m in path:
                ranges[m] = (lo, hi)
            moved += 1
    return moved

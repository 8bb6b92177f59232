"""IR -> kmodel: KPU convs where the hardware can run them exactly, SDK CPU layers for the rest.

    model, rows, trace_map, lw = lower(graph, ranges, Options(...))

One small function per op kind, in a registry (`registry.py`): `conv.py` (KPU convs), `kxk.py` (K x K kernels as 3x3
stages), `fc.py` (dense layers), `cpu.py` (SDK CPU layers), `layout.py` (relabels). `state.py` holds where each
tensor lives and emits the moves between KPU RAM, uint8 and float main memory. Every IR node
becomes one or more kmodel layers and a receipt row saying where it runs and why.
"""
from . import conv, cpu, fc, kxk, layout  # noqa: F401  (register the lowerings)
from .registry import REGISTRY, select, supported_ops  # noqa: F401
from .state import Loc, Lowering, Options, Row  # noqa: F401


def lower(graph, ranges, opts: Options | None = None):
    """Returns (KModelV3, receipt rows, trace map {tensor: (layer index, kind)}, lowering)."""
    lw = Lowering(graph, ranges, opts)
    model = lw.run()
    return model, lw.rows, lw.trace_map, lw

"""Which IR ops the K210 back-end lowers, how, and on which unit: one registry of small functions.

    @lowering("Resize", unit=CPU_U8, check=nearest_integer_scale)
    def resize(lw, node): ...

Per op the alternatives are tried in order of preference: the KPU (exact integer hardware), then
a quantized (uint8) CPU layer, then a float CPU layer; registration order breaks ties. The first
alternative whose `check(graph, node, opts)` returns None lowers the node; a check returns the
reason it cannot, phrased so a user knows what to change (or `NA`: "not about this node",
which no message mentions). Checks read only the graph (shapes,
attributes, constants), so the pass `check_supported` asks the same question before calibration:
"supported" means "lowered". The reasons of the alternatives passed over become the receipt's
"why" for the chosen one, and the refusal when none applies.

`needs_format(op, fmt, why)` records what only another kmodel format can express (bilinear
resize, general pad/slice, convs on the CPU): the refusal then says "needs `--format v4`". A v4
back-end registers real alternatives with `formats=("v4",)` and the same checks decide.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from tl2k210.errors import UnsupportedOpError

KPU, CPU_U8, CPU_F32 = "KPU", "CPU uint8", "CPU float"
RELABEL = "no-op"          # the same bytes under another name/shape: no layer at all
UNIT_RANK = {RELABEL: 0, KPU: 1, CPU_U8: 2, CPU_F32: 3}
FORMATS = ("v3",)          # kmodel formats this release writes
NA = ""                    # a check's answer for "this alternative is not about this node": no note


@dataclass(frozen=True)
class Alternative:
    op: str
    name: str
    unit: str
    formats: tuple
    check: Callable | None       # (graph, node, opts) -> None | reason
    fn: Callable | None          # (lowering, node) -> None; None = only a format can express it

    def refuses(self, g, node, opts):
        return self.check(g, node, opts) if self.check is not None else None


REGISTRY: dict[str, list[Alternative]] = {}


def _add(alt: Alternative):
    alts = REGISTRY.setdefault(alt.op, [])
    alts.append(alt)
    alts.sort(key=lambda a: UNIT_RANK[a.unit])     # stable: registration order within a unit


def lowering(*ops, unit, check=None, formats=("v3",), name=None):
    """Register `fn(lowering, node)` as a way to lower `ops` on `unit`."""
    def deco(fn):
        for op in ops:
            _add(Alternative(op, name or fn.__name__, unit, tuple(formats), check, fn))
        return fn
    return deco


def needs_format(op, fmt, why, check=None, unit=CPU_F32):
    """`op` (where `check` passes) can only be expressed in kmodel `fmt`; `why` says which layer."""
    _add(Alternative(op, f"{fmt}: {why}", unit, (fmt,), check, None))


def supported_ops(fmt="v3"):
    return sorted(op for op, alts in REGISTRY.items() if any(fmt in a.formats and a.fn for a in alts))


def describe(node) -> str:
    """'Conv kernel=(5, 5) strides=(1, 1) ...': the op and its small attributes, for messages."""
    parts = []
    for k, v in node.attrs.items():
        if isinstance(v, np.ndarray):
            if v.size > 8:
                continue
            v = v.tolist()
        parts.append(f"{k}={v}")
    return f"{node.op} {' '.join(parts)}".strip()


def select(g, node, opts, fmt="v3"):
    """(chosen Alternative, [(passed-over Alternative, reason)]) or UnsupportedOpError."""
    from tl2k210.passes.check_supported import NEAREST
    alts = REGISTRY.get(node.op)
    if not alts:
        hint = NEAREST.get(node.op, f"one of {', '.join(supported_ops(fmt))}")
        raise UnsupportedOpError(f"node {node.name!r}: op {describe(node)} has no K210 lowering; "
                                 f"nearest supported form: {hint}")
    passed = []
    for alt in alts:
        reason = alt.refuses(g, node, opts)
        if reason is not None:
            passed.append((alt, reason))
            continue
        if fmt in alt.formats and alt.fn is not None:
            return alt, passed
        passed.append((alt, None))          # possible, but not in this format
    other = [a for a, r in passed if r is None]
    lines = [f"{a.name} ({a.unit}): {r}" for a, r in passed if r]
    if other:
        fmts = sorted({f for a in other for f in a.formats})
        lines.append(f"{other[0].name.split(': ', 1)[-1]}: needs `--format {fmts[0]}` "
                     f"(kmodel {fmts[0]}; this release writes {', '.join(FORMATS)})")
    raise UnsupportedOpError(f"node {node.name!r}: {describe(node)} cannot be lowered to kmodel "
                             f"{fmt}:\n  - " + "\n  - ".join(lines))


def why_not(passed) -> str:
    """The receipt's note on the alternatives passed over."""
    return "; ".join(f"not {a.name}: {r}" for a, r in passed if r)

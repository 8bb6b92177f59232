"""Which IR ops the K210 back-end lowers, how, and on which unit: one registry of small functions.

    @lowering("Resize", unit=CPU_U8, check=nearest_integer_scale)
    def resize(lw, node): ...

Per op the alternatives are tried in order of preference: the KPU (exact integer hardware), then
a quantized (uint8) CPU layer, then a float CPU layer; registration order breaks ties. The first
alternative whose `check(graph, node, opts)` returns None lowers the node; a check returns the
reason it cannot, phrased so a user knows what to change (or `NA`: "not about this node",
which no message mentions). Checks read only the graph (shapes,
attributes, constants), so the flow's last pass `check_supported` (`tl2k210.k210.flow`) asks the same question before calibration:
"supported" means "lowered". The reasons of the alternatives passed over become the receipt's
"why" for the chosen one, and the refusal when none applies.

Formats: a lowering that emits SDK v3 layers serves both kmodel formats (the v4 emission,
`v4emit.py`, translates every v3 layer into v4 nodes); one that emits v4-only nodes registers
`formats=("v4",)`. `select(..., "v3")` passes over v4-only alternatives and its refusal then says
"needs kmodel v4"; `"auto"` takes the first format that lowers the node. `needs_format(op, fmt,
why)` records what only a format this release does not write could express.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

from tl2k210.errors import UnsupportedOpError
from tl2k210.graph import describe

KPU, CPU_U8, CPU_F32 = "KPU", "CPU uint8", "CPU float"
RELABEL = "no-op"          # the same bytes under another name/shape: no layer at all
UNIT_RANK = {RELABEL: 0, KPU: 1, CPU_U8: 2, CPU_F32: 3}
FORMATS = ("v3", "v4")    # kmodel formats this release writes (--format auto picks one)
NA = ""                    # a check's answer for "this alternative is not about this node": no note

# op -> the nearest form that has a lowering, for the refusal of an op with none
NEAREST = {
    "ConvTranspose": "nearest UpSampling2D (Resize) followed by a 3x3 Conv",
    "PRelu": "PReLU with one constant slope per channel (the pass prelu_split runs it on the KPU); not slopes that vary over the map",
    "Gelu": "Swish (x*sigmoid(x)) or ReLU",
    "ReduceMean": "GlobalAveragePooling2D", "ReduceMax": "GlobalMaxPooling2D",
    "LSTM": "a convolutional model (no recurrent ops on the K210)", "GRU": "a convolutional model",
    "RNN": "a convolutional model", "Upsample": "Resize with mode nearest",
    "InstanceNormalization": "BatchNormalization after a Conv (folded into it)",
    "Einsum": "Dense (MatMul) layers",
    "Loop": "a model without loops (a TF while_loop, as Keras 3 writes LSTM/GRU layers; the K210 runs a "
            "fixed sequence of layers): export a convolutional model",
    "Scan": "a model without loops (a scan over time steps, as tf2onnx writes a TF1 dynamic_rnn's LSTM/GRU "
            "cell; the K210 runs a fixed sequence of layers): export a convolutional model",
    "ArgMax": "the scores before it: convert with --outputs {input}{upsampled} (or export the model without "
              "its ArgMax) and take the argmax in the application (K210 runtimes have none)",
    **{op: "the values it compares: a comparison's 0/1 map (a threshold, a decision tree's routing, as in "
           "Deep Tree Learning's anti-spoofing nets) has no K210 layer; convert with --outputs naming them "
           "({inputs}) and compare them in the application"
       for op in ("Greater", "GreaterOrEqual", "Less", "LessOrEqual")},
    "Gather": "none on the K210: a table looked up by the model's integer input (a text model's embedding) "
              "or elements picked by index (an audio front end's framing); do the lookup in the application "
              "and convert the network that reads its result (--inputs NAME starts the model at that tensor), "
              "or export the model without the pick",
    "Cast": "the network before its decoder: a Cast is index arithmetic (MoveNet's keypoint decoding, "
            "a detector's box decoding); convert with --outputs naming its heatmaps or scores (or export "
            "the model up to them) and decode them in the application",
}


#: the advice for an op NEAREST calls a decoder's, where a layer with weights reads what it computes
INSIDE = {
    "Cast": "it sits inside the network (a layer with weights reads what it computes): integer arithmetic "
            "between layers (NEMO's integer-deployable ONNX floors each requantization through int64) has no "
            "K210 form; convert the model's float or QDQ export instead",
}
LAYERS = ("Conv", "ConvTranspose", "MatMul", "Gemm")


def _feeds_a_layer(g, node) -> bool:
    """Does a layer with weights (LAYERS) read, through any ops, what `node` computes?"""
    seen, todo = set(), list(node.outputs)
    while todo:
        t = todo.pop()
        for u in g.consumers(t):
            if u.op in LAYERS:
                return True
            if u.name not in seen:
                seen.add(u.name)
                todo.extend(u.outputs)
    return False


@dataclass(frozen=True)
class Alternative:
    op: str
    name: str
    unit: str
    formats: tuple
    check: Callable | None       # (graph, node, opts) -> None | reason
    fn: Callable | None          # (lowering, node) -> None; None = only a format can express it
    takes: Callable | None = None    # (graph, node, opts) -> None | why it goes before better units
    explicit: bool = False       # only where the user named its format: `--format auto` takes the other's form

    def refuses(self, g, node, opts):
        return self.check(g, node, opts) if self.check is not None else None


REGISTRY: dict[str, list[Alternative]] = {}


def _add(alt: Alternative):
    alts = REGISTRY.setdefault(alt.op, [])
    alts.append(alt)
    alts.sort(key=lambda a: UNIT_RANK[a.unit])     # stable: registration order within a unit


def lowering(*ops, unit, check=None, formats=FORMATS, name=None, takes=None, explicit=False):
    """Register `fn(lowering, node)` as a way to lower `ops` on `unit`. `takes(graph, node, opts)`:
    why this alternative goes before those of better units (the smaller form the plan asked for:
    v4conv.cpu_trade), or None; it answers only where its own check passes. `explicit`: a
    workaround for what only another format does plainly (cpu.zero_pad), taken only where the
    user asked for this format by name or the runtime loads no other (`opts.v3_only`), so
    `--format auto` keeps choosing that other format where it can."""
    def deco(fn):
        for op in ops:
            _add(Alternative(op, name or fn.__name__, unit, tuple(formats), check, fn, takes, explicit))
        return fn
    return deco


def needs_format(op, fmt, why, check=None, unit=CPU_F32):
    """`op` (where `check` passes) can only be expressed in kmodel `fmt`; `why` says which layer."""
    _add(Alternative(op, f"{fmt}: {why}", unit, (fmt,), check, None))


def supported_ops(fmt="v3"):
    fmts = FORMATS if fmt == "auto" else (fmt,)
    return sorted(op for op, alts in REGISTRY.items() if any(f in a.formats and a.fn for a in alts for f in fmts))


def _before_upsampling(g, t) -> str:
    """', or before their upsampling, ...' where scores `t` are a segmenter's upsampled logits (a
    Resize, then a softmax or data movement): the full-size map is what would not fit (hunt 22:
    BiSeNetV2's 19x256x256 float probabilities, 19.9 MB of main memory, where its 32x32 logits
    convert at 98 % of pixels agreeing); else ''."""
    while (p := g.producer(t)) is not None and p.op in ("Softmax", "Sigmoid", "Transpose", "Reshape", "Identity"):
        t = p.inputs[0]
    p = g.producer(t)
    if p is None or p.op not in ("Resize", "Upsample"):
        return ""
    name = (g.file_names([p.inputs[0]]) or [g.source_name(p.inputs[0])])[0]
    return f", or, smaller, the scores before their upsampling, --outputs {name}, upsampled in the application"


def select(g, node, opts, fmt="v3"):
    """(chosen Alternative, [(passed-over Alternative, reason)]) or UnsupportedOpError. `fmt`
    "auto": the v3 choice when there is one (widest firmware support), else the v4 one."""
    if fmt == "auto":
        try:
            return select(g, node, opts, "v3")
        except UnsupportedOpError:
            return select(g, node, opts, "v4")
    alts = REGISTRY.get(node.op)
    if not alts:
        inside = INSIDE.get(node.op) if _feeds_a_layer(g, node) else None
        # the tensors it reads as --outputs takes them (the file's names; no constant: hunt 22's
        # Deep Tree anti-spoofing advice named tf2onnx's Gemm output and the threshold)
        named = g.file_names([i for i in node.inputs if i and g.const(i) is None])
        hint = NEAREST.get(node.op, "").replace(
            "{inputs}", ", ".join(map(repr, named)) if named else "the tensors it reads (netron shows their names)"
        ).replace("{input}", g.source_name(node.inputs[0]) if node.inputs else "").replace(
            "{upsampled}", _before_upsampling(g, node.inputs[0]) if node.inputs else "")
        hint = inside or (f"nearest supported form: {hint}" if hint else
                          f"replace it in the model with supported ops: {', '.join(supported_ops(fmt))}")
        err = UnsupportedOpError(f"node {node.name!r}: op {describe(node)} has no K210 lowering; {hint}")
        if node.op not in NEAREST:      # (NEAREST's advice is the op's own)
            err.node = node.name
        raise err
    named = getattr(opts, "format", fmt) == fmt   # the user's format, not one `auto` tries
    workarounds = named or fmt == "v3" and getattr(opts, "v3_only", False)   # explicit alternatives
    if not named:      # checks may ask which format is being planned
        opts = dataclasses.replace(opts, format=fmt)
    taker = next(((a, why) for a in alts if a.takes is not None and fmt in a.formats
                  for why in [a.takes(g, node, opts)] if why), None)
    passed = []
    for alt in alts:
        if alt.explicit and (not workarounds or fmt not in alt.formats):
            passed.append((alt, NA))
            continue
        reason = alt.refuses(g, node, opts)
        if reason is None and taker is not None and UNIT_RANK[alt.unit] < UNIT_RANK[taker[0].unit]:
            reason = taker[1]
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
        if fmts[0] in FORMATS:
            lines.append(f"{other[0].name} ({other[0].unit}): needs kmodel {fmts[0]}: use `--format "
                         f"{fmts[0]}` or `--format auto` (a firmware that loads {fmts[0]}: see --runtime)")
        else:
            lines.append(f"{other[0].name.split(': ', 1)[-1]}: needs kmodel {fmts[0]}, which this release "
                         f"does not write (it writes {', '.join(FORMATS)})")
    err = UnsupportedOpError(f"node {node.name!r}: {describe(node)} cannot be lowered to kmodel {fmt}:\n  - "
                             + "\n  - ".join(lines))
    err.node = node.name        # for the advice the caller may add (fit.end_before)
    raise err


def smaller_alternative(g, node, opts, chosen):
    """(Alternative, format) that `node`'s smaller form takes instead of `chosen`, possibly only in
    kmodel v4, or None: a layer of a better unit (uint8 CPU for float: a byte a weight, not four),
    or the uint8 CPU layer for a KPU conv (v4conv.cpu_trade: a byte a weight, without the KPU's
    per-channel args, tables and alignment, or a K x K conv's shift stages storing them several
    times), or the float one where uint8 weights would keep too little (v4conv.float_trade_why).
    The checks see `opts.small` naming the node (state.wants_small)."""
    if chosen.unit == RELABEL:
        return None
    small = dataclasses.replace(opts, small=frozenset({node.name}))
    for fmt in FORMATS:
        try:
            alt, _ = select(g, node, small, fmt)
        except UnsupportedOpError:
            continue
        if UNIT_RANK[alt.unit] < UNIT_RANK[chosen.unit] or chosen.unit == KPU and alt.unit in (CPU_U8, CPU_F32):
            return alt, fmt
    return None


def why_not(passed) -> str:
    """The receipt's note on the alternatives passed over."""
    return "; ".join(f"not {a.name}: {r}" for a, r in passed if r)

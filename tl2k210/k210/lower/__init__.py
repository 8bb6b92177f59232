"""IR -> kmodel: KPU convs where the hardware can run them exactly, CPU layers for the rest.

    model, rows, trace_map, lw = lower(graph, ranges, Options(...))

One small function per op kind, in a registry (`registry.py`): `conv.py` (KPU convs), `kxk.py`
(K x K kernels as 3x3 stages), `fc.py` (dense layers), `cpu.py` (SDK CPU layers), `layout.py`
(relabels), `v3resize.py` (kmodel v3's bilinear 2x: nearest + a KPU filter), and the kmodel v4
ops (`v4conv.py`, `v4elementwise.py`, `v4ops.py`, `v4resize.py`).
`state.py` holds where each tensor lives and emits the moves between KPU RAM, uint8 and float main
memory; `v4emit.py` writes a plan as kmodel v4. Every IR node becomes one or more kmodel layers and
a receipt row saying where it runs and why.

`Options.format`: "v3" (every MaixPy build loads it), "v4" (nncase v0.2's format: CPU convs,
bilinear resize, elementwise and reduce ops...) or "auto": v3 when every layer has a v3 form,
else v4, and `lw.forced_by` names the node (and the reason) that needed v4.
"""
import dataclasses

from tl2k210.errors import KpuLimitError, UnsupportedOpError
from tl2k210.graph import describe

from . import conv, cpu, fc, kxk, layout, v3resize  # noqa: F401  (register the lowerings)
from . import kpupool  # noqa: F401  (before the CPU pools of its op: registration order within a unit)
from . import v4ops, v4resize, v4phases, v4gather, v4elementwise, v4conv, v4norm  # noqa: F401  (the kmodel v4 lowerings)
from .registry import CPU_F32, FORMATS, REGISTRY, select, smaller_alternative, supported_ops  # noqa: F401
from .state import Loc, Lowering, Options, Row, wants_small  # noqa: F401


def plan_format(graph, opts: Options | None = None):
    """(format, forced_by) before calibration: "v3" or "v4" for `opts.format`, with "auto"
    resolved by the per-node checks; forced_by = (node name, why v3 cannot) or None. Raises the
    refusal of the first node the chosen format cannot lower."""
    from tl2k210.graph import toposort
    opts = opts or Options()
    fmt = opts.format
    if fmt not in FORMATS + ("auto",):
        raise UnsupportedOpError(f"--format {fmt!r}: choose from {', '.join(FORMATS + ('auto',))}")
    if opts.weight_bits != 8 and fmt == "v4":
        raise UnsupportedOpError("kmodel v4 has 8-bit KPU weights only (the nncase v0 runtime sets "
                                 "eight_bit_mode unconditionally): drop --weight-bits 16 or use --format v3")
    order = toposort(graph)
    if fmt != "auto":
        for n in order:
            select(graph, n, opts, fmt)
        return fmt, None
    for n in order:
        try:
            alt3, _ = select(graph, n, opts, "v3")
            if wants_small(opts, n):     # the smaller form may be a layer only kmodel v4 has
                smaller = smaller_alternative(graph, n, opts, alt3)
                if smaller is not None and smaller[1] == "v4":
                    return "v4", (n.name, f"{describe(n)} in its smaller form, {smaller[0].name} "
                                          f"({smaller[0].unit}), which only kmodel v4 has")
        except UnsupportedOpError as e3:
            select(graph, n, opts, "v4")      # raises what neither format can do
            if opts.weight_bits != 8:
                raise UnsupportedOpError(f"{e3}\n  (kmodel v4 would lower it, but v4 has 8-bit KPU "
                                         "weights only: drop --weight-bits 16)") from None
            return "v4", (n.name, _first_reason(n, e3))
    return "v3", None


def _first_reason(node, err) -> str:
    """"<op attrs>: why each v3 alternative does not apply" (or "has no kmodel v3 layer")."""
    lines = [ln.strip()[2:] for ln in str(err).splitlines()[1:] if ln.strip().startswith("- ")]
    why = "; ".join(ln for ln in lines if "needs kmodel" not in ln)
    return f"{describe(node)}: " + (why or "no kmodel v3 layer does this")


def lower(graph, ranges, opts: Options | None = None, planned=None):
    """Returns (KModelV3 or KModelV4, receipt rows, trace map {tensor: (layer/node index, kind)},
    lowering). `planned`: the (format, forced_by) the flow's check_supported answered for these
    options (else planned here). With format "auto", a v3 plan that fails on a whole-model rule
    (what the v3 runtimes need of the first layer: a KPU conv reading the whole image) is redone
    as v4."""
    opts = opts or Options()
    fmt, forced = planned or plan_format(graph, opts)
    lw = Lowering(graph, ranges, dataclasses.replace(opts, format=fmt))
    try:
        model = lw.run()
    except (UnsupportedOpError, KpuLimitError) as e:
        if opts.format != "auto" or fmt != "v3" or opts.weight_bits != 8:
            raise
        try:         # what only v3's whole-model rules refuse (the first layer reads the whole image)
            lw = Lowering(graph, ranges, dataclasses.replace(opts, format="v4"))
            model = lw.run()
        except (UnsupportedOpError, KpuLimitError):
            raise e from None
        forced = (None, str(e).splitlines()[0])
        lw.v3_error = e
    lw.forced_by = forced
    if lw.quantized_model:
        _say_float_layers_inexact(lw)
    return model, lw.rows, lw.trace_map, lw


def _say_float_layers_inexact(lw):
    """A quantized model's layers computed in float on the CPU do not round as TFLite's int8
    kernels do: the receipt says so (the KPU and uint8 layers say "int8 exact" or why not)."""
    for r in lw.rows:
        alt = lw.choice.get(r.node, (None,))[0]
        said = any(n.startswith(("int8 exact", "not exact")) for n in r.notes)
        if getattr(alt, "unit", None) == CPU_F32 and not said:
            r.notes.append("not exact: computed in float on the CPU (TFLite: an int8 kernel); rounded to the "
                           "model's grid only where a uint8 layer reads it")

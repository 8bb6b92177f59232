"""Does a kmodel fit the firmware it is made for? Checked before anything is written.

* format: kmodel v4 only on builds that load it (firmware.RUNTIMES[...].kmodel_versions;
  docs/kmodel-format.md#versions-and-loaders: MaixPy builds with KMODEL_V4_SUPPORT and the SDK
  since V0.5.7 do, `maixpy-minimum` does not); the refusal names the layer that needs v4.
* memory: model file + main memory within what the build leaves (`model_budget`); the refusal
  gives the budget, the 8-bit ideal (ideal.py) against ours, the layers furthest from their ideal
  and the buffers live at the main-memory peak. `check_ideal` refuses, before calibration, a model
  whose floor (the ideal's weights + the maps the KPU RAM cannot hold) exceeds the budget: no form
  of it fits.
* forms: `choose_forms` picks, per layer, the fastest exact form such that the whole model fits,
  and smaller forms where they cost at most LATENCY_SLACK of its time (or the smallest,
  --optimize size, faster where SIZE_SLACK of its bytes buys it), and says what it traded.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tl2k210.errors import KpuLimitError, Tl2k210Error
from tl2k210.graph import RELABELS, fixed_sizes, nodes_after, through_relabels
from tl2k210.k210 import cost, firmware, hardware as hw
from tl2k210.k210.ideal import WEIGHT_OPS, mb
from tl2k210.k210.lower.conv import WINDOWS
from tl2k210.k210.lower.memory import PARK, SLICES


class BudgetError(Tl2k210Error):
    """Too big for the runtime. `ideal_fits`: the model's 8-bit ideal fits it (smaller forms may)."""
    ideal_fits = False


class FormatError(Tl2k210Error):
    pass


def loads_format(runtime: str, fmt: str) -> bool:
    return int(fmt.lstrip("v")) in firmware.get(runtime).kmodel_versions


def forced_text(forced) -> str:
    node, why = forced
    return f"node {node!r}: {why}" if node else why


def check_format(fmt: str, forced, runtime: str, floor: int = 0, graph=None, source=None):
    """FormatError when `runtime` cannot load kmodel `fmt`; the runtimes it names load it and
    leave at least `floor` bytes (the 8-bit ideal's: a COCO SSD's 4.09 MB of weights were told
    to try full MaixPy's 2 MiB). `graph` (the lowered one) and `source` (the model as read): where
    the layer that needs `fmt` is post-processing, the --outputs that end the model before it."""
    if loads_format(runtime, fmt):
        return
    rt = firmware.get(runtime)
    need = f" (needed by {forced_text(forced)})" if forced else ""
    builds = fitting_runtimes(floor, int(fmt.lstrip("v")))
    use = (f"Use --runtime {' or '.join(builds)}" if builds else
           f"No runtime that loads it holds the model's 8-bit ideal ({floor:,} B): use a smaller network")
    raise FormatError(f"kmodel {fmt}{need} does not load on '{runtime}' ({rt.release}: it loads kmodel "
                      f"{'/'.join(f'v{v}' for v in rt.kmodel_versions)} only; MaixPy says "
                      f"'{rt.version_text()}'). {use}, or "
                      + ((_cut_before(graph, source, forced[0]) or _start_after(graph, source, forced[0])
                          or "change that layer to one kmodel v3 has")
                         if forced else "--format auto (v3 when every layer has a v3 form)") + ". Nothing was written.")


def _cut_before(graph, source, name):
    """'end the model before it (--outputs ...)' where node `name` of `graph`, and every other node
    a v3-only build refuses (graph.meta["v3_refused"]), is post-processing (neither a weight op
    nor one after it) and the tensors to end at are the source model's too; else None."""
    if graph is None or source is None:
        return None
    after, ends = _ends_before(graph, set(graph.meta.get("v3_refused", ())) | {name})
    if name not in after or any(n.op in WEIGHT_OPS for n in after.values()):
        return None
    ends = source.file_names(ends)
    if not ends or any(t not in source.tensors for t in ends):
        return None
    return f"end the model before it (--outputs {','.join(ends)}) and do that step in the application"


def _ends_before(graph, names):
    """({name: node} of the nodes `names` and every node after them, the tensors a model that ends
    before them outputs: what they read from the rest, and the outputs none of them makes)."""
    cut = [n for n in graph.nodes if n.name in names]
    after = {n.name: n for r in cut for n in [r] + nodes_after(graph, r)}
    made, fixed = {t for n in after.values() for t in n.outputs}, {}
    ends = [i for n in after.values() for i in n.inputs if i and i not in made and not _constant(graph, i, fixed)]
    ends += [o for o in graph.outputs if o not in made]
    return after, list(dict.fromkeys(ends))


def _constant(graph, t, memo) -> bool:
    """Is `t` a constant, or computed from constants only (a dynamic-range model's dequantized
    weights)? `memo` keeps the answers."""
    if t not in memo:
        p = graph.producer(t)
        memo[t] = graph.tensors[t].is_const or (p is not None and all(_constant(graph, i, memo) for i in p.inputs if i))
    return memo[t]


def end_before(source, name) -> str | None:
    """'or end the model before it (--outputs ...) ...' for node `name` of the model as read
    (`source`), which no kmodel layer computes: the tensors to end at and what the application
    would compute after them (FSA-Net's capsule MatMul; its refusal had offered nothing), or None
    where `name` is not the source's or nothing of it would be left."""
    if source is None or name is None:
        return None
    after, ends = _ends_before(source, {name})
    if name not in after or not ends or set(ends) & set(source.inputs):
        return None
    ends = source.file_names(ends)
    if not ends:
        return None
    memo = {}
    weights = sum(int(np.prod(source.shape(i))) for n in after.values() if n.op in WEIGHT_OPS
                  for i in n.inputs[1:] if i and _constant(source, i, memo) and source.shape(i) is not None)
    what = f"{len(after)} node(s)" + (f", {weights:,} weights" if weights else "")
    return (f"or end the model before it (--outputs {','.join(ends)}) and compute the rest in the application "
            f"({what})")


def _start_after(graph, source, name):
    """'start the model after it (--inputs ...)' where node `name` is the only one a v3-only build
    refuses, no weight op comes before it (input-side preprocessing: YAMNet's Permute of its
    spectrogram), and its output is a tensor of the source model; else None."""
    if graph is None or source is None or set(graph.meta.get("v3_refused", ())) - {name}:
        return None
    n = next((x for x in graph.nodes if x.name == name), None)
    if n is None or len(n.outputs) != 1 or n.outputs[0] not in source.tensors:
        return None
    todo, seen = [i for i in n.inputs if i], set()
    while todo:
        p = graph.producer(todo.pop())
        if p is None or id(p) in seen:
            continue
        if p.op in WEIGHT_OPS and p.outputs[0] != graph.meta.get("entry_conv"):    # (not tl2k210's own)
            return None
        seen.add(id(p))
        todo += [i for i in p.inputs if i]
    return (f"start the model after it (--inputs {n.outputs[0]}) and do that step in the application "
            "(the kmodel is fed what it writes)")


def _kb(n):
    return f"{n / 1024:,.0f} KiB" if n >= 10 * 1024 else f"{n:,} B"


def furthest(rows, ide, n=3):
    """The `n` receipt rows whose kmodel bytes exceed their ideal the most: [(excess, node, ours, ideal)]."""
    per = {}
    for r in rows:
        per[r.node] = per.get(r.node, 0) + r.weight_bytes
    out = []
    for node, ours in per.items():
        li = ide.layer(node)
        ideal_b = li.weight_bytes if li is not None else 0
        if ours > ideal_b:
            out.append((ours - ideal_b, node, ours, ideal_b))
    return sorted(out, reverse=True)[:n]


def ideal_text(ide, nbytes, main, rows) -> str:
    """'ideal 0.87 MB, ours 6.51 MB; the three layers furthest from their ideal: ...', or, where
    main memory is further from the maps than the kmodel from the weights, that (the buffers
    follow in the refusal: a style net's 2.6 MB over had been shown as 9 KB GAP layers)."""
    ours = f"{ide.text()}, ours {mb(nbytes + main)} (kmodel {mb(nbytes)} + main memory {mb(main)})"
    if main - ide.live_bytes > nbytes - ide.weight_bytes:
        return ours + f"; main memory is the furthest from its ideal, {main / max(1, ide.live_bytes):.2f}x the maps"
    far = furthest(rows, ide)
    return (ours + (f"; the {len(far)} layer{'s' if len(far) > 1 else ''} furthest from their ideal: "
                    + ", ".join(f"{node} {_kb(o)} (ideal {_kb(ib)})" for _, node, o, ib in far) if far else ""))


def fitting_runtimes(need: int, version=None) -> list:
    return [n for n, r in firmware.RUNTIMES.items() if r.model_budget >= need
            and (version is None or version in r.kmodel_versions)]


def check_ideal(ide, runtime: str, where: str, fmt: str = "v3", graph=None):
    """BudgetError, before calibration, when no form of the model fits `runtime`: its ideal's
    weights, and the maps the KPU RAM cannot hold, exceed what the runtime leaves. The runtimes it
    names hold that much and load kmodel `fmt` (the flow's plan). `graph` (the loaded one): where
    the user sized the input already, what keeps the maps that big."""
    budget = firmware.get(runtime).model_budget
    if ide.floor <= budget:
        return
    top = sorted(ide.layers, key=lambda r: -r.weight_bytes)[:3]
    bigger = fitting_runtimes(ide.floor, int(fmt.lstrip("v")))
    raise BudgetError(
        f"{where}: {ide.text()}; even with the {hw.KPU_RAM_BYTES:,} B KPU RAM holding what it can of its "
        f"maps (none larger than it) it needs {ide.floor:,} B, which exceeds what '{runtime}' firmware "
        f"leaves for model + main memory ({budget:,} B): no form of this model fits it (largest weights at the ideal: "
        + ", ".join(f"{r.node} {_kb(r.weight_bytes)}" for r in top) + "). "
        + (f"Use --runtime {' or '.join(bigger)}" if bigger else
           "No K210 runtime holds it: use a smaller network (fewer channels, a smaller input)")
        + (_maps_advice(graph, ide, budget) if ide.live_bytes > 4 * ide.weight_bytes else "")
        + ". Nothing was written.")


def _maps_advice(graph, ide, budget) -> str:
    fixed = fixed_sizes(graph) if graph is not None else []
    if fixed:      # no --input-shape makes those smaller
        return (". Its maps need the most" + (", at the --input-shape given too" if graph.meta.get("sized_by_user")
                                               else "") + f": {', '.join(map(repr, fixed[:3]))} "
                "output a size the file fixes (a ConvTranspose's output_shape, a Resize to constant sizes); "
                "export the model at the size it is to run at")
    dense = _dense_on_a_map(graph)
    if dense is not None:      # its weights take the map's size: no other input size feeds it
        return (f". Its maps need the most, and {dense!r}, a dense layer, reads them flattened, so the "
                "input's size is fixed by its weights: export the model for a smaller input (or with a "
                "global pool before the dense layer)")
    size = _smaller_input(graph, ide, budget)
    return (". Its maps need the most: a fully convolutional model converts at a smaller input, "
            + (f"e.g. --input-shape {size} (its maps shrink with the input's area)" if size else
               "--input-shape 1,C,H,W (MTCNN's P-Net, exported at 600x800, fits at 48x64)"))


def _dense_on_a_map(graph):
    """The name of a dense layer (Gemm, MatMul) that reads a map of more than one pixel flattened,
    or None."""
    for n in graph.nodes if graph is not None else ():
        if n.op in ("Gemm", "MatMul") and n.inputs:
            shape = graph.shape(through_relabels(graph, n.inputs[0])[1])
            if shape is not None and len(shape) == 4 and min(shape[1:]) > 0 and \
                    sorted(shape[1:])[1] > 1:      # two dims over 1: rows and columns, or a channel's
                return n.name
    return None


def _smaller_input(graph, ide, budget):
    """'1,C,H,W' of the same aspect, a multiple of 16, whose maps at the floor's proportion (the
    floor's maps scale with the area; a map the KPU RAM then holds only lowers it) fit `budget`
    beside the weights, or None (weights alone too big, no 4-D input)."""
    shape = graph.shape(graph.inputs[0]) if graph is not None and len(graph.inputs) == 1 else None
    maps, room = ide.floor - ide.weight_bytes, budget - ide.weight_bytes
    if not shape or len(shape) != 4 or maps <= 0 or room <= 0:
        return None
    c, h, w = (shape[3], shape[1], shape[2]) if shape[3] <= 4 < shape[1] else shape[1:]
    k = (room / maps) ** 0.5
    h2, w2 = int(h * k) // 16 * 16, int(w * k) // 16 * 16
    return f"1,{c},{h2},{w2}" if h2 >= 16 and w2 >= 16 else None


def check_budget(model, nbytes: int, runtime: str, lw=None, rows=(), ide=None, v3_error=None):
    """BudgetError when file + main memory exceed what `runtime` leaves (`v3_error`: why not
    kmodel v3, when --format auto fell back to v4 after v3's whole-model refusal)."""
    rt = firmware.get(runtime)
    main = model.main_memory
    need = nbytes + main
    if need <= rt.model_budget:
        return
    weights = sorted(((r.weight_bytes, r.node) for r in rows if r.weight_bytes), reverse=True)[:3]
    bufs = []
    if lw is not None:
        bufs = sorted(((size, name) for name, (_, size) in lw.main.at_high.items()), reverse=True)[:3]
        if getattr(lw, "v4_scratch", 0):
            bufs = sorted(bufs + [(lw.v4_scratch, "v4 layer temporaries")], reverse=True)[:3]
    bigger = fitting_runtimes(need, model.version)
    sizes = [int(o[-1]) for o in model.outputs]
    out, big = max(((n, i) for i, n in enumerate(sizes)), default=(0, 0))
    third = rt.model_budget // 3      # outputs this big leave too little for the model itself
    returned = (f"output {big} alone is {out:,} B" if out > third else
                f"its {len(sizes)} outputs together are {sum(sizes):,} B (output {big}: {out:,} B)"
                if sum(sizes) > third else "")
    cut = _upsampled_from(lw.g, lw.g.outputs[big]) if returned and lw is not None and big < len(lw.g.outputs) else None
    less = (f"end the model before its upsampling, --outputs {cut}, and upsample in the application" if cut else
            "make the model return less (export it without a last upsampling or a full-size image output, "
            "or at a smaller input) and do that step in the application")
    err = BudgetError(
        (f"kmodel v3: {v3_error}\nkmodel v4 would run it, but: " if v3_error is not None else "") +
        f"kmodel v{model.version} {nbytes:,} B + main memory {main:,} B = {need:,} B exceeds what "
        f"'{runtime}' firmware leaves for model + main memory ({rt.model_budget:,} B)"
        + (f"; {ideal_text(ide, nbytes, main, rows)}" if ide is not None else "")
        + (f"; biggest weights: {', '.join(f'{n} {_kb(b)}' for b, n in weights)}" if weights else "")
        + (f"; biggest buffers at the main-memory peak: {', '.join(f'{n} {_kb(b)}' for b, n in bufs)}"
           if bufs else "")
        + (f" ({len(lw.parked)} other buffers, {_kb(sum(n for _, n in lw.parked))} in all over the run, already "
           "in KPU RAM lines free while each lives)" if getattr(lw, "parked", None) else "")
        + (f"; {returned}, the values the runtime returns: {less}" if returned else "")
        + (". Or use " if returned else ". Its 8-bit ideal fits: tl2k210 has no forms near it for the layers "
           "above yet; use " if ide is not None and ide.total <= rt.model_budget else ". Use a smaller network, ")
        + (f"--runtime {' or '.join(bigger)}" if bigger else "a smaller input")
        + (" or kpu.load_flash (v3)" if model.version == 3 else "") + ". Nothing was written.")
    err.ideal_fits = ide is not None and ide.total <= rt.model_budget
    raise err


def _upsampled_from(g, o) -> str | None:
    """The tensor graph output `o` is upsampled from (through Resize and data movement: DeepLab's
    two bilinear resizes of its 33x33 logits to 257x257), or None where no Resize writes it."""
    t, resized = o, False
    while (p := g.producer(t)) is not None and p.op in ("Resize", "Upsample", "Transpose") + RELABELS:
        resized, t = resized or p.op in ("Resize", "Upsample"), p.inputs[0]
    return t if resized and g.producer(t) is not None else None


# ---------------------------------------------------------------------------------------------
# forms under the budget
@dataclass
class Built:
    """One lowering of the model: what `lower` returned, its bytes and its estimated cycles."""
    model: object
    data: bytes
    rows: list
    trace_map: dict
    lw: object
    est: object = None
    picked: frozenset | None = None     # the smaller forms the plan gave it (_choose_forms)

    def __post_init__(self):
        self.est = cost.estimate(self.model)

    @property
    def need(self) -> int:
        return len(self.data) + self.model.main_memory

    def per_node(self) -> dict:
        """node -> (kmodel weight bytes, estimated cycles, form): what each layer's form costs."""
        out = {}
        for r in self.rows:        # a node's first row names its form (later ones: moves after it)
            w, c, form = out.get(r.node, (0, 0, ""))
            out[r.node] = (w + r.weight_bytes, c + sum(self.est.rows[i][3] for i in r.layers),
                           form or r.lowering + (f" ({r.form})" if r.form else ""))
        return out


@dataclass
class Choice:
    built: Built
    trades: list = field(default_factory=list)    # one line per layer given its smaller form
    fastest_need: int = 0                         # kmodel + main memory in the fastest forms
    fastest_cycles: int = 0                       # their estimated cycles
    fastest_format: str = ""                      # their kmodel format ("v3" / "v4")
    v3_error: object = None                       # why not kmodel v3, when --format auto took v4
    format_note: str = ""                         # why kmodel v4, where the size search chose it


# --optimize latency gives up at most this share of the fastest forms' estimated time for smaller
# forms: a form 10 % faster and several times bigger does not win (issue 22)
LATENCY_SLACK = 0.10
# --optimize size gives up at most this share of its smallest model's bytes for the fast forms of
# the layers whose smaller forms save the fewest bytes per cycle
SIZE_SLACK = 0.005
# issue 22's targets: kmodel bytes at most this times the ideal weights, main memory this times
# the live set of uint8 maps (bench/memory.py measures both)
WEIGHTS_TARGET, MAIN_TARGET = 1.15, 1.25


def choose_forms(build, budget: int, optimize: str = "latency", v4=None, ideal=None) -> Choice:
    """The forms of `_choose_forms`; with --optimize size and `v4` (a build of --format auto's
    model as kmodel v4), also v4's smallest, kept when the whole model is smaller, or as small and
    faster: auto's search starts from v3's fastest forms, where one v4-only smaller form moves
    every layer to v4's forms and so never pays alone (ULFD RFB-320: v3 385,488 B, v4 324,064 B),
    and where one does, it is charged with what v4 saves elsewhere (Maix-EMC's CIFAR net: a 3x3
    conv's CPU form, 165x slower and 256 B smaller, took v4's uint8 dense layer with it).
    With --optimize latency, a kmodel v3 over WEIGHTS_TARGET times the `ideal` weights is also
    built as v4, kept where that is smaller and at most LATENCY_SLACK slower (`_v4_latency`)."""
    choice = _choose_forms(build, budget, optimize)
    if v4 is None or choice.fastest_format != "v3":     # else the same search
        return choice
    if optimize != "size":
        return _v4_latency(choice, v4, budget, ideal)
    try:
        other = _choose_forms(v4, budget, "size")
    except Tl2k210Error:
        return choice
    cap = _size_cap(min(choice.built.need, other.built.need))     # the fastest within the slack
    if min((c for c in (choice, other) if c.built.need <= cap),
           key=lambda c: (c.built.est.cycles, c.built.need)) is choice:
        return choice
    saves = choice.built.need - other.built.need
    other.format_note = ("kmodel v4 (--format auto --optimize size): " + (
        f"{saves:,} B smaller than the smallest kmodel v3" if choice.built.lw.format == "v3" and saves > 0
        else "the smallest model found needs v4's forms"))
    other.v3_error = other.v3_error or choice.v3_error
    return other


def _v4_latency(choice, v4, budget, ideal):
    """--format auto --optimize latency: kmodel v3 unless its bytes are over WEIGHTS_TARGET times
    the `ideal` weights and v4's fastest forms that fit store fewer, in a model no bigger with its
    main memory, at most LATENCY_SLACK slower, and within MAIN_TARGET of the live set where v3 is
    (an int8 model's dense layers: v3's float FULLY_CONNECTED stores 4 bytes a weight, v4's KPU or
    quantized_matmul 1 at about the same time; MLPerf's int8 anomaly detector 1.93x -> 1.05x,
    1.21 -> 0.77 ms. Its ResNet-8, 1.94x -> 1.10x at 1.34x the live set, stays v3)."""
    b = choice.built
    weights, live = (ideal.weight_bytes, ideal.live_bytes) if ideal is not None else (0, 0)
    if b.lw.format != "v3" or not weights or len(b.data) <= WEIGHTS_TARGET * weights:
        return choice
    try:
        other = _choose_forms(v4, budget, "latency")
    except Tl2k210Error:
        return choice
    o = other.built
    main_kept = not live or o.model.main_memory <= MAIN_TARGET * live or b.model.main_memory > MAIN_TARGET * live
    if o.need > budget or len(o.data) >= len(b.data) or o.need > b.need or not main_kept \
            or o.est.cycles > (1 + LATENCY_SLACK) * b.est.cycles:
        return choice
    other.format_note = (
        f"kmodel v4 (--format auto): kmodel v3's forms take {len(b.data):,} B ({len(b.data) / weights:.2f}x the "
        f"ideal weights) + {b.model.main_memory:,} B main memory, v4's {len(o.data):,} B + {o.model.main_memory:,} B, "
        f"est. {cost.ms(b.est.cycles):.2f} -> {cost.ms(o.est.cycles):.2f} ms"
        f"{f' (within {LATENCY_SLACK:.0%})' if o.est.cycles > b.est.cycles else ''}; "
        "--format v3 for a build without kmodel V4 support")
    other.v3_error = other.v3_error or choice.v3_error
    return other


ROOM_TRIES = 8      # layers given their smaller form, one at a time, for want of KPU RAM


def _room(build):
    """(build, its fastest lowering, trade lines): where a layer's fastest form finds no room in
    KPU RAM (KpuLimitError naming the node: a style net's 9x9 conv, whose 'sparse shifts' copies
    stay resident and leave its output no piece), that layer is given its smaller form in every
    lowering, one layer at a time, up to ROOM_TRIES; the error stands where none is left to try."""
    base, lines = frozenset(), []
    while True:
        try:
            fast = build(base)
            break
        except KpuLimitError as e:
            node = getattr(e, "node", None)
            if node is None or node in base or len(base) >= ROOM_TRIES:
                raise
            base |= {node}
            why = str(e).splitlines()[0].split(": ", 1)[-1].split(" (resident maps")[0]
            lines.append(f"{node}: its smaller form; the fastest finds no room in KPU RAM ({why})")
    return ((lambda small: build(frozenset(small) | base)) if base else build), fast, lines


def _choose_forms(build, budget: int, optimize: str = "latency") -> Choice:
    """Lower with `build(small)` (small: the nodes to give their smaller form, "*" all) until the
    model fits `budget`. The fastest forms first; where some layer has a smaller form
    (`lw.smaller`), every smaller form too: the per-layer differences (kmodel bytes saved, cycles
    lost) rank the layers, most bytes per cycle first (smaller and faster at the head).
    * latency, the fastest forms fit: the ranked layers whose smaller form is exact (the same
      output bytes, `lw.smaller[n]`) and whose cycles lost add up to at most LATENCY_SLACK of the
      fastest forms' are switched in one lowering, kept if the whole model shrank within that
      time and still fits: the default never changes the arithmetic to save bytes;
    * otherwise they are switched one at a time, each kept only if the whole model shrank (a
      smaller form may need more main memory: the stride-1 map its CPU pick reads), a windowed
      conv's fewest-bytes windows first (exact, a few layers more, and a few stride-1 maps in
      main memory less: MobileNetV2's 96x112x112 depthwise conv, 0.9 MB) and a pool's float
      temporaries a channel at a time (tried again last, where other forms moved the peak), until the
      model fits ("latency") or the candidates run out ("size"); with "latency" the trades the
      fit did not need are then undone, the slowest first (_give_back), starting from every
      smaller form where no one at a time made the model fit; the fastest lowering that fits is
      kept (the smallest with "size", without the pool slices that do not make it smaller:
      `_spare`, and with the fast forms given back within SIZE_SLACK: `_size_slack`); when none
      fits, the smallest, for check_budget's refusal.
    Main-memory buffers in free KPU RAM (PARK, kmodel v4) are an exact form that saves main
    memory only (read from uncached AI RAM: slower): latency mode tries it first when the model
    does not fit and again after each form kept, stopping where that fits (`_parks_to_fit`), size
    mode on its smallest lowering, kept where smaller (`_parked`).
    A form that fails to lower is no option; a layer whose fastest form finds no room in KPU RAM
    (the maps resident around it) is given its smaller form from the start (`_room`)."""
    if optimize not in ("latency", "size"):
        raise Tl2k210Error(f"--optimize {optimize!r}: choose latency or size")
    build, fast, no_room = _room(build)

    def choice(best, lines):
        v3 = getattr(best.lw, "v3_error", None) or getattr(fast.lw, "v3_error", None)
        return Choice(best, no_room + lines, fast.need, fast.est.cycles, getattr(fast.lw, "format", ""), v3)
    same_bytes = any(v for n, v in fast.lw.smaller.items() if n != PARK)    # parking saves only main memory
    if not fast.lw.smaller or optimize == "latency" and fast.need <= budget and not same_bytes:
        return choice(fast, [])
    tried, a, b, every = _Best(budget, fast), fast.per_node(), {}, None
    fast.picked = frozenset()          # each lowering tried: the smaller forms it was given
    try:
        every = build(frozenset({"*"}))
        every.picked = (frozenset(fast.lw.smaller) | frozenset(every.lw.smaller)) - {PARK}
        tried.add(every)
        b = every.per_node()
    except Tl2k210Error:     # e.g. a smaller form needs kmodel v4, which the runtime does not load
        pass
    ranked = [n for _, n in sorted(((b[n][1] - a[n][1]) / (a[n][0] - b[n][0]), n)
                                   for n in a if n in b and a[n][0] > b[n][0])]
    if optimize == "latency" and fast.need <= budget:
        exact = [n for n in ranked if fast.lw.smaller.get(n)]
        best = _within_slack(build, fast, exact, a, b, budget)
        why = (f"(within {LATENCY_SLACK:.0%} of the fastest forms' estimated time, the model "
               f"{fast.need - best.need:,} B smaller)")
        return choice(best, trades(a, best.per_node(), why))
    extra = sorted(n for n in fast.lw.smaller if n not in b)       # forms of a part of a layer
    first = [n for n in extra if n.endswith((WINDOWS, SLICES, PARK))]   # exact: main memory less
    ranked = first + ranked + [n for n in extra if n not in first] + [n for n in first if n.endswith((SLICES, PARK))]
    chosen, current = set(), fast
    for n in ranked:
        if optimize == "latency" and current.need <= budget:
            break
        if n in chosen:     # a pool's slices, tried again once other forms moved the peak to it
            continue
        try:
            trial = build(frozenset(chosen | {n}))
        except Tl2k210Error:
            continue
        trial.picked = frozenset(chosen | {n})
        tried.add(trial)
        if trial.need < current.need:
            chosen.add(n)
            current = trial
            parked = _parks_to_fit(build, trial, chosen, budget, tried) if optimize == "latency" else None
            if parked is not None:
                chosen.add(PARK)
                current = parked
    if optimize == "latency" and fast.need > budget:
        if current.need > budget and every is not None and every.need <= budget:
            # no one form at a time fitted (two maps at the main-memory peak must both shrink):
            # every smaller form does, and gives back what it can from there
            chosen, current = set(every.picked), every
        if current.need <= budget:
            _give_back(build, current, chosen, {n: b[n][1] - a[n][1] for n in chosen if n in a and n in b},
                       budget, tried)
    kept = []
    parkable = any(b is not None and PARK in b.lw.smaller for b in (fast, tried.small, every))
    if optimize == "size" or tried.fit is None:
        best = tried.small
        if optimize == "size" and parkable:     # parked where that is smaller, before the slack
            best = _parked(build, best, every)
        if best.picked is not None:
            best = _spare(build, best)
        if optimize == "size":
            best, kept = _size_slack(build, best, best.picked, a, b, budget)
    else:
        best = tried.fit
    if best.need > budget and parkable and optimize == "latency":
        # (the fastest forms may fill the KPU RAM: only the smaller ones, on the CPU, free lines)
        best = _parked(build, best, every)
        if best.need <= budget:
            best = _parked_give_back(build, best, every, a, b, budget)
    why = (f"and the model in its fastest forms would not fit ({fast.need:,} B > {budget:,} B)" if fast.need > budget
           else "(--optimize size)")
    return choice(best, trades(a, best.per_node(), why) + parked_trade(best.lw, why) + kept)


class _Best:
    """The lowerings a search may still return: the smallest (need, then cycles) and the fastest
    that fits `budget` (cycles, then need), the first of equals as min() over every lowering
    tried would give; the others go (each holds its model, bytes and graph: about 20 MB for a
    512x512 segmenter, whose search tried some 200 and held 4.5 GB)."""

    def __init__(self, budget: int, *builds):
        self.budget, self.small, self.fit = budget, None, None
        for b in builds:
            self.add(b)

    def add(self, b):
        if self.small is None or (b.need, b.est.cycles) < (self.small.need, self.small.est.cycles):
            self.small = b
        if b.need <= self.budget and (self.fit is None or (b.est.cycles, b.need) < (self.fit.est.cycles, self.fit.need)):
            self.fit = b


def _size_cap(need: int) -> int:
    """The most bytes --optimize size accepts for speed against its smallest model of `need`."""
    return need + int(SIZE_SLACK * need)


def _size_slack(build, best, chosen, a, b, budget):
    """(lowering, receipt lines): --optimize size's smallest lowering `best` (given the smaller
    forms `chosen`) with the fast forms given back to the layers whose smaller forms save the
    fewest layer bytes per cycle lost (a form whose layer grows, for main memory, first: the
    trial shows what it saves), while together they save at most SIZE_SLACK of the model: a
    smaller form that saves a few bytes of alignment is not worth a conv 160x slower (Maix-EMC's
    CIFAR net: a 3x3 conv's 18 KiB either way, 0.43 or 70.8 ms). Kept when the whole model is
    then within SIZE_SLACK of `best` and faster."""
    allowance = _size_cap(best.need) - best.need
    gains = {n: (a[n][0] - b[n][0], b[n][1] - a[n][1]) for n in chosen or () if n in a and n in b}
    back, saved = set(), 0
    for n in sorted((n for n, (_, lost) in gains.items() if lost > 0),
                    key=lambda n: (gains[n][0] / gains[n][1], n)):
        if saved + max(gains[n][0], 0) <= allowance:
            back.add(n)
            saved += max(gains[n][0], 0)
    if not back:
        return best, []
    try:
        trial = build(frozenset(chosen) - back)
    except Tl2k210Error:
        return best, []
    if (trial.need > _size_cap(best.need) or trial.est.cycles >= best.est.cycles
            or trial.need > budget >= best.need):
        return best, []
    return trial, [f"{len(back)} layer(s) kept their fast forms ({', '.join(sorted(back)[:3])}"
                   f"{', ...' if len(back) > 3 else ''}): the model {trial.need - best.need:,} B bigger, est. "
                   f"{cost.ms(best.est.cycles - trial.est.cycles):.2f} ms faster (--optimize size gives up "
                   f"at most {SIZE_SLACK:.1%} of the bytes for speed)"]


def _parked(build, best, every):
    """The smallest of `best` and of `best` and `every` (every smaller form) with their main-memory
    buffers in KPU RAM where that is free (PARK): the least main memory may come with the most
    KPU RAM in use (TBEFN: 0.5 MB less with every form on the CPU, 1.8 MB of it then parked)."""
    for base in (best, every):
        if base is None or PARK in base.lw.opts.small:
            continue
        try:
            trial = build(frozenset(base.lw.opts.small) | {PARK})
        except Tl2k210Error:
            continue
        if base.picked is not None:
            trial.picked = base.picked | {PARK}
        best = trial if trial.need < best.need else best
    return best


def _parks_to_fit(build, trial, chosen, budget, tried):
    """`trial` (lowered with the smaller forms `chosen`) with its main-memory buffers in free KPU
    RAM (PARK), where that fits `budget` and it does not; else None. A form that frees KPU RAM may
    make the model fit only parked: a CartoonGAN for the sdk fits with its last 7x7 conv on the CPU
    and parked buffers (est. 4.5 s), and parking tried only after the search had given eight
    128-channel convs their CPU forms as well (each saving 656 B) took 70.1 s."""
    if trial.need <= budget or PARK in chosen or PARK not in trial.lw.smaller:
        return None
    try:
        parked = build(frozenset(chosen | {PARK}))
    except Tl2k210Error:
        return None
    parked.picked = frozenset(chosen | {PARK})
    tried.add(parked)
    return parked if parked.need <= budget else None


def _parked_give_back(build, parked, every, a, b, budget):
    """`parked` (a lowering that fits only with its buffers in free KPU RAM) with the trades the fit
    did not need undone (_give_back): parking may have been tried only from every smaller form
    together (onnx.js's udnie at 256x256: 40 s est. with all 121, most of them only there)."""
    small = set(parked.lw.opts.small)
    if "*" in small:          # every smaller form: those `every` was given (_choose_forms)
        small = (small - {"*"}) | every.picked
    tried = _Best(budget, parked)
    _give_back(build, parked, small, {n: b[n][1] - a[n][1] for n in small if n in a and n in b}, budget, tried)
    return tried.fit


def _spare(build, best):
    """`best` without each smaller form it was given (`best.picked`) that does not make the whole
    model smaller (or as small and faster): every smaller form together may be the smallest
    lowering only because a few of them lower the main-memory peak, while the others add nodes (a
    uint8 CPU conv in channel ranges, a pool's float temporaries a channel at a time) that it does not need
    (YuNet, --optimize size: 104,176 B of kmodel with every form, 88 KB without those)."""
    chosen = best.picked
    return _without_each(build, best, chosen, sorted(chosen, key=lambda x: (not x.endswith(SLICES), x)),
                         lambda t, c: (t.need, t.est.cycles) <= (c.need, c.est.cycles), True)


def _give_back(build, current, chosen, lost, budget, tried):
    """Undo the trades the fit did not need, the slowest first, each when the model still fits and
    gets faster without it, or as fast and smaller (a memory-only form); the lowering left goes to
    `tried`. A PyTorch MobileNetV2 (TFLite Micro's int8 export) for the sdk: no one smaller form at
    a time fitted, all 45 together did, at 3.9 s est.; giving back what the fit did not need
    leaves 15, at 158 ms."""
    tried.add(_without_each(build, current, chosen, sorted(chosen, key=lambda n: (-lost.get(n, 0), n)),
                            lambda t, c: t.need <= budget and (t.est.cycles, t.need) < (c.est.cycles, c.need)))


def _without_each(build, current, chosen, order, better, picked=False):
    """`current` (lowered with the smaller forms `chosen`) without each form of `order` in turn,
    kept where `better(trial, current)`: the last lowering kept (its forms in `.picked` where
    `picked`). A form that fails to lower stays."""
    for n in order:
        try:
            trial = build(frozenset(chosen - {n}))
        except Tl2k210Error:
            continue
        if better(trial, current):
            chosen, current = chosen - {n}, trial
            if picked:
                trial.picked = frozenset(chosen)
    return current


def _within_slack(build, fast, ranked, a, b, budget):
    """The lowering with the `ranked` layers whose cycles lost fit LATENCY_SLACK in their smaller
    forms, if it is smaller than `fast`, fits `budget` and is at most LATENCY_SLACK slower; else `fast`."""
    allowance = LATENCY_SLACK * fast.est.cycles
    chosen, spent = set(), 0
    for n in ranked:
        if spent + b[n][1] - a[n][1] <= allowance:
            chosen.add(n)
            spent += b[n][1] - a[n][1]
    if not chosen:
        return fast
    try:
        t = build(frozenset(chosen))
    except Tl2k210Error:
        return fast
    return t if t.need < fast.need and t.need <= budget and t.est.cycles <= fast.est.cycles + allowance else fast


def parked_trade(lw, why: str) -> list:
    """The receipt's line for the main-memory buffers the plan put in free KPU RAM (PARK)."""
    if not getattr(lw, "parked", None):
        return []
    big = sorted(lw.parked, key=lambda p: -p[1])
    return [f"main memory: {len(big)} buffers, {_kb(sum(n for _, n in big))}, in KPU RAM lines free while "
            f"they live ({', '.join(f'{name} {_kb(n)}' for name, n in big[:3])}{', ...' if len(big) > 3 else ''}); "
            f"CPU ops read them from uncached AI RAM (slower; not in the estimate), {why}"]


def trades(fastest: dict, chosen: dict, why: str) -> list:
    """'conv2d_21: kpu_conv (stride 1 + CPU pick), 40 KiB, 1.20 ms; kpu_conv_kxk (stride-2
    phases) would store 160 KiB, 1.10 ms, and the model in its fastest forms would not fit
    (2,310,000 B > 2,097,152 B)'"""
    out = []
    for n, (w, c, form) in chosen.items():
        fw, fc, fform = fastest.get(n, (w, c, form))
        if fform != form:          # the same form may store a few bytes more or less beside others
            out.append(f"{n}: {form}, {_kb(w)}, est. {cost.ms(c):.2f} ms; {fform} would store "
                       f"{_kb(fw)}, {cost.ms(fc):.2f} ms, {why}")
    return out

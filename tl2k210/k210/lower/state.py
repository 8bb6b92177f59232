"""The lowering's state: where each tensor lives, the layers emitted so far, the receipt rows.

A tensor lives in up to three places, materialised on demand: a uint8 map in KPU RAM (between
KPU convs), a dense CHW uint8 copy in main memory (KPU output streaming, uint8 CPU layers) and a
float32 copy (float CPU layers, model outputs). `need_u8`, `need_f32` and `need_kpu` emit the
QUANTIZE / DEQUANTIZE / K210_UPLOAD layers that move a tensor between them.

The layers are SDK v3 layers (`v3.Layer`) and, in a kmodel v4 plan, v4-only nodes (`V4Op`,
emitted by `emit_v4`); `v4emit.assemble` turns the whole list into a KModelV4.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from tl2k210.errors import KpuLimitError, Tl2k210Error, UnsupportedOpError
from tl2k210.graph import describe
from tl2k210.k210 import hardware as hw
from tl2k210.k210.kmodel import v3
from tl2k210.k210 import fixed_point as fx
from tl2k210.k210.ideal import ideal
from tl2k210.k210.kmodel.v4 import MEM_MAIN, OPCODE_BY_NAME

from . import registry
from .memory import MAIN_TARGET, PARK, PARK_BASE, Block, KpuAllocator, MainAllocator, kpu_peak, park, plan

T = v3.TYPE_BY_NAME


RECURRENT = ("LSTM", "GRU", "RNN", "Loop", "Scan")


def check_one_input(g):
    """A kmodel has one input: refuse a graph with more, naming them. A recurrent op is refused
    first (the inputs past the first are then its states, which no pin makes right); an input
    with the shape of an output is named as the state a streaming or recurrent step returns
    for its next call (42io's streaming keyword spotter, DTLN, TEN VAD: hunt 21), which a kmodel
    cannot keep: pinning it makes every call the first."""
    if len(g.inputs) == 1:
        return
    rnn = next((n for n in g.nodes if n.op in RECURRENT), None)
    if rnn is not None:
        raise UnsupportedOpError(f"node {rnn.name!r}: op {rnn.op} has no K210 lowering (its states are the model's "
                                 f"other inputs); nearest supported form: {registry.NEAREST[rnn.op]}: export a "
                                 "model without it")
    names = ", ".join(f"{x!r} {tuple(g.shape(x) or ())}" for x in g.inputs)
    shapes = {}
    for o in g.outputs:
        shapes.setdefault(tuple(g.shape(o) or ()), []).append(repr(o))
    states = [(x, " or ".join(shapes[tuple(g.shape(x) or ())])) for x in g.inputs[1:]
              if tuple(g.shape(x) or ()) in shapes]
    said = ("; " + ", ".join(f"{x!r} has the shape of output {o}" for x, o in states)
            + ": a streaming or recurrent step's state, returned for the next call, which a kmodel cannot "
            "keep (pinned, every call would be the first): export the model's whole-window form, not its "
            "streaming step" if states else "")
    raise UnsupportedOpError(f"the model has {len(g.inputs)} inputs: {names}; a kmodel has one (K210 "
                             "runtimes feed it one image or array): pin the others to constants with "
                             "--input-value NAME=VALUE (a threshold, a flag), or export the model with "
                             f"one input, the others left to a separate model{said}")


@dataclass
class Loc:
    shape: tuple                       # (C, H, W) or (N,)
    quant: tuple | None = None         # (scale, zero_point) of the uint8 forms
    kpu: tuple | None = None           # (start_line, end_line) while resident in KPU RAM
    u8: int | None = None
    f32: int | None = None
    block: str | None = None           # the KPU RAM block holding the map
    pixels: int | None = None          # v4 image input in main memory: raw uint8 pixels here


@dataclass
class Row:
    """One receipt line: an IR node and the kmodel layers it became."""
    node: str
    op: str
    unit: str
    why: str
    fused: list = field(default_factory=list)
    layers: list = field(default_factory=list)
    in_shape: tuple = ()
    out_shape: tuple = ()
    macs: int = 0
    weight_bytes: int = 0
    kpu_lines: int = 0
    notes: list = field(default_factory=list)
    tensor: str = ""        # the tensor this row produces (default: the node's output)
    lowering: str = ""      # the registered lowering that produced it
    form: str = ""          # which of its exact forms, where it has several ('stride-2 phases'...)
    act_fit_lsb: float | None = None   # KPU activation table's max error (output LSB), see kpu.fit_error


@dataclass
class Options:
    weight_bits: int = 8
    # preprocessing of the first (image) input: x_float = pixel * scale[c] + offset[c]
    input_scale: tuple = (1 / 255,)
    input_offset: tuple = (0.0,)
    channel_means: dict = field(default_factory=dict)   # tensor -> per-channel mean (bias correction)
    float_fc: bool = False      # dense layers as float FULLY_CONNECTED instead of the padded KPU conv
    int8_rounding: str = "single"   # a quantized model's requantization (compiler.ConvertOptions)
    format: str = "auto"        # kmodel format: "v3", "v4" or "auto" (v3 when every layer has a v3 form)
    v3_only: bool = False       # the runtime loads kmodel v3 only: auto may take v3's explicit workarounds
    kpu_ram_lines: int = hw.KPU_RAM_LINES   # KPU RAM the plan may use (tests force tiling with less)
    small: frozenset = frozenset()   # nodes to lower in their smaller (slower) form; "*": every node
    compact: bool = False       # KPU conv weights and BN at the least alignment, v3 and v4 (--optimize size)


#: why a layer runs in its smaller form (wants_small): the plan's choice, never the user's by name
SMALLER_TAKEN = "the plan took the smaller form (to fit the budget, or --optimize size)"


def wants_small(opts, node) -> bool:
    """Does the plan ask for `node`'s smaller form (fit.choose_forms: to fit the budget, or
    --optimize size)? Read by every choice between exact forms that trades bytes for speed; a
    lowering that takes the faster one adds the node to `Lowering.smaller`, so the plan knows
    there is something to trade, and whether the trade keeps the output bytes."""
    small = getattr(opts, "small", ())
    return "*" in small or node.name in small


def chw(shape):
    """NCHW / NC / (N,) graph shape -> the per-sample shape the lowering uses. The graph runs one
    sample, so a first axis over 1 is no batch: a 2-D (rows, values) tensor (YuNet's (1076, 2)
    scores after a Reshape to (-1, 2)) is its rows x values as one vector, a 3-D one (ShuffleNetV2's
    (c/2, 2, h*w) before its channel shuffle) its own C x H x W, a 4-D one its first two axes
    as the channels: the same elements in the same order."""
    s = tuple(int(v) for v in shape)
    if len(s) == 4:
        return s[1:] if s[0] == 1 else (s[0] * s[1],) + s[2:]
    if len(s) == 2:
        return (s[1],) if s[0] == 1 else (s[0] * s[1],)
    if len(s) == 3 and s[0] > 1:
        return s
    return s[1:] if len(s) > 1 else s


class Lowering:
    def __init__(self, graph, ranges: dict, opts: Options | None = None):
        from tl2k210.graph import toposort
        self.g, self.ranges, self.opts = graph, ranges, opts or Options()
        self.order = toposort(graph)
        self.layers, self.rows, self.locs = [], [], {}
        clock = lambda: len(self.layers)     # noqa: E731 (a buffer's lifetime in layer indices)
        self.kpu, self.main = KpuAllocator(self.opts.kpu_ram_lines, clock), MainAllocator(clock)
        self.pixel_input = None     # the image input in KPU RAM (uint8 pixels, preprocessing folded in)
        self.pixel_main = None      # kmodel v4: the image input in main memory (uint8 pixels)
        self.format = self.opts.format if self.opts.format != "auto" else "v3"
        self.geo, self.plans = {}, {}   # per KPU conv node: its geometry and tiling plan (conv.py)
        # stages of a conv lowered as several KPU layers (kxk.py): their tensors' shapes, the
        # stage reading each, and which pixel channel each channel of a copied image holds
        self.virtual_shapes, self.virtual_next, self.pixel_copy = {}, {}, {}
        self.near_stages = set()    # K x K shift stages to place beside their input (kxk._lower)
        # a stage's input made a row band at a time, never whole: tensor -> fn(a, b, dst, last)
        # writing rows [a, b) of every channel to dst (v3resize.py)
        self.band_sources = {}
        self.folded = set()         # nodes already lowered by their producer (fused activations)
        self.scratch_at = {}        # kmodel v4: layer index -> its planned temporaries (_plan_main)
        self.parked = []            # kmodel v4: (buffer, bytes) planned into free KPU RAM lines (PARK)
        self.trace_map = {}         # tensor -> (layer index or indices, kind): SQNR from emulator traces
        self.uses = {}
        self.choice = {}            # node name -> (Alternative, passed-over reasons)
        self.smaller = {}           # node given a fast form that has a smaller one (wants_small) ->
                                    # whether that form is exact (the same output bytes)
        # a quantized model (passes.dequantize kept its ranges): round each layer as TFLite does
        self.quantized_model = bool(graph.meta.get("quant_ranges"))
        self.int8_rounding = self.opts.int8_rounding    # how its requantizations round
        self.u8_offset = {}   # tensor -> output LSB its QUANTIZE adds before rounding (cpu.global_average_pool)
        self.relabels = {}          # tensor -> the tensor whose bytes it names (alias)
        self.blocks = {}            # kmodel v3: (block, its bytes) -> the K210_CONV storing it (share_blocks)
        self.at = None              # the index in `order` of the node being lowered
        self._target = None         # main-memory bytes within MAIN_TARGET of the live set (float_room)
        for n in self.order:
            for i in n.inputs:
                self.uses[i] = self.uses.get(i, 0) + 1
        for o in graph.outputs:
            self.uses[o] = self.uses.get(o, 0) + 1

    # ------------------------------------------------------------------ queries
    def shape(self, t):
        if t in self.virtual_shapes:
            return self.virtual_shapes[t]
        return chw(self.g.tensors[t].shape)

    def rng(self, t):
        if t not in self.ranges:
            raise KeyError(f"no calibration range for tensor {t}")
        return self.ranges[t]

    def quant_of(self, t):
        return fx.qparams(*self.rng(t))

    def consumers(self, t):
        return [n for n in self.order if t in n.inputs]

    def producer(self, t):
        return next((n for n in self.order if t in n.outputs), None)

    def float_room(self, *new_bytes) -> int | None:
        """Bytes of float scratch an op may take now, beside `new_bytes` it is about to allocate,
        with main memory still within MAIN_TARGET x the live-set lower bound (ideal.py); None
        when the graph has no bound."""
        if self._target is None:
            self._target = int(MAIN_TARGET * ideal(self.g).live_bytes)
        return self._target - self.main.used() - sum(new_bytes) if self._target else None

    def reader_units(self, t, since: int = 0) -> set:
        """The units (registry.KPU, CPU_U8, CPU_F32; "output" for a model output) of `t`'s
        readers from node `since` of the order on, through relabels."""
        units = {"output"} if t in self.g.outputs else set()
        for n in self.consumers(t):
            if self.order.index(n) >= since:
                unit = self.choice[n.name][0].unit if n.name in self.choice else registry.CPU_F32
                units |= self.reader_units(n.outputs[0], since) if unit == registry.RELABEL else {unit}
        return units

    def float_readers(self, t, since: int = 0) -> bool:
        """Does a reader of `t` need it as float: a float CPU layer or a model output?"""
        return bool(self.reader_units(t, since) & {registry.CPU_F32, "output"})

    def relabelled(self, t) -> bool:
        """Does another tensor name `t`'s bytes (alias, either way)?"""
        return t in self.relabels or t in self.relabels.values()

    def drop_copy(self, t, kind: str, since: int):
        """Free `t`'s `kind` copy ("f32" or "u8") once it has the other one and no reader from
        node `since` on needs this one: float only where an op needs it, and a uint8 map
        dequantized for float readers only is not kept beside its float copy. Kept for a model
        input or output, or when a relabel shares the bytes."""
        loc = self.locs.get(t)
        name, other = f"{t}:{kind}", "u8" if kind == "f32" else "f32"
        if loc is None or getattr(loc, other) is None or getattr(loc, kind) is None or name not in self.main.blocks \
                or t in self.g.inputs or t in self.g.outputs or loc.pixels is not None or self.relabelled(t):
            return
        units = self.reader_units(t, since)
        if units - ({registry.KPU, registry.CPU_U8} if kind == "f32" else {registry.CPU_F32}):
            return
        self.main.free(name)
        setattr(loc, kind, None)
        if kind == "u8" and loc.block:     # float readers only: no KPU RAM copy either
            self.kpu_free(loc)

    def _drop_output_u8(self, o, to_come):
        """Free the uint8 map of the output `o` once its float copy is written, unless an output
        still `to_come` names the same bytes: the outputs are dequantized largest first, so at
        the end main memory holds the float outputs and no uint8 copy beside them."""
        fam = self.family(o)
        if self.locs[o].f32 is None or any(self.family(p) & fam for p in to_come):
            return
        for t in self._named(o):
            self.main.free(f"{t}:u8")

    def family(self, t) -> set:
        """`t` and every tensor naming the same bytes (relabels either way, lowered or to come)."""
        fam, todo = set(), [t]
        while todo:
            a = todo.pop()
            if a in fam:
                continue
            fam.add(a)
            todo += [b for b in (self.relabels.get(a),) if b is not None]
            todo += [b for b, c in self.relabels.items() if c == a]
            todo += [n.outputs[0] for n in self.consumers(a) if n.name in self.choice
                     and self.choice[n.name][0].unit == registry.RELABEL]
        return fam

    def last_read(self, t) -> int:
        """Index in the order of the last node reading `t`'s bytes (len(order) for a model output)."""
        fam = self.family(t)
        if fam & set(self.g.outputs):
            return len(self.order)
        return max((self.order.index(n) for a in fam for n in self.consumers(a)), default=-1)

    def concat_views(self, node, whole: str, parts: list) -> list:
        """Which of a concat's `parts` [(tensor, address, bytes)], laid out one after the other
        in the buffer `whole` (a plain copy of each range: docs/kmodel-format.md, QUANTIZED_CONCAT
        and v4 concat with outer_size 1), are written there by their producers instead: each a
        view at its offset (MainAllocator.view), so the concat copies only the others. A part
        qualifies when its range is a whole buffer of its own at an 8-aligned offset whose
        8-rounded size does not reach the next part (the KPU's DMA and QUANTIZED_ADD write whole
        groups of 8 bytes), it is no model input or output (their ranges are the header's), it is
        not read after the concat's output is (the view would keep that alive), and it is not
        the same buffer as an earlier part (concatenated twice: the second copies the first);
        MainAllocator.fit_views keeps those that do not raise the live bytes so far. Returns one
        bool per part."""
        io, last = set(self.g.inputs) | set(self.g.outputs), self.last_read(node.outputs[0])
        cands, seen, off = {}, set(), 0
        for k, (t, addr, n) in enumerate(parts):
            name = self.main.owner(addr)
            if name is not None and name not in seen and off % 8 == 0 and (n % 8 == 0 or k == len(parts) - 1) \
                    and self.main.blocks[name][1] == -(-n // 8) * 8 and not self.family(t) & io \
                    and self.last_read(t) <= last:
                cands[k] = (name, off)
            seen.add(name)
            off += n
        chosen = set(self.main.fit_views(whole, list(cands.values())))
        for name, o in chosen:
            self.main.view(name, whole, o)
        return [cands.get(k) in chosen for k in range(len(parts))]

    def concat_into(self, node, row, whole: str, addr: int, parts: list, kind: str, emit):
        """Fill `node`'s output buffer `whole` (at `addr`) with `parts` [(tensor, address, bytes)]
        one after the other: the parts that may be views (`concat_views`) are there already,
        `emit(address, [(address, bytes)])` copies each run of the others. The output's trace
        joins its writers'."""
        views = self.concat_views(node, whole, parts) if len(parts) > 1 else [False] * len(parts)
        runs, writers, off = [], [], 0          # writers: a layer index, or ("run", k) before emission
        for (t, a, n), v in zip(parts, views):
            if v:
                writers.append(self._writer(a))
            elif runs and runs[-1][0] + sum(m for _, m in runs[-1][1]) == off:
                runs[-1][1].append((a, n))
            else:
                runs.append((off, [(a, n)]))
                writers.append(("run", len(runs) - 1))
            off += n
        idx = [emit(addr + o, run) for o, run in runs]
        writers = [idx[w[1]] if isinstance(w, tuple) else w for w in writers]
        if any(views):
            row.notes.append(f"{sum(views)} of {len(parts)} inputs written into the output buffer by their "
                             "producers (no copy)")
        if None in writers:
            self.trace_map.pop(node.outputs[0], None)
        else:
            self.trace_map[node.outputs[0]] = (writers[0] if len(writers) == 1 else tuple(writers), kind)

    def _writer(self, addr):
        """Index of the last layer that wrote a main-memory output starting at `addr`."""
        for i in range(len(self.layers) - 1, -1, -1):
            L = self.layers[i]
            if isinstance(L, v3.Layer):
                f = L.fields
                outs = [] if L.name == "K210_CONV" and not f["flags"] & 1 else \
                    [f[k] for k in ("main_mem_out_address", "mem_out_address") if k in f]
            else:
                outs = [r[2] for r in (L.fields.get("output"), L.fields.get("main_mem_output"))
                        if isinstance(r, tuple) and r[0] == MEM_MAIN and r[3]]
            if addr in outs:
                return i
        return None

    def lowered_by(self, node):
        """Name of the registered lowering chosen for `node`."""
        return self.choice[node.name][0].name

    # ------------------------------------------------------------------ emitting
    def emit(self, name, fields, row=None, **kw):
        lt = T[name]
        full = {k: 0 for k in lt.struct.names}
        full.update(fields)
        layer = v3.Layer(lt.id, full, **kw)
        self.layers.append(layer)
        if row is not None:
            row.layers.append(len(self.layers) - 1)
        return len(self.layers) - 1

    def share_blocks(self, idx) -> int:
        """kmodel v3: point the weights, BN and activation table of K210_CONV `idx` at an earlier
        K210_CONV's block of the same bytes, stored once (the runner reads each block at its
        absolute file offset: docs/kmodel-format.md#v3-conv-parameter-placement): the row bands of
        one layer, and the layers whose tables come out alike. Returns the bytes it stores itself.
        kmodel v4 cannot share (its blocks are skips inside each body)."""
        layer = self.layers[idx]
        shared, own = {}, 0
        for b, data in v3.param_blocks(layer.conv).items():
            j = self.blocks.setdefault((b, data), idx) if self.format == "v3" else idx
            if j == idx:
                own += len(data)
            else:
                shared[b] = j
        layer.shared = shared or None
        return own

    def emit_v4(self, name, fields, row=None, data=None):
        """Append a v4-only node (kmodel v4 plans only); `fields` hold every struct field of the
        opcode, ranges as `main(...)` tuples or `Const` blocks (v4emit.py)."""
        from .v4emit import V4Op
        if self.format != "v4":
            raise AssertionError(f"v4 node {name} in a kmodel {self.format} plan")
        self.layers.append(V4Op(name, dict(fields), dict(data or {})))
        if row is not None:
            row.layers.append(len(self.layers) - 1)
        return len(self.layers) - 1

    def row(self, node, why, unit=None, **kw):
        """Start the receipt row of `node`; notes say why preferred alternatives were passed over."""
        alt, passed = self.choice.get(node.name, (None, []))
        r = Row(node.name, node.op, unit or (alt.unit.split()[0] if alt else "CPU"), why, list(node.fused),
                lowering=alt.name if alt else "", **kw)
        skipped = registry.why_not(passed)
        if skipped:
            r.notes.append(skipped)
        self.rows.append(r)
        return r

    def alloc(self, t, kind, nbytes):
        return self.main.alloc(f"{t}:{kind}", nbytes)

    def _named(self, t):
        """`t` and the tensors it relabels (alias), nearest first: a read of `t` reads their bytes."""
        while t is not None:
            yield t
            t = self.relabels.get(t)

    def release(self, node):
        """Free the buffers of tensors whose last consumer was `node` (a read of a relabel counts
        as a read of the tensor whose bytes it names)."""
        for t in (a for i in node.inputs for a in self._named(i)):
            if t in self.uses:
                self.uses[t] -= 1
                if self.uses[t] == 0:
                    self._free_main(t)
                    loc = self.locs.get(t)
                    if loc is not None and loc.block:
                        self.kpu_free(loc)

    def last_reader(self, t) -> bool:
        """Is the node being lowered the last to read `t` (or the bytes it names)?"""
        return all(self.uses.get(a, 0) == 1 for a in self._named(t))

    def release_read(self, t, kpu: bool = False):
        """Free `t`'s main-memory buffers now (and with `kpu` its KPU RAM block), where the node
        being lowered is its last reader and has read it (a band gather, a K x K conv's first
        shift stage): release at the node's end then finds them gone."""
        if self.last_reader(t):
            for a in self._named(t):
                self._free_main(a)
                loc = self.locs.get(a)
                if kpu and loc is not None and loc.block:
                    self.kpu_free(loc)

    def _free_main(self, t):
        for kind in ("u8", "f32", "pixels"):
            self.main.free(f"{t}:{kind}")

    # ------------------------------------------------------------------ KPU RAM
    def kpu_resident(self, t):
        loc = self.locs.get(t)
        return loc is not None and loc.kpu is not None and self.kpu.blocks.get(loc.block) == loc.kpu

    def kpu_alloc(self, loc, name, lines, where, keep=(), away=None, near=False):
        """Put `loc` in a new KPU block, evicting maps that are no longer needed there (they have a
        main-memory copy or no consumers left); `keep` names blocks that must stay. `away`: a
        (start, end) block to keep clear of (the block goes to the far end of KPU RAM; with `near`,
        to its end: the shift stages of a K x K conv whose input stays resident for a later
        reader, packed beside it, so that its output at the far end leaves no hole when they go:
        BiSeNetV2's 1 MiB maps)."""
        while not self.kpu.fits(lines):
            victim = self._evictable(keep)
            if victim is None:
                break
            self.kpu_free(victim)
        high = away is not None and (away[0] < self.kpu.lines - away[1]) != near
        start = self.kpu.alloc(name, lines, where, high)
        loc.kpu, loc.block = (start, start + lines), name
        return start

    def _evictable(self, keep):
        for t, loc in self.locs.items():
            if loc.block and loc.block not in keep and self.kpu_resident(t) and \
                    (loc.u8 is not None or self.uses.get(t, 0) == 0):
                return loc
        return None

    def kpu_free(self, loc):
        if loc.block and self.kpu.blocks.get(loc.block) == loc.kpu:
            self.kpu.free(loc.block)
        for other in self.locs.values():          # aliases of the same map
            if other.block == loc.block:
                other.kpu, other.block = None, None

    # ------------------------------------------------------------------ materialisation
    def need_u8(self, t, row):
        loc = self.locs[t]
        if loc.u8 is not None:
            return loc.u8
        if loc.pixels is not None and loc.f32 is None:     # per-channel preprocessing: a table a channel
            from .v4emit import requantize_pixels
            return requantize_pixels(self, t, row)
        if loc.f32 is not None:
            if loc.quant is None:
                loc.quant = self.quant_of(t)
            loc.u8 = self.alloc(t, "u8", int(np.prod(loc.shape)))
            self.emit_quantize(loc.f32, t, loc.u8, loc.quant, row)
            row.notes.append("quantize to uint8")
            if self.at is not None and self.order[self.at].name == row.node:
                self.drop_copy(t, "f32", self.at)      # the node quantizing it reads the uint8 copy
            return loc.u8
        raise AssertionError(f"tensor {t} has no main-memory copy")

    def emit_quantize(self, src, t, dst, quant, row):
        """QUANTIZE the float map at `src` to tensor `t`'s uint8 buffer `dst` on grid `quant`."""
        s, z = quant
        self.emit("QUANTIZE", dict(flags=0, main_mem_in_address=src, mem_out_address=dst,
                                   count=int(np.prod(self.locs[t].shape)), scale=s,
                                   bias=-(z + self.u8_offset.get(t, 0.0)) * s), row)

    def need_f32(self, t, row):
        loc = self.locs[t]
        if loc.f32 is not None:
            return loc.f32
        if loc.pixels is not None:
            from .v4emit import dequantize_pixels
            return dequantize_pixels(self, t, row)
        src = self.need_u8(t, row)
        s, z = loc.quant
        n = int(np.prod(loc.shape))
        loc.f32 = self.alloc(t, "f32", 4 * n)
        self.emit("DEQUANTIZE", dict(flags=1, main_mem_in_address=src, mem_out_address=loc.f32,
                                     count=n, scale=s, bias=-z * s), row)
        self.trace_map[t] = (len(self.layers) - 1, "f32")
        row.notes.append("dequantize to float")
        if self.at is not None and self.order[self.at].name == row.node:
            self.drop_copy(t, "u8", self.at)       # the node dequantizing it reads the float copy
        return loc.f32

    def need_kpu(self, t, row, keep=(), src=None):
        """Line range of t's map in KPU RAM, uploading it from main memory if needed (from `src`
        where given: the image's pixels, conv.folds_pixels)."""
        if self.kpu_resident(t):
            self.kpu.touch(self.locs[t].block)
            return self.locs[t].kpu
        loc = self.locs[t]
        c, h, w = loc.shape
        src = self.need_u8(t, row) if src is None else src
        lines = hw.map_lines(c, h, w)
        start = self.kpu_alloc(loc, f"{t}:kpu", lines, f"node {row.node!r}: input map {t} {c}x{h}x{w}", keep)
        self.emit("K210_UPLOAD", dict(flags=0, main_mem_in_address=src, kpu_mem_out_address=start,
                                      width=w, height=h, channels=c), row)
        row.notes.append("upload to KPU RAM")
        if src == loc.u8 and loc.pixels is None and self.last_reader(t):
            self.release_read(t)        # read from KPU RAM from here: its main copy need not wait for the
            loc.u8 = None               # node's end (ESPCN: 1 MiB beside the 64x128x128 conv's output)
        return loc.kpu

    def u8_out(self, t, quant=None, shape=None):
        """A fresh uint8 main-memory home for t."""
        loc = Loc(shape or self.shape(t), quant=quant or self.quant_of(t))
        loc.u8 = self.alloc(t, "u8", int(np.prod(loc.shape)))
        self.locs[t] = loc
        return loc

    def in_place(self, node, t, over, quant=None, kind="u8"):
        """A home for `node`'s output `t` in the buffer of its input `over` (its uint8 one, or with
        kind "f32" its float copy), when the op's kernel may write over that input (the caller's
        fact: kmodel.v3/v4 IN_PLACE) and `node` is the input's last reader (node None: `over` is a
        stage of the caller's own, read only here): same size, no relabel or model output sharing
        the bytes. None otherwise (the caller then takes a fresh buffer)."""
        src, shape = self.locs.get(over), self.shape(t)
        name = f"{over}:{kind}"
        if src is None or getattr(src, kind) is None or name not in self.main.blocks or over in self.g.outputs or \
                self.main.viewed(name) or \
                int(np.prod(src.shape)) != int(np.prod(shape)) or \
                (node is not None and self.uses.get(over, 0) != node.inputs.count(over)) or \
                src.pixels is not None or self.relabelled(over):
            return None
        loc = Loc(shape, quant=(quant or self.quant_of(t)) if kind == "u8" else None)
        setattr(loc, kind, self.main.hand_over(name, f"{t}:{kind}"))
        self.locs[t] = loc
        return loc

    def f32_out(self, t, shape=None):
        loc = Loc(shape or self.shape(t))
        loc.f32 = self.alloc(t, "f32", 4 * int(np.prod(loc.shape)))
        self.locs[t] = loc
        return loc

    def alias(self, new, old, shape=None):
        """`new` is `old` relabelled (same bytes): share every copy."""
        src = self.locs[old]
        self.locs[new] = Loc(shape or src.shape, src.quant, src.kpu, src.u8, src.f32, src.block, src.pixels)
        if old in self.trace_map and new not in self.trace_map:
            self.trace_map[new] = self.trace_map[old]
        for t in self._named(old):      # its bytes live while `new` has readers (release)
            self.uses[t] = self.uses.get(t, 0) + self.uses.get(new, 0)
        self.relabels[new] = old

    def traced(self, t, kind):
        self.trace_map[t] = (len(self.layers) - 1, kind)

    def _lower_one(self, node):
        alt = self.choice[node.name][0]
        try:
            alt.fn(self, node)
        except Tl2k210Error:
            raise
        except (ValueError, AssertionError, KeyError, IndexError, ZeroDivisionError) as exc:
            # a register value that does not fit or a case the lowering missed: name the node
            raise Tl2k210Error(f"node {node.name!r} ({describe(node)}): the {alt.name} lowering "
                               f"failed ({type(exc).__name__}: {exc}); nothing was written. Please report "
                               "this model; a smaller or differently shaped layer may convert") from exc

    def _image_fits(self, node):
        """Does the first KPU conv read the whole image from KPU RAM (one band)? Not one on an image
        under the KPU's minimum size, grown to it in main memory (conv.small_map_refuses)."""
        from .conv import SMALL_MAP, plan_for
        from .kxk import image_resident
        if self.lowered_by(node) == SMALL_MAP:
            return False
        if self.lowered_by(node) == "kpu_conv_kxk":
            return image_resident(self.g, node, self.format, self.opts.kpu_ram_lines)
        return self.lowered_by(node) != "kpu_conv" or plan_for(self, node).in_resident

    # ------------------------------------------------------------------ main-memory plan
    def _plan_main(self, outs):
        """Re-place every main-memory buffer once all layers are known (memory.plan: greedy by
        size over the buffers' lifetimes, checked for overlaps) and move each address the layers,
        the outputs and the input hold into its buffer's new place. An address that falls in no
        buffer live at that layer is an error (a read after free). Returns the moved outputs."""
        blocks, end = list(self.main.history), len(self.layers)
        scratch = self._scratch_blocks(blocks)
        at, peak = plan(blocks, end, self.main.views)
        if self.format == "v4" and self.main.high:
            self.smaller[PARK] = True        # the same ops on the same bytes, in other memory
            if PARK in self.opts.small:      # named only: "*" is every smaller *form*
                at, peak = self._park(blocks, end, at, peak)
        if not self.main.views and not self.parked and \
                peak >= max((blocks[i].start + blocks[i].size for i in at), default=0):
            return outs                      # first fit is as good: the layout stays as allocated
        self.scratch_at = {t: at[i] for t, i in scratch.items()}
        live = [[] for _ in range(end + 1)]
        for i in at:
            b = blocks[i]
            for t in range(b.t0, min(end, end if b.t1 is None else b.t1) + (b.t1 is None)):
                live[t].append(i)

        def move(addr, t, size=1):
            for i in live[t]:
                b = blocks[i]
                if b.start <= addr and addr + size <= b.start + b.size:
                    return at[i] + addr - b.start
            raise AssertionError(f"layer {t}: main-memory bytes [{addr}, {addr + size}) are in no live buffer")

        for t, layer in enumerate(self.layers):
            _relocate(layer, lambda a, n=1, t=t: move(a, t, n))
        loc = self.locs[self.g.inputs[0]]        # the input range of the v4 header
        if loc.pixels is not None:
            loc.u8 = move(loc.u8, 0) if loc.u8 == loc.pixels else loc.u8
            loc.pixels = move(loc.pixels, 0)
        elif loc.f32 is not None and self.pixel_input is None:
            loc.f32 = move(loc.f32, 0)
        main = {i for i in at if i not in self.main.views and at[i] < PARK_BASE}
        self.main.high = peak
        # the buffers live together at the layer where the most bytes are: what no layout can
        # put under each other (those live where the topmost one starts can be few: a PAN's
        # 1 MB of 8 there, its three 2.3 MB float maps live later in that buffer's lifetime)
        most = max(range(end + 1), key=lambda t: sum(blocks[i].size for i in live[t] if i in main)) if main else 0
        self.main.at_high = {blocks[i].name: (at[i], blocks[i].size) for i in live[most] if i in main}
        return [(move(a, end, n), n) for a, n in outs]

    def _park(self, blocks, end, at, peak):
        """kmodel v4 (PARK): main-memory buffers into KPU RAM lines free over their lifetimes
        (memory.park), every one but the model's input and outputs and the buffers that hold
        views. Returns the plan (parked buffers at PARK_BASE + their KPU byte) and its peak."""
        views = self.main.views
        x = self.g.inputs[0]
        fixed = set(views) | {j for j, _ in views.values()}
        movable = {i for i, b in enumerate(blocks) if i not in fixed and b.t1 is not None
                   and not b.name.startswith(f"{x}:")}
        parked, rest, low = park(blocks, end, views, self.kpu.used_history(), self.kpu.lines, movable)
        if low >= peak:
            return at, peak
        for i, line in parked.items():
            rest[i] = PARK_BASE + line * hw.LINE_BYTES
        self.parked = [(blocks[i].name, blocks[i].size) for i in parked]
        lines = [Block(blocks[i].name, line, -(-blocks[i].size // hw.LINE_BYTES), blocks[i].t0, blocks[i].t1)
                 for i, line in parked.items()]
        self.kpu.peak = max(self.kpu.peak, kpu_peak(self.kpu.used_history(0) + lines, end))
        return rest, low

    def _scratch_blocks(self, blocks):
        """kmodel v4: the temporaries of each v3 layer written as several v4 nodes (v4emit.py),
        as one buffer live during that layer, planned with the others (appended to `blocks`; at
        first fit they sit above the lowering's allocation, where assemble would put them).
        Returns {layer index: block index}."""
        if self.format != "v4":
            return {}
        from .v4emit import scratch_need
        out = {}
        for t, layer in enumerate(self.layers):
            n = scratch_need(layer)
            if n:
                out[t] = len(blocks)
                blocks.append(Block(f"layer {t} ({layer.name}) temporaries", self.main.high, n, t, t + 1))
        return out

    # ------------------------------------------------------------------ entry
    def run(self):
        g = self.g
        check_one_input(g)
        plain = replace(self.opts, small=frozenset())
        for node in self.order:
            alt = self.choice[node.name] = registry.select(g, node, self.opts, self.format)
            if alt[0].unit in (registry.KPU, registry.CPU_F32) and \
                    registry.smaller_alternative(g, node, self.opts, alt[0]):
                self.smaller[node.name] = False       # another unit: other arithmetic
            elif wants_small(self.opts, node) and registry.select(g, node, plain, self.format)[0] != alt[0]:
                self.smaller.setdefault(node.name, False)   # in its smaller form already (a "*" plan)
        x = g.inputs[0]
        first = self.consumers(x)
        shape = self.shape(x)
        kpu_first = len(shape) == 3 and first and all(self.lowered_by(n).startswith("kpu_conv") for n in first)
        if kpu_first and self.format == "v4" and (len(first) > 1 or not self._image_fits(first[0])):
            kpu_first = False      # v4: the image stays in main memory, uploaded where convs read it
        if kpu_first:
            if len(first) > 1:
                raise UnsupportedOpError(
                    f"the image input {x} feeds {len(first)} convs ({', '.join(n.name for n in first)}); "
                    "the runtime puts the image in KPU RAM once, for the first layer only: start the "
                    "model with one conv and branch after it (or use kmodel v4, which can keep the image "
                    "in main memory and upload it for each conv)")
            self.locs[x] = Loc(shape)
            self.pixel_input = x
        elif len(shape) == 3 and self.format == "v4":
            # kmodel v4 runs a CPU op first, or several convs read the image: the camera image in
            # main memory, as uint8 pixels (uploaded to KPU RAM for each conv that reads it)
            from .v4emit import pixel_quant
            loc = self.locs[x] = Loc(shape, pixels=self.alloc(x, "pixels", int(np.prod(shape))))
            q = pixel_quant(self.opts, shape[0])
            if q is not None:          # the pixels are the input's uint8 form (one affine map, integer zp)
                loc.u8, loc.quant = loc.pixels, q
            self.pixel_main = x
        elif len(shape) == 1 or (len(shape) == 3 and shape[1:] == (1, 1)) or self.format == "v4":
            self.locs[x] = Loc(shape, f32=self.alloc(x, "f32", 4 * int(np.prod(shape))))
        else:
            raise UnsupportedOpError(
                f"input {x} {shape} feeds {[f'{n.name} ({n.op})' for n in first]}: MaixPy and the SDK "
                "run a kmodel whose first layer is a KPU conv (image input) or a dense layer (vector "
                "input); start the model with a Conv on the image")
        for self.at, node in enumerate(self.order):
            if node.name not in self.folded:
                try:
                    self._lower_one(node)
                except KpuLimitError as e:
                    e.node = getattr(e, "node", None) or node.name     # fit.choose_forms: its smaller form
                    raise
            self.release(node)
            self.kpu.end_node()
            for t in dict.fromkeys(node.inputs):    # a copy no reader to come needs (float for a resize)
                self.drop_copy(t, "f32", self.at + 1)
                self.drop_copy(t, "u8", self.at + 1)
        self.at = None
        outs = {}
        for k, o in sorted(enumerate(g.outputs), key=lambda ko: -int(np.prod(self.locs[ko[1]].shape))):
            row = Row(o, "output", "CPU", "model outputs are float32 in main memory")
            outs[k] = (self.need_f32(o, row), 4 * int(np.prod(self.locs[o].shape)))
            if row.layers:
                self.rows.append(row)
            self._drop_output_u8(o, [p for p in g.outputs if p != o and g.outputs.index(p) not in outs])
        outs = self._plan_main([outs[k] for k in range(len(g.outputs))])
        if self.format == "v4":
            from .v4emit import assemble
            return assemble(self, outs)
        clash = v3.overlapping_io(v3.KModelV3(self.layers, outs, self.main.high))
        if clash:   # the SDK's loops would read what they already wrote
            raise AssertionError("internal error: the main-memory plan gives a layer an output range over "
                                 "one of its inputs: " + "; ".join(clash))
        first_layer = self.layers[0].name if self.layers else None
        if first_layer not in ("K210_CONV", "FULLY_CONNECTED"):
            raise UnsupportedOpError(f"the first kmodel layer would be {first_layer}; the SDK/MaixPy "
                                     "need K210_CONV or FULLY_CONNECTED first in a kmodel v3: convert with "
                                     "--format v4 (or auto) for a runtime that loads it, or give the model an "
                                     "image input its first conv reads")
        return v3.KModelV3(self.layers, outs, self.main.high, flags=1 if self.opts.weight_bits == 8 else 0,
                           max_start_address=self.kpu.lowest, packed=True, compact=self.opts.compact)


MAIN_FIELDS = ("main_mem_in_address", "main_mem_in_a_address", "main_mem_in_b_address", "main_mem_out_address",
               "mem_out_address")


def _relocate(layer, move):
    """Move the main-memory addresses of one plan item (a v3 layer or a v4 node) with `move(addr,
    size)`."""
    if isinstance(layer, v3.Layer):
        f = layer.fields
        for k in MAIN_FIELDS:
            if k in f and not (layer.name == "K210_CONV" and not f["flags"] & 1):
                f[k] = move(f[k])
        if "ranges" in layer.data:
            layer.data["ranges"] = [(move(a, n), n) if n else (a, n) for a, n in layer.data["ranges"]]
        return

    def rng(r):
        return (r[0], r[1], move(r[2], r[3]), r[3]) if isinstance(r, tuple) and r[0] == MEM_MAIN and r[3] else r

    for name, typ, _ in OPCODE_BY_NAME[layer.name].struct.fields:
        if typ == "range":
            layer.fields[name] = rng(layer.fields[name])
    if "inputs" in layer.data:
        layer.data["inputs"] = [rng(r) for r in layer.data["inputs"]]

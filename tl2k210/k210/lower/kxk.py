"""K x K convs (5x5, 7x7, ..., and dilated 3x3) exactly on the KPU's 3x3 kernel; K x L ones too
(a keyword spotter's 10x4 on MFCCs, a 1x5): each axis reads its own taps, both in the stages of
the longer one, and an even kernel reads one more tap before its centre than after, or after
than before, as its padding needs (`_centres`).

A conv with K = 2R+1 reads input offsets u in [-R, R]^2. One-hot 3x3 "copy" stages build a map
holding every input channel shifted by each offset d of a set D (a stage moves each copy by one
step t in {-1, 0, 1}^2 per axis), then one 3x3 conv reads that map with the re-indexed weights:
tap u is copy d read at step t, u = d + t. The copies are byte for byte (ACC = the picked byte,
BN x1, identity table, the input's quantization) and the last stage computes the K x K conv's
accumulator with its per-channel weights, so the result is the quantized K x K conv exactly -
provided an off-map read (the pad value) happens only where the K x K conv reads off the map
too. That holds when every step keeps its copy's direction (t = 0, d = 0 or sign(d) = t): a
read then leaves the map only when the whole offset does.

Forms (`forms`), all exact, the cheapest by the cost model chosen and named in the receipt:
  * "shift grid": D_r = [-r, r]^2 after stage r (R-1 stages; 9 copies per channel for 5x5, 25
    for 7x7);
  * "sparse shifts": the fewest copies per stage that still reach every tap monotonically
    (7x7: 9 copies in both stages, {-2, 0, 2}^2 last);
  * "stride-2 phases" (stride 2, even maps): the last copy stage also picks every second pixel
    (KPU pick pool), so the 3x3 stage runs on the quarter-size map: input row 2j + v = 2(j + t)
    + a with copies a (5x5: a in {0, 1}^2, 4 copies): a quarter of the 3x3 stage's MACs.
Channels are grouped per input channel, so every stage is a group conv (depthwise K x K stays
grouped: |D| inputs per output); conv.py tiles each stage, choosing the tile size by the cost
model, and keeps the intermediate maps in KPU RAM when they fit.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from itertools import combinations

import numpy as np

from tl2k210.graph import Node
from tl2k210.k210 import hardware as hw

from . import kpu
from .conv import (conv_cycles, describe, emit_layer, geometry, input_terms, is_dense, kpu_conv_refuses,
                   plan_for, quantize_conv)
from .registry import KPU, NA, lowering
from .state import SMALLER_TAKEN, wants_small


def _effective_kernel(a):
    """((rows, columns) the kernel spans, its taps (kh, kw), its dilations)."""
    k, d = tuple(a["kernel"]), tuple(a.get("dilations", (1, 1)))
    return ((k[0] - 1) * d[0] + 1, (k[1] - 1) * d[1] + 1), k, d


def _centres(g, node):
    """Per axis, the kernel tap c each output pixel is centred on (taps read offsets -c .. K-1-c):
    K // 2, or for an even kernel (K-1) // 2 where its padding is larger at the end (TF's SAME);
    None where neither keeps every output's centre on the map (the stride-1 map the KPU computes)."""
    a = node.attrs
    (Ky, Kx), _, _ = _effective_kernel(a)
    _, _, h, w = g.shape(node.inputs[0])
    _, _, oh, ow = g.shape(node.outputs[0])
    out = []
    for K, p, s, size, o in ((Ky, a["pads"][0], a["strides"][0], h, oh), (Kx, a["pads"][1], a["strides"][1], w, ow)):
        c = next((c for c in (K // 2, (K - 1) // 2) if 0 <= p <= c and c - p + (o - 1) * s <= size - 1), None)
        if c is None:
            return None
        out.append(c)
    return tuple(out)


def _keeps_direction(d, t):
    """Reading copy d at step t leaves the map only when the whole offset d + t does."""
    return t == 0 or d == 0 or np.sign(d) == t


# ---------------------------------------------------------------------------------------------
# one axis: copy sets per stage and how the final 3x3 reaches each tap
@dataclass(frozen=True)
class Axis:
    sets: tuple        # copy offsets after each copy stage: (S_1, ..., S_n), S_0 = (0,)
    parents: tuple     # per stage: {offset: (parent offset, step)}
    taps: dict         # needed tap -> (copy offset in S_n, final step)


COVER_TRIES = 20_000    # subsets _cover tries before it takes the greedy cover


def _cover(need, cands, reach):
    """The smallest subset S of `cands` (then the most central) with reach(v, S) for every v in need;
    past COVER_TRIES subsets, the greedy cover (a dilated temporal conv, kernel 8 at dilation 8,
    needs 8 of 113 offsets: the exact search ran for hours). An offset is reached through one
    member of S (`reach` tries each), so each candidate's reach is a bit mask of `need`, and a
    subset covers where their union is all of it."""
    cands = sorted(cands, key=lambda v: (abs(v), v))
    masks = _reach_masks(need, cands, reach)
    full = (1 << len(need)) - 1
    tries = 0
    for n in range(1, len(cands) + 1):
        for s in combinations(cands, n):
            m = 0
            for c in s:
                m |= masks[c]
            if m == full:
                return tuple(sorted(s))
            tries += 1
            if tries > COVER_TRIES:
                return _greedy_cover(full, cands, masks)
    return None


def _reach_masks(need, cands, reach):
    """{candidate c: bit i set where reach(need[i], (c,))}."""
    return {c: sum(1 << i for i, v in enumerate(need) if reach(v, (c,)) is not None) for c in cands}


def _greedy_cover(full, cands, masks):
    """A subset of `cands` whose `masks` together cover `full`: each time the candidate that
    reaches the most of those left (the most central of equals), None where none reaches any
    (a 1x256 filterbank conv: 127 stages, each a greedy cover)."""
    chosen, left = [], full
    while left:
        best = max(cands, key=lambda c: (masks[c] & left).bit_count())
        if best in chosen or not masks[best] & left:
            return None
        chosen.append(best)
        left &= ~masks[best]
    return tuple(sorted(chosen))


def _back(final, n):
    """Copy sets S_1..S_n ending in `final`, each the smallest reaching the next monotonically."""
    sets, parents, cur = [final], [], final
    for i in range(n, 0, -1):
        prev = _cover(cur, range(-(i - 1), i), _parent) if i > 1 else (0,)
        if prev is None or any(_parent(v, prev) is None for v in cur):
            return None
        parents.insert(0, {v: _parent(v, prev) for v in cur})
        sets.insert(0, prev)
        cur = prev
    return tuple(sets[1:]), tuple(parents)


def _parent(v, s):
    for t in (0, 1, -1):
        if v - t in s and _keeps_direction(v - t, t):
            return (v - t, t)
    return None


@lru_cache(maxsize=None)     # forms() asks again for every pass and lowering that weighs the conv
def _axis_stride1(need, R, sparse):
    n = R - 1
    if sparse:
        final = _cover(need, range(-n, n + 1), _parent)
        chain = _back(final, n) if final else None
        if chain is None:
            return None
        sets, parents = chain
    else:            # the grid: [-r, r] after stage r, steps t = sign(d) where |d| = r
        final = tuple(range(-n, n + 1))
        sets = tuple(tuple(range(-r, r + 1)) for r in range(1, n + 1))
        parents = tuple({d: (d - _edge(d, r), _edge(d, r)) for d in range(-r, r + 1)} for r in range(1, n + 1))
    return Axis(sets, parents, {u: _parent(u, final) for u in need})


def _edge(d, r):
    return int(np.sign(d)) if abs(d) == r else 0


def _phase_reach(size, out):
    """reach(v, S) on an axis of `size` pixels giving `out` outputs: input offset v = 2t + a from
    copy a at half-resolution step t. Off the half-size map (size // 2 rows) the true row is
    -2 + a (t = -1 at the first output): off the map too only if a <= 1; or 2 (size // 2) + a
    (t = +1 at the last output, reached only when out = size // 2): off the map too only if
    a >= 0 (even size), a >= 1 (odd size). Fewer outputs than size // 2 (VALID pads) never
    step past the half map: the stage's extra rows are cropped."""
    last = out == size // 2
    amin = size % 2

    def reach(v, s):
        for t in (0, -1, 1):
            a = v - 2 * t
            if a in s and (t != -1 or a <= 1) and (t != 1 or not last or a >= amin):
                return (a, t)
        return None
    return reach


@lru_cache(maxsize=None)
def _axis_phase(need, size, out):
    reach = _phase_reach(size, out)
    for n in (1, 2):
        final = _cover(need, range(-n, n + 1), reach)
        if final is None or max(abs(a) for a in final) != n:
            continue
        chain = _back(final, n)
        if chain is not None:
            return Axis(chain[0], chain[1], {v: reach(v, final) for v in need})
    return None


# ---------------------------------------------------------------------------------------------
# forms: both axes, the stages' channel counts and the cost model's cycles
@dataclass(frozen=True)
class Form:
    name: str
    ay: Axis
    ax: Axis
    phase: bool           # the last copy stage picks stride 2; the 3x3 stage runs on the small map
    cycles: int
    channels: int         # input channels of the 3x3 stage

    def copies(self, i):
        """2-D copy offsets after copy stage i (1-based; 0: the input itself)."""
        if i == 0:
            return [(0, 0)]
        return [(y, x) for y in self.ay.sets[i - 1] for x in self.ax.sets[i - 1]]

    @property
    def n(self):
        return len(self.ay.sets)


def _needs(K, d, R, dy0, phase):
    """The input offsets an axis's taps read (R: its centre tap; phase: from the stride-2 pick's
    origin dy0)."""
    taps = tuple(u * d - R for u in range((K - 1) // d + 1))
    return tuple(dy0 + u for u in taps) if phase else taps


def forms(g, node, fmt="v3", windows=False):
    """Every exact form of this K x K conv (an empty list if none has a 3x3 stage the KPU takes),
    cheapest first by the cost model (kmodel `fmt`: its CPU pick/crop layer). `windows`: a stage
    may hold more channels than one KPU layer takes where conv.py's tiles of a few groups each
    (channel windows, each its own slice of the stage chain) take at most that many."""
    a = node.attrs
    (Ky, Kx), _, (dly, dlx) = _effective_kernel(a)
    centres = _centres(g, node)
    if centres is None:
        return []
    Ry, Rx = centres
    R = max(Ry, Ky - 1 - Ry, Rx, Kx - 1 - Rx)    # a K x L kernel: both axes in the stages of the longer
    _, ci, h, w = g.shape(node.inputs[0])
    _, co, oh, ow = g.shape(node.outputs[0])
    grp, s = a.get("group", 1), a["strides"][0]
    dy0, dx0 = Ry - a["pads"][0], Rx - a["pads"][1]
    first = node.inputs[0] in g.inputs
    cand = []
    for name, sparse in (("shift grid", False), ("sparse shifts", True)) if R > 1 else ():
        ay, ax = _axis_stride1(_needs(Ky, dly, Ry, 0, False), R, sparse), \
            _axis_stride1(_needs(Kx, dlx, Rx, 0, False), R, sparse)
        if ay is not None and ax is not None:
            cand.append((name, ay, ax, False))
    if s == 2 and oh <= h // 2 and ow <= w // 2 and min(h // 2, w // 2) >= hw.LIMITS["out_min"]:   # docs/kpu.md#limits
        ay = _axis_phase(_needs(Ky, dly, Ry, dy0, True), h, oh)
        ax = _axis_phase(_needs(Kx, dlx, Rx, dx0, True), w, ow)
        if ay is not None and ax is not None:
            cand.append(("stride-2 phases", ay, ax, True))
    out, seen = [], set()
    cmax = hw.LIMITS["channels"][1]
    for name, ay, ax, phase in cand:
        if len(ay.sets) != len(ax.sets):
            continue
        key = (ay.sets, ax.sets, phase)
        if key in seen:
            continue
        seen.add(key)
        f = Form(name, ay, ax, phase, 0, 0)
        cyc, prev = 0, 1
        for i in range(1, f.n + 1):
            nd = len(f.copies(i))
            wo = w // 2 if phase and i == f.n else w
            if ci * nd > cmax and not (windows and _windows_fit(ci * len(f.copies(i - 1)), ci * nd, ci, w, wo)):
                break
            cyc += conv_cycles(ci, ci * nd, ci, 3, h, w, wo, dense=first and i == 1)[1]
            prev = nd
        else:
            hh, ww = (h // 2, w // 2) if phase else (h, w)
            if ci * prev > cmax and (grp == 1 or windows and not _windows_fit(ci * prev, co, grp, ww, ww)):
                continue
            cyc += conv_cycles(ci * prev, co, grp, 3, hh, ww, ww)[1]
            if (oh, ow) != (hh, ww) or not phase and s != 1:      # the CPU picks or crops
                cyc += post_cycles(co * hh * ww, co * oh * ow, fmt)
            out.append(Form(name, ay, ax, phase, cyc, ci * prev))
    return sorted(out, key=lambda f: f.cycles)


def _windows_fit(ci, co, groups, w, w_out):
    """Do conv.py's tiles of a grouped stage (its cheapest and its fewest-bytes aligned splits,
    conv_cycles) each read and write at most the channels one KPU layer takes?"""
    cmax = hw.LIMITS["channels"][1]
    m, n = ci // groups, co // groups
    return all(max(q * m, q * n) <= cmax
               for q in (conv_cycles(ci, co, groups, 3, 1, w, w_out, small=small)[0] for small in (False, True)))


def post_cycles(n_in, n_out, fmt="v3"):
    """Cost-model cycles of streaming an n_in-byte KPU map to main memory and picking or cropping
    n_out bytes of it on the CPU (conv.py's post stage: v3 QUANTIZED_MAX_POOL2D, a pass over its
    input; v4 strided_slice, a copy of its output)."""
    from tl2k210.k210 import cost
    cpu = cost.CPU_CYCLES["copy"] * n_out if fmt == "v4" else cost.CPU_CYCLES["elem"] * n_in
    return int(n_in / cost.DMA_BYTES_PER_CYCLE + cpu)


def stride1_cycles(g, node, fmt="v3"):
    """Cost-model cycles of kpu_conv's form of a stride-2 3x3 conv whose pixels no KPU pick pool
    takes: the conv at stride 1 (4x the output), streamed, every second pixel picked on the CPU."""
    _, ci, h, w = g.shape(node.inputs[0])
    _, co, oh, ow = g.shape(node.outputs[0])
    return conv_cycles(ci, co, node.attrs.get("group", 1), 3, h, w, w)[1] + post_cycles(co * h * w, co * oh * ow, fmt)


def phase_lines(g, node, form):
    """KPU RAM lines the phases' largest stage needs with its input and output resident."""
    _, ci, h, w = g.shape(node.inputs[0])
    co = g.shape(node.outputs[0])[1]
    prev, need = hw.map_lines(ci, h, w), 0
    for i in range(1, form.n + 1):
        c = ci * len(form.copies(i))
        out = hw.map_lines(c, h // 2, w // 2) if i == form.n else hw.map_lines(c, h, w)
        need, prev = max(need, prev + out), out
    return max(need, prev + hw.map_lines(co, h // 2, w // 2))


def phase_forms(g, node, fmt="v3") -> list:
    """The 'stride-2 phases' forms of a 3x3 stride-2 conv no KPU pick pool takes, else []: such a
    conv has an exact KPU form storing its weights 4x (the phases) and one storing them once (the
    stride-1 map + CPU pick)."""
    a = node.attrs
    if (tuple(a["kernel"]), tuple(a.get("dilations", (1, 1))), tuple(a["strides"])) != ((3, 3), (1, 1), (2, 2)) \
            or a.get("pool") or "pick" in a or any(p not in (0, 1) for p in a["pads"]) or is_dense(g, node):
        return []                # ("pick": a stage of a decomposed conv, or kxk_refuses' shadow)
    _, ci, h, w = g.shape(node.inputs[0])
    _, co, oh, ow = g.shape(node.outputs[0])
    grp = a.get("group", 1)
    dy, dx = 1 - a["pads"][0], 1 - a["pads"][1]
    if ci % grp or co % grp or (oh, ow) == (h // 2, w // 2) and dy == 0 and dx in ((0,) if grp == ci == co else (0, 1)):
        return []                # a KPU pick pool takes it (a depthwise conv's: the next 1x1 conv's)
    return forms(g, node, fmt)


def phases_preferred(g, node, opts=None):
    """Does this 3x3 stride-2 conv run as 'stride-2 phases' (kpu_conv_kxk) rather than kpu_conv?
    Both are exact. Yes when no KPU pick pool takes its pixels (VALID or asymmetric pads: an odd
    row phase, an output smaller than the pool's), the cost model finds the phases cheaper than
    the stride-1 map + CPU pick, and the phases' maps fit the KPU RAM (else their copies would
    wait in main memory, 4x the input where the stride-1 form streams chunks of its output) - or
    the stride-1 form cannot run at all: a first layer whose stride-1 map is too wide to stream
    (and a first layer cannot run in row bands)."""
    fmt = _fmt(opts)
    alts = phase_forms(g, node, fmt)
    if not alts:
        return False
    _, _, h, w = g.shape(node.inputs[0])
    if node.inputs[0] in g.inputs and h * w > kpu.STREAM_PIXELS:
        return True              # v3 cannot run the stride-1 form, v4 only with the image in main memory
    if wants_small(opts, node):
        return False             # the phases' re-indexed weights are 4x the conv's
    cap = getattr(opts, "kpu_ram_lines", hw.KPU_RAM_LINES)
    return alts[0].cycles < stride1_cycles(g, node, fmt) and phase_lines(g, node, alts[0]) <= cap


def _fmt(opts):
    return "v4" if getattr(opts, "format", "v3") == "v4" else "v3"


def phases_passed_over(g, node, opts):
    """Why a 3x3 stride-2 conv with a phases form runs as the stride-1 map + CPU pick (the
    receipt's note), or None."""
    a = node.attrs
    if tuple(a["kernel"]) != (3, 3) or tuple(a["strides"]) != (2, 2) or is_dense(g, node):
        return None
    fmt = _fmt(opts)
    alts = forms(g, node, fmt)
    if not alts:
        return None
    f, s1 = alts[0], stride1_cycles(g, node, fmt)
    lines, cap = phase_lines(g, node, f), getattr(opts, "kpu_ram_lines", hw.KPU_RAM_LINES)
    why = (f"its copies need {lines * hw.LINE_BYTES:,} B of KPU RAM (> {cap * hw.LINE_BYTES:,} B)" if lines > cap
           else f"{SMALLER_TAKEN} (see the receipt's trades)" if wants_small(opts, node)
           else "not cheaper")
    return f"stride 1 + CPU pick: est. {s1:,} cycles; 'stride-2 phases' {f.cycles:,}, not chosen: {why}"


def image_resident(g, node, fmt="v3", cap=hw.KPU_RAM_LINES) -> bool:
    """Does this K x K first layer's first stage read the image where the runtime puts it, in KPU
    RAM: is the image within the KPU's rows and columns, and do it and the stage's copies fit
    there together? (Else the stage runs in row bands from a main-memory image: kmodel v4 only.)"""
    alts = forms(g, node, fmt)
    _, ci, h, w = g.shape(node.inputs[0])
    if h > hw.LIMITS["in_h"][1] or w > hw.LIMITS["in_w"][1]:
        return False
    if not alts:
        return True
    f = alts[0]
    oh, ow = (h // 2, w // 2) if f.phase and f.n == 1 else (h, w)
    return hw.map_lines(ci, h, w) + hw.map_lines(ci * len(f.copies(1)), oh, ow) <= cap


def kxk_refuses(g, node, opts, windows=False):
    if is_dense(g, node):
        return NA
    a = node.attrs
    (Ky, Kx), k, d = _effective_kernel(a)
    if k in ((1, 1), (3, 3)) and d == (1, 1) and not (k == (3, 3) and phases_preferred(g, node, opts)):
        return NA                            # kpu_conv's
    _, ci, h, w = g.shape(node.inputs[0])
    centres = _centres(g, node)
    if centres is None:
        return (f"pads {a['pads']} of a {Ky}x{Kx} kernel: an output's centre tap falls off the {h}x{w} map "
                "(pads larger than the kernel's border)")
    Ry, Rx = centres
    R = max(Ry, Ky - 1 - Ry, Rx, Kx - 1 - Rx)
    if not forms(g, node, windows=windows):
        cmax = hw.LIMITS["channels"][1]
        per = 1
        for K1, d1, R1 in ((Ky, d[0], Ry), (Kx, d[1], Rx)):   # the fewest copies: sparse shifts, else the grid
            need = _needs(K1, d1, R1, 0, False)
            sets = (_axis_stride1(need, R, True) or _axis_stride1(need, R, False)).sets
            per *= len(sets[-1]) if sets else 1
        if ci * per <= cmax:                 # not the channels: a small kernel whose padding the border cannot take
            return (f"pads {a['pads']} of a {Ky}x{Kx} kernel: as a 3x3 KPU kernel with zero taps it would need "
                    f"more padding on a side than the KPU's 1-pixel border (pad the map first, or pad it less)")
        grouped = a.get("group", 1) > 1     # (a depthwise conv's edgetpu MobileNet had read "or a depthwise conv")
        return (f"a {Ky}x{Kx} kernel on {ci} channels reads {ci * per} shifted channels; the KPU reads "
                f"{cmax}: " + ("no split of its groups into channel windows keeps every layer within it" if windows
                               else f"at most {cmax // per} input channels in one layer; a depthwise/group conv "
                               "runs in channel windows in kmodel v4 (in v3 too with --format v3)" if grouped
                               else f"at most {cmax // per} input channels (or a depthwise/group conv)"))
    if node.inputs[0] in g.inputs and _fmt(opts) == "v3" and \
            not image_resident(g, node, "v3", getattr(opts, "kpu_ram_lines", hw.KPU_RAM_LINES)):
        why = (f"is over the {hw.LIMITS['in_h'][1]} rows / {hw.LIMITS['in_w'][1]} columns one KPU layer reads"
               if h > hw.LIMITS["in_h"][1] or w > hw.LIMITS["in_w"][1] else
               "and its first shift stage's copies do not fit there together")
        return (f"a first layer reads the image from KPU RAM, whole: the {ci}x{h}x{w} image {why}; kmodel v4 "
                "keeps the image in main memory and runs the stage in row bands")
    shadow = Node("Conv", node.inputs, node.outputs, {**a, "kernel": (3, 3), "dilations": (1, 1),
                                                     "pads": [1, 1, 1, 1], "pick": None}, node.name)
    return kpu_conv_refuses(g, shadow, opts)


def windows_refuses(g, node, opts):
    """A grouped / depthwise K x K conv whose shift stages hold more channels than one KPU layer
    takes (MobileFaceNet's 7x7 GDConv on 512 channels: 4,608) runs them in channel windows, each
    window of groups its own slice of the stage chain (conv.py's grouped tiles, every tile of
    every stage within the KPU's channels). In kmodel v3 only where v3 is asked for by name
    (`--format auto` takes v4, which also has the CPU's quantized_conv2d); in v4 the fastest
    form, with quantized_conv2d as its smaller one: the windows' last layers store each window's
    groups as one dense block (DBFace's 5x5 convs on 240 channels: 188 KiB for 7 KB of weights,
    3.8 ms on the KPU against 23 ms on the CPU), which the planner trades back for bytes."""
    if is_dense(g, node) or node.attrs.get("group", 1) == 1 or forms(g, node):
        return NA            # kpu_conv_kxk's (or kpu_conv's), or no window helps a dense conv
    return kxk_refuses(g, node, opts, windows=True)


@lowering("Conv", unit=KPU, check=kxk_refuses, name="kpu_conv_kxk")
def kpu_conv_kxk(lw, node):
    _lower(lw, node, forms(lw.g, node, lw.format))


@lowering("Conv", unit=KPU, check=windows_refuses, formats=("v3",), name="kpu_conv_kxk_windows", explicit=True)
@lowering("Conv", unit=KPU, check=windows_refuses, formats=("v4",), name="kpu_conv_kxk_windows")
def kpu_conv_kxk_windows(lw, node):
    _lower(lw, node, forms(lw.g, node, lw.format, windows=True), " in channel windows")


def _lower(lw, node, alts, windows=""):
    a = node.attrs
    x, out = node.inputs[0], node.outputs[0]
    (Ky, Kx), k, d = _effective_kernel(a)
    Ry, Rx = _centres(lw.g, node)
    ci, h, w = lw.shape(x)
    grp = a.get("group", 1)
    W = np.asarray(lw.g.tensors[node.inputs[1]].value, np.float64)
    co, m = W.shape[:2]
    if d != (1, 1):      # a dilated kernel is a K x K kernel with zeros between the taps
        We = np.zeros((co, m, Ky, Kx))
        We[:, :, ::d[0], ::d[1]] = W
        W = We
    B = np.asarray(lw.g.tensors[node.inputs[2]].value, np.float64)
    form = alts[0]
    row = lw.row(node, "", in_shape=(ci, h, w), out_shape=lw.shape(out), form=form.name)
    sc, _, z_x, _ = input_terms(lw, x, ci)
    quant = (float(sc[0]), z_x) if x != lw.pixel_input and x not in lw.pixel_copy else (None, z_x)
    pixels = lw.pixel_copy.get(x, np.arange(ci) if x == lw.pixel_input else None)
    base = dict(kernel=(3, 3), strides=(1, 1), pads=[1, 1, 1, 1], dilations=(1, 1))
    stages, src = [], x
    for i in range(1, form.n + 1):          # copy stages: each copy moves one step
        prev, offs = form.copies(i - 1), form.copies(i)
        py, px = form.ay.parents[i - 1], form.ax.parents[i - 1]
        onehot = np.zeros((ci * len(offs), len(prev), 3, 3), np.uint8)
        for j, (oy, ox) in enumerate(offs):
            (ppy, ty), (ppx, tx) = py[oy], px[ox]
            onehot[j::len(offs), prev.index((ppy, ppx)), ty + 1, tx + 1] = 1
        z = f"{out}:shift{i}"
        pick = form.phase and i == form.n
        lw.virtual_shapes[z] = (ci * len(offs), h // 2, w // 2) if pick else (ci * len(offs), h, w)
        if pixels is not None:
            lw.pixel_copy[z] = np.repeat(pixels, len(offs))
        elif x in lw.opts.channel_means:      # the copies' means: their input channel's (bias correction);
            # a stage's channels are copies of x's, c * len(offs) + j (not of the stage before)
            lw.opts.channel_means[z] = np.repeat(lw.opts.channel_means[x], len(offs))
        attrs = {**base, "group": ci, **({"pick": (0, 0, 2)} if pick else {})}
        stages.append((Node("Conv", [src], [z], attrs, f"{node.name}/shift{i}"),
                       kpu.copy_layer(onehot, quant, lw.opts.weight_bits, ci)))
        src = z
    last = form.copies(form.n)
    per = len(last)
    W2 = np.zeros((co, m * per, 3, 3))
    dy0, dx0 = Ry - a["pads"][0], Rx - a["pads"][1]
    for ky in range(0, Ky, d[0]):
        for kx in range(0, Kx, d[1]):
            uy, ux = ky - Ry + (dy0 if form.phase else 0), kx - Rx + (dx0 if form.phase else 0)
            (cy, ty), (cx, tx) = form.ay.taps[uy], form.ax.taps[ux]
            W2[:, last.index((cy, cx))::per, ty + 1, tx + 1] = W[:, :, ky, kx]
    pick = (0, 0, 1) if form.phase else (dy0, dx0, a["strides"][0])
    final = Node("Conv", [src, node.inputs[1], node.inputs[2]], [out],
                 {**a, **base, "group": grp, "pick": pick}, node.name, list(node.fused))
    for (prev_node, _), (nxt, _) in zip(stages, stages[1:] + [(final, None)]):
        lw.virtual_next[prev_node.outputs[0]] = nxt
    if not lw.last_reader(x):     # x stays in KPU RAM for a later reader: the stages beside it
        lw.near_stages.update(stage.outputs[0] for stage, _ in stages)
    for stage, lq in stages:
        emit_layer(lw, stage, geometry(lw, stage), plan_for(lw, stage), lq, row)
        if stage.inputs[0] == x:    # the stages after the first read its copies: x leaves KPU RAM now,
            lw.release_read(x, kpu=True)    # not beside the output (ESPCN's 1 MiB maps: no hole under it)
        _drop(lw, stage.inputs[0])
    geo = geometry(lw, final)
    lq = quantize_conv(lw, final, geo, W2, B, row)
    emit_layer(lw, final, geo, plan_for(lw, final), lq, row)
    _drop(lw, src)
    n = form.n
    if (Ky, Kx) == (3, 3):      # the stride-1 map + CPU pick stores the conv's own weights, not 4x
        lw.smaller[node.name] = True     # the same KPU arithmetic: the same output
    row.why = (f" as {n + 1} KPU stages ('{form.name}': {n} exact one-hot 3x3 shift stage{'s' if n > 1 else ''} "
               f"to {form.channels} channels{windows}{', picking stride 2' if form.phase else ''}, then a 3x3 conv "
               f"with re-indexed weights; est. {form.cycles:,} cycles"
               + "".join(f"; '{f.name}': {f.cycles:,}" for f in alts[1:])
               + (f"; stride 1 + CPU pick: {stride1_cycles(lw.g, node, lw.format):,}" if (Ky, Kx) == (3, 3)
                  else "") + ")")
    describe(row, geo, plan_for(lw, final), k=(Ky, Kx))
    for stage, _ in stages:
        p = plan_for(lw, stage)
        if p.why:
            row.notes.append(f"{stage.name}: {p.why}")
    if d != (1, 1):
        row.notes.append(f"dilation {d}: a {Ky}x{Kx} kernel with zeros between the taps")


def _drop(lw, t):
    """A stage's input, read by nobody else, leaves KPU RAM and main memory."""
    if t not in lw.virtual_shapes:
        return
    loc = lw.locs.get(t)
    if loc is not None:
        lw.kpu_free(loc)
        lw.main.free(f"{t}:u8")

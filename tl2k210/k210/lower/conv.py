"""Conv on the KPU, keeping the float semantics, in as many K210_CONVs as it takes.

Stride 2 and unusual paddings run the KPU conv at stride 1 and pick the wanted pixels: the KPU's
pick pools when the phase allows, the next 1x1 conv's pick for a depthwise conv, else a 1x1
QUANTIZED_MAX_POOL2D on the CPU ("post" stages, with any pool the KPU cannot fuse).

A layer whose maps do not fit the KPU RAM is tiled, exactly (every tile uses the layer's one
quantization, so the bytes are those one big layer would give):
  * output-channel chunks: the input stays resident, each chunk streams to its slice of the
    output in main memory (dense CHW: a channel range is contiguous);
  * channel windows (depthwise and grouped convs): each tile uploads its input channels;
  * row bands with halo rows (a dense conv whose input does not fit): each band's rows are
    uploaded a channel at a time where they lie in the map (maps over 32 wide), or gathered
    (QUANTIZED_CONCAT; or made as it runs, `Lowering.band_sources`) and uploaded, convolved,
    post-processed, and the bands' valid rows assembled, or written into the map by each band's
    post stages a channel at a time where that takes less memory (_map_first). Bands start on
    the KPU pool's stride so pooling and picks keep their phase;
  * column bands (kmodel v4, an input wider than the KPU's maximum): the same rule on the
    columns, with row bands where needed (2-D tiles); each tile gathered by a strided_slice, its
    valid pixels assembled by concats along W and H (_col_plan, emit_tiles).
Grouped convs (1 < group < channels) run as block-diagonal dense tiles of a few groups each,
as many as the cost model finds cheapest.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tl2k210.errors import KpuLimitError
from tl2k210.graph import stage_names
from tl2k210.k210 import hardware as hw
from tl2k210.k210.kmodel import v3
from tl2k210.k210.kmodel.v4 import DT_UINT8, MEM_KPU, MEM_MAIN
from tl2k210.passes.group_conv import block_diagonal

from . import kpu
from .registry import KPU, NA, lowering
from .state import Loc, wants_small
from .v4emit import U8, main, pad_scalar, pixel_fold, pixel_zero


# ---------------------------------------------------------------------------------------------
# static checks
def is_dense(g, node):
    """A 1x1 conv on a 1x1 map: a dense layer."""
    s = g.shape(node.inputs[0])
    return len(s) == 4 and tuple(s[2:]) == (1, 1) and tuple(node.attrs["kernel"]) == (1, 1)


def grouped_dense(g, node) -> bool:
    """A grouped 1x1 conv on a 1x1 map (prelu_split's split and join of a vector, a depthwise
    conv after a global pool): as a dense layer (fc.py) its block-diagonal matrix stores every
    zero; kmodel v4's uint8 CPU conv stores its Co·Ci/group weights (v4conv.cpu_trade)."""
    return node.op == "Conv" and is_dense(g, node) and int(node.attrs.get("group", 1)) > 1


def dense_matrix(W, group: int = 1) -> np.ndarray:
    """The (Co, Ci) matrix of a dense layer's conv weights (Co, Ci/group, 1, 1): block-diagonal
    for a grouped conv (a depthwise conv on a 1x1 map, prelu_split's split and join of a vector)."""
    W = np.asarray(W)
    return (W if group == 1 else block_diagonal(W, group)).reshape(W.shape[0], -1)


def kpu_conv_refuses(g, node, opts):
    """Why the KPU cannot run this Conv (None if it can)."""
    a = node.attrs
    if is_dense(g, node):
        return NA     # a dense layer (fc.py)
    _, ci, h, w = g.shape(node.inputs[0])
    co = g.shape(node.outputs[0])[1]
    k, dil = tuple(a["kernel"]), tuple(a.get("dilations", (1, 1)))
    if k not in ((1, 1), (3, 3)) or dil != (1, 1):
        return NA     # a K x L or dilated kernel: kxk.py's (which says why if it cannot)
    from .kxk import phases_preferred
    if phases_preferred(g, node, opts):
        return NA     # a stride-2 3x3 no KPU pick pool takes: kxk.py's 'stride-2 phases'
    grp = a.get("group", 1)
    if ci % grp or co % grp:
        return f"group {grp} does not divide {ci} input / {co} output channels"
    if any(p > k[0] // 2 for p in a["pads"]) or any(p < 0 for p in a["pads"]):
        return f"pads {a['pads']} exceed the KPU's {k[0] // 2}-pixel border"
    (wlo, whi), (hlo, hhi) = hw.LIMITS["in_w"], hw.LIMITS["in_h"]
    # kmodel v3's first layer reads the whole image from KPU RAM; v4 keeps it in main memory and
    # uploads row bands of it like any taller map (_band_plan)
    first = node.inputs[0] in g.inputs and getattr(opts, "format", "v3") != "v4"
    v4 = getattr(opts, "format", "v3") == "v4"      # wider maps: column bands (_col_plan), kmodel v4
    if not (wlo <= w and (w <= whi or v4) and hlo <= h and (h <= hhi or not first)):
        return (f"input {w}x{h}: the KPU runs {wlo} <= W <= {whi}, {hlo} <= H <= {hhi} (nncase limit; "
                "taller maps run in row bands, a first layer's in kmodel v4 only; wider maps in "
                "column bands, kmodel v4 only)")
    cmax = hw.LIMITS["channels"][1]
    if max(ci, co) > cmax:
        return f"{max(ci, co)} channels: the KPU allows {cmax}; split the layer"
    s = tuple(a["strides"])
    if any(v not in (1, 2) for v in s) or s[0] != s[1]:
        return f"strides {s}: only equal strides 1 and 2 are lowered"
    oh, ow = (g.shape(node.outputs[0]) or (0, 0, h, w))[2:]
    dy, dx, _ = _pick(node) or (None, None, None)
    kpu_pick = s == (2, 2) and dy == 0 and dx in (0, 1) and (oh, ow) == (h // 2, w // 2) \
        and not (grp == ci == co) and not a.get("pool")
    if kpu_pick and min(oh, ow) < hw.LIMITS["out_min"]:
        lo = hw.LIMITS["out_min"]
        return (f"output {ow}x{oh}: the KPU's stride-2 pick writes maps of at least {lo}x{lo} "
                "(docs/kpu.md#limits); use a larger input")
    if a.get("pool") and kpu.pool_code(a["pool"]) is None and a["pool"]["kind"] != "max":
        return f"pool {a['pool']} has no KPU code and no uint8 CPU layer"
    return None


SMALL_MAP = "kpu_conv_small_map"


def small_map_refuses(g, node, opts):
    """Why a conv on a map under the KPU's minimum width / height cannot run on the map grown to
    it: the map is copied into a bigger one in main memory whose extra bottom rows / right columns
    hold code 0 (kmodel v4: a pad; v3: a kernel-1 QUANTIZED_MAX_POOL2D whose output is larger than
    its input: the taps outside are skipped and the max starts at 0), uploaded, convolved, and the
    output cropped back. Both formats prefer it to v4's quantized_conv2d: the KPU's batch norm
    gives each channel its own weight scale. A 1x1 conv never
    reads the extra pixels for the outputs kept; a 3x3 one (pads 1) reads them as its bottom /
    right padding, which must be the input's zero point: exact where that is code 0 (checked when
    lowered; the input comes from a ReLU / ReLU6, whose ranges start at 0)."""
    from tl2k210.passes.pad_into_conv import nonnegative
    a = node.attrs
    _, ci, h, w = g.shape(node.inputs[0])
    (wlo, whi), (hlo, hhi) = hw.LIMITS["in_w"], hw.LIMITS["in_h"]
    k = tuple(a["kernel"])
    if is_dense(g, node) or k not in ((1, 1), (3, 3)) or (w >= wlo and h >= hlo) or w > whi or h > hhi:
        return NA
    if node.inputs[0] in g.inputs and getattr(opts, "format", "v3") != "v4":
        return NA       # v3's first layer reads the image as the runtime puts it in KPU RAM (v4's: main memory)
    valid = list(a["pads"]) == [0] * 4     # the kept outputs read the map's own pixels only
    if tuple(a["strides"]) != (1, 1) or tuple(a.get("dilations", (1, 1))) != (1, 1) or a.get("pool") \
            or not valid and list(a["pads"]) != [k[0] // 2] * 4:
        return f"input {w}x{h} grown to the KPU's {wlo}x{hlo}: only stride 1, 'same' or no pads, no pool"
    if k == (3, 3) and not valid and not nonnegative(g, node.inputs[0]):
        return (f"input {w}x{h} grown to the KPU's {wlo}x{hlo}: a 3x3 conv reads the added pixels as "
                "padding, code 0, which is its input's zero point only after a ReLU / ReLU6")
    grp, co = a.get("group", 1), g.shape(node.outputs[0])[1]
    if ci % grp or co % grp or max(ci, co) > hw.LIMITS["channels"][1]:
        return NA
    return None


def grow_map(lw, src, shape, grown, out, row):
    """The uint8 (C, H, W) map at `src` copied into a (C, H', W') one whose extra bottom rows and
    right columns hold code 0 (small_map_refuses); returns its address."""
    c, h, w = shape
    gh, gw = grown
    dst = lw.alloc(f"{out}:grown", "u8", c * gh * gw)
    if lw.format == "v4":
        lw.emit_v4("pad", dict(input=main(U8, src, c * h * w), output=main(U8, dst, c * gh * gw),
                               in_shape=(1, c, h, w), paddings=(0, 0, 0, 0, 0, gh - h, 0, gw - w),
                               pad_value=pad_scalar(0, U8)), row)
        return dst
    lw.emit("QUANTIZED_MAX_POOL2D", dict(
        flags=1, main_mem_in_address=src, main_mem_out_address=dst, in_shape=(w, h, c), out_shape=(gw, gh, c),
        kernel_width=1, kernel_height=1, stride_width=1, stride_height=1, padding_width=0, padding_height=0), row)
    return dst


# ---------------------------------------------------------------------------------------------
# geometry: what the KPU computes for a node, decided from the graph alone
@dataclass
class Stage:
    """A row window: output row j reads input rows [s*j + lo, s*j + hi]."""
    s: int
    lo: int
    hi: int


@dataclass
class Geometry:
    in_shape: tuple            # (C, H, W) the KPU reads
    co: int
    k: int
    groups: int
    depthwise: bool
    code: int                  # KPU pool code
    kpu_out: tuple             # (C, H, W) after the KPU pool
    post: list                 # CPU QUANTIZED_MAX_POOL2D stages [(k, s, pad_h, pad_w)] after the KPU
    out_shape: tuple           # the node's output (C, H, W)
    small_map: tuple | None = None   # (H, W) of the input in main memory, grown to in_shape (small_map_refuses)
    pick_next: bool = False    # a depthwise conv's stride-2 pick moves onto the next 1x1 conv
    notes: list = field(default_factory=list)


def _pick(node):
    """(row_offset, col_offset, stride) of the wanted pixels in the KPU stride-1 output."""
    a = node.attrs
    if "pick" in a:          # a stage of a decomposed conv: the whole conv's pick
        return a["pick"]
    k = a["kernel"][0]
    return (k // 2 - a["pads"][0], k // 2 - a["pads"][1], a["strides"][0])


def geometry(lw, node) -> Geometry:
    if node.name in lw.geo:
        return lw.geo[node.name]
    a = node.attrs
    x = node.inputs[0]
    ci, h, w = lw.shape(x)
    p = lw.producer(x)
    src = p if p is not None and p.op == "Conv" and lw.lowered_by(p) == "kpu_conv" and \
        geometry(lw, p).pick_next else None
    if src is not None:
        ci, h, w = geometry(lw, src).kpu_out      # the depthwise conv's stride-1 map
    small_map = None
    if node.name in lw.choice and lw.lowered_by(node) == SMALL_MAP:
        small_map = (h, w)
        h, w = max(h, hw.LIMITS["in_h"][0]), max(w, hw.LIMITS["in_w"][0])
    co = lw.shape(node.outputs[0])[0]
    groups = a.get("group", 1)
    depthwise = groups == ci == co and ci > 1
    k = a["kernel"][0]
    dy, dx, s = _pick(node)
    pool = a.get("pool")
    code, post, pick_next, notes = 0, [], False, []
    conv_hw = lw.shape(node.outputs[0])[1:] if not pool else None   # the wanted picks' count
    kpu_picks = conv_hw is not None and tuple(conv_hw) == (h // 2, w // 2)   # the pick pools' floor
    if src is not None:
        code = kpu.pick_code(0)
    elif (dy, dx, s) != (0, 0, 1) or (conv_hw is not None and tuple(conv_hw) != (h, w)):
        if s == 2 and dy == 0 and dx in (0, 1) and not depthwise and kpu_picks:
            code = kpu.pick_code(dx)
        elif s == 2 and dy == 0 and dx == 0 and depthwise and kpu_picks and _next_pw_takes_pick(lw, node) \
                and 2 * hw.map_lines(ci, h, w) <= lw.opts.kpu_ram_lines:
            pick_next = True
        elif s == 1:     # the KPU pads every side by k // 2: fewer pads on a side crop the map
            post.append((1, 1, -dy, -dx))
            grow = "pad" if lw.format == "v4" else "kernel-1 QUANTIZED_MAX_POOL2D"
            notes.append(f"input {small_map[1]}x{small_map[0]} grown to {w}x{h} in main memory ({grow}, "
                         f"code 0 in the added pixels), the output cropped back"
                         if small_map else
                         f"pads {a['pads']}: the KPU pads every side; CPU crops the map to rows from {dy}, "
                         f"columns from {dx}" if "pick" not in a else
                         f"CPU crops the {h}x{w} map to its first {conv_hw[0]} rows, {conv_hw[1]} columns")
        else:
            post.append((1, s, -dy, -dx))
            notes.append(f"stride {s} with pads {a['pads']}: KPU at stride 1 ({s * s}x the MACs), "
                         f"CPU picks rows from {dy}, columns from {dx}")
        if pool:
            post.append(_cpu_pool(pool))
    elif pool:
        c = None if depthwise else kpu.pool_code(pool)
        if c is None:
            post.append(_cpu_pool(pool))
            notes.append("max pool on the CPU (QUANTIZED_MAX_POOL2D)")
        else:
            code = c
    ph, pw = hw.POOL[code].out_size(h, w)
    geo = Geometry((ci, h, w), co, k, groups, depthwise, code, (co, ph, pw), post, lw.shape(node.outputs[0]),
                   small_map, pick_next, notes)
    lw.geo[node.name] = geo
    return geo


def _cpu_pool(pool):
    pads = pool.get("pads", [0, 0, 0, 0])
    return (pool["size"], pool["stride"], pads[0], pads[1])


def _next_pw_takes_pick(lw, node):
    cons = lw.consumers(node.outputs[0])
    if len(cons) != 1 or node.outputs[0] in lw.g.outputs:
        return False
    c = cons[0]
    return (c.op == "Conv" and lw.lowered_by(c) == "kpu_conv" and tuple(c.attrs["kernel"]) == (1, 1)
            and tuple(c.attrs["strides"]) == (1, 1) and c.attrs.get("group", 1) == 1 and not c.attrs.get("pool")
            and list(c.attrs["pads"]) == [0, 0, 0, 0])


# ---------------------------------------------------------------------------------------------
# the tiling plan
@dataclass
class Plan:
    units: list                # [((c0, c1), (o0, o1))] input / output channel windows per tile
    bands: list                # [((f0, f1), (a, b))] final rows a band yields, input rows it reads
    in_resident: bool          # tiles read windows of the whole input map, resident in KPU RAM
    out_resident: bool         # tiles write windows of one output map that stays in KPU RAM
    why: str = ""
    form: str = ""             # the receipt's name of a smaller form the plan took (fit.trades)
    cols: list | None = None   # column bands [((g0, g1), (a, b))] like `bands` (None: the whole width)

    @property
    def tiles(self):
        return len(self.units) * len(self.bands) * len(self.cols or [None])


def _group(w):
    return hw.row_layout(w)[0]


def _split(n, size):
    """[(a, b)] chunks of at most `size` covering range(n)."""
    return [(i, min(n, i + size)) for i in range(0, n, size)]


def _group_units(geo, q):
    ci, co, G = geo.in_shape[0], geo.co, geo.groups
    m, n = ci // G, co // G
    return [((g0 * m, min(G, g0 + q) * m), (g0 * n, min(G, g0 + q) * n)) for g0 in range(0, G, q)]


def conv_cycles(ci, co, groups, k, h, w, w_out, dense=False, small=False):
    """(groups per tile, est. cycles, one dense tile's cycles) of a conv: a grouped conv runs as
    block-diagonal dense tiles, the cheapest aligned split by the cost model (KPU cycles of all its
    tiles); `dense` forces one tile; `small`, the split of the fewest kmodel bytes (each tile is a
    layer of its own 256-aligned blocks, kpu.layer_file_bytes; fewer tiles store more zeros),
    ties to the cheaper. A depthwise conv is one native layer."""
    if groups == ci == co:
        c = kpu.estimate_cycles(h * w * co * k * k, co * k * k)
        return groups, c, c
    G, m, n = groups, ci // groups, co // groups
    gi, go, cmax = _group(w), _group(w_out), hw.LIMITS["channels"][1]
    cost = {q: (G // q) * kpu.estimate_cycles(h * w * (q * n) * (q * m) * k * k, (q * n) * (q * m) * k * k)
            for q in range(1, G + 1)
            if q == G or not (G % q or (q * m) % gi or (q * n) % go or max(q * m, q * n) > cmax)}
    q = G if dense else min(cost, key=lambda q: ((G // q) * kpu.layer_file_bytes(q * m, q * n, k), cost[q])
                            if small else cost[q])
    return q, cost[q], cost[G]


def _grouped_q(geo, small=False):
    ci, h, w = geo.in_shape
    return conv_cycles(ci, geo.co, geo.groups, geo.k, h, w, geo.kpu_out[2], small=small)


TILES = "/tiles"      # Options.small names "<node>/tiles": a grouped conv's KPU tiling of the fewest bytes


def wants_small_tiles(opts, node) -> bool:
    """Does the plan ask for a grouped conv's fewest-bytes KPU tiling? With its other smaller
    form (state.wants_small: the uint8 CPU conv, where kmodel v4 has it, which goes first), or by
    itself: the plan tries it where the CPU form did not shrink the model (its maps in main memory)."""
    return wants_small(opts, node) or node.name + TILES in getattr(opts, "small", ())


WINDOWS = "/windows"  # Options.small names "<node>/windows": channel windows of the fewest bytes, the
# kmodel's layers and the stride-1 map each window leaves in main memory for its CPU pick


def wants_small_windows(opts, node) -> bool:
    """Does the plan ask for a windowed conv's fewest-bytes windows (with its other smaller forms,
    or by itself: the plan tries it where the model does not fit)?"""
    return wants_small(opts, node) or node.name + WINDOWS in getattr(opts, "small", ())


def plan_for(lw, node) -> Plan:
    """How the layer's tiles cover it (memoized): one tile when input and output fit the KPU RAM,
    else output-channel chunks, channel windows or row bands (module docstring)."""
    if node.name in lw.plans:
        return lw.plans[node.name]
    geo = geometry(lw, node)
    cap = lw.opts.kpu_ram_lines
    ci, h, w = geo.in_shape
    co, ph, pw = geo.kpu_out
    whole = ((0, _final_h(geo)), (0, h))
    if geo.groups == 1 or geo.depthwise:
        units, why, form = [((0, ci), (0, co))], "", ""
    else:   # MaixPy checks the first layer reads the image's channels: one tile for it
        (q, cyc, dense), how, form = _grouped_q(geo), "cheapest", ""
        small = _grouped_q(geo, small=True)
        if node.inputs[0] == lw.g.inputs[0]:
            q, cyc = geo.groups, dense
        elif small[0] != q:
            lw.smaller[node.name + TILES] = True      # the same integer sums: the same output
            if wants_small_tiles(lw.opts, node):
                form = f"fewest-bytes tiles: {-(-geo.groups // small[0])} layers, not {-(-geo.groups // q)}"
                (q, cyc, _), how = small, "fewest-bytes"
        units = _group_units(geo, q)
        why = (f"group {geo.groups}: {len(units)} block-diagonal dense tile(s) of {q} group(s) "
               f"({ci // geo.groups}->{co // geo.groups} channels each), est. {cyc:,} cycles"
               + ("" if q == geo.groups else f" (the {how} aligned split; one dense layer: {dense:,})"))
    lines_in = hw.map_lines(ci, h, w)
    first = node.inputs[0] == lw.g.inputs[0] and lw.format != "v4"   # v4 can keep the image in main memory
    fits = lines_in + hw.map_lines(co, ph, pw) <= cap
    # kmodel v4: the CPU reads a resident output from KPU RAM (emit_layer's kpu_pick), so an output
    # the KPU cannot stream (over STREAM_PIXELS a channel) needs no row bands where the maps fit
    resident_read = lw.format == "v4" and fits and _kpu_pick(geo, bare=True) is not None
    wide = ph * pw > kpu.STREAM_PIXELS and not resident_read and (geo.post or not fits or needs_main(lw, node.outputs[0]))
    if wide and first:
        raise KpuLimitError(
            f"node {node.name!r}: its {co}x{ph}x{pw} output ({co * ph * pw:,} B) must go to main memory "
            f"({'it does not fit the KPU RAM' if not fits else 'a CPU layer reads it'}), but the KPU streams "
            f"at most {kpu.STREAM_PIXELS:,} pixels per channel (docs/kpu.md#write-back-and-streaming) and the first layer cannot run "
            "in row bands (MaixPy feeds it the whole image): use a smaller input or a stride-2 first layer")
    tall = h > hw.LIMITS["in_h"][1] or wide
    limit = f"the {cap * hw.LINE_BYTES:,} B KPU RAM"
    if w > hw.LIMITS["in_w"][1]:
        plan = _col_plan(lw, node, geo, cap, units if geo.groups == 1 or geo.depthwise else _group_units(geo, 1))
        lw.plans[node.name] = plan
        return plan
    # the smaller form of a stride-2 conv, the stride-1 map + CPU pick (not its phases, 4x the
    # weights): the stride-1 map waits in main memory by output-channel chunks, not whole (4x the output)
    by_chunks = any(k == 1 and s == 2 for k, s, *_ in geo.post) and wants_small(lw.opts, node) and geo.groups == 1
    if not tall and fits and not by_chunks:      # a grown map is uploaded from its grown copy
        plan = Plan(units, [whole], geo.small_map is None, True, why, form)
    elif not tall and geo.groups == 1 and lines_in + hw.map_lines(1, ph, pw) <= cap:
        n = next(n for n in range(co, 0, -1) if lines_in + hw.map_lines(n, ph, pw) <= cap)
        if geo.post:   # each chunk's stride-1 map waits in main memory for its CPU pick/pool: at most
            # half the output (the smaller form: the output, so fewer chunks repeat their layer arguments)
            n = min(n, max(1, int(np.prod(geo.out_shape)) // (1 if by_chunks else 2) // (ph * pw)))
        units = [((0, ci), o) for o in _split(co, n)]
        plan = Plan(units, [whole], True, False,
                    (f"the smaller form: {len(units)} output-channel chunks of <= {n}, each stride-1 map "
                     "streamed and picked in turn" if fits else
                     f"the {ci}x{h}x{w} input and {co}x{ph}x{pw} output exceed {limit}: {len(units)} "
                     f"output-channel chunks of <= {n}, each streamed to its slice of the output"))
    elif geo.groups != 1 and node.inputs[0] != lw.g.inputs[0] and not tall:
        per_in, per_out = ci // geo.groups, co // geo.groups
        qs = [q for q in range(1, geo.groups + 1)
              if hw.map_lines(q * per_in, h, w) + hw.map_lines(q * per_out, ph, pw) <= cap]
        if qs:
            q, took = min(max(qs), (units[0][1][1] - units[0][1][0]) // per_out), ""
            if geo.post:   # each window's stride-1 map waits in main memory for its CPU pick/pool
                def window_bytes(n):    # the windows' layers + one window's stride-1 map
                    return -(-geo.groups // n) * kpu.layer_file_bytes(n * per_in, n * per_out, geo.k) \
                        + n * per_out * ph * pw
                small = min((n for n in qs if n <= q), key=lambda n: (window_bytes(n), -n))
                if small < q:
                    lw.smaller[node.name + WINDOWS] = True    # the same layer, window by window: the same output
                    if wants_small_windows(lw.opts, node):
                        took = f"fewest-bytes windows: {-(-geo.groups // small)}, not {-(-geo.groups // q)}"
                        q = small
            units = _group_units(geo, q)
            plan = Plan(units, [whole], False, False,
                        f"the {ci}x{h}x{w} input and {co}x{ph}x{pw} output exceed {limit}: {len(units)} "
                        "channel windows, each uploaded and streamed to its slice of the output", took)
        else:
            plan = _band_plan(lw, node, geo, cap, _group_units(geo, 1),
                              f"one group of the {ci}x{h}x{w} input does not fit {limit}")
    else:
        why = (f"the {co}x{ph}x{pw} output streams over {kpu.STREAM_PIXELS:,} pixels per channel" if wide
               else f"the {ci}x{h}x{w} map is taller than {hw.LIMITS['in_h'][1]} rows" if tall
               else f"the {ci}x{h}x{w} input does not fit {limit}")
        plan = _band_plan(lw, node, geo, cap, units, why)
    lw.plans[node.name] = plan
    return plan


def _final_h(geo):
    return geo.out_shape[1] if geo.post else geo.kpu_out[1]


def _stages(geo, axis=0):
    """Row (axis 0) or column (axis 1) windows from the input map to the node's output: KPU conv,
    KPU pool, CPU post stages."""
    p = hw.POOL[geo.code]
    r = geo.k // 2
    if p.kind == "bypass":
        pool = Stage(1, 0, 0)
    elif p.kind == "pick":
        pool = Stage(p.stride, p.pick[axis], p.pick[axis])
    elif p.stride == 1:
        pool = Stage(1, 0, 1)
    else:
        pool = Stage(p.stride, 0, p.size - 1)
    return [Stage(1, -r, r), pool] + [Stage(s, -pad[axis], -pad[axis] + k - 1) for k, s, *pad in geo.post]


def band_rows(geo, f0, f1, axis=0):
    """Input rows [a, b) a band needs so that it yields final rows [f0, f1) exactly: back through
    the CPU post stages, the KPU pool and the conv's halo; a on the pool stride (band-local pools
    and picks keep the global phase), b covering whole pool windows. Axis 1: the same for the
    columns of a column band (the column pads, the pick's column phase)."""
    conv, pool, *post = _stages(geo, axis)
    lo, hi = f0, f1 - 1
    for s in reversed(post):
        lo, hi = s.s * lo + s.lo, s.s * hi + s.hi
    plo, phi = max(0, lo), min(geo.kpu_out[1 + axis] - 1, hi)
    ilo = pool.s * plo + pool.lo + conv.lo
    ihi = pool.s * phi + pool.hi + conv.hi
    a = max(0, ilo) // pool.s * pool.s
    b = min(geo.in_shape[1 + axis], max(ihi + 1, pool.s * (phi + 1)))
    return a, b


def _final_w(geo):
    return geo.out_shape[2] if geo.post else geo.kpu_out[2]


def _even_bands(F, nb, omin):
    """`nb` bands of about equal size covering range(F), the last merged if under `omin`."""
    size = -(-F // nb)
    bands = [(f, min(F, f + size)) for f in range(0, F, size)]
    if len(bands) > 1 and bands[-1][1] - bands[-1][0] < omin:
        bands[-2:] = [(bands[-2][0], F)]
    return bands


def _band_splits(geo, first, axis=0):
    """(bands, spans) for `first`, `first` + 1, ... even bands of the final rows (axis 0) or
    columns (axis 1): each band's final range and the input span band_rows gives it. A split
    whose widest span exceeds the KPU's maximum is skipped; the search ends at the first split
    with a span under the KPU's minimum or too short for one output after the pool (more bands
    only narrow them)."""
    (lo, hi), omin = hw.LIMITS["in_h" if axis == 0 else "in_w"], hw.LIMITS["out_min"]
    sp = hw.POOL[geo.code].stride
    n_final = _final_h(geo) if axis == 0 else _final_w(geo)
    for nb in range(first, n_final + 1):
        bands = _even_bands(n_final, nb, omin)
        spans = [band_rows(geo, f0, f1, axis) for f0, f1 in bands]
        if any(b - a > hi for a, b in spans):
            continue
        if any(b - a < lo or (b - a) // sp < omin for a, b in spans):
            return
        yield bands, spans


def _tile_units(geo, units, cap, rows, w_in, w_out):
    """The channel tiles of a band whose input is `rows` x `w_in` (its pooled output `w_out`
    wide): the fewest output-channel chunks (normal conv) or the largest group windows that fit
    the KPU RAM (`cap` lines) beside their input; None where not even one fits."""
    ci, co = geo.in_shape[0], geo.kpu_out[0]
    sp = hw.POOL[geo.code].stride
    if geo.groups == 1:
        outs = [n for n in range(co, 0, -1)
                if hw.map_lines(ci, rows, w_in) + hw.map_lines(n, rows // sp, w_out) <= cap]
        return [((0, ci), o) for o in _split(co, outs[0])] if outs else None
    m, n = ci // geo.groups, co // geo.groups
    qs = [q for q in range(geo.groups, 0, -1) if geo.groups % q == 0 and
          hw.map_lines(q * m, rows, w_in) + hw.map_lines(q * n, rows // sp, w_out) <= cap]
    return _group_units(geo, min(qs[0], (units[0][1][1] - units[0][1][0]) // n)) if qs else None


def _col_plan(lw, node, geo, cap, units):
    """Column bands for an input wider than the KPU's maximum (kmodel v4): the final columns split
    in bands whose input columns (halo, pool phase, CPU post stages: band_rows on axis 1) fit the
    KPU width, combined with row bands where the map is also taller than the KPU's maximum, or
    where a band does not fit the KPU RAM. Each tile is gathered (strided_slice), uploaded,
    convolved, streamed, post-processed or cropped to its valid pixels, and the tiles
    assembled (concat along W, then along H)."""
    ci, h, w = geo.in_shape
    co, ph, pw = geo.kpu_out
    wmax = hw.LIMITS["in_w"][1]
    sp = hw.POOL[geo.code].stride
    for cols, cin in _band_splits(geo, 2, axis=1):
        cw = max(b - a for a, b in cin)
        for bands, rows in _band_splits(geo, 1):
            worst = max(b - a for a, b in rows)
            if worst // sp * (cw // sp) > kpu.STREAM_PIXELS:
                continue
            tile_units = _tile_units(geo, units, cap, worst, cw, cw // sp)
            if tile_units is None:
                continue
            return Plan(tile_units, list(zip(bands, rows)), False, False,
                        f"the {w}x{h} map is wider than {wmax}: {len(cols)} column bands of <= {cw} input "
                        f"columns (halo {geo.k // 2}) x {len(bands)} row band(s) of <= {worst} rows x "
                        f"{len(tile_units)} channel tile(s); each tile gathered (strided_slice), its valid "
                        "pixels assembled in main memory (concat)", cols=list(zip(cols, cin)))
    raise KpuLimitError(f"node {node.name!r}: no column band of the {ci}x{h}x{w} input fits the KPU "
                        f"({cap * hw.LINE_BYTES:,} B RAM, {wmax} columns) with the {co}x{ph}x{pw} output")


def _band_plan(lw, node, geo, cap, units, reason):
    ci, h, w = geo.in_shape
    co, ph, pw = geo.kpu_out
    if node.inputs[0] == lw.g.inputs[0] and lw.format != "v4":
        raise KpuLimitError(f"node {node.name!r}: the {ci}x{h}x{w} input image and one output channel "
                            f"do not fit the KPU RAM; the first layer cannot run in row bands (MaixPy "
                            "feeds the whole image to it): use a smaller input")
    sp = hw.POOL[geo.code].stride
    for bands, rows in _band_splits(geo, 2):
        if any((b - a) // sp * pw > kpu.STREAM_PIXELS for a, b in rows):
            continue
        worst = max(b - a for a, b in rows)
        tile_units = _tile_units(geo, units, cap, worst, w, pw)
        if tile_units is None:
            continue
        return Plan(tile_units, list(zip(bands, rows)), False, False,
                    f"{reason}: {len(bands)} row bands of <= {worst} input rows (halo {geo.k // 2}) x "
                    f"{len(tile_units)} channel tile(s), each band's valid rows kept in the map")
    raise KpuLimitError(f"node {node.name!r}: no row band of the {ci}x{h}x{w} input fits the KPU RAM "
                        f"({cap * hw.LINE_BYTES:,} B) with the {co}x{ph}x{pw} output: use fewer channels")


# ---------------------------------------------------------------------------------------------
@lowering("Conv", unit=KPU, check=kpu_conv_refuses, name="kpu_conv")
def kpu_conv(lw, node):
    geo = geometry(lw, node)
    row = lw.row(node, "", in_shape=geo.in_shape, out_shape=geo.out_shape)
    W = np.asarray(lw.g.tensors[node.inputs[1]].value, np.float64)
    B = np.asarray(lw.g.tensors[node.inputs[2]].value, np.float64)
    lq = quantize_conv(lw, node, geo, W, B, row)
    (emit_tiles if plan_for(lw, node).cols else emit_layer)(lw, node, geo, plan_for(lw, node), lq, row)
    describe(row, geo, plan_for(lw, node))
    row.form = plan_for(lw, node).form
    if geo.post and geo.post[0][1] == 2:
        from .kxk import phases_passed_over
        note = phases_passed_over(lw.g, node, lw.opts)
        if note:
            row.notes.append(note)
            row.form = "stride 1 + CPU pick" + (f", {row.form}" if row.form else "")


@lowering("Conv", unit=KPU, check=small_map_refuses, name=SMALL_MAP)
def kpu_conv_small_map(lw, node):
    """kpu_conv on the map grown to the KPU's minimum (small_map_refuses); a 'same' 3x3 conv only
    where its input's zero point is code 0, the value of the added pixels (an unpadded one's kept
    outputs never read them)."""
    geo = geometry(lw, node)
    if geo.k == 3 and any(node.attrs["pads"]):
        _, _, z_x, _ = input_terms(lw, node.inputs[0], geo.in_shape[0])
        if z_x:
            raise KpuLimitError(
                f"node {node.name!r}: its {geo.small_map[1]}x{geo.small_map[0]} input is under the KPU's "
                f"{geo.in_shape[2]}x{geo.in_shape[1]} minimum; grown to it, the added pixels (code 0) are "
                f"the 3x3 conv's padding, but its input's zero point is code {z_x}: use --format v4 (a CPU conv)")
    kpu_conv(lw, node)


def describe(row, geo, plan, k=None):
    kind = "depthwise " if geo.depthwise else "" if geo.groups == 1 else f"group-{geo.groups} "
    ky, kx = k if isinstance(k, tuple) else (k or geo.k,) * 2
    row.why = f"{kind}conv{ky}x{kx}" + (f" + {hw.POOL[geo.code].name}" if geo.code else "") + row.why
    row.notes += geo.notes
    if plan.why:
        row.notes.append(plan.why)
    if geo.pick_next:
        row.notes.append("stride 2 moved onto the next 1x1 conv (exact: pick commutes with it)")


def folds_pixels(lw, node) -> tuple | None:
    """v4emit.pixel_fold for a KPU conv that alone reads the image's uint8 pixels in main memory
    (lw.pixel_main), where they are not already its input's uint8 form (v4emit.pixel_quant):
    uploaded as they are, the preprocessing in the weights, as for an image in KPU RAM, not
    dequantized to float and quantized again (two or three float copies of the image: AIZOO's
    260x260 face-mask detector at --input-range -1,1 went over full MaixPy's 2 MiB)."""
    x = node.inputs[0]
    if x != lw.pixel_main or lw.locs[x].u8 is not None or lw.consumers(x) != [node]:
        return None
    return pixel_fold(lw, x, node.attrs.get("pads", ()))


def input_terms(lw, x, ci, fold=None):
    """How the KPU reads input x: (per-channel scale, per-channel residual, pad value z_x, mean
    E[q - z_x] or None). Pixels: x = scale·(q - z_x) + residual (preprocessing folded into the
    weights; `fold`: folds_pixels' terms of the image in main memory); a quantized map:
    x = s·(q - z_x). A copy of the pixels (lw.pixel_copy) reads like them."""
    if fold is not None:
        return fold
    src = lw.pixel_copy.get(x, np.arange(ci) if x == lw.pixel_input else None)
    if src is not None:
        n_img = lw.shape(lw.pixel_input)[0]
        sc = np.resize(np.asarray(lw.opts.input_scale, np.float64), n_img)
        of = np.resize(np.asarray(lw.opts.input_offset, np.float64), n_img)
        z_x, resid = pixel_zero(sc, of)             # x = sc·(q − z_x) + resid
        mean = lw.opts.channel_means.get(lw.pixel_input)
        e = None if mean is None else ((mean - resid) / sc)[src]
        return sc[src], resid[src], z_x, e
    loc = lw.locs[x]
    if loc.quant is None:
        loc.quant = lw.quant_of(x)
    s_in, z_x = loc.quant
    mean = lw.opts.channel_means.get(x)
    return np.full(ci, s_in), np.zeros(ci), z_x, None if mean is None else mean / s_in


def quantize_conv(lw, node, geo, W, B, row):
    """LayerQuant of a conv with float weights W (Co, Ci/groups, k, k) reading node.inputs[0]."""
    x = node.inputs[0]
    ci = geo.in_shape[0]
    fold = folds_pixels(lw, node)
    sc, resid, z_x, e = input_terms(lw, x, ci, fold)
    m = W.shape[1]                                   # input channels per group
    src_of = (np.arange(geo.co) // (geo.co // geo.groups))[:, None] * m + np.arange(m)[None, :]
    B = B + (W.sum(axis=(2, 3)) * resid[src_of]).sum(axis=1)
    W = W * sc[src_of][:, :, None, None]
    if x == lw.pixel_input or x in lw.pixel_copy or fold is not None:
        row.notes.append(f"input: pixels, preprocessing folded into weights (pad value {z_x})")
    st = stage_names(node)
    # a fused KPU mean pool floors sum/k² (docs/kpu.md#pooling): on average (k²-1)/(2k²) LSB low
    # (-2 to -6 dB on a 4x4 pool); the conv's output rounds that much higher, so the pooled map is
    # unbiased. Not TFLite's bytes in a quantized model (its AVERAGE_POOL_2D rounds to nearest).
    pool = hw.POOL[geo.code] if geo.code else None
    off = (pool.size ** 2 - 1) / (2 * pool.size ** 2) if pool is not None and pool.kind == "mean" else 0.0
    if off:
        row.notes.append(f"{'not exact: ' if lw.quantized_model else ''}the {pool.name} pool floors: "
                         f"its input rounds {off:.3g} LSB up, an unbiased mean")
    lq = kpu.quantize_layer(W, B, e, z_x, geo.groups, lw.rng(st["conv"]), lw.rng(st["act"]),
                            node.attrs.get("activation"), lw.opts.weight_bits, row,
                            lw.quantized_model and not off and lw.int8_rounding, out_offset=off)
    lq.pixels = fold is not None
    return lq


def emit_layer(lw, node, geo, plan, lq, row):
    """Emit every tile of a planned KPU layer and leave the output where its consumers need it."""
    x, out = node.inputs[0], node.outputs[0]
    xloc = lw.locs[x]
    ci, h, w = geo.in_shape
    co, ph, pw = geo.kpu_out
    fc, fh, fw = geo.out_shape if geo.post else geo.kpu_out
    name = node.name
    single = len(plan.bands) == 1
    post = bool(geo.post)
    # v4: a crop/pick read straight from the resident KPU output (no stride-1 copy in main memory)
    copy_out = not post and ph * pw > kpu.STREAM_PIXELS and needs_main(lw, out)    # too big to stream
    kpu_pick = lw.format == "v4" and single and plan.out_resident and _kpu_pick(geo, bare=copy_out) is not None
    # ... and of each tile's output, where the tiles do not share one resident map (a depthwise
    # conv's channel windows, row bands): no tile's stride-1 map in main memory. Row bands write
    # their valid rows straight into the map, a channel at a time (with or without a pick): no
    # band's output waits in main memory for the others to be assembled beside the map
    tile_pick = lw.format == "v4" and not plan.out_resident and _kpu_pick(geo, bare=not single) is not None
    rows_direct = tile_pick and not single
    # row bands with CPU post stages (v3, or v4 without a tile pick): each band's post stages
    # write its rows of each channel into the map (a stage a channel), where the map beside one
    # band's buffers takes less than the bands' outputs beside the map assembled after the last
    posted = post and not single and not rows_direct and _map_first(lw, geo, plan, x)
    stream = not tile_pick and ((post and not kpu_pick) or not plan.out_resident or (needs_main(lw, out) and not kpu_pick))
    out_loc = Loc((co, ph, pw), quant=lq.out_quant)
    final = Loc((fc, fh, fw), quant=lq.out_quant)
    lw.locs[out] = final if post else out_loc
    keep = []
    # --- the input, when tiles read windows of it in KPU RAM
    if plan.in_resident:
        if x == lw.pixel_input:
            lw.kpu_alloc(xloc, f"{x}:kpu", hw.map_lines(ci, h, w), f"node {name!r}: input image {ci}x{h}x{w}")
        else:
            lw.need_kpu(x, row, src=xloc.pixels if lq.pixels else None)
        keep.append(xloc.block)
        in_base = xloc.kpu[0]
    elif x not in lw.band_sources:
        src_u8 = xloc.pixels if lq.pixels else lw.need_u8(x, row)
        if geo.small_map:
            src_u8 = grow_map(lw, src_u8, (ci,) + geo.small_map, (h, w), out, row)
    # --- where the KPU output goes
    if plan.out_resident:
        lw.kpu_alloc(out_loc, f"{out}:kpu", hw.map_lines(co, ph, pw),
                     f"node {name!r}: output map {co}x{ph}x{pw} (input {ci}x{h}x{w} resident)", keep,
                     away=xloc.kpu if plan.in_resident else None, near=out in lw.near_stages)
        keep.append(out_loc.block)
    whole = None            # one streamed buffer of the whole KPU output
    in_place = lw.format == "v3" and _post_in_place(geo)     # the CPU crop/pick over the streamed map
    if stream and single and (plan.out_resident or not post):
        whole = lw.alloc(out + ":s1" if post and not in_place else out, "u8", co * ph * pw)
        if not post or in_place:
            out_loc.u8 = final.u8 = whole
    if (post and single or rows_direct or kpu_pick or posted) and final.u8 is None:
        final.u8 = lw.alloc(out, "u8", fc * fh * fw)
        if not post:
            out_loc.u8 = final.u8
    macs = lines = 0
    traces, band_finals, rows_of = [], [], {}     # rows_of: (channel, band) -> its strided_slice
    # bands of a map at least 33 wide upload each channel's rows where they lie in the map (its
    # KPU lines hold one channel each): no gathered copy of the band in main memory
    direct = not plan.in_resident and not single and _direct_bands(lw, x, w)
    for bi, ((f0, f1), (ra, rb)) in enumerate(plan.bands):
        rows = rb - ra
        band_in = None
        if not plan.in_resident:
            if single:
                band_in = src_u8
            elif not direct:            # gather rows [ra, rb) of every channel: dense (ci, rows, w)
                band_in = lw.alloc(f"{out}:band{bi}:in", "u8", ci * rows * w)
                if x in lw.band_sources:    # a map made a band at a time (v3resize.py)
                    lw.band_sources[x](ra, rb, band_in, last=bi == len(plan.bands) - 1)
                else:
                    ranges = [(src_u8 + (c * h + ra) * w, rows * w) for c in range(ci)]
                    lw.emit("QUANTIZED_CONCAT", dict(flags=1, main_mem_out_address=band_in, input_count=ci),
                            row, data={"ranges": ranges})
                if bi == len(plan.bands) - 1:
                    lw.release_read(x)      # the last band gathered: the map is no longer read
        prow = rows // hw.POOL[geo.code].stride
        band_out = None
        if not single and not rows_direct:
            band_out = lw.alloc(f"{out}:band{bi}:out", "u8", co * prow * pw)
        for (c0, c1), (o0, o1) in plan.units:
            cin = (c0, c1)
            nin = c1 - c0
            tmp_in = tmp_out = None
            if plan.in_resident:
                src_line = in_base + kpu.window_line(c0, h, w)
            else:
                tmp_in = Loc((nin, rows, w))
                src_line = lw.kpu_alloc(tmp_in, f"{out}:tile_in", hw.map_lines(nin, rows, w),
                                        f"node {name!r}: tile input {nin}x{rows}x{w}", keep)
                if direct:
                    for c in range(c0, c1):
                        lw.emit("K210_UPLOAD", dict(
                            flags=0, main_mem_in_address=src_u8 + (c * h + ra) * w,
                            kpu_mem_out_address=src_line + kpu.window_line(c - c0, rows, w),
                            width=w, height=rows, channels=1), row)
                else:
                    lw.emit("K210_UPLOAD", dict(flags=0, main_mem_in_address=band_in + c0 * rows * w,
                                                kpu_mem_out_address=src_line, width=w, height=rows,
                                                channels=nin), row)
            conv = kpu.tile_conv(lq, cin, (o0, o1), (nin, rows, w), geo.code, geo.depthwise, name)
            if plan.out_resident:
                dst_line = out_loc.kpu[0] + kpu.window_line(o0, ph, pw)
            else:
                tmp_out = Loc(conv.out_shape)
                dst_line = lw.kpu_alloc(tmp_out, f"{out}:tile_out", kpu.out_lines(conv),
                                        f"node {name!r}: tile output {conv.out_shape}",
                                        keep + ([tmp_in.block] if tmp_in else []),
                                        away=tmp_in.kpu if tmp_in else xloc.kpu)
            kpu.place(conv, src_line, dst_line)
            n_o = o1 - o0
            if not stream:
                target = 0
            elif not single:
                target = band_out + o0 * prow * pw
            elif whole is not None:
                target = whole + o0 * ph * pw
            else:                                   # per-tile post: the tile's own stride-1 buffer
                target = lw.alloc(f"{out}:tile", "u8", n_o * ph * pw)
            idx = lw.emit("K210_CONV", dict(flags=int(stream), main_mem_out_address=target), row, conv=conv)
            macs += conv.macs
            lines = max(lines, (hw.map_lines(ci, h, w) if plan.in_resident else hw.map_lines(nin, rows, w))
                        + (hw.map_lines(co, ph, pw) if plan.out_resident else kpu.out_lines(conv)))
            row.weight_bytes += lw.share_blocks(idx)
            if tile_pick:       # the tile's rows (f0, f1) of the map: one slice, or one a channel of a band
                tile = (n_o, conv.out_shape[1], (f0, f1), ra // hw.POOL[geo.code].stride)
                if single:
                    traces.append(lw.emit_v4("strided_slice", _kpu_pick(
                        geo, tmp_out.kpu, final.u8 + o0 * fh * fw, tile), row))
                for c in range(o0, o1) if rows_direct else ():
                    rows_of[c, bi] = lw.emit_v4("strided_slice", _kpu_pick(
                        geo, tmp_out.kpu, final.u8 + (c * fh + f0) * fw, tile, c - o0, bare=True), row)
            for t in (tmp_in, tmp_out):
                if t is not None:
                    lw.kpu_free(t)
            if single and whole is None and post and not kpu_pick and not tile_pick:
                traces.append(_post(lw, geo, target, (n_o, ph, pw), final.u8 + o0 * fh * fw, (0, fh), 0, row))
                lw.main.free(f"{out}:tile:u8")
            elif single and not post:
                traces.append(idx)
        if direct and bi == len(plan.bands) - 1:
            lw.release_read(x)              # the last band uploaded: the map is no longer read
        if posted:
            for c in range(co):
                rows_of[c, bi] = _post(lw, geo, band_out + c * prow * pw, (1, prow, pw), final.u8 + (c * fh + f0) * fw,
                                       (f0, f1), ra // hw.POOL[geo.code].stride, row)
            lw.main.free(f"{out}:band{bi}:out:u8")
        elif band_out is not None and post:
            fin = lw.alloc(f"{out}:band{bi}:fin", "u8", co * (f1 - f0) * fw)
            _post(lw, geo, band_out, (co, prow, pw), fin, (f0, f1), ra // hw.POOL[geo.code].stride, row)
            lw.main.free(f"{out}:band{bi}:out:u8")
            band_finals.append((fin, f1 - f0, 0))
        elif band_out is not None:
            band_finals.append((band_out, prow, f0 - ra // hw.POOL[geo.code].stride))
        if not single and not direct:
            lw.main.free(f"{out}:band{bi}:in:u8")
    if kpu_pick:
        traces = [lw.emit_v4("strided_slice", _kpu_pick(geo, out_loc.kpu, final.u8, bare=copy_out), row)]
        if copy_out:
            row.notes.append(f"the {co}x{ph}x{pw} output, over the {kpu.STREAM_PIXELS:,} pixels a channel the KPU "
                             "streams, copied from KPU RAM to main memory by a strided_slice (no row bands)")
    if whole is not None and post:
        traces = [_post(lw, geo, whole, (co, ph, pw), final.u8, (0, fh), 0, row)]
        lw.main.free(f"{out}:s1:u8")
    if rows_direct or posted:                    # each channel's rows in order: the map's bytes
        traces = [rows_of[k] for k in sorted(rows_of)]
        row.notes.append(f"each band's rows read where they lie in KPU RAM into the map, a strided_slice a "
                         f"channel ({len(rows_of)}): no band waits in main memory to be assembled" if rows_direct else
                         f"each band's post stages write its rows into the map, a channel at a time ({len(rows_of)}"
                         " layers): no band waits in main memory to be assembled")
    elif not single:                             # assemble the bands' valid rows, channel by channel
        final.u8 = lw.alloc(out, "u8", fc * fh * fw)     # live from here: not beside the bands' input
        if not post:
            out_loc.u8 = final.u8
        ranges = []
        for c in range(fc):
            for (buf, nrows, off), (f0, f1) in zip(band_finals, (b[0] for b in plan.bands)):
                ranges.append((buf + (c * nrows + off) * fw, (f1 - f0) * fw))
        traces = [lw.emit("QUANTIZED_CONCAT", dict(flags=1, main_mem_out_address=final.u8,
                                                    input_count=len(ranges)), row, data={"ranges": ranges})]
        for bi in range(len(plan.bands)):
            lw.main.free(f"{out}:band{bi}:out:u8")
            lw.main.free(f"{out}:band{bi}:fin:u8")
    kind = "kpu" if traces and lw.layers[traces[0]].name == "K210_CONV" else "u8"
    lw.trace_map[out] = (traces[0] if len(traces) == 1 else tuple(traces), kind)
    if geo.small_map:
        lw.main.free(f"{out}:grown:u8")
    if x == lw.pixel_input:
        lw.kpu_free(xloc)      # the image is read once
    if post:
        lw.kpu_free(out_loc)
    row.macs, row.kpu_lines = macs, lines


def emit_tiles(lw, node, geo, plan, lq, row):
    """Emit a column-band plan (_col_plan, kmodel v4): per tile (row band x column band) a
    strided_slice gathers its input pixels of every channel, each channel tile is uploaded,
    convolved and streamed, the CPU post stages (or a strided_slice crop) keep the tile's valid
    pixels; concats along W (the column bands) and along H (the row bands) assemble the map."""
    x, out = node.inputs[0], node.outputs[0]
    ci, h, w = geo.in_shape
    co = geo.co
    fc, fh, fw = geo.out_shape if geo.post else geo.kpu_out
    sp = hw.POOL[geo.code].stride
    final = Loc((fc, fh, fw), quant=lq.out_quant)
    lw.locs[out] = final
    src_u8 = lw.locs[x].pixels if lq.pixels else lw.need_u8(x, row)
    if geo.small_map:
        src_u8 = grow_map(lw, src_u8, (ci,) + geo.small_map, (h, w), out, row)
    macs = lines = 0
    pieces, n_tiles, t = {}, len(plan.bands) * len(plan.cols), 0
    for bi, ((f0, f1), (ra, rb)) in enumerate(plan.bands):
        for cj, ((g0, g1), (ca, cb)) in enumerate(plan.cols):
            rows, cols, tag = rb - ra, cb - ca, f"{out}:tile{bi}.{cj}"
            band_in = lw.alloc(tag + ":in", "u8", ci * rows * cols)
            lw.emit_v4("strided_slice", dict(
                input=main(U8, src_u8, ci * h * w), output=main(U8, band_in, ci * rows * cols),
                in_shape=(1, ci, h, w), begin=(0, 0, ra, ca), end=(1, ci, rb, cb), strides=(1, 1, 1, 1),
                begin_mask=0, end_mask=0, ellipsis_mask=0, new_axis_mask=0, shrink_axis_mask=0), row)
            t += 1
            if t == n_tiles:
                lw.release_read(x)          # the last tile gathered: the map is no longer read
            prow, pcol = hw.POOL[geo.code].out_size(rows, cols)
            band_out = lw.alloc(tag + ":out", "u8", co * prow * pcol)
            for (c0, c1), (o0, o1) in plan.units:
                nin = c1 - c0
                tmp_in = Loc((nin, rows, cols))
                src_line = lw.kpu_alloc(tmp_in, f"{out}:tile_in", hw.map_lines(nin, rows, cols),
                                        f"node {node.name!r}: tile input {nin}x{rows}x{cols}")
                lw.emit("K210_UPLOAD", dict(flags=0, main_mem_in_address=band_in + c0 * rows * cols,
                                            kpu_mem_out_address=src_line, width=cols, height=rows,
                                            channels=nin), row)
                conv = kpu.tile_conv(lq, (c0, c1), (o0, o1), (nin, rows, cols), geo.code, geo.depthwise, node.name)
                tmp_out = Loc(conv.out_shape)
                dst_line = lw.kpu_alloc(tmp_out, f"{out}:tile_out", kpu.out_lines(conv),
                                        f"node {node.name!r}: tile output {conv.out_shape}", [tmp_in.block],
                                        away=tmp_in.kpu)
                kpu.place(conv, src_line, dst_line)
                idx = lw.emit("K210_CONV", dict(flags=1, main_mem_out_address=band_out + o0 * prow * pcol),
                              row, conv=conv)
                macs += conv.macs
                lines = max(lines, hw.map_lines(nin, rows, cols) + kpu.out_lines(conv))
                row.weight_bytes += lw.share_blocks(idx)
                lw.kpu_free(tmp_in)
                lw.kpu_free(tmp_out)
            lw.main.free(tag + ":in:u8")
            fin = lw.alloc(tag + ":fin", "u8", fc * (f1 - f0) * (g1 - g0))
            if geo.post:
                _post(lw, geo, band_out, (co, prow, pcol), fin, (f0, f1), ra // sp, row, (g0, g1), ca // sp)
            else:                       # crop the tile's valid pixels
                r0, q0 = f0 - ra // sp, g0 - ca // sp
                lw.emit_v4("strided_slice", dict(
                    input=main(U8, band_out, co * prow * pcol), output=main(U8, fin, fc * (f1 - f0) * (g1 - g0)),
                    in_shape=(1, co, prow, pcol), begin=(0, 0, r0, q0), end=(1, co, r0 + f1 - f0, q0 + g1 - g0),
                    strides=(1, 1, 1, 1), begin_mask=0, end_mask=0, ellipsis_mask=0, new_axis_mask=0,
                    shrink_axis_mask=0), row)
            lw.main.free(tag + ":out:u8")
            pieces[bi, cj] = fin
    final.u8 = lw.alloc(out, "u8", fc * fh * fw)
    widths = [g1 - g0 for (g0, g1), _ in plan.cols]
    strips = []
    for bi, ((f0, f1), _) in enumerate(plan.bands):     # the column bands side by side: concat along W
        n = fc * (f1 - f0)
        dst = final.u8 if len(plan.bands) == 1 else lw.alloc(f"{out}:strip{bi}", "u8", n * fw)
        idx = lw.emit_v4("concat", dict(output=main(U8, dst, n * fw), inner_size=1, outer_size=n,
                                        inputs_count=len(widths)), row,
                         data={"inputs": [main(U8, pieces[bi, cj], n * wd) for cj, wd in enumerate(widths)],
                               "dims": widths})
        strips.append((dst, f1 - f0))
    if len(plan.bands) > 1:                               # the row bands: concat along H
        idx = lw.emit_v4("concat", dict(output=main(U8, final.u8, fc * fh * fw), inner_size=fw, outer_size=fc,
                                        inputs_count=len(strips)), row,
                         data={"inputs": [main(U8, a, fc * n * fw) for a, n in strips], "dims": [n for _, n in strips]})
    for key in pieces:
        lw.main.free(f"{out}:tile{key[0]}.{key[1]}:fin:u8")
    for bi in range(len(strips) if len(plan.bands) > 1 else 0):
        lw.main.free(f"{out}:strip{bi}:u8")
    lw.trace_map[out] = (idx, "u8")
    if geo.small_map:
        lw.main.free(f"{out}:grown:u8")
    row.macs, row.kpu_lines = macs, lines


def _kpu_pick(geo, kpu=None, dst=0, tile=None, channel=None, bare=False):
    """The fields of a v4 strided_slice that crops or picks the KPU output where it lies in KPU
    RAM (nncase v0.2's interpreter reads a mem_k210_kpu range in place, k210/interpreter.cpp
    memory_at) into the dense uint8 map at `dst`; None unless the one CPU stage is a 1x1 pick or
    crop (`bare`: or there is none, the rows a band keeps) and the map's rows are one per line
    group (width > 32: (C, H, 64 * lines) in KPU RAM, hardware.row_layout). `tile` (channels, KPU
    rows, final rows (f0, f1), the band's first KPU row): of one tile's output, a channel chunk or
    window and/or a row band, as _post reads it; `channel`: only that channel of the tile."""
    (co, ph, pw), (fc, fh, fw) = geo.kpu_out, geo.out_shape if geo.post else geo.kpu_out
    f0, f1, row0 = 0, fh, 0
    if tile is not None:
        co, ph, (f0, f1), row0 = tile
        fc = co
    g, _, lines = hw.row_layout(pw)
    if not (len(geo.post) == 1 and geo.post[0][0] == 1 or bare and not geo.post) or g != 1 or fc != co:
        return None
    _, s, pad_h, pad_w = geo.post[0] if geo.post else (1, 1, 0, 0)
    top = s * f0 - pad_h - row0
    c0, c1 = (0, co) if channel is None else (channel, channel + 1)
    start = 0 if kpu is None else kpu[0] * hw.LINE_BYTES
    return dict(input=(MEM_KPU, DT_UINT8, start, hw.map_lines(co, ph, pw) * hw.LINE_BYTES),
                output=(MEM_MAIN, DT_UINT8, dst, (c1 - c0) * (f1 - f0) * fw), in_shape=(1, co, ph, hw.LINE_BYTES * lines),
                begin=(0, c0, top, -pad_w), end=(1, c1, top + (f1 - f0 - 1) * s + 1, -pad_w + (fw - 1) * s + 1),
                strides=(1, 1, s, s), begin_mask=0, end_mask=0, ellipsis_mask=0, new_axis_mask=0,
                shrink_axis_mask=0)


def _post_in_place(geo):
    """Is the CPU stage after the KPU one QUANTIZED_MAX_POOL2D that may write over the map it
    reads (kmodel.v3.pool_reads_ahead: a crop or a pick)?"""
    if len(geo.post) != 1:
        return False
    (co, ph, pw), (fc, fh, fw) = geo.kpu_out, geo.out_shape
    k, s, pad_h, pad_w = geo.post[0]
    return v3.pool_reads_ahead(dict(in_shape=(pw, ph, co), out_shape=(fw, fh, fc), stride_height=s,
                                    stride_width=s, padding_height=pad_h, padding_width=pad_w))


def _post(lw, geo, src, shape, dst, frows, pooled0, row, fcols=None, pcol0=0):
    """The CPU stages after the KPU (a pick and/or a pool: QUANTIZED_MAX_POOL2D) on a buffer of
    `shape` holding the KPU's pooled rows [pooled0, pooled0 + H) (and columns [pcol0, pcol0 + W));
    writes final rows `frows` (and columns `fcols`, default all) to `dst`. Taps outside the buffer
    are skipped, which is right: a band holds every in-image row its outputs read. Returns the
    last layer's index."""
    c, h, w = shape
    heights, widths = [geo.kpu_out[1]], [geo.kpu_out[2]]
    for i, (k, s, pad_h, pad_w) in enumerate(geo.post):
        last = i == len(geo.post) - 1
        heights.append(geo.out_shape[1] if last else (heights[-1] + pad_h + s - 1) // s)
        widths.append(geo.out_shape[2] if last else (widths[-1] + pad_w + s - 1) // s)
    need = [tuple(frows)]
    cneed = [tuple(fcols) if fcols is not None else (0, geo.out_shape[2])]
    for i in range(len(geo.post) - 1, 0, -1):    # rows / columns stage i-1 must give stage i
        k, s, pad_h, pad_w = geo.post[i]
        lo, hi = need[0]
        need.insert(0, (max(0, s * lo - pad_h), min(heights[i], s * (hi - 1) - pad_h + k)))
        lo, hi = cneed[0]
        cneed.insert(0, (max(0, s * lo - pad_w), min(widths[i], s * (hi - 1) - pad_w + k)))
    g0, c0, buf, idx = pooled0, pcol0, src, None
    for i, (k, s, pad_h, pad_w) in enumerate(geo.post):
        lo, hi = need[i]
        clo, chi = cneed[i]
        last = i == len(geo.post) - 1
        out = dst if last else lw.alloc(f"{row.node}:post{i}", "u8", c * (hi - lo) * (chi - clo))
        idx = lw.emit("QUANTIZED_MAX_POOL2D", dict(
            flags=1, main_mem_in_address=buf, main_mem_out_address=out, in_shape=(w, h, c),
            out_shape=(chi - clo, hi - lo, c), kernel_width=k, kernel_height=k, stride_width=s,
            stride_height=s, padding_width=pad_w + c0 - s * clo, padding_height=pad_h + g0 - s * lo), row)
        if i:
            lw.main.free(f"{row.node}:post{i - 1}:u8")
        buf, g0, c0, h, w = out, lo, clo, hi - lo, chi - clo
    return idx


def _direct_bands(lw, x, w):
    """Do a row band's channels upload straight from the map (one channel a KPU line group)?"""
    return x not in lw.band_sources and hw.row_layout(w)[0] == 1


def _map_first(lw, geo, plan, x):
    """Does the whole output map beside one band's buffers (and the input, read until the last
    band) take less main memory than every band's output beside the map assembled after them?"""
    (ci, h, w), (co, _, pw), (fc, fh, fw) = geo.in_shape, geo.kpu_out, geo.out_shape
    stride = hw.POOL[geo.code].stride
    gather = 0 if _direct_bands(lw, x, w) else ci
    work = max(gather * (b - a) * w + co * ((b - a) // stride) * pw for _, (a, b) in plan.bands)
    held = 0 if x in lw.band_sources else ci * h * w
    return held + work < fc * fh * fw


def needs_main(lw, t):
    """Must this conv output also stream to main memory? Yes unless its only consumer is a KPU
    conv reading the whole map from KPU RAM, emitted right after it (any conv in between could
    overwrite the map)."""
    if t in lw.virtual_next:            # a stage of a decomposed conv feeding the next stage
        p = plan_for(lw, lw.virtual_next[t])
        return not p.in_resident or len(p.bands) != 1
    cons = lw.consumers(t)
    if t in lw.g.outputs or len(cons) != 1:
        return True
    c = cons[0]
    if lw.lowered_by(c) != "kpu_conv":
        return True
    p = plan_for(lw, c)
    if not p.in_resident or len(p.bands) != 1:
        return True
    i = lw.order.index(lw.producer(t))
    nxt = next((n for n in lw.order[i + 1:] if n.op == "Conv"), None)
    return nxt is not c

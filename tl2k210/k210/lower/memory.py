"""KPU RAM lines and main-buffer allocation for the lowering."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tl2k210.errors import KpuLimitError
from tl2k210.k210 import hardware as hw


SLICES = "/slices"    # Options.small names "<node>/slices": its float temporaries a channel at a time
SLICE_MIN_BYTES = 65536          # float scratch below which a uint8 map is dequantized whole (64 KiB)
PARK = "/park"        # Options.small names "/park": main-memory buffers in KPU RAM lines free over their lifetimes
PARK_BASE = 1 << 40   # a main-memory address at PARK_BASE + b is byte b of KPU RAM (kmodel v4 ranges)
PARK_PLANS = 40       # main-memory plans a park search makes at most (each re-places every buffer)
PARK_STALE = 10       # buffers it parks without lowering the peak before it stops
MAIN_TARGET = 1.25               # issue 22: the main-memory peak within 1.25x the live-set lower bound
#: the kmodel bytes of one more float slice: a v4 dequantize (40 B), the op (reduce_window2d: 104 B)
#: and a quantize (40 B), each with its 8-byte node header
SLICE_NODE_BYTES = 208


def float_slices(c: int, u8_per_channel: int, f32_per_channel: int, room: int | None = None) -> list:
    """[(c0, c1)] channel ranges for a per-channel float op on a uint8 map (a pool the runtime has
    in float only): each slice's float temporaries (`f32_per_channel` bytes a channel) no bigger
    than the uint8 map or SLICE_MIN_BYTES, nor than `room` (Lowering.float_room: what keeps main
    memory within MAIN_TARGET of the live set), one channel at least, and none smaller than what
    saves its own nodes' SLICE_NODE_BYTES of kmodel (a pool of ten 1x4 rows: one slice, not ten).
    Channels (or any units) are contiguous in CHW, so a slice is one range of the map, and the
    values are those of one big op."""
    f32 = max(1, f32_per_channel)
    n = max(1, max(SLICE_MIN_BYTES, c * u8_per_channel) // f32)
    if room is not None and n * f32 > room:
        n = max(1, room // f32, -(-SLICE_NODE_BYTES // f32))
    return [(c0, min(c, c0 + n)) for c0 in range(0, c, n)]


class KpuAllocator:
    """KPU RAM in 64-byte lines: named blocks, first fit, explicit free. A KPU conv needs its
    input and output maps resident at once and disjoint (docs/kpu.md#write-back-and-streaming); several maps may stay
    resident while their KPU consumers run (a map read by two convs, a concat's slots)."""

    def __init__(self, lines: int = hw.KPU_RAM_LINES, clock=lambda: 0):
        self.lines = lines
        self.blocks: dict[str, tuple[int, int]] = {}
        self.peak = 0                   # most lines in use at once
        self.lowest = hw.KPU_RAM_LINES  # the header's max_start_address (informational)
        self.clock = clock
        self.history: list[Block] = []  # every block in lines, with its lifetime in layer indices
        self._open = {}
        self.touched: set[int] = set()      # history indices of the blocks the node being lowered uses
        self.last_use: dict[int, int] = {}  # history index -> the layer index after the last node using it

    def touch(self, name: str):
        """The node being lowered reads (or writes) block `name` (end_node dates it)."""
        if name in self._open:
            self.touched.add(self._open[name])

    def end_node(self):
        """The node being lowered is done: the blocks it touched were last used up to here."""
        for i in self.touched:
            self.last_use[i] = self.clock()
        self.touched.clear()

    def used_history(self, margin: int = 1) -> list:
        """`history` with each block's lifetime ending after the node that last read or wrote it
        (`end_node`), or `margin` layers after its free where that is sooner (a block freed inside
        its node, while the node's later layers go on): a map left resident while nobody reads it
        there (its readers take the main-memory copy) holds no lines a buffer parked in KPU RAM
        could use (ESPCN: a 64x128x128 conv's 1 MiB output, read on the CPU, kept the lines its
        resize's 2 MiB output needed)."""
        out = []
        for i, b in enumerate(self.history):
            ends = [t for t in (self.last_use.get(i), None if b.t1 is None else b.t1 + margin) if t is not None]
            out.append(Block(b.name, b.start, b.size, b.t0, max(min(ends), b.t0 + 1) if ends else None))
        return out

    def used(self) -> int:
        return sum(e - s for s, e in self.blocks.values())

    def _gaps(self):
        start = 0
        for s, e in sorted(self.blocks.values()):
            if s > start:
                yield start, s
            start = max(start, e)
        if start < self.lines:
            yield start, self.lines

    def _place(self, n: int, high: bool):
        fit = [(s, e) for s, e in self._gaps() if e - s >= n]
        if not fit:
            return None
        return fit[-1][1] - n if high else fit[0][0]

    def fits(self, n: int) -> bool:
        return self._place(n, False) is not None

    def alloc(self, name: str, n: int, where: str, high: bool = False) -> int:
        """First line of a new block of n lines (the lowest free one, or the highest with `high`:
        a layer's output goes to the end of KPU RAM away from its input, so two maps that fit
        together always find room); KpuLimitError naming `where` if none is free."""
        start = self._place(n, high)
        if start is None:
            live = ", ".join(f"{k} {e - s}" for k, (s, e) in self.blocks.items())
            free, piece = self.lines - self.used(), max((e - s for s, e in self._gaps()), default=0)
            split = f" ({free * hw.LINE_BYTES:,} B free in all, split by the resident maps)" if free > piece else ""
            raise KpuLimitError(
                f"{where}: needs {n * hw.LINE_BYTES:,} B of KPU RAM ({n} lines) but only "
                f"{piece * hw.LINE_BYTES:,} B of the {self.lines * hw.LINE_BYTES:,} B "
                f"KPU RAM are free in one piece{split} (resident maps in lines: {live or 'none'})")
        self.blocks[name] = (start, start + n)
        self.peak = max(self.peak, self.used())
        self.lowest = min(self.lowest, start)
        self._open[name] = len(self.history)
        self.touched.add(len(self.history))
        self.history.append(Block(name, start, n, self.clock()))
        return start

    def free(self, name: str):
        if self.blocks.pop(name, None) is not None:
            self.history[self._open.pop(name)].t1 = self.clock()


@dataclass
class Block:
    """One main-memory buffer of the lowering: bytes [start, start + size) from the layer index
    t0 (the layers emitted when it was allocated) to t1 (when it was freed; None: to the end)."""
    name: str
    start: int
    size: int
    t0: int
    t1: int | None = None

    def live(self, t: int, end: int) -> bool:
        return self.t0 <= t < (end if self.t1 is None else self.t1)


class MainAllocator:
    """First-fit allocation with lifetimes; 8-byte aligned; high-water mark = main_mem_usage.
    Every buffer's lifetime (in layer indices, from `clock`) is kept in `history`: `plan`
    re-places them offline once all layers are known. `views` {history index: (history index,
    offset)} are the declared facts that a buffer lies inside another one (`view`)."""

    def __init__(self, clock=lambda: 0):
        self.blocks = {}   # name -> (start, size)
        self.high = 0
        self.at_high = {}  # the blocks live when the high-water mark was last raised
        self.clock = clock
        self.history: list[Block] = []
        self._open = {}    # name -> index in history
        self.views = {}

    def used(self) -> int:
        """Bytes of the buffers live now."""
        return sum(n for _, n in self.blocks.values())

    def alloc(self, name: str, size: int) -> int:
        size = max(8, -(-size // 8) * 8)
        used = sorted(self.blocks.values())
        start = 0
        for s, n in used:
            if start + size <= s:
                break
            start = max(start, s + n)
        self.blocks[name] = (start, size)
        self._open[name] = len(self.history)
        self.history.append(Block(name, start, size, self.clock()))
        if start + size > self.high:
            self.high = start + size
            self.at_high = dict(self.blocks)
        return start

    def free(self, name: str):
        if self.blocks.pop(name, None) is not None:
            self.history[self._open.pop(name)].t1 = self.clock()

    def hand_over(self, old: str, new: str) -> int:
        """`new` takes `old`'s live buffer (an op writing its output over its input, which dies
        there): one buffer from `old`'s allocation to `new`'s free, so a plan keeps them at one
        place. Returns its start."""
        assert not self.viewed(old), f"{old} is a view or holds views: no op may write over it"
        start, size = self.blocks[new] = self.blocks.pop(old)
        i = self._open[new] = self._open.pop(old)
        self.history[i].name = f"{new} (in place of {old})"
        return start

    def owner(self, addr: int) -> str | None:
        """The live buffer that starts at `addr`."""
        return next((k for k, (s, _) in self.blocks.items() if s == addr), None)

    def viewed(self, name: str) -> bool:
        """Is the live buffer `name` a view or does it hold one? (Then nothing may write over it
        in place: the bytes of the others are in it.)"""
        i = self._open.get(name)
        return i in self.views or any(j == i for j, _ in self.views.values())

    def view(self, part: str, whole: str, offset: int):
        """Declare that the live buffer `part` lies at `offset` in the live buffer `whole`: its
        producer writes there, so `whole` needs no copy of it (a concat's input). Both are
        placed as one buffer from the first one's allocation to the last one's free. The
        offset is 8-aligned (allocations are; the KPU's DMA writes whole u64 words) and the
        part (8-rounded) lies inside `whole`."""
        i, j = self._open[part], self._open[whole]
        assert i not in self.views and offset % 8 == 0 and \
            offset + self.history[i].size <= self.history[j].size, (part, whole, offset)
        self.views[i] = (j, offset)

    def fit_views(self, whole: str, parts: list) -> list:
        """Of `parts` [(buffer name, offset in `whole`)], those to declare views of `whole`: the
        ones allocated last, as many as keep the live bytes at every layer so far within their
        peak with `whole` a separate copy. A view reserves all of `whole` from its part's
        allocation on, which costs where the other parts are not live yet."""
        now, i = self.clock(), self._open[whole]
        merged, where = merge(self.history, self.views)
        live = np.zeros(now + 2, np.int64)
        for b in merged:
            t1 = now + 1 if b.t1 is None else min(b.t1, now + 1)
            if t1 > b.t0:
                live[b.t0] += b.size
                live[t1] -= b.size
        live = np.cumsum(live)[:now + 1]
        bound, size = int(live.max()), merged[where[i][0]].size
        cands = sorted((p for p in parts if self._open[p[0]] not in self.views),
                       key=lambda p: -merged[where[self._open[p[0]]][0]].t0)
        best = []
        for k in range(1, len(cands) + 1):
            delta = np.full(now, size, np.int64)
            for name, _ in cands[:k]:
                b = merged[where[self._open[name]][0]]
                delta[b.t0:now if b.t1 is None else min(b.t1, now)] -= b.size
            t0 = merged[where[self._open[cands[k - 1][0]]][0]].t0
            if t0 >= now or int((live[t0:now] + delta[t0:]).max()) <= bound:
                best = cands[:k]
        return best


def merge(blocks: list, views: dict) -> tuple[list, dict]:
    """The buffers as placed: each declared view inside its outermost buffer, which lives from
    the first allocation to the last free of them all. Returns (merged blocks, {block index:
    (merged index, offset in it)})."""
    def root(i):
        off = 0
        while i in views:
            i, o = views[i]
            off += o
        return i, off
    merged, where, first = [], {}, {}
    for i, b in enumerate(blocks):
        r, off = root(i)
        if r not in first:
            first[r] = len(merged)
            rb = blocks[r]
            merged.append(Block(rb.name, rb.start, rb.size, rb.t0, rb.t1))
        m = merged[first[r]]
        m.t0 = min(m.t0, b.t0)
        m.t1 = None if m.t1 is None or b.t1 is None else max(m.t1, b.t1)
        where[i] = (first[r], off)
    return merged, where


def _overlap(a: Block, b: Block, end: int) -> bool:
    a1 = end if a.t1 is None else a.t1
    b1 = end if b.t1 is None else b.t1
    return a.t0 < b1 and b.t0 < a1


def _neighbours(blocks: list, end: int) -> list:
    """For each block, the indices of the other blocks whose lifetimes overlap its own (_overlap)."""
    t0 = np.array([b.t0 for b in blocks], np.int64)
    t1 = np.array([end if b.t1 is None else b.t1 for b in blocks], np.int64)
    out = []
    for i in range(len(blocks)):
        live = (t0 < t1[i]) & (t0[i] < t1)
        live[i] = False
        out.append(np.flatnonzero(live).tolist())
    return out


def _greedy(blocks: list, order: list, nbr: list) -> dict:
    """TFLite Micro's greedy planner: in `order`, each buffer at the lowest offset clear of the
    buffers already placed whose lifetimes overlap its own (`nbr`: _neighbours)."""
    at = {}
    for i in order:
        size, off = blocks[i].size, 0
        for o, j in sorted((at[j], j) for j in nbr[i] if j in at):
            if off + size <= o:
                break
            off = max(off, o + blocks[j].size)
        at[i] = off
    return at


def plan(blocks: list, end: int, views: dict | None = None) -> tuple[dict, int]:
    """({block index: offset}, peak) for the buffers that hold data (t1 > t0): the best of greedy
    by size, by size x lifetime, by first use, and the online first-fit offsets as allocated
    (unless `views` {block: (block, offset)} put buffers inside others: then each group is
    placed as its outermost buffer, and every view at its offset in it)."""
    views = views or {}
    merged, where = merge(blocks, views)
    idx = [i for i, b in enumerate(merged) if (end if b.t1 is None else b.t1) > b.t0]
    life = {i: (end if merged[i].t1 is None else merged[i].t1) - merged[i].t0 for i in idx}
    orders = [sorted(idx, key=lambda i: (-merged[i].size, merged[i].t0)),
              sorted(idx, key=lambda i: (-merged[i].size * life[i], merged[i].t0)),
              sorted(idx, key=lambda i: (merged[i].t0, -merged[i].size))]
    best = None if views else {i: merged[i].start for i in idx}
    peak = lambda at: max((at[i] + merged[i].size for i in at), default=0)   # noqa: E731
    nbr = _neighbours(merged, end)
    for order in orders:
        at = _greedy(merged, order, nbr)
        if best is None or peak(at) < peak(best):
            best = at
    at = {i: best[m] + off for i, (m, off) in where.items() if m in best}
    check(blocks, at, end, views)
    return at, peak(best)


def _inside(i: int, j: int, at: dict, blocks: list, views: dict) -> bool:
    """Is block i declared a view in block j (directly or through views of views), and placed
    at its offset there, wholly inside?"""
    off, k = 0, i
    while k in views and k != j:
        k, o = views[k]
        off += o
    return k == j and k != i and at[i] == at[j] + off and at[i] + blocks[i].size <= at[j] + blocks[j].size


def check(blocks: list, at: dict, end: int, views: dict | None = None):
    """An overlap of two buffers that are live at the same time is an error (AssertionError),
    unless one is a declared view in the other (`views`, MainAllocator.view) at its offset."""
    views = views or {}
    items = sorted(at.items(), key=lambda kv: kv[1])
    ids = [i for i, _ in items]
    o = np.array([p for _, p in items], np.int64)
    e = o + np.array([blocks[i].size for i in ids], np.int64)
    t0 = np.array([blocks[i].t0 for i in ids], np.int64)
    t1 = np.array([end if blocks[i].t1 is None else blocks[i].t1 for i in ids], np.int64)
    pos = np.arange(len(ids))
    step = max(1, (1 << 22) // max(1, len(ids)))      # a band of rows, at most 4 M pairs at a time
    for r in range(0, len(ids), step):                # the pairs in offset order
        k = pos[r:r + step, None]
        clash = (pos > k) & (o < e[k]) & (t0 < t1[k]) & (t0[k] < t1)
        for a, b in zip(*np.nonzero(clash)):
            i, j = ids[r + a], ids[b]
            if not (_inside(i, j, at, blocks, views) or _inside(j, i, at, blocks, views)):
                raise AssertionError(f"main memory plan: {blocks[i].name} [{at[i]}, {at[i] + blocks[i].size}) and "
                                     f"{blocks[j].name} [{at[j]}, {at[j] + blocks[j].size}) are live together "
                                     f"(layers {blocks[i].t0}-{blocks[i].t1}, {blocks[j].t0}-{blocks[j].t1})")


def park(blocks: list, end: int, views: dict, kpu: list, lines: int, movable: set) -> tuple[dict, dict, int]:
    """Main-memory buffers moved into KPU RAM, which kmodel v4's runtime addresses for any op
    (memory type k210_kpu, docs/kmodel-format.md#v4-interpreter): each into lines that no KPU
    block (`kpu`, in lines: KpuAllocator.used_history) and no buffer parked before holds while it
    is live. Of the `movable` buffers live with the one on top of the main-memory plan, the
    largest that has room goes first, kept while the plan's peak does not grow; the parked set
    that gave the lowest peak is returned. Returns ({block index: its first KPU line}, the plan of
    the rest, its peak)."""
    cur = list(blocks)
    at, peak = plan(cur, end, views)
    parked, best = {}, ({}, at, peak)
    nlines = [-(-b.size // hw.LINE_BYTES) for b in blocks]

    def room(i):
        b, start = blocks[i], 0
        busy = sorted([(k.start, k.start + k.size) for k in kpu if _overlap(k, b, end)] +
                      [(s, s + nlines[j]) for j, s in parked.items() if _overlap(blocks[j], b, end)])
        for s, e in busy:
            if start + nlines[i] <= s:
                break
            start = max(start, e)
        return start if start + nlines[i] <= lines else None

    tried, stale, plans = set(), 0, 0
    while at and stale < PARK_STALE and plans < PARK_PLANS:
        top = blocks[max(at, key=lambda i: at[i] + blocks[i].size)]
        cands = sorted((i for i in at if i in movable and i not in tried and _overlap(blocks[i], top, end)),
                       key=lambda i: -blocks[i].size)
        for i in cands:
            tried.add(i)
            line = room(i)
            if line is None:
                continue
            plans += 1
            trial = list(cur)
            trial[i] = Block(blocks[i].name, blocks[i].start, blocks[i].size, blocks[i].t0, blocks[i].t0)
            t_at, t_peak = plan(trial, end, views)
            if t_peak <= peak:
                cur, at, peak, parked[i] = trial, t_at, t_peak, line
                stale = 0 if peak < best[2] else stale + 1
                if peak < best[2]:
                    best = (dict(parked), at, peak)
                break
            if plans == PARK_PLANS:
                break
        else:
            break
    return best


def kpu_peak(blocks: list, end: int) -> int:
    """Most KPU RAM lines in use at one layer, of blocks in lines with their lifetimes."""
    use = np.zeros(end + 2, np.int64)
    for b in blocks:
        t1 = end + 1 if b.t1 is None else b.t1
        if t1 > b.t0:
            use[b.t0] += b.size
            use[t1] -= b.size
    return int(np.cumsum(use).max(initial=0))

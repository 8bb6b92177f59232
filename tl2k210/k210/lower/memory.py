"""KPU RAM lines and main-buffer allocation for the lowering."""
from __future__ import annotations

from dataclasses import dataclass

from tl2k210.errors import KpuLimitError
from tl2k210.k210 import hardware as hw


SLICE_MIN_BYTES = 65536          # float scratch below which a uint8 map is dequantized whole (64 KiB)
MAIN_TARGET = 1.25               # issue 22: the main-memory peak within 1.25x the live-set lower bound


def float_slices(c: int, u8_per_channel: int, f32_per_channel: int, room: int | None = None) -> list:
    """[(c0, c1)] channel ranges for a per-channel float op on a uint8 map (a pool the runtime has
    in float only): each slice's float temporaries (`f32_per_channel` bytes a channel) no bigger
    than the uint8 map or SLICE_MIN_BYTES, nor than `room` (Lowering.float_room: what keeps main
    memory within MAIN_TARGET of the live set), one channel at least. Channels (or any units) are
    contiguous in CHW, so a slice is one range of the map, and the values are those of one big op."""
    n = max(1, max(SLICE_MIN_BYTES, c * u8_per_channel) // max(1, f32_per_channel))
    if room is not None and n * f32_per_channel > room:
        n = max(1, room // max(1, f32_per_channel))
    return [(c0, min(c, c0 + n)) for c0 in range(0, c, n)]


class KpuAllocator:
    """KPU RAM in 64-byte lines: named blocks, first fit, explicit free. A KPU conv needs its
    input and output maps resident at once and disjoint (docs/kpu.md#write-back-and-streaming); several maps may stay
    resident while their KPU consumers run (a map read by two convs, a concat's slots)."""

    def __init__(self, lines: int = hw.KPU_RAM_LINES):
        self.lines = lines
        self.blocks: dict[str, tuple[int, int]] = {}
        self.peak = 0                   # most lines in use at once
        self.lowest = hw.KPU_RAM_LINES  # the header's max_start_address (informational)

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
            raise KpuLimitError(
                f"{where}: needs {n * hw.LINE_BYTES:,} B of KPU RAM ({n} lines) but only "
                f"{(self.lines - self.used()) * hw.LINE_BYTES:,} B of the {self.lines * hw.LINE_BYTES:,} B "
                f"KPU RAM are free in one piece (resident maps in lines: {live or 'none'})")
        self.blocks[name] = (start, start + n)
        self.peak = max(self.peak, self.used())
        self.lowest = min(self.lowest, start)
        return start

    def free(self, name: str):
        self.blocks.pop(name, None)


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
    re-places them offline once all layers are known."""

    def __init__(self, clock=lambda: 0):
        self.blocks = {}   # name -> (start, size)
        self.high = 0
        self.at_high = {}  # the blocks live when the high-water mark was last raised
        self.clock = clock
        self.history: list[Block] = []
        self._open = {}    # name -> index in history

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
        start, size = self.blocks[new] = self.blocks.pop(old)
        i = self._open[new] = self._open.pop(old)
        self.history[i].name = f"{new} (in place of {old})"
        return start


def _overlap(a: Block, b: Block, end: int) -> bool:
    a1 = end if a.t1 is None else a.t1
    b1 = end if b.t1 is None else b.t1
    return a.t0 < b1 and b.t0 < a1


def _greedy(blocks: list, order: list, end: int) -> dict:
    """TFLite Micro's greedy planner: in `order`, each buffer at the lowest offset clear of the
    buffers already placed whose lifetimes overlap its own."""
    placed, at = [], {}
    for i in order:
        b = blocks[i]
        off = 0
        for o, j in sorted((at[j], j) for j in placed if _overlap(blocks[j], b, end)):
            if off + b.size <= o:
                break
            off = max(off, o + blocks[j].size)
        at[i] = off
        placed.append(i)
    return at


def plan(blocks: list, end: int) -> tuple[dict, int]:
    """({block index: offset}, peak) for the buffers that hold data (t1 > t0): the best of greedy
    by size, by size x lifetime, by first use, and the online first-fit offsets as allocated."""
    idx = [i for i, b in enumerate(blocks) if (end if b.t1 is None else b.t1) > b.t0]
    life = {i: (end if blocks[i].t1 is None else blocks[i].t1) - blocks[i].t0 for i in idx}
    orders = [sorted(idx, key=lambda i: (-blocks[i].size, blocks[i].t0)),
              sorted(idx, key=lambda i: (-blocks[i].size * life[i], blocks[i].t0)),
              sorted(idx, key=lambda i: (blocks[i].t0, -blocks[i].size))]
    best = {i: blocks[i].start for i in idx}
    peak = lambda at: max((at[i] + blocks[i].size for i in at), default=0)   # noqa: E731
    for order in orders:
        at = _greedy(blocks, order, end)
        if peak(at) < peak(best):
            best = at
    check(blocks, best, end)
    return best, peak(best)


def check(blocks: list, at: dict, end: int):
    """An overlap of two buffers that are live at the same time is an error (AssertionError)."""
    items = sorted(at.items(), key=lambda kv: kv[1])
    for k, (i, o) in enumerate(items):
        for j, p in items[k + 1:]:
            if p >= o + blocks[i].size:
                break
            if _overlap(blocks[i], blocks[j], end):
                raise AssertionError(f"main memory plan: {blocks[i].name} [{o}, {o + blocks[i].size}) and "
                                     f"{blocks[j].name} [{p}, {p + blocks[j].size}) are live together "
                                     f"(layers {blocks[i].t0}-{blocks[i].t1}, {blocks[j].t0}-{blocks[j].t1})")

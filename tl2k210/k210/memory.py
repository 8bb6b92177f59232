"""KPU RAM lines and main-buffer allocation for the lowering."""
from __future__ import annotations

from tl2k210.errors import KpuLimitError
from tl2k210.k210 import hardware as hw


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


class MainAllocator:
    """First-fit allocation with lifetimes; 8-byte aligned; high-water mark = main_mem_usage."""

    def __init__(self):
        self.blocks = {}   # name -> (start, size)
        self.high = 0
        self.at_high = {}  # the blocks live when the high-water mark was last raised

    def alloc(self, name: str, size: int) -> int:
        size = max(8, -(-size // 8) * 8)
        used = sorted(self.blocks.values())
        start = 0
        for s, n in used:
            if start + size <= s:
                break
            start = max(start, s + n)
        self.blocks[name] = (start, size)
        if start + size > self.high:
            self.high = start + size
            self.at_high = dict(self.blocks)
        return start

    def free(self, name: str):
        self.blocks.pop(name, None)

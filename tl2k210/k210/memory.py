"""KPU RAM (64-byte lines) and main-buffer allocation for the v3 lowering."""
from __future__ import annotations

from tl2k210.errors import KpuLimitError
from tl2k210.k210 import hardware as hw


class KpuAllocator:
    """Each KPU conv needs its input and output maps resident at once, disjoint. A map lives from
    its producer to its one KPU consumer, so maps alternate between the two ends of the 2 MiB."""

    def __init__(self):
        self.peak = 0
        self.lowest = hw.KPU_RAM_LINES

    def place_output(self, in_range: tuple[int, int], out_lines: int, where: str) -> int:
        a, b = in_range
        in_lines = b - a
        if in_lines + out_lines > hw.KPU_RAM_LINES:
            raise KpuLimitError(
                f"{where}: input map ({in_lines * 64:,} B) + output map ({out_lines * 64:,} B) exceed "
                f"the 2 MiB KPU RAM; reduce the feature-map size or channels of this layer")
        start = hw.KPU_RAM_LINES - out_lines if a == 0 else 0   # the end the input is not at
        self.peak = max(self.peak, in_lines + out_lines)
        self.lowest = min(self.lowest, start, a)
        return start

    def place_input(self, lines: int, where: str) -> int:
        if lines > hw.KPU_RAM_LINES:
            raise KpuLimitError(f"{where}: input map of {lines * 64:,} B exceeds the 2 MiB KPU RAM")
        return 0


class MainAllocator:
    """First-fit allocation with lifetimes; 8-byte aligned; high-water mark = main_mem_usage."""

    def __init__(self):
        self.blocks = {}   # name -> (start, size)
        self.high = 0

    def alloc(self, name: str, size: int) -> int:
        size = max(8, -(-size // 8) * 8)
        used = sorted(self.blocks.values())
        start = 0
        for s, n in used:
            if start + size <= s:
                break
            start = max(start, s + n)
        self.blocks[name] = (start, size)
        self.high = max(self.high, start + size)
        return start

    def free(self, name: str):
        self.blocks.pop(name, None)

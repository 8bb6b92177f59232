"""Emulated memories: the 2 MiB KPU RAM (64-byte lines, docs/kpu.md#kpu-ram-layout) and the main buffer.

Feature maps in KPU RAM are accessed through strided numpy views, so upload/download is a plain
array copy (no per-pixel index arithmetic).
"""
from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import as_strided

from tl2k210.errors import EmulatorError
from tl2k210.k210 import hardware as hw


class KpuRam:
    """KPU RAM. The map written last is also kept as an array: reading exactly that map back
    (what the next KPU layer does) returns it without a copy. Writes reach the bytes lazily:
    they are laid out into lines, in order, only when something reads other bytes (a different
    map, or raw access through ``mem``, which also forgets the last map: the caller may change
    bytes). A chain of KPU layers thus never pays for the line layout."""

    def __init__(self):
        self._mem = np.zeros(hw.KPU_RAM_BYTES, np.uint8)
        self._last = None   # (base_line, shape, array) of the latest write
        self._pending = []  # (base_line, array) written but not yet laid out, oldest first

    @property
    def mem(self) -> np.ndarray:
        self._flush()
        self._last = None
        return self._mem

    def _flush(self):
        for base_line, x in self._pending:
            self._store(base_line, x)
        self._pending.clear()

    @staticmethod
    def _check(base_line: int, c: int, h: int, w: int, where: str):
        lines = hw.map_lines(c, h, w)
        if base_line < 0 or base_line + lines > hw.KPU_RAM_LINES:
            raise EmulatorError(f"{where}: a {c}x{h}x{w} map at KPU line {base_line} needs {lines} "
                                f"lines, past the end of KPU RAM ({hw.KPU_RAM_LINES} lines)")

    def _groups(self, base_line: int, c: int, h: int, w: int, where: str):
        self._check(base_line, c, h, w, where)
        g, p, L = hw.row_layout(w)
        g = min(g, c)
        cg = -(-c // g)
        view = as_strided(self._mem[base_line * hw.LINE_BYTES:], shape=(cg, g, h, w),
                          strides=(L * h * hw.LINE_BYTES, p, L * hw.LINE_BYTES, 1))
        return view, g, cg

    def read(self, base_line: int, c: int, h: int, w: int, where: str = "KPU RAM") -> np.ndarray:
        """The (C, H, W) map at base_line; treat the result as read-only."""
        last = self._last
        if last is not None and last[0] == base_line and last[1] == (c, h, w):
            return last[2]
        self._flush()
        view, g, cg = self._groups(base_line, c, h, w, where)
        return view.reshape(cg * g, h, w)[:c].copy() if g > 1 else view[:, 0].copy()

    def write(self, base_line: int, x: np.ndarray, where: str = "KPU RAM"):
        """Store the (C, H, W) map at base_line; x must not change afterwards."""
        self._check(base_line, *x.shape, where)
        self._pending.append((base_line, x))
        self._last = (base_line, x.shape, x)

    def _store(self, base_line: int, x: np.ndarray):
        c, h, w = x.shape
        view, g, cg = self._groups(base_line, c, h, w, "KPU RAM")
        full = c // g
        view[:full] = x[:full * g].reshape(full, g, h, w)
        if full < cg:  # partial last group: write only the channels that exist
            view[full, :c - full * g] = x[full * g:]


class MainMemory:
    """The model's main working buffer (malloc'ed by the loader; +8 for DMA round-up)."""

    def __init__(self, size: int):
        self.size = size
        self.mem = np.zeros(size + 8, np.uint8)

    def _check(self, addr: int, nbytes: int, where: str):
        if addr < 0 or nbytes < 0 or addr + nbytes > self.mem.size:
            raise EmulatorError(f"{where}: main-memory access [{addr}, {addr + nbytes}) is outside "
                                f"the {self.size}-byte main buffer (corrupt model?)")

    def view(self, addr: int, count: int, dtype, where: str = "main memory") -> np.ndarray:
        dt = np.dtype(dtype)
        self._check(addr, count * dt.itemsize, where)
        return self.mem[addr:addr + count * dt.itemsize].view(dt)

    def read(self, addr, count, dtype, where="main memory") -> np.ndarray:
        return self.view(addr, count, dtype, where).copy()

    def write(self, addr: int, x: np.ndarray, where: str = "main memory"):
        b = np.ascontiguousarray(x).reshape(-1).view(np.uint8)
        self._check(addr, b.size, where)
        self.mem[addr:addr + b.size] = b


# Errors numpy raises when a file's values make no sense for a layer (a corrupt or hand-edited
# model that still parses): reported as EmulatorError naming the layer, never as a traceback.
_DATA_ERRORS = (ValueError, IndexError, KeyError, TypeError, OverflowError, MemoryError, ZeroDivisionError)


def guarded(fn, where, *args):
    try:
        return fn(*args)
    except EmulatorError:
        raise
    except _DATA_ERRORS as exc:
        raise EmulatorError(f"{where}: the values in this layer cannot be executed "
                            f"({type(exc).__name__}: {exc}); the kmodel is corrupt or uses a "
                            "variant the emulator does not know") from exc

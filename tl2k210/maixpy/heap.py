"""The MicroPython GC heap of the emulated board (docs/maixpy-firmware.md#gc-heap, #checklist).

The pool is the firmware's (518 144 bytes for the default 512 KiB heap, tl2k210/k210/firmware.py).
What the host can see of it is what takes most of it on a board: image pixel buffers
(`image.Image()`, copy, resize, cut, to_grayscale(copy=True) ...: w*h*2 for RGB565, w*h for
grayscale), AI buffers made by `pix_to_ai()` ((w rounded up to 64)*h*3), the tuples of floats
`fmap[:]` returns (each float a boxed 32-byte block + 8 bytes of tuple) and bytearrays the board
modules return; plus BASELINE for the interpreter's own objects after boot. Buffers are given back
when CPython frees the object, like MicroPython's GC would; a request that does not fit first
runs a collection, then raises MemoryError with the firmware's text. The script's other Python
objects (its lists, strings) are not counted: mem_free() is an upper bound of the board's.
"""
from __future__ import annotations

import gc as _gc
import weakref

BLOCK = 32
BASELINE = 22 * 1024     # modules, __main__ dict, the boot scripts' objects (memtest: ~490 KB free)
IMAGE_MSG = ("Out of normal MicroPython Heap Memory! Please reduce the resolution of the image "
             "you are running this algorithm on to bypass this issue!")


def blocks(nbytes: int) -> int:
    return (max(1, nbytes) + BLOCK - 1) // BLOCK * BLOCK


class Heap:
    def __init__(self, pool: int):
        self.pool = pool
        self.used = BASELINE
        self.peak = self.used

    def free(self) -> int:
        return max(0, self.pool - self.used)

    def alloc(self, nbytes: int, owner=None, image: bool = False, what: str = "") -> int:
        """Take `nbytes` (rounded to blocks); give them back when `owner` is freed."""
        n = blocks(nbytes)
        if n > self.free():
            _gc.collect()                      # MicroPython collects before giving up
        if n > self.free():
            raise MemoryError(IMAGE_MSG if image else
                              f"memory allocation failed, allocating {n} bytes")
        self.used += n
        self.peak = max(self.peak, self.used)
        if owner is not None:
            weakref.finalize(owner, self._release, n)
        return n

    def _release(self, n: int):
        self.used = max(BASELINE, self.used - n)

    def release(self, n: int):
        self._release(n)

    def float_tuple_bytes(self, n: int) -> int:
        return blocks(16 + 8 * n) + n * BLOCK

"""The emulated board behind the host MaixPy modules: its 16 MiB flash (a file, as the emulated
board of `tl2k210.flash` writes it), the camera's queue of input photos, the LCD's output, and
the `/sd` and `/flash` file systems mapped to host folders.

One `Board` is current at a time (`current()`); `run_script` installs a fresh one per run.

    board.use_flash("flash.bin")                  # or env TL2K210_FLASH
    board.flash_kfpkg("face.kfpkg", "flash.bin")  # "flash" a package into an image file
"""
from __future__ import annotations

import os
from pathlib import Path

from tl2k210.errors import Tl2k210Error

FLASH_SIZE = 16 * 1024 * 1024
ERASED = 0xFF


class StopDemo(BaseException):
    """Raised by `sensor.snapshot()` after the last input frame. A BaseException so that a
    script's own `except Exception:` does not swallow it; `run_script` catches it."""


class Board:
    def __init__(self, flash=None, images=(), out=None, max_frames=None, sd=None, fs=None, button=()):
        self.flash_path = Path(flash) if flash else (Path(os.environ["TL2K210_FLASH"])
                                                     if os.environ.get("TL2K210_FLASH") else None)
        self.images = list(images)
        self.max_frames = len(self.images) if max_frames is None else min(max_frames, len(self.images))
        self.frames_taken = 0
        self.out = Path(out) if out else None
        self.lcd_frames = []      # RGB888 HWC arrays, one per lcd.display()
        self.lcd_pngs = []        # paths written
        self.mounts = {"/sd": Path(sd) if sd else None, "/flash": Path(fs) if fs else None}
        self.kpu_tasks = []       # loaded kpu_net objects (MaixPy allows 5)
        self.notes = []           # host-side hints (why a MaixPy error happened)
        self.button = set(int(f) for f in button)   # camera frames (0-based) with BOOT held down

    def button_down(self) -> bool:
        """Is the scripted button (BOOT key) held down now, i.e. during the latest frame taken?"""
        return self.frames_taken - 1 in self.button

    # -- flash ---------------------------------------------------------------------------------
    def read_flash(self, address: int, length: int) -> bytes:
        """`length` bytes at `address`; a board without a flash file reads erased flash (0xFF)."""
        if address < 0 or address >= FLASH_SIZE:
            return b""
        length = max(0, min(length, FLASH_SIZE - address))
        if self.flash_path is None:
            if not any("no flash image" in n for n in self.notes):
                self.notes.append("no flash image is set (run_script(flash=...), "
                                  "board.use_flash(), --flash/--kfpkg or TL2K210_FLASH): the "
                                  "host flash reads as erased 0xFF")
            return bytes([ERASED]) * length
        try:
            with open(self.flash_path, "rb") as fh:
                fh.seek(address)
                data = fh.read(length)
        except OSError as exc:
            raise Tl2k210Error(f"cannot read flash image {self.flash_path}: {exc.strerror}") from None
        return data + bytes([ERASED]) * (length - len(data))

    # -- file systems --------------------------------------------------------------------------
    def host_path(self, path) -> Path:
        """Map a board path (/sd/x, /flash/x) to the host; other paths are host paths."""
        p = os.fspath(path)
        for mount, host in self.mounts.items():
            if host is not None and (p == mount or p.startswith(mount + "/")):
                return host / p[len(mount):].lstrip("/")
        return Path(p)


_current = Board()


def current() -> Board:
    return _current


def install(board: Board) -> Board:
    """Make `board` current; returns the previous one (to restore)."""
    global _current
    prev, _current = _current, board
    return prev


def use_flash(path):
    """Point the current board (and later `Board()`s via TL2K210_FLASH) at a flash image file."""
    _current.flash_path = Path(path) if path else None
    if path:
        os.environ["TL2K210_FLASH"] = os.fspath(path)
    else:
        os.environ.pop("TL2K210_FLASH", None)


def flash_kfpkg(kfpkg, flash_path, fresh: bool = True) -> Path:
    """Write a .kfpkg's images into a flash image file at their addresses, as kflash would
    (a fresh erased 16 MiB image unless `fresh` is False and the file exists)."""
    from tl2k210.flash.kfpkg import read_kfpkg
    return write_flash(flash_path, [(i.address, i.flash_bytes()) for i in read_kfpkg(kfpkg)], fresh)


def flash_kmodel(kmodel_path, flash_path, address=0x300000, fresh: bool = True) -> Path:
    """Write a raw kmodel at `address` (what a kfpkg with sha256Prefix false does)."""
    return write_flash(flash_path, [(address, Path(kmodel_path).read_bytes())], fresh)


def write_flash(flash_path, images, fresh: bool = True) -> Path:
    from tl2k210.flash.emulated_board import new_flash_file
    flash_path = Path(flash_path)
    if fresh or not flash_path.exists():
        new_flash_file(flash_path, FLASH_SIZE)
    with open(flash_path, "r+b") as fh:
        for address, data in images:
            if address < 0 or address + len(data) > FLASH_SIZE:
                raise Tl2k210Error(f"image of {len(data)} bytes at 0x{address:x} does not fit "
                                   f"in a {FLASH_SIZE >> 20} MiB flash")
            fh.seek(address)
            fh.write(data)
    return flash_path

"""MaixPy `lcd` module on the host: every `lcd.display(img)` becomes a frame (kept in memory)
and, when the board has an output path, a PNG.

Output naming: `out` a folder -> `frame_0000.png`, `frame_0001.png`...; `out` a `.png` file ->
the first frame there, later ones as `NAME-1.png`, `NAME-2.png`...
"""
from __future__ import annotations

import io

import numpy as np
from PIL import Image as _PIL

from tl2k210.maixpy import board as _board
from tl2k210.maixpy import image as _image

BLACK, WHITE, RED, GREEN, BLUE = 0x0000, 0xFFFF, 0xF800, 0x07E0, 0x001F


class _State:
    def __init__(self):
        self.inited = False
        self.w, self.h = 320, 240
        self.rot = 0
        self.mirror = False
        self.fb = None


_s = _State()


def init(type=1, freq=15000000, color=BLACK, invert=0, lcd_type=0, width=320, height=240, **kw):
    global _s
    _s = _State()
    _s.inited = True
    _s.w, _s.h = int(width), int(height)
    clear(color)


def deinit():
    _s.inited = False


def width():
    return _s.h if _s.rot % 2 else _s.w


def height():
    return _s.w if _s.rot % 2 else _s.h


def rotation(r=None):
    if r is None:
        return _s.rot
    _s.rot = int(r) & 3
    return _s.rot


def mirror(m=None):
    if m is None:
        return _s.mirror
    _s.mirror = bool(m)
    return _s.mirror


def direction(d=None):
    return 0


def freq(f=None):
    return 15000000


def set_backlight(v=None):
    return 100


def clear(color=BLACK):
    img = _image.Image(size=(width(), height()))
    if color:
        img.draw_rectangle(0, 0, img.width(), img.height(), color=color, fill=True)
    _s.fb = img.to_rgb888()


def draw_string(x, y, text, color=WHITE, bg_color=BLACK):
    img = _image.Image._from(_s.fb.copy() if _s.fb is not None else
                             np.zeros((height(), width(), 3), np.uint8), _image.RGB565)
    img.draw_string(x, y, text, color=color)
    _s.fb = img.to_rgb888()
    _emit(_s.fb)


def display(img, roi=None, oft=None):
    if not _s.inited:
        raise OSError("lcd not initialised: call lcd.init() first (host LCD)")
    if roi is not None:
        img = img.copy(roi)
    _s.fb = img.to_rgb888()
    _emit(_s.fb)


def _emit(rgb: np.ndarray):
    b = _board.current()
    b.lcd_frames.append(rgb.copy())
    if b.out is None:
        return
    k = len(b.lcd_frames) - 1
    if b.out.suffix.lower() == ".png":
        path = b.out if k == 0 else b.out.with_name(f"{b.out.stem}-{k}{b.out.suffix}")
    else:
        b.out.mkdir(parents=True, exist_ok=True)
        path = b.out / f"frame_{k:04d}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    _PIL.fromarray(rgb).save(buf, format="PNG")
    from tl2k210.k210.kmodel import atomic_write
    atomic_write(path, buf.getvalue())
    b.lcd_pngs.append(path)

"""MaixPy `image` module on the host (OpenMV semantics, the subset MaixPy scripts use).

An RGB565 image keeps its pixels on the RGB565 lattice (each value is what MaixPy's
COLOR_R5_TO_R8 expansion gives), so `get_pixel`, drawing and `pix_to_ai` see what a board sees.
Like the board, an image carries a separate planar RGB888 "AI buffer" for the KPU: the camera
fills it at `snapshot()`, `img.pix_to_ai()` refreshes it; drawing or resizing does not.
"""
from __future__ import annotations

import numpy as np
from PIL import Image as _PIL
from PIL import ImageDraw as _Draw

from tl2k210.imaging import rgb565_roundtrip
from tl2k210.maixpy import board as _board

GRAYSCALE = 1   # OpenMV PIXFORMAT values (sensor.GRAYSCALE / sensor.RGB565)
RGB565 = 2
_DEFAULT_COLOR = (255, 255, 255)


def _lattice(rgb: np.ndarray) -> np.ndarray:
    return rgb565_roundtrip(np.asarray(rgb, np.uint8))


def _gray(rgb: np.ndarray) -> np.ndarray:
    """OpenMV COLOR_RGB888_TO_Y: (r*38 + g*75 + b*15) >> 7."""
    r, g, b = (rgb[..., i].astype(np.int32) for i in range(3))
    return ((r * 38 + g * 75 + b * 15) >> 7).astype(np.uint8)


class Image:
    """`image.Image(path)` loads a file (board paths /sd, /flash are mapped);
    `image.Image(size=(w, h))` / `image.Image()` makes a black 320x240 RGB565 image."""

    def __init__(self, path=None, size=None, copy_to_fb=False):
        self._ai = None
        if path is not None:
            host = _board.current().host_path(path)
            try:
                rgb = np.asarray(_PIL.open(host).convert("RGB"), np.uint8)
            except (OSError, ValueError):
                raise OSError(f"Could not open file '{path}'") from None   # OpenMV wording
            self._px, self._fmt = _lattice(rgb), RGB565
        else:
            w, h = size or (320, 240)
            self._px, self._fmt = np.zeros((h, w, 3), np.uint8), RGB565

    @classmethod
    def _from(cls, px: np.ndarray, fmt: int, ai=None) -> "Image":
        img = cls.__new__(cls)
        img._px, img._fmt, img._ai = px, fmt, ai
        return img

    @classmethod
    def from_rgb(cls, rgb: np.ndarray, fmt: int = RGB565) -> "Image":
        """Host helper: an image from an HWC RGB888 array, through the sensor's pixel format."""
        rgb = np.asarray(rgb, np.uint8)
        return cls._from(_gray(rgb) if fmt == GRAYSCALE else _lattice(rgb), fmt)

    # -- properties ----------------------------------------------------------------------------
    def width(self):
        return int(self._px.shape[1])

    def height(self):
        return int(self._px.shape[0])

    def format(self):
        return self._fmt

    def size(self):
        return self.width() * self.height() * (2 if self._fmt == RGB565 else 1)

    def __repr__(self):
        fmt = "rgb565" if self._fmt == RGB565 else "grayscale"
        return f'{{"w":{self.width()}, "h":{self.height()}, "type"="{fmt}", "size":{self.size()}}}'

    def to_rgb888(self) -> np.ndarray:
        """Host helper: HWC uint8 RGB as an LCD shows it."""
        return np.repeat(self._px[..., None], 3, 2) if self._fmt == GRAYSCALE else self._px.copy()

    # -- pixels --------------------------------------------------------------------------------
    def _color(self, color):
        if color is None:
            color = _DEFAULT_COLOR
        if isinstance(color, int):   # RGB565 int or gray value
            if self._fmt == GRAYSCALE:
                return np.uint8(color & 0xFF)
            color = ((color >> 8) & 0xF8, (color >> 3) & 0xFC, (color << 3) & 0xF8)
        rgb = np.asarray(color, np.uint8).reshape(1, 1, 3)
        return _gray(rgb)[0, 0] if self._fmt == GRAYSCALE else _lattice(rgb)[0, 0]

    def get_pixel(self, x, y=None, rgbtuple=True):
        if y is None:
            x, y = x
        if not (0 <= x < self.width() and 0 <= y < self.height()):
            return None
        v = self._px[y, x]
        return int(v) if self._fmt == GRAYSCALE else tuple(int(c) for c in v)

    def set_pixel(self, x, y, color=None):
        if 0 <= x < self.width() and 0 <= y < self.height():
            self._px[y, x] = self._color(color)
        return self

    def clear(self):
        self._px[...] = 0
        return self

    # -- drawing (in place, returns the image like OpenMV) -------------------------------------
    def draw_rectangle(self, x, y=None, w=None, h=None, color=None, thickness=1, fill=False):
        if y is None:
            x, y, w, h = x
        x, y, w, h = int(x), int(y), int(w), int(h)
        c = self._color(color)
        H, W = self.height(), self.width()

        def paint(x0, y0, x1, y1):   # inclusive-exclusive, clipped
            x0, y0, x1, y1 = max(0, x0), max(0, y0), min(W, x1), min(H, y1)
            if x0 < x1 and y0 < y1:
                self._px[y0:y1, x0:x1] = c

        if fill:
            paint(x, y, x + w, y + h)
            return self
        t = max(1, int(thickness))
        paint(x, y, x + w, y + t)
        paint(x, y + h - t, x + w, y + h)
        paint(x, y, x + t, y + h)
        paint(x + w - t, y, x + w, y + h)
        return self

    def draw_line(self, x0, y0=None, x1=None, y1=None, color=None, thickness=1):
        if y0 is None:
            x0, y0, x1, y1 = x0
        return self._pil_draw(lambda d, c: d.line([x0, y0, x1, y1], fill=c, width=int(thickness)))

    def draw_circle(self, x, y=None, r=None, color=None, thickness=1, fill=False):
        if y is None:
            x, y, r = x
        box = [x - r, y - r, x + r, y + r]
        return self._pil_draw(lambda d, c: d.ellipse(box, outline=c, width=int(thickness),
                                                     fill=c if fill else None))

    def draw_cross(self, x, y=None, color=None, size=5, thickness=1):
        if y is None:
            x, y = x
        self.draw_line(x - size, y, x + size, y, color, thickness)
        return self.draw_line(x, y - size, x, y + size, color, thickness)

    def draw_string(self, x, y, text, color=None, scale=1, x_spacing=0, y_spacing=0,
                    mono_space=True):
        """Text in PIL's bitmap font (the board's is a 8x10 OpenMV font), scaled by `scale`."""
        text = str(text)
        lines = text.split("\n")
        probe = _Draw.Draw(_PIL.new("L", (1, 1)))
        tw = max(1, max(int(probe.textlength(ln)) for ln in lines) + 1)
        th = 11 * len(lines)
        mask = _PIL.new("L", (tw, th), 0)
        _Draw.Draw(mask).multiline_text((0, 0), text, fill=255, spacing=1)
        s = max(1, int(round(scale)))
        m = np.asarray(mask.resize((tw * s, th * s), _PIL.NEAREST)) > 127
        x, y = int(x), int(y)
        H, W = self.height(), self.width()
        y0, x0 = max(0, y), max(0, x)
        y1, x1 = min(H, y + m.shape[0]), min(W, x + m.shape[1])
        if y0 < y1 and x0 < x1:
            region = self._px[y0:y1, x0:x1]
            region[m[y0 - y:y1 - y, x0 - x:x1 - x]] = self._color(color)
        return self

    def _pil_draw(self, fn, color=None):
        pil = _PIL.fromarray(self._px)
        c = self._color(color)
        fn(_Draw.Draw(pil), int(c) if self._fmt == GRAYSCALE else tuple(int(v) for v in c))
        self._px = np.asarray(pil, np.uint8).copy()
        return self

    # -- geometry / format ---------------------------------------------------------------------
    def resize(self, w, h):
        """A new image of w x h (MaixPy's resize allocates a new image; bilinear)."""
        pil = _PIL.fromarray(self._px).resize((int(w), int(h)), _PIL.BILINEAR)
        px = np.asarray(pil, np.uint8)
        return Image._from(px if self._fmt == GRAYSCALE else _lattice(px), self._fmt)

    def copy(self, roi=None, copy_to_fb=False):
        if roi is None:
            return Image._from(self._px.copy(), self._fmt)
        x, y, w, h = (int(v) for v in roi)
        return Image._from(self._px[y:y + h, x:x + w].copy(), self._fmt)

    def cut(self, x, y, w, h):
        return self.copy((x, y, w, h))

    crop = cut

    def to_grayscale(self, copy=False):
        img = Image._from(self._px.copy(), self._fmt) if copy else self
        if img._fmt == RGB565:
            img._px, img._fmt = _gray(img._px), GRAYSCALE
        return img

    def to_rgb565(self, copy=False):
        img = Image._from(self._px.copy(), self._fmt) if copy else self
        if img._fmt == GRAYSCALE:
            img._px, img._fmt = _lattice(np.repeat(img._px[..., None], 3, 2)), RGB565
        return img

    def pix_to_ai(self):
        """Fill the AI buffer (planar RGB888, or the gray plane) from the current pixels."""
        px = self._px
        self._ai = np.ascontiguousarray(px[None] if self._fmt == GRAYSCALE else px.transpose(2, 0, 1))
        return None

    def ai_buffer(self):
        """Host helper: the planar uint8 buffer the KPU would read, or None if never filled."""
        return self._ai

    def save(self, path, roi=None, quality=50):
        host = _board.current().host_path(path)
        img = self if roi is None else self.copy(roi)
        try:
            _PIL.fromarray(img.to_rgb888()).save(host)
        except (OSError, ValueError) as exc:
            raise OSError(f"Could not open file '{path}': {exc}") from None
        return self


def load_file(path) -> Image:
    """Host helper: a photo as the camera would hand it over (RGB565)."""
    return Image(path)

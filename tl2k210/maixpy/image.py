"""MaixPy `image` module on the host (OpenMV-derived; docs/maixpy-firmware.md#image).

Pixels: an RGB565 image keeps them on the RGB565 lattice as (H, W, 3) uint8 (each value what
COLOR_R5_TO_R8 expands to), a grayscale image as (H, W) uint8, so `get_pixel`, drawing and
`pix_to_ai` see what a board sees. An image may carry a separate planar "AI buffer" for the KPU:
the camera fills it at `snapshot()`, `pix_to_ai()` rebuilds it; drawing on an RGB565 image does not
change it (in GRAYSCALE snapshots the pixels ARE the AI buffer's Y plane, as on a board).

Arguments follow the firmware (args.py): geometry as ints or one tuple, keywords override
positional slots, unknown keywords are ignored (one host note each), ints reject floats, `scale`
is a float, colours are raw byte-swapped RGB565 ints (`lcd.RED` = 0x00F8) or (r, g, b) tuples.
Buffers come from the board's GC heap (heap.py) - camera frames do not. Each call advances the
board clock by its documented cost (timing.py).

`image.Image` is a function on a board (`isinstance(x, image.Image)` raises TypeError); the type
is `Image` (`type(x).__name__ == 'Image'`). The host helpers here (`Image._from_rgb`,
`Image._ai_buffer`, `Image._to_rgb888`, RGB565/GRAYSCALE) are not in the board's module.
"""
from __future__ import annotations

import errno as _errno
import math

import numpy as np

from tl2k210.imaging import rgb565_roundtrip
from tl2k210.maixpy import args as A
from tl2k210.maixpy import board as _board
from tl2k210.maixpy import font as _font
from tl2k210.maixpy import timing
from tl2k210.maixpy.vfs import oserror

BAYER, RGB565, YUV422, GRAYSCALE, JPEG = 1, 2, 3, 4, 5


def _lattice(rgb: np.ndarray) -> np.ndarray:
    return rgb565_roundtrip(np.asarray(rgb, np.uint8))


def _gray(rgb: np.ndarray) -> np.ndarray:
    """OpenMV COLOR_RGB888_TO_Y: (r*38 + g*75 + b*15) >> 7."""
    r, g, b = (rgb[..., i].astype(np.int32) for i in range(3))
    return ((r * 38 + g * 75 + b * 15) >> 7).astype(np.uint8)


def _cost(pixels=0):
    _board.current().clock.advance(timing.draw_us(pixels))


class _NoHeap:
    """Images made outside a Session (host helpers) are not accounted."""

    def alloc(self, *a, **k):
        return 0


def _heap():
    return _board.current().gc or _NoHeap()


_NOT_SUPPORTED = "Image format is not supported!"


class Image:
    """The board's image type. Create with the module's `Image(...)` function, `_from_rgb`."""

    def __init__(self, px: np.ndarray, fmt: int, ai=None, fb=False, jpeg: bytes | None = None):
        self._px, self._fmt, self._ai, self._fb, self._jpeg = px, fmt, ai, fb, jpeg
        self._texts = []          # (x, y, text) drawn, for the host's screen log
        if not fb:
            _heap().alloc(self.size() if jpeg is None else len(jpeg), owner=self, image=True)

    # -- host helpers --------------------------------------------------------------------------
    @classmethod
    def _from(cls, px: np.ndarray, fmt: int, ai=None) -> "Image":
        return cls(px, fmt, ai)

    @classmethod
    def _from_rgb(cls, rgb: np.ndarray, fmt: int = RGB565) -> "Image":
        """Host helper: an image from an HWC RGB888 array, through the sensor's pixel format."""
        rgb = np.asarray(rgb, np.uint8)
        return cls._from(_gray(rgb) if fmt == GRAYSCALE else _lattice(rgb), fmt)

    def _ai_buffer(self):
        """Host helper: the planar uint8 buffer the KPU would read, or None."""
        return self._ai

    def _to_rgb888(self) -> np.ndarray:
        """Host helper: HWC uint8 RGB as an LCD shows it."""
        if self._fmt == JPEG:
            self._decode()
        if self._fmt == GRAYSCALE:
            return np.repeat(self._px[..., None], 3, 2)
        return self._px.copy()

    @property
    def _gray_img(self):
        return self._fmt == GRAYSCALE

    def _check_mutable(self):
        if self._fmt == JPEG:
            raise OSError(_NOT_SUPPORTED)

    def _decode(self):
        if self._fmt == JPEG and self._jpeg is not None:
            import io

            from PIL import Image as P
            self._px = _lattice(np.asarray(P.open(io.BytesIO(self._jpeg)).convert("RGB")))
            self._fmt, self._jpeg = RGB565, None

    # -- properties ----------------------------------------------------------------------------
    def width(self):
        return int(self._px.shape[1])

    def height(self):
        return int(self._px.shape[0])

    def format(self):
        return self._fmt

    def bpp(self):
        return {RGB565: 2, GRAYSCALE: 1}.get(self._fmt, 0)

    def size(self):
        if self._fmt == JPEG:
            return len(self._jpeg or b"")
        return self.width() * self.height() * (1 if self._gray_img else 2)

    def __repr__(self):
        fmt = {RGB565: "rgb565", GRAYSCALE: "grayscale", JPEG: "jpeg"}.get(self._fmt, "?")
        return f'{{"w":{self.width()}, "h":{self.height()}, "type"="{fmt}", "size":{self.size()}}}'

    def __len__(self):
        raise TypeError("object of type 'Image' has no len()")

    def __iter__(self):
        raise TypeError("'Image' object isn't iterable")

    def __bytes__(self):
        if self._fmt == JPEG:
            return bytes(self._jpeg)
        if self._gray_img:
            return self._px.tobytes()
        raw = self._raw565()
        return raw.astype("<u2").tobytes()

    def to_bytes(self):
        return bytes(self)

    def _raw565(self):
        p = self._px.astype(np.uint16)
        s = ((p[..., 0] >> 3) << 11) | ((p[..., 1] >> 2) << 5) | (p[..., 2] >> 3)
        return ((s & 0xFF) << 8) | (s >> 8)

    def __getitem__(self, i):
        flat = self._px.reshape(-1) if self._gray_img else self._px.reshape(-1, 3)
        if isinstance(i, slice):
            if i.step not in (None, 1):
                raise OSError("only slices with step=1 (aka None) are supported")
            return tuple(self._pix_value(v) for v in flat[i])
        return self._pix_value(flat[A.get_int(i)])

    def __setitem__(self, i, v):
        flat = self._px.reshape(-1) if self._gray_img else self._px.reshape(-1, 3)
        flat[A.get_int(i)] = A.color(v, self._gray_img)

    def _pix_value(self, v):
        return int(v) if self._gray_img else tuple(int(c) for c in v)

    # -- pixels --------------------------------------------------------------------------------
    def get_pixel(self, *args, **kwargs):
        A.ignore_unknown("Image.get_pixel", kwargs, {"rgbtuple"})
        (x, y), nxt = A.consume_array(args, 0, 2)
        rgbtuple = A.kw(args, kwargs, "rgbtuple", nxt, not self._gray_img)
        _cost(1)
        if not (0 <= x < self.width() and 0 <= y < self.height()):
            return None
        v = self._px[y, x]
        if self._gray_img:
            return int(v)
        if rgbtuple:
            return tuple(int(c) for c in v)
        return A.rgb_to_raw565(*(int(c) for c in v))

    def set_pixel(self, *args, **kwargs):
        A.ignore_unknown("Image.set_pixel", kwargs, {"color"})
        self._check_mutable()
        (x, y), nxt = A.consume_array(args, 0, 2)
        c = A.color(A.kw(args, kwargs, "color", nxt, -1), self._gray_img)
        _cost(1)
        if 0 <= x < self.width() and 0 <= y < self.height():
            self._px[y, x] = c
        return self

    def clear(self, *args, **kwargs):
        A.ignore_unknown("Image.clear", kwargs, {"mask"})
        self._px[...] = 0
        _cost(self.width() * self.height())
        return self

    # -- drawing (in place, returns the image) -------------------------------------------------
    def _paint(self, x0, y0, x1, y1, c):
        """Fill [x0, x1] x [y0, y1] inclusive, clipped."""
        H, W = self.height(), self.width()
        x0, y0, x1, y1 = max(0, x0), max(0, y0), min(W - 1, x1), min(H - 1, y1)
        if x0 <= x1 and y0 <= y1:
            self._px[y0:y1 + 1, x0:x1 + 1] = c
            return (x1 - x0 + 1) * (y1 - y0 + 1)
        return 0

    def _point_fill(self, cx, cy, r0, r1, c):
        return self._paint(cx + r0, cy + r0, cx + r1, cy + r1, c)

    def _line(self, x0, y0, x1, y1, c, t):
        """Bresenham; thickness t paints a t x t square at each point (OpenMV point_fill)."""
        t0, t1 = -((t - 1) // 2), t // 2
        dx, dy = abs(x1 - x0), abs(y1 - y0)
        sx, sy = (1 if x0 < x1 else -1), (1 if y0 < y1 else -1)
        err = (dx if dx > dy else -dy) // 2
        n = 0
        while True:
            n += self._point_fill(x0, y0, t0, t1, c) if t > 1 else self._paint(x0, y0, x0, y0, c)
            if x0 == x1 and y0 == y1:
                break
            e2 = err
            if e2 > -dx:
                err -= dy
                x0 += sx
            if e2 < dy:
                err += dx
                y0 += sy
        return n

    def draw_line(self, *args, **kwargs):
        A.ignore_unknown("Image.draw_line", kwargs, {"color", "thickness"})
        self._check_mutable()
        (x0, y0, x1, y1), nxt = A.consume_array(args, 0, 4)
        c = A.color(A.kw(args, kwargs, "color", nxt, -1), self._gray_img)
        t = A.get_int(A.kw(args, kwargs, "thickness", nxt + 1, 1))
        _cost(self._line(x0, y0, x1, y1, c, t) if t > 0 else 0)
        return self

    def draw_rectangle(self, *args, **kwargs):
        A.ignore_unknown("Image.draw_rectangle", kwargs, {"color", "thickness", "fill"})
        self._check_mutable()
        (rx, ry, rw, rh), nxt = A.consume_array(args, 0, 4)
        c = A.color(A.kw(args, kwargs, "color", nxt, -1), self._gray_img)
        t = A.get_int(A.kw(args, kwargs, "thickness", nxt + 1, 1))
        fill = A.get_int(A.kw(args, kwargs, "fill", nxt + 2, False))
        n = 0
        if fill:
            n = self._paint(rx, ry, rx + rw - 1, ry + rh - 1, c)
        elif t > 0:
            t0, t1 = t // 2, (t - 1) // 2
            for x0, y0, x1, y1 in ((rx - t0, ry, rx + rw + t1 - 1, ry),
                                   (rx - t0, ry + rh - 1, rx + rw + t1 - 1, ry + rh - 1),
                                   (rx, ry - t0, rx, ry + rh + t1 - 1),
                                   (rx + rw - 1, ry - t0, rx + rw - 1, ry + rh + t1 - 1)):
                n += self._paint(x0 - t0, y0 - t0, x1 + t1, y1 + t1, c)
        _cost(n)
        return self

    def draw_circle(self, *args, **kwargs):
        A.ignore_unknown("Image.draw_circle", kwargs, {"color", "thickness", "fill"})
        self._check_mutable()
        (cx, cy, r), nxt = A.consume_array(args, 0, 3)
        c = A.color(A.kw(args, kwargs, "color", nxt, -1), self._gray_img)
        t = A.get_int(A.kw(args, kwargs, "thickness", nxt + 1, 1))
        fill = A.get_int(A.kw(args, kwargs, "fill", nxt + 2, False))
        yy, xx = np.ogrid[:self.height(), :self.width()]
        d2 = (xx - cx) ** 2 + (yy - cy) ** 2
        if fill:
            m = d2 <= r * r
        elif t > 0:
            t0, t1 = t // 2, (t - 1) // 2
            lo, hi = max(0, r - t0 - 0.5), r + t1 + 0.5
            m = (d2 >= lo * lo) & (d2 <= hi * hi)
        else:
            m = np.zeros_like(d2, bool)
        self._px[m] = c
        _cost(int(m.sum()))
        return self

    def draw_ellipse(self, *args, **kwargs):
        A.ignore_unknown("Image.draw_ellipse", kwargs, {"color", "thickness", "fill", "rotation"})
        self._check_mutable()
        (cx, cy, rx, ry), nxt = A.consume_array(args, 0, 4)
        rot = A.get_int(A.kw(args, kwargs, "rotation", nxt, 0))
        c = A.color(A.kw(args, kwargs, "color", nxt + 1, -1), self._gray_img)
        t = A.get_int(A.kw(args, kwargs, "thickness", nxt + 2, 1))
        fill = A.get_int(A.kw(args, kwargs, "fill", nxt + 3, False))
        yy, xx = np.ogrid[:self.height(), :self.width()]
        a = math.radians(rot)
        u = (xx - cx) * math.cos(a) + (yy - cy) * math.sin(a)
        v = -(xx - cx) * math.sin(a) + (yy - cy) * math.cos(a)
        q = (u / max(rx, 1e-9)) ** 2 + (v / max(ry, 1e-9)) ** 2
        if fill:
            m = q <= 1
        else:
            inner = ((u / max(rx - t, 1e-9)) ** 2 + (v / max(ry - t, 1e-9)) ** 2) if min(rx, ry) > t else np.inf
            m = (q <= 1) & (inner > 1)
        self._px[m] = c
        _cost(int(np.sum(m)))
        return self

    def draw_cross(self, *args, **kwargs):
        A.ignore_unknown("Image.draw_cross", kwargs, {"color", "size", "thickness"})
        self._check_mutable()
        (x, y), nxt = A.consume_array(args, 0, 2)
        c = A.color(A.kw(args, kwargs, "color", nxt, -1), self._gray_img)
        size = A.get_int(A.kw(args, kwargs, "size", nxt + 1, 5))
        t = A.get_int(A.kw(args, kwargs, "thickness", nxt + 2, 1))
        n = self._line(x - size, y, x + size, y, c, t) + self._line(x, y - size, x, y + size, c, t)
        _cost(n)
        return self

    def draw_arrow(self, *args, **kwargs):
        A.ignore_unknown("Image.draw_arrow", kwargs, {"color", "size", "thickness"})
        self._check_mutable()
        (x0, y0, x1, y1), nxt = A.consume_array(args, 0, 4)
        c = A.color(A.kw(args, kwargs, "color", nxt, -1), self._gray_img)
        size = A.get_int(A.kw(args, kwargs, "size", nxt + 1, 10))
        t = A.get_int(A.kw(args, kwargs, "thickness", nxt + 2, 1))
        n = self._line(x0, y0, x1, y1, c, t)
        ang = math.atan2(y1 - y0, x1 - x0)
        for da in (math.pi * 3 / 4, -math.pi * 3 / 4):
            n += self._line(x1, y1, int(round(x1 + size * math.cos(ang + da))),
                            int(round(y1 + size * math.sin(ang + da))), c, t)
        _cost(n)
        return self

    def draw_string(self, *args, **kwargs):
        known = {"color", "scale", "x_spacing", "y_spacing", "mono_space", "char_rotation",
                 "char_hmirror", "char_vflip", "string_rotation", "string_hmirror", "string_vflip"}
        A.ignore_unknown("Image.draw_string", kwargs, known)
        self._check_mutable()
        (x, y), nxt = A.consume_array(args, 0, 2)
        if nxt >= len(args):
            raise TypeError("function missing 1 required positional arguments")
        text = args[nxt]
        # font.c imlib_draw_string reads it with mp_obj_str_get_str (ASCII font) or as UTF-8
        # bytes (font_load'ed UTF8 font): a str or a bytes object, bytes drawn as they are
        if isinstance(text, bytes):
            text = text.decode("utf-8", "surrogateescape")
        if not isinstance(text, str):     # py/objstr.c bad_implicit_conversion
            raise TypeError(f"can't convert '{A.type_name(text)}' object to str implicitly")
        c = A.color(A.kw(args, kwargs, "color", nxt + 1, -1), self._gray_img)
        scale = A.get_float(A.kw(args, kwargs, "scale", nxt + 2, 1.0))
        if not scale > 0:
            raise OSError("Error: 0 < scale!")
        x_sp = A.get_int(A.kw(args, kwargs, "x_spacing", nxt + 3, 0))
        y_sp = A.get_int(A.kw(args, kwargs, "y_spacing", nxt + 4, 2))
        mono = A.get_int(A.kw(args, kwargs, "mono_space", nxt + 5, False))
        n = self._text(x, y, text, c, scale, x_sp, y_sp, mono)
        self._texts.append((x, y, text))
        _cost(n)
        return self

    def draw_font(self, *args, **kwargs):
        """py_image.c py_image_draw_font + font.c imlib_draw_font (v0.6.2): draw_font(x, y,
        w, h, font[, color, scale]) draws one w x h bitmap glyph (w a multiple of 8 up to 32,
        len(font) == w/8 * h/8 * 8); row y reads byte int(y/scale) and, for each further
        8 rows of h, the byte h further on (the firmware's 8-column bands), bit w-1-int(x/scale)
        set = a pixel (fast_roundf truncates)."""
        A.ignore_unknown("Image.draw_font", kwargs, {"color", "scale"})
        self._check_mutable()
        if args and isinstance(args[0], (tuple, list)):
            vec, nxt = list(args[0]), 1
        else:
            vec, nxt = list(args[:5]), 5
        if len(vec) < 5:
            raise OSError("Not enough positional arguments!")
        x, y, fw, fh = (A.get_int(v) for v in vec[:4])
        font = vec[4]
        if isinstance(font, str):
            font = font.encode()
        elif not isinstance(font, (bytes, bytearray)):
            raise TypeError(f"can't convert {A.type_name(font)} to str")
        font = bytes(font)
        if not (fw % 8 == 0 and fw <= 32):
            raise OSError("Error: font arg_w_font %% 8 == 0 && arg_w_font <= 32!")  # sic
        if (fw // 8) * (fh // 8) * 8 != len(font):
            raise OSError("Error: font (arg_w_font / 8) * (arg_h_font / 8) * 8 == font_len!")
        c = A.color(A.kw(args, kwargs, "color", nxt, -1), self._gray_img)
        scale = np.float32(A.get_float(A.kw(args, kwargs, "scale", nxt + 1, 1.0)))
        if not scale > 0:
            raise OSError("Error: 0 < scale!")
        fh8, fw8 = fh & 0xFF, fw & 0xFF                  # uint8_t font_h, font_w
        hh, ww = int(np.float32(fh8) * scale), int(np.float32(fw8) * scale)
        data = font + bytes(4 * max(1, fh8))             # the C reads on past a short font
        mask = np.zeros((max(hh, 0), max(ww, 0)), bool)
        for yy in range(hh):
            pos = int(np.float32(yy) / scale) & 0xFF
            tmp = data[pos]
            for i in range(1, fh8 // 8):
                tmp = ((tmp << 8) | data[pos + i * fh8]) & 0xFFFFFFFF
            for xx in range(ww):
                bit = fw8 - 1 - int(np.float32(xx) / scale)
                mask[yy, xx] = bit >= 0 and bool(tmp >> bit & 1)
        _cost(self._blit(x, y, mask, c))
        return self

    def _text(self, x, y, text, c, scale, x_sp, y_sp, mono):
        gw, gh = int(round(_font.W * scale)), int(round(_font.H * scale))
        ox, oy, n = x, y, 0
        data = text.encode("utf-8", "surrogateescape")
        i = 0
        while i < len(data):
            ch = data[i]
            i += 1
            if ch in (10, 13):
                if ch == 13 and i < len(data) and data[i] == 10:
                    i += 1
                ox, oy = x, oy + gh + y_sp
                continue
            g = _font.glyph(chr(ch) if 32 <= ch <= 126 else "\x00")
            cols = _font.columns(g)
            if not mono and cols is None:
                ox += int(round(3 * scale)) + x_sp
                continue
            shift = 0 if mono or cols is None else cols[0]
            ys = (np.arange(gh) * _font.H // gh)
            xs = (np.arange(gw) * _font.W // gw)
            mask = g[ys][:, xs]
            if not mono:
                mask = mask[:, int(round(shift * scale)):]
            n += self._blit(ox, oy, mask, c)
            if mono:
                ox += gw + x_sp
            else:
                ox += int(round((cols[1] - cols[0] + 2) * scale)) + x_sp
        return n

    def _blit(self, x, y, mask, c):
        H, W = self.height(), self.width()
        h, w = mask.shape
        x0, y0, x1, y1 = max(0, x), max(0, y), min(W, x + w), min(H, y + h)
        if x0 >= x1 or y0 >= y1:
            return 0
        m = mask[y0 - y:y1 - y, x0 - x:x1 - x]
        self._px[y0:y1, x0:x1][m] = c
        return int(m.sum())

    def draw_image(self, *args, **kwargs):
        A.ignore_unknown("Image.draw_image", kwargs, {"x_scale", "y_scale", "alpha", "mask"})
        self._check_mutable()
        if not args or not isinstance(args[0], Image):
            raise TypeError("Can't convert <class 'type'> to type")
        src = args[0]
        (x, y), nxt = A.consume_array(args, 1, 2)
        xs = A.get_float(A.kw(args, kwargs, "x_scale", nxt, 1.0))
        ys = A.get_float(A.kw(args, kwargs, "y_scale", nxt + 1, 1.0))
        alpha = A.get_int(A.kw(args, kwargs, "alpha", nxt + 2, 256))
        mask = A.kw(args, kwargs, "mask", nxt + 3, None)
        if xs < 0 or ys < 0:
            raise OSError("Error: 0 <= x_scale!")
        if not 0 <= alpha <= 256:
            raise OSError("Error: 0 <= alpha <= 256!")
        sw, sh = int(src.width() * xs), int(src.height() * ys)
        if sw <= 0 or sh <= 0:
            return self
        iy = (np.arange(sh) * src.height() // sh)
        ix = (np.arange(sw) * src.width() // sw)
        pix = src._to_rgb888()[iy][:, ix] if not self._gray_img else \
            (src._px if src._gray_img else _gray(src._px))[iy][:, ix]
        if not self._gray_img:
            pix = _lattice(pix)
        m = None
        if isinstance(mask, Image):
            m = (mask._to_rgb888()[iy % mask.height()][:, ix % mask.width()].max(-1) > 0)
        H, W = self.height(), self.width()
        x0, y0, x1, y1 = max(0, x), max(0, y), min(W, x + sw), min(H, y + sh)
        if x0 < x1 and y0 < y1:
            part = pix[y0 - y:y1 - y, x0 - x:x1 - x]
            dst = self._px[y0:y1, x0:x1]
            if alpha < 256:
                part = ((part.astype(np.int32) * alpha + dst.astype(np.int32) * (256 - alpha)) >> 8)
                part = part.astype(np.uint8) if self._gray_img else _lattice(part.astype(np.uint8))
            if m is not None:
                mm = m[y0 - y:y1 - y, x0 - x:x1 - x]
                dst[mm] = part[mm]
            else:
                dst[...] = part
            _cost((x1 - x0) * (y1 - y0))
        return self

    # -- geometry / format ---------------------------------------------------------------------
    def _roi(self, roi):
        if roi is None:
            return 0, 0, self.width(), self.height()
        x, y, w, h = (A.get_int(v) for v in A.seq(roi, 4))
        x0, y0 = max(0, x), max(0, y)
        x1, y1 = min(self.width(), x + w), min(self.height(), y + h)
        if w <= 0 or h <= 0:
            raise OSError("Invalid ROI dimensions!")
        if x0 >= x1 or y0 >= y1:
            raise OSError("ROI does not overlap on the image!")
        return x0, y0, x1 - x0, y1 - y0

    def _scaled(self, roi, xs, ys):
        x, y, w, h = self._roi(roi)
        nw, nh = int(w * xs), int(h * ys)
        if nw <= 0 or nh <= 0:
            raise OSError("Invalid ROI dimensions!")
        iy = y + (np.arange(nh) * h // nh)
        ix = x + (np.arange(nw) * w // nw)
        return self._px[iy][:, ix].copy()

    def copy(self, *args, **kwargs):
        """copy([roi, x_scale, y_scale, copy_to_fb]): a new image (no AI buffer)."""
        A.ignore_unknown("Image.copy", kwargs, {"roi", "x_scale", "y_scale", "copy_to_fb"})
        self._decode()
        roi = A.kw(args, kwargs, "roi", 0, None)
        xs = A.get_float(A.kw(args, kwargs, "x_scale", 1, 1.0))
        ys = A.get_float(A.kw(args, kwargs, "y_scale", 2, 1.0))
        px = self._scaled(roi, xs, ys)
        _cost(px.shape[0] * px.shape[1])
        return Image(px, self._fmt)

    def crop(self, *args, **kwargs):
        """crop([roi, x_scale, y_scale, copy=False]): in place unless copy (MaixPy HEAD)."""
        A.ignore_unknown("Image.crop", kwargs, {"roi", "x_scale", "y_scale", "copy"})
        roi = A.kw(args, kwargs, "roi", 0, None)
        xs = A.get_float(A.kw(args, kwargs, "x_scale", 1, 1.0))
        ys = A.get_float(A.kw(args, kwargs, "y_scale", 2, 1.0))
        copy = A.kw(args, kwargs, "copy", 3, False)
        px = self._scaled(roi, xs, ys)
        _cost(px.shape[0] * px.shape[1])
        if copy:
            return Image(px, self._fmt)
        self._px, self._ai = px, None
        return self

    def cut(self, *args, **kwargs):
        if kwargs:
            raise TypeError("function doesn't take keyword arguments")
        A.check_arity(args, 3, 4)
        if len(args) == 3:
            raise OSError("Not enough positional arguments!")
        x, y, w, h = (A.get_int(v) for v in args)
        x1, y1 = min(self.width(), x + w), min(self.height(), y + h)
        if x < 0 or y < 0 or x1 <= x or y1 <= y:
            raise OSError("Invalid ROI dimensions!")
        px = self._px[y:y1, x:x1].copy()
        _cost(px.shape[0] * px.shape[1])
        return Image(px, self._fmt)

    def resize(self, *args, **kwargs):
        """resize(w, h): a new image (RGB565: bilinear when the width grows and the height does
        not shrink, else nearest; grayscale: bilinear unless both shrink, then box average)."""
        if kwargs:
            raise TypeError("function doesn't take keyword arguments")
        A.check_arity(args, 2, 2)
        w, h = (A.get_int(v) for v in args)
        if w <= 0 or h <= 0:
            raise OSError("Invalid ROI dimensions!")
        self._decode()
        from PIL import Image as P
        sw, sh = self.width(), self.height()
        if (w, h) == (sw, sh):
            px = self._px.copy()
        elif self._gray_img:
            mode = P.BOX if (w < sw and h < sh) else P.BILINEAR
            px = np.asarray(P.fromarray(self._px).resize((w, h), mode), np.uint8)
        elif w > sw and h >= sh:
            px = _lattice(np.asarray(P.fromarray(self._px).resize((w, h), P.BILINEAR), np.uint8))
        else:
            iy, ix = np.arange(h) * sh // h, np.arange(w) * sw // w
            px = self._px[iy][:, ix].copy()
        _cost(w * h)
        return Image(np.ascontiguousarray(px), self._fmt)

    def to_grayscale(self, *args, **kwargs):
        A.ignore_unknown("Image.to_grayscale", kwargs, {"copy"})
        copy = A.kw(args, kwargs, "copy", 0, False)
        self._decode()
        px = self._px if self._gray_img else _gray(self._px)
        _cost(self.width() * self.height())
        if copy:
            return Image(px.copy(), GRAYSCALE)
        if not self._gray_img:
            self._px, self._fmt, self._ai = px, GRAYSCALE, None
        return self

    def to_rgb565(self, *args, **kwargs):
        A.ignore_unknown("Image.to_rgb565", kwargs, {"copy", "rgb_channel"})
        copy = A.kw(args, kwargs, "copy", 0, False)
        self._decode()
        px = self._px if not self._gray_img else _lattice(np.repeat(self._px[..., None], 3, 2))
        _cost(self.width() * self.height())
        if copy:
            return Image(px.copy(), RGB565)
        if self._gray_img:
            self._px, self._fmt, self._ai = px, RGB565, None
        return self

    def to_rainbow(self, *args, **kwargs):
        A.ignore_unknown("Image.to_rainbow", kwargs, {"copy", "rgb_channel", "color_palette"})
        copy = A.kw(args, kwargs, "copy", 0, False)
        g = self._px if self._gray_img else _gray(self._px)
        import colorsys
        lut = np.array([[int(255 * c) for c in colorsys.hsv_to_rgb((1 - v / 255) * 0.7, 1, 1)]
                        for v in range(256)], np.uint8)
        px = _lattice(lut[g])
        if copy:
            return Image(px, RGB565)
        self._px, self._fmt, self._ai = px, RGB565, None
        return self

    def pix_to_ai(self, *args, **kwargs):
        """Rebuild the planar R,G,B (or Y) 8-bit buffer the KPU reads; returns None."""
        self._decode()
        px = self._px
        if self._gray_img:
            ai = px[None] if self._fb else np.ascontiguousarray(px[None])
        else:
            ai = np.ascontiguousarray(px.transpose(2, 0, 1))
        if not self._fb and self._ai is None:
            w64 = (self.width() + 63) // 64 * 64
            holder = _AiHolder()
            _heap().alloc(w64 * self.height() * (1 if self._gray_img else 3), owner=holder)
            self._ai_holder = holder
        self._ai = ai
        _cost(self.width() * self.height())
        return None

    def conv3(self, *args, **kwargs):
        """conv3(kern): a 3x3 convolution of each colour plane of the AI buffer, on the KPU, in
        place (py_image_conv3 -> conv.c imlib_conv3 -> sipeed_conv.c): `kern` 9 numbers (the
        keyword, else slot 1); the AI buffer and the pixels get the result; returns None. Without
        an AI buffer the firmware prints "pix_ai or pixels is NULL!" and does nothing; without a
        kernel, "please input 9 kern parm!". The arithmetic is the KPU's (`_sipeed_conv3`)."""
        kern = kwargs.get("kern", args[0] if args else None)
        if kern is None:
            _board.console("please input 9 kern parm!\n")
            return None
        krn = [A.get_float(v) for v in A.seq(kern, 9)]
        if self._ai is None or self._px is None:
            _board.console("pix_ai or pixels is NULL!\n")
            return None
        if self._gray_img:
            _board.current().note("Image.conv3 on a grayscale image: the firmware reads and writes three "
                                  "colour planes of a one-plane buffer (undefined on a board); the host does "
                                  "nothing", ("img", "conv3-gray"))
            return None
        self._ai = _sipeed_conv3(self._ai, krn)
        self._px[...] = _lattice(self._ai.transpose(1, 2, 0))
        _cost(4 * self.width() * self.height())
        return None

    def ai_to_pix(self, *args, **kwargs):
        if self._ai is None:
            raise OSError("pix_ai is NULL")
        if self._gray_img:
            self._px[...] = self._ai[0]
        else:
            self._px[...] = _lattice(self._ai.transpose(1, 2, 0))
        _cost(self.width() * self.height())
        return None

    def replace(self, *args, **kwargs):
        """replace/set/assign([image, hmirror, vflip, transpose, mask]): in place."""
        A.ignore_unknown("Image.replace", kwargs, {"image", "hmirror", "vflip", "transpose", "mask"})
        src = A.kw(args, kwargs, "image", 0, None)
        hm = A.kw(args, kwargs, "hmirror", 1, False)
        vf = A.kw(args, kwargs, "vflip", 2, False)
        tr = A.kw(args, kwargs, "transpose", 3, False)
        px = (src if isinstance(src, Image) else self)._px
        if isinstance(src, Image) and src._fmt != self._fmt:
            px = _gray(src._px) if self._gray_img else _lattice(np.repeat(src._px[..., None], 3, 2))
        if hm:
            px = px[:, ::-1]
        if vf:
            px = px[::-1]
        if tr:
            px = px.swapaxes(0, 1)
        self._px = np.ascontiguousarray(px)
        _cost(self.width() * self.height())
        return self

    set = assign = replace

    def rotation_corr(self, *args, **kwargs):
        """rotation_corr(x_rotation, y_rotation, z_rotation, x_translation, y_translation,
        zoom, ...): in place. The host does z rotation, translation and zoom (nearest
        neighbour); x/y (perspective) rotation is noted and left out."""
        known = {"x_rotation", "y_rotation", "z_rotation", "x_translation", "y_translation",
                 "zoom", "fov", "corners"}
        A.ignore_unknown("Image.rotation_corr", kwargs, known)
        xr = A.get_float(A.kw(args, kwargs, "x_rotation", 0, 0.0))
        yr = A.get_float(A.kw(args, kwargs, "y_rotation", 1, 0.0))
        zr = A.get_float(A.kw(args, kwargs, "z_rotation", 2, 0.0))
        tx = A.get_float(A.kw(args, kwargs, "x_translation", 3, 0.0))
        ty = A.get_float(A.kw(args, kwargs, "y_translation", 4, 0.0))
        zoom = A.get_float(A.kw(args, kwargs, "zoom", 5, 1.0))
        if xr or yr:
            _board.current().note("Image.rotation_corr: x/y (perspective) rotation is not "
                                  "emulated; only z rotation, translation and zoom",
                                  "rotation_corr")
        h, w = self.height(), self.width()
        zr_mod = zr % 360
        if zr_mod in (0.0, 180.0) and zoom == 1.0 and tx == 0 and ty == 0:
            if zr_mod == 180.0:
                self._px = np.ascontiguousarray(self._px[::-1, ::-1])
        else:
            a = math.radians(zr)
            yy, xx = np.mgrid[:h, :w].astype(np.float64)
            cx, cy = (w - 1) / 2, (h - 1) / 2
            u = ((xx - cx - tx) * math.cos(a) + (yy - cy - ty) * math.sin(a)) / zoom + cx
            v = (-(xx - cx - tx) * math.sin(a) + (yy - cy - ty) * math.cos(a)) / zoom + cy
            ui, vi = np.rint(u).astype(int), np.rint(v).astype(int)
            ok = (ui >= 0) & (ui < w) & (vi >= 0) & (vi < h)
            out = np.zeros_like(self._px)
            out[ok] = self._px[vi[ok], ui[ok]]
            self._px = out
        _cost(w * h * 3)
        return self

    # -- filters ---------------------------------------------------------------------------------
    def _luma(self, px=None):
        px = self._px if px is None else px
        return px.astype(np.int32) if self._gray_img else _gray(px).astype(np.int32)

    def _windows(self, size):
        k = 2 * size + 1
        pad = np.pad(self._px, ((size, size), (size, size)) + (((0, 0),) if not self._gray_img else ()),
                     mode="edge")
        from numpy.lib.stride_tricks import sliding_window_view
        ax = (0, 1)
        return sliding_window_view(pad, (k, k), axis=ax), k

    def _filter(self, name, args, kwargs, extra, reduce):
        A.ignore_unknown(f"Image.{name}", kwargs, {"size", "threshold", "offset", "invert",
                                                    "mask"} | set(extra))
        self._check_mutable()
        size = A.get_int(A.kw(args, kwargs, "size", 0, 1))
        vals = {e: A.kw(args, kwargs, e, i + 1, d) for i, (e, d) in enumerate(extra.items())}
        off = len(extra) + 1
        thr = A.kw(args, kwargs, "threshold", off, False)
        offset = A.get_int(A.kw(args, kwargs, "offset", off + 1, 0))
        invert = A.kw(args, kwargs, "invert", off + 2, False)
        win, k = self._windows(size)
        filt = reduce(win, vals).astype(np.float64)
        if thr:
            src = self._luma()
            ref = filt if self._gray_img else _gray(np.clip(filt, 0, 255).astype(np.uint8))
            low = ((src - offset) < ref) ^ bool(invert)
            if self._gray_img:
                self._px = np.where(low, 0, 255).astype(np.uint8)
            else:
                self._px = _bw(low, False)
        else:
            out = np.clip(np.rint(filt), 0, 255).astype(np.uint8)
            self._px = out if self._gray_img else _lattice(out)
        _cost(self.width() * self.height() * k * k)
        return self

    def mean(self, *args, **kwargs):
        return self._filter("mean", args, kwargs, {}, lambda w, v: w.mean(axis=(-2, -1)))

    def median(self, *args, **kwargs):
        def red(w, v):
            p = A.get_float(v["percentile"])
            if not 0 <= p <= 1:
                raise OSError("Error: 0 <= percentile <= 1!")
            return np.quantile(w, p, axis=(-2, -1), method="nearest")
        return self._filter("median", args, kwargs, {"percentile": 0.5}, red)

    def midpoint(self, *args, **kwargs):
        def red(w, v):
            b = A.get_float(v["bias"])
            return w.min(axis=(-2, -1)) * (1 - b) + w.max(axis=(-2, -1)) * b
        return self._filter("midpoint", args, kwargs, {"bias": 0.5}, red)

    def mode(self, *args, **kwargs):
        def red(w, v):
            flat = w.reshape(w.shape[:-2] + (-1,)).astype(np.int64)
            out = np.empty(flat.shape[:-1])
            it = np.nditer(out, flags=["multi_index"], op_flags=["writeonly"])
            for o in it:
                o[...] = np.bincount(flat[it.multi_index]).argmax()
            return out
        return self._filter("mode", args, kwargs, {}, red)

    def gaussian(self, *args, **kwargs):
        def red(w, v):
            k = w.shape[-1]
            g = np.array([math.comb(k - 1, i) for i in range(k)], np.float64)
            ker = np.outer(g, g) / np.outer(g, g).sum()
            blur = (w * ker).sum(axis=(-2, -1))
            if v["unsharp"]:
                c = w[..., k // 2, k // 2]
                blur = c + (c - blur)
            return blur * A.get_float(v["mul"] if v["mul"] is not None else 1.0) + \
                A.get_float(v["add"])
        return self._filter("gaussian", args, kwargs, {"unsharp": False, "mul": None, "add": 0.0}, red)

    def binary(self, *args, **kwargs):
        A.ignore_unknown("Image.binary", kwargs, {"invert", "zero", "mask", "to_bitmap", "copy"})
        self._check_mutable()
        th = A.seq(args[0] if args else kwargs.get("thresholds"))
        invert = A.kw(args, kwargs, "invert", 1, False)
        zero = A.kw(args, kwargs, "zero", 2, False)
        inside = self._in_thresholds(th) ^ bool(invert)
        if zero:
            self._px[inside] = 0
        else:
            on = 255
            self._px = (np.where(inside, on, 0).astype(np.uint8) if self._gray_img else
                        _bw(inside, True))
        _cost(self.width() * self.height())
        return self

    def invert(self, *args, **kwargs):
        self._px = (255 - self._px).astype(np.uint8)
        if not self._gray_img:
            self._px = _lattice(self._px)
        _cost(self.width() * self.height())
        return self

    negate = invert

    def _morph(self, name, args, kwargs, grow):
        A.ignore_unknown(f"Image.{name}", kwargs, {"size", "threshold", "mask"})
        size = A.get_int(A.kw(args, kwargs, "size", 0, 1))
        thr = A.kw(args, kwargs, "threshold", 1, None)
        win, k = self._windows(size)
        lum = win if self._gray_img else win.max(axis=2)
        on = lum > 0
        cnt = on.sum(axis=(-2, -1)) - (self._luma() > 0)
        if thr is None:
            thr = 0 if grow else k * k - 1
        thr = A.get_int(thr)
        cur = self._luma() > 0
        out = (cur | (cnt > thr)) if grow else (cur & (cnt >= thr))
        self._px = (np.where(out, 255, 0).astype(np.uint8) if self._gray_img else
                    np.where(out[..., None], self._px, 0).astype(np.uint8) if not grow else
                    _bw(out, True))
        _cost(self.width() * self.height() * k * k)
        return self

    def erode(self, *args, **kwargs):
        return self._morph("erode", args, kwargs, False)

    def dilate(self, *args, **kwargs):
        return self._morph("dilate", args, kwargs, True)

    def histeq(self, *args, **kwargs):
        A.ignore_unknown("Image.histeq", kwargs, {"adaptive", "clip_limit", "mask"})
        lum = self._luma().astype(np.uint8)
        hist = np.bincount(lum.reshape(-1), minlength=256)
        cdf = np.cumsum(hist).astype(np.float64)
        lut = np.rint(255 * (cdf - cdf[0]) / max(1.0, cdf[-1] - cdf[0])).astype(np.uint8)
        if self._gray_img:
            self._px = lut[self._px]
        else:
            scale = (lut[lum].astype(np.float64) + 1) / (lum.astype(np.float64) + 1)
            self._px = _lattice(np.clip(self._px * scale[..., None], 0, 255).astype(np.uint8))
        _cost(self.width() * self.height())
        return self

    def lens_corr(self, *args, **kwargs):
        _board.current().note("Image.lens_corr: the host camera has no lens distortion; "
                              "the image is left as it is", "lens_corr")
        return self

    def stretch(self, lo, hi):
        if not self._gray_img:
            raise OSError("Image format is not supported!")
        lo, hi = A.get_int(lo), A.get_int(hi)
        p = self._px.astype(np.int32)
        self._px = np.clip((p - lo) * 255 // max(1, hi - lo), 0, 255).astype(np.uint8)
        return self

    def strech_char(self, de_dark=0):
        if not self._gray_img:
            raise OSError("Image format is not supported!")
        lo, hi = int(self._px.min()), int(self._px.max())
        return self.stretch(lo, hi)

    # -- analysis --------------------------------------------------------------------------------
    def _in_thresholds(self, th):
        """Mask of pixels inside any threshold: grayscale (lo, hi); RGB565 LAB
        (l_lo, l_hi, a_lo, a_hi, b_lo, b_hi)."""
        inside = np.zeros(self._px.shape[:2], bool)
        if self._gray_img:
            v = self._px.astype(np.int32)
            for t in th:
                t = [A.get_int(x) for x in A.seq(t)]
                lo, hi = (t + [255])[:2] if len(t) >= 1 else (0, 255)
                inside |= (v >= min(lo, hi)) & (v <= max(lo, hi))
            return inside
        lab = rgb_to_lab_array(self._px)
        for t in th:
            t = [A.get_int(x) for x in A.seq(t)] + [0, 100, -128, 127, -128, 127][len(A.seq(t)):]
            ok = np.ones_like(inside)
            for i in range(3):
                lo, hi = sorted((t[2 * i], t[2 * i + 1]))
                ok &= (lab[..., i] >= lo) & (lab[..., i] <= hi)
            inside |= ok
        return inside

    def find_blobs(self, *args, **kwargs):
        known = {"invert", "roi", "x_stride", "y_stride", "area_threshold", "pixels_threshold",
                 "merge", "margin", "threshold_cb", "merge_cb"}
        A.ignore_unknown("Image.find_blobs", kwargs, known)
        if not args:
            raise TypeError("function missing 1 required positional arguments")
        th = A.seq(args[0])
        invert = A.kw(args, kwargs, "invert", 1, False)
        roi = self._roi(A.kw(args, kwargs, "roi", 2, None))
        area_t = A.get_int(A.kw(args, kwargs, "area_threshold", 5, 10))
        pix_t = A.get_int(A.kw(args, kwargs, "pixels_threshold", 6, 10))
        merge = A.kw(args, kwargs, "merge", 7, False)
        margin = A.get_int(A.kw(args, kwargs, "margin", 8, 0))
        x, y, w, h = roi
        blobs = []
        for ti, t in enumerate(th):
            mask = self._in_thresholds([t])[y:y + h, x:x + w] ^ bool(invert)
            for ys, xs in _components(mask):
                bx, by = int(xs.min()) + x, int(ys.min()) + y
                bw, bh = int(xs.max() - xs.min() + 1), int(ys.max() - ys.min() + 1)
                if bw * bh < area_t or len(xs) < pix_t:
                    continue
                rot = 0.0
                if len(xs) > 1:
                    cov = np.cov(np.stack([xs, ys]).astype(np.float64))
                    rot = (0.5 * math.atan2(2 * cov[0, 1], cov[0, 0] - cov[1, 1])) % math.pi
                blobs.append(Blob(bx, by, bw, bh, len(xs), int(math.floor(xs.mean() + 0.5)) + x,
                                  int(math.floor(ys.mean() + 0.5)) + y, rot, 1 << ti))
        if merge:
            blobs = _merge_blobs(blobs, margin)
        _cost(self.width() * self.height() * 2)
        return blobs

    def get_statistics(self, *args, **kwargs):
        A.ignore_unknown("Image.get_statistics", kwargs, {"thresholds", "invert", "roi", "bins",
                                                          "l_bins", "a_bins", "b_bins"})
        roi = self._roi(A.kw(args, kwargs, "roi", 2, None) if args and isinstance(args[0], (list, tuple))
                        and args[0] and isinstance(args[0][0], (list, tuple)) else
                        A.kw(args, kwargs, "roi", 0, None))
        x, y, w, h = roi
        px = self._px[y:y + h, x:x + w]
        if self._gray_img:
            return Statistics([px.reshape(-1).astype(np.int32)])
        lab = rgb_to_lab_array(px).reshape(-1, 3)
        return Statistics([lab[:, 0], lab[:, 1], lab[:, 2]])

    def get_histogram(self, *args, **kwargs):
        """get_histogram([thresholds, invert, roi, bins, l_bins, a_bins, b_bins]): normalised
        histograms (grayscale: 1 channel of `bins`; RGB565: L, A, B)."""
        A.ignore_unknown("Image.get_histogram", kwargs, {"thresholds", "invert", "roi", "bins",
                                                         "l_bins", "a_bins", "b_bins"})
        roi = kwargs.get("roi", args[2] if len(args) > 2 else None)
        x, y, w, h = self._roi(roi)
        px = self._px[y:y + h, x:x + w]
        bins = A.get_int(kwargs.get("bins", kwargs.get("l_bins", 256 if self._gray_img else 100)))
        if self._gray_img:
            chans = [(px.reshape(-1).astype(np.int64), 0, 255, bins)]
        else:
            lab = rgb_to_lab_array(px).reshape(-1, 3)
            chans = [(lab[:, 0], 0, 100, bins),
                     (lab[:, 1], -128, 127, A.get_int(kwargs.get("a_bins", 256))),
                     (lab[:, 2], -128, 127, A.get_int(kwargs.get("b_bins", 256)))]
        hists = []
        for v, lo, hi, n in chans:
            idx = np.clip((v - lo) * n // (hi - lo + 1), 0, n - 1)
            c = np.bincount(idx, minlength=n).astype(np.float64)
            hists.append((c / max(1.0, c.sum()), lo, hi))
        _cost(w * h)
        return Histogram(hists)

    def get_regression(self, *args, **kwargs):
        """get_regression(thresholds[, invert, roi, x_stride, y_stride, area_threshold,
        pixels_threshold, robust]): the least-squares line through the pixels inside the
        thresholds (robust=True: Theil-Sen), or None."""
        A.ignore_unknown("Image.get_regression", kwargs, {"invert", "roi", "x_stride", "y_stride",
                                                          "area_threshold", "pixels_threshold",
                                                          "robust"})
        if not args:
            raise TypeError("function missing 1 required positional arguments")
        th = A.seq(args[0])
        invert = A.kw(args, kwargs, "invert", 1, False)
        x, y, w, h = self._roi(A.kw(args, kwargs, "roi", 2, None))
        xs_, ys_ = A.get_int(A.kw(args, kwargs, "x_stride", 3, 2)), A.get_int(A.kw(args, kwargs, "y_stride", 4, 1))
        pix_t = A.get_int(A.kw(args, kwargs, "pixels_threshold", 6, 10))
        robust = A.kw(args, kwargs, "robust", 7, False)
        mask = self._in_thresholds(th)[y:y + h, x:x + w] ^ bool(invert)
        sub = np.zeros_like(mask)
        sub[::max(1, ys_), ::max(1, xs_)] = True
        yy, xx = np.nonzero(mask & sub)
        _cost(w * h)
        if len(xx) < max(2, pix_t):
            return None
        xx, yy = xx + x, yy + y
        vertical = np.ptp(yy) > np.ptp(xx)
        u, v = (yy, xx) if vertical else (xx, yy)
        if robust:
            i, j = np.triu_indices(min(len(u), 200), 1)
            du = u[i] - u[j]
            ok = du != 0
            m = float(np.median((v[i] - v[j])[ok] / du[ok])) if ok.any() else 0.0
            b = float(np.median(v - m * u))
        else:
            m, b = np.polyfit(u.astype(float), v.astype(float), 1)
        u0, u1 = int(u.min()), int(u.max())
        p0, p1 = (u0, m * u0 + b), (u1, m * u1 + b)
        if vertical:
            p0, p1 = (p0[1], p0[0]), (p1[1], p1[0])
        resid = np.abs(v - (m * u + b)).mean()
        return Line(int(round(p0[0])), int(round(p0[1])), int(round(p1[0])), int(round(p1[1])),
                    magnitude=int(max(0, 255 - 10 * resid)))

    def draw_keypoints(self, *args, **kwargs):
        A.ignore_unknown("Image.draw_keypoints", kwargs, {"color", "size", "thickness", "fill"})
        kps = A.seq(args[0]) if args else []
        c = A.kw(args, kwargs, "color", 1, -1)
        size = A.get_int(A.kw(args, kwargs, "size", 2, 10))
        t = A.get_int(A.kw(args, kwargs, "thickness", 3, 1))
        for kp in kps:
            kx, ky, rot = (list(A.seq(kp)) + [0])[:3]
            kx, ky = A.get_int(kx), A.get_int(ky)
            self.draw_circle(kx, ky, max(1, (size - 2) // 2), color=c, thickness=t)
            a = math.radians(A.get_float(rot))
            self.draw_line(kx, ky, int(round(kx + size * math.cos(a))),
                           int(round(ky + size * math.sin(a))), color=c, thickness=t)
        return self

    def __getattr__(self, name):
        """A method of the firmware the host does not emulate is there (a script may test for
        it) and raises OSError EOPNOTSUPP with a note, as docs/maixpy-host.md says of all such;
        any other name is the firmware's AttributeError."""
        if name not in _OPENMV_NOT_EMULATED:
            raise AttributeError(f"'Image' object has no attribute '{name}'")

        def not_emulated(*args, **kwargs):
            _board.current().note(f"Image.{name}: an OpenMV/MaixPy method the host does not "
                                  "emulate", ("img", name))
            raise oserror(_errno.EOPNOTSUPP)
        return not_emulated

    def find_qrcodes(self, *args, **kwargs):
        return self._not_emulated("find_qrcodes")

    def find_apriltags(self, *args, **kwargs):
        return self._not_emulated("find_apriltags")

    def find_barcodes(self, *args, **kwargs):
        return self._not_emulated("find_barcodes")

    def find_datamatrices(self, *args, **kwargs):
        return self._not_emulated("find_datamatrices")

    def find_lines(self, *args, **kwargs):
        return self._not_emulated("find_lines")

    def find_circles(self, *args, **kwargs):
        return self._not_emulated("find_circles")

    def find_rects(self, *args, **kwargs):
        return self._not_emulated("find_rects")

    def _not_emulated(self, name):
        _board.current().note(f"Image.{name}: not emulated on the host; it returns [] (no "
                              "detection), a board may find something", name)
        return []

    # -- output ----------------------------------------------------------------------------------
    def compress(self, *args, **kwargs):
        A.ignore_unknown("Image.compress", kwargs, {"quality"})
        q = A.get_int(A.kw(args, kwargs, "quality", 0, 50))
        data = self._jpeg_bytes(q)
        self._jpeg, self._fmt = data, JPEG
        return self

    def compressed(self, *args, **kwargs):
        A.ignore_unknown("Image.compressed", kwargs, {"quality"})
        q = A.get_int(A.kw(args, kwargs, "quality", 0, 50))
        return Image(self._px.copy(), JPEG, jpeg=self._jpeg_bytes(q))

    def _jpeg_bytes(self, q):
        import io

        from PIL import Image as P
        if not 1 <= q <= 100:
            raise OSError("Error: 1 <= quality <= 100!")
        buf = io.BytesIO()
        P.fromarray(self._to_rgb888()).save(buf, format="JPEG", quality=q)
        _cost(self.width() * self.height() * 4)
        return buf.getvalue()

    def save(self, *args, **kwargs):
        """save(path[, roi, quality=50]): .bmp and .jpg/.jpeg only; other extensions write
        nothing and raise nothing (as the firmware)."""
        A.ignore_unknown("Image.save", kwargs, {"roi", "quality"})
        if not args or not isinstance(args[0], str):
            raise TypeError("function missing 1 required positional arguments")
        path = args[0]
        roi = A.kw(args, kwargs, "roi", 1, None)
        q = A.get_int(A.kw(args, kwargs, "quality", 2, 50))
        if not 1 <= q <= 100:
            raise OSError("Error: 1 <= quality <= 100!")
        ext = path.lower().rsplit(".", 1)[-1] if "." in path else ""
        if ext not in ("bmp", "jpg", "jpeg"):
            _board.current().note(f"Image.save('{path}'): the firmware writes only .bmp and "
                                  ".jpg/.jpeg; nothing was written", ("save", ext))
            return self
        img = self if roi is None else self.copy(roi)
        import io

        from PIL import Image as P
        buf = io.BytesIO()
        P.fromarray(img._to_rgb888()).save(buf, format="BMP" if ext == "bmp" else "JPEG", quality=q)
        with _board.current().vfs.open(path, "wb") as f:
            f.write(buf.getvalue())
        _cost(self.width() * self.height() * 4)
        return self


def _bw(mask, on_white: bool):
    """An RGB565 black/white image from a mask (white where mask == on_white)."""
    v = np.where(mask == on_white, 255, 0).astype(np.uint8)
    return np.ascontiguousarray(np.repeat(v[..., None], 3, 2))


class _AiHolder:
    """Owner of an AI buffer's heap blocks (freed with the image)."""


def _components(mask):
    """[(ys, xs)] of the 8-connected components of a boolean mask."""
    try:
        from scipy import ndimage
        lab, n = ndimage.label(mask, structure=np.ones((3, 3), int))
        if n == 0:
            return []
        idx = np.argsort(lab, axis=None, kind="stable")
        flat = lab.reshape(-1)[idx]
        starts = np.searchsorted(flat, np.arange(1, n + 1))
        ends = np.searchsorted(flat, np.arange(1, n + 1), side="right")
        ys, xs = np.unravel_index(idx, mask.shape)
        return [(ys[a:b], xs[a:b]) for a, b in zip(starts, ends)]
    except ImportError:
        pass
    seen = np.zeros_like(mask, bool)
    out = []
    H, W = mask.shape
    for y0, x0 in zip(*np.nonzero(mask)):
        if seen[y0, x0]:
            continue
        stack, ys, xs = [(y0, x0)], [], []
        seen[y0, x0] = True
        while stack:
            y, x = stack.pop()
            ys.append(y)
            xs.append(x)
            for dy in (-1, 0, 1):
                for dx in (-1, 0, 1):
                    v, u = y + dy, x + dx
                    if 0 <= v < H and 0 <= u < W and mask[v, u] and not seen[v, u]:
                        seen[v, u] = True
                        stack.append((v, u))
        out.append((np.array(ys), np.array(xs)))
    return out


def _merge_blobs(blobs, margin):
    merged = True
    while merged:
        merged = False
        for i in range(len(blobs)):
            for j in range(i + 1, len(blobs)):
                a, b = blobs[i], blobs[j]
                if (a.x() - margin <= b.x() + b.w() and b.x() - margin <= a.x() + a.w()
                        and a.y() - margin <= b.y() + b.h() and b.y() - margin <= a.y() + a.h()):
                    x0, y0 = min(a.x(), b.x()), min(a.y(), b.y())
                    x1 = max(a.x() + a.w(), b.x() + b.w())
                    y1 = max(a.y() + a.h(), b.y() + b.h())
                    n = a.pixels() + b.pixels()
                    blobs[i] = Blob(x0, y0, x1 - x0, y1 - y0, n,
                                    (a.cx() * a.pixels() + b.cx() * b.pixels()) // n,
                                    (a.cy() * a.pixels() + b.cy() * b.pixels()) // n,
                                    a.rotation(), a.code() | b.code(), a.count() + b.count())
                    del blobs[j]
                    merged = True
                    break
            if merged:
                break
    return blobs


class Blob:
    def __init__(self, x, y, w, h, pixels, cx, cy, rotation, code, count=1):
        self._v = (x, y, w, h, pixels, cx, cy, rotation, code, count)

    def rect(self):
        return self._v[:4]

    def x(self):
        return self._v[0]

    def y(self):
        return self._v[1]

    def w(self):
        return self._v[2]

    def h(self):
        return self._v[3]

    def pixels(self):
        return self._v[4]

    def cx(self):
        return self._v[5]

    def cy(self):
        return self._v[6]

    def rotation(self):
        return self._v[7]

    def code(self):
        return self._v[8]

    def count(self):
        return self._v[9]

    def area(self):
        return self._v[2] * self._v[3]

    def density(self):
        return self._v[4] / max(1, self.area())

    def __getitem__(self, i):
        return self._v[i]

    def __len__(self):
        return len(self._v)

    def __repr__(self):
        x, y, w, h, p, cx, cy, r, c, n = self._v
        return (f'{{"x":{x}, "y":{y}, "w":{w}, "h":{h}, "pixels":{p}, "cx":{cx}, "cy":{cy}, '
                f'"rotation":{r:f}, "code":{c}, "count":{n}}}')


_OPENMV_NOT_EMULATED = {
    "find_edges", "find_hog", "find_features", "find_eye", "find_lbp", "find_keypoints",
    "find_template", "find_line_segments", "find_displacement", "get_similarity",
    "match_descriptor", "bilateral", "laplacian", "sharpen", "cartoon", "morph", "linpolar",
    "logpolar", "chrominvar", "illuminvar", "remove_shadows", "mask_circle", "mask_ellipse",
    "mask_rectangle", "flood_fill", "top_hat", "black_hat", "b_and", "b_or", "b_xor", "b_nand",
    "b_nor", "b_xnor", "add", "sub", "mul", "div", "min", "max", "difference", "blend",
    "replace_color", "gamma_corr", "find_cirles",
}


def _sipeed_conv3(ai: np.ndarray, krn) -> np.ndarray:
    """The KPU layer sipeed_conv.c builds for imlib_conv3, run by the emulator's KPU reference:
    a 3-in, 3-out 3x3 conv with `krn` on the diagonal (each plane its own), 16-bit weights
    quantized over all 81 values (conv_float2u16: w = (uint16)((v - min) * 65535 / range) in
    float32, the offset back as arg_x = min * scale * 2^shr_x, shr_x doublings up to 2^22),
    identity batch norm, an activation table of 0 below 0 and (V * y_mul) >> shift above (y_mul
    the inverse scale doubled past 16383), pad value 0, the planes padded to 64-byte rows with
    zeros (the same as the conv's own padding). Returns the new (3, H, W) uint8 planes."""
    from tl2k210.k210.emulator.kpu import reference_layer
    f32 = np.float32
    data = np.zeros((3, 3, 9), f32)
    for c in range(3):
        data[c, c] = np.asarray(krn, f32)
    dmin, dmax = f32(data.min()), f32(data.max())
    scale = f32(65535.0) / f32(dmax - dmin) if dmax > dmin else f32(np.inf)
    w16 = ((data - dmin) * scale).astype(np.int64) if np.isfinite(scale) else np.zeros(data.shape, np.int64)
    arg, shr_x = f32(scale * abs(dmin)) if np.isfinite(scale) else f32(0), 0
    while arg < f32(0x400000) and arg != 0:
        arg, shr_x = f32(arg * 2), shr_x + 1
    arg_x = int(arg) if dmin >= 0 else -int(arg)
    inv, shift = f32(1.0) / scale if np.isfinite(scale) else f32(0), 0
    while inv <= f32(16383.0) and shift < 255:
        inv, shift = f32(inv * 2), shift + 1
    y_mul = int(inv) & 0xFFFF
    args = dict(kernel_type=1, pad_value=0, depth_wise_layer=0, arg_x=arg_x, shr_x=shr_x, arg_w=0, shr_w=0,
                arg_add=0, pool_type=0)
    bn = dict(norm_mul=[1] * 3, norm_add=[0] * 3, norm_shift=[0] * 3)
    act = dict(x_start=[-(1 << 35)] + [0] * 15, shift_number=[0] + [shift] * 15, y_mul=[0] + [y_mul] * 15,
               bias=[0] * 16)
    return reference_layer(np.asarray(ai, np.uint8), w16.reshape(3, 3, 3, 3), args, bn, act)


class Line:
    def __init__(self, x1, y1, x2, y2, magnitude=0):
        self._v = (x1, y1, x2, y2)
        self._mag = magnitude

    def line(self):
        return self._v

    def x1(self):
        return self._v[0]

    def y1(self):
        return self._v[1]

    def x2(self):
        return self._v[2]

    def y2(self):
        return self._v[3]

    def length(self):
        return int(round(math.hypot(self._v[2] - self._v[0], self._v[3] - self._v[1])))

    def magnitude(self):
        return self._mag

    def theta(self):
        x1, y1, x2, y2 = self._v
        t = int(round(math.degrees(math.atan2(x2 - x1, -(y2 - y1))))) % 180
        return t

    def rho(self):
        x1, y1, _, _ = self._v
        t = math.radians(self.theta())
        return int(round(x1 * math.cos(t) + y1 * math.sin(t)))

    def __getitem__(self, i):
        return (self._v + (self.length(), self._mag, self.theta(), self.rho()))[i]

    def __repr__(self):
        x1, y1, x2, y2 = self._v
        return (f'{{"x1":{x1}, "y1":{y1}, "x2":{x2}, "y2":{y2}, "length":{self.length()}, '
                f'"magnitude":{self._mag}, "theta":{self.theta()}, "rho":{self.rho()}}}')


class Histogram:
    def __init__(self, hists):
        self._h = hists

    def bins(self):
        return self._h[0][0].tolist()

    l_bins = bins

    def a_bins(self):
        return self._h[min(1, len(self._h) - 1)][0].tolist()

    def b_bins(self):
        return self._h[min(2, len(self._h) - 1)][0].tolist()

    def get_percentile(self, p):
        out = []
        for h, lo, hi in self._h:
            i = int(np.searchsorted(np.cumsum(h), A.get_float(p) - 1e-9))
            out.append(lo + i * (hi - lo + 1) // len(h))
        return _Percentile(out)

    def get_threshold(self):
        out = []
        for h, lo, hi in self._h:                           # Otsu
            n = len(h)
            w = np.cumsum(h)
            mu = np.cumsum(h * np.arange(n))
            with np.errstate(divide="ignore", invalid="ignore"):
                between = (mu[-1] * w - mu) ** 2 / (w * (1 - w))
            k = int(np.nanargmax(between[:-1])) if n > 1 else 0
            out.append(lo + k * (hi - lo + 1) // n)
        return _Percentile(out)

    def get_statistics(self):
        chans = []
        for h, lo, hi in self._h:
            vals = lo + np.arange(len(h)) * (hi - lo + 1) / len(h)
            chans.append(np.repeat(vals, np.rint(h * 10000).astype(int)))
        return Statistics(chans)


class _Percentile:
    def __init__(self, v):
        self._v = v

    def value(self):
        return self._v[0]

    l_value = value

    def a_value(self):
        return self._v[min(1, len(self._v) - 1)]

    def b_value(self):
        return self._v[min(2, len(self._v) - 1)]

    def __getitem__(self, i):
        return self._v[i]


class Statistics:
    def __init__(self, chans):
        self._c = [np.asarray(c, np.float64) for c in chans]

    def _f(self, i, fn):
        c = self._c[i] if i < len(self._c) else self._c[0]
        return int(round(fn(c))) if c.size else 0

    def mean(self):
        return self._f(0, np.mean)

    def median(self):
        return self._f(0, np.median)

    def mode(self):
        return self._f(0, lambda c: np.bincount((c - c.min()).astype(int)).argmax() + c.min())

    def stdev(self):
        return self._f(0, np.std)

    def min(self):
        return self._f(0, np.min)

    def max(self):
        return self._f(0, np.max)

    def lq(self):
        return self._f(0, lambda c: np.percentile(c, 25))

    def uq(self):
        return self._f(0, lambda c: np.percentile(c, 75))

    def __getattr__(self, name):
        for p, i in (("l_", 0), ("a_", 1), ("b_", 2)):
            if name.startswith(p):
                base = getattr(Statistics, name[2:])
                return lambda: base(Statistics([self._c[min(i, len(self._c) - 1)]]))
        raise AttributeError(name)


# ---------------------------------------------------------------------------------------------
# colour spaces
def rgb_to_lab_array(rgb: np.ndarray) -> np.ndarray:
    """sRGB (D65) -> CIE L*a*b*, rounded to ints (OpenMV's tables are the same conversion)."""
    c = np.asarray(rgb, np.float64) / 255.0
    c = np.where(c > 0.04045, ((c + 0.055) / 1.055) ** 2.4, c / 12.92)
    m = np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722], [0.0193, 0.1192, 0.9505]])
    xyz = c @ m.T / np.array([0.95047, 1.0, 1.08883])
    f = np.where(xyz > 0.008856, np.cbrt(xyz), 7.787 * xyz + 16 / 116)
    L = 116 * f[..., 1] - 16
    a = 500 * (f[..., 0] - f[..., 1])
    b = 200 * (f[..., 1] - f[..., 2])
    return np.rint(np.stack([L, a, b], -1)).astype(np.int32)


def rgb_to_lab(rgb):
    r, g, b = (A.get_int(v) for v in A.seq(rgb, 3))
    return tuple(int(v) for v in rgb_to_lab_array(np.array([[[r, g, b]]], np.uint8))[0, 0])


def lab_to_rgb(lab):
    L, a, b = (A.get_int(v) for v in A.seq(lab, 3))
    fy = (L + 16) / 116
    fx, fz = fy + a / 500, fy - b / 200
    f = np.array([fx, fy, fz])
    xyz = np.where(f > 0.206893, f ** 3, (f - 16 / 116) / 7.787) * np.array([0.95047, 1.0, 1.08883])
    m = np.array([[3.2406, -1.5372, -0.4986], [-0.9689, 1.8758, 0.0415], [0.0557, -0.2040, 1.0570]])
    c = m @ xyz
    c = np.where(c > 0.0031308, 1.055 * np.power(np.clip(c, 0, None), 1 / 2.4) - 0.055, 12.92 * c)
    return tuple(int(v) for v in np.clip(np.rint(c * 255), 0, 255))


def rgb_to_grayscale(rgb):
    r, g, b = (A.get_int(v) for v in A.seq(rgb, 3))
    return (r * 38 + g * 75 + b * 15) >> 7


def grayscale_to_rgb(g):
    g = A.get_int(g)
    return (g, g, g)


# ---------------------------------------------------------------------------------------------
# face alignment helpers (MaixPy / CanMV), ported from omv/img/affine.c and py_image.c (v0.6.2)
def _f32(v):
    return float(np.float32(v))


def _svd22(a):
    """affine.c svd22: the firmware's closed-form 2x2 SVD (u, s, v as it leaves them)."""
    a0, a1, a2, a3 = a
    r1 = math.sqrt((a0 - a3) ** 2 + (a1 + a2) ** 2)
    s0 = _f32((r1 + math.sqrt((a0 + a3) ** 2 + (a1 - a2) ** 2)) / 2)
    s1 = _f32(abs(s0 - r1))
    v2 = _f32(math.sin(math.atan2(2 * (a0 * a1 + a2 * a3),
                                  a0 * a0 - a1 * a1 + a2 * a2 - a3 * a3) / 2)) if s0 > s1 else 0.0
    v0 = _f32(math.sqrt(1 - v2 * v2))
    v1, v3 = -v2, v0
    u0 = _f32(-(a0 * v0 + a1 * v2) / s0) if s0 != 0 else 1.0
    u2 = _f32(-(a2 * v0 + a3 * v2) / s0) if s0 != 0 else 0.0
    u1 = _f32((a0 * v1 + a1 * v3) / s1) if s1 != 0 else -u2
    u3 = _f32((a2 * v1 + a3 * v3) / s1) if s1 != 0 else u0
    return (u0, u1, u2, u3), (s0, s1), (-v0, v1, -v2, v3)


def get_affine_transform(src_points, dst_points):
    """image.get_affine_transform(src, dst): two lists of (x, y) int points (at most 10) ->
    a 9-tuple of floats, the 3x3 matrix T (row-major) that maps a **dst** point to its src
    point (the firmware's Umeyama estimate, imlib_affine_getTansform), as warp_affine_ai uses it."""
    if not (isinstance(src_points, list) and isinstance(dst_points, list)):
        raise OSError("Need input [[x0,y0],[x1,y1],...]\r\n")
    if len(src_points) != len(dst_points):
        raise OSError("src len must equal with dst len")
    if len(src_points) > 10:
        raise OSError("must<=10 points")
    src, dst = [], []
    for sp, dp in zip(src_points, dst_points):
        sp, dp = A.seq(sp, 2), A.seq(dp, 2)
        src.append([A.get_int(v) & 0xFFFF for v in sp])        # uint16_t src_pos[10][2]
        dst.append([A.get_int(v) & 0xFFFF for v in dp])
    n = len(src)
    # the firmware's "src" side is the dst points: T maps dst -> src
    sm = [_f32(sum(p[k] for p in dst) / n) for k in (0, 1)]
    dm = [_f32(sum(p[k] for p in src) / n) for k in (0, 1)]
    sd = [[_f32(p[0] - sm[0]), _f32(p[1] - sm[1])] for p in dst]
    dd = [[_f32(p[0] - dm[0]), _f32(p[1] - dm[1])] for p in src]
    a = [_f32(sum(dd[j][i] * sd[j][k] for j in range(n)) / n) for i in (0, 1) for k in (0, 1)]
    u, sv, v = _svd22(a)
    t00 = _f32(u[0] * v[0] + u[1] * v[2])
    t01 = _f32(u[0] * v[1] + u[1] * v[3])
    t10 = _f32(u[2] * v[0] + u[3] * v[2])
    t11 = _f32(u[2] * v[1] + u[3] * v[3])
    mean = [_f32(sum(p[k] for p in sd) / n) for k in (0, 1)]
    var = [_f32(sum((mean[k] - p[k]) ** 2 for p in sd) / n) for k in (0, 1)]
    scale = _f32(1.0 / (var[0] + var[1]) * (sv[0] + sv[1])) if var[0] + var[1] else float("inf")
    t02 = _f32(dm[0] - scale * (t00 * sm[0] + t01 * sm[1]))
    t12 = _f32(dm[1] - scale * (t10 * sm[0] + t11 * sm[1]))
    return (_f32(t00 * scale), _f32(t01 * scale), t02, _f32(t10 * scale), _f32(t11 * scale), t12,
            0.0, 0.0, 1.0)


def warp_affine_ai(src, dst, T):
    """warp_affine_ai(src, dst, T): fill dst's AI buffer from src's AI buffer; dst pixel (x, y)
    takes src at T (x, y, 1) (T from get_affine_transform: dst -> src), 8.8 fixed-point bilinear
    (imlib_affine_ai); dst pixels mapping outside src stay 0. Returns None."""
    tt = np.array([A.get_float(v) for v in A.seq(T, 9)], np.float32)
    if not isinstance(src, Image) or not isinstance(dst, Image):
        raise TypeError("Can't convert <class 'type'> to type")
    if src._gray_img != dst._gray_img:
        raise ValueError("src_img->bpp != dst_img->bpp")
    if src._ai is None or dst._ai is None:
        raise ValueError("only support ai image affine")
    if src._fmt not in (RGB565, GRAYSCALE):
        raise ValueError("only support grayscale or RGB565 pic")
    h, w = dst.height(), dst.width()
    H, W = src.height(), src.width()
    ch = 1 if src._gray_img else 3
    yy, xx = np.mgrid[:h, :w]
    xs, ys = np.float32(xx * 256), np.float32(yy * 256)
    px = np.trunc(tt[0] * xs + tt[1] * ys + tt[2] * np.float32(256)).astype(np.int64)
    py = np.trunc(tt[3] * xs + tt[4] * ys + tt[5] * np.float32(256)).astype(np.int64)
    fx, fy = px & 0xFF, py & 0xFF
    px, py = px >> 8, py >> 8
    ok = (px >= 0) & (px <= W - 1) & (py >= 0) & (py <= H - 1)
    flat = np.concatenate([np.asarray(src._ai, np.uint8).reshape(-1)[:ch * H * W],
                           np.zeros(W + 1, np.uint8)]).astype(np.int64)   # past the end: 0
    fx, fy, base = fx[ok], fy[ok], (py * W + px)[ok]
    out = np.zeros((ch, h, w), np.uint8)
    for k in range(ch):
        b = base + k * H * W       # x + 1 / y + 1 at the edge read the next row / plane
        v = ((256 - fx) * (256 - fy) * flat[b] + fx * (256 - fy) * flat[b + 1]
             + (256 - fx) * fy * flat[b + W] + fx * fy * flat[b + W + 1]) >> 16
        out[k][ok] = v.astype(np.uint8)
    dst._ai[...] = out.reshape(dst._ai.shape)
    _cost(w * h * 4)
    return None


# ---------------------------------------------------------------------------------------------
def _load_file(data: bytes, path: str):
    import io

    from PIL import Image as P
    if data[:2] == b"BM" or data[:3] == b"\xff\xd8\xff":
        try:
            pil = P.open(io.BytesIO(data))
            pil.load()
        except (OSError, ValueError, SyntaxError):
            raise OSError(5, "EIO") from None
        if pil.mode in ("L", "1", "I;16"):
            return np.asarray(pil.convert("L"), np.uint8), GRAYSCALE
        return _lattice(np.asarray(pil.convert("RGB"), np.uint8)), RGB565
    raise ValueError("format not supported")


def new_image(*args, **kwargs):
    """image.Image([path | bytes][, copy_to_fb][, size=(w, h)][, from_bytes]): copy_to_fb,
    from_bytes and size all read positional slot 1 (docs/maixpy-firmware.md#image-constructor)."""
    A.ignore_unknown("image.Image", kwargs, {"copy_to_fb", "size", "from_bytes"})
    b = _board.current()
    src = args[0] if args else None
    size = A.kw(args, kwargs, "size", 1, None)
    from_bytes = A.kw(args, kwargs, "from_bytes", 1, False)
    if src is None:
        w, h = 320, 240
        if size is not None and not isinstance(size, bool) and isinstance(size, (tuple, list)):
            sw, sh = (A.get_int(v) for v in A.seq(size, 2))
            if sw > 0 and sh > 0:
                w, h = sw, sh
        img = Image(np.zeros((h, w, 3), np.uint8), RGB565)
        _cost(w * h)
        return img
    if isinstance(src, (bytes, bytearray)):
        if not from_bytes:
            raise TypeError("Can't convert bytes to str")
        px, fmt = _load_file(bytes(src), "<bytes>")
        return Image(px, fmt)
    if not isinstance(src, str):
        raise TypeError(f"can't convert {A.type_name(src)} to str")
    data = b.vfs.read_bytes(src)
    px, fmt = _load_file(data, src)
    _board.current().clock.advance(len(data) * 0.05 + px.shape[0] * px.shape[1] * 0.05)
    return Image(px, fmt)


def load_file(path) -> Image:
    """Host helper: a photo as the camera would hand it over (RGB565)."""
    from PIL import Image as P
    return Image._from_rgb(np.asarray(P.open(path).convert("RGB"), np.uint8))


class _Font:
    def __init__(self):
        self.loaded = None


def make_module(s):
    from tl2k210.maixpy.modules import module

    def font_load(*args, **kwargs):
        s.board.note("image.font_load: custom fonts are not emulated; the built-in 8x12 font "
                     "is used", "font_load")

    def font_free():
        return None

    class HaarCascade:
        def __init__(self, *a, **k):
            s.board.note("image.HaarCascade / find_features: not emulated", "haar")

    class ImageWriter:
        def __init__(self, *a, **k):
            raise oserror(95)

    ImageReader = ImageWriter
    consts = dict(ASCII=0, UTF8=1, SEARCH_EX=0, SEARCH_DS=1, EDGE_CANNY=0, EDGE_SIMPLE=1,
                  CORNER_FAST=0, CORNER_AGAST=1, TAG16H5=1, TAG25H7=2, TAG25H9=4, TAG36H10=8,
                  TAG36H11=16, ARTOOLKIT=32, EAN2=2, EAN5=5, EAN8=8, UPCE=9, ISBN10=10, UPCA=12,
                  EAN13=13, ISBN13=14, I25=25, DATABAR=34, DATABAR_EXP=35, CODABAR=38, CODE39=39,
                  PDF417=57, CODE93=93, CODE128=128)
    return module("image", "MaixPy image (OpenMV) on the host", Image=new_image,
                  rgb_to_lab=rgb_to_lab, lab_to_rgb=lab_to_rgb, rgb_to_grayscale=rgb_to_grayscale,
                  grayscale_to_rgb=grayscale_to_rgb, font_load=font_load, font_free=font_free,
                  get_affine_transform=get_affine_transform, warp_affine_ai=warp_affine_ai,
                  HaarCascade=HaarCascade, ImageWriter=ImageWriter, ImageReader=ImageReader,
                  **consts)

"""MaixPy `lcd` module on the host (docs/maixpy-firmware.md#lcd): the screen is an RGB888 buffer; what it
shows becomes frames (`board.lcd_frames`, PNGs when the board has an output path).

A frame is the screen from one `lcd.display()` to the next: `lcd.draw_string`/`clear` after a
display change the current frame (what a viewer sees until the next display). The text drawn on
a frame (image draw_string of the displayed image + lcd.draw_string) is kept in
`board.lcd_texts` so tests can read what the script shows.

Output naming: `out` a folder -> frame_0000.png, frame_0001.png...; `out` a .png file -> the
first frame there, later ones NAME-1.png, NAME-2.png...
"""
from __future__ import annotations

import io

import numpy as np
from PIL import Image as _PIL

from tl2k210.maixpy import args as A
from tl2k210.maixpy import board as _board
from tl2k210.maixpy import font as _font
from tl2k210.maixpy import image as _image
from tl2k210.maixpy import timing

COLORS = dict(BLACK=0x0000, NAVY=0x0F00, DARKGREEN=0xE003, DARKCYAN=0xEF03, MAROON=0x0078,
              PURPLE=0x0F78, OLIVE=0xE07B, LIGHTGREY=0x18C6, DARKGREY=0xEF7B, BLUE=0x1F00,
              GREEN=0xE007, CYAN=0xFF07, RED=0x00F8, MAGENTA=0x1FF8, YELLOW=0xE0FF,
              WHITE=0xFFFF, ORANGE=0x20FD, GREENYELLOW=0xE5AF, PINK=0x1FF8)
globals().update(COLORS)
TYPE_SIZES = {2: (240, 240), 3: (240, 135), 4: (240, 240)}


class State:
    def __init__(self):
        self.inited = False
        self.type = None
        self.w, self.h = 320, 240
        self.rot = 0
        self.mirror = 0
        self.freq = 15_000_000
        self.fb = None
        self.current = None        # index of the frame being shown


def _s() -> State:
    b = _board.current()
    if b.lcd is None:
        b.lcd = State()
    return b.lcd


def _rgb(color):
    return np.array(A.color(color, False), np.uint8)


def init(*args, **kwargs):
    w0, h0 = _board.current().profile.lcd_size      # the build's CONFIG_LCD_DEFAULT_WIDTH/HEIGHT
    a = A.parse_all(args, kwargs, [
        ("type", 1), ("freq", 15_000_000), ("color", BLACK), ("width", w0), ("height", h0),
        ("invert", 0), ("offset_w0", 0), ("offset_h0", 0), ("offset_w1", 0), ("offset_h1", 0),
        ("rst", 37), ("dcx", 38), ("ss", 36), ("clk", 39)])
    t = A.get_int(a["type"])
    # v0.6.2 py_lcd.c py_lcd_init: LCD_NONE, SHIELD, IPS_240X240, M5STICK, TWATCH (0-4); no
    # lcd_type keyword (a panel's lcd_type comes from /flash/config.json, py_lcd_load_config)
    if t not in range(0, 5):
        raise ValueError("type error")
    st = State()
    b = _board.current()
    b.lcd = st
    st.type = t
    if t == 0:
        return None
    st.inited = True
    st.freq = A.get_int(a["freq"])
    st.w, st.h = TYPE_SIZES.get(t, (A.get_int(a["width"]), A.get_int(a["height"])))
    st.fb = np.zeros((st.h, st.w, 3), np.uint8)
    st.fb[...] = _rgb(a["color"])
    b.clock.advance(120_000 + timing.lcd_display_us(st.w * st.h, st.freq))
    return None


def deinit(*args, **kwargs):
    _s().inited = False


def width():
    st = _s()
    if st.type == 0 or st.type is None and not st.inited:
        return None if st.type == 0 else 320
    return st.h if st.rot % 2 else st.w


def height():
    st = _s()
    if st.type == 0 or st.type is None and not st.inited:
        return None if st.type == 0 else 240
    return st.w if st.rot % 2 else st.h


def type(*args):
    return _s().type


def rotation(*args):
    st = _s()
    if args:
        r = A.get_int(args[0])
        if not 0 <= r <= 3:
            raise ValueError("value:[0,3]")
        if r != st.rot and st.fb is not None:
            # py_lcd_rotation only sets the panel's scan direction (lcd_set_direction): its
            # memory keeps the pixels, seen turned in the new coordinates
            st.fb = np.ascontiguousarray(np.rot90(st.fb, k=(st.rot - r) % 4))
        st.rot = r
    return st.rot


def mirror(*args):
    st = _s()
    if args:
        st.mirror = int(bool(args[0]))
    return st.mirror


def direction(*args):
    return 0


def freq(*args):
    st = _s()
    if args:
        st.freq = A.get_int(args[0])
    return st.freq


def set_backlight(*args):
    return None


def get_backlight(*args):
    return None


def register(*args):
    return None


def bgr_to_rgb(*args):
    return None


def _screen():
    st = _s()
    if st.fb is None or st.fb.shape[:2] != (height(), width()):
        st.fb = np.zeros((height(), width(), 3), np.uint8)
    return st.fb


def clear(*args, **kwargs):
    """clear([color]): positional only; `color=` is ignored (so clears to black), as on a board."""
    if kwargs:
        A.ignore_unknown("lcd.clear", kwargs, set())
    st = _s()
    if not st.inited:
        return None
    fb = _screen()
    fb[...] = _rgb(args[0]) if args else 0
    _touch(clear_texts=True)
    _board.current().clock.advance(timing.lcd_display_us(fb.shape[0] * fb.shape[1], st.freq))
    return None


def fill_rectangle(*args, **kwargs):
    A.check_arity(args, 5, 5)
    x, y, w, h = (A.get_int(v) for v in args[:4])
    fb = _screen()
    fb[max(0, y):max(0, y + h), max(0, x):max(0, x + w)] = _rgb(args[4])
    _touch()
    return None


def draw_string(*args, **kwargs):
    """draw_string(x, y, text[, fg=RED, bg=BLACK]): 3-5 positional ints, no keywords; 8x12
    cells; truncated at the right edge; nothing when x >= width or y > width - 16, the width
    lcd.init configured (py_lcd_draw_string: lcd_para.width, which lcd.rotation does not swap;
    v0.6.2 compares y with the configured height), x and y taken as uint16 (a negative one
    wraps: nothing)."""
    if kwargs:
        raise TypeError("function doesn't take keyword arguments")
    A.check_arity(args, 3, 5)
    st = _s()
    if not st.inited:
        raise ValueError("not init")
    x, y = A.get_int(args[0]) & 0xFFFF, A.get_int(args[1]) & 0xFFFF
    text = args[2]
    if not isinstance(text, str):
        raise TypeError(f"can't convert {A.type_name(text)} to str")
    fg = A.get_int(args[3]) if len(args) > 3 else RED
    bg = A.get_int(args[4]) if len(args) > 4 else BLACK
    if x >= st.w or y > st.w - 16:
        return None
    text = text[:max(0, (st.w - x) // 8)]
    fb = _screen()
    fgc, bgc = np.array(A.raw565_to_rgb(fg), np.uint8), np.array(A.raw565_to_rgb(bg), np.uint8)
    H, W = fb.shape[:2]
    for i, ch in enumerate(text):
        g = _font.glyph(ch if 32 <= ord(ch) <= 126 else "\x00")
        cx = x + 8 * i
        y0, y1, x0, x1 = max(0, y), min(H, y + _font.H), max(0, cx), min(W, cx + _font.W)
        if y0 >= y1 or x0 >= x1:
            continue
        cell = np.where(g[y0 - y:y1 - y, x0 - cx:x1 - cx, None], fgc, bgc)
        fb[y0:y1, x0:x1] = cell
    _touch(text=(x, y, text))
    _board.current().clock.advance(timing.lcd_display_us(len(text) * 96, st.freq) + timing.CALL_US)
    return None


def display(*args, **kwargs):
    """display(img[, roi[, oft]]): centred (black border) or centre-cropped without `oft`;
    at oft=(x, y) without clearing the rest. Silently nothing before lcd.init()."""
    A.ignore_unknown("lcd.display", kwargs, {"roi", "oft"})
    A.check_arity(args, 1)
    img = args[0]
    st = _s()
    b = _board.current()
    if not st.inited:
        b.note("lcd.display before lcd.init(): the board's display does nothing", "lcd-noinit")
        return None
    if not isinstance(img, _image.Image):
        raise TypeError("Can't convert <class 'type'> to type")
    if img.format() == _image.JPEG:
        raise OSError("Image format is not supported.")
    roi = A.kw(args, kwargs, "roi", 1, None)
    oft = A.kw(args, kwargs, "oft", 2, None)
    src = img._to_rgb888()
    if roi is not None:
        x, y, w, h = img._roi(roi)
        src = src[y:y + h, x:x + w]
    fb = _screen()
    H, W = fb.shape[:2]
    h, w = src.shape[:2]
    if oft is None:
        border = (h < H) or (w < W)
        sx, sy = max(0, (w - W) // 2), max(0, (h - H) // 2)
        part = src[sy:sy + H, sx:sx + W]
        ox, oy = (W - part.shape[1]) // 2, (H - part.shape[0]) // 2
        if border:
            fb[...] = 0
        fb[oy:oy + part.shape[0], ox:ox + part.shape[1]] = part
        shift = (ox - sx, oy - sy)
        cost_px = W * H if border else part.shape[0] * part.shape[1]
    else:
        ox, oy = (A.get_int(v) for v in A.seq(oft, 2))
        x0, y0, x1, y1 = max(0, ox), max(0, oy), min(W, ox + w), min(H, oy + h)
        if x0 < x1 and y0 < y1:
            fb[y0:y1, x0:x1] = src[y0 - oy:y1 - oy, x0 - ox:x1 - ox]
        shift = (ox, oy)
        cost_px = max(0, x1 - x0) * max(0, y1 - y0)
    texts = [(tx + shift[0], ty + shift[1], t) for tx, ty, t in img._texts]
    covered = (shift[0], shift[1], w, h) if oft is not None else (0, 0, W, H)
    _new_frame(texts, keep=oft is not None, covered=covered)
    b.clock.advance(timing.lcd_display_us(cost_px, st.freq))
    return None


# ---------------------------------------------------------------------------------------------
def _inside(t, rect):
    x, y, w, h = rect
    return x <= t[0] < x + w and y <= t[1] < y + h


def _lcd_only_cap(b):
    """Stop a script that keeps showing LCD frames without taking a camera frame."""
    if b.frames_taken == 0 and len(b.lcd_frames) >= _board.LCD_FRAMES_WITHOUT_CAMERA:
        flush(b)
        b.stop(f"lcd: {len(b.lcd_frames)} LCD frames shown and no camera frame taken: the run stops there", "lcd")


def _new_frame(texts, keep=False, covered=None):
    b = _board.current()
    st = _s()
    _lcd_only_cap(b)
    flush(b, upto=len(b.lcd_frames))
    prev = b.lcd_texts[-1] if (keep and b.lcd_texts) else []
    prev = [t for t in prev if covered is None or not _inside(t, covered)]
    b.lcd_frames.append(st.fb.copy())
    b.lcd_texts.append(list(prev) + list(texts))
    st.current = len(b.lcd_frames) - 1


def _touch(text=None, clear_texts=False):
    """The screen changed outside display(): update the frame being shown (or start one)."""
    b = _board.current()
    st = _s()
    if st.current is None or st.current != len(b.lcd_frames) - 1:
        _lcd_only_cap(b)
        flush(b, upto=len(b.lcd_frames))
        b.lcd_frames.append(st.fb.copy())
        b.lcd_texts.append([])
        st.current = len(b.lcd_frames) - 1
    else:
        b.lcd_frames[-1] = st.fb.copy()
        if clear_texts:
            b.lcd_texts[-1] = []
    if text is not None:
        b.lcd_texts[-1] = [t for t in b.lcd_texts[-1] if t[:2] != text[:2]] + [text]


def flush(b, upto=None):
    """Write the PNGs of frames [already written, upto) (default: all)."""
    if b.out is None:
        return
    upto = len(b.lcd_frames) if upto is None else upto
    from tl2k210.k210.kmodel import atomic_write
    while len(b.lcd_pngs) < upto:
        k = len(b.lcd_pngs)
        if b.out.suffix.lower() == ".png":
            path = b.out if k == 0 else b.out.with_name(f"{b.out.stem}-{k}{b.out.suffix}")
        else:
            b.out.mkdir(parents=True, exist_ok=True)
            path = b.out / f"frame_{k:04d}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        buf = io.BytesIO()
        _PIL.fromarray(b.lcd_frames[k]).save(buf, format="PNG")
        atomic_write(path, buf.getvalue())
        b.lcd_pngs.append(path)


def make_module(s):
    from tl2k210.maixpy.modules import module
    return module("lcd", "MaixPy lcd: frames and PNGs on the host", init=init, deinit=deinit,
                  width=width, height=height, type=type, rotation=rotation, mirror=mirror,
                  direction=direction, freq=freq, set_backlight=set_backlight,
                  get_backlight=get_backlight, register=register, bgr_to_rgb=bgr_to_rgb,
                  clear=clear, fill_rectangle=fill_rectangle, draw_string=draw_string,
                  display=display, **COLORS, XY_LRUD=0, XY_RLUD=0x40, XY_LRDU=0x80, XY_RLDU=0xC0,
                  YX_LRUD=0x20, YX_RLUD=0x60, YX_LRDU=0xA0, YX_RLDU=0xE0)

"""MaixPy `sensor` module on the host: the camera "sees" the board's queue of photos.

`snapshot()` takes the next photo, resizes it to the frame size (bilinear), crops the centre
window (`set_windowing`), applies mirror/flip, and delivers it in the pixel format (RGB565
quantisation like the OV2640's output, or grayscale), with the KPU AI buffer filled as the
MaixPy camera driver does. After the last photo it ends the script's loop (StopDemo).
"""
from __future__ import annotations

import numpy as np
from PIL import Image as _PIL

from tl2k210.maixpy import board as _board
from tl2k210.maixpy import image as _image

GRAYSCALE = _image.GRAYSCALE
RGB565 = _image.RGB565
YUV422 = 3
BAYER = 4
JPEG = 5

# framesize constants -> (w, h), as in OpenMV/MaixPy
_SIZES = {
    "QQQVGA": (80, 60), "QQVGA": (160, 120), "QQVGA2": (128, 160), "QVGA": (320, 240),
    "VGA": (640, 480), "HQQVGA": (120, 80), "HQVGA": (240, 160), "CIF": (352, 288),
    "QCIF": (176, 144), "B64X64": (64, 64), "B128X128": (128, 128), "B240X240": (240, 240),
    "B320X320": (320, 320), "SVGA": (800, 600),
}
for _i, _n in enumerate(_SIZES):
    globals()[_n] = 100 + _i
_BY_CODE = {100 + i: s for i, s in enumerate(_SIZES.values())}

OV2640_ID = 0x2642
OV7740_ID = 0x7742


class _State:
    def __init__(self):
        self.reset_done = False
        self.pixformat = RGB565
        self.framesize = _SIZES["QVGA"]
        self.window = None
        self.hmirror = self.vflip = False
        self.running = True


_s = _State()


def reset(freq=None, set_regs=True, dual_buff=False, choice=None):
    global _s
    _s = _State()
    _s.reset_done = True


def set_pixformat(fmt):
    if fmt not in (GRAYSCALE, RGB565):
        raise ValueError("Invalid Pixformat")   # the host camera delivers RGB565 / GRAYSCALE
    _s.pixformat = fmt
    return True


def set_framesize(size):
    if size not in _BY_CODE:
        raise ValueError("Invalid Framesize")
    _s.framesize = _BY_CODE[size]
    _s.window = None
    return True


def set_windowing(roi):
    """(w, h) centred, or (x, y, w, h), inside the frame."""
    fw, fh = _s.framesize
    if len(roi) == 2:
        w, h = roi
        x, y = (fw - w) // 2, (fh - h) // 2
    else:
        x, y, w, h = roi
    if w <= 0 or h <= 0 or x < 0 or y < 0 or x + w > fw or y + h > fh:
        raise ValueError("Invalid ROI dimensions!")
    _s.window = (int(x), int(y), int(w), int(h))
    return True


def set_hmirror(enable):
    _s.hmirror = bool(enable)


def set_vflip(enable):
    _s.vflip = bool(enable)


def run(enable):
    _s.running = bool(enable)
    return True


def skip_frames(n=None, time=None):
    """On a board this lets the exposure settle; the host camera has nothing to drop."""


def width():
    return (_s.window or (0, 0) + _s.framesize)[2]


def height():
    return (_s.window or (0, 0) + _s.framesize)[3]


def get_id():
    return OV2640_ID


def set_contrast(v):
    return True


set_brightness = set_saturation = set_auto_gain = set_auto_whitebal = set_auto_exposure = set_contrast
set_gainceiling = set_jb_quality = set_colorbar = set_contrast


def get_fb():
    return None


def snapshot():
    if not _s.reset_done:
        raise OSError("sensor not initialised: call sensor.reset() first (host camera)")
    b = _board.current()
    if b.frames_taken >= b.max_frames:
        raise _board.StopDemo(f"camera: no frame after {b.frames_taken}")
    src = b.images[b.frames_taken]
    b.frames_taken += 1
    pil = src if isinstance(src, _PIL.Image) else _load(src)
    fw, fh = _s.framesize
    if pil.size != (fw, fh):
        pil = pil.resize((fw, fh), _PIL.BILINEAR)
    rgb = np.asarray(pil.convert("RGB"), np.uint8)
    if _s.window:
        x, y, w, h = _s.window
        rgb = rgb[y:y + h, x:x + w]
    if _s.hmirror:
        rgb = rgb[:, ::-1]
    if _s.vflip:
        rgb = rgb[::-1]
    img = _image.Image.from_rgb(np.ascontiguousarray(rgb), _s.pixformat)
    img.pix_to_ai()   # the MaixPy camera DMA fills the AI buffer too
    return img


def _load(path):
    from tl2k210.imaging import load_rgb
    return load_rgb(path)

"""Images in and out, the way MaixPy sees them: RGB888 planar (CHW) uint8 for the KPU, the
camera's RGB565 path, and annotated PNGs."""
from __future__ import annotations

import numpy as np
from PIL import Image, ImageDraw

from tl2k210.errors import Tl2k210Error


def load_rgb(path) -> Image.Image:
    try:
        return Image.open(path).convert("RGB")
    except (OSError, ValueError) as exc:
        raise Tl2k210Error(f"cannot read image {path}: {exc}") from None


def rgb565_roundtrip(rgb: np.ndarray) -> np.ndarray:
    """HWC uint8 RGB888 -> RGB565 (what the sensor delivers) -> RGB888 as MaixPy's
    ``pix_to_ai`` expands it (OpenMV COLOR_R5_TO_R8 / COLOR_G6_TO_G8)."""
    rgb = rgb.astype(np.int32)
    r5, g6, b5 = rgb[..., 0] >> 3, rgb[..., 1] >> 2, rgb[..., 2] >> 3
    r8 = (r5 * 527 + 23) >> 6
    g8 = (g6 * 259 + 33) >> 6
    b8 = (b5 * 527 + 23) >> 6
    return np.stack([r8, g8, b8], -1).astype(np.uint8)


def to_model_input(img: Image.Image, shape, rgb565: bool = False) -> np.ndarray:
    """Resize to the model's (C, H, W) and return planar uint8 (grayscale when C == 1)."""
    c, h, w = shape
    im = img.resize((w, h), Image.BILINEAR) if img.size != (w, h) else img
    if c == 1:
        return np.asarray(im.convert("L"), np.uint8)[None]
    if c != 3:
        raise Tl2k210Error(f"model input has {c} channels; images give 1 (gray) or 3 (RGB)")
    hwc = np.asarray(im, np.uint8)
    if rgb565:
        hwc = rgb565_roundtrip(hwc)
    return np.ascontiguousarray(hwc.transpose(2, 0, 1))


def draw_boxes(img: Image.Image, boxes, labels=None, scale=(1.0, 1.0)) -> Image.Image:
    out = img.copy()
    d = ImageDraw.Draw(out)
    sx, sy = scale
    for b in boxes:
        x0, y0 = b.x * sx, b.y * sy
        x1, y1 = (b.x + b.w) * sx, (b.y + b.h) * sy
        d.rectangle([x0, y0, x1, y1], outline=(255, 40, 40), width=max(2, out.width // 200))
        name = labels[b.classid] if labels and b.classid < len(labels) else str(b.classid)
        text = f"{name} {b.value:.2f}"
        tw = d.textlength(text)
        d.rectangle([x0, max(0, y0 - 12), x0 + tw + 4, max(12, y0)], fill=(255, 40, 40))
        d.text((x0 + 2, max(0, y0 - 12)), text, fill=(255, 255, 255))
    return out

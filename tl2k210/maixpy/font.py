"""The 8x12 ASCII font of `draw_string` (OpenMV's built-in font is 8 wide, 12 high, ' '..'~').

The firmware's glyph bitmaps are not in our sources, so the glyph shapes come from Pillow's
built-in bitmap font, each placed in an 8x12 cell; sizes, advances, line spacing, scaling and the
box drawn for characters outside ' '..'~' follow the firmware (docs/maixpy-firmware.md#methods), so text lands
where it would on a board, in a different typeface.
"""
from __future__ import annotations

import functools

import numpy as np

W, H = 8, 12


@functools.lru_cache(maxsize=1)
def glyphs() -> dict:
    from PIL import Image, ImageDraw, ImageFont
    try:
        font = ImageFont.load_default_imagefont()
    except AttributeError:            # Pillow < 10.1
        font = ImageFont.load_default()
    out = {}
    for code in range(32, 127):
        im = Image.new("L", (W, H), 0)
        ImageDraw.Draw(im).text((1, 0), chr(code), font=font, fill=255)
        out[chr(code)] = np.asarray(im) > 127
    box = np.zeros((H, W), bool)        # what the firmware draws for other characters
    box[2:10, 1] = box[2:10, 6] = True
    box[2, 1:7] = box[9, 1:7] = True
    out[None] = box
    return out


def glyph(ch: str) -> np.ndarray:
    g = glyphs()
    return g.get(ch, g[None])


def columns(g: np.ndarray):
    """(first, last) set column of a glyph, None for a blank one."""
    cols = np.nonzero(g.any(0))[0]
    return (int(cols[0]), int(cols[-1])) if cols.size else None

"""Images in and out, the way MaixPy sees them: RGB888 planar (CHW) uint8 for the KPU, the
camera's RGB565 path, and annotated PNGs."""
from __future__ import annotations

import numpy as np
from PIL import Image, ImageDraw

from tl2k210.errors import InputFileError, Tl2k210Error


# The largest picture decoded (PIL's own warning level): far above any camera frame or photo a
# K210 model sees (its input is at most 512x256), far below what exhausts memory.
MAX_PIXELS = 89_478_485


def open_image(path, mode: str = "RGB") -> Image.Image:
    """An image file as a PIL image in `mode` ("RGB" or "L"), refusing what would give wrong
    pixels or exhaust memory: decompression bombs (by the size the header declares, before
    decoding), float images; 16-bit images are scaled to 8 bits (not clipped to white),
    palette/CMYK/alpha modes converted, EXIF orientation applied (a phone photo is upright as the
    user sees it), the first frame of an animation taken (and said)."""
    import sys

    from PIL import ImageOps
    limit, Image.MAX_IMAGE_PIXELS = Image.MAX_IMAGE_PIXELS, None    # we check the size ourselves
    try:
        im = Image.open(path)                    # lazy: reads the header only
    except FileNotFoundError:
        raise InputFileError(f"{path}: no such file; check the path") from None
    except IsADirectoryError:
        raise InputFileError(f"{path} is a folder, not an image; give an image file") from None
    except Exception as exc:  # PIL raises many types (OSError, SyntaxError, ValueError...)
        raise InputFileError(f"cannot read image {path}: {exc}; give a jpg/png/bmp file, or remove this one") from None
    finally:
        Image.MAX_IMAGE_PIXELS = limit
    if im.width * im.height > MAX_PIXELS:
        raise InputFileError(f"image {path} declares {im.width}x{im.height} pixels, more than the "
                             f"{MAX_PIXELS // 10**6} Mpx tl2k210 decodes (a decompression bomb?); "
                             "downscale it first (the model input is at most 512x256)")
    try:
        frames = getattr(im, "n_frames", 1)
        if frames > 1:
            print(f"note: {path} has {frames} frames; using the first", file=sys.stderr)
        im.load()
        im = ImageOps.exif_transpose(im)
        if im.mode == "F":
            raise InputFileError(f"{path} is a floating-point image: its pixel range is unknown; "
                                 "save it as 8-bit (or pass the values as a .npy array)")
        if im.mode.startswith("I"):              # I;16* (16-bit), I (32-bit int; 16-bit PNG in old PIL)
            a = np.asarray(im)
            lo, hi = int(a.min(initial=0)), int(a.max(initial=0))
            if im.mode == "I" and im.format != "PNG" and 0 <= lo and hi <= 255:
                im = Image.fromarray(a.astype(np.uint8), "L")
            elif 0 <= lo and hi <= 65535:
                im = Image.fromarray((a.astype(np.uint32) >> 8).astype(np.uint8), "L")
            else:
                raise InputFileError(f"{path}: 32-bit integer pixels {lo}..{hi} are no image range; "
                                     "save it as 8- or 16-bit")
        if im.mode in ("RGBA", "LA", "PA") or (im.mode == "P" and "transparency" in im.info):
            im = im.convert("RGBA" if mode == "RGB" else "LA")
        return im.convert(mode)
    except InputFileError:
        raise
    except Exception as exc:
        raise InputFileError(f"cannot decode image {path}: {exc}; the file is truncated, corrupt or "
                             "in a pixel format tl2k210 does not convert") from None


def load_rgb(path) -> Image.Image:
    return open_image(path, "RGB")


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

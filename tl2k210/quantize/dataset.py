"""Calibration / evaluation inputs: a folder of images or .npy/.npz arrays -> NCHW float32 batches.

Images are resized with PIL bilinear to the model's input size (what MaixPy's image.resize does),
converted to RGB (or BGR), scaled from 0..255 to `input_range`, then (x - mean) / std.
"""
from dataclasses import dataclass
from pathlib import Path

import numpy as np

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp")


@dataclass(frozen=True)
class Preprocess:
    input_range: tuple = (0.0, 1.0)   # 0..255 pixels map linearly onto this range
    mean: tuple = (0.0,)
    std: tuple = (1.0,)
    channel_order: str = "RGB"         # or "BGR"

    def __call__(self, pixels):
        """HWC uint8-range pixels -> HWC float32 model input."""
        lo, hi = self.input_range
        x = pixels.astype(np.float32) * np.float32((hi - lo) / 255.0) + np.float32(lo)
        if self.channel_order.upper() == "BGR":
            x = x[..., ::-1]
        return (x - np.asarray(self.mean, np.float32)) / np.asarray(self.std, np.float32)


def parse_range(text):
    """'0,1' / '-1,1' / '0,255' -> (lo, hi)."""
    lo, hi = (float(v) for v in str(text).split(","))
    if hi <= lo:
        raise ValueError(f"input range {text!r}: max must exceed min")
    return lo, hi


def image_files(folder):
    files = sorted(p for p in Path(folder).iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
    if not files:
        raise FileNotFoundError(f"{folder}: no {'/'.join(IMAGE_SUFFIXES)} images")
    return files


def load_image(path, shape, pre=Preprocess()):
    """One image -> (1, C, H, W) float32 for an NCHW model input of `shape` (C = 1 or 3)."""
    from PIL import Image
    _, c, h, w = shape
    img = Image.open(path).convert("L" if c == 1 else "RGB")
    if img.size != (w, h):
        img = img.resize((w, h), Image.BILINEAR)
    x = np.asarray(img)
    x = pre(x[..., None] if c == 1 else x)
    return np.ascontiguousarray(x.transpose(2, 0, 1)[None])


def _arrays(path):
    if path.suffix == ".npz":
        with np.load(path) as z:
            return [z[k] for k in z.files]
    return [np.load(path)]


def load_arrays(path, shape, layout="NCHW"):
    """.npy/.npz (or a folder of them) -> list of (1, C, H, W) float32; `layout` of the stored data
    is "NCHW" or "NHWC" (a single sample without batch dim is accepted too)."""
    path = Path(path)
    files = sorted(path.glob("*.np[yz]")) if path.is_dir() else [path]
    out = []
    for a in (a for f in files for a in _arrays(f)):
        a = np.asarray(a, np.float32)
        if a.ndim == len(shape) - 1:
            a = a[None]
        if layout == "NHWC" and a.ndim == 4:
            a = a.transpose(0, 3, 1, 2)
        if tuple(a.shape[1:]) != tuple(shape[1:]):
            raise ValueError(f"{path}: samples of shape {a.shape[1:]}, model input is {tuple(shape[1:])} "
                             f"({'NCHW' if len(shape) == 4 else ''}; use layout='NHWC' for channels-last data)")
        out += [s[None] for s in a]
    return out


def load_dataset(path, shape, pre=Preprocess(), layout="NCHW", limit=None):
    """Folder of images, folder of arrays, or one .npy/.npz -> list of (1, C, H, W) float32."""
    path = Path(path)
    if path.is_dir() and not any(path.glob("*.np[yz]")):
        files = image_files(path)[:limit]
        return [load_image(f, shape, pre) for f in files]
    return load_arrays(path, shape, layout)[:limit]

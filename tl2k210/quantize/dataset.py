"""Calibration / evaluation inputs: a folder of images or .npy/.npz arrays -> NCHW float32 batches.

Images are resized with PIL bilinear to the model's input size (what MaixPy's image.resize does),
converted to RGB (or BGR), scaled from 0..255 to `input_range`, then (x - mean) / std.
"""
import sys
from dataclasses import dataclass
from itertools import zip_longest
from pathlib import Path

import numpy as np

from tl2k210.errors import InputFileError

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
    try:
        lo, hi = (float(v) for v in str(text).split(","))
    except ValueError:
        raise ValueError(f"input range {text!r}: give MIN,MAX, e.g. 0,1 or -1,1") from None
    if not (np.isfinite(lo) and np.isfinite(hi)) or hi <= lo:
        raise ValueError(f"input range {text!r}: MAX must exceed MIN (both finite)")
    return lo, hi


def array_files(folder) -> list:
    """The .npy/.npz files of a dataset folder: regular files only (a FIFO would hang the read)."""
    return sorted(p for p in Path(folder).glob("*.np[yz]") if p.is_file())


def _images_in(folder) -> list:
    return sorted(p for p in Path(folder).iterdir() if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())


def image_files(folder):
    """The images of a dataset folder; where it has none of its own, those of its subfolders
    (a class-per-folder dataset, `train/cat/*.jpg`), taken a folder at a time in turn so that the
    first N (--calib-limit) span every class rather than the first one."""
    files = _images_in(folder)
    if not files:
        subs = sorted(d for d in Path(folder).rglob("*")
                      if d.is_dir() and not any(p.startswith(".") for p in d.relative_to(folder).parts))
        per = [f for f in (_images_in(d) for d in subs) if f]
        files = [f for row in zip_longest(*per) for f in row if f is not None]
    if not files:
        raise InputFileError(f"dataset {folder}: no images ({'/'.join(IMAGE_SUFFIXES)}) and no "
                             ".npy/.npz arrays in this folder or its subfolders; put calibration "
                             "images like the camera sees there, or pass a .npy/.npz file")
    return files


def load_image(path, shape, pre=Preprocess()):
    """One image -> (1, C, H, W) float32 for an NCHW model input of `shape` (C = 1 or 3)."""
    from PIL import Image

    from tl2k210.imaging import open_image
    _, c, h, w = shape
    img = open_image(path, "L" if c == 1 else "RGB")
    if img.size != (w, h):
        img = img.resize((w, h), Image.BILINEAR)
    x = np.asarray(img)
    x = pre(x[..., None] if c == 1 else x)
    return np.ascontiguousarray(x.transpose(2, 0, 1)[None])


def _samples(a, shape, where, keep_dtype=False, flat=None):
    """(N, *shape[1:]) float32 (or the stored dtype) from one stored array: NCHW (or channels-last
    NHWC, transposed and said; a one-channel input's maps without their channel axis), with or
    without the batch dimension (or with one a sample: N x TFLite's (1, 1, 257)); with `flat`
    ("NCHW", or "NHWC" where passes.input_nchw made the source's NHWC input NCHW), samples of a
    lower rank with as many values too, in the order the source model reads them (a keyword
    spotter's (T, F) frames given a batch axis, whose graph reshapes them to (1, T, 1, F))."""
    from tl2k210.arrays import check_finite
    want = tuple(shape[1:])
    with np.errstate(over="ignore"):
        as32 = np.asarray(a, np.float32)
    check_finite(as32, f"{where} (as float32)")
    a = np.asarray(a) if keep_dtype else as32
    if len(want) == 3 and want[0] == 1 and a.ndim in (2, 3) and tuple(a.shape[-2:]) == want[1:]:
        return a.reshape((-1,) + want)      # one-channel maps (MNIST's arrays): (N,) H, W
    if flat and 2 <= a.ndim <= len(want) and int(np.prod(a.shape[1:])) == int(np.prod(want)):
        print(f"note: {where}: samples {a.shape[1:]} read as the model input {want}: their values in the "
              "order the source model reads them", file=sys.stderr)
        if flat == "NHWC" and len(want) == 3:
            return np.ascontiguousarray(a.reshape((-1, want[1], want[2], want[0])).transpose(0, 3, 1, 2))
        return a.reshape((-1,) + want)
    if len(want) == 3 and 2 <= a.ndim <= len(want) and int(np.prod(a.shape[1:])) == int(np.prod(want)):
        # N samples without the input's axes of 1: a keyword spotter's (N, 47, 13) MFCCs for its
        # (47, 1, 13) TFLite input (hunt 21), in the order of the NCHW or the channels-last shape
        # (a vector's rows, one axis over 1, as below: validate's flat float rows)
        c, h, w = want
        big = [d for d in a.shape[1:] if d != 1]
        for order, dims in (("NCHW", want), ("channels-last", (h, w, c))) if len(big) > 1 else ():
            if big == [d for d in dims if d != 1]:
                print(f"note: {where}: samples {a.shape[1:]} read as {order} {dims}", file=sys.stderr)
                x = a.reshape((-1,) + dims)
                return x if order == "NCHW" else np.ascontiguousarray(x.transpose(0, 3, 1, 2))
    if a.ndim == len(shape) - 1:
        a = a[None]
    if a.ndim == len(want) + 2 and a.shape[1] == 1:     # each sample with its own batch axis of 1
        print(f"note: {where}: samples {a.shape[1:]} each with a batch axis of 1, read as {a.shape[2:]}",
              file=sys.stderr)
        a = a[:, 0]
    if tuple(a.shape[1:]) == want:
        return a
    if a.ndim == 4 and len(want) == 3 and tuple(a.shape[1:]) == (want[1], want[2], want[0]):
        print(f"note: {where}: channels-last samples {a.shape[1:]}, transposed to the model's "
              f"{want} (NCHW)", file=sys.stderr)
        return np.ascontiguousarray(a.transpose(0, 3, 1, 2))
    last = f" or {(want[1], want[2], want[0])} channels-last" if len(want) == 3 else ""
    raise InputFileError(f"dataset {where}: samples of shape {tuple(a.shape[1:])}; the model input "
                         f"is {want}{last}, with or without a leading batch dimension: resize or "
                         "reshape the arrays")


def load_arrays(path, shape, layout=None, keep_dtype=False, flat=None):
    """.npy/.npz (or a folder of them) -> list of (1, C, H, W) float32 (the stored dtype with
    `keep_dtype`). Stored data may be NCHW or NHWC (`layout` forces one), with or without the
    batch dimension; numbers only, finite."""
    from tl2k210.arrays import load_any
    path = Path(path)
    if path.suffix.lower() in IMAGE_SUFFIXES:
        raise InputFileError(f"dataset {path} is one image; put the calibration images (tens to "
                             "hundreds, like the camera sees) in a folder and pass the folder")
    files = array_files(path) if path.is_dir() else [path]
    out = []
    for f in files:
        for name, a in load_any(f):
            if layout == "NHWC" and a.ndim == 4:
                a = a.transpose(0, 3, 1, 2)
            out += [s[None] for s in _samples(a, shape, name, keep_dtype, flat)]
    if not out:
        raise InputFileError(f"dataset {path}: no samples (the arrays are empty)")
    return out


def load_dataset(path, shape, pre=Preprocess(), layout=None, limit=None):
    """Folder of images, folder of arrays, or one .npy/.npz -> list of (1, C, H, W) float32."""
    path = Path(path)
    if not path.exists():
        raise InputFileError(f"dataset {path}: no such file or folder; check the path")
    if path.is_dir() and not array_files(path):
        files = image_files(path)[:limit]
        return [load_image(f, shape, pre) for f in files]
    return load_arrays(path, shape, layout)[:limit]

"""Seeded, offline data for the style-transfer network (nothing downloaded).

  style        skimage.data.immunohistochemistry() (512x512 IHC stain: brown/blue/violet texture)
  content      the testdata ImageNet photos (except tiger.jpg / tiger224.bmp), skimage coffee and
               rocket, sklearn's china.jpg and flower.jpg, matplotlib's grace_hopper.jpg;
               random 128x128 crops at random scales, random horizontal flips
  HELD OUT     skimage astronaut and chelsea, testdata imagenet/tiger.jpg: evaluation and the
               README sample only -- never used for training or calibration.

Training batch i comes from np.random.default_rng([TRAIN_SEED, i]) (a resumed run sees the same
batches); calibration from CALIB_SEED.
"""
from __future__ import annotations

import functools

import numpy as np

from tl2k210 import paths

SIZE = 128
TRAIN_SEED, CALIB_SEED = 5, 4242


def style_image() -> np.ndarray:
    from skimage import data
    return np.asarray(data.immunohistochemistry(), np.uint8)


def _rgb(a) -> np.ndarray:
    a = np.asarray(a)
    if a.ndim == 2:
        a = np.repeat(a[..., None], 3, 2)
    return np.ascontiguousarray(a[..., :3].astype(np.uint8))


@functools.lru_cache(maxsize=None)
def content_photos() -> tuple:
    from PIL import Image
    from skimage import data
    from sklearn.datasets import load_sample_images
    import matplotlib.cbook as cbook
    out = [data.coffee(), data.rocket()] + list(load_sample_images().images)
    with cbook.get_sample_data("grace_hopper.jpg") as fh:
        out.append(np.asarray(Image.open(fh).convert("RGB")))
    imagenet = paths.testdata("imagenet")
    for p in sorted(imagenet.glob("*.JPEG")) if imagenet else []:
        out.append(np.asarray(Image.open(p).convert("RGB")))
    return tuple(_rgb(a) for a in out)


def heldout_photos() -> dict:
    """name -> HWC uint8 photo (full size)."""
    from PIL import Image
    from skimage import data
    out = {"astronaut": data.astronaut(), "chelsea": data.chelsea()}
    tiger = paths.testdata("imagenet", "tiger.jpg")
    if tiger is not None:
        out["tiger"] = np.asarray(Image.open(tiger).convert("RGB"))
    return {k: _rgb(v) for k, v in out.items()}


def center_square(img: np.ndarray, size: int = SIZE) -> np.ndarray:
    """Centre square crop resized to size x size (what the camera's set_windowing + resize give)."""
    from PIL import Image
    h, w = img.shape[:2]
    s = min(h, w)
    y, x = (h - s) // 2, (w - s) // 2
    return np.asarray(Image.fromarray(img[y:y + s, x:x + s]).resize((size, size), Image.BILINEAR))


def random_crop(img: np.ndarray, rng, size: int = SIZE) -> np.ndarray:
    from PIL import Image
    h, w = img.shape[:2]
    side = int(rng.uniform(0.35, 1.0) * min(h, w))
    side = max(side, min(size, h, w))
    y, x = int(rng.integers(0, h - side + 1)), int(rng.integers(0, w - side + 1))
    crop = np.asarray(Image.fromarray(img[y:y + side, x:x + side]).resize((size, size), Image.BILINEAR))
    return crop[:, ::-1] if rng.random() < 0.5 else crop


def train_batch(i: int, batch: int, size: int = SIZE) -> np.ndarray:
    """NHWC float32 in [0, 1]."""
    rng = np.random.default_rng([TRAIN_SEED, i])
    photos = content_photos()
    return np.stack([random_crop(photos[int(rng.integers(len(photos)))], rng, size)
                     for _ in range(batch)]).astype(np.float32) / 255.0


def calibration_images(n: int = 24) -> list:
    """HWC uint8 128x128 crops of the training photos (never the held-out ones)."""
    rng = np.random.default_rng(CALIB_SEED)
    photos = content_photos()
    return [random_crop(photos[k], rng) for k in rng.permutation(len(photos))[:n]]

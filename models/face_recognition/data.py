"""Real-face data for the face embedder: 64x64 RGB uint8 crops.

Training (fetched, never committed: `../shared/data/get-face-training.sh MIRROR OUT`, research
use only, see the zoo README): the LFW people of View-2 folds 2-10 (`pairs.txt`; the folds are
identity-disjoint, fold 1 is the test) with 2 or more images, all their images.
Evaluation (`../shared/testdata/faces`): lfw_fold1 (300 same + 300 different pairs) and
orl_att (40 people x 10).

Crops are fixed, no alignment: the central CROP x CROP square of the 250x250 LFW image
(the unaligned LFW images are centred on the face by the Viola-Jones detector that built LFW),
and the upper 92x92 square of the 92x112 ORL images offset by ORL_TOP rows. Training jitters that
crop (scale, shift, small rotation), flips, colour/grey/blur.
"""
from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

import numpy as np

SIZE = 64
CROP = 130            # px of the 250x250 LFW image, centred (the best of 90/110/130/150 for the anchor model on fold 2)
ORL_TOP = 10          # rows skipped at the top of the 92x112 ORL image (hair), 92x92 square below
TRAIN_SEED, CALIB_SEED = 1, 777
PRELOAD = 96          # training crops are kept in memory at 96x96 for a 1.4*CROP square


def _cv2():
    import cv2
    return cv2


def fail(msg: str):
    """Bad input (missing data, unreadable image): the message on stderr, exit status 2."""
    print(f"error: {msg}", file=sys.stderr)
    raise SystemExit(2)


def _read_rgb(path) -> np.ndarray:
    cv2 = _cv2()
    img = cv2.imread(str(path), cv2.IMREAD_COLOR)
    if img is None:
        fail(f"cannot read image {path}")
    return np.ascontiguousarray(img[..., ::-1])


def _resize(a, size):
    cv2 = _cv2()
    return cv2.resize(a, (size, size), interpolation=cv2.INTER_AREA if a.shape[0] > size else cv2.INTER_LINEAR)


def lfw_crop(img, crop=CROP) -> np.ndarray:
    """The fixed central crop of a 250x250 LFW image, at 64x64."""
    h, w = img.shape[:2]
    y0, x0 = (h - crop) // 2, (w - crop) // 2
    return _resize(img[y0:y0 + crop, x0:x0 + crop], SIZE)


def orl_crop(img) -> np.ndarray:
    if img.ndim == 2:
        img = np.repeat(img[..., None], 3, 2)
    w = img.shape[1]
    return _resize(np.ascontiguousarray(img[ORL_TOP:ORL_TOP + w]), SIZE)


# ------------------------------------------------------------------ LFW folds
def read_pairs(path) -> list:
    """pairs.txt (or a fold of it) -> [(name1, n1, name2, n2)] in file order."""
    out = []
    for line in open(path):
        p = line.split()
        if len(p) == 3:
            out.append((p[0], int(p[1]), p[0], int(p[2])))
        elif len(p) == 4:
            out.append((p[0], int(p[1]), p[2], int(p[3])))
    return out


def lfw_path(root, name, n) -> Path:
    return Path(root) / name / f"{name}_{n:04d}.jpg"


def training_dir(path=None) -> Path:
    p = path or os.environ.get("TL2K210_FACE_DATA")
    if not p or not (Path(p) / "lfw" / "pairs.txt").is_file():
        fail(f"face training data not found at {p!r}: run ../shared/data/get-face-training.sh "
                         "MIRROR OUT and pass --data OUT (or set TL2K210_FACE_DATA)")
    return Path(p)


def folds(root) -> list:
    """The 10 View-2 folds of pairs.txt: [[(name1, n1, name2, n2)] * 600] * 10."""
    pairs = read_pairs(Path(root) / "lfw" / "pairs.txt")
    return [pairs[i * 600:(i + 1) * 600] for i in range(10)]


@functools.lru_cache(maxsize=None)
def train_identities(root, min_images: int = 2) -> list:
    """[(name, [image paths])]: people of folds 2-10 (none of fold 1) with >= min_images images
    (1: also the people with a single image, who add classes -- negatives -- but no pairs)."""
    fs = folds(root)
    test = {n for p in fs[0] for n in (p[0], p[2])}
    names = sorted({n for f in fs[1:] for p in f for n in (p[0], p[2])} - test)
    img_root = Path(root) / "lfw" / "images"
    out = []
    for name in names:
        files = sorted((img_root / name).glob("*.jpg"))
        if len(files) >= min_images:
            out.append((name, files))
    return out


@functools.lru_cache(maxsize=None)
def _train_images(root, min_images: int = 2):
    """(images uint8 (N, 96, 96, 3): the central 1.4*CROP square, labels int32 (N,))."""
    big = int(CROP * 1.4)
    imgs, labels = [], []
    for k, (_, files) in enumerate(train_identities(root, min_images)):
        for f in files:
            a = _read_rgb(f)
            y0, x0 = (a.shape[0] - big) // 2, (a.shape[1] - big) // 2
            imgs.append(_resize(a[y0:y0 + big, x0:x0 + big], PRELOAD))
            labels.append(k)
    return np.stack(imgs), np.asarray(labels, np.int32)


# Caltech 10k WebFaces (unlabelled extra faces for distillation, teacher.py --webfaces): the boxes of
# get-face-training.sh (caltech_webfaces/boxes_derived.txt: side 3x the range of eyes, nose, mouth).
# On the mean LFW image the eyes are 40 px apart and 47 px above the mouth, their mean 4 px below
# the centre: that box would be about 141 px, centred 0.03 of its side below CROP's centre, so the
# CROP-equivalent square is WEBFACES_FRAMING x the box, moved up by WEBFACES_UP x its side.
WEBFACES_FRAMING, WEBFACES_UP = CROP / 141, 0.03


@functools.lru_cache(maxsize=None)
def _webfaces_images(root, min_side: int = 24):
    """(images uint8 (N, 96, 96, 3): the 1.4*crop square around each Caltech WebFaces face whose
    CROP-equivalent square is >= min_side px (edge pixels repeated outside the photo), labels -1:
    no identity)."""
    cv2 = _cv2()
    d = Path(root) / "caltech_webfaces"
    if not (d / "boxes_derived.txt").is_file():
        fail(f"no Caltech WebFaces in {d}: run ../shared/data/get-face-training.sh")
    imgs, cache = [], {}
    for line in open(d / "boxes_derived.txt"):
        name, *box = line.split()
        x1, y1, x2, y2 = map(float, box)
        side = (x2 - x1) * WEBFACES_FRAMING
        if side < min_side:
            continue
        if name not in cache:
            cache = {name: _read_rgb(d / "images" / name)}    # the file is in image order
        a = cache[name]
        big = int(round(side * 1.4))
        x0 = int(round((x1 + x2 - big) / 2))
        y0 = int(round((y1 + y2) / 2 - WEBFACES_UP * (x2 - x1) - big / 2))
        p = max(0, -x0, -y0, x0 + big - a.shape[1], y0 + big - a.shape[0])
        a = cv2.copyMakeBorder(a, p, p, p, p, cv2.BORDER_REPLICATE) if p else a
        imgs.append(_resize(np.ascontiguousarray(a[y0 + p:y0 + p + big, x0 + p:x0 + p + big]), PRELOAD))
    return np.stack(imgs), np.full(len(imgs), -1, np.int32)


def augment(img96, rng) -> np.ndarray:
    """A jittered CROP-equivalent 64x64 crop of a preloaded 96x96 (1.4*CROP) square."""
    cv2 = _cv2()
    c = PRELOAD / 1.4 * np.exp(rng.uniform(-0.12, 0.12))   # crop side in preload px
    cx, cy = PRELOAD / 2 + rng.normal(0, 3, 2)
    ang = rng.uniform(-10, 10)
    m = cv2.getRotationMatrix2D((float(cx), float(cy)), float(ang), SIZE / c)
    m[:, 2] += (SIZE / 2 - cx, SIZE / 2 - cy)
    out = cv2.warpAffine(img96, m, (SIZE, SIZE), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_REFLECT_101)
    if rng.random() < 0.5:
        out = out[:, ::-1]
    x = out.astype(np.float32) / 255.0
    if rng.random() < 0.2:
        x = np.repeat(x.mean(2, keepdims=True), 3, 2)
    x = (x - 0.5) * rng.uniform(0.7, 1.3) + 0.5 + rng.uniform(-0.15, 0.15)
    x = x * rng.uniform(0.9, 1.1, 3).astype(np.float32)
    if rng.random() < 0.2:
        x = cv2.GaussianBlur(x, (0, 0), rng.uniform(0.4, 1.2))
    return (np.clip(x, 0, 1) * 255 + 0.5).astype(np.uint8)


def center_crop(img96) -> np.ndarray:
    """The un-jittered CROP-equivalent 64x64 crop of a preloaded 96x96 (1.4*CROP) square."""
    c = round(PRELOAD / 1.4)
    o = (PRELOAD - c) // 2
    return _resize(np.ascontiguousarray(img96[o:o + c, o:o + c]), SIZE)


def train_batch(step: int, size: int, root, min_images: int = 2):
    """(uint8 (size, 64, 64, 3), int32 labels) from rng([TRAIN_SEED, step])."""
    imgs, labels = _train_images(str(root), min_images)
    rng = np.random.default_rng([TRAIN_SEED, step])
    idx = rng.integers(0, len(imgs), size)
    return np.stack([augment(imgs[i], rng) for i in idx]), labels[idx]


def calibration_images(n: int = 100):
    """n 64x64 faces for the KPU quantization (the recipe's calibration set), from data that
    ship with the venv (so that `tl2k210 zoo build` needs no training data): skimage's
    lfw_subset faces (25x25 grey, tight crops: only activation ranges are taken from them, no
    labels) widened to the CROP framing by edge padding, every third one tinted, and the faces
    of skimage's astronaut and matplotlib's grace_hopper."""
    import matplotlib.cbook
    from PIL import Image
    from skimage import data as sk
    faces = sk.lfw_subset()[:100]
    rng = np.random.default_rng(CALIB_SEED)
    out = []
    for i, f in enumerate(faces[:max(0, n - 2)]):
        g = (np.pad(f, 7, mode="edge") * 255).astype(np.uint8)
        rgb = np.repeat(_resize(g, SIZE)[..., None], 3, 2).astype(np.float32)
        if i % 3 == 0:
            rgb = rgb * rng.uniform(0.75, 1.0, 3)
        out.append(np.clip(rgb, 0, 255).astype(np.uint8))
    with matplotlib.cbook.get_sample_data("grace_hopper.jpg") as fh:
        grace = np.asarray(Image.open(fh).convert("RGB"))
    out += [_resize(np.ascontiguousarray(sk.astronaut()[40:220, 145:325]), SIZE),
            _resize(np.ascontiguousarray(grace[100:360, 130:390]), SIZE)]
    return out[:n]


# ------------------------------------------------------------------ evaluation sets
def faces_dir(path=None) -> Path | None:
    if path:
        return Path(path)
    from tl2k210 import paths
    return paths.testdata("faces")


def lfw_pairs(pairs, img_root, crop=CROP):
    """Crops of the images the pairs name: (crops (N, 64, 64, 3), index pairs (P, 2), same (P,))."""
    keys = sorted({(p[0], p[1]) for p in pairs} | {(p[2], p[3]) for p in pairs})
    at = {k: i for i, k in enumerate(keys)}
    crops = np.stack([lfw_crop(_read_rgb(lfw_path(img_root, *k)), crop) for k in keys])
    idx = np.array([(at[(p[0], p[1])], at[(p[2], p[3])]) for p in pairs])
    same = np.array([p[0] == p[2] for p in pairs])
    return crops, idx, same


def lfw_fold1(faces):
    d = Path(faces) / "lfw_fold1"
    return lfw_pairs(read_pairs(d / "pairs_fold1.txt"), d / "images")


def orl(faces):
    """(crops (400, 64, 64, 3), person ids (400,), image number 1..10 (400,))."""
    from PIL import Image
    d = Path(faces) / "orl_att"
    crops, ids, nums = [], [], []
    for s in range(1, 41):
        for k in range(1, 11):
            crops.append(orl_crop(np.asarray(Image.open(d / f"s{s}" / f"{k}.pgm"))))
            ids.append(s)
            nums.append(k)
    return np.stack(crops), np.array(ids), np.array(nums)

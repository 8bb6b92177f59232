"""Seeded, offline data for the face embedder (nothing downloaded).

Identities (the issue's definition): each 25x25 grayscale patch of skimage.data.lfw_subset() and
all its augmentations form one identity.
  TRAIN_FACES   faces 0..79  -> training identities (plus the 100 non-face patches as extra
                training identities, which only add negatives)
  UNSEEN_FACES  faces 80..99 -> never trained on: verification on new people
Augmentation (augment()): random crop/shift/scale/rotation, horizontal flip, brightness, contrast,
gamma, colour tint, blur, Gaussian noise; output 64x64 RGB uint8 (the embedder input).

Streams are seeded: training batch i = default_rng([TRAIN_SEED, i]); held-out = HELDOUT_SEED;
calibration = CALIB_SEED, so held-out augmentations never coincide with training ones.

Real photos for the host demo / tests (never trained on): astronaut (Eileen Collins),
matplotlib's grace_hopper.jpg, camera (the cameraman), and their "camera" variants
(photo_variants(): shifted, brighter, darker, flipped, rescaled, noisy).
"""
from __future__ import annotations

import functools

import numpy as np

SIZE = 64
TRAIN_SEED, HELDOUT_SEED, CALIB_SEED = 5, 31337, 778
TRAIN_FACES = range(0, 80)
UNSEEN_FACES = range(80, 100)


def _cv2():
    import cv2
    return cv2


@functools.lru_cache(maxsize=None)
def lfw():
    """(200, 25, 25) float32 in [0, 1]: 100 faces then 100 non-faces."""
    from skimage import data
    return data.lfw_subset().astype(np.float32)


def train_identities():
    """Patch indices into lfw() used as training classes (faces 0..79 + the 100 non-faces)."""
    return np.array(list(TRAIN_FACES) + list(range(100, 200)))


SKIN = np.array([(1.0, 0.8, 0.66), (0.96, 0.72, 0.56), (0.82, 0.6, 0.45), (0.62, 0.44, 0.32),
                 (0.45, 0.3, 0.22), (1.0, 0.88, 0.8), (1.0, 1.0, 1.0)], np.float32)


def augment(patch: np.ndarray, rng, size: int = SIZE) -> np.ndarray:
    """One augmentation of a gray (h, w) or RGB (h, w, 3) float [0, 1] face crop -> size x size
    x 3 uint8: crop/shift/scale/rotation, flip, brightness/contrast/gamma, tint, blur, noise."""
    cv2 = _cv2()
    p = np.asarray(patch, np.float32)
    h, w = p.shape[:2]
    # geometry: one affine warp from the patch to the output (scale, rotation, shift)
    s = size / w * rng.uniform(0.88, 1.15)
    ang = rng.uniform(-10, 10)
    m = cv2.getRotationMatrix2D((w / 2, h / 2), ang, s)
    m[0, 2] += size / 2 - w / 2 + rng.uniform(-0.08, 0.08) * size
    m[1, 2] += size / 2 - h / 2 + rng.uniform(-0.08, 0.08) * size
    out = cv2.warpAffine(p, m, (size, size), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_REFLECT)
    if rng.random() < 0.5:
        out = out[:, ::-1]
    if out.ndim == 2:   # colourise: skin tones, random tints, or plain gray
        k = rng.random()
        tint = (SKIN[rng.integers(len(SKIN))] if k < 0.5 else
                rng.uniform(0.5, 1.0, 3) if k < 0.8 else np.ones(3))
        out = out[..., None] * tint[None, None].astype(np.float32)
    else:
        if rng.random() < 0.2:
            out = np.repeat(out.mean(-1, keepdims=True), 3, -1)
    out = out * rng.uniform(0.85, 1.15, 3).astype(np.float32)
    # photometric
    out = (out - 0.5) * rng.uniform(0.7, 1.3) + 0.5 + rng.uniform(-0.2, 0.2)
    out = np.clip(out, 0, 1) ** rng.uniform(0.7, 1.4)
    if rng.random() < 0.5:
        sig = rng.uniform(0.3, 1.5)
        out = cv2.GaussianBlur(np.ascontiguousarray(out), (0, 0), sig)
    if rng.random() < 0.5:
        out = out + rng.normal(0, rng.uniform(0.005, 0.04), out.shape).astype(np.float32)
    return (np.clip(out, 0, 1) * 255 + 0.5).astype(np.uint8)


def train_batch(step: int, size: int):
    """(images (B, 64, 64, 3) uint8, labels (B,) int) for training step `step`."""
    rng = np.random.default_rng([TRAIN_SEED, step])
    ids = train_identities()
    n_faces = len(TRAIN_FACES)   # 70 % faces, 30 % non-face identities
    labels = np.where(rng.random(size) < 0.7, rng.integers(0, n_faces, size),
                      rng.integers(n_faces, len(ids), size))
    a = lfw()
    imgs = np.stack([augment(a[ids[k]], rng) for k in labels])
    return imgs, labels


def heldout(faces=TRAIN_FACES, per_identity: int = 4, seed: int = HELDOUT_SEED):
    """(images (N, 64, 64, 3) uint8, identity (N,)): `per_identity` new augmentations of each
    face in `faces` from the held-out seed."""
    rng = np.random.default_rng([seed, faces.start if isinstance(faces, range) else 0])
    a = lfw()
    imgs, ids = [], []
    for f in faces:
        for _ in range(per_identity):
            imgs.append(augment(a[f], rng))
            ids.append(f)
    return np.stack(imgs), np.array(ids)


def pairs(ids: np.ndarray, seed: int = HELDOUT_SEED):
    """All same-identity pairs and as many random different-identity pairs: (i, j, same)."""
    rng = np.random.default_rng(seed + 1)
    pos = [(i, j) for i in range(len(ids)) for j in range(i + 1, len(ids)) if ids[i] == ids[j]]
    neg = set()
    while len(neg) < len(pos):
        i, j = sorted(int(v) for v in rng.integers(0, len(ids), 2))
        if ids[i] != ids[j]:
            neg.add((i, j))
    p = np.array(pos + sorted(neg))
    same = np.r_[np.ones(len(pos), bool), np.zeros(len(neg), bool)]
    return p[:, 0], p[:, 1], same


def calibration_images(n: int = 100):
    """Calibration set for the recipe: augmented faces of all 100 identities + 20 non-faces
    (64x64 RGB uint8, the embedder input)."""
    rng = np.random.default_rng(CALIB_SEED)
    a = lfw()
    idx = list(range(100)) + list(range(100, 200, 5))
    return [augment(a[i], rng) for i in idx[:n]]


# ---------------------------------------------------------------------------------------------
# Real photos (test only)
@functools.lru_cache(maxsize=None)
def real_photos():
    """{name: HWC uint8 RGB}: astronaut, grace_hopper, camera (gray -> RGB)."""
    import matplotlib.cbook
    from PIL import Image
    from skimage import data
    gh = np.asarray(Image.open(matplotlib.cbook.get_sample_data("grace_hopper.jpg")).convert("RGB"))
    cam = data.camera()
    return {"astronaut": data.astronaut(), "grace_hopper": gh,
            "camera": np.repeat(cam[..., None], 3, 2)}


def photo_variants(rgb: np.ndarray, seed: int = 7):
    """{kind: HWC uint8}: what another camera frame of the same scene could look like."""
    cv2 = _cv2()
    h, w = rgb.shape[:2]
    f = rgb.astype(np.float32)
    rng = np.random.default_rng(seed)
    shift = np.float32([[1, 0, 0.06 * w], [0, 1, -0.04 * h]])
    zoom = cv2.getRotationMatrix2D((w / 2, h / 2), 0, 1.12)
    return {
        "shifted": cv2.warpAffine(rgb, shift, (w, h), borderMode=cv2.BORDER_REPLICATE),
        "brighter": np.clip(f * 1.25 + 20, 0, 255).astype(np.uint8),
        "darker": np.clip(f * 0.7, 0, 255).astype(np.uint8),
        "flipped": np.ascontiguousarray(rgb[:, ::-1]),
        "rescaled": cv2.warpAffine(rgb, zoom, (w, h), borderMode=cv2.BORDER_REPLICATE),
        "noisy": np.clip(f + rng.normal(0, 8, f.shape), 0, 255).astype(np.uint8),
    }

"""Seeded, offline training data for the face detector: composites of augmented face crops on
varied backgrounds, 320x240 RGB uint8, boxes (x, y, w, h) in pixels.

Sources (all shipped with the venv, nothing downloaded):
  faces           the 100 faces of skimage.data.lfw_subset() (25x25 grayscale), colorized
  hard negatives  its 100 non-face patches, pasted with exactly the same augmentation
  backgrounds     skimage photos/textures (chelsea, brick, grass, gravel, immunohistochemistry,
                  hubble_deep_field, retina, moon, page, text, clock, coins, colorwheel, cell,
                  checkerboard, horse, logo, the lower part of camera, the left stereo_motorcycle
                  view), sklearn's flower.jpg, dead-leaves "foliage", smooth random fields,
                  shapes and noise
  TEST ONLY       astronaut, grace_hopper.jpg (faces); coffee, rocket, sklearn's china.jpg
                  (face-free) -- never used for training or calibration.

Streams are seeded: training = TRAIN_SEED (+ a per-resume offset), held-out = HELDOUT_SEED,
calibration = CALIB_SEED, so the held-out composites never coincide with training ones.
"""
from __future__ import annotations

import functools

import numpy as np

W, H = 320, 240
TRAIN_SEED, HELDOUT_SEED, CALIB_SEED = 1, 20260, 777
# Real photos: hand-annotated face boxes (x, y, w, h) on the original images.
ASTRONAUT_BOX = (180, 68, 92, 112)     # on the 512x512 original
GRACE_HOPPER_BOX = (170, 140, 180, 185)  # on the 512x600 original (forehead below the cap to chin)
# A face box is the pasted 25x25 crop (brows..chin) extended upwards to take in the forehead,
# the convention of the hand annotations above.
FOREHEAD = 0.12


def _cv2():
    import cv2
    return cv2


@functools.lru_cache(maxsize=None)
def _lfw():
    from skimage import data
    a = data.lfw_subset().astype(np.float32)
    return a[:100], a[100:]


@functools.lru_cache(maxsize=None)
def _backgrounds():
    from skimage import data
    from sklearn.datasets import load_sample_images
    out = []

    def add(a):
        a = np.asarray(a)
        if a.dtype == bool:
            a = a.astype(np.float32)
        elif a.dtype == np.uint8:
            a = a.astype(np.float32) / 255.0
        else:
            a = a.astype(np.float32)
            a = (a - a.min()) / max(1e-6, float(a.max() - a.min()))
        if a.ndim == 3 and a.shape[2] == 4:
            a = a[..., :3]
        out.append(a)

    for n in ("chelsea", "brick", "grass", "gravel", "immunohistochemistry", "hubble_deep_field",
              "retina", "moon", "page", "text", "clock", "coins", "colorwheel", "cell",
              "checkerboard", "horse", "logo"):
        add(getattr(data, n)())
    add(data.camera()[260:])  # below the cameraman's face
    add(data.stereo_motorcycle()[0])  # a cluttered workshop
    imgs = load_sample_images()
    for fname, img in zip(imgs.filenames, imgs.images):
        if fname.endswith("flower.jpg"):  # china.jpg is a face-free TEST photo
            add(img)
    return out


def _resize(a, w, h):
    cv2 = _cv2()
    interp = cv2.INTER_AREA if a.shape[1] > w else cv2.INTER_LINEAR
    return cv2.resize(a, (int(w), int(h)), interpolation=interp)


def _rgb(a, rng):
    """Gray -> RGB with a random tint; RGB -> per-channel gain jitter."""
    if a.ndim == 2:
        tint = rng.uniform(0.5, 1.0, 3) if rng.random() < 0.7 else np.ones(3)
        a = a[..., None] * tint[None, None].astype(np.float32)
    else:
        a = a * rng.uniform(0.75, 1.25, 3).astype(np.float32)
    return a


def _smooth_field(rng, w=W, h=H):
    gw, gh = rng.integers(2, 12), rng.integers(2, 9)
    small = rng.random((gh, gw, 3)).astype(np.float32)
    return _resize(small, w, h)


# leaf/bark/earth colours (RGB) for the dead-leaves "foliage" backgrounds
FOLIAGE = np.array([(0.18, 0.32, 0.10), (0.35, 0.50, 0.18), (0.55, 0.62, 0.30), (0.10, 0.16, 0.06),
                    (0.42, 0.33, 0.20), (0.65, 0.55, 0.40), (0.80, 0.82, 0.75), (0.25, 0.22, 0.18)], np.float32)


def dead_leaves(rng, w=W, h=H):
    """A dead-leaves image: occluding ellipses with power-law sizes (the statistics of natural
    scenes -- foliage, gravel, crowds of objects), coloured from the foliage palette (each leaf
    brightened or darkened) or at random, under a smooth shading field: hard negatives with
    dark/light blob layouts at every scale."""
    cv2 = _cv2()
    foliage = rng.random() < 0.6
    img = np.empty((h, w, 3), np.float32)
    img[:] = FOLIAGE[rng.integers(len(FOLIAGE))] if foliage else rng.random(3)
    r_min, r_max = 2.0, float(rng.uniform(25, 90)) * w / W
    n = int(rng.integers(600, 2500) * (w * h) / (W * H)) + 20
    u = rng.random(n)
    radii = 1.0 / np.sqrt(u / r_min ** 2 + (1 - u) / r_max ** 2)  # density ~ r^-3
    for r in radii:
        c = FOLIAGE[rng.integers(len(FOLIAGE))] * rng.uniform(0.5, 1.4) if foliage else rng.random(3)
        c = tuple(float(v) for v in np.clip(c, 0, 1))
        cv2.ellipse(img, (int(rng.integers(0, w)), int(rng.integers(0, h))),
                    (max(1, int(r)), max(1, int(r * rng.uniform(0.3, 1.0)))), float(rng.uniform(0, 180)),
                    0, 360, c, -1)
    if rng.random() < 0.5:
        img = cv2.GaussianBlur(img, (0, 0), rng.uniform(0.5, 1.5))
    return img * (0.6 + 0.6 * _smooth_field(rng, w, h)[..., :1])


def background(rng) -> np.ndarray:
    cv2 = _cv2()
    k = rng.random()
    if k < 0.6:
        src = _backgrounds()[rng.integers(len(_backgrounds()))]
        sh, sw = src.shape[:2]
        s = rng.uniform(0.35, 1.0)
        cw = int(min(sw, sh * 4 / 3) * s * rng.uniform(0.85, 1.15))
        cw = max(8, min(cw, sw))
        ch = max(6, min(int(cw * 3 / 4 * rng.uniform(0.85, 1.15)), sh))
        x0, y0 = rng.integers(0, sw - cw + 1), rng.integers(0, sh - ch + 1)
        img = _resize(src[y0:y0 + ch, x0:x0 + cw], W, H)
        if rng.random() < 0.5:
            img = img[:, ::-1]
        img = _rgb(np.ascontiguousarray(img), rng)
        if rng.random() < 0.3:
            img = 0.6 * img + 0.4 * _smooth_field(rng)
    elif k < 0.75:
        img = dead_leaves(rng)
    elif k < 0.85:
        img = _smooth_field(rng) * rng.uniform(0.3, 1.0)
    elif k < 0.95:
        img = _smooth_field(rng)
        for _ in range(rng.integers(3, 15)):
            color = tuple(float(c) for c in rng.random(3))
            x, y = int(rng.integers(0, W)), int(rng.integers(0, H))
            if rng.random() < 0.5:
                cv2.rectangle(img, (x, y), (x + int(rng.integers(5, 150)), y + int(rng.integers(5, 120))), color, -1)
            else:
                cv2.ellipse(img, (x, y), (int(rng.integers(3, 80)), int(rng.integers(3, 80))),
                            float(rng.uniform(0, 180)), 0, 360, color, -1)
    else:
        img = np.clip(rng.normal(rng.uniform(0.2, 0.8), rng.uniform(0.05, 0.3), (H, W, 3)), 0, 1).astype(np.float32)
    return np.clip(img, 0, 1).astype(np.float32)


SKIN = np.array([(1.0, 0.8, 0.66), (0.96, 0.72, 0.56), (0.82, 0.6, 0.45), (0.62, 0.44, 0.32),
                 (0.45, 0.3, 0.22), (1.0, 0.88, 0.8), (1.0, 1.0, 1.0)], np.float32)


def _sprite(g, w, h, rng):
    """Augmented RGB sprite (h, w, 3) and soft alpha (h, w) from a 25x25 gray patch."""
    cv2 = _cv2()
    if rng.random() < 0.5:
        g = g[:, ::-1]
    g = np.clip((g - 0.5) * rng.uniform(0.6, 1.5) + 0.5 + rng.uniform(-0.2, 0.2), 0, 1)
    g = g ** rng.uniform(0.6, 1.6)
    s = _resize(np.ascontiguousarray(g, dtype=np.float32), w, h)
    ang = rng.uniform(-12, 12)
    m = cv2.getRotationMatrix2D((w / 2, h / 2), ang, 1.0)
    s = cv2.warpAffine(s, m, (w, h), borderMode=cv2.BORDER_REFLECT)
    if rng.random() < 0.8:
        tint = SKIN[rng.integers(len(SKIN))] * rng.uniform(0.9, 1.1, 3)
    else:
        tint = rng.uniform(0.3, 1.0, 3)
    rgb = s * 1.0 if s.ndim == 3 else s[..., None] * tint.astype(np.float32)[None, None]
    if rng.random() < 0.3:
        rgb = cv2.GaussianBlur(rgb, (0, 0), rng.uniform(0.5, 1.2) * max(1.0, w / 40))
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    ax, ay = w / 2 * rng.uniform(0.95, 1.2), h / 2 * rng.uniform(1.0, 1.25)
    r = np.sqrt(((xx - w / 2 + 0.5) / ax) ** 2 + ((yy - h / 2 + 0.5) / ay) ** 2)
    feather = rng.uniform(0.1, 0.3)
    alpha = np.clip((1.0 - r) / feather, 0, 1)
    return rgb, alpha


def _context(img, x, y, w, h, rng):
    """Hair / head / shoulders blobs around a (face or non-face) patch."""
    cv2 = _cv2()
    if rng.random() < 0.6:
        color = tuple(float(c) for c in rng.uniform(0.0, 0.7) * rng.uniform(0.5, 1.0, 3))
        cv2.ellipse(img, (int(x + w / 2), int(y + h * 0.4)), (int(w * rng.uniform(0.55, 0.75)), int(h * rng.uniform(0.6, 0.8))),
                    0, 0, 360, color, -1)
    if rng.random() < 0.5:
        color = tuple(float(c) for c in rng.random(3))
        cv2.ellipse(img, (int(x + w / 2), int(y + h * rng.uniform(1.5, 1.9))), (int(w * rng.uniform(0.9, 1.6)), int(h * 0.7)),
                    0, 0, 360, color, -1)


def _overlaps(r, rects, limit=0.05):
    for q in rects:
        iw = min(r[0] + r[2], q[0] + q[2]) - max(r[0], q[0])
        ih = min(r[1] + r[3], q[1] + q[3]) - max(r[1], q[1])
        if iw > 0 and ih > 0 and iw * ih > limit * min(r[2] * r[3], q[2] * q[3]):
            return True
    return False


def _photo_patch(rng):
    """A random colour patch of a training background, 25x25: a hard negative (foliage, fur,
    stars, texture) shaped and blended exactly like the faces."""
    if rng.random() < 0.3:
        return np.clip(dead_leaves(rng, 25, 25), 0, 1)
    src = _backgrounds()[rng.integers(len(_backgrounds()))]
    sh, sw = src.shape[:2]
    side = int(rng.integers(12, max(13, min(sh, sw) // 2)))
    y0, x0 = rng.integers(0, sh - side + 1), rng.integers(0, sw - side + 1)
    p = _resize(np.ascontiguousarray(src[y0:y0 + side, x0:x0 + side]), 25, 25)
    return p if p.ndim == 3 and rng.random() < 0.7 else (p.mean(axis=2) if p.ndim == 3 else p)


def composite(rng, photo_negatives=False, bg=None):
    """One 320x240 RGB uint8 composite and its face boxes (n, 4) float32 (x, y, w, h).
    photo_negatives: also paste 0-3 ellipse-masked patches of background photos as hard negatives
    (train.py switches it on from --photo-negatives-from; the held-out set has none).
    bg: a background (H, W, 3) float in [0, 1] to use instead of a random one (train.py's mined
    hard backgrounds)."""
    cv2 = _cv2()
    faces, nonfaces = _lfw()
    img = background(rng) if bg is None else np.array(bg, np.float32)
    n_faces = int(rng.choice([0, 1, 1, 2, 2, 3, 4]))
    n_neg = int(rng.integers(0, 4)) + (int(rng.integers(0, 4)) if photo_negatives else 0)
    kinds = [True] * n_faces + [False] * n_neg
    rng.shuffle(kinds)
    rects, boxes = [], []
    for is_face in kinds:
        for _ in range(20):
            w = float(np.exp(rng.uniform(np.log(18), np.log(130))))
            h = w / float(np.exp(rng.uniform(np.log(0.7), np.log(1.7))))  # w/h of the whole face box
            w, hc = int(round(w)), int(round(h / (1 + FOREHEAD)))
            if w + 2 > W or h + 2 > H or hc < 12:
                continue
            x = int(rng.integers(0, W - w + 1))
            y = int(rng.integers(int(np.ceil(h - hc)), H - hc + 1))
            box = (x, y - (h - hc), w, h)
            if _overlaps(box, rects):
                continue
            break
        else:
            continue
        rects.append(box)
        if rng.random() < (0.6 if is_face else 0.3):
            _context(img, x, y, w, hc, rng)
        if is_face:
            patch = faces[rng.integers(100)]
        elif photo_negatives and rng.random() < 0.6:
            patch = _photo_patch(rng)
        else:
            patch = nonfaces[rng.integers(100)]
        rgb, alpha = _sprite(patch, w, hc, rng)
        light = rng.uniform(0.5, 1.3)
        a = alpha[..., None]
        img[y:y + hc, x:x + w] = img[y:y + hc, x:x + w] * (1 - a) + np.clip(rgb * light, 0, 1) * a
        if is_face:
            boxes.append(box)
    # global photometric jitter
    img = img * rng.uniform(0.7, 1.3) + rng.uniform(-0.12, 0.12)
    img = img * rng.uniform(0.85, 1.15, 3).astype(np.float32)
    if rng.random() < 0.2:
        img = cv2.GaussianBlur(img, (0, 0), rng.uniform(0.4, 1.2))
    if rng.random() < 0.5:
        img = img + rng.normal(0, rng.uniform(0.005, 0.04), img.shape).astype(np.float32)
    img = (np.clip(img, 0, 1) * 255 + 0.5).astype(np.uint8)
    return img, np.array(boxes, np.float32).reshape(-1, 4)


def composites(n, seed):
    rng = np.random.default_rng(seed)
    return [composite(rng) for _ in range(n)]


def heldout(n=200, seed=HELDOUT_SEED):
    """Held-out composites (a seed never used for training): list of (image, boxes)."""
    return composites(n, seed)


def calibration_images(n=64):
    """~64 HWC uint8 320x240 composites for the KPU quantization (the recipe's calibration set)."""
    return [img for img, _ in composites(n, CALIB_SEED)]


def _to_input(img, box=None):
    """Stretch a photo to 320x240 (what the board's camera frame is) and scale its box."""
    from PIL import Image
    h0, w0 = img.shape[:2]
    out = np.asarray(Image.fromarray(img).convert("RGB").resize((W, H), Image.BILINEAR))
    if box is None:
        return out, None
    sx, sy = W / w0, H / h0
    return out, (box[0] * sx, box[1] * sy, box[2] * sx, box[3] * sy)


def real_photos():
    """TEST ONLY photos at 320x240: {name: (image, face box or None)}."""
    import matplotlib.cbook
    from PIL import Image
    from skimage import data
    from sklearn.datasets import load_sample_images
    out = {"astronaut": _to_input(data.astronaut(), ASTRONAUT_BOX)}
    with matplotlib.cbook.get_sample_data("grace_hopper.jpg") as fh:
        gh = np.asarray(Image.open(fh).convert("RGB"))
    out["grace_hopper"] = _to_input(gh, GRACE_HOPPER_BOX)
    out["coffee"] = _to_input(data.coffee())
    out["rocket"] = _to_input(data.rocket())
    imgs = load_sample_images()
    china = [i for f, i in zip(imgs.filenames, imgs.images) if f.endswith("china.jpg")][0]
    out["china"] = _to_input(china)
    return out

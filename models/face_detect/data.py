"""Real-face training and evaluation data for the face detector: 320x240 RGB uint8 frames,
boxes (x, y, w, h) in pixels of the frame.

Training (fetched, never committed: `../shared/data/get-face-training.sh MIRROR OUT`; research
use only, see the zoo README):
  caltech_webfaces  7,092 web photos, 10,524 faces, boxes derived from 4 landmarks (a square of
                    3x the landmark extent: the convention of the CMU+MIT ground truth)
  face_mask_kaggle  853 photos, 4,072 VOC face boxes (most faces wear masks)
  negatives         crops of skimage/sklearn sample photos and textures, dead-leaves clutter
                    (`background`); mined hard negatives (`negative_candidate`, mine.py):
                    face-mask set regions clear of faces and such backgrounds
Evaluation (`../shared/testdata/faces`, never trained on): cmu_mit_frontal, wider_val_subset200
(faces >= 10 px at 416x416), nonface_scenes.

Every image is stretched to 320x240, like a camera frame. Training frames are random crops
(zoomed in and out, aspect jittered, padded where they leave the photo), flipped, colour/grey/
blur/noise jittered; `sample(rng)` is deterministic in rng.
"""
from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

import numpy as np

W, H = 320, 240
TRAIN_SEED, CALIB_SEED = 1, 777
MIN_TRAIN_FACE = 6      # px in the 320x240 frame: smaller boxes are dropped from the targets
MIN_EVAL_FACE = 10      # px, WIDER protocol used here: faces narrower than this at 416 are ignored
NEGATIVE_P = 0.1        # share of face-free frames
HARD_P = 0.15           # share of mined hard negatives (training-photo regions away from every face)
NEG_MARGIN = 2.0        # a hard-negative region keeps clear of every face box scaled by this
# Box convention: the two evaluation sets disagree (CMU+MIT: loose landmark squares, 3x the
# landmark extent, like Caltech's derived boxes; WIDER and the face-mask set: tight face boxes,
# about 0.56 of that side). Training boxes sit in between (0.75 of the loose side), so that a
# well-placed box has IoU >= 0.5 with either convention.
CALTECH_SCALE, MASK_SCALE = 0.75, 1.33


def _cv2():
    import cv2
    return cv2


def fail(msg: str):
    """Bad input (missing data, unreadable image): the message on stderr, exit status 2."""
    print(f"error: {msg}", file=sys.stderr)
    raise SystemExit(2)


# ------------------------------------------------------------------ training data
def training_dir(path=None) -> Path:
    """The get-face-training.sh output folder: --data, else $TL2K210_FACE_DATA."""
    p = path or os.environ.get("TL2K210_FACE_DATA")
    if not p or not (Path(p) / "caltech_webfaces").is_dir():
        fail(f"face training data not found at {p!r}: run ../shared/data/get-face-training.sh "
                         "MIRROR OUT and pass --data OUT (or set TL2K210_FACE_DATA)")
    return Path(p)


@functools.lru_cache(maxsize=None)
def training_set(root) -> list:
    """[(image path, float array (n, 4) of x1, y1, x2, y2)] of both training sets."""
    root = Path(root)
    boxes = {}
    for line in open(root / "caltech_webfaces" / "boxes_derived.txt"):
        p = line.split()
        boxes.setdefault(root / "caltech_webfaces" / "images" / p[0], []).append([float(v) for v in p[1:5]])
    for line in open(root / "face_mask_kaggle" / "boxes.txt"):
        p = line.split()
        boxes.setdefault(root / "face_mask_kaggle" / "images" / p[0], []).append([float(v) for v in p[2:6]])
    return [(str(k), _rescale(np.asarray(v, np.float32), CALTECH_SCALE if "caltech" in str(k) else MASK_SCALE))
            for k, v in sorted(boxes.items())]


def _rescale(b, s):
    """Boxes (x1, y1, x2, y2) scaled by s about their centres."""
    c, half = (b[:, :2] + b[:, 2:]) / 2, (b[:, 2:] - b[:, :2]) * s / 2
    return np.concatenate([c - half, c + half], 1)


def _read_rgb(path) -> np.ndarray:
    cv2 = _cv2()
    img = cv2.imread(str(path), cv2.IMREAD_COLOR)
    if img is None:
        fail(f"cannot read image {path}")
    return img[..., ::-1]


def _jitter(img, rng) -> np.ndarray:
    """Colour, grey, blur and noise jitter of a float32 HWC image in [0, 1]."""
    cv2 = _cv2()
    if rng.random() < 0.25:
        img = np.repeat(img.mean(2, keepdims=True), 3, 2)
    else:
        grey = img.mean(2, keepdims=True)
        img = grey + (img - grey) * rng.uniform(0.5, 1.5)          # saturation
        img = img * rng.uniform(0.85, 1.15, 3).astype(np.float32)  # white balance
    img = (img - 0.5) * rng.uniform(0.6, 1.4) + 0.5 + rng.uniform(-0.2, 0.2)  # contrast, brightness
    if rng.random() < 0.3:
        img = np.clip(img, 0, 1) ** rng.uniform(0.6, 1.6)
    if rng.random() < 0.25:
        img = cv2.GaussianBlur(img, (0, 0), rng.uniform(0.5, 1.8))
    if rng.random() < 0.2:
        img = img + rng.normal(0, rng.uniform(0.01, 0.05), img.shape).astype(np.float32)
    return np.clip(img, 0, 1)


def _image_size(path) -> tuple[int, int]:
    from PIL import Image
    with Image.open(path) as im:
        return im.size


def place(rng, b, sw, sh):
    """Where a sw x sh photo with face boxes b (x1, y1, x2, y2) lands in the frame: the affine
    matrix (2x3), the x scale, and the visible boxes (x, y, w, h) in the frame.

    Scaled so that one face (picked at random) is 7..200 px wide (log-uniform), or so that the
    photo fills the frame (zoomed in up to 2x), aspect stretched like a camera frame, that face
    anywhere inside the frame, flipped half of the time. A box less than 60 % inside the frame
    or smaller than MIN_TRAIN_FACE is dropped."""
    b = np.clip(b, 0, [sw, sh, sw, sh])  # derived boxes can run past the photo
    x1, y1, x2, y2 = b[rng.integers(len(b))]
    if rng.random() < 0.5:
        sx = max(W / sw, H / sh) * np.exp(rng.uniform(0, 0.7))
    else:
        sx = np.exp(rng.uniform(np.log(7), np.log(200))) / max(x2 - x1, 1.0)
    sy = sx * np.exp(rng.uniform(-0.3, 0.3))
    x0 = x1 - rng.uniform(0, max(0.0, W - (x2 - x1) * sx)) / sx
    y0 = y1 - rng.uniform(0, max(0.0, H - (y2 - y1) * sy)) / sy
    m = np.float32([[sx, 0, -x0 * sx], [0, sy, -y0 * sy]])
    flip = rng.random() < 0.5
    if flip:
        m = (np.float32([[-1, 0, W], [0, 1, 0]]) @ np.vstack([m, [0, 0, 1]])).astype(np.float32)
    boxes = []
    for x1, y1, x2, y2 in b:
        x1, x2, y1, y2 = (x1 - x0) * sx, (x2 - x0) * sx, (y1 - y0) * sy, (y2 - y0) * sy
        if flip:
            x1, x2 = W - x2, W - x1
        area = (x2 - x1) * (y2 - y1)
        cx1, cy1, cx2, cy2 = max(x1, 0), max(y1, 0), min(x2, W), min(y2, H)
        if cx2 <= cx1 or cy2 <= cy1 or (cx2 - cx1) * (cy2 - cy1) < 0.6 * area:
            continue
        if cx2 - cx1 >= MIN_TRAIN_FACE and cy2 - cy1 >= MIN_TRAIN_FACE:
            boxes.append((cx1, cy1, cx2 - cx1, cy2 - cy1))
    return m, sx, boxes


def sample_boxes(rng, root) -> list:
    """The boxes of a training frame without making its pixels (photo sizes from the headers;
    for fitting the anchors)."""
    if rng.random() < NEGATIVE_P:
        return []
    items = training_set(str(root))
    path, b = items[rng.integers(len(items))]
    return place(rng, b, *_image_size(path))[2]


def sample(rng, root, hard=()) -> tuple[np.ndarray, list]:
    """One augmented training frame: (320x240x3 uint8, [(x, y, w, h), ...]). With `hard` (mined
    hard negatives, `read_hard_negatives`), HARD_P of the frames are one of them."""
    cv2 = _cv2()
    if len(hard) and rng.random() < HARD_P:
        spec = hard[rng.integers(len(hard))]
        return (_jitter(negative_frame(spec).astype(np.float32) / 255.0, rng) * 255 + 0.5).astype(np.uint8), []
    if rng.random() < NEGATIVE_P:
        return (background(rng) * 255 + 0.5).astype(np.uint8), []
    items = training_set(str(root))
    path, b = items[rng.integers(len(items))]
    src = _read_rgb(path)
    m, sx, boxes = place(rng, b, src.shape[1], src.shape[0])
    # where the frame leaves the photo: a face-free background (70 %) or a flat colour
    if rng.random() < 0.7:
        img = (background(rng) * 255).astype(np.uint8)
    else:
        img = np.empty((H, W, 3), np.uint8)
        img[:] = rng.integers(0, 256, 3)
    cv2.warpAffine(np.ascontiguousarray(src), m[:2], (W, H), dst=img,
                   flags=cv2.INTER_AREA if sx < 1 else cv2.INTER_LINEAR, borderMode=cv2.BORDER_TRANSPARENT)
    img = _jitter(img.astype(np.float32) / 255.0, rng)
    return (img * 255 + 0.5).astype(np.uint8), boxes


# ------------------------------------------------------------------ hard negatives
def negative_candidate(rng, root, tries=30):
    """A face-free frame to mine: a region of a face-mask set photo -- (path, x, y, w, h, flip), a
    4:3 (±25 %) crop of at least 40 px clear of every face box scaled by NEG_MARGIN about its
    centre -- or, half of the time, a `background` frame ("background", seed, 0, 0, 0, False).
    Caltech WebFaces photos are not used: their boxes are incomplete (the regions a detector
    fires on are often unlabelled faces). None when the photo has no such region."""
    if rng.random() < 0.5:
        return ("background", int(rng.integers(1 << 31)), 0, 0, 0, False)
    items = [it for it in training_set(str(root)) if "face_mask" in it[0]]
    path, b = items[rng.integers(len(items))]
    sw, sh = _image_size(path)
    big = _rescale(b, NEG_MARGIN)
    for _ in range(tries):
        w = int(rng.uniform(40, max(41, min(sw, sh * 4 / 3))))
        h = int(min(sh, w * 3 / 4 * np.exp(rng.uniform(-0.25, 0.25))))
        if h < 30 or w > sw:
            continue
        x, y = int(rng.integers(0, sw - w + 1)), int(rng.integers(0, sh - h + 1))
        if not np.any((big[:, 0] < x + w) & (big[:, 2] > x) & (big[:, 1] < y + h) & (big[:, 3] > y)):
            return (path, x, y, w, h, bool(rng.random() < 0.5))
    return None


def negative_frame(spec) -> np.ndarray:
    """The 320x240 uint8 frame of a `negative_candidate`."""
    path, x, y, w, h, flip = spec
    if path == "background":
        return (background(np.random.default_rng(x)) * 255 + 0.5).astype(np.uint8)
    img = _resize(np.ascontiguousarray(_read_rgb(path)[y:y + h, x:x + w]), W, H)
    return np.ascontiguousarray(img[:, ::-1]) if flip else img


def read_hard_negatives(path) -> list:
    """`mine`'s file: one `score path x y w h flip` a line, path relative to its folder (or
    `background`)."""
    out = []
    for line in open(path):
        p = line.split()
        if len(p) == 7:
            src = p[1] if p[1] == "background" else str(Path(path).parent / p[1])
            out.append((src, *map(int, p[2:6]), p[6] == "1"))
    return out


def calibration_images(n=32):
    """n 320x240 frames for the KPU quantization (the recipe's calibration set), made only from
    photos that ship with the venv (so that `tl2k210 zoo build` needs no training data): the
    faces of skimage's astronaut and matplotlib's grace_hopper, other skimage/sklearn photos,
    each whole and as crops, flipped every other time."""
    photos = _calibration_photos()
    rng = np.random.default_rng(CALIB_SEED)
    out = []
    for i in range(n):
        src = photos[i % len(photos)]
        sh, sw = src.shape[:2]
        if i >= len(photos):  # a random crop of half to all of the photo
            s = rng.uniform(0.5, 1.0)
            cw, ch = int(sw * s), int(sh * s)
            x0, y0 = rng.integers(0, sw - cw + 1), rng.integers(0, sh - ch + 1)
            src = src[y0:y0 + ch, x0:x0 + cw]
        img = to_frame(src)
        out.append(np.ascontiguousarray(img[:, ::-1]) if i % 2 else img)
    return out


@functools.lru_cache(maxsize=None)
def _calibration_photos():
    import matplotlib.cbook
    from PIL import Image
    from skimage import data as sk
    with matplotlib.cbook.get_sample_data("grace_hopper.jpg") as fh:
        grace = np.asarray(Image.open(fh).convert("RGB"))
    return [sk.astronaut(), grace, sk.coffee(), sk.chelsea(), sk.rocket(), sk.camera(), sk.immunohistochemistry(),
            sk.stereo_motorcycle()[0]]


# ------------------------------------------------------------------ negatives (face-free)
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
        if a.ndim == 2:
            a = np.repeat(a[..., None], 3, 2)
        out.append(a)

    for n in ("brick", "grass", "gravel", "immunohistochemistry", "hubble_deep_field", "retina", "moon",
              "page", "text", "clock", "coins", "colorwheel", "cell", "checkerboard", "horse", "logo",
              "coffee", "rocket"):
        add(getattr(data, n)())
    add(data.camera()[260:])  # below the cameraman's face
    add(data.stereo_motorcycle()[0])  # a cluttered workshop
    for img in load_sample_images().images:  # china.jpg and flower.jpg
        add(img)
    return out


def _resize(a, w, h):
    cv2 = _cv2()
    interp = cv2.INTER_AREA if a.shape[1] > w else cv2.INTER_LINEAR
    return cv2.resize(a, (int(w), int(h)), interpolation=interp)


def _smooth_field(rng, w=W, h=H):
    gw, gh = rng.integers(2, 12), rng.integers(2, 9)
    return _resize(rng.random((gh, gw, 3)).astype(np.float32), w, h)


# leaf/bark/earth colours (RGB) for the dead-leaves "foliage" backgrounds
FOLIAGE = np.array([(0.18, 0.32, 0.10), (0.35, 0.50, 0.18), (0.55, 0.62, 0.30), (0.10, 0.16, 0.06),
                    (0.42, 0.33, 0.20), (0.65, 0.55, 0.40), (0.80, 0.82, 0.75), (0.25, 0.22, 0.18)], np.float32)


def dead_leaves(rng, w=W, h=H):
    """A dead-leaves image: occluding ellipses with power-law sizes (the statistics of natural
    clutter), foliage-coloured or random, under a smooth shading field."""
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
    """A face-free 320x240 float frame: a photo/texture crop (75 %) or dead leaves."""
    if rng.random() < 0.25:
        return np.clip(dead_leaves(rng), 0, 1)
    src = _backgrounds()[rng.integers(len(_backgrounds()))]
    sh, sw = src.shape[:2]
    cw = max(8, min(sw, int(min(sw, sh * 4 / 3) * rng.uniform(0.35, 1.0))))
    ch = max(6, min(int(cw * 3 / 4 * rng.uniform(0.8, 1.25)), sh))
    x0, y0 = rng.integers(0, sw - cw + 1), rng.integers(0, sh - ch + 1)
    img = _resize(np.ascontiguousarray(src[y0:y0 + ch, x0:x0 + cw]), W, H)
    if rng.random() < 0.5:
        img = img[:, ::-1]
    return _jitter(np.ascontiguousarray(img), rng)


# ------------------------------------------------------------------ evaluation sets
def faces_dir(path=None) -> Path | None:
    """../shared/testdata/faces (or --faces / $TL2K210_TESTDATA/faces); None when absent."""
    if path:
        return Path(path)
    from tl2k210 import paths
    return paths.testdata("faces")


def to_frame(img) -> np.ndarray:
    """Any HxW(x3) uint8 photo stretched to the 320x240 RGB camera frame."""
    if img.ndim == 2:
        img = np.repeat(img[..., None], 3, 2)
    return np.ascontiguousarray(_resize(np.ascontiguousarray(img), W, H))


def _scaled(boxes, w0, h0):
    sx, sy = W / w0, H / h0
    return [(x * sx, y * sy, w * sx, h * sy) for x, y, w, h in boxes]


def cmu_mit(root, gt_file="ground_truth_bboxes.txt") -> list:
    """[(name, frame, [gt boxes], [ignored boxes])]: CMU+MIT frontal, all 511 faces (boxes from
    the landmarks at scale 3; the `_face_only` file: tight boxes)."""
    d = Path(root) / "cmu_mit_frontal"
    gt = {}
    for line in open(d / gt_file):
        p = line.split()
        if len(p) == 5:
            x1, y1, x2, y2 = map(float, p[1:])
            gt.setdefault(p[0], []).append((x1, y1, x2 - x1, y2 - y1))
    out = []
    for f in sorted((d / "images").iterdir()):
        img = _read_rgb(f)
        h0, w0 = img.shape[:2]
        out.append((f.name, to_frame(img), _scaled(gt.get(f.name, []), w0, h0), []))
    return out


def wider_subset(root) -> list:
    """[(name, frame, [gt boxes >= 10 px at 416], [smaller or invalid boxes: ignored])]."""
    d = Path(root) / "wider_val_subset200"
    lines = open(d / "gt_416.txt").read().split("\n")
    gt, i = {}, 0
    while i < len(lines):
        name = lines[i].strip()
        if not name:
            i += 1
            continue
        n = int(lines[i + 1])
        rows = [lines[i + 2 + k].split() for k in range(n)]
        gt[os.path.basename(name)] = rows
        i += 2 + max(n, 1)
    out = []
    img_dir = next(p for p in (d / "images", d) if p.is_dir() and any(p.glob("*.jpg")))
    for f in sorted(img_dir.glob("*.jpg")):
        img = _read_rgb(f)
        h0, w0 = img.shape[:2]
        keep, ignore = [], []
        for r in gt.get(f.name, []):
            x, y, w, h = map(float, r[:4])
            (keep if w >= MIN_EVAL_FACE and int(r[7]) == 0 else ignore).append((x, y, w, h))
        out.append((f.name, to_frame(img), _scaled(keep, w0, h0), _scaled(ignore, w0, h0)))
    return out


def nonface_scenes(root) -> list:
    d = Path(root) / "nonface_scenes"
    return [(f.name, to_frame(_read_rgb(f)), [], []) for f in sorted(d.glob("*.jpg"))]


# Hand-annotated faces (x, y, w, h), forehead to chin, on the originals: skimage's astronaut
# (512x512) and matplotlib's grace_hopper.jpg (512x600); both photos are public domain.
ASTRONAUT_BOX = (180, 68, 92, 112)
GRACE_HOPPER_BOX = (170, 140, 180, 185)


def demo_photo():
    """(PIL image 960x720, [face boxes]): the astronaut and Grace Hopper side by side on grey, each
    480 px tall -- the README's demo picture."""
    import matplotlib.cbook
    from PIL import Image
    from skimage import data as sk
    with matplotlib.cbook.get_sample_data("grace_hopper.jpg") as fh:
        grace = Image.open(fh).convert("RGB")
    a = Image.fromarray(sk.astronaut()).resize((480, 480))
    g = grace.resize((grace.width * 480 // grace.height, 480))
    out = Image.new("RGB", (960, 720), (40, 40, 40))
    out.paste(a, (0, 120))
    out.paste(g, (960 - g.width, 120))
    sa, sg = 480 / 512, 480 / grace.height
    boxes = [(ASTRONAUT_BOX[0] * sa, 120 + ASTRONAUT_BOX[1] * sa, ASTRONAUT_BOX[2] * sa, ASTRONAUT_BOX[3] * sa),
             (960 - g.width + GRACE_HOPPER_BOX[0] * sg, 120 + GRACE_HOPPER_BOX[1] * sg,
              GRACE_HOPPER_BOX[2] * sg, GRACE_HOPPER_BOX[3] * sg)]
    return out, boxes


EVAL_SETS = {"cmu_mit_frontal": cmu_mit, "wider_val_subset200": wider_subset, "nonface_scenes": nonface_scenes,
             "cmu_mit_frontal_face_only": lambda root: cmu_mit(root, "ground_truth_bboxes_face_only.txt")}

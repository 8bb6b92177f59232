"""YOLOv2 region-output decoding as MaixPy's ``kpu.run_yolo2`` does it (Kendryte region_layer.c):
sigmoid x/y/objectness, exp w/h times the anchors, softmax over classes times objectness,
per-class NMS, then one box per grid cell/anchor with its best class above the threshold."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Box:
    x: float  # left, pixels
    y: float  # top, pixels
    w: float
    h: float
    value: float
    classid: int
    index: int

    def rect(self):
        return (self.x, self.y, self.w, self.h)


def parse_anchors(text) -> list[float]:
    """--anchors 'w,h,w,h,...' -> floats; refuses non-numbers, odd counts, sizes <= 0 or NaN."""
    from tl2k210.errors import Tl2k210Error
    if not text:
        raise Tl2k210Error("--decode yolo2 needs --anchors w,h,w,h,... (the anchors the model was "
                           "trained with, as in its MaixPy script's kpu.init_yolo2)")
    try:
        anchors = [float(v) for v in str(text).split(",")]
    except ValueError:
        raise Tl2k210Error(f"--anchors {text!r}: give comma-separated numbers w,h,w,h,... "
                           "(e.g. 1.889,2.5245,2.9465,3.94056)") from None
    if len(anchors) % 2:
        raise Tl2k210Error(f"--anchors has {len(anchors)} numbers; give (w,h) pairs")
    bad = [v for v in anchors if not (np.isfinite(v) and v > 0)]
    if bad:
        raise Tl2k210Error(f"--anchors: anchor sizes must be positive finite numbers (grid cells), "
                           f"got {bad[0]}")
    return anchors


def region_layout(model, size: int, n_anchors: int, labels=None) -> tuple[int, int, int]:
    """(grid_w, grid_h, classes) of a `size`-value region output decoded with `n_anchors`
    anchors, checked before running: channels = anchors x (5 + classes), and classes = the
    number of labels when labels are given. Raises Tl2k210Error naming the numbers."""
    from tl2k210.errors import Tl2k210Error
    try:
        gw, gh = region_grid(model, size)
    except ValueError as exc:
        raise Tl2k210Error(f"{exc} ({n_anchors} anchors); --decode yolo2 needs a YOLOv2 region "
                           "output: use --decode none for this model") from None
    channels = size // (gw * gh)
    if channels % n_anchors or channels // n_anchors < 6:
        raise Tl2k210Error(f"{n_anchors} anchors do not fit the {channels}-channel region output "
                           f"({gw}x{gh} grid): channels = anchors x (5 + classes); check --anchors "
                           "(MaixPy's face and VOC models use 5 anchors)")
    classes = channels // n_anchors - 5
    if labels is not None and len(labels) != classes:
        fits = [a for a in range(1, channels + 1) if channels % a == 0 and channels // a - 5 == len(labels)]
        hint = f"{len(labels)} class(es) fit {channels} channels with {fits[0]} anchors" if fits else \
            f"no anchor count fits {len(labels)} class(es) in {channels} channels"
        raise Tl2k210Error(f"{n_anchors} anchors x (5 + {classes} classes) = {channels} channels, but "
                           f"--labels names {len(labels)} label(s); {hint}: check --anchors and --labels")
    return gw, gh, classes


def region_grid(model, size: int) -> tuple[int, int]:
    """Grid (w, h) of a `size`-value region output: the last KPU conv map with that many values
    (v3 or v4 kmodel). Raises ValueError when none matches."""
    items = model.items
    for it in reversed(items):
        if it.conv is not None:
            c, h, w = it.conv.out_shape
            if c * h * w == size:
                return w, h
    raise ValueError(f"cannot tell the YOLO grid of a {size}-value output: no KPU layer has that size")


def _sigmoid(v):
    return 1.0 / (1.0 + np.exp(-v))


def iou(a, b) -> float:
    """IoU of two (x, y, w, h) rectangles."""
    ax2, ay2, bx2, by2 = a[0] + a[2], a[1] + a[3], b[0] + b[2], b[1] + b[3]
    iw = max(0.0, min(ax2, bx2) - max(a[0], b[0]))
    ih = max(0.0, min(ay2, by2) - max(a[1], b[1]))
    inter = iw * ih
    union = a[2] * a[3] + b[2] * b[3] - inter
    return inter / union if union > 0 else 0.0


def decode(output: np.ndarray, anchors, grid_w: int, grid_h: int, image_w: int, image_h: int,
           threshold: float = 0.5, nms: float = 0.3) -> list[Box]:
    """output: the float region map, (n_anchors*(5+classes), grid_h, grid_w) CHW (any shape with
    that many values)."""
    anchors = np.asarray(anchors, np.float32).reshape(-1, 2)
    na = len(anchors)
    out = np.asarray(output, np.float32).reshape(na, -1, grid_h, grid_w)
    classes = out.shape[1] - 5
    if classes < 1:
        raise ValueError(f"region output has {out.shape[1]} entries per anchor; need 5 + classes")
    col = np.arange(grid_w)[None, None, :]
    row = np.arange(grid_h)[None, :, None]
    bx = (col + _sigmoid(out[:, 0])) / grid_w
    by = (row + _sigmoid(out[:, 1])) / grid_h
    bw = np.exp(out[:, 2]) * anchors[:, 0, None, None] / grid_w
    bh = np.exp(out[:, 3]) * anchors[:, 1, None, None] / grid_h
    obj = _sigmoid(out[:, 4])
    logits = out[:, 5:]
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs = e / e.sum(axis=1, keepdims=True) * obj[:, None]          # (na, classes, gh, gw)
    probs = np.where(probs > threshold, probs, 0.0)
    # boxes indexed like region_layer.c: index = cell * na + anchor
    P = probs.transpose(2, 3, 0, 1).reshape(-1, classes)              # (cells*na, classes)
    geo = np.stack([bx, by, bw, bh], -1).transpose(1, 2, 0, 3).reshape(-1, 4)
    x0, y0 = geo[:, 0] - geo[:, 2] / 2, geo[:, 1] - geo[:, 3] / 2
    x1, y1 = x0 + geo[:, 2], y0 + geo[:, 3]
    area = geo[:, 2] * geo[:, 3]
    for k in range(classes):  # do_nms_sort: per class, sorted by probability
        order = np.argsort(-P[:, k], kind="stable")
        order = order[P[order, k] > 0]
        for ii, i in enumerate(order):
            if P[i, k] == 0:
                continue
            rest = order[ii + 1:]
            iw = np.maximum(0.0, np.minimum(x1[i], x1[rest]) - np.maximum(x0[i], x0[rest]))
            ih = np.maximum(0.0, np.minimum(y1[i], y1[rest]) - np.maximum(y0[i], y0[rest]))
            inter = iw * ih
            union = area[i] + area[rest] - inter
            overlap = np.where(union > 0, inter / np.where(union > 0, union, 1), 0.0)
            P[rest[overlap > nms], k] = 0
    boxes = []
    for i in range(P.shape[0]):
        k = int(np.argmax(P[i]))
        p = float(P[i, k])
        if p > threshold:
            x, y, w, h = geo[i]
            boxes.append(Box(float((x - w / 2) * image_w), float((y - h / 2) * image_h),
                             float(w * image_w), float(h * image_h), p, k, i))
    boxes.sort(key=lambda b: -b.value)
    return boxes


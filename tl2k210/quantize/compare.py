"""Float-vs-test agreement for `tl2k210 compare`: per output SQNR and cosine, top-1/top-5 agreement
for classifiers, and detection agreement for YOLOv2 region outputs (decoded like MaixPy's
region layer: anchor-major channels [x, y, w, h, obj, classes...])."""
import numpy as np

from .calibrate import FloatRunner
from .metrics import cosine, sqnr_db, topk_agreement


def float_outputs(graph, xs):
    """{output_name: (N, ...) array} of the float graph over the inputs `xs` (onnxruntime)."""
    run = FloatRunner(graph, expose_all=False)
    outs = [run(x) for x in xs]
    return {k: np.concatenate([o[k] for o in outs]) for k in graph.outputs}


def output_agreement(ref, test, ks=(1, 5)):
    """ref/test: {name: (N, ...) arrays}. Per output: sqnr_db, cosine, and top-k agreement when
    the output is a class vector (N, classes) with more classes than k."""
    report = {}
    for k, r in ref.items():
        t = np.asarray(test[k]).reshape(r.shape)
        row = {"sqnr_db": sqnr_db(r, t), "cosine": cosine(r, t)}
        flat = r.reshape(len(r), -1)
        if flat.shape[1] > 1 and flat.shape[1] == int(np.prod(r.shape[1:])) and r.ndim == 2:
            for kk in ks:
                if flat.shape[1] > kk:
                    row[f"top{kk}"] = topk_agreement(r, t, kk)
        report[k] = row
    return report


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


def yolo2_decode(out, anchors, num_classes, threshold=0.5, nms=0.3):
    """One region output (A*(5+C), H, W) -> detections [x0, y0, x1, y1, score, class] in 0..1."""
    anchors = np.asarray(anchors, np.float64).reshape(-1, 2)
    a, (c, h, w) = len(anchors), out.shape
    if c != a * (5 + num_classes):
        raise ValueError(f"region output has {c} channels, expected {a} anchors x (5 + {num_classes})")
    v = out.reshape(a, 5 + num_classes, h, w).astype(np.float64)
    gy, gx = np.mgrid[0:h, 0:w]
    cx, cy = (gx + _sigmoid(v[:, 0])) / w, (gy + _sigmoid(v[:, 1])) / h
    bw = anchors[:, 0, None, None] * np.exp(v[:, 2]) / w
    bh = anchors[:, 1, None, None] * np.exp(v[:, 3]) / h
    cls = v[:, 5:]
    prob = np.exp(cls - cls.max(1, keepdims=True))
    prob /= prob.sum(1, keepdims=True)
    score = _sigmoid(v[:, 4]) * prob.max(1)
    keep = score > threshold
    dets = np.stack([cx - bw / 2, cy - bh / 2, cx + bw / 2, cy + bh / 2, score, prob.argmax(1)], -1)[keep]
    return _nms(dets[np.argsort(-dets[:, 4])], nms)


def iou(a, b):
    x0, y0 = np.maximum(a[0], b[:, 0]), np.maximum(a[1], b[:, 1])
    x1, y1 = np.minimum(a[2], b[:, 2]), np.minimum(a[3], b[:, 3])
    inter = np.clip(x1 - x0, 0, None) * np.clip(y1 - y0, 0, None)
    area = lambda d: (d[..., 2] - d[..., 0]) * (d[..., 3] - d[..., 1])
    return inter / np.maximum(area(a) + area(b) - inter, 1e-12)


def _nms(dets, thresh):
    kept = []
    for d in dets:
        if not kept or np.all((iou(d, np.array(kept)) <= thresh) | (np.array(kept)[:, 5] != d[5])):
            kept.append(d)
    return np.array(kept).reshape(-1, 6)


def detection_agreement(ref_dets, test_dets, iou_thresh=0.5):
    """Greedy one-to-one matching (same class, IoU >= iou_thresh) of test detections to the float
    ones, summed over images: {"ref", "test", "matched", "recall", "precision"}."""
    n_ref = n_test = matched = 0
    for r, t in zip(ref_dets, test_dets):
        n_ref, n_test = n_ref + len(r), n_test + len(t)
        free = np.ones(len(t), bool)
        for d in r:
            if not free.any():
                break
            ious = np.where(free & (t[:, 5] == d[5]), iou(d, t), 0) if len(t) else np.zeros(0)
            if len(ious) and ious.max() >= iou_thresh:
                free[ious.argmax()] = False
                matched += 1
    return {"ref": n_ref, "test": n_test, "matched": matched,
            "recall": matched / n_ref if n_ref else 1.0, "precision": matched / n_test if n_test else 1.0}


def read_labels(path):
    return [line.strip() for line in open(path, encoding="utf-8") if line.strip()]

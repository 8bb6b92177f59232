"""Float-vs-test agreement for `tl2k210 compare`: per output SQNR and cosine, top-1/top-5 agreement
for classifiers, and detection agreement for YOLOv2 region outputs (decoded by
tl2k210.k210.yolo, MaixPy's region layer)."""
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


def yolo2_boxes(region, anchors, threshold=0.5, nms=0.3):
    """Decode one (A*(5+C), H, W) region map with MaixPy's rules (tl2k210.k210.yolo.decode),
    boxes in 0..1 image units."""
    from tl2k210.k210.yolo import decode
    _, h, w = region.shape
    return decode(region, anchors, w, h, 1, 1, threshold, nms)


def detection_agreement(ref_boxes, test_boxes, iou_thresh=0.5):
    """Greedy one-to-one matching (same class, IoU >= iou_thresh) of test boxes to the float ones
    (per image lists of tl2k210.k210.yolo.Box), summed over images:
    {"ref", "test", "matched", "recall", "precision"}."""
    from tl2k210.k210.yolo import iou
    n_ref = n_test = matched = 0
    for r, t in zip(ref_boxes, test_boxes):
        n_ref, n_test = n_ref + len(r), n_test + len(t)
        free = list(t)
        for d in r:
            cands = [(iou(d.rect(), b.rect()), i) for i, b in enumerate(free) if b.classid == d.classid]
            best = max(cands, default=(0.0, None))
            if best[1] is not None and best[0] >= iou_thresh:
                free.pop(best[1])
                matched += 1
    return {"ref": n_ref, "test": n_test, "matched": matched,
            "recall": matched / n_ref if n_ref else 1.0, "precision": matched / n_test if n_test else 1.0}


def read_labels(path):
    return [line.strip() for line in open(path, encoding="utf-8") if line.strip()]

"""Fit the 5 YOLOv2 anchors (grid units, 16 px cells) to the training boxes: k-means with the
1 - IoU distance of boxes sharing a centre (YOLOv2's dimension clusters), on the boxes of
augmented training frames, so that they match the scales the network is trained on
(data.sample_boxes: the geometry of data.sample without the pixels).

    .venv/bin/python -m models.face_detect.anchors --data /path/to/face-training [--frames 20000]

Prints the fitted anchors (recipe.toml [decode] anchors holds them) and their mean IoU with the
boxes, and that of --compare (default: MaixPy's face anchors; the network's are `ANCHORS`).
"""
from __future__ import annotations

import argparse
import sys

import numpy as np

from models.face_detect import data
from models.face_detect.network import MAIXPY_ANCHORS

CELL = 16


def iou(a, c):
    """IoU of centred boxes: a (n, 2) x c (k, 2) widths/heights -> (n, k)."""
    inter = np.minimum(a[:, None, 0], c[None, :, 0]) * np.minimum(a[:, None, 1], c[None, :, 1])
    return inter / (a[:, None].prod(-1) + c[None].prod(-1) - inter)


def mean_best_iou(wh, anchors) -> float:
    return float(iou(wh, anchors).max(1).mean())


def kmeans_iou(wh: np.ndarray, k: int = 5, iters: int = 300, seed: int = 0):
    """Anchors (k, 2) sorted by area, and the mean best IoU of the boxes with them."""
    rng = np.random.default_rng(seed)
    c = wh[rng.choice(len(wh), k, replace=False)]
    for _ in range(iters):
        assign = np.argmax(iou(wh, c), 1)
        new = np.array([np.median(wh[assign == j], 0) if np.any(assign == j) else c[j] for j in range(k)])
        if np.allclose(new, c):
            break
        c = new
    c = c[np.argsort(c.prod(1))]
    return c, mean_best_iou(wh, c)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", help="get-face-training.sh output (default $TL2K210_FACE_DATA)")
    ap.add_argument("--frames", type=int, default=20000)
    ap.add_argument("--compare", default=",".join(map(str, MAIXPY_ANCHORS)),
                    help="also print the mean IoU of these anchors (default: MaixPy's face anchors)")
    args = ap.parse_args(argv)
    root = data.training_dir(args.data)
    rng = np.random.default_rng([data.TRAIN_SEED, 99])
    wh = np.array([(w / CELL, h / CELL) for _ in range(args.frames) for _, _, w, h in data.sample_boxes(rng, root)])
    anchors, mean_iou = kmeans_iou(wh)
    print(f"{len(wh)} boxes from {args.frames} frames, mean IoU with the anchors {mean_iou:.3f}")
    print("anchors = [" + ", ".join(f"{v:.3f}" for v in anchors.reshape(-1)) + "]")
    other = np.array([float(v) for v in args.compare.split(",")]).reshape(-1, 2)
    print(f"mean IoU with {args.compare}: {mean_best_iou(wh, other):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Evaluate the face detector: AP@0.5 on held-out composites (float TensorLayer model vs the
kmodel on the bit-exact KPU emulator) and the real-photo checks (faces found on astronaut and
grace_hopper, nothing on coffee, rocket and china).

    .venv/bin/python models/face_detect/evaluate.py [--n 200] [--out out/face_detect] [--json FILE]

Builds the zoo model (kmodel + kfpkg + report) into --out first, exactly as `tl2k210 zoo build`.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from tl2k210 import paths

sys.path.insert(0, str(paths.models_dir().parent))   # `models.<name>` imports (checkout or wheel)
HERE = paths.models_dir() / "face_detect"

from models.face_detect import data  # noqa: E402
from models.face_detect.network import ANCHORS  # noqa: E402

GW, GH = 20, 15
AP_THRESHOLD = 0.05  # decode threshold for the precision/recall sweep
THRESHOLD, NMS = 0.5, 0.3


def float_outputs(net, images, batch=8):
    """Region maps (30, 15, 20) of the float TensorLayer model for HWC uint8 images."""
    outs = []
    for i in range(0, len(images), batch):
        x = np.stack(images[i:i + batch]).astype(np.float32) / 255.0
        y = np.asarray(net(x))
        outs += [o.transpose(2, 0, 1) for o in y]
    return outs


def kmodel_outputs(kmodel_path, images):
    from tl2k210.k210.emulator import Emulator
    emu = Emulator.load(kmodel_path)
    return [np.asarray(emu.run(np.ascontiguousarray(img.transpose(2, 0, 1)))[0], np.float32) for img in images]


def detect(out, threshold=THRESHOLD, nms=NMS):
    from tl2k210.k210 import yolo
    return yolo.decode(out, ANCHORS, GW, GH, data.W, data.H, threshold=threshold, nms=nms)


def average_precision(outputs, gts, iou_thr=0.5):
    """VOC all-point AP of the decoded detections (threshold AP_THRESHOLD, NMS 0.3)."""
    from tl2k210.k210 import yolo
    scored, n_gt = [], sum(len(g) for g in gts)
    for out, gt in zip(outputs, gts):
        boxes = sorted(detect(out, AP_THRESHOLD), key=lambda b: -b.value)
        used = np.zeros(len(gt), bool)
        for b in boxes:
            ious = [yolo.iou(b.rect(), g) for g in gt]
            j = int(np.argmax(ious)) if ious else -1
            tp = j >= 0 and ious[j] >= iou_thr and not used[j]
            if tp:
                used[j] = True
            scored.append((b.value, tp))
    if not n_gt:
        return float("nan")
    scored.sort(key=lambda s: -s[0])
    tp = np.cumsum([s[1] for s in scored])
    fp = np.cumsum([not s[1] for s in scored])
    rec = tp / n_gt
    prec = tp / np.maximum(tp + fp, 1e-9)
    mrec = np.concatenate([[0], rec, [1]])
    mpre = np.concatenate([[0], prec, [0]])
    for i in range(len(mpre) - 2, -1, -1):
        mpre[i] = max(mpre[i], mpre[i + 1])
    idx = np.where(mrec[1:] != mrec[:-1])[0]
    return float(np.sum((mrec[idx + 1] - mrec[idx]) * mpre[idx + 1]))


def photo_results(outputs: dict, photos: dict):
    """Per photo: boxes at threshold 0.5, best IoU with the annotated face (if any)."""
    from tl2k210.k210 import yolo
    res = {}
    for name, (img, box) in photos.items():
        boxes = detect(outputs[name])
        r = {"boxes": [[round(float(v), 1) for v in b.rect()] + [round(float(b.value), 3)] for b in boxes]}
        if box is not None:
            ious = [yolo.iou(b.rect(), box) for b in boxes]
            r["annotated"] = [round(float(v), 1) for v in box]
            r["best_iou"] = round(float(max(ious)), 3) if ious else 0.0
            r["found"] = bool(ious) and max(ious) >= 0.5
            r["false_positives"] = int(sum(i < 0.5 for i in ious))
        else:
            r["false_positives"] = len(boxes)
        res[name] = r
    return res


def evaluate(n=200, out_dir=None, progress=False):
    from tl2k210 import zoo
    out_dir = Path(out_dir or "out/face_detect")
    t = time.time()
    report = zoo.build("face_detect", out_dir, progress=progress)
    build_s = time.time() - t
    kpath = report["kmodel"]
    net = zoo.build_network(zoo.get("face_detect"))
    held = data.heldout(n)
    imgs, gts = [i for i, _ in held], [list(map(tuple, b)) for _, b in held]
    photos = data.real_photos()
    t = time.time()
    f_out = float_outputs(net, imgs + [p[0] for p in photos.values()])
    k_out = kmodel_outputs(kpath, imgs + [p[0] for p in photos.values()])
    run_s = time.time() - t
    rc = report["receipt"]
    res = {
        "heldout_images": n, "heldout_faces": int(sum(len(g) for g in gts)),
        "ap50_float": average_precision(f_out[:n], gts),
        "ap50_kmodel": average_precision(k_out[:n], gts),
        "photos_float": photo_results(dict(zip(photos, f_out[n:])), photos),
        "photos_kmodel": photo_results(dict(zip(photos, k_out[n:])), photos),
        "file_size": rc["file_size"], "peak_kpu_ram": rc["peak_kpu_ram"], "latency_ms": rc["latency_ms"],
        "cpu_layers": [r["node"] for r in rc["layers"] if r["unit"] != "KPU"],
        "layers": [(r["node"], r["unit"], r.get("sqnr_db")) for r in rc["layers"]],
        "output_sqnr_db": rc["totals"].get("output_sqnr_db"),
        "build_s": round(build_s, 1), "run_s": round(run_s, 1), "kmodel": kpath,
    }
    return res


def table(res) -> str:
    lines = [f"held-out composites: {res['heldout_images']} images, {res['heldout_faces']} faces",
             f"AP@0.5 float  {res['ap50_float']:.3f}",
             f"AP@0.5 kmodel {res['ap50_kmodel']:.3f} (KPU emulator)",
             f"kmodel {res['file_size']:,} B, peak KPU RAM {res['peak_kpu_ram']:,} B, "
             f"est. latency {res['latency_ms']:.1f} ms, non-KPU layers: {', '.join(res['cpu_layers']) or 'none'}",
             "", f"{'photo':14s} {'model':7s} {'boxes':>5s} {'best IoU':>8s} {'FP':>3s}  top box (x, y, w, h, score)"]
    for kind in ("float", "kmodel"):
        for name, r in res[f"photos_{kind}"].items():
            top = max(r["boxes"], key=lambda b: b[4]) if r["boxes"] else "-"
            lines.append(f"{name:14s} {kind:7s} {len(r['boxes']):5d} {r.get('best_iou', '-')!s:>8s} "
                         f"{r['false_positives']:3d}  {top}")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=200, help="held-out composites")
    ap.add_argument("--out", default="out/face_detect")
    ap.add_argument("--json", default=str(HERE / "results.json"))
    args = ap.parse_args(argv)
    res = evaluate(args.n, args.out, progress=False)
    print(table(res))
    Path(args.json).write_text(json.dumps(res, indent=1))
    print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

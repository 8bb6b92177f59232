"""Evaluate face detectors on real faces (../shared/testdata/faces; never trained on):

  cmu_mit_frontal      130 photos, 511 faces           AP@0.5, recall at 1 false positive / image
  wider_val_subset200  200 photos, faces >= 10 px wide at 416x416 (smaller or `invalid` faces
                       are ignored: a detection on one is neither right nor wrong)   same
  nonface_scenes       274 face-free scenes             false positives / image at threshold 0.5

for the zoo model (float TensorLayer model and its kmodel on the bit-exact KPU emulator) and the
anchor, MaixPy's facedetect_320x240_v3.kmodel (testdata/kmodels), through the same decode
(tl2k210.k210.yolo.decode = kpu.run_yolo2) and NMS 0.3. Every photo is stretched to 320x240 like
a camera frame. AP: VOC all-point, detections decoded at threshold 0.05; a detection is right
when its IoU with a not yet matched face is >= 0.5.

    .venv/bin/python -m models.face_detect.evaluate [--faces DIR] [--out out/face_detect] [--json FILE]

Builds the zoo model (kmodel + kfpkg + report) into --out first, exactly as `tl2k210 zoo build`.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from tl2k210 import paths

sys.path.insert(0, str(paths.models_dir().parent))   # `models.<name>` imports (checkout or wheel)
HERE = paths.models_dir() / "face_detect"

from models.face_detect import data  # noqa: E402
from models.face_detect.network import ANCHORS, MAIXPY_ANCHORS  # noqa: E402

GW, GH = 20, 15
AP_THRESHOLD = 0.05  # decode threshold for the precision/recall sweep
THRESHOLD, NMS = 0.5, 0.3
ANCHOR_KMODEL = ("kmodels", "facedetect_320x240_v3.kmodel")
# the anchor's anchors (testdata/kmodels/MANIFEST.md, MaixPy's face example)
ANCHOR_ANCHORS = MAIXPY_ANCHORS


def float_outputs(net, images, batch=8):
    """Region maps (30, 15, 20) of the float TensorLayer model for HWC uint8 images."""
    outs = []
    for i in range(0, len(images), batch):
        x = np.stack(images[i:i + batch]).astype(np.float32) / 255.0
        outs += [o.transpose(2, 0, 1) for o in np.asarray(net(x))]
    return outs


def kmodel_outputs(kmodel_path, images):
    from tl2k210.k210.emulator import Emulator
    emu = Emulator.load(kmodel_path)
    return [np.asarray(emu.run(np.ascontiguousarray(img.transpose(2, 0, 1)))[0], np.float32) for img in images]


def detect(out, anchors=ANCHORS, threshold=THRESHOLD, nms=NMS):
    from tl2k210.k210 import yolo
    return yolo.decode(out, anchors, GW, GH, data.W, data.H, threshold=threshold, nms=nms)


def match(boxes, gt, ignore, iou_thr=0.5):
    """[(score, True = right / False = wrong)] for boxes sorted by score; boxes on ignored faces
    are dropped."""
    from tl2k210.k210 import yolo
    used = np.zeros(len(gt), bool)
    out = []
    for b in sorted(boxes, key=lambda b: -b.value):
        ious = np.array([yolo.iou(b.rect(), g) if not used[j] else 0.0 for j, g in enumerate(gt)])
        if len(ious) and ious.max() >= iou_thr:
            used[int(np.argmax(ious))] = True
            out.append((b.value, True))
        elif any(yolo.iou(b.rect(), g) >= iou_thr for g in ignore):
            continue
        else:
            out.append((b.value, False))
    return out


def detection_metrics(outputs, gts, ignores, anchors) -> dict:
    """AP@0.5 (VOC all-point), recall at 1 false positive per image, and recall / false
    positives per image at the deployment threshold 0.5."""
    scored = []
    for out, gt, ig in zip(outputs, gts, ignores):
        scored += match(detect(out, anchors, AP_THRESHOLD), gt, ig)
    n_gt, n_img = sum(len(g) for g in gts), len(outputs)
    scored.sort(key=lambda s: -s[0])
    ok = np.array([s[1] for s in scored], bool)
    tp, fp = np.cumsum(ok), np.cumsum(~ok)
    at05 = np.array([s[0] > THRESHOLD for s in scored], bool)
    res = {"images": n_img, "faces": n_gt,
           "fp_per_image_at_0.5": round(float((~ok & at05).sum()) / n_img, 4)}
    if not n_gt:
        return res
    rec, prec = tp / n_gt, tp / np.maximum(tp + fp, 1)
    mrec = np.concatenate([[0], rec, [1]])
    mpre = np.concatenate([[0], prec, [0]])
    mpre = np.maximum.accumulate(mpre[::-1])[::-1]
    idx = np.where(mrec[1:] != mrec[:-1])[0]
    within = fp <= n_img
    res.update(ap50=round(float(np.sum((mrec[idx + 1] - mrec[idx]) * mpre[idx + 1])), 4),
               recall_at_1fp_per_image=round(float(rec[within].max()) if within.any() else 0.0, 4),
               recall_at_0_5=round(float((ok & at05).sum()) / n_gt, 4))
    return res


MODELS = ("zoo_float", "zoo_kmodel", "anchor_kmodel")


def evaluate(faces=None, out_dir="out/face_detect", models=MODELS, progress=False) -> dict:
    from tl2k210 import zoo
    from tl2k210.k210 import cost
    from tl2k210.k210.kmodel import load
    faces = data.faces_dir(faces)
    if faces is None or not faces.is_dir():
        data.fail("../shared/testdata/faces not found: pass --faces DIR (or set TL2K210_TESTDATA)")
    anchor_path = paths.testdata(*ANCHOR_KMODEL)
    runs = {"anchor_kmodel": (lambda imgs: kmodel_outputs(anchor_path, imgs), ANCHOR_ANCHORS)}
    est = cost.estimate(load(anchor_path))
    res = {"sets": {}, "anchor_kmodel": {"path": "testdata/" + "/".join(ANCHOR_KMODEL),
                                         "file_size": anchor_path.stat().st_size, "latency_ms": round(est.ms, 2)}}
    if {"zoo_float", "zoo_kmodel"} & set(models):
        report = zoo.build("face_detect", Path(out_dir), progress=progress)
        rc = report["receipt"]
        net = zoo.build_network(zoo.get("face_detect"))
        runs.update(zoo_float=(lambda imgs: float_outputs(net, imgs), ANCHORS),
                    zoo_kmodel=(lambda imgs: kmodel_outputs(report["kmodel"], imgs), ANCHORS))
        res["zoo_kmodel"] = {
            "file_size": rc["file_size"], "peak_kpu_ram": rc["peak_kpu_ram"], "latency_ms": round(rc["latency_ms"], 2),
            "cpu_layers": [r["node"] for r in rc["layers"] if r["unit"] != "KPU"],
            "output_sqnr_db": rc["totals"].get("output_sqnr_db")}
    for set_name, loader in data.EVAL_SETS.items():
        items = loader(faces)
        imgs = [i[1] for i in items]
        gts, ignores = [i[2] for i in items], [i[3] for i in items]
        res["sets"][set_name] = {name: detection_metrics(runs[name][0](imgs), gts, ignores, runs[name][1])
                                 for name in models}
        if progress:
            print(set_name, json.dumps(res["sets"][set_name]), flush=True)
    return res


def table(res) -> str:
    """The results as a Markdown table (what the README shows)."""
    nan = float("nan")
    lines = ["| set | model | AP@0.5 | recall at 1 FP/image | recall at 0.5 | FP/image at 0.5 |",
             "|---|---|---|---|---|---|"]
    for set_name, by_model in res["sets"].items():
        for name in MODELS:
            if name in by_model:
                m = by_model[name]
                lines.append(f"| {set_name} ({m['images']} images, {m['faces']} faces) | {name} | "
                             f"{m.get('ap50', nan):.3f} | {m.get('recall_at_1fp_per_image', nan):.3f} | "
                             f"{m.get('recall_at_0_5', nan):.3f} | {m['fp_per_image_at_0.5']:.3f} |")
    lines.append("")
    if "zoo_kmodel" in res:
        z = res["zoo_kmodel"]
        lines.append(f"zoo kmodel: {z['file_size']:,} B, est. latency {z['latency_ms']:.1f} ms, peak KPU RAM "
                     f"{z['peak_kpu_ram']:,} B, non-KPU layers: {', '.join(z['cpu_layers']) or 'none'}, "
                     f"output SQNR vs float {z['output_sqnr_db']:.1f} dB")
    a = res["anchor_kmodel"]
    lines.append(f"anchor kmodel ({a['path']}): {a['file_size']:,} B, est. latency {a['latency_ms']:.1f} ms")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--faces", help="testdata/faces folder (default ../shared/testdata/faces)")
    ap.add_argument("--out", default="out/face_detect")
    ap.add_argument("--json", default=str(HERE / "results.json"))
    ap.add_argument("--models", default=",".join(MODELS),
                    help="comma-separated subset of %(default)s; the others keep their entries in --json")
    args = ap.parse_args(argv)
    models = [m for m in args.models.split(",") if m]
    bad = sorted(set(models) - set(MODELS))
    if bad:
        print(f"error: --models {','.join(bad)}: choose from {','.join(MODELS)}", file=sys.stderr)
        return 2
    res = evaluate(args.faces, args.out, models, progress=True)
    old = json.loads(Path(args.json).read_text()) if Path(args.json).is_file() else {}
    res["sets"] = {k: {**old.get("sets", {}).get(k, {}), **v} for k, v in res["sets"].items()}
    res = {**old, **res}
    print(table(res))
    from tl2k210.fileio import atomic_write
    atomic_write(Path(args.json), (json.dumps(res, indent=1) + "\n").encode())
    print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

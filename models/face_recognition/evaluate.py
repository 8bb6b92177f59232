"""Evaluate face embedders on real faces (../shared/testdata/faces; never trained on):

  lfw_fold1  LFW View-2 fold 1, 300 same + 300 different pairs: verification accuracy at the
             threshold chosen on the training folds' pairs (folds 2-10 of pairs.txt, needs
             --data: the get-face-training.sh folder), ROC-AUC
  orl_att    40 people x 10: rank-1 identification, image 1 of each person enrolled, the other
             9 (360 probes) matched by cosine similarity

for the zoo model (float TensorLayer model and its kmodel on the bit-exact KPU emulator) and the
anchor, canmv_examples' feature_extraction.kmodel (testdata/corpus/kmodels, 192-d), on the same
fixed crops (data.lfw_crop / data.orl_crop, 64x64). Score = cosine of L2-normalised embeddings.

    .venv/bin/python -m models.face_recognition.evaluate --data TRAINING_DIR [--json FILE]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from tl2k210 import paths

sys.path.insert(0, str(paths.models_dir().parent))   # `models.<name>` imports (checkout or wheel)
HERE = paths.models_dir() / "face_recognition"

from models.face_recognition import data  # noqa: E402

ANCHOR_KMODEL = ("corpus", "kmodels", "canmv_examples__feature_extraction.kmodel")


def l2n(e):
    e = np.asarray(e, np.float64)
    return e / np.maximum(np.linalg.norm(e, axis=-1, keepdims=True), 1e-12)


def float_embeddings(net, images, batch=64):
    """(N, D) raw embeddings of the float TensorLayer model for HWC uint8 64x64 images."""
    return np.concatenate([np.asarray(net(np.stack(images[i:i + batch]).astype(np.float32) / 255.0))
                           for i in range(0, len(images), batch)])


def kmodel_embeddings(kmodel_path, images):
    """(N, D) raw embeddings of a kmodel on the emulator (planar uint8 input)."""
    from tl2k210.k210.emulator import Emulator
    emu = Emulator.load(kmodel_path)
    return np.stack([np.asarray(emu.run(np.ascontiguousarray(img.transpose(2, 0, 1)))[0], np.float32).reshape(-1)
                     for img in images])


def pair_scores(emb, idx):
    e = l2n(emb)
    return np.sum(e[idx[:, 0]] * e[idx[:, 1]], axis=1)


def best_threshold(score, same) -> float:
    """The threshold (a midpoint between sorted scores) with the highest accuracy."""
    order = np.sort(np.unique(score))
    cands = np.r_[order[0] - 1e-6, (order[:-1] + order[1:]) / 2, order[-1] + 1e-6]
    return float(cands[int(np.argmax([np.mean((score >= t) == same) for t in cands]))])


def verification(score, same, threshold) -> dict:
    from sklearn.metrics import roc_auc_score
    return {"pairs": int(len(same)), "threshold": round(threshold, 4),
            "accuracy": round(float(np.mean((score >= threshold) == same)), 4),
            "auc": round(float(roc_auc_score(same, score)), 4),
            "best_accuracy_on_fold1_itself": round(float(np.mean((score >= best_threshold(score, same)) == same)), 4)}


def rank1(emb, ids, nums) -> float:
    e = l2n(emb)
    gallery, probe = nums == 1, nums != 1
    best = np.argmax(e[probe] @ e[gallery].T, axis=1)
    return round(float(np.mean(ids[gallery][best] == ids[probe])), 4)


MODELS = ("zoo_float", "zoo_kmodel", "anchor_kmodel")


def evaluate(faces=None, root=None, out_dir="out/face_recognition", train_folds=range(1, 10), per_fold=600,
             models=MODELS, progress=False):
    from tl2k210 import zoo
    faces = data.faces_dir(faces)
    if faces is None or not faces.is_dir():
        data.fail("../shared/testdata/faces not found: pass --faces DIR (or set TL2K210_TESTDATA)")
    root = data.training_dir(root)
    res = {"threshold_pairs": {"folds": [k + 1 for k in train_folds], "per_fold": per_fold}, "models": {}}
    runs = {"anchor_kmodel": lambda x: kmodel_embeddings(paths.testdata(*ANCHOR_KMODEL), x)}
    if {"zoo_float", "zoo_kmodel"} & set(models):
        report = zoo.build("face_recognition", Path(out_dir), progress=progress)
        net = zoo.build_network(zoo.get("face_recognition"))
        runs.update(zoo_float=lambda x: float_embeddings(net, list(x)),
                    zoo_kmodel=lambda x: kmodel_embeddings(report["kmodel"], x))
        rc = report["receipt"]
        res["zoo_kmodel"] = {"file_size": rc["file_size"], "latency_ms": round(rc["latency_ms"], 2)}
    fs = data.folds(root)
    half = per_fold // 2  # the first `half` same and `half` different pairs of each fold
    tr_pairs = [p for k in train_folds for p in fs[k][:half] + fs[k][300:300 + half]]
    tr_crops, tr_idx, tr_same = data.lfw_pairs(tr_pairs, root / "lfw" / "images")
    crops, idx, same = data.lfw_fold1(faces)
    orl_crops, orl_ids, orl_nums = data.orl(faces)
    res["threshold_pairs"]["pairs"] = len(tr_pairs)
    for name in models:
        run = runs[name]
        t = best_threshold(pair_scores(run(tr_crops), tr_idx), tr_same)
        res["models"][name] = {"lfw_fold1": verification(pair_scores(run(crops), idx), same, t),
                               "orl_rank1": rank1(run(orl_crops), orl_ids, orl_nums)}
        if progress:
            print(name, json.dumps(res["models"][name]), flush=True)
    return res


def table(res) -> str:
    """The results as a Markdown table (what the README shows)."""
    tp = res["threshold_pairs"]
    lines = ["| model | LFW fold 1 accuracy | threshold | ROC-AUC | best accuracy on fold 1 itself | ORL rank-1 |",
             "|---|---|---|---|---|---|"]
    for name in MODELS:
        if name in res["models"]:
            m = res["models"][name]
            v = m["lfw_fold1"]
            lines.append(f"| {name} | {v['accuracy']:.4f} | {v['threshold']:.3f} | {v['auc']:.4f} | "
                         f"{v['best_accuracy_on_fold1_itself']:.4f} | {m['orl_rank1']:.4f} |")
    lines.append(f"\nthresholds chosen on {tp['pairs']} pairs of LFW folds {tp['folds'][0]}-{tp['folds'][-1]} "
                 f"({tp['per_fold']} per fold)")
    if "zoo_kmodel" in res:
        lines.append(f"zoo kmodel: {res['zoo_kmodel']['file_size']:,} B, est. latency "
                     f"{res['zoo_kmodel']['latency_ms']:.2f} ms")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--faces", help="testdata/faces folder (default ../shared/testdata/faces)")
    ap.add_argument("--data", help="get-face-training.sh folder (default $TL2K210_FACE_DATA)")
    ap.add_argument("--out", default="out/face_recognition")
    ap.add_argument("--json", default=str(HERE / "results.json"))
    ap.add_argument("--per-fold", type=int, default=600,
                    help="threshold pairs per training fold, half same, half different (default all 600)")
    ap.add_argument("--models", default=",".join(MODELS),
                    help="comma-separated subset of %(default)s; the others keep their entries in --json")
    args = ap.parse_args(argv)
    models = [m for m in args.models.split(",") if m]
    bad = sorted(set(models) - set(MODELS))
    if bad:
        print(f"error: --models {','.join(bad)}: choose from {','.join(MODELS)}", file=sys.stderr)
        return 2
    res = evaluate(args.faces, args.data, args.out, per_fold=args.per_fold, models=models, progress=True)
    old = json.loads(Path(args.json).read_text()) if Path(args.json).is_file() else {}
    res["models"] = {**old.get("models", {}), **res["models"]}
    res = {**old, **res}
    print(table(res))
    from tl2k210.fileio import atomic_write
    atomic_write(Path(args.json), (json.dumps(res, indent=1) + "\n").encode())
    print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Evaluate the face embedder: face verification on held-out augmentations, float TensorLayer
model vs the kmodel on the bit-exact KPU emulator.

    .venv/bin/python models/face_recognition/evaluate.py [--out out/zoo] [--json FILE] [--kmodel K]

Builds the zoo model (kmodel + kfpkg + report) into --out first, exactly as `tl2k210 zoo build`
(unless --kmodel is given). Two sets, both from the held-out seed (data.HELDOUT_SEED):
  seen     faces 0..79 (training identities), 4 new augmentations each: 480 same-identity pairs
           + 480 different-identity pairs
  unseen   faces 80..99 (never trained on), 8 augmentations each: 560 + 560 pairs
Embeddings are L2-normalised; a pair's score is the cosine similarity. Reported: ROC-AUC,
verification accuracy at the best threshold, that threshold, the threshold for a 1 % false
accept rate (FAR) with the true accept rate (TAR) there, and the accuracy at the recipe's
threshold ([decode] threshold, the one the MaixPy script and recognize.py use: the unseen set's
FAR-1 % threshold of the kmodel, rounded).
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

from models.face_recognition import data  # noqa: E402

SETS = {"seen": (data.TRAIN_FACES, 4), "unseen": (data.UNSEEN_FACES, 8)}


def l2n(e):
    e = np.asarray(e, np.float64)
    return e / np.maximum(np.linalg.norm(e, axis=-1, keepdims=True), 1e-12)


def float_embeddings(net, images, batch=64):
    """(N, 128) raw embeddings of the float TensorLayer model for HWC uint8 64x64 images."""
    outs = []
    for i in range(0, len(images), batch):
        x = np.stack(images[i:i + batch]).astype(np.float32) / 255.0
        outs.append(np.asarray(net(x)))
    return np.concatenate(outs)


def kmodel_embeddings(kmodel_path, images):
    """(N, 128) raw embeddings of the kmodel on the emulator (planar uint8 input)."""
    from tl2k210.k210.emulator import Emulator
    emu = Emulator.load(kmodel_path)
    return np.stack([np.asarray(emu.run(np.ascontiguousarray(img.transpose(2, 0, 1)))[0], np.float32).reshape(-1)
                     for img in images])


def verification(emb, ids, threshold=None):
    """ROC-AUC and accuracy of cosine-similarity verification on data.pairs(ids)."""
    from sklearn.metrics import roc_auc_score
    e = l2n(emb)
    i, j, same = data.pairs(ids)
    score = np.sum(e[i] * e[j], axis=1)
    order = np.sort(np.unique(score))
    cands = np.r_[order[0] - 1e-6, (order[:-1] + order[1:]) / 2, order[-1] + 1e-6]
    accs = np.array([np.mean((score >= t) == same) for t in cands])
    k = int(np.argmax(accs))
    out = {"pairs": int(len(same)), "auc": float(roc_auc_score(same, score)),
           "best_acc": float(accs[k]), "best_threshold": float(cands[k]),
           "pos_mean": float(score[same].mean()), "neg_mean": float(score[~same].mean())}
    t1 = float(np.quantile(score[~same], 0.99))     # false accepts <= 1 % of different pairs
    out.update(far1_threshold=t1, tar_at_far1=float(np.mean(score[same] > t1)))
    if threshold is not None:
        out["acc_at_threshold"] = float(np.mean((score >= threshold) == same))
    return out


def evaluate(kmodel_path, net=None, threshold=None, sets=("seen", "unseen")):
    """{set: {"float": metrics, "kmodel": metrics, "cos_float_kmodel": mean cos}}."""
    from tl2k210 import zoo
    r = zoo.get("face_recognition")
    if threshold is None:
        threshold = float(r.decode.get("threshold", 0.5))
    net = net or zoo.build_network(r)
    res = {}
    for name in sets:
        faces, per = SETS[name]
        imgs, ids = data.heldout(faces, per)
        ef, ek = float_embeddings(net, list(imgs)), kmodel_embeddings(kmodel_path, imgs)
        res[name] = {"images": int(len(imgs)), "identities": len(faces),
                     "float": verification(ef, ids, threshold), "kmodel": verification(ek, ids, threshold),
                     "cos_float_kmodel": float(np.mean(np.sum(l2n(ef) * l2n(ek), axis=1)))}
    return res


def table(res, receipt=None) -> str:
    lines = ["| set | pairs | ROC-AUC float | ROC-AUC kmodel | best acc float | best acc kmodel "
             "(threshold) | TAR @ FAR 1 % kmodel (threshold) | acc kmodel @ recipe threshold | cos(float, kmodel) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, v in res.items():
        f, k = v["float"], v["kmodel"]
        lines.append(f"| {name} ({v['identities']} ids, {v['images']} imgs) | {f['pairs']} | {f['auc']:.4f} | "
                     f"{k['auc']:.4f} | {f['best_acc']:.3f} | {k['best_acc']:.3f} ({k['best_threshold']:.2f}) | "
                     f"{k['tar_at_far1']:.3f} ({k['far1_threshold']:.2f}) | "
                     f"{k.get('acc_at_threshold', float('nan')):.3f} | {v['cos_float_kmodel']:.4f} |")
    if receipt:
        cpu = [r["node"] + " (" + r["why"].split(":")[0] + ")" for r in receipt["layers"] if r["unit"] == "CPU"]
        lines.append("")
        lines.append(f"kmodel {receipt['file_size']:,} B, peak KPU RAM {receipt['peak_kpu_ram']:,} B, "
                     f"main memory {receipt['main_memory']:,} B, estimated latency "
                     f"{receipt['latency_ms']:.2f} ms at 400 MHz; CPU layers: {', '.join(cpu)}")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="zoo build folder (default: the zoo folder, ~/.cache/tl2k210/zoo)")
    ap.add_argument("--kmodel", help="evaluate this kmodel instead of building one")
    ap.add_argument("--json", help="write the results here (default OUT/face_recognition.eval.json)")
    args = ap.parse_args(argv)
    from tl2k210 import paths, zoo
    t0 = time.time()
    out_dir = Path(args.out) if args.out else paths.zoo_dir()
    receipt = None
    if args.kmodel:
        kpath = args.kmodel
    else:
        rep = zoo.build("face_recognition", out_dir, progress=False)
        kpath, receipt = rep["kmodel"], rep["receipt"]
    res = evaluate(kpath)
    print(table(res, receipt))
    out = Path(args.json or out_dir / "face_recognition.eval.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"kmodel": str(kpath), "results": res}, indent=1))
    print(f"\nwrote {out} ({time.time() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

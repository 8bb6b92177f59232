"""Transfer learning, the everyday MaixHub case: a folder of images per class → a MobileNetV1
classifier fine-tuned on them → kmodel, with float vs kmodel accuracy on a held-out split.

    python models/mobilenet_v1/transfer.py DATA_DIR --out out/transfer      # DATA_DIR/<class>/*.jpg
    python models/mobilenet_v1/transfer.py --demo-faces --out out/transfer  # offline demo dataset

The ImageNet backbone (alpha 0.25, testdata weights) stays frozen; a new dense head is trained on
its global-pool features (softmax regression, seeded), then the whole network is converted.
The demo dataset is scikit-image's lfw_subset: 100 faces and 100 non-face patches.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

from tl2k210 import paths

sys.path.insert(0, str(paths.models_dir().parent))   # `models.<name>` imports (checkout or wheel)
WEIGHTS = "weights/mobilenetv1_0.25_tensorlayer.npz"     # in the test data (TL2K210_TESTDATA)
SIZE = 224


def demo_faces_dataset(folder: Path) -> Path:
    """lfw_subset (25x25 grayscale) as two class folders of 224x224 RGB images."""
    from PIL import Image
    from skimage import data
    imgs = data.lfw_subset()
    for cls, part in (("face", imgs[:100]), ("not_face", imgs[100:])):
        (folder / cls).mkdir(parents=True, exist_ok=True)
        for i, a in enumerate(part):
            Image.fromarray((a * 255).astype(np.uint8)).convert("RGB").save(folder / cls / f"{i:03d}.png")
    return folder


def load_split(data_dir: Path, holdout: float, seed: int):
    """[(path, label)] train and held-out lists, stratified per class, seeded."""
    classes = sorted(p.name for p in data_dir.iterdir() if p.is_dir())
    if len(classes) < 2:
        raise SystemExit(f"{data_dir}: need at least two class folders")
    rng = np.random.default_rng(seed)
    train, test = [], []
    for k, c in enumerate(classes):
        files = sorted(p for p in (data_dir / c).iterdir() if p.suffix.lower() in (".jpg", ".jpeg", ".png", ".bmp"))
        files = [files[i] for i in rng.permutation(len(files))]
        n_test = max(1, int(round(len(files) * holdout)))
        test += [(f, k) for f in files[:n_test]]
        train += [(f, k) for f in files[n_test:]]
    return classes, train, test


def pixels(items):
    from PIL import Image
    return np.stack([np.asarray(Image.open(f).convert("RGB").resize((SIZE, SIZE), Image.BILINEAR)).transpose(2, 0, 1)
                     for f, _ in items]).astype(np.uint8)


def train_head(feats, labels, n_classes, epochs=300, lr=0.5, l2=1e-3, seed=0):
    """Softmax regression by full-batch gradient descent (deterministic)."""
    rng = np.random.default_rng(seed)
    mu, sd = feats.mean(0), feats.std(0) + 1e-6
    x = (feats - mu) / sd
    w = rng.normal(0, 0.01, (x.shape[1], n_classes))
    b = np.zeros(n_classes)
    y = np.eye(n_classes)[labels]
    for _ in range(epochs):
        z = x @ w + b
        p = np.exp(z - z.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        g = (p - y) / len(x)
        w -= lr * (x.T @ g + l2 * w)
        b -= lr * g.sum(0)
    # fold the feature standardisation into the dense layer: (f - mu)/sd @ w + b
    W = w / sd[:, None]
    return W.astype(np.float32), (b - mu / sd @ w).astype(np.float32)


def run(data_dir: Path, out: Path, holdout=0.3, seed=0, progress=True):
    from models.mobilenet_v1.network import load_keras_order_npz, mobilenet_v1
    from tl2k210 import frontends, paths
    from tl2k210.compiler import ConvertOptions, convert
    from tl2k210.graph import from_onnx
    from tl2k210.k210.emulator import Emulator
    from tl2k210.k210.kmodel import atomic_write
    from tl2k210.k210.flow import run_pipeline
    from tl2k210.frontends.tensorlayer import fast_layer_init
    from tl2k210.quantize.calibrate import FloatRunner

    fast_layer_init()
    classes, train, test = load_split(data_dir, holdout, seed)
    xtr, xte = pixels(train), pixels(test)
    ytr, yte = np.array([k for _, k in train]), np.array([k for _, k in test])
    to_float = lambda p: (p.astype(np.float32) / 127.5 - 1.0)  # noqa: E731  Keras MobileNet preprocessing
    # 1. frozen ImageNet backbone -> global-pool features (float, onnxruntime)
    base = mobilenet_v1(0.25)
    weights = paths.testdata(WEIGHTS)
    if weights is None:
        raise SystemExit(f"the ImageNet backbone needs the test data's {WEIGHTS} (set TL2K210_TESTDATA)")
    load_keras_order_npz(base, weights)
    base.eval()
    g, _ = run_pipeline(from_onnx(frontends.load_model(base)))
    gap = next(n.outputs[0] for n in g.nodes if n.op == "GlobalAveragePool")
    runner = FloatRunner(g)
    feats = np.stack([runner(to_float(p)[None])[gap].reshape(-1) for p in xtr])
    # 2. new head
    W, b = train_head(feats, ytr, len(classes), seed=seed)
    net = mobilenet_v1(0.25, classes=len(classes))
    for dst, src in zip(net.all_weights[:-2], base.all_weights[:-2]):
        dst.assign(src.numpy())
    net.all_weights[-2].assign(W)
    net.all_weights[-1].assign(b)
    net.eval()
    # 3. convert, calibrated on the training images
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as calib:
        from PIL import Image
        for i, p in enumerate(xtr[:100]):
            Image.fromarray(p.transpose(1, 2, 0)).save(Path(calib) / f"{i:03d}.png")
        # a 2-class head's two logits sit close together, so their SQNR says little about the
        # classifier: the held-out accuracy and the agreement with float (step 4) are this flow's
        # measure, reported beside the receipt's SQNR
        receipt = convert(net, out / "classifier.kmodel",
                          ConvertOptions(dataset=calib, input_range=(-1, 1), progress=progress, min_sqnr=0))
    # 4. held-out accuracy: float vs kmodel (emulator). The float network is the backbone's
    # global-pool features (onnxruntime) through the new dense head; softmax keeps the argmax
    fte = np.stack([runner(to_float(p)[None])[gap].reshape(-1) for p in xte])
    pf = (fte @ W + b).argmax(1)
    emu = Emulator.load(out / "classifier.kmodel")
    pk = np.array([emu.run(p)[0].argmax() for p in xte])
    report = {"classes": classes, "train": len(train), "heldout": len(test),
              "float_accuracy": float((pf == yte).mean()), "kmodel_accuracy": float((pk == yte).mean()),
              "agreement": float((pf == pk).mean()), "kmodel_bytes": receipt.file_size,
              "latency_ms": receipt.latency_ms, "output_sqnr_db": receipt.totals["output_sqnr_db"]}
    atomic_write(out / "labels.txt", ("\n".join(classes) + "\n").encode())
    atomic_write(out / "report.json", json.dumps(report, indent=1).encode())
    return report


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("data", nargs="?", help="folder with one sub-folder of images per class")
    ap.add_argument("--demo-faces", action="store_true", help="use scikit-image's lfw_subset (faces / not faces)")
    ap.add_argument("--out", default="out/transfer")
    ap.add_argument("--holdout", type=float, default=0.3)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.demo_faces:
        data = demo_faces_dataset(Path(tempfile.mkdtemp(prefix="tl2k210-faces-")))
    elif args.data:
        data = Path(args.data)
    else:
        ap.error("give DATA_DIR or --demo-faces")
    rep = run(data, Path(args.out), args.holdout, args.seed)
    print(f"classes {rep['classes']}; {rep['train']} train / {rep['heldout']} held-out images")
    print(f"held-out accuracy: float {rep['float_accuracy']:.3f}, kmodel (emulator) {rep['kmodel_accuracy']:.3f}, "
          f"agreement {rep['agreement']:.3f}; kmodel {rep['kmodel_bytes']:,} B, est. {rep['latency_ms']:.1f} ms")
    print(f"wrote {args.out}/classifier.kmodel, labels.txt, report.json")


if __name__ == "__main__":
    main()

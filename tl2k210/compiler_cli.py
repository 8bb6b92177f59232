"""`tl2k210 convert` and `tl2k210 compare` (flags in the spirit of nncase's `ncc`)."""
from __future__ import annotations

import argparse
import json
import os
import sys

from tl2k210 import cliargs
from tl2k210.errors import Tl2k210Error
from tl2k210.k210 import firmware


def _range_arg(text):
    from tl2k210.quantize.dataset import parse_range
    try:
        return parse_range(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


# input_range None: a quantized model's own input scale, else (0, 1) -- ConvertOptions decides
PRE_DEFAULTS = {"input_range": None, "mean": (0.0,), "std": (1.0,)}


def _add_preprocess(p, from_metadata=False):
    """from_metadata (compare): a flag left out comes from the kmodel's MODEL.kmodel.json."""
    g = p.add_argument_group("input preprocessing (how 0..255 camera pixels become model input)"
                             + ("; default: the kmodel's metadata, else" if from_metadata else ""))
    # `--input-range -1,1` / `--mean -0.5,...`: let argparse read a comma list of numbers that starts
    # with a minus sign as a value, not as an unknown option (it only knows plain negative numbers)
    import re
    p._negative_number_matcher = re.compile(r"^-\d*\.?\d+(,-?\d*\.?\d+)*$")
    g.add_argument("--input-range", type=_range_arg,
                   help="pixels 0..255 map linearly onto MIN,MAX (default 0,1; for a quantized TFLite "
                   "model, the range its integer input stands for)")
    g.add_argument("--mean", type=cliargs.floats(example="0.485,0.456,0.406"),
                   help="per-channel mean subtracted after the range (0): 1 value or one per channel")
    g.add_argument("--std", type=cliargs.floats(positive=True, example="0.229,0.224,0.225"),
                   help="per-channel std divided after the mean (1), > 0")
    g.add_argument("--bgr", action="store_true", default=None, help="the model wants BGR channel order")
    if from_metadata:
        g.add_argument("--rgb", dest="bgr", action="store_false", help="RGB order, whatever the metadata says")
    g.add_argument("--input-shape", type=cliargs.shape, help="N,C,H,W for models with symbolic input dims")
    p.add_argument("--weights", help="weights .h5 for a Keras architecture .json (model.to_json())")


def _pre_opts(args, meta=None):
    """Preprocessing from the flags; a flag left out comes from `meta` (ModelMetadata of an image
    model), else the default."""
    m = meta.input if meta is not None else {}

    def pick(flag, key):
        v = getattr(args, flag)
        if v is not None:
            return tuple(v)
        if m.get(key) is not None:
            return tuple(m[key])
        return PRE_DEFAULTS[flag]
    bgr = args.bgr if args.bgr is not None else bool(m.get("bgr", False))
    return dict(input_range=pick("input_range", "range"), mean=pick("mean", "mean"), std=pick("std", "std"),
                channel_order="BGR" if bgr else "RGB", input_shape=args.input_shape)


def add_convert_parser(sub):
    p = sub.add_parser("convert", help="convert a model to a quantized kmodel v3/v4 (with a receipt)",
                       description="Convert a TensorLayer weight file (with --network), Keras "
                       "(.keras/.h5, or .json with --weights), SavedModel directory, frozen TF1 .pb, .tflite or .onnx "
                       "model to a quantized "
                       "kmodel: v3 (every MaixPy build loads it) when every layer has a v3 form, else v4. Prints a per-layer receipt: where each "
                       "layer runs and why, MACs, KPU RAM, cycles and SQNR vs float.")
    p.add_argument("model", help="model file or SavedModel directory")
    p.add_argument("output", help="kmodel to write (written atomically, only on success)")
    p.add_argument("--dataset", required=True, help="calibration data: folder of jpg/png/bmp, or .npy/.npz")
    p.add_argument("--calibrate-method", choices=["minmax", "percentile", "kld", "mse"], default="minmax",
                   help="activation ranges: minmax (default), percentile (99.99), kld (entropy), mse (least "
                   "squared quantization error, like nncase's l2)")
    p.add_argument("--calib-limit", type=cliargs.int_range(1, example=100), default=100,
                   help="calibration samples to use (100)")
    p.add_argument("--weight-bits", type=int, choices=[8, 16], default=8)
    p.add_argument("--float-fc", action="store_true",
                   help="run dense layers as float FULLY_CONNECTED on the CPU (exact, 4x the weight "
                   "bytes) instead of a 1x1 KPU conv on a 4x4-padded map")
    p.add_argument("--kpu-padding", action="store_true",
                   help="rewrite TF-SAME stride-2 convs to symmetric padding so they run fully on the "
                   "KPU (changes the math; the receipt shows the measured effect)")
    p.add_argument("--runtime", choices=list(firmware.RUNTIMES), default="maixpy",
                   help="the firmware the model is for (maixpy): model + main memory must fit what "
                   "it leaves, and a kmodel v4 needs a build that loads v4. " + firmware.summary())
    p.add_argument("--format", choices=["auto", "v3", "v4"], default="auto",
                   help="kmodel version: v3 (loads on every MaixPy build), v4 (nncase v0.2's format: "
                   "CPU convs, bilinear resize, elementwise/reduce/slice ops; needs a V4 firmware) or "
                   "auto: v3 when every layer has a v3 form, else v4 (the receipt names the layer)")
    p.add_argument("--report", help="also write the receipt as JSON")
    p.add_argument("--network", help="python file defining build() -> TensorLayer model, for weight "
                   "files (it is run as Python: use files you trust)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    p.add_argument("-v", "--verbose", action="store_true", help="show TensorFlow's own log output")
    m = p.add_argument_group("metadata (written to OUTPUT.json beside the kmodel; read by run, "
                             "compare, demo, deploy)")
    m.add_argument("--task", choices=["yolo2", "classify", "embed", "image"], help="what the model does")
    m.add_argument("--anchors", help="YOLOv2 anchor pairs w,h,w,h,... (grid cells)")
    m.add_argument("--labels", help="class names: comma-separated, or a file with one per line")
    m.add_argument("--threshold", type=cliargs.probability, help="detection threshold to record (yolo2)")
    m.add_argument("--nms", type=cliargs.probability, help="NMS IoU to record (yolo2)")
    _add_preprocess(p)
    p.set_defaults(func=cmd_convert)


def _load_network(path):
    import importlib.util

    from tl2k210 import quiet
    quiet.tensorflow()          # the network file imports TensorLayer, which imports TensorFlow
    spec = importlib.util.spec_from_file_location("tl2k210_user_network", path)
    if spec is None or spec.loader is None:
        raise Tl2k210Error(f"--network {path}: not a Python file (it must define build())")
    mod = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(mod)
        if not callable(getattr(mod, "build", None)):
            raise Tl2k210Error(f"{path}: define build() returning the TensorLayer model")
        net = mod.build()
        if net is None:
            raise Tl2k210Error(f"--network {path}: build() returned None; return the TensorLayer model")
        return net
    except Tl2k210Error:
        raise
    except Exception as exc:     # the user's code failed: say where, not our traceback
        raise Tl2k210Error(f"--network {path} failed: {type(exc).__name__}: {exc}") from None


def _metadata_args(args):
    """What MODEL.kmodel.json gets from the convert flags."""
    from tl2k210.k210 import yolo
    from tl2k210.k210.cli import _labels
    anchors = yolo.parse_anchors(args.anchors) if args.anchors else None
    decode = {k: getattr(args, k) for k in ("threshold", "nms") if getattr(args, k) is not None}
    return {"task": args.task or ("yolo2" if anchors else None), "anchors": anchors,
            "labels": _labels(args.labels), "decode": decode, "source": str(args.model)}


def cmd_convert(args):
    from tl2k210.compiler import ConvertOptions, convert
    from tl2k210.fileio import atomic_write, check_outputs, check_readable
    check_readable(args.model, "model", folder=None)
    check_readable(args.dataset, "dataset", folder=None)
    if args.network:
        check_readable(args.network, "Python file")
    stream = os.path.exists(args.output) and not os.path.isfile(args.output)    # /dev/stdout
    check_outputs([("output", args.output), ("--report", args.report),
                   ("metadata", None if stream else f"{args.output}.json")],
                  [args.model, args.dataset, args.network])
    meta = _metadata_args(args)
    opts = ConvertOptions(dataset=args.dataset, method=args.calibrate_method, weight_bits=args.weight_bits,
                          kpu_padding=args.kpu_padding, runtime=args.runtime, calib_limit=args.calib_limit,
                          float_fc=args.float_fc, format=args.format, weights=args.weights,
                          progress=not args.quiet, **_pre_opts(args))
    if args.network:
        opts.network = _load_network(args.network)
    opts.metadata = meta
    receipt = convert(args.model, args.output, opts)
    print(receipt.table())
    if args.report:
        atomic_write(args.report, receipt.to_json().encode(), "--report")
        print(f"wrote {args.report}", file=sys.stderr)
    return 0


def add_compare_parser(sub):
    p = sub.add_parser("compare", help="float model (onnxruntime) vs kmodel (emulator) on held-out data",
                       description="Run the float model in onnxruntime and the kmodel on the bit-exact "
                       "emulator over a dataset; report per-output SQNR and cosine, top-1/top-5 "
                       "agreement for classifiers, detection agreement for YOLOv2 region outputs. "
                       "Works on kmodels made by nncase too.")
    p.add_argument("float_model")
    p.add_argument("kmodel")
    p.add_argument("--dataset", required=True, help="folder of images, or .npy/.npz")
    p.add_argument("--labels", help="class names, one per line (prints the top classes)")
    p.add_argument("--limit", type=cliargs.int_range(1, example=200), default=200,
                   help="samples to compare (200)")
    p.add_argument("--decode", choices=["yolo2", "none"],
                   help="also compare decoded detections (default: the metadata's task)")
    p.add_argument("--anchors", help="anchor pairs for --decode yolo2 (default: the metadata's)")
    p.add_argument("--threshold", type=cliargs.probability, help="yolo2 threshold (metadata, else 0.5)")
    p.add_argument("--nms", type=cliargs.probability, help="yolo2 NMS IoU (metadata, else 0.3)")
    p.add_argument("--json", help="write the report as JSON")
    p.add_argument("-v", "--verbose", action="store_true", help="show TensorFlow's own log output")
    _add_preprocess(p, from_metadata=True)
    p.set_defaults(func=cmd_compare)


def compare(float_model, kmodel_path, dataset, limit=200, decode=None, anchors=None, threshold=0.5,
            nms=0.3, **pre):
    """{"outputs": {name: {sqnr_db, cosine, top1, top5}}, "detections": {...}, "samples": n}."""
    from tl2k210 import frontends
    from tl2k210.compiler import ConvertOptions
    from tl2k210.graph import from_onnx
    from tl2k210.k210.flow import run_pipeline

    opts = ConvertOptions(**pre)
    model = frontends.load_model(float_model, **({"weights": opts.weights} if opts.weights else {}))
    shapes = {model.graph.input[0].name: tuple(opts.input_shape)} if opts.input_shape else None
    graph, _ = run_pipeline(from_onnx(model, input_shapes=shapes))  # exact passes: NCHW in and out
    return compare_graph(graph, kmodel_path, dataset, limit, decode, anchors, threshold, nms, opts, float_model)


def _match_outputs(graph, ref, outs):
    """Pair each float output with the kmodel output of the same size (in order), and read a 4-D map
    the way the kmodel lays it out: channel-major (what tl2k210 writes) or channels-last (nncase
    v0.2 keeps a TFLite model's NHWC outputs) -- whichever agrees better. Returns
    {name: (ref flat, test flat, layout)}."""
    import numpy as np

    from tl2k210.quantize.metrics import cosine
    free = list(range(len(outs)))
    pairs = {}
    for o in graph.outputs:
        r = np.asarray(ref[o], np.float64)
        k = next((i for i in free if np.asarray(outs[i]).size == r.size), None)
        if k is None:
            continue
        free.remove(k)
        t = np.asarray(outs[k], np.float64).reshape(-1)
        flat, layout = r.reshape(-1), "NCHW"
        if r.ndim == 4 and r.shape[1] > 1 and r.shape[2] * r.shape[3] > 1:
            nhwc = r.transpose(0, 2, 3, 1).reshape(-1)
            if cosine(nhwc, t) > cosine(flat, t):
                flat, layout = nhwc, "NHWC"
        pairs[o] = (flat, t, layout)
    return pairs


def compare_graph(graph, kmodel_path, dataset, limit=200, decode=None, anchors=None, threshold=0.5, nms=0.3,
                  opts=None, float_model="the float model"):
    """compare() on an IR graph already through the passes (no second front-end run)."""
    import numpy as np

    from tl2k210.compiler import ConvertOptions, input_affine, model_input_range, model_inputs
    from tl2k210.k210 import yolo
    from tl2k210.k210.emulator import Emulator
    from tl2k210.passes.input_nchw import input_layout
    from tl2k210.quantize.calibrate import FloatRunner
    from tl2k210.quantize.compare import detection_agreement, output_agreement

    opts = opts or ConvertOptions()
    emu = Emulator.load(kmodel_path)
    emu_shape, emu_dtype = emu.input_spec()
    opts, _ = model_input_range(graph, opts)
    floats, pixels = model_inputs(graph, dataset, limit, opts)
    mismatch = (f"{kmodel_path} is not a conversion of {float_model}: pass the kmodel converted "
                "from it (and the same --input-shape)")
    if int(np.prod(floats.shape[1:])) != int(np.prod(emu_shape)):
        raise Tl2k210Error(f"{mismatch}; the model takes {tuple(floats.shape[1:])}, the kmodel "
                           f"{tuple(emu_shape)}")
    chw = floats if input_layout(graph) != "NHWC" else floats.transpose(0, 3, 1, 2)
    if chw.ndim == 4:   # a float-input kmodel (nncase) takes the model's input, before in-graph preprocessing
        a, b = input_affine(graph, chw.shape[1])
        chw = (chw - b[None, :, None, None]) / a[None, :, None, None]
    runner = FloatRunner(graph, expose_all=False)
    refs, tests, layouts = {}, {}, {}
    for i in range(len(floats)):
        ref = runner(floats[i][None])
        # uint8 pixels for a kmodel that takes the camera image, the preprocessed floats (CHW)
        # for one with a float input (nncase v0.2 without --input-type uint8)
        feed = pixels[i] if pixels is not None and emu_dtype == np.uint8 else chw[i]
        outs = emu.run(np.asarray(feed).astype(emu_dtype).reshape(emu_shape))
        for o, (r, t, layout) in _match_outputs(graph, ref, outs).items():
            refs.setdefault(o, []).append(r)
            tests.setdefault(o, []).append(t)
            layouts[o] = layout
    if not refs:
        raise Tl2k210Error(f"{mismatch}; no kmodel output has the size of a float output "
                           f"{[tuple(graph.shape(o)) for o in graph.outputs]}")
    ref = {k: np.stack(v) for k, v in refs.items()}
    test = {k: np.stack(v) for k, v in tests.items()}
    report = {"samples": len(floats), "outputs": output_agreement(ref, test)}
    for k, layout in layouts.items():
        report["outputs"][k]["kmodel_layout"] = layout
        if sum(d > 1 for d in graph.shape(k) or ()) > 1:   # top-k agreement for class vectors, not maps
            report["outputs"][k].pop("top1", None)
            report["outputs"][k].pop("top5", None)
    if decode == "yolo2":
        a = yolo.parse_anchors(anchors)
        k = next(iter(test))
        gw, gh, _ = yolo.region_layout(emu.model, test[k].shape[1], len(a) // 2)
        rb = [yolo.decode(r, a, gw, gh, 1, 1, threshold, nms) for r in ref[k]]
        tb = [yolo.decode(t, a, gw, gh, 1, 1, threshold, nms) for t in test[k]]
        report["detections"] = detection_agreement(rb, tb)
    return report


def cmd_compare(args):
    from tl2k210 import metadata
    from tl2k210.fileio import check_outputs, check_readable
    from tl2k210.k210 import yolo
    from tl2k210.k210.cli import _labels, apply_metadata, labels_file
    check_readable(args.float_model, "model", folder=None)
    check_readable(args.kmodel, "kmodel")
    check_readable(args.dataset, "dataset", folder=None)
    _labels(args.labels)
    check_outputs([("--json", args.json)], [args.float_model, args.kmodel, args.dataset,
                                             labels_file(args.labels)])
    meta = metadata.load_for(args.kmodel)
    if meta is not None:
        print(f"using {metadata.path_for(args.kmodel).name} for what the flags leave out", file=sys.stderr)
    apply_metadata(args, meta)
    if args.decode == "yolo2":
        yolo.parse_anchors(args.anchors)
    report = compare(args.float_model, args.kmodel, args.dataset, args.limit,
                     args.decode if args.decode != "none" else None, args.anchors,
                     args.threshold, args.nms, weights=args.weights, **_pre_opts(args, meta))
    print(f"{report['samples']} samples: float ({args.float_model}) vs kmodel ({args.kmodel}, emulated)")
    print(f"{'output':32} {'SQNR dB':>8} {'cosine':>8} {'top-1':>7} {'top-5':>7}")
    for name, r in report["outputs"].items():
        t1 = f"{r['top1']:.3f}" if "top1" in r else "-"
        t5 = f"{r['top5']:.3f}" if "top5" in r else "-"
        print(f"{name[:32]:32} {r['sqnr_db']:8.2f} {r['cosine']:8.4f} {t1:>7} {t5:>7}")
    if "detections" in report:
        d = report["detections"]
        print(f"detections: float {d['ref']}, kmodel {d['test']}, matched {d['matched']} "
              f"(recall {d['recall']:.3f}, precision {d['precision']:.3f})")
    if args.json:
        from tl2k210.fileio import atomic_write
        atomic_write(args.json, json.dumps(report, indent=1, default=float).encode(), "--json")
    return 0

"""`tl2k210 convert` (flags in the spirit of nncase's `ncc`)."""
from __future__ import annotations

import os
import sys

from tl2k210 import cliargs
from tl2k210.errors import QualityError, Tl2k210Error
from tl2k210.k210 import firmware


def add_convert_parser(sub):
    p = sub.add_parser("convert", help="convert a model to a quantized kmodel v3/v4 (with a receipt)",
                       description="Convert a TensorLayer Model.save .h5 or weight file (with --network), Keras "
                       "(.keras/.h5, or .json with --weights), SavedModel directory, frozen TF1 .pb, .tflite or .onnx "
                       "model to a quantized "
                       "kmodel: v3 (every MaixPy build loads it) when every layer has a v3 form, else v4. Prints a per-layer receipt: where each "
                       "layer runs and why, MACs, KPU RAM, cycles and SQNR vs float.")
    p.add_argument("model", help="model file or SavedModel directory")
    p.add_argument("output", help="kmodel to write (written atomically, only on success)")
    p.add_argument("--dataset", help="calibration data: folder of jpg/png/bmp (or of class subfolders), or "
                   ".npy/.npz (optional for a quantized model: its own int8 scales give the ranges)")
    p.add_argument("--calibrate-method", choices=["minmax", "percentile", "kld", "mse"], default="minmax",
                   help="activation ranges: minmax (default), percentile (99.99), kld (entropy), mse (least "
                   "squared quantization error, like nncase's l2)")
    p.add_argument("--calib-limit", type=cliargs.int_range(1, example=100), default=100,
                   help="calibration samples to use (100)")
    p.add_argument("--sqnr-samples", type=cliargs.int_range(1, example=8), default=8, metavar="N",
                   help="calibration samples the receipt's SQNR and --min-sqnr's gate are measured on, "
                   "the first N (8; each runs on the emulator layer by layer: more is slower)")
    p.add_argument("--weight-bits", type=int, choices=[8, 16], default=8)
    p.add_argument("--float-fc", action="store_true",
                   help="run dense layers as float FULLY_CONNECTED on the CPU (exact, 4x the weight "
                   "bytes) instead of a 1x1 KPU conv on a 4x4-padded map")
    p.add_argument("--int8-rounding", choices=["single", "reference"], default="single",
                   help="a fully quantized model's layers round once (single: the desktop TFLite "
                   "interpreter's default XNNPACK kernels, ONNX Runtime) or as TFLite's reference kernels "
                   "do (reference: TFLite Micro's two roundings). They differ by one LSB near rounding ties")
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
    p.add_argument("--min-sqnr", type=cliargs.float_range(0, example=15), default=15.0, metavar="DB",
                   help="refuse (exit 2, nothing written) a kmodel whose outputs are NaN/Inf on the "
                   "calibration data or below DB dB SQNR vs the float model (15); 0 accepts anything")
    p.add_argument("--optimize", choices=["latency", "size"], default="latency",
                   help="latency (default): per layer the fastest exact form such that the whole model "
                   "fits --runtime, and a smaller form where that costs at most 10%% of the model's "
                   "estimated time (the receipt says what it traded); size: the smallest forms")
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
    cliargs.add_preprocess(p)
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
    anchors = yolo.parse_anchors(args.anchors) if args.anchors else None
    decode = {k: getattr(args, k) for k in ("threshold", "nms") if getattr(args, k) is not None}
    return {"task": args.task or ("yolo2" if anchors else None), "anchors": anchors,
            "labels": cliargs.parse_labels(args.labels), "decode": decode, "source": str(args.model)}


def cmd_convert(args):
    from tl2k210.compiler import ConvertOptions, convert
    from tl2k210.fileio import atomic_write, check_outputs, check_readable
    check_readable(args.model, "model", folder=None)
    if args.dataset is not None:
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
                          sqnr_samples=args.sqnr_samples,
                          float_fc=args.float_fc, int8_rounding=args.int8_rounding, format=args.format,
                          weights=args.weights,
                          optimize=args.optimize, progress=not args.quiet, min_sqnr=args.min_sqnr,
                          **cliargs.pre_opts(args))
    if args.network:
        opts.network = _load_network(args.network)
    opts.metadata = meta
    try:
        receipt = convert(args.model, args.output, opts)
    except QualityError as exc:       # the receipt says where the SQNR went; then the error
        if exc.receipt is not None:   # (none where the calibration data was refused)
            print(exc.receipt.table(), file=sys.stderr)
        raise
    print(receipt.table())
    if args.report:
        atomic_write(args.report, receipt.to_json().encode(), "--report")
        print(f"wrote {args.report}", file=sys.stderr)
    return 0

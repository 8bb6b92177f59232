"""`tl2k210 compare`: the float model (onnxruntime) against a kmodel (the emulator)."""
from __future__ import annotations

import json
import sys

from tl2k210 import cliargs


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
    cliargs.add_preprocess(p, from_metadata=True)
    p.set_defaults(func=cmd_compare)


def cmd_compare(args):
    from tl2k210 import metadata
    from tl2k210.fileio import check_outputs, check_readable
    from tl2k210.k210 import yolo
    from tl2k210.compare import compare
    check_readable(args.float_model, "model", folder=None)
    check_readable(args.kmodel, "kmodel")
    check_readable(args.dataset, "dataset", folder=None)
    cliargs.parse_labels(args.labels)
    check_outputs([("--json", args.json)], [args.float_model, args.kmodel, args.dataset,
                                             cliargs.labels_file(args.labels)])
    meta = metadata.load_for(args.kmodel)
    if meta is not None:
        print(f"using {metadata.path_for(args.kmodel).name} for what the flags leave out", file=sys.stderr)
    cliargs.apply_metadata(args, meta)
    if args.decode == "yolo2":
        yolo.parse_anchors(args.anchors)
    report = compare(args.float_model, args.kmodel, args.dataset, args.limit,
                     args.decode if args.decode != "none" else None, args.anchors,
                     args.threshold, args.nms, weights=args.weights, **cliargs.pre_opts(args, meta))
    print(f"{report['samples']} samples: float ({args.float_model}) vs kmodel ({args.kmodel}, emulated)")
    if report.get("quantized_source"):
        print("(a quantized model: the reference is the float graph its integers stand for, at its own scales "
              "and zero points, not its runtime's integer kernels, which round otherwise)")
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

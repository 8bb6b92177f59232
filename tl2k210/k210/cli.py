"""`tl2k210 inspect` and `tl2k210 run` (never imports TensorFlow)."""
from __future__ import annotations

import json
import os
import sys

from tl2k210.errors import Tl2k210Error


def add_inspect_parser(sub):
    p = sub.add_parser("inspect", help="describe a kmodel: layers, KPU/CPU, MACs, memory",
                       description="Describe a kmodel (v3 or v4): version, flags, each layer "
                       "(type, shapes, KPU or CPU, MACs, weight bytes, KPU RAM lines, "
                       "main-memory ranges), peak KPU RAM, main memory and outputs.")
    p.add_argument("file", help="kmodel file")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=cmd_inspect)


def cmd_inspect(args):
    from tl2k210.k210 import kmodel
    from tl2k210.k210.inspect import describe, render
    model = kmodel.load(args.file)
    info = describe(model, args.file, os.path.getsize(args.file))
    print(json.dumps(info, indent=1, default=int) if args.json else render(info))
    return 0


def add_run_parser(sub):
    p = sub.add_parser("run", help="run a kmodel on the bit-exact emulator",
                       description="Run a kmodel on an image or a .npy array with the bit-exact "
                       "K210 emulator. Images are resized to the model input and fed as RGB888 "
                       "planar uint8, like MaixPy's img.pix_to_ai().")
    p.add_argument("file", help="kmodel file")
    p.add_argument("-i", "--input", required=True, help="image (jpg/png/bmp...) or .npy array")
    p.add_argument("-o", "--out", help="write result: .png (annotated image, with --decode), "
                   ".npy (first output; .npz for all), or .json")
    p.add_argument("--rgb565", action="store_true",
                   help="reproduce the camera path: RGB888 -> RGB565 -> RGB888 before the KPU")
    p.add_argument("--decode", choices=["yolo2"], help="decode region outputs like kpu.run_yolo2")
    p.add_argument("--anchors", help="comma-separated anchor pairs (w,h,w,h,...) for --decode yolo2")
    p.add_argument("--threshold", type=float, default=0.5, help="yolo2 probability threshold (0.5)")
    p.add_argument("--nms", type=float, default=0.3, help="yolo2 NMS IoU threshold (0.3)")
    p.add_argument("--labels", help="comma-separated class names or a file with one per line")
    p.add_argument("--sum-rule", choices=["silicon", "simulator"], default="silicon",
                   help="Σx/Σw term rule: per input channel as silicon does (default) or the "
                   "vendor simulator's")
    p.add_argument("--act-rule", choices=["nncase02", "nncase01"], default="nncase02",
                   help="activation boundary/rounding rule (default nncase v0.2 simulator)")
    p.set_defaults(func=cmd_run)


def _labels(spec):
    if not spec:
        return None
    if os.path.exists(spec):
        with open(spec) as fh:
            return [ln.strip() for ln in fh if ln.strip()]
    return [s.strip() for s in spec.split(",")]


def cmd_run(args):
    import numpy as np

    from tl2k210 import imaging
    from tl2k210.k210 import yolo
    from tl2k210.k210.emulator import Emulator

    emu = Emulator.load(args.file, sum_rule=args.sum_rule, act_rule=args.act_rule)
    shape, dtype = emu.input_spec()
    chw_shape = tuple(shape[-3:]) if len(shape) >= 3 else tuple(shape)
    image = None
    if args.input.lower().endswith(".npy"):
        x = np.load(args.input)
    else:
        if len(chw_shape) != 3:
            raise Tl2k210Error(f"this model takes a {dtype.__name__} vector of shape {shape}, not an "
                               "image: pass a .npy file")
        image = imaging.load_rgb(args.input)
        x = imaging.to_model_input(image, chw_shape, rgb565=args.rgb565)
    outputs = emu.run(x)
    for i, o in enumerate(outputs):
        flat = np.asarray(o, np.float64).reshape(-1)
        head = ", ".join(f"{v:.6g}" for v in flat[:8]) + (" ..." if flat.size > 8 else "")
        print(f"output {i}: {o.dtype} {tuple(o.shape)}  min {flat.min():.6g}  max {flat.max():.6g}  "
              f"[{head}]")
    result = {"outputs": [np.asarray(o).tolist() for o in outputs]}
    boxes = None
    if args.decode == "yolo2":
        if not args.anchors:
            raise Tl2k210Error("--decode yolo2 needs --anchors w,h,w,h,... (e.g. the anchors the "
                               "model was trained with)")
        anchors = [float(v) for v in args.anchors.split(",")]
        if len(anchors) % 2:
            raise Tl2k210Error(f"--anchors has {len(anchors)} numbers; give (w,h) pairs")
        out = np.asarray(outputs[0], np.float32)
        gw, gh = _grid(emu, out.size, len(anchors) // 2)
        _, h, w = chw_shape
        boxes = yolo.decode(out, anchors, gw, gh, w, h, args.threshold, args.nms)
        labels = _labels(args.labels)
        print(f"{len(boxes)} box(es) (threshold {args.threshold}, NMS {args.nms}):")
        for b in boxes:
            name = labels[b.classid] if labels and b.classid < len(labels) else b.classid
            print(f"  {name}  {b.value:.3f}  x={b.x:.0f} y={b.y:.0f} w={b.w:.0f} h={b.h:.0f}")
        result["boxes"] = [dict(x=b.x, y=b.y, w=b.w, h=b.h, value=b.value, classid=b.classid)
                           for b in boxes]
    if args.out:
        _write_result(args, outputs, result, image, boxes, chw_shape)
    return 0


def _grid(emu, size, n_anchors):
    from tl2k210.k210.yolo import region_grid
    try:
        return region_grid(emu.model, size)
    except ValueError as exc:
        raise Tl2k210Error(f"{exc} ({n_anchors} anchors)") from None


def _write_result(args, outputs, result, image, boxes, chw_shape):
    import numpy as np

    from tl2k210 import imaging
    from tl2k210.k210.kmodel import atomic_write
    ext = os.path.splitext(args.out)[1].lower()
    if ext == ".png":
        if image is None:
            raise Tl2k210Error("--out .png needs an image input")
        _, h, w = chw_shape
        shown = image.resize((w, h))
        if boxes is not None:
            shown = imaging.draw_boxes(shown, boxes, _labels(args.labels))
        import io
        buf = io.BytesIO()
        shown.save(buf, format="PNG")
        atomic_write(args.out, buf.getvalue())
    elif ext == ".npy":
        import io
        buf = io.BytesIO()
        np.save(buf, outputs[0])
        atomic_write(args.out, buf.getvalue())
    elif ext == ".npz":
        import io
        buf = io.BytesIO()
        np.savez(buf, *outputs)
        atomic_write(args.out, buf.getvalue())
    elif ext == ".json":
        atomic_write(args.out, json.dumps(result, indent=1).encode())
    else:
        raise Tl2k210Error(f"--out {args.out}: use .png, .npy, .npz or .json")
    print(f"wrote {args.out}", file=sys.stderr)

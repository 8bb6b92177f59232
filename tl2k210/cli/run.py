"""`tl2k210 run`: a kmodel on the bit-exact emulator (never imports TensorFlow)."""
from __future__ import annotations

import json
import math
import os
import sys

from tl2k210.cliargs import apply_metadata, labels_file, parse_labels, probability
from tl2k210.errors import InputFileError, Tl2k210Error
from tl2k210.tables import printable

OUT_FORMATS = (".png", ".npy", ".npz", ".json")


def add_run_parser(sub):
    p = sub.add_parser("run", help="run a kmodel on the bit-exact emulator",
                       description="Run a kmodel on an image or a .npy array with the bit-exact "
                       "K210 emulator. Images are resized to the model input and fed as RGB888 "
                       "planar uint8, like MaixPy's img.pix_to_ai(). An array is one input of the "
                       "model's shape (channels-last H,W,C taken too) or a batch of N of them "
                       "(N, ...): every item runs alone and the outputs are stacked.")
    p.add_argument("file", help="kmodel file")
    p.add_argument("image", nargs="?", metavar="INPUT", help="the input, as -i gives it")
    p.add_argument("-i", "--input", help="image (jpg/png/bmp...), or .npy array: "
                   "one input or a batch (N, ...) of inputs")
    p.add_argument("-o", "--out", help="write result: .png (annotated image, with --decode), "
                   ".npy (first output; (N, ...) for a batch), .npz (all outputs), or .json (per "
                   "item for a batch)")
    p.add_argument("--rgb565", action="store_true",
                   help="reproduce the camera path: RGB888 -> RGB565 -> RGB888 before the KPU")
    p.add_argument("--decode", choices=["yolo2", "none"],
                   help="decode region outputs like kpu.run_yolo2 (default: the metadata's task)")
    p.add_argument("--anchors", help="comma-separated anchor pairs (w,h,w,h,...) for --decode yolo2 "
                   "(default: the metadata's)")
    p.add_argument("--threshold", type=probability,
                   help="yolo2 probability threshold, 0..1 (the metadata's, else 0.5)")
    p.add_argument("--nms", type=probability, help="yolo2 NMS IoU threshold, 0..1 (the metadata's, else 0.3)")
    p.add_argument("--labels", help="comma-separated class names or a file with one per line "
                   "(default: the metadata's)")
    p.add_argument("--sum-rule", choices=["silicon", "simulator"], default="silicon",
                   help="Σx/Σw term rule: per input channel as silicon does (default) or the "
                   "vendor simulator's")
    p.add_argument("--act-rule", choices=["nncase02", "nncase01"], default="nncase02",
                   help="activation boundary/rounding rule (default nncase v0.2 simulator)")
    p.add_argument("--progress", action="store_true", default=None,
                   help="show the progress bar of a batch even when stderr is not a terminal")
    p.set_defaults(func=cmd_run)


def input_forms(shape) -> dict:
    """{array shape: "chw" | "hwc"}: the shapes taken as ONE input of a model whose input is
    `shape`: that shape, without the leading N=1 of an NCHW shape, channels-last (H, W, C), and
    (n,) for a vector model. A batch is any of them behind a leading N."""
    full = tuple(int(d) for d in shape)
    forms = {full: "chw"}
    if len(full) >= 4 and full[0] == 1:
        forms.setdefault(full[1:], "chw")
    big = [d for d in full if d != 1]
    if len(full) >= 3 and len(big) >= 2:
        c, h, w = full[-3:]
        forms.setdefault((h, w, c), "hwc")
    if len(big) <= 1:
        forms.setdefault((math.prod(full),), "chw")
    return forms


def _dtype_name(dtype) -> str:
    import numpy as np
    return np.dtype(dtype).name


def _fmt(shape) -> str:
    return "(" + ", ".join(map(str, shape)) + ("," if len(shape) == 1 else "") + ")"


def _input_plan(where, got, shape, dtype):
    """(layout, N) for an array of shape `got`: N is None for one input, else the batch size.
    A form of input_forms, or one without its axes of 1 (a keyword spotter's (47, 13) MFCCs for
    its (13, 47, 1) map: the source's (47, 1, 13) order, hunt 21; they were read channel-major,
    a wrong answer without a word), is one input; behind a leading N, a batch. Anything else is
    refused, naming both accepted forms."""
    forms = input_forms(shape)
    want = math.prod(shape)
    got = tuple(int(d) for d in got)

    def form(g):
        if g in forms:
            return forms[g]
        big = tuple(d for d in g if d != 1)
        return next((f for k, f in forms.items() if tuple(d for d in k if d != 1) == big), None)
    if (one := form(got)) is not None:
        return one, None
    if len(got) >= 2 and (each := form(got[1:])) is not None:
        if got[0] == 0:
            raise InputFileError(f"{where} holds an empty batch (shape {_fmt(got)}); give at least "
                                 "one input")
        return each, (None if got[0] == 1 else got[0])
    squeezed = [d for d in shape if d != 1]
    if len(squeezed) <= 1 and len(got) >= 2 and got[0] > 0 and [d for d in got[1:] if d != 1] == squeezed:
        return "chw", got[0]           # a vector model's samples in any shape of their values: (N, 216, 1)
    batch = " or ".join(_fmt(("N",) + f) for f in forms)
    raise InputFileError(f"{where} declares shape {_fmt(got)} ({math.prod(got)} values); the model "
                         f"takes {_fmt(shape)} {_dtype_name(dtype)} ({want} values): give one input "
                         f"of that shape, or a batch of N inputs shaped {batch}; reshape the array, "
                         "or pass an image")


def _array_input(path, shape, dtype, pre=None):
    """A .npy/.npz model input, checked before running: numbers, finite, one input of the
    model's shape or a batch of them (memory bounded by the file's size), and for uint8 (pixel)
    models whole values 0..255, or float values of the model's own input, which `pre` (the
    kmodel's metadata input: range, mean, std) maps to its pixels as `convert --dataset` does.
    Returns (x, n): x in the model's layout, (n, *shape) for a batch of n, n None for one input."""
    import numpy as np

    from tl2k210.arrays import load_npy, load_npz
    plan = []
    if path.lower().endswith(".npz"):
        arrays = load_npz(path)
        if len(arrays) != 1:
            raise InputFileError(f"{path} holds {len(arrays)} arrays "
                                 f"({', '.join(n for n, _ in arrays[:5])}); save the input as one .npy")
        x = arrays[0][1]
        plan.append(_input_plan(path, x.shape, shape, dtype))
    else:
        x = load_npy(path, accept=lambda got: plan.append(_input_plan(path, got, shape, dtype)))
    layout, n = plan[0]
    item = tuple(int(d) for d in shape)
    if layout == "hwc":                 # channels-last -> the model's CHW
        c, h, w = item[-3:]
        x = np.moveaxis(x.reshape(-1, h, w, c), -1, -3)
    x = np.ascontiguousarray(x).reshape(item if n is None else (n,) + item)
    if np.dtype(dtype).kind == "f":
        with np.errstate(over="ignore"):
            cast = x.astype(dtype)
        if not np.isfinite(cast).all():
            raise InputFileError(f"{path} holds values beyond the {np.dtype(dtype).name} range the "
                                 f"model takes (up to {np.finfo(dtype).max:.3g}): they would become "
                                 "Inf; scale the input")
    if dtype == np.uint8 and x.dtype != np.uint8:
        lo, hi = (x.min(), x.max()) if x.size else (0, 0)
        pixels = lo >= 0 and hi <= 255 and (x.dtype.kind != "f" or np.array_equal(x, np.round(x)))
        if not pixels and x.dtype.kind == "f" and pre and pre.get("range"):
            x = _to_pixels(path, x, item, pre)
        elif not pixels:
            raise InputFileError(f"{path} holds {x.dtype} values {lo:.6g}..{hi:.6g}; the model takes "
                                 "uint8 pixels 0..255 (planar RGB, CHW): scale and round them "
                                 "(e.g. x*255 for 0..1 data) or pass the image file")
    return x, n


def _to_pixels(path, x, item, pre):
    """Float model input `x` as the uint8 pixels the kmodel reads: the inverse of the
    preprocessing its metadata records (compiler.pixel_mapping, as `convert --dataset` maps float
    arrays), rounded. Values more than half a pixel outside 0..255 are clipped with a warning, as
    `convert --dataset` and the board clip them, where at most CLIPPED_REFUSED of them are; more
    are refused naming the range (the model was converted for other data)."""
    import numpy as np

    from tl2k210.compiler import CLIPPED_REFUSED, ConvertOptions, pixel_mapping
    (a, b), c = pre["range"], item[-3] if len(item) >= 3 else 1
    opts = ConvertOptions(input_range=(a, b), channel_order="BGR" if pre.get("bgr") else "RGB",
                          **{k: tuple(pre[k]) for k in ("mean", "std") if pre.get(k)})
    scale, offset = (v.reshape((c, 1, 1) if len(item) >= 3 else (1,)) for v in pixel_mapping(opts, c))
    raw = (x.astype(np.float64) - offset) / scale
    outside = float(np.mean((raw < -0.5) | (raw > 255.5))) if raw.size else 0.0
    what = (f"{path} holds {x.dtype} values {x.min():.6g}..{x.max():.6g}, {outside:.1%} of them outside the "
            f"model's input range {a:g}..{b:g} (its metadata: what pixels 0..255 become)") if outside else ""
    if outside > CLIPPED_REFUSED:
        raise InputFileError(f"{what}; pass values in that range, uint8 pixels, or reconvert with --input-range "
                             "covering the data")
    if outside:
        print(f"warning: {what}: they are clipped to it, as convert --dataset and the board clip them",
              file=sys.stderr)
    print(f"input: {x.dtype} values mapped to uint8 pixels by the model's input range {a:g}..{b:g}")
    return np.rint(np.clip(raw, 0, 255)).astype(np.uint8)


def cmd_run(args):
    import numpy as np

    from tl2k210 import imaging, metadata
    from tl2k210.fileio import check_outputs, check_readable
    from tl2k210.k210 import yolo
    from tl2k210.k210.emulator import Emulator

    # everything that can be checked before loading or running the model
    if (args.input is None) == (args.image is None):
        raise Tl2k210Error("give the input once: tl2k210 run MODEL.kmodel INPUT (or -i INPUT)")
    args.input = args.input or args.image
    check_readable(args.input, "input")
    meta = metadata.load_for(args.file)
    apply_metadata(args, meta)
    is_array = args.input.lower().endswith((".npy", ".npz"))
    if args.out:
        ext = os.path.splitext(args.out)[1].lower()
        if ext not in OUT_FORMATS and not _is_stream(args.out):
            raise Tl2k210Error(f"--out {args.out}: use .png, .npy, .npz or .json")
        if ext == ".png" and is_array:
            raise Tl2k210Error("--out .png needs an image input (-i photo.jpg), not an array")
    if args.rgb565 and is_array:
        raise Tl2k210Error("--rgb565 applies to image inputs; a .npy input is fed as it is")
    anchors = yolo.parse_anchors(args.anchors) if args.decode == "yolo2" else None
    labels = parse_labels(args.labels)
    check_outputs([("--out", args.out)], [args.file, args.input, labels_file(args.labels)])

    emu = Emulator.load(args.file, sum_rule=args.sum_rule, act_rule=args.act_rule)
    shape, dtype = emu.input_spec()
    from tl2k210.k210 import hardware as hw
    nbytes = int(np.prod(shape, dtype=np.float64)) * np.dtype(dtype).itemsize
    if nbytes > hw.MAIN_SRAM_BYTES + hw.KPU_RAM_BYTES:
        raise Tl2k210Error(f"{args.file} claims an input of shape {tuple(shape)} ({nbytes:,} bytes), "
                           "more than a K210's 8 MiB of memory: the kmodel is corrupt; rebuild it "
                           "(tl2k210 convert) or use an intact copy")
    chw_shape = tuple(shape[-3:]) if len(shape) >= 3 else tuple(shape)
    grid = None
    if anchors is not None:
        grid = yolo.region_layout(emu.model, emu.model.output_size(), len(anchors) // 2, labels)
    image, n = None, None
    if is_array:
        x, n = _array_input(args.input, shape, dtype, meta.input if meta is not None else None)
    else:
        if len(chw_shape) != 3:
            raise Tl2k210Error(f"this model takes a {dtype.__name__} vector of shape {shape}, not an "
                               "image: pass a .npy file")
        image = imaging.load_rgb(args.input)
        x = imaging.to_model_input(image, chw_shape, rgb565=args.rgb565)
        if meta is not None and meta.planes == "bgr" and chw_shape[0] == 3:
            x = np.ascontiguousarray(x[::-1])        # an older --bgr kmodel: it takes B, G, R planes
    if n is not None:
        from tl2k210.arrays import MAX_ARRAY_BYTES
        per = max(1, emu.model.output_bytes())
        if n * per > MAX_ARRAY_BYTES:
            raise InputFileError(f"{args.input}: a batch of {n:,} inputs gives {n * per:,} bytes of "
                                 f"outputs, more than the {MAX_ARRAY_BYTES >> 20} MiB tl2k210 holds at "
                                 f"once; pass at most {MAX_ARRAY_BYTES // per:,} inputs per file")
        print(f"batch: {n} items of {_fmt(shape)} from {args.input}")
    outputs = _shaped(_run_items(emu, x, n, args), meta, n)
    names = [o["name"] for o in meta.outputs] if meta is not None and len(meta.outputs) == len(outputs) else []
    for i, o in enumerate(outputs):
        flat = np.asarray(o, np.float64).reshape(-1)
        head = ", ".join(f"{v:.6g}" for v in flat[:8]) + (" ..." if flat.size > 8 else "")
        lo, hi = (f"{flat.min():.6g}", f"{flat.max():.6g}") if flat.size else ("-", "-")
        name = f" ({printable(names[i])})" if names else ""
        print(f"output {i}{name}: {o.dtype} {tuple(o.shape)}  min {lo}  max {hi}  [{head}]")
    per_item = [outputs] if n is None else [[o[k] for o in outputs] for k in range(n)]
    to_json = bool(args.out) and os.path.splitext(args.out)[1].lower() not in (".png", ".npy", ".npz")
    items = [{"outputs": [np.asarray(o).tolist() for o in r]} if to_json else {} for r in per_item]
    boxes = None
    if anchors is not None:
        gw, gh, classes = grid
        na = len(anchors) // 2
        print(f"decoding {na} anchors x (5 + {classes} classes) on a {gw}x{gh} grid"
              + ("" if labels else " (pass --labels to check the class count)"))
        _, h, w = chw_shape
        for k, (r, item) in enumerate(zip(per_item, items)):
            boxes = yolo.decode(np.asarray(r[0], np.float32), anchors, gw, gh, w, h,
                                args.threshold, args.nms)
            print(f"{'' if n is None else f'item {k}: '}{len(boxes)} box(es) (threshold "
                  f"{args.threshold}, NMS {args.nms}):")
            for b in boxes:
                name = printable(labels[b.classid]) if labels and b.classid < len(labels) else b.classid
                print(f"  {name}  {b.value:.3f}  x={b.x:.0f} y={b.y:.0f} w={b.w:.0f} h={b.h:.0f}")
            item["boxes"] = [dict(x=b.x, y=b.y, w=b.w, h=b.h, value=b.value, classid=b.classid)
                             for b in boxes]
    result = items[0] if n is None else {"batch": n, "items": items}
    if args.out:
        _write_result(args, outputs, result, image, boxes, chw_shape, labels)
    return 0


def _shaped(outputs, meta, n):
    """The emulator's flat outputs in the shapes the kmodel's metadata records (the converted
    graph's, the layout the kmodel writes; its leading batch dim of 1 dropped), where the value
    counts agree; (N, ...) for a batch of N. Without metadata they stay as they come."""
    import numpy as np
    if meta is None or len(meta.outputs) != len(outputs):
        return outputs
    shaped = []
    for o, m in zip(outputs, meta.outputs):
        shape = tuple(m["shape"][1:] if len(m["shape"]) > 1 and m["shape"][0] == 1 else m["shape"])
        item = np.shape(o)[1:] if n is not None else np.shape(o)
        ok = shape and int(np.prod(shape)) == int(np.prod(item))
        shaped.append(np.reshape(o, ((n,) if n is not None else ()) + shape) if ok else o)
    return shaped


def _run_items(emu, x, n, args):
    """The outputs of one input, or of each item of a batch stacked (N, ...) as they come
    (with a progress bar): several at once (Emulator.iter_frames), each exactly as by itself."""
    import numpy as np

    from tl2k210.errors import EmulatorError
    if n is None:
        return emu.run(x)
    from tl2k210.progress import Progress
    show = args.progress if args.progress is not None else sys.stderr.isatty()
    bar = Progress(show, unit="items")
    bar.start("running", n)
    stacked, i = None, 0
    try:
        for outs in emu.iter_frames(x[j] for j in range(n)):   # several items at once
            if stacked is None:
                stacked = [np.empty((n,) + np.shape(o), np.asarray(o).dtype) for o in outs]
            for dst, o in zip(stacked, outs):
                dst[i] = o
            i += 1
            bar.update(i)
    except EmulatorError as exc:   # item i: the items before it came out
        raise EmulatorError(f"{args.input}, batch item {i}: {exc}") from None
    return stacked


def _is_stream(path) -> bool:
    import stat
    try:
        m = os.stat(path).st_mode
    except OSError:
        return False
    return stat.S_ISCHR(m) or stat.S_ISFIFO(m)


def _write_result(args, outputs, result, image, boxes, chw_shape, labels=None):
    import io

    import numpy as np

    from tl2k210 import imaging
    from tl2k210.fileio import atomic_write
    ext = os.path.splitext(args.out)[1].lower()
    buf = io.BytesIO()
    if ext == ".png":
        _, h, w = chw_shape
        shown = image.resize((w, h))
        if boxes is not None:
            shown = imaging.draw_boxes(shown, boxes, labels)
        shown.save(buf, format="PNG")
    elif ext == ".npy":
        np.save(buf, outputs[0])
    elif ext == ".npz":
        np.savez(buf, *outputs)
    else:
        buf.write(json.dumps(result, indent=1).encode())
    atomic_write(args.out, buf.getvalue(), "--out")
    print(f"wrote {args.out}", file=sys.stderr)

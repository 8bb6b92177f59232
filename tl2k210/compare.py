"""A float model (onnxruntime) against a kmodel (the bit-exact emulator) on the same inputs:
per output SQNR and cosine, top-1/top-5 agreement for classifiers, and detection agreement for
YOLOv2 region outputs (decoded by tl2k210.k210.yolo, MaixPy's region layer). `compare` is what
`tl2k210 compare` prints; it works on kmodels made by nncase too."""
import numpy as np

from tl2k210 import frontends, metadata
from tl2k210.compiler import (ConvertOptions, cut_outputs, input_affine, load_options, model_input_range,
                              model_inputs, source_graph)
from tl2k210.errors import Tl2k210Error, UnknownOutputError
from tl2k210.k210 import yolo
from tl2k210.k210.emulator import Emulator
from tl2k210.k210.flow import run_pipeline
from tl2k210.passes.input_nchw import input_chw, input_layout
from tl2k210.quantize.calibrate import FloatRunner
from tl2k210.quantize.metrics import cosine, sqnr_db, topk_agreement


def float_outputs(graph, xs):
    """{output_name: (N, ...) array} of the float graph over the inputs `xs` (onnxruntime)."""
    run = FloatRunner(graph, expose_all=False)
    outs = [run(x) for x in xs]
    return {k: np.concatenate([o[k] for o in outs]) for k in graph.outputs}


def output_agreement(ref, test, ks=(1, 5)):
    """ref/test: {name: (N, ...) arrays}. Per output: sqnr_db, cosine, and top-k agreement when
    the output is a class vector (N, classes) with more classes than k."""
    report = {}
    for k, r in ref.items():
        t = np.asarray(test[k]).reshape(r.shape)
        row = {"sqnr_db": sqnr_db(r, t), "cosine": cosine(r, t)}
        flat = r.reshape(len(r), -1)
        if flat.shape[1] > 1 and flat.shape[1] == int(np.prod(r.shape[1:])) and r.ndim == 2:
            for kk in ks:
                if flat.shape[1] > kk:
                    row[f"top{kk}"] = topk_agreement(r, t, kk)
        report[k] = row
    return report


def yolo2_boxes(region, anchors, threshold=0.5, nms=0.3):
    """Decode one (A*(5+C), H, W) region map with MaixPy's rules (tl2k210.k210.yolo.decode),
    boxes in 0..1 image units."""
    _, h, w = region.shape
    return yolo.decode(region, anchors, w, h, 1, 1, threshold, nms)


def detection_agreement(ref_boxes, test_boxes, iou_thresh=0.5):
    """Greedy one-to-one matching (same class, IoU >= iou_thresh) of test boxes to the float ones
    (per image lists of tl2k210.k210.yolo.Box), summed over images:
    {"ref", "test", "matched", "recall", "precision"}."""
    n_ref = n_test = matched = 0
    for r, t in zip(ref_boxes, test_boxes):
        n_ref, n_test = n_ref + len(r), n_test + len(t)
        free = list(t)
        for d in r:
            cands = [(yolo.iou(d.rect(), b.rect()), i) for i, b in enumerate(free) if b.classid == d.classid]
            best = max(cands, default=(0.0, None))
            if best[1] is not None and best[0] >= iou_thresh:
                free.pop(best[1])
                matched += 1
    return {"ref": n_ref, "test": n_test, "matched": matched,
            "recall": matched / n_ref if n_ref else 1.0, "precision": matched / n_test if n_test else 1.0}




def compare(float_model, kmodel_path, dataset, limit=200, decode=None, anchors=None, threshold=0.5,
            nms=0.3, **pre):
    """{"outputs": {name: {sqnr_db, cosine, top1, top5}}, "detections": {...}, "samples": n}."""
    opts = ConvertOptions(**pre)
    meta = metadata.load_for(kmodel_path)
    ends = opts.outputs or ([o.get("name") for o in meta.outputs] if meta is not None else None)
    kw = {k: v for k, v in load_options(opts).items() if k != "outputs"}     # as convert read it
    model = None
    if ends:
        try:    # as convert cut it (a .tflite before a custom op TFLite cannot read)
            model = frontends.load_model(float_model, outputs=tuple(ends), **kw)
        except UnknownOutputError:      # any other load error: the file itself, read once
            if opts.outputs:
                raise
    if model is None:               # the metadata's names are not the file's: compare it whole
        model = frontends.load_model(float_model, **kw)
    graph = source_graph(model, opts)
    cut_outputs(graph, opts.outputs or _kmodel_ends(graph, ends), str(float_model))
    graph, _ = run_pipeline(graph)                                  # exact passes: NCHW in and out
    return compare_graph(graph, kmodel_path, dataset, limit, decode, anchors, threshold, nms, opts, float_model)


def _kmodel_ends(graph, names):
    """The kmodel's outputs `names` (its metadata) where the float graph computes them before its
    own outputs -- a kmodel converted with --outputs: the float side is cut there too; else None."""
    names = list(names or ())
    computed = {t for n in graph.nodes for t in n.outputs}
    return names if names and set(names) <= computed and set(names) != set(graph.outputs) else None


def _match_outputs(graph, ref, outs):
    """Pair each float output with the kmodel output of the same size (in order), and read a 4-D map
    the way the kmodel lays it out: channel-major (what tl2k210 writes) or channels-last (nncase
    v0.2 keeps a TFLite model's NHWC outputs) -- whichever agrees better. Returns
    {name: (ref flat, test flat, layout)}."""
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
        a, b = input_affine(graph, input_chw(graph)[0])
        chw = (chw - b[None, :, None, None]) / a[None, :, None, None]
    runner = FloatRunner(graph, expose_all=False)
    refs, tests, layouts = {}, {}, {}
    # uint8 pixels for a kmodel that takes the camera image, the preprocessed floats (CHW)
    # for one with a float input (nncase v0.2 without --input-type uint8)
    feeds = pixels if pixels is not None and emu_dtype == np.uint8 else chw
    meta = metadata.load_for(kmodel_path)
    if feeds is pixels and pixels is not None and meta is not None and meta.input.get("bgr") and meta.planes == "rgb":
        feeds = pixels[:, ::-1]     # a --bgr kmodel takes the camera's R, G, B planes; the float model B, G, R
    frames = emu.iter_frames(np.asarray(f).astype(emu_dtype).reshape(emu_shape) for f in feeds)
    for i, outs in enumerate(frames):   # several frames at once, each as by itself
        ref = runner(floats[i][None])
        for o, (r, t, layout) in _match_outputs(graph, ref, outs).items():
            refs.setdefault(o, []).append(r)
            tests.setdefault(o, []).append(t)
            layouts[o] = layout
    if not refs:
        raise Tl2k210Error(f"{mismatch}; no kmodel output has the size of a float output "
                           f"{[tuple(graph.shape(o)) for o in graph.outputs]}")
    ref = {k: np.stack(v) for k, v in refs.items()}
    test = {k: np.stack(v) for k, v in tests.items()}
    report = {"samples": len(floats), "outputs": output_agreement(ref, test),
              "quantized_source": bool(graph.meta.get("quant_ranges"))}    # the float graph of its integers
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


def drawn_ranges(ranges, draw, rel=0.01):
    """`ranges` widened at each end by a factor in [1, 1 + rel] drawn with seed `draw` (draw 0:
    unchanged): ranges as good as the calibrated ones (no more clipping, steps at most rel
    coarser), on which each tensor's rounding falls differently. Tensors of one range keep one
    (a max-pool and its conv, a relabel): the kmodel adds no requantization between them."""
    if not draw:
        return dict(ranges)
    rng = np.random.default_rng(draw)
    key = {t: (float(lo), float(hi)) for t, (lo, hi) in ranges.items()}
    widen = {r: (r[0] * (1 + rel * rng.uniform()), r[1] * (1 + rel * rng.uniform())) for r in sorted(set(key.values()))}
    return {t: widen[key[t]] for t in ranges}


def drawn_gap(source, held, opts, limit=100, draws=16, rel=0.01):
    """{output: (ideal dB, ours dB)} without the rounding's luck: the 8-bit ideal and the kmodel
    each built `draws` times, at convert's calibrated ranges moved by drawn_ranges, their noise
    power averaged over the draws, on the held-out samples `held`. Where a few values hold an
    output's signal (a detector's objectness map on photos without faces: YuNet's obj_32 on the
    28 ImageNet photos, 57% of it in one photo) one draw's SQNR is a lottery: over 16 draws the
    ideal spans 8.9-16.4 dB and ours 8.6-16.2. The averages compare the mapping, not the luck."""
    import dataclasses

    from tl2k210.compiler import calibrate, load, optimise, plan_and_lower
    from tl2k210.quantize.fake_quant import ideal_graphs
    loaded = load(source, opts)
    opt = optimise(loaded, opts)
    cal = calibrate(opt, opts, loaded.where)
    g = opt.graph
    floats, pixels = model_inputs(g, str(held), limit, cal.opts)
    feeds = pixels if pixels is not None else floats.reshape(len(floats), -1)
    refs = [FloatRunner(g, False)(x[None]) for x in floats]
    signal = {o: sum(float(np.sum(np.square(r[o], dtype=np.float64))) for r in refs) for o in g.outputs}
    noise = {o: np.zeros(3) for o in g.outputs}     # (the ideal graphs', ours) summed over the draws
    for d in range(draws):
        ranges = drawn_ranges(cal.ranges, d, rel)
        fqs = [FloatRunner(fg, False) for fg in ideal_graphs(g, ranges, opts.weight_bits, vector_input=pixels is None,
                                                             means=cal.means)]
        emu = Emulator(plan_and_lower(opt, dataclasses.replace(cal, ranges=ranges)).built.model)
        for x, outs, r in zip(floats, emu.iter_frames(feeds), refs):
            qs = [fq(x[None]) for fq in fqs]
            for o, out in zip(g.outputs, outs):
                ref = np.asarray(r[o], np.float64).reshape(-1)
                for k, y in enumerate([q[o] for q in qs]):
                    noise[o][k] += np.sum((ref - np.asarray(y, np.float64).reshape(-1)) ** 2)
                noise[o][2] += np.sum((ref - np.asarray(out, np.float64).reshape(-1)) ** 2)
    noise = {o: (min(n[:len(fqs)]), n[2]) for o, n in noise.items()}     # the better ideal
    return {o: tuple(float("inf") if e == 0 else float(10 * np.log10(signal[o] * draws / e)) for e in noise[o])
            for o in g.outputs}

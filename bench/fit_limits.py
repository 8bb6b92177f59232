"""What quantization itself can keep on the float models of ../shared/testdata/corpus/fit (the
files and arguments of bench/fit.py, its photos: calibration on the 12 scikit-image photos,
evaluation on the 28 ImageNet photos), whatever the compiler does -- the float graph with fake
quantization (tl2k210/quantize/fake_quant.py) of:

  * bench/seeded_limits.py's columns: the 8-bit ideal, weights only (8-bit), activations only
    (16-bit weights), the one uint8 tensor whose rounding alone costs the most;
  * the one conv whose 8-bit weights alone cost the most (activations and other weights float);
  * the ideal with 16-bit weights (--weight-bits 16: the whole model, kmodel v3's eight_bit_mode
    is one flag for every layer);
  * per-channel activation scales with 16-bit weights: every conv output that only KPU convs
    read gets a grid per channel (its producer's BN stage can write channel c at its own scale;
    a ReLU output keeps zero point 0, so padding stays exact; a linear one only where its
    readers are unpadded 1x1 convs, whose bias takes the per-channel zero points), from the
    calibration photos' per-channel ranges ("calibrated") and from ranges that also cover the
    evaluation photos ("covering", every other tensor's range too: the bound of a calibration set
    that shows every channel's extremes), against the ideal on the same covering per-tensor ranges;
    and from no data ("bounded": each channel's interval propagated from the input range through
    the weights, cut to the calibrated per-tensor range: it never clips more than that range).

Each figure is the worst output's SQNR (dB) against the float graph and, for a classifier, the
top-1 agreement.

    python bench/fit_limits.py [--only SUBSTRING,...] [--json bench/results/fit_limits.json]
"""
import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
from tl2k210 import paths  # noqa: E402

REPO = paths.checkout()
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "bench"))


def per_channel_tensors(g, rng):
    """Conv outputs (stage "out") that a per-channel grid keeps exact on the KPU: read only as the
    input of convs; a ReLU-like output (lo >= 0: zero point 0 everywhere), or read only by
    unpadded 1x1 convs (per-channel zero points fold into their bias)."""
    from tl2k210.graph import stage_names
    out = []
    for n in g.nodes:
        t = stage_names(n)["out"] if n.op == "Conv" else None
        users = g.consumers(t) if t else []
        if t not in rng or not users or t in g.outputs or any(u.op != "Conv" or u.inputs[0] != t for u in users):
            continue
        if rng[t][0] >= 0 or all(g.const(u.inputs[1]).shape[2:] == (1, 1) and not any(u.attrs.get("pads", ()))
                                 for u in users):
            out.append(t)
    return out


def channel_ranges(values, tensors):
    """{tensor: (lo[C], hi[C])} over the samples' float values ({tensor: array} per sample)."""
    out = {}
    for t in tensors:
        v = np.concatenate([s[t] for s in values])
        ax = (0,) + tuple(range(2, v.ndim))
        out[t] = (np.minimum(v.min(axis=ax), 0.0), np.maximum(v.max(axis=ax), 0.0))
    return out


def bounded_channel_ranges(g, rng, tensors, input_interval):
    """{tensor: (lo[C], hi[C])} for `tensors` without calibration: each conv output channel's
    interval from its inputs' intervals and its weights (bias + sum of min/max of w * [lo, hi]),
    ReLU/Clip applied, cut to the calibrated per-tensor range. A per-channel tensor's readers get
    its channel intervals, any other tensor's its per-tensor range (where the uint8 grid clips
    it). Nothing the quantized model computes leaves these intervals: no clipping beyond the
    per-tensor range's."""
    from tl2k210.graph import stage_names
    iv, out = {g.inputs[0]: input_interval}, {}
    for n in g.nodes:
        t = stage_names(n)["out"] if n.op == "Conv" else None
        act = (n.attrs.get("activation") or {}).get("op")
        if t not in tensors or act not in (None, "Relu", "Clip") or g.const(n.inputs[1]) is None:
            continue
        w = g.const(n.inputs[1]).astype(np.float64)
        b = g.const(n.inputs[2]).astype(np.float64) if len(n.inputs) > 2 else np.zeros(w.shape[0])
        co, cig = w.shape[:2]
        x = n.inputs[0]
        lo_i, hi_i = iv.get(x) or (np.full(cig * n.attrs.get("group", 1), rng[x][0]), np.full(cig * n.attrs.get("group", 1), rng[x][1]))
        src = (np.arange(co) // (co // n.attrs.get("group", 1)))[:, None] * cig + np.arange(cig)[None, :]
        wl, wh = w * lo_i[src][:, :, None, None], w * hi_i[src][:, :, None, None]
        lo, hi = b + np.minimum(wl, wh).sum(axis=(1, 2, 3)), b + np.maximum(wl, wh).sum(axis=(1, 2, 3))
        if act is not None:
            a = n.attrs["activation"]
            lo, hi = (np.clip(v, a.get("min", 0.0) if act == "Clip" else 0.0, a.get("max", np.inf)) for v in (lo, hi))
        tlo, thi = min(rng[t][0], 0.0), max(rng[t][1], 0.0)
        out[t] = iv[t] = (np.clip(np.minimum(lo, 0.0), tlo, 0.0), np.clip(np.maximum(hi, 0.0), 0.0, thi))
    return out


def extra_limits(graph, cal, ev, classifier, input_interval):
    import seeded_limits

    from tl2k210.quantize import calibrate
    from tl2k210.quantize.fake_quant import fake_quant_graph
    from tl2k210.quantize.metrics import sqnr_db
    from tl2k210.quantize.uniform import quantize_weights
    fr = calibrate.FloatRunner(graph, False)
    ref = {o: np.stack([fr(x[None])[o] for x in ev]) for o in graph.outputs}

    def score(g):
        run = calibrate.FloatRunner(g, False)
        got = [run(x[None]) for x in ev]
        db = min(sqnr_db(ref[o], np.stack([r[o] for r in got])) for o in graph.outputs)
        o = graph.outputs[0]
        top1 = float(np.mean(ref[o].reshape(len(ev), -1).argmax(1) == np.stack([r[o] for r in got]).reshape(len(ev), -1).argmax(1)))
        return (round(db, 2), round(top1, 3)) if classifier else (round(db, 2),)

    row = seeded_limits.limits(graph, cal, ev)
    rng = calibrate.ranges(calibrate.collect(graph, [c[None] for c in cal], histograms=False), "minmax")
    w8 = {n.name for n in graph.nodes if n.op == "Conv" and graph.const(n.inputs[1]) is not None}
    fq_one = {}
    for name in w8:     # one conv's weights at 8 bits, everything else float
        g = graph.copy()
        node = next(n for n in g.nodes if n.name == name)
        w = g.const(node.inputs[1])
        wq, zw, sw = quantize_weights(w, 8)
        deq = (wq.astype(np.float64) - zw) * sw.reshape(-1, *[1] * (w.ndim - 1))
        node.inputs[1] = g.add_const(deq.astype(np.float32), node.inputs[1] + "/fq")
        fq_one[name] = score(g)[0]
    worst = min(fq_one, key=fq_one.get)
    row.update(ideal=score(fake_quant_graph(graph, rng)), ideal_w16=score(fake_quant_graph(graph, rng, 16)),
               weights16_only_db=score(fake_quant_graph(graph, {}, 16))[0],
               weights_conv=worst, one_conv_weights_only_db=fq_one[worst])
    pcs = per_channel_tensors(graph, rng)
    every = calibrate.FloatRunner(graph)
    cal_v, ev_v = [every(x[None]) for x in cal], [every(x[None]) for x in ev]
    cover = {t: (min(lo, *(float(v[t].min()) for v in ev_v)), max(hi, *(float(v[t].max()) for v in ev_v)))
             for t, (lo, hi) in rng.items() if t in ev_v[0]}
    cover_pc = {**cover, **channel_ranges(cal_v + ev_v, pcs)}
    row.update(per_channel_tensors=f"{len(pcs)} of {len(rng)}",
               per_channel_w16_calibrated=score(fake_quant_graph(graph, {**rng, **channel_ranges(cal_v, pcs)}, 16)),
               ideal_w16_covering=score(fake_quant_graph(graph, cover, 16)),
               per_channel_w16_covering=score(fake_quant_graph(graph, cover_pc, 16)),
               per_channel_w8_covering=score(fake_quant_graph(graph, cover_pc, 8)))
    bounded = {**rng, **bounded_channel_ranges(graph, rng, pcs, input_interval)}
    row.update(per_channel_w8_bounded=score(fake_quant_graph(graph, bounded, 8)),
               per_channel_w16_bounded=score(fake_quant_graph(graph, bounded, 16)))
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", help="the files whose name contains one of these (comma-separated)")
    ap.add_argument("--json", default=str(REPO / "bench" / "results" / "fit_limits.json"))
    args = ap.parse_args()
    import corpus
    import fit

    from tl2k210.compiler import ConvertOptions, load, model_input_range, model_inputs, optimise, pixel_mapping
    from tl2k210.passes.input_nchw import input_chw, input_layout
    rows = []
    for name, (extra, classifier) in fit.FILES.items():
        src = fit.FIT / name
        if (args.only and not any(o in name for o in args.only.split(","))) or not src.exists() \
                or fit.quantized_tflite(src):
            continue
        pre = {k: tuple(float(v) if k == "input_range" else int(v) for v in extra[extra.index(flag) + 1].split(","))
               for flag, k in (("--input-shape", "input_shape"), ("--input-range", "input_range")) if flag in extra}
        opts = ConvertOptions(progress=False, **pre)
        opt = optimise(load(str(src), opts), opts)
        opts, _ = model_input_range(opt.graph, opts)
        cal, _ = model_inputs(opt.graph, str(corpus.photo_folder()), 100, opts)
        ev, _ = model_inputs(opt.graph, str(fit.FACES if name in fit.FACE_DETECTORS else fit.PHOTOS),
                             fit.EVAL_LIMIT, opts)
        c = cal.shape[1] if input_layout(opt.graph) == "NCHW" else cal.shape[-1]
        scale, offset = pixel_mapping(opts, c, opt.graph)
        ends = np.stack([offset, 255 * scale + offset]) if input_chw(opt.graph) else np.stack(
            [cal.min(axis=0).reshape(c, -1).min(1), cal.max(axis=0).reshape(c, -1).max(1)])
        rows.append({"model": name, **extra_limits(opt.graph, cal, ev, classifier, (ends.min(0), ends.max(0)))})
        print(json.dumps(rows[-1], default=float), flush=True)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(rows, indent=1, default=float))


if __name__ == "__main__":
    main()

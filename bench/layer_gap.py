"""Where a kmodel falls below its 8-bit ideal: per traced tensor, in graph order, the SQNR of
ours (the emulator's trace, as the receipt's per-layer column) and of the ideal (the float graph
with fake quantization, tl2k210/quantize/fake_quant.py, bias-corrected where the kmodel is: the
same graph tensor by tensor, not the better of two at the outputs) against the float graph after the passes,
on the same calibration samples. The first row where "gap" (ideal - ours) jumps is where the
lowering loses what the quantization alone would not.

One build's output SQNR can be a lottery (compare.drawn_gap): --draws K averages it out.

    python bench/layer_gap.py MODEL --dataset DIR [--runtime maixpy] [--samples 8] [--draws K] [--all] [--held DIR]
        [--input-shape N,C,H,W] [--input-range LO,HI]
"""
import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def layer_gap(source, opts, draws=1, held=None):
    """[(tensor, ideal dB, ours dB)] in graph order, then ("__out__" + output, ...) per output.
    draws > 1: each side's noise power averaged over that many builds at ranges moved by up to 1%
    (compare.drawn_ranges; draw 0 is convert's own), as compare.drawn_gap does for the outputs."""
    import dataclasses

    import numpy as np

    from tl2k210.compare import drawn_ranges
    from tl2k210.compiler import calibrate, load, model_inputs, optimise, plan_and_lower, traced
    from tl2k210.k210.emulator import Emulator
    from tl2k210.quantize.calibrate import FloatRunner
    from tl2k210.quantize.fake_quant import fake_quant_graph
    loaded = load(source, opts)
    opt = optimise(loaded, opts)
    cal = calibrate(opt, opts, loaded.where)
    floats, pixels = cal.floats, cal.pixels
    if held is not None:                        # held-out samples, at the calibrated ranges
        floats, pixels = model_inputs(opt.graph, str(held), opts.sqnr_samples, cal.opts)
    g, n = opt.graph, min(opts.sqnr_samples, len(floats))
    refs = [FloatRunner(g)(x[None]) for x in floats[:n]]
    power = {}                                  # tensor -> [signal, ideal noise, ours noise]

    def add(t, r, q, v):
        r, q, v = (np.asarray(a, np.float64).reshape(-1) for a in (r, q, v))
        if v.size == r.size:
            p = power.setdefault(t, np.zeros(3))
            p += [np.sum(r * r), np.sum((q - r) ** 2), np.sum((v - r) ** 2)]

    for d in range(draws):
        ranges = drawn_ranges(cal.ranges, d)
        built = plan_and_lower(opt, dataclasses.replace(cal, ranges=ranges)).built
        fq, emu = FloatRunner(fake_quant_graph(g, ranges, opts.weight_bits, not cal.image,
                                                 cal.means if cal.correct_bias else None)), Emulator(built.model)
        for i, r in enumerate(refs):
            q = fq(floats[i][None])
            outs, trace = emu.run(pixels[i] if cal.image else floats[i].reshape(-1), trace=True)
            for t, (idx, kind) in built.trace_map.items():
                if t in r and t in q:
                    add(t, r[t], q[t], traced(trace, idx, kind, built.lw.locs.get(t)))
            for o, out in zip(g.outputs, outs):
                add("__out__" + o, r[o], q[o], out)
    order = {t: k for k, nd in enumerate(g.nodes) for t in nd.outputs}
    rows = sorted((t for t in power if not t.startswith("__out__")), key=lambda t: order.get(t, -1))
    rows += [t for t in power if t.startswith("__out__")]
    return [(t, *(float("inf") if e == 0 else float(10 * np.log10(power[t][0] / e)) for e in power[t][1:]))
            for t in rows]


def main(argv=None):
    from tl2k210.cliargs import range_arg, shape
    from tl2k210.compiler import ConvertOptions
    from tl2k210.tables import text_table
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--dataset", required=True)
    ap.add_argument("--runtime", default="maixpy")
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--draws", type=int, default=1, help="average each side's noise over K drawn ranges")
    ap.add_argument("--all", action="store_true", help="every traced tensor (default: where the gap grows)")
    ap.add_argument("--held", help="held-out samples (folder or file, as --dataset) to measure on, "
                    "at the ranges calibrated on --dataset")
    ap.add_argument("--input-shape", type=shape, help="N,C,H,W for models with symbolic input dims")
    ap.add_argument("--input-range", type=range_arg, help="LO,HI of the input pixels, as convert's")
    a = ap.parse_args(argv)
    opts = ConvertOptions(dataset=a.dataset, runtime=a.runtime, min_sqnr=0, progress=False, sqnr_samples=a.samples,
                          input_shape=a.input_shape, input_range=a.input_range)
    rows, worst, shown = layer_gap(a.model, opts, a.draws, a.held), -1e9, []
    for t, i, o in rows:
        gap = i - o
        if a.all or t.startswith("__out__") or gap > worst + 0.5:
            shown.append((t, f"{i:.1f}", f"{o:.1f}", f"{gap:+.1f}"))
        worst = max(worst, gap)
    print("\n".join(text_table(("tensor", "ideal dB", "ours dB", "gap"), shown)))


if __name__ == "__main__":
    main()

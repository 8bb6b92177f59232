"""How much SQNR 8-bit quantization can keep on the seeded developer corpus (tests/devcorpus.py:
keras.applications with weights=None, the hand-written nets, the ONNX zoo), whatever the compiler
does: the float graph with fake quantization (tl2k210/quantize/fake_quant.py) of

  * everything the back-end keeps in 8 bits ("ideal 8-bit", the README table's column);
  * the weights only (8-bit per channel, activations float);
  * the activations only (every uint8 tensor, 16-bit weights);
  * one tensor only: the one whose uint8 rounding alone costs the most (screened with its calibrated
    range on 6 photos), then with the best of several ranges (0.3x .. 1.2x the calibrated one).

Calibration: the 12 scikit-image photos; evaluation: the 28 testdata ImageNet photos (as
bench/corpus.py). The last column bounds every kmodel that keeps that tensor in 8 bits: the KPU
writes every layer's output as uint8 on a uniform grid, and reads its input the same way.

    python bench/seeded_limits.py [--only SUBSTRING] [--json bench/results/seeded_limits.json]
"""
import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
from tl2k210 import paths  # noqa: E402

REPO = paths.checkout()
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "bench"))
FACTORS = (0.3, 0.5, 0.7, 0.85, 1.0, 1.2)


def limits(graph, cal, ev):
    import numpy as np

    from tl2k210.graph import stage_names
    from tl2k210.quantize import calibrate
    from tl2k210.quantize.fake_quant import U8_OPS, fake_quant_graph
    from tl2k210.quantize.metrics import sqnr_db

    def sqnr(g, n=len(ev)):
        run = calibrate.FloatRunner(g, False)
        return min(sqnr_db(ref[o][:n], np.concatenate([run(x[None])[o] for x in ev[:n]])) for o in graph.outputs)

    fr = calibrate.FloatRunner(graph, False)
    ref = {o: np.concatenate([fr(x[None])[o] for x in ev]) for o in graph.outputs}
    rng = calibrate.ranges(calibrate.collect(graph, [c[None] for c in cal], histograms=False), "minmax")
    u8 = [stage_names(n)["out"] if n.op == "Conv" else n.outputs[0] for n in graph.nodes if n.op in U8_OPS]
    worst = min((t for t in u8 if t in rng), key=lambda t: sqnr(fake_quant_graph(graph, {t: rng[t]}, 16), 6))
    lo, hi = rng[worst]
    return {"ideal_db": sqnr(fake_quant_graph(graph, rng)),
            "weights_only_db": sqnr(fake_quant_graph(graph, {})),
            "activations_only_db": sqnr(fake_quant_graph(graph, rng, weight_bits=16)),
            "tensor": worst, "position": f"{u8.index(worst) + 1} of {len(u8)} uint8 tensors",
            "one_tensor_only_db": max(sqnr(fake_quant_graph(graph, {worst: (lo * f, hi * f)}, weight_bits=16))
                                      for f in FACTORS)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only")
    ap.add_argument("--json", default=str(REPO / "bench" / "results" / "seeded_limits.json"))
    args = ap.parse_args()
    import devcorpus
    from corpus import photo_folder

    from tl2k210.compiler import ConvertOptions, check_weight_budget, model_inputs
    from tl2k210.errors import Tl2k210Error
    from tl2k210.frontends import load_model
    from tl2k210.graph import from_onnx
    from tl2k210.k210.flow import run_pipeline
    calib, photos = photo_folder(), paths.testdata_dir() / "imagenet"
    rows = []
    for name, e in devcorpus.entries().items():
        if args.only and args.only not in name:
            continue
        try:
            model = load_model(e.build())
            check_weight_budget(model, ConvertOptions(**{k: v for k, v in e.options.items() if k == "runtime"}), name)
            graph, _ = run_pipeline(from_onnx(model))
        except Tl2k210Error as err:   # what convert refuses has no limit to measure
            print(f"{name}: {str(err).splitlines()[0]}", flush=True)
            continue
        opts = ConvertOptions(input_range=e.options.get("input_range"))
        cal, _ = model_inputs(graph, str(calib), 100, opts)
        ev, _ = model_inputs(graph, str(photos), 100, opts)
        rows.append({"model": name, **limits(graph, cal, ev)})
        print(rows[-1], flush=True)
    print(f"\n{'model':30} {'ideal 8-bit':>11} {'weights only':>12} {'acts only':>10} {'one tensor only':>16}  tensor")
    for r in rows:
        print(f"{r['model'][:30]:30} {r['ideal_db']:11.1f} {r['weights_only_db']:12.1f} {r['activations_only_db']:10.1f} "
              f"{r['one_tensor_only_db']:16.1f}  {r['tensor']} ({r['position']})")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(rows, indent=1, default=float))


if __name__ == "__main__":
    main()

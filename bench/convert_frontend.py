"""Front-half conversion time for MobileNetV1 (TensorLayer, 224x224): tf2onnx vs IR + passes.

alpha 0.25 uses the ImageNet npz from testdata when present, other alphas random weights.
Prints a table and writes bench/results/convert_frontend.json.
    python bench/convert_frontend.py [--alphas 0.25,0.5,0.75] [--out FILE]
"""
import argparse
import sys
import json
import time
from pathlib import Path

from tl2k210 import paths

REPO = paths.checkout()
sys.path.insert(0, str(REPO))        # the zoo's `models` package, as `make demo` finds it
TESTDATA = paths.testdata_dir()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--alphas", default="0.25,0.5,0.75")
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "convert_frontend.json"))
    args = ap.parse_args()
    t0 = time.perf_counter()
    import tensorflow  # noqa: F401  (timed separately: every TF front-end pays it once)
    import_s = time.perf_counter() - t0
    from models.mobilenet_v1.network import load_keras_order_npz, mobilenet_v1
    from tl2k210.frontends import load_model
    from tl2k210.graph import from_onnx
    from tl2k210.k210.flow import run_pipeline
    rows = []
    for alpha in (float(a) for a in args.alphas.split(",")):
        net = mobilenet_v1(alpha, name=f"bench_{alpha}")
        npz = TESTDATA / "weights" / "mobilenetv1_0.25_tensorlayer.npz"
        if alpha == 0.25 and npz.exists():
            load_keras_order_npz(net, npz)
        t = time.perf_counter()
        model = load_model(net)
        t_onnx = time.perf_counter() - t
        t = time.perf_counter()
        g = from_onnx(model)
        t_ir = time.perf_counter() - t
        t = time.perf_counter()
        g2, log = run_pipeline(g)
        t_pass = time.perf_counter() - t
        rows.append({"alpha": alpha, "tf2onnx_s": t_onnx, "from_onnx_s": t_ir, "passes_s": t_pass,
                     "onnx_nodes": len(model.graph.node), "ir_nodes": len(g2.nodes),
                     "per_pass_s": {e["pass"]: round(e["seconds"], 4) for e in log}})
    print(f"import tensorflow: {import_s:.2f} s")
    print(f"{'alpha':>6} {'tf2onnx s':>10} {'from_onnx s':>12} {'passes s':>9} {'ONNX nodes':>11} {'IR nodes':>9}")
    for r in rows:
        print(f"{r['alpha']:>6} {r['tf2onnx_s']:>10.2f} {r['from_onnx_s']:>12.3f} {r['passes_s']:>9.3f} "
              f"{r['onnx_nodes']:>11} {r['ir_nodes']:>9}")
    slow = sorted(rows[-1]["per_pass_s"].items(), key=lambda kv: -kv[1])[:3]
    print(f"slowest passes (alpha {rows[-1]['alpha']}): " + ", ".join(f"{k} {v:.3f} s" for k, v in slow))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"import_tensorflow_s": import_s, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()

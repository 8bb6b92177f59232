"""Emulator speed: frames/s on real kmodels, 1 and 2 threads, next to onnxruntime running a
float graph of the same shape (same convs/pools, random weights).

    python bench/emulator.py [--frames 30] [--json bench/results/emulator.json]
"""
import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from tl2k210.k210 import kmodel  # noqa: E402
from tl2k210.k210.emulator import Emulator  # noqa: E402

TESTDATA = Path(os.environ.get("TL2K210_TESTDATA", REPO.parent / "shared" / "testdata"))
MODELS = ["facedetect_320x240_v3", "yolo20_v3", "yolo20_v4"]


def float_twin(model):
    """An ONNX float graph with the kmodel's KPU layers: conv (+relu) (+pool), random weights."""
    import onnx
    from onnx import TensorProto, helper
    items = model.layers if model.version == 3 else model.nodes
    convs = [it.conv for it in items if it.conv is not None]
    rng = np.random.default_rng(0)
    nodes, inits = [], []
    name = "x"
    for i, c in enumerate(convs):
        ci, co, k = c.in_shape[0], c.out_shape[0], c.k
        g = ci if c.depthwise else 1
        w = rng.normal(0, 0.1, (co, ci // g, k, k)).astype(np.float32)
        inits.append(helper.make_tensor(f"w{i}", TensorProto.FLOAT, w.shape, w.ravel()))
        p = k // 2
        nodes.append(helper.make_node("Conv", [name, f"w{i}"], [f"c{i}"], group=g, pads=[p] * 4))
        nodes.append(helper.make_node("Relu", [f"c{i}"], [f"r{i}"]))
        name = f"r{i}"
        pool = c.pool
        if pool.kind != "bypass":
            op = {"max": "MaxPool", "mean": "AveragePool"}.get(pool.kind, "MaxPool")
            pads = [0, 0, 1, 1] if pool.stride == 1 else [0] * 4
            nodes.append(helper.make_node(op, [name], [f"p{i}"], kernel_shape=[pool.size] * 2,
                                          strides=[pool.stride] * 2, pads=pads))
            name = f"p{i}"
    c0 = convs[0]
    graph = helper.make_graph(nodes, "twin", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [1, *c0.in_shape])], [helper.make_tensor_value_info(
            name, TensorProto.FLOAT, None)], inits)
    return onnx.helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), c0.in_shape


def timed(fn, frames):
    fn()
    fn()
    t = time.perf_counter()
    for _ in range(frames):
        fn()
    return frames / (time.perf_counter() - t)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--frames", type=int, default=30)
    ap.add_argument("--json", default=str(REPO / "bench" / "results" / "emulator.json"))
    args = ap.parse_args()
    from threadpoolctl import threadpool_limits
    rows = []
    for name in MODELS:
        path = TESTDATA / "kmodels" / f"{name}.kmodel"
        if not path.exists():
            print(f"skip {name}: {path} missing")
            continue
        model = kmodel.load(path)
        row = {"model": name}
        for threads in (1, 2):
            emu = Emulator(model, threads=threads)
            shape, _ = emu.input_spec()
            x = np.random.default_rng(1).integers(0, 256, shape).astype(np.uint8)
            with threadpool_limits(1):  # our threads are the only parallelism
                row[f"emu_fps_{threads}t"] = timed(lambda: emu.run(x), args.frames)
        try:
            import onnxruntime as ort
            twin, in_shape = float_twin(model)
            xf = np.random.default_rng(1).random((1, *in_shape), dtype=np.float32)
            for threads in (1, 2):
                so = ort.SessionOptions()
                so.intra_op_num_threads = threads
                so.inter_op_num_threads = 1
                sess = ort.InferenceSession(twin.SerializeToString(), so, providers=["CPUExecutionProvider"])
                row[f"ort_fps_{threads}t"] = timed(lambda: sess.run(None, {"x": xf}), args.frames)
        except ImportError:
            pass
        rows.append(row)
    cols = ["model", "emu_fps_1t", "emu_fps_2t", "ort_fps_1t", "ort_fps_2t"]
    print(f"{'model':24} {'emulator 1t':>12} {'emulator 2t':>12} {'onnxruntime float 1t':>21} {'2t':>8}")
    for r in rows:
        vals = [f"{r.get(c, float('nan')):.1f}" for c in cols[1:]]
        print(f"{r['model']:24} {vals[0]:>12} {vals[1]:>12} {vals[2]:>21} {vals[3]:>8}")
    print("(frames/s; board: facedetect runs at ~50-70 fps on a K210; target >= 30 fps on 2 cores)")
    meta = {"cpu_count": os.cpu_count(), "frames": args.frames, "numpy": np.__version__}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()

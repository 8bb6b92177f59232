"""Emulator speed: frames/s on real kmodels with 1 and 2 threads (median of 5 timed runs),
next to onnxruntime running a float graph of the same shape (same convs/pools, random weights).

    python bench/emulator.py [--frames 20] [--runs 5] [--json bench/results/emulator.json]

Warm-up (numba JIT compile, or loading it from numba's cache) happens before the timed runs and
is reported on its own; each row says whether the fused numba kernels ran and on how many KPU
layers. The emulator is bit-exact either way (tests/test_kpu_stages.py, test_emulator_speedpaths).
"""
import argparse
import json
import os
import platform
import time
from pathlib import Path

import numpy as np

from tl2k210 import paths
from tl2k210.k210 import kmodel
from tl2k210.k210.emulator import Emulator, fast

REPO = paths.checkout()
TESTDATA = paths.testdata_dir()
MODELS = [("facedetect_320x240_v3", TESTDATA / "kmodels"), ("yolo20_v3", TESTDATA / "kmodels"),
          ("yolo20_v4", TESTDATA / "kmodels"),
          # the largest corpus kmodel (3.9 MB, MobileNet-YOLOv3, 32 KPU layers)
          ("kendryte_mobile_yolo__yolo", TESTDATA / "corpus" / "kmodels")]


def float_twin(model):
    """An ONNX float graph with the kmodel's KPU layers: conv (+relu) (+pool), random weights.
    A conv whose input is not the previous conv's output (branches) reads a graph input."""
    import onnx
    from onnx import TensorProto, helper
    items = model.layers if model.version == 3 else model.nodes
    convs = [it.conv for it in items if it.conv is not None]
    rng = np.random.default_rng(0)
    nodes, inits, inputs, outputs = [], [], [], []
    prev = None   # (tensor name, shape) of the previous conv's output
    for i, c in enumerate(convs):
        ci, co, k = c.in_shape[0], c.out_shape[0], c.k
        shape = [1, *c.in_shape]
        if prev is not None and prev[1] == shape:
            src = prev[0]
        else:
            if prev is not None:
                outputs.append(prev[0])
            src = f"x{i}"
            inputs.append(helper.make_tensor_value_info(src, TensorProto.FLOAT, shape))
        g = ci if c.depthwise else 1
        w = rng.normal(0, 0.1, (co, ci // g, k, k)).astype(np.float32)
        inits.append(helper.make_tensor(f"w{i}", TensorProto.FLOAT, w.shape, w.ravel()))
        nodes.append(helper.make_node("Conv", [src, f"w{i}"], [f"c{i}"], group=g, pads=[k // 2] * 4))
        nodes.append(helper.make_node("Relu", [f"c{i}"], [f"r{i}"]))
        out, pool = f"r{i}", c.pool
        if pool.kind != "bypass":
            op = {"max": "MaxPool", "mean": "AveragePool"}.get(pool.kind, "MaxPool")
            pads = [0, 0, 1, 1] if pool.stride == 1 else [0] * 4
            nodes.append(helper.make_node(op, [out], [f"p{i}"], kernel_shape=[pool.size] * 2,
                                          strides=[pool.stride] * 2, pads=pads))
            out = f"p{i}"
        prev = (out, [1, *c.out_shape])
    outputs.append(prev[0])
    graph = helper.make_graph(nodes, "twin", inputs, [helper.make_tensor_value_info(
        o, TensorProto.FLOAT, None) for o in outputs], inits)
    return onnx.helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), inputs


def timed_runs(fn, frames, runs, cpu=None):
    """fps of `runs` timed runs of `frames` calls each (after the caller's warm-up); appends
    the CPU milliseconds per frame (all threads of this process) of each run to `cpu`."""
    out = []
    for _ in range(runs):
        t, c = time.perf_counter(), time.process_time()
        for _ in range(frames):
            fn()
        out.append(frames / (time.perf_counter() - t))
        if cpu is not None:
            cpu.append(1000 * (time.process_time() - c) / frames)
    return out


def cpu_ms(fn, n=7):
    fn()
    ts = []
    for _ in range(n):
        c = time.process_time()
        fn()
        ts.append(time.process_time() - c)
    return 1000 * float(np.median(ts))


def idle_estimate(model, x):
    """CPU ms/frame with 1 thread, the part of it inside multi-band layers (which the band
    threads split), and the resulting frames/s on two idle cores: a load-independent figure."""
    e1, e2 = Emulator(model, threads=1), Emulator(model, threads=2)
    total = cpu_ms(lambda: e1.run(x))
    items = model.layers if model.version == 3 else model.nodes
    banded = 0.0
    for it in items:
        if it.conv is not None and len(e2.prepared[id(it)].bands) > 1:
            p = e1.prepared[id(it)]
            xi = np.random.default_rng(2).integers(0, 256, it.conv.in_shape).astype(np.uint8)
            banded += cpu_ms(lambda: p(xi), 5)
    banded = min(banded, total)
    return {"cpu_ms_1t": round(total, 2), "banded_share": round(banded / total, 3),
            "idle_2core_fps_estimate": round(1000 / (total - banded / 2), 1)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--frames", type=int, default=20, help="frames per timed run")
    ap.add_argument("--runs", type=int, default=5, help="timed runs (the median is reported)")
    ap.add_argument("--models", nargs="*", help="subset of model names")
    ap.add_argument("--no-ort", action="store_true", help="skip the onnxruntime float twins")
    ap.add_argument("--json", default=str(REPO / "bench" / "results" / "emulator.json"))
    args = ap.parse_args()
    from threadpoolctl import threadpool_limits
    rows = []
    for name, folder in MODELS:
        if args.models and name not in args.models:
            continue
        path = folder / f"{name}.kmodel"
        if not path.exists():
            print(f"skip {name}: {path} missing")
            continue
        model = kmodel.load(path)
        row = {"model": name, "kmodel": f"v{model.version}", "bytes": path.stat().st_size}
        for threads in (1, 2):
            emu = Emulator(model, threads=threads)
            shape, dtype = emu.input_spec()
            x = np.random.default_rng(1).integers(0, 256, shape).astype(np.uint8)
            if dtype == np.float32:
                x = x.astype(np.float32) / 255
            with threadpool_limits(1):  # our band threads are the only parallelism
                t = time.perf_counter()
                emu.run(x)
                row.setdefault("warmup_s", round(time.perf_counter() - t, 2))  # JIT / cache load
                emu.run(x)
                cpu = []
                fps = timed_runs(lambda: emu.run(x), args.frames, args.runs, cpu)
            row[f"emu_fps_{threads}t"] = float(np.median(fps))
            row[f"emu_cpu_ms_{threads}t"] = round(float(np.median(cpu)), 2)
            row[f"emu_fps_{threads}t_runs"] = [round(v, 1) for v in fps]
            fused = [p.use_fast for p in emu.prepared.values()]
            row["fused_layers"] = f"{sum(fused)}/{len(fused)}"
        with threadpool_limits(1):
            row.update(idle_estimate(model, x))
        if not args.no_ort:
            try:
                import onnxruntime as ort
                twin, inputs = float_twin(model)
                feeds = {i.name: np.random.default_rng(1).random(
                    [d.dim_value for d in i.type.tensor_type.shape.dim], dtype=np.float32) for i in inputs}
                for threads in (1, 2):
                    so = ort.SessionOptions()
                    so.intra_op_num_threads = threads
                    so.inter_op_num_threads = 1
                    sess = ort.InferenceSession(twin.SerializeToString(), so,
                                                providers=["CPUExecutionProvider"])
                    sess.run(None, feeds)
                    row[f"ort_fps_{threads}t"] = float(np.median(timed_runs(
                        lambda: sess.run(None, feeds), args.frames, args.runs)))
            except ImportError:
                pass
        rows.append(row)
        print(f"  {name}: {row['emu_fps_1t']:.1f} / {row['emu_fps_2t']:.1f} fps", flush=True)
    nan = float("nan")
    print(f"\n{'model':28} {'kmodel':>6} {'emulator 1t':>12} {'emulator 2t':>12} {'CPU ms/frame':>12} "
          f"{'banded':>7} {'2 idle cores':>12} {'fused':>6} {'warm-up s':>9} {'onnxruntime float 1t':>21} "
          f"{'2t':>7}")
    for r in rows:
        print(f"{r['model']:28} {r['kmodel']:>6} {r['emu_fps_1t']:12.1f} {r['emu_fps_2t']:12.1f} "
              f"{r['cpu_ms_1t']:12.1f} {r['banded_share']:7.0%} {r['idle_2core_fps_estimate']:12.1f} "
              f"{r['fused_layers']:>6} {r['warmup_s']:9.2f} "
              f"{r.get('ort_fps_1t', nan):21.1f} {r.get('ort_fps_2t', nan):7.1f}")
    print(f"(frames/s, median of {args.runs} runs of {args.frames} frames; numba "
          f"{'on' if fast.available() else 'OFF (pure numpy path, about 2x slower)'}; "
          f"a K210 runs facedetect at about 50-70 fps; load average now "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs: on a busy machine CPU ms/frame "
          "(1 thread) is the steadier figure; '2 idle cores' = 1000 / (CPU ms - banded part / 2))")
    meta = {"cpu_count": os.cpu_count(), "affinity": len(os.sched_getaffinity(0)),
            "cpu": platform.processor() or platform.machine(), "frames": args.frames,
            "runs": args.runs, "numpy": np.__version__, "numba": fast.available(),
            "load_avg": os.getloadavg()}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()

"""Emulator speed as ratios that hold from machine to machine: the emulator against onnxruntime
running a float graph of the same shape (same convs/pools, random weights) on the same frames,
2 band threads against 1 within each frame, and 2 frames at once (``Emulator.run_frames``, each
frame on its own 1-thread copy) against 1 frame at a time, each pair timed back to back
(interleaved runs, median of the per-run ratios), so a machine's speed and load cancel out. On a
loaded machine the ratio of the two 1-thread variants' fastest frames (thread CPU time) is the
steadier figure: load inflates the emulator's many short memory-bound passes more than
onnxruntime's fused graph.

    python bench/emulator.py [--frames 60] [--runs 5] [--json bench/results/emulator.json]

A run is 60 frames of each variant (20 until round 64): 2 frames at once is for streams, and a
20-frame call of a 3 ms model (60 ms) measured its start and its last frame alone as much as the
stream (facedetect and yolo20_v3 on an idle 2-core AMD EPYC, two runs each way: 1.31, 1.30 and
1.44, 1.41 with 20; 1.54, 1.46 and 1.53, 1.42 with 60).

It prints the CPU model and load average beside the figures, and which exact integer sums the
emulator takes there (uint8 x int8 where the CPU's product is exact, VNNI; else uint8 x uint8,
slower: the emulator/onnxruntime ratio depends on it); frames/s are only that machine's.
Warm-up (numba JIT compile, or loading it from numba's cache, and each multi-band layer's
threads-or-not trials, kpu.TRIALS) happens before the timed runs; warm-up s is reported on its
own. The emulator is bit-exact either way (tests/test_kpu_stages.py, test_emulator_speedpaths).
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
from tl2k210.k210.emulator import Emulator, fast, intconv, kpu

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


def cpu_model() -> str:
    """The CPU's model name (Linux /proc/cpuinfo), else what platform knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def timed(fn, frames):
    """(wall s, CPU s of this process's threads) per frame over `frames` calls, and the calling
    thread's CPU s of the fastest frame (all of a 1-thread variant's work: the emulator's bands
    and onnxruntime with one intra-op thread run in the caller). On a shared machine the fastest
    frame is the least disturbed by other work (no time slices lost, caches least evicted)."""
    t, c = time.perf_counter(), time.process_time()
    best = float("inf")
    for _ in range(frames):
        f = time.thread_time()
        fn()
        best = min(best, time.thread_time() - f)
    return (time.perf_counter() - t) / frames, (time.process_time() - c) / frames, best


def sums_kind() -> str:
    """Which exact integer sums this machine's emulator takes (intconv.py)."""
    if not intconv.available():
        return "OFF: float BLAS"
    if intconv.u8s8_exact():
        return "uint8 x int8 MatMulInteger, exact on this CPU (as with VNNI)"
    return "uint8 x uint8 ConvInteger: this CPU's uint8 x int8 product is not exact (no VNNI)"


def ort_session(model, threads):
    """onnxruntime session and feeds for the model's float twin, or None without onnxruntime."""
    try:
        import onnxruntime as ort
    except ImportError:
        return None
    twin, inputs = float_twin(model)
    feeds = {i.name: np.random.default_rng(1).random(
        [d.dim_value for d in i.type.tensor_type.shape.dim], dtype=np.float32) for i in inputs}
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    # idle intra-op workers would spin on after each run, taking the second core from whatever
    # runs next (the emulator's 1-thread frames: 25-35 % slower on 2 cores, inflating both
    # emu/ort and 2t/1t); they block instead
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    sess = ort.InferenceSession(twin.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return lambda: sess.run(None, feeds)


def banded_share(model, emu1, emu2, x):
    """Share of the 1-thread CPU time spent in layers that have several row bands with 2
    threads (what the band threads can split)."""
    def cpu(fn, n=5):
        fn()
        return float(np.median([timed(fn, 1)[1] for _ in range(n)]))
    total = cpu(lambda: emu1.run(x))
    banded = 0.0
    for it in model.items:
        if it.conv is not None and len(emu2.prepared[id(it)].bands) > 1:
            xi = np.random.default_rng(2).integers(0, 256, it.conv.in_shape).astype(np.uint8)
            banded += cpu(lambda: emu1.prepared[id(it)](xi))
    return min(banded / total, 1.0)


def bench_model(model, frames, runs, ort):
    emus = {t: Emulator(model, threads=t) for t in (1, 2)}
    shape, dtype = emus[1].input_spec()
    x = np.random.default_rng(1).integers(0, 256, shape).astype(np.uint8)
    if dtype == np.float32:
        x = x.astype(np.float32) / 255
    fns = {f"emu_{t}t": (lambda e=e: e.run(x)) for t, e in emus.items()}
    # 2 frames at once: one call runs the whole run's frames (its 1-thread copies are made on
    # the warm-up call below)
    fns["emu_frames_2t"] = lambda: emus[1].run_frames([x] * frames, threads=2)
    row = {}
    t = time.perf_counter()
    emus[1].run(x)
    row["warmup_s"] = round(time.perf_counter() - t, 2)       # JIT / cache load
    for _ in range(2 * kpu.TRIALS + 1):                          # the thread trials
        emus[2].run(x)
    if ort:
        for t in (1, 2):
            f = ort_session(model, t)
            if f is not None:
                fns[f"ort_{t}t"] = f
    for f in fns.values():
        f()
    wall = {k: [] for k in fns}
    cpu = {k: [] for k in fns}
    best = {k: float("inf") for k in fns}
    for _ in range(runs):           # interleaved: every variant once per run, back to back
        for k, f in fns.items():
            if k == "emu_frames_2t":
                w, c, _ = timed(f, 1)
                w, c, b = w / frames, c / frames, float("inf")
            else:
                w, c, b = timed(f, frames)
            wall[k].append(w)
            cpu[k].append(c)
            best[k] = min(best[k], b)
    med = lambda v: float(np.median(v))   # noqa: E731
    for k in fns:
        row[f"{k}_fps"] = round(1 / med(wall[k]), 1)
        row[f"{k}_cpu_ms"] = round(1000 * med(cpu[k]), 2)
    ratio = lambda a, b, d=wall: round(med(np.divide(d[a], d[b])), 2)   # noqa: E731
    if "ort_1t" in fns:
        row["emu_over_ort_1t"] = ratio("emu_1t", "ort_1t")          # time ratio, same run
        row["emu_over_ort_1t_cpu"] = ratio("emu_1t", "ort_1t", cpu)
        row["emu_over_ort_1t_best"] = round(best["emu_1t"] / best["ort_1t"], 2)   # fastest frames
    row["speedup_2t_over_1t"] = ratio("emu_1t", "emu_2t")
    row["frames_speedup_2t_over_1t"] = ratio("emu_1t", "emu_frames_2t")
    if "ort_2t" in fns:
        row["ort_speedup_2t_over_1t"] = ratio("ort_1t", "ort_2t")
    multi = [p for p in emus[2].prepared.values() if len(p.bands) > 1]
    row["threads_kept"] = f"{sum(p.parallel for p in multi)}/{len(multi)}"
    row["banded_share"] = round(banded_share(model, emus[1], emus[2], x), 3)
    fused = [p.use_fast for p in emus[1].prepared.values()]
    row["fused_layers"] = f"{sum(fused)}/{len(fused)}"
    normal = [p for p in emus[1].prepared.values() if not p.depthwise]
    row["int_sums"] = f"{sum(p.int_sums is not None for p in normal)}/{len(normal)}"
    return row


def main():
    nan = float("nan")
    ap = argparse.ArgumentParser()
    ap.add_argument("--frames", type=int, default=60, help="frames per timed run")
    ap.add_argument("--runs", type=int, default=5, help="timed runs (the median is reported)")
    ap.add_argument("--models", nargs="*", help="subset of model names")
    ap.add_argument("--no-ort", action="store_true", help="skip the onnxruntime float twins")
    ap.add_argument("--json", default=str(REPO / "bench" / "results" / "emulator.json"))
    args = ap.parse_args()
    from threadpoolctl import threadpool_limits
    cpu, load = cpu_model(), os.getloadavg()
    print(f"CPU: {cpu}, {os.cpu_count()} CPUs ({len(os.sched_getaffinity(0))} usable), load "
          f"average {load[0]:.1f} at the start; integer sums: {sums_kind()}", flush=True)
    rows = []
    for name, folder in MODELS:
        if args.models and name not in args.models:
            continue
        path = folder / f"{name}.kmodel"
        if not path.exists():
            print(f"skip {name}: {path} missing")
            continue
        model = kmodel.load(path)
        with threadpool_limits(1):  # our band threads are the only parallelism
            row = {"model": name, "kmodel": f"v{model.version}", "bytes": path.stat().st_size,
                   **bench_model(model, args.frames, args.runs, not args.no_ort)}
        rows.append(row)
        print(f"  {name}: emulator/onnxruntime {row.get('emu_over_ort_1t', nan)}x (fastest frames "
              f"{row.get('emu_over_ort_1t_best', nan)}x), 2t/1t "
              f"{row['speedup_2t_over_1t']}x, frames 2t/1t {row['frames_speedup_2t_over_1t']}x",
              flush=True)
    load_end = os.getloadavg()
    cols = [("model", "model", 28, "s"), ("kmodel", "kmodel", 6, "s"),
            ("emu/ort 1t", "emu_over_ort_1t", 10, ".2f"), ("(CPU)", "emu_over_ort_1t_cpu", 6, ".2f"),
            ("(best)", "emu_over_ort_1t_best", 6, ".2f"),
            ("emu 2t/1t", "speedup_2t_over_1t", 9, ".2f"),
            ("frames 2t/1t", "frames_speedup_2t_over_1t", 12, ".2f"),
            ("threads kept", "threads_kept", 12, "s"),
            ("banded", "banded_share", 7, ".0%"), ("emu fps 1t", "emu_1t_fps", 10, ".1f"),
            ("2t", "emu_2t_fps", 6, ".1f"), ("ort fps 1t", "ort_1t_fps", 10, ".1f"),
            ("ort 2t/1t", "ort_speedup_2t_over_1t", 9, ".2f"), ("emu CPU ms", "emu_1t_cpu_ms", 10, ".1f"),
            ("fused", "fused_layers", 6, "s"), ("int sums", "int_sums", 8, "s"),
            ("warm-up s", "warmup_s", 9, ".2f")]
    print("\n" + " ".join(f"{h:>{w}}" if i else f"{h:{w}}" for i, (h, _, w, _) in enumerate(cols)))
    for r in rows:
        print(" ".join(format(r.get(k, nan if f != "s" else "-"), (">" if i else "<") + f"{w}{f}")
                       for i, (_, k, w, f) in enumerate(cols)))
    print(f"(ratios: medians over {args.runs} runs of the per-run time ratio, each run {args.frames} "
          f"frames of every variant back to back; emu/ort = emulator time / onnxruntime float "
          f"twin time, 1 thread each (CPU: the same in CPU time; best: the fastest frame's thread "
          f"CPU time of each, the figure least disturbed by other work); 2t/1t = speed-up of 2 band "
          f"threads within each frame; frames 2t/1t = speed-up of 2 frames at once "
          f"(Emulator.run_frames, each on a 1-thread copy) over 1 emulator running them in turn; "
          f"threads kept = multi-band layers whose measured trials kept 2 threads; int "
          f"sums = normal convs summed by onnxruntime's exact integer ops "
          f"({sums_kind()}); numba "
          f"{'on' if fast.available() else 'OFF (the slower pure numpy path)'}; fps are this "
          f"machine's only: {cpu}, {os.cpu_count()} CPUs, load average {load[0]:.1f} -> "
          f"{load_end[0]:.1f})")
    meta = {"cpu": cpu, "cpu_count": os.cpu_count(), "affinity": len(os.sched_getaffinity(0)),
            "frames": args.frames, "runs": args.runs, "numpy": np.__version__,
            "numba": fast.available(), "int_sums": intconv.available(),
            "u8s8_exact": intconv.u8s8_exact(), "load_avg_start": load,
            "load_avg_end": load_end}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()

"""TF-free lowering tests: hand-made ONNX graphs compiled to kmodels, run on the bit-exact
emulator and compared with onnxruntime on the same float input."""
import numpy as np
from onnx import helper

from front_helpers import make_model, ort_run  # noqa: F401  (re-exported for the tests)
from tl2k210.graph import from_onnx
from tl2k210.k210.emulator import Emulator
from tl2k210.k210.kmodel import v4
from tl2k210.k210.lower import Options, lower
from tl2k210.k210.flow import run_pipeline
from tl2k210.quantize import calibrate
from tl2k210.quantize.metrics import sqnr_db

RNG = np.random.default_rng(7)


def pixels(n, c, h, w, seed=0):
    """Smooth random images (uint8 CHW): sums of a few 2-D sinusoids, like camera content."""
    r = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w]
    out = np.zeros((n, c, h, w))
    for _ in range(4):
        fy, fx, ph = r.uniform(0.02, 0.3, 2).tolist() + [r.uniform(0, 6.3)]
        out += r.uniform(0.3, 1.0, (n, c, 1, 1)) * np.sin(fy * yy + fx * xx + ph + r.uniform(0, 6, (n, c, 1, 1)))
    out += r.normal(0, 0.15, out.shape)
    lo, hi = out.min(axis=(1, 2, 3), keepdims=True), out.max(axis=(1, 2, 3), keepdims=True)
    return np.clip((out - lo) / (hi - lo) * 255, 0, 255).astype(np.uint8)


def conv_node(name, x, w, b=None, **attrs):
    return helper.make_node("Conv", [x, w] + ([b] if b else []), [name], name=name, **attrs)


def compile_model(model, px, calib=None, passes=None, **opts):
    """(kmodel, rows, lowering, pipeline graph) for an ONNX image model; `px` (N, C, H, W) uint8
    pixels calibrate it (float input = pixels / 255); `passes`: run_pipeline's pass options."""
    g, rng = calibrated(model, px if calib is None else calib, passes)
    kmodel, rows, _, lw = lower(g, rng, Options(**opts))
    assert kmodel.version == 3 or v4.overlapping_io(kmodel) == []     # docs/kmodel-format.md#v4-interpreter
    return kmodel, rows, lw, g


def calibrated(model, px, passes=None):
    """(pipeline graph, minmax ranges) of an ONNX image model on pixels (float input = px / 255)."""
    g, _ = run_pipeline(from_onnx(model), passes)
    batches = [(p[None] / 255.0).astype(np.float32) for p in px]
    return g, calibrate.ranges(calibrate.collect(g, batches, histograms=False), "minmax")


def run_both(model, kmodel, px):
    """(float reference outputs, emulator outputs) over pixel images, flattened per sample."""
    emu = Emulator(kmodel)
    ref = np.stack([ort_run(model, (p[None] / 255.0).astype(np.float32))[0].reshape(-1) for p in px])
    got = np.stack([emu.run(p)[0].reshape(-1) for p in px])
    return ref, got


def sqnr(model, kmodel, px):
    ref, got = run_both(model, kmodel, px)
    return sqnr_db(ref.reshape(-1).astype(np.float64), got.reshape(-1).astype(np.float64))


def kpu_outputs(kmodel, px):
    """Every layer's output for each image (emulator traces): [[array per layer] per image]."""
    emu = Emulator(kmodel)
    return [[a for _, a in emu.run(p, trace=True)[1]] for p in px]


def light_zoo(name, seed=0):
    """An architecture from the onnx wheel's backend test data (`light_<name>.onnx`), whose
    weights are constant fills, with seeded He-initialised weights so outputs mean something."""
    from pathlib import Path

    import onnx
    import pytest
    from onnx import numpy_helper
    path = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light" / f"light_{name}.onnx"
    if not path.exists():
        pytest.skip(f"{path} not in this onnx wheel")
    m = onnx.load(path)
    rng = np.random.default_rng(seed)
    shapes = {n.output[0]: n for n in m.graph.node if n.op_type == "ConstantOfShape"}
    inits = {i.name: i for i in m.graph.initializer}
    keep, weights = [], {}
    for n in m.graph.node:
        if n.op_type in ("Conv", "Gemm") and len(n.input) > 1:
            for k, t in enumerate(n.input[1:3]):
                src = shapes.get(t)
                dims = None if src is None else numpy_helper.to_array(inits[src.input[0]]) \
                    if src.input[0] in inits else None
                if dims is None:
                    continue
                dims = tuple(int(d) for d in dims)
                fan_in = int(np.prod(dims[1:])) if len(dims) > 1 else 1
                v = rng.normal(0, np.sqrt(2.0 / fan_in), dims) if k == 0 else rng.normal(0, 0.05, dims)
                weights[t] = numpy_helper.from_array(v.astype(np.float32), t)
    for n in m.graph.node:
        if not (n.op_type == "ConstantOfShape" and n.output[0] in weights):
            keep.append(n)
    del m.graph.node[:]
    m.graph.node.extend(keep)
    used = {i for n in keep for i in n.input}
    live = [i for i in m.graph.initializer if i.name in used]
    del m.graph.initializer[:]
    m.graph.initializer.extend(live + list(weights.values()))
    ins = [i for i in m.graph.input if i.name in used or i.name not in inits]
    del m.graph.input[:]
    m.graph.input.extend(ins)
    return m

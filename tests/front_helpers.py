"""Shared helpers for the front-half tests (tiny ONNX graphs, cached TF conversions, testdata)."""
import functools

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import REPO  # noqa: F401  (re-exported)
from tl2k210 import paths

TESTDATA = paths.testdata_dir()
RNG = np.random.default_rng(0)


def need_testdata(rel):
    p = TESTDATA / rel
    if not p.exists():
        pytest.skip(f"test data {p} not found (set TL2K210_TESTDATA)")
    return p


def make_model(nodes, inputs, outputs, inits=(), opset=13):
    """inputs/outputs: [(name, shape)]; inits: {name: array}."""
    g = helper.make_graph(
        nodes, "t",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outputs],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in dict(inits).items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8

    return m


def ort_run(model, x):
    import onnxruntime as ort
    s = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return s.run(None, {s.get_inputs()[0].name: x})


def rand(*shape, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


@functools.lru_cache(maxsize=None)
def tf():
    import tensorflow
    return tensorflow


def noise_photos(folder, h, w, rng, n=8):
    """`folder` (made) holding n PNG photos of uniform RGB noise h x w drawn from `rng`."""
    from PIL import Image
    folder.mkdir()
    for i in range(n):
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(folder / f"{i}.png")
    return folder

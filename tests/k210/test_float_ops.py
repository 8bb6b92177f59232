"""Softmax (any axis, many short vectors), log-softmax, sigmoid and exp as CPU float ops: the
kmodel on the emulator agrees with onnxruntime to float32 rounding on random tensors with large
ranges, and never gives NaN. The (4420, 2) scores head of a face detector is the short-vector case."""
import numpy as np
import pytest
from onnx import helper

from front_helpers import make_model, ort_run
from tl2k210.compiler import ConvertOptions, convert
from tl2k210.k210.emulator import Emulator

pytest.importorskip("onnxruntime")
TINY = float(np.finfo(np.float32).tiny)      # below it float32 is denormal: compare absolutely
CASES = [("Softmax", (1, 4420, 2), 2), ("Softmax", (1, 4420, 2), 1), ("Softmax", (1, 2, 4420), 1),
         ("Softmax", (1, 10), 1), ("Softmax", (1, 35, 7), 1), ("Softmax", (1, 35, 7), -1),
         ("LogSoftmax", (1, 10), 1), ("LogSoftmax", (1, 100, 3), 2), ("LogSoftmax", (1, 3, 100), 1),
         ("Sigmoid", (1, 100, 3), None), ("Sigmoid", (1, 50), None), ("Exp", (1, 100, 3), None)]


@pytest.mark.parametrize("op,shape,axis", CASES, ids=lambda v: str(v))
def test_cpu_float_op_matches_onnxruntime(op, shape, axis, tmp_path):
    rng = np.random.default_rng(3)
    scale = 5.0 if op == "Exp" else 60.0         # exp(x) of N(0, 5) spans 1e-10 .. 1e10
    m = make_model([helper.make_node(op, ["x"], ["y"], **({} if axis is None else {"axis": axis}))],
                   [("x", list(shape))], [("y", list(shape))])
    np.save(tmp_path / "d.npy", (rng.standard_normal((8, *shape[1:])) * scale).astype(np.float32))
    receipt = convert(m, tmp_path / "m.kmodel", ConvertOptions(dataset=str(tmp_path / "d.npy"), progress=False))
    out = receipt.totals["outputs"]["y"]
    assert out["sqnr_db"] > 100 if out["sqnr_db"] is not None else out["sqnr_note"].startswith("exact")
    emu = Emulator.load(tmp_path / "m.kmodel")
    for _ in range(3):
        x = (rng.standard_normal(shape) * scale).astype(np.float32)
        ref = ort_run(m, x)[0]
        got = np.asarray(emu.run(x.reshape(-1))[0], np.float32).reshape(ref.shape)
        assert np.isfinite(got).all()
        if op == "Sigmoid":   # onnxruntime's logistic is an approximation (absolute error ~1e-7)
            np.testing.assert_allclose(got, ref, atol=1e-7)
            ref = (1 / (1 + np.exp(-x.astype(np.float64)))).astype(np.float32)
        np.testing.assert_allclose(got, ref, rtol=2e-6, atol=TINY)
        if op == "Softmax":
            np.testing.assert_allclose(got.sum(axis=axis), 1, rtol=1e-5)

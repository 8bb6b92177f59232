"""Convs with unequal strides (ARM's KWS CNN / DS-CNN: a 10x4 conv with strides (2, 1) on the
MFCCs), which no KPU layer runs: pass unequal_strides makes them the KPU conv at equal strides and
a strided slice. Exact in float, the kmodel against onnxruntime, the 8-bit ideal that of the
source graph, and off where the plan wants the small form (FAST_FORMS)."""
import numpy as np
import pytest
from onnx import helper

from front_helpers import make_model, ort_run
from lower_helpers import compile_model, conv_node, pixels
from tl2k210.graph import from_onnx, run
from tl2k210.k210.flow import run_pipeline
from tl2k210.k210.ideal import ideal
from tl2k210.quantize.metrics import sqnr_db

pytest.importorskip("onnxruntime")
RNG = np.random.default_rng(50)


def _model(kernel, strides, pads, c_in=3, c_out=8, h=49, w=20):
    w1 = (RNG.standard_normal((c_out, c_in, *kernel)) * 0.3).astype(np.float32)
    w2 = (RNG.standard_normal((4, c_out, 3, 3)) * 0.3).astype(np.float32)
    nodes = [conv_node("c", "x", "w1", "b1", kernel_shape=list(kernel), strides=list(strides), pads=pads),
             helper.make_node("Relu", ["c"], ["r"]), conv_node("y", "r", "w2", pads=[1, 1, 1, 1])]
    return make_model(nodes, [("x", [1, c_in, h, w])], [("y", None)],
                      {"w1": w1, "b1": (RNG.standard_normal(c_out) * 0.1).astype(np.float32), "w2": w2})


CASES = [((10, 4), (2, 1), [4, 1, 5, 2]),      # DS-CNN's first conv (TF SAME)
         ((3, 3), (1, 2), [1, 1, 1, 1]),
         ((5, 3), (3, 1), [0, 0, 0, 0]),       # VALID, rows every 3rd
         ((3, 3), (4, 2), [1, 1, 1, 1])]       # the KPU conv at (2, 2), then every 2nd row


@pytest.mark.parametrize("kernel,strides,pads", CASES)
def test_the_kpu_conv_and_a_strided_slice_are_the_conv(kernel, strides, pads):
    m = _model(kernel, strides, pads)
    g, log = run_pipeline(from_onnx(m))
    conv = next(n for n in g.nodes if n.name == "c")
    m_ = min(strides)
    assert tuple(conv.attrs["strides"]) == (m_, m_) and any(n.op == "Slice" for n in g.nodes)
    x = pixels(1, 3, 49, 20)[0][None].astype(np.float32) / 255
    np.testing.assert_allclose(run(g, x)["y"], ort_run(m, x)[0], rtol=1e-4, atol=1e-4)
    src, _ = run_pipeline(from_onnx(m), {"unequal_strides": False})
    assert ideal(g).live_bytes == ideal(src).live_bytes       # the ideal is the source graph's


def test_the_kmodel_runs_the_conv_on_the_kpu_and_agrees_with_onnxruntime():
    from tl2k210.k210.emulator import Emulator
    m = _model((10, 4), (2, 1), [4, 1, 5, 2])
    px = pixels(6, 3, 49, 20)
    model, rows, lw, g = compile_model(m, px, format="v4")
    assert [r.unit for r in rows if r.node == "c"] == ["KPU"]
    emu = Emulator(model)
    for p in px[:3]:
        want = ort_run(m, p[None].astype(np.float32) / 255)[0]
        got = np.asarray(emu.run(p)[0]).reshape(want.shape)
        assert sqnr_db(want, got) > 30


def test_the_small_form_keeps_the_cpu_conv():
    g, _ = run_pipeline(from_onnx(_model((10, 4), (2, 1), [4, 1, 5, 2])), {"unequal_strides": False})
    assert [tuple(n.attrs["strides"]) for n in g.nodes if n.name == "c"] == [(2, 1)]
    assert not any(n.op == "Slice" for n in g.nodes)

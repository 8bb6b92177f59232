"""Linear Resize by a rational factor that no resize_image plan samples (half_pixel 0.8, 1.5,
5/3; Keras' Resizing, TF2's resize to a fixed size) in uint8 phases (lower/v4phases.py): the
plan reproduces ONNX's interpolation matrix on every output, the kmodel follows onnxruntime, and
the resize itself is within one step of the uint8 grid of the exact interpolation of its input.
And a float resize_image (align_corners) in channel slices where the whole map would not keep
main memory near the live set."""
import numpy as np
import pytest
from onnx import helper

from front_helpers import make_model, ort_run
from tl2k210.compiler import ConvertOptions, convert
from tl2k210.k210.emulator import Emulator
from tl2k210.k210.lower.v4phases import axis_phases
from tl2k210.k210.lower.v4resize import onnx_linear_matrix
from tl2k210.quantize.metrics import sqnr_db

pytest.importorskip("onnxruntime")
N = helper.make_node
RNG = np.random.default_rng(491)


@pytest.mark.parametrize("cmode,n,m,q", [("half_pixel", 120, 96, 4), ("half_pixel", 20, 30, 3),
                                         ("half_pixel", 24, 40, 5), ("asymmetric", 30, 20, 2),
                                         ("pytorch_half_pixel", 10, 25, 5), ("half_pixel", 16, 32, 2)])
def test_phase_plans_are_onnx_interpolation(cmode, n, m, q):
    ph = axis_phases(cmode, n, m, m / n)
    assert ph is not None and ph.q == q
    np.testing.assert_allclose(ph.matrix(n, m), onnx_linear_matrix(cmode, n, m, m / n), atol=1e-3)
    scale32 = float(np.float32(m / n))                # a scales input in float32 (tf2onnx's)
    assert axis_phases(cmode, n, m, scale32) == ph


def test_no_plan_past_the_phase_limit():
    assert axis_phases("half_pixel", 33, 257, 257 / 33) is None      # DeepLab's logits: the float matmul


def resize_model(h, w, oh, ow, cmode="half_pixel"):
    nodes = [N("Conv", ["x", "w1", "b1"], ["a"], pads=[1, 1, 1, 1]), N("Relu", ["a"], ["r"]),
             N("Resize", ["r", "", "", "sizes"], ["z"], mode="linear", coordinate_transformation_mode=cmode),
             N("Conv", ["z", "w2"], ["y"])]
    inits = {"w1": (RNG.standard_normal((6, 3, 3, 3)) / 3).astype(np.float32),
             "b1": RNG.uniform(-0.1, 0.3, 6).astype(np.float32),
             "sizes": np.array([1, 6, oh, ow], np.int64),
             "w2": (RNG.standard_normal((4, 6, 1, 1)) / 2).astype(np.float32)}
    return make_model(nodes, [("x", [1, 3, h, w])], [("y", [1, 4, oh, ow])], inits, opset=13)


@pytest.mark.parametrize("size", [(24, 32, 20, 24), (24, 30, 20, 25), (12, 16, 20, 20)])   # x0.8, x5/6, x5/3 and x5/4
def test_rational_resize_converts_in_uint8_phases(size, tmp_path):
    h, w, oh, ow = size
    m = resize_model(h, w, oh, ow)
    data = RNG.integers(0, 256, (8, 3, h, w)).astype(np.uint8)
    np.save(tmp_path / "d.npy", data)
    rep = convert(m, tmp_path / "m.kmodel", ConvertOptions(dataset=str(tmp_path / "d.npy"), progress=False,
                                                           min_sqnr=0, runtime="sdk"))
    rows = [r for r in rep.layers if r["op"] == "Resize"]
    assert len(rows) == 1 and "uint8 phases" in rows[0]["why"], rows
    emu = Emulator.load(tmp_path / "m.kmodel")
    a_h, a_w = (onnx_linear_matrix("half_pixel", n, o, o / n) for n, o in ((h, oh), (w, ow)))
    for x in data[:3]:
        want = ort_run(m, x[None].astype(np.float32) / 255)[0].astype(np.float64)
        outs, trace = emu.run(x.reshape(-1), trace=True)
        got = np.asarray(outs[0], np.float64).reshape(want.shape)
        assert sqnr_db(want, got) > 32
        # the resize alone, on its own uint8 codes (the output keeps the input's quantization):
        # two roundings, one an axis, so within one step of the exact interpolation
        codes = next(a for where, a in trace if "kpu_conv2d" in where).reshape(6, h, w).astype(np.float64)
        resized = [a for where, a in trace if "concat" in where][-1].reshape(6, oh, ow)
        exact = np.einsum("oh,chw,pw->cop", a_h, codes, a_w)
        assert np.abs(resized - exact).max() <= 1 + 1e-9


def test_float_resize_runs_in_channel_slices_within_the_main_memory_target(tmp_path):
    """A bilinear align_corners upsampling (a PyTorch U-Net's F.interpolate) stays a float
    resize_image, but a slice of channels at a time, quantized into its uint8 output, where the
    whole float map would take main memory past 1.25x the live set (round 49's never-seen U-Net:
    1,622,016 B, 1.83x, before)."""
    h = w = 32
    nodes = [N("Conv", ["x", "w1", "b1"], ["a"], pads=[1, 1, 1, 1]), N("Relu", ["a"], ["r"]),
             N("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             N("Conv", ["p", "w2", "b2"], ["q"], pads=[1, 1, 1, 1]), N("Relu", ["q"], ["rq"]),
             N("Resize", ["rq", "", "", "sizes"], ["up"], mode="linear",
               coordinate_transformation_mode="align_corners"),
             N("Concat", ["up", "r"], ["cat"], axis=1), N("Conv", ["cat", "w3"], ["y"], pads=[1, 1, 1, 1])]
    inits = {"w1": (RNG.standard_normal((16, 3, 3, 3)) / 3).astype(np.float32),
             "b1": RNG.uniform(-0.1, 0.3, 16).astype(np.float32),
             "w2": (RNG.standard_normal((32, 16, 3, 3)) / 8).astype(np.float32),
             "b2": RNG.uniform(-0.1, 0.3, 32).astype(np.float32),
             "sizes": np.array([1, 32, h, w], np.int64),
             "w3": (RNG.standard_normal((2, 48, 3, 3)) / 10).astype(np.float32)}
    m = make_model(nodes, [("x", [1, 3, h, w])], [("y", [1, 2, h, w])], inits, opset=13)
    data = RNG.integers(0, 256, (8, 3, h, w)).astype(np.uint8)
    np.save(tmp_path / "d.npy", data)
    rep = convert(m, tmp_path / "m.kmodel", ConvertOptions(dataset=str(tmp_path / "d.npy"), progress=False,
                                                           min_sqnr=0, runtime="sdk"))
    row = next(r for r in rep.layers if r["op"] == "Resize")
    assert "at a time" in " ".join(row["notes"]), row
    assert rep.main_memory <= 1.25 * rep.ideal["live_bytes"]
    emu = Emulator.load(tmp_path / "m.kmodel")
    for x in data[:3]:
        want = ort_run(m, x[None].astype(np.float32) / 255)[0].astype(np.float64)
        got = np.asarray(emu.run(x.reshape(-1))[0], np.float64).reshape(want.shape)
        assert sqnr_db(want, got) > 30

"""CenterNet's peak trick, heat * Cast(MaxPool3x3(heat) == heat), TF-free (round 48's
centernet96 of never-seen set 4): the equal_mask pass computes the Equal as 1 - Sign(|a - b|),
exact in float against onnxruntime (ties included), also read through Where(eq, x, 0), and the
model compiles and runs on the emulator."""
import numpy as np
import pytest
from onnx import helper

from front_helpers import make_model, ort_run
from tl2k210.compiler import ConvertOptions, convert
from tl2k210.graph import from_onnx, run
from tl2k210.k210.emulator import Emulator
from tl2k210.k210.flow import run_pass
from tl2k210.quantize.metrics import sqnr_db

pytest.importorskip("onnxruntime")
N = helper.make_node
RNG = np.random.default_rng(48)


def peak_model(reader="Cast"):
    nodes = [N("Conv", ["x", "w", "b"], ["logits"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             N("Sigmoid", ["logits"], ["heat"]),
             N("MaxPool", ["heat"], ["peak"], kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1]),
             N("Equal", ["peak", "heat"], ["is_peak"], name="equal")]
    if reader == "Cast":
        nodes += [N("Cast", ["is_peak"], ["keep"], to=1), N("Mul", ["heat", "keep"], ["y"])]
    elif reader == "Where":
        nodes += [N("Where", ["is_peak", "heat", "zero"], ["y"])]
    elif reader == "WhereNot":
        nodes += [N("Where", ["is_peak", "zero", "heat"], ["y"])]
    else:
        nodes += [N("Where", ["is_peak", "heat", "logits"], ["y"])]
    w = (RNG.standard_normal((4, 3, 3, 3)) * 0.5).astype(np.float32)
    return make_model(nodes, [("x", [1, 3, 16, 16])], [("y", [1, 4, 16, 16])],
                      {"w": w, "b": np.zeros(4, np.float32), "zero": np.zeros(1, np.float32)})


def test_equal_mask_is_exact_in_float_with_ties():
    m = peak_model()
    g, changes = run_pass("equal_mask", from_onnx(m))
    assert changes and not any(n.op in ("Equal", "Cast") for n in g.nodes)
    for k in range(3):
        x = RNG.standard_normal((1, 3, 16, 16)).astype(np.float32)
        if k:
            x = np.round(x * 2) / 2          # plateaus: equal neighbours, several 'peaks' per window
        got, want = run(g, x)["y"], ort_run(m, x)[0]
        np.testing.assert_array_equal(got != 0, want != 0)     # the same peaks kept
        np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize("reader", ["Where", "WhereNot"])
def test_where_of_the_peaks_and_zero_is_a_product(reader):
    m = peak_model(reader)
    g, changes = run_pass("equal_mask", from_onnx(m))
    assert changes and not any(n.op in ("Equal", "Where", "Cast") for n in g.nodes)
    x = np.round(RNG.standard_normal((1, 3, 16, 16)).astype(np.float32) * 2) / 2
    got, want = run(g, x)["y"], ort_run(m, x)[0]
    np.testing.assert_array_equal(got != 0, want != 0)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_equal_read_as_a_boolean_is_left_alone():
    g, changes = run_pass("equal_mask", from_onnx(peak_model("WhereMaps")))
    assert not changes and any(n.op == "Equal" for n in g.nodes)


def test_peak_trick_compiles_and_runs(tmp_path):
    """On the emulator, every clear peak (above its neighbours by 3 steps of the uint8 heatmap) is
    kept with its value, and every pixel clearly below its window's maximum is 0; near-ties may go
    either way (the quantized heatmap has plateaus the float one has not)."""
    m = peak_model()
    data = RNG.integers(0, 256, (8, 3, 16, 16)).astype(np.uint8)      # pixels: input range 0..1
    np.save(tmp_path / "d.npy", data)
    convert(m, tmp_path / "m.kmodel", ConvertOptions(dataset=str(tmp_path / "d.npy"), progress=False, min_sqnr=0))
    emu = Emulator.load(tmp_path / "m.kmodel")
    g = from_onnx(m)
    step = 3 / 255
    for x in data[:3]:
        heat = run(g, x[None].astype(np.float32) / 255, ["heat"])["heat"][0]
        pad = np.pad(heat, ((0, 0), (1, 1), (1, 1)), constant_values=-1)
        around = np.stack([pad[:, i:i + 16, j:j + 16] for i in range(3) for j in range(3) if (i, j) != (1, 1)])
        neighbours = around.max(0)
        got = np.asarray(emu.run(x.reshape(-1))[0], np.float32).reshape(heat.shape)
        clear = heat > neighbours + step
        below = heat < neighbours - step
        assert clear.any() and below.any()
        assert (got[clear] != 0).all() and (got[below] == 0).all()
        assert sqnr_db(heat[clear].astype(np.float64), got[clear].astype(np.float64)) > 30

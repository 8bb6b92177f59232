"""A nearest Resize of any size ratio as a gather of rows and columns (v4gather: strided_slice +
concat, no weights): on the uint8 pixels of the input the kmodel's output is onnxruntime's
Resize of the same pixels, every coordinate_transformation_mode with a formula and every
nearest_mode, at sizes no resize_image plan samples (18 -> 20, 96 -> 33, non-square)."""
import numpy as np
import pytest
from onnx import helper

from lower_helpers import compile_model, make_model, pixels, run_both
import v4_reference as ref
from tl2k210.k210 import kmodel
from tl2k210.k210.emulator import Emulator
from tl2k210.k210.lower.v4gather import runs

pytest.importorskip("onnxruntime")
CMODES = ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric", "tf_half_pixel_for_nn",
          "half_pixel_symmetric"]
NMODES = ["floor", "ceil", "round_prefer_floor", "round_prefer_ceil"]
SIZES = [((18, 18), (20, 20)), ((20, 20), (18, 18)), ((7, 7), (12, 12)), ((96, 96), (33, 33)),
         ((9, 14), (13, 5))]


def _resize(x, y, hw, out, cmode, nmode, by, c):
    """The Resize node and its size or scale input (by "scales": float32 out / in, as tf2onnx
    writes them: 18 -> 20 is 1.1111112, whose coordinates no resize_image plan samples)."""
    if by == "scales":
        sc = np.array([1, 1, *(np.float32(o) / np.float32(i) for i, o in zip(hw, out))], np.float32)
        if any(np.float64(v) * i < o for v, i, o in zip(sc[2:], hw, out)):
            pytest.skip("float32 out / in below out / in: ONNX's floor(in x scale) is out - 1, onnxruntime says out")
        ins, init = [x, "", "scales"], {"scales": sc}
    else:
        ins, init = [x, "", "", "sizes"], {"sizes": np.array([1, c, *out], np.int64)}
    return helper.make_node("Resize", ins, [y], mode="nearest", coordinate_transformation_mode=cmode,
                            nearest_mode=nmode), init


def _model(hw, out, cmode, nmode, by="sizes", c=3):
    opset = 19 if cmode == "half_pixel_symmetric" else 13     # tf_half_pixel_for_nn: before opset 19
    node, init = _resize("x", "y", hw, out, cmode, nmode, by, c)
    return make_model([node], [("x", [1, c, *hw])], [("y", [1, c, *out])], init, opset=opset)


def _noise(n, c, h, w, seed):
    """Random pixels: neighbouring rows and columns differ, so a wrong index shows."""
    return np.random.default_rng(seed).integers(0, 256, (n, c, h, w), dtype=np.uint8)


@pytest.mark.parametrize("cmode", CMODES)
@pytest.mark.parametrize("nmode", NMODES)
@pytest.mark.parametrize("hw,out", SIZES, ids=lambda v: "x".join(map(str, v)))
@pytest.mark.parametrize("by", ["sizes", "scales"])
def test_nearest_resize_is_onnxruntime_on_the_pixels(hw, out, cmode, nmode, by):
    m = _model(hw, out, cmode, nmode, by)
    px = _noise(3, 3, *hw, seed=hw[0] * 31 + out[1])
    model, rows, _, _ = compile_model(m, px, format="v4")
    back = kmodel.loads(kmodel.dumps(model))
    r = next(r for r in rows if r.op == "Resize")
    assert r.lowering in ("resize_gather", "resize_nearest_v4"), r.lowering
    want, got = run_both(m, back, px)
    # the same pixels, dequantized by the same scale: equal to float32 rounding (1/255 apart otherwise)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


@pytest.mark.parametrize("hw,out,cmode,by", [((18, 18), (20, 20), "tf_half_pixel_for_nn", "scales"),
                                              ((9, 14), (13, 5), "align_corners", "sizes")], ids=str)
def test_gather_on_a_uint8_map_bit_for_bit(hw, out, cmode, by):
    """After a conv (a uint8 map in main memory): each node matches the reference runner bit for
    bit, and the gather (not a resize_image) does the resize."""
    from lower_helpers import conv_node
    rng = np.random.default_rng(5)
    resize, init = _resize("r", "y", hw, out, cmode, "floor", by, 8)
    nodes = [conv_node("c", "x", "w0", "b0", pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["r"]), resize]
    m = make_model(nodes, [("x", [1, 3, *hw])], [("y", [1, 8, *out])],
                   {"w0": (rng.normal(size=(8, 3, 3, 3)) * 0.3).astype(np.float32),
                    "b0": (rng.normal(size=8) * 0.3).astype(np.float32), **init})
    px = pixels(3, 3, *hw, seed=2)
    model, rows, _, _ = compile_model(m, px, format="v4")
    back = kmodel.loads(kmodel.dumps(model))
    names = [nd.name for nd in back.nodes]
    assert "resize_image" not in names and "concat" in names and "strided_slice" in names, names
    assert next(r for r in rows if r.op == "Resize").lowering == "resize_gather"
    emu = Emulator(back)
    for p in px:
        assert ref.mismatches(emu, p) == [], names


def test_runs_of_consecutive_rows():
    assert runs([0, 1, 2, 2, 3, 5, 5]) == [(0, 3), (2, 2), (5, 1), (5, 1)]
    assert runs([]) == []

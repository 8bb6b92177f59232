"""Models saved after onnxruntime's graph optimizations (`optimized_model_filepath`, e.g.
OpenSeeFace's `*_opt.onnx`) hold com.microsoft FusedConv / FusedGemm: a Conv or Gemm with an
activation folded in. `repair` writes them back as the standard ops, exactly: onnxruntime runs the
fused file and the rewritten one to the same bits, and the rewritten one compiles. TF-free."""
import numpy as np
import onnx
import pytest
from onnx import helper

from front_helpers import make_model, ort_run
from tl2k210.compiler import ConvertOptions, convert
from tl2k210.frontends import check_onnx
from tl2k210.frontends.repair import repair
from tl2k210.k210.emulator import Emulator
from tl2k210.quantize.metrics import sqnr_db

pytest.importorskip("onnxruntime")
N = helper.make_node
MS = "com.microsoft"
RNG = np.random.default_rng(50)
ACTIVATIONS = [("Relu", []), ("LeakyRelu", [0.1]), ("Tanh", []), ("Sigmoid", []), ("Clip", [0.0, 6.0]),
               ("HardSigmoid", [0.2, 0.5]), ("", [])]


def _ms(model):
    model.opset_import.append(helper.make_opsetid(MS, 1))
    return model


def _conv_model(kind, params, z=False, opset=13):
    w = (RNG.standard_normal((8, 4, 3, 3)) * 0.3).astype(np.float32)
    b = (RNG.standard_normal(8) * 0.1).astype(np.float32)
    attrs = {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [1, 1]}
    if kind:
        attrs["activation"] = kind
    if params:
        attrs["activation_params"] = params
    ins = ["x", "w", "b"] + (["z"] if z else [])
    zconv = [N("Conv", ["x", "w2"], ["z"], kernel_shape=[1, 1])] if z else []   # Z: a map of y's shape
    nodes = zconv + [N("FusedConv", ins, ["y"], domain=MS, name="fused", **attrs)]
    inits = {"w": w, "b": b}
    if z:
        inits["w2"] = (RNG.standard_normal((8, 4, 1, 1)) * 0.3).astype(np.float32)
    return _ms(make_model(nodes, [("x", [1, 4, 16, 16])], [("y", [1, 8, 16, 16])], inits, opset=opset))


@pytest.mark.parametrize("kind,params", ACTIVATIONS, ids=[k or "none" for k, _ in ACTIVATIONS])
@pytest.mark.parametrize("z", [False, True], ids=["conv", "conv+sum"])
def test_fused_conv_is_the_conv_and_its_activation(kind, params, z):
    m = _conv_model(kind, params, z)
    fixed = repair(m)
    assert all(n.domain != MS for n in fixed.graph.node)
    onnx.checker.check_model(fixed)
    assert [n.op_type for n in m.graph.node][-1] == "FusedConv"      # a copy: the caller's model unchanged
    x = RNG.standard_normal((1, 4, 16, 16)).astype(np.float32)
    np.testing.assert_array_equal(ort_run(fixed, x)[0], ort_run(m, x)[0])


def test_clip_before_opset_11_takes_attributes():
    m = _conv_model("Clip", [0.0, 6.0], opset=9)
    fixed = repair(m)
    clip = next(n for n in fixed.graph.node if n.op_type == "Clip")
    assert len(clip.input) == 1 and {a.name for a in clip.attribute} == {"min", "max"}
    x = RNG.standard_normal((1, 4, 16, 16)).astype(np.float32) * 4
    np.testing.assert_array_equal(ort_run(fixed, x)[0], ort_run(m, x)[0])


def test_fused_gemm_is_the_gemm_and_its_activation():
    w = (RNG.standard_normal((10, 32)) * 0.3).astype(np.float32)
    b = (RNG.standard_normal(10) * 0.1).astype(np.float32)
    nodes = [N("Flatten", ["x"], ["f"]),
             N("FusedGemm", ["f", "w", "b"], ["y"], domain=MS, transB=1, alpha=0.5, beta=2.0,
               activation="LeakyRelu", activation_alpha=0.2)]
    m = _ms(make_model(nodes, [("x", [1, 2, 4, 4])], [("y", [1, 10])], {"w": w, "b": b}))
    fixed = repair(m)
    assert [n.op_type for n in fixed.graph.node] == ["Flatten", "Gemm", "LeakyRelu"]
    x = RNG.standard_normal((1, 2, 4, 4)).astype(np.float32)
    np.testing.assert_array_equal(ort_run(fixed, x)[0], ort_run(m, x)[0])


def test_an_unknown_fused_activation_is_refused_by_name():
    m = _conv_model("Softsign", [])
    assert repair(m).graph.node[-1].op_type == "FusedConv"           # left as it is ...
    from tl2k210.errors import UnsupportedOpError
    from tl2k210.graph import from_onnx
    with pytest.raises(UnsupportedOpError, match="'fused': op com.microsoft.FusedConv .* FusedConv and FusedGemm"):
        from_onnx(check_onnx(m, "m.onnx"))                           # ... and named


def test_a_fused_conv_model_compiles_to_the_kpu(tmp_path):
    m = _conv_model("Clip", [0.0, 6.0], z=True)
    data = RNG.integers(0, 256, (8, 4, 16, 16)).astype(np.uint8)     # pixels, NCHW: --input-range 0,1
    np.save(tmp_path / "d.npy", data)
    convert(m, tmp_path / "m.kmodel", ConvertOptions(dataset=str(tmp_path / "d.npy"), progress=False))
    emu = Emulator.load(tmp_path / "m.kmodel")
    for x in data[:3]:
        want = ort_run(m, x[None].astype(np.float32) / 255)[0]
        got = np.asarray(emu.run(x.reshape(-1))[0], np.float32).reshape(want.shape)
        assert sqnr_db(want, got) > 30

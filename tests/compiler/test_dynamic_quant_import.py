"""onnxruntime's `quantize_dynamic` form (DynamicQuantizeLinear -> ConvInteger / MatMulInteger ->
Cast -> Mul by x_scale * w_scale) read as the float model on the file's integer weights
(`tl2k210/qlinear.py` dynamic_to_float): the way ONNX users shrink a float model to int8 weights."""
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from front_helpers import ort_run
from tl2k210.errors import UnsupportedOpError
from tl2k210.graph import from_onnx
from tl2k210.qlinear import dynamic_to_float

RNG = np.random.default_rng(49)


def _dynamic_model(first="DynamicQuantizeLinear"):
    """x -> DQL -> ConvInteger 3x3 (int8 weights, zero point 1) -> Cast -> Mul -> Add bias
    -> Relu -> GlobalAveragePool -> Flatten -> DQL -> MatMulInteger -> Cast -> Mul -> Add."""
    c = {"w": RNG.integers(-127, 128, (4, 3, 3, 3)).astype(np.int8), "wz": np.int8(1),
         "ws": np.float32(0.01), "b": RNG.normal(0, 0.1, (1, 4, 1, 1)).astype(np.float32),
         "m": RNG.integers(0, 256, (4, 5)).astype(np.uint8), "mz": np.uint8(128), "ms": np.float32(0.02),
         "mb": RNG.normal(0, 0.1, 5).astype(np.float32)}
    q = [helper.make_node(first, ["x"], ["xq", "xs", "xz"])] if first == "DynamicQuantizeLinear" else \
        [helper.make_node("Cast", ["x"], ["xq"], to=TensorProto.UINT8),
         helper.make_node("Constant", [], ["xs"], value=numpy_helper.from_array(np.float32(1.0))),
         helper.make_node("Constant", [], ["xz"], value=numpy_helper.from_array(np.uint8(0)))]
    nodes = q + [
        helper.make_node("ConvInteger", ["xq", "w", "xz", "wz"], ["ci"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("Cast", ["ci"], ["cf"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["xs", "ws"], ["cs"]),
        helper.make_node("Mul", ["cf", "cs"], ["cm"]),
        helper.make_node("Add", ["cm", "b"], ["ca"]),
        helper.make_node("Relu", ["ca"], ["r"]),
        helper.make_node("GlobalAveragePool", ["r"], ["p"]),
        helper.make_node("Flatten", ["p"], ["f"], axis=1),
        helper.make_node("DynamicQuantizeLinear", ["f"], ["fq", "fs", "fz"]),
        helper.make_node("MatMulInteger", ["fq", "m", "fz", "mz"], ["mi"], name="matmul"),
        helper.make_node("Cast", ["mi"], ["mf"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["fs", "ms"], ["fms"]),
        helper.make_node("Mul", ["mf", "fms"], ["mm"]),
        helper.make_node("Add", ["mm", "mb"], ["y"])]
    g = helper.make_graph(nodes, "dyn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5])],
                          [numpy_helper.from_array(np.asarray(v), k) for k, v in c.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    return m, c


def _float_reference(x, c):
    w = (c["w"].astype(np.float32) - np.float32(c["wz"])) * c["ws"]
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    y = np.zeros((1, 4, 8, 8), np.float64)
    for i in range(8):
        for j in range(8):
            y[0, :, i, j] = np.tensordot(w, xp[0, :, i:i + 3, j:j + 3], 3)
    p = np.maximum(y + c["b"], 0).mean((2, 3))
    return p @ ((c["m"].astype(np.float64) - 128) * c["ms"]) + c["mb"]


def test_dynamic_quantized_model_is_its_float_model():
    """The rewritten model is the float model on the dequantized weights (exact but for float
    rounding); onnxruntime's own dynamic run differs only by its activation rounding."""
    m, c = _dynamic_model()
    x = RNG.uniform(0, 1, (1, 3, 8, 8)).astype(np.float32)
    f = dynamic_to_float(m)
    assert {"DynamicQuantizeLinear", "ConvInteger", "MatMulInteger"}.isdisjoint(n.op_type for n in f.graph.node)
    ref = _float_reference(x, c)
    np.testing.assert_allclose(ort_run(f, x)[0], ref, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(ort_run(m, x)[0], ref, atol=0.05 * np.abs(ref).max())
    g = from_onnx(m)
    assert not {"DynamicQuantizeLinear", "ConvInteger", "MatMulInteger"} & {n.op for n in g.nodes}


def test_integer_op_without_dynamic_quantize_is_refused_by_name():
    m, _ = _dynamic_model(first="Cast")
    with pytest.raises(UnsupportedOpError, match="'conv'.*ConvInteger.*quantize_dynamic.*convert the float model"):
        dynamic_to_float(m)

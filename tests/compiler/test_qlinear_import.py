"""onnxruntime's QOperator format (QLinearConv, com.microsoft QLinearAdd, ...) read as the QDQ model it
stands for (`tl2k210/qlinear.py`): nncase-era users quantize with onnxruntime's quantize_static."""
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from front_helpers import ort_run
from tl2k210.errors import UnsupportedOpError
from tl2k210.graph import from_onnx
from tl2k210.k210.flow import run_pass
from tl2k210.qlinear import to_qdq

RNG = np.random.default_rng(41)
MS = "com.microsoft"


def _qop_model(channels_last=0):
    """x -> Q -> QLinearConv 3x3 (per-channel int8 weights, int32 bias) -> a; QLinearConv 1x1 -> b;
    QLinearAdd(a, b) -> QLinearLeakyRelu -> QLinearConcat(., a) -> QLinearGlobalAveragePool ->
    Reshape -> QLinearMatMul -> QLinearSigmoid -> DQ."""
    c = {"xs": np.float32(0.02), "xz": np.uint8(128),
         "w1": RNG.integers(-127, 128, (4, 3, 3, 3)).astype(np.int8),
         "w1s": (RNG.uniform(0.5, 2, 4) * 0.004).astype(np.float32), "w1z": np.zeros(4, np.int8),
         "b1": RNG.integers(-400, 400, 4).astype(np.int32),
         "as": np.float32(0.03), "az": np.uint8(120),
         "w2": RNG.integers(-127, 128, (4, 4, 1, 1)).astype(np.int8), "w2s": np.float32(0.005), "w2z": np.int8(0),
         "bs": np.float32(0.025), "bz": np.uint8(130), "ss": np.float32(0.04), "sz": np.uint8(100),
         "ls": np.float32(0.035), "lz": np.uint8(90), "cs": np.float32(0.04), "cz": np.uint8(100),
         "ps": np.float32(0.02), "pz": np.uint8(110), "shape": np.array([1, 8], np.int64),
         "m": RNG.integers(0, 256, (8, 5)).astype(np.uint8), "ms": np.float32(0.01), "mz": np.uint8(128),
         "ys": np.float32(0.05), "yz": np.uint8(128), "gs": np.float32(1 / 256), "gz": np.uint8(0)}
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
             helper.make_node("QLinearConv", ["xq", "xs", "xz", "w1", "w1s", "w1z", "as", "az", "b1"], ["a"],
                              pads=[1, 1, 1, 1], name="conv1"),
             helper.make_node("QLinearConv", ["a", "as", "az", "w2", "w2s", "w2z", "bs", "bz"], ["b"], name="conv2"),
             helper.make_node("QLinearAdd", ["a", "as", "az", "b", "bs", "bz", "ss", "sz"], ["s"], domain=MS),
             helper.make_node("QLinearLeakyRelu", ["s", "ss", "sz", "ls", "lz"], ["l"], alpha=0.1, domain=MS),
             helper.make_node("QLinearConcat", ["cs", "cz", "l", "ls", "lz", "a", "as", "az"], ["c"], axis=1,
                              domain=MS),
             helper.make_node("QLinearGlobalAveragePool", ["c", "cs", "cz", "ps", "pz"], ["p"],
                              channels_last=channels_last, domain=MS, name="gap"),
             helper.make_node("Reshape", ["p", "shape"], ["pr"]),
             helper.make_node("QLinearMatMul", ["pr", "ps", "pz", "m", "ms", "mz", "ys", "yz"], ["mm"]),
             helper.make_node("QLinearSigmoid", ["mm", "ys", "yz", "gs", "gz"], ["g"], domain=MS),
             helper.make_node("DequantizeLinear", ["g", "gs", "gz"], ["y"])]
    g = helper.make_graph(nodes, "qop", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(np.asarray(v), k) for k, v in c.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid(MS, 1)])
    m.ir_version = 8
    return m


def _ort_plain(model, x):
    """onnxruntime without graph optimizations: DQ -> float op -> Q run as written (no QDQ fusion)."""
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    s = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return s.run(None, {"x": x})[0]


def test_qoperator_model_is_its_qdq_model():
    """Each QLinear op becomes DQ -> float op -> Q on its own scales: onnxruntime gives the same
    integers for both forms (a rounding tie may differ by one step), and tl2k210 reads the QDQ form
    into one float graph, the Q/DQ pairs gone."""
    m = _qop_model()
    x = RNG.uniform(-2.5, 2.5, (4, 1, 3, 8, 8)).astype(np.float32)
    qdq = to_qdq(m)
    assert not any(n.op_type.startswith("QLinear") for n in qdq.graph.node)
    assert any(n.op_type.startswith("QLinear") for n in m.graph.node)      # the caller's model is left as it is
    steps = np.concatenate([(ort_run(m, xi)[0] - _ort_plain(qdq, xi)).ravel() * 256 for xi in x])
    assert np.abs(steps).max() <= 1.001 and np.mean(np.abs(steps) > 0.5) < 0.1

    g, _ = run_pass("dequantize", from_onnx(m))
    assert sorted(g.op_counts()) == ["Add", "Concat", "Conv", "GlobalAveragePool", "LeakyRelu", "MatMul",
                                     "Reshape", "Sigmoid"]
    # the float graph: the weights and biases exactly as the integers give them
    w1 = np.asarray(g.const(next(n for n in g.nodes if n.op == "Conv").inputs[1]))
    c = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
    assert np.array_equal(w1, (c["w1"].astype(np.float64) * c["w1s"].reshape(4, 1, 1, 1)).astype(np.float32))
    b1 = np.asarray(g.const(next(n for n in g.nodes if n.op == "Conv").inputs[2]))
    assert np.array_equal(b1, (c["b1"] * np.float64(c["xs"]) * c["w1s"]).astype(np.float32))
    # each op's output range, as its y_scale and y_zero_point give it, is kept for calibration
    assert g.meta["quant_ranges"]["conv1/float"] == pytest.approx(((0 - 120) * 0.03, (255 - 120) * 0.03))
    assert g.meta["quant_ranges"]["conv2/float"] == pytest.approx(((0 - 130) * 0.025, (255 - 130) * 0.025))


def test_channels_last_quantized_pool_is_refused_by_name():
    with pytest.raises(UnsupportedOpError, match="'gap': QLinearGlobalAveragePool with channels_last=1"):
        from_onnx(_qop_model(channels_last=1))


@pytest.mark.parametrize("domain,op,says", [
    ("com.microsoft.extensions", "DecodeImage", "pre/post-processing .* runs on the host; convert the network as "
                                                "exported before"),
    (MS, "FusedConv", "of onnxruntime's com.microsoft ops the quantized QLinearAdd, QLinearMul"),
    ("onnx.brevitas", "Quant", "Brevitas / QONNX quantizers: export with QuantizeLinear/DequantizeLinear"),
    ("acme", "Frob", "only standard ONNX ops can be converted$")])
def test_custom_domain_refusal_says_what_to_do(domain, op, says):
    g = helper.make_graph([helper.make_node(op, ["x"], ["y"], domain=domain, name="n")], "c",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid(domain, 1)])
    with pytest.raises(UnsupportedOpError, match=f"node 'n': op {domain}.{op} is a custom-domain op; .*{says}"):
        from_onnx(m)


@pytest.mark.parametrize("float_out", [False, True])
def test_qgemm_and_quantized_softmax_are_their_qdq_form(float_out):
    """onnxruntime's QGemm (per-channel int8 B with transB, int32 bias; a float output without
    y_scale) and QLinearSoftmax: the same integers as their QDQ form, a float Gemm in tl2k210."""
    c = {"xs": np.float32(0.02), "xz": np.uint8(128), "b": RNG.integers(-127, 128, (6, 10)).astype(np.int8),
         "bs": (RNG.uniform(0.5, 2, 6) * 0.01).astype(np.float32), "bz": np.zeros(6, np.int8),
         "c": RNG.integers(-300, 300, 6).astype(np.int32), "ys": np.float32(0.05), "yz": np.uint8(128),
         "ss": np.float32(1 / 256), "sz": np.uint8(0)}
    gemm = ["xq", "xs", "xz", "b", "bs", "bz", "c"] + ([] if float_out else ["ys", "yz"])
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
             helper.make_node("QGemm", gemm, ["y" if float_out else "g"], transB=1, domain=MS, name="fc")]
    if not float_out:
        nodes += [helper.make_node("QLinearSoftmax", ["g", "ys", "yz", "ss", "sz"], ["s"], axis=-1, opset=13,
                                   domain=MS),
                  helper.make_node("DequantizeLinear", ["s", "ss", "sz"], ["y"])]
    g = helper.make_graph(nodes, "qgemm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 10])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(np.asarray(v), k) for k, v in c.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid(MS, 1)])
    m.ir_version = 8
    x = RNG.uniform(-2.5, 2.5, (8, 1, 10)).astype(np.float32)
    qdq = to_qdq(m)
    got = np.concatenate([_ort_plain(qdq, xi).ravel() for xi in x])
    ref = np.concatenate([ort_run(m, xi)[0].ravel() for xi in x])
    step = 1e-4 if float_out else 1 / 256        # float: onnxruntime's int32 sums times one scale
    assert np.abs(got - ref).max() <= step * 1.001
    graph, _ = run_pass("dequantize", from_onnx(m))
    assert sorted(graph.op_counts()) == (["Gemm"] if float_out else ["Gemm", "Softmax"])
    bias = np.asarray(graph.const(next(n for n in graph.nodes if n.op == "Gemm").inputs[2]))
    assert np.array_equal(bias, (c["c"] * np.float64(c["xs"]) * c["bs"]).astype(np.float32))

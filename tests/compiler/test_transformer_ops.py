"""What a small Vision Transformer exported by tf2onnx (tiny_vit64 of never-seen set 3) is made
of, TF-free, on hand-made ONNX graphs compiled and run on the emulator against onnxruntime:
Erfc (read as 1 - Erf), TFLite's GELU (mapped to ONNX ops), ReduceSumSquare over the batch axes,
a batch norm of computed statistics (LayerNormalization), Einsum with weights, attention's
batched MatMul, dense layers over many rows (tokens), Gemm with beta 0, 5-D transposes."""
import math

import numpy as np
import onnx
import pytest
from onnx import helper

from front_helpers import make_model, ort_run
from tl2k210.compiler import ConvertOptions, convert
from tl2k210.frontends import tflite_ops
from tl2k210.frontends.repair import repair
from tl2k210.k210.emulator import Emulator
from tl2k210.k210.lower.v4ops import compact_transpose
from tl2k210.quantize.metrics import sqnr_db

pytest.importorskip("onnxruntime")
N = helper.make_node
RNG = np.random.default_rng(47)
erf = np.vectorize(math.erf, otypes=[np.float64])
erfc = np.vectorize(math.erfc, otypes=[np.float64])


def emulate(m, shape, tmp_path, scale=1.0, samples=3, ref=None, **opts):
    """(receipt, [(reference, emulator output)]) of the model compiled on random float inputs;
    `ref(x)`: the reference where onnxruntime cannot run the model as written."""
    data = (RNG.standard_normal((8, *shape[1:])) * scale).astype(np.float32)
    np.save(tmp_path / "d.npy", data)
    r = convert(m, tmp_path / "m.kmodel", ConvertOptions(dataset=str(tmp_path / "d.npy"), progress=False,
                                                         min_sqnr=0, **opts))
    emu = Emulator.load(tmp_path / "m.kmodel")
    pairs = []
    for _ in range(samples):
        x = (RNG.standard_normal(shape) * scale).astype(np.float32)
        want = ref(x) if ref else ort_run(m, x)[0]
        got = np.asarray(emu.run(x.reshape(-1))[0], np.float32).reshape(np.shape(want))
        pairs.append((np.asarray(want, np.float64), got.astype(np.float64)))
    return r, pairs


def assert_close(pairs, db):
    for want, got in pairs:
        assert np.isfinite(got).all()
        assert sqnr_db(want, got) > db, sqnr_db(want, got)


# ------------------------------------------------------------------------------------ Erfc
def _erfc_model():
    return make_model([N("Erfc", ["x"], ["y"], name="erfc")], [("x", [1, 64, 16])], [("y", [1, 64, 16])])


def test_erfc_is_read_as_one_minus_erf():
    m = _erfc_model()
    with pytest.raises(Exception):
        onnx.checker.check_model(m)                       # no opset defines Erfc
    fixed = repair(m)
    onnx.checker.check_model(fixed)
    assert [n.op_type for n in fixed.graph.node] == ["Erf", "Sub"]
    assert [n.op_type for n in m.graph.node] == ["Erfc"]  # a copy: the caller's model unchanged
    x = (RNG.standard_normal((1, 64, 16)) * 2).astype(np.float32)
    np.testing.assert_allclose(ort_run(fixed, x)[0], erfc(x), rtol=1e-5, atol=1e-6)


def test_erfc_compiles_and_runs(tmp_path):
    r, pairs = emulate(_erfc_model(), (1, 64, 16), tmp_path, scale=1.5, ref=erfc)
    assert_close(pairs, 35)      # an 8-bit output: about 43 dB


# ------------------------------------------------------------------------------------ GELU
def _tfl_gelu_model(approximate):
    node = N("TFL_GELU", ["x"], ["y"], name="gelu", domain=tflite_ops.DOMAIN, approximate=int(approximate))
    m = make_model([node], [("x", [1, 64, 16])], [("y", [1, 64, 16])])
    m.opset_import.append(helper.make_opsetid(tflite_ops.DOMAIN, 1))
    return tflite_ops.to_standard_ops(m, "test")


@pytest.mark.parametrize("approximate", [False, True])
def test_tflite_gelu_maps_to_its_formula(approximate):
    m = _tfl_gelu_model(approximate)
    onnx.checker.check_model(m)
    assert all(n.domain == "" for n in m.graph.node) and tflite_ops.DOMAIN not in {o.domain for o in m.opset_import}
    x = (RNG.standard_normal((1, 64, 16)) * 3).astype(np.float64)
    want = (0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))) if approximate \
        else 0.5 * x * (1 + erf(x / math.sqrt(2)))
    np.testing.assert_allclose(ort_run(m, x.astype(np.float32))[0], want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("approximate", [False, True])
def test_tflite_gelu_compiles_and_runs(approximate, tmp_path):
    r, pairs = emulate(_tfl_gelu_model(approximate), (1, 64, 16), tmp_path, scale=2.0)
    assert_close(pairs, 30)


def test_tflite_gelu_through_tf2onnx(tmp_path):
    """A Keras Dense(gelu) in a .tflite (the builtin GELU op) converts and matches TFLite."""
    tf = pytest.importorskip("tensorflow")
    from tl2k210.frontends.tflite import from_tflite
    for approximate in (False, True):
        i = tf.keras.Input((16, 8))
        k = tf.keras.Model(i, tf.keras.layers.Dense(12, activation=lambda t: tf.nn.gelu(t, approximate))(i))
        path = tmp_path / f"gelu{int(approximate)}.tflite"
        path.write_bytes(tf.lite.TFLiteConverter.from_keras_model(k).convert())
        interp = tf.lite.Interpreter(model_path=str(path))
        if not any(d["op_name"] == "GELU" for d in interp._get_ops_details()):
            pytest.skip("this TensorFlow writes gelu as other ops, not the builtin GELU")
        m = from_tflite(path)
        x = RNG.standard_normal((1, 16, 8)).astype(np.float32)
        interp.allocate_tensors()
        interp.set_tensor(interp.get_input_details()[0]["index"], x)
        interp.invoke()
        want = interp.get_tensor(interp.get_output_details()[0]["index"])
        np.testing.assert_allclose(ort_run(m, x)[0], want, rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------ LayerNormalization, tf2onnx's
def _layer_norm_model(opset=13):
    """tf2onnx's opset-13 LayerNormalization of (1, 64, 32) tokens: a (1, 64, 32, 1) map whose
    per-token mean and variance (ReduceMean / ReduceSumSquare over axes 0, 2, 3) feed a batch norm."""
    ax = {"axes": [0, 2, 3]}
    nodes = [N("Reshape", ["x", "shape4"], ["x4"]),
             N("ReduceMean", ["x4"], ["mean4"], keepdims=1, **ax),
             N("Sub", ["x4", "mean4"], ["d"]),
             N("ReduceSumSquare", ["d"], ["ss"], keepdims=0, **ax),
             N("Div", ["ss", "n"], ["var"]),
             N("Squeeze", ["mean4", "sq_axes"], ["mean"]),
             N("BatchNormalization", ["x4", "ones", "zeros", "mean", "var"], ["bn"], epsilon=1e-3),
             N("Reshape", ["bn", "shape3"], ["b3"]),
             N("Mul", ["b3", "gamma"], ["g"]), N("Add", ["g", "beta"], ["y"])]
    inits = {"shape4": np.array([1, 64, 32, 1]), "shape3": np.array([1, 64, 32]), "n": np.float32(32),
             "sq_axes": np.array([0, 2, 3]), "ones": np.ones(64, np.float32), "zeros": np.zeros(64, np.float32),
             "gamma": (1 + 0.1 * RNG.standard_normal(32)).astype(np.float32),
             "beta": (0.1 * RNG.standard_normal(32)).astype(np.float32)}
    return make_model(nodes, [("x", [1, 64, 32])], [("y", [1, 64, 32])], inits, opset=opset)


def test_layer_norm_of_reduce_sum_square_and_batch_norm(tmp_path):
    m = _layer_norm_model()
    r, pairs = emulate(m, (1, 64, 32), tmp_path, scale=3.0)
    assert_close(pairs, 30)
    assert "reduce_sum_square" in str(r.passes) and "batchnorm_of_activations" in str(r.passes)


@pytest.mark.parametrize("axes,keepdims,opset", [([0, 2], 0, 13), ([2], 1, 18), ([1], 0, 11)])
def test_reduce_sum_square_any_axes(axes, keepdims, opset, tmp_path):
    from tl2k210.graph import from_onnx
    from tl2k210.k210.flow import run_pass
    if opset >= 18:
        node, inits = N("ReduceSumSquare", ["x", "axes"], ["y"], keepdims=keepdims), {"axes": np.array(axes)}
    else:
        node, inits = N("ReduceSumSquare", ["x"], ["y"], keepdims=keepdims, axes=axes), {}
    x = RNG.standard_normal((1, 6, 5)).astype(np.float32)
    want = np.sum(x.astype(np.float64) ** 2, axis=tuple(axes), keepdims=bool(keepdims))
    m = make_model([node], [("x", [1, 6, 5])], [("y", list(want.shape))], inits, opset=opset)
    np.testing.assert_allclose(ort_run(m, x)[0], want, rtol=1e-5)
    g, _ = run_pass("reduce_sum_square", from_onnx(m))
    assert [n.op for n in g.nodes] == ["Mul", "ReduceSum"]
    from tl2k210.graph import run
    np.testing.assert_allclose(run(g, x)[g.outputs[0]].reshape(want.shape), want, rtol=1e-5)


# ------------------------------------------------------------------------------------ Einsum
@pytest.mark.parametrize("eq,xs,ws", [("abcd,cde->abe", (1, 64, 2, 16), (2, 16, 32)),
                                      ("abc,cd->abd", (1, 64, 32), (32, 24)),
                                      ("abc,dc->adb", (1, 64, 32), (24, 32)),
                                      ("abc,cde->abde", (1, 64, 32), (32, 2, 16))], ids=str)
def test_einsum_with_weights(eq, xs, ws, tmp_path):
    """The input a (1, 64, 32) sequence, reshaped in the model (a 4-D input is read as an image)."""
    W = (RNG.standard_normal(ws) * 0.2).astype(np.float32)
    want_shape = list(np.einsum(eq, np.zeros(xs), W).shape)
    m = make_model([N("Reshape", ["x", "xs"], ["xr"]), N("Einsum", ["xr", "w"], ["y"], equation=eq)],
                   [("x", [1, 64, 32])], [("y", want_shape)], {"w": W, "xs": np.array(xs)}, opset=13)
    r, pairs = emulate(m, (1, 64, 32), tmp_path)
    assert_close(pairs, 30)       # a transposed output may be moved on uint8


# ---------------------------------------------------------------------------- MatMul, Gemm
def test_attention_batched_matmul(tmp_path):
    """Two heads: softmax(q k^T) v with q, k, v slices of the input, one matmul per head."""
    nodes = [N("Reshape", ["x", "s4"], ["x4"]), N("Transpose", ["x4"], ["q"], perm=[0, 2, 1, 3]),
             N("Transpose", ["x4"], ["kt"], perm=[0, 2, 3, 1]), N("MatMul", ["q", "kt"], ["att"]),
             N("Softmax", ["att"], ["p"], axis=-1), N("MatMul", ["p", "q"], ["y"])]
    m = make_model(nodes, [("x", [1, 64, 32])], [("y", [1, 2, 64, 16])], {"s4": np.array([1, 64, 2, 16])})
    r, pairs = emulate(m, (1, 64, 32), tmp_path, scale=0.5)
    assert_close(pairs, 80)


def test_matmul_broadcast_over_heads(tmp_path):
    nodes = [N("Reshape", ["x", "s4"], ["x4"]), N("Slice", ["x4", "st", "en", "ax"], ["b"]),
             N("Transpose", ["b"], ["bt"], perm=[0, 1, 3, 2]), N("MatMul", ["x4", "bt"], ["y"])]
    m = make_model(nodes, [("x", [1, 64, 8])], [("y", [1, 2, 32, 32])],
                   {"s4": np.array([1, 2, 32, 8]), "st": np.array([1]), "en": np.array([2]), "ax": np.array([1])})
    r, pairs = emulate(m, (1, 64, 8), tmp_path)
    assert_close(pairs, 100)


@pytest.mark.parametrize("act", [None, "Relu"])
def test_dense_over_token_rows_keeps_every_row(act, tmp_path):
    """(1, 64, 32) x (32, 48): all 64 rows (the v3 FULLY_CONNECTED form multiplied the first only)."""
    nodes = [N("MatMul", ["x", "w"], ["mm" if act else "y"])] + ([N(act, ["mm"], ["y"])] if act else [])
    m = make_model(nodes, [("x", [1, 64, 32])], [("y", [1, 64, 48])],
                   {"w": (RNG.standard_normal((32, 48)) * 0.2).astype(np.float32)})
    r, pairs = emulate(m, (1, 64, 32), tmp_path)
    assert_close(pairs, 30 if act else 100)


def test_quantized_dense_over_token_rows(tmp_path):
    """The uint8 matmul of a ReLU'd map (--optimize size: its 4x smaller weights) takes every row."""
    nodes = [N("Relu", ["x"], ["r"]), N("MatMul", ["r", "w"], ["mm"]), N("Relu", ["mm"], ["y"])]
    m = make_model(nodes, [("x", [1, 64, 32])], [("y", [1, 64, 48])],
                   {"w": (RNG.standard_normal((32, 48)) * 0.2).astype(np.float32)})
    r, pairs = emulate(m, (1, 64, 32), tmp_path, optimize="size")
    assert_close(pairs, 25)
    assert any(row["lowering"] == "quantized_matmul" for row in r.layers), [row["lowering"] for row in r.layers]


def test_gemm_with_beta_zero_over_rows(tmp_path):
    nodes = [N("Reshape", ["x", "s2"], ["x2"]), N("Gemm", ["x2", "w"], ["g"], transB=1, beta=0.0),
             N("Reshape", ["g", "s3"], ["y"])]
    m = make_model(nodes, [("x", [1, 64, 32])], [("y", [1, 64, 24])],
                   {"s2": np.array([64, 32]), "s3": np.array([1, 64, 24]),
                    "w": (RNG.standard_normal((24, 32)) * 0.2).astype(np.float32)})
    r, pairs = emulate(m, (1, 64, 32), tmp_path)
    assert_close(pairs, 100)


# ------------------------------------------------------------------------------ Transpose
@pytest.mark.parametrize("shape,perm", [((1, 1, 64, 2, 16), [0, 3, 1, 2, 4]), ((2, 3, 1, 4, 5), [4, 2, 0, 1, 3]),
                                        ((2, 3, 4, 5, 6), [0, 1, 3, 2, 4]), ((1, 1, 1), [2, 1, 0])], ids=str)
def test_compact_transpose_moves_the_same_data(shape, perm):
    x = np.arange(np.prod(shape)).reshape(shape)
    s, p = compact_transpose(shape, perm)
    np.testing.assert_array_equal(x.transpose(perm).reshape(-1), x.reshape(s).transpose(p).reshape(-1))


def test_five_d_transpose_with_unit_axes(tmp_path):
    nodes = [N("Reshape", ["x", "s5"], ["x5"]), N("Transpose", ["x5"], ["t"], perm=[0, 3, 1, 2, 4]),
             N("Reshape", ["t", "s4"], ["y"])]
    m = make_model(nodes, [("x", [1, 64, 32])], [("y", [1, 2, 64, 16])],
                   {"s5": np.array([1, 1, 64, 2, 16]), "s4": np.array([1, 2, 64, 16])})
    r, pairs = emulate(m, (1, 64, 32), tmp_path)
    assert_close(pairs, 35)


def test_tflite_broadcast_args_maps_to_a_shape():
    """TFLite's BROADCAST_ARGS (Keras' GroupNormalization writes it; round 48's grouped96): the
    broadcast shape of two int32 shape vectors, in the inputs' type."""
    from onnx import TensorProto
    node = N("TFL_BROADCAST_ARGS", ["a", "b"], ["y"], name="bargs", domain=tflite_ops.DOMAIN)
    g = helper.make_graph([node], "t", [helper.make_tensor_value_info(k, TensorProto.INT32, [None]) for k in "ab"],
                          [helper.make_tensor_value_info("y", TensorProto.INT32, [None])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(tflite_ops.DOMAIN, 1)])
    m.ir_version = 8
    m = tflite_ops.to_standard_ops(m, "test")
    onnx.checker.check_model(m)
    import onnxruntime as ort
    s = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    for a, b in [((1, 12, 12, 8, 6), ()), ((3, 1, 5), (4, 1)), ((1,), (2, 3))]:
        y = s.run(None, {"a": np.array(a, np.int32), "b": np.array(b, np.int32)})[0]
        assert y.dtype == np.int32 and tuple(y) == np.broadcast_shapes(a, b)

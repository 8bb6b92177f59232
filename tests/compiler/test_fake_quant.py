"""Ideal 8-bit quantization (tl2k210/quantize/fake_quant.py) puts its rounding where the back-end
keeps uint8 tensors -- a pooled vector only where a KPU conv or dense layer reads it."""
import numpy as np
import pytest
from onnx import helper

from front_helpers import make_model, rand
from tl2k210.graph import from_onnx
from tl2k210.k210.flow import run_pipeline
from tl2k210.k210.lower import Options
from tl2k210.k210 import fixed_point as fx
from tl2k210.quantize import calibrate
from tl2k210.quantize.fake_quant import fake_quant_graph
from tl2k210.quantize.metrics import sqnr_db


def test_pooled_vector_is_rounded_only_before_a_conv():
    rng = np.random.default_rng(1)
    w1, w2 = rng.standard_normal((8, 4, 3, 3)).astype(np.float32), rng.standard_normal((5, 8, 1, 1)).astype(np.float32)
    m = make_model([helper.make_node("Conv", ["x", "w1"], ["c"], name="c", pads=[1] * 4),
                    helper.make_node("Relu", ["c"], ["r"], name="r"),
                    helper.make_node("GlobalAveragePool", ["r"], ["p"], name="p"),
                    helper.make_node("Conv", ["p", "w2"], ["fc"], name="fc"),
                    helper.make_node("GlobalAveragePool", ["fc"], ["y"], name="y")],
                   [("x", [1, 4, 8, 8])], [("y", [1, 5, 1, 1])], {"w1": w1, "w2": w2})
    g, _ = run_pipeline(from_onnx(m))
    xs = [rand(1, 4, 8, 8) for _ in range(4)]
    rngs = calibrate.ranges(calibrate.collect(g, xs, histograms=False), "minmax")
    fq = fake_quant_graph(g, rngs)
    rounded = {n.inputs[0].removesuffix("/float") for n in fq.nodes if n.op == "QuantizeLinear"}
    pooled = [n.outputs[0] for n in g.nodes if n.op == "GlobalAveragePool"]
    assert pooled[0] in rounded and pooled[1] not in rounded   # the KPU dense layer's input; the output
    got = calibrate.FloatRunner(fq)(xs[0])
    raw, s, z = got[pooled[0] + "/float"], *fx.qparams(*rngs[pooled[0]])   # pooled before the rounding
    want = (np.clip(np.round(raw / np.float32(s)) + z, 0, 255) - z) * np.float32(s)
    np.testing.assert_allclose(got[pooled[0]], want, atol=1e-6)
    assert not np.allclose(got[pooled[0]], raw)


def _rounded(g, xs):
    rngs = calibrate.ranges(calibrate.collect(g, xs, histograms=False), "minmax")
    fq = fake_quant_graph(g, rngs)
    return fq, {n.inputs[0].removesuffix("/float") for n in fq.nodes if n.op == "QuantizeLinear"}


def test_dense_layers_fed_by_float_stay_float():
    # k210-dronet's head: a conv map flattened into a dense layer over more than the KPU's 1024
    # channels, then a constant Add: one float Gemm with its bias (matmul_to_conv), which the
    # back-end computes in float; rounding the Add to uint8 would clamp it to its calibrated range
    # (the ideal had been 3.5 dB "better" than an exact float layer on dronet's near-constant
    # output by that clamp)
    rng = np.random.default_rng(2)
    w1, wd = rng.standard_normal((2, 3, 3, 3)).astype(np.float32), rng.standard_normal((2048, 1)).astype(np.float32)
    m = make_model([helper.make_node("Conv", ["x", "w1"], ["c"], name="c", pads=[1] * 4),
                    helper.make_node("Relu", ["c"], ["r"], name="r"),
                    helper.make_node("Flatten", ["r"], ["f"], name="f"),
                    helper.make_node("MatMul", ["f", "wd"], ["d"], name="d"),
                    helper.make_node("Add", ["d", "b"], ["a"], name="a"),
                    helper.make_node("Sigmoid", ["a"], ["y"], name="y")],
                   [("x", [1, 3, 32, 32])], [("y", [1, 1])], {"w1": w1, "wd": wd, "b": np.array([0.5], np.float32)})
    g, _ = run_pipeline(from_onnx(m))
    fq, rounded = _rounded(g, [rand(1, 3, 32, 32) for _ in range(4)])
    dense = [n for n in g.nodes if n.op in ("MatMul", "Gemm")]
    assert [n.op for n in dense] == ["Gemm"] and [n.op for n in g.nodes if n.op == "Conv"] == ["Conv"]
    assert "c" in rounded and not rounded & set(dense[0].outputs)
    fd = next(n for n in fq.nodes if n.name == dense[0].name)
    assert fd.inputs[1] == dense[0].inputs[1]          # its weights stay float too


def test_a_quantized_models_dense_layers_are_integer():
    # TFLite Micro's micro_speech: a conv map flattened into a 4000-input FULLY_CONNECTED (a MatMul
    # wider than the KPU) before a softmax. The file states its logits as int8, TFLite clips them
    # to that range, and so does the back-end (quantized_matmul); the ideal had kept the MatMul
    # float (56.1 dB against ours and TFLite's 16.9 on inputs that overflow the logit range).
    # 10 x 32 x 32 inputs: over the 9,216 that wide_dense's 3x3 KPU conv sums
    rng = np.random.default_rng(2)
    w1, wd = rng.standard_normal((10, 3, 3, 3)).astype(np.float32), rng.standard_normal((10240, 4)).astype(np.float32)
    m = make_model([helper.make_node("Conv", ["x", "w1"], ["c"], name="c", pads=[1] * 4),
                    helper.make_node("Relu", ["c"], ["r"], name="r"),
                    helper.make_node("Flatten", ["r"], ["f"], name="f"),
                    helper.make_node("MatMul", ["f", "wd"], ["d"], name="d"),
                    helper.make_node("Softmax", ["d"], ["y"], name="y")],
                   [("x", [1, 3, 32, 32])], [("y", [1, 4])], {"w1": w1, "wd": wd})
    g, _ = run_pipeline(from_onnx(m))
    xs = [rand(1, 3, 32, 32) for _ in range(4)]
    _, rounded = _rounded(g, xs)
    assert "c" in rounded and "d" not in rounded               # a float model: the float layer
    g.meta["quant_ranges"] = {"d": (-8.0, 8.0)}                 # what passes.dequantize records
    fq, rounded = _rounded(g, xs)
    assert {"c", "d"} <= rounded
    mm = next(n for n in fq.nodes if n.name == "d")
    wq = fq.const(mm.inputs[1])
    for col, want in zip(wq.T, wd.T):                          # each output's weights on its own grid
        s = np.abs(want).max() / 127
        np.testing.assert_allclose(col, np.round(want / s) * s, atol=1e-6)
    assert not np.allclose(wq, wd)


def _se_block(out_conv=True):
    """conv -> relu -> GAP -> sigmoid gate -> Mul (-> 1x1 conv): a squeeze-and-excite block."""
    rng = np.random.default_rng(5)
    w1, w2 = rng.standard_normal((4, 3, 3, 3)).astype(np.float32), rng.standard_normal((4, 4, 1, 1)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c"], name="c", pads=[1] * 4),
             helper.make_node("Relu", ["c"], ["r"], name="r"),
             helper.make_node("GlobalAveragePool", ["r"], ["p"], name="p"),
             helper.make_node("Sigmoid", ["p"], ["gate"], name="gate"),
             helper.make_node("Mul", ["r", "gate"], ["se"], name="se")]
    nodes += [helper.make_node("Conv", ["se", "w2"], ["y"], name="y")] if out_conv else []
    m = make_model(nodes, [("x", [1, 3, 8, 8])], [("y" if out_conv else "se", [1, 4, 8, 8])], {"w1": w1, "w2": w2})
    g, _ = run_pipeline(from_onnx(m))
    return g, next(n for n in g.nodes if n.op == "Mul").outputs[0], [rand(1, 3, 8, 8) for _ in range(4)]


def test_a_map_an_integer_conv_reads_is_rounded():
    # A float model's SE gate: the KPU conv after the Mul reads it as uint8, so the ideal rounds it
    # there too (it had read the float product: dense_gate64x96's swish head, round 44's unseen set)
    g, mul, xs = _se_block()
    fq, rounded = _rounded(g, xs)
    assert mul in rounded
    got = calibrate.FloatRunner(fq)(xs[0])
    lo, hi = calibrate.ranges(calibrate.collect(g, xs, histograms=False), "minmax")[mul]
    s, z = fx.qparams(lo, hi)
    raw = got[mul + "/float"]
    np.testing.assert_allclose(got[mul], (np.clip(np.round(raw / np.float32(s)) + z, 0, 255) - z) * np.float32(s),
                               atol=1e-6)
    g, mul, xs = _se_block(out_conv=False)
    assert mul not in _rounded(g, xs)[1]                    # a float output no integer layer reads


def test_a_quantized_models_own_roundings_are_the_ideal():
    # An int8 SE block: TFLite rounds the gate's Mul output to the file's int8 grid, and so does
    # the back-end (quantized_binary). The ideal had left it float: 1.6 dB above ours and the
    # file's own arithmetic at that Mul (se_net128 int8, round 43's unseen set), 2.2 dB at the output
    g, mul, xs = _se_block(out_conv=False)
    g.meta["quant_ranges"] = {mul: (-4.0, 4.0)}                # what passes.dequantize records
    assert mul in _rounded(g, xs)[1]


def test_dense_layers_on_the_model_input_stay_float():
    # iris: dense layers on a float vector (--float-fc or not: FULLY_CONNECTED reads the input)
    rng = np.random.default_rng(3)
    w1, w2 = rng.standard_normal((4, 8)).astype(np.float32), rng.standard_normal((8, 3)).astype(np.float32)
    m = make_model([helper.make_node("MatMul", ["x", "w1"], ["h"], name="h"),
                    helper.make_node("Relu", ["h"], ["r"], name="r"),
                    helper.make_node("MatMul", ["r", "w2"], ["y"], name="y")],
                   [("x", [1, 4])], [("y", [1, 3])], {"w1": w1, "w2": w2})
    g, _ = run_pipeline(from_onnx(m))
    fq, rounded = _rounded(g, [rand(1, 4) for _ in range(4)])
    assert [n.op for n in g.nodes if n.op == "Conv"] == ["Conv", "Conv"] and not rounded
    x = rand(1, 4)
    np.testing.assert_allclose(calibrate.FloatRunner(fq, False)(x)["y"], calibrate.FloatRunner(g, False)(x)["y"],
                               rtol=1e-6)


def test_per_channel_ranges_put_each_channel_on_its_own_grid():
    # a range (lo[C], hi[C]) rounds channel c with its own scale and zero point, clipping to its
    # own range; a scalar range keeps one grid for the tensor
    rng = np.random.default_rng(4)
    w = rng.standard_normal((3, 2, 1, 1)).astype(np.float32) * np.array([1, 10, 0.1], np.float32)[:, None, None, None]
    m = make_model([helper.make_node("Conv", ["x", "w"], ["y"], name="c")],
                   [("x", [1, 2, 4, 4])], [("y", [1, 3, 4, 4])], {"w": w})
    g, _ = run_pipeline(from_onnx(m))
    x = rand(1, 2, 4, 4)
    lo, hi = np.array([-1.0, -5.0, 0.0]), np.array([1.0, 20.0, 0.05])
    got = calibrate.FloatRunner(fake_quant_graph(g, {"y": (lo, hi)}, weight_bits=16))(x)
    raw = got["y/float"]
    for c in range(3):
        s, z = fx.qparams(lo[c], hi[c])
        want = (np.clip(np.round(raw[0, c] / np.float32(s)) + z, 0, 255) - z) * np.float32(s)
        np.testing.assert_allclose(got["y"][0, c], want, atol=1e-6)
    one = calibrate.FloatRunner(fake_quant_graph(g, {"y": (-5.0, 20.0)}, weight_bits=16))(x)
    s, z = fx.qparams(-5.0, 20.0)
    np.testing.assert_allclose(one["y"], (np.clip(np.round(raw / np.float32(s)) + z, 0, 255) - z) * np.float32(s), atol=1e-5)
    assert np.abs(got["y"][0, 2]).max() <= hi[2] + 1e-6 < np.abs(one["y"][0, 2]).max()   # clipped to its own range


@pytest.mark.parametrize("fmt", ["v3", "v4"])
def test_only_the_dense_layers_the_back_end_keeps_float_stay_float(fmt):
    # ARM's ML-KWS DNN: MFCCs (25x10) flattened, then three dense layers. Kmodel v3 runs the first
    # float on the CPU (a v3 kmodel starts with K210_CONV or FULLY_CONNECTED) and the others on the
    # KPU; kmodel v4 runs all three on the KPU: the ideal follows it (it had kept all three float,
    # an ideal of inf dB: no floor to measure against)
    rng = np.random.default_rng(4)
    ws = [rng.standard_normal(s).astype(np.float32) * 0.2 for s in ((250, 64), (64, 64), (64, 12))]
    m = make_model([helper.make_node("MatMul", ["x", "w1"], ["h1"], name="h1"),
                    helper.make_node("Relu", ["h1"], ["r1"], name="r1"),
                    helper.make_node("MatMul", ["r1", "w2"], ["h2"], name="h2"),
                    helper.make_node("Relu", ["h2"], ["r2"], name="r2"),
                    helper.make_node("MatMul", ["r2", "w3"], ["y"], name="y")],
                   [("x", [1, 250])], [("y", [1, 12])], {"w1": ws[0], "w2": ws[1], "w3": ws[2]})
    g, _ = run_pipeline(from_onnx(m), target=Options(format=fmt))
    assert g.meta["plan"][0] == fmt
    convs = [n.name for n in g.nodes if n.op == "Conv"]
    assert len(convs) == 3 and g.meta["float_dense"] == ({convs[0]} if fmt == "v3" else set())
    fq, rounded = _rounded(g, [rand(1, 250) for _ in range(4)])
    weights = {n.name: n.inputs[1] for n in g.nodes if n.name in convs}
    kept = [next(n for n in fq.nodes if n.name == c).inputs[1] == weights[c] for c in convs]
    assert kept == [fmt == "v3", False, False] and rounded     # float weights; 8-bit weights and maps
    x = rand(1, 250)
    ideal = sqnr_db(calibrate.FloatRunner(g, False)(x)["y"], calibrate.FloatRunner(fq, False)(x)["y"])
    assert 10 < ideal < 80, ideal       # finite: v4 rounds the input to 8 bits too


def test_the_ideal_takes_the_back_ends_bias_correction_where_it_helps():
    """A conv on a map with large channel means (as after a ReLU: MLPerf's float ResNet-8's ideal
    rose 13.8 -> 27.0 dB with it): the weights' rounding shifts the output's mean by dW . E[x];
    the corrected ideal (means given) takes most of it back, and ideal_sqnr is the better of the
    two ideals, output by output."""
    from tl2k210.compiler import channel_means
    from tl2k210.quantize.fake_quant import ideal_sqnr
    rng = np.random.default_rng(3)
    w1 = rng.standard_normal((16, 8, 3, 3)).astype(np.float32) * 0.05
    m = make_model([helper.make_node("Conv", ["x", "w1"], ["y"], name="c")],       # VALID: every tap inside
                   [("x", [1, 8, 8, 8])], [("y", [1, 16, 6, 6])], {"w1": w1})
    g, _ = run_pipeline(from_onnx(m))
    xs = [(rand(8, 8, 8) * 0.1 + 3.0).astype(np.float32) for _ in range(6)]     # means ~3: a large shift
    batches = [x[None] for x in xs]
    rngs = calibrate.ranges(calibrate.collect(g, batches, histograms=False), "minmax")
    means = channel_means(g, batches)
    y = g.outputs[0]
    ref = calibrate.FloatRunner(g)(batches[0])[y]
    plain, corrected = (calibrate.FloatRunner(fake_quant_graph(g, rngs, means=mm))(batches[0])[y] for mm in (None, means))
    assert abs(np.mean(corrected - ref)) < abs(np.mean(plain - ref)) / 3     # the mean shift, mostly gone
    best, alone = ideal_sqnr(g, rngs, xs, means=means)[y], ideal_sqnr(g, rngs, xs)[y]
    assert best > alone + 3 and best == pytest.approx(sqnr_db(
        np.stack([calibrate.FloatRunner(g)(b)[y] for b in batches]),
        np.stack([calibrate.FloatRunner(fake_quant_graph(g, rngs, means=means))(b)[y] for b in batches])))


"""Each pass on tiny ONNX graphs: numerics vs onnxruntime before/after, and the structure."""
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from front_helpers import make_model, ort_run, rand
from tl2k210.graph import from_onnx, run
from tl2k210.k210.flow import PIPELINE, run_pass, run_pipeline

X = ("x", [1, 4, 8, 8])


def conv(name, x, w, b=None, **attrs):
    return helper.make_node("Conv", [x, w] + ([b] if b else []), [name], name=name, **attrs)


def check(model, passes, x=None, tol=1e-5, options=None):
    """Run passes (a name or None for the full pipeline) and assert the float results did not change.
    The absolute tolerance scales with the output's magnitude: float32 sums of a few hundred terms
    differ in their last bits between CPUs (SIMD widths), and a small output computed from large
    ones (a swish of a Gemm) inherits that absolute error."""
    g = from_onnx(model)
    x = rand(*g.shape(g.inputs[0])) if x is None else x
    ref = ort_run(model, x)[0]
    if passes is None:
        g2, log = run_pipeline(g, options)
    else:
        g2, log = run_pass(passes, g)
    if g2.inputs[0] in g2.meta.get("relabelled", {}):    # (input_nchw: the map the input was reshaped to)
        x = x.reshape(g2.shape(g2.inputs[0]))
    out = run(g2, x)[g2.outputs[0]]
    np.testing.assert_allclose(out, ref, atol=tol * max(1.0, float(np.abs(ref).max())), rtol=tol)
    return g2, log


def test_pipeline_is_ordered_and_named():
    names = [p.name for p in PIPELINE]
    assert names.index("fold_batchnorm") < names.index("fuse_activation") < names.index("fuse_pool")
    assert names.index("upsample_to_resize") < names.index("matmul_to_conv")
    off = {p.name for p in PIPELINE if not p.default}
    assert off == {"kpu_padding", "prelu_residual", "prelu_residual_grouped",  # the compiler's choices (to fit)
                   "prelu_residual_every"}
    assert not next(p for p in PIPELINE if p.name == "kpu_padding").exact
    assert next(p for p in PIPELINE if p.name == "prelu_residual").exact
    assert names.index("prelu_residual") == names.index("prelu_split") - 1
    with pytest.raises(ValueError, match="unknown pass"):
        run_pipeline(from_onnx(make_model([helper.make_node("Relu", ["x"], ["y"])], [X], [("y", None)])),
                     {"kpu_paddin": True})


def test_fold_constants():
    nodes = [helper.make_node("Add", ["a", "b"], ["c"]), helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Reshape", ["x", "s"], ["r"]), helper.make_node("Mul", ["r", "c"], ["y"]),
             helper.make_node("Identity", ["y"], ["z"])]
    m = make_model(nodes, [X], [("z", None)], {"a": rand(4, 1, 1), "b": rand(4, 1, 1)})
    g, changes = check(m, "fold_constants")
    # the Reshape to the shape x has (its target a Shape of x, as TF graphs compute it: Magenta's
    # instance norms, whose such Reshapes had kept a map NHWC between layout changes) goes too
    assert [n.op for n in g.nodes] == ["Mul"]
    assert g.outputs == ["z"] and g.nodes[-1].outputs == ["z"]
    assert len(changes) == 4  # Add, Shape, Reshape, Identity


def test_fold_batchnorm_into_conv():
    c = 6
    nodes = [conv("c", "x", "w", "b", pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "g", "be", "m", "v"], ["y"], epsilon=1e-3)]
    inits = {"w": rand(c, 4, 3, 3), "b": rand(c), "g": rand(c), "be": rand(c), "m": rand(c),
             "v": np.abs(rand(c)) + 0.1}
    g, changes = check(make_model(nodes, [X], [("y", None)], inits), "fold_batchnorm")
    assert g.op_counts() == {"Conv": 1} and len(g.nodes[0].fused) == 2 and len(changes) == 1


def test_fold_keras3_mul_add_after_depthwise():
    nodes = [conv("dw", "x", "w", group=4, pads=[1, 1, 1, 1]),
             helper.make_node("Mul", ["dw", "s"], ["m"]), helper.make_node("Add", ["m", "t"], ["y"])]
    inits = {"w": rand(4, 1, 3, 3), "s": rand(4, 1, 1), "t": rand(1, 4, 1, 1)}
    g, changes = check(make_model(nodes, [X], [("y", None)], inits), "fold_batchnorm")
    assert g.op_counts() == {"Conv": 1} and len(changes) == 2


def test_a_folded_add_takes_its_range_to_the_conv():
    """DBFace's int8 TFLite: a squeeze-excite gate relu6(conv + 3) / 6, the +3 an ADD with a fused
    ReLU6. fold_batchnorm folds the +3 into the conv, whose tensor keeps its name; the file states
    for that name the range before the +3 (-0.79..1.45), for the gate's input 0..4.45: the model's
    own ranges (compiler.ModelRanges, and the ideal's) now give the conv's tensor the latter.
    Before, every gate clipped to one value and the heat map read 0 dB, receipt and ideal alike."""
    from tl2k210.compiler import ModelRanges
    i8 = lambda v: np.int8(v)    # noqa: E731
    nodes = [conv("c", "x", "w", "b"),
             helper.make_node("QuantizeLinear", ["c", "s1", "z1"], ["cq"]),
             helper.make_node("DequantizeLinear", ["cq", "s1", "z1"], ["cd"]),
             helper.make_node("Add", ["cd", "three"], ["a"]),
             helper.make_node("Clip", ["a", "lo", "hi"], ["r"]),
             helper.make_node("QuantizeLinear", ["r", "s2", "z2"], ["rq"]),
             helper.make_node("DequantizeLinear", ["rq", "s2", "z2"], ["rd"]),
             helper.make_node("Mul", ["x", "rd"], ["y"])]
    inits = {"w": rand(4, 4, 1, 1), "b": rand(4), "three": np.float32(3), "lo": np.float32(0),
             "hi": np.float32(6), "s1": np.float32(0.0088), "z1": i8(-38), "s2": np.float32(0.0175), "z2": i8(-128)}
    g, _ = run_pipeline(from_onnx(make_model(nodes, [X], [("y", None)], inits)))
    gate = next(n for n in g.nodes if n.op == "Conv")
    assert gate.attrs.get("activation") and len(gate.fused) >= 2, (gate.attrs, gate.fused)
    lo, hi = ModelRanges(g).own[gate.outputs[0]]
    assert lo == pytest.approx(0) and hi == pytest.approx(255 * 0.0175)


def test_fold_batchnorm_leaves_shared_conv_output():
    nodes = [conv("c", "x", "w"), helper.make_node("Mul", ["c", "s"], ["m"]), helper.make_node("Add", ["c", "m"], ["y"])]
    g, changes = check(make_model(nodes, [X], [("y", None)], {"w": rand(4, 4, 1, 1), "s": rand(4, 1, 1)}),
                       "fold_batchnorm")
    assert not changes and g.op_counts() == {"Conv": 1, "Mul": 1, "Add": 1}


def _act_nodes(kind):
    if kind == "Clip":
        return [helper.make_node("Clip", ["c", "lo", "hi"], ["y"])], {"lo": np.float32(0), "hi": np.float32(6)}
    if kind == "Swish":
        return [helper.make_node("Sigmoid", ["c"], ["s"]), helper.make_node("Mul", ["c", "s"], ["y"])], {}
    attrs = {"LeakyRelu": {"alpha": 0.1}, "HardSigmoid": {"alpha": 0.25, "beta": 0.4}}.get(kind, {})
    return [helper.make_node(kind, ["c"], ["y"], **attrs)], {}


@pytest.mark.parametrize("kind", ["Relu", "Clip", "LeakyRelu", "Sigmoid", "Tanh", "HardSigmoid", "HardSwish", "Swish"])
def test_fuse_activation(kind):
    acts, inits = _act_nodes(kind)
    m = make_model([conv("c", "x", "w", "b", pads=[1, 1, 1, 1])] + acts, [X], [("y", None)],
                   {"w": rand(8, 4, 3, 3), "b": rand(8), **inits}, opset=14 if kind == "HardSwish" else 13)
    g, changes = check(m, "fuse_activation", x=rand(1, 4, 8, 8, scale=3))
    assert g.op_counts() == {"Conv": 1} and g.nodes[0].attrs["activation"]["op"] == kind
    if kind == "Clip":
        assert g.nodes[0].attrs["activation"] == {"op": "Clip", "min": 0.0, "max": 6.0}
    if kind == "LeakyRelu":
        assert g.nodes[0].attrs["activation"]["alpha"] == pytest.approx(0.1)


def test_swish_after_any_op_is_one_swish_node():
    """x * Sigmoid(x) after a conv whose output is shared (not fusable) and after a Gemm: each
    becomes one IR Swish node (exported back as Sigmoid + Mul: the float results are the same);
    a Sigmoid whose Mul multiplies another tensor stays (a squeeze-and-excite gate)."""
    n = helper.make_node
    nodes = [conv("c", "x", "w"), n("Relu", ["c"], ["r"]), n("Sigmoid", ["c"], ["s"]), n("Mul", ["c", "s"], ["sw"]),
             n("Add", ["sw", "r"], ["a"]), n("Flatten", ["a"], ["f"]), n("Gemm", ["f", "wg"], ["g"], transB=1),
             n("Sigmoid", ["g"], ["gs"]), n("Mul", ["g", "gs"], ["gw"]), n("Sigmoid", ["gw"], ["e"]),
             n("Mul", ["g", "e"], ["y"])]
    m = make_model(nodes, [X], [("y", None)], {"w": rand(4, 4, 1, 1), "wg": rand(6, 4 * 8 * 8)})
    g, changes = check(m, "fuse_activation", x=rand(1, 4, 8, 8, scale=3))
    counts = g.op_counts()
    assert counts["Swish"] == 2 and counts["Sigmoid"] == 1 and counts["Mul"] == 1, counts


def test_activation_not_fused_when_conv_output_is_shared():
    nodes = [conv("c", "x", "w"), helper.make_node("Relu", ["c"], ["r"]), helper.make_node("Add", ["c", "r"], ["y"])]
    g, changes = check(make_model(nodes, [X], [("y", None)], {"w": rand(4, 4, 1, 1)}), "fuse_activation")
    assert not changes and "Relu" in g.op_counts()


def _keras_upsample_nodes(c, h, w):
    """What tf2onnx emits for Keras 3 UpSampling2D(2) on an NCHW tensor x (repeat H, then W)."""
    n = helper.make_node
    return [n("Transpose", ["x"], ["t"], perm=[0, 2, 3, 1]),
            n("Unsqueeze", ["t", "ax2"], ["u1"]), n("Tile", ["u1", "rep2"], ["t1"]),
            n("Reshape", ["t1", "s1"], ["r1"]),
            n("Unsqueeze", ["r1", "ax3"], ["u2"]), n("Tile", ["u2", "rep3"], ["t2"]),
            n("Reshape", ["t2", "s2"], ["r2"]), n("Transpose", ["r2"], ["y"], perm=[0, 3, 1, 2])], {
        "ax2": np.array([2], np.int64), "rep2": np.array([1, 1, 2, 1, 1], np.int64),
        "s1": np.array([1, 2 * h, w, c], np.int64), "ax3": np.array([3], np.int64),
        "rep3": np.array([1, 1, 1, 2, 1], np.int64), "s2": np.array([1, 2 * h, 2 * w, c], np.int64)}


def test_keras3_upsampling_becomes_resize():
    nodes, inits = _keras_upsample_nodes(4, 8, 8)
    g, changes = check(make_model(nodes, [X], [("y", [1, 4, 16, 16])], inits), "upsample_to_resize")
    assert g.op_counts() == {"Resize": 1}
    assert list(g.const(g.nodes[0].inputs[2])) == [1, 1, 2, 2] and g.nodes[0].attrs["mode"] == "nearest"
    assert len(g.nodes[0].fused) == 8


def test_object_detection_api_upsampling_becomes_resize():
    """TF's Object Detection API upsamples every FPN level as `nearest_neighbor_upsampling`:
    stack the map with itself on a new axis (Unsqueeze + Concat(x, x)) and merge that axis with
    the columns, then the same for the rows (hunt 11's SSD MobileNetV2 FPN-lite: its 5-D row
    Concat had no kmodel form). Pass concat_copies makes each Concat of copies a Tile, and the
    chain is the one 2x nearest Resize it computes."""
    n = helper.make_node
    c, h, w = 4, 8, 8
    nodes = [n("Transpose", ["x"], ["t"], perm=[0, 2, 3, 1]),
             n("Unsqueeze", ["t", "ax3"], ["u1"]), n("Concat", ["u1", "u1"], ["k1"], axis=3),
             n("Reshape", ["k1", "s1"], ["r1"]),
             n("Unsqueeze", ["r1", "ax2"], ["u2"]), n("Concat", ["u2", "u2"], ["k2"], axis=2),
             n("Reshape", ["k2", "s2"], ["r2"]), n("Transpose", ["r2"], ["y"], perm=[0, 3, 1, 2])]
    inits = {"ax3": np.array([3], np.int64), "s1": np.array([1, h, 2 * w, c], np.int64),
             "ax2": np.array([2], np.int64), "s2": np.array([1, 2 * h, 2 * w, c], np.int64)}
    model = make_model(nodes, [X], [("y", [1, c, 2 * h, 2 * w])], inits)
    g, log = check(model, None, options={"check_supported": False})
    assert g.op_counts() == {"Resize": 1}
    assert list(g.const(g.nodes[0].inputs[2])) == [1, 1, 2, 2] and g.nodes[0].attrs["mode"] == "nearest"
    copies = next(r["changes"] for r in log if r["pass"] == "concat_copies")
    assert len(copies) == 2 and all("with itself (2 copies" in m for _, m in copies)


def test_identity_chain_removed_and_real_transpose_kept():
    n = helper.make_node
    nodes = [n("Transpose", ["x"], ["a"], perm=[0, 2, 3, 1]), n("Transpose", ["a"], ["b"], perm=[0, 3, 1, 2]),
             n("Relu", ["b"], ["c"]), n("Transpose", ["c"], ["y"], perm=[0, 2, 3, 1])]
    g, changes = check(make_model(nodes, [X], [("y", None)]), "upsample_to_resize")
    assert [x.op for x in g.nodes] == ["Relu", "Transpose"]



@pytest.mark.parametrize("mode, coords", [("linear", "half_pixel"), ("nearest", "asymmetric"),
                                          ("linear", "align_corners"), ("cubic", "pytorch_half_pixel")])
def test_resize_to_its_own_size_is_removed(mode, coords):
    """Keras' Resizing(256, 256) on a 256x256 input (the TF tutorials' resize_and_rescale): a float
    CPU resize that forced kmodel v4 for nothing. Every pixel maps onto itself: removed."""
    n = helper.make_node
    m = make_model([n("Resize", ["x", "", "s"], ["r"], mode=mode, coordinate_transformation_mode=coords),
                    n("Relu", ["r"], ["y"])], [X], [("y", None)], {"s": np.ones(4, np.float32)}, opset=13)
    g, changes = check(m, "fold_constants", tol=1e-6)
    assert [x.op for x in g.nodes] == ["Relu"] and any("removed Resize" in c for _, c in changes)

def test_nhwc_flatten_into_matmul_rows():
    n = helper.make_node
    nodes = [n("Transpose", ["x"], ["t"], perm=[0, 2, 3, 1]), n("Reshape", ["t", "s"], ["f"]),
             n("MatMul", ["f", "w"], ["y"])]
    m = make_model(nodes, [X], [("y", None)], {"s": np.array([1, -1], np.int64), "w": rand(256, 10)})
    g, changes = check(m, "normalize_flatten")
    assert [x.op for x in g.nodes] == ["Flatten", "MatMul"]


def test_matmul_and_bias_to_1x1_conv():
    n = helper.make_node
    nodes = [n("GlobalAveragePool", ["x"], ["p"]), n("Flatten", ["p"], ["f"]), n("MatMul", ["f", "w"], ["mm"]),
             n("Add", ["mm", "b"], ["y"])]
    m = make_model(nodes, [X], [("y", None)], {"w": rand(4, 10), "b": rand(10)})
    g, changes = check(m, None)
    assert g.op_counts() == {"GlobalAveragePool": 1, "Conv": 1, "Reshape": 1}  # Flatten+Reshape cancelled
    c = next(x for x in g.nodes if x.op == "Conv")
    assert g.shape(c.inputs[0]) == (1, 4, 1, 1) and c.attrs["kernel"] == (1, 1) and len(c.fused) == 2


def test_gemm_transb_and_too_wide_matmul():
    n = helper.make_node
    nodes = [n("Flatten", ["x"], ["f"]), n("Gemm", ["f", "w", "b"], ["y"], transB=1, alpha=0.5, beta=2.0)]
    g, _ = check(make_model(nodes, [X], [("y", None)], {"w": rand(7, 256), "b": rand(7)}), "matmul_to_conv")
    assert g.op_counts()["Conv"] == 1
    nodes = [n("Flatten", ["x"], ["f"]), n("MatMul", ["f", "w"], ["y"])]
    g, changes = check(make_model(nodes, [("x", [1, 4, 32, 32])], [("y", None)], {"w": rand(4096, 3)}),
                       "matmul_to_conv")
    assert "MatMul" in g.op_counts() and "over the KPU" in changes[0][1]


def test_bias_of_a_too_wide_matmul_stays_in_the_dense_layer():
    """MobileNetV2's 1280-input classifier as onnxruntime's QOperator files give it, MatMul then Add
    of the bias: the bias goes into the (split) dense layer, not a 1000x1000 diagonal conv of its
    own (981 KiB of weights); its 1,280 inputs one 3x3 conv on a 143x3x3 map (wide_dense)."""
    n = helper.make_node
    nodes = [conv("c", "x", "wc"), n("GlobalAveragePool", ["c"], ["p"]), n("Flatten", ["p"], ["f"]),
             n("MatMul", ["f", "w"], ["mm"]), n("Add", ["b", "mm"], ["y"])]
    m = make_model(nodes, [X], [("y", None)], {"wc": rand(1280, 4, 1, 1), "w": rand(1280, 20, scale=0.1),
                                                "b": rand(20)})
    g, _ = check(m, None, tol=1e-4)
    convs = [g.const(c.inputs[1]).shape for c in g.nodes if c.op == "Conv"]
    assert convs == [(640, 4, 1, 1)] * 2 + [(20, 143, 3, 3)]      # the conv's two slices, no diagonal conv


def test_zero_pad_absorbed_into_conv():
    n = helper.make_node
    nodes = [n("Pad", ["x", "p"], ["xp"]), conv("y", "xp", "w", strides=[2, 2])]
    m = make_model(nodes, [X], [("y", None)], {"p": np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64), "w": rand(4, 4, 3, 3)})
    g, _ = check(m, "pad_into_conv")
    assert g.op_counts() == {"Conv": 1} and g.nodes[0].attrs["pads"] == [1, 1, 1, 1]
    # a non-zero pad value: Add(-v) before, v*sum(W) into the bias (exact)
    nodes = [n("Pad", ["x", "p", "v"], ["xp"]), conv("y", "xp", "w")]
    m = make_model(nodes, [X], [("y", None)], {"p": np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64),
                                                "v": np.float32(1), "w": rand(4, 4, 3, 3)})
    g, changes = check(m, "pad_into_conv")
    assert g.op_counts() == {"Add": 1, "Conv": 1} and "value 1" in changes[0][1]
    # opset 18's Pad with an `axes` input (PyTorch 2's exports, hunt 20): pads on H and W only
    nodes = [n("Pad", ["x", "p", "", "ax"], ["xp"]), conv("y", "xp", "w")]
    m = make_model(nodes, [X], [("y", None)], {"p": np.array([1, 2, 1, 0], np.int64), "ax": np.array([2, 3], np.int64),
                                                "w": rand(4, 4, 3, 3)}, opset=18)
    g, _ = check(m, "pad_into_conv")
    assert g.op_counts() == {"Conv": 1} and g.nodes[0].attrs["pads"] == [1, 2, 1, 0]


@pytest.mark.parametrize("pool,fused", [
    (dict(op_type="MaxPool", kernel_shape=[2, 2], strides=[2, 2]), True),
    (dict(op_type="AveragePool", kernel_shape=[4, 4], strides=[4, 4]), True),
    (dict(op_type="MaxPool", kernel_shape=[2, 2], strides=[1, 1], pads=[0, 0, 1, 1]), True),
    (dict(op_type="MaxPool", kernel_shape=[3, 3], strides=[2, 2]), False),
    (dict(op_type="AveragePool", kernel_shape=[2, 2], strides=[1, 1], pads=[0, 0, 1, 1]), False)])
def test_fuse_pool(pool, fused):
    op = pool.pop("op_type")
    nodes = [conv("c", "x", "w", pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node(op, ["r"], ["y"], **pool)]
    # 16x16: a 4x4 pool of the 8x8 X would be a 2x2 KPU output, under its 4x4 minimum (not fused)
    g, log = check(make_model(nodes, [("x", [1, 4, 16, 16])], [("y", None)], {"w": rand(8, 4, 3, 3)}), None)
    assert (g.op_counts() == {"Conv": 1}) == fused
    if fused:
        p = g.nodes[0].attrs["pool"]
        assert p["size"] == pool["kernel_shape"][0] and p["stride"] == pool["strides"][0]
        assert g.nodes[0].attrs["activation"] == {"op": "Relu"}


def test_pool_not_fused_into_depthwise():
    nodes = [conv("c", "x", "w", group=4, pads=[1, 1, 1, 1]),
             helper.make_node("MaxPool", ["c"], ["y"], kernel_shape=[2, 2], strides=[2, 2])]
    g, _ = check(make_model(nodes, [X], [("y", None)], {"w": rand(4, 1, 3, 3)}), None)
    assert g.op_counts() == {"Conv": 1, "MaxPool": 1}


def test_kpu_padding_is_opt_in_and_changes_math():
    m = make_model([conv("y", "x", "w", strides=[2, 2], pads=[0, 0, 1, 1])], [X], [("y", None)],
                   {"w": rand(4, 4, 3, 3)})
    g, _ = check(m, None)
    assert g.nodes[0].attrs["pads"] == [0, 0, 1, 1]  # default keeps the real padding
    g2, log = run_pipeline(from_onnx(m), {"kpu_padding": True})
    assert g2.nodes[0].attrs["pads"] == [1, 1, 1, 1] and g2.shape("y") == g.shape("y")
    entry = next(e for e in log if e["pass"] == "kpu_padding")
    assert not entry["exact"] and "CHANGES MATH" in entry["changes"][0][1]
    x = rand(1, 4, 8, 8)
    assert not np.allclose(run(g, x)["y"], run(g2, x)["y"], atol=1e-3)


def test_unsupported_op_names_node_and_nearest_form():
    from tl2k210.errors import UnsupportedOpError
    from tl2k210.k210.lower import Options, plan_format
    m = make_model([helper.make_node("Einsum", ["x", "w"], ["y"], name="ein1", equation="nchw,hk->nchk")],
                   [X], [("y", None)], {"w": rand(8, 8)})
    with pytest.raises(UnsupportedOpError, match=r"'ein1'.*Einsum.*Dense \(MatMul\)"):
        run_pipeline(from_onnx(m))
    m = make_model([helper.make_node("Resize", ["x", "", "s"], ["y"], mode="cubic")], [X], [("y", None)],
                   {"s": np.array([1, 1, 2, 2], np.float32)})
    with pytest.raises(UnsupportedOpError, match="mode nearest"):
        run_pipeline(from_onnx(m))
    # what kmodel v3 lacks but v4 has passes the pipeline and plans as v4
    for node in (helper.make_node("ConvTranspose", ["x", "w"], ["y"], name="deconv1", strides=[2, 2]),
                 helper.make_node("Resize", ["x", "", "s"], ["y"], name="up", mode="linear",
                                  coordinate_transformation_mode="align_corners")):    # v3: half_pixel 2x only
        m = make_model([node], [X], [("y", None)], {"w": rand(4, 4, 2, 2), "s": np.array([1, 1, 2, 2], np.float32)})
        g, _ = run_pipeline(from_onnx(m))
        assert plan_format(g, Options())[0] == "v4"
        with pytest.raises(UnsupportedOpError, match="needs kmodel v4"):
            plan_format(g, Options(format="v3"))


def test_dense_relu_dense_chain_becomes_two_fused_convs():
    n = helper.make_node
    nodes = [n("Gemm", ["x", "w1", "b1"], ["h"], transB=1), n("Relu", ["h"], ["r"]),
             n("Gemm", ["r", "w2", "b2"], ["y"], transB=1)]
    m = make_model(nodes, [("x", [1, 4])], [("y", None)],
                   {"w1": rand(10, 4), "b1": rand(10), "w2": rand(3, 10), "b2": rand(3)})
    g, _ = check(m, None)
    assert [x.op for x in g.nodes] == ["Reshape", "Conv", "Conv", "Reshape"]
    assert g.nodes[1].attrs["activation"] == {"op": "Relu"}


def test_push_transposes_cancels_nhwc_pairs():
    n = helper.make_node
    nodes = [n("Transpose", ["x"], ["t"], perm=[0, 2, 3, 1]), n("Add", ["t", "c"], ["a"]),  # per-channel NHWC const
             n("Relu", ["a"], ["r"]), n("Mul", ["t", "r"], ["m"]),
             n("Transpose", ["m"], ["y"], perm=[0, 3, 1, 2])]
    g, _ = check(make_model(nodes, [X], [("y", None)], {"c": rand(4)}), None, options={"check_supported": False})
    assert g.op_counts() == {"Conv": 1, "Mul": 1}   # the per-channel Add + ReLU: a 1x1 depthwise conv


def test_push_transposes_sees_a_reshape_that_moves_size_1_axes():
    # MediaPipe's selfie segmenter (tf2onnx): Conv -> Transpose to NHWC, multiplied by its
    # squeeze-and-excite scale Reshaped (1, C, 1, 1) -> (1, 1, 1, C), then back to NCHW. The
    # pairs had stayed as 20 uint8 transposes of whole maps (and a 256 KiB copy at the peak)
    n = helper.make_node
    nodes = [conv("c", "x", "w", pads=[1, 1, 1, 1]), n("Transpose", ["c"], ["t"], perm=[0, 2, 3, 1]),
             n("GlobalAveragePool", ["c"], ["p"]), conv("e", "p", "we"), n("Sigmoid", ["e"], ["sg"]),
             n("Reshape", ["sg", "shape"], ["sr"]), n("Mul", ["t", "sr"], ["m"]),
             n("Transpose", ["m"], ["y"], perm=[0, 3, 1, 2])]
    inits = {"w": rand(4, 4, 3, 3), "we": rand(4, 4, 1, 1), "shape": np.array([1, 1, 1, 4], np.int64)}
    g, _ = check(make_model(nodes, [X], [("y", None)], inits), None)
    assert "Transpose" not in g.op_counts() and g.op_counts()["Mul"] == 1


@pytest.mark.parametrize("order", [("Min", "Max"), ("Max", "Min")])
def test_scalar_min_and_max_become_one_clip_in_the_conv(order):
    # TF1's clip_by_value / ReLU6 in frozen graphs: Minimum(x, 6) and Maximum(0) after a conv were a
    # CPU table each (ARM ML-examples' MobileNet: 54 of them, 70 % of its estimated time)
    n = helper.make_node
    bound = {"Min": "six", "Max": "zero"}
    nodes = [conv("c", "x", "w", pads=[1, 1, 1, 1]), n(order[0], ["c", bound[order[0]]], ["a"]),
             n(order[1], [bound[order[1]], "a"], ["y"])]
    inits = {"w": rand(4, 4, 3, 3), "six": np.array(6, np.float32), "zero": np.array(0, np.float32)}
    g, _ = check(make_model(nodes, [X], [("y", None)], inits), None)
    assert g.op_counts() == {"Conv": 1}
    assert g.nodes[0].attrs["activation"] == {"op": "Clip", "min": 0.0, "max": 6.0}


def test_a_pad_of_nothing_is_dropped():
    # PyTorch's AvgPool export writes a Pad of zeros before each pool (cunjian's PFLD): a CPU pad
    # layer that only kmodel v4 has, so the whole model left v3 for nothing
    n = helper.make_node
    nodes = [conv("c", "x", "w", pads=[1, 1, 1, 1]), n("Pad", ["c", "p"], ["q"], mode="constant"),
             n("AveragePool", ["q"], ["y"], kernel_shape=[2, 2], strides=[2, 2])]
    g, _ = check(make_model(nodes, [X], [("y", None)], {"w": rand(4, 4, 3, 3), "p": np.zeros(8, np.int64)}), None)
    assert "Pad" not in g.op_counts()


@pytest.mark.parametrize("eps", [1e-9, 1e-3])
def test_a_centred_map_times_itself_plus_a_tiny_eps_is_its_square(eps):
    """onnx.js's instance norm (gnsmrky's udnie, candy) squares its centred map as d * (d + 1e-9):
    d * d within float32 rounding, the square the normalization forms look for (lower/v4norm.py).
    An eps that moves the products (1e-3) stays."""
    n = helper.make_node
    nodes = [conv("c", "x", "w", pads=[1, 1, 1, 1]), n("ReduceMean", ["c"], ["m"], axes=[2, 3]),
             n("Sub", ["c", "m"], ["d"]), n("Add", ["d", "e"], ["de"]), n("Mul", ["d", "de"], ["sq"]),
             n("ReduceMean", ["sq"], ["y"], axes=[2, 3])]
    m = make_model(nodes, [X], [("y", None)], {"w": rand(4, 4, 3, 3), "e": np.array(eps, np.float32)})
    g, changes = check(m, "fold_constants")
    mul = next(x for x in g.nodes if x.op == "Mul")
    assert ("Add" in g.op_counts()) == (eps > 1e-6) and (mul.inputs == ["d", "d"]) == (eps < 1e-6)


@pytest.mark.parametrize("k", [0.0, 0.5])
def test_a_scalar_add_on_a_table_of_rows(k):
    # onnx.js's exports (gnsmrky's fast neural style) upsample through (N, 1) tables and add 0.0
    # to them: the Add was taken for a vector's per-channel affine, reshaped to (1, 1, 1, 1), and
    # refused as the model's fault. x + 0 is x; x + 0.5 stays an Add of the table
    n = helper.make_node
    nodes = [conv("c", "x", "w", pads=[1, 1, 1, 1]), n("Reshape", ["c", "s1"], ["r"]), n("Add", ["r", "k"], ["a"]),
             n("Reshape", ["a", "s2"], ["y"])]
    inits = {"w": rand(4, 4, 3, 3), "s1": np.array([-1, 1], np.int64), "k": np.array(k, np.float32),
             "s2": np.array([1, 4, 8, 8], np.int64)}
    g, _ = check(make_model(nodes, [X], [("y", None)], inits), None)
    assert ("Add" in g.op_counts()) == (k != 0)


def test_push_transposes_passes_a_computed_scalar():
    # OpenVINO's re-identification nets (tf2onnx): a normalization over the whole map in NHWC,
    # d = x - mean(x), Transpose to NHWC, divided by its deviation sqrt(mean(d²) + eps) -- a
    # computed (1, 1, 1, 1) tensor -- times gamma plus beta per channel, ReLU, Transpose back.
    # The scalar stopped the Transpose: 1 MiB float transposes and a third float copy of the map
    n = helper.make_node
    nodes = [n("ReduceMean", ["x"], ["m"], keepdims=1), n("Sub", ["x", "m"], ["d"]),
             n("Transpose", ["d"], ["t"], perm=[0, 2, 3, 1]), n("Mul", ["t", "t"], ["d2"]),
             n("ReduceMean", ["d2"], ["v"], keepdims=1), n("Add", ["v", "eps"], ["ve"]), n("Sqrt", ["ve"], ["sd"]),
             n("Div", ["t", "sd"], ["nm"]), n("Mul", ["nm", "gamma"], ["sc"]), n("Add", ["sc", "beta"], ["b"]),
             n("Relu", ["b"], ["r"]), n("Transpose", ["r"], ["y"], perm=[0, 3, 1, 2])]
    inits = {"eps": np.array(1e-3, np.float32), "gamma": rand(1, 1, 1, 4) + 2, "beta": rand(4)}
    g, _ = check(make_model(nodes, [X], [("y", None)], inits), None, options={"check_supported": False})
    assert "Transpose" not in g.op_counts()
    div = next(x for x in g.nodes if x.op == "Div")
    assert g.shape(div.outputs[0]) == g.shape("x")        # the map divided in its own NCHW layout


def test_push_transposes_passes_a_computed_per_channel_operand():
    """AnimeGANv2 (hunt 22): a layer norm's scale and shift per channel, computed (1, 1, 1, C)
    tensors, multiply and add the NHWC map after tf2onnx's Transpose; they stopped the Transpose,
    and the reflect pad after them reached the lowering NHWC, refused as a pad of "N or C". The
    operand goes through a Transpose of its few values; the map and its pad stay NCHW. Float-exact."""
    n = helper.make_node
    nodes = [n("Transpose", ["x"], ["t"], perm=[0, 2, 3, 1]), n("ReduceMean", ["x"], ["m"], keepdims=1),
             n("Mul", ["m", "gamma"], ["s"]), n("Mul", ["t", "s"], ["ms"]), n("Relu", ["ms"], ["r"]),
             n("Pad", ["r", "p"], ["pd"], mode="reflect"), n("Transpose", ["pd"], ["y"], perm=[0, 3, 1, 2])]
    inits = {"gamma": rand(4) + 2, "p": np.array([0, 0, 0, 0, 0, 1, 1, 0], np.int64)}
    g, _ = check(make_model(nodes, [X], [("y", None)], inits), None, options={"check_supported": False})
    pad = next(x for x in g.nodes if x.op == "Pad")
    assert g.shape(pad.inputs[0])[1] == 4            # channels first: the pad pads H and W of the NCHW map


@pytest.mark.parametrize("group,bias,pads,ops", [
    (1, True, [0, 0, 1, 1], {"Conv": 1, "DepthToSpace": 1}),
    (2, False, [0, 0, 1, 1], {"Conv": 1, "DepthToSpace": 1}),
    (1, True, [1, 1, 1, 1], {"ConvTranspose": 1})])
def test_batchnorm_folds_into_a_transposed_conv(group, bias, pads, ops):
    # Keras Conv2DTranspose(3, strides 2, 'same') + BatchNormalization: the transposed conv becomes
    # its phases' 3x3 conv + DepthToSpace and the BN folds into that conv through the shuffle; the
    # one of output 2H - 1 stays a float conv2d_transpose, the BN folded into it
    n = helper.make_node
    nodes = [n("ConvTranspose", ["x", "w"] + (["b"] if bias else []), ["t"], strides=[2, 2], pads=pads,
               group=group),
             n("BatchNormalization", ["t", "s", "o", "m", "v"], ["y"])]
    inits = {"w": rand(4, 6 // group, 3, 3), "b": rand(6), "s": rand(6) + 2, "o": rand(6), "m": rand(6),
             "v": np.abs(rand(6)) + 0.5}
    g, _ = check(make_model(nodes, [X], [("y", None)], inits), None)
    assert g.op_counts() == ops


def test_activation_fuses_into_a_conv_through_depth_to_space():
    # Conv2DTranspose(3, 2, 'same') + ReLU: the ReLU after the phases' pixel shuffle fuses into
    # their conv, so the conv's uint8 grid spans [0, max], not the negative half the ReLU drops
    n = helper.make_node
    nodes = [n("ConvTranspose", ["x", "w", "b"], ["t"], strides=[2, 2], pads=[0, 0, 1, 1]),
             n("Relu", ["t"], ["y"])]
    g, _ = check(make_model(nodes, [X], [("y", None)], {"w": rand(4, 6, 3, 3), "b": rand(6)}), None)
    assert [(n.op, (n.attrs.get("activation") or {}).get("op")) for n in g.nodes] == \
        [("Conv", "Relu"), ("DepthToSpace", None)]
    assert g.nodes[-1].outputs == ["y"]


@pytest.mark.parametrize("mode", ["CRD", "DCR"])
def test_affine_folds_into_a_conv_through_depth_to_space(mode):
    # a per-channel Mul and Add after a pixel shuffle fold into the conv before it: channel c of
    # the shuffle is conv channels 4c..4c+3 (CRD) or c, c+3, c+6, c+9 (DCR)
    n = helper.make_node
    nodes = [conv("c", "x", "w", pads=[1, 1, 1, 1]), n("DepthToSpace", ["c"], ["d"], blocksize=2, mode=mode),
             n("Mul", ["d", "k"], ["m"]), n("Add", ["m", "a"], ["y"])]
    inits = {"w": rand(12, 4, 3, 3), "k": rand(1, 3, 1, 1) + 2, "a": rand(3, 1, 1)}
    g, _ = check(make_model(nodes, [X], [("y", None)], inits), None)
    assert g.op_counts() == {"Conv": 1, "DepthToSpace": 1}


def test_push_transposes_moves_an_nhwc_pad_into_the_conv():
    # Keras' MobileNetV3Small (tf2onnx): ZeroPadding2D between NHWC pairs before each stride-2
    # depthwise conv. The Pad stayed a CPU layer between two whole-map transposes (kmodel v3,
    # which has no pad layer, refused the model; v4 kept 467,856 B of main memory, now 250,880 B)
    n = helper.make_node
    nodes = [conv("c", "x", "w", pads=[1, 1, 1, 1]), n("Transpose", ["c"], ["t"], perm=[0, 2, 3, 1]),
             n("Pad", ["t", "pads"], ["p"]), n("Transpose", ["p"], ["u"], perm=[0, 3, 1, 2]),
             conv("y", "u", "wd", group=4, strides=[2, 2])]
    inits = {"w": rand(4, 4, 3, 3), "wd": rand(4, 1, 3, 3), "pads": np.array([0, 0, 0, 0, 0, 1, 1, 0], np.int64)}
    g, _ = check(make_model(nodes, [X], [("y", None)], inits), None)
    assert g.op_counts() == {"Conv": 2}
    assert g.nodes[1].attrs["pads"] == [0, 0, 1, 1]


def test_reduce_mean_through_transpose_becomes_global_pool():
    n = helper.make_node
    nodes = [n("Transpose", ["x"], ["t"], perm=[0, 2, 3, 1]), n("ReduceMean", ["t"], ["y"], axes=[1, 2], keepdims=0)]
    g, _ = check(make_model(nodes, [X], [("y", None)]), None)
    assert [x.op for x in g.nodes] == ["GlobalAveragePool", "Flatten"]


@pytest.mark.parametrize("swish", [False, True])
def test_keras3_hard_sigmoid_and_hard_swish(swish):
    n = helper.make_node
    nodes = [conv("c", "x", "w", pads=[1, 1, 1, 1]), n("Add", ["c", "three"], ["a"]),
             n("Clip", ["a", "lo", "hi"], ["cl"]), n("Div", ["cl", "six"], ["hs"])]
    nodes += [n("Mul", ["c", "hs"], ["y"])] if swish else [n("Identity", ["hs"], ["y"])]
    inits = {"w": rand(4, 4, 3, 3), "three": np.float32(3), "lo": np.float32(0), "hi": np.float32(6),
             "six": np.float32(6)}
    g, _ = check(make_model(nodes, [X], [("y", None)], inits), None, x=rand(1, 4, 8, 8, scale=3))
    act = g.nodes[0].attrs["activation"]
    assert g.op_counts() == {"Conv": 1}
    assert act == {"op": "HardSwish"} if swish else (act["op"] == "HardSigmoid" and act["alpha"] == pytest.approx(1 / 6))


@pytest.mark.parametrize("order", ["min_relu", "max_min", "clip"])
def test_keras2_hard_sigmoid(order):
    """tf_keras's hard_sigmoid clip(0.2 x + 0.5, 0, 1) as TF writes it (Mul, Add, Minimum(1) then
    Relu, or Maximum(0) then Minimum(1), or a Clip): one HardSigmoid(0.2, 0.5), a KPU table, in
    hard_swish's x * hard_sigmoid(x) too (it was an affine conv and two clamp tables, each
    rounding: pp_lcnet96_float 17.9 dB, ideal 20.8, round 45). onnxruntime's values."""
    n = helper.make_node
    clamp = {"max_min": [n("Max", ["a", "zero"], ["m"]), n("Min", ["m", "one"], ["hs"])],
             "clip": [n("Clip", ["a", "zero", "one"], ["hs"])]}.get(order, [n("Min", ["a", "one"], ["m"]),
                                                                         n("Relu", ["m"], ["hs"])])
    nodes = [conv("c", "x", "w", pads=[1, 1, 1, 1]), n("Mul", ["c", "k"], ["s"]), n("Add", ["s", "half"], ["a"]),
             *clamp, n("Mul", ["c", "hs"], ["h"]), conv("d", "h", "w2", pads=[1, 1, 1, 1])]
    inits = {"w": rand(4, 4, 3, 3), "w2": rand(3, 4, 3, 3), "k": np.float32(0.2), "half": np.float32(0.5),
             "one": np.float32(1), "zero": np.float32(0)}
    m = make_model(nodes, [X], [("d", None)], inits)
    x = rand(1, 4, 8, 8, scale=3)
    g, changes = check(m, "hard_activations", x=x)
    assert g.op_counts() == {"Conv": 2, "Mul": 1, "HardSigmoid": 1}
    hs = next(n for n in g.nodes if n.op == "HardSigmoid")
    assert hs.attrs == {"alpha": pytest.approx(0.2), "beta": pytest.approx(0.5)}
    assert any("-> HardSigmoid(alpha=0.2, beta=0.5)" in msg for _, msg in changes)
    g, _ = check(m, None, x=x, tol=1e-4)
    assert g.op_counts() == {"Conv": 2, "Mul": 1, "HardSigmoid": 1}


# ---------------------------------------------------------------------------------------------
# standalone affines and pads
def _aff_nodes(kind, x, y):
    n = helper.make_node
    if kind == "bn":
        return [n("BatchNormalization", [x, "g", "be", "m", "v"], [y], epsilon=1e-3)]
    if kind == "sub_from":
        return [n("Sub", ["k", x], [y])]
    return [n({"mul": "Mul", "add": "Add", "div": "Div", "sub": "Sub"}[kind], [x, "k"], [y])]


AFF_INITS = {"g": rand(4), "be": rand(4), "m": rand(4), "v": np.abs(rand(4)) + 0.1, "k": rand(4, 1, 1) + 2}


@pytest.mark.parametrize("kind", ["bn", "mul", "add", "sub", "div", "sub_from"])
@pytest.mark.parametrize("pads", [0, 1])
def test_affine_before_conv_folds_or_becomes_a_depthwise_conv(kind, pads):
    """An affine between a ReLU and a Conv: into the conv's weights when exact (a scale, or a shift
    before an unpadded conv), else a 1x1 depthwise conv of its own. Float results unchanged."""
    n = helper.make_node
    nodes = [n("Relu", ["x"], ["r"])] + _aff_nodes(kind, "r", "a") + [conv("y", "a", "w", "b", pads=[pads] * 4)]
    m = make_model(nodes, [X], [("y", None)], {**AFF_INITS, "w": rand(6, 4, 3, 3), "b": rand(6)})
    g, log = check(m, None, tol=1e-4)
    convs = [c for c in g.nodes if c.op == "Conv"]
    shift = kind not in ("mul", "div")
    assert len(convs) == (2 if shift and pads else 1)
    if len(convs) == 2:
        assert convs[0].attrs["group"] == 4 and convs[0].attrs["kernel"] == (1, 1)


def test_standalone_affines_chain_into_one_conv():
    n = helper.make_node
    nodes = [n("Relu", ["x"], ["r"]), n("Mul", ["r", "k"], ["a"]), n("Add", ["a", "k2"], ["y"])]
    g, _ = check(make_model(nodes, [X], [("y", None)], {"k": rand(4, 1, 1), "k2": rand(1, 4, 1, 1)}), None)
    assert g.op_counts() == {"Relu": 1, "Conv": 1} and g.nodes[1].attrs["group"] == 4


def test_standalone_affine_on_a_vector_is_a_depthwise_conv_on_its_map():
    """A per-channel affine on a (1, C) vector: a depthwise 1x1 conv on the (1, C, 1, 1) map, C
    weights (hunt 22: MTCNN O-Net's 256 PReLU slopes had become a 256x256 diagonal dense layer,
    67 KB, and the 8-bit ideal counted it so); the lowering picks its form (tests/k210)."""
    n = helper.make_node
    nodes = [n("Relu", ["x"], ["r"]), n("BatchNormalization", ["r", "g", "be", "m", "v"], ["y"])]
    g, _ = check(make_model(nodes, [("x", [1, 4])], [("y", None)], AFF_INITS), None)
    c = next(c for c in g.nodes if c.op == "Conv")
    assert g.shape(c.inputs[0]) == (1, 4, 1, 1) and c.attrs["group"] == 4 and g.const(c.inputs[1]).size == 4


@pytest.mark.parametrize("value", [0.0, 0.7])
def test_pad_value_into_conv(value):
    """A constant Pad of any value before a conv: pads add up; a value v becomes Add(-v) before
    (here folded into the conv before) and v*sum(W) in the bias."""
    n = helper.make_node
    nodes = [conv("c", "x", "w0", "b0"), n("Pad", ["c", "p", "pv"], ["cp"]), conv("y", "cp", "w", "b")]
    m = make_model(nodes, [X], [("y", None)], {"w0": rand(4, 4, 1, 1), "b0": rand(4), "w": rand(6, 4, 3, 3),
                                               "b": rand(6), "p": np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64),
                                               "pv": np.float32(value)})
    g, log = check(m, None, tol=1e-4)
    assert g.op_counts() == {"Conv": 2} and g.nodes[-1].attrs["pads"] == [1, 1, 1, 1]


@pytest.mark.parametrize("value,folded", [(0.0, True), (-np.inf, True), (0.5, False)])
def test_pad_into_max_pool(value, folded):
    n = helper.make_node
    nodes = [n("Relu", ["x"], ["r"]), n("Pad", ["r", "p", "pv"], ["rp"]),
             n("MaxPool", ["rp"], ["y"], kernel_shape=[3, 3], strides=[2, 2])]
    m = make_model(nodes, [X], [("y", None)], {"p": np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64),
                                               "pv": np.float32(value)})
    g, _ = check(m, None, options={"check_supported": False})
    assert ("Pad" not in g.op_counts()) == folded


# ---------------------------------------------------------------------------------------------
# PReLU on the KPU
def _prelu_model(consumer, producer="conv", slopes=None):
    n = helper.make_node
    c = 4
    a = rand(c, 1, 1) if slopes is None else np.asarray(slopes, np.float32).reshape(c, 1, 1)
    inits = {"w0": rand(c, 4, 3, 3), "b0": rand(c), "a": a, "w1": rand(6, c, 3, 3), "b1": rand(6),
             "wd": rand(c, 1, 3, 3), "bd": rand(c), "wg": rand(6, 2, 1, 1), "bg": rand(6)}
    nodes = [conv("c0", "x", "w0", "b0", pads=[1, 1, 1, 1])] if producer == "conv" else \
        [n("Relu", ["x"], ["c0"])]
    nodes.append(n("PRelu", ["c0", "a"], ["p"]))
    if consumer == "dense":
        nodes.append(conv("y", "p", "w1", "b1", pads=[1, 1, 1, 1]))
    elif consumer == "depthwise":
        nodes.append(conv("y", "p", "wd", "bd", pads=[1, 1, 1, 1], group=c))
    elif consumer == "grouped":
        nodes.append(conv("y", "p", "wg", "bg", group=2))
    elif consumer == "add":
        nodes += [conv("d", "p", "wd", "bd", pads=[1, 1, 1, 1], group=c), n("Add", ["p", "d"], ["y"])]
    else:
        nodes.append(n("Identity", ["p"], ["y"]))
    return make_model(nodes, [X], [("y", None)], inits)


@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("consumer", ["dense", "depthwise", "grouped", "add", "output"])
@pytest.mark.parametrize("producer", ["conv", "other"])
def test_prelu_split(consumer, producer, residual):
    """PReLU becomes ReLU on a doubled layer and weights [W, -sign(a)W] after it; with pass
    prelu_residual, where that pair needs a layer of its own (a split or a join), y +
    relu(-(1-a)⁺y) - relu(-(a-1)⁺y) instead: two 1x1 depthwise ReLU convs of c weights and residual
    adds, the readers unchanged. Float-exact, no PRelu left, negative, zero and over-1 slopes."""
    m = _prelu_model(consumer, producer, slopes=[0.25, -0.5, 0.0, 1.5])
    g, log = check(m, None, x=rand(1, 4, 8, 8, scale=2), tol=1e-4, options={"prelu_residual": residual})
    assert "PRelu" not in g.op_counts()
    convs = [c for c in g.nodes if c.op == "Conv"]
    relus = [c for c in convs if c.attrs.get("activation") == {"op": "Relu"}]
    fused = producer == "conv" and consumer in ("dense", "depthwise", "grouped")
    if residual and not fused:
        assert [(g.shape(c.outputs[0])[1], c.attrs["group"], c.attrs["kernel"]) for c in relus] == [(4, 4, (1, 1))] * 2
        assert all(g.shape(c.outputs[0])[1] < 8 for c in convs)          # nothing doubled
        assert g.op_counts()["Sub"] == 1
    else:
        assert [g.shape(c.outputs[0])[1] for c in relus] == [8]
        joins = [c for c in convs if c.name.endswith("/join")]
        assert bool(joins) == (consumer in ("add", "output"))



@pytest.mark.parametrize("consumer", ["depthwise", "grouped", "dense"])
def test_prelu_residual_grouped_takes_the_prelus_grouped_convs_read(consumer):
    """Pass prelu_residual_grouped (the compiler's choice where the pair's group convs exceed the
    KPU, and --optimize size's): a conv -> PReLU -> depthwise or grouped conv takes the residual
    form, the reader unchanged; an ungrouped reader keeps the fused pair. Float-exact."""
    m = _prelu_model(consumer, "conv", slopes=[0.25, -0.5, 0.0, 1.5])
    g, log = check(m, None, x=rand(1, 4, 8, 8, scale=2), tol=1e-4, options={"prelu_residual_grouped": True})
    assert "PRelu" not in g.op_counts()
    residual = next(p["changes"] for p in log if p["pass"] == "prelu_residual_grouped")
    assert bool(residual) == (consumer != "dense")

@pytest.mark.parametrize("form", ["add", "sub", "mtcnn"])
def test_prelu_pattern_from_keras(form):
    """Keras 3 PReLU through tf2onnx: relu(y) + (-a)·relu(-y) (Relu, Neg, Relu, Mul, Add) -> PRelu,
    then prelu_split: no Neg/Mul left, float-exact. TF MTCNN's relu(y) + a·(-relu(-y)) (one more
    Neg; hunt 22: each of O-Net's 5 PReLUs had been 6 layers, CPU tables and adds) too."""
    n = helper.make_node
    c = -rand(1, 4, 1, 1) if form == "add" else rand(1, 4, 1, 1)
    rn = [n("Relu", ["nc"], ["rn0"]), n("Neg", ["rn0"], ["rn"])] if form == "mtcnn" else [n("Relu", ["nc"], ["rn"])]
    nodes = [conv("c", "x", "w", "b", pads=[1, 1, 1, 1]), n("Relu", ["c"], ["pos"]), n("Neg", ["c"], ["nc"]),
             *rn, n("Mul", ["rn", "k"], ["neg"]),
             n("Sub" if form == "sub" else "Add", ["pos", "neg"], ["p"]), conv("y", "p", "w2", "b2")]
    m = make_model(nodes, [X], [("y", None)], {"w": rand(4, 4, 3, 3), "b": rand(4), "k": c,
                                               "w2": rand(6, 4, 1, 1), "b2": rand(6)})
    g, log = check(m, None, x=rand(1, 4, 8, 8, scale=2), tol=1e-4)
    assert g.op_counts() == {"Conv": 2}
    assert any(e["pass"] == "prelu_pattern" and e["changes"] for e in log)


def test_a_written_out_softmax_of_a_vector_is_a_softmax_node():
    """TF MTCNN's class scores: exp(x - max(x)) / sum(exp(x - max(x))) over a dense layer's (1, 2)
    vector (ReduceMax, Sub, Exp, ReduceSum, Div: no kmodel v3 layer, so O-Net went v4; hunt 22)
    becomes one Softmax node (v3's SOFTMAX). Float-exact."""
    n = helper.make_node
    ax = {"axes": [1], "keepdims": 1}
    nodes = [n("Gemm", ["x", "w", "b"], ["l"], transB=1), n("ReduceMax", ["l"], ["m"], **ax),
             n("Sub", ["l", "m"], ["d"]), n("Exp", ["d"], ["e"]), n("ReduceSum", ["e", "a"], ["s"], keepdims=1),
             n("Div", ["e", "s"], ["y"])]
    m = make_model(nodes, [("x", [1, 8])], [("y", None)], {"w": rand(2, 8), "b": rand(2),
                                                          "a": np.array([1], np.int64)})
    g, log = check(m, None, x=rand(1, 8, scale=3), tol=1e-5)
    assert "Softmax" in g.op_counts() and not {"ReduceMax", "Exp", "Div"} & set(g.op_counts())


@pytest.mark.parametrize("reader", ["conv", "add"])
def test_prelu_pattern_as_max_of_y_and_its_slope(reader):
    """PINTO's int8 FaceMesh writes PReLU as max(y, a·y) (MUL, MAXIMUM; hunt 22): a Max no kmodel v3
    layer has, run on the CPU. With slopes a <= 1 it is PRelu(y, a); a slope over 1 (its learned
    slopes reach 1.41) is a·PReLU(y, 1/a): the conv writing y scaled where the pattern alone
    reads it, else a Mul after the PRelu. Float-exact; no Max left."""
    n = helper.make_node
    k = np.array([0.25, -0.6, 1.0, 1.4], np.float32).reshape(1, 4, 1, 1)
    nodes = [conv("c", "x", "w", "b", pads=[1, 1, 1, 1]), n("Mul", ["c", "k"], ["ac"]), n("Max", ["ac", "c"], ["p"])]
    nodes += [conv("y", "p", "w2", "b2")] if reader == "conv" else [n("Add", ["p", "c"], ["y"])]
    m = make_model(nodes, [X], [("y", None)], {"w": rand(4, 4, 3, 3), "b": rand(4), "k": k,
                                               "w2": rand(6, 4, 1, 1), "b2": rand(6)})
    g, log = check(m, None, x=rand(1, 4, 8, 8, scale=2), tol=1e-4)
    assert "Max" not in g.op_counts() and "Mul" not in g.op_counts()
    assert any(e["pass"] == "prelu_pattern" and e["changes"] for e in log)


def test_stride2_even_maps():
    """A VALID stride-2 conv whose only consumer (a stride-2 conv or pool, no padding on that
    side) never reads one more row pads that side by one: the float outputs are the same and
    its map is half its input (even, for the next stride-2 conv); per axis. Not when the
    consumer pads that side, reads the map twice, or the map is a graph output."""
    n = helper.make_node
    nodes = [conv("a", "x", "wa", "ba", kernel_shape=[3, 3], strides=[2, 2]),         # 47x40 -> 23x19 (23x20)
             conv("b", "a", "wb", "bb", kernel_shape=[3, 3], strides=[2, 2]),         # -> 11x9 (11x10)
             n("MaxPool", ["b"], ["p"], kernel_shape=[3, 3], strides=[2, 2]),         # -> 5x4
             conv("c", "p", "wc", "bc", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
             conv("d", "x", "wd", "bd", kernel_shape=[3, 3], strides=[2, 2]),         # read twice
             conv("e", "d", "we", "be", kernel_shape=[3, 3], strides=[2, 2], pads=[0, 0, 1, 0]),
             n("Relu", ["d"], ["r"]), n("Add", ["c", "c"], ["y"])]
    inits = {f"w{k}": rand(4, 4 if k not in "ad" else 3, 3, 3, scale=0.3) for k in "abcde"}
    inits.update({f"b{k}": rand(4) for k in "abcde"})
    m = make_model(nodes, [("x", [1, 3, 47, 40])], [("y", None), ("e", None), ("r", None)], inits)
    g, changes = check(m, "stride2_even_maps", tol=1e-4)
    pads = {nd.name: nd.attrs["pads"] for nd in g.nodes if nd.op == "Conv"}
    assert pads == {"a": [0, 0, 0, 1], "b": [0, 0, 0, 1], "c": [1, 1, 1, 1], "d": [0, 0, 0, 0], "e": [0, 0, 1, 0]}
    assert g.shape("a")[2:] == (23, 20) and g.shape("b")[2:] == (11, 10) and g.shape("p")[2:] == (5, 4)
    assert [c for c, _ in changes] == ["a", "b"]


@pytest.mark.parametrize("op,attrs,inits", [
    ("Conv", dict(kernel_shape=[3], pads=[2, 1], strides=[2], dilations=[2], group=2),
     {"w": rand(6, 2, 3), "b": rand(6)}),
    ("MaxPool", dict(kernel_shape=[3], pads=[1, 1], strides=[2]), {}),
    ("AveragePool", dict(kernel_shape=[2], strides=[2]), {}),
    ("BatchNormalization", {}, {"s": rand(4), "b": rand(4), "m": rand(4), "v": np.abs(rand(4)) + 0.5}),
    ("PRelu", {}, {"a": rand(4, 1)}),
])
def test_spatial_1d_ops_become_2d(op, attrs, inits):
    """Conv1d/MaxPool1d/AvgPool1d/BatchNorm1d/PReLU on (N, C, L) as their 2-D forms on (N, C, 1, L):
    float-exact, two 1-D layers in a row share one Unsqueeze/Squeeze."""
    names = list(inits)
    first = helper.make_node(op, ["x"] + names, ["h"], **attrs)
    second = helper.make_node("Relu", ["h"], ["r"])
    third = helper.make_node("MaxPool", ["r"], ["y"], kernel_shape=[2], strides=[1])
    m = make_model([first, second, third], [("x", [1, 4, 12])], [("y", None)], inits)
    g, changes = check(m, "spatial_1d")
    assert all(len(g.shape(n.outputs[0])) == 4 for n in g.nodes if n.op in (op, "MaxPool"))
    assert [n.op for n in g.nodes].count("Unsqueeze") == 1 and [n.op for n in g.nodes].count("Squeeze") == 1
    assert len(changes) == 3


def test_a_keras_conv1d_bias_after_its_squeeze_folds_into_the_conv():
    """Keras' Conv1D through tf2onnx: Unsqueeze -> Conv (no bias) -> Squeeze -> Add (its bias,
    (1, C, 1)) -> Relu -> Unsqueeze -> the next Conv1D. The Squeeze moves below the Add and the
    Relu, meets the Unsqueeze and cancels; the bias folds into the conv and the ReLU fuses (each
    Add had been a uint8 CPU layer of its own, rounding the map once more: hunt 17's voice
    emotion net, 17.4 -> 36.8 dB)."""
    n = helper.make_node
    ax = {"ax": np.array([2], np.int64)}
    nodes = [n("Unsqueeze", ["x", "ax"], ["x4"]), n("Conv", ["x4", "w1"], ["c1"], pads=[0, 2, 0, 2]),
             n("Squeeze", ["c1", "ax"], ["s1"]), n("Add", ["s1", "b1"], ["a1"]), n("Relu", ["a1"], ["r1"]),
             n("Unsqueeze", ["r1", "ax"], ["u2"]), n("Conv", ["u2", "w2"], ["c2"], pads=[0, 1, 0, 1]),
             n("Squeeze", ["c2", "ax"], ["s2"]), n("Add", ["b2", "s2"], ["a2"]), n("Mul", ["a2", "rows"], ["y"])]
    m = make_model(nodes, [("x", [1, 3, 20])], [("y", None)],
                   {**ax, "w1": rand(8, 3, 1, 5, scale=0.3), "b1": rand(1, 8, 1), "w2": rand(4, 8, 1, 3, scale=0.3),
                    "b2": rand(4, 1), "rows": rand(1, 20)})
    g, _ = check(m, None)
    convs = [nd for nd in g.nodes if nd.op == "Conv"]
    assert [nd.attrs.get("activation", {}).get("op") for nd in convs] == ["Relu", None]
    assert all(len(nd.inputs) == 3 for nd in convs)          # both biases folded
    assert [nd.op for nd in g.nodes].count("Add") == 0 and [nd.op for nd in g.nodes].count("Unsqueeze") == 0
    assert g.shape("x") == (1, 3, 1, 20)      # the first Unsqueeze too: the input is the map (input_nchw)
    assert [nd.op for nd in g.nodes][-2:] == ["Mul", "Squeeze"]     # a (1, 20) row scale on the 2-D map too


def test_volumetric_ops_are_refused_with_what_to_change():
    from tl2k210.errors import UnsupportedOpError
    m = make_model([helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2, 2], name="pool3d")],
                   [("x", [1, 2, 4, 4, 4])], [("y", None)])
    with pytest.raises(UnsupportedOpError, match=r"'pool3d'.*MaxPool kernel_shape=\[2, 2, 2\].*fold the depth"):
        run_pipeline(from_onnx(m))


def test_fixed_batch_runs_one_sample_and_refuses_a_graph_across_it():
    """An export with batch 4 (PyTorch's example input) reads as one sample, view(4, -1)
    included; a graph that mixes the samples (a split over the batch axis) is refused."""
    from tl2k210.errors import ModelLoadError
    shape = helper.make_node("Reshape", ["x", "s"], ["y"])
    m = make_model([shape], [("x", [4, 2, 3])], [("y", [4, 6])], {"s": np.array([4, -1], np.int64)})
    g = from_onnx(m)
    assert g.shape("x") == (1, 2, 3) and g.shape("y") == (1, 6) and g.meta["rebatched"] == {"x": 4}
    split = helper.make_node("Split", ["x"], ["a", "b"], axis=0, num_outputs=2, name="halves")
    m = make_model([split], [("x", [4, 2, 3])], [("a", None), ("b", None)], opset=18)
    with pytest.raises(ModelLoadError, match="'halves'.*export the model with batch 1"):
        from_onnx(m)


def test_opset6_prelu_slope_is_per_channel():
    """Before opset 7 a (C,) PRelu slope meant per channel (PyTorch nn.PReLU(C) exports so);
    the opset upgrade keeps that meaning."""
    x = rand(1, 3, 4, 5)
    a = np.array([0.1, -0.5, 2.0], np.float32)
    m = make_model([helper.make_node("PRelu", ["x", "a"], ["y"])], [("x", [1, 3, 4, 5])], [("y", None)],
                   {"a": a}, opset=6)
    m.ir_version = 3
    g = from_onnx(m)
    want = np.where(x > 0, x, x * a[None, :, None, None])
    np.testing.assert_allclose(run(g, x)[g.outputs[0]], want, rtol=1e-6)


def test_opset7_experimental_ops_become_standard_ones():
    """ImageScaler, Crop and Affine (Windows ML's style transfer, the model zoo's Tiny YOLOv2)
    have no schema after opset 8, so version_converter refused the file while onnxruntime runs
    it: they are Mul/Add and a Slice now, as onnxruntime computes them."""
    x = rand(1, 3, 16, 16)
    nodes = [helper.make_node("ImageScaler", ["x"], ["s"], scale=0.5, bias=[0.1, -0.2, 0.3]),
             helper.make_node("Conv", ["s", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Crop", ["c"], ["k"], border=[1, 2, 3, 1]),
             helper.make_node("Affine", ["k"], ["y"], alpha=2.0, beta=0.5)]
    m = make_model(nodes, [("x", [1, 3, 16, 16])], [("y", None)], {"w": rand(4, 3, 3, 3)}, opset=7)
    m.ir_version = 3
    g = from_onnx(m)
    want = ort_run(m, x)[0]
    assert want.shape == (1, 4, 13, 12)
    np.testing.assert_allclose(run(g, x)[g.outputs[0]], want, rtol=1e-5, atol=1e-5)


def test_a_float16_model_reads_as_float32():
    """Windows ML's *_fp16 zoo files: float16 weights, input and output. The IR holds float32 (its
    weights widened exactly); the graph had kept the float16 input beside float32 weights, which
    onnxruntime refused, blaming the model."""
    x = rand(1, 3, 8, 8)
    w = rand(4, 3, 3, 3).astype(np.float16)
    node = helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])
    graph = helper.make_graph([node], "fp16", [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT16, None)],
                              [numpy_helper.from_array(w, "w")])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    g = from_onnx(m)
    want = ort_run(m, x.astype(np.float16))[0].astype(np.float32)
    got = run(g, x)[g.outputs[0]]
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=0.01, atol=0.02)      # float16's own rounding


@pytest.mark.parametrize("mode", ["CRD", "DCR"])
def test_pixel_shuffle_chain_is_one_depth_to_space(mode):
    """PyTorch's PixelShuffle(2) (Reshape 6-D, Transpose, Reshape; and the DCR order TF exports)
    becomes one 4-D DepthToSpace node, bit for bit in float; a DepthToSpace node stays as it is."""
    c, r = 3, 2
    perm, mid = ([0, 1, 4, 2, 5, 3], [1, c, r, r, 5, 6]) if mode == "CRD" else ([0, 3, 4, 1, 5, 2], [1, r, r, c, 5, 6])
    nodes = [helper.make_node("Reshape", ["x", "s6"], ["a"]),
             helper.make_node("Transpose", ["a"], ["b"], perm=perm),
             helper.make_node("Reshape", ["b", "s4"], ["y"])]
    inits = {"s6": np.array(mid, np.int64), "s4": np.array([1, c, 10, 12], np.int64)}
    m = make_model(nodes, [("x", [1, c * r * r, 5, 6])], [("y", None)], inits)
    g, changes = check(m, "pixel_shuffle", tol=0)
    assert [(n.op, n.attrs["mode"], n.attrs["blocksize"]) for n in g.nodes] == [("DepthToSpace", mode, r)]
    assert g.shape(g.outputs[0]) == (1, c, 10, 12)
    assert changes and "DepthToSpace" in changes[0][1]


@pytest.mark.parametrize("k,s,pads,group,extra,ops", [
    (2, 2, [0, 0, 0, 0], 1, {}, ["Conv", "DepthToSpace"]),                  # Keras Conv2DTranspose(2, 2)
    (4, 2, [1, 1, 1, 1], 1, {}, ["Conv3", "DepthToSpace"]),                 # PyTorch's x2 upsampling
    (4, 2, [1, 2, 2, 1], 2, {}, ["Conv", "DepthToSpace", "Slice"]),         # grouped, uneven pads
    (6, 3, [2, 0, 1, 3], 2, {"output_padding": [1, 2]}, ["Conv", "DepthToSpace", "Slice"]),
    (2, 2, [0, 0, 0, 0], 4, {}, ["Conv", "DepthToSpace"]),                  # 4 groups of 1 -> 2
    (3, 1, [1, 1, 1, 1], 1, {}, ["Conv"]),                                  # stride 1: a conv
    (4, 2, None, 1, {"auto_pad": "SAME_UPPER"}, ["Conv3", "DepthToSpace"]),
    (3, 2, [0, 0, 1, 1], 1, {}, ["Conv3", "DepthToSpace"]),                 # Keras Conv2DTranspose(3, 2, 'same')
    (3, 2, [1, 1, 0, 0], 2, {}, ["Conv3", "DepthToSpace"]),                 # ... the odd pixel first, grouped
    (3, 2, [1, 1, 1, 1], 1, {}, ["ConvTranspose"]),       # output 2H - 1: phases of 2 and 1 tap, cropped
    (4, 2, None, 1, {"auto_pad": "SAME_LOWER", "output_padding": [1, 1]}, ["ConvTranspose"]),
    (2, 2, [0, 0, 0, 0], 1, {"output_shape": [10, 14]}, ["Conv", "DepthToSpace"]),   # tf2onnx's TRANSPOSE_CONV
    (4, 2, None, 1, {"output_shape": [10, 14]}, ["ConvTranspose"]),         # pads computed from it: left
])
def test_conv_transpose_is_phase_convs_and_a_pixel_shuffle(k, s, pads, group, extra, ops):
    """A transposed conv whose kernel is a multiple of its stride becomes one Conv computing the
    s*s phases (k/s taps each, every weight once) + DepthToSpace (CRD) + a Slice for the padding:
    onnxruntime's ConvTranspose to float rounding. Where the phases have 2 taps and the output is
    s times the input ("Conv3"), each phase's taps sit in a 3x3 window of their own, one 3x3 conv
    with 1-pixel padding (the KPU's form) + DepthToSpace, no Slice, k = 3 included; an
    `output_shape` that is the plain s x input (MediaPipe's selfie segmenter through tf2onnx) too.
    Other kernels that are no multiple (their phases would store zero taps), SAME with
    output_padding (onnx and onnxruntime disagree on its shape) and an output_shape that implies
    padding stay as they are."""
    ci, co = 4, 8
    w, b = rand(ci, co // group, k, k), rand(co)
    attrs = dict(strides=[s, s], kernel_shape=[k, k], group=group, **extra)
    if pads is not None:
        attrs["pads"] = pads
    m = make_model([helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], name="ct", **attrs)],
                   [("x", [1, ci, 5, 7])], [("y", None)], {"w": w, "b": b})
    x = rand(1, ci, 5, 7)
    three = ops[0] == "Conv3"
    g, changes = check(m, "conv_transpose_3x3", x=x, tol=1e-5)
    assert bool(changes) == three
    if not three:
        g, changes = check(m, "conv_transpose", x=x, tol=1e-5)
    elif k % s == 0:        # --optimize size (conv_transpose_3x3 off): the exact phases, cropped
        ge, _ = check(m, "conv_transpose", x=x, tol=1e-5)
        assert [n.op for n in ge.nodes][-1] == "Slice" and ge.const(ge.nodes[0].inputs[1]).size == w.size
    assert [n.op for n in g.nodes] == ["Conv" if three else ops[0]] + ops[1:]
    assert bool(changes) == (ops[0] != "ConvTranspose")
    if ops[0] != "ConvTranspose":
        conv = g.nodes[0]
        wc = g.const(conv.inputs[1])
        assert wc.shape[0] == co * s * s and conv.attrs["group"] == group
        if three:
            assert conv.attrs["kernel"] == (3, 3) and conv.attrs["pads"] == [1, 1, 1, 1]
            assert wc.shape[1:] == (ci // group, 3, 3) and np.count_nonzero(wc) == w.size
        else:
            assert wc.size == w.size
        assert g.nodes[-1].name == "ct" and g.nodes[-1].outputs == ["y"]


def test_log_softmax_and_instance_norm_decompose():
    m = make_model([helper.make_node("LogSoftmax", ["x"], ["y"], axis=1)], [X], [("y", None)])
    g, _ = check(m, "log_softmax")
    assert [n.op for n in g.nodes] == ["ReduceMax", "Sub", "Exp", "ReduceSum", "Log", "Sub"]
    g, _ = check(m, "log_softmax", x=rand(*X[1], scale=300))     # float32 softmax underflows: no -inf
    m = make_model([helper.make_node("InstanceNormalization", ["x", "s", "b"], ["y"], epsilon=1e-3)], [X],
                   [("y", None)], {"s": rand(4), "b": rand(4)})
    g, _ = check(m, "instance_norm", tol=1e-4)
    assert "InstanceNormalization" not in [n.op for n in g.nodes]


@pytest.mark.parametrize("size,bias", [(5, 1.0), (3, 2.0), (9, 0.5)])
def test_lrn_decomposes_exactly(size, bias):
    """AlexNet's / GoogLeNet's LRN against onnxruntime (odd windows: it refuses even ones), on a
    map with 7 channels: windows cut at both ends, one wider than the map."""
    m = make_model([helper.make_node("LRN", ["x"], ["y"], size=size, alpha=3e-2, beta=0.75, bias=bias)],
                   [("x", [1, 7, 5, 6])], [("y", None)])
    g, _ = check(m, "lrn", x=rand(1, 7, 5, 6, scale=3), tol=1e-5)
    assert [n.op for n in g.nodes] == ["Mul", "Conv", "Log", "Mul", "Exp", "Div"]
    g, _ = check(m, None, x=rand(1, 7, 5, 6, scale=3), tol=1e-5)      # and through every pass
    assert "LRN" not in [n.op for n in g.nodes]


def test_tile_is_concat_of_copies():
    """torch's x.repeat(1, 2, 3, 1) (ONNX Tile, constant repeats) -> a Concat per repeated axis."""
    m = make_model([helper.make_node("Tile", ["x", "r"], ["y"])], [X], [("y", None)],
                   {"r": np.array([1, 2, 3, 1], np.int64)})
    g, changes = check(m, "tile", tol=0)
    assert [(n.op, n.attrs["axis"], len(n.inputs)) for n in g.nodes] == [("Concat", 1, 2), ("Concat", 2, 3)]
    assert g.shape(g.outputs[0]) == (1, 8, 24, 8)


def test_input_layout_without_evidence_is_nchw_for_pytorch():
    """A map read by no conv or layout change: PyTorch exports are NCHW by convention; for other
    producers the fallback still looks for a 1/3/4-sized channel axis."""
    from tl2k210.passes.input_nchw import input_layout
    m = make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", [1, 2, 3, 4])], [("y", None)])
    assert input_layout(from_onnx(m)) == "NHWC"
    m.producer_name = "pytorch"
    assert input_layout(from_onnx(m)) == "NCHW"



def test_a_five_d_reader_of_a_one_channel_input_is_no_layout_change():
    """tf2onnx writes a 1-channel Keras input's NHWC -> NCHW as Unsqueeze to 5-D + Reshape (faceai's
    colorizer at --input-shape 1,1,224,224): input_nchw asked whether the Reshape of the 5-D map
    was a layout change by transposing it as 4-D, and the pass failed ("please report")."""
    w = rand(4, 1, 3, 3)
    m = make_model([helper.make_node("Mul", ["x", "k"], ["s"]),
                    helper.make_node("Unsqueeze", ["s", "ax"], ["u"]),
                    helper.make_node("Reshape", ["u", "shape"], ["r"]), conv("y", "r", "w", pads=[1, 1, 1, 1])],
                   [("x", [1, 8, 6, 1])], [("y", None)],
                   {"k": np.array(2.0, np.float32), "ax": np.array([1], np.int64),
                    "shape": np.array([1, 1, 0, 0], np.int64), "w": w}, opset=13)
    m.producer_name = "tf2onnx"
    x = rand(1, 8, 6, 1)
    g, _ = run_pipeline(from_onnx(m))
    xi = x if g.shape(g.inputs[0]) == (1, 8, 6, 1) else x.transpose(0, 3, 1, 2)
    np.testing.assert_allclose(run(g, xi)[g.outputs[0]], ort_run(m, x)[0], atol=1e-5)

@pytest.mark.parametrize("shape, want", [([1, 3, 416, 416], "NCHW"), ([1, 416, 416, 3], "NHWC"),
                                         ([1, 1, 64, 48], "NCHW"), ([1, 64, 48, 1], "NHWC")])
def test_input_layout_follows_an_image_channel_axis_over_the_producer(shape, want):
    """A TFLite file onnx-tf made from an ONNX model keeps its NCHW input ((1, 3, 416, 416):
    YOLOX-nano's, read by strided slices first), though tf2onnx's convention is NHWC: where only
    one of axes 1 and 3 can be an image's channels, that axis decides."""
    from tl2k210.passes.input_nchw import input_layout
    m = make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", shape)], [("y", None)])
    m.producer_name = "tf2onnx"
    assert input_layout(from_onnx(m)) == want


@pytest.mark.parametrize("k,pads,strides", [((1, 3), [0, 1, 0, 1], [1, 1]), ((3, 1), [1, 0, 1, 0], [1, 1]),
                                            ((3, 2), [0, 0, 0, 0], [1, 1]), ((2, 2), [0, 0, 0, 0], [2, 2]),
                                            ((1, 2), [0, 0, 0, 0], [1, 1]), ((2, 2), [0, 0, 1, 1], [1, 1]),
                                            ((3, 2), [1, 0, 1, 1], [1, 1]), ((2, 2), [1, 1, 0, 0], [2, 2])])
def test_square_kernels_pad_small_kernels_to_3x3(k, pads, strides):
    """A 2-tap axis padded after (Keras 'same': 0 before, 1 after) gets its taps last and the pad
    before, so the KPU's 1-pixel border holds it (the Speech-to-Intent model's 2x2 convs had run
    on the CPU); `check` compares the graph before and after in float."""
    m = make_model([conv("y", "x", "w", "b", kernel_shape=list(k), pads=pads, strides=strides)], [X], [("y", None)],
                   {"w": rand(6, 4, *k), "b": rand(6)})
    g, changes = check(m, "square_kernels")
    (c,) = g.nodes
    assert c.attrs["kernel"] == (3, 3) and max(c.attrs["pads"]) <= 1 and len(changes) == 1


@pytest.mark.parametrize("k,pads", [((1, 3), [1, 1, 1, 1]), ((2, 2), [1, 1, 1, 1])])
def test_square_kernels_leave_what_the_kpu_border_cannot_pad(k, pads):
    m = make_model([conv("y", "x", "w", "b", kernel_shape=list(k), pads=pads)], [X], [("y", None)],
                   {"w": rand(6, 4, *k), "b": rand(6)})
    g, changes = check(m, "square_kernels")
    assert g.nodes[0].attrs["kernel"] == k and not changes


@pytest.mark.parametrize("k,strides,dense", [((2, 2), [1, 1], True), ((2, 2), [2, 2], True), ((1, 2), [1, 1], True),
                                             ((2, 2), [1, 1], False)])
def test_conv_covering_its_map_is_a_dense_layer(k, strides, dense):
    """A conv whose kernel covers the unpadded map (a landmark head's 2x2 VALID conv on a 2x2 map)
    -> Reshape to (1, C*H*W, 1, 1) + 1x1 conv on the flattened weights, equal in float; a map
    the kernel does not cover (3x3 here) stays a conv."""
    h, w = k if dense else (3, 3)
    m = make_model([conv("y", "x", "w", "b", kernel_shape=list(k), strides=strides)], [("x", [1, 5, h, w])],
                   [("y", None)], {"w": rand(7, 5, *k), "b": rand(7)})
    g, changes = check(m, "conv_as_dense", x=rand(1, 5, h, w))
    if not dense:
        assert [n.op for n in g.nodes] == ["Conv"] and not changes
        return
    assert [n.op for n in g.nodes] == ["Reshape", "Conv"] and len(changes) == 1
    c = g.nodes[1]
    assert c.attrs["kernel"] == (1, 1) and g.const(c.inputs[1]).shape == (7, 5 * h * w, 1, 1)
    assert g.shape(c.inputs[0]) == (1, 5 * h * w, 1, 1)


@pytest.mark.parametrize("case", ["flatten_dense", "covering_7x7", "model_input", "over_9216"])
def test_a_dense_layer_over_1024_inputs_is_a_3x3_conv_on_a_3x3_map(case):
    """A Keras Flatten -> Dense on 4,096 inputs and PFLD's 7x7 conv on a 7x7x32 map (1,568 inputs)
    are over the KPU's 1024 channels: their inputs as ceil(K / 9) channels of 3x3 (8 and 7 zero
    inputs padded) and one unpadded 3x3 conv, equal in float. A dense layer on the model input keeps
    its float form; one over 9 x 1024 inputs stays."""
    n = helper.make_node
    if case == "covering_7x7":
        nodes, x, inits = [n("Relu", ["x"], ["r"]), conv("y", "r", "w", "b", kernel_shape=[7, 7])], [1, 32, 7, 7], \
            {"w": rand(12, 32, 7, 7, scale=0.05), "b": rand(12)}
    else:
        k = {"flatten_dense": 4096, "model_input": 4096, "over_9216": 9472}[case]
        nodes = [n("Flatten", ["x" if case == "model_input" else "r"], ["f"]), n("Gemm", ["f", "w", "b"], ["y"])]
        nodes = ([] if case == "model_input" else [n("Relu", ["x"], ["r"])]) + nodes
        x, inits = [1, k // 64, 8, 8], {"w": rand(k, 10, scale=0.05), "b": rand(10)}
    g, changes = check(make_model(nodes, [("x", x)], [("y", None)], inits), "wide_dense", tol=1e-4)
    if case in ("model_input", "over_9216"):
        assert not changes and "Gemm" in g.op_counts()
        return
    (c,) = [m for m in g.nodes if m.op == "Conv"]
    k = int(np.prod(x[1:]))
    assert g.shape(c.inputs[0]) == (1, -(-k // 9), 3, 3) and c.attrs["kernel"] == (3, 3) and not any(c.attrs["pads"])
    assert g.op_counts()["Pad"] == 1 and len(changes) == 1 and f"{k} inputs" in changes[0][1]


def test_pad_feeding_a_pad_folds_into_the_conv():
    """TF's ZeroPadding2D before a dilated conv: Pad(2) -> Pad(0) (SpaceToBatchND's paddings) ->
    Conv; both fold once the one next to the conv has."""
    n = helper.make_node
    nodes = [n("Pad", ["x", "p"], ["xp"]), n("Pad", ["xp", "p0"], ["xq"]), conv("y", "xq", "w", dilations=[2, 2])]
    m = make_model(nodes, [X], [("y", None)], {"p": np.array([0, 0, 2, 2, 0, 0, 2, 2], np.int64),
                                                "p0": np.zeros(8, np.int64), "w": rand(4, 4, 3, 3)})
    g, changes = check(m, "pad_into_conv")
    assert g.op_counts() == {"Conv": 1} and g.nodes[0].attrs["pads"] == [2, 2, 2, 2] and len(changes) == 2


def test_softmax_of_concatenated_score_heads_runs_in_their_convs():
    """ULFD/SSD scores: Softmax(Concat(Reshape(Transpose(conv), (1, -1, 2)))) over each anchor's
    two classes, channels 2j and 2j + 1 of its head: each conv takes the pairs' differences and
    a Sigmoid, and the Softmax goes (exact in float)."""
    n = helper.make_node
    nodes, inits, parts = [], {"shape": np.array([1, -1, 2], np.int64)}, []
    for i, co in enumerate((6, 4)):
        nodes += [conv(f"c{i}", "x", f"w{i}", f"b{i}"), n("Transpose", [f"c{i}"], [f"t{i}"], perm=[0, 2, 3, 1]),
                  n("Reshape", [f"t{i}", "shape"], [f"r{i}"])]
        inits.update({f"w{i}": rand(co, 4, 1, 1) * 3, f"b{i}": rand(co)})
        parts.append(f"r{i}")
    nodes += [n("Concat", parts, ["cat"], axis=1), n("Softmax", ["cat"], ["y"], axis=-1)]
    m = make_model(nodes, [X], [("y", None)], inits)
    g, changes = check(m, "channel_softmax")
    assert "Softmax" not in g.op_counts() and len(changes) == 2
    assert all(c.attrs["activation"] == {"op": "Sigmoid"} for c in g.nodes if c.op == "Conv")
    # a head of an odd channel count (its pairs would straddle anchors): the Softmax stays
    inits["w1"], inits["b1"] = rand(3, 4, 1, 1), rand(3)
    g, changes = check(make_model(nodes, [X], [("y", None)], inits), "channel_softmax")
    assert g.op_counts()["Softmax"] == 1 and not changes


@pytest.mark.parametrize("slope_shape", [(1, 1), (16, 1)])
def test_prelu_of_a_rank3_vector_runs_on_its_map(slope_shape):
    """OpenVINO's person re-identification nets (round 55's hunt): a PReLU of the (1, C, 1) output
    of a batch norm after the embedding Gemm, its slope one (1, 1) value, was refused "op PRelu
    has no K210 lowering" (prelu_split took (1, C) vectors and NCHW maps only). Now it runs on the
    (1, C, 1, 1) map of the vector, each value's slope broadcast to it: float-exact, no PRelu left."""
    n = helper.make_node
    a = np.random.default_rng(3).uniform(-0.5, 1.5, slope_shape).astype(np.float32)
    m = make_model([n("Add", ["v", "v"], ["b"]), n("PRelu", ["b", "a"], ["p"])], [("v", [1, 16, 1])],
                   [("p", [1, 16, 1])], {"a": a})
    g = from_onnx(m)
    g2, changes = run_pass("prelu_split", g.copy())
    assert changes and "PRelu" not in g2.op_counts()
    x = np.random.default_rng(4).normal(size=(1, 16, 1)).astype(np.float32)
    np.testing.assert_allclose(run(g2, x)["p"], run(g, x)["p"], rtol=1e-6, atol=1e-6)


def test_float_fc_keeps_a_wide_dense_layer_float(tmp_path):
    """--float-fc asks for float dense layers; a Flatten -> Dense on 4,096 inputs still became a 3x3
    KPU conv (pass wide_dense) while the next dense went float (round 65's hunt, a cifar TFLite)."""
    from tl2k210.compiler import ConvertOptions, convert
    n = helper.make_node
    m = make_model([n("Relu", ["x"], ["r"]), n("Flatten", ["r"], ["f"]), n("Gemm", ["f", "w", "b"], ["y"], name="dense")],
                   [("x", [1, 64, 8, 8])], [("y", None)], {"w": rand(4096, 10, scale=0.05), "b": rand(10)})
    calib = tmp_path / "c.npy"
    np.save(calib, np.random.default_rng(0).uniform(0, 1, (8, 64, 8, 8)).astype(np.float32))
    rows = {}
    for fc in (False, True):
        r = convert(m, str(tmp_path / f"{fc}.kmodel"), ConvertOptions(dataset=str(calib), progress=False, float_fc=fc))
        rows[fc] = next(x["why"] for x in r.layers if x["node"] == "dense")
    assert "FULLY_CONNECTED" not in rows[False] and "float FULLY_CONNECTED" in rows[True], rows


@pytest.mark.parametrize("op", ["MatMul", "Gemm"])
def test_a_dense_on_the_rows_of_a_map_is_a_1x1_conv(op):
    """A Keras Dense on a 4-D map (Tensordot: NHWC Transpose, Reshape to (H*W, C), MatMul; or a
    TFLite FULLY_CONNECTED, a Gemm with its bias) ran as a CPU dense layer over 9 rows and forced
    kmodel v4 (Edge Impulse's classifiers; hunt 19): a 1x1 conv on the NCHW map, equal in float;
    the whole pipeline makes the model kmodel v3."""
    from tl2k210.k210.lower import plan_format
    n = helper.make_node
    dense = n("MatMul", ["rows", "wd"], ["d"]) if op == "MatMul" else n("Gemm", ["rows", "wd", "bd"], ["d"])
    nodes = [conv("c", "x", "w", "b", strides=[2, 2], pads=[1, 1, 1, 1]), n("Relu", ["c"], ["r"]),
             n("Transpose", ["r"], ["t"], perm=[0, 2, 3, 1]), n("Reshape", ["t", "s"], ["rows"]), dense,
             n("Reshape", ["d", "s4"], ["d4"]), n("Relu", ["d4"], ["e"]), n("Reshape", ["e", "flat"], ["f"]),
             n("MatMul", ["f", "wo"], ["y"])]
    m = make_model(nodes, [X], [("y", None)], {"w": rand(6, 4, 3, 3), "b": rand(6), "s": np.array([16, 6], np.int64),
                                                "wd": rand(6, 5), "bd": rand(5), "s4": np.array([1, 4, 4, 5], np.int64),
                                                "flat": np.array([1, 80], np.int64), "wo": rand(80, 3)})
    g, changes = check(m, "tensordot")
    assert len(changes) == 1 and [x.op for x in g.nodes].count("Conv") == 2 and "Transpose" in [x.op for x in g.nodes]
    g, _ = check(m, None)
    assert plan_format(g)[0] == "v3"


def test_a_quantized_models_two_class_softmax_reads_the_differences_range(tmp_path):
    """A QDQ model's 2-class softmax becomes its conv's sigmoid of the class differences: the
    model's own range of the logits (here -2.6..2.6) is not that of their differences (to 5.2),
    which the sigmoid's table reads. It had kept the logits': a visual wake word's p(person)
    never went below sigmoid(-2.6) = 0.07 (hunt 20, 27.7 dB against an ideal of 36.2)."""
    import onnx
    from tl2k210.compiler import ConvertOptions, convert
    n = helper.make_node
    s = np.float32(2.6 / 127)
    nodes = [conv("c", "x", "w", "b"), n("QuantizeLinear", ["c", "s", "z"], ["q"]),
             n("DequantizeLinear", ["q", "s", "z"], ["d"]), n("Softmax", ["d"], ["y"], axis=1)]
    rng = np.random.default_rng(3)
    m = make_model(nodes, [("x", [1, 3, 8, 8])], [("y", None)],
                   {"w": (rng.normal(0, 1, (2, 3, 8, 8)) * 0.3).astype(np.float32), "b": np.zeros(2, np.float32),
                    "s": s, "z": np.int8(0)}, opset=13)
    src = tmp_path / "wake.onnx"
    onnx.save(m, src)
    np.save(tmp_path / "x.npy", rng.random((32, 3, 8, 8), np.float32))
    r = convert(src, tmp_path / "wake.kmodel", ConvertOptions(dataset=str(tmp_path / "x.npy"), progress=False))
    out = next(iter(r.totals["outputs"].values()))
    assert out["sqnr_db"] > out["ideal_db"] - 1, out
    note = next(nt for row in r.layers for nt in row["notes"] if "activation Sigmoid" in nt)
    lo, hi = (float(v) for v in note.split("input [")[1].rstrip("]").split(", "))
    assert hi - lo > 2 * 2.6 * 1.2, note


@pytest.mark.parametrize("pads,cip,stride,made", [([1, 1, 1, 1], 1, 1, True), ([1, 1, 1, 1], 1, 2, True),
                                                  ([0, 0, 0, 0], 0, 1, True), ([1, 1, 1, 1], 0, 1, False)])
def test_a_3x3_mean_pool_dividing_by_9_is_a_depthwise_conv(pads, cip, stride, made):
    """PyTorch's AvgPool2d(3, 1, 1) (count_include_pad by default; hunt 20) ran as a uint8 CPU conv,
    kmodel v4 only. Where every window divides by 9 it is a depthwise 3x3 conv of weights 1/9 over
    the zero-padded map (exact in float): the KPU runs it, in kmodel v3; the 8-bit ideal stays the
    pool's (no weights: a FORM_PASSES member). A padded pool that divides by the taps inside stays."""
    from lower_helpers import compile_model, pixels, sqnr
    n = helper.make_node
    m = make_model([conv("c", "x", "w", "b", pads=[1, 1, 1, 1]), n("Relu", ["c"], ["r"]),
                    n("AveragePool", ["r"], ["y"], kernel_shape=[3, 3], strides=[stride, stride], pads=pads,
                      count_include_pad=cip)],
                   [("x", [1, 3, 16, 16])], [("y", None)], {"w": rand(8, 3, 3, 3), "b": rand(8)})
    g, _ = check(m, "avg_pool_conv")
    assert ("AveragePool" in g.op_counts()) is not made
    if made:
        from tl2k210.k210.flow import FORM_PASSES
        assert "avg_pool_conv" in FORM_PASSES
        px = pixels(3, 3, 16, 16)
        kmodel = compile_model(m, px, format="v3")[0]
        assert kmodel.version == 3 and sum(L.conv is not None for L in kmodel.layers) == 2 and sqnr(m, kmodel, px) > 30


@pytest.mark.parametrize("mode", ["asymmetric", "half_pixel"])
def test_upsample_conv_is_the_phase_conv_and_a_pixel_shuffle(monkeypatch, mode):
    """Nearest 2x + 3x3 conv (pad 1) + ReLU, where the upsampled map and the conv's output overflow
    the KPU RAM (here a 1,024-line one: ESPCN's 2 MiB map at 128x128): one 3x3 conv to the 4 x 5
    phases on the small map + DepthToSpace, the same floats. Where they fit, the graph stays."""
    from tl2k210.k210 import hardware as hw
    monkeypatch.setattr(hw, "KPU_RAM_LINES", 1024)
    nodes = [helper.make_node("Resize", ["x", "", "sc"], ["u"], mode="nearest", coordinate_transformation_mode=mode),
             conv("c", "u", "w", "b", kernel_shape=[3, 3], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["y"])]
    inits = {"sc": np.array([1, 1, 2, 2], np.float32), "w": rand(5, 24, 3, 3), "b": rand(5)}
    m = make_model(nodes, [("x", [1, 24, 20, 24])], [("y", None)], inits)
    g, log = check(m, None)
    assert g.op_counts() == {"Conv": 1, "DepthToSpace": 1}
    assert g.const(g.nodes[0].inputs[1]).shape == (20, 24, 3, 3)
    monkeypatch.setattr(hw, "KPU_RAM_LINES", 32768)
    assert check(m, None)[0].op_counts() == {"Resize": 1, "Conv": 1}

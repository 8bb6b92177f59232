"""Front half on hand-made ONNX graphs (no TensorFlow): opset handling, NHWC inputs, n-ary ops,
constant and shape folding. Every rewrite is checked against onnxruntime on the original graph."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from front_helpers import make_model, ort_run, rand
from tl2k210 import frontends
from tl2k210.graph import OPSET, from_onnx, run
from tl2k210.k210.flow import run_pass, run_pipeline

pytest.importorskip("onnxruntime")


def _check(model, x, g, out=None):
    ref = ort_run(model, x)[0]
    got = run(g, x)[out or g.outputs[0]]
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


def _conv_w(co, ci, k=3, seed=0):
    return np.random.default_rng(seed).standard_normal((co, ci, k, k)).astype(np.float32) * 0.3


def test_opset_is_the_highest_tf2onnx_and_onnxruntime_share():
    import onnxruntime  # noqa: F401
    assert frontends.OPSET == OPSET >= 17
    tf2onnx = pytest.importorskip("tf2onnx")
    assert OPSET == max(tf2onnx.constants.OPSET_TO_IR_VERSION)
    # onnxruntime runs an opset-OPSET model with ops whose form changed late (HardSwish 14,
    # ReduceMean axes as an input 18)
    m = make_model([helper.make_node("HardSwish", ["x"], ["h"]),
                    helper.make_node("ReduceMean", ["h", "axes"], ["y"], keepdims=1)],
                   [("x", [1, 2, 4, 4])], [("y", [1, 2, 1, 1])], {"axes": np.array([2, 3], np.int64)}, opset=OPSET)
    x = rand(1, 2, 4, 4)
    g, log = run_pipeline(from_onnx(m), {"check_supported": False})
    assert g.op_counts() == {"HardSwish": 1, "GlobalAveragePool": 1}
    _check(m, x, g)


def test_old_opset_file_is_upgraded():
    """The ONNX zoo's opset-9 files: Clip bounds as attributes, Dropout with a ratio attribute."""
    m = make_model([helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
                    helper.make_node("Clip", ["c"], ["r"], min=0.0, max=6.0),
                    helper.make_node("Dropout", ["r"], ["d"], ratio=0.5),
                    helper.make_node("Unsqueeze", ["d"], ["u"], axes=[0]),
                    helper.make_node("Squeeze", ["u"], ["y"], axes=[0])],
                   [("x", [1, 3, 8, 8])], [("y", [1, 4, 8, 8])], {"w": _conv_w(4, 3)}, opset=9)
    g = from_onnx(m)
    assert g.meta["opset"] == OPSET
    g2, _ = run_pipeline(g)
    assert g2.op_counts() == {"Conv": 1}
    assert g2.nodes[0].attrs["activation"] == {"op": "Clip", "min": 0.0, "max": 6.0}
    _check(m, rand(1, 3, 8, 8), g2)


# ----------------------------------------------------------------------------------- NHWC inputs
def _nhwc_model(h, w, c, pre):
    """NHWC input -> `pre` nodes -> Transpose to NCHW -> 3x3 conv."""
    nodes = pre + [helper.make_node("Transpose", ["p"], ["t"], perm=[0, 3, 1, 2]),
                   helper.make_node("Conv", ["t", "w"], ["y"])]
    return nodes


def test_nhwc_input_through_pad_and_rescaling_becomes_nchw():
    """A 320x240 NHWC input whose Transpose comes after a Rescaling (Mul, Add) and a ZeroPadding2D
    (Pad): the shape the issue's 320x240 TFLite model crashed the calibration loader with."""
    h, w = 240, 320
    pre = [helper.make_node("Mul", ["x", "scale"], ["m"]),
           helper.make_node("Add", ["m", "shift"], ["a"]),
           helper.make_node("Pad", ["a", "pads"], ["p"], mode="constant")]
    inits = {"scale": np.array([1 / 127.5, 1 / 100, 1 / 50], np.float32), "shift": np.array(-1.0, np.float32),
             "pads": np.array([0, 1, 0, 0, 0, 0, 1, 0], np.int64), "w": _conv_w(4, 3)}
    m = make_model(_nhwc_model(h, w, 3, pre), [("x", [1, h, w, 3])], [("y", [1, 4, h - 1, w - 1])], inits)
    x = np.random.default_rng(1).uniform(0, 255, (1, h, w, 3)).astype(np.float32)
    g, log = run_pipeline(from_onnx(m))
    assert g.shape(g.inputs[0]) == (1, 3, h, w) and g.meta["input_layout"] == {"x": "NHWC->NCHW"}
    assert "Transpose" not in g.op_counts()
    assert g.op_counts() == {"Conv": 1}
    conv = g.nodes[0]
    assert conv.attrs["pads"] == [1, 0, 0, 1]          # the NHWC Pad, now NCHW, absorbed by the conv
    moved = [c for e in log if e["pass"] == "input_nchw" for c in e["changes"]]
    assert len(moved) == 4  # Pad, Add, Mul moved; the input flipped
    # the Rescaling left the graph for the pixel mapping: the IR's input is x * a + b
    a, b = (np.asarray(v, np.float32) for v in g.meta["input_affine"])
    np.testing.assert_allclose(a, inits["scale"], rtol=1e-6)
    np.testing.assert_allclose(b, -np.ones(3), rtol=1e-6)
    xi = x.transpose(0, 3, 1, 2) * a[None, :, None, None] + b[None, :, None, None]
    np.testing.assert_allclose(run(g, xi)[g.outputs[0]], ort_run(m, x)[0], rtol=1e-4, atol=1e-4)


def test_a_batch_norm_on_the_image_is_input_preprocessing():
    """OpenCV's res10 face detector (and Caffe models) start with a BatchNormalization on the image
    ('data_bn'): a per-channel affine of the pixels, folded into the pixel mapping like --mean/--std
    (it had been a depthwise 1x1 KPU layer over the whole image, rounding it once more; hunt 17)."""
    rng = np.random.default_rng(2)
    bn = {"s": rng.uniform(0.5, 2, 3), "b": rng.normal(0, 1, 3), "mu": rng.uniform(90, 130, 3),
          "var": rng.uniform(900, 4000, 3)}
    m = make_model([helper.make_node("BatchNormalization", ["x", "s", "b", "mu", "var"], ["n"], name="data_bn"),
                    helper.make_node("Conv", ["n", "w"], ["y"], pads=[1, 1, 1, 1])],
                   [("x", [1, 3, 8, 8])], [("y", None)], {**{k: v.astype(np.float32) for k, v in bn.items()},
                                                          "w": _conv_w(4, 3)})
    g, log = run_pipeline(from_onnx(m))
    assert g.op_counts() == {"Conv": 1}
    a, b = (np.asarray(v) for v in g.meta["input_affine"])
    k = bn["s"] / np.sqrt(bn["var"] + 1e-5)
    np.testing.assert_allclose(a, k, rtol=1e-6)
    np.testing.assert_allclose(b, bn["b"] - bn["mu"] * k, rtol=1e-5)
    x = rng.uniform(0, 255, (1, 3, 8, 8)).astype(np.float32)
    xi = (x * a[None, :, None, None] + b[None, :, None, None]).astype(np.float32)
    np.testing.assert_allclose(run(g, xi)[g.outputs[0]], ort_run(m, x)[0], rtol=1e-4, atol=1e-4)


def test_one_channel_nhwc_input_padded_before_its_reshape():
    """A ZeroPadding2D before tf2onnx's one-channel Reshape (1,H+2,W+2,1) -> (1,1,H+2,W+2): the
    Pad moves below the layout change and the Reshape goes (it is decided on the padded shape
    the Reshape reads, not the input's)."""
    m = make_model([helper.make_node("Pad", ["x", "pads"], ["p"], mode="constant"),
                    helper.make_node("Reshape", ["p", "s"], ["t"]), helper.make_node("Conv", ["t", "w"], ["y"])],
                   [("x", [1, 20, 28, 1])], [("y", [1, 4, 20, 28])],
                   {"pads": np.array([0, 1, 1, 0, 0, 1, 1, 0], np.int64), "s": np.array([1, 1, 22, 30], np.int64),
                    "w": _conv_w(4, 1)})
    g = from_onnx(m)
    g.meta["producer"] = "tf2onnx"
    moved, _ = run_pass("input_nchw", g.copy())
    assert [n.op for n in moved.nodes] == ["Pad", "Conv"]
    g, _ = run_pipeline(g)
    assert g.shape(g.inputs[0]) == (1, 1, 20, 28) and g.op_counts() == {"Conv": 1}
    x = rand(1, 20, 28, 1)
    np.testing.assert_allclose(run(g, x.transpose(0, 3, 1, 2))[g.outputs[0]], ort_run(m, x)[0], rtol=1e-4, atol=1e-4)


def test_one_channel_nhwc_input_via_reshape():
    """tf2onnx writes NHWC -> NCHW of a one-channel input as Reshape (1,H,W,1) -> (1,1,H,W)."""
    m = make_model([helper.make_node("Reshape", ["x", "s"], ["t"]), helper.make_node("Conv", ["t", "w"], ["y"])],
                   [("x", [1, 20, 28, 1])], [("y", [1, 4, 18, 26])],
                   {"s": np.array([1, 1, 20, 28], np.int64), "w": _conv_w(4, 1)})
    g, _ = run_pipeline(from_onnx(m))
    assert g.shape(g.inputs[0]) == (1, 1, 20, 28) and g.op_counts() == {"Conv": 1}
    x = rand(1, 20, 28, 1)
    np.testing.assert_allclose(run(g, x.reshape(1, 1, 20, 28))[g.outputs[0]], ort_run(m, x)[0], atol=1e-5)


def test_reshape_that_is_not_a_layout_change_keeps_nhwc():
    """(1,4,6,2) -> (1,2,4,6) by Reshape scrambles pixels: not a transpose, the input stays."""
    m = make_model([helper.make_node("Reshape", ["x", "s"], ["t"]), helper.make_node("Relu", ["t"], ["y"])],
                   [("x", [1, 4, 6, 2])], [("y", [1, 2, 4, 6])], {"s": np.array([1, 2, 4, 6], np.int64)})
    g, _ = run_pipeline(from_onnx(m), {"check_supported": False})
    assert g.shape(g.inputs[0]) == (1, 4, 6, 2) and "input_layout" not in g.meta


# ----------------------------------------------------------------------------------- n-ary ops
@pytest.mark.parametrize("op,n", [("Sum", 3), ("Sum", 2), ("Mean", 3), ("Max", 3), ("Min", 4), ("Sum", 1)])
def test_nary_ops_become_binary_chains(op, n):
    names = [f"x{i}" for i in range(n)]
    nodes = [helper.make_node("Relu", ["x"], ["r"])] + \
            [helper.make_node("Mul", ["r", f"k{i}"], [f"x{i}"]) for i in range(n)] + \
            [helper.make_node(op, names, ["y"])]
    inits = {f"k{i}": np.array(0.5 + i, np.float32) for i in range(n)}
    m = make_model(nodes, [("x", [1, 2, 3, 3])], [("y", [1, 2, 3, 3])], inits)
    g, changes = run_pass("nary_ops", from_onnx(m))
    binary = {"Sum": "Add", "Mean": "Add", "Max": "Max", "Min": "Min"}[op]
    assert op == binary or op not in g.op_counts()
    assert g.op_counts().get(binary, 0) == n - 1 and g.op_counts().get("Mul") == n + (op == "Mean")
    assert all(len(nd.inputs) == 2 for nd in g.nodes if nd.op == binary)
    _check(m, rand(1, 2, 3, 3), g)


# ----------------------------------------------------------------------------------- folding
def test_shape_arithmetic_casts_and_identities_fold():
    """A TF-style dynamic flatten: Shape -> Gather -> Unsqueeze -> Concat -> Reshape, with a
    same-type Cast, an Identity, an inference Dropout and an opset-15 Shape(start=1)."""
    nodes = [helper.make_node("Identity", ["x"], ["i"]),
             helper.make_node("Cast", ["i"], ["c"], to=TensorProto.FLOAT),
             helper.make_node("Dropout", ["c"], ["d"]),
             helper.make_node("Shape", ["d"], ["s"]),
             helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
             helper.make_node("Unsqueeze", ["n", "ax0"], ["n1"]),
             helper.make_node("Shape", ["d"], ["chw"], start=1),
             helper.make_node("ReduceProd", ["chw"], ["k"], keepdims=1),
             helper.make_node("Concat", ["n1", "k"], ["shape"], axis=0),
             helper.make_node("Reshape", ["d", "shape"], ["y"])]
    m = make_model(nodes, [("x", [1, 2, 3, 4])], [("y", [1, 24])],
                   {"zero": np.array(0, np.int64), "ax0": np.array([0], np.int64)}, opset=OPSET)
    g, changes = run_pass("fold_constants", from_onnx(m))
    assert g.op_counts() == {"Reshape": 1}
    assert g.const(g.nodes[0].inputs[1]).tolist() == [1, 24]
    msgs = " ".join(msg for _, msg in changes)
    assert "removed Cast to the same type" in msgs and "removed Dropout" in msgs
    _check(m, rand(1, 2, 3, 4), g)


def test_cast_to_another_type_stays():
    m = make_model([helper.make_node("Cast", ["x"], ["c"], to=TensorProto.INT32),
                    helper.make_node("Cast", ["c"], ["y"], to=TensorProto.FLOAT)],
                   [("x", [1, 4])], [("y", [1, 4])])
    g, _ = run_pass("fold_constants", from_onnx(m))
    assert g.op_counts() == {"Cast": 2}


# ----------------------------------------------------------------------------------- ShuffleNet-style
def test_channel_shuffle_folds_into_the_grouped_conv_before_it():
    """Group-4 1x1 conv -> Relu -> ShuffleNet channel shuffle (Reshape/Transpose/Reshape) -> depthwise
    3x3 -> group-4 1x1: the shuffle becomes a reordering of the first conv's output channels (which
    turns block-diagonal dense: the shuffle mixes its groups); the second grouped conv stays grouped
    for the lowering. Same numbers as onnxruntime on the original graph."""
    rng = np.random.default_rng(3)
    c, g = 16, 4
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], group=g),
             helper.make_node("Relu", ["a"], ["r"]),
             helper.make_node("Reshape", ["r", "s5"], ["r5"]),
             helper.make_node("Transpose", ["r5"], ["t5"], perm=[0, 2, 1, 3, 4]),
             helper.make_node("Reshape", ["t5", "s4"], ["sh"]),
             helper.make_node("Conv", ["sh", "wd"], ["d"], group=c, pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["d", "w2"], ["y"], group=g)]
    inits = {"w1": rng.standard_normal((c, 8 // g, 1, 1)).astype(np.float32),
             "s5": np.array([1, g, c // g, 6, 6], np.int64), "s4": np.array([1, c, 6, 6], np.int64),
             "wd": rng.standard_normal((c, 1, 3, 3)).astype(np.float32),
             "w2": rng.standard_normal((c, c // g, 1, 1)).astype(np.float32)}
    m = make_model(nodes, [("x", [1, 8, 6, 6])], [("y", [1, c, 6, 6])], inits)
    gr, log = run_pipeline(from_onnx(m))
    assert gr.op_counts() == {"Conv": 3}
    assert [n.attrs["group"] for n in gr.nodes] == [1, c, g]
    changes = {e["pass"]: e["changes"] for e in log}
    assert [m_ for _, m_ in changes["channel_shuffle"]][0].startswith("group 4 conv -> normal conv")
    assert "output channels of" in changes["channel_shuffle"][1][1]
    _check(m, rand(1, 8, 6, 6), gr)


def test_entry_conv_when_the_input_feeds_a_pool_and_a_conv():
    """A U-Net-like start (the corpus DAE: input -> MaxPool and Conv): an identity 1x1 depthwise conv
    goes first, the pool fuses into it."""
    nodes = [helper.make_node("MaxPool", ["x"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("Concat", ["p", "c"], ["y"], axis=1)]
    m = make_model(nodes, [("x", [1, 3, 16, 16])], [("y", [1, 7, 8, 8])], {"w": _conv_w(4, 3)})
    g, _ = run_pipeline(from_onnx(m))
    first = next(n for n in g.nodes if g.inputs[0] in n.inputs)
    assert first.op == "Conv" and first.attrs["group"] == 3 and first.name == "entry_conv"
    assert len(g.consumers(g.inputs[0])) == 1
    np.testing.assert_array_equal(g.const(first.inputs[1]).ravel(), np.ones(3))
    _check(m, rand(1, 3, 16, 16), g)


# ----------------------------------------------------------------------------------- budget census
def test_weight_census_reads_constantofshape_without_materialising():
    """The ONNX zoo's files build weights with ConstantOfShape: counted from the shape operand,
    and the budget check refuses before anything is folded."""
    from tl2k210.compiler import BudgetError, ConvertOptions, check_weight_budget, weight_census
    nodes = [helper.make_node("ConstantOfShape", ["wshape"], ["w"],
                              value=helper.make_tensor("v", TensorProto.FLOAT, [1], [0.02])),
             helper.make_node("Conv", ["x", "w"], ["c"], name="big_conv"),
             helper.make_node("Flatten", ["c"], ["f"]),
             helper.make_node("Gemm", ["f", "fc"], ["y"], transB=1, name="fc")]
    inits = {"wshape": np.array([4096, 64, 3, 3], np.int64), "fc": np.zeros((10, 4096 * 4), np.float32)}
    m = make_model(nodes, [("x", [1, 64, 4, 4])], [("y", [1, 10])], inits)
    assert [c for _, _, c in weight_census(m)] == [4096 * 64 * 9, 10 * 4096 * 4]
    assert check_weight_budget(m, ConvertOptions(runtime="sdk"), "m") == 2_523_136      # 2.5 MB fits
    with pytest.raises(BudgetError, match=r"5,046,272 B at 16 bits.*'maixpy'.*largest: big_conv Conv "
                                          r"2,359,296.*; sdk \(5,242,880 B\) hold the weights: try --runtime sdk"):
        check_weight_budget(m, ConvertOptions(runtime="maixpy", weight_bits=16), "m")
    # the weights fit two runtimes, the maps are unknown yet: both named, the largest to try (hunt 12's
    # MobileNetV2 1.0: weights 3.47 MB, told "use --runtime maixpy-minimum", whose 4 MiB its maps exceed)
    with pytest.raises(BudgetError, match=r"; maixpy-minimum \(4,194,304 B\), .* and sdk \(5,242,880 B\) hold "
                                          r"the weights: try --runtime sdk, the largest"):
        check_weight_budget(m, ConvertOptions(runtime="maixpy"), "m")


# ----------------------------------------------------------------------------------- detector heads
@pytest.mark.parametrize("form", ["tf", "softmax"])
def test_two_class_channel_softmax_becomes_a_sigmoid_conv(form):
    """LFFD/ULFFD score heads: softmax over the 2 channels of a conv map, either decomposed the way
    TF writes it (with tf2onnx's NHWC transposes before the Div) or as one Softmax node."""
    axes = {"ax": np.array([1], np.int64)}
    if form == "tf":
        nodes = [helper.make_node("Conv", ["x", "w"], ["s"]),
                 helper.make_node("ReduceMax", ["s", "ax"], ["m"], keepdims=1),
                 helper.make_node("Sub", ["s", "m"], ["d"]),
                 helper.make_node("Exp", ["d"], ["e"]),
                 helper.make_node("ReduceSum", ["e", "ax"], ["z"], keepdims=1),
                 helper.make_node("Transpose", ["e"], ["et"], perm=[0, 2, 3, 1]),
                 helper.make_node("Reshape", ["z", "zs"], ["zt"]),
                 helper.make_node("Div", ["et", "zt"], ["y"])]
        inits = {**axes, "zs": np.array([1, 6, 5, 1], np.int64)}
        out_shape = [1, 6, 5, 2]
    else:
        nodes = [helper.make_node("Conv", ["x", "w"], ["s"]), helper.make_node("Softmax", ["s"], ["y"], axis=1)]
        inits, out_shape = {}, [1, 2, 6, 5]
    inits["w"] = _conv_w(2, 3, 1, seed=4) * 5
    m = make_model(nodes, [("x", [1, 3, 6, 5])], [("y", out_shape)], inits, opset=OPSET)
    g, _ = run_pipeline(from_onnx(m))
    assert g.op_counts() == {"Conv": 1} and g.nodes[0].attrs["activation"] == {"op": "Sigmoid"}
    x = rand(1, 3, 6, 5)
    got = run(g, x)[g.outputs[0]]
    ref = ort_run(m, x)[0]
    np.testing.assert_allclose(got.transpose(0, 2, 3, 1) if form == "tf" else got, ref, atol=1e-6)


def test_cli_reads_negative_ranges_as_values():
    """`tl2k210 convert m.tflite m.kmodel --dataset d --input-range -1,1` as the README writes it
    (argparse alone takes "-1,1" for an unknown option)."""
    from tl2k210.cli import build_parser
    for verb in ("convert", "compare"):
        a = build_parser(only=verb).parse_args([verb, "m.tflite", "m.kmodel", "--dataset", "d",
                                                "--input-range", "-1,1", "--mean", "-0.5,-.25,0.5"])
        assert tuple(a.input_range) == (-1.0, 1.0) and tuple(a.mean) == (-0.5, -0.25, 0.5)


def test_layers_wider_than_the_kpu_split_exactly():
    """MobileNetV2's tail: a 1x1 conv to 1280 channels, global average pool, dense 1280 -> 1000.
    The KPU takes 1024 channels: two convs of 640, pooled per slice, the dense layer one 3x3 conv
    on the 1,280 inputs as a 143x3x3 map (7 zeros padded: wide_dense)."""
    rng = np.random.default_rng(6)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("GlobalAveragePool", ["r"], ["p"]), helper.make_node("Flatten", ["p"], ["f"]),
             helper.make_node("MatMul", ["f", "fc"], ["y"])]
    inits = {"w": rng.standard_normal((1280, 16, 1, 1)).astype(np.float32),
             "fc": rng.standard_normal((1280, 1000)).astype(np.float32) * 0.05}
    m = make_model(nodes, [("x", [1, 16, 5, 5])], [("y", [1, 1000])], inits)
    g, log = run_pipeline(from_onnx(m))
    widths = sorted(g.const(n.inputs[1]).shape[:2] for n in g.nodes if n.op == "Conv")
    assert widths == [(640, 16), (640, 16), (1000, 143)]
    assert g.op_counts() == {"Conv": 3, "GlobalAveragePool": 2, "Concat": 1, "Pad": 1, "Reshape": 2}
    _check(m, rand(1, 16, 5, 5), g)


def test_old_ir_file_whose_initializers_are_not_inputs_is_upgraded():
    """IR 3 wants initializers listed as inputs too; a seeded zoo file that adds weights as plain
    initializers still converts (onnx.version_converter would say 'Input w is undefined')."""
    m = make_model([helper.make_node("Conv", ["x", "w"], ["y"])], [("x", [1, 3, 6, 6])], [("y", [1, 2, 4, 4])],
                   {"w": _conv_w(2, 3)}, opset=9)
    m.ir_version = 3
    g = from_onnx(m)
    assert g.meta["opset"] == OPSET and g.op_counts() == {"Conv": 1}


def test_old_ir_onnx_file_whose_initializers_are_not_inputs_loads(tmp_path):
    """The same as a file: onnx.checker refuses it ('in initializer but not in graph input'); the
    front-end reads it as the IR-4 file it is in practice, and leaves the file as it was."""
    import onnx

    from tl2k210.frontends import load_model
    m = make_model([helper.make_node("Conv", ["x", "w"], ["y"])], [("x", [1, 3, 6, 6])], [("y", [1, 2, 4, 4])],
                   {"w": _conv_w(2, 3)}, opset=9)
    m.ir_version = 3
    src = tmp_path / "ir3.onnx"
    onnx.save(m, src)
    before = src.read_bytes()
    g = from_onnx(load_model(src))
    assert g.op_counts() == {"Conv": 1} and src.read_bytes() == before
    _check(m, rand(1, 3, 6, 6), g)


def test_an_op_onnx_does_not_define_is_refused_by_name(tmp_path):
    """DBFace's PyTorch export writes its bilinear upsampling as a TensorRT-style `Plugin` node in
    the standard domain: named with its attributes and tensors, not "No Op registered for Plugin"."""
    from tl2k210.frontends import ModelLoadError, load_model
    n = helper.make_node("Plugin", ["x"], ["up"], name="up", info=b'{"scale_factor": [2, 2]}', name_=b"x")
    n.attribute[-1].name = "name"
    g = helper.make_graph([n], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                          [helper.make_tensor_value_info("up", TensorProto.FLOAT, None)])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 11)]), tmp_path / "p.onnx")
    with pytest.raises(ModelLoadError, match=r"node 'up' is op 'Plugin', which ONNX does not define \(a vendor's "
                                             r"plugin: info=\{\"scale_factor\": \[2, 2\]\}, name=x\); inputs \['x'\]"):
        load_model(tmp_path / "p.onnx")
    # hls4ml's QONNX files: quantizers and channels-last convs in domains the file does not import
    q = [helper.make_node("Quant", ["x", "s", "z", "b"], [f"q{i}"], domain="qonnx.custom_op.general") for i in (0, 1)]
    c = helper.make_node("Conv", ["q0", "q1"], ["y"], domain="qonnx.custom_op.channels_last")
    g = helper.make_graph(q + [c], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 8, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), tmp_path / "q.onnx")
    with pytest.raises(ModelLoadError, match=r"it uses ops of domains the file does not import, which onnx and "
                                             r"onnxruntime refuse \('qonnx.custom_op.general': Quant x2; "
                                             r"'qonnx.custom_op.channels_last': Conv x1\)\. These are QONNX's"):
        load_model(tmp_path / "q.onnx")


def test_a_graph_output_without_a_shape_loads(tmp_path):
    """tf2onnx writes no shape for an output whose size TFLite stores as unknown (computed at run
    time); onnx's checker wants one on every graph output: the model loads and its shape is inferred."""
    from tl2k210.frontends import load_model
    w = numpy_helper.from_array(np.ones((4, 3, 1, 1), np.float32), "w")
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    out.type.tensor_type.ClearField("shape")
    g = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])], [out], [w])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), tmp_path / "o.onnx")
    assert from_onnx(load_model(tmp_path / "o.onnx")).shape("y") == (1, 4, 8, 8)

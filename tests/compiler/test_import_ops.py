"""What real exports bring (issue 23), each on a hand-made graph, TF-free, exact against
onnxruntime: TF's dilated conv as SpaceToDepth/DepthToSpace with any block, and the integer
islands of fully quantized TFLite files (Q -> Transpose/Concat -> DQ, an int8 input transposed
before it is dequantized)."""
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from front_helpers import make_model, ort_run, rand
from tl2k210.graph import from_onnx, run
from tl2k210.k210.flow import run_pass, run_pipeline


def _space_to_depth(b, k, hw, perm):
    """TF's SpaceToBatchND for a k x k conv of dilation b on an hw x hw map, as tf2onnx starts it:
    Pad x -> Transpose(perm) into the batch axis -> SpaceToDepth (output "s"). (pad, the padded
    size, a multiple of b as TF makes it, the three nodes)."""
    pad = b * (k - 1) // 2
    hp = -(-(hw + 2 * pad) // b) * b
    return pad, hp, [helper.make_node("Pad", ["x", "pads"], ["p"]),
                     helper.make_node("Transpose", ["p"], ["t1"], perm=perm),
                     helper.make_node("SpaceToDepth", ["t1"], ["s"], blocksize=b)]


@pytest.mark.parametrize("b,k,hw", [(5, 3, 40), (2, 3, 12), (3, 1, 9), (2, 3, 13)])
def test_space_to_batch_dilated_conv_is_one_dilated_conv(b, k, hw):
    """TFLite's Conv2D(dilation_rate=b): Pad -> SpaceToBatchND -> Conv -> BatchToSpaceND -> crop,
    as tf2onnx writes it (Transpose(1,0,2,3) around SpaceToDepth/DepthToSpace) -> one Conv with
    dilations b, with onnxruntime's values (to float rounding of the conv sums). A crop of nothing
    (ULFD's: the map already the input's size) goes; 13 rows leave one to crop."""
    c, co = 4, 6
    pad, hp, head = _space_to_depth(b, k, hw, [1, 0, 2, 3])
    nodes = head + [helper.make_node("Transpose", ["s"], ["t2"], perm=[1, 0, 2, 3]),
                     helper.make_node("Conv", ["t2", "w", "bias"], ["c"], kernel_shape=[k, k]),
                     helper.make_node("Transpose", ["c"], ["t3"], perm=[1, 0, 2, 3]),
                     helper.make_node("DepthToSpace", ["t3"], ["d"], blocksize=b),
                     helper.make_node("Slice", ["d", "st", "en", "ax"], ["dc"]),
                     helper.make_node("Transpose", ["dc"], ["y"], perm=[1, 0, 2, 3])]
    inits = {"pads": np.array([0, 0, pad, pad, 0, 0, hp - hw - pad, hp - hw - pad], np.int64),
             "w": rand(co, c, k, k), "bias": rand(co), "st": np.array([0, 0], np.int64),
             "en": np.array([hw, hw], np.int64), "ax": np.array([2, 3], np.int64)}
    m = make_model(nodes, [("x", [1, c, hw, hw])], [("y", None)], inits)
    x = rand(1, c, hw, hw)
    ref = ort_run(m, x)[0]
    g, changes = run_pass("space_to_batch", from_onnx(m))
    convs = [n for n in g.nodes if n.op == "Conv"]
    assert "SpaceToDepth" not in g.op_counts() and "DepthToSpace" not in g.op_counts()
    assert len(convs) == 1 and tuple(convs[0].attrs["dilations"]) == ((b, b) if k > 1 else (1, 1))
    assert changes and f"block {b}" in changes[0][1]
    assert ("Slice" in g.op_counts()) == (hp - b * (k - 1) > hw)
    np.testing.assert_allclose(run(g, x)[g.outputs[0]], ref, atol=1e-5, rtol=1e-5)
    g, _ = run_pipeline(from_onnx(m))          # and the K210 flow takes it
    np.testing.assert_allclose(run(g, x)[g.outputs[0]], ref, atol=1e-4, rtol=1e-4)


def test_space_to_batch_from_an_nhwc_input_with_the_bias_after_the_crop():
    """The same as TF writes it for an NHWC input whose size was symbolic (tflite-support's
    dilated_conv.tflite, given --input-shape): Pad of the NHWC input -> Transpose(3,0,1,2) ->
    SpaceToDepth -> Transpose -> Conv (no bias) -> Transpose -> DepthToSpace -> crop -> Add of the
    bias in that swapped layout -> Transpose(1,2,3,0) back to NHWC. The K210 flow makes the input
    NCHW, one Conv with dilations b, and keeps onnxruntime's values."""
    b, k, hw, c, co = 3, 3, 14, 3, 5
    pad, hp, head = _space_to_depth(b, k, hw, [3, 0, 1, 2])
    nodes = head + [helper.make_node("Transpose", ["s"], ["t2"], perm=[1, 0, 2, 3]),
                     helper.make_node("Conv", ["t2", "w"], ["cv"], kernel_shape=[k, k]),
                     helper.make_node("Transpose", ["cv"], ["t3"], perm=[1, 0, 2, 3]),
                     helper.make_node("DepthToSpace", ["t3"], ["d"], blocksize=b),
                     helper.make_node("Slice", ["d", "st", "en", "ax"], ["dc"]),
                     helper.make_node("Add", ["dc", "bias"], ["ab"]),
                     helper.make_node("Transpose", ["ab"], ["y"], perm=[1, 2, 3, 0])]
    e = hp - hw - pad
    inits = {"pads": np.array([0, pad, pad, 0, 0, e, e, 0], np.int64), "w": rand(co, c, k, k),
             "bias": rand(co, 1, 1, 1), "st": np.array([0, 0], np.int64), "en": np.array([hw, hw], np.int64),
             "ax": np.array([2, 3], np.int64)}
    m = make_model(nodes, [("x", [1, hw, hw, c])], [("y", None)], inits)
    x = rand(1, hw, hw, c)
    ref = ort_run(m, x)[0]
    g = from_onnx(m)
    g.meta["producer"] = "tf2onnx"
    g, _ = run_pipeline(g)
    convs = [n for n in g.nodes if n.op == "Conv"]
    assert g.shape(g.inputs[0]) == (1, c, hw, hw) and "SpaceToDepth" not in g.op_counts()
    assert tuple(convs[0].attrs["dilations"]) == (b, b)
    got = run(g, x.transpose(0, 3, 1, 2))[g.outputs[0]]       # the output NCHW too (output_nchw)
    np.testing.assert_allclose(got, ref.transpose(0, 3, 1, 2), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("act", ["relu", "relu6"])
def test_space_to_batch_of_a_dilated_depthwise_conv_with_its_activation(act):
    """A TFLite DepthwiseConv2D(dilation_rate=2) with its fused ReLU / ReLU6, as tf2onnx writes it:
    the depthwise Conv (group = C) between the swaps, then the crop, the activation still in the
    swapped layout, and Transpose(1,2,3,0) back to NHWC (ASPP's dilated depthwise branch,
    aspp_dilated96_int8io, round 45: the chain was missed for the activation, and the swap into
    the batch axis refused). One depthwise Conv with dilations 2, onnxruntime's values."""
    b, k, hw, c = 2, 3, 12, 4
    pad, hp, head = _space_to_depth(b, k, hw, [3, 0, 1, 2])
    a = helper.make_node("Relu", ["dc"], ["ab"]) if act == "relu" else \
        helper.make_node("Clip", ["dc", "lo", "hi"], ["ab"])
    nodes = head + [helper.make_node("Transpose", ["s"], ["t2"], perm=[1, 0, 2, 3]),
                     helper.make_node("Conv", ["t2", "w", "bias"], ["cv"], kernel_shape=[k, k], group=c),
                     helper.make_node("Transpose", ["cv"], ["t3"], perm=[1, 0, 2, 3]),
                     helper.make_node("DepthToSpace", ["t3"], ["d"], blocksize=b),
                     helper.make_node("Slice", ["d", "st", "en", "ax"], ["dc"]), a,
                     helper.make_node("Transpose", ["ab"], ["y"], perm=[1, 2, 3, 0])]
    e = hp - hw - pad
    inits = {"pads": np.array([0, pad, pad, 0, 0, e, e, 0], np.int64), "w": rand(c, 1, k, k),
             "bias": rand(c), "st": np.array([0, 0], np.int64), "en": np.array([hw, hw], np.int64),
             "ax": np.array([2, 3], np.int64), "lo": np.float32(0), "hi": np.float32(1)}
    m = make_model(nodes, [("x", [1, hw, hw, c])], [("y", None)], inits)
    x = rand(1, hw, hw, c)
    ref = ort_run(m, x)[0]
    assert (ref == 0).mean() > 0.1 and (act == "relu" or (ref == 1).mean() > 0.1)   # the clamps bite
    g, changes = run_pass("space_to_batch", run_pass("input_nchw", from_onnx(m))[0])
    convs = [n for n in g.nodes if n.op == "Conv"]
    assert not {"SpaceToDepth", "DepthToSpace"} & set(g.op_counts())
    assert len(convs) == 1 and tuple(convs[0].attrs["dilations"]) == (b, b) and convs[0].attrs["group"] == c
    got = run(g, x.transpose(0, 3, 1, 2))[g.outputs[0]]
    np.testing.assert_allclose(got, ref, atol=1e-5, rtol=1e-5)
    g, _ = run_pipeline(from_onnx(m))
    assert [n.op for n in g.nodes if n.op in ("Conv", "Relu", "Clip")] == ["Conv"]   # the activation fused
    got = run(g, x.transpose(0, 3, 1, 2))[g.outputs[0]]
    np.testing.assert_allclose(got, ref.transpose(0, 3, 1, 2), atol=1e-4, rtol=1e-4)


def test_space_to_batch_shared_by_a_conv_and_a_depthwise_conv():
    """A full-int8 TFLite ASPP's dilation-2 Conv2D and dilation-2 DepthwiseConv2D read one map:
    TFLite shares their SpaceToBatchND, so the swapped sub-grid batch feeds both convs, each with
    its own BatchToSpaceND (aspp_dilated96_int8io, round 45: refused for the swap into the batch
    axis). Both become dilated convs of the map, onnxruntime's values."""
    b, k, hw, c, co = 2, 3, 12, 4, 6
    pad, hp, head = _space_to_depth(b, k, hw, [1, 0, 2, 3])
    nodes = head + [helper.make_node("Transpose", ["s"], ["t2"], perm=[1, 0, 2, 3])]
    for j, (w, g_) in enumerate([("w", 1), ("wd", c)]):
        nodes += [helper.make_node("Conv", ["t2", w], [f"cv{j}"], kernel_shape=[k, k], group=g_),
                  helper.make_node("Transpose", [f"cv{j}"], [f"t3{j}"], perm=[1, 0, 2, 3]),
                  helper.make_node("DepthToSpace", [f"t3{j}"], [f"d{j}"], blocksize=b),
                  helper.make_node("Slice", [f"d{j}", "st", "en", "ax"], [f"dc{j}"]),
                  helper.make_node("Relu", [f"dc{j}"], [f"r{j}"]),
                  helper.make_node("Transpose", [f"r{j}"], [f"y{j}"], perm=[1, 0, 2, 3])]
    nodes.append(helper.make_node("Concat", ["y0", "y1"], ["y"], axis=1))
    inits = {"pads": np.array([0, 0, pad, pad, 0, 0, hp - hw - pad, hp - hw - pad], np.int64),
             "w": rand(co, c, k, k), "wd": rand(c, 1, k, k), "st": np.array([0, 0], np.int64),
             "en": np.array([hw, hw], np.int64), "ax": np.array([2, 3], np.int64)}
    m = make_model(nodes, [("x", [1, c, hw, hw])], [("y", None)], inits)
    x = rand(1, c, hw, hw)
    ref = ort_run(m, x)[0]
    g, changes = run_pass("space_to_batch", from_onnx(m))
    convs = [n for n in g.nodes if n.op == "Conv"]
    assert not {"SpaceToDepth", "DepthToSpace", "Transpose"} & set(g.op_counts()) and len(changes) == 2
    assert [(n.attrs["dilations"], n.attrs.get("group", 1)) for n in convs] == [((b, b), 1), ((b, b), c)]
    np.testing.assert_allclose(run(g, x)[g.outputs[0]], ref, atol=1e-5, rtol=1e-5)
    g, _ = run_pipeline(from_onnx(m))
    np.testing.assert_allclose(run(g, x)[g.outputs[0]], ref, atol=1e-4, rtol=1e-4)


def test_space_to_batch_of_a_full_int8_tflite_dilated_conv():
    """An int8 TFLite file's Conv2D(dilation_rate=2) through tf2onnx: the conv's integers run
    Q -> Transpose -> DepthToSpace -> crop -> Transpose -> DQ (BatchToSpaceND), an island whose
    Q/DQ share one grid. DepthToSpace / SpaceToDepth move integers exactly: the island becomes
    float and the chain one dilated Conv (it was left quantized, and the Transpose(1,0,2,3) into
    the batch axis was refused)."""
    b, k, hw, c, co = 2, 3, 12, 4, 6
    pad, hp, head = _space_to_depth(b, k, hw, [1, 0, 2, 3])
    s, z = np.float32(0.05), np.uint8(128)
    nodes = head + [helper.make_node("QuantizeLinear", ["s", "sc", "zp"], ["sq"]),
                     helper.make_node("Transpose", ["sq"], ["t2q"], perm=[1, 0, 2, 3]),
                     helper.make_node("DequantizeLinear", ["t2q", "sc", "zp"], ["t2"]),
                     helper.make_node("Conv", ["t2", "w", "bias"], ["cv"], kernel_shape=[k, k]),
                     helper.make_node("QuantizeLinear", ["cv", "sc", "zp"], ["cq"]),
                     helper.make_node("Transpose", ["cq"], ["t3"], perm=[1, 0, 2, 3]),
                     helper.make_node("DepthToSpace", ["t3"], ["d"], blocksize=b),
                     helper.make_node("Slice", ["d", "st", "en", "ax"], ["dc"]),
                     helper.make_node("Transpose", ["dc"], ["t4"], perm=[1, 0, 2, 3]),
                     helper.make_node("DequantizeLinear", ["t4", "sc", "zp"], ["dq"]),
                     helper.make_node("Relu", ["dq"], ["y"])]
    inits = {"pads": np.array([0, 0, pad, pad, 0, 0, hp - hw - pad, hp - hw - pad], np.int64),
             "w": rand(co, c, k, k, scale=0.2), "bias": rand(co), "st": np.array([0, 0], np.int64),
             "en": np.array([hw, hw], np.int64), "ax": np.array([2, 3], np.int64), "sc": s, "zp": z}
    m = make_model(nodes, [("x", [1, c, hw, hw])], [("y", None)], inits)
    x = rand(1, c, hw, hw)
    float_ref = make_model([n for n in nodes if n.op_type not in ("QuantizeLinear", "DequantizeLinear")], [("x", [1, c, hw, hw])],
                           [("y", None)], inits)
    for n in float_ref.graph.node:     # the same chain with the Q/DQ dropped
        n.input[:] = [{"sq": "s", "t2q": "t2", "cq": "cv", "t4": "dq"}.get(i, i) for i in n.input]
        n.output[:] = [{"t2q": "t2", "t4": "dq"}.get(o, o) for o in n.output]
    ref = ort_run(float_ref, x)[0]
    g, _ = run_pipeline(from_onnx(m))
    convs = [n for n in g.nodes if n.op == "Conv"]
    assert not {"QuantizeLinear", "DequantizeLinear", "SpaceToDepth", "DepthToSpace"} & set(g.op_counts())
    assert len(convs) == 1 and tuple(convs[0].attrs["dilations"]) == (b, b)
    np.testing.assert_allclose(run(g, x)[g.outputs[0]], ref, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("dims,want", [(["n", "h", "w", 3], (1, 64, 48, 3)), (["n", 3, "h", "w"], (1, 3, 64, 48)),
                                       (["n", "a", "b", "c"], (1, 3, 64, 48)), ([1, 64, 48, 3], (1, 64, 48, 3))])
def test_input_shape_is_read_in_the_inputs_own_layout(dims, want):
    """--input-shape N,C,H,W (1,3,64,48) for a symbolic input: a TFLite/Keras export's NHWC input
    (its known channel last) takes it as (1,64,48,3); an NCHW input or one that says nothing, as
    given."""
    from tl2k210.compiler import input_dims
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)
    assert input_dims(x, (1, 3, 64, 48)) == want


def _int8_model():
    """int8 input -> Transpose (NHWC->NCHW) -> DQ -> Conv -> Q, read by a DQ and by a
    Transpose -> DQ; the two branches -> Q(same params) -> Concat (int8) -> DQ -> output."""
    s, z = np.float32(0.05), np.int8(-3)
    inits = [numpy_helper.from_array(np.array(v), k) for k, v in
             {"s": s, "z": z, "si": np.float32(0.02), "zi": np.int8(-128), "w": rand(4, 3, 1, 1, scale=0.1),
              "b": rand(4, scale=0.1)}.items()]
    nodes = [helper.make_node("Transpose", ["x"], ["xt"], perm=[0, 3, 1, 2]),
             helper.make_node("DequantizeLinear", ["xt", "si", "zi"], ["xf"]),
             helper.make_node("Conv", ["xf", "w", "b"], ["c"]),
             helper.make_node("QuantizeLinear", ["c", "s", "z"], ["cq"]),
             helper.make_node("DequantizeLinear", ["cq", "s", "z"], ["a"]),
             helper.make_node("Transpose", ["cq"], ["ct"], perm=[0, 1, 3, 2]),
             helper.make_node("DequantizeLinear", ["ct", "s", "z"], ["bt"]),
             helper.make_node("Relu", ["a"], ["ar"]),
             helper.make_node("QuantizeLinear", ["ar", "s", "z"], ["aq"]),
             helper.make_node("QuantizeLinear", ["bt", "s", "z"], ["bq"]),
             helper.make_node("Concat", ["aq", "bq"], ["cat"], axis=1),
             helper.make_node("DequantizeLinear", ["cat", "s", "z"], ["y"])]
    g = helper.make_graph(nodes, "q", [helper.make_tensor_value_info("x", TensorProto.INT8, [1, 6, 6, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    return m


def test_dequantize_makes_integer_islands_float():
    """Every Q/DQ of an island sharing one per-tensor (scale, zero point) goes; the int8 input
    becomes the float it stood for; the ranges each Q stood for are kept for calibration, and so
    is the range of what the island's data movement writes (the SSD's concatenated class logits,
    whose range 16 synthetic images put under 0: every score read 0.5)."""
    m = _int8_model()
    xq = np.random.default_rng(0).integers(-128, 128, (1, 6, 6, 3)).astype(np.int8)
    ref = ort_run(m, xq)[0]
    g, changes = run_pass("dequantize", from_onnx(m))
    assert not {"QuantizeLinear", "DequantizeLinear"} & set(g.op_counts())
    assert g.meta["input_quant"][g.inputs[0]] == pytest.approx((0.02, -128, "int8"))
    lo, hi = (-128 + 3) * 0.05, (127 + 3) * 0.05
    assert g.meta["quant_ranges"]["c"] == pytest.approx((lo, hi))
    assert g.meta["quant_ranges"]["cat"] == g.meta["quant_ranges"]["ct"] == pytest.approx((lo, hi))
    assert any("above its data movement" in msg for _, msg in changes)
    got = run(g, ((xq.astype(np.float32) + 128) * 0.02))[g.outputs[0]]
    # the float graph is what the integers stand for (inside their range): within a step of the grid
    assert np.abs(got - ref).max() <= 0.05 * 1.01


@pytest.mark.parametrize("dtype", ["uint8", "int8"])
def test_an_integer_image_cast_to_float_is_its_pixels(dtype, tmp_path):
    """MoveNet's int8 TFLite takes a uint8 image and casts it to float itself (a Cast the lowering
    has no form for, refused as if it were a decoder's): the input is the float it casts to, its
    range the integers' (pixels 0..255 for uint8), and the kmodel fed the camera's pixels computes
    what the model computes (emulated against onnxruntime fed the integers)."""
    from tl2k210.compiler import ConvertOptions, convert
    from tl2k210.k210.emulator import Emulator
    m = make_model([helper.make_node("Cast", ["x"], ["f"], to=TensorProto.FLOAT),
                    helper.make_node("Conv", ["f", "w"], ["y"], pads=[1, 1, 1, 1])],
                   [("x", [1, 3, 8, 8])], [("y", [1, 4, 8, 8])], {"w": rand(4, 3, 3, 3, scale=0.01)})
    m.graph.input[0].type.tensor_type.elem_type = TensorProto.UINT8 if dtype == "uint8" else TensorProto.INT8
    g, changes = run_pass("dequantize", from_onnx(m))
    assert "Cast" not in g.op_counts() and g.meta["input_quant"][g.inputs[0]] == (1.0, 0, dtype)
    pixels = np.random.default_rng(0).integers(0, 256, (16, 3, 8, 8)).astype(np.uint8)
    ds = tmp_path / "ds.npy"
    np.save(ds, pixels.astype(np.float32) - (128 if dtype == "int8" else 0))
    rep = convert(m, str(tmp_path / "o.kmodel"), ConvertOptions(dataset=str(ds), progress=False))
    assert rep.totals["input_range"] == ([0.0, 255.0] if dtype == "uint8" else [-128.0, 127.0])
    emu = Emulator.load(tmp_path / "o.kmodel")
    for p in pixels[:4]:
        q = p if dtype == "uint8" else (p.astype(np.int16) - 128).astype(np.int8)
        ref = ort_run(m, q[None])[0].reshape(-1)
        got = np.asarray(emu.run(p)[0], np.float64).reshape(-1)
        assert 10 * np.log10(np.sum(ref ** 2) / np.sum((ref - got) ** 2)) > 35


def test_an_integer_input_the_model_computes_on_is_refused_naming_it(tmp_path):
    """An int32 image padded as integers (a TFLite op test's mirror pad, int32 in and out): the
    onnxruntime type error met tl2k210's own entry conv, and the user was told to fix the model.
    The refusal names the input, its dtype and the op that reads it; nothing is written."""
    from tl2k210.compiler import ConvertOptions, convert
    from tl2k210.errors import UnsupportedOpError
    m = make_model([helper.make_node("Pad", ["x", "p"], ["y"], mode="reflect")],
                   [("x", [1, 3, 8, 8])], [("y", None)], {"p": np.array([0, 0, 1, 1, 0, 0, 1, 1])})
    m.graph.input[0].type.tensor_type.elem_type = TensorProto.INT32
    ds = tmp_path / "ds.npy"
    np.save(ds, np.random.default_rng(0).integers(0, 256, (4, 3, 8, 8)).astype(np.float32))
    with pytest.raises(UnsupportedOpError, match=r"input 'x' is int32 and the model computes on its integers "
                                                 r"\('Pad_0' \(Pad\) read it\).*export the model with a float input"):
        convert(m, str(tmp_path / "o.kmodel"), ConvertOptions(dataset=str(ds), progress=False))
    assert not (tmp_path / "o.kmodel").exists()


def test_dequantize_keeps_a_relu_folded_into_the_range():
    """TOCO's uint8 files (TF1 MobileNet v1 _quant) may leave ReLU6 out of the graph: a conv with no
    activation writes uint8 at scale 6/255, zero point 0, and the integers saturate at 0 and 6.
    The float graph keeps that clamp (a Clip, which the K210 flow fuses into the conv); a conv whose
    range does not start at 0 (zero point 90) gets none. Within a grid step of onnxruntime's QDQ."""
    s6, z0, s2, z2 = np.float32(6 / 255), np.uint8(0), np.float32(0.1), np.uint8(90)
    r = np.random.default_rng(5)        # conv2's output stays inside its range [-9, 16.5]
    inits = [numpy_helper.from_array(np.array(v), k) for k, v in
             {"si": np.float32(1 / 127.5), "zi": np.uint8(128), "s6": s6, "z0": z0, "s2": s2, "z2": z2,
              "w": r.normal(0, 2.0, (4, 3, 3, 3)).astype(np.float32), "b": r.normal(0, 1, 4).astype(np.float32),
              "w2": r.normal(0, 0.1, (2, 4, 1, 1)).astype(np.float32), "b2": np.zeros(2, np.float32)}.items()]
    nodes = [helper.make_node("QuantizeLinear", ["x", "si", "zi"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "si", "zi"], ["xf"]),
             helper.make_node("Conv", ["xf", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("QuantizeLinear", ["c", "s6", "z0"], ["cq"]),
             helper.make_node("DequantizeLinear", ["cq", "s6", "z0"], ["cf"]),
             helper.make_node("Conv", ["cf", "w2", "b2"], ["d"], name="conv2"),
             helper.make_node("QuantizeLinear", ["d", "s2", "z2"], ["dq"]),
             helper.make_node("DequantizeLinear", ["dq", "s2", "z2"], ["y"])]
    g = helper.make_graph(nodes, "toco", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    x = r.uniform(-1, 1, (1, 3, 8, 8)).astype(np.float32)
    ref = ort_run(m, x)[0]
    assert -9 < ref.min() and ref.max() < 16.5
    g, changes = run_pass("dequantize", from_onnx(m))
    clips = [n for n in g.nodes if n.op == "Clip"]
    assert [g.producer(n.inputs[0]).name for n in clips] == ["conv"]
    assert [g.const(t).item() for t in clips[0].inputs[1:]] == pytest.approx([0.0, 6.0])
    assert any("clamps it (no activation node)" in msg for _, msg in changes)
    inner = run(g, x, [clips[0].inputs[0]])[clips[0].inputs[0]]
    assert inner.min() < -1 and inner.max() > 7          # the clamp matters on this input
    np.testing.assert_allclose(run(g, x)[g.outputs[0]], ref, atol=0.1 * 1.5 + 0.5 * 4 * 6 / 255)
    g, _ = run_pipeline(from_onnx(m))                    # fused into the conv as its activation
    conv = next(n for n in g.nodes if n.op == "Conv" and n.name == "conv")
    assert conv.attrs["activation"] == {"op": "Clip", "min": 0.0, "max": pytest.approx(6.0)}
    np.testing.assert_allclose(run(g, x)[g.outputs[0]], ref, atol=0.1 * 1.5 + 0.5 * 4 * 6 / 255)


def test_dequantize_removes_a_dynamic_range_dense_input_quantization():
    """A dynamic-range TFLite file's hybrid FULLY_CONNECTED (Dense(320 -> 8), int8 weights) through
    tf2onnx: DynamicQuantizeLinear -> DequantizeLinear of its three outputs -> MatMul. The pair is
    the identity it approximates: it goes (it was refused as an op with no K210 lowering;
    effnet_lite112_dynrange, round 45), the float MatMul computes the unrounded product, within
    one run-time quantization step of onnxruntime's."""
    r = np.random.default_rng(45)
    w = r.normal(0, 0.1, (320, 8)).astype(np.float32)
    nodes = [helper.make_node("Relu", ["x"], ["a"]),
             helper.make_node("DynamicQuantizeLinear", ["a"], ["aq", "as", "az"], name="dql"),
             helper.make_node("DequantizeLinear", ["aq", "as", "az"], ["af"]),
             helper.make_node("MatMul", ["af", "w"], ["y"])]
    m = make_model(nodes, [("x", [1, 320])], [("y", None)], {"w": w})
    x = r.normal(0, 1, (1, 320)).astype(np.float32)
    ref = ort_run(m, x)[0]
    g, changes = run_pass("dequantize", from_onnx(m))
    assert not {"DynamicQuantizeLinear", "DequantizeLinear"} & set(g.op_counts())
    assert any(n == "dql" and "run-time quantization" in msg for n, msg in changes)
    got = run(g, x)[g.outputs[0]]
    np.testing.assert_allclose(got, np.maximum(x, 0) @ w, rtol=1e-5, atol=1e-5)
    step = np.maximum(x, 0).max() / 255
    assert np.abs(got - ref).max() <= 0.5 * step * np.abs(w).sum(0).max()
    g, _ = run_pipeline(from_onnx(m))
    assert "DynamicQuantizeLinear" not in g.op_counts()


@pytest.mark.parametrize("break_it,says", [("scale", "QuantizeLinear/DequantizeLinear disagree"),
                                            ("integer op", "node 'neg' (op Neg) computes on the integers")])
def test_dequantize_names_the_boundary_of_a_mixed_model(break_it, says):
    """An island whose Q and DQ disagree on the scale, or where an op computes on the integers, is
    no fake quantization: refused naming the QuantizeLinear that starts it and why."""
    from tl2k210.errors import UnsupportedOpError
    m = _int8_model()
    if break_it == "scale":
        m.graph.initializer.append(numpy_helper.from_array(np.float32(0.07), "s2"))
        m.graph.node[-1].input[1] = "s2"                   # the Concat's DQ disagrees
    else:
        m.graph.node.insert(6, helper.make_node("Neg", ["ct"], ["ctn"], name="neg"))
        m.graph.node[7].input[0] = "ctn"
    with pytest.raises(UnsupportedOpError, match="starts a quantized part") as e:
        run_pass("dequantize", from_onnx(m))
    assert says in str(e.value) and "mixes quantized and float parts" in str(e.value)


@pytest.mark.parametrize("pick", [False, True])
def test_dequantize_output_quantized_before_a_reshape(pick):
    """TOCO's embedding extractor: the pooled map is quantized, then reshaped into the uint8
    output (Q -> Reshape -> output). The QuantizeLinear moves below the Reshape and goes: a float
    output, its (scale, zero point) kept, the values those of the float pool. tf2onnx's
    portrait_video keeps one channel of its softmax first (Q -> Slice -> Reshape): the same."""
    inits = [numpy_helper.from_array(np.array(v), k) for k, v in
             {"s": np.float32(0.0235), "z": np.uint8(3), "shape": np.array([1, -1], np.int64),
              "st": np.array([1], np.int64), "en": np.array([3], np.int64), "ax": np.array([1], np.int64)}.items()]
    nodes = [helper.make_node("AveragePool", ["x"], ["p"], kernel_shape=[3, 3]),
             helper.make_node("QuantizeLinear", ["p", "s", "z"], ["pq"])]
    nodes += [helper.make_node("Slice", ["pq", "st", "en", "ax"], ["sl"])] if pick else []
    nodes += [helper.make_node("Reshape", ["sl" if pick else "pq", "shape"], ["y"])]
    n = 2 if pick else 4
    g = helper.make_graph(nodes, "q", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 3, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.UINT8, [1, n])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    x = rand(1, 4, 3, 3)
    ref = ort_run(m, x)[0]
    g, changes = run_pass("dequantize", from_onnx(m))
    assert g.op_counts() == {"AveragePool": 1, "Reshape": 1, **({"Slice": 1} if pick else {})} and g.outputs == ["y"]
    assert g.tensors["y"].dtype == np.float32 and g.meta["output_quant"]["y"] == pytest.approx((0.0235, 3, "uint8"))
    assert any("below its data movement" in msg for _, msg in changes)
    got = run(g, x)["y"]
    assert got.shape == (1, n)
    np.testing.assert_array_equal(np.clip(np.rint(got / 0.0235) + 3, 0, 255), ref)


def test_dequantize_output_concatenated_from_quantized_tensors():
    """PoseNet's uint8 mid offsets: two convs quantized on one grid, concatenated and transposed
    into the output (Q, Q -> Concat -> Transpose -> output). Both QuantizeLinear go: a float
    output, its (scale, zero point) kept, the values those of the float concat."""
    inits = [numpy_helper.from_array(np.array(v), k) for k, v in
             {"s": np.float32(0.05), "z": np.uint8(117), "w1": rand(2, 3, 1, 1), "w2": rand(2, 3, 1, 1)}.items()]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"]), helper.make_node("Conv", ["x", "w2"], ["c2"]),
             helper.make_node("QuantizeLinear", ["c1", "s", "z"], ["q1"]),
             helper.make_node("QuantizeLinear", ["c2", "s", "z"], ["q2"]),
             helper.make_node("Concat", ["q1", "q2"], ["cat"], axis=1),
             helper.make_node("Transpose", ["cat"], ["y"], perm=[0, 2, 3, 1])]
    g = helper.make_graph(nodes, "q", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.UINT8, [1, 4, 4, 4])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    x = rand(1, 3, 4, 4)
    ref = ort_run(m, x)[0]
    g, changes = run_pass("dequantize", from_onnx(m))
    assert g.op_counts() == {"Conv": 2, "Clip": 2, "Concat": 1, "Transpose": 1} and g.outputs == ["y"]
    assert g.tensors["y"].dtype == np.float32 and g.meta["output_quant"]["y"] == pytest.approx((0.05, 117, "uint8"))
    np.testing.assert_array_equal(np.clip(np.rint(run(g, x)["y"] / 0.05) + 117, 0, 255), ref)
    nodes[3].input[1] = "s2"          # two grids: the concat computes nothing, but the output has no one scale
    g2 = helper.make_graph(nodes, "q", g.inputs and m.graph.input, m.graph.output,
                           inits + [numpy_helper.from_array(np.float32(0.07), "s2")])
    g2, _ = run_pass("dequantize", from_onnx(helper.make_model(g2, opset_imports=[helper.make_opsetid("", 13)])))
    assert "QuantizeLinear" in g2.op_counts()


@pytest.mark.parametrize("through", [False, True])
def test_dequantize_an_int8_output_also_read_inside_the_model(through):
    """--outputs naming a tensor and one computed from it, on an int8 TFLite (hunt 21: Himax's
    YOLOv8n, 42io's keyword spotter): the first tensor's integers are an output (through tf2onnx's
    NHWC Transpose) and read by a DequantizeLinear for the rest; its QuantizeLinear was left over
    ("op QuantizeLinear has no K210 lowering"). Both outputs become float, with their scales, and
    the values are onnxruntime's (the pool's within an LSB: it now averages the float map)."""
    inits = [numpy_helper.from_array(np.array(v), k) for k, v in
             {"s": np.float32(0.05), "z": np.uint8(3), "w": rand(4, 3, 1, 1)}.items()]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("QuantizeLinear", ["r", "s", "z"], ["a" if not through else "aq"]),
             helper.make_node("DequantizeLinear", ["a" if not through else "aq", "s", "z"], ["ad"]),
             helper.make_node("AveragePool", ["ad"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("QuantizeLinear", ["p", "s", "z"], ["b"])]
    nodes += [helper.make_node("Transpose", ["aq"], ["a"], perm=[0, 2, 3, 1])] if through else []
    shape_a = [1, 4, 4, 4]
    g = helper.make_graph(nodes, "q", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4, 4])],
                          [helper.make_tensor_value_info("a", TensorProto.UINT8, shape_a),
                           helper.make_tensor_value_info("b", TensorProto.UINT8, [1, 4, 2, 2])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    x = rand(1, 3, 4, 4)
    ref = ort_run(m, x)
    g, changes = run_pass("dequantize", from_onnx(m))
    assert not {"QuantizeLinear", "DequantizeLinear"} & set(g.op_counts()) and g.outputs == ["a", "b"]
    assert any("also read inside the model" in msg for _, msg in changes)
    got = run(g, x)
    for o, want, lsb in zip(("a", "b"), ref, (0, 1)):
        assert g.meta["output_quant"][o] == pytest.approx((0.05, 3, "uint8"))
        assert np.abs(np.clip(np.rint(got[o] / 0.05) + 3, 0, 255) - want).max() <= lsb


def _int8_output_model(nodes, x_shape, inits, through):
    """`nodes` reading the float input x (`x_shape`), the last writing the int8 output "q": the
    model's output, or through a Transpose to NHWC ("y") where `through`."""
    nodes = nodes + ([helper.make_node("Transpose", ["q"], ["y"], perm=[0, 2, 3, 1])] if through else [])
    m = helper.make_model(helper.make_graph(
        nodes, "q", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
        [helper.make_tensor_value_info("y" if through else "q", TensorProto.INT8, None)],
        [numpy_helper.from_array(np.array(v), k) for k, v in inits.items()]), opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    return m


@pytest.mark.parametrize("through", [False, True])
def test_dequantize_output_keeps_the_files_saturation(through):
    """YOLOX-nano's TFLite export writes raw box regressions (-2..3.6) straight from a conv to an
    int8 output at 1/256, zero point -128: the file returns them in [0, 0.996]. Dropping the
    output's QuantizeLinear must keep that clamp (a Clip at the integers' whole range, which the
    K210 flow folds into the conv) and the range as the model's own: the float graph reads the
    file's values within half a step, not the conv's (that kmodel read 0.5 dB against TFLite)."""
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("QuantizeLinear", ["c", "s", "z"], ["q"])]
    m = _int8_output_model(nodes, [1, 3, 4, 4], {"s": np.float32(1 / 256), "z": np.int8(-128), "w": rand(4, 3, 1, 1) * 8},
                           through)
    x = rand(1, 3, 4, 4)
    ref = (ort_run(m, x)[0].astype(np.float32) + 128) / 256
    conv = ort_run(helper.make_model(helper.make_graph(nodes[:1], "c", m.graph.input, [helper.make_tensor_value_info(
        "c", TensorProto.FLOAT, None)], m.graph.initializer), opset_imports=[helper.make_opsetid("", 13)]), x)[0]
    assert (conv < 0).mean() > 0.2 and (conv > 1).mean() > 0.2      # the file's range cuts both ends
    g, changes = run_pass("dequantize", from_onnx(m))
    assert "QuantizeLinear" not in g.op_counts() and g.op_counts()["Clip"] == 1
    assert any("range [0, 0.996094] clamps it" in msg for _, msg in changes)
    assert g.meta["quant_ranges_by_node"][next(n.name for n in g.nodes if n.op == "Clip")] == (0.0, 255 / 256)
    got = run(g, x)[g.outputs[0]]
    assert np.abs(got - ref).max() <= 0.5 / 256 + 1e-6


@pytest.mark.parametrize("through", [False, True])
def test_a_quantized_sigmoid_head_keeps_the_logits_and_the_sigmoids_ranges(through, tmp_path):
    """MoveNet's heat maps: conv -> int8 logits (scale 0.28: -68..3.7) -> LOGISTIC -> int8 output at
    1/256 (transposed to NHWC or not). Fused, the conv's table must read the logits' own range (16
    synthetic images reach -1.3 of it: a table fitted there flattened every peak at sigmoid(-1.3))
    and write the sigmoid's (it had written the logits' grid: outputs 0, 0.28, 0.56, 0.84)."""
    from tl2k210.compiler import ConvertOptions, ModelRanges, convert, load, optimise
    from tl2k210.graph import stage_names
    from tl2k210.k210.emulator import Emulator
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"]),
             helper.make_node("QuantizeLinear", ["c", "sl", "zl"], ["cq"]),
             helper.make_node("DequantizeLinear", ["cq", "sl", "zl"], ["cf"]),
             helper.make_node("Sigmoid", ["cf"], ["s"]),
             helper.make_node("QuantizeLinear", ["s", "so", "zo"], ["q"])]
    m = _int8_output_model(nodes, [1, 3, 8, 8], {"sl": np.float32(0.28), "zl": np.int8(114), "so": np.float32(1 / 256),
                                                 "zo": np.int8(-128), "w": rand(2, 3, 1, 1) * 3,
                                                 "b": np.array([1.0, -2.0], np.float32)}, through)
    opts = ConvertOptions(input_range=(0.0, 1.0), progress=False, min_sqnr=0)
    g = optimise(load(m, opts), opts).graph
    (conv,) = [n for n in g.nodes if n.op == "Conv"]
    assert conv.attrs["activation"]["op"] == "Sigmoid"
    own = ModelRanges(g).own
    assert own[stage_names(conv)["conv"]] == pytest.approx(((-128 - 114) * 0.28, (127 - 114) * 0.28))
    assert own[conv.outputs[0]] == (0.0, 255 / 256)
    convert(m, str(tmp_path / "o.kmodel"), opts)
    emu = Emulator.load(tmp_path / "o.kmodel")
    x = np.random.default_rng(1).uniform(0, 1, (6, 3, 8, 8)).astype(np.float32)
    ref = np.stack([(ort_run(m, v[None])[0].astype(np.float64) + 128) / 256 for v in x]).reshape(6, -1)
    got = np.stack([np.asarray(emu.run(np.rint(v * 255).astype(np.uint8))[0], np.float64).reshape(-1) for v in x])
    if through:
        got = got.reshape(6, 2, 8, 8).transpose(0, 2, 3, 1).reshape(6, -1)
    assert ref.max() > 0.9 and got.max() > 0.9
    assert 10 * np.log10(np.sum(ref ** 2) / np.sum((ref - got) ** 2)) > 25


@pytest.mark.parametrize("pick", ["GatherND", "Split"])
def test_dequantize_takes_a_pick_of_the_integers_as_movement(pick):
    """MoveNet's keypoint decoder gathers int8 heatmap values (Q -> GatherND -> DQ), the traffic
    model's conv-LSTM cell splits uint8 gates (Q -> Split -> DQ): a pick of elements is exact on
    the integers, so the island goes like data movement (GatherND used to be refused as
    'computes on the integers' with advice to export the model fully quantized; Split's DQ was
    left for the back-end to refuse)."""
    inits = [numpy_helper.from_array(np.array(v), k) for k, v in
             {"s": np.float32(0.05), "z": np.int8(-3), "idx": np.array([[0, 1, 2], [0, 3, 1]], np.int64),
              "sizes": np.array([2, 2], np.int64)}.items()]
    take = helper.make_node("GatherND", ["rq", "idx"], ["gq"]) if pick == "GatherND" else \
        helper.make_node("Split", ["rq", "sizes"], ["gq", "unused"], axis=1)
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("QuantizeLinear", ["r", "s", "z"], ["rq"]),
             take,
             helper.make_node("DequantizeLinear", ["gq", "s", "z"], ["g"]),
             helper.make_node("Neg", ["g"], ["y"])]
    m = helper.make_model(helper.make_graph(nodes, "q", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 5])],
                                            [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits),
                          opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    x = rand(1, 4, 5)
    ref = ort_run(m, x)[0]
    g, _ = run_pass("dequantize", from_onnx(m))
    assert g.op_counts() == {"Relu": 1, pick: 1, "Neg": 1}
    got = run(g, x)[g.outputs[0]]
    assert got.shape == ref.shape == ((2,) if pick == "GatherND" else (1, 2, 5))
    assert np.abs(got - ref).max() <= 0.05 / 2 + 1e-6     # within half a step: the float the integers stand for


def test_pool_under_the_kpu_minimum_stays_a_pool_of_its_own():
    """MobileNet's 4x4 average pool of its last 4x4 map: fused into the conv it would make a 1x1
    KPU output (the KPU writes >= 4x4); the flow leaves it a pool the back-end runs on the CPU."""
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("AveragePool", ["c"], ["y"], kernel_shape=[4, 4], strides=[4, 4])]
    m = make_model(nodes, [("x", [1, 4, 4, 4])], [("y", None)], {"w": rand(8, 4, 3, 3), "b": rand(8)})
    x = rand(1, 4, 4, 4)
    g, log = run_pipeline(from_onnx(m))
    conv = next(n for n in g.nodes if n.op == "Conv")
    assert "pool" not in conv.attrs and {"AveragePool", "GlobalAveragePool"} & set(g.op_counts())
    fused = next(p for p in log if p["pass"] == "fuse_pool")["changes"]
    assert fused and "under the 4x4" in fused[0][1]
    np.testing.assert_allclose(run(g, x)[g.outputs[0]], ort_run(m, x)[0], atol=1e-5, rtol=1e-5)


def test_per_axis_quantized_bias_folds():
    """A depthwise conv's int32 bias dequantized per channel with its kernel's axis 3 (what tf2onnx
    writes for TFLite's quantized_dimension) folds along the bias' only axis instead of failing."""
    q = np.arange(-3, 5, dtype=np.int32)
    sc = np.linspace(0.01, 0.08, 8).astype(np.float32)
    nodes = [helper.make_node("DequantizeLinear", ["q", "s", "z"], ["bias"], axis=3),
             helper.make_node("Add", ["x", "bias"], ["y"])]
    m = make_model(nodes, [("x", [1, 8])], [("y", None)],
                   {"q": q, "s": sc, "z": np.zeros(8, np.int32)})
    g, changes = run_pass("fold_constants", from_onnx(m))
    assert "DequantizeLinear" not in g.op_counts()
    bias = g.const(next(n for n in g.nodes if n.op == "Add").inputs[1])
    np.testing.assert_array_equal(bias, q.astype(np.float32) * sc)


def test_shufflenet_v2_split_of_a_5d_reshape_is_rows_of_a_2d_view():
    """The official ShuffleNetV2's channel shuffle (FastestDet): x.reshape(c/2, 2, h*w).permute(1, 0,
    2).reshape(2, -1, c/2, h, w), then x[0] and x[1] (Gathers on axis 0 of a 5-D tensor): each pick
    is rows of a 2-D view, reshaped back (the runtime's shapes are 4-D); the K210 flow lowers it
    as kmodel v4 with onnxruntime's values."""
    from lower_helpers import compile_model, pixels, run_both
    from tl2k210.quantize.metrics import sqnr_db
    c, h, w = 8, 6, 6
    i64 = lambda *v: np.array(v, np.int64)    # noqa: E731
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["f"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("Reshape", ["f", "s1"], ["r1"]), helper.make_node("Transpose", ["r1"], ["t"], perm=[1, 0, 2]),
             helper.make_node("Reshape", ["t", "s2"], ["r2"]),
             helper.make_node("Gather", ["r2", "i0"], ["a"], axis=0), helper.make_node("Gather", ["r2", "i1"], ["b2"], axis=0),
             helper.make_node("Conv", ["a", "wa"], ["ya"], kernel_shape=[1, 1]),
             helper.make_node("Conv", ["b2", "wb"], ["yb"], kernel_shape=[1, 1]),
             helper.make_node("Add", ["ya", "yb"], ["y"])]
    m = make_model(nodes, [("x", [1, 3, h, w])], [("y", None)],
                   {"w": rand(c, 3, 3, 3), "b": rand(c), "s1": i64(c // 2, 2, h * w), "s2": i64(2, -1, c // 2, h, w),
                    "i0": np.array(0, np.int64), "i1": np.array(1, np.int64), "wa": rand(4, c // 2, 1, 1),
                    "wb": rand(4, c // 2, 1, 1)})
    x = rand(1, 3, h, w)
    g, changes = run_pass("gather_slices", from_onnx(m))
    assert "Gather" not in g.op_counts() and all(len(g.shape(t) or ()) <= 4 for n in g.nodes if n.op == "Slice"
                                                 for t in n.inputs[:1] + n.outputs)
    np.testing.assert_allclose(run(g, x)["y"], ort_run(m, x)[0], atol=1e-5, rtol=1e-5)
    px = pixels(4, 3, h, w)
    kmodel = compile_model(m, px, format="v4")[0]
    ref, got = run_both(m, kmodel, px)
    assert sqnr_db(ref.reshape(-1).astype(np.float64), got.reshape(-1).astype(np.float64)) > 30


@pytest.mark.parametrize("idx", [[0, 2, 4, 6], [5, 6, 7, 0, 1], [3], 3, [-1, -2]])
def test_gather_of_constant_indices_is_slices(idx):
    """tf.gather / x[:, idx] on a feature map with constant indices: Slices of the runs of
    consecutive indices (+ Concat, + Squeeze for a scalar index): onnxruntime's values."""
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("Gather", ["c", "idx"], ["y"], axis=1)]
    m = make_model(nodes, [("x", [1, 4, 8, 8])], [("y", None)],
                   {"w": rand(8, 4, 3, 3), "b": rand(8), "idx": np.array(idx, np.int64)})
    x = rand(1, 4, 8, 8)
    g, changes = run_pass("gather_slices", from_onnx(m))
    assert "Gather" not in g.op_counts() and changes
    np.testing.assert_allclose(run(g, x)[g.outputs[0]], ort_run(m, x)[0], atol=1e-5, rtol=1e-5)
    g, _ = run_pipeline(from_onnx(m))            # lowered by the K210 flow
    np.testing.assert_allclose(run(g, x)[g.outputs[0]], ort_run(m, x)[0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("form", ["unsqueeze", "graph-input", "expand"])
def test_prelu_with_a_computed_or_listed_slope(form):
    """PReLU whose slope is Unsqueeze(initializer) (PyTorch exports), an initializer also listed
    as a graph input (IR < 4 files) or Expand(alpha (1,C,1,1)) to the whole map (tflite2onnx: one
    slope per channel, repeated over H and W): the slope is a constant, the PReLU becomes conv
    arithmetic."""
    if form == "expand":
        nodes = [helper.make_node("Expand", ["s", "shape"], ["s2"]), helper.make_node("PRelu", ["c", "s2"], ["y"])]
        inits = {"s": rand(1, 8, 1, 1), "shape": np.array([1, 8, 8, 8], np.int64)}
    elif form == "unsqueeze":
        nodes = [helper.make_node("Unsqueeze", ["s", "ax"], ["s2"]), helper.make_node("PRelu", ["c", "s2"], ["y"])]
        inits = {"s": rand(8, 1), "ax": np.array([2], np.int64)}
    else:
        nodes = [helper.make_node("PRelu", ["c", "s"], ["y"])]
        inits = {"s": rand(8, 1, 1)}
    nodes.insert(0, helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]))
    m = make_model(nodes, [("x", [1, 4, 8, 8])], [("y", None)], {"w": rand(8, 4, 3, 3), "b": rand(8), **inits})
    if form == "graph-input":
        m.graph.input.append(helper.make_tensor_value_info("s", TensorProto.FLOAT, [8, 1, 1]))
        m.ir_version = 3
    x = rand(1, 4, 8, 8)
    g, _ = run_pipeline(from_onnx(m))
    assert "PRelu" not in g.op_counts()
    np.testing.assert_allclose(run(g, x)[g.outputs[0]], ort_run(m, x)[0], atol=1e-4, rtol=1e-4)


def test_constant_output_is_dropped_and_named():
    """An SSD's anchors exported as a constant output next to its boxes: the kmodel computes the
    boxes; the constant is kept in meta and named in the log (it was an internal KeyError)."""
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["boxes"], kernel_shape=[1, 1]),
             helper.make_node("Identity", ["anchors0"], ["anchors"])]
    m = make_model(nodes, [("x", [1, 4, 8, 8])], [("boxes", None), ("anchors", None)],
                   {"w": rand(4, 4, 1, 1), "b": rand(4), "anchors0": rand(1, 16, 4)})
    g, log = run_pipeline(from_onnx(m))
    assert g.outputs == ["boxes"] and g.meta["constant_outputs"]["anchors"].shape == (1, 16, 4)
    changes = next(p for p in log if p["pass"] == "constant_outputs")["changes"]
    assert changes and "is a constant" in changes[0][1]


@pytest.mark.parametrize("n", [4, 6825])
def test_a_constant_output_left_out_is_said_and_kept_in_the_metadata(tmp_path, capsys, n):
    """ortex's tinymodel with x pinned: output2 = Gemm(x) is a constant, so the kmodel has two
    outputs, output1 and output3, and the second is not the source's second: the receipt said
    nothing of it (hunt 17). It names what was left out and the kmodel's order; the metadata
    keeps the values, so the application need not read the source model - ST's 256 px SSD's
    6,825 anchors too (hunt 19: over the 16,384 values then kept, they were dropped), read back."""
    import onnx
    from tl2k210 import metadata
    from tl2k210.cli import main
    nodes = [helper.make_node("Identity", ["k"], ["anchors"]), helper.make_node("Conv", ["x", "w"], ["boxes"])]
    anchors = rand(1, n, 4 if n > 4 else 2)
    m = make_model(nodes, [("x", [1, 4, 8, 8])], [("anchors", None), ("boxes", None)],
                   {"k": anchors, "w": rand(4, 4, 1, 1)})
    src = tmp_path / "ssd.onnx"
    onnx.save(m, src)
    np.save(tmp_path / "cal.npy", np.random.default_rng(0).uniform(0, 1, (8, 4, 8, 8)).astype(np.float32))
    out = tmp_path / "ssd.kmodel"
    assert main(["convert", str(src), str(out), "--dataset", str(tmp_path / "cal.npy"), "--min-sqnr", "0"]) == 0
    said = capsys.readouterr().out
    assert (f"constant outputs left out of the kmodel (it computes maps): anchors {anchors.shape} (their values "
            "are in the metadata's constants); the kmodel's outputs, in order: boxes") in said
    meta = metadata.load_for(out)
    assert [o["name"] for o in meta.outputs] == ["boxes"] and meta.constants["anchors"]["shape"] == list(anchors.shape)
    assert np.array_equal(np.float32(meta.constants["anchors"]["values"]), anchors.ravel().astype(np.float32))


@pytest.mark.parametrize("conv_after", [True, False])
def test_pixel_unshuffle_is_space_to_depth_and_a_folded_shuffle(conv_after):
    """torch's nn.PixelUnshuffle(2) as the TorchScript exporter writes it: Reshape (1, C, H/2, 2, W/2,
    2) -> Transpose [0, 1, 3, 5, 2, 4] -> Reshape (1, 4C, H/2, W/2), 6-D tensors no kmodel holds ->
    SpaceToDepth and a DCR-to-CRD channel shuffle, folded into the conv that reads it; onnxruntime's
    values (exact: data movement, and a conv's input channels reordered)."""
    c, hw, co = 3, 8, 5
    nodes = [helper.make_node("Reshape", ["x", "s6"], ["r6"]),
             helper.make_node("Transpose", ["r6"], ["t6"], perm=[0, 1, 3, 5, 2, 4]),
             helper.make_node("Reshape", ["t6", "s4"], ["u"])]
    nodes += [helper.make_node("Conv", ["u", "w", "bias"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1])] \
        if conv_after else [helper.make_node("Relu", ["u"], ["y"])]
    inits = {"s6": np.array([1, c, hw // 2, 2, hw // 2, 2], np.int64),
             "s4": np.array([1, 4 * c, hw // 2, hw // 2], np.int64), "w": rand(co, 4 * c, 3, 3), "bias": rand(co)}
    m = make_model(nodes, [("x", [1, c, hw, hw])], [("y", None)], inits)
    x = rand(1, c, hw, hw)
    ref = ort_run(m, x)[0]
    g, changes = run_pass("pixel_shuffle", from_onnx(m))
    assert "SpaceToDepth" in g.op_counts() and changes and "pixel unshuffle (x2)" in changes[0][1]
    np.testing.assert_allclose(run(g, x)[g.outputs[0]], ref, atol=1e-5, rtol=1e-5)
    g, _ = run_pipeline(from_onnx(m))
    assert all(len(g.shape(t) or ()) <= 5 for t in g.tensors)
    if conv_after:
        assert "Transpose" not in g.op_counts()
    np.testing.assert_allclose(run(g, x)[g.outputs[0]], ref, atol=1e-4, rtol=1e-4)


def test_dequantize_lets_a_view_read_the_shape_of_a_quantized_map():
    """torch's `x.view(x.size(0), -1)` of a quantized map (onnxruntime's quantize_static of a
    TorchScript export): Shape -> Gather -> Unsqueeze -> Concat -> Reshape(xq, shape) reads only
    the shape of the integers, so the island Q -> Reshape -> DQ still becomes float (it was
    refused: "Shape computes on the integers"); onnxruntime's values."""
    s, z = np.float32(0.05), np.uint8(128)
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("QuantizeLinear", ["r", "s", "z"], ["rq"]),
             helper.make_node("Shape", ["rq"], ["shp"]),
             helper.make_node("Gather", ["shp", "zero"], ["n"], axis=0),
             helper.make_node("Unsqueeze", ["n", "ax0"], ["nu"]),
             helper.make_node("Concat", ["nu", "minus1"], ["view"], axis=0),
             helper.make_node("Reshape", ["rq", "view"], ["fq"]),
             helper.make_node("DequantizeLinear", ["fq", "s", "z"], ["f"]),
             helper.make_node("MatMul", ["f", "w"], ["y"])]
    inits = {"s": s, "z": z, "zero": np.array(0, np.int64), "ax0": np.array([0], np.int64),
             "minus1": np.array([-1], np.int64), "w": rand(2 * 3 * 3, 4)}
    m = make_model(nodes, [("x", [1, 2, 3, 3])], [("y", None)], inits)
    x = rand(1, 2, 3, 3)
    ref = ort_run(m, x)[0]
    g, changes = run_pass("dequantize", from_onnx(m))
    assert not {"QuantizeLinear", "DequantizeLinear"} & set(g.op_counts())
    assert ((0 - 128) * 0.05, (255 - 128) * 0.05) == pytest.approx(next(iter(g.meta["quant_ranges"].values())))
    got = run(g, x)[g.outputs[0]]
    # float where the model rounds to its 0.05 grid: within half a step per element of the MatMul
    assert np.abs(got - ref).max() <= 0.025 * np.abs(inits["w"]).sum(0).max() * 1.01
    g, _ = run_pipeline(from_onnx(m))
    assert "Shape" not in g.op_counts()


@pytest.mark.parametrize("op", ["Tile", "Expand"])
def test_dequantize_moves_a_tile_of_a_quantized_map(op):
    """DeepLab's image pooling (Coral's deeplab_mobilenet_edgetpu_slim_cityscapes_quant.tflite):
    a quantized 1x1 map broadcast back to the feature size, Q -> Reshape -> Tile -> DQ, was
    refused ("op QuantizeLinear has no K210 lowering"): Tile and Expand move integers like
    Reshape, so the island becomes float; onnxruntime's values within half a step."""
    s, z = np.float32(0.05), np.uint8(0)
    nodes = [helper.make_node("GlobalAveragePool", ["x"], ["p"]),
             helper.make_node("Relu", ["p"], ["r"]),
             helper.make_node("QuantizeLinear", ["r", "s", "z"], ["rq"]),
             helper.make_node("Reshape", ["rq", "shape"], ["rr"]),
             helper.make_node(op, ["rr", "reps"], ["t"]),
             helper.make_node("DequantizeLinear", ["t", "s", "z"], ["f"]),
             helper.make_node("Add", ["f", "x"], ["y"])]
    reps = np.array([1, 1, 4, 4] if op == "Tile" else [1, 3, 4, 4], np.int64)
    inits = {"s": s, "z": z, "shape": np.array([1, 3, 1, 1], np.int64), "reps": reps}
    m = make_model(nodes, [("x", [1, 3, 4, 4])], [("y", None)], inits)
    x = rand(1, 3, 4, 4)
    ref = ort_run(m, x)[0]
    g, _ = run_pass("dequantize", from_onnx(m))
    assert not {"QuantizeLinear", "DequantizeLinear"} & set(g.op_counts())
    assert np.abs(run(g, x)[g.outputs[0]] - ref).max() <= 0.025 + 1e-6
    g, _ = run_pipeline(from_onnx(m))
    assert np.abs(run(g, x)[g.outputs[0]] - ref).max() <= 0.025 + 1e-6


@pytest.mark.parametrize("broken", [False, True])
def test_dead_channels_with_an_infinite_scale_are_zero(broken):
    """tf2onnx's portrait_video: two layers whose int8 weights are all 0 on a scale of inf. They
    stand for 0 (not inf * 0 = NaN, which stopped calibration); a code other than the zero point
    on such a scale is a broken file, said so."""
    from tl2k210.errors import ModelLoadError
    q = np.zeros((2, 4, 1, 1), np.int8)
    q[1] = 3
    if broken:
        q[0, 0] = 1
    inits = [numpy_helper.from_array(q, "wq"), numpy_helper.from_array(np.array([np.inf, 0.5], np.float32), "s"),
             numpy_helper.from_array(np.zeros(2, np.int8), "z")]
    nodes = [helper.make_node("DequantizeLinear", ["wq", "s", "z"], ["w"], axis=0),
             helper.make_node("Conv", ["x", "w"], ["y"])]
    g = helper.make_graph(nodes, "d", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 3, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 3, 3])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    if broken:
        with pytest.raises(ModelLoadError, match="scale for 'wq' is not finite .* broken"):
            run_pass("fold_constants", from_onnx(m))
        return
    g, _ = run_pass("fold_constants", from_onnx(m))
    w = g.const(next(n for n in g.nodes if n.op == "Conv").inputs[1])
    np.testing.assert_array_equal(w, np.concatenate([np.zeros((1, 4, 1, 1)), np.full((1, 4, 1, 1), 1.5)]))


def test_a_quantized_dense_output_keeps_the_files_range_without_a_dataset(tmp_path):
    """A cifar int8 TFLite (TinyML Cookbook) converted without --dataset: its last dense layer
    writes the int8 output (-13..10.8), which passes.dequantize keeps as a Clip; the dense layer
    became a conv and a reshape that the Clip could not fuse through, so the conv took the 16
    synthetic images' range and the kmodel clipped every logit to -7.8..2.7 (19.9 dB against
    TFLite on real photos, the receipt 29.1). The conv writes the file's grid."""
    from tl2k210.compiler import ConvertOptions, ModelRanges, convert, load, optimise
    from tl2k210.k210.emulator import Emulator
    rng = np.random.default_rng(4)
    w = (rng.normal(size=(1200, 10)) * 0.05).astype(np.float32)      # > 1024 inputs: passes.wide_dense
    nodes = [helper.make_node("QuantizeLinear", ["x", "si", "zi"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "si", "zi"], ["xf"]),
             helper.make_node("MaxPool", ["xf"], ["mp"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Flatten", ["mp"], ["f"]), helper.make_node("MatMul", ["f", "w"], ["mm"]),
             helper.make_node("Add", ["mm", "b"], ["a"]), helper.make_node("QuantizeLinear", ["a", "so", "zo"], ["q"])]
    m = _int8_output_model(nodes, [1, 3, 40, 40], {"si": np.float32(1 / 255), "zi": np.int8(-128), "w": w,
                                                 "b": np.linspace(-1, 1, 10).astype(np.float32),
                                                 "so": np.float32(0.1), "zo": np.int8(0)}, False)
    opts = ConvertOptions(progress=False, min_sqnr=0)
    g = optimise(load(m, opts), opts).graph
    own = ModelRanges(g).own
    (conv,) = [n for n in g.nodes if n.op == "Conv" and "MatMul_4" in n.fused]
    assert own[conv.outputs[0]] == pytest.approx((-12.8, 12.7))
    convert(m, str(tmp_path / "o.kmodel"), opts)
    emu = Emulator.load(tmp_path / "o.kmodel")
    x = rng.integers(0, 2, (8, 3, 40, 40)).astype(np.float32)        # high-contrast inputs: large logits
    ref = np.stack([ort_run(m, v[None])[0].astype(np.float64) * 0.1 for v in x]).reshape(8, -1)
    got = np.stack([np.asarray(emu.run(np.rint(v * 255).astype(np.uint8))[0], np.float64).reshape(-1) for v in x])
    assert np.abs(ref).max() > 3 and np.abs(got - ref).max() <= 0.3


def test_a_refusal_names_the_quantized_tensor_the_file_has(tmp_path):
    """Coral's DeepLab (uint8 TFLite) ends in an ArgMax of the dequantized scores: the refusal told
    the user `--outputs ResizeBilinear_2_dequant`, tf2onnx's name, which the file has not (the
    TFLite tensor is ResizeBilinear_2). Dropping a DequantizeLinear keeps the integers' name."""
    from tl2k210.compiler import ConvertOptions, convert
    from tl2k210.errors import UnsupportedOpError
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("QuantizeLinear", ["c", "s", "z"], ["scores"]),
             helper.make_node("DequantizeLinear", ["scores", "s", "z"], ["scores_dequant"]),
             helper.make_node("ArgMax", ["scores_dequant"], ["y"], axis=1, keepdims=0)]
    m = helper.make_model(helper.make_graph(
        nodes, "a", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.INT64, None)],
        [numpy_helper.from_array(np.array(v), k) for k, v in
         {"w": rand(4, 3, 1, 1), "s": np.float32(0.05), "z": np.uint8(128)}.items()]),
        opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    with pytest.raises(UnsupportedOpError, match="convert with --outputs scores "):
        convert(m, str(tmp_path / "o.kmodel"), ConvertOptions(progress=False, input_range=(0.0, 1.0)))
    assert not (tmp_path / "o.kmodel").exists()


@pytest.mark.parametrize("inside", [True, False])
def test_a_cast_inside_the_network_is_not_called_a_decoder(inside):
    """NEMO's integer-deployable ONNX (pulp-platform's dory examples) floors each requantization
    through Cast(int64) -> ... -> Cast(float) in its first layer; the refusal called it a decoder's
    index arithmetic and advised --outputs, which cannot help. A Cast a layer with weights reads
    from is said to be inside the network; one after the last layer keeps the decoder advice."""
    from tl2k210.errors import UnsupportedOpError
    from tl2k210.k210.flow import check_supported
    from tl2k210.k210.lower import Options
    n = helper.make_node
    nodes = [n("Conv", ["x", "w"], ["c"]), n("Cast", ["c"], ["ci"], to=TensorProto.INT64),
             n("Cast", ["ci"], ["cf"], to=TensorProto.FLOAT)]
    nodes += [n("Conv", ["cf", "w2"], ["y"])] if inside else [n("Identity", ["cf"], ["y"])]
    g = from_onnx(make_model(nodes, [("x", [1, 3, 8, 8])], [("y", None)], {"w": rand(4, 3, 1, 1), "w2": rand(2, 4, 1, 1)}))
    with pytest.raises(UnsupportedOpError) as e:
        check_supported(g, lambda *a: None, opts=Options())
    assert ("it sits inside the network" in str(e.value)) is inside
    assert ("a Cast is index arithmetic" in str(e.value)) is not inside


def test_an_embedding_lookup_is_refused_saying_where_it_belongs():
    """A text classifier's embedding (a Gather of a constant table by the model's token ids) was
    refused with a list of 60 ONNX ops to replace it with; it says the lookup belongs in the
    application."""
    from tl2k210.errors import UnsupportedOpError
    from tl2k210.k210.flow import check_supported
    from tl2k210.k210.lower import Options
    m = make_model([helper.make_node("Gather", ["table", "ids"], ["e"], axis=0),
                    helper.make_node("ReduceMean", ["e"], ["y"], axes=[1])],
                   [("ids", [1, 8])], [("y", None)], {"table": rand(100, 16)})
    m.graph.input[0].type.tensor_type.elem_type = TensorProto.INT64
    with pytest.raises(UnsupportedOpError, match=r"do the lookup in the application .*\(--inputs NAME starts"):
        check_supported(from_onnx(m), lambda *a: None, opts=Options())

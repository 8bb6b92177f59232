"""The IR: ONNX in/out, Conv normalisation, shapes, topological order, fused-stage export."""
import sys
import subprocess

import numpy as np
import pytest
from onnx import helper

from front_helpers import make_model, ort_run, rand
from tl2k210.errors import UnsupportedOpError
from tl2k210.graph import Node, from_onnx, run, stage_names, to_onnx, toposort
from tl2k210.k210.flow import run_pipeline


def small_model():
    n = helper.make_node
    nodes = [n("Conv", ["x", "w"], ["c"], name="conv", auto_pad="SAME_UPPER", strides=[2, 2]),
             n("Relu", ["c"], ["r"]), n("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             n("Flatten", ["p"], ["f"]), n("Gemm", ["f", "fw", "fb"], ["y"], transB=1)]
    return make_model(nodes, [("x", ["N", 3, 16, 16])], [("y", None)],
                      {"w": rand(8, 3, 3, 3), "fw": rand(5, 128), "fb": rand(5)})


def test_from_onnx_normalises_conv_and_infers_shapes():
    g = from_onnx(small_model())
    c = g.nodes[0]
    assert c.attrs == {"kernel": (3, 3), "strides": (2, 2), "pads": [0, 0, 1, 1], "group": 1, "dilations": (1, 1)}
    assert len(c.inputs) == 3 and np.all(g.const(c.inputs[2]) == 0)  # explicit zero bias
    assert g.shape("x") == (1, 3, 16, 16) and g.shape("c") == (1, 8, 8, 8) and g.shape("y") == (1, 5)
    assert set(g.initializers) >= {"w", "fw", "fb"}


@pytest.mark.parametrize("auto, size, pads", [("SAME_UPPER", 12, [0, 0, 1, 1]), ("SAME_LOWER", 12, [1, 1, 0, 0]),
                                               ("SAME_UPPER", 11, [1, 1, 1, 1]), ("VALID", 12, [0, 0, 0, 0])])
def test_a_pools_auto_pad_becomes_explicit_pads_and_lowers_to_v3(auto, size, pads):
    """keras2onnx's MTCNN writes MaxPool auto_pad=SAME_UPPER: the uint8 and KPU pools took only
    explicit pads, so every net went to kmodel v4 (and `--format v3` was refused). The pads the
    shape gives, at import: the same values as onnxruntime, kmodel v3 within quantization."""
    from lower_helpers import compile_model, pixels, sqnr
    n = helper.make_node
    m = make_model([n("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]), n("Relu", ["c"], ["r"]),
                    n("MaxPool", ["r"], ["y"], kernel_shape=[3, 3], strides=[2, 2], auto_pad=auto)],
                   [("x", [1, 3, size, size])], [("y", None)], {"w": rand(8, 3, 3, 3), "b": rand(8)})
    g = from_onnx(m)
    pool = next(x for x in g.nodes if x.op == "MaxPool")
    assert "auto_pad" not in pool.attrs and pool.attrs["pads"] == pads
    x = rand(1, 3, size, size)
    np.testing.assert_allclose(run(g, x)["y"], ort_run(m, x)[0], rtol=1e-5, atol=1e-5)
    px = pixels(3, 3, size, size)
    kmodel = compile_model(m, px, format="v3")[0]
    assert kmodel.version == 3 and sqnr(m, kmodel, px) > 30


@pytest.mark.parametrize("op,cip,k,s,size,pads", [
    ("MaxPool", 0, 2, 2, 64, [0, 0, 0, 0]),       # yolov8-lite's: an even map, the same windows
    ("MaxPool", 0, 2, 2, 63, [0, 0, 1, 1]),       # odd: one more window, half in the end padding
    ("MaxPool", 0, 3, 2, 32, [0, 0, 1, 1]),
    ("AveragePool", 0, 2, 2, 63, [0, 0, 1, 1]),   # a mean of the taps inside: as ceil mode's
    ("AveragePool", 1, 2, 2, 63, None),           # counts pads: ceil mode stays
])
def test_a_pools_ceil_mode_becomes_end_pads(op, cip, k, s, size, pads):
    """PyTorch's MaxPool2d(ceil_mode=True) (hpc203's yolov8-lite face detector, hunt 20): the KPU
    and uint8 pools take no ceil_mode, so it ran in float on the CPU and forced kmodel v4, though
    on an even map it pools the same windows. At import it is the end pads that give floor mode
    its outputs: the same values as onnxruntime, kmodel v3 where the pool has a v3 form."""
    from lower_helpers import compile_model, pixels, sqnr
    n = helper.make_node
    kw = {"count_include_pad": cip} if op == "AveragePool" else {}
    m = make_model([n("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]), n("Relu", ["c"], ["r"]),
                    n(op, ["r"], ["y"], kernel_shape=[k, k], strides=[s, s], ceil_mode=1, **kw)],
                   [("x", [1, 3, size, size])], [("y", None)], {"w": rand(8, 3, 3, 3), "b": rand(8)})
    g = from_onnx(m)
    pool = next(x for x in g.nodes if x.op == op)
    assert pool.attrs.get("ceil_mode") == (1 if pads is None else 0)
    assert pads is None or pool.attrs["pads"] == pads
    x = rand(1, 3, size, size)
    np.testing.assert_allclose(run(g, x)["y"], ort_run(m, x)[0], rtol=1e-5, atol=1e-5)
    if op == "MaxPool":
        px = pixels(3, 3, size, size)
        kmodel = compile_model(m, px, format="v3")[0]
        assert kmodel.version == 3 and sqnr(m, kmodel, px) > 30


def test_roundtrip_matches_onnxruntime():
    m = small_model()
    x = rand(1, 3, 16, 16)
    np.testing.assert_allclose(run(from_onnx(m), x)["y"], ort_run(m, x)[0], rtol=1e-5, atol=1e-5)


def test_a_copys_edits_do_not_reach_the_graph_it_was_copied_from():
    """Ranges and source names are recorded by tensor name: a copy's replace_uses must not
    give a tensor of the original (or of a later copy, where the same name may mean another
    tensor) a range or a name it does not have."""
    g = from_onnx(small_model())
    g.meta["quant_ranges"] = {"c": (-1.0, 2.0)}
    g.meta["source_names"] = {}
    c = g.copy()
    c.replace_uses("c", "r")
    assert c.meta["quant_ranges"] == {"c": (-1.0, 2.0), "r": (-1.0, 2.0)}
    assert c.source_name("r") == "c"
    assert g.meta["quant_ranges"] == {"c": (-1.0, 2.0)} and g.meta["source_names"] == {}
    assert g.copy().source_name("r") == "r"


def test_an_opset_8_batchnorm_with_spatial_0_and_per_channel_parameters_loads():
    """An MXNet export (Ultralight-SimplePose, opset 8) writes spatial=0 on every BatchNormalization
    with (C,) parameters -- what spatial=1 computes; onnx's version converter refuses the attribute.
    Dropped there, the graph computes what onnxruntime computes of the file."""
    n = helper.make_node
    m = make_model([n("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
                    n("BatchNormalization", ["c", "s", "b", "m", "v"], ["y"], spatial=0, epsilon=1e-5)],
                   [("x", [1, 3, 8, 8])], [("y", None)],
                   {"w": rand(4, 3, 3, 3), "s": rand(4) + 2, "b": rand(4), "m": rand(4), "v": np.abs(rand(4)) + 0.5},
                   opset=8)
    x = rand(1, 3, 8, 8)
    g = from_onnx(m)
    assert np.allclose(run(g, x)[g.outputs[0]], ort_run(m, x)[0], atol=1e-4)
    assert any(a.name == "spatial" for a in m.graph.node[1].attribute)      # the file is left as it was


def test_maps_that_meet_a_resize_to_constant_sizes_name_it_at_another_size():
    """A PAN segmenter upsamples to constant sizes (Resize 'sizes' 8x8): at --input-shape 256 its
    maps met that 8x8 as 4x4 and the user was told to pick a size its strides divide (256 was);
    the Resize is named instead, and re-exporting at the size it runs at."""
    n = helper.make_node
    m = make_model([n("MaxPool", ["x"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
                    n("Resize", ["p", "", "", "sz"], ["r"], name="up", mode="nearest"),
                    n("MaxPool", ["x"], ["q"], kernel_shape=[2, 2], strides=[2, 2]),
                    n("Add", ["r", "q"], ["y"], name="sum")],
                   [("x", [1, 3, 16, 16])], [("y", None)], {"sz": np.array([1, 3, 8, 8], np.int64)})
    assert from_onnx(m).shape("y") == (1, 3, 8, 8)
    with pytest.raises(ValueError, match=r"'up' output a size the file fixes .* export the model at the size"):
        from_onnx(m, input_shapes={"x": (1, 3, 32, 32)})


def test_toposort_and_cycle_error():
    g = from_onnx(small_model())
    g.nodes.reverse()
    assert [n.op for n in toposort(g)] == ["Conv", "Relu", "MaxPool", "Flatten", "Gemm"]
    g.nodes.append(Node("Relu", ["loop"], ["loop2"]))
    with pytest.raises(ValueError, match="loop"):
        toposort(g)


def test_fused_conv_exports_its_stages():
    g, _ = run_pipeline(from_onnx(small_model()))
    conv = next(n for n in g.nodes if n.op == "Conv" and n.attrs.get("activation"))
    assert conv.attrs["activation"] == {"op": "Relu"}
    # the stride-2 conv keeps its real pads; the pool is not fused into a stride-2 conv
    assert conv.attrs["strides"] == (2, 2) and "pool" not in conv.attrs
    st = stage_names(conv)
    outs = run(g, rand(1, 3, 16, 16), expose_all=True)
    assert st["conv"] in outs and st["out"] in outs
    assert np.array_equal(np.maximum(outs[st["conv"]], 0), outs[st["out"]])
    m = to_onnx(g)
    assert [o.name for o in m.graph.output] == ["y"]


def test_custom_domain_op_is_unsupported():
    m = make_model([helper.make_node("Foo", ["x"], ["y"], domain="com.acme")], [("x", [1, 2])], [("y", None)])
    with pytest.raises(UnsupportedOpError, match="com.acme.Foo"):
        from_onnx(m)


def test_ir_modules_do_not_import_tensorflow():
    code = ("import sys, tl2k210.graph, tl2k210.passes, tl2k210.frontends, tl2k210.quantize.calibrate, "
            "tl2k210.quantize.dataset; bad = [m for m in ('tensorflow', 'tf2onnx', 'keras', 'tensorlayer') "
            "if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_symbolic_spatial_dims_need_a_shape():
    """The refusal shows the dims as the file stores them, the known ones as numbers and not a
    converter's internal names (tflite-support's dilated_conv.tflite listed ['unk__202',
    'unk__203', 'unk__204', '?'] for its (?, ?, ?, 3) input), and says how to give the size."""
    m = make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", ["N", 3, "H", "W"])], [("y", None)])
    with pytest.raises(ValueError, match=r"\['\?', 3, '\?', '\?'\] .* --input-shape N,C,H,W"):
        from_onnx(m)
    assert from_onnx(m, input_shapes={"x": (1, 3, 8, 8)}).shape("y") == (1, 3, 8, 8)
    # an audio or sensor input of another rank gets an example of its own rank, not N,C,H,W
    m = make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", [1, "T", 3])], [("y", None)])
    with pytest.raises(ValueError, match=r"\[1, '\?', 3\] .* --input-shape 1,\?,3, each \? replaced"):
        from_onnx(m)
    assert from_onnx(m, input_shapes={"x": (1, 16, 3)}).shape("y") == (1, 16, 3)
    # Silero VAD: (?, ?) audio, a state and a rate: the one-input rule is said at once
    m = make_model([helper.make_node("Add", ["x", "s"], ["y"])], [("x", ["N", "T"]), ("s", ["N", "T"])],
                   [("y", None)])
    with pytest.raises(ValueError, match=r"But first: the model has 2 inputs \('x', 's'\) and a kmodel has one"):
        from_onnx(m)
    # a YOLOv8-seg post-processing graph (hunt 22): a box vector [?] first, then [1, ?]: a 1-D input's
    # only dim is no batch, and every input is counted
    m = make_model([helper.make_node("Add", ["d", "c"], ["y"])], [("d", ["K"]), ("c", [1, "T"])], [("y", None)])
    with pytest.raises(ValueError, match=r"input 'd' has dims of no fixed size: \['\?'\].*--input-shape \?, "
                                         r"each.*But first: the model has 2 inputs \('d', 'c'\)"):
        from_onnx(m)


def test_a_batchless_input_read_as_a_batch_says_to_give_its_shape():
    """Hunt 21: KWT's (98, 40) features, a tensor inside the model that --inputs starts at, have
    no batch axis; read as a batch of 98, its Tensordot gave 1x64 where a Reshape wants [1, 98, 64],
    and the refusal said to fix the model (which TFLite runs). It says that the input was read as
    a batch and to give --input-shape 98,40, which works."""
    import numpy as np
    m = make_model([helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Reshape", ["h", "s"], ["y"])],
                   [("x", [6, 4])], [("y", None)], {"w": rand(4, 8), "s": np.array([1, 6, 8], np.int64)})
    with pytest.raises(ValueError, match=r"input 'x' \(6, 4\) was read as a batch of 6 .* give --input-shape 6,4"):
        from_onnx(m)
    assert from_onnx(m, input_shapes={"x": (6, 4)}).shape("y") == (1, 6, 8)


def test_a_fixed_size_input_given_another_size_moves_its_relabelling_reshapes():
    """MTCNN's P-Net ships at 1280x960 (NHWC) and runs at any size: --input-shape 1,3,240,320 is
    read channels-last (only that fits its 3 channels), and tf2onnx's Reshape of a one-channel
    map NHWC -> NCHW, a constant target made for the exported size, takes the new size's dims in
    the same places (at the exported size it only moves size-1 dims); one that merges a map's
    adjacent dims merges them at the new size. A Reshape that flattens into a vector keeps its
    target (a dense layer reads it), so a size it cannot hold is still refused."""
    from tl2k210.compiler import input_dims
    relabel = make_model([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Reshape", ["r", "s"], ["y"])],
                         [("x", [1, 8, 6, 1])], [("y", None)], {"s": np.array([1, 1, 8, 6], np.int64)})
    x0 = relabel.graph.input[0]
    shape = input_dims(x0, (1, 1, 12, 10))
    assert shape == (1, 12, 10, 1)
    g = from_onnx(relabel, input_shapes={x0.name: shape})
    assert g.shape("y") == (1, 1, 12, 10)
    x = np.random.default_rng(0).normal(size=shape).astype(np.float32)
    np.testing.assert_array_equal(run(g, x)["y"], np.maximum(x, 0).reshape(1, 1, 12, 10))
    # the graph says which targets took the new size (the receipt names them: yolov8-lite's 24
    # channel-shuffle Reshapes at 320 had been re-derived without a word, hunt 20)
    assert g.meta["resized_reshapes"] == {next(nd.name for nd in g.nodes if nd.op == "Reshape"): ([1, 1, 8, 6],
                                                                                                  [1, 1, 12, 10])}
    from tl2k210.compiler import ConvertOptions, load
    note = load(relabel, ConvertOptions(input_shape=(1, 1, 12, 10), progress=False)).input_note
    assert "1 Reshape target(s) the file fixes at its exported size take the new size" in note, note
    flatten = make_model([helper.make_node("Reshape", ["x", "s"], ["y"])], [("x", [1, 8, 6, 1])], [("y", None)],
                         {"s": np.array([1, 48], np.int64)})
    with pytest.raises(ValueError, match=r"cannot reshape x 1x12x10x1 \(120 values\) into \[1, 48\]"):
        from_onnx(flatten, input_shapes={x0.name: shape})
    # TF's Object Detection API upsamples a map by stacking it with itself and merging that axis
    # into the columns: (1, H, W, 2, C) -> (1, H, 2W, C), a target made for the exported size; a
    # merge of a map's adjacent dims takes the new size's product
    n = helper.make_node
    stack = make_model([n("Unsqueeze", ["x", "ax"], ["u"]), n("Concat", ["u", "u"], ["k"], axis=3),
                        n("Reshape", ["k", "s"], ["y"])], [("x", [1, 8, 6, 4])], [("y", None)],
                       {"ax": np.array([3], np.int64), "s": np.array([1, 8, 12, 4], np.int64)})
    g = from_onnx(stack, input_shapes={"x": (1, 10, 5, 4)})
    assert g.shape("y") == (1, 10, 10, 4)
    x = np.random.default_rng(0).normal(size=(1, 10, 5, 4)).astype(np.float32)
    np.testing.assert_array_equal(run(g, x)["y"], x.repeat(2, axis=2))



def test_a_pixel_shuffle_exported_at_one_size_runs_at_another():
    """PyTorch writes PixelShuffle(3) as Reshape (1, 9C, H, W) -> (1, C, 3, 3, H, W), Transpose,
    Reshape -> (1, C, 3H, 3W), both targets constants of the exported size (the ONNX tutorial's
    super-resolution net at 224x224); at --input-shape 1,1,112,112 the split of the unchanged
    channels keeps its dims and the spatial ones take the new size (was: 'cannot reshape ... into
    [-1, 1, 3, 3, 224, 224]'). A split of a dim the new size changes cannot be re-derived."""
    n = helper.make_node
    r = 3
    shuffle = make_model([n("Reshape", ["x", "s1"], ["a"]), n("Transpose", ["a"], ["t"], perm=[0, 1, 4, 2, 5, 3]),
                          n("Reshape", ["t", "s2"], ["y"])], [("x", [1, 9, 8, 6])], [("y", None)],
                         {"s1": np.array([-1, 1, r, r, 8, 6], np.int64), "s2": np.array([-1, 1, 24, 18], np.int64)})
    g = from_onnx(shuffle, input_shapes={"x": (1, 9, 4, 5)})
    assert g.shape("y") == (1, 1, 12, 15)
    x = np.random.default_rng(0).normal(size=(1, 9, 4, 5)).astype(np.float32)
    want = x.reshape(1, 1, r, r, 4, 5).transpose(0, 1, 4, 2, 5, 3).reshape(1, 1, 12, 15)
    np.testing.assert_array_equal(run(g, x)["y"], want)
    split = make_model([n("Reshape", ["x", "s"], ["y"])], [("x", [1, 4, 8, 6])], [("y", None)],
                       {"s": np.array([1, 4, 2, 4, 6], np.int64)})
    with pytest.raises(ValueError, match=r"cannot reshape x 1x4x10x6 \(240 values\) into \[1, 4, 2, 4, 6\]"):
        from_onnx(split, input_shapes={"x": (1, 4, 10, 6)})

def test_shape_inference_leaves_big_weights_out():
    """infer_shapes sends weights over SHAPE_ONLY_ELEMENTS as typed inputs without values (the
    passes re-infer shapes after every pass; serialising a 240 MB AlexNet each time took ~5 s per
    pass): the shapes are those of full inference, small constants (Reshape shapes) still fold."""
    from tl2k210.graph import SHAPE_ONLY_ELEMENTS, infer_shapes
    n = helper.make_node
    nodes = [n("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]), n("Relu", ["c"], ["r"]),
             n("Reshape", ["r", "sh"], ["rs"]), n("MatMul", ["rs", "wm"], ["y"])]
    m = make_model(nodes, [("x", [1, 8, 16, 16])], [("y", None)],
                   {"w": rand(64, 8, 3, 3), "b": rand(64), "sh": np.array([1, -1], np.int64),
                    "wm": rand(64 * 16 * 16, 10)})
    light = to_onnx(from_onnx(m), shapes_only=True)
    assert {i.name for i in light.graph.initializer} == {"b", "sh"}
    assert all(np.prod([d.dim_value for d in i.type.tensor_type.shape.dim]) > SHAPE_ONLY_ELEMENTS
               for i in light.graph.input if i.name in ("w", "wm"))
    g = from_onnx(m)
    for t in ("c", "rs", "y"):
        g.tensors[t].shape = None
    infer_shapes(g)
    assert (g.shape("c"), g.shape("rs"), g.shape("y")) == ((1, 64, 16, 16), (1, 16384), (1, 10))


def test_same_conv_after_a_crop_computed_at_run_time():
    """Keras' CenterCrop in a TFLite file: the crop's box is shape arithmetic (Shape, Equal,
    Cast, Mul, Add) that onnx's data propagation leaves unknown, so the 'SAME' conv after it has
    no input shape when the graph is read; it keeps its ONNX attributes until fold_constants
    has made that arithmetic constants (round 48: an internal TypeError before)."""
    from tl2k210.passes.fold_constants import fold_constants
    n = helper.make_node
    i64 = lambda v: np.array(v, np.int64)  # noqa: E731
    nodes = [n("Shape", ["x"], ["s"]), n("Equal", ["s", "full"], ["e"]),
             n("Cast", ["e"], ["ec"], to=7), n("Mul", ["ec", "off"], ["starts"]),
             n("Add", ["starts", "size"], ["ends"]), n("Slice", ["x", "starts", "ends"], ["crop"]),
             n("Conv", ["crop", "w"], ["y"], name="conv", auto_pad="SAME_UPPER", strides=[2, 2])]
    m = make_model(nodes, [("x", [1, 3, 10, 10])], [("y", None)],
                   {"full": i64([1, 3, 10, 10]), "off": i64([0, 0, 1, 1]), "size": i64([1, 3, 8, 8]),
                    "w": rand(4, 3, 3, 3)})
    g = from_onnx(m)
    conv = next(c for c in g.nodes if c.op == "Conv")
    assert g.shape("crop") is None and conv.attrs["auto_pad"] == "SAME_UPPER"
    fold_constants(g, lambda *a: None)
    assert g.shape("crop") == (1, 3, 8, 8)
    assert conv.attrs["pads"] == [0, 0, 1, 1] and conv.attrs["kernel"] == (3, 3)
    x = rand(1, 3, 10, 10)
    np.testing.assert_allclose(run(g, x)["y"], ort_run(m, x)[0], rtol=1e-5, atol=1e-5)


def test_a_window_larger_than_its_input_is_named():
    """Coral's DeepLab at --input-shape 1,3,257,257: its 33x33 image-pooling AvgPool meets a 17x17
    map, onnx's inference gives (1, 160, -15, -15), and the refusal came at the Reshape after it
    ('fix the target shape in the model'). The pool is named, with both shapes and what to do."""
    from tl2k210.errors import ModelLoadError
    n = helper.make_node
    m = make_model([n("Conv", ["x", "w"], ["c"], strides=[2, 2]), n("AveragePool", ["c"], ["p"], kernel_shape=[4, 4]),
                    n("Reshape", ["p", "s"], ["y"])], [("x", [1, 3, "H", "W"])], [("y", None)],
                   {"w": rand(8, 3, 1, 1), "s": np.array([1, 8], np.int64)})
    assert from_onnx(m, input_shapes={"x": (1, 3, 8, 8)}).shape("y") == (1, 8)
    with pytest.raises(ModelLoadError, match=r"node 'AveragePool_1' .* reads c \(1, 8, 2, 2\) and would write "
                                             r"\(1, 8, -1, -1\): its window is larger than its input"):
        from_onnx(m, input_shapes={"x": (1, 3, 4, 4)})


@pytest.mark.parametrize("producer, size, pads, batch", [("tf2onnx", 9, [1, 1, 1, 1], 1), ("tf2onnx", 10, [0, 0, 1, 1], 1),
                                                         ("pytorch", 9, [0, 0, 1, 1], 1), ("tf2onnx", 9, [1, 1, 1, 1], "N")])
def test_a_tf_models_same_pads_follow_its_input_shape(producer, size, pads, batch):
    """tf2onnx writes TF's 'SAME' as the explicit pads of the size the model was exported at
    (3x3 stride 2 on 8x8: 0 before, 1 after); --input-shape 1,3,9,9 kept them, where TF pads 1 and
    1: PoseNet at 225x321 was a pixel off at every stride-2 stage (9.9 dB against TFLite at that
    size, its receipt 26.5). A TF model's SAME windows get SAME's pads at the new size; other
    producers' explicit pads are the model's own. A symbolic batch (a Keras TFLite's [-1, 96, 96, 3])
    is the batch of one: the VWW net at 85x85 had kept them, 13.5 dB against TFLite there."""
    n = helper.make_node
    m = make_model([n("Conv", ["x", "w"], ["c"], strides=[2, 2], pads=[0, 0, 1, 1]), n("Relu", ["c"], ["y"])],
                   [("x", [batch, 3, 8, 8])], [("y", None)], {"w": rand(4, 3, 3, 3)})
    m.producer_name = producer
    g = from_onnx(m, input_shapes={"x": (1, 3, size, size)})
    conv = next(x for x in g.nodes if x.op == "Conv")
    assert conv.attrs["pads"] == pads and g.shape("c")[2:] == ((size + 1) // 2 if producer == "tf2onnx" else 4 + (size > 9),) * 2


def test_a_tf_window_that_was_same_or_valid_alike_is_valid_where_they_differ():
    """A 2x2 stride-2 pool on an 8x8 map pads nothing as 'SAME' or 'VALID'; on 9x9 SAME pads one
    row and column, VALID none. Such a window (no wider than its stride) is VALID, as Keras' and
    TF-slim's pools default to: DeepLab's 33x33 image pooling at 321x321 is TFLite's 1x1 (round 65's
    second hunt: it had been refused at every size, 'the file does not say which')."""
    n = helper.make_node
    m = make_model([n("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], strides=[2, 2])], [("x", [1, 3, 8, 8])],
                   [("y", None)])
    m.producer_name = "tf2onnx"
    assert from_onnx(m, input_shapes={"x": (1, 3, 10, 10)}).shape("y") == (1, 3, 5, 5)
    g = from_onnx(m, input_shapes={"x": (1, 3, 9, 9)})
    assert g.shape("y") == (1, 3, 4, 4) and g.nodes[0].attrs.get("pads", [0] * 4) == [0, 0, 0, 0]


def test_a_dense_layer_given_more_inputs_than_its_weights_take_is_named():
    """MTCNN R-Net at --input-shape 1,3,48,48: its Flatten gives 5,184 values to a 576-input Dense,
    and a pass failed on it ('please report it with the model'). The dense layer is named, with
    both counts and what to do."""
    from tl2k210.errors import ModelLoadError
    n = helper.make_node
    m = make_model([n("Conv", ["x", "w"], ["c"], strides=[2, 2]), n("Flatten", ["c"], ["f"]), n("MatMul", ["f", "d"], ["y"])],
                   [("x", [1, 3, 8, 8])], [("y", None)], {"w": rand(4, 3, 1, 1), "d": rand(64, 5)})
    assert from_onnx(m).shape("y") == (1, 5)
    with pytest.raises(ModelLoadError, match=r"MatMul node 'MatMul_2' reads f \(1, 256\) \(256 values a row\), but its "
                                             r"weights take 64: at this --input-shape"):
        from_onnx(m, input_shapes={"x": (1, 3, 16, 16)})


def test_a_concat_of_maps_that_no_longer_agree_is_named():
    """PEFM's CPM at --input-shape 200x200: a branch resized to a constant size meets one of the new
    size (24 against 25), and a pass failed on the Concat's unknown shape ('please report it'). The
    Concat is named with its inputs' shapes and what to do."""
    from tl2k210.errors import ModelLoadError
    n = helper.make_node
    m = make_model([n("Conv", ["x", "w"], ["a"]), n("AveragePool", ["x"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
                    n("Resize", ["p", "", "", "sz"], ["r"], mode="nearest"), n("Concat", ["a", "r"], ["y"], axis=1)],
                   [("x", [1, 3, 8, 8])], [("y", None)], {"w": rand(4, 3, 1, 1), "sz": np.array([1, 3, 8, 8], np.int64)})
    assert from_onnx(m).shape("y") == (1, 7, 8, 8)
    with pytest.raises(ModelLoadError, match=r"Concat node 'Concat_3' joins a \(1, 4, 10, 10\), r \(1, 3, 8, 8\) on axis "
                                             r"1; they differ on another axis: at this --input-shape"):
        from_onnx(m, input_shapes={"x": (1, 3, 10, 10)})


def test_a_resize_scale_a_hair_under_a_whole_size_takes_the_size():
    """tf2onnx writes a Keras Resizing(32, 32) of a 124x129 spectrogram as float32 scales 32/124 and
    32/129: 124 x 0.2580645 = 31.999998, which onnx's inference floored to 31 (onnxruntime and TFLite
    give 32), and the Reshape after it was refused, 'export it again' (a Pico audio classifier). The
    Resize takes the whole sizes; the graph computes what onnxruntime does."""
    n = helper.make_node
    scales = np.array([1, 1, 32 / 124, 32 / 129], np.float32)
    m = make_model([n("Resize", ["x", "", "s"], ["r"], mode="nearest"), n("Reshape", ["r", "t"], ["y"])],
                   [("x", [1, 1, 124, 129])], [("y", None)], {"s": scales, "t": np.array([-1, 1, 32, 32], np.int64)})
    g = from_onnx(m)
    assert g.shape("r") == (1, 1, 32, 32) and g.shape("y") == (1, 1, 32, 32)
    x = rand(1, 1, 124, 129)
    alone = make_model(m.graph.node[:1], [("x", [1, 1, 124, 129])], [("r", None)], {"s": scales})
    np.testing.assert_array_equal(run(g, x)["y"].ravel(), ort_run(alone, x)[0].ravel())

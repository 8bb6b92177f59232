"""The kmodel's input layout and channel count come from the graph, never from an index into a
shape: 1-, 3- and 4-channel inputs, NHWC (TF) and NCHW (ONNX), square and not, all become planar
(1, C, H, W) uint8 kmodels (1 channel: a grayscale image) that agree with the source model fed
the same pixels in its own layout. Hand-made ONNX graphs here (no TensorFlow); the Keras/TFLite
front-ends at the end."""
import json

import numpy as np
import pytest
from onnx import helper

from front_helpers import make_model, ort_run
from tl2k210.compiler import ConvertOptions, convert
from tl2k210.k210.emulator import Emulator
from tl2k210.quantize.metrics import sqnr_db

pytest.importorskip("onnxruntime")
RNG = np.random.default_rng(7)
SHAPES = [(1, 12, 8), (3, 10, 10), (4, 8, 12), (1, 9, 9), (3, 8, 14)]     # (C, H, W)


def _w(*shape):
    return (RNG.standard_normal(shape) * 0.3).astype(np.float32)


def nhwc_conv(c, h, w):
    """tf2onnx's form of a Keras Conv2D first layer: NHWC input, Transpose (a Reshape for one
    channel), conv, back to NHWC, Flatten + Dense."""
    to_nchw = (helper.make_node("Reshape", ["x", "s"], ["t"]) if c == 1 else
               helper.make_node("Transpose", ["x"], ["t"], perm=[0, 3, 1, 2]))
    nodes = [to_nchw, helper.make_node("Conv", ["t", "k", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Transpose", ["r"], ["rt"], perm=[0, 2, 3, 1]),
             helper.make_node("Flatten", ["rt"], ["f"]), helper.make_node("Gemm", ["f", "d"], ["y"])]
    m = make_model(nodes, [("x", [1, h, w, c])], [("y", [1, 5])],
                   {"s": np.array([1, 1, h, w], np.int64), "k": _w(6, c, 3, 3), "b": _w(6), "d": _w(6 * h * w, 5)})
    m.producer_name = "tf2onnx"
    return m, "NHWC"


def nhwc_dense(c, h, w):
    """A Keras Flatten + Dense first layer: no layout change below the NHWC input at all."""
    m = make_model([helper.make_node("Flatten", ["x"], ["f"]), helper.make_node("Gemm", ["f", "d"], ["y"])],
                   [("x", [1, h, w, c])], [("y", [1, 5])], {"d": _w(c * h * w, 5)})
    m.producer_name = "tf2onnx"
    return m, "NHWC"


def nchw_conv(c, h, w):
    """ONNX's own convention (PyTorch export): NCHW straight into a conv."""
    nodes = [helper.make_node("Conv", ["x", "k", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]), helper.make_node("Flatten", ["r"], ["f"]),
             helper.make_node("Gemm", ["f", "d"], ["y"])]
    m = make_model(nodes, [("x", [1, c, h, w])], [("y", [1, 5])],
                   {"k": _w(6, c, 3, 3), "b": _w(6), "d": _w(6 * h * w, 5)})
    m.producer_name = "pytorch"
    return m, "NCHW"


def check_planar(src, layout, chw, tmp_path, dataset_layout=None):
    """Convert `src` on pixels stored in `dataset_layout` (default: the model's own) and check the
    kmodel takes planar (1, C, H, W) pixels that give the source model's outputs."""
    c, h, w = chw
    pix = RNG.integers(0, 256, (12, c, h, w)).astype(np.uint8)
    stored = pix.transpose(0, 2, 3, 1) if (dataset_layout or layout) == "NHWC" else pix
    np.save(tmp_path / "d.npy", stored)
    out = tmp_path / "m.kmodel"
    convert(src, out, ConvertOptions(dataset=str(tmp_path / "d.npy"), progress=False))
    meta = json.loads((tmp_path / "m.kmodel.json").read_text())
    assert meta["input"]["layout"] == "NCHW" and meta["input"]["shape"] == [1, c, h, w]
    emu = Emulator.load(out)
    ref, got = [], []
    for p in pix:
        fed = p[None] / np.float32(255)
        ref.append(ort_run(src, (fed.transpose(0, 2, 3, 1) if layout == "NHWC" else fed).astype(np.float32))[0])
        got.append(emu.run(p)[0])            # the planar camera image, as MaixPy hands it over
    return sqnr_db(np.ravel(ref), np.ravel(got))


@pytest.mark.parametrize("chw", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("build", [nhwc_conv, nhwc_dense, nchw_conv], ids=lambda f: f.__name__)
def test_onnx_inputs_become_planar_kmodels(build, chw, tmp_path):
    m, layout = build(*chw)
    assert check_planar(m, layout, chw, tmp_path) > 30


def test_nhwc_dataset_for_an_nchw_model_is_transposed(tmp_path):
    """Calibration arrays stored channels-last for an NCHW model read the same pixels."""
    m, _ = nchw_conv(3, 8, 14)
    assert check_planar(m, "NCHW", (3, 8, 14), tmp_path, dataset_layout="NHWC") > 30


# --------------------------------------------------------------------------- TF front-ends
@pytest.mark.slow
@pytest.mark.parametrize("chw", [(1, 12, 8), (3, 10, 10), (4, 8, 12)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("first", ["conv", "dense"])
def test_tf_inputs_become_planar_kmodels(first, chw, tmp_path):
    """One NHWC Keras model through every TensorFlow front-end: .keras, .tflite, a SavedModel
    directory and a frozen TF1-style GraphDef (.pb)."""
    tf = pytest.importorskip("tensorflow")
    from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2
    from tl2k210 import frontends
    K = tf.keras
    c, h, w = chw
    tf.random.set_seed(0)
    x = K.Input((h, w, c))
    y = K.layers.Conv2D(4, 3, activation="relu")(x) if first == "conv" else x
    model = K.Model(x, K.layers.Dense(5)(K.layers.Flatten()(y)))
    keras_path, tflite_path, sm_path, pb_path = (tmp_path / "m.keras", tmp_path / "m.tflite", tmp_path / "sm",
                                                 tmp_path / "m.pb")
    model.save(keras_path)
    tflite_path.write_bytes(tf.lite.TFLiteConverter.from_keras_model(model).convert())
    model.export(sm_path, verbose=False)
    fn = tf.function(lambda t: model(t), input_signature=[tf.TensorSpec((1, h, w, c), tf.float32, name="image")])
    pb_path.write_bytes(convert_variables_to_constants_v2(fn.get_concrete_function()).graph.as_graph_def()
                        .SerializeToString())
    for src in (keras_path, tflite_path, sm_path, pb_path):
        onnx_model = frontends.load_model(str(src))
        assert check_planar(onnx_model, "NHWC", chw, tmp_path) > 30, src.name


def test_grayscale_kmodel_is_fed_grayscale_by_compare_and_run(tmp_path, capsys):
    """A one-channel NHWC model (Flatten + Dense on 12x8x1) calibrated on colour photos: compare
    and `tl2k210 run` both hand the kmodel the photo's grayscale pixels."""
    from PIL import Image

    from tl2k210.cli import main
    from tl2k210.compare import compare
    from tl2k210.imaging import load_rgb, to_model_input
    m, _ = nhwc_dense(1, 12, 8)
    photos = tmp_path / "photos"
    photos.mkdir()
    for i in range(8):
        Image.fromarray(RNG.integers(0, 256, (30, 20, 3), dtype=np.uint8)).save(photos / f"p{i}.png")
    out = tmp_path / "g.kmodel"
    convert(m, out, ConvertOptions(dataset=str(photos), progress=False))
    rep = compare(m, str(out), str(photos))
    assert rep["samples"] == 8 and rep["outputs"]["y"]["sqnr_db"] > 30
    photo = photos / "p0.png"
    gray = to_model_input(load_rgb(photo), (1, 12, 8))
    assert gray.shape == (1, 12, 8)
    assert main(["run", str(out), "-i", str(photo)]) == 0
    want = Emulator.load(out).run(gray)[0].reshape(-1)
    assert f"[{', '.join(f'{v:.6g}' for v in want[:5])}]" in capsys.readouterr().out


def test_an_output_made_channel_major_is_said(tmp_path):
    """keras2onnx's MTCNN P-Net returns its box map NHWC (a last Transpose), its face map too: the
    kmodel writes the first NCHW (passes.output_nchw), and nothing said so, so the repo's NHWC
    post-processing read garbage. The receipt names each output whose layout changed, with its
    shape; the kmodel's values are the source's transposed."""
    n = helper.make_node
    m = make_model([n("Conv", ["x", "k", "b"], ["c"], pads=[1, 1, 1, 1]), n("Transpose", ["c"], ["boxes"], perm=[0, 2, 3, 1]),
                    n("Conv", ["x", "k2", "b2"], ["faces"])], [("x", [1, 3, 8, 10])], [("boxes", None), ("faces", None)],
                   {"k": _w(4, 3, 3, 3), "b": _w(4), "k2": _w(2, 3, 1, 1), "b2": _w(2)})
    calib = tmp_path / "calib.npy"
    np.save(calib, RNG.uniform(0, 1, (8, 3, 8, 10)).astype(np.float32))
    r = convert(m, str(tmp_path / "o.kmodel"), ConvertOptions(dataset=str(calib), progress=False))
    note = r.totals["layout_note"]
    assert note.startswith("channel-major outputs: boxes (1, 4, 8, 10) is NCHW in the kmodel, NHWC in the source") \
        and "faces" not in note and note in r.table()
    x = RNG.uniform(0, 1, (1, 3, 8, 10)).astype(np.float32)
    px = np.rint(x[0] * 255).astype(np.uint8)
    boxes = np.asarray(Emulator.load(tmp_path / "o.kmodel").run(px)[0]).reshape(4, 8, 10)
    assert sqnr_db(ort_run(m, px[None] / np.float32(255))[0][0].transpose(2, 0, 1).ravel(), boxes.ravel()) > 30


@pytest.mark.parametrize("first", ["conv", "pool"])
def test_bgr_is_folded_into_the_kmodel_which_reads_the_cameras_rgb(first, tmp_path):
    """--bgr promised that the kmodel swaps the camera's R and B; only the host tools did (calibration,
    `run`, `compare`), and MaixPy's kpu.forward, which feeds the camera's planes as they are, ran a
    --bgr kmodel on RGB (round 65's second hunt: an edgetpu MobileNet's top class 830 on the board,
    875 as the model fed BGR says). The first layer reads the channels reversed (a pool first: the
    entry conv becomes a group-1 conv that does), the metadata says the planes are R, G, B, and the
    kmodel fed RGB planes computes the model fed BGR; `compare` agrees."""
    from tl2k210.compare import compare
    n = helper.make_node
    head = [n("Conv", ["x", "k", "b"], ["c"], pads=[1, 1, 1, 1])] if first == "conv" else \
        [n("MaxPool", ["x"], ["p"], kernel_shape=[2, 2], strides=[2, 2]), n("Conv", ["p", "k", "b"], ["c"], pads=[1, 1, 1, 1])]
    k = _w(6, 3, 3, 3)
    k[:, 0] *= 4        # R and B weigh differently: a swap shows
    m = make_model(head + [n("Relu", ["c"], ["y"])], [("x", [1, 3, 8, 8])], [("y", None)], {"k": k, "b": _w(6)})
    photos = tmp_path / "photos"
    photos.mkdir()
    from PIL import Image
    imgs = RNG.integers(0, 256, (8, 8, 8, 3)).astype(np.uint8)
    for i, a in enumerate(imgs):
        Image.fromarray(a).save(photos / f"{i}.png")
    out = tmp_path / "m.kmodel"
    convert(m, str(out), ConvertOptions(dataset=str(photos), channel_order="BGR", progress=False))
    meta = json.loads((tmp_path / "m.kmodel.json").read_text())
    assert meta["input"]["bgr"] is True and meta["input"]["planes"] == "rgb"
    emu = Emulator.load(out)
    for a in imgs[:3]:
        rgb = np.ascontiguousarray(a.transpose(2, 0, 1))
        want = ort_run(m, (rgb[::-1] / np.float32(255))[None].astype(np.float32))[0].ravel()
        got = np.asarray(emu.run(rgb)[0], np.float64).ravel()
        assert sqnr_db(want.astype(np.float64), got) > 30
    rep = compare(m, out, photos)
    assert min(o["sqnr_db"] for o in rep["outputs"].values()) > 30


def test_bgr_on_a_gray_model_changes_nothing(tmp_path):
    """--bgr on a one-channel model was a no-op; folding the swap into the first layer keeps it so
    (no refusal, no `planes` in the metadata)."""
    m, _ = nhwc_conv(1, 8, 8)
    calib = tmp_path / "c.npy"
    np.save(calib, RNG.uniform(0, 1, (8, 8, 8, 1)).astype(np.float32))
    convert(m, str(tmp_path / "g.kmodel"), ConvertOptions(dataset=str(calib), channel_order="BGR", progress=False))
    meta = json.loads((tmp_path / "g.kmodel.json").read_text())
    assert "planes" not in meta["input"]

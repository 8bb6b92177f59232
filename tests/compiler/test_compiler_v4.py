"""Keras models kmodel v3 cannot express, converted with the default `--format auto` (-> v4) and
compared with the float model on held-out photo crops (the README table's rows)."""
import numpy as np
import pytest

from tl2k210.k210 import kmodel

tf = pytest.importorskip("tensorflow")
pytest.importorskip("onnxruntime")
from test_compiler import calib_dir, heldout_dir  # noqa: E402,F401  (shared fixtures)
from tl2k210.compiler import ConvertOptions, convert  # noqa: E402
from tl2k210.compare import compare  # noqa: E402


def _bilinear():
    """Segmentation-style decoder: a TF1-style bilinear resize with align_corners (a half_pixel 2x
    one, Keras UpSampling2D's, has a kmodel v3 form: tests/k210/test_v3_pad_resize.py)."""
    L = tf.keras.layers
    x = tf.keras.Input((32, 32, 3))
    a = L.Conv2D(16, 3, padding="same", activation="relu")(x)
    b = L.Conv2D(32, 3, strides=2, padding="same", activation="relu")(a)
    u = L.Lambda(lambda t: tf.compat.v1.image.resize_bilinear(t, (32, 32), align_corners=True))(b)
    return x, L.Conv2D(4, 3, padding="same")(L.Concatenate()([u, a]))


def _cpu_convs():
    """A conv the KPU has not, even decomposed: strides 3; and one with strides (2, 1) (round 50:
    the KPU conv at (1, 1) and a strided slice). (Round 50's K x L shift stages
    run what this model had before, an even 4x4 stride 2 on the image, 1x7 and 7x1, on the KPU: v3.)"""
    L = tf.keras.layers
    x = tf.keras.Input((32, 32, 3))
    a = L.Conv2D(12, 4, strides=(2, 1), padding="same", activation="relu")(x)
    b = L.Conv2D(16, (1, 7), padding="same", activation="relu")(a)
    c = L.Conv2D(8, 3, strides=3, padding="same")(b)
    return x, L.Dense(10)(L.Flatten()(c))


def _se_block():
    """Squeeze-and-excitation: a per-channel attention scale multiplied into the map."""
    L = tf.keras.layers
    x = tf.keras.Input((32, 32, 3))
    a = L.Conv2D(32, 3, padding="same", activation="relu")(x)
    s = L.GlobalAveragePooling2D()(a)
    s = L.Dense(8, activation="relu")(s)
    s = L.Dense(32, activation="sigmoid")(s)
    y = L.Multiply()([a, L.Reshape((1, 1, 32))(s)])
    return x, L.Conv2D(8, 3, padding="same")(y)


def _mean_max():
    """CBAM spatial attention: mean and max over the channels, a 7x7 conv, a sigmoid gate."""
    L = tf.keras.layers
    x = tf.keras.Input((32, 32, 3))
    a = L.Conv2D(16, 3, padding="same", activation="relu")(x)
    mean = L.Lambda(lambda t: tf.reduce_mean(t, axis=-1, keepdims=True))(a)
    mx = L.Lambda(lambda t: tf.reduce_max(t, axis=-1, keepdims=True))(a)
    g = L.Conv2D(1, 7, padding="same", activation="sigmoid")(L.Concatenate()([mean, mx]))
    return x, L.Conv2D(8, 3, padding="same")(L.Multiply()([a, g]))


def _channel_split():
    """ShuffleNet-v2-style unit: the channels split in two, one half convolved, concatenated back."""
    L = tf.keras.layers
    x = tf.keras.Input((32, 32, 3))
    a = L.Conv2D(16, 3, padding="same", activation="relu")(x)
    left, right = L.Lambda(lambda t: tf.split(t, 2, axis=-1))(a)
    r = L.Conv2D(8, 3, padding="same", activation="relu")(right)
    return x, L.Conv2D(8, 1)(L.Concatenate()([left, r]))


MODELS = {"bilinear upsampling": (_bilinear, "resize_image"),         # align_corners: the runtime's resize
          "CPU conv (strides 3)": (_cpu_convs, "quantized_conv2d"),
          "SE block (Mul)": (_se_block, "quantized_binary"),
          "Mean/ReduceMax over channels": (_mean_max, "reduce"),
          "channel Split": (_channel_split, "strided_slice")}


@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
def test_model_needing_v4_converts_with_format_auto(name, tmp_path, calib_dir, heldout_dir):  # noqa: F811
    build, opcode = MODELS[name]
    tf.keras.utils.set_random_seed(3)
    x, y = build()
    import onnx
    from tl2k210.frontends import load_model
    src = tmp_path / "m.onnx"            # through ONNX: a .keras file cannot hold the Lambda layers
    onnx.save(load_model(tf.keras.Model(x, y)), src)
    out = tmp_path / "m.kmodel"
    receipt = convert(src, out, ConvertOptions(dataset=str(calib_dir), progress=False))
    m = kmodel.load(out)
    assert m.version == 4 and receipt.totals["format"] == "v4"
    assert "v3 cannot express" in receipt.totals["format_why"]
    assert opcode in [n.name for n in m.nodes]
    rep = compare(str(src), str(out), str(heldout_dir))
    sq = list(rep["outputs"].values())[0]["sqnr_db"]
    print(f"| {name} | {len(m.nodes)} nodes ({sum(n.conv is not None for n in m.nodes)} KPU) | "
          f"{receipt.file_size:,} B | {receipt.main_memory:,} B | {receipt.latency_ms:.2f} ms | {sq:.1f} dB |")
    assert sq > 25


# ---------------------------------------------------------------------------------------------
# Real third-party models whose nncase v0.2 kmodels are v4 (corpus/models: their TF Lite sources)
# name -> (min SQNR dB, kmodel version --format auto writes)
CORPUS_V4 = {"SemanticSegmentation4M5StickV__Model_V0_1": (12.0, 4),   # a Pad v3 has no layer for (16.0 dB)
             # the image feeds a pool and a conv: an identity entry conv (passes.entry_conv) keeps
             # it v3, which every MaixPy build loads
             "DAE_for_M5StickV__Model": (15.0, 3)}


@pytest.mark.slow
@pytest.mark.parametrize("name", CORPUS_V4)
def test_corpus_model_needing_v4_converts_with_format_auto(name, tmp_path, calib_dir, heldout_dir):  # noqa: F811
    from front_helpers import need_testdata
    src = need_testdata(f"corpus/models/{name}.tflite")
    out = tmp_path / "m.kmodel"
    receipt = convert(src, out, ConvertOptions(dataset=str(calib_dir), progress=False))
    m = kmodel.load(out)
    min_db, version = CORPUS_V4[name]
    assert m.version == version
    if version == 4:
        assert "v3 cannot express" in receipt.totals["format_why"]
    theirs = kmodel.load(need_testdata(f"corpus/kmodels/{name}.kmodel"))
    rep = compare(str(src), str(out), str(heldout_dir))
    sq = list(rep["outputs"].values())[0]["sqnr_db"]
    n_ours = len(m.nodes) if version == 4 else len(m.layers)
    print(f"\n| {name} | {receipt.totals['format_why'][:60]} | v{version}, {n_ours} layers "
          f"(nncase v4: {len(theirs.nodes)} nodes) | {receipt.file_size:,} B | "
          f"{receipt.main_memory:,} B (nncase {theirs.main_mem:,} B) | {receipt.latency_ms:.2f} ms | {sq:.1f} dB |")
    assert sq > min_db


def test_a_whole_model_reason_for_v4_reads_as_a_sentence(tmp_path):
    """A vector input reshaped for a pool (a map no conv reads first: it stays a vector, see
    passes.input_nchw) starts the kmodel with QUANTIZE, which v3 runtimes do not take: no node is
    to blame, and the receipt read 'v3 cannot express the first kmodel layer would be QUANTIZE'
    (a Pico loud-talking detector, round 65's second hunt)."""
    import numpy as np
    from onnx import helper

    from front_helpers import make_model, rand
    from tl2k210.compiler import ConvertOptions, convert
    n = helper.make_node
    m = make_model([n("Reshape", ["x", "s"], ["r"]), n("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[1, 1]),
                    n("Conv", ["p", "w"], ["c"], pads=[1, 1, 1, 1]), n("Relu", ["c"], ["y"])],
                   [("x", [1, 256])], [("y", None)], {"s": np.array([1, 4, 8, 8], np.int64), "w": rand(8, 4, 3, 3)})
    calib = tmp_path / "c.npy"
    np.save(calib, np.random.default_rng(0).uniform(0, 1, (8, 256)).astype(np.float32))
    r = convert(m, str(tmp_path / "o.kmodel"), ConvertOptions(dataset=str(calib), progress=False))
    why = r.totals["format_why"]
    assert r.totals["format"] == "v4" and why.startswith("kmodel v4 (--format auto): not v3, as the first kmodel "
                                                         "layer would be QUANTIZE"), why


def test_auto_takes_v4_where_v3_is_far_over_the_ideal(tmp_path):
    """`--format auto` writes kmodel v3 where every layer has a v3 form, unless v3's bytes are
    over fit.WEIGHTS_TARGET times the ideal weights and kmodel v4's fastest forms make a smaller
    model at most LATENCY_SLACK slower: a 7x7 depthwise conv over its 7x7 map is v3's KPU shift
    stages (the kernel stored several times), v4's uint8 CPU conv (once, and faster). The
    receipt says what v3 would take; a v3-only runtime still gets v3."""
    import onnx
    from lower_helpers import conv_node, make_model
    from tl2k210.k210.fit import WEIGHTS_TARGET
    rng = np.random.default_rng(1)
    w = {"w0": rng.normal(0, .3, (64, 3, 1, 1)), "b0": rng.normal(0, .1, 64),
         "wg": rng.normal(0, .1, (64, 1, 7, 7)), "bg": rng.normal(0, .1, 64)}
    m = make_model([conv_node("c", "x", "w0", "b0"), onnx.helper.make_node("Relu", ["c"], ["r"]),
                    conv_node("y", "r", "wg", "bg", group=64, pads=[0, 0, 0, 0])],
                   [("x", [1, 3, 7, 7])], [("y", None)], {k: v.astype(np.float32) for k, v in w.items()})
    src = tmp_path / "gdc.onnx"
    onnx.save(m, src)
    np.save(tmp_path / "x.npy", rng.random((8, 3, 7, 7), np.float32))
    opts = dict(dataset=str(tmp_path / "x.npy"), progress=False)
    auto = convert(src, tmp_path / "a.kmodel", ConvertOptions(**opts))
    v3 = convert(src, tmp_path / "b.kmodel", ConvertOptions(runtime="maixpy-minimum", **opts))
    ideal = auto.ideal["weight_bytes"]
    assert kmodel.load(tmp_path / "b.kmodel").version == 3 and v3.file_size > WEIGHTS_TARGET * ideal
    assert kmodel.load(tmp_path / "a.kmodel").version == 4 and auto.file_size < v3.file_size
    why = auto.totals["format_why"]
    assert f"kmodel v3's forms take {v3.file_size:,} B" in why and "--format v3" in why, why
    assert auto.latency_ms <= v3.latency_ms * 1.1

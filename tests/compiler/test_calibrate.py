"""Calibration data loading, range estimators vs numpy, float reference and metrics."""
import numpy as np
import pytest
from onnx import helper
from PIL import Image

from front_helpers import make_model, need_testdata, rand
from tl2k210.graph import from_onnx, stage_names
from tl2k210.k210.flow import run_pipeline
from tl2k210.quantize.calibrate import collect, float_reference, kld_threshold, ranges, snap
from tl2k210.quantize.dataset import Preprocess, load_dataset, load_image, parse_range
from tl2k210.quantize.metrics import cosine, sqnr_db, topk_agreement


def conv_relu_graph():
    n = helper.make_node
    m = make_model([n("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]), n("Relu", ["c"], ["r"]),
                    n("GlobalAveragePool", ["r"], ["y"])], [("x", [1, 3, 8, 8])], [("y", None)],
                   {"w": rand(4, 3, 3, 3), "b": rand(4)})
    return run_pipeline(from_onnx(m))[0]


def numpy_conv(x, w, b):
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    out = np.zeros((1, w.shape[0], 8, 8), np.float64)
    for i in range(3):
        for j in range(3):
            out += np.einsum("nchw,oc->nohw", xp[:, :, i:i + 8, j:j + 8], w[:, :, i, j])
    return out + b.reshape(1, -1, 1, 1)


def test_collect_minmax_matches_numpy_including_fused_stages():
    g = conv_relu_graph()
    conv = g.nodes[0]
    st = stage_names(conv)
    xs = [rand(1, 3, 8, 8) for _ in range(5)]
    stats = collect(g, xs)
    w, b = g.const(conv.inputs[1]), g.const(conv.inputs[2])
    pre = np.stack([numpy_conv(x, w, b) for x in xs])
    lo, hi = ranges(stats, "minmax")[st["conv"]]
    want = snap(pre.min(), pre.max())     # rounded outward to the grid, from the float64 reference
    step = 2.0 ** (np.floor(np.log2(np.abs(pre).max())) - 8)
    assert (lo, hi) == (pytest.approx(want[0], abs=1e-9), pytest.approx(want[1], abs=1e-9))
    assert lo <= pre.min() + 1e-5 and hi >= pre.max() - 1e-5 and hi - lo <= pre.max() - pre.min() + 2 * step
    assert ranges(stats, "minmax")[st["out"]] == (0.0, pytest.approx(want[1], abs=1e-9))
    assert stats[st["conv"]].hist.sum() == 5 * pre[0].size
    assert ranges(stats, "minmax")["x"] == snap(min(x.min() for x in xs), max(x.max() for x in xs))


def test_ranges_snap_outward_to_a_grid_that_float_noise_does_not_cross():
    assert snap(0.0, 6.0) == (0.0, 6.0) and snap(-1.0, 1.0) == (-1.0, 1.0)     # round bounds stay
    assert snap(0.0, 5.3333) == (0.0, 5.34375)            # 2**2 / 2**8 = 1/64 steps, outward
    assert snap(-0.00123, 5.3333) == (-0.015625, 5.34375)
    assert snap(-3.1, -0.5) == (-3.1015625, -0.5) and snap(0.0, 0.0) == (0.0, 0.0)
    # a hair past a line is the line (a ReLU6's 6.0000005 on another CPU): 1e-6 relative either way
    for v in (6.0, 0.9999999, 2.5546875):
        hi = snap(0.0, v)[1]
        assert snap(0.0, v * (1 + 1e-6))[1] == hi == snap(0.0, v * (1 - 1e-6))[1]
    # every bound at most one step wider
    rng = np.random.default_rng(0)
    for lo, hi in rng.uniform(-50, 50, (200, 2)):
        lo, hi = min(lo, hi), max(lo, hi)
        s = snap(lo, hi)
        step = 2.0 ** (np.floor(np.log2(max(abs(lo), abs(hi)))) - 8)
        assert lo - step < s[0] <= lo + step / 1000 and hi - step / 1000 <= s[1] < hi + step


def test_percentile_and_kld_clip_outliers():
    n = helper.make_node
    g = from_onnx(make_model([n("Relu", ["x"], ["y"])], [("x", [1, 1, 100, 100])], [("y", None)]))
    x = np.abs(rand(1, 1, 100, 100))
    x[0, 0, 0, :3] = [40, 50, 60]  # three outliers in 10000 values
    stats = collect(g, [x])
    mm = ranges(stats, "minmax")["y"]
    pc = ranges(stats, "percentile", percentile=99.9)["y"]
    kl = ranges(stats, "kld")["y"]
    assert mm == (pytest.approx(0, abs=1e-3), 60.0)
    assert np.mean(x <= pc[1]) >= 0.999 and pc[1] <= np.quantile(x, 0.9995) + 60 / 2048  # 99.9 % kept, not more
    assert pc[1] < 6.0
    assert 2.0 < kl[1] < 20.0  # clipped well below the outliers, above the bulk
    ms = ranges(stats, "mse")["y"]
    assert ms[0] == mm[0] and 6.0 < ms[1] < 60.0   # rounding vs clipping error traded: the outliers go
    with pytest.raises(ValueError, match="unknown calibration method"):
        ranges(stats, "l2")


@pytest.mark.parametrize("method", ["minmax", "percentile", "kld", "mse"])
def test_a_map_of_one_value_takes_that_value_with_every_method(method):
    """conv * 0 + 100 (a branch a model switches off): every value of the map is 100, whose
    histogram of 2048 bins over [100, 100 + 1e-12] numpy refuses (the bins finer than a float's
    step there); its range is its min/max with every method."""
    n = helper.make_node
    m = make_model([n("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), n("Mul", ["c", "zero"], ["z"]),
                    n("Add", ["z", "hundred"], ["y"])], [("x", [1, 3, 8, 8])], [("y", None)],
                   {"w": rand(4, 3, 3, 3), "zero": np.float32(0), "hundred": np.float32(100)})
    g = from_onnx(m)
    x = np.random.default_rng(0).uniform(0, 1, (4, 1, 3, 8, 8)).astype(np.float32)
    r = ranges(collect(g, list(x)), method)
    assert r["y"] == (100.0, 100.0) and r["c"][0] < 0 < r["c"][1]


def test_kld_threshold_keeps_a_uniform_range():
    hist = np.full(2048, 100)
    assert kld_threshold(hist, 8.0) == pytest.approx(8.0, rel=0.02)


def test_float_reference_has_every_tensor():
    g = conv_relu_graph()
    x = rand(1, 3, 8, 8)
    ref = float_reference(g, x)
    st = stage_names(g.nodes[0])
    assert {st["conv"], st["out"], "y"} <= set(ref)
    np.testing.assert_allclose(ref["y"], ref[st["out"]].mean(axis=(2, 3), keepdims=True), rtol=1e-5, atol=1e-6)


def test_preprocess_ranges_order_mean_std():
    px = np.array([[[0, 128, 255]]], np.uint8)
    assert np.allclose(Preprocess((0, 1))(px), [[[0, 128 / 255, 1]]])
    assert np.allclose(Preprocess((-1, 1))(px), [[[-1, 128 / 127.5 - 1, 1]]], atol=1e-6)
    assert np.allclose(Preprocess((0, 255), channel_order="BGR")(px), [[[255, 128, 0]]])
    assert np.allclose(Preprocess((0, 255), mean=(1, 2, 3), std=(2, 2, 2))(px), [[[-0.5, 63, 126]]])
    assert parse_range("0,255") == (0.0, 255.0)
    with pytest.raises(ValueError):
        parse_range("1,0")


def test_image_folder_is_resized_bilinear(tmp_path):
    from skimage import data
    img = data.astronaut()  # 512x512 RGB
    Image.fromarray(img).save(tmp_path / "a.png")
    Image.fromarray(img[:300, :400]).save(tmp_path / "b.bmp")
    Image.fromarray(img).save(tmp_path / "c.jpg", quality=95)
    (tmp_path / "notes.txt").write_text("ignored")
    xs = load_dataset(tmp_path, (1, 3, 64, 32), Preprocess((0, 1)))
    assert len(xs) == 3 and all(x.shape == (1, 3, 64, 32) and x.dtype == np.float32 for x in xs)
    want = np.asarray(Image.fromarray(img).resize((32, 64), Image.BILINEAR), np.float32) / 255
    np.testing.assert_allclose(xs[0][0].transpose(1, 2, 0), want, atol=1e-6)
    gray = load_image(tmp_path / "a.png", (1, 1, 28, 28))
    assert gray.shape == (1, 1, 28, 28)


def test_class_per_folder_dataset_takes_every_class_in_turn(tmp_path):
    """A folder with no images of its own but one subfolder per class (train/cat/*.jpg): its
    images, a class at a time in turn, so that --calib-limit 4 spans all the classes."""
    from PIL import Image
    shades = {"cat": 10, "dog": 120, "owl/young": 240}
    for cls, v in shades.items():
        (tmp_path / cls).mkdir(parents=True)
        for i in range(3):
            Image.fromarray(np.full((8, 8, 3), v + i, np.uint8)).save(tmp_path / cls / f"{i}.png")
    xs = load_dataset(tmp_path, (1, 3, 8, 8), Preprocess((0, 255)), limit=4)
    assert [int(x[0, 0, 0, 0]) for x in xs] == [10, 120, 240, 11]
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no images .* in this folder or its subfolders"):
        load_dataset(tmp_path / "empty", (1, 3, 8, 8))


def test_npy_npz_arrays(tmp_path):
    a = rand(4, 8, 8, 3)
    np.save(tmp_path / "a.npy", a)
    xs = load_dataset(tmp_path / "a.npy", (1, 3, 8, 8), layout="NHWC")
    assert len(xs) == 4 and np.array_equal(xs[2][0], a[2].transpose(2, 0, 1))
    np.savez(tmp_path / "b.npz", x=a.transpose(0, 3, 1, 2)[:2])
    assert len(load_dataset(tmp_path / "b.npz", (1, 3, 8, 8))) == 2
    # channels-last data is recognised without layout= (a CLI user cannot pass it)
    assert all(np.array_equal(x, y) for x, y in zip(load_dataset(tmp_path / "a.npy", (1, 3, 8, 8)), xs))
    with pytest.raises(ValueError, match=r"channels-last"):
        load_dataset(tmp_path / "a.npy", (1, 3, 4, 4))


def test_samples_each_with_their_own_batch_axis(tmp_path, capsys):
    """Hunt 21: DTLN's calibration frames saved as N x TFLite's input shape (1, 1, 257) for the
    model's (1, 257) were refused ("with or without a leading batch dimension"); each sample's
    batch axis of 1 is dropped, with a note, and NHWC ones are still transposed."""
    a = rand(6, 1, 1, 257)
    np.save(tmp_path / "f.npy", a)
    xs = load_dataset(tmp_path / "f.npy", (1, 1, 257))
    assert len(xs) == 6 and all(x.shape == (1, 1, 257) and np.array_equal(x[0], m[0]) for x, m in zip(xs, a))
    assert "each with a batch axis of 1" in capsys.readouterr().err
    b = rand(3, 1, 8, 6, 3)
    np.save(tmp_path / "b.npy", b)
    xs = load_dataset(tmp_path / "b.npy", (1, 3, 8, 6))
    assert len(xs) == 3 and np.array_equal(xs[1][0], b[1, 0].transpose(2, 0, 1))
    with pytest.raises(ValueError, match=r"samples of shape"):
        load_dataset(tmp_path / "f.npy", (1, 1, 256))
    # a keyword spotter's (N, 47, 13) MFCCs for its (47, 1, 13) TFLite input (NCHW (13, 47, 1))
    m = rand(4, 47, 13)
    np.save(tmp_path / "m.npy", m)
    xs = load_dataset(tmp_path / "m.npy", (1, 13, 47, 1))
    assert len(xs) == 4 and np.array_equal(xs[2][0, :, :, 0], m[2].T)
    assert "read as channels-last (47, 1, 13)" in capsys.readouterr().err
    np.save(tmp_path / "t.npy", m.transpose(0, 2, 1))         # (N, 13, 47): channel-major already
    assert np.array_equal(load_dataset(tmp_path / "t.npy", (1, 13, 47, 1))[2][0, :, :, 0], m[2].T)


def test_gray_maps_without_a_channel_axis(tmp_path):
    """MNIST-like arrays (N, H, W) -- or one (H, W) map -- for a one-channel image input: each
    map one sample (they were taken as one sample of N channels, and refused)."""
    a = rand(5, 8, 6)
    np.save(tmp_path / "gray.npy", a)
    xs = load_dataset(tmp_path / "gray.npy", (1, 1, 8, 6))
    assert len(xs) == 5 and all(x.shape == (1, 1, 8, 6) and np.array_equal(x[0, 0], m) for x, m in zip(xs, a))
    np.save(tmp_path / "one.npy", a[0])
    [x] = load_dataset(tmp_path / "one.npy", (1, 1, 8, 6))
    assert np.array_equal(x[0, 0], a[0])
    with pytest.raises(ValueError, match=r"samples of shape"):
        load_dataset(tmp_path / "gray.npy", (1, 3, 8, 6))


def test_imagenet_folder_from_testdata():
    folder = need_testdata("imagenet")
    xs = load_dataset(folder, (1, 3, 224, 224), Preprocess((-1, 1)), limit=3)
    assert len(xs) == 3 and -1 <= xs[0].min() < -0.5 and 0.5 < xs[0].max() <= 1


def test_metrics():
    ref = rand(1000)
    noise = rand(1000)
    noise *= 0.1 * np.linalg.norm(ref) / np.linalg.norm(noise)
    assert sqnr_db(ref, ref + noise) == pytest.approx(20.0, abs=1e-5)   # float32 data: ~1e-6 off
    assert sqnr_db(ref, ref) == float("inf")
    assert cosine(ref, 3 * ref) == pytest.approx(1.0) and cosine(ref, -ref) == pytest.approx(-1.0)
    logits = np.eye(4)[[0, 1, 2, 3]]
    test = logits.copy()
    test[3] = [0, 0.5, 0, 0.4]
    assert topk_agreement(logits, test, 1) == 0.75 and topk_agreement(logits, test, 2) == 1.0


def test_output_agreement_and_float_outputs():
    from tl2k210.compare import float_outputs, output_agreement
    n = helper.make_node
    g = from_onnx(make_model([n("Flatten", ["x"], ["y"])], [("x", [1, 10, 1, 1])], [("y", None)]))
    rng = np.random.default_rng(3)   # its own seed: the shared RNG's draw depends on test order
    xs = [rng.standard_normal((1, 10, 1, 1)).astype(np.float32) for _ in range(4)]
    ref = float_outputs(g, xs)
    assert ref["y"].shape == (4, 10)
    gaps = np.diff(np.sort(ref["y"], axis=1), axis=1)
    test = {"y": ref["y"] + 0.2 * gaps.min() * rng.uniform(-1, 1, (4, 10))}   # no rank can change
    rep = output_agreement(ref, test)["y"]
    assert rep["top1"] == 1.0 and rep["top5"] == 1.0 and rep["sqnr_db"] > 30 and rep["cosine"] > 0.999


def test_yolo2_detection_agreement():
    from tl2k210.compare import detection_agreement, yolo2_boxes
    anchors, classes, h, w = [1.0, 1.0, 2.0, 3.0], 2, 7, 10
    out = np.full((2 * (5 + classes), h, w), -8.0, np.float32)
    base = 1 * (5 + classes)  # anchor 1 at cell (row 3, col 4): centred, objectness ~1, class 1
    out[base:base + 4, 3, 4] = 0
    out[base + 4, 3, 4], out[base + 5 + 1, 3, 4] = 8, 8
    ref = yolo2_boxes(out, anchors)
    assert len(ref) == 1 and ref[0].classid == 1
    np.testing.assert_allclose(ref[0].rect(), [0.35, 3.5 / 7 - 1.5 / 7, 0.2, 3 / 7], atol=1e-5)
    moved = out.copy()
    moved[base, 3, 4] = 0.1  # small shift: same detection
    other = out.copy()
    other[base + 5:base + 7, 3, 4] = [8, -8]  # class flips
    assert detection_agreement([ref], [yolo2_boxes(moved, anchors)])["recall"] == 1.0
    agree = detection_agreement([ref], [yolo2_boxes(other, anchors)])
    assert agree["matched"] == 0 and agree["test"] == 1


@pytest.mark.slow
def test_a_kmodel_does_not_depend_on_the_cpus_float_rounding(tmp_path, monkeypatch):
    """Another CPU's onnxruntime sums in another order: every float value a few ulps off (a 2e-7
    relative noise here, round values such as a ReLU6's 6 left exact, as clipping leaves them).
    The kmodel stays byte for byte the same; with the ranges unsnapped the same noise changes it
    (the zoo face detector built on an Intel and an AMD VM differed so)."""
    import tl2k210.graph as graph_mod
    from tl2k210.compiler import convert_file
    from tl2k210.quantize import calibrate
    src = need_testdata("corpus/fit/st_mobilenet_v2_128_0.5.onnx")
    photos = need_testdata("imagenet")
    run = graph_mod.FloatSession.run

    def noisy(self, names, feeds):
        rng = np.random.default_rng(len(names))
        return [np.where(o * 4096 == np.round(o * 4096), o, o * (1 + 2e-7 * rng.standard_normal(o.shape))
                         ).astype(o.dtype) if o.dtype == np.float32 else o for o in run(self, names, feeds)]

    def build(name):
        out = tmp_path / f"{name}.kmodel"
        convert_file(src, out, photos, runtime="sdk", min_sqnr=0.0, progress=False, calib_limit=8)
        return out.read_bytes()
    clean = build("clean")
    monkeypatch.setattr(graph_mod.FloatSession, "run", noisy)
    assert build("noisy") == clean
    monkeypatch.setattr(calibrate.snap, "__defaults__", (60,))     # the grid finer than float32: no snapping
    monkeypatch.setattr(calibrate.snap_values, "__defaults__", (60,))
    noisy_unsnapped = build("unsnapped")
    monkeypatch.setattr(graph_mod.FloatSession, "run", run)
    assert noisy_unsnapped != build("clean_unsnapped")


def test_non_finite_calibration_names_where_it_starts():
    """A NaN is refused at the first node that makes it, not where a later op passes it on
    (OpenCV's res10 SSD read "node 'mbox_loc' (Concat) gives NaN; its input spans nan..nan");
    where a constant of that node is itself not finite, the refusal says the file's weights are."""
    from tl2k210.errors import Tl2k210Error
    n = helper.make_node
    m = make_model([n("Sub", ["x", "two"], ["d"]), n("Sqrt", ["d"], ["s"]), n("Relu", ["x"], ["r"]),
                    n("Concat", ["s", "r"], ["y"], axis=1)], [("x", [1, 3, 4, 4])], [("y", None)],
                   {"two": np.array(2.0, np.float32)})
    g = from_onnx(m)
    x = np.random.default_rng(0).uniform(0, 1, (1, 3, 4, 4)).astype(np.float32)
    with pytest.raises(Tl2k210Error, match=r"node 'Sqrt_1' \(Sqrt\) gives NaN on the calibration data; its input spans -1.99"):
        collect(g, [x])
    b = np.array([0.1, np.nan, 0.2, np.nan], np.float32)
    m = make_model([n("Conv", ["x", "w", "b"], ["y"])], [("x", [1, 3, 4, 4])], [("y", None)],
                   {"w": rand(4, 3, 1, 1), "b": b})
    with pytest.raises(Tl2k210Error, match=r"its constant 'b' holds 2 of 4 values that are not finite"):
        collect(from_onnx(m), [x])


def test_features_out_of_the_pixel_range_name_their_own_range(tmp_path, capsys):
    """A keyword spotter's 16x16 MFCCs (values about -47..15, hunt 11) read as a one-channel image
    at the default --input-range 0,1: the warning says how much is clipped, that the SQNR is
    measured on the clipped values, and gives the arrays' own range to pass instead."""
    import onnx

    from front_helpers import make_model
    from lower_helpers import conv_node
    from tl2k210.compiler import ConvertOptions, convert
    m = make_model([conv_node("y", "x", "w", "b", pads=[1, 1, 1, 1])], [("x", [1, 1, 16, 16])], [("y", None)],
                   {"w": rand(4, 1, 3, 3), "b": rand(4)})
    onnx.save(m, tmp_path / "kws.onnx")
    mfcc = np.random.default_rng(3).uniform(-47, 15, (8, 1, 16, 16)).astype(np.float32)
    mfcc[0, 0, 0, :2] = (-47.5, 15.25)
    np.save(tmp_path / "mfcc.npy", mfcc)
    convert(tmp_path / "kws.onnx", tmp_path / "kws.kmodel", ConvertOptions(dataset=str(tmp_path / "mfcc.npy"),
                                                                         progress=False, min_sqnr=0))
    err = capsys.readouterr().err
    assert "warning: 9" in err and "--input-range -47.5,15.25 (the arrays' min and max)" in err
    assert "the SQNR below is measured on the clipped values" in err


@pytest.mark.parametrize("shape, mean, says", [((1, 3, 8, 8), (0.0,), True), ((1, 3, 8, 8), (0.5,), False),
                                             ((1, 16), (0.0,), False)])
def test_a_float_images_default_input_range_is_said(shape, mean, says):
    """A YOLOX-style person detector trained on 0..255 BGR pixels converted at the float default
    0..1 with a healthy 24.3 dB and found nobody (round 64's second hunt): the receipt says which
    range it took and what to give otherwise, for an image with no --mean/--std."""
    from types import SimpleNamespace

    from tl2k210.compiler import ConvertOptions, model_input_range
    g = SimpleNamespace(inputs=["x"], meta={}, shape=lambda x: shape)
    opts, note = model_input_range(g, ConvertOptions(mean=mean))
    assert opts.input_range == (0.0, 1.0)
    assert (note is not None and "a float model's default" in note and "--input-range (0,255" in note) is says


@pytest.mark.parametrize("own, mean, want", [((-0.9921875, 1.0), (0.0,), (-1.0, 1.0)), ((0.0, 1.0), (0.0,), (0.0, 1.0)),
                                             ((-5.99, 3.86), (0.0,), (-5.99, 3.86)), ((-2.1, 2.6), (0.5,), (0.0, 1.0))])
def test_a_float_input_quantized_first_gives_the_input_range(own, mean, want):
    """An int8 TFLite model with a float input quantizes it first (zye1996's MobileFaceNet: 1/128,
    zero point -1, -0.992..1): without --input-range that is the range the pixels map onto, read as
    the common range it stands for; a range no common one is near is taken as it is (atomic14's
    wake word: a spectrogram at -5.99..3.86, which 0..1 clipped silently, 92 % of its values),
    unless --mean/--std say how pixels become the input (then 0..1, as for any model)."""
    from types import SimpleNamespace

    from tl2k210.compiler import ConvertOptions, model_input_range
    g = SimpleNamespace(inputs=["x"], meta={"quant_ranges": {"x": own}}, shape=lambda x: (1, 3, 8, 8))
    opts, note = model_input_range(g, ConvertOptions(mean=mean))
    assert opts.input_range == want
    assert (note is not None and "first QuantizeLinear of its float input" in note) is (mean == (0.0,))
    assert (note is not None and "int8 input + 128" in note) is (own == (-5.99, 3.86))


def test_a_sigmoid_output_keeps_its_whole_range(tmp_path):
    """NanoDet-m's class scores, calibrated on photos whose best score was 0.29, clipped every
    held-out score there (a person's 0.42 under a 0.35 threshold: no detection). A model output
    that a bounded activation writes, fused into its conv or through a reshape, takes the
    activation's whole range (the receipt says so); an output no activation bounds keeps its
    calibrated range."""
    from tl2k210.compiler import ConvertOptions, convert
    from tl2k210.k210.emulator import Emulator
    n = helper.make_node
    shape = np.array([1, -1], np.int64)
    m = make_model([n("Conv", ["x", "w", "b"], ["c"]), n("Sigmoid", ["c"], ["s"]), n("Reshape", ["s", "shape"], ["y"]),
                    n("Conv", ["x", "w2", "b2"], ["z"])], [("x", [1, 3, 8, 8])], [("y", None), ("z", None)],
                   {"w": np.full((2, 3, 1, 1), 2.0, np.float32), "b": np.array([-3.0, -4.0], np.float32),
                    "w2": np.full((1, 3, 1, 1), 1.0, np.float32), "b2": np.zeros(1, np.float32), "shape": shape})
    calib = tmp_path / "calib.npy"
    np.save(calib, np.random.default_rng(0).uniform(0, 0.2, (8, 3, 8, 8)).astype(np.float32))
    r = convert(m, str(tmp_path / "o.kmodel"), ConvertOptions(dataset=str(calib), progress=False, min_sqnr=0))
    assert "outputs at their activation's whole range" in r.totals["calibration_note"] and " y 0..1 " in \
        r.totals["calibration_note"] and " z " not in r.totals["calibration_note"]
    x = np.random.default_rng(1).uniform(0.6, 1, (3, 8, 8)).astype(np.float32)
    want = 1 / (1 + np.exp(-(2 * x.sum(0) - np.array([3.0, 4.0])[:, None, None]))).reshape(-1)
    y, z = Emulator.load(tmp_path / "o.kmodel").run(np.rint(x * 255).astype(np.uint8))
    assert want.max() > 0.9 and np.abs(np.asarray(y, np.float64).reshape(-1) - want).max() < 0.02
    assert np.asarray(z).max() < 0.65      # no activation: the calibration's 0..0.6 (a linear output clips)


def test_calibration_arrays_the_input_range_clips_are_refused(tmp_path, capsys):
    """MLPerf Tiny's keyword spotter calibrated with MFCC arrays (-50..30) at the default input
    range 0..1: 93 % of the values clipped, and convert wrote the kmodel, exit 0, its receipt
    50.5 dB measured on the clipped values (26.0 at the MFCCs' range); a warning on line 6 was the
    only sign. Over a tenth clipped is refused, naming the arrays' range; --min-sqnr 0 converts it,
    with the warning."""
    from tl2k210.compiler import ConvertOptions, convert
    from tl2k210.errors import QualityError
    n = helper.make_node
    m = make_model([n("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]), n("Relu", ["c"], ["y"])],
                   [("x", [1, 1, 10, 8])], [("y", None)], {"w": rand(4, 1, 3, 3), "b": rand(4)})
    calib = tmp_path / "mfcc.npy"
    np.save(calib, np.random.default_rng(2).uniform(-50, 30, (8, 1, 10, 8)).astype(np.float32))
    out = tmp_path / "o.kmodel"
    with pytest.raises(QualityError, match=r"9\d% of the dataset values lie outside .* --input-range -49\.\d+,30 \(the arrays'"):
        convert(m, str(out), ConvertOptions(dataset=str(calib), progress=False))
    assert not out.exists()
    r = convert(m, str(out), ConvertOptions(dataset=str(calib), progress=False, input_range=(-50.0, 30.0)))
    assert r.totals["output_sqnr_db"] > 30 and "lie outside" not in capsys.readouterr().err
    convert(m, str(out), ConvertOptions(dataset=str(calib), progress=False, min_sqnr=0))
    assert "lie outside" in capsys.readouterr().err


def test_calibration_on_few_samples_is_said(tmp_path):
    """A cifar TFLite at --calib-limit 2: the receipt said 42.6 dB measured on the two images the
    ranges were fitted to, 10.9 dB on other photos, without a word (round 65's hunt). Fewer
    calibration samples than the SQNR measures on is said in the calibration note."""
    from tl2k210.compiler import ConvertOptions, convert
    n = helper.make_node
    m = make_model([n("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]), n("Relu", ["c"], ["y"])],
                   [("x", [1, 3, 8, 8])], [("y", None)], {"w": rand(4, 3, 3, 3), "b": rand(4)})
    calib = tmp_path / "c.npy"
    np.save(calib, np.random.default_rng(2).uniform(0, 1, (12, 3, 8, 8)).astype(np.float32))
    for limit, says in ((2, True), (8, False)):
        r = convert(m, str(tmp_path / "o.kmodel"), ConvertOptions(dataset=str(calib), progress=False, calib_limit=limit))
        assert ("calibration on 2 sample(s): the ranges fit them alone" in (r.totals["calibration_note"] or "")) is says


@pytest.mark.parametrize("given, warns", [((-1.0, 1.0), True), ((0.0, 1.0), False), ((0.0, 1.2), False), (None, False)])
def test_an_input_range_past_an_integer_inputs_own_is_warned(given, warns):
    """An int8 cifar TFLite whose input stands for 0..1, converted with --input-range -1,1: the
    negative half saturated with no word (the warning existed for a float input quantized first)."""
    from types import SimpleNamespace

    from tl2k210.compiler import ConvertOptions, model_input_range
    g = SimpleNamespace(inputs=["x"], meta={"input_quant": {"x": (1 / 255, -128, "int8")}}, shape=lambda x: (1, 3, 8, 8))
    opts, note = model_input_range(g, ConvertOptions(input_range=given))
    assert opts.input_range == (given or (0.0, 1.0))
    assert (note is not None and note.startswith("warning: --input-range -1,1 reaches past what the model's int8 "
                                                 "input stands for (0..1")) is warns


@pytest.mark.parametrize("given, warns", [((-1.0, 1.0), True), ((0.0, 255.0), False), ((0.0, 200.0), False)])
def test_an_input_range_a_sliver_of_an_integer_inputs_own_is_warned(given, warns):
    """PINTO's int8 PoseNet / BlazePose take 0..255 (scale 1, zero point -128); at --input-range
    -1,1 TFLite rounds the input to 3 of its 256 levels and the kmodel computes for inputs the
    model was not made for (hunt 22: -30 dB against TFLite where the receipt read 27 dB)."""
    from types import SimpleNamespace

    from tl2k210.compiler import ConvertOptions, model_input_range
    g = SimpleNamespace(inputs=["x"], meta={"input_quant": {"x": (1.0, -128, "int8")}}, shape=lambda x: (1, 3, 8, 8))
    _, note = model_input_range(g, ConvertOptions(input_range=given))
    assert (note is not None and note.startswith("warning: --input-range -1,1 spans a sliver of what the model's "
                                                 "int8 input stands for (0..255")) is warns

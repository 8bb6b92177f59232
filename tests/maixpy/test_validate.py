"""Hardware-in-the-loop `validate` against the emulated MaixPy board: board = emulator bit for
bit (0 difference, every layer), the real quantization error against the float model (recomputed
here independently), the RGB565 input path as a preprocessing gap, a runtime gap found at the
layer where it starts, a model read from flash, and the CLI's table, JSON and PNG."""
import json
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from conftest import data_path
from repl_helpers import b, board, calib_photos, client_env, r, tiny_onnx  # noqa: F401 (b, r: fixtures)
from tl2k210.errors import Tl2k210Error
from tl2k210.maixpy import validate as V
from tl2k210.maixpy.repl import Repl


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """Two small conv nets (RGB and grayscale) in ONNX, converted by tl2k210 on real photos."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("skimage.data")
    from tl2k210.compiler import ConvertOptions, convert
    d = tmp_path_factory.mktemp("tiny")
    calib_photos(d / "calib")
    out = {}
    for c, tag in ((3, "rgb"), (1, "gray")):
        tiny_onnx(d / f"{tag}.onnx", c)
        convert(str(d / f"{tag}.onnx"), str(d / f"{tag}.kmodel"),
                ConvertOptions(dataset=str(d / "calib"), progress=False))
        out[tag] = (d / f"{tag}.onnx", d / f"{tag}.kmodel")
    out["photos"] = [d / "calib" / "0.png", d / "calib" / "2.png"]
    return out


def _row(rep, name):
    return next(x for x in rep["rows"] if x["name"].startswith(name))


def _independent(onnx_path, kmodel_path, photo, channels):
    """SQNR emulator vs float on the board's input, and float on RGB565 vs exact pixels,
    computed without tl2k210.maixpy.validate."""
    import onnxruntime as ort

    from tl2k210.imaging import rgb565_roundtrip
    from tl2k210.k210.emulator import Emulator
    from tl2k210.quantize.metrics import sqnr_db
    img = Image.open(photo).convert("L" if channels == 1 else "RGB").resize((32, 32))
    px = np.asarray(img)
    exact = px[None] if channels == 1 else px.transpose(2, 0, 1)
    board = exact if channels == 1 else rgb565_roundtrip(px).transpose(2, 0, 1)
    s = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])

    def f(x):
        return s.run(None, {"x": (x[None] / 255.0).astype(np.float32)})[0].ravel()
    emu = Emulator.load(kmodel_path).run(np.ascontiguousarray(board, np.uint8))[0].ravel()
    return sqnr_db(f(board), emu), sqnr_db(f(exact), f(board))


def test_quantization_error_vs_float_and_zero_board_difference(tiny, r):
    onnx_path, kpath = tiny["gray"]
    rep = V.validate(r, str(kpath), [str(tiny["photos"][0])], per_layer=True,
                     float_src=str(onnx_path), pre={"input_range": (0.0, 1.0)}, log=lambda m: None)
    out = _row(rep, "output 0")
    assert out["pairs"]["board_vs_emulator"] == {"max_abs_diff": 0.0, "cosine": 1.0, "sqnr_db": "inf"}
    q = out["pairs"]["emulator_vs_float"]["sqnr_db"]
    want_q, want_p = _independent(onnx_path, kpath, tiny["photos"][0], 1)
    assert abs(q - want_q) < 1e-3 and 15 < q < 60, (q, want_q)   # a real quantization error
    assert out["pairs"]["float_rgb565_vs_exact"]["sqnr_db"] == "inf"  # grayscale BMP: exact
    assert out["verdict"].startswith("quantization")
    layers = [x for x in rep["rows"] if x["kind"] == "layer"]
    assert len(layers) >= 4 and all(x["pairs"]["board_vs_emulator"]["max_abs_diff"] == 0
                                    for x in layers)
    assert rep["first_differing_layer"] is None
    # per layer against the float tensor it stands for (uint8 maps: affine dequantization fit)
    assert all(x["verdict"].startswith("quantization") for x in layers)
    convs = [x["pairs"]["emulator_vs_float"] for x in layers if "K210_CONV" in x["name"]]
    assert [c["fit"] for c in convs] == ["affine"] * 3 and all(15 < c["sqnr_db"] < 80 for c in convs)
    last = layers[-1]["pairs"]["emulator_vs_float"]         # DEQUANTIZE: the output itself
    assert last["fit"] == "none" and abs(last["sqnr_db"] - q) < 1e-9


def test_rgb565_input_path_is_a_preprocessing_gap(tiny, r):
    onnx_path, kpath = tiny["rgb"]
    rep = V.validate(r, str(kpath), [str(p) for p in tiny["photos"]][:1], float_src=str(onnx_path),
                     pre={"input_range": (0.0, 1.0)}, log=lambda m: None)
    out = _row(rep, "output 0")
    want_q, want_p = _independent(onnx_path, kpath, tiny["photos"][0], 3)
    assert out["pairs"]["board_vs_emulator"]["max_abs_diff"] == 0.0
    assert abs(out["pairs"]["emulator_vs_float"]["sqnr_db"] - want_q) < 1e-3
    assert abs(out["pairs"]["float_rgb565_vs_exact"]["sqnr_db"] - want_p) < 1e-3
    expect = "preprocessing" if want_p < want_q else "quantization"
    assert out["verdict"].startswith(expect)


def test_a_runtime_gap_is_found_where_it_starts(tiny, r, monkeypatch):
    """A board whose runtime adds 1 LSB to one pixel of layer 2 (and what follows)."""
    from tl2k210.k210.emulator import Emulator
    from tl2k210.maixpy import KPU

    class Drifting:
        def __init__(self, emu):
            self.emu = emu

        def __getattr__(self, k):
            return getattr(self.emu, k)

        def run(self, x, trace=False):
            outs, tr = self.emu.run(x, trace=True)
            for i in range(1, len(tr)):
                a = np.array(tr[i][1], copy=True)
                a.reshape(-1)[5] = a.reshape(-1)[5] + (1 if a.dtype == np.uint8 else 0.01)
                tr[i] = (tr[i][0], a)
            outs = [tr[-1][1].reshape(np.asarray(outs[0]).shape)]
            return (outs, tr) if trace else outs
    monkeypatch.setattr(KPU, "_emulator", lambda model, key: Drifting(Emulator(model)))
    monkeypatch.setattr(KPU, "_RESULTS", {})
    rep = V.validate(r, str(tiny["gray"][1]), [str(tiny["photos"][0])], per_layer=True,
                     log=lambda m: None)
    assert rep["first_differing_layer"].startswith("layer 2 ")
    assert _row(rep, "layer 1 ")["pairs"]["board_vs_emulator"]["max_abs_diff"] == 0
    lay2 = _row(rep, "layer 2 ")
    assert lay2["pairs"]["board_vs_emulator"]["max_abs_diff"] == 1.0 and \
        lay2["verdict"].startswith("runtime")
    assert _row(rep, "output 0")["verdict"].startswith("runtime")


def test_model_at_a_flash_address(tiny, tmp_path):
    from tl2k210.maixpy.board import flash_kmodel
    flash = flash_kmodel(tiny["gray"][1], tmp_path / "flash.bin", 0x300000)
    bd = board(tmp_path, flash=str(flash))
    try:
        with Repl.open(bd.port) as r:
            r.enter_raw()
            rep = V.validate(r, str(tiny["gray"][1]), [str(tiny["photos"][0])], address=0x300000,
                             log=lambda m: None)
            assert _row(rep, "output 0")["pairs"]["board_vs_emulator"]["max_abs_diff"] == 0
            assert not list(bd.sd.glob("*.kmodel"))           # nothing was uploaded
            with pytest.raises(Tl2k210Error, match="are not this kmodel"):
                V.validate(r, str(tiny["gray"][1]), [], address=0x400000, log=lambda m: None)
    finally:
        bd.close()


def test_cli_table_json_png_on_a_real_kmodel(b, tmp_path):
    """mnist_v3.kmodel (MaixPy_scripts) per layer through the CLI: exit 0, every map equal."""
    k = data_path("kmodels", "mnist_v3.kmodel")
    pytest.importorskip("matplotlib")
    p = subprocess.run([sys.executable, "-m", "tl2k210.cli", "validate", str(k), "-p", b.port,
                        "--per-layer", "--json", str(tmp_path / "v.json"), "--plot",
                        str(tmp_path / "v.png")], capture_output=True, text=True, timeout=600,
                       env=client_env())
    assert p.returncode == 0, p.stderr
    assert "first layer where the board differs: none" in p.stdout
    assert "output 0: board = emulator (bit-exact)" in p.stdout
    rep = json.loads((tmp_path / "v.json").read_text())
    assert len([x for x in rep["rows"] if x["kind"] == "layer"]) == 11
    assert all(x["pairs"]["board_vs_emulator"]["max_abs_diff"] == 0 for x in rep["rows"])
    png = Image.open(tmp_path / "v.png")
    assert png.size[0] > 600 and png.format == "PNG"


@pytest.mark.slow
def test_vector_model_with_its_tflite_source(tmp_path, b, r):
    """iris_v3.kmodel (nncase v0.1) and iris.tflite, the iris flowers as float32 vectors
    sent to kpu.forward(task, [floats]): board = emulator, float layers agree to ~140 dB."""
    k = data_path("kmodels", "iris_v3.kmodel")
    src = data_path("tflite", "iris.tflite")
    datasets = pytest.importorskip("sklearn.datasets")
    np.save(tmp_path / "iris.npy", datasets.load_iris().data.astype(np.float32)[::15])
    rep = V.validate(r, str(k), [str(tmp_path / "iris.npy")], per_layer=True, float_src=str(src),
                     log=lambda m: None)
    out = _row(rep, "output 0")
    assert out["pairs"]["board_vs_emulator"]["max_abs_diff"] == 0
    assert out["pairs"]["emulator_vs_float"]["sqnr_db"] > 100
    assert "float_rgb565_vs_exact" not in out["pairs"]          # vectors: no RGB565 input path
    assert out["verdict"].startswith("float: board = emulator = float model")   # float layers
    assert len(rep["samples"]) == 10


@pytest.mark.slow
def test_face_detector_every_layer(r):
    k = data_path("kmodels", "facedetect_320x240_v3.kmodel")
    rep = V.validate(r, str(k), [], per_layer=True, log=lambda m: None)
    assert len(rep["rows"]) == 25 and rep["first_differing_layer"] is None


def test_float_tensor_model_takes_flat_vectors(tmp_path, r):
    """iris_v4.kmodel (nncase v0.2) takes a float32 (1, 1, 1, 4) tensor: --input with (N, 4)
    float32 rows goes to kpu.forward(task, [floats]), and the board equals the emulator."""
    from tl2k210.k210.emulator import Emulator
    k = data_path("kmodels", "iris_v4.kmodel")
    datasets = pytest.importorskip("sklearn.datasets")
    x = datasets.load_iris().data.astype(np.float32)[::30]
    np.save(tmp_path / "iris.npy", x)
    np.save(tmp_path / "iris_u8.npy", (x * 10).astype(np.uint8))
    rep = V.validate(r, str(k), [str(tmp_path / "iris.npy")], log=lambda m: None)
    assert rep["samples"] == [f"iris.npy[{i}]" for i in range(len(x))]
    assert _row(rep, "output 0")["pairs"]["board_vs_emulator"]["max_abs_diff"] == 0
    emu = Emulator.load(str(k))                   # the board ran what the emulator runs on x
    ref = [emu.run(v.reshape(1, 1, 1, 4))[0] for v in x]
    samples = V.load_samples([str(tmp_path / "iris.npy")], emu)
    assert all(s.kind == "vector" and np.array_equal(s.exact, v) for s, v in zip(samples, x))
    assert not np.allclose(ref[0], ref[-1])       # different flowers, different scores
    with pytest.raises(Tl2k210Error, match="takes float32 \\(1, 1, 4\\) \\(or 4 values"):
        V.load_samples([str(tmp_path / "iris_u8.npy")], emu)


def test_kpu_load_errors_name_cause_and_fix():
    from tl2k210.maixpy.repl import board_error
    tb = (b"Traceback (most recent call last):\r\n  File \"<stdin>\", line 1, in <module>\r\n"
          b"ValueError: [MAIXPY]kpu: load error:2006, ERR_NO_MEM: memory not enough\r\n")
    msg = str(board_error(tb, "kpu.load of the model"))
    assert "error 2006: the model does not fit in the system heap" in msg
    assert "minimum build" in msg and "smaller model" in msg
    tb2 = tb.replace(b"2006, ERR_NO_MEM: memory not enough",
                     b"2002, ERR_KMODEL_VERSION: only support kmodel V3/V4 now")
    assert "erased flash reads 0xFF" in str(board_error(tb2, "kpu.load"))


def test_two_camera_size_photos_fit_the_board_heap_in_turn(r, tmp_path):
    """A 320x240 input and its pix_to_ai copy hold 384,000 B of the board's 512 KiB GC heap: the
    second input of a run had failed with the board's MemoryError while the first was still
    referenced (round 66's second hunt); each input is freed before the next, and no upload is
    left on the card."""
    pytest.importorskip("skimage.data")
    from skimage import data
    photos = []
    for name in ("astronaut", "chelsea"):
        p = tmp_path / f"{name}.png"
        Image.fromarray(getattr(data, name)()).resize((320, 240)).save(p)
        photos.append(str(p))
    k = data_path("kmodels", "facedetect_320x240_v3.kmodel")
    rep = V.validate(r, str(k), photos, per_layer=False, log=lambda m: None)
    assert len(rep["samples"]) == 2 and rep["first_differing_layer"] is None, rep
    assert not [name for name, _, _ in r.ls() if name.startswith("_tl_in")]


def test_a_flatten_layer_is_paired_with_its_tensor_in_tf_order():
    """A v3 TENSORFLOW_FLATTEN writes its (C, H, W) map in H, W, C order (TF's flatten): validate
    had paired it with the float tensor in C, H, W order and reported -2.4 dB, "quantization", for
    a layer that only reorders (an nncase v0.1 MNIST; round 66's second hunt)."""
    from tl2k210.quantize.metrics import sqnr_db
    t = np.random.default_rng(0).normal(size=(1, 8, 3, 2))
    hwc = t[0].transpose(1, 2, 0).ravel()
    u8 = np.clip(np.round(hwc * 40 + 128), 0, 255).astype(np.uint8)
    name, fit, ref = V.match_tensor(u8, {"pool": t, "other": np.random.default_rng(1).normal(size=(1, 48))})
    assert name == "pool" and np.array_equal(ref, hwc) and sqnr_db(ref, fit) > 30

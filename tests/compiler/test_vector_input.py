"""A fully quantized TFLite model whose input is no image (TFLite Micro's micro_speech: a (1, 1960)
int8 spectrogram reshaped to 49x40 inside the model), built at test time with the TF converter."""
import numpy as np
import pytest

from front_helpers import tf
from tl2k210.quantize.metrics import sqnr_db

pytestmark = pytest.mark.slow
N, ROWS = 490, 49


@pytest.fixture(scope="module")
def speech(tmp_path_factory):
    import keras
    from keras import layers as L
    t = tf()
    keras.utils.set_random_seed(0)
    i = keras.Input((N,), batch_size=1)
    a = L.Reshape((ROWS, N // ROWS, 1))(i)
    a = L.Conv2D(8, (10, 8), strides=2, padding="same", activation="relu")(a)
    m = keras.Model(i, L.Softmax()(L.Dense(4)(L.Flatten()(a))))
    r = np.random.default_rng(1)

    def rep():
        for _ in range(16):
            yield [r.uniform(0, 26, (1, N)).astype(np.float32)]
    c = t.lite.TFLiteConverter.from_keras_model(m)
    c.optimizations, c.representative_dataset = [t.lite.Optimize.DEFAULT], rep
    c.target_spec.supported_ops = [t.lite.OpsSet.TFLITE_BUILTINS_INT8]
    c.inference_input_type = c.inference_output_type = t.int8
    path = tmp_path_factory.mktemp("speech") / "speech_int8.tflite"
    path.write_bytes(c.convert())
    return path


def test_converts_from_its_own_scales_and_agrees_with_tflite(speech, tmp_path):
    """Without --dataset the calibration samples span the input's own int8 range (an image's
    synthetic pixels cannot feed a vector: this was an IndexError), and the kmodel's scores are
    the interpreter's. The (1, 490) input reshaped for the first conv is that (1, 49, 10) map
    (passes.input_nchw): kmodel v3, fed the int8 codes + 128."""
    from tl2k210.compiler import ConvertOptions, convert
    from tl2k210.k210.emulator import Emulator
    out = tmp_path / "speech.kmodel"
    r = convert(speech, out, ConvertOptions(progress=False))
    assert r.totals["format"] == "v3" and r.layers[0]["unit"] == "KPU"
    (o,) = r.totals["outputs"].values()
    print(f"receipt: ours {o['sqnr_db']:.1f} dB, 8-bit ideal {o['ideal_db']:.1f} dB")
    assert np.isfinite(o["sqnr_db"]) and o["sqnr_db"] >= o["ideal_db"] - 1   # the ideal's logits are int8 too
    it = tf().lite.Interpreter(model_path=str(speech))
    it.allocate_tensors()
    i, o = it.get_input_details()[0], it.get_output_details()[0]
    (si, zi), (so, zo) = i["quantization"], o["quantization"]
    emu = Emulator.load(out)
    q = np.random.default_rng(4).integers(-128, 128, (16, 1, N), dtype=np.int8)
    refs, gots = [], []
    for x in q:
        it.set_tensor(i["index"], x)
        it.invoke()
        refs.append((it.get_tensor(o["index"]).astype(np.float64) - zo) * so)
        codes = (x.astype(np.int16) + 128).astype(np.uint8)
        gots.append(np.asarray(emu.run(codes.reshape(emu.input_spec()[0]))[0], np.float64).reshape(refs[-1].shape))
    db = sqnr_db(np.stack(refs), np.stack(gots))
    print(f"kmodel vs TFLite interpreter: {db:.1f} dB")
    assert db >= 25


def test_a_photo_folder_for_a_vector_input_says_what_to_give(speech, tmp_path):
    from PIL import Image

    from tl2k210.compiler import ConvertOptions, convert
    from tl2k210.errors import Tl2k210Error
    photos = tmp_path / "photos"
    photos.mkdir()
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(photos / "a.png")
    out = tmp_path / "speech.kmodel"
    with pytest.raises(Tl2k210Error) as e:
        convert(speech, out, ConvertOptions(dataset=str(photos), progress=False))
    assert f"input (1, {N}) is no image" in str(e.value) and f"shape (N, {N})" in str(e.value)
    assert not out.exists()


def test_a_photo_folder_for_a_four_channel_map_names_both_layouts(tmp_path):
    """MediaPipe's hair segmenter reads RGB plus the last frame's mask (4 channels): the refusal
    of a photo folder gives the array shape in both layouts load_arrays takes (a TFLite user has
    channels-last data)."""
    from onnx import helper
    from PIL import Image

    from front_helpers import make_model, rand
    from tl2k210.compiler import ConvertOptions, convert
    from tl2k210.errors import Tl2k210Error
    src = tmp_path / "four.onnx"
    src.write_bytes(make_model([helper.make_node("Conv", ["x", "w"], ["y"])], [("x", [1, 4, 16, 12])],
                               [("y", None)], {"w": rand(8, 4, 1, 1)}).SerializeToString())
    photos = tmp_path / "photos"
    photos.mkdir()
    Image.fromarray(np.zeros((16, 12, 3), np.uint8)).save(photos / "a.png")
    with pytest.raises(Tl2k210Error, match=r"give \.npy/\.npz arrays of shape \(N, 4, 16, 12\) or channels-last "
                                           r"\(N, 16, 12, 4\)"):
        convert(src, tmp_path / "four.kmodel", ConvertOptions(dataset=str(photos), progress=False))

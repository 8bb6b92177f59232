"""--inputs: a model that starts with what the K210 cannot run (an FFT spectrogram, a custom
front end) converts from the tensor named; the front end stays in the application, and compare
starts the float model there too (the kmodel's metadata says where). And an input without a batch
axis, given one by --input-shape."""
import json

import numpy as np
import onnx
import pytest
from onnx import helper

from front_helpers import make_model, tf
from lower_helpers import conv_node
from tl2k210.cli import main


def _arrays(folder, shape, seed, n=8):
    folder.mkdir()
    rng = np.random.default_rng(seed)
    for i in range(n):
        np.save(folder / f"{i}.npy", rng.normal(0, 1.5, shape).astype(np.float32))
    return folder


def _featured(tmp_path):
    """raw (1, 64) -> a custom-domain feature op -> feat (1, 1, 8, 8) -> conv + ReLU -> out."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Features", ["raw"], ["feat"], name="front", domain="ai.example"),
             conv_node("c", "feat", "w", "b", pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["out"])]
    m = make_model(nodes, [("raw", [1, 64])], [("out", [1, 4, 8, 8])],
                   {"w": rng.normal(0, 0.3, (4, 1, 3, 3)).astype(np.float32),
                    "b": rng.normal(0, 0.1, 4).astype(np.float32)})
    m.opset_import.append(helper.make_opsetid("ai.example", 1))
    m.graph.value_info.append(helper.make_tensor_value_info("feat", onnx.TensorProto.FLOAT, [1, 1, 8, 8]))
    src = tmp_path / "featured.onnx"
    onnx.save(m, src)
    return src


def test_inputs_starts_the_model_after_its_front_end_and_compare_follows(tmp_path, capsys):
    src = _featured(tmp_path)
    cal, held = _arrays(tmp_path / "cal", (1, 1, 8, 8), 1), _arrays(tmp_path / "held", (1, 1, 8, 8), 2)
    out = tmp_path / "f.kmodel"
    flags = ["--dataset", str(cal), "--input-range=-5,5", "-q"]
    assert main(["convert", str(src), str(out)] + flags) == 2
    assert "ai.example.Features is a custom-domain op" in capsys.readouterr().err and not out.exists()
    assert main(["convert", str(src), str(out), "--inputs", "feat"] + flags) == 0
    meta = json.loads((tmp_path / "f.kmodel.json").read_text())
    assert meta["input"]["start"] == "feat" and meta["input"]["shape"] == [1, 1, 8, 8]
    # compare reads the float model from the same tensor (the metadata's), on held-out arrays
    assert main(["compare", str(src), str(out), "--dataset", str(held), "--json", str(tmp_path / "c.json")]) == 0
    rows = json.loads((tmp_path / "c.json").read_text())["outputs"]
    assert rows["out"]["sqnr_db"] > 30, rows


@pytest.mark.parametrize("name, says", [
    ("fet", "--inputs 'fet': the model has no such tensor; nearest: 'feat'"),
    ("w", "--inputs 'w' is a constant of the model (weights)"),
    ("feat,c", "a kmodel has one input; give one tensor name")])
def test_inputs_that_cannot_start_the_model_are_refused(tmp_path, capsys, name, says):
    src = _featured(tmp_path)
    out = tmp_path / "f.kmodel"
    try:
        rc = main(["convert", str(src), str(out), "--dataset", str(_arrays(tmp_path / "cal", (1, 1, 8, 8), 1)),
                   "--inputs", name, "-q"])
    except SystemExit as e:    # argparse's usage error
        rc = e.code
    err = capsys.readouterr().err
    assert rc == 2
    assert says in err and "Traceback" not in err and not out.exists()


def test_inputs_takes_its_shape_from_the_model(tmp_path):
    """A cut tensor the file declares no shape for takes the one inference gives it: no
    --input-shape needed; the kmodel reads (1, 4, 8, 8) arrays."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Mul", ["x", "k"], ["a"]), conv_node("c", "a", "w", pads=[1, 1, 1, 1])]
    m = make_model(nodes, [("x", [1, 4, 8, 8])], [("c", None)],
                   {"k": np.float32(3.0), "w": rng.normal(0, 0.3, (4, 4, 3, 3)).astype(np.float32)})
    src = tmp_path / "scaled.onnx"
    onnx.save(m, src)
    out = tmp_path / "s.kmodel"
    assert main(["convert", str(src), str(out), "--dataset", str(_arrays(tmp_path / "cal", (1, 4, 8, 8), 1)),
                 "--inputs", "a", "--input-range=-5,5", "-q"]) == 0
    assert json.loads((tmp_path / "s.kmodel.json").read_text())["input"]["shape"] == [1, 4, 8, 8]


def test_inputs_that_leave_another_input_read_are_named(tmp_path, capsys):
    """A tensor some output does not go through: the original input is still read beside it."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Relu", ["x"], ["a"]), conv_node("c", "a", "w", pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c", "x"], ["out"])]
    m = make_model(nodes, [("x", [1, 4, 8, 8])], [("out", None)],
                   {"w": rng.normal(0, 0.3, (4, 4, 3, 3)).astype(np.float32)})
    src = tmp_path / "skip.onnx"
    onnx.save(m, src)
    out = tmp_path / "s.kmodel"
    assert main(["convert", str(src), str(out), "--dataset", str(_arrays(tmp_path / "cal", (1, 4, 8, 8), 1)),
                 "--inputs", "a", "-q"]) == 2
    err = capsys.readouterr().err
    assert "'a'" in err and "'x'" in err and "Traceback" not in err and not out.exists()


@pytest.mark.slow
def test_inputs_cuts_a_tflite_before_its_fft(tmp_path, capsys):
    """A keyword spotter whose TFLite file computes its own log-spectrogram (tf.signal.stft: RFFT2D,
    which no K210 runtime has): refused with the advice to convert the network that reads the
    spectrogram, which --inputs now does, cut on the file before TensorFlow Lite reads it; its
    outputs agree with the TFLite interpreter's from that tensor."""
    t = tf()
    rng = np.random.default_rng(0)
    w = t.constant(rng.normal(0, 0.3, (3, 3, 1, 4)).astype(np.float32))
    d = t.constant(rng.normal(0, 0.3, (4 * 15 * 33, 3)).astype(np.float32))

    @t.function(input_signature=[t.TensorSpec([1, 2048], t.float32)])
    def spotter(wav):
        spec = t.math.log(t.abs(t.signal.stft(wav, 256, 128, 64)) + 1e-3)
        x = t.reshape(spec, [1, 15, 33, 1], name="spec4")
        y = t.nn.relu(t.nn.conv2d(x, w, 1, "SAME"))
        return t.reshape(y, [1, -1]) @ d
    src = tmp_path / "kws.tflite"
    src.write_bytes(t.lite.TFLiteConverter.from_concrete_functions([spotter.get_concrete_function()]).convert())
    cal, held = _arrays(tmp_path / "cal", (1, 15, 33, 1), 1, 32), _arrays(tmp_path / "held", (1, 15, 33, 1), 2)
    out = tmp_path / "kws.kmodel"
    flags = ["--dataset", str(cal), "--input-range=-5,5", "-q"]
    assert main(["convert", str(src), str(out)] + flags) == 2
    assert "RFFT2D" in capsys.readouterr().err and not out.exists()
    assert main(["convert", str(src), str(out), "--inputs", "spec4"] + flags) == 0
    assert main(["compare", str(src), str(out), "--dataset", str(held), "--json", str(tmp_path / "c.json")]) == 0
    rows = json.loads((tmp_path / "c.json").read_text())["outputs"]
    assert min(r["sqnr_db"] for r in rows.values()) > 25, rows


def test_a_vector_input_without_a_batch_axis_is_given_one_by_input_shape(tmp_path, capsys):
    """A (5360,) waveform input (tflite-support's audio classifier) cannot tell its samples from its
    values: the refusal now offers --input-shape 1,5360, which a TFLite user can give (it had said
    only to export the model again; hunt 17)."""
    rng = np.random.default_rng(0)
    m = make_model([helper.make_node("Reshape", ["x", "s"], ["r"]), helper.make_node("MatMul", ["r", "w"], ["y"])],
                   [("x", [6])], [("y", None)], {"s": np.array([1, 6], np.int64),
                                                 "w": rng.normal(0, 0.5, (6, 3)).astype(np.float32)})
    src = tmp_path / "wave.onnx"
    onnx.save(m, src)
    np.save(tmp_path / "cal.npy", rng.uniform(-1, 1, (16, 6)).astype(np.float32))
    out = tmp_path / "w.kmodel"
    flags = ["--dataset", str(tmp_path / "cal.npy"), "--input-range=-1,1", "-q"]
    assert main(["convert", str(src), str(out)] + flags) == 2
    assert "give it one with --input-shape 1,6" in capsys.readouterr().err and not out.exists()
    assert main(["convert", str(src), str(out), "--input-shape", "1,6"] + flags) == 0


def test_frames_without_a_batch_axis_sized_by_input_shape_convert(tmp_path, capsys):
    """Snips' TF1 keyword spotter reads (T, 40) filterbank frames with no batch axis, unsqueezed
    to NHWC (1, T, 1, 40) for its 1-D convs (hunt 19): `--input-shape 80,40` had made T the batch,
    and samples of (80, 40) were refused. The input gets a batch axis of one, the relabels before
    the first conv go (its input is the (1, 40, 80, 1) map the conv reads), and the (N, 80, 40)
    samples are read in the source's order; the kmodel agrees with onnxruntime on the source
    model fed (80, 40). A 4-D --input-shape with a batch above one is refused."""
    from tl2k210.k210.emulator import Emulator
    rng = np.random.default_rng(0)
    n = helper.make_node
    nodes = [n("Unsqueeze", ["x", "ax"], ["x4"]), n("Transpose", ["x4"], ["xc"], perm=[0, 3, 1, 2]),
             conv_node("c", "xc", "w", "b", pads=[2, 0, 2, 0]), n("Relu", ["c"], ["y"])]
    m = make_model(nodes, [("x", ["T", 40])], [("y", None)],
                   {"ax": np.array([0, 2], np.int64), "w": rng.normal(0, 0.2, (8, 40, 5, 1)).astype(np.float32),
                    "b": rng.normal(0, 0.1, 8).astype(np.float32)})
    m.producer_name = "tf2onnx"
    src = tmp_path / "kws.onnx"
    onnx.save(m, src)
    frames = rng.normal(0, 1, (24, 80, 40)).astype(np.float32)
    np.save(tmp_path / "cal.npy", frames[:16])
    out = tmp_path / "kws.kmodel"
    flags = ["--dataset", str(tmp_path / "cal.npy"), "--input-range=-4,4", "-q"]
    assert main(["convert", str(src), str(out), "--input-shape", "80,40"] + flags) == 0
    assert "samples (80, 40) read as the model input (40, 80, 1)" in capsys.readouterr().err
    import onnxruntime as ort
    sess = ort.InferenceSession(src.read_bytes(), providers=["CPUExecutionProvider"])
    emu = Emulator.load(out)
    for f in frames[16:]:
        want = sess.run(None, {"x": f})[0].reshape(-1)
        px = np.clip(np.rint((f.T[:, :, None] + 4) / 8 * 255), 0, 255).astype(np.uint8)   # the kmodel's (40, 80, 1)
        got = np.asarray(emu.run(px)[0]).reshape(-1)
        assert 10 * np.log10(np.sum(want ** 2) / np.sum((want - got) ** 2)) > 30
    # the metadata keeps the shape --input-shape gave: compare feeds the source (80, 40) frames
    assert json.loads((tmp_path / "kws.kmodel.json").read_text())["input"]["source_shape"] == [80, 40]
    np.save(tmp_path / "held.npy", frames[16:])
    assert main(["compare", str(src), str(out), "--dataset", str(tmp_path / "held.npy")]) == 0
    assert main(["convert", str(src), str(out), "--input-shape", "2,80,1,40"] + flags) == 2
    assert "a kmodel runs one sample at a time; give a batch of one: --input-shape 1,80,1,40" in capsys.readouterr().err


def test_a_flat_input_reshaped_for_its_first_conv_is_that_map(tmp_path, capsys):
    """MLPerf Tiny's keyword spotter (PPQ's ONNX export) reads (1, 490) MFCCs and reshapes them
    to the (1, 1, 49, 10) map its first conv reads (hunt 20): the first kmodel layer was a
    QUANTIZE of the flat input, which kmodel v3 cannot start with, so a v3-only MaixPy could not
    load it. The input is now that map (the same bytes): kmodel v3, its first layer the conv; the
    (N, 490) samples are read in the source's order, the metadata keeps the source's shape, and
    `compare` feeds the source model (1, 490) rows."""
    from tl2k210.k210 import kmodel
    from tl2k210.k210.emulator import Emulator
    rng = np.random.default_rng(2)
    n = helper.make_node
    nodes = [n("Reshape", ["x", "shape"], ["x4"]), conv_node("c", "x4", "w", "b", pads=[1, 1, 1, 1]),
             n("Relu", ["c"], ["y"])]
    m = make_model(nodes, [("x", [1, 490])], [("y", None)],
                   {"shape": np.array([-1, 1, 49, 10], np.int64),
                    "w": rng.normal(0, 0.3, (8, 1, 3, 3)).astype(np.float32), "b": rng.normal(0, 0.1, 8).astype(np.float32)})
    src = tmp_path / "kws.onnx"
    onnx.save(m, src)
    rows = rng.normal(0, 1, (24, 490)).astype(np.float32)
    np.save(tmp_path / "cal.npy", rows[:16])
    np.save(tmp_path / "held.npy", rows[16:])
    out = tmp_path / "kws.kmodel"
    assert main(["convert", str(src), str(out), "--dataset", str(tmp_path / "cal.npy"), "--input-range=-4,4",
                 "-q"]) == 0
    assert "samples (490,) read as the model input (1, 49, 10)" in capsys.readouterr().err
    k = kmodel.load(out)
    assert k.version == 3 and k.layers[0].name == "K210_CONV"
    meta = json.loads((tmp_path / "kws.kmodel.json").read_text())
    assert meta["input"]["shape"] == [1, 1, 49, 10] and meta["input"]["source_shape"] == [1, 490]
    import onnxruntime as ort
    sess = ort.InferenceSession(src.read_bytes(), providers=["CPUExecutionProvider"])
    emu = Emulator.load(out)
    for r in rows[16:]:
        px = np.clip(np.rint((r + 4) / 8 * 255), 0, 255).astype(np.uint8)     # --input-range -4,4
        want = sess.run(None, {"x": (px / 255 * 8 - 4).astype(np.float32)[None]})[0].reshape(-1)
        got = np.asarray(emu.run(px.reshape(1, 49, 10))[0]).reshape(-1)
        assert 10 * np.log10(np.sum(want ** 2) / np.sum((want - got) ** 2)) > 30
    assert main(["compare", str(src), str(out), "--dataset", str(tmp_path / "held.npy")]) == 0
    assert "8 samples" in capsys.readouterr().out


def test_a_refused_node_names_the_outputs_that_end_the_model_before_it(tmp_path, capsys):
    """FSA-Net's capsule layer, a MatMul of its capsules by a 4-D constant (hunt 20), has no K210
    layer; its refusal offered nothing. It now names the tensors a model ending before it outputs
    and what the application would compute after them; following it converts."""
    rng = np.random.default_rng(3)
    n = helper.make_node
    nodes = [conv_node("c", "x", "w", "b", pads=[1, 1, 1, 1]), n("Relu", ["c"], ["r"]),
             n("Reshape", ["r", "s"], ["caps"]), n("MatMul", ["caps", "wc"], ["u"]), n("Relu", ["u"], ["y"])]
    m = make_model(nodes, [("x", [1, 3, 8, 8])], [("y", None)],
                   {"w": rng.normal(0, 0.3, (8, 3, 3, 3)).astype(np.float32), "b": np.zeros(8, np.float32),
                    "s": np.array([1, 1, 8, 64], np.int64), "wc": rng.normal(0, 0.3, (3, 8, 64, 4)).astype(np.float32)})
    src = tmp_path / "caps.onnx"
    onnx.save(m, src)
    np.save(tmp_path / "cal.npy", rng.random((8, 3, 8, 8), np.float32))
    out = tmp_path / "caps.kmodel"
    flags = ["--dataset", str(tmp_path / "cal.npy"), "-q"]
    assert main(["convert", str(src), str(out)] + flags) == 2
    err = capsys.readouterr().err
    assert "MatMul cannot be lowered" in err and not out.exists()
    assert "or end the model before it (--outputs caps)" in err and "(2 node(s), 6,144 weights)" in err, err
    assert main(["convert", str(src), str(out), "--outputs", "caps"] + flags) == 0

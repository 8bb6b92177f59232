"""--outputs: a model that ends in what the K210 cannot run (DeepLab's ArgMax, MoveNet's decoder)
converts up to the tensors named; compare cuts the float model where the kmodel ends."""
import json

import numpy as np
import onnx
from onnx import helper

from front_helpers import noise_photos
from lower_helpers import conv_node, make_model
from tl2k210.cli import main


def _segmenter(tmp_path):
    """conv + ReLU scores, then an ArgMax over the classes: the file's output is the class map."""
    rng = np.random.default_rng(0)
    m = make_model([conv_node("c", "x", "w", "b", pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["scores"]),
                    helper.make_node("ArgMax", ["scores"], ["seg"], name="ArgMax", axis=1, keepdims=0)],
                   [("x", [1, 3, 16, 16])], [("seg", None)],
                   {"w": rng.normal(0, 0.3, (5, 3, 3, 3)).astype(np.float32),
                    "b": rng.normal(0, 0.1, 5).astype(np.float32)})
    del m.graph.output[:]
    m.graph.output.append(helper.make_tensor_value_info("seg", onnx.TensorProto.INT64, [1, 16, 16]))
    onnx.checker.check_model(m)
    src = tmp_path / "seg.onnx"
    onnx.save(m, src)
    photos = noise_photos(tmp_path / "photos", 16, 16, rng)
    return src, photos


def test_outputs_cuts_the_model_before_an_argmax_and_compare_follows(tmp_path, capsys):
    src, photos = _segmenter(tmp_path)
    out = tmp_path / "seg.kmodel"
    assert main(["convert", str(src), str(out), "--dataset", str(photos), "-q"]) == 2
    err = capsys.readouterr().err
    assert "node 'ArgMax'" in err and "--outputs scores " in err and not out.exists()
    # a name the model does not have: refused with the nearest ones, nothing written
    assert main(["convert", str(src), str(out), "--dataset", str(photos), "--outputs", "score", "-q"]) == 2
    err = capsys.readouterr().err
    assert "--outputs 'score': the model has no such tensor; nearest: 'scores'" in err and not out.exists()
    assert main(["convert", str(src), str(out), "--dataset", str(photos), "--outputs", "x", "-q"]) == 2
    assert "--outputs 'x' is the model's input" in capsys.readouterr().err and not out.exists()
    assert main(["convert", str(src), str(out), "--dataset", str(photos), "--outputs", "scores",
                 "--report", str(tmp_path / "r.json")]) == 0
    err = capsys.readouterr().err
    assert "the model ends at 'scores' (--outputs): what follows is the application's" in err
    meta = json.loads((tmp_path / "seg.kmodel.json").read_text())
    assert [o["name"] for o in meta["outputs"]] == ["scores"] and meta["outputs"][0]["shape"][-3:] == [5, 16, 16]
    # compare: the float side is cut where the kmodel ends (its metadata), without the flag
    assert main(["compare", str(src), str(out), "--dataset", str(photos), "--json", str(tmp_path / "c.json")]) == 0
    rows = json.loads((tmp_path / "c.json").read_text())["outputs"]
    assert list(rows) == ["scores"] and rows["scores"]["sqnr_db"] > 30, rows


def test_compare_reads_a_broken_file_once_with_the_kmodels_outputs(tmp_path, capsys, monkeypatch):
    """compare first loads the float model cut at the kmodel's metadata outputs; only a name the
    file lacks (UnknownOutputError) sends it to load the file whole. A file that does not load at
    all is refused after one read, not two."""
    from tl2k210 import frontends
    src, photos = _segmenter(tmp_path)
    out = tmp_path / "seg.kmodel"
    assert main(["convert", str(src), str(out), "--dataset", str(photos), "--outputs", "scores", "-q"]) == 0
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(src.read_bytes()[:100])
    reads = []
    real = frontends._load_path
    monkeypatch.setattr(frontends, "_load_path", lambda *a, **k: reads.append(a[0]) or real(*a, **k))
    capsys.readouterr()
    assert main(["compare", str(broken), str(out), "--dataset", str(photos)]) == 2
    assert "broken.onnx" in capsys.readouterr().err and reads == [broken]


def test_outputs_takes_a_keras_layer_name(tmp_path, capsys):
    """A Keras .h5's layer names are what netron shows and what its author knows; tf2onnx names
    its tensors by op scopes Keras makes unique ('sequential_1/dense_1_2/...'), so `--outputs
    dense` was refused with no nearest name (round 65's hunt). The model is cut at the layer
    before tf2onnx reads it; compare follows."""
    from front_helpers import tf
    tf()
    import keras
    from keras import layers as L
    keras.utils.set_random_seed(3)
    m = keras.Sequential([keras.Input((16, 16, 3)), L.Conv2D(4, 3, activation="relu", name="conv"), L.Flatten(),
                          L.Dense(8, activation="relu", name="feat"), L.Dense(3, activation="softmax", name="probs")])
    src = tmp_path / "m.h5"
    m.save(src)
    _, photos = _segmenter(tmp_path)
    out = tmp_path / "m.kmodel"
    assert main(["convert", str(src), str(out), "--dataset", str(photos), "--outputs", "feat", "-q"]) == 0
    meta = json.loads((tmp_path / "m.kmodel.json").read_text())
    assert [o["name"] for o in meta["outputs"]] == ["feat"] and meta["outputs"][0]["shape"][-1] == 8
    assert main(["compare", str(src), str(out), "--dataset", str(photos), "--json", str(tmp_path / "c.json")]) == 0
    rows = json.loads((tmp_path / "c.json").read_text())["outputs"]
    assert list(rows) == ["feat"] and rows["feat"]["sqnr_db"] > 30, rows


def test_outputs_takes_a_layer_name_of_a_model_tf_keras_reads(tmp_path, capsys):
    """ST's MobileNet .h5 (DepthwiseConv2D with `groups`: Keras 3 refuses it, tf-keras reads it):
    its cut is built with tf-keras's Model, not Keras 3's (a ValueError had escaped `compare`)."""
    from front_helpers import need_testdata
    src = need_testdata("corpus/fit/st_mobilenet_v1_0.25_96_grayscale.h5")
    rng = np.random.default_rng(1)
    photos = noise_photos(tmp_path / "photos", 96, 96, rng)
    out = tmp_path / "m.kmodel"
    assert main(["convert", str(src), str(out), "--dataset", str(photos), "--outputs", "global_average_pooling2d",
                 "-q"]) == 0
    assert main(["compare", str(src), str(out), "--dataset", str(photos), "--json", str(tmp_path / "c.json")]) == 0
    rows = json.loads((tmp_path / "c.json").read_text())["outputs"]
    assert list(rows) == ["global_average_pooling2d"] and rows["global_average_pooling2d"]["cosine"] > 0.99, rows


def test_anchors_baked_in_at_another_input_size_name_the_outputs_that_work(tmp_path, capsys):
    """UltraFace's ONNX decodes its boxes with a constant table of 4,420 anchors, the count at
    240x320: at --input-shape 1,3,256,320 the maps meet 4,700 rows of it, and the advice was to
    give a size the strides divide, which every size but the exported one fails. The refusal
    names the constant and the --outputs that end the model before it (with its other outputs),
    and that cut now happens on the ONNX graph before the shape checks."""
    rng = np.random.default_rng(0)
    n = helper.make_node
    nodes = [conv_node("loc", "x", "wl", strides=[4, 4]), n("Reshape", ["loc", "shape"], ["rows"]),
             n("Mul", ["rows", "anchors"], ["boxes"], name="decode"),
             conv_node("conf", "x", "wc", strides=[4, 4]), n("Reshape", ["conf", "shape"], ["scores"])]
    m = make_model(nodes, [("x", [1, 3, 16, 16])], [("boxes", None), ("scores", None)],
                   {"wl": rng.normal(0, 0.3, (2, 3, 3, 3)).astype(np.float32),
                    "wc": rng.normal(0, 0.3, (2, 3, 3, 3)).astype(np.float32),
                    "shape": np.array([1, -1, 2], np.int64),
                    "anchors": rng.uniform(0.5, 1, (1, 16, 2)).astype(np.float32)})
    src = tmp_path / "ssd.onnx"
    onnx.save(m, src)
    photos = noise_photos(tmp_path / "photos", 32, 32, rng)
    out = tmp_path / "ssd.kmodel"
    flags = ["--dataset", str(photos), "--input-shape", "1,3,32,32", "-q"]
    assert main(["convert", str(src), str(out)] + flags) == 2
    err = capsys.readouterr().err
    assert "'anchors' (1x16x2) is computed from constants alone" in err and "(--outputs rows,scores)" in err
    assert main(["convert", str(src), str(out), "--outputs", "rows,scores"] + flags) == 0
    meta = json.loads((tmp_path / "ssd.kmodel.json").read_text())
    assert [o["name"] for o in meta["outputs"]] == ["rows", "scores"] and meta["outputs"][0]["shape"][-2:] == [64, 2]

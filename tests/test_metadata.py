"""MODEL.kmodel.json (tl2k210/metadata.py): written by `zoo build` / `convert` beside the kmodel
and into the .kfpkg; read by `run --decode`, `compare`, `demo`, `deploy` (flags override); shown
by `inspect`; a json whose sha256 is another kmodel's is ignored with a warning."""
import json
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from conftest import data_path
from tl2k210 import metadata
from tl2k210.cli import main


@pytest.fixture(scope="module")
def astronaut(tmp_path_factory):
    skdata = pytest.importorskip("skimage.data")
    p = tmp_path_factory.mktemp("photo") / "astronaut.png"
    Image.fromarray(skdata.astronaut()).save(p)
    return p


@pytest.fixture
def face(zoo_build, tmp_path):
    """A private copy of the zoo face detector and its metadata (the tests modify them)."""
    built = zoo_build("face_detect")
    km = tmp_path / "face.kmodel"
    shutil.copy(built["kmodel"], km)
    shutil.copy(built["metadata"], metadata.path_for(km))
    return km


def _zoo_anchors():
    """The zoo face detector's anchors (models/face_detect/recipe.toml, written into its metadata)."""
    from tl2k210 import zoo
    return list(zoo.get("face_detect").decode["anchors"])


def _run(argv, capsys):
    rc = main(argv)
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_zoo_build_writes_the_metadata_and_packs_it(zoo_build):
    from tl2k210 import zoo
    from tl2k210.flash.kfpkg import read_kfpkg
    built = zoo_build("face_detect")
    data = Path(built["kmodel"]).read_bytes()
    meta = metadata.load_for(built["kmodel"])
    recipe = zoo.get("face_detect")
    assert meta is not None and meta.schema == metadata.SCHEMA and meta.version == metadata.VERSION
    assert meta.kmodel == {"file": "face_detect.kmodel", "sha256": metadata.sha256(data),
                           "bytes": len(data), "version": 3}
    assert meta.task == "yolo2" and meta.anchors == recipe.decode["anchors"] and meta.labels == ["face"]
    assert meta.decode == {"threshold": 0.5, "nms": 0.3}
    assert meta.input == {"layout": "NCHW", "shape": [1, 3, 240, 320], "dtype": "uint8",
                          "range": [0.0, 1.0], "mean": [0.0], "std": [1.0], "bgr": False}
    assert [o["shape"] for o in meta.outputs] == [[1, 30, 15, 20]]      # 5 anchors x 6, 15x20 grid
    assert meta.firmware["runtime"] == "maixpy" and meta.firmware["script"] == "face_detect.py"
    assert meta.flash_address == 0x300000
    assert meta.firmware["needs_bytes"] == built["receipt"]["file_size"] + built["receipt"]["main_memory"]
    from tl2k210 import __version__
    assert meta.tl2k210_version == __version__
    # the package carries it, unflashed: kflash and read_kfpkg see only the kmodel
    with zipfile.ZipFile(built["kfpkg"]) as zf:
        assert sorted(zf.namelist()) == ["face_detect.kmodel", "face_detect.kmodel.json", "flash-list.json"]
        assert "json" not in zf.read("flash-list.json").decode()
    assert [(i.address, i.data) for i in read_kfpkg(built["kfpkg"])] == [(0x300000, data)]
    assert metadata.from_kfpkg(built["kfpkg"]) == meta


def test_run_decodes_from_the_metadata_and_flags_override(face, astronaut, capsys):
    rc, out, err = _run(["run", str(face), "-i", str(astronaut), "--decode", "yolo2"], capsys)
    assert rc == 0 and "1 box(es) (threshold 0.5, NMS 0.3)" in out and "  face  " in out, out + err
    rc, out, _ = _run(["run", str(face), "-i", str(astronaut)], capsys)     # task yolo2: decoded
    assert rc == 0 and "1 box(es)" in out
    rc, out, _ = _run(["run", str(face), "-i", str(astronaut), "--decode", "none"], capsys)
    assert rc == 0 and "box(es)" not in out
    rc, out, _ = _run(["run", str(face), "-i", str(astronaut), "--labels", "head", "--threshold", "0.99999"],
                      capsys)
    assert rc == 0 and "threshold 0.99999" in out and ("  head  " in out or "0 box(es)" in out)
    # other anchors (flags win): 10x smaller boxes
    small = ",".join(str(v / 10) for v in metadata.load_for(face).anchors)
    rc, out, _ = _run(["run", str(face), "-i", str(astronaut), "--anchors", small, "--nms", "0.3"], capsys)
    w = [int(t[2:]) for t in out.split() if t.startswith("w=")]
    assert rc == 0 and w and max(w) < 20, out


def test_a_json_of_another_kmodel_is_ignored_with_a_warning(face, astronaut, capsys):
    other = data_path("kmodels", "facedetect_320x240_v3.kmodel")     # nncase's, no metadata
    km = face.with_name("swapped.kmodel")
    shutil.copy(other, km)
    shutil.copy(metadata.path_for(face), metadata.path_for(km))
    rc, out, err = _run(["run", str(km), "-i", str(astronaut), "--decode", "yolo2"], capsys)
    assert rc == 2 and "describes another kmodel" in err and "needs --anchors" in err
    rc, out, err = _run(["inspect", str(km)], capsys)
    assert rc == 0 and "describes another kmodel" in err and "metadata (" not in out
    # garbage and a newer schema: warned and ignored, never a traceback
    metadata.path_for(km).write_text("{not json")
    assert metadata.load_for(km) is None and "not valid metadata" in capsys.readouterr().err
    d = json.loads(metadata.path_for(face).read_text())
    d["version"] = metadata.VERSION + 1
    metadata.path_for(face).write_text(json.dumps(d))
    assert metadata.load_for(face) is None and "metadata version" in capsys.readouterr().err


def test_inspect_shows_the_metadata(face, capsys):
    rc, out, _ = _run(["inspect", str(face)], capsys)
    assert rc == 0 and "metadata (face.kmodel.json, sha256 matches)" in out
    a = _zoo_anchors()
    assert "task              yolo2" in out and f"anchors           {a[0]}, {a[1]}" in out
    assert "flash address 0x300000" in out and "script face_detect.py" in out
    rc, out, _ = _run(["inspect", str(face), "--json"], capsys)
    info = json.loads(out)
    assert info["metadata"]["anchors"] == a and info["metadata"]["task"] == "yolo2"
    rc, out, _ = _run(["inspect", str(data_path("kmodels", "iris_v3.kmodel")), "--json"], capsys)
    assert json.loads(out)["metadata"] is None


def test_metadata_round_trip_and_schema():
    meta = metadata.build(b"\x03\0\0\0" + bytes(60), "x.kmodel", input={"shape": [1, 4]},
                          outputs=[{"name": "y", "shape": [1, 3]}], task="classify",
                          labels=["a", "[1,  2]", "c"], anchors=[1.5, -2e-3])
    text = meta.to_json()
    d = json.loads(text)
    assert list(d)[:2] == ["schema", "version"] and d["kmodel"]["version"] == 3
    assert metadata.ModelMetadata.from_dict(d) == meta and d["labels"][1] == "[1,  2]"
    assert '"anchors": [1.5, -0.002],' in text           # short number lists on one line
    assert metadata.parse(text, b"\x03\0\0\0" + bytes(60), "x") == meta
    from tl2k210.errors import Tl2k210Error
    with pytest.raises(Tl2k210Error, match="task 'detect'"):
        metadata.build(b"\x03\0\0\0" + bytes(60), "x.kmodel", input={}, outputs=[], task="detect")
    for bad in ({"anchors": "1,2"}, {"labels": [1, 2]}, {"decode": {"threshold": "high"}},
                {"firmware": {"flash_address": "here"}}, {"outputs": None}):
        with pytest.raises((TypeError, ValueError)):
            metadata.ModelMetadata.from_dict({**d, **bad})


def test_deploy_takes_address_and_decode_lines_from_the_metadata(face, tmp_path):
    from flash_helpers import board, run_tl2k210
    meta = json.loads(metadata.path_for(face).read_text())
    meta["firmware"]["flash_address"] = "0x500000"          # the deploy must follow it
    metadata.path_for(face).write_text(json.dumps(meta))
    data = face.read_bytes()
    with board(tmp_path) as b:
        rc, out = run_tl2k210(["deploy", str(face), "-p", b.port, "-B", "dan", "-o", str(tmp_path / "d.kfpkg")], b)
        assert rc == 0, out
        assert b.flash_bytes(0x500000, len(data)) == data
        # -a wins over the metadata
        rc, over = run_tl2k210(["deploy", str(face), "-p", b.port, "-B", "dan", "-a", "0x600000"], b)
        assert rc == 0 and b.flash_bytes(0x600000, len(data)) == data, over
        assert "task = kpu.load(0x600000)" in over and "from face.kmodel.json" not in over
    assert "model address 0x500000 from face.kmodel.json" in out and "task = kpu.load(0x500000)" in out
    assert f"anchor = ({', '.join(map(str, _zoo_anchors()[:4]))}" in out and "kpu.init_yolo2(task, 0.5, 0.3, 5, anchor)" in out
    assert "labels = ['face']" in out
    with zipfile.ZipFile(tmp_path / "d.kfpkg") as zf:
        assert "face.kmodel.json" in zf.namelist()


def test_package_carries_the_metadata(face, tmp_path, capsys):
    rc, _, _ = _run(["package", f"{face}@0x300000", "-o", str(tmp_path / "p.kfpkg")], capsys)
    assert rc == 0 and metadata.from_kfpkg(tmp_path / "p.kfpkg") == metadata.load_for(face)


def test_demo_reads_labels_from_the_package_metadata(zoo_build, tmp_path, monkeypatch, capsys):
    """mobilenet_v1's script reads /sd/labels.txt; the recipe's labels are a test-data file.
    With the test data gone the demo still names the tiger: the labels come from the kfpkg."""
    pkg = zoo_build("mobilenet_v1")["kfpkg"]
    tiger = tmp_path / "tiger.jpg"
    shutil.copy(data_path("imagenet", "tiger.jpg"), tiger)
    monkeypatch.setenv("TL2K210_TESTDATA", str(tmp_path / "no-testdata"))
    rc, out, err = _run(["demo", "mobilenet-v1", "--kfpkg", pkg, "--image", str(tiger),
                         "--out", str(tmp_path / "lcd.png")], capsys)
    assert rc == 0, err
    assert "[host] model: mobilenet_v1.kmodel (classify, 224x224 input" in out
    top5 = out[out.index("top-5:"):].splitlines()[1:6]
    assert "tiger, Panthera tigris" in top5[0], top5


# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def bgr_keras(tmp_path_factory):
    """A small Keras conv net converted with --input-range -1,1 --bgr (metadata records both)."""
    tf = pytest.importorskip("tensorflow")
    keras = tf.keras
    keras.utils.set_random_seed(3)
    x = keras.Input((32, 32, 3))
    y = keras.layers.Conv2D(8, 3, padding="same", activation="relu")(x)
    y = keras.layers.Conv2D(4, 3, padding="same")(y)
    d = tmp_path_factory.mktemp("bgr")
    src = d / "net.keras"
    keras.Model(x, y).save(src)
    rng = np.random.default_rng(0)
    calib = d / "calib"
    calib.mkdir()
    for i in range(12):
        img = (rng.random((32, 32, 3)) * 255).astype(np.uint8)
        img[..., 0] = 255 - img[..., 1] // 2                # the channels differ: order matters
        Image.fromarray(img).save(calib / f"{i}.png")
    km = d / "net.kmodel"
    assert main(["convert", str(src), str(km), "--dataset", str(calib), "--input-range", "-1,1",
                 "--bgr", "-q"]) == 0
    return src, km, calib


def test_convert_records_preprocessing_and_compare_uses_it(bgr_keras, capsys):
    from tl2k210.compare import compare
    src, km, calib = bgr_keras
    capsys.readouterr()
    meta = metadata.load_for(km)
    assert meta.input["range"] == [-1.0, 1.0] and meta.input["bgr"] is True
    assert meta.task is None and meta.source == str(src)
    rc, out, err = _run(["compare", str(src), str(km), "--dataset", str(calib), "--json", str(km) + ".cmp"],
                        capsys)
    assert rc == 0 and "using net.kmodel.json" in err, err
    with_meta = json.loads(Path(str(km) + ".cmp").read_text())["outputs"]
    sq = list(with_meta.values())[0]["sqnr_db"]
    # the same comparison with the defaults (0..1, RGB): the float side is fed something else
    wrong = list(compare(str(src), str(km), str(calib))["outputs"].values())[0]["sqnr_db"]
    assert sq > 25 and sq > wrong + 10, (sq, wrong)
    # the flags win: told 0..1 and RGB, compare feeds the float side what the defaults feed it
    rc, out, err = _run(["compare", str(src), str(km), "--dataset", str(calib), "--input-range", "0,1", "--rgb",
                         "--json", str(km) + ".cmp"], capsys)
    flagged = list(json.loads(Path(str(km) + ".cmp").read_text())["outputs"].values())[0]["sqnr_db"]
    assert rc == 0 and abs(flagged - wrong) < 1e-6, (flagged, wrong)


# ---------------------------------------------------------------------------------------------
def test_decode_parameters_must_fit_the_region_output(kmodel_path):
    """Anchors/labels written into the metadata must fit the model's output (channels = anchors
    x (5 + classes)), else MaixPy's kpu.init_yolo2 fails on the board, and a classifier's labels
    its output's values: refused with the numbers."""
    from conftest import FACE_ANCHORS
    from tl2k210.errors import Tl2k210Error
    from tl2k210.k210.kmodel import load
    model = load(kmodel_path("facedetect_320x240_v3.kmodel"))      # 30 channels: 5 x (5 + 1)
    metadata.check_decode(model, {"task": "yolo2", "anchors": FACE_ANCHORS, "labels": ["face"]})
    metadata.check_decode(model, {"anchors": FACE_ANCHORS})          # task yolo2 implied
    with pytest.raises(Tl2k210Error, match=r"names 2 label\(s\) for a 9000-way classifier output"):
        metadata.check_decode(model, {"task": "classify", "labels": ["a", "b"]})  # a label a value
    with pytest.raises(Tl2k210Error, match="4 anchors do not fit the 30-channel region output"):
        metadata.check_decode(model, {"anchors": FACE_ANCHORS[:8]})
    with pytest.raises(Tl2k210Error, match="names 2 label"):
        metadata.check_decode(model, {"anchors": FACE_ANCHORS, "labels": ["face", "cat"]})
    with pytest.raises(Tl2k210Error, match="task yolo2 needs its anchors"):
        metadata.check_decode(model, {"task": "yolo2"})


def test_convert_refuses_anchors_its_output_cannot_carry(tmp_path, capsys):
    """`convert --anchors` with one anchor too many for a 2 x (5 + 1)-channel head: refused after
    lowering, and neither the kmodel nor its metadata is written; the right count converts."""
    onnx = pytest.importorskip("onnx")
    from onnx import helper, numpy_helper
    rng = np.random.default_rng(5)
    w = rng.normal(0, 0.3, (12, 3, 3, 3)).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1])], "head",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 12, 16, 16])],
        [numpy_helper.from_array(w, "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    onnx.save(m, tmp_path / "head.onnx")
    calib = tmp_path / "calib"
    calib.mkdir()
    for i in range(4):
        Image.fromarray((rng.random((16, 16, 3)) * 255).astype(np.uint8)).save(calib / f"{i}.png")
    km = tmp_path / "head.kmodel"
    rc, _, err = _run(["convert", str(tmp_path / "head.onnx"), str(km), "--dataset", str(calib), "-q",
                       "--anchors", "1,1,2,2,3,3", "--labels", "thing"], capsys)
    assert rc == 2 and "3 anchors do not fit the 12-channel region output (16x16 grid)" in err, err
    assert not km.exists() and not metadata.path_for(km).exists()
    rc, _, err = _run(["convert", str(tmp_path / "head.onnx"), str(km), "--dataset", str(calib), "-q",
                       "--anchors", "1,1,2,2", "--labels", "thing", "--threshold", "0.6"], capsys)
    assert rc == 0, err
    meta = metadata.load_for(km)
    assert (meta.task, meta.anchors, meta.labels, meta.decode) == ("yolo2", [1, 1, 2, 2], ["thing"],
                                                                     {"threshold": 0.6})

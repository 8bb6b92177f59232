"""`tl2k210 inspect` and `tl2k210 run` as a user runs them."""
import json
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from conftest import FACE_ANCHORS, KMODEL_FILES, REPO, data_path
from tl2k210.cli import main

pytestmark = pytest.mark.skipif(not KMODEL_FILES, reason="../shared/testdata/kmodels missing")


@pytest.mark.parametrize("path", KMODEL_FILES, ids=lambda p: p.name)
def test_inspect_every_testdata_kmodel(path, capsys):
    assert main(["inspect", str(path)]) == 0
    text = capsys.readouterr().out
    assert "peak KPU RAM" in text and "main memory" in text and "outputs" in text
    assert main(["inspect", str(path), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["version"] in (3, 4) and info["layer_count"] == len(info["layers"]) > 0
    for row in info["layers"]:
        assert row["unit"] in ("KPU", "CPU") and row["macs"] >= 0


def test_inspect_numbers_for_facedetect(capsys):
    main(["inspect", str(data_path("kmodels", "facedetect_320x240_v3.kmodel")), "--json"])
    info = json.loads(capsys.readouterr().out)
    first = info["layers"][0]
    assert first["in"] == [3, 240, 320] and first["out"] == [16, 120, 160]
    assert first["macs"] == 240 * 320 * 16 * 27 and first["op"] == "conv3x3+max_2_s2"
    assert info["kpu_layers"] == 23 and info["cpu_layers"] == 1 and info["main_memory"] == 45000


def test_inspect_lists_all_asr_ops(capsys):
    main(["inspect", str(data_path("kmodels", "maix_asr_v4.kmodel")), "--json"])
    info = json.loads(capsys.readouterr().out)
    assert [r["type"] for r in info["layers"]] == [
        "kpu_conv2d", "kpu_conv2d", "kpu_conv2d", "transpose", "pad", "kpu_upload", "kpu_conv2d",
        "kpu_conv2d", "pad", "transpose", "dequantize"]
    assert info["trailing_bytes"] == 997632


def test_inspect_does_not_import_tensorflow():
    f = data_path("kmodels", "yolo20_v4.kmodel")
    code = ("import sys; from tl2k210.cli import main; main(['inspect', %r]); "
            "bad = [m for m in ('tensorflow', 'onnx', 'onnxruntime', 'tf2onnx') if m in sys.modules]; "
            "assert not bad, bad" % str(f))
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, capture_output=True)


def test_run_decodes_the_face_and_writes_png(tmp_path, capsys):
    img = tmp_path / "astronaut.png"
    from skimage import data
    Image.fromarray(data.astronaut()).save(img)
    out = tmp_path / "faces.png"
    rc = main(["run", str(data_path("kmodels", "facedetect_320x240_v3.kmodel")), "--input", str(img),
               "--decode", "yolo2", "--anchors", ",".join(map(str, FACE_ANCHORS)),
               "--threshold", "0.5", "--nms", "0.3", "--labels", "face", "--out", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "1 box(es)" in text and "face  0.93" in text
    png = Image.open(out)
    assert png.size == (320, 240)
    # the box outline is drawn in red around x=118..165
    px = np.asarray(png.convert("RGB"))
    assert (px[50, 117:120] == [255, 40, 40]).all(axis=1).any()


def test_run_npy_and_json(tmp_path, capsys):
    x = np.array([5.1, 3.5, 1.4, 0.2], np.float32)
    np.save(tmp_path / "x.npy", x)
    js = tmp_path / "r.json"
    assert main(["run", str(data_path("kmodels", "iris_v3.kmodel")), "-i", str(tmp_path / "x.npy"),
                 "-o", str(js)]) == 0
    res = json.loads(js.read_text())
    assert np.argmax(res["outputs"][0]) == 0  # setosa


def test_run_rgb565_changes_input_slightly(tmp_path):
    from tl2k210 import imaging
    rgb = np.random.default_rng(0).integers(0, 256, (8, 8, 3)).astype(np.uint8)
    back = imaging.rgb565_roundtrip(rgb)
    assert np.abs(back.astype(int) - rgb).max() <= 7 and not np.array_equal(back, rgb)
    assert imaging.rgb565_roundtrip(np.array([[[255, 255, 255]]], np.uint8)).tolist() == [[[255, 255, 255]]]


@pytest.mark.parametrize("content,needle", [
    (b"\x03\x00\x00\x00" + bytes(10), "file ends inside v3 header"),
    (b"LDMK\x05\x00\x00\x00" + bytes(40), "kmodel v5 (nncase 1.x)"),
])
def test_bad_file_gives_clear_error_and_exit_2(tmp_path, capsys, content, needle):
    f = tmp_path / "bad.kmodel"
    f.write_bytes(content)
    assert main(["inspect", str(f)]) == 2
    err = capsys.readouterr().err
    assert needle in err and "bad.kmodel" in err and "Traceback" not in err


def test_wrong_input_size_is_explained(tmp_path, capsys):
    np.save(tmp_path / "x.npy", np.zeros(7, np.float32))
    assert main(["run", str(data_path("kmodels", "iris_v3.kmodel")), "-i", str(tmp_path / "x.npy")]) == 2
    assert "the model takes (4,) float32" in capsys.readouterr().err

"""`tl2k210 deploy MODEL --via repl` against the emulated MaixPy board: the kmodel, labels and
a generated main.py land byte-exact on the card, the board soft-reboots into main.py and the
first lines it prints are shown: the real face detector finds the astronaut's face on the
board's camera; a model that still needs converting is converted first."""
import re
import subprocess
import sys

import pytest

from conftest import FACE_ANCHORS, data_path
from repl_helpers import board, calib_photos, client_env, tiny_onnx

TL = [sys.executable, "-m", "tl2k210.cli", "deploy"]


@pytest.fixture
def astronaut(tmp_path):
    data = pytest.importorskip("skimage.data")
    from PIL import Image
    p = tmp_path / "astronaut.png"
    Image.fromarray(data.astronaut()).save(p)
    return p


@pytest.mark.slow                      # uploads 389 KB and runs the detector on the camera
def test_deploy_face_detector_runs_on_the_board(tmp_path, astronaut):
    k = data_path("kmodels", "facedetect_320x240_v3.kmodel")
    (tmp_path / "labels.txt").write_text("face\n")
    (tmp_path / "b").mkdir()
    bd = board(tmp_path / "b", images=[str(astronaut)])
    try:
        assert bd.wait_idle()
        p = subprocess.run(TL + [str(k), "--via", "repl", "-p", bd.port, "--labels",
                                 str(tmp_path / "labels.txt"), "--anchors",
                                 ",".join(map(str, FACE_ANCHORS)), "--lines", "4"],
                           capture_output=True, text=True, timeout=300, env=client_env())
        assert p.returncode == 0, p.stderr
        assert (bd.sd / "facedetect_320x240_v3.kmodel").read_bytes() == k.read_bytes()
        assert (bd.sd / "labels.txt").read_text() == "face\n"
        main = (bd.sd / "main.py").read_text()
        assert "kpu.load('/sd/facedetect_320x240_v3.kmodel')" in main and "run_yolo2" in main
        shown = p.stdout.split("its first 4 lines:\n", 1)[1].splitlines()
        assert len(shown) == 4
        face = [ln for ln in shown if ln.strip().startswith("face ")]
        assert face, p.stdout
        x, y, w, h = map(int, re.search(r"at \((\d+), (\d+), (\d+), (\d+)\)", face[0]).groups())
        # the astronaut's face, in the 320x240 frame of the 512x512 photo
        assert 90 < x + w / 2 < 190 and 10 < y + h / 2 < 110, face[0]
        assert any(re.fullmatch(r"\s*1 found, [\d.]+ fps", ln) for ln in shown)
    finally:
        bd.close()


def test_deploy_converts_a_float_model_first(tmp_path):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("skimage.data")
    calib = calib_photos(tmp_path / "calib")
    tiny_onnx(tmp_path / "net.onnx", 3)
    (tmp_path / "b").mkdir()
    bd = board(tmp_path / "b", sd=False, images=[str(calib / "0.png")])
    try:
        assert bd.wait_idle()
        p = subprocess.run(TL + [str(tmp_path / "net.onnx"), "--dataset", str(calib), "--via",
                                 "repl", "-p", bd.port, "--lines", "2"],
                           capture_output=True, text=True, timeout=300, env=client_env())
        assert p.returncode == 0, p.stderr
        assert (bd.fs / "net.kmodel").read_bytes()[:4] == b"\x03\x00\x00\x00"   # kmodel v3
        main = (bd.fs / "main.py").read_text()              # no card: /flash/main.py runs
        assert "sensor.set_windowing((32, 32))" in main
        shown = p.stdout.split("its first 2 lines:\n", 1)[1].splitlines()
        assert len(shown) == 2 and all(re.match(r"\s*class \d+ ", ln) for ln in shown), p.stdout
    finally:
        bd.close()

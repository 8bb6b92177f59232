"""Our CLI verbs print our lines and nothing else: a real `tl2k210 convert`, `tl2k210 zoo build`
and `tl2k210 demo` in subprocesses. TensorFlow's start-up chatter (absl, oneDNN, cpu_feature_guard),
TF Lite's XNNPACK note, onnxruntime's warnings and the Python warnings of TF/tf2onnx/TensorLayer
are kept off (tl2k210/quiet.py) unless --verbose."""
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import cli_env, data_path
from tl2k210 import quiet

PROGRESS = re.compile(r"^\[[1-6]/6\] ")
# what TensorFlow, absl, oneDNN and Python's warnings print when they are let through
NOISE = re.compile(r"absl|cpu_feature_guard|oneDNN|TF_ENABLE|tensorflow|XNNPACK|^[IWE]\d{4} |Warning|"
                   r"WARNING|Starting new session", re.I)


def _cli(cwd, *args):
    """`tl2k210 ARGS...` in a subprocess, run in `cwd` as a user would."""
    return subprocess.run([sys.executable, "-m", "tl2k210.cli", *args], cwd=cwd, env=cli_env(),
                          capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def iris(tmp_path_factory):
    pytest.importorskip("tensorflow")
    d = tmp_path_factory.mktemp("iris")
    np.save(d / "x.npy", np.random.default_rng(0).random((16, 4)).astype(np.float32) * 6)
    return d, data_path("tflite", "iris.tflite")


def test_convert_stderr_is_only_our_progress(iris):
    d, src = iris
    p = _cli(d, "convert", str(src), "iris.kmodel", "--dataset", "x.npy", "--float-fc")
    lines = p.stderr.splitlines()
    assert p.returncode == 0, p.stderr
    assert [ln for ln in lines if not PROGRESS.match(ln)] == [], p.stderr
    assert len(lines) == 6 and lines[-1] == "[6/6] writing iris.kmodel and iris.kmodel.json"
    assert "file iris.kmodel: " in p.stdout and (d / "iris.kmodel.json").is_file()
    # an error after TensorFlow did its work is still shown (and nothing else)
    np.save(d / "five.npy", np.zeros((4, 5), np.float32))       # iris takes 4 features
    p = _cli(d, "convert", str(src), "bad.kmodel", "--dataset", "five.npy")
    extra = [ln for ln in p.stderr.splitlines() if not PROGRESS.match(ln)]
    assert p.returncode == 2 and len(extra) == 1, p.stderr
    assert extra[0].startswith("tl2k210 convert: error: dataset five.npy: samples of shape (5,)"), p.stderr
    assert p.stderr.startswith("[1/6] loading ")


@pytest.mark.slow
def test_verbose_lets_tensorflow_talk(iris):
    d, src = iris
    p = _cli(d, "convert", str(src), "v.kmodel", "--dataset", "x.npy", "--float-fc", "--verbose")
    assert p.returncode == 0, p.stderr
    talk = [ln for ln in p.stderr.splitlines() if not PROGRESS.match(ln)]
    assert any("cpu_feature_guard" in ln for ln in talk) and all(NOISE.search(ln) for ln in talk[:3]), talk


@pytest.mark.slow
def test_tensorlayer_convert_is_quiet_too(tmp_path):
    """The TensorLayer path (the zoo's, `make demo`'s): TF is imported by TensorLayer."""
    pytest.importorskip("tensorlayer")
    (tmp_path / "net.py").write_text(
        "def build():\n"
        "    from tensorlayer.layers import Conv2d, Input\n"
        "    from tensorlayer.models import Model\n"
        "    x = Input((1, 16, 16, 3))\n"
        "    y = Conv2d(4, (3, 3), act='relu', in_channels=3)(x)\n"
        "    return Model(x, y)\n")
    import importlib.util
    spec = importlib.util.spec_from_file_location("tl_quiet_net", tmp_path / "net.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    net = mod.build()
    np.savez(tmp_path / "w.npz", params=np.array([w.numpy() for w in net.all_weights], dtype=object))
    (tmp_path / "calib").mkdir()
    from PIL import Image
    rng = np.random.default_rng(1)
    for i in range(8):      # (fewer: a note that calibration on so few is not a measure)
        Image.fromarray((rng.random((16, 16, 3)) * 255).astype(np.uint8)).save(tmp_path / "calib" / f"{i}.png")
    p = _cli(tmp_path, "convert", "w.npz", "net.kmodel", "--network", "net.py", "--dataset", "calib")
    assert p.returncode == 0, p.stderr
    ours = [ln for ln in p.stderr.splitlines() if not PROGRESS.match(ln)]     # and the stages' notes:
    assert ours == ["      input range 0,1: a float model's default (the pixels / 255); for a model trained on "
                    "other input give --input-range (0,255: the pixels as they are), --mean/--std and --bgr as "
                    "it was"], p.stderr


@pytest.mark.parametrize("name", ["face_detect", "face_recognition", "mobilenet_v1", "style_transfer"])
def test_zoo_build_prints_only_our_lines(zoo_build, name):
    """`tl2k210 zoo build` (the TensorLayer conversion `make demo` starts with), run by the
    zoo_build fixture as a real subprocess: stderr is our six progress lines, stdout the receipt
    table and the 'wrote' line, nothing else."""
    built = zoo_build(name)
    err = built["stderr"].splitlines()
    assert [ln for ln in err if not PROGRESS.match(ln)] == [] and len(err) == 6, built["stderr"]
    table = Path(built["kmodel"]).with_suffix(".report.txt").read_text()
    assert built["stdout"].startswith(table + "\n"), built["stdout"]
    rest = built["stdout"][len(table) + 1:].splitlines()
    assert rest[0] == "" and rest[1].startswith(f"wrote {built['kmodel']}, ") and len(rest) == 2, rest
    assert not [ln for ln in table.splitlines() if NOISE.search(ln)]


def test_demo_prints_only_our_lines(zoo_build, tmp_path):
    """`tl2k210 demo face-detect` on the zoo build (what `make demo` runs after the build above),
    in a subprocess: stderr is empty, stdout is the host's [host] lines and what the unchanged
    firmware script prints."""
    skdata = pytest.importorskip("skimage.data")
    from PIL import Image
    Image.fromarray(skdata.astronaut()).save(tmp_path / "astronaut.png")
    p = _cli(tmp_path, "demo", "face-detect", "--image", "astronaut.png",
             "--kfpkg", zoo_build("face_detect")["kfpkg"], "--out", "lcd.png")
    assert p.returncode == 0 and p.stderr == "", p.stderr
    script = [ln for ln in p.stdout.splitlines() if not ln.startswith("[host] ")]
    # sensor.reset()'s probe lines (sensor.c v0.6.2), then the script's own two
    assert script[:3] == ["init i2c2", "[MAIXPY]: find ov2640", "[MAIXPY]: find ov sensor"], p.stdout
    script = script[3:]
    assert len(script) == 2 and re.fullmatch(r"face x=\d+ y=\d+ w=\d+ h=\d+ value=[01]\.\d{3}", script[0]) \
        and script[1] == "faces: 1", p.stdout
    assert "[host] model: face_detect.kmodel (yolo2, 320x240 input" in p.stdout and (tmp_path / "lcd.png").is_file()


def test_native_stderr_filter_keeps_what_is_not_noise(capfd, monkeypatch):
    import os
    monkeypatch.setitem(quiet._state, "verbose", False)
    with quiet.native_stderr():
        os.write(2, b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n")
        os.write(2, b"I0000 00:00:1796107782.887281   26080 port.cc:153] oneDNN custom operations are on.\n")
        os.write(2, b"E0000 00:00:1796107782.887281   26080 foo.cc:1] a real error\n")
        os.write(2, b"Segmentation fault (core dumped)\n")
    err = capfd.readouterr().err
    assert err == ("E0000 00:00:1796107782.887281   26080 foo.cc:1] a real error\n"
                   "Segmentation fault (core dumped)\n")

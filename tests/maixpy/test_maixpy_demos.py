"""The firmware/ MaixPy scripts run unchanged on the host (tl2k210.maixpy): real photos through
the emulated camera, models read from an emulated flash image, LCD frames as PNGs."""
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from conftest import FACE_ANCHORS, REPO, data_path
from tl2k210.maixpy import board, run_script
from test_maixpy_runtime import PROBE

FIRMWARE = REPO / "firmware"
ADDR = 0x300000
RED = (255, 0, 0)


def _iou(a, b):
    iw = max(0.0, min(a[0] + a[2], b[0] + b[2]) - max(a[0], b[0]))
    ih = max(0.0, min(a[1] + a[3], b[1] + b[3]) - max(a[1], b[1]))
    inter = iw * ih
    return inter / (a[2] * a[3] + b[2] * b[3] - inter)


def _faces(stdout):
    """[(x, y, w, h, value)] from the face script's "face x=.. y=.. w=.. h=.. value=.." lines."""
    out = []
    for line in stdout.splitlines():
        if line.startswith("face x="):
            kv = dict(item.split("=") for item in line.split()[1:])
            out.append(tuple(int(kv[k]) for k in "xywh") + (float(kv["value"]),))
    return out


@pytest.fixture(scope="module")
def skdata():
    return pytest.importorskip("skimage.data")


@pytest.fixture(scope="module")
def face_flash(tmp_path_factory):
    """A 16 MiB erased flash image with the testdata face detector written at 0x300000."""
    km = data_path("kmodels", "facedetect_320x240_v3.kmodel")
    return board.flash_kmodel(km, tmp_path_factory.mktemp("flash") / "flash.bin", ADDR)


@pytest.fixture(scope="module")
def astronaut_png(skdata, tmp_path_factory):
    p = tmp_path_factory.mktemp("photos") / "astronaut.png"
    Image.fromarray(skdata.astronaut()).save(p)
    return p


def test_face_demo_finds_the_astronaut(face_flash, astronaut_png, tmp_path):
    out = tmp_path / "lcd.png"
    res = run_script(FIRMWARE / "face_detect.py", images=[astronaut_png], flash=face_flash, out=out)
    assert res.snapshots == 1 and "faces: 1" in res.lines
    (x, y, w, h, value), = _faces(res.stdout)
    face = (180 * 320 / 512, 68 * 240 / 512, 92 * 320 / 512, 112 * 240 / 512)
    assert _iou((x, y, w, h), face) >= 0.5 and value > 0.5
    # the LCD frame: a 320x240 PNG with the red rectangle (thickness 2) where the face is
    assert res.pngs == [out] and out.is_file()
    lcd = np.asarray(Image.open(out).convert("RGB"))
    assert lcd.shape == (240, 320, 3)
    red = np.all(lcd == RED, axis=-1)
    assert red[y + 1:y + h - 1, x].all() and red[y + 1:y + h - 1, x + w - 1].all()   # sides
    assert red[y + h - 1, x:x + w].all()                                             # bottom
    assert red[y + 3:y + h - 3, x + 3:x + w - 3].mean() < 0.05     # the face itself is not painted
    assert "KPU" not in sys.modules and "sensor" not in sys.modules  # nothing leaked


def test_face_demo_boxes_equal_the_emulator_pipeline(face_flash, astronaut_png):
    """The host camera path (resize, RGB565, AI buffer) + run_yolo2 == emulator + yolo.decode
    on imaging.to_model_input(rgb565=True), i.e. what `tl2k210 run` computes."""
    from tl2k210 import imaging
    from tl2k210.k210 import yolo
    from tl2k210.k210.emulator import Emulator
    res = run_script(FIRMWARE / "face_detect.py", images=[astronaut_png], flash=face_flash)
    emu = Emulator.load(data_path("kmodels", "facedetect_320x240_v3.kmodel"))
    x = imaging.to_model_input(imaging.load_rgb(astronaut_png), (3, 240, 320), rgb565=True)
    boxes = yolo.decode(emu.run(x)[0], FACE_ANCHORS, 20, 15, 320, 240, 0.5, 0.3)
    assert [f[:4] for f in _faces(res.stdout)] == [(int(b.x), int(b.y), int(b.w), int(b.h))
                                                   for b in boxes]


def test_face_demo_no_face_in_face_free_photos(face_flash, skdata, tmp_path):
    sklearn_datasets = pytest.importorskip("sklearn.datasets")
    samples = sklearn_datasets.load_sample_images()
    china = next(i for f, i in zip(samples.filenames, samples.images) if f.endswith("china.jpg"))
    photos = [Image.fromarray(skdata.coffee()), Image.fromarray(skdata.rocket()), Image.fromarray(china)]
    res = run_script(FIRMWARE / "face_detect.py", images=photos, flash=face_flash, out=tmp_path)
    assert res.snapshots == 3
    assert _faces(res.stdout) == [] and res.lines.count("faces: 0") == 3
    assert [p.name for p in res.pngs] == ["frame_0000.png", "frame_0001.png", "frame_0002.png"]
    for frame in res.frames:   # no rectangle drawn anywhere
        assert not np.all(frame == RED, axis=-1).any()


def test_face_demo_from_the_real_kfpkg_via_cli(astronaut_png, tmp_path, capsys):
    """`tl2k210 demo face-detect` with MaixPy's own face_model_at_0x300000.kfpkg."""
    from tl2k210.cli import main
    pkg = data_path("kfpkg", "face_model_at_0x300000.kfpkg")
    out = tmp_path / "cli.png"
    rc = main(["demo", "face-detect", "--image", str(astronaut_png), "--kfpkg", str(pkg),
               "--out", str(out)])
    text = capsys.readouterr().out
    assert rc == 0 and out.is_file() and str(out) in text
    (x, y, w, h, _), = _faces(text)
    assert _iou((x, y, w, h), (112.5, 31.9, 57.5, 52.5)) >= 0.5


# ---------------------------------------------------------------------------------------------
@pytest.fixture
def mobilenet_pkg(zoo_build):
    data_path("weights", "mobilenetv1_0.25_tensorlayer.npz")
    built = zoo_build("mobilenet_v1")
    out = Path(built["kfpkg"]).parent
    assert (out / "mobilenet_v1_main.py").read_text() == (FIRMWARE / "mobilenet_v1.py").read_text()
    return Path(built["kfpkg"])


def test_mobilenet_demo_tiger(mobilenet_pkg, tmp_path):
    sd = tmp_path / "sd"
    sd.mkdir()
    (sd / "labels.txt").write_bytes(data_path("imagenet", "labels.txt").read_bytes())
    flash = board.flash_kfpkg(mobilenet_pkg, tmp_path / "flash.bin")
    res = run_script(FIRMWARE / "mobilenet_v1.py", images=[data_path("imagenet", "tiger.jpg")],
                     flash=flash, sd=sd, out=tmp_path / "lcd.png")
    i = res.lines.index("top-5:")
    top5 = res.lines[i + 1:i + 6]
    assert any("tiger, Panthera tigris" in t for t in top5), top5
    prob, idx = top5[0].split()[:2]
    assert idx == "292" and float(prob) > 0.3, top5
    lcd = np.asarray(Image.open(tmp_path / "lcd.png").convert("RGB"))
    # sensor.set_windowing((224, 224)): lcd.display centres the 224x224 frame, black border
    assert lcd.shape == (240, 320, 3)
    assert not lcd[:8].any() and not lcd[232:].any() and not lcd[:, :48].any() and not lcd[:, 272:].any()
    assert np.all(lcd[8:48, 48:272] == RED, axis=-1).sum() > 50     # the label drawn in red
    assert any(t.startswith("0.") and "tiger" in t for _, _, t in res.texts[0])


# ---------------------------------------------------------------------------------------------
def _script(tmp_path, body):
    p = tmp_path / "main.py"
    p.write_text("import sensor, image, lcd\nimport KPU as kpu\nsensor.reset()\n"
                 "sensor.set_pixformat(sensor.RGB565)\nsensor.set_framesize(sensor.QVGA)\n" + body)
    return p


def test_load_from_erased_flash_fails_like_maixpy(tmp_path, astronaut_png):
    from tl2k210.flash.emulated_board import new_flash_file
    empty = new_flash_file(tmp_path / "empty.bin")
    with pytest.raises(ValueError) as ei:
        run_script(FIRMWARE / "face_detect.py", images=[astronaut_png], flash=empty)
    assert str(ei.value) == ("[MAIXPY]kpu: load error:2002, "
                             "ERR_KMODEL_VERSION: only support kmodel V3/V4 now")
    res = run_script(FIRMWARE / "face_detect.py", images=[astronaut_png], flash=empty,
                     raise_errors=False)
    assert 'face_detect.py", line' in res.traceback and "load error:2002" in res.traceback
    assert res.snapshots == 0 and any("0x300000" in n for n in res.notes)


def test_kpu_argument_errors(tmp_path, face_flash):
    """kpu.load's argument rules and error texts (docs/maixpy-firmware.md#kpuload, #error-codes, #yolov2)."""
    from tl2k210.maixpy import KPU
    prev = board.install(board.Board(flash=face_flash))
    try:
        with pytest.raises(ValueError, match=r"^\[MAIXPY\]kpu: model_addr must > 0 $"):
            KPU.load(0)
        with pytest.raises(ValueError, match=r"model format don't match, only supply .kmodel $"):
            KPU.load("/sd/face.bin")
        with pytest.raises(TypeError, match="only accept int or string"):
            KPU.load(1.5)
        with pytest.raises(ValueError, match=r"load error:2001, ERR_PARAM"):   # no such file
            KPU.load("/flash/missing.kmodel")
        board.current().vfs.mounts["flash"].host.joinpath("v5.kmodel").write_bytes(
            b"KMDL"[::-1] + (5).to_bytes(4, "little") + bytes(64))
        with pytest.raises(ValueError, match=r"load error:2015, ERR_UNKNOWN"):   # issue #423
            KPU.load("/flash/v5.kmodel")
        task = KPU.load(ADDR)
        assert task.model_addr() == ADDR and task.model_size() == 388776
        assert repr(task).startswith('{"model_addr": 3145728, "model_size": 388776, "model_path": "(null)"')
        with pytest.raises(ValueError, match="^requested length 10 but object has length 8$"):
            KPU.init_yolo2(task, 0.5, 0.3, 5, FACE_ANCHORS[:8])
        with pytest.raises(ValueError, match="threshold only support 0 to 1"):
            KPU.init_yolo2(task, 1.5, 0.3, 5, FACE_ANCHORS)
        with pytest.raises(TypeError, match="function missing 1 required positional arguments"):
            KPU.init_yolo2(task, 0.5, 0.3, 5, anchor=FACE_ANCHORS)      # min 5 positionals
        with pytest.raises(TypeError, match="extra keyword arguments given"):
            KPU.init_yolo2(task, 0.5, 0.3, 5, FACE_ANCHORS, anchor_num=5)
        with pytest.raises(TypeError, match="kpu_net type error"):
            KPU.init_yolo2(None, 0.5, 0.3, 5, FACE_ANCHORS)
        tasks = [task] + [KPU.load(ADDR) for _ in range(3)]      # 4 x 0.43 MB fit in 2 MiB
        with pytest.raises(ValueError, match=r"load error:2006, ERR_NO_MEM"):   # a 5th does not
            KPU.load(ADDR)
        assert any("model 0.39 MB + KPU buffers 0.04 MB" in n for n in board.current().notes)
        for t in tasks:
            assert KPU.deinit(t) is True
        assert board.current().sys_used == 0
        board.current().vfs.mounts["flash"].host.joinpath("mnist.kmodel").write_bytes(
            data_path("kmodels", "mnist_v3.kmodel").read_bytes())
        tasks = [KPU.load("/flash/mnist.kmodel") for _ in range(5)]
        with pytest.raises(ValueError, match=r"load error:2009, ERR_MODELS_FULL"):
            KPU.load("/flash/mnist.kmodel")
        for t in tasks:
            KPU.deinit(t)
    finally:
        board.install(prev).close()


@pytest.mark.parametrize("setup, printed", [
    ("sensor.set_framesize(sensor.QQVGA)", "[MAIXPY]kpu: img w=160,h=120, but model w=320,h=240"),
    ("sensor.set_windowing((320, 200))", "[MAIXPY]kpu: img w=320,h=200, but model w=320,h=240"),
    ("sensor.set_pixformat(sensor.GRAYSCALE)", None),
])
def test_forward_checks_the_image_like_maixpy(tmp_path, face_flash, astronaut_png, setup, printed):
    p = _script(tmp_path, f"{setup}\ntask = kpu.load(0x300000)\nkpu.forward(task, sensor.snapshot())\n")
    res = run_script(p, images=[astronaut_png], flash=face_flash, raise_errors=False)
    assert str(res.error) == "[MAIXPY]kpu: check img format err!\r\n"
    assert res.lines == PROBE + ([printed] if printed else [])
    assert res.traceback.endswith("ValueError: [MAIXPY]kpu: check img format err!\r\n\n")


def test_run_yolo2_none_forward_fmap_and_pix_to_ai(tmp_path, face_flash, skdata, astronaut_png):
    p = _script(tmp_path, """
task = kpu.load(0x300000)
kpu.init_yolo2(task, 0.5, 0.3, 5, (1.889, 2.5245, 2.9465, 3.94056, 3.99987, 5.3658, 5.155437, 6.92275, 6.718375, 9.01025))
img = sensor.snapshot()
print("yolo", kpu.run_yolo2(task, img))
fm = kpu.forward(task, img)
print("fmap", fm.size(), fm.w(), fm.h(), fm.ch(), type(fm[:]).__name__, len(fm[:]), fm[0] == fm[:][0])
small = img.resize(160, 120).resize(320, 240)
try:
    kpu.forward(task, small)
except ValueError as e:
    print("no ai buffer")
small.pix_to_ai()
print("after pix_to_ai", kpu.forward(task, small).size())
print("faces", len(kpu.run_yolo2(task, sensor.snapshot())))
kpu.deinit(task)
""")
    res = run_script(p, images=[Image.fromarray(skdata.coffee()), astronaut_png], flash=face_flash)
    # a v3 model ending in DEQUANTIZE: typecode 'f', h = ch = 1 and w = the BYTE count
    # (docs/maixpy-firmware.md#forward-and-feature-maps)
    assert res.lines == PROBE + ["yolo None", "fmap 36000 36000 1 1 tuple 9000 True",
                         "[MAIXPY]kpu: pix_ai is NULL!", "no ai buffer",
                         "after pix_to_ai 36000", "faces 1"]

"""Zoo: the style-transfer network (models/style_transfer) built from its recipe: every conv on the
KPU, only the residual Adds / nearest upsamplings / output dequantize on the CPU; kmodel (bit-exact
emulator) vs float PSNR/SSIM on the held-out photos; the output is stylised (far from the
content); the unchanged MaixPy script (firmware/style_transfer.py) on the host shows exactly the
emulator's image. Numbers measured with the committed weights are in models/style_transfer/README.md."""
import sys

import numpy as np
import pytest

from conftest import REPO

pytest.importorskip("tensorflow")
pytest.importorskip("tensorlayer")
pytest.importorskip("skimage")
pytest.importorskip("sklearn")

sys.path.insert(0, str(REPO))
from models.style_transfer import evaluate as ev  # noqa: E402

# measured on the committed weights (README): PSNR min/mean 35.6/36.1 dB, SSIM min/mean 0.987/0.989,
# mean abs difference stylised vs content 0.19..0.24 (float), 0.20..0.24 (kmodel)
PSNR_FLOOR = 33.0
SSIM_FLOOR = 0.97
MAD_FLOOR = 0.15


@pytest.fixture(scope="module")
def built(zoo_build):
    return zoo_build("style_transfer")


@pytest.fixture(scope="module")
def report(built, tmp_path_factory):
    return ev.evaluate(built["kmodel"], tmp_path_factory.mktemp("style_eval"))


def test_convs_on_kpu_adds_and_upsamplings_on_cpu(built):
    r = built["receipt"]
    layers = r["layers"]
    convs = [x for x in layers if x["op"] == "Conv"]
    assert len(convs) == 12 and all(x["unit"] == "KPU" for x in convs)
    cpu = [x for x in layers if x["unit"] == "CPU"]
    assert [x["op"] for x in cpu] == ["Add"] * 3 + ["Resize"] * 2 + ["output"]
    assert sorted({k for x in cpu for k in x["kmodel_layers"]}) == [
        "DEQUANTIZE", "QUANTIZED_ADD", "QUANTIZED_RESIZE_NEAREST_NEIGHBOR"]
    # the CPU share stays small: adds + resizes + dequantize < 20% of the estimated cycles
    assert sum(x["cycles"] for x in cpu) < 0.2 * r["totals"]["cycles"]
    assert r["peak_kpu_ram"] <= 2 * 1024 * 1024 and r["file_size"] < 200_000
    assert r["latency_ms"] < 40


def test_kmodel_matches_float(report):
    for name, p in report["photos"].items():
        assert p["psnr_db"] >= PSNR_FLOOR, (name, p)
        assert p["ssim"] >= SSIM_FLOOR, (name, p)


def test_output_is_stylised(report):
    for name, p in report["photos"].items():
        assert p["float_vs_content_mad"] >= MAD_FLOOR, (name, p)
        assert p["kmodel_vs_content_mad"] >= MAD_FLOOR, (name, p)


def test_maixpy_script_shows_the_emulator_output(built, tmp_path):
    from PIL import Image
    from skimage import data

    from tl2k210.imaging import load_rgb
    from tl2k210.k210.emulator import Emulator
    from tl2k210.maixpy import board, run_script
    from tl2k210.maixpy import image as mimage
    photo = tmp_path / "chelsea.png"
    Image.fromarray(data.chelsea()).save(photo)
    flash = board.flash_kfpkg(built["kfpkg"], tmp_path / "flash.bin")
    res = run_script(REPO / "firmware" / "style_transfer.py", images=[photo], flash=flash,
                     out=tmp_path / "lcd.png")
    assert res.snapshots == 1 and len(res.frames) == 1 and res.pngs == [tmp_path / "lcd.png"]
    screen = np.asarray(Image.open(tmp_path / "lcd.png").convert("RGB"))
    assert screen.shape == (240, 320, 3)             # lcd.display centres the 128x128 image
    shown = screen[56:184, 96:224]
    assert not screen[:56].any() and not screen[184:].any() and not screen[:, :96].any()
    # what the script feeds the KPU: QVGA frame, 240x240 window (top-left on the OV2640: the
    # DVP ignores the window's x, y), resized to 128x128
    qvga = np.asarray(load_rgb(photo).resize((320, 240), Image.BILINEAR).convert("RGB"), np.uint8)
    small = mimage.Image._from_rgb(qvga[:, :240]).resize(128, 128)
    small.pix_to_ai()
    out = Emulator.load(built["kmodel"]).run(small._ai_buffer())[0].reshape(3, 128, 128)
    rgb = (np.clip(out.astype(np.float64), 0, 1) * 255 + 0.5).astype(np.int64).transpose(1, 2, 0)
    # set_pixel((r, g, b)) rounds to RGB565 (docs/maixpy-firmware.md#colours: round(v*31/255), round(v*63/255))
    r5, g6, b5 = ((rgb[..., 0] * 31 + 127) // 255, (rgb[..., 1] * 63 + 127) // 255,
                  (rgb[..., 2] * 31 + 127) // 255)
    want = np.stack([(r5 * 255 + 15) // 31, (g6 * 255 + 31) // 63, (b5 * 255 + 15) // 31], -1)
    assert np.abs(shown.astype(int) - want.astype(int)).max() <= 8
    assert np.mean(shown == want) >= 0.999

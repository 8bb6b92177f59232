"""Zoo: the face detector (models/face_detect) built from its recipe and checked on the bit-exact
KPU emulator against the numbers in models/face_detect/results.json (written by
`python -m models.face_detect.evaluate`, shown in its README) on the real-face evaluation sets of
../shared/testdata/faces (skipped when absent): AP@0.5 / recall at 1 FP per image on CMU+MIT
frontal and the WIDER subset, false positives per image on the face-free scenes, and the
unchanged firmware script finding the faces of a real photo on the host MaixPy.

The emulator is bit-exact and the decode deterministic, so the kmodel numbers are reproduced
exactly; TOL only absorbs the 4-decimal rounding of results.json."""
import json
import sys

import numpy as np
import pytest

from conftest import REPO

pytest.importorskip("tensorflow")
pytest.importorskip("tensorlayer")

sys.path.insert(0, str(REPO))
from models.face_detect import data  # noqa: E402
from models.face_detect import evaluate as ev  # noqa: E402

TOL = 0.001
DEMO_BOXES = 2      # measured: the two faces, nothing else
RESULTS = json.loads((REPO / "models" / "face_detect" / "results.json").read_text())


@pytest.fixture(scope="module")
def built(zoo_build):
    return zoo_build("face_detect")


@pytest.fixture(scope="module")
def faces():
    d = data.faces_dir()
    if d is None or not (d / "cmu_mit_frontal").is_dir():
        pytest.skip("../shared/testdata/faces is absent (set TL2K210_TESTDATA)")
    return d


def test_every_conv_runs_on_the_kpu(built):
    layers = built["receipt"]["layers"]
    assert [r["unit"] for r in layers[:-1]] == ["KPU"] * 7
    assert layers[-1]["unit"] == "CPU" and "dequantize" in " ".join(layers[-1].get("notes", []))
    assert built["receipt"]["peak_kpu_ram"] <= 2 * 1024 * 1024


def test_receipt_matches_results(built):
    z = RESULTS["zoo_kmodel"]
    assert built["receipt"]["file_size"] == z["file_size"]
    assert round(built["receipt"]["latency_ms"], 2) == z["latency_ms"]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["cmu_mit_frontal", "wider_val_subset200", "nonface_scenes"])
def test_kmodel_on_real_faces_reproduces_results(built, faces, name):
    items = data.EVAL_SETS[name](faces)
    got = ev.detection_metrics(ev.kmodel_outputs(built["kmodel"], [i[1] for i in items]),
                               [i[2] for i in items], [i[3] for i in items], ev.ANCHORS)
    want = RESULTS["sets"][name]["zoo_kmodel"]
    assert got["images"] == want["images"] and got["faces"] == want["faces"]
    for key in ("ap50", "recall_at_1fp_per_image", "recall_at_0_5", "fp_per_image_at_0.5"):
        if key in want:
            assert abs(got[key] - want[key]) <= TOL, (key, got, want)


def test_anchors_are_one_fact():
    """recipe.toml [decode] anchors: the network's (training, evaluation), the kmodel's metadata and
    the board script the build writes; firmware/face_detect.py holds MaixPy's face model's."""
    from models.face_detect import network
    from tl2k210 import zoo
    r = zoo.get("face_detect")
    assert network.ANCHORS == r.decode["anchors"] == zoo._metadata(r)["anchors"] != network.MAIXPY_ANCHORS
    assert zoo.detector_anchors(zoo.get("face_recognition")) == network.ANCHORS
    script = (REPO / "firmware" / "face_detect.py").read_text()
    assert f"anchor = {tuple(network.MAIXPY_ANCHORS)}" in script
    rendered = zoo.render_script(script, network.ANCHORS)
    assert f"anchor = {tuple(network.ANCHORS)}\n" in rendered and str(network.MAIXPY_ANCHORS[0]) not in rendered
    with pytest.raises(zoo.Tl2k210Error, match="0 lines `anchor = "):
        zoo.render_script("import KPU as kpu\n", network.ANCHORS)


def test_built_script_has_the_models_anchors(built):
    from pathlib import Path

    from tl2k210 import metadata
    main = Path(built["kmodel"]).with_name("face_detect_main.py").read_text()
    anchors = metadata.load_for(built["kmodel"]).anchors
    assert f"anchor = {tuple(anchors)}\n" in main and "kpu.init_yolo2(task, 0.5, 0.3, 5, anchor)" in main


def test_firmware_script_finds_both_faces_of_the_demo_photo(built, tmp_path):
    """The board script the build writes (firmware/face_detect.py with the model's anchors) on the
    host MaixPy, with the zoo's own .kfpkg flashed into an emulated board, on the README's demo
    picture (astronaut + Grace Hopper, public domain, one RGB565 camera frame): both
    hand-annotated faces boxed with IoU >= 0.5 and, as measured with the committed weights,
    DEMO_BOXES boxes in all."""
    from pathlib import Path

    from tl2k210.k210 import yolo
    from tl2k210.maixpy import board, run_script
    photo, faces = data.demo_photo()
    flash = board.flash_kfpkg(built["kfpkg"], tmp_path / "flash.bin")
    res = run_script(Path(built["kmodel"]).with_name("face_detect_main.py"), flash=flash, images=[photo])
    found = []
    for line in res.stdout.splitlines():  # "face x=.. y=.. w=.. h=.. value=.." lines, then "faces: N"
        if line.startswith("face x="):
            kv = dict(item.split("=") for item in line.split()[1:])
            found.append(tuple(float(kv[k]) for k in "xywh"))
    sx, sy = data.W / photo.width, data.H / photo.height
    for x, y, w, h in faces:
        box = (x * sx, y * sy, w * sx, h * sy)
        assert max(yolo.iou(f, box) for f in found) >= 0.5, (found, box)
    assert len(found) == DEMO_BOXES, found


def test_demo_cli_runs_the_script_with_the_models_anchors(built, tmp_path, capsys):
    """`tl2k210 demo face-detect --kfpkg` of the zoo package: firmware/face_detect.py (MaixPy's
    anchors) runs with the anchors of the package's metadata, so it boxes what the built
    face_detect_main.py boxes (test_firmware_script_finds_both_faces_of_the_demo_photo)."""
    from tl2k210.cli import main
    photo, _ = data.demo_photo()
    photo.save(tmp_path / "faces.png")
    rc = main(["demo", "face-detect", "--image", str(tmp_path / "faces.png"), "--kfpkg", built["kfpkg"],
               "--out", str(tmp_path / "lcd.png")])
    text = capsys.readouterr().out
    assert rc == 0 and "face_detect.py's `anchor = (...)` set to the detector's, from its metadata" in text
    assert text.count("face x=") == DEMO_BOXES and f"faces: {DEMO_BOXES}" in text


def test_train_torch_pack_feeds_the_same_sampler(tmp_path, monkeypatch):
    """train_torch's `pack` (the training sets small enough to send to a GPU machine): the longer
    side cut to PACK_SIDE, boxes scaled with it, WebP images that the sampler reads, and the
    background photos carried as uint8 arrays; make_batch gives one step's frames and targets."""
    from PIL import Image

    from models.face_detect import train_torch as tt
    src = tmp_path / "src"
    for sub in ("caltech_webfaces", "face_mask_kaggle"):
        (src / sub / "images").mkdir(parents=True)
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 255, (400, 640, 3), dtype=np.uint8)).save(src / "caltech_webfaces/images/a.jpg")
    Image.fromarray(rng.integers(0, 255, (200, 128, 4), dtype=np.uint8)).save(src / "face_mask_kaggle/images/m.png")
    (src / "caltech_webfaces/boxes_derived.txt").write_text("a.jpg 64.0 40.0 192.0 168.0\n")
    (src / "face_mask_kaggle/boxes.txt").write_text("m.png with_mask 10 20 50 60\nm.png without_mask 60 70 90 110\n")
    monkeypatch.setattr(data, "_read_rgb", data._read_rgb)        # use_pack patches these two
    monkeypatch.setattr(data, "_backgrounds", data._backgrounds)
    tt.pack(src, tmp_path / "pack")
    s = tt.PACK_SIDE / 640
    assert (tmp_path / "pack/caltech_webfaces/boxes_derived.txt").read_text() == \
        f"a.webp {64 * s:.1f} {40 * s:.1f} {192 * s:.1f} {168 * s:.1f}\n"
    assert (tmp_path / "pack/face_mask_kaggle/boxes.txt").read_text().splitlines()[1] == \
        "m.webp without_mask 60.0 70.0 90.0 110.0"          # smaller than PACK_SIDE: unscaled
    with Image.open(tmp_path / "pack/caltech_webfaces/images/a.webp") as im:
        assert im.format == "WEBP" and im.size == (256, 160)
    tt.use_pack(tmp_path / "pack")
    assert len(data._backgrounds()) == 22 and data._backgrounds()[0].dtype == np.float32
    step, imgs, mask, *_ = tt.make_batch((3, 4, str(tmp_path / "pack")))
    assert step == 3 and imgs.shape == (4, data.H, data.W, 3) and imgs.dtype == np.uint8
    assert mask.shape == (4, 15, 20, 5)
    assert tt.lr_at(0, 100, 1.0, 10) == 0.05 and tt.lr_at(10, 100, 1.0, 10) == 1.0
    assert abs(tt.lr_at(100, 100, 1.0, 10) - 0.01) < 1e-12
    assert tt.lr_at(50, 100, 1.0, 10, done=1.0) == tt.lr_at(100, 100, 1.0, 10)   # the time budget ends it

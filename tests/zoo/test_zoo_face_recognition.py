"""Zoo: the face embedder (models/face_recognition) built from its recipe and checked on the
bit-exact KPU emulator: KPU-only convs, face verification on held-out augmentations (ROC-AUC,
kmodel vs float), the host pipeline (detect -> crop -> embed -> cosine match) on real photos, and
firmware/face_recognition.py run unchanged on the host with a scripted BOOT-key press.
Numbers measured with the committed weights are in models/face_recognition/README.md."""
import sys

import numpy as np
import pytest
from PIL import Image

from conftest import REPO, data_path

pytest.importorskip("tensorflow")
pytest.importorskip("tensorlayer")
pytest.importorskip("skimage")
pytest.importorskip("sklearn")

sys.path.insert(0, str(REPO))
from models.face_recognition import data  # noqa: E402
from models.face_recognition import evaluate as ev  # noqa: E402
from models.face_recognition import recognize as rz  # noqa: E402
from tl2k210.maixpy import board, run_script  # noqa: E402

# measured on the committed weights (README): kmodel AUC seen 1.0000, unseen 0.9856 (float the same)
AUC_FLOOR = {"seen": 0.99, "unseen": 0.97}
AUC_MAX_DROP = 0.02
ENROLLED = ("astronaut", "grace_hopper")
VARIANTS = ("shifted", "brighter", "darker", "flipped", "rescaled", "noisy")


@pytest.fixture(scope="module")
def built(zoo_build):
    return zoo_build("face_recognition")


@pytest.fixture(scope="module")
def detector():
    return data_path("kmodels", "facedetect_320x240_v3.kmodel")


@pytest.fixture(scope="module")
def recognizer(built, detector):
    rec = rz.Recognizer(built["kmodel"], detector)
    photos = data.real_photos()
    for name in ENROLLED:
        rec.enroll(name, photos[name])
    return rec


def test_every_conv_runs_on_the_kpu(built):
    layers = built["receipt"]["layers"]
    cpu = [r["node"] for r in layers if r["unit"] == "CPU"]
    assert cpu == ["gap", "Identity:0"], cpu          # global mean pool + float output only
    assert sum(r["unit"] == "KPU" for r in layers) == 17
    assert built["receipt"]["peak_kpu_ram"] <= 128 * 1024
    assert built["receipt"]["file_size"] < 200_000
    assert built["flash_address"] == "0x400000"


def test_heldout_verification_kmodel_close_to_float(built):
    res = ev.evaluate(built["kmodel"])
    for name, v in res.items():
        f, k = v["float"], v["kmodel"]
        assert k["auc"] >= AUC_FLOOR[name], (name, f["auc"], k["auc"])
        assert k["auc"] >= f["auc"] - AUC_MAX_DROP, (name, f["auc"], k["auc"])
        assert v["cos_float_kmodel"] > 0.97, v["cos_float_kmodel"]


@pytest.mark.parametrize("name", ENROLLED)
def test_host_pipeline_recognises_enrolled_faces_in_other_frames(recognizer, name):
    photo = data.real_photos()[name]
    for kind, img in data.photo_variants(photo).items():
        matches, _ = recognizer.recognise(img)
        assert matches, f"{name}/{kind}: no face detected"
        best = max(matches, key=lambda m: m.score)
        assert best.name == name and best.score >= recognizer.threshold, (kind, [(m.name, m.score) for m in matches])
        assert all(m.name in (name, "unknown") for m in matches), (kind, [(m.name, m.score) for m in matches])


def test_host_pipeline_rejects_a_face_not_enrolled(recognizer):
    cam = data.real_photos()["camera"]
    for img in [cam] + list(data.photo_variants(cam).values())[:3]:
        matches, _ = recognizer.recognise(img)
        assert matches, "the cameraman's face is detected"
        assert all(m.name == "unknown" and m.score < recognizer.threshold for m in matches), \
            [(m.name, m.score) for m in matches]


def test_host_demo_writes_a_labelled_png(built, detector, tmp_path, capsys):
    photos = data.real_photos()
    paths = {}
    for name, img in photos.items():
        paths[name] = tmp_path / f"{name}.png"
        Image.fromarray(img).save(paths[name])
    flipped = tmp_path / "astronaut_flipped.png"
    Image.fromarray(data.photo_variants(photos["astronaut"])["flipped"]).save(flipped)
    out = tmp_path / "labelled.png"
    rc = rz.main(["--enroll", f"eileen={paths['astronaut']}", "--enroll", f"grace={paths['grace_hopper']}",
                  "--image", str(flipped), "--out", str(out), "--embedder", built["kmodel"],
                  "--detector", str(detector)])
    text = capsys.readouterr().out
    assert rc == 0 and "-> eileen" in text and out.is_file(), text
    png = np.asarray(Image.open(out).convert("RGB"))
    assert png.shape == (240, 320, 3) and np.all(png == (0, 255, 0), axis=-1).sum() > 100   # green box + label


def test_maixpy_script_enrolls_on_button_press_then_recognises(built, detector, tmp_path):
    flash = board.flash_kfpkg(built["kfpkg"], tmp_path / "flash.bin")     # embedder at 0x400000
    board.flash_kmodel(detector, flash, 0x300000, fresh=False)            # detector at 0x300000
    photos = data.real_photos()
    av, gv = data.photo_variants(photos["astronaut"]), data.photo_variants(photos["grace_hopper"])
    frames = [photos["astronaut"], photos["grace_hopper"], av["brighter"], gv["flipped"], photos["camera"]]
    res = run_script(REPO / "firmware" / "face_recognition.py", images=[Image.fromarray(f) for f in frames],
                     flash=flash, out=tmp_path / "lcd", button=[0, 1])
    assert res.snapshots == 5 and len(res.pngs) == 5
    per_frame, cur = [], []
    for line in res.lines:
        if line.startswith("face x="):
            cur.append(dict(kv.split("=") for kv in line.split()[1:]))
        elif line.startswith("faces: "):
            per_frame.append(cur)
            cur = []
    assert [line for line in res.lines if line.startswith("enrolled")] == ["enrolled person1", "enrolled person2"]
    assert [f["name"] for f in per_frame[0]] == ["person1"] and [f["name"] for f in per_frame[1]] == ["person2"]
    assert [f["name"] for f in per_frame[2]] == ["person1"] and float(per_frame[2][0]["score"]) >= 0.6
    assert [f["name"] for f in per_frame[3]] == ["person2"]
    assert per_frame[4] and all(f["name"] == "unknown" for f in per_frame[4])
    assert res.lines[-1] == "faces: 1 enrolled: 2"


def test_demo_cli_face_recognition(built, tmp_path, capsys):
    """`tl2k210 demo face-recognition --kfpkg ... --press 0`: the detector is added at 0x300000."""
    from tl2k210.cli import main
    photos = data.real_photos()
    a, b = tmp_path / "a.png", tmp_path / "b.png"
    Image.fromarray(photos["astronaut"]).save(a)
    Image.fromarray(data.photo_variants(photos["astronaut"])["noisy"]).save(b)
    rc = main(["demo", "face-recognition", "--image", str(a), "--image", str(b), "--press", "0",
               "--kfpkg", built["kfpkg"], "--out", str(tmp_path / "lcd")])
    text = capsys.readouterr().out
    assert rc == 0 and "enrolled person1" in text
    assert text.count("name=person1") == 2, text


def test_pipeline_with_part1_zoo_detector(built, zoo_build):
    """The board pipeline with part 1's own detector (models/face_detect) at 0x300000 instead of
    MaixPy's face model. Measured: astronaut recognised in all 7 frames, Grace Hopper in 5 of 7
    (the zoo detector misses her face in the shifted and rescaled frames), the cameraman is never
    detected (grayscale photo) so never named; no enrolled name goes to the other person."""
    det = zoo_build("face_detect")["kmodel"]
    rec = rz.Recognizer(built["kmodel"], det)
    photos = data.real_photos()
    for name in ENROLLED:
        rec.enroll(name, photos[name])
    found = {}
    for name in ENROLLED:
        frames = [photos[name]] + list(data.photo_variants(photos[name]).values())
        hits = 0
        for img in frames:
            matches, _ = rec.recognise(img)
            assert all(m.name in (name, "unknown") for m in matches), (name, [(m.name, m.score) for m in matches])
            hits += any(m.name == name for m in matches)
        found[name] = hits
    assert found["astronaut"] == 7 and found["grace_hopper"] >= 5, found

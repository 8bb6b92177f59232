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


def test_inspect_warns_when_an_op_writes_over_its_input(tmp_path, capsys):
    """A softmax whose output range starts inside its input (nncase's kernel then reads rows it
    already overwrote, docs/kmodel-format.md#v4-interpreter): inspect names the node and both ranges; nncase's own v4
    files and ours have none."""
    from tl2k210.k210 import kmodel
    from tl2k210.k210.kmodel import v4
    f = dict(input=(1, 0, 0, 16), output=(1, 0, 8, 16), inner_size=2, outer_size=2, beta=1.0)
    m = v4.KModelV4([v4.Node(v4.OPCODE_BY_NAME["softmax"].code, f, {})], [(1, 0, 0, 16)], [(1, 1, 2, 2)],
                    [(1, 0, 8, 16)], 24)
    path = tmp_path / "overlap.kmodel"
    kmodel.save(m, path)
    assert main(["inspect", str(path)]) == 0
    text = capsys.readouterr().out
    assert ("warning: node 0 (softmax): output [8, 24) overlaps input [0, 16) in main memory: nncase's kernel "
            "reads input it has already overwritten") in text
    assert main(["inspect", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["overlapping_io"] == [
        "node 0 (softmax): output [8, 24) overlaps input [0, 16) in main memory"]
    for name in ("yolo20_v4.kmodel", "maix_asr_v4.kmodel", "iris_v4.kmodel"):
        assert main(["inspect", str(data_path("kmodels", name))]) == 0
        assert "overlaps" not in capsys.readouterr().out


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


# ---- inspect PACKAGE.kfpkg -------------------------------------------------------------------
def _inspect(capsys, *argv):
    rc = main(["inspect", *map(str, argv)])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def _member(pkg, name):
    import zipfile
    with zipfile.ZipFile(pkg) as zf:
        return zf.read(name)


def test_inspect_lists_the_real_maixpy_face_kfpkg(tmp_path, capsys):
    """MaixPy_scripts' face_model_at_0x300000.kfpkg: one kmodel at 0x300000, described exactly
    as `inspect` describes that kmodel extracted to a file."""
    import hashlib
    pkg = data_path("kfpkg", "face_model_at_0x300000.kfpkg")
    data = _member(pkg, "facedetect.kmodel")
    rc, out, _ = _inspect(capsys, pkg)
    assert rc == 0
    row = next(ln for ln in out.splitlines() if ln.startswith("0  facedetect.kmodel"))
    assert row.split()[1:7] == ["facedetect.kmodel", "0x300000", f"0x{0x300000 + len(data):06x}",
                                "388,776", "no", hashlib.sha256(data).hexdigest()[:16]]
    assert row.endswith("kmodel v3, 8-bit weights, 24 layers (23 KPU conv, 1 CPU)")
    assert "warning" not in out and "peak KPU RAM" in out
    rc, js, _ = _inspect(capsys, pkg, "--json")
    info = json.loads(js)
    assert rc == 0 and info["format"] == "kfpkg" and info["file_size"] == pkg.stat().st_size
    [img] = info["images"]
    assert (img["name"], img["address"], img["size"], img["sha256Prefix"], img["kind"]) == \
        ("facedetect.kmodel", 0x300000, 388776, False, "kmodel")
    alone = tmp_path / "facedetect.kmodel"
    alone.write_bytes(data)
    rc, js, _ = _inspect(capsys, alone, "--json")
    plain = json.loads(js)
    assert img["kmodel"].pop("file") == f"{pkg}:facedetect.kmodel"
    plain.pop("file")
    assert img["kmodel"] == plain and plain["kpu_layers"] == 23


def _firmware_payload():
    return b"\x13\x00\x00\x00" * 64 + b"MicroPython v0.6.2 MaixPy\x00" + bytes(64)


def test_inspect_kfpkg_with_the_real_standalone_manifest(tmp_path, capsys):
    """The kendryte-standalone-demo manifest (firmware at 0 with sha256Prefix, kmodel at
    0xA00000 written as a hex literal) with a firmware and the face kmodel in it."""
    manifest = data_path("kfpkg", "standalone_demo_flash-list.json").read_bytes()
    face = data_path("kmodels", "facedetect_320x240_v3.kmodel").read_bytes()
    pkg = tmp_path / "demo.kfpkg"
    import zipfile
    with zipfile.ZipFile(pkg, "w") as z:
        z.writestr("flash-list.json", manifest)
        z.writestr("face_detect.bin", b"\x13\x00\x00\x00" * 1000)
        z.writestr("detect.kmodel", face)
    rc, out, _ = _inspect(capsys, pkg)
    assert rc == 0
    lines = out.splitlines()
    fw = next(ln for ln in lines if ln.startswith("0  face_detect.bin"))
    assert fw.split()[2:6] == ["0x000000", f"0x{4000 + 37:06x}", "4,000", "yes"]
    assert "firmware image (4,000-byte payload, bootable envelope added when flashed)" in fw
    assert "MaixPy" not in fw               # no MaixPy banner in that payload
    km = next(ln for ln in lines if ln.startswith("1  detect.kmodel"))
    assert km.split()[2] == "0xa00000" and "kmodel v3" in km
    assert "warning" not in out


def test_inspect_kfpkg_kinds_and_package_warnings(tmp_path, capsys):
    """Every kind of image and every warning `package` gives, from one package."""
    import zipfile

    from tl2k210.flash.layout import address_warnings
    from tl2k210.flash.kfpkg import read_kfpkg
    iris = data_path("kmodels", "iris_v3.kmodel").read_bytes()
    swapped = np.frombuffer(iris + bytes(-len(iris) % 4), "<u4").byteswap().tobytes()[:len(iris)]
    files = [(0, "maixpy.bin", True, _firmware_payload()),
             (0x100000, "low.kmodel", False, iris),
             (0x300000, "iris.kmodel", False, iris),
             (0x500800, "v4.kmodel", False, data_path("kmodels", "iris_v4.kmodel").read_bytes()),
             (0x600000, "iris_be.kmodel", False, swapped),
             (0x700000, "v5.kmodel", False, b"LDMK\x05\x00\x00\x00" + bytes(64)),
             (0xD00000, "spiffs.img", False, b"\xff" * 8192)]
    pkg = tmp_path / "all.kfpkg"
    with zipfile.ZipFile(pkg, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("flash-list.json", json.dumps({"version": "0.1.0", "files": [
            {"address": a, "bin": n, "sha256Prefix": e} for a, n, e, _ in files]}, indent=4))
        for _, n, _, d in files:
            z.writestr(n, d)
        z.writestr("readme.txt", "not flashed")
    rc, js, _ = _inspect(capsys, pkg, "--json")
    info = json.loads(js)
    assert rc == 0
    kinds = {r["name"]: (r["kind"], r["summary"]) for r in info["images"]}
    assert kinds["maixpy.bin"] == ("maixpy-firmware", "MaixPy firmware image (346-byte payload, "
                                   "bootable envelope added when flashed)")
    assert kinds["iris.kmodel"] == ("kmodel", "kmodel v3, 8-bit weights, 2 layers (0 KPU conv, 2 CPU)")
    assert kinds["iris_be.kmodel"] == ("kmodel", "kmodel v3, 8-bit weights, 2 layers (0 KPU conv, "
                                       "2 CPU) (32-bit word-swapped, for kpu.load_flash)")
    assert kinds["v4.kmodel"][1].startswith("kmodel v4, 8-bit weights")
    assert kinds["v5.kmodel"] == ("other-model", "kmodel v5 (nncase 1.x): only the Kendryte standalone "
                                  "SDK (develop since 2021-06) and CanMV load it")
    assert kinds["spiffs.img"][0] == "unknown"
    assert [r["name"] for r in info["images"] if r["kmodel"]] == ["low.kmodel", "iris.kmodel",
                                                                   "v4.kmodel", "iris_be.kmodel"]
    assert info["extras"] == ["readme.txt"]
    images = read_kfpkg(pkg)
    assert info["warnings"] == address_warnings(images)        # package's warnings, word for word
    assert {r["name"]: r["warnings"] for r in info["images"]} == \
        {i.name: address_warnings([i]) for i in images}
    warned = {r["name"] for r in info["images"] if r["warnings"]}
    assert warned == {"low.kmodel", "v4.kmodel", "spiffs.img"}
    rc, out, _ = _inspect(capsys, pkg)
    assert rc == 0
    for w in info["warnings"]:
        assert f"warning: {w}" in out
    assert "firmware region" in out and "SPIFFS" in out and "not 4 KiB aligned" in out
    assert "also in the package, not flashed: readme.txt" in out
    assert out.count("peak KPU RAM") == 4                   # one description per kmodel


def test_inspect_kfpkg_shows_the_metadata_it_carries(tmp_path, capsys):
    from dataclasses import asdict

    from tl2k210 import metadata
    km = tmp_path / "iris.kmodel"
    km.write_bytes(data_path("kmodels", "iris_v3.kmodel").read_bytes())
    meta = metadata.build(km.read_bytes(), km.name, task="classify",
                          labels=["setosa", "versicolor", "virginica"],
                          input={"layout": "N", "shape": [1, 4], "dtype": "float32"},
                          outputs=[{"name": "logits", "shape": [1, 3]}])
    metadata.path_for(km).write_text(meta.to_json())
    pkg = tmp_path / "iris.kfpkg"
    assert main(["package", "-o", str(pkg), f"{km}@0x300000"]) == 0
    capsys.readouterr()
    rc, js, _ = _inspect(capsys, pkg, "--json")
    info = json.loads(js)
    assert rc == 0 and info["extras"] == ["iris.kmodel.json"]
    assert info["images"][0]["kmodel"]["metadata"] == json.loads(json.dumps(asdict(meta)))
    rc, out, _ = _inspect(capsys, pkg)
    assert "metadata (carried in the package, sha256 matches)" in out
    assert "labels            setosa, versicolor, virginica" in out


def test_inspect_kfpkg_with_a_broken_kmodel_lists_then_fails(tmp_path, capsys):
    import zipfile
    pkg = tmp_path / "cut.kfpkg"
    face = data_path("kmodels", "facedetect_320x240_v3.kmodel").read_bytes()
    with zipfile.ZipFile(pkg, "w") as z:
        z.writestr("flash-list.json", json.dumps({"files": [
            {"address": 0x300000, "bin": "face.kmodel", "sha256Prefix": False}]}, indent=4))
        z.writestr("face.kmodel", face[:5000])
    rc, out, err = _inspect(capsys, pkg)
    assert rc == 2 and "Traceback" not in err
    assert "0  face.kmodel  0x300000" in out and "unreadable kmodel" in out
    assert f"{pkg}:face.kmodel (at 0x300000)" in err and "rebuild it" in err
    rc, js, err = _inspect(capsys, pkg, "--json")
    assert rc == 2 and json.loads(js)["errors"] and "face.kmodel" in err


def test_inspect_a_package_under_another_name(tmp_path, capsys):
    """A .kfpkg renamed .zip is still listed, with the warning that kflash would flash it raw."""
    pkg = tmp_path / "face.zip"
    pkg.write_bytes(data_path("kfpkg", "face_model_at_0x300000.kfpkg").read_bytes())
    rc, out, _ = _inspect(capsys, pkg)
    assert rc == 0 and "facedetect.kmodel" in out
    assert "kflash flashes a ZIP as a package only when its name ends in .kfpkg" in out


# ---- run on a batch ----------------------------------------------------------------------------
def _run_cli(capsys, *argv):
    rc = main(["run", *map(str, argv)])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def test_run_batch_iris_equals_item_by_item(tmp_path, capsys):
    """The iris data set (150, 4) through the (4,) iris kmodels: item i of the batch output is
    the output of item i run alone (bit for bit), and the classes are right."""
    from sklearn.datasets import load_iris

    from tl2k210.k210.emulator import Emulator
    iris = load_iris()
    x = iris.data.astype(np.float32)
    np.save(tmp_path / "iris.npy", x)
    for name in ("iris_v3.kmodel", "iris_v4.kmodel"):
        km = data_path("kmodels", name)
        rc, out, err = _run_cli(capsys, km, "-i", tmp_path / "iris.npy", "-o", tmp_path / "b.npy",
                                "--progress")
        assert rc == 0, err
        assert "batch: 150 items" in out and "output 0: float32 (150, 3)" in out
        assert "150/150 items" in err
        batch = np.load(tmp_path / "b.npy")
        emu = Emulator.load(km)
        alone = np.stack([emu.run(v)[0].reshape(-1) for v in x])
        assert batch.shape == (150, 3) and np.array_equal(batch.reshape(150, -1), alone)
        for i in (0, 77, 149):                      # and through the CLI, one input each
            np.save(tmp_path / "one.npy", x[i])
            assert _run_cli(capsys, km, "-i", tmp_path / "one.npy", "-o", tmp_path / "one_out.npy")[0] == 0
            assert np.array_equal(np.load(tmp_path / "one_out.npy").reshape(-1), batch[i].reshape(-1))
        accuracy = float((batch.reshape(150, -1).argmax(1) == iris.target).mean())
        assert accuracy >= 0.95, accuracy           # measured 0.987 (148/150) for both
        # a vector model's samples in another shape of their values, as convert --dataset takes
        # them (a Keras Conv1D's (N, 216, 1); hunt 17): the same batch
        np.save(tmp_path / "iris41.npy", x[:, :, None])
        assert _run_cli(capsys, km, "-i", tmp_path / "iris41.npy", "-o", tmp_path / "b41.npy")[0] == 0
        assert np.array_equal(np.load(tmp_path / "b41.npy"), batch)


def test_run_batch_image_model_chw_and_channels_last(tmp_path, capsys):
    """(N, 1, 28, 28) and (N, 28, 28, 1) batches into the MNIST kmodel: the same stacked
    outputs, each equal to its item run alone; .npz and .json hold every output per item."""
    rng = np.random.default_rng(1)
    chw = rng.integers(0, 256, (5, 1, 28, 28), dtype=np.uint8)
    np.save(tmp_path / "chw.npy", chw)
    np.save(tmp_path / "hwc.npy", np.ascontiguousarray(chw.transpose(0, 2, 3, 1)))
    km = data_path("kmodels", "mnist_v3.kmodel")
    results = {}
    for form in ("chw", "hwc"):
        rc, out, err = _run_cli(capsys, km, "-i", tmp_path / f"{form}.npy", "-o", tmp_path / f"{form}.npz")
        assert rc == 0 and "batch: 5 items of (1, 28, 28)" in out, err
        with np.load(tmp_path / f"{form}.npz") as z:
            results[form] = [z[k] for k in z.files]
    assert all(np.array_equal(a, b) for a, b in zip(results["chw"], results["hwc"]))
    assert results["chw"][0].shape[0] == 5
    for i in (0, 4):
        np.save(tmp_path / "one.npy", chw[i])
        np.save(tmp_path / "one_hwc.npy", chw[i].transpose(1, 2, 0))    # one input, channels-last
        for one in ("one.npy", "one_hwc.npy"):
            assert _run_cli(capsys, km, "-i", tmp_path / one, "-o", tmp_path / "one.npz")[0] == 0
            with np.load(tmp_path / "one.npz") as z:
                assert all(np.array_equal(z[k], r[i]) for k, r in zip(z.files, results["chw"]))
    assert _run_cli(capsys, km, "-i", tmp_path / "chw.npy", "-o", tmp_path / "r.json")[0] == 0
    res = json.loads((tmp_path / "r.json").read_text())
    assert res["batch"] == 5 and len(res["items"]) == 5
    assert np.array_equal(np.asarray(res["items"][3]["outputs"][0], results["chw"][0].dtype),
                          results["chw"][0][3])


def test_run_batch_decodes_every_image(tmp_path, capsys):
    """Two photos (N, H, W, 3) through the face detector with --decode yolo2: one box set per
    item, each the one the photo gets alone."""
    from skimage import data
    photos = np.stack([np.asarray(Image.fromarray(p).resize((320, 240)))
                       for p in (data.astronaut(), data.chelsea())])
    np.save(tmp_path / "two.npy", photos)
    km = data_path("kmodels", "facedetect_320x240_v3.kmodel")
    flags = ["--decode", "yolo2", "--anchors", ",".join(map(str, FACE_ANCHORS)), "--labels", "face"]
    rc, out, err = _run_cli(capsys, km, "-i", tmp_path / "two.npy", *flags, "-o", tmp_path / "b.json")
    assert rc == 0, err
    assert "item 0: 1 box(es)" in out and "item 1: 0 box(es)" in out
    batch = json.loads((tmp_path / "b.json").read_text())["items"]
    np.save(tmp_path / "one.npy", photos[0])
    assert _run_cli(capsys, km, "-i", tmp_path / "one.npy", *flags, "-o", tmp_path / "a.json")[0] == 0
    alone = json.loads((tmp_path / "a.json").read_text())
    assert batch[0] == alone and len(alone["boxes"]) == 1 and alone["boxes"][0]["value"] > 0.9


@pytest.mark.parametrize("name,shape,needles", [
    ("iris_v3.kmodel", (5, 3), ("(5, 3)", "the model takes (4,) float32", "(N, 4)")),
    ("iris_v4.kmodel", (5, 3), ("(1, 1, 1, 4)", "(N, 1, 1, 1, 4)", "(N, 4)")),
    ("mnist_v3.kmodel", (2, 3, 28, 28), ("(1, 28, 28)", "(N, 1, 28, 28) or (N, 28, 28, 1)")),
    ("iris_v3.kmodel", (0, 4), ("empty batch", "(0, 4)")),
])
def test_run_refuses_shapes_that_are_neither_one_input_nor_a_batch(name, shape, needles, tmp_path, capsys):
    np.save(tmp_path / "x.npy", np.zeros(shape, np.uint8 if "mnist" in name else np.float32))
    rc, out, err = _run_cli(capsys, data_path("kmodels", name), "-i", tmp_path / "x.npy")
    assert rc == 2 and "Traceback" not in err and "output 0" not in out
    for n in needles:
        assert n in err, err


def test_run_batch_memory_is_bounded(tmp_path, capsys, monkeypatch):
    """A batch header claiming 10^9 items is refused from the file size before any allocation;
    a batch whose stacked outputs would pass the array cap is refused before running."""
    import io
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": "<f4", "fortran_order": False,
                                               "shape": (10 ** 9, 4)})
    (tmp_path / "lie.npy").write_bytes(buf.getvalue() + bytes(160))
    km = data_path("kmodels", "iris_v3.kmodel")
    rc, _, err = _run_cli(capsys, km, "-i", tmp_path / "lie.npy")
    assert rc == 2 and "declares a (1000000000, 4) float32 array" in err
    np.save(tmp_path / "x.npy", np.zeros((150, 4), np.float32))
    from tl2k210 import arrays
    monkeypatch.setattr(arrays, "MAX_ARRAY_BYTES", 1000)
    rc, out, err = _run_cli(capsys, km, "-i", tmp_path / "x.npy")
    assert rc == 2 and "a batch of 150 inputs gives 1,800 bytes of outputs" in err
    assert "pass at most 83 inputs per file" in err and "output 0" not in out


def test_run_maps_float_features_by_the_models_input_range(tmp_path, capsys):
    """A keyword spotter's MFCCs (-46..15, hunt 11) converted with --input-range -50,20: `run`
    takes the same float arrays `convert --dataset` took, mapped to the kmodel's uint8 pixels by
    the range its metadata records (the same output as those pixels given as uint8); a few values
    outside that range are clipped with a warning, as convert --dataset clips them (hunt 19: `run`
    refused held-out MFCCs 1.4 % outside, which convert had taken), and many are refused naming it."""
    import onnx

    from front_helpers import make_model
    from lower_helpers import conv_node
    from tl2k210.compiler import ConvertOptions, convert
    rng = np.random.default_rng(4)
    m = make_model([conv_node("y", "x", "w", "b", pads=[1, 1, 1, 1])], [("x", [1, 1, 16, 16])], [("y", None)],
                   {"w": rng.normal(size=(4, 1, 3, 3)).astype(np.float32), "b": np.zeros(4, np.float32)})
    onnx.save(m, tmp_path / "kws.onnx")
    mfcc = rng.uniform(-46, 15, (8, 1, 16, 16)).astype(np.float32)
    np.save(tmp_path / "mfcc.npy", mfcc)
    km = tmp_path / "kws.kmodel"
    convert(tmp_path / "kws.onnx", km, ConvertOptions(dataset=str(tmp_path / "mfcc.npy"), input_range=(-50, 20),
                                                      progress=False, min_sqnr=0))
    np.save(tmp_path / "one.npy", mfcc[0])
    rc, out, err = _run_cli(capsys, km, "-i", tmp_path / "one.npy", "-o", tmp_path / "f.npy")
    assert rc == 0 and "mapped to uint8 pixels by the model's input range -50..20" in out, err
    pixels = np.rint((mfcc[0].astype(np.float64) + 50) * 255 / 70).astype(np.uint8)
    np.save(tmp_path / "px.npy", pixels)
    assert _run_cli(capsys, km, "-i", tmp_path / "px.npy", "-o", tmp_path / "p.npy")[0] == 0
    assert np.array_equal(np.load(tmp_path / "f.npy"), np.load(tmp_path / "p.npy"))
    few = mfcc[0].copy()
    few.flat[:3] = (-60, 25, 21)            # 3 of 256 values, 1.2 %
    np.save(tmp_path / "few.npy", few)
    rc, out, err = _run_cli(capsys, km, "-i", tmp_path / "few.npy", "-o", tmp_path / "c.npy")
    assert rc == 0 and "1.2% of them outside the model's input range -50..20" in err and "clipped" in err
    pixels.flat[:3] = (0, 255, 255)
    np.save(tmp_path / "px.npy", pixels)
    assert _run_cli(capsys, km, "-i", tmp_path / "px.npy", "-o", tmp_path / "p.npy")[0] == 0
    assert np.array_equal(np.load(tmp_path / "c.npy"), np.load(tmp_path / "p.npy"))
    np.save(tmp_path / "far.npy", mfcc[0] * 3)
    rc, out, err = _run_cli(capsys, km, "-i", tmp_path / "far.npy")
    assert rc == 2 and "outside the model's input range -50..20" in err and "Traceback" not in err
    assert "reconvert with --input-range" in err


def test_a_float_first_layer_on_a_1x1_map_is_measured_and_described_with_floats(tmp_path, capsys):
    """Hunt 21: a keyword spotter's (1, 1, 13) MFCC input read by a 1x1 conv (42io's streaming
    DS-CNN) becomes a v3 kmodel starting with a float FULLY_CONNECTED, which takes float32 values;
    convert measured it on uint8 pixel codes (-48 dB), refused a correct kmodel with calibration
    advice, and the metadata said uint8. It is measured on the floats it reads, the metadata says
    float32, and `run` on a float array gives the float model's output."""
    import onnx

    from front_helpers import make_model, ort_run
    from lower_helpers import conv_node
    from tl2k210 import metadata
    rng = np.random.default_rng(5)
    n = onnx.helper.make_node
    m = make_model([conv_node("h", "x", "w", "b"), n("Relu", ["h"], ["r"]), n("Flatten", ["r"], ["f"]),
                    n("Gemm", ["f", "w2", "b2"], ["y"], transB=1)], [("x", [1, 13, 1, 1])], [("y", None)],
                   {"w": rng.normal(size=(16, 13, 1, 1)).astype(np.float32),
                    "b": rng.normal(size=16).astype(np.float32),
                    "w2": rng.normal(size=(4, 16)).astype(np.float32), "b2": rng.normal(size=4).astype(np.float32)})
    onnx.save(m, tmp_path / "kws.onnx")
    x = rng.uniform(0, 1, (20, 13, 1, 1)).astype(np.float32)
    np.save(tmp_path / "cal.npy", x)
    km = tmp_path / "kws.kmodel"
    rc = main(["convert", str(tmp_path / "kws.onnx"), str(km), "--dataset", str(tmp_path / "cal.npy")])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert metadata.load_for(km).input["dtype"] == "float32"
    sqnr = float(out.split("output SQNR vs float ")[1].split(" dB")[0])
    assert sqnr > 60, out
    np.save(tmp_path / "one.npy", x[0])
    rc, out, err = _run_cli(capsys, km, "-i", tmp_path / "one.npy", "-o", tmp_path / "y.npy")
    assert rc == 0, err
    np.testing.assert_allclose(np.load(tmp_path / "y.npy").reshape(-1), ort_run(m, x[:1])[0].reshape(-1),
                               rtol=1e-3, atol=1e-3)


def test_run_reads_a_feature_matrix_without_its_axis_of_1_in_its_own_order(tmp_path, capsys):
    """Hunt 21: 42io's keyword spotter reads (47, 1, 13) frames x coefficients; `run` took the
    same values as a (47, 13) matrix channel-major, because the count matched, and printed a
    wrong class. A form without its axes of 1 is read in its own order: channels-last (T, F) as
    (T, 1, F), channel-major (F, T) as (F, T, 1), one or a batch; other shapes are refused."""
    import onnx

    from front_helpers import make_model
    from lower_helpers import conv_node
    from tl2k210.compiler import ConvertOptions, convert
    rng = np.random.default_rng(6)
    m = make_model([conv_node("y", "x", "w", "b")], [("x", [1, 3, 8, 1])], [("y", None)],
                   {"w": rng.normal(size=(4, 3, 1, 1)).astype(np.float32), "b": np.zeros(4, np.float32)})
    onnx.save(m, tmp_path / "kws.onnx")
    x = rng.integers(0, 256, (5, 3, 8, 1)).astype(np.uint8)
    np.save(tmp_path / "cal.npy", x)
    km = tmp_path / "kws.kmodel"
    convert(tmp_path / "kws.onnx", km, ConvertOptions(dataset=str(tmp_path / "cal.npy"), progress=False, min_sqnr=0))
    hwc = x.transpose(0, 2, 3, 1)                   # (5, 8, 1, 3): frames, 1, coefficients
    outs = {}
    for name, a in {"chw": x[0], "hwc": hwc[0], "tf": hwc[0, :, 0], "ft": x[0, :, :, 0],
                    "batch": hwc[:, :, 0]}.items():
        np.save(tmp_path / f"{name}.npy", a)
        rc, out, err = _run_cli(capsys, km, "-i", tmp_path / f"{name}.npy", "-o", tmp_path / f"{name}_y.npy")
        assert rc == 0, err
        outs[name] = np.load(tmp_path / f"{name}_y.npy")
    for name in ("hwc", "tf", "ft"):
        assert np.array_equal(outs[name], outs["chw"]), name
    assert np.array_equal(outs["batch"][0], outs["chw"])
    np.save(tmp_path / "odd.npy", x[0].reshape(2, 12))
    rc, _, err = _run_cli(capsys, km, "-i", tmp_path / "odd.npy")
    assert rc == 2 and "(2, 12)" in err


def test_run_takes_the_input_positionally_and_shapes_outputs_by_the_metadata(tmp_path, capsys):
    """Hunt 12: `tl2k210 run MODEL IMAGE` was refused for want of -i, and a (605, 95) output came
    back flat (57475,). The input may be given either way (not both); outputs take the shapes the
    kmodel's metadata records, named, one item or a batch (N, ...)."""
    import onnx

    from front_helpers import make_model
    from lower_helpers import conv_node
    from tl2k210.compiler import ConvertOptions, convert
    rng = np.random.default_rng(5)
    m = make_model([conv_node("maps", "x", "w", "b", pads=[1, 1, 1, 1])], [("x", [1, 3, 8, 8])], [("maps", None)],
                   {"w": rng.normal(size=(4, 3, 3, 3)).astype(np.float32), "b": np.zeros(4, np.float32)})
    onnx.save(m, tmp_path / "m.onnx")
    np.save(tmp_path / "cal.npy", rng.random((4, 3, 8, 8), np.float32))
    km = tmp_path / "m.kmodel"
    convert(tmp_path / "m.onnx", km, ConvertOptions(dataset=str(tmp_path / "cal.npy"), progress=False, min_sqnr=0))
    np.save(tmp_path / "one.npy", rng.integers(0, 256, (3, 8, 8), dtype=np.uint8))
    rc, out, err = _run_cli(capsys, km, tmp_path / "one.npy", "-o", tmp_path / "y.npy")
    assert rc == 0 and "output 0 (maps): float32 (4, 8, 8)" in out, err
    assert np.load(tmp_path / "y.npy").shape == (4, 8, 8)
    np.save(tmp_path / "two.npy", rng.integers(0, 256, (2, 3, 8, 8), dtype=np.uint8))
    assert _run_cli(capsys, km, "-i", tmp_path / "two.npy", "-o", tmp_path / "b.npy")[0] == 0
    assert np.load(tmp_path / "b.npy").shape == (2, 4, 8, 8)
    rc, out, err = _run_cli(capsys, km, tmp_path / "one.npy", "-i", tmp_path / "one.npy")
    assert rc == 2 and "give the input once" in err

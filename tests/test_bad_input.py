"""Hostile-but-realistic input to every verb (issue 15).

Every refusal here is checked the same way (`refused`): exit code 2, one line naming the cause
and the fix, no traceback; and where a file is involved, the input is unchanged (`Frozen`) and
nothing is left at the output path (`nothing_at`), not even a temporary file.
"""
import io
import json
import os
import re
import signal
import struct
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from conftest import FACE_ANCHORS, REPO, TESTDATA, data_path
from tl2k210.cli import main

PY = sys.executable
TEMP_PREFIXES = (".tmp-", ".kfpkg-", ".tl2k210-")


# ---- helpers ------------------------------------------------------------------------------
def cli(capsys, *argv):
    """tl2k210 in-process: (exit code, stdout, stderr). An exception escaping main() fails the
    test: that is a traceback a user would see."""
    rc = main([str(a) for a in argv])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def sh(*argv, env=None, **kw):
    e = dict(os.environ, PYTHONPATH=str(REPO), **(env or {}))
    return subprocess.run([PY, "-m", "tl2k210.cli", *map(str, argv)], capture_output=True,
                          text=True, env=e, timeout=kw.pop("timeout", 300), **kw)


# what a message says to do: every refusal names a fix, not only the cause
FIX = re.compile(r"\b(give|use|choose|pass|save|check|create|mkdir|fix|rebuild|re-?download|download|"
                 r"repack|downscale|resize|reshape|scale|make|put|pick|install|convert|chmod|"
                 r"define|plug|list|must|needs?|export|try)\b", re.I)


def refused(rc, err, *needles):
    """Exit 2, no traceback, the last line is the one-line error, and it says every needle
    and what to do (`FIX`)."""
    assert rc == 2, f"exit {rc}: {err}"
    assert "Traceback" not in err, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("tl2k210 ") and ": error: " in last, err
    for n in needles:
        assert n.lower() in last.lower(), f"{n!r} not in: {last}"
    assert FIX.search(last.split(": error: ", 1)[1]), f"no fix named in: {last}"
    return last


class Frozen:
    """Bytes and mode of input files before a command; `.check()` asserts they did not change."""

    def __init__(self, *paths):
        self.paths = [Path(p) for p in paths]
        self.state = {p: (p.read_bytes(), p.stat().st_mode, os.path.islink(p)) for p in self.paths}

    def check(self):
        for p, (data, mode, link) in self.state.items():
            assert os.path.islink(p) == link, f"{p} was replaced"
            assert p.read_bytes() == data, f"{p} changed"
            assert p.stat().st_mode == mode, f"{p} changed mode"


def nothing_at(path):
    path = Path(path)
    assert not path.exists() or path.is_dir(), f"{path} was written"
    folder = path if path.is_dir() else path.parent
    if folder.is_dir():
        left = [p.name for p in folder.iterdir() if p.name.startswith(TEMP_PREFIXES)]
        assert not left, f"temporary files left in {folder}: {left}"


def tiny_onnx(path):
    """A 1x3x16x16 -> 8x16x16 conv + relu ONNX model (converts in a second)."""
    from onnx import helper, save

    from front_helpers import make_model, rand
    m = make_model([helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
                    helper.make_node("Relu", ["c"], ["y"])],
                   [("x", [1, 3, 16, 16])], [("y", [1, 8, 16, 16])], {"w": rand(8, 3, 3, 3, scale=0.3)})
    save(m, str(path))
    return path


def photos(folder, n=3, size=(16, 16)):
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for i in range(n):
        Image.fromarray(rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)).save(folder / f"{i}.png")
    return folder


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    d = tmp_path_factory.mktemp("bad")
    tiny_onnx(d / "tiny.onnx")
    photos(d / "ds")
    return d


@pytest.fixture
def model(work, tmp_path):
    """A private copy of the tiny ONNX model and its calibration folder."""
    m = tmp_path / "m.onnx"
    m.write_bytes((work / "tiny.onnx").read_bytes())
    ds = photos(tmp_path / "ds")
    return m, ds


def kmodel(name):
    return data_path("kmodels", name)


def png16(path, array):
    """Write a 16-bit grayscale (H, W) or RGB (H, W, 3) PNG by hand (PIL writes only gray)."""
    import zlib
    a = np.asarray(array, ">u2")
    h, w = a.shape[:2]
    ctype = 2 if a.ndim == 3 else 0

    def chunk(t, d):
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xFFFFFFFF)
    raw = b"".join(b"\x00" + row.tobytes() for row in a.reshape(h, -1))
    Path(path).write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 16, ctype, 0, 0, 0))
                           + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))
    return path


def bomb_png(path, w=30000, h=30000):
    """A valid-looking PNG header declaring w x h RGB (the data is a few bytes)."""
    import zlib

    def chunk(t, d):
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xFFFFFFFF)
    Path(path).write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
                           + chunk(b"IDAT", zlib.compress(b"\x00" * 64)) + chunk(b"IEND", b""))
    return path


# =============================================================================================
# 1. Data loss: an output that resolves to an input is refused before any work
# =============================================================================================
def _alias(kind, target, tmp_path):
    """The same file as `target` under another name: itself, a hard link or a symlink."""
    if kind == "same":
        return target
    alias = tmp_path / f"alias_{kind}{target.suffix}"
    (os.link if kind == "hardlink" else os.symlink)(target, alias)
    return alias


ALIASES = ["same", "hardlink", "symlink"]


@pytest.mark.parametrize("kind", ALIASES)
def test_convert_never_overwrites_the_source_model(kind, model, tmp_path, capsys):
    m, ds = model
    keep = Frozen(m, *ds.iterdir())
    out = _alias(kind, m, tmp_path)
    rc, _, err = cli(capsys, "convert", m, out, "--dataset", ds)
    refused(rc, err, "same file", "choose another")
    assert "[1/6]" not in err          # refused before loading the model
    keep.check()


def test_convert_never_overwrites_the_dataset_or_its_own_output(model, tmp_path, capsys):
    m, ds = model
    keep = Frozen(m, *ds.iterdir())
    rc, _, err = cli(capsys, "convert", m, ds / "0.png", "--dataset", ds)
    refused(rc, err, "0.png", "choose another")
    out = tmp_path / "out.kmodel"
    rc, _, err = cli(capsys, "convert", m, out, "--dataset", ds, "--report", out)
    refused(rc, err, "--report", "same file")
    rc, _, err = cli(capsys, "convert", m, out, "--dataset", ds, "--report", m)
    refused(rc, err, "same file")
    os.link(ds / "1.png", tmp_path / "linked.kmodel")        # another name of a dataset image
    rc, _, err = cli(capsys, "convert", m, tmp_path / "linked.kmodel", "--dataset", ds)
    refused(rc, err, "hard link", "1.png", "choose another")
    keep.check()
    nothing_at(out)


@pytest.mark.parametrize("kind", ALIASES)
def test_package_never_overwrites_an_image(kind, tmp_path, capsys):
    km = tmp_path / "fd.kmodel"
    km.write_bytes(kmodel("mnist_v3.kmodel").read_bytes())
    keep = Frozen(km)
    out = _alias(kind, km, tmp_path)
    rc, _, err = cli(capsys, "package", "-o", out, f"{km}@0x300000")
    refused(rc, err, "same file", "choose another")
    keep.check()


def test_package_never_overwrites_an_input_package(tmp_path, capsys):
    pkg = data_path("kfpkg", "face_model_at_0x300000.kfpkg")
    mine = tmp_path / "face.kfpkg"
    mine.write_bytes(pkg.read_bytes())
    keep = Frozen(mine)
    rc, _, err = cli(capsys, "package", "-o", mine, mine)
    refused(rc, err, "same file")
    keep.check()


@pytest.mark.parametrize("kind", ALIASES)
def test_run_out_never_overwrites_its_input(kind, tmp_path, capsys):
    x = tmp_path / "x.npy"
    np.save(x, np.zeros((1, 28, 28), np.uint8))
    keep = Frozen(x)
    rc, out, err = cli(capsys, "run", kmodel("mnist_v3.kmodel"), "-i", x, "-o", _alias(kind, x, tmp_path))
    refused(rc, err, "same file")
    assert "output 0" not in out       # refused before running
    keep.check()


def test_run_png_out_never_overwrites_the_photo(tmp_path, capsys):
    img = tmp_path / "photo.png"
    Image.fromarray(np.full((240, 320, 3), 128, np.uint8)).save(img)
    keep = Frozen(img)
    rc, out, err = cli(capsys, "run", kmodel("facedetect_320x240_v3.kmodel"), "-i", img, "-o", img,
                       "--decode", "yolo2", "--anchors", ",".join(map(str, FACE_ANCHORS)))
    refused(rc, err, "same file")
    keep.check()


@pytest.mark.parametrize("kind", ALIASES)
def test_deploy_package_never_overwrites_the_model_or_firmware(kind, tmp_path, capsys):
    km = tmp_path / "m.kmodel"
    km.write_bytes(kmodel("mnist_v3.kmodel").read_bytes())
    fw = tmp_path / "fw.bin"
    fw.write_bytes(b"\x13" * 4096)
    keep = Frozen(km, fw)
    for target in (km, fw):
        rc, out, err = cli(capsys, "deploy", km, "--firmware", fw, "-o", _alias(kind, target, tmp_path),
                           "-p", tmp_path / "noport")
        refused(rc, err, "same file", "choose another")
        assert "packaged" not in out
    keep.check()


@pytest.mark.parametrize("kind", ALIASES)
def test_compare_json_never_overwrites_an_input(kind, model, tmp_path, capsys):
    m, ds = model
    km = tmp_path / "m.kmodel"
    km.write_bytes(kmodel("mnist_v3.kmodel").read_bytes())
    keep = Frozen(m, km, *ds.iterdir())
    for target in (m, km, ds / "0.png"):
        rc, _, err = cli(capsys, "compare", m, km, "--dataset", ds, "--json", _alias(kind, target, tmp_path))
        refused(rc, err, "choose another")
    keep.check()


@pytest.mark.parametrize("kind", ALIASES)
def test_demo_never_overwrites_the_photo(kind, tmp_path, capsys):
    img = tmp_path / "photo.png"
    Image.fromarray(np.full((240, 320, 3), 128, np.uint8)).save(img)
    keep = Frozen(img)
    rc, out, err = cli(capsys, "demo", "face-detect", "--image", img, "--out", _alias(kind, img, tmp_path),
                       "--kmodel", kmodel("facedetect_320x240_v3.kmodel"))
    refused(rc, err, "same file", "choose another")
    assert "[host]" not in out              # refused before the board starts
    keep.check()


@pytest.mark.parametrize("kind", ALIASES)
def test_validate_outputs_never_overwrite_an_input(kind, tmp_path, capsys):
    """validate --json/--plot: refused before the board is opened."""
    km = tmp_path / "m.kmodel"
    km.write_bytes(kmodel("mnist_v3.kmodel").read_bytes())
    x = tmp_path / "x.npy"
    np.save(x, np.zeros((1, 28, 28), np.uint8))
    keep = Frozen(km, x)
    for flag, target in (("--json", x), ("--plot", km)):
        rc, _, err = cli(capsys, "validate", km, "-i", x, flag, _alias(kind, target, tmp_path),
                         "-p", tmp_path / "noport")
        refused(rc, err, "same file", "choose another")
    keep.check()


@pytest.mark.parametrize("kind", ["hardlink", "symlink"])
def test_zoo_build_never_overwrites_its_firmware_script(kind, tmp_path, capsys, monkeypatch):
    """zoo build writes OUT/NAME_main.py from firmware/NAME.py: a link between them is refused
    before the network is built (the firmware folder is a private copy here)."""
    from tl2k210 import paths, zoo
    fwdir = tmp_path / "firmware"
    fwdir.mkdir()
    script = fwdir / "face_detect.py"
    script.write_bytes((paths.firmware_dir() / "face_detect.py").read_bytes())
    monkeypatch.setattr(zoo.paths, "firmware_dir", lambda: fwdir)
    out = tmp_path / "zoo"
    out.mkdir()
    (os.link if kind == "hardlink" else os.symlink)(script, out / "face_detect_main.py")
    keep = Frozen(script)
    t0 = time.monotonic()
    rc, _, err = cli(capsys, "zoo", "build", "face_detect", "--out", out, "-q")
    refused(rc, err, "face_detect_main.py", "same file", "choose another")
    assert time.monotonic() - t0 < 20
    keep.check()
    assert sorted(p.name for p in out.iterdir()) == ["face_detect_main.py"]


def test_zoo_build_failing_removes_the_folders_it_made(tmp_path, capsys, monkeypatch):
    """--out new/sub is created before the work; a build refused after that leaves no folder."""
    from tl2k210 import paths, zoo
    fwdir = tmp_path / "firmware"
    fwdir.mkdir()
    (fwdir / "face_detect.py").write_text("import KPU as kpu\ntask = kpu.load(0x123000)\n")
    monkeypatch.setattr(zoo.paths, "firmware_dir", lambda: fwdir)
    rc, _, err = cli(capsys, "zoo", "build", "face_detect", "--out", tmp_path / "new" / "sub", "-q")
    refused(rc, err, "face_detect.py", "0x")
    assert not (tmp_path / "new").exists()


@pytest.fixture(scope="module")
def converted(work):
    """tiny.onnx converted once, with labels: c.kmodel and its metadata c.kmodel.json."""
    assert main(["convert", str(work / "tiny.onnx"), str(work / "c.kmodel"), "--dataset",
                 str(work / "ds"), "-q", "--labels", "a,b"]) == 0
    return work / "c.kmodel"


@pytest.fixture
def with_metadata(converted, tmp_path):
    km, meta = tmp_path / "c.kmodel", tmp_path / "c.kmodel.json"
    km.write_bytes(converted.read_bytes())
    meta.write_bytes(Path(f"{converted}.json").read_bytes())
    return km, meta


@pytest.mark.parametrize("verb,kind", [("run", "same"), ("run", "hardlink"), ("run", "symlink"),
                                       ("package", "same"), ("compare", "same"), ("deploy", "same")])
def test_outputs_never_overwrite_a_kmodels_metadata(verb, kind, with_metadata, work, tmp_path, capsys):
    """MODEL.kmodel.json is read with the kmodel (decode, labels, preprocessing): it is an input."""
    km, meta = with_metadata
    keep = Frozen(km, meta)
    out = _alias(kind, meta, tmp_path)
    x = tmp_path / "x.npy"
    np.save(x, np.zeros((1, 3, 16, 16), np.uint8))
    argv = {"run": ["run", km, "-i", x, "-o", out],
            "package": ["package", "-o", out, f"{km}@0x300000"],
            "compare": ["compare", work / "tiny.onnx", km, "--dataset", work / "ds", "--json", out],
            "deploy": ["deploy", km, "-o", out, "-p", tmp_path / "noport"]}[verb]
    rc, stdout, err = cli(capsys, *argv)
    refused(rc, err, "metadata of the input", "c.kmodel", "choose another")
    assert "output 0" not in stdout and "packaged" not in stdout
    keep.check()


@pytest.mark.parametrize("layout", ["later-frame", "folder"])
def test_demo_never_overwrites_a_photo_with_a_later_frame(layout, tmp_path, capsys):
    """--out lcd.png writes lcd-1.png, lcd-2.png... for later frames; --out DIR frame_0000.png..."""
    name, out = ("lcd-1.png", tmp_path / "lcd.png") if layout == "later-frame" else \
        ("frame_0001.png", tmp_path)
    img = tmp_path / name
    Image.fromarray(np.full((240, 320, 3), 128, np.uint8)).save(img)
    keep = Frozen(img)
    rc, _, err = cli(capsys, "demo", "face-detect", "--image", img, "--image", img, "--out", out,
                     "--kmodel", kmodel("facedetect_320x240_v3.kmodel"))
    refused(rc, err, name, "choose another --out")
    keep.check()


def test_board_never_wipes_a_file_that_is_not_a_flash_image(tmp_path, capsys):
    fw = tmp_path / "firmware.bin"
    fw.write_bytes(b"\x5a" * 100_000)
    keep = Frozen(fw)
    rc, _, err = cli(capsys, "board", "--pty", "--flash", fw, "--for", "0")
    refused(rc, err, "16 MiB", "firmware.bin")
    keep.check()


# =============================================================================================
# 2. Memory is bounded by the file's size, not by what its header claims (CLI level)
# =============================================================================================
CLAIM_FILE_MB = 48


def _claiming(tmp_path, name, offset):
    """A real kmodel followed by 48 MiB of zeros, its header claiming one entry per 8 bytes."""
    data = bytearray(kmodel(name).read_bytes()) + bytes(CLAIM_FILE_MB << 20)
    struct.pack_into("<I", data, offset, (CLAIM_FILE_MB << 20) // 8)
    p = tmp_path / f"claims_{offset}_{name}"
    p.write_bytes(data)
    return p


def _limited(limit):
    import resource

    def set_limit():
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    return set_limit


@pytest.mark.slow
@pytest.mark.parametrize("verb,name,offset", [
    ("inspect", "mnist_v3.kmodel", 12),     # v3 layers_length
    ("inspect", "mnist_v3.kmodel", 24),     # v3 output_count
    ("inspect", "iris_v4.kmodel", 24),      # v4 nodes
    ("run", "mnist_v3.kmodel", 12),
], ids=["inspect-v3-layers", "inspect-v3-outputs", "inspect-v4-nodes", "run-v3-layers"])
def test_header_claims_cost_no_memory(verb, name, offset, tmp_path):
    f = _claiming(tmp_path, name, offset)
    limit = (256 << 20) + 3 * f.stat().st_size     # interpreter + numpy, plus 3x the file
    extra = ["-i", tmp_path / "x.npy"] if verb == "run" else []
    if verb == "run":
        np.save(tmp_path / "x.npy", np.zeros((1, 28, 28), np.uint8))
    t0 = time.monotonic()
    res = sh(verb, f, *extra, preexec_fn=_limited(limit),
             env={"TL2K210_NO_NUMBA": "1", "OPENBLAS_NUM_THREADS": "1"})
    refused(res.returncode, res.stderr)
    assert "MemoryError" not in res.stderr
    assert time.monotonic() - t0 < 60


def test_input_shape_claim_costs_no_memory(tmp_path, capsys):
    """A v4 header claiming a 60000x60000 input: refused, not an image resized to 10 GB."""
    d = bytearray(kmodel("yolo20_v4.kmodel").read_bytes())
    n_inputs = struct.unpack_from("<I", d, 28)[0]
    struct.pack_into("<4i", d, 40 + 16 * n_inputs, 1, 3, 60000, 60000)
    f = tmp_path / "big_input.kmodel"
    f.write_bytes(d)
    img = tmp_path / "p.png"
    Image.fromarray(np.full((240, 320, 3), 100, np.uint8)).save(img)
    t0 = time.monotonic()
    rc, _, err = cli(capsys, "run", f, "-i", img)
    refused(rc, err, "60000", "8 MiB")
    assert time.monotonic() - t0 < 30


# =============================================================================================
# 3. Messages, not tracebacks
# =============================================================================================
# ---- calibration data --------------------------------------------------------------------
def _npy(path, a):
    np.save(path, a, allow_pickle=True)
    return path


CALIBRATION_CASES = {
    "empty-folder": (lambda d: d, ("no images", ".npy")),
    "non-images": (lambda d: ((d / "a.txt").write_text("x"), (d / "b.csv").write_text("1,2"), d)[-1],
                   ("no images", ".png")),
    "fake-jpg": (lambda d: ((d / "a.jpg").write_text("not a jpeg"), d)[-1], ("a.jpg", "image")),
    "wrong-shape-npy": (lambda d: _npy(d / "x.npy", np.zeros((4, 3, 5, 5), np.float32)),
                        ("(3, 5, 5)", "(3, 16, 16)")),
    "object-npy": (lambda d: _npy(d / "x.npy", np.array([1, "a"], object)), ("object", "numbers")),
    "string-npy": (lambda d: _npy(d / "x.npy", np.array(["ab", "cd"])), ("str", "numbers")),
    "structured-npy": (lambda d: _npy(d / "x.npy", np.zeros(3, [("a", "f4"), ("b", "i4")])), ("numbers",)),
    "nan-npy": (lambda d: _npy(d / "x.npy", np.full((2, 3, 16, 16), np.nan, np.float32)), ("nan",)),
    "inf-npz": (lambda d: (np.savez(d / "x.npz", a=np.full((2, 3, 16, 16), np.inf, np.float32)),
                           d / "x.npz")[-1], ("inf",)),
    "not-npy": (lambda d: ((d / "x.npy").write_bytes(b"hello, not numpy"), d / "x.npy")[-1],
                ("x.npy", "not a .npy")),
    "empty-npz": (lambda d: (np.savez(d / "x.npz"), d / "x.npz")[-1], ("no arrays",)),
    "huge-claim-npy": (lambda d: _huge_npy(d / "x.npy"), ("declares",)),
    "bomb-png": (lambda d: (bomb_png(d / "big.png"), d)[-1], ("big.png", "30000x30000")),
    "truncated-jpg": (lambda d: (_truncated_jpg(d / "t.jpg"), d)[-1], ("t.jpg", "truncated")),
    "beyond-float32": (lambda d: _npy(d / "x.npy", np.full((2, 3, 16, 16), 1e300)), ("inf", "float32")),
}


def _truncated_jpg(path):
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (64, 64, 3), np.uint8)).save(path)
    path.write_bytes(path.read_bytes()[:400])
    return path


def _huge_npy(path):
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": "<f4", "fortran_order": False,
                                               "shape": (10 ** 9, 3, 16, 16)})
    path.write_bytes(buf.getvalue() + bytes(800))
    return path


@pytest.mark.parametrize("case", list(CALIBRATION_CASES))
def test_bad_calibration_data(case, model, tmp_path, capsys):
    m, _ = model
    make, needles = CALIBRATION_CASES[case]
    d = tmp_path / "calib"
    d.mkdir()
    ds = make(d)
    out = tmp_path / "out.kmodel"
    keep = Frozen(m, *[p for p in d.iterdir()])
    rc, _, err = cli(capsys, "convert", m, out, "--dataset", ds, "-q")
    last = refused(rc, err, *needles)
    assert "layout=" not in last                    # no Python keyword a CLI user cannot pass
    keep.check()
    nothing_at(out)


def test_rerunning_into_an_input_folder_is_fine_for_files_nobody_reads(model, tmp_path, capsys):
    """The kmodel (and its report) may live in the dataset folder; a second run replaces them."""
    m, ds = model
    for _ in range(2):
        rc, _, err = cli(capsys, "convert", m, ds / "m.kmodel", "--dataset", ds, "-q", "--report", ds / "r.json")
        assert rc == 0, err
    assert (ds / "m.kmodel").stat().st_size > 0


def test_channels_last_npy_calibrates(model, tmp_path, capsys):
    """The wrong-shape message used to suggest layout='NHWC'; NHWC arrays now just work."""
    m, ds = model
    x = tmp_path / "nhwc.npy"
    np.save(x, np.random.default_rng(0).random((3, 16, 16, 3), np.float32))
    rc, out, err = cli(capsys, "convert", m, tmp_path / "o.kmodel", "--dataset", x, "-q")
    assert rc == 0, err
    assert "channels-last" in err


def test_uint8_arrays_are_pixels_like_images(model, tmp_path, capsys):
    """uint8 .npy calibration data is pixels: the device sees the same pixels as from the same
    pictures as PNGs (it used to be taken as preprocessed floats: all white)."""
    from tl2k210 import frontends
    from tl2k210.compiler import ConvertOptions, model_inputs
    from tl2k210.graph import from_onnx
    m, ds = model
    pix = np.stack([np.asarray(Image.open(ds / f"{i}.png")).transpose(2, 0, 1) for i in range(3)])
    np.save(tmp_path / "pix.npy", pix)
    g = from_onnx(frontends.load_model(str(m)))
    f_img, p_img = model_inputs(g, ds, 10, ConvertOptions())
    f_npy, p_npy = model_inputs(g, tmp_path / "pix.npy", 10, ConvertOptions())
    assert np.array_equal(p_img, pix) and np.array_equal(p_npy, pix) and np.array_equal(f_img, f_npy)
    rc, out_a, _ = cli(capsys, "convert", m, tmp_path / "a.kmodel", "--dataset", ds, "-q")
    rc_b, out_b, err = cli(capsys, "convert", m, tmp_path / "b.kmodel", "--dataset", tmp_path / "pix.npy", "-q")
    assert rc == rc_b == 0 and "warning" not in err, err
    sqnr = [float(o.split("output SQNR vs float ")[1].split()[0]) for o in (out_a, out_b)]
    assert abs(sqnr[0] - sqnr[1]) < 0.5 and sqnr[0] > 30
    np.save(tmp_path / "f.npy", pix.astype(np.float32))          # 0..255 floats with --input-range 0,1
    rc, _, err = cli(capsys, "convert", m, tmp_path / "c.kmodel", "--dataset", tmp_path / "f.npy", "-q")
    refused(rc, err, "uint8", "--min-sqnr 0")                      # mostly clipped: refused
    nothing_at(tmp_path / "c.kmodel")
    rc, _, err = cli(capsys, "convert", m, tmp_path / "c.kmodel", "--dataset", tmp_path / "f.npy", "-q",
                     "--min-sqnr", "0")
    assert rc == 0 and "warning:" in err and "uint8" in err


def test_one_image_is_not_a_dataset(model, tmp_path, capsys):
    m, ds = model
    rc, _, err = cli(capsys, "convert", m, tmp_path / "o.kmodel", "--dataset", ds / "0.png", "-q")
    refused(rc, err, "one image", "folder")
    nothing_at(tmp_path / "o.kmodel")


def test_images_for_an_input_that_is_no_image(tmp_path, capsys):
    """Coral's mobilenet head layers read a 1x1x1024 embedding: a folder of photos cannot give
    it (it used to crash broadcasting 3 channels onto 1024); refused naming both shapes."""
    from onnx import helper, save

    from front_helpers import make_model, rand
    m = tmp_path / "head.onnx"
    save(make_model([helper.make_node("Conv", ["x", "w"], ["y"])], [("x", [1, 64, 1, 1])], [("y", [1, 10, 1, 1])],
                    {"w": rand(10, 64, 1, 1)}), str(m))
    rc, _, err = cli(capsys, "convert", m, tmp_path / "o.kmodel", "--dataset", photos(tmp_path / "ds"), "-q")
    refused(rc, err, "3 (RGB) channels", "64x1x1", ".npy")
    nothing_at(tmp_path / "o.kmodel")


def test_a_model_with_two_inputs_is_refused_naming_them(tmp_path, capsys):
    """Coral's split_concat (3 uint8 inputs): refused at load, naming every input and its shape,
    before calibration (it used to fail feeding onnxruntime one of them)."""
    from onnx import helper, save

    from front_helpers import make_model
    m = tmp_path / "two.onnx"
    save(make_model([helper.make_node("Concat", ["a", "b"], ["y"], axis=1)], [("a", [1, 3, 8, 8]), ("b", [1, 1, 8, 8])],
                    [("y", [1, 4, 8, 8])]), str(m))
    rc, _, err = cli(capsys, "convert", m, tmp_path / "o.kmodel", "--dataset", photos(tmp_path / "ds"), "-q")
    refused(rc, err, "2 inputs", "'a' (1, 3, 8, 8), 'b' (1, 1, 8, 8)", "one input", "--input-value NAME=VALUE")
    nothing_at(tmp_path / "o.kmodel")


def test_a_streaming_step_and_a_recurrent_model_are_refused_for_what_they_are(tmp_path, capsys):
    """Hunt 21: 42io's streaming keyword spotter and DTLN feed back ring buffers and LSTM states
    as inputs the model also returns; TEN VAD's LSTM h/c are inputs too. The multi-input refusal
    advised pinning them (every call would be the first; the streaming spotter's class output
    even became a constant), and asked of the LSTM's states before naming the LSTM. A state input
    is named beside the output of its shape, and a recurrent op is refused first."""
    from onnx import helper, save

    from front_helpers import make_model, rand
    m = tmp_path / "step.onnx"
    save(make_model([helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Add", ["c", "s"], ["y"]),
                     helper.make_node("Identity", ["c"], ["s_out"])],
                    [("x", [1, 13, 4, 4]), ("s", [1, 8, 4, 4])], [("y", [1, 8, 4, 4]), ("s_out", [1, 8, 4, 4])],
                    {"w": rand(8, 13, 1, 1)}), str(m))
    np.save(tmp_path / "cal.npy", rand(4, 13, 4, 4))
    rc, _, err = cli(capsys, "convert", m, tmp_path / "o.kmodel", "--dataset", tmp_path / "cal.npy", "-q")
    refused(rc, err, "2 inputs", "'s' has the shape of output 'y' or 's_out'", "state",
            "export the model's whole-window form")
    nothing_at(tmp_path / "o.kmodel")
    r = tmp_path / "lstm.onnx"
    lstm = helper.make_node("LSTM", ["x", "W", "R", "", "", "h0", "c0"], ["Y", "h", "c"], hidden_size=4)
    save(make_model([lstm], [("x", [5, 1, 3]), ("h0", [1, 1, 4]), ("c0", [1, 1, 4])],
                    [("Y", None), ("h", None), ("c", None)], {"W": rand(1, 16, 3), "R": rand(1, 16, 4)}), str(r))
    rc, _, err = cli(capsys, "convert", r, tmp_path / "o.kmodel", "--dataset", tmp_path / "cal.npy", "-q")
    refused(rc, err, "op LSTM has no K210 lowering", "no recurrent ops on the K210", "states are the model's other")
    nothing_at(tmp_path / "o.kmodel")


def test_a_second_input_pinned_with_input_value_converts_as_the_model_computes(tmp_path, capsys):
    """An LSTM classifier's scalar threshold, a flag: --input-value NAME=V pins the input the
    kmodel is not fed to constants; the kmodel then computes what the model does with that value
    (emulated against onnxruntime fed the same value), the receipt says so, and a name the model
    has not, a count that does not fit or pinning every input is refused naming it."""
    from onnx import helper, save

    from front_helpers import make_model, rand
    from tl2k210.compiler import ConvertOptions, load
    from tl2k210.k210.emulator import Emulator
    m = tmp_path / "two.onnx"
    model = make_model([helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
                        helper.make_node("Mul", ["c", "t"], ["y"])],
                       [("x", [1, 3, 16, 16]), ("t", [1])], [("y", [1, 8, 16, 16])], {"w": rand(8, 3, 3, 3)})
    save(model, str(m))
    ds = photos(tmp_path / "ds", n=4)
    out = tmp_path / "o.kmodel"
    rc, _, _ = cli(capsys, "convert", m, out, "--dataset", ds, "--input-value", "t=0.25", "-q")
    assert rc == 0 and json.loads((tmp_path / "o.kmodel.json").read_text())["input"]["pinned"] == {"t": [0.25]}
    x = np.asarray(Image.open(sorted(Path(ds).iterdir())[0]).convert("RGB"), np.float32).transpose(2, 0, 1) / 255
    sess = __import__("onnxruntime").InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    ref = sess.run(None, {"x": x[None], "t": np.array([0.25], np.float32)})[0].reshape(-1)
    got = Emulator.load(out).run(np.rint(x * 255).astype(np.uint8))[0].reshape(-1)
    assert 10 * np.log10(np.sum(ref ** 2) / np.sum((ref - got) ** 2)) > 30
    assert "'t' pinned to 0.25" in load(str(m), ConvertOptions(input_values=(("t", (0.25,)),), progress=False)).input_note
    rc, text, _ = cli(capsys, "compare", m, out, "--dataset", ds)     # the value from the kmodel's metadata
    assert rc == 0 and float(next(ln for ln in text.splitlines() if ln.startswith("y ")).split()[1]) > 30
    for flag, needles in (("tt=1", ("no input 'tt'", "nearest: 't'", "'x', 't'")),
                          ("t=1,2", ("2 values for input 't' of shape (1,)", "give 1 value")),
                          ("x=0", ("pins every input",))):
        more = ["--input-value", "t=1"] if flag == "x=0" else []
        rc, _, err = cli(capsys, "convert", m, tmp_path / "bad.kmodel", "--dataset", ds, "--input-value", flag, *more, "-q")
        refused(rc, err, *needles)
        nothing_at(tmp_path / "bad.kmodel")


# ---- unwritable or impossible output paths ------------------------------------------------
def _impossible(kind, tmp_path):
    if kind == "missing-folder":
        return tmp_path / "no" / "such" / "folder" / "out.ext", ("does not exist", "mkdir")
    if kind == "directory":
        d = tmp_path / "adir.ext"
        d.mkdir()
        return d, ("folder", "file name")
    if kind == "proc":
        return Path("/proc/tl2k210-out.ext"), ("/proc", "writable")
    if kind == "sys":
        return Path("/sys/tl2k210-out.ext"), ("/sys", "writable")
    if kind == "file-as-folder":
        f = tmp_path / "plain"
        f.write_text("x")
        return f / "out.ext", ("not a folder",)
    raise AssertionError(kind)


OUT_KINDS = ["missing-folder", "directory", "proc", "sys", "file-as-folder"]


def _out(p, ext):
    return Path(str(p).replace(".ext", ext))


@pytest.mark.parametrize("kind", OUT_KINDS)
def test_run_out_unwritable(kind, tmp_path, capsys):
    out, needles = _impossible(kind, tmp_path)
    if kind == "directory":
        out = out.rename(out.parent / "adir.json")
    out = _out(out, ".json")
    x = tmp_path / "x.npy"
    np.save(x, np.zeros((1, 28, 28), np.uint8))
    rc, stdout, err = cli(capsys, "run", kmodel("mnist_v3.kmodel"), "-i", x, "-o", out)
    refused(rc, err, *needles)
    assert "output 0" not in stdout              # found out before running the model
    if kind != "directory":
        nothing_at(out)


@pytest.mark.parametrize("kind", OUT_KINDS)
def test_package_out_unwritable(kind, tmp_path, capsys):
    out, needles = _impossible(kind, tmp_path)
    out = out if kind == "directory" else _out(out, ".kfpkg")
    km = tmp_path / "m.kmodel"
    km.write_bytes(kmodel("mnist_v3.kmodel").read_bytes())
    rc, _, err = cli(capsys, "package", "-o", out, f"{km}@0x300000")
    refused(rc, err, *needles)
    if kind != "directory":
        nothing_at(out)


@pytest.mark.parametrize("kind", OUT_KINDS)
def test_convert_out_unwritable_is_found_before_the_work(kind, model, tmp_path, capsys):
    m, ds = model
    out, needles = _impossible(kind, tmp_path)
    out = out if kind == "directory" else _out(out, ".kmodel")
    rc, _, err = cli(capsys, "convert", m, out, "--dataset", ds)
    refused(rc, err, *needles)
    assert "[1/6]" not in err
    rc, _, err = cli(capsys, "convert", m, tmp_path / "ok.kmodel", "--dataset", ds, "--report",
                     out if kind == "directory" else _out(out, ".json"))
    refused(rc, err, *needles)
    assert "[1/6]" not in err
    nothing_at(tmp_path / "ok.kmodel")


@pytest.mark.parametrize("kind", ["proc", "sys", "a-file", "under-a-file"])
def test_zoo_build_out_unwritable(kind, tmp_path, capsys):
    f = tmp_path / "plain"
    f.write_text("x")
    out, needle = {"proc": (Path("/proc/tl2k210-zoo"), "writable"),
                   "sys": (Path("/sys/tl2k210-zoo"), "writable"),
                   "a-file": (f, "not a folder"), "under-a-file": (f / "zoo", "not a folder")}[kind]
    rc, _, err = cli(capsys, "zoo", "build", "face_detect", "--out", out, "-q")
    refused(rc, err, needle)
    assert f.read_text() == "x"


def test_read_only_filesystem(tmp_path):
    """A real read-only mount (private mount namespace; skipped where unshare is not allowed)."""
    ro = tmp_path / "ro"
    ro.mkdir()
    x = tmp_path / "x.npy"
    np.save(x, np.zeros((1, 28, 28), np.uint8))
    km = kmodel("mnist_v3.kmodel")
    cmd = (f"mount -t tmpfs -o ro,size=64k tmpfs {ro} && PYTHONPATH={REPO} {PY} -m tl2k210.cli "
           f"run {km} -i {x} -o {ro}/out.json")
    probe = subprocess.run(["unshare", "-m", "sh", "-c", f"mount -t tmpfs -o ro tmpfs {ro}"],
                           capture_output=True)
    if probe.returncode:
        pytest.skip("cannot mount a read-only filesystem here (needs unshare -m)")
    res = subprocess.run(["unshare", "-m", "sh", "-c", cmd], capture_output=True, text=True)
    refused(res.returncode, res.stderr, "read-only", "writable")
    assert "output 0" not in res.stdout


@pytest.mark.parametrize("verb", ["package", "run", "convert", "zoo"])
def test_read_only_filesystem_message(verb, model, tmp_path, capsys, monkeypatch):
    """The EROFS branch for every verb that writes, without needing a mount: found before the work."""
    import errno
    import tempfile

    real = tempfile.mkstemp
    ro = tmp_path / "ro"
    ro.mkdir()

    def erofs(*a, **kw):
        if str(kw.get("dir", "")).startswith(str(ro)):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS))
        return real(*a, **kw)
    monkeypatch.setattr(tempfile, "mkstemp", erofs)
    km = tmp_path / "m.kmodel"
    km.write_bytes(kmodel("mnist_v3.kmodel").read_bytes())
    x = tmp_path / "x.npy"
    np.save(x, np.zeros((1, 28, 28), np.uint8))
    m, ds = model
    argv = {"package": ["package", "-o", ro / "o.kfpkg", f"{km}@0x300000"],
            "run": ["run", km, "-i", x, "-o", ro / "o.json"],
            "convert": ["convert", m, ro / "o.kmodel", "--dataset", ds],
            "zoo": ["zoo", "build", "face_detect", "--out", ro / "zoo", "-q"]}[verb]
    rc, out, err = cli(capsys, *argv)
    refused(rc, err, "read-only", "writable")
    assert "[1/6]" not in err and "output 0" not in out
    assert list(ro.iterdir()) == []


# ---- broken .kfpkg packages -------------------------------------------------------------
def _pkg(tmp_path, method=zipfile.ZIP_STORED):
    data = kmodel("mnist_v3.kmodel").read_bytes()[:20000]
    p = tmp_path / "bad.kfpkg"
    with zipfile.ZipFile(p, "w", method) as z:
        z.writestr("flash-list.json", json.dumps(
            {"version": "0.1.0", "files": [{"address": 0x300000, "bin": "m.kmodel", "sha256Prefix": False}]},
            indent=4))
        z.writestr("m.kmodel", data)
    return p


def _patch_member(p, name, **fields):
    """Patch the local and central headers of member `name` (flags, method, crc, csize, usize)."""
    b = bytearray(p.read_bytes())
    nb = name.encode()
    offs = {"local": {"flags": 6, "method": 8, "crc": 14, "csize": 18, "usize": 22, "name": 30},
            "central": {"flags": 8, "method": 10, "crc": 16, "csize": 20, "usize": 24, "name": 46}}
    for sig, kind in ((b"PK\x03\x04", "local"), (b"PK\x01\x02", "central")):
        i = 0
        while (i := b.find(sig, i)) >= 0:
            o = offs[kind]
            if b[i + o["name"]:i + o["name"] + len(nb)] == nb:
                for k, v in fields.items():
                    fmt = "<H" if k in ("flags", "method") else "<I"
                    struct.pack_into(fmt, b, i + o[k], v)
            i += 4
    p.write_bytes(b)
    return p


def _data_offset(p, name):
    b = p.read_bytes()
    i = b.find(b"PK\x03\x04" + b"\x00" * 0)
    while True:
        n, e = struct.unpack_from("<HH", b, i + 26)
        if b[i + 30:i + 30 + n] == name.encode():
            return i + 30 + n + e
        i = b.find(b"PK\x03\x04", i + 4)


def _bad_crc(tmp_path):
    p = _pkg(tmp_path)
    b = bytearray(p.read_bytes())
    b[_data_offset(p, "m.kmodel") + 100] ^= 0xFF
    p.write_bytes(b)
    return p


def _lying_size(tmp_path):
    p = _pkg(tmp_path, zipfile.ZIP_DEFLATED)
    return _patch_member(p, "m.kmodel", usize=40000)


def _corrupt_deflate(tmp_path):
    p = _pkg(tmp_path, zipfile.ZIP_DEFLATED)
    b = bytearray(p.read_bytes())
    o = _data_offset(p, "m.kmodel")
    b[o:o + 64] = bytes(range(64))
    p.write_bytes(b)
    return p


def _nested(tmp_path):
    p = tmp_path / "bad.kfpkg"
    with zipfile.ZipFile(p, "w") as z:
        z.writestr("flash-list.json", '{"files": ' + "[" * 100000 + "]" * 100000 + "}")
    return p


KFPKG_CASES = {
    "bad-crc": (_bad_crc, ("m.kmodel", "corrupt")),
    "lying-size": (_lying_size, ("m.kmodel", "corrupt")),
    "lying-size-small": (lambda t: _patch_member(_pkg(t, zipfile.ZIP_DEFLATED), "m.kmodel", usize=1000),
                         ("m.kmodel", "corrupt")),
    "lying-size-stored": (lambda t: _patch_member(_pkg(t), "m.kmodel", usize=30000, csize=30000),
                          ("m.kmodel", "corrupt")),
    "corrupt-deflate": (_corrupt_deflate, ("m.kmodel", "corrupt")),
    "encrypted": (lambda t: _patch_member(_pkg(t), "m.kmodel", flags=1), ("encrypted", "without")),
    "unknown-method": (lambda t: _patch_member(_pkg(t), "m.kmodel", method=99), ("compression", "99")),
    "nested-manifest": (_nested, ("flash-list.json", "nested")),
    "members-exceed-flash": (lambda t: _zeros_bomb(t), ("add up", "flash")),
    "manifest-lies-about-size": (lambda t: _manifest_bomb(t), ("flash-list.json", "corrupt")),
    "overlapping-images": (lambda t: _overlapping(t), ("a.bin (0x300000..0x301000) overlaps b.bin",
                                                       "from 0x301000")),
}


def _overlapping(tmp_path):
    p = tmp_path / "bad.kfpkg"
    files = [{"address": a, "bin": n, "sha256Prefix": False} for a, n in ((0x300000, "a.bin"), (0x300800, "b.bin"))]
    with zipfile.ZipFile(p, "w") as z:
        z.writestr("flash-list.json", json.dumps({"version": "0.1.0", "files": files}, indent=4))
        z.writestr("a.bin", bytes(4096))
        z.writestr("b.bin", bytes(4096))
    return p


def _zeros_bomb(tmp_path):
    """Three 6 MiB members (a few KB deflated): more than the 16 MiB flash together."""
    p = tmp_path / "bad.kfpkg"
    files = [{"address": a, "bin": f"z{i}.bin", "sha256Prefix": False}
             for i, a in enumerate((0x200000, 0x800000, 0xE00000))]
    with zipfile.ZipFile(p, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("flash-list.json", json.dumps({"version": "0.1.0", "files": files}, indent=4))
        for f in files:
            z.writestr(f["bin"], bytes(6 << 20))
    return p


def _manifest_bomb(tmp_path):
    p = tmp_path / "bad.kfpkg"
    with zipfile.ZipFile(p, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("flash-list.json", " " * (64 << 20))
    return _patch_member(p, "flash-list.json", usize=100)


@pytest.mark.parametrize("case", list(KFPKG_CASES))
def test_broken_kfpkg(case, tmp_path, capsys):
    make, needles = KFPKG_CASES[case]
    pkg = make(tmp_path)
    keep = Frozen(pkg)
    out = tmp_path / "out.kfpkg"
    rc, _, err = cli(capsys, "package", "-o", out, pkg)
    refused(rc, err, "bad.kfpkg", *needles)
    nothing_at(out)
    rc, _, err = cli(capsys, "flash", "-p", tmp_path / "no-port", pkg)
    refused(rc, err, "bad.kfpkg", *needles)
    rc, out, err = cli(capsys, "inspect", pkg)          # the same reader, the same error
    refused(rc, err, "bad.kfpkg", *needles)
    assert out == ""
    keep.check()


def test_kfpkg_manifest_with_a_bom_reads_like_kflash(tmp_path, capsys):
    """Windows editors save flash-list.json with a UTF-8 BOM; kflash's json.loads(bytes) takes it."""
    data = kmodel("mnist_v3.kmodel").read_bytes()
    p = tmp_path / "bom.kfpkg"
    with zipfile.ZipFile(p, "w") as z:
        z.writestr("flash-list.json", b"\xef\xbb\xbf" + json.dumps(
            {"version": "0.1.0", "files": [{"address": 0x300000, "bin": "m.kmodel", "sha256Prefix": False}]}).encode())
        z.writestr("m.kmodel", data)
    from tl2k210.flash.kfpkg import read_kfpkg
    assert [(i.address, i.data) for i in read_kfpkg(p)] == [(0x300000, data)]


# ---- run -i ---------------------------------------------------------------------------------
RUN_INPUTS = {
    "not-npy": (lambda d: ((d / "x.npy").write_bytes(b"\x93NUMPY garbage"), d / "x.npy")[-1], ("x.npy", "not a .npy")),
    "object": (lambda d: _npy(d / "x.npy", np.array([None] * 784, object)), ("object", "numbers")),
    "string": (lambda d: _npy(d / "x.npy", np.array(["a"] * 784)), ("str", "numbers")),
    "structured": (lambda d: _npy(d / "x.npy", np.zeros(784, [("a", "u1"), ("b", "u1")])), ("numbers",)),
    "complex": (lambda d: _npy(d / "x.npy", np.zeros(784, np.complex64)), ("complex",)),
    "nan": (lambda d: _npy(d / "x.npy", np.full((1, 28, 28), np.nan, np.float32)), ("nan",)),
    "inf": (lambda d: _npy(d / "x.npy", np.full((1, 28, 28), np.inf, np.float32)), ("inf",)),
    "fractions": (lambda d: _npy(d / "x.npy", np.full((1, 28, 28), 0.5, np.float32)), ("0..255", "uint8")),
    "huge-claim": (lambda d: _huge_npy(d / "x.npy"), ("declares",)),
    "wrong-size": (lambda d: _npy(d / "x.npy", np.zeros((3, 28, 27), np.uint8)), ("(1, 28, 28)",)),
    "bomb-png": (lambda d: bomb_png(d / "x.png"), ("30000x30000", "downscale")),
    "truncated-png": (lambda d: _truncated(d / "x.png"), ("x.png",)),
    "float-tiff": (lambda d: (Image.fromarray(np.full((8, 8), 0.5, np.float32)).save(d / "x.tiff"),
                              d / "x.tiff")[-1], ("floating-point",)),
    "directory": (lambda d: ((d / "x.png").mkdir(), d / "x.png")[-1], ("folder",)),
    "missing": (lambda d: d / "missing.png", ("no such file",)),
}


def _truncated(path):
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (64, 64, 3), np.uint8)).save(path)
    path.write_bytes(path.read_bytes()[:300])
    return path


@pytest.mark.parametrize("case", list(RUN_INPUTS))
def test_run_bad_input(case, tmp_path, capsys):
    make, needles = RUN_INPUTS[case]
    x = make(tmp_path)
    keep = Frozen(*[x] if x.is_file() else [])
    result = tmp_path / "result.json"
    rc, out, err = cli(capsys, "run", kmodel("mnist_v3.kmodel"), "-i", x, "-o", result)
    last = refused(rc, err, *needles)
    assert "output 0" not in out
    assert "kmodel is corrupt" not in last      # the array is blamed, not the model
    keep.check()
    nothing_at(result)


@pytest.mark.parametrize("anchors,needles", [
    ("a,b,c,d", ("--anchors", "number")),
    ("1,2,3", ("pairs",)),
    (",".join(["1"] * 14), ("7 anchors", "30")),           # 7 pairs for a 5-anchor output
    ("-1,2," + ",".join(map(str, FACE_ANCHORS[2:])), ("positive",)),
    ("0,2," + ",".join(map(str, FACE_ANCHORS[2:])), ("positive",)),
    ("nan,2," + ",".join(map(str, FACE_ANCHORS[2:])), ("positive",)),
], ids=["not-numbers", "odd", "7-pairs-for-5", "negative", "zero", "nan"])
def test_yolo_anchors_checked_before_running(anchors, needles, tmp_path, capsys):
    img = tmp_path / "p.png"
    Image.fromarray(np.full((240, 320, 3), 100, np.uint8)).save(img)
    keep = Frozen(img)
    rc, out, err = cli(capsys, "run", kmodel("facedetect_320x240_v3.kmodel"), "-i", img,
                       "--decode", "yolo2", f"--anchors={anchors}", "-o", tmp_path / "boxes.png")
    refused(rc, err, *needles)
    assert "output 0" not in out                # checked against the output shape before running
    keep.check()
    nothing_at(tmp_path / "boxes.png")


@pytest.mark.parametrize("flag,value", [("--threshold", "1.5"), ("--threshold", "nan"),
                                        ("--nms", "-0.1")])
def test_yolo_thresholds_are_probabilities(flag, value, tmp_path, capsys):
    img = tmp_path / "p.png"
    Image.fromarray(np.full((240, 320, 3), 100, np.uint8)).save(img)
    with pytest.raises(SystemExit) as e:
        main(["run", str(kmodel("facedetect_320x240_v3.kmodel")), "-i", str(img), "--decode", "yolo2",
              "--anchors", ",".join(map(str, FACE_ANCHORS)), flag, value])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert flag in err and "0" in err and "1" in err and "Traceback" not in err


# ---- flash -b ----------------------------------------------------------------------------
@pytest.mark.parametrize("baud", ["0", "-5", str(10 ** 12), "7", "abc", "2500000"])
def test_flash_baud_rates_are_validated(baud, tmp_path, capsys):
    fw = tmp_path / "fw.bin"
    fw.write_bytes(b"\x11" * 1000)
    with pytest.raises(SystemExit) as e:
        main(["flash", "-p", str(tmp_path / "no-port"), "-b", baud, str(fw)])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--baud" in err and "115200" in err and "Traceback" not in err


def test_flash_baud_above_the_boards_bridge(tmp_path, capsys):
    """The CH552 bridge of the Maix Bit with mic is reported unreliable above 1.5 Mbaud
    (docs/flash-protocol.md#baud-rates)."""
    fw = tmp_path / "fw.bin"
    fw.write_bytes(b"\x11" * 1000)
    rc, _, err = cli(capsys, "flash", "-p", tmp_path / "no-port", "-B", "bit_mic", "-b", "2000000", fw)
    refused(rc, err, "1500000", "bit_mic", "-b")


def test_flash_sane_baud_gets_to_the_port(tmp_path, capsys):
    fw = tmp_path / "fw.bin"
    fw.write_bytes(b"\x11" * 1000)
    rc, _, err = cli(capsys, "flash", "-p", tmp_path / "no-port", "-b", "115200", fw)
    refused(rc, err, "no-port")


# ---- output into a closed pipe -------------------------------------------------------------
@pytest.mark.parametrize("verb", ["inspect", "inspect-json"])
def test_output_into_a_closed_pipe_exits_quietly(verb):
    """`tl2k210 inspect M | head -1`: the reader is gone; exit quietly like Unix tools do."""
    r, w = os.pipe()
    os.close(r)
    args = ["inspect", kmodel("facedetect_320x240_v3.kmodel")] + (["--json"] if verb.endswith("json") else [])
    try:
        res = subprocess.run([PY, "-m", "tl2k210.cli", *map(str, args)], stdout=w, stderr=subprocess.PIPE,
                             text=True, env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=120)
    finally:
        os.close(w)
    assert res.stderr == "", res.stderr
    assert res.returncode == 141


def test_head_minus_one():
    res = subprocess.run(f"{PY} -m tl2k210.cli inspect {kmodel('facedetect_320x240_v3.kmodel')} | head -1",
                         shell=True, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert res.stdout.count("\n") == 1 and "kmodel v3" in res.stdout
    assert res.stderr == ""


def tensorlayer_file(path, act="'relu'", layer="'class': 'Conv2d', 'args': {'n_filter': 4, 'act': ACT, "
                     "'name': 'c1', 'layer_type': 'normal'}"):
    """A TensorLayer `Model.save` .h5 as TensorLayer 2.x lays it out (model_config text, layer_names,
    one weight group per layer), with `act` / `layer` put into its model_config text."""
    import h5py
    text = ("{'name': 'm', 'version_info': {'tensorlayer_version': '2.1.0'}, 'model_architecture': ["
            "{'class': '_InputLayer', 'args': {'shape': [None, 16, 16, 3], 'dtype': tf.float32, 'name': 'input', "
            "'layer_type': 'normal'}, 'prev_layer': None}, {" + layer.replace("ACT", act)
            + ", 'prev_layer': ['input_node_0']}], 'inputs': 'input_node_0', 'outputs': 'c1_node_0'}")
    with h5py.File(path, "w") as f:
        f.attrs["model_config"] = np.bytes_(text.encode())
        f.attrs["layer_names"] = np.array([b"input", b"c1"], "S")
        for name in ("input", "c1"):
            f.create_group(name).attrs["weight_names"] = np.array([], "S1")
    return path


@pytest.mark.parametrize("act, layer, needles", [
    ("__import__('os').system('touch {marker}')", None,
     ["a call", "__import__('os').system", "model_architecture[1].args.act"]),
    ("lambda x: open('{marker}', 'w')", None, ["a lambda", "model_architecture[1].args.act"]),
    ("tf.io.write_file", None, ["unknown name", "tf.io.write_file"]),
    ("'relu'", "'class': 'SubpixelConv2d', 'args': {'scale': 2, 'n_out_channels': None, 'act': ACT, 'name': 'c1', "
     "'layer_type': 'normal'}", ["SubpixelConv2d(scale=2, n_out_channels=None, act=", "--network"]),
])
def test_tensorlayer_model_file_with_code_is_refused_unrun(act, layer, needles, model, tmp_path, capsys):
    """A TensorLayer Model.save file whose model_config holds more than literals and the known tf.*
    names (TensorLayer itself would eval it): refused by name and place, never run (issue 28)."""
    _, ds = model
    marker = tmp_path / "ran"
    h5 = tensorlayer_file(tmp_path / "m.h5", act.format(marker=marker), *([layer] if layer else []))
    keep = Frozen(h5)
    out = tmp_path / "out.kmodel"
    rc, _, err = cli(capsys, "convert", h5, out, "--dataset", ds)
    refused(rc, err, "m.h5", *needles)
    assert not marker.exists()
    nothing_at(out)
    keep.check()


# =============================================================================================
# 4. No silent wrong results
# =============================================================================================
def test_16bit_png_is_scaled_not_clipped(tmp_path, capsys):
    rng = np.random.default_rng(1)
    img8 = rng.integers(0, 256, (28, 28), dtype=np.uint16)
    png16(tmp_path / "g16.png", img8 * 257)                 # the same picture, 16 bits deep
    Image.fromarray(img8.astype(np.uint8)).save(tmp_path / "g8.png")
    rgb8 = rng.integers(0, 256, (28, 28, 3), dtype=np.uint16)
    png16(tmp_path / "rgb16.png", rgb8 * 257)
    Image.fromarray(rgb8.astype(np.uint8)).save(tmp_path / "rgb8.png")
    from tl2k210 import imaging
    for a, b in (("g16", "g8"), ("rgb16", "rgb8")):
        x16 = imaging.to_model_input(imaging.load_rgb(tmp_path / f"{a}.png"), (3, 28, 28))
        x8 = imaging.to_model_input(imaging.load_rgb(tmp_path / f"{b}.png"), (3, 28, 28))
        assert np.array_equal(x16, x8) and x8.std() > 50
    outs = []
    for n in ("g16", "g8"):
        rc, out, err = cli(capsys, "run", kmodel("mnist_v3.kmodel"), "-i", tmp_path / f"{n}.png",
                           "-o", tmp_path / f"{n}.npy")
        assert rc == 0, err
        outs.append(np.load(tmp_path / f"{n}.npy"))
    assert np.array_equal(outs[0], outs[1])
    # calibration sees the same pixels too
    from tl2k210.quantize.dataset import load_image
    assert np.array_equal(load_image(tmp_path / "g16.png", (1, 1, 28, 28)),
                          load_image(tmp_path / "g8.png", (1, 1, 28, 28)))


@pytest.mark.parametrize("mode", ["P", "PA", "CMYK", "LA", "RGBA", "1", "I"])
def test_other_image_modes_load_as_rgb(mode, tmp_path):
    from tl2k210 import imaging
    base = Image.fromarray(np.random.default_rng(0).integers(0, 256, (16, 16, 3), np.uint8))
    im = base.convert(mode) if mode not in ("I",) else base.convert("L").convert("I")
    p = tmp_path / ("x.tiff" if mode in ("CMYK", "I", "PA") else "x.png")
    im.save(p)
    rgb = imaging.load_rgb(p)
    assert rgb.mode == "RGB" and rgb.size == (16, 16)
    if mode == "I":       # 32-bit integer image with 8-bit values: not clipped, not scaled
        assert np.array_equal(np.asarray(rgb)[..., 0], np.asarray(base.convert("L")))


def test_animated_gif_uses_the_first_frame_and_says_so(tmp_path, capsys):
    frames = [Image.new("L", (28, 28), v) for v in (10, 200, 90)]
    frames[0].save(tmp_path / "a.gif", save_all=True, append_images=frames[1:])
    rc, out, err = cli(capsys, "run", kmodel("mnist_v3.kmodel"), "-i", tmp_path / "a.gif")
    assert rc == 0 and "3 frames" in err and "first" in err


def test_exif_rotated_photo_is_upright(tmp_path):
    """A phone photo stored sideways with EXIF orientation 6 is what the user sees upright."""
    from tl2k210 import imaging
    up = np.zeros((20, 10, 3), np.uint8)
    up[:5] = 255                                    # white band at the top
    stored = Image.fromarray(up).transpose(Image.Transpose.ROTATE_90)   # as the sensor wrote it
    exif = Image.Exif()
    exif[0x0112] = 6                                # rotate 90 CW to display
    stored.save(tmp_path / "p.jpg", exif=exif, quality=100)
    a = np.asarray(imaging.load_rgb(tmp_path / "p.jpg"))
    assert a.shape == (20, 10, 3) and a[:5].mean() > 200 and a[-5:].mean() < 50


def test_yolo_decode_of_a_model_without_a_region_output(tmp_path, capsys):
    x = tmp_path / "x.npy"
    np.save(x, np.zeros((1, 28, 28), np.uint8))
    rc, out, err = cli(capsys, "run", kmodel("mnist_v3.kmodel"), "-i", x, "--decode", "yolo2",
                       "--anchors", "1,2,3,4", "-o", tmp_path / "o.json")
    refused(rc, err, "10-value output", "--decode none")
    assert "output 0" not in out
    nothing_at(tmp_path / "o.json")


def test_anchor_count_that_divides_the_channels_is_checked_against_labels(tmp_path, capsys):
    """facedetect: 30 channels = 5 anchors x (5 + 1 class). 3 anchors divide 30 too (5 classes)."""
    img = tmp_path / "p.png"
    Image.fromarray(np.full((240, 320, 3), 100, np.uint8)).save(img)
    three = ",".join(map(str, FACE_ANCHORS[:6]))
    rc, out, err = cli(capsys, "run", kmodel("facedetect_320x240_v3.kmodel"), "-i", img,
                       "--decode", "yolo2", "--anchors", three, "--labels", "face")
    refused(rc, err, "3 anchors", "1 label", "30")
    assert "output 0" not in out
    # without labels the interpretation is stated, never silent
    rc, out, err = cli(capsys, "run", kmodel("facedetect_320x240_v3.kmodel"), "-i", img,
                       "--decode", "yolo2", "--anchors", three)
    assert rc == 0 and "3 anchors x (5 + 5 classes)" in out + err
    rc, out, err = cli(capsys, "run", kmodel("facedetect_320x240_v3.kmodel"), "-i", img,
                       "--decode", "yolo2", "--anchors", ",".join(map(str, FACE_ANCHORS)), "--labels", "face")
    assert rc == 0 and "5 anchors x (5 + 1 classes)" in out + err


@pytest.mark.parametrize("labels,needles", [("/missing/labels.txt", ("no labels file", "/missing/labels.txt")),
                                            ("labels.txt", ("no labels file",)),
                                            ("DIR", ("folder",))])
def test_labels_that_name_a_missing_file_are_an_error(labels, needles, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    if labels == "DIR":
        (tmp_path / "lab").mkdir()
        labels = str(tmp_path / "lab")
    img = tmp_path / "p.png"
    Image.fromarray(np.full((240, 320, 3), 100, np.uint8)).save(img)
    rc, out, err = cli(capsys, "run", kmodel("facedetect_320x240_v3.kmodel"), "-i", img, "--decode", "yolo2",
                       "--anchors", ",".join(map(str, FACE_ANCHORS)), "--labels", labels,
                       "-o", tmp_path / "boxes.png")
    refused(rc, err, *needles)
    assert "output 0" not in out
    nothing_at(tmp_path / "boxes.png")


def test_float_input_model_refuses_non_finite(tmp_path, capsys):
    x = tmp_path / "x.npy"
    np.save(x, np.array([1.0, np.nan, 2.0, 3.0], np.float32))
    rc, out, err = cli(capsys, "run", kmodel("iris_v3.kmodel"), "-i", x, "-o", tmp_path / "r.npy")
    refused(rc, err, "nan")
    np.save(x, np.array([1e300, 3.5, 1.4, 0.2], np.float64))    # Inf once cast to float32
    rc, out, err = cli(capsys, "run", kmodel("iris_v3.kmodel"), "-i", x, "-o", tmp_path / "r.npy")
    refused(rc, err, "float32", "inf")
    nothing_at(tmp_path / "r.npy")
    np.save(x, np.array([5.1, 3.5, 1.4, 0.2], np.float64))      # float64 is fine
    rc, out, err = cli(capsys, "run", kmodel("iris_v3.kmodel"), "-i", x)
    assert rc == 0, err


# =============================================================================================
# 5. Clean-up: SIGTERM, umask, flash addresses
# =============================================================================================
def _wait_for(proc, needle, timeout=60):
    t0 = time.monotonic()
    seen = ""
    while time.monotonic() - t0 < timeout:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            break
        seen += line
        if needle in line:
            return seen
    proc.kill()
    _, err = proc.communicate()
    raise AssertionError(f"never saw {needle!r}: {seen} (exit {proc.returncode}) {err}")


def _sigterm_leaves_nothing(argv, ready, tmp_path, sig=signal.SIGTERM):
    tmp = tmp_path / "TMP"
    tmp.mkdir()
    env = dict(os.environ, PYTHONPATH=str(REPO), TMPDIR=str(tmp), PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([PY, "-m", "tl2k210.cli", *map(str, argv)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    _wait_for(proc, ready)
    assert list(tmp.iterdir()), "expected a temporary flash image while running"
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert "Traceback" not in err, err
    assert proc.returncode in (0, 128 + sig), (proc.returncode, err)
    assert not list(tmp.iterdir()), f"left behind: {list(tmp.rglob('*'))}"


def test_sigterm_board_removes_its_flash_image(tmp_path):
    _sigterm_leaves_nothing(["board", "--pty"], "DTR/RTS socket", tmp_path)


def test_sighup_board_removes_its_flash_image(tmp_path):
    """The terminal that ran `tl2k210 board --pty` was closed."""
    _sigterm_leaves_nothing(["board", "--pty"], "DTR/RTS socket", tmp_path, signal.SIGHUP)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_sigterm_demo_removes_its_flash_image(sig, tmp_path):
    script = tmp_path / "loop.py"
    script.write_text("import time\nprint('ready')\nwhile True:\n    time.sleep(0.05)\n")
    img = tmp_path / "p.png"
    Image.fromarray(np.full((240, 320, 3), 100, np.uint8)).save(img)
    _sigterm_leaves_nothing(["demo", script, "--image", img, "--kmodel", kmodel("mnist_v3.kmodel"),
                             "--out", tmp_path / "lcd.png"], "ready", tmp_path, sig)


@pytest.fixture
def umask022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def _mode(p):
    return Path(p).stat().st_mode & 0o777


def test_outputs_follow_the_umask(umask022, model, tmp_path, capsys):
    km = tmp_path / "m.kmodel"
    km.write_bytes(kmodel("mnist_v3.kmodel").read_bytes())
    assert cli(capsys, "package", "-o", tmp_path / "p.kfpkg", f"{km}@0x300000")[0] == 0
    x = tmp_path / "x.npy"
    np.save(x, np.zeros((1, 28, 28), np.uint8))
    assert cli(capsys, "run", km, "-i", x, "-o", tmp_path / "r.json")[0] == 0
    m, ds = model
    assert cli(capsys, "convert", m, tmp_path / "c.kmodel", "--dataset", ds, "-q",
               "--report", tmp_path / "c.json")[0] == 0
    assert cli(capsys, "compare", m, tmp_path / "c.kmodel", "--dataset", ds,
               "--json", tmp_path / "cmp.json")[0] == 0
    # deploy keeps its package (-o) even when no board answers
    assert cli(capsys, "deploy", km, "-o", tmp_path / "d.kfpkg", "-p", tmp_path / "noport")[0] == 2
    script = tmp_path / "show.py"
    script.write_text("import lcd, image\nlcd.init()\nlcd.display(image.Image())\n")
    rc, _, err = cli(capsys, "demo", script, "--image", ds / "0.png", "--out", tmp_path / "lcd.png")
    assert rc == 0, err
    for f in ("p.kfpkg", "r.json", "c.kmodel", "c.kmodel.json", "c.json", "cmp.json", "d.kfpkg", "lcd.png"):
        assert _mode(tmp_path / f) == 0o644, f
    os.umask(0o077)
    assert cli(capsys, "run", km, "-i", x, "-o", tmp_path / "private.json")[0] == 0
    assert _mode(tmp_path / "private.json") == 0o600
    # replacing an existing file keeps its mode
    os.chmod(tmp_path / "r.json", 0o664)
    assert cli(capsys, "run", km, "-i", x, "-o", tmp_path / "r.json")[0] == 0
    assert _mode(tmp_path / "r.json") == 0o664


@pytest.mark.parametrize("address,needles", [
    ("0x100000", ("firmware region", "0x300000")),
    ("0x300100", ("4 KiB",)),
    ("0xD00000", ("SPIFFS",)),
])
def test_package_warns_for_risky_addresses(address, needles, tmp_path, capsys):
    km = tmp_path / "m.kmodel"
    km.write_bytes(kmodel("mnist_v3.kmodel").read_bytes())
    rc, out, err = cli(capsys, "package", "-o", tmp_path / "p.kfpkg", f"{km}@{address}")
    assert rc == 0 and (tmp_path / "p.kfpkg").exists()      # a warning, not a refusal
    assert "warning:" in err
    for n in needles:
        assert n in err
    rc, out, err = cli(capsys, "package", "-o", tmp_path / "q.kfpkg", f"{km}@0x300000")
    assert rc == 0 and "warning" not in err


def test_firmware_at_zero_is_not_warned_about(tmp_path, capsys):
    fw = tmp_path / "maixpy.bin"
    fw.write_bytes(b"\x11" * 5000)
    rc, out, err = cli(capsys, "package", "-o", tmp_path / "p.kfpkg", f"{fw}@0")
    assert rc == 0 and "warning" not in err


# =============================================================================================
# 6. demo runs arbitrary Python: say so
# =============================================================================================
def test_demo_help_says_it_runs_python(capsys):
    with pytest.raises(SystemExit):
        main(["demo", "--help"])
    text = " ".join(capsys.readouterr().out.split()).lower()
    assert "runs the script as python on this computer" in text and "trust" in text
    readme = " ".join((REPO / "README.md").read_text().split()).lower()
    assert "runs the script as python on this computer" in readme


# =============================================================================================
# more of the same classes: numeric flags, other paths, other files
# =============================================================================================
@pytest.mark.parametrize("argv,needle", [
    (["convert", "M", "o.kmodel", "--dataset", "D", "--calib-limit", "0"], "--calib-limit"),
    (["convert", "M", "o.kmodel", "--dataset", "D", "--input-range", "1,0"], "--input-range"),
    (["convert", "M", "o.kmodel", "--dataset", "D", "--input-range", "a"], "--input-range"),
    (["convert", "M", "o.kmodel", "--dataset", "D", "--std", "0"], "--std"),
    (["convert", "M", "o.kmodel", "--dataset", "D", "--mean", "nan"], "--mean"),
    (["convert", "M", "o.kmodel", "--dataset", "D", "--input-shape", "1,3,a,8"], "--input-shape"),
    (["convert", "M", "o.kmodel", "--dataset", "D", "--input-shape", "1,3,0,8"], "--input-shape"),
    (["compare", "M", "K", "--dataset", "D", "--limit", "-1"], "--limit"),
    (["board", "--pty", "--fault-rate", "2", "--for", "1"], "--fault-rate"),
    (["board", "--pty", "--fault-rate", "1", "--for", "1"], "--fault-rate"),    # log(0) in the board
    (["board", "--pty", "--for", "-1"], "--for"),
    (["board", "--pty", "--fault-kinds", "melt", "--for", "1"], "--fault-kinds"),
    (["board", "--pty", "--wiring", "nope", "--for", "1"], "--wiring"),
    (["demo", "face-detect", "--image", "I", "--frames", "0"], "--frames"),
    (["demo", "face-detect", "--image", "I", "--press", "-1"], "--press"),
    (["demo", "face-detect", "--image", "I", "--address", "zz"], "--address"),
    (["deploy", "K", "-a", "zz"], "--address"),
])
def test_numeric_flags_are_range_checked(argv, needle, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err


def test_flags_are_taken_only_as_spelled(capsys):
    """argparse's prefix matching read `run --rgb` (a flag of `compare`: RGB order) as `--rgb565`
    without a word (round 65's second hunt): a flag a verb does not have is refused."""
    with pytest.raises(SystemExit) as e:
        main(["run", "m.kmodel", "x.png", "--rgb"])
    assert e.value.code == 2 and "unrecognized arguments: --rgb" in capsys.readouterr().err


def test_convert_mean_std_count_must_match_channels(model, tmp_path, capsys):
    m, ds = model
    rc, _, err = cli(capsys, "convert", m, tmp_path / "o.kmodel", "--dataset", ds, "--mean", "1,2", "-q")
    refused(rc, err, "--mean", "3")
    nothing_at(tmp_path / "o.kmodel")


def test_convert_classify_labels_must_match_the_output(model, tmp_path, capsys):
    """Coral's MobileNet v1 (1001 classes: background first) converted with ImageNet's 1000 labels
    and --task classify: the metadata took them, every label the board printed one off."""
    m, ds = model
    labels = ",".join(f"c{i}" for i in range(2047))
    rc, _, err = cli(capsys, "convert", m, tmp_path / "o.kmodel", "--dataset", ds, "--task", "classify",
                     "--labels", labels, "-q")
    refused(rc, err, "2047 label(s)", "2048-way", "background class first")
    nothing_at(tmp_path / "o.kmodel")


@pytest.mark.parametrize("case", ["missing-model", "model-is-a-folder", "missing-network",
                                  "dataset-missing", "zero-byte-model"])
def test_convert_bad_paths(case, model, tmp_path, capsys):
    m, ds = model
    argv = ["convert", m, tmp_path / "o.kmodel", "--dataset", ds, "-q"]
    if case == "missing-model":
        argv[1] = tmp_path / "nope.onnx"
    elif case == "model-is-a-folder":
        argv[1] = ds
    elif case == "missing-network":
        argv += ["--network", tmp_path / "nope.py"]
    elif case == "dataset-missing":
        argv[4] = tmp_path / "nope"
    else:
        (tmp_path / "z.onnx").write_bytes(b"")
        argv[1] = tmp_path / "z.onnx"
    rc, _, err = cli(capsys, *argv)
    refused(rc, err)
    nothing_at(tmp_path / "o.kmodel")


@pytest.mark.parametrize("what", ["folder", "dev-zero", "missing", "empty"])
def test_inspect_bad_paths(what, tmp_path, capsys):
    p = {"folder": tmp_path, "dev-zero": Path("/dev/zero"), "missing": tmp_path / "no.kmodel",
         "empty": tmp_path / "e.kmodel"}[what]
    if what == "empty":
        p.write_bytes(b"")
    rc, _, err = cli(capsys, "inspect", p)
    refused(rc, err)


def test_deploy_missing_firmware(tmp_path, capsys):
    km = tmp_path / "m.kmodel"
    km.write_bytes(kmodel("mnist_v3.kmodel").read_bytes())
    rc, _, err = cli(capsys, "deploy", km, "--firmware", tmp_path / "nope.bin", "-p", tmp_path / "np")
    refused(rc, err, "nope.bin")


def test_compare_a_kmodel_of_another_model(model, tmp_path, capsys):
    """compare M K where K was not converted from M: a message, not a reshape error (exit 3)."""
    m, ds = model
    rc, _, err = cli(capsys, "compare", m, kmodel("mnist_v3.kmodel"), "--dataset", ds)
    refused(rc, err, "not a conversion", "(3, 16, 16)", "(1, 28, 28)", "converted from")


def test_compare_yolo_without_anchors(model, tmp_path, capsys):
    m, ds = model
    rc, _, err = cli(capsys, "compare", m, kmodel("facedetect_320x240_v3.kmodel"), "--dataset", ds,
                     "--decode", "yolo2")
    refused(rc, err, "--anchors")


def test_demo_bad_images_are_refused_cleanly(tmp_path, capsys):
    bomb = bomb_png(tmp_path / "bomb.png")
    rc, _, err = cli(capsys, "demo", "face-detect", "--image", bomb, "--kmodel",
                     kmodel("facedetect_320x240_v3.kmodel"), "--out", tmp_path / "o.png")
    refused(rc, err, "30000x30000")
    nothing_at(tmp_path / "o.png")


def test_demo_flash_image_must_be_a_flash_image(tmp_path, capsys):
    img = tmp_path / "p.png"
    Image.fromarray(np.full((240, 320, 3), 100, np.uint8)).save(img)
    km = tmp_path / "m.kmodel"
    km.write_bytes(kmodel("facedetect_320x240_v3.kmodel").read_bytes())
    rc, _, err = cli(capsys, "demo", "face-detect", "--image", img, "--flash", km, "--out", tmp_path / "o.png")
    refused(rc, err, "16 MiB", "--kmodel")


@pytest.fixture
def char_device(tmp_path):
    """A private twin of /dev/null (same device numbers) in tmp_path: if a regression replaced it
    with a file, only this copy is lost."""
    import stat
    p = tmp_path / "null"
    try:
        os.mknod(p, stat.S_IFCHR | 0o666, os.stat("/dev/null").st_rdev)
    except (PermissionError, OSError):
        pytest.skip("cannot create a device node here")
    return p


def test_device_outputs_are_streamed_not_replaced(char_device, tmp_path, capsys):
    """`-o /dev/null` must not rename a file over the device (as root that replaces it)."""
    import stat
    km = tmp_path / "m.kmodel"
    km.write_bytes(kmodel("mnist_v3.kmodel").read_bytes())
    before = os.stat(char_device)
    rc, _, err = cli(capsys, "package", "-o", char_device, f"{km}@0x300000")
    assert rc == 0, err
    after = os.stat(char_device)
    assert stat.S_ISCHR(after.st_mode) and (before.st_ino, before.st_rdev) == (after.st_ino, after.st_rdev)


def test_fifo_output_is_streamed(tmp_path, capsys):
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    rfd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)       # a reader is there: writing never blocks
    try:
        x = tmp_path / "x.npy"
        np.save(x, np.zeros((1, 28, 28), np.uint8))
        rc, _, err = cli(capsys, "run", kmodel("mnist_v3.kmodel"), "-i", x, "-o", fifo)
        assert rc == 0, err
        try:
            got = os.read(rfd, 1 << 20)
        except BlockingIOError:
            got = b""
    finally:
        os.close(rfd)
    assert fifo.is_fifo() and got and json.loads(got)["outputs"]


def test_block_device_output_is_refused(tmp_path, capsys):
    import stat
    p = tmp_path / "disk"
    try:
        os.mknod(p, stat.S_IFBLK | 0o600, os.makedev(7, 200))
    except (PermissionError, OSError):
        pytest.skip("cannot create a device node here")
    km = tmp_path / "m.kmodel"
    km.write_bytes(kmodel("mnist_v3.kmodel").read_bytes())
    rc, _, err = cli(capsys, "package", "-o", p, f"{km}@0x300000")
    refused(rc, err, "device")
    assert stat.S_ISBLK(os.stat(p).st_mode)


# =============================================================================================
# fuzz: mutated files through the CLI paths above
# =============================================================================================
def _mutate(data, rng, n=None):
    d = bytearray(data)
    for _ in range(n or int(rng.integers(1, 6))):
        kind = rng.integers(4)
        if kind == 0 and d:
            d[int(rng.integers(len(d)))] = int(rng.integers(256))
        elif kind == 1 and len(d) > 8:
            del d[int(rng.integers(len(d) // 2, len(d))):]
        elif kind == 2 and len(d) > 16:
            at = int(rng.integers(0, len(d) - 4))
            struct.pack_into("<I", d, at, int(rng.choice([0, 1, 0xFFFF, 0x7FFFFFFF, 0xFFFFFFFF])))
        else:
            at = int(rng.integers(len(d) + 1))
            d[at:at] = bytes(rng.integers(0, 256, int(rng.integers(1, 64)), dtype=np.uint8))
    return bytes(d)


def _fuzz(capsys, argv_for, base, tmp_path, n, seed, suffix, out=None):
    rng = np.random.default_rng(seed)
    rcs = {}
    for i in range(n):
        if out is not None and Path(out).exists():
            Path(out).unlink()
        f = tmp_path / f"f{i % 4}{suffix}"
        f.write_bytes(_mutate(base, rng))
        rc, _, err = cli(capsys, *argv_for(f))
        assert rc in (0, 2), (i, rc, err)
        assert "Traceback" not in err
        if rc == 2:
            last = err.strip().splitlines()[-1]
            assert last.startswith("tl2k210 ") and ": error: " in last, err
            assert FIX.search(last.split(": error: ", 1)[1]), f"no fix named in: {last}"
            if out is not None:
                nothing_at(out)
        rcs[rc] = rcs.get(rc, 0) + 1
    return rcs


@pytest.mark.slow
def test_fuzz_kfpkg_through_package_and_flash(tmp_path, capsys):
    base = data_path("kfpkg", "face_model_at_0x300000.kfpkg").read_bytes()
    out = tmp_path / "out" / "o.kfpkg"
    out.parent.mkdir()
    rcs = _fuzz(capsys, lambda f: ["package", "-o", out, f], base, tmp_path, 150, 1, ".kfpkg", out)
    assert rcs.get(2, 0) > 50
    for p in out.parent.iterdir():
        assert p.name == "o.kfpkg"
    # flash reads the package before it opens the port: every case ends in one clean line
    rcs = _fuzz(capsys, lambda f: ["flash", "-p", tmp_path / "no-port", f], base, tmp_path, 60, 9, ".kfpkg")
    assert rcs == {2: 60}
    # inspect lists what survives the reader and describes the kmodel inside; the rest is refused
    rcs = _fuzz(capsys, lambda f: ["inspect", f], base, tmp_path, 100, 11, ".kfpkg")
    assert rcs.get(2, 0) > 30
    # ... and a damaged kmodel in an intact package (valid CRCs) gets the kmodel's clean error
    with zipfile.ZipFile(io.BytesIO(base)) as z:
        manifest, km = z.read("flash-list.json"), z.read("facedetect.kmodel")
    rng, rcs = np.random.default_rng(12), {}
    for i in range(40):
        p = tmp_path / "m.kfpkg"
        with zipfile.ZipFile(p, "w") as z:
            z.writestr("flash-list.json", manifest)
            z.writestr("facedetect.kmodel", _mutate(km, rng))
        rc, out, err = cli(capsys, "inspect", p)
        assert rc in (0, 2) and "Traceback" not in err, (i, err)
        assert "facedetect.kmodel  0x300000" in out           # listed either way
        if rc == 2:
            assert f"{p}:facedetect.kmodel (at 0x300000)" in err.strip().splitlines()[-1], err
        rcs[rc] = rcs.get(rc, 0) + 1
    assert rcs.get(2, 0) > 5, rcs


@pytest.mark.slow
def test_fuzz_kmodels_through_inspect_and_run(tmp_path, capsys):
    x = tmp_path / "x.npy"
    np.save(x, np.zeros((1, 28, 28), np.uint8))
    base = kmodel("mnist_v3.kmodel").read_bytes()
    rcs = _fuzz(capsys, lambda f: ["inspect", f], base, tmp_path, 150, 2, ".kmodel")
    assert rcs.get(2, 0) > 30 and rcs.get(0, 0) > 10
    out = tmp_path / "o.json"
    with np.errstate(all="ignore"):
        rcs = _fuzz(capsys, lambda f: ["run", f, "-i", x, "-o", out], base, tmp_path, 80, 3, ".kmodel", out)
    assert rcs.get(2, 0) > 10


@pytest.mark.slow
def test_fuzz_images_through_run(tmp_path, capsys):
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (40, 40, 3), np.uint8)).save(buf, "PNG")
    png = buf.getvalue()
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (40, 40, 3), np.uint8)).save(buf, "JPEG")
    rcs = _fuzz(capsys, lambda f: ["run", kmodel("mnist_v3.kmodel"), "-i", f], png, tmp_path, 120, 4, ".png")
    rcs2 = _fuzz(capsys, lambda f: ["run", kmodel("mnist_v3.kmodel"), "-i", f], buf.getvalue(), tmp_path,
                 120, 5, ".jpg")
    assert rcs.get(2, 0) > 20 and rcs2.get(0, 0) + rcs2.get(2, 0) == 120


@pytest.mark.slow
def test_fuzz_arrays_through_run_and_calibration(tmp_path, capsys):
    buf = io.BytesIO()
    np.save(buf, np.zeros((1, 28, 28), np.uint8))
    rcs = _fuzz(capsys, lambda f: ["run", kmodel("mnist_v3.kmodel"), "-i", f], buf.getvalue(), tmp_path,
                150, 6, ".npy")
    assert rcs.get(2, 0) > 50
    from tl2k210.errors import Tl2k210Error
    from tl2k210.quantize.dataset import load_dataset
    buf = io.BytesIO()
    np.savez(buf, a=np.zeros((2, 3, 16, 16), np.float32), b=np.ones((1, 3, 16, 16), np.float32))
    rng = np.random.default_rng(7)
    ok = bad = 0
    for i in range(150):
        f = tmp_path / f"d{i % 4}.npz"
        f.write_bytes(_mutate(buf.getvalue(), rng))
        try:
            xs = load_dataset(f, (1, 3, 16, 16))
            assert all(x.shape == (1, 3, 16, 16) and np.isfinite(x).all() for x in xs)
            ok += 1
        except Tl2k210Error:
            bad += 1
    assert ok + bad == 150 and bad > 50


@pytest.mark.slow
def test_fuzz_calibration_arrays_through_convert(model, tmp_path, capsys):
    m, _ = model
    buf = io.BytesIO()
    np.savez(buf, a=np.random.default_rng(0).random((3, 3, 16, 16), np.float32))
    out = tmp_path / "o.kmodel"
    rcs = _fuzz(capsys, lambda f: ["convert", m, out, "--dataset", f, "-q"], buf.getvalue(), tmp_path,
                12, 8, ".npz", out)
    assert rcs.get(2, 0) >= 6



_PIECES = ["1", "2.5", "-1", "0", "-0", "nan", "inf", "-inf", "1e309", "0x10", "", " ", "a", "1e-300",
           "\u0663", "1_0", "--", "9" * 30, "115200", "2000000", "1500000"]


def _junk(rng, sep=","):
    return sep.join(str(rng.choice(_PIECES)) for _ in range(int(rng.integers(0, 14))))


def _cli_or_usage(capsys, *argv):
    """Like cli(), an argparse usage error (SystemExit 2) counts as exit 2."""
    try:
        return cli(capsys, *argv)
    except SystemExit as e:
        cap = capsys.readouterr()
        return e.code, cap.out, cap.err


@pytest.mark.slow
def test_fuzz_flag_values(model, tmp_path, capsys):
    """Junk number lists for --anchors, --mean/--std/--input-range and -b: a usage error or one
    clean line, never a traceback, and nothing written."""
    m, ds = model
    img = tmp_path / "p.png"
    Image.fromarray(np.full((240, 320, 3), 100, np.uint8)).save(img)
    fw = tmp_path / "fw.bin"
    fw.write_bytes(b"\x11" * 1000)
    rng = np.random.default_rng(11)
    refusals = [0, 0, 0]
    for i in range(150):
        j = _junk(rng)
        argv = [["run", kmodel("facedetect_320x240_v3.kmodel"), "-i", img, "--decode", "yolo2",
                 f"--anchors={j}", "-o", tmp_path / "o.png"],
                ["convert", m, tmp_path / "o.kmodel", "--dataset", ds, "-q",
                 rng.choice(["--mean", "--std", "--input-range"]) + f"={j}"],
                ["flash", "-p", tmp_path / "no-port", "-b", j.replace(",", ""), fw]][i % 3]
        rc, out, err = _cli_or_usage(capsys, *argv)
        assert rc in (0, 2), (argv, rc, err)
        assert "Traceback" not in err and "internal error" not in err, (argv, err)
        refusals[i % 3] += rc == 2
        if rc == 2 and ": error: " in err.strip().splitlines()[-1]:
            assert FIX.search(err.strip().splitlines()[-1].split(": error: ", 1)[1]) or \
                "argument" in err, err
        for p in (tmp_path / "o.png", tmp_path / "o.kmodel"):
            if rc == 2:
                nothing_at(p)
            elif p.exists():
                p.unlink()
    assert min(refusals) > 30, refusals


def test_input_shape_the_strides_do_not_divide(tmp_path, capsys):
    """A stride-2 conv, a 2x upsample and an Add back to the input: at 9x9 the maps are 10x10 and
    9x9. Refused at the Add, naming both shapes and what to give instead; nothing written."""
    from onnx import TensorProto, helper, numpy_helper
    w = numpy_helper.from_array(np.full((3, 3, 3, 3), 0.1, np.float32), "w")
    scales = numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], strides=[2, 2], pads=[1, 1, 1, 1], name="down"),
             helper.make_node("Resize", ["c", "", "scales"], ["u"], mode="nearest", name="up"),
             helper.make_node("Add", ["u", "x"], ["y"], name="skip")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 8, 8])], [w, scales])
    src = tmp_path / "skip.onnx"
    src.write_bytes(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString())
    out = tmp_path / "skip.kmodel"
    rc, _, err = cli(capsys, "convert", src, out, "--input-shape", "1,3,9,9")
    refused(rc, err, "'skip'", "1x3x10x10", "1x3x9x9", "input shape that its strides divide")
    assert not out.exists()
    # the same maps at the size the file itself fixes: no input size to blame, the file's graph
    # is inconsistent (what tf2onnx wrote for a style-transfer TFLite file whose convs it skipped)
    g.input[0].type.tensor_type.shape.dim[2].dim_value = g.input[0].type.tensor_type.shape.dim[3].dim_value = 9
    src.write_bytes(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString())
    rc, _, err = cli(capsys, "convert", src, out)
    refused(rc, err, "'skip'", "1x3x10x10", "1x3x9x9", "at the input size the file itself fixes, so the graph "
            "read from it (made by", "is inconsistent there")
    assert not out.exists()


@pytest.mark.parametrize("name, verb", [("model.tflite", "convert"), ("model.onnx", "convert"),
                                        ("model.kmodel", "inspect"), ("model.kmodel", "run")])
def test_a_git_lfs_pointer_is_named_as_one(name, verb, tmp_path, capsys):
    """A clone without git-lfs holds ~130-byte pointer files where the models are: each verb says
    so and how to fetch them (hunt 17: TFLite's reader had called one damaged)."""
    p = tmp_path / name
    p.write_text("version https://git-lfs.github.com/spec/v1\noid sha256:" + "ab" * 32 + "\nsize 1234567\n")
    argv = {"convert": ["convert", p, tmp_path / "o.kmodel", "--dataset", tmp_path],
            "inspect": ["inspect", p], "run": ["run", p, "-i", p]}[verb]
    rc, out, err = cli(capsys, *argv)
    refused(rc, err, "Git LFS pointer", "git lfs pull")
    assert not (tmp_path / "o.kmodel").exists()

"""MODEL.kmodel.json as untrusted input (issue 25, items 5-8).

A sidecar (or a .kfpkg member) is validated once, when it is read: a wrong type, a value the
matching flag would refuse, a non-finite number, a newer or absurd version, deep nesting, a
missing required key -- each is "ignored with a warning" naming the key, before anything is done
with it. Only a regular file of at most 1 MiB is read; it is written atomically and never
through a link planted in its place.
"""
import json
import math
import os
import shutil
import threading

import pytest

from conftest import FACE_ANCHORS, data_path
from tl2k210 import metadata
from tl2k210.cli import main

FACE = ("kmodels", "facedetect_320x240_v3.kmodel")


def base_doc(data, name="face.kmodel"):
    """The metadata `zoo build` writes for the face detector, as a JSON dict."""
    meta = metadata.build(data, name, input={
        "layout": "NCHW", "shape": [1, 3, 240, 320], "dtype": "uint8", "range": [0.0, 1.0],
        "mean": [0.0], "std": [1.0], "bgr": False},
        outputs=[{"name": "out", "shape": [1, 30, 15, 20]}], task="yolo2", anchors=FACE_ANCHORS,
        labels=["face"], decode={"threshold": 0.5, "nms": 0.3},
        firmware={"runtime": "maixpy", "budget_bytes": 5_000_000, "needs_bytes": 1_000_000,
                  "script": "face_detect.py", "flash_address": "0x300000"}, source="face.onnx")
    return json.loads(meta.to_json())


def sidecar(tmp_path, text=None, edit=None, **top):
    """tmp_path/face.kmodel (the testdata face detector) and its MODEL.kmodel.json: the valid
    document with `top` keys replaced and `edit(doc)` applied, or the raw `text`."""
    km = tmp_path / "face.kmodel"
    shutil.copy(data_path(*FACE), km)
    doc = base_doc(km.read_bytes())
    doc.update(top)
    if edit is not None:
        edit(doc)
    metadata.path_for(km).write_text(text if text is not None else json.dumps(doc))
    return km


def _set(path, value):
    def edit(doc):
        d = doc
        keys = path.split(".")
        for k in keys[:-1]:
            d = d[k]
        if value is _DEL:
            del d[keys[-1]]
        else:
            d[keys[-1]] = value
    return edit


_DEL = object()

# item 5: parseable but malformed; item 6: values the flags would refuse
MALFORMED = {
    "outputs-not-dicts": ("outputs", _set("outputs", [1, 2])),
    "output-without-shape": ("outputs[0].shape", _set("outputs", [{"name": "x"}])),
    "needs-bytes-text": ("firmware.needs_bytes", _set("firmware.needs_bytes", "lots")),
    "input-without-shape": ("input.shape", _set("input.shape", _DEL)),
    "kmodel-without-file": ("kmodel.file", _set("kmodel.file", _DEL)),
    "range-text": ("input.range", _set("input.range", "ab")),
    "shape-bool": ("input.shape", _set("input.shape", [1, True, 240, 320])),
    "labels-not-text": ("labels", _set("labels", ["a", 3])),
    "anchors-text": ("anchors", _set("anchors", ["1", 2])),
    "task-unknown": ("task", _set("task", "mine")),
    "threshold-nan": ("decode.threshold", _set("decode.threshold", math.nan)),
    "threshold-negative": ("decode.threshold", _set("decode.threshold", -1)),
    "threshold-bool": ("decode.threshold", _set("decode.threshold", True)),
    "nms-7": ("decode.nms", _set("decode.nms", 7)),
    "bgr-text": ("input.bgr", _set("input.bgr", "no")),
    "std-zero": ("input.std", _set("input.std", [0])),
    "mean-inf": ("input.mean", _set("input.mean", [math.inf])),
    "pinned-list": ("input.pinned", _set("input.pinned", [0.5])),
    "pinned-text": ("input.pinned.t", _set("input.pinned", {"t": ["half"]})),
    "constants-list": ("constants", _set("constants", [1, 2])),
    "constant-short": ("constants.a.values", _set("constants", {"a": {"shape": [1, 3], "values": [1.0, 2.0]}})),
    "flash-address-negative": ("firmware.flash_address", _set("firmware.flash_address", -5)),
    "flash-address-huge": ("firmware.flash_address", _set("firmware.flash_address", "0x1000000")),
    "flash-address-text": ("firmware.flash_address", _set("firmware.flash_address", "here")),
    "version-overflow": ("version", None),
    "version-bool": ("version", _set("version", True)),
    "nan-anywhere": ("decode.extra", _set("decode.extra", math.nan)),
    "sha256-list": ("kmodel.sha256", _set("kmodel.sha256", [1, 2])),
}


def _malformed(tmp_path, case):
    key, edit = MALFORMED[case]
    if case == "version-overflow":
        km = sidecar(tmp_path)
        p = metadata.path_for(km)
        p.write_text(p.read_text().replace('"version": 1', '"version": 1e999', 1))
        return key, km
    return key, sidecar(tmp_path, edit=edit)


def ignored(err, *needles):
    assert "Traceback" not in err
    warn = [ln for ln in err.splitlines() if ln.startswith("warning: ") and "ignoring it" in ln]
    assert warn, err
    for n in needles:
        assert n in warn[0], warn[0]
    return warn[0]


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_sidecar_is_ignored_with_a_warning(case, tmp_path, capsys):
    key, km = _malformed(tmp_path, case)
    rc = main(["inspect", str(km)])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    ignored(cap.err, key)
    assert "metadata (" not in cap.out
    rc = main(["inspect", "--json", str(km)])
    cap = capsys.readouterr()
    assert rc == 0 and json.loads(cap.out)["metadata"] is None


def test_deep_nesting_is_ignored_with_a_warning(tmp_path, capsys):
    km = sidecar(tmp_path)
    p = metadata.path_for(km)
    text = p.read_text().rstrip()
    assert text.endswith("}")
    p.write_text(text[:-1] + ', "deep": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    assert main(["inspect", str(km)]) == 0
    ignored(capsys.readouterr().err, "nested too deep")


def test_valid_sidecar_still_reads(tmp_path, capsys):
    km = sidecar(tmp_path)
    assert main(["inspect", str(km)]) == 0
    cap = capsys.readouterr()
    assert "warning" not in cap.err and "labels            face" in cap.out
    assert metadata.load_for(km).flash_address == 0x300000


@pytest.mark.parametrize("case", ["sha256-list", "sha256-dict"])
def test_malformed_package_member_is_ignored(case, tmp_path, capsys):
    from tl2k210.flash.kfpkg import FlashImage, write_kfpkg
    data = data_path(*FACE).read_bytes()
    doc = base_doc(data)
    doc["kmodel"]["sha256"] = [1, 2] if case == "sha256-list" else {}
    p = tmp_path / "p.kfpkg"
    write_kfpkg([FlashImage(0x300000, data, False, "face.kmodel", "face.kmodel")], p,
                extras={"face.kmodel.json": json.dumps(doc).encode()})
    rc = main(["inspect", str(p)])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    ignored(cap.err, "kmodel.sha256")


def test_run_refuses_nan_threshold_from_the_sidecar(tmp_path, capsys):
    """decode.threshold NaN gave 0 boxes; -1 with nms 7 gave 1,500: now the sidecar is ignored
    (the defaults 0.5 / 0.3 hold) with a warning naming the key."""
    skdata = pytest.importorskip("skimage.data")
    from PIL import Image
    Image.fromarray(skdata.astronaut()).save(tmp_path / "a.png")
    km = sidecar(tmp_path, edit=_set("decode", {"threshold": -1, "nms": 7}))
    rc = main(["run", str(km), "-i", str(tmp_path / "a.png"), "--decode", "yolo2", "--anchors",
               ",".join(map(str, FACE_ANCHORS))])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    ignored(cap.err, "decode.")
    assert "threshold 0.5, NMS 0.3" in cap.out


def test_deploy_package_ignores_a_bad_flash_address(tmp_path, capsys):
    """flash_address -5 with --force wrote a package its own reader rejects."""
    from tl2k210.flash.kfpkg import read_kfpkg
    km = sidecar(tmp_path, edit=_set("firmware.flash_address", -5))
    rc = main(["deploy", str(km), "--force", "-o", str(tmp_path / "p.kfpkg"), "-p",
               str(tmp_path / "no-port")])
    cap = capsys.readouterr()
    ignored(cap.err, "firmware.flash_address")
    assert [i.address for i in read_kfpkg(tmp_path / "p.kfpkg")] == [0x300000]
    assert rc == 2          # no board on that port: the package is written before flashing


# ---- 7: what is read and how it is written -------------------------------------------------
def test_sidecar_on_dev_zero_is_not_read(tmp_path, capsys):
    km = sidecar(tmp_path)
    p = metadata.path_for(km)
    p.unlink()
    p.symlink_to("/dev/zero")
    assert main(["inspect", str(km)]) == 0
    ignored(capsys.readouterr().err, "regular file")


def test_sparse_giant_sidecar_is_not_read(tmp_path, capsys):
    km = sidecar(tmp_path)
    with open(metadata.path_for(km), "r+b") as fh:
        fh.truncate(1 << 30)
    assert main(["inspect", str(km)]) == 0
    ignored(capsys.readouterr().err, "1 MiB")


def test_fifo_sidecar_does_not_hang(tmp_path, capsys):
    km = sidecar(tmp_path)
    p = metadata.path_for(km)
    p.unlink()
    os.mkfifo(p)
    done = []
    t = threading.Thread(target=lambda: done.append(metadata.load_for(km)), daemon=True)
    t.start()
    t.join(10)
    if t.is_alive():            # unblock the reader before failing
        with open(p, "w"):
            pass
        pytest.fail("reading a FIFO sidecar hangs")
    assert done == [None]
    ignored(capsys.readouterr().err, "regular file")


def test_sidecar_is_never_written_through_a_link(tmp_path):
    km = tmp_path / "m.kmodel"
    shutil.copy(data_path(*FACE), km)
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    metadata.path_for(km).symlink_to(victim)
    meta = metadata.ModelMetadata.from_dict(base_doc(km.read_bytes(), "m.kmodel"))
    metadata.write_for(km, meta)
    assert victim.read_text() == "keep me"
    assert not metadata.path_for(km).is_symlink()
    assert metadata.load_for(km) == meta


# ---- 8: encoding and JSON out ------------------------------------------------------------------
def test_non_utf8_sidecar_warns(tmp_path, capsys):
    km = sidecar(tmp_path)
    p = metadata.path_for(km)
    p.write_bytes(p.read_bytes().replace(b'"face"', b'"f\xffce"'))
    assert main(["inspect", str(km)]) == 0
    ignored(capsys.readouterr().err, "UTF-8")


def test_inspect_json_is_strict_json(tmp_path, capsys):
    km = sidecar(tmp_path, edit=_set("decode.threshold", math.nan))
    assert main(["inspect", "--json", str(km)]) == 0
    out = capsys.readouterr().out

    def no_constants(name):
        raise AssertionError(f"{name} in the JSON output")
    json.loads(out, parse_constant=no_constants)

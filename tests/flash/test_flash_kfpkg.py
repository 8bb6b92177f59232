"""kfpkg reading (tolerant and safe) and writing (kflash-compatible), FILE@ADDR arguments."""
import json
import re
import zipfile

import pytest

from flash_helpers import payload, run_tl2k210, shared_testdata
from tl2k210.flash.errors import KfpkgError
from tl2k210.flash.kfpkg import (FlashImage, manifest_text, parse_image_arg, parse_manifest,
                                 read_kfpkg, write_kfpkg)


def kflash_reads(text):
    """kflash 1.1.6's own manifest parsing (docs/flash-protocol.md#kfpkg), reproduced for the check."""
    doc = json.loads(re.sub(r'"address": (.*),', r'"address": "\1",', text))
    return [(int(f["address"], 0), f["bin"], f["sha256Prefix"]) for f in doc["files"]]


def make_pkg(path, manifest, members):
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("flash-list.json", manifest if isinstance(manifest, str)
                    else json.dumps(manifest, indent=4))
        for name, data in members.items():
            zf.writestr(name, data)
    return path


def test_real_package_from_maixpy_scripts():
    imgs = read_kfpkg(shared_testdata() / "kfpkg" / "face_model_at_0x300000.kfpkg")
    assert [(i.address, i.name, len(i.data), i.envelope) for i in imgs] == \
        [(0x300000, "facedetect.kmodel", 388776, False)]
    assert imgs[0].data[:4] == b"\x03\x00\x00\x00"          # kmodel v3


def test_hex_literal_manifest_is_accepted():
    text = (shared_testdata() / "kfpkg" / "standalone_demo_flash-list.json").read_text()
    files = parse_manifest(text)
    assert [(f["address"], f["bin"], f["sha256Prefix"]) for f in files] == \
        [(0, "face_detect.bin", True), (0xA00000, "detect.kmodel", False)]


def test_written_manifest_is_read_by_kflash_rules(tmp_path):
    imgs = [FlashImage(0x300000, payload(1000), False, "m.kmodel"),
            FlashImage(0, payload(500, 1), True, "fw.bin")]
    out = write_kfpkg(imgs, tmp_path / "o.kfpkg")
    text = zipfile.ZipFile(out).read("flash-list.json").decode()
    assert text == manifest_text(imgs)
    assert kflash_reads(text) == [(0x300000, "m.kmodel", False), (0, "fw.bin", True)]
    back = read_kfpkg(out)
    assert [(i.address, i.data, i.envelope) for i in back] == \
        [(i.address, i.data, i.envelope) for i in imgs]


@pytest.mark.parametrize("files, members, match", [
    ([{"address": 0, "bin": "../evil.bin", "sha256Prefix": False}], {"../evil.bin": b"x"},
     "path traversal"),
    ([{"address": 0, "bin": "/etc/passwd", "sha256Prefix": False}], {}, "path traversal"),
    ([{"address": 0x300000, "bin": "a.bin"}, {"address": 0x300000, "bin": "b.bin"}],
     {"a.bin": b"x" * 10, "b.bin": b"y"}, "same address|overlaps"),
    ([{"address": 0x300000, "bin": "a.bin"}, {"address": 0x300004, "bin": "b.bin"}],
     {"a.bin": b"x" * 10, "b.bin": b"y"}, "overlaps"),
    ([{"address": 0x300000, "bin": "a.bin"}, {"address": 0x300000, "bin": "a.bin"}],
     {"a.bin": b"x"}, "same address"),
    ([{"address": 0xFFFFF0, "bin": "a.bin"}], {"a.bin": b"x" * 64}, "beyond"),
    ([{"address": 0x300000, "bin": "gone.bin"}], {}, "not in the package"),
    ([{"address": "banana", "bin": "a.bin"}], {"a.bin": b"x"}, "not a number"),
    ([], {}, "no files"),
])
def test_unsafe_or_broken_packages_are_rejected(tmp_path, files, members, match):
    p = make_pkg(tmp_path / "bad.kfpkg", {"version": "0.1.0", "files": files}, members)
    with pytest.raises(KfpkgError, match=match):
        read_kfpkg(p)


def test_a_member_listed_at_two_addresses_is_flashed_at_both(tmp_path):
    """LoBo MicroPython's OTA package writes config.bin at 0x4000 and its backup at 0x5000; kflash
    flashes each entry, tl2k210 had refused the package ("listed twice"; round 66's second hunt)."""
    cfg = payload(64, 3)
    p = make_pkg(tmp_path / "ota.kfpkg", {"files": [{"address": 0x4000, "bin": "config.bin"},
                                                    {"address": 0x5000, "bin": "config.bin"}]}, {"config.bin": cfg})
    assert [(i.address, i.data, i.name) for i in read_kfpkg(p)] == [(0x4000, cfg, "config.bin"),
                                                                    (0x5000, cfg, "config.bin")]


def test_absurd_member_size_rejected(tmp_path):
    p = make_pkg(tmp_path / "big.kfpkg", {"files": [{"address": 0, "bin": "a.bin"}]},
                 {"a.bin": b"\0" * (17 * 1024 * 1024)})
    with pytest.raises(KfpkgError, match="more than the whole flash"):
        read_kfpkg(p)


def test_not_a_zip_and_no_manifest(tmp_path):
    (tmp_path / "x.kfpkg").write_bytes(b"hello")
    with pytest.raises(KfpkgError, match="not a readable"):
        read_kfpkg(tmp_path / "x.kfpkg")
    with zipfile.ZipFile(tmp_path / "y.kfpkg", "w") as zf:
        zf.writestr("a.bin", b"x")
    with pytest.raises(KfpkgError, match="flash-list.json"):
        read_kfpkg(tmp_path / "y.kfpkg")


def test_image_arguments(tmp_path):
    (tmp_path / "fw.bin").write_bytes(b"\x13" * 16)
    (tmp_path / "m.kmodel").write_bytes(b"\x03\0\0\0")
    [fw] = parse_image_arg(str(tmp_path / "fw.bin"))
    assert (fw.address, fw.envelope) == (0, True)
    [m] = parse_image_arg(str(tmp_path / "m.kmodel") + "@0x300000")
    assert (m.address, m.envelope) == (0x300000, False)
    with pytest.raises(KfpkgError, match="0x300000"):
        parse_image_arg(str(tmp_path / "m.kmodel"))          # a model needs an address


def test_package_cli_writes_a_kflash_readable_package(tmp_path):
    (tmp_path / "m.kmodel").write_bytes(payload(3000))
    (tmp_path / "fw.bin").write_bytes(payload(2000, 2))
    out = tmp_path / "out.kfpkg"
    rc, text = run_tl2k210(["package", f"{tmp_path}/m.kmodel@0x300000", f"{tmp_path}/fw.bin@0",
                            "-o", str(out)])
    assert rc == 0, text
    manifest = zipfile.ZipFile(out).read("flash-list.json").decode()
    assert kflash_reads(manifest) == [(0x300000, "m.kmodel", False), (0, "fw.bin", True)]
    rc, text = run_tl2k210(["package", f"{tmp_path}/m.kmodel@0x300000",
                            f"{tmp_path}/fw.bin@0x300100", "-o", str(tmp_path / "x.kfpkg")])
    assert rc == 2 and "overlaps" in text and not (tmp_path / "x.kfpkg").exists()


def test_a_package_of_another_firmware_gets_no_maixpy_layout_warnings():
    """LoBo MicroPython's bootloader and config at 0x1000-0x5000, a standalone-SDK program's model
    at 0xE00000: their packages lay the flash out their own way, so the MaixPy firmware-region and
    SPIFFS warnings were false alarms (round 66's second hunt). Alignment still counts."""
    from tl2k210.flash.layout import address_warnings
    model = FlashImage(0xE00000, b"\x01" * 64, False, "aug.kmodel")
    other = FlashImage(0, b"\x13" * 64 + b"Kendryte standalone demo", True, "app.bin")
    maixpy = FlashImage(0, b"\x13" * 64 + b"MicroPython v0.6.2 MaixPy", True, "maixpy.bin")
    assert address_warnings([other, model]) == []
    assert any("SPIFFS" in w for w in address_warnings([maixpy, model]))
    odd = FlashImage(0x1001, b"x", False, "odd.bin")
    assert [w for w in address_warnings([other, odd]) if "4 KiB aligned" in w]

"""`tl2k210 inspect PACKAGE.kfpkg`: what a package writes where, and what each image is.

The package goes through the reader of `flash` and `package` (`read_kfpkg`), so a broken one
gets the same error (bad CRC, sizes that lie, corrupt deflate, overlapping images ...); the
warnings are `package`'s (firmware region, SPIFFS, alignment). Each kmodel inside is described
exactly as `tl2k210 inspect` describes a kmodel file.
"""
from __future__ import annotations

import hashlib
import zipfile
from dataclasses import asdict

from tl2k210.errors import KmodelFormatError
from tl2k210.flash import image as fw_image
from tl2k210.flash.kfpkg import MANIFEST, _swap32, read_kfpkg
from tl2k210.flash.layout import FIRMWARE_MARK, address_warnings
from tl2k210.tables import printable, text_table

ZIP_MAGIC = b"PK\x03\x04"


def is_package(path) -> bool:
    """A .kfpkg by name, or any ZIP archive file (a package saved under another name; a pipe
    is not sniffed: its first bytes would be lost to the kmodel reader)."""
    import os
    if str(path).lower().endswith(".kfpkg"):
        return True
    if not os.path.isfile(path):
        return False
    try:
        with open(path, "rb") as fh:
            return fh.read(4) == ZIP_MAGIC
    except OSError:
        return False


def _kmodel_kind(data: bytes):
    """(kind, summary, model or None) of raw image bytes; a kmodel that does not parse raises
    KmodelFormatError."""
    from tl2k210.k210 import kmodel
    from tl2k210.k210.inspect import describe, summary
    try:
        kmodel.detect_version(data)
        swapped = False
    except KmodelFormatError as exc:
        text = str(exc)
        if "byte-swapped" not in text:
            if text.startswith(("not a kmodel", "file is")):
                return "unknown", "unknown data (neither a firmware image nor a kmodel)", None
            return "other-model", text.split(";")[0], None        # kmodel v1/v5, old model bin
        data, swapped = _swap32(data)[:len(data)], True
    model = kmodel.loads(data)
    text = summary(describe(model))
    return "kmodel", text + (" (32-bit word-swapped, for kpu.load_flash)" if swapped else ""), model


def _classify(img):
    if img.envelope or img.address == 0:
        try:
            payload = img.data if img.envelope else fw_image.unwrap(img.data)
        except fw_image.ImageError:
            pass                    # raw bytes at 0 that are no envelope: say what they are
        else:
            maixpy = FIRMWARE_MARK in payload
            how = ("bootable envelope added when flashed" if img.envelope
                   else "already in its bootable envelope")
            return ("maixpy-firmware" if maixpy else "firmware",
                    f"{'MaixPy ' if maixpy else ''}firmware image ({len(payload):,}-byte payload, "
                    f"{how})", None)
    return _kmodel_kind(img.data)


def describe_package(path, file_size=None) -> dict:
    """The listing of a .kfpkg: every image (file, address, size, sha256, kind, warnings; for a
    kmodel the same dict `inspect --json` gives a kmodel file, under "kmodel"), the members that
    are not flashed, the warnings. A kmodel image that does not parse is reported in "errors"."""
    from tl2k210 import metadata
    from tl2k210.k210.inspect import describe

    images = read_kfpkg(path)
    metas = metadata.kfpkg_metadata(path, images)
    with zipfile.ZipFile(path) as zf:
        names = [i.filename for i in zf.infolist() if not i.is_dir()]
    flashed = {i.name for i in images} | {MANIFEST}
    rows, errors = [], []
    for img in images:
        digest = hashlib.sha256(img.data).hexdigest()
        row = {"name": img.name, "address": img.address, "end": img.end, "size": len(img.data),
               "flash_size": img.flash_size, "sha256Prefix": img.envelope, "sha256": digest,
               "warnings": address_warnings([img]), "kmodel": None}
        try:
            row["kind"], row["summary"], model = _classify(img)
        except KmodelFormatError as exc:
            row["kind"], row["summary"], model = "kmodel", f"unreadable kmodel: {exc}", None
            errors.append(f"{path}:{printable(img.name)} (at 0x{img.address:x}): {exc}")
        if model is not None:
            info = describe(model, f"{path}:{printable(img.name)}", len(img.data))
            meta = metas.get(digest)
            info["metadata"] = asdict(meta) if meta else None
            row["kmodel"] = info
        rows.append(row)
    warnings = [w for r in rows for w in r["warnings"]]
    if not str(path).lower().endswith(".kfpkg"):
        warnings.append(f"{path} is a package, but kflash flashes a ZIP as a package only when "
                        "its name ends in .kfpkg (any other name is written as one raw image): "
                        "rename it")
    return {"file": str(path), "format": "kfpkg", "file_size": file_size, "images": rows,
            "extras": [n for n in names if n not in flashed], "warnings": warnings,
            "errors": errors}


def render_package(info: dict) -> str:
    from tl2k210 import metadata
    from tl2k210.k210.inspect import render

    n = len(info["images"])
    size = f" ({info['file_size']:,} bytes)" if info.get("file_size") is not None else ""
    out = [f"{info['file']}: kfpkg, {n} image{'s' if n != 1 else ''}{size}"]
    cols = ("#", "file", "address", "end", "bytes", "sha256Prefix", "sha256", "kind")
    out += text_table(cols, [(i, printable(r["name"]), f"0x{r['address']:06x}", f"0x{r['end']:06x}",
                              f"{r['size']:,}", "yes" if r["sha256Prefix"] else "no",
                              r["sha256"][:16], printable(r["summary"]))
                             for i, r in enumerate(info["images"])])
    if info["extras"]:
        out.append(f"also in the package, not flashed: {', '.join(map(printable, info['extras']))}")
    out += [f"warning: {printable(w)}" for w in info["warnings"]]
    for r in info["images"]:
        if r["kmodel"] is None:
            continue
        out += ["", render(r["kmodel"])]
        meta = r["kmodel"].get("metadata")
        if meta:
            out.append("\nmetadata (carried in the package, sha256 matches)")
            out += ["  " + ln for ln in metadata.ModelMetadata.from_dict(meta).summary_lines()]
    return "\n".join(out)

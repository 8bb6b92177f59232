"""kmodel files: v3 (read/write) and v4 (read/write), with version detection.

    model = kmodel.load("face.kmodel")   # KModelV3 or KModelV4
    kmodel.save(model, "copy.kmodel")   # atomic write
"""
from __future__ import annotations

import struct

from tl2k210.errors import KmodelFormatError
from tl2k210.fileio import atomic_write, lfs_pointer  # noqa: F401  (re-exported: kmodel.atomic_write)
from tl2k210.k210.kmodel import v3, v4

_SUPPORTED = "tl2k210 reads v3/v4 and writes v3"


def detect_version(data: bytes) -> int:
    """3 or 4; any other recognisable file raises a KmodelFormatError saying what it is and
    which tool or firmware reads it (docs/kmodel-format.md#versions-and-loaders, #reader-rules)."""
    if len(data) < 8:
        raise KmodelFormatError(f"file is {len(data)} bytes, too short for a kmodel header", 0,
                                "version")
    first, second = struct.unpack_from("<II", data, 0)
    if first == v4.IDENTIFIER:
        if second == 4:
            return 4
        if second == 5:
            raise KmodelFormatError(
                "kmodel v5 (nncase 1.x): only the Kendryte standalone SDK (develop since 2021-06) "
                "and CanMV load it; MaixPy refuses it (load error 2015, ERR_UNKNOWN); "
                + _SUPPORTED + ": compile the source model with `tl2k210 convert`", 4, "version")
        if second in (6, 7):
            raise KmodelFormatError(
                f"kmodel v{second} (nncase 2.x, for the Kendryte K230/K510, not the K210): no K210 "
                "firmware loads it; run it with nncase 2.x on a K230 (CanMV-K230); "
                + _SUPPORTED, 4, "version")
        raise KmodelFormatError(f"kmodel v{second} ('KMDL' container of an unknown nncase "
                                "version); K210 firmware loads only v3/v4 (v5 in the SDK); "
                                + _SUPPORTED, 4, "version")
    if first == 3:
        return 3
    if first == 1:
        raise KmodelFormatError(
            "legacy kmodel v1 (Kendryte's 2018 pre-nncase model compiler): only the old standalone "
            "SDK's kpu_model_load_from_buffer reads it; no MaixPy build and no nncase runtime "
            "loads it; " + _SUPPORTED + ": recompile the source model with `tl2k210 convert`",
            0, "version")
    if first == 0x12345678:
        raise KmodelFormatError("very old MaixPy model bin (magic 0x12345678, 2018 model "
                                "compiler; only 2018 MaixPy builds load it); " + _SUPPORTED, 0,
                                "version")
    if first in (0x78563412,) or second == 0x03000000 or first == 0x03000000:
        raise KmodelFormatError("this looks like a byte-swapped kmodel v3 (made for "
                                "kpu.load_flash); swap it back per 32-bit word first", 0, "version")
    if lfs_pointer(data) is not None:
        raise KmodelFormatError(lfs_pointer(data), 0, "version")
    raise KmodelFormatError(f"not a kmodel: first word 0x{first:08x} is neither version 3 nor "
                            "'KMDL'; " + _SUPPORTED, 0, "version")


def loads(data: bytes):
    return v3.read(data) if detect_version(data) == 3 else v4.read(data)


MAX_KMODEL_BYTES = 64 << 20   # 4x the 16 MiB flash of every K210 board; corpus max is 4 MB


def load(path):
    from tl2k210.errors import InputFileError
    from tl2k210.fileio import read_bytes
    try:
        data = read_bytes(path, MAX_KMODEL_BYTES, "kmodel")
    except InputFileError as exc:
        if "larger than" not in str(exc):
            raise KmodelFormatError(str(exc)) from None
        with open(path, "rb") as fh:
            data = fh.read(64)                      # say what it is, if it is no kmodel at all
        message = (f"larger than {MAX_KMODEL_BYTES >> 20} MiB; no K210 kmodel is (the flash of a "
                   "K210 board holds 16 MiB)")
    else:
        message = None
    try:
        if message:
            detect_version(data)
            raise KmodelFormatError(message)
        return loads(data)
    except KmodelFormatError as exc:
        raise KmodelFormatError(f"{path}: {exc}") from None


def dumps(model) -> bytes:
    return v3.write(model) if model.version == 3 else v4.write(model)


def save(model, path):
    atomic_write(path, dumps(model))

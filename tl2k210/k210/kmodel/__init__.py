"""kmodel files: v3 (read/write) and v4 (read/write), with version detection.

    model = kmodel.load("face.kmodel")   # KModelV3 or KModelV4
    kmodel.save(model, "copy.kmodel")   # atomic write
"""
from __future__ import annotations

import os
import struct
import tempfile

from tl2k210.errors import KmodelFormatError
from tl2k210.k210.kmodel import v3, v4

_SUPPORTED = "tl2k210 reads v3/v4 and writes v3"


def detect_version(data: bytes) -> int:
    """3 or 4; any other recognisable file raises a KmodelFormatError saying what it is and
    which tool or firmware reads it (spec §1, §10.x)."""
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
    raise KmodelFormatError(f"not a kmodel: first word 0x{first:08x} is neither version 3 nor "
                            "'KMDL'; " + _SUPPORTED, 0, "version")


def loads(data: bytes):
    return v3.read(data) if detect_version(data) == 3 else v4.read(data)


def load(path):
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        raise KmodelFormatError(f"cannot read {path}: {exc.strerror}") from None
    try:
        return loads(data)
    except KmodelFormatError as exc:
        raise KmodelFormatError(f"{path}: {exc}") from None


def dumps(model) -> bytes:
    return v3.write(model) if model.version == 3 else v4.write(model)


def atomic_write(path, data: bytes):
    """Write via a temporary file in the same folder, then rename: never a half-written file."""
    path = os.fspath(path)
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=os.path.basename(path), dir=d)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def save(model, path):
    atomic_write(path, dumps(model))

"""The stage-2 flash program ("ISP stub").

It is third-party code without published sources, so it is never committed here: it is read at
run time from the installed ``kflash`` package (a hex string of a zlib stream named ``ISP_PROG``
in kflash.py), or from a file given with ``--stub``.
"""
import binascii
import hashlib
import importlib.util
import re
import zlib
from functools import lru_cache

from tl2k210.flash.errors import StubError

KFLASH_116_STUB_SHA256_PREFIX = "757776d0"
_ISP_PROG_RE = re.compile(r"ISP_PROG\s*=\s*'([0-9a-fA-F]+)'")


@lru_cache(maxsize=1)
def kflash_stub() -> bytes:
    """The stub embedded in the installed kflash (16,512 bytes for kflash 1.1.6)."""
    spec = importlib.util.find_spec("kflash")
    if spec is None or not spec.origin:
        raise StubError("the stage-2 flash program comes from the `kflash` package, which is not "
                        "installed; run `pip install kflash==1.1.6` or pass --stub FILE")
    with open(spec.origin, "r", encoding="utf-8", errors="replace") as f:
        m = _ISP_PROG_RE.search(f.read())
    if not m:
        raise StubError(f"no ISP_PROG found in {spec.origin}; install kflash==1.1.6 or pass --stub")
    try:
        return zlib.decompress(binascii.unhexlify(m.group(1)))
    except (binascii.Error, zlib.error) as exc:
        raise StubError(f"the ISP_PROG in {spec.origin} is corrupt ({exc}); reinstall kflash") from exc


def load_stub(path=None) -> bytes:
    """The stub bytes: from ``path`` when given, else from kflash."""
    if path is None:
        return kflash_stub()
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise StubError(f"cannot read stub file {path}: {exc.strerror}") from exc
    if not data:
        raise StubError(f"stub file {path} is empty")
    if len(data) > 1024 * 1024:
        raise StubError(f"stub file {path} is {len(data)} bytes; a stage-2 program is < 1 MiB")
    return data


def stub_id(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()

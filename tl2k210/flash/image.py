"""The firmware envelope the K210 mask ROM boots from flash offset 0.

Layout: ``[flag:1][length:u32 LE][payload:length][SHA-256 of everything before it:32]``.
Flag bit0 = AES-encrypted payload, bit1 = DIO SPI mode (kflash >= 1.1.5 sets it by default).
"""
import hashlib
import struct

from tl2k210.flash.isp import SRAM_SIZE
from tl2k210.k210.board_facts import GENERAL_SRAM_BYTES

FLAG_AES = 0x01
FLAG_DIO = 0x02
ENVELOPE_OVERHEAD = 1 + 4 + 32
MAX_PAYLOAD = GENERAL_SRAM_BYTES   # the ROM copies the payload to general SRAM
assert MAX_PAYLOAD <= SRAM_SIZE
BOOT_FAIL_MESSAGE = ("interesting, something's wrong, boot failed with exit code 233, "
                     "go to find your vendor.")


class ImageError(ValueError):
    """The bytes at flash offset 0 are not a bootable envelope."""


def wrap(payload: bytes, flag: int = FLAG_DIO) -> bytes:
    """Wrap a firmware payload for address 0."""
    head = bytes([flag]) + struct.pack("<I", len(payload)) + bytes(payload)
    return head + hashlib.sha256(head).digest()


def unwrap(flash: bytes) -> bytes:
    """Check an envelope the way the bootrom does and return its payload; raise ImageError
    naming the failed check otherwise. ``flash`` may be longer than the envelope."""
    if len(flash) < ENVELOPE_OVERHEAD:
        raise ImageError("flash too small for a firmware envelope")
    flag = flash[0]
    (length,) = struct.unpack_from("<I", flash, 1)
    if flag & ~(FLAG_AES | FLAG_DIO):
        raise ImageError("invalid flag byte 0x%02x" % flag)
    if length == 0 or length > MAX_PAYLOAD or 5 + length + 32 > len(flash):
        raise ImageError("implausible payload length %d (0x%x)" % (length, length))
    head = bytes(flash[: 5 + length])
    digest = bytes(flash[5 + length: 5 + length + 32])
    if hashlib.sha256(head).digest() != digest:
        raise ImageError("SHA-256 mismatch over %d bytes" % len(head))
    if flag & FLAG_AES:
        raise ImageError("AES-encrypted image (no key in this chip's OTP)")
    return head[5:]

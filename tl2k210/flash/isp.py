"""The K210 ISP packet formats: stage 1 (mask ROM) and stage 2 (the flash stub).

Request (little-endian): ``op:u16, reserved:u16, crc32:u32, address:u32, data_len:u32, data``.
The CRC-32 (zlib) covers bytes 8..end. NOP-type requests (C2, D2, D5, D9) are sent in the
13-byte all-zero form used by kflash and the Kendryte Windows tool; receivers must accept them
without checking length or CRC. A reply is ``[op, reason]`` (2 bytes); ``D1 <reason> <text>`` is
a debug frame. This module is the only place these numbers live.
"""
import struct
import zlib
from dataclasses import dataclass
from enum import IntEnum

from tl2k210.k210.board_facts import FLASH_SECTOR, ROM_BAUD, SRAM_START  # noqa: F401  (isp.*)
from tl2k210.k210.board_facts import SRAM_BYTES as SRAM_SIZE  # noqa: F401

STUB_ADDRESS = 0x80000000         # where kflash loads the stage-2 program and boots it
SRAM_UNCACHED_ALIAS = 0x40000000
ROM_CHUNK = 1024                  # stage-1 MEMORY_WRITE payload used by every tool
FLASH_CHUNK = 65536               # stage-2 FLASH_WRITE maximum payload
HEADER = struct.Struct("<HHIII")  # op, reserved, crc, address, data_len
HEADER_SIZE = HEADER.size         # 16


class Op(IntEnum):
    # stage 1 (ROM)
    ECHO = 0xC1
    NOP = 0xC2
    MEMORY_WRITE = 0xC3
    MEMORY_READ = 0xC4
    MEMORY_BOOT = 0xC5
    CHANGE_BAUDRATE = 0xC6
    DEBUG_INFO = 0xD1
    # stage 2 (stub)
    FLASH_NOP = 0xD2
    FLASH_ERASE = 0xD3
    FLASH_WRITE = 0xD4
    REBOOT = 0xD5
    UARTHS_BAUDRATE_SET = 0xD6
    FLASH_INIT = 0xD7
    FLASH_ERASE_NONBLOCKING = 0xD8
    FLASH_STATUS = 0xD9


class Reason(IntEnum):
    DEFAULT = 0x00
    OK = 0xE0
    BAD_DATA_LEN = 0xE1
    BAD_DATA_CHECKSUM = 0xE2
    INVALID_COMMAND = 0xE3
    BAD_INIT = 0xE4
    BAD_ERASE = 0xE5
    BAD_WRITE = 0xE6
    FLASH_BUSY = 0xE7


# requests that carry no CRC and may be short (the 13-byte zero form)
NOP_OPS = frozenset({Op.NOP, Op.FLASH_NOP, Op.REBOOT, Op.FLASH_STATUS})
STAGE1_OPS = frozenset({Op.ECHO, Op.NOP, Op.MEMORY_WRITE, Op.MEMORY_READ, Op.MEMORY_BOOT,
                        Op.CHANGE_BAUDRATE})
STAGE2_OPS = frozenset({Op.FLASH_NOP, Op.FLASH_ERASE, Op.FLASH_WRITE, Op.REBOOT,
                        Op.UARTHS_BAUDRATE_SET, Op.FLASH_INIT, Op.FLASH_ERASE_NONBLOCKING,
                        Op.FLASH_STATUS})


def crc32(body: bytes) -> int:
    return zlib.crc32(body) & 0xFFFFFFFF


def request(op: int, address: int = 0, data: bytes = b"", data_len: int = None) -> bytes:
    """Build a request payload (un-framed) with a valid CRC."""
    n = len(data) if data_len is None else data_len
    body = struct.pack("<II", address & 0xFFFFFFFF, n) + bytes(data)
    return struct.pack("<HHI", int(op), 0, crc32(body)) + body


def nop_request(op: int) -> bytes:
    """The 13-byte zero-checksum form kflash sends for NOP, REBOOT and STATUS."""
    return bytes([int(op)]) + bytes(12)


def u32_request(op: int, value: int) -> bytes:
    """Requests whose data is one u32 (baud-rate changes)."""
    return request(op, 0, struct.pack("<I", value))


@dataclass
class Request:
    op: int
    crc: int
    address: int
    data_len: int
    data: bytes

    @property
    def crc_ok(self) -> bool:
        return self.crc == crc32(struct.pack("<II", self.address, self.data_len) + self.data)


def parse_request(payload: bytes):
    """Parse a received request. Returns (Request or None, Reason). The reason is what a strict
    receiver answers: OK, BAD_DATA_LEN (short frame or data_len mismatch) or BAD_DATA_CHECKSUM.
    NOP-type requests only need their op byte."""
    if len(payload) < 1:
        return None, Reason.BAD_DATA_LEN
    op = payload[0]
    if op in NOP_OPS and len(payload) >= 2:
        return Request(op, 0, 0, 0, b""), Reason.OK
    if len(payload) < HEADER_SIZE:
        return Request(op, 0, 0, 0, b""), Reason.BAD_DATA_LEN
    _op, _res, crc, address, data_len = HEADER.unpack_from(payload)
    data = bytes(payload[HEADER_SIZE:])
    req = Request(op, crc, address, data_len, data)
    if data_len != len(data):
        return req, Reason.BAD_DATA_LEN
    if not req.crc_ok:
        return req, Reason.BAD_DATA_CHECKSUM
    return req, Reason.OK


def response(op: int, reason: int) -> bytes:
    return bytes([int(op) & 0xFF, int(reason) & 0xFF])


def debug_frame(reason: int, text: str) -> bytes:
    raw = text.encode("ascii", "replace").replace(b"\xc0", b"?").replace(b"\xdb", b"?")
    return bytes([Op.DEBUG_INFO, int(reason) & 0xFF]) + raw


def parse_response(payload: bytes):
    """Returns (op, reason, text). Short frames give (op or 0, None, '')."""
    if len(payload) < 2:
        return (payload[0] if payload else 0), None, ""
    op, reason = payload[0], payload[1]
    text = payload[2:].decode("ascii", "replace") if op == Op.DEBUG_INFO else ""
    return op, reason, text


def reason_name(reason) -> str:
    try:
        return Reason(reason).name
    except (ValueError, TypeError):
        return "unknown reason %r" % (reason,)

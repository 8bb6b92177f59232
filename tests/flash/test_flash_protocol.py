"""SLIP, ISP packets, the firmware envelope, board presets and the stub loader, against the
test vectors of docs/flash-protocol.md#test-vectors."""
import pytest

from flash_helpers import needs_kflash
from tl2k210.flash import boards, image, isp, slip
from tl2k210.flash.errors import FlashError, StubError
from tl2k210.flash.isp import Op, Reason

H = bytes.fromhex


@pytest.mark.parametrize("frame, payload", [
    ("c0 c2 00 00 00 00 00 00 00 00 00 00 00 00 c0", isp.nop_request(Op.NOP)),
    ("c0 c5 00 00 00 fb 6f c4 d4 00 00 00 80 00 00 00 00 c0",
     isp.request(Op.MEMORY_BOOT, 0x80000000)),
    ("c0 d7 00 00 00 f7 df 88 a9 01 00 00 00 00 00 00 00 c0", isp.request(Op.FLASH_INIT, 1)),
    ("c0 d6 00 00 00 b8 e4 85 73 00 00 00 00 04 00 00 00 60 e3 16 00 c0",
     isp.u32_request(Op.UARTHS_BAUDRATE_SET, 1_500_000)),
    ("c0 c6 00 00 00 c1 38 36 8c 00 00 00 00 04 00 00 00 e4 3f 17 00 c0",
     isp.u32_request(Op.CHANGE_BAUDRATE, 1_523_684)),
    ("c0 d8 00 00 00 95 ca 9a 2b 00 00 30 00 00 00 10 00 c0",
     isp.request(Op.FLASH_ERASE_NONBLOCKING, 0x300000, data_len=0x100000)),
    ("c0 c3 00 00 00 0b ec b2 0e 00 00 00 80 04 00 00 00 01 02 03 04 c0",
     isp.request(Op.MEMORY_WRITE, 0x80000000, b"\x01\x02\x03\x04")),
    ("c0 d4 00 00 00 ca 43 fc b8 00 00 00 00 08 00 00 00 db dc db dd 00 01 02 03 04 05 c0",
     isp.request(Op.FLASH_WRITE, 0, H("c0db000102030405"))),
])
def test_spec_frames(frame, payload):
    assert slip.encode(payload) == H(frame)
    d = slip.Decoder()
    assert d.feed(H(frame)) == [(payload, True)]


def test_reply_frame_on_the_wire():
    assert slip.encode(isp.response(Op.NOP, Reason.OK)) == H("c0c2e0c0")


def test_decoder_splits_resyncs_and_flags_bad_escapes():
    d = slip.Decoder()
    assert d.feed(b"\xc0\xc0ab") == []           # empty frame skipped, frame pending
    assert d.feed(b"c\xc0") == [(b"abc", True)]
    assert d.feed(b"xyz\xc0") == [(b"xyz", True)]   # lost opening delimiter costs nothing
    assert d.feed(b"\xc0\xdb\x01\xc0") == [(b"\xdb\x01", False)]


def test_parse_request_is_strict():
    req, r = isp.parse_request(isp.request(Op.FLASH_WRITE, 0x1000, b"abcd"))
    assert r == Reason.OK and req.address == 0x1000 and req.data == b"abcd"
    good = bytearray(isp.request(Op.FLASH_WRITE, 0x1000, b"abcd"))
    good[-1] ^= 1
    assert isp.parse_request(bytes(good))[1] == Reason.BAD_DATA_CHECKSUM
    assert isp.parse_request(bytes(good[:-1]))[1] == Reason.BAD_DATA_LEN
    assert isp.parse_request(bytes(good[:10]))[1] == Reason.BAD_DATA_LEN
    # the 13-byte zero-checksum NOP form is accepted
    assert isp.parse_request(isp.nop_request(Op.NOP))[1] == Reason.OK


@pytest.mark.parametrize("flag, hexstr", [
    (0, "0010000000130000001300000013000000130000007240f33fe7656c3c25915ef2deef029f2f12d66f19"
        "395197e2cda959152393ba"),
    (2, "021000000013000000130000001300000013000000a3fe9a66932d7dfc54ac5baeb6e1f57630a3a902c6"
        "35867774ec7c3ff2c4fb23"),
])
def test_envelope_vectors(flag, hexstr):
    payload = H("13000000") * 4
    assert image.wrap(payload, flag) == H(hexstr)
    assert image.unwrap(H(hexstr) + b"\xff" * 100) == payload


def test_envelope_checks_like_the_bootrom():
    env = bytearray(image.wrap(b"\x13\x00\x00\x00" * 100))
    env[50] ^= 0x01
    with pytest.raises(image.ImageError, match="SHA-256"):
        image.unwrap(bytes(env))
    with pytest.raises(image.ImageError, match="flag"):
        image.unwrap(b"\xff" * 4096)                      # erased flash
    with pytest.raises(image.ImageError, match="length"):
        image.unwrap(b"\x00\x00\x00\x00\x7f" + bytes(64))  # absurd length


def test_board_presets_are_data():
    assert boards.get_board("M5StickV").name == "goE"
    assert boards.get_board("maixduino").name == "goE"
    assert boards.get_board("bit").name == "dan"
    assert boards.get_board("bit_mic").reset_line == "dtr"
    dan = boards.get_board("dan")
    assert (dan.reset_line, dan.boot_line) == ("rts", "dtr")
    # last ISP step of dan: release RESET (RTS) first, then pull IO16 (DTR) low
    assert dan.isp_sequence[-1] == [("rts", False), ("dtr", True)]
    assert boards.AUTODETECT_ORDER[:3] == ("dan", "kd233", "goD")
    with pytest.raises(FlashError, match="known boards"):
        boards.get_board("nosuchboard")


@needs_kflash
def test_stub_comes_from_installed_kflash():
    from tl2k210.flash.stub import kflash_stub, stub_id

    s = kflash_stub()
    assert len(s) == 16512 and stub_id(s).startswith("757776d0")


def test_stub_override_file(tmp_path):
    from tl2k210.flash.stub import load_stub

    p = tmp_path / "stub.bin"
    p.write_bytes(b"\x01\x02")
    assert load_stub(str(p)) == b"\x01\x02"
    with pytest.raises(StubError, match="cannot read"):
        load_stub(str(tmp_path / "missing.bin"))

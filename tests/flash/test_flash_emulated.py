"""tl2k210's flasher against the emulated K210 board: images land byte-exact in the flash file,
the emulated bootrom accepts the firmware, and every failure is bounded and explained."""
import threading
import time

import pytest
import serial

from flash_helpers import (FaultConfig, board, firmware_at_0, flash_ours, needs_kflash,
                           open_shimmed, payload, run_tl2k210, sha)
from tl2k210.flash import isp, slip
from tl2k210.flash.emulated_board import EmulatedBoard, K210Core
from tl2k210.flash.errors import BoardTimeoutError, GreetingError
from tl2k210.flash.flasher import Flasher
from tl2k210.flash.isp import Op, Reason
from tl2k210.flash.kfpkg import FlashImage, write_kfpkg

pytestmark = needs_kflash          # the emulated board runs kflash's stub only


def test_raw_file_at_0x300000(tmp_path):
    model = payload(200_000, 1)
    with board(tmp_path) as b:
        rep = flash_ours(b, [FlashImage(0x300000, model, False, "m.kmodel")], "dan")
        assert b.flash_bytes(0x300000, len(model)) == model
        assert b.flash_bytes(0x300000 + len(model), 16) == b"\xff" * 16   # nothing beyond
        assert b.flash_bytes(0, 16) == b"\xff" * 16
    assert rep.verified and rep.images[0]["sha256"] == sha(model)


def test_firmware_at_0_boots(tmp_path):
    fw = payload(150_000, 2)
    with board(tmp_path, wiring="kd233") as b:
        rep = flash_ours(b, [FlashImage(0, fw, True, "fw.bin")])     # auto-detects kd233
        time.sleep(0.05)
        assert firmware_at_0(b, fw) == fw
        assert b.core.boot_ok is True and b.state == K210Core.APP
        assert b"[MaixPy] init end" in bytes(b.output_log)
    assert rep.board == "kd233" and rep.rebooted


def test_kfpkg_with_both_via_cli(tmp_path):
    fw, model = payload(120_000, 3), payload(90_000, 4)
    pkg = write_kfpkg([FlashImage(0, fw, True, "fw.bin"),
                       FlashImage(0x300000, model, False, "m.kmodel")], tmp_path / "both.kfpkg")
    with board(tmp_path) as b:
        rc, out = run_tl2k210(["flash", "-p", b.port, "-B", "dan", "-b", "1500000", str(pkg)], b)
        time.sleep(0.05)
        assert rc == 0, out
        assert "verified" in out
        assert "100.0%" not in out          # no progress bar when stderr is not a terminal
        assert b.flash_bytes(0x300000, len(model)) == model
        assert firmware_at_0(b, fw) == fw and b.core.boot_ok


def test_cli_file_at_address_and_progress(tmp_path):
    model = payload(70_000, 5)
    (tmp_path / "m.kmodel").write_bytes(model)
    with board(tmp_path, wiring="goE") as b:
        rc, out = run_tl2k210(["flash", "-p", b.port, "--board", "maixduino", "--progress",
                               f"{tmp_path}/m.kmodel@0x300000"], b)
        assert rc == 0, out
        assert "KiB/s" in out and "100.0%" in out
        assert b.flash_bytes(0x300000, len(model)) == model


def test_board_that_resets_into_isp_on_open(tmp_path):
    """A pty has no DTR/RTS: the flasher must not depend on a visible reset sequence."""
    fw = payload(64_000, 6)
    (tmp_path / "fw.bin").write_bytes(fw)
    with board(tmp_path, wiring="isp_on_open") as b:
        rc, out = run_tl2k210(["flash", "-p", b.port, str(tmp_path / "fw.bin")])   # no shim
        time.sleep(0.05)
        assert rc == 0, out
        assert firmware_at_0(b, fw) == fw and b.core.boot_ok


def test_wrong_board_fails_greeting_with_advice(tmp_path):
    with board(tmp_path, wiring="kd233") as b:
        port = open_shimmed(b)
        with pytest.raises(GreetingError) as ei:
            Flasher(port, board="dan").connect()
        port.close()
    msg = str(ei.value)
    assert "greeting failed" in msg and "dan" in msg and "--board" in msg and "BOOT" in msg


def test_board_that_stops_answering_fails_in_bounded_time(tmp_path):
    result = {}
    with board(tmp_path, faults=FaultConfig(stop_after_bytes=100_000)) as b:
        def go():
            try:
                flash_ours(b, [FlashImage(0x300000, payload(300_000), False, "m")], "dan")
                result["ok"] = True
            except Exception as exc:       # noqa: BLE001 - the test inspects it
                result["exc"] = exc
        t = threading.Thread(target=go, daemon=True)
        t.start()
        t.join(60)                          # generous bound; the flasher gives up in seconds
        assert not t.is_alive(), "flasher did not give up"
    assert isinstance(result.get("exc"), BoardTimeoutError), result
    assert "stopped answering" in str(result["exc"])


def test_noisy_line_recovers_by_resending(tmp_path):
    model = payload(256 * 1024, 7)
    with board(tmp_path, faults=FaultConfig(rate=1e-4, seed=11)) as b:
        rep = flash_ours(b, [FlashImage(0x300000, model, False, "m")], "dan")
        assert b.flash_bytes(0x300000, len(model)) == model
    assert rep.retries > 0 and sum(b.stats.faults.values()) > 0


def test_port_errors_are_explained(tmp_path):
    rc, out = run_tl2k210(["flash", "-p", str(tmp_path / "ttyNONE"), "x.bin@0x300000"])
    assert rc == 2 and "cannot read" in out                    # the image is missing
    (tmp_path / "x.bin").write_bytes(b"1234")
    rc, out = run_tl2k210(["flash", "-p", str(tmp_path / "ttyNONE"), f"{tmp_path}/x.bin@0x300000"])
    assert rc == 2 and "does not exist" in out and "--port" in out


def test_deploy_kmodel_prints_maixpy_lines(tmp_path):
    model = b"\x03\x00\x00\x00" + payload(50_000, 8)
    (tmp_path / "net.kmodel").write_bytes(model)
    with board(tmp_path) as b:
        rc, out = run_tl2k210(["deploy", str(tmp_path / "net.kmodel"), "-p", b.port, "-B", "dan",
                               "-o", str(tmp_path / "net.kfpkg")], b)
        assert rc == 0, out
        assert b.flash_bytes(0x300000, len(model)) == model
    assert "import KPU as kpu" in out and "kpu.load(0x300000)" in out
    assert (tmp_path / "net.kfpkg").exists()


def test_deploy_guards(tmp_path):
    (tmp_path / "net.kmodel").write_bytes(b"\x03\0\0\0" + bytes(100))
    rc, out = run_tl2k210(["deploy", str(tmp_path / "net.kmodel"), "--address", "0x10000",
                           "-p", "/dev/null"])
    assert rc == 2 and "firmware region" in out and "--force" in out
    rc, out = run_tl2k210(["deploy", str(tmp_path / "net.kmodel"), "--address", "0xF00000",
                           "-p", "/dev/null"])
    assert rc == 2 and "SPIFFS" in out


# ---- the emulated board is strict ------------------------------------------------------
def _exchange(ser, payload_bytes, raw=None, wait=5.0):
    """The first reply frame, or None after `wait` s (generous: the board thread may be starved
    when the suite runs next to other jobs; callers that expect silence pass a short wait)."""
    ser.reset_input_buffer()
    ser.write(raw if raw is not None else slip.encode(payload_bytes))
    d = slip.Decoder()
    end = time.monotonic() + wait
    while time.monotonic() < end:
        frames = d.feed(ser.read(64))
        if frames:
            return frames[0][0]
    return None


def test_emulated_rom_answers_like_the_chip(tmp_path):
    with board(tmp_path, wiring="isp_on_open") as b:
        ser = serial.Serial(b.port, 115200, timeout=0.05)
        time.sleep(0.05)
        assert _exchange(ser, isp.nop_request(Op.NOP)) == bytes([0xC2, 0xE0])
        bad = bytearray(isp.request(Op.MEMORY_WRITE, 0x80000000, b"abcd"))
        bad[-1] ^= 0xFF
        assert _exchange(ser, bytes(bad)) == bytes([0xC3, Reason.BAD_DATA_CHECKSUM])
        assert _exchange(ser, bytes(bad[:-2])) == bytes([0xC3, Reason.BAD_DATA_LEN])
        assert _exchange(ser, isp.request(0xAB, 0)) == bytes([0xAB, Reason.INVALID_COMMAND])
        # booting garbage instead of the stub: the board hangs, like a real chip
        assert _exchange(ser, isp.request(Op.MEMORY_WRITE, 0x80000000, b"\x00" * 1024)) == \
            bytes([0xC3, 0xE0])
        ser.write(slip.encode(isp.request(Op.MEMORY_BOOT, 0x80000000)))
        end = time.monotonic() + 10
        while b.state != K210Core.DEAD and time.monotonic() < end:
            time.sleep(0.05)
        assert b.state == K210Core.DEAD
        assert _exchange(ser, isp.nop_request(Op.FLASH_NOP), wait=1.0) is None
        ser.close()


def test_emulated_stub_requires_init_and_checks_crc(tmp_path):
    from tl2k210.flash.stub import kflash_stub

    with board(tmp_path, wiring="isp_on_open") as b:
        port = serial.Serial(b.port, 115200, timeout=0.02)
        f = Flasher(port, baud=115200)
        f.connect()
        f.upload_stub()
        f.boot_stub()
        assert b.state == K210Core.STUB
        w = isp.request(Op.FLASH_WRITE, 0x1000, b"data")
        assert _exchange(port, w) == bytes([0xD4, Reason.INVALID_COMMAND])     # before D7
        assert _exchange(port, isp.request(Op.FLASH_INIT, 1)) == bytes([0xD7, 0xE0])
        bad = bytearray(w)
        bad[-1] ^= 1
        assert _exchange(port, bytes(bad)) == bytes([0xD4, Reason.BAD_DATA_CHECKSUM])
        assert _exchange(port, isp.request(Op.FLASH_WRITE, 0x1000, bytes(65537))) == \
            bytes([0xD4, Reason.BAD_DATA_LEN])
        assert _exchange(port, w) == bytes([0xD4, 0xE0])
        assert b.flash_bytes(0x1000, 4) == b"data"
        port.close()
    assert len(kflash_stub()) == 16512


def test_baud_mismatch_loses_bytes(tmp_path):
    with board(tmp_path, wiring="isp_on_open") as b:
        ser = serial.Serial(b.port, 1_500_000, timeout=0.05)   # the ROM listens at 115200
        time.sleep(0.05)
        assert _exchange(ser, isp.nop_request(Op.NOP), wait=1.0) is None
        assert b.stats.lost_bytes_baud_mismatch > 0
        ser.baudrate = 115200
        assert _exchange(ser, isp.nop_request(Op.NOP)) == bytes([0xC2, 0xE0])
        ser.close()


def test_flash_file_persists_between_boards(tmp_path):
    model = payload(10_000, 9)
    with board(tmp_path) as b:
        flash_ours(b, [FlashImage(0x500000, model, False, "m")], "dan")
    b2 = EmulatedBoard(str(tmp_path / "flash.bin"))
    try:
        assert b2.flash_bytes(0x500000, len(model)) == model
    finally:
        b2.close()
    data = (tmp_path / "flash.bin").read_bytes()
    assert len(data) == 16 * 1024 * 1024 and data[0x500000:0x500000 + len(model)] == model


# ---- transports and error paths --------------------------------------------------------
def test_in_process_pipe_transport():
    """No pty, no thread: the flasher only needs a byte stream (and pins for DTR/RTS)."""
    from tl2k210.flash.emulated_board import LoopbackPort

    flash = bytearray(b"\xff" * (16 * 1024 * 1024))
    core = K210Core(flash, wiring="kd233")
    model, fw = payload(100_000, 31), payload(40_000, 32)
    rep = Flasher(LoopbackPort(core), board="kd233", baud=1_500_000).run(
        [FlashImage(0x300000, model, False, "m"), FlashImage(0, fw, True, "fw")])
    time.sleep(0.01)
    LoopbackPort(core).read(0)                      # run pending events (the reboot)
    assert bytes(flash[0x300000:0x300000 + len(model)]) == model
    assert core.boot_ok and rep.verified and rep.board == "kd233"


def test_unknown_stub_hangs_board_and_is_reported(tmp_path):
    bogus = tmp_path / "stub.bin"
    bogus.write_bytes(b"\x13\x00\x00\x00" * 256)
    (tmp_path / "fw.bin").write_bytes(payload(1000))
    with board(tmp_path) as b:
        rc, out = run_tl2k210(["flash", "-p", b.port, "-B", "dan", "--stub", str(bogus),
                               str(tmp_path / "fw.bin")], b)
        assert b.state == K210Core.DEAD
    assert rc == 2 and "stage-2 flash program did not start" in out and "--stub" in out


def test_busy_port_is_explained(tmp_path):
    (tmp_path / "fw.bin").write_bytes(payload(1000))
    with board(tmp_path) as b:
        holder = serial.Serial(b.port, 115200, exclusive=True)     # e.g. MaixPy IDE has it open
        try:
            rc, out = run_tl2k210(["flash", "-p", b.port, str(tmp_path / "fw.bin")], b)
        finally:
            holder.close()
    assert rc == 2 and "busy" in out and "close" in out


def test_permission_error_mentions_dialout():
    import errno

    from tl2k210.flash.transport import port_error

    msg = str(port_error("/dev/ttyUSB0", OSError(errno.EACCES, "Permission denied")))
    assert "permission denied" in msg and "dialout" in msg


def test_deploy_without_compiler_asks_for_a_kmodel(tmp_path, monkeypatch, capsys):
    import sys

    from tl2k210.cli import main

    monkeypatch.setitem(sys.modules, "tl2k210.compiler", None)      # conversion unavailable
    (tmp_path / "net.h5").write_bytes(b"HDF")
    assert main(["deploy", str(tmp_path / "net.h5"), "-p", "/dev/null"]) == 2
    err = capsys.readouterr().err
    assert "conversion is not available" in err and ".kmodel" in err


def test_delayed_bytes_are_ridden_out(tmp_path):
    model = payload(120_000, 33)
    with board(tmp_path, faults=FaultConfig(rate=5e-5, seed=4, kinds=("delay",))) as b:
        rep = flash_ours(b, [FlashImage(0x300000, model, False, "m")], "dan")
        assert b.flash_bytes(0x300000, len(model)) == model
    assert b.stats.faults.get("delay", 0) > 0 and rep.verified


def test_socket_url_transport(tmp_path):
    """`-p socket://host:port` (pyserial URL): a TCP relay to the board's pty."""
    import socket as _socket

    fw = payload(60_000, 34)
    (tmp_path / "fw.bin").write_bytes(fw)
    with board(tmp_path, wiring="isp_on_open", check_baud=False) as b:
        srv = _socket.create_server(("127.0.0.1", 0))
        tcp_port = srv.getsockname()[1]
        stop = threading.Event()

        def relay():
            conn, _ = srv.accept()
            conn.settimeout(0.01)
            pty = serial.Serial(b.port, 115200, timeout=0.01)
            while not stop.is_set():
                try:
                    data = conn.recv(65536)
                    if not data:
                        break
                    pty.write(data)
                except TimeoutError:
                    pass
                back = pty.read(pty.in_waiting or 1)
                if back:
                    conn.sendall(back)
            pty.close()
            conn.close()

        t = threading.Thread(target=relay, daemon=True)
        t.start()
        rc, out = run_tl2k210(["flash", "-p", f"socket://127.0.0.1:{tcp_port}",
                               str(tmp_path / "fw.bin")])
        stop.set()
        t.join(5)
        srv.close()
        time.sleep(0.05)
        assert rc == 0, out
        assert firmware_at_0(b, fw) == fw and b.core.boot_ok

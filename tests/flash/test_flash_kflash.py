"""Stock kflash 1.1.6, unmodified, against the emulated board: as CLI (subprocess, DTR/RTS routed
by the sitecustomize line shim) and as library (pyserial's DTR/RTS setters redirected)."""
import time

import pytest

from flash_helpers import (board, firmware_at_0, needs_kflash, payload, run_kflash_cli,
                           shared_testdata)
from tl2k210.flash.kfpkg import FlashImage, read_kfpkg, write_kfpkg

pytestmark = needs_kflash


def test_kflash_cli_firmware_at_0(tmp_path):
    fw = payload(150_000, 21)
    (tmp_path / "fw.bin").write_bytes(fw)
    with board(tmp_path) as b:
        rc, out = run_kflash_cli(b, ["-B", "dan", "-b", "1500000", str(tmp_path / "fw.bin")])
        time.sleep(0.05)
        assert rc == 0, out
        assert firmware_at_0(b, fw) == fw
        assert b.flash_bytes(0, 1) == b"\x02"          # kflash 1.1.6 writes the DIO flag
        assert b.core.boot_ok


def test_kflash_cli_autodetect_kfpkg_with_both(tmp_path):
    fw, model = payload(100_000, 22), payload(80_000, 23)
    pkg = write_kfpkg([FlashImage(0, fw, True, "fw.bin"),
                       FlashImage(0x300000, model, False, "m.kmodel")], tmp_path / "both.kfpkg")
    with board(tmp_path, wiring="kd233") as b:
        rc, out = run_kflash_cli(b, ["-b", "1500000", str(pkg)])        # no -B: auto-detect
        time.sleep(0.05)
        assert rc == 0, out
        assert "goE/kd233/bit_mic" in out
        assert b.flash_bytes(0x300000, len(model)) == model
        assert firmware_at_0(b, fw) == fw and b.core.boot_ok


def test_kflash_cli_real_package(tmp_path):
    src = shared_testdata() / "kfpkg" / "face_model_at_0x300000.kfpkg"
    [model] = read_kfpkg(src)
    with board(tmp_path) as b:
        rc, out = run_kflash_cli(b, ["-B", "dan", "-b", "2000000", str(src)])
        assert rc == 0, out
        assert b.flash_bytes(0x300000, len(model.data)) == model.data


@pytest.fixture
def kflash_lines(monkeypatch):
    """Route pyserial's DTR/RTS setters to the emulated board (kflash itself is untouched)."""
    import serial.serialposix as sp

    target = {}

    def dtr(self):
        target["board"].set_line("dtr", self._dtr_state)

    def rts(self):
        target["board"].set_line("rts", self._rts_state)

    monkeypatch.setattr(sp.Serial, "_update_dtr_state", dtr)
    monkeypatch.setattr(sp.Serial, "_update_rts_state", rts)
    return target


def run_kflash_library(b, file, **kw):
    from kflash import KFlash

    logs = []
    KFlash.print_callback = lambda *a, **k: logs.append(" ".join(map(str, a)))
    progress = []
    try:
        KFlash().process(terminal=False, dev=b.port, file=str(file), noansi=True,
                         callback=lambda *a: progress.append(a), **kw)
    finally:
        KFlash.print_callback = None
    return logs, progress


def test_kflash_library_kfpkg(tmp_path, kflash_lines):
    fw, model = payload(90_000, 24), payload(60_000, 25)
    pkg = write_kfpkg([FlashImage(0, fw, True, "fw.bin"),
                       FlashImage(0x300000, model, False, "m.kmodel")], tmp_path / "lib.kfpkg")
    with board(tmp_path) as b:
        kflash_lines["board"] = b
        logs, progress = run_kflash_library(b, pkg, baudrate=1_500_000, board="dan")
        time.sleep(0.05)
        assert b.flash_bytes(0x300000, len(model)) == model
        assert firmware_at_0(b, fw) == fw and b.core.boot_ok
    kinds = {p[0] for p in progress}
    assert {"ISP", "fw.bin", "m.kmodel"} <= kinds


def test_kflash_library_raw_bin_at_0(tmp_path, kflash_lines):
    fw = payload(70_000, 26)
    (tmp_path / "fw.bin").write_bytes(fw)
    with board(tmp_path, wiring="kd233") as b:
        kflash_lines["board"] = b
        run_kflash_library(b, tmp_path / "fw.bin", baudrate=115200, board="kd233")
        time.sleep(0.05)
        assert firmware_at_0(b, fw) == fw and b.core.boot_ok

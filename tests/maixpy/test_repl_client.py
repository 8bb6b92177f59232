"""tl2k210's raw-REPL client (tl2k210.maixpy.repl) against the emulated MaixPy board: code and
streamed output, uploads byte-exact on the board's folders (verified by the board's SHA-256,
skipped when there, resumed from a .part), downloads, the baud raise, and errors that name their
cause (no answer, garbled line, busy board, no SD card, out of flash space)."""
import hashlib
import os
import random

import pytest

from repl_helpers import b, board, r  # noqa: F401 (b, r: fixtures)
from tl2k210.maixpy.repl import (BoardBusyError, BoardExecError, NoAnswerError, NoSdCardError,
                                 OutOfSpaceError, Repl)

DATA = random.Random(14).randbytes(50_000) + bytes(range(256)) * 4   # every byte value


def test_exec_streams_output_and_reports_tracebacks(r):
    got = []
    out, err = r.exec("for i in range(3):\n    print('line', i)\n", on_output=got.append)
    assert out == b"line 0\r\nline 1\r\nline 2\r\n" and err == b""
    assert b"".join(got) == out
    assert r.eval("[1, 2.5, 'x']") == [1, 2.5, "x"]
    with pytest.raises(BoardExecError) as e:
        r.exec_ok("open('/sd/nope.txt')", "reading nope")
    assert "no such file" in str(e.value) and "OSError: [Errno 2] ENOENT" in e.value.traceback
    assert r.raw_paste is False          # probed once: MaixPy's 1.11 core has no raw paste


def test_put_is_byte_exact_verified_and_skips_what_is_there(b, r):
    res = r.put(DATA, "/sd/model.kmodel")
    assert res.status == "written" and res.sha256 == hashlib.sha256(DATA).hexdigest()
    assert (b.sd / "model.kmodel").read_bytes() == DATA
    assert not (b.sd / "model.kmodel.part").exists()
    res = r.put(DATA, "/flash/main.py")
    assert (b.fs / "main.py").read_bytes() == DATA
    assert r.put(DATA, "/sd/model.kmodel").status == "up to date"
    assert r.sha256("/sd/model.kmodel") == hashlib.sha256(DATA).hexdigest()
    names = {n: size for n, _, size in r.ls("/sd")}
    assert names == {"model.kmodel": len(DATA)}
    assert ("main.py", False, len(DATA)) in r.ls("/flash")
    assert r.get("/sd/model.kmodel") == DATA
    r.rm("/sd/model.kmodel")
    assert not (b.sd / "model.kmodel").exists()


def test_put_resumes_from_a_matching_part_and_restarts_on_a_wrong_one(b, r):
    (b.sd / "m.bin.part").write_bytes(DATA[:20_000])          # an interrupted earlier put
    res = r.put(DATA, "/sd/m.bin")
    assert res.status == "resumed" and res.resumed_from == 20_000
    assert res.sent_bytes == len(DATA) - 20_000
    assert (b.sd / "m.bin").read_bytes() == DATA
    bad = bytearray(DATA[:20_000])
    bad[777] ^= 1
    (b.sd / "n.bin.part").write_bytes(bytes(bad))
    res = r.put(DATA, "/sd/n.bin")
    assert res.status == "written" and res.sent_bytes == len(DATA)
    assert (b.sd / "n.bin").read_bytes() == DATA


def test_relative_paths_follow_the_board_folder(b, r):
    assert r.cwd() == "/sd"                      # MaixPy: cwd /sd with a card
    r.put(b"print(1)\n", "boot.py")
    assert (b.sd / "boot.py").read_bytes() == b"print(1)\n"


def test_no_sd_card(tmp_path):
    bd = board(tmp_path, sd=False)
    try:
        with Repl.open(bd.port) as r:
            r.enter_raw()
            with pytest.raises(NoSdCardError, match="no SD card"):
                r.put(b"x", "/sd/x.bin")
            assert r.cwd() == "/flash"
    finally:
        bd.close()


def test_out_of_flash_space_is_refused_before_writing(b, r):
    (b.fs / "big.bin").write_bytes(b"\0" * (3 * 1024 * 1024 - 40_000))    # SPIFFS is 3 MiB
    with pytest.raises(OutOfSpaceError, match=r"out of space on /flash \(3 MiB SPIFFS\).*--to /sd"):
        r.put(DATA, "/flash/model.kmodel")
    assert not (b.fs / "model.kmodel.part").exists() and not (b.fs / "model.kmodel").exists()
    assert r.put(DATA, "/sd/model.kmodel").status == "written"     # the card has room


def test_busy_main_py_is_interrupted(tmp_path):
    (tmp_path / "sd").mkdir()
    (tmp_path / "sd" / "main.py").write_text("while True:\n    print('frame')\n")
    bd = board(tmp_path)
    try:
        with Repl.open(bd.port) as r:
            r.enter_raw()                        # Ctrl-C stops main.py, then the raw REPL
            assert r.exec_ok("print('ok')") == b"ok\r\n"
    finally:
        bd.close()


@pytest.mark.slow                      # three Ctrl-C rounds of a few seconds
def test_main_py_that_ignores_ctrl_c_is_reported_busy(tmp_path):
    (tmp_path / "sd").mkdir()
    (tmp_path / "sd" / "main.py").write_text(          # Ctrl-C is a plain character now
        "import micropython\nmicropython.kbd_intr(-1)\nwhile True:\n    print('frame')\n")
    bd = board(tmp_path)
    try:
        with Repl.open(bd.port) as r:
            r.read_until(b"frame", total=60)     # kbd_intr(-1) has run: a Ctrl-C before it still stops main.py
            with pytest.raises(BoardBusyError, match="does not stop on Ctrl-C.*frame"):
                r.enter_raw(tries=2)
    finally:
        bd.close()


def test_no_answer_and_wrong_baud(tmp_path):
    m, s = os.openpty()                          # a port with nothing behind it
    try:
        with Repl.open(os.ttyname(s)) as r:
            with pytest.raises(NoAnswerError, match="no answer .* powered"):
                r.enter_raw(tries=1)
    finally:
        os.close(m)
        os.close(s)
    d = tmp_path / "b2"
    (d / "sd").mkdir(parents=True)
    (d / "sd" / "main.py").write_text("while True:\n    print('frame')\n")
    bd = board(d, baud=1_500_000)         # its REPL at another rate (as in IDE mode)
    try:
        with Repl.open(bd.port) as r:
            with pytest.raises(NoAnswerError, match="garbled answer .* another baud rate"):
                r.enter_raw(tries=1)
    finally:
        bd.close()
    from tl2k210.flash.errors import PortError
    with pytest.raises(PortError, match="does not exist"):
        Repl.open(str(tmp_path / "ttyUSB9"))


def test_baud_raise_and_back(b):
    with Repl.open(b.port) as r:
        r.enter_raw()
        t0 = b.line_seconds()
        r.put(DATA, "/sd/slow.bin")
        slow = b.line_seconds() - t0
        r.set_baud(1_500_000)
        assert b.baud == 1_500_000 and r.baud == 1_500_000
        t0 = b.line_seconds()
        r.put(DATA, "/sd/fast.bin")
        fast = b.line_seconds() - t0
    assert b.baud == 115200                      # close() switched the board back
    assert (b.sd / "fast.bin").read_bytes() == DATA
    # line time (the board's virtual clock, not wall time): base64 at 115200 is wire-bound
    assert slow >= len(DATA) * 4 / 3 * 10 / 115200
    assert fast < slow / 8, (slow, fast)


def test_raw_paste_board(tmp_path):
    bd = board(tmp_path, raw_paste=True)
    try:
        with Repl.open(bd.port) as r:
            r.enter_raw()
            assert r.exec_ok("print(6 * 7)") == b"42\r\n"
            assert r.raw_paste is True
            r.put(DATA, "/sd/p.bin")
        assert (bd.sd / "p.bin").read_bytes() == DATA
    finally:
        bd.close()


def test_soft_reset_clears_the_board_and_the_helpers_come_back(b, r):
    r.exec_ok("x = 41")
    assert r.put(b"before\n", "/sd/a.txt").status == "written"      # helpers defined
    r.soft_reset()                                     # Ctrl-D at the raw prompt
    assert b.stats.soft_resets == 1 and r.in_raw
    out, err = r.exec("print(x)")
    assert out == b"" and b"NameError: name 'x' isn't defined" in err
    assert r.put(b"after\n", "/sd/b.txt").status == "written"       # redefined after the reboot
    assert (b.sd / "b.txt").read_bytes() == b"after\n"


class _StopAt:
    """A progress bar (tl2k210.flash.flasher.Progress) that is interrupted at `at` bytes."""

    def __init__(self, at=None):
        import io
        from tl2k210.flash.flasher import Progress
        self.bar = Progress(True, stream=io.StringIO())
        self.at = at

    def start(self, label, total, done=0):
        self.bar.start(label, total, done)

    def update(self, done, force=False):
        self.bar.update(done, force=True)
        if self.at is not None and done >= self.at:
            raise KeyboardInterrupt()


def test_an_interrupted_put_resumes_where_the_board_file_ends(b):
    with Repl.open(b.port) as r:
        r.enter_raw()
        with pytest.raises(KeyboardInterrupt):
            r.put(DATA, "/sd/big.bin", progress=_StopAt(20_000))
    assert not (b.sd / "big.bin").exists()              # never renamed into place
    with Repl.open(b.port) as r:                         # a new connection, the board as it was
        r.enter_raw()
        bar = _StopAt()
        res = r.put(DATA, "/sd/big.bin", progress=bar)
    assert res.status == "resumed" and 20_000 <= res.resumed_from < len(DATA)
    assert res.sent_bytes == len(DATA) - res.resumed_from
    assert (b.sd / "big.bin").read_bytes() == DATA and not (b.sd / "big.bin.part").exists()
    shown = bar.bar.stream.getvalue()
    first = shown.split("\r")[1]                         # the bar starts where the file ended
    assert f" {res.resumed_from}/{len(DATA)} B " in first and "100.0%" in shown

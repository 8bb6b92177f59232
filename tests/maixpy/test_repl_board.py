"""The emulated MaixPy REPL board byte for byte (MicroPython @ced340d's pyexec/readline, spec
docs/flash-protocol.md#maixpy-repl): friendly REPL, raw REPL and its sections, soft reboot,
raw paste absent (the 1.11 fallback) or offered, Ctrl-C, the baud rate on the line, the seeded
line faults and the line clock."""
import re
import struct

import pytest

from repl_helpers import RAW, Wire, board
from tl2k210.flash.emulated_board import FaultConfig


@pytest.fixture
def b(tmp_path):
    bd = board(tmp_path)
    yield bd
    bd.close()


@pytest.fixture
def w(b):
    assert b.wait_idle()
    wire = Wire(b.port)
    yield wire
    wire.close()


def test_friendly_repl_banner_prompt_echo_and_values(b, w):
    w.send(b"\x02")                                     # Ctrl-B: the banner
    banner = w.until(b">>> ")
    assert b"MicroPython v0.6.2 on 2020-12-16; Sipeed_M1 with kendryte-k210" in banner
    assert b'Type "help()" for more information.\r\n' in banner
    w.send(b"1+2\r")
    assert w.until(b">>> ") == b"1+2\r\n3\r\n>>> "      # echo, the value's repr, a new prompt
    w.send(b"x = 1/3\r")
    w.until(b">>> ")
    w.send(b"x\r")
    assert w.until(b">>> ") == b"x\r\n0.3333333\r\n>>> "  # single-precision floats
    w.send(b"for i in range(2):\r")
    assert w.until(b"... ") == b"for i in range(2):\r\n... "
    w.send(b" print(i*10)\r\r")
    assert w.until(b">>> ").endswith(b"0\r\n10\r\n>>> ")
    w.send(b"abc\x08\x08d\r")                           # backspace edits the line
    out = w.until(b">>> ")
    assert b"\x08 \x08" in out and b"name 'ad' isn't defined" in out
    w.send(b"xyz\x03")                                  # Ctrl-C drops the line
    assert w.until(b">>> ") == b"xyz\r\n>>> "


def test_raw_repl_sections_errors_and_ctrl_b(b, w):
    w.raw()
    w.send(b"print('out')\x04")
    assert w.until(b">") == b"OKout\r\n\x04\x04>"
    w.send(b"import sys\nprint('a')\n1/0\x04")
    reply = w.until(b"\x04>")
    assert reply.startswith(b"OKa\r\n\x04Traceback (most recent call last):\r\n")
    assert reply.endswith(b'  File "<stdin>", line 3, in <module>\r\nZeroDivisionError: '
                          b"divide by zero\r\n\x04>")
    w.send(b"x = 42\x04")
    assert w.until(b">") == b"OK\x04\x04>"              # namespace persists between commands
    w.send(b"print(x)\x04")
    assert w.until(b">") == b"OK42\r\n\x04\x04>"
    w.send(b"f'{x}'\x04")                               # MicroPython 1.11: no f-strings
    assert b"SyntaxError: invalid syntax" in w.until(b"\x04>")
    w.send(b"pri\x03print(7)\x04")                      # Ctrl-C clears the raw line
    assert w.until(b">") == b"OK7\r\n\x04\x04>"
    w.send(b"\x01")                                     # Ctrl-A restarts the raw REPL
    assert w.until(b">") == RAW + b">"
    w.send(b"\x02")                                     # Ctrl-B: back to the friendly REPL
    assert w.until(b">>> ").startswith(b"\r\nMicroPython v0.6.2")
    w.send(b"x\r")
    assert w.until(b">>> ") == b"x\r\n42\r\n>>> "


def test_raw_paste_is_absent_like_micropython_1_11(b, w):
    """Ctrl-E A Ctrl-A: the 1.11 core takes \\x05A as code and restarts the raw REPL, the
    fallback pyboard.py and mpremote expect; the line is empty afterwards."""
    w.raw()
    w.send(b"\x05A\x01")
    assert w.until(b">") == RAW + b">"
    w.send(b"print(5)\x04")
    assert w.until(b">") == b"OK5\r\n\x04\x04>"


def test_raw_paste_when_the_firmware_offers_it(tmp_path):
    bd = board(tmp_path, raw_paste=True)
    try:
        w = Wire(bd.port)
        w.raw()
        w.send(b"\x05A\x01")
        assert w.until(b"R\x01") == b"R\x01"
        window = struct.unpack("<H", w.read(2))[0]
        assert window == 256
        code = b"s = 0\nfor i in range(100):\n    s += i\nprint(s)\n" + b"#" * 600 + b"\n"
        w.send(code[:window])
        assert w.until(b"\x01", 5) == b"\x01"           # flow control: one more window
        w.send(code[window:] + b"\x04")
        reply = w.until(b">")                           # credits, ack, stdout, stderr, prompt
        assert reply.lstrip(b"\x01") == b"\x044950\r\n\x04\x04>" and reply.count(b"\x01") == 1
        w.close()
    finally:
        bd.close()


def test_soft_reboot_clears_the_board_and_skips_main_in_raw_mode(b, w):
    (b.sd / "boot.py").write_text("print('boot.py ran')\n")
    (b.sd / "main.py").write_text("print('main.py ran')\n")
    w.raw()
    w.send(b"x = 1\x04")
    w.until(b">")
    t0 = b.board.clock.now_us()
    w.send(b"\x04")                                     # empty raw line: soft reboot
    out = w.until(RAW + b">")
    assert out.startswith(b"OK\r\nMPY: soft reboot\r\n[MaixPy] init end\r\n")
    assert b"boot.py ran" in out and b"main.py ran" not in out
    assert b.board.clock.now_us() > t0                  # ticks keep counting
    w.send(b"print(x)\x04")
    assert b"NameError: name 'x' isn't defined" in w.until(b"\x04>")
    w.send(b"import uos\nprint(uos.getcwd())\x04")
    assert w.until(b">") == b"OK/sd\r\n\x04\x04>"
    w.send(b"\x02")
    w.until(b">>> ")
    w.send(b"\x04")                                     # friendly soft reboot runs main.py
    out = w.until(b">>> ")
    assert b"boot.py ran" in out and b"main.py ran" in out
    assert b.stats.soft_resets == 2


def test_ctrl_c_interrupts_running_code(b, w):
    w.raw()
    w.send(b"n = 0\nwhile True:\n    n += 1\n\x04")
    assert w.until(b"OK") == b"OK"
    w.quiet(0.3)
    w.send(b"\x03")
    out = w.until(b"\x04>")
    assert b"KeyboardInterrupt" in out and re.search(rb'File "<stdin>", line [23]', out)
    w.send(b"print(n > 0)\x04")
    assert w.until(b">") == b"OKTrue\r\n\x04\x04>"
    assert b.stats.interrupts == 1


def test_main_py_runs_at_power_on_and_ctrl_c_stops_it(tmp_path):
    (tmp_path / "sd").mkdir()
    (tmp_path / "sd" / "main.py").write_text("import time\nwhile True:\n    print('tick')\n"
                                             "    time.sleep_ms(100)\n")
    bd = board(tmp_path)
    try:
        w = Wire(bd.port)
        w.until(b"tick\r\n")                            # the board is busy with main.py
        w.send(b"\x03")
        out = w.until(b">>> ")
        assert b"KeyboardInterrupt" in out and b'File "main.py", line' in out
        w.close()
    finally:
        bd.close()


def test_bytes_at_another_baud_are_lost_and_output_is_garbled(b):
    w = Wire(b.port, baud=9600)
    try:
        w.send(b"\r\x01print(1)\x04")
        junk = w.quiet(0.5)
        assert RAW not in junk and b"OK" not in junk
        assert b.stats.lost_bytes_baud_mismatch >= 10
    finally:
        w.close()
    w = Wire(b.port)                                    # the right rate works
    w.raw()
    w.close()


def test_uart_repl_uart_init_changes_the_line_rate(b, w):
    """machine.UART.repl_uart().init(B): the REPL then talks at B (what _boot.py does for the
    IDE); a host that stays at 115200 sees garbage."""
    w.raw()
    w.send(b"from machine import UART\nUART.repl_uart().init(1500000, 8, None, 1, "
           b"read_buf_len=2048)\x04")
    assert w.until(b"OK") == b"OK"
    w.s.baudrate = 1500000                              # follow, as a client does
    assert w.until(b">") == b"\x04\x04>"
    assert b.baud == 1500000 and b.stats.bauds == [1500000]
    w.send(b"print(2)\x04")
    assert w.until(b">") == b"OK2\r\n\x04\x04>"


def test_line_clock_counts_wire_time_not_host_time(b, w):
    """The board clock advances by bytes x 10 / baud for every byte either way (plus board
    work), whatever the host's load: the same exchange costs the same line time."""
    w.raw()
    code = b"x = '" + b"a" * 11000 + b"'\x04"
    t0 = b.line_seconds()
    w.send(code)
    w.until(b">")
    dt = b.line_seconds() - t0
    wire = (len(code) + len(b"OK\x04\x04>")) * 10 / 115200
    assert wire <= dt < wire + 0.01, (dt, wire)         # + the modelled compile, < 10 ms


def test_seeded_line_faults_are_reproducible(tmp_path):
    got = []
    for run in range(2):
        d = tmp_path / f"r{run}"
        d.mkdir()
        bd = board(d, faults=FaultConfig(rate=0.01, seed=7))
        try:
            w = Wire(bd.port)
            w.raw()
            w.send(b"print('" + b"z" * 3000 + b"')\x04")
            w.quiet(0.5)
            w.close()
            got.append(dict(bd.stats.faults))
        finally:
            bd.close()
    assert got[0] == got[1] and sum(got[0].values()) > 10

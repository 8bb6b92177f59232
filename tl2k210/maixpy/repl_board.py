"""An emulated MaixPy board on a serial line: MaixPy v0.6.2's MicroPython REPL on a pty, backed
by the host MaixPy (`runtime.Session`: its /flash and /sd folders, the KPU on the bit-exact
emulator, the virtual board clock). Real clients (mpremote, ampy, `tl2k210 repl`) use it
unchanged:

    with ReplBoard(sd="card/", fs="flash/", images=["a.jpg"]) as b:
        subprocess.run(["mpremote", "connect", b.port, "fs", "ls"])
        b.stats.rx_bytes, b.line_seconds()

The REPL is MicroPython @ced340d's (lib/utils/pyexec.c, lib/mp-readline;
docs/flash-protocol.md#maixpy-repl, docs/maixpy-firmware.md#boot):

* power-on: _boot.py's output, boot.py, main.py, then the friendly REPL `>>> ` (echo, backspace,
  `... ` continuation lines, Ctrl-A raw REPL, Ctrl-B banner, Ctrl-C new line, Ctrl-D soft
  reboot, Ctrl-E paste mode); expression values print their repr;
* raw REPL: `raw REPL; CTRL-B to exit\\r\\n>`; Ctrl-D ends the code: `OK`, its output, `\\x04`,
  the traceback, `\\x04`, `>`; Ctrl-D on an empty line soft-reboots (`OK\\r\\n`, `MPY: soft
  reboot`; main.py does not run in raw mode); Ctrl-B back to friendly, Ctrl-A restarts, Ctrl-C
  clears the line, every other byte belongs to the code. Raw-paste mode (Ctrl-E A Ctrl-A,
  MicroPython >= 1.14) is absent from this core (docs/flash-protocol.md#maixpy-repl): those bytes become code and the
  Ctrl-A restarts the raw REPL, which clients read as "not supported". `raw_paste=True` emulates
  a firmware that has it (256-byte window, as MicroPython's);
* Ctrl-C while code runs raises KeyboardInterrupt at its next line (unless the code called
  `micropython.kbd_intr(-1)`; a soft reboot restores it);
* `machine.UART.repl_uart().init(baud, ...)` changes the REPL's baud rate (what _boot.py does for
  the IDE's 1.5 Mbaud); the board waits up to BAUD_SWITCH_WAIT_S of host time for the host to
  follow, as the host would within the board's `time.sleep_ms` after the call.

The line: the host's baud rate is read from the pty (TCGETS2); bytes sent at another rate than
the REPL UART's are lost, output at a wrong rate arrives garbled. Host->board bytes get the ISP
board's seeded faults (`flash.emulated_board.LineFaults`). `throttle` paces the line in real
time (bytes x 10 / baud). Whatever the host's load, the board clock (virtual) advances by the wire
time of every byte either way plus what the board spends (executed lines, KPU runs, the compile of
each command, file writes: costs below), so `line_seconds()` is a deterministic line-time figure
(host think time and a client's own sleeps are not in it; real time is, with `throttle`).
"""
from __future__ import annotations

import ast
import codeop
import io
import os
import re
import select
import struct
import sys
import threading
import time
import tty
from dataclasses import dataclass, field

from tl2k210.flash.emulated_board import BAUD_TOLERANCE, FaultConfig, LineFaults, pty_baud
from tl2k210.k210.board_facts import REPL_BAUD

BAUD_SWITCH_WAIT_S = 1.0
RAW_PASTE_WINDOW = 256          # MICROPY_REPL_STDIN_BUFFER_MAX of the cores that have raw paste
RAW_BANNER = b"raw REPL; CTRL-B to exit\r\n"
# Board-side costs on the virtual clock (estimates, not measured on a board; each x3 UNCERTAIN):
EXEC_US = 200                   # one raw-REPL command: line buffer, parse tree, GC, bookkeeping
COMPILE_US_PER_BYTE = 0.1       # MicroPython lexer + compiler, ~40 cycles per source byte at 400 MHz
SPIFFS_WRITE_US_PER_BYTE = 12.6  # /flash: NOR page program ~0.4 ms / 256 B + 4 KiB erase ~45 ms
SD_WRITE_US_PER_BYTE = 1.0      # /sd: FatFs over SPI-mode SD, ~1 MB/s
FRIENDLY, RAW = "friendly", "raw"
_RAW_CTRL = re.compile(rb"[\x01-\x05]")
_PASTE_CTRL = re.compile(rb"[\x03\x04]")


class _Closed(BaseException):
    """The board is being shut down."""


@dataclass
class ReplStats:
    rx_bytes: int = 0                 # host -> board, on the wire (before faults)
    tx_bytes: int = 0                 # board -> host
    faults: dict = field(default_factory=dict)
    lost_bytes_baud_mismatch: int = 0
    garbled_tx_bytes: int = 0
    interrupts: int = 0
    commands: int = 0                 # raw-REPL / raw-paste / friendly executions
    soft_resets: int = 0
    bauds: list = field(default_factory=list)


class _Input:
    """The UART's receive buffer between the line thread and the REPL thread; wire time of the
    bytes received is charged to the board clock when the REPL takes them."""

    def __init__(self):
        self.buf = bytearray()
        self.cv = threading.Condition()
        self.wire_us = 0.0
        self.closed = False
        self.waiting = False           # the REPL waits for input (the board is idle)

    def put(self, data, wire_us):
        with self.cv:
            self.buf += data
            self.wire_us += wire_us
            self.cv.notify_all()

    def charge(self, wire_us):
        with self.cv:
            self.wire_us += wire_us

    def unget(self, data):
        if data:
            with self.cv:
                self.buf[0:0] = data

    def _wait(self):
        while not self.buf:
            if self.closed:
                raise _Closed()
            self.waiting = True
            self.cv.wait(0.2)
        self.waiting = False

    def take(self, pattern=None, n=None):
        """Block for data; return (bytes before the first `pattern` match, the matched byte or
        None) and the wire time to charge. Without a pattern: up to `n` bytes (None: all)."""
        with self.cv:
            self._wait()
            wire, self.wire_us = self.wire_us, 0.0
            if pattern is not None:
                m = pattern.search(self.buf)
                if m is not None:
                    i = m.start()
                    out, c = bytes(self.buf[:i]), self.buf[i]
                    del self.buf[:i + 1]
                    return out, c, wire
            k = len(self.buf) if n is None else min(n, len(self.buf))
            out = bytes(self.buf[:k])
            del self.buf[:k]
            return out, None, wire

    def close(self):
        with self.cv:
            self.closed = True
            self.cv.notify_all()


class _Tee(io.StringIO):
    """Session.boot_out that also goes out on the line (the firmware prints it on the REPL)."""

    def __init__(self, sink):
        super().__init__()
        self._sink = sink

    def write(self, text):
        self._sink(text)
        return super().write(text)


class _Photos:
    """The camera of a board on the desk: the photos in a loop (sensor.snapshot never ends)."""

    def __init__(self, images):
        self.images = list(images)

    def __getitem__(self, i):
        return self.images[i % len(self.images)]

    def __len__(self):
        return len(self.images)


class _CostFile:
    """A board file whose writes cost board time (SPIFFS or SD)."""

    def __init__(self, f, charge):
        self._f, self._charge = f, charge

    def write(self, data):
        n = self._f.write(data)
        self._charge(n or 0)
        return n

    def __getattr__(self, name):
        return getattr(self._f, name)

    def __iter__(self):
        return iter(self._f)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._f.close()


class ReplBoard:
    """A MaixPy board behind a pty (see the module docstring). Board options as for
    `maixpy.board.Board`: sd/fs host folders for /sd and /flash, flash the 16 MiB flash image
    file, images the camera's photos (shown in a loop), runtime the firmware build, board its
    profile (maix, m5stickv)."""

    def __init__(self, sd=None, fs=None, flash=None, images=(), runtime="maixpy",
                 faults: FaultConfig = None, throttle=False, raw_paste=False, check_baud=True,
                 baud=REPL_BAUD, log=None, board="maix"):
        from tl2k210.maixpy.board import Board
        from tl2k210.maixpy.runtime import Session

        b = Board(flash=flash, images=images, sd=sd, fs=fs, runtime=runtime, timeout=None, board=board)
        if images:
            b.images, b.max_frames = _Photos(images), sys.maxsize
        b.on_repl_baud, b.repl_baud = self._uart_init, baud
        self.session = Session(b, on_output=self._out_text, on_input=self._input_line)
        self.session.idle_threads = True     # _threads run while the prompt waits, as on a board
        self.session.on_char = self._input_char
        self.session.boot_out = _Tee(self._out_text)
        vfs_open = b.vfs.open
        b.vfs.open = lambda path, mode="r", *a, **k: self._open(vfs_open, path, mode, *a, **k)
        self.board = b
        self.baud = baud
        self.throttle, self.raw_paste, self.check_baud = throttle, raw_paste, check_baud
        self.stats = ReplStats()
        self.faults = LineFaults(faults or FaultConfig(), self.stats)
        self.log = log                       # host notes of the board (why an error happened)
        self._notes_seen = 0
        self.mode = FRIENDLY
        self.output_log = bytearray()        # what the board sent (last 1 MiB)
        self._in = _Input()
        self._executing = False
        self._running = False
        self._threads = []
        self.master, slave = os.openpty()
        tty.setraw(self.master)
        tty.setraw(slave)
        self.port = os.ttyname(slave)
        os.close(slave)                      # the host closing the port shows as HUP
        os.set_blocking(self.master, False)

    # ---- public ------------------------------------------------------------------------
    def start(self):
        self._running = True
        for fn, name in ((self._line_loop, "maixpy-line"), (self._repl_loop, "maixpy-repl")):
            t = threading.Thread(target=fn, name=name, daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.close()

    def close(self):
        self._running = False
        self._in.close()
        self.session.interrupt()
        for t in self._threads:
            t.join(timeout=5)
        try:
            os.close(self.master)
        except OSError:
            pass
        self.session.close()

    def wait_idle(self, timeout=30.0) -> bool:
        """Wait until the board waits for input with nothing left to read (boot done)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            with self._in.cv:
                if self._in.waiting and not self._in.buf:
                    return True
            time.sleep(0.01)
        return False

    def line_seconds(self) -> float:
        """The board clock (virtual) in seconds: line time plus board time (see the docstring)."""
        return self.board.clock.now_us() / 1e6

    def host_path(self, path):
        """The host file behind a board path such as /flash/main.py."""
        return self.board.vfs.host_path(path)

    # ---- the line ----------------------------------------------------------------------
    def _line_loop(self):
        poller = select.poll()
        poller.register(self.master, select.POLLIN)
        while self._running:
            ev = dict(poller.poll(20)).get(self.master, 0)
            if ev & select.POLLHUP:          # nobody has the port open
                time.sleep(0.005)
                continue
            if not ev & select.POLLIN:
                continue
            try:
                data = os.read(self.master, 64 if self.throttle else 65536)
            except (BlockingIOError, OSError):
                continue
            if data:
                self._receive(data)

    def _mismatch(self):
        if not self.check_baud:
            return False
        host = pty_baud(self.master)
        return bool(host) and abs(host - self.baud) > BAUD_TOLERANCE * self.baud

    def _receive(self, data):
        wire_us = len(data) * 10e6 / self.baud
        self.stats.rx_bytes += len(data)
        if self._mismatch():
            self.stats.lost_bytes_baud_mismatch += len(data)
            self._in.charge(wire_us)
            return
        data, delay = self.faults.apply(data)
        pause = (wire_us / 1e6 if self.throttle else 0.0) + delay
        if pause:
            time.sleep(pause)
        if self._executing and b"\x03" in data and getattr(self.session, "kbd_intr", 3) == 3:
            self.session.interrupt()         # the UART IRQ's interrupt character
            self.stats.interrupts += 1
            data = data.replace(b"\x03", b"")
        self._in.put(data, wire_us + delay * 1e6)

    def _charge(self, us):
        if us > 0:
            self.board.clock.advance(us)

    def _emit(self, data: bytes):
        if not data:
            return
        wire_s = len(data) * 10.0 / self.baud
        self._charge(wire_s * 1e6)
        self.stats.tx_bytes += len(data)
        if not self._listening():
            return                           # no one has the port open: the bytes are gone
        if self._mismatch():
            self.stats.garbled_tx_bytes += len(data)
            data = bytes((c ^ 0x5A) | 0x80 for c in data)    # framing garbage at the host's rate
        self.output_log += data
        if len(self.output_log) > 1 << 20:
            del self.output_log[:len(self.output_log) - (1 << 20)]
        if self.throttle:
            time.sleep(wire_s)
        self._write(data)

    def _listening(self):
        p = select.poll()
        p.register(self.master, select.POLLOUT)
        return not dict(p.poll(0)).get(self.master, 0) & select.POLLHUP

    def _write(self, data):
        view = memoryview(data)
        poller = select.poll()
        poller.register(self.master, select.POLLOUT)
        while view and self._running:
            ev = dict(poller.poll(200)).get(self.master, 0)
            if ev & select.POLLHUP:
                return                       # no one listening: a UART's bytes are gone
            if not ev & select.POLLOUT:
                continue
            try:
                view = view[os.write(self.master, view):]
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                return

    def _out_text(self, text):
        """Board stdout: MicroPython's cooked output (every \\n goes out as \\r\\n)."""
        if text:
            self._emit(str(text).replace("\n", "\r\n").encode("utf-8", "replace"))

    def _uart_init(self, baud):
        if baud == self.baud:
            return
        if self.check_baud:
            end = time.monotonic() + BAUD_SWITCH_WAIT_S
            while time.monotonic() < end and self._running:
                host = pty_baud(self.master)
                if host and abs(host - baud) <= BAUD_TOLERANCE * baud:
                    break
                time.sleep(0.002)
        self.baud = self.board.repl_baud = baud
        self.stats.bauds.append(baud)

    def _open(self, vfs_open, path, mode="r", *a, **k):
        f = vfs_open(path, mode, *a, **k)
        if any(c in mode for c in "wax+"):
            sd = self.board.vfs.abspath(path).startswith("/sd")
            per = SD_WRITE_US_PER_BYTE if sd else SPIFFS_WRITE_US_PER_BYTE
            return _CostFile(f, lambda n: self._charge(n * per))
        return f

    # ---- input ------------------------------------------------------------------------
    def _take(self, pattern=None, n=None):
        data, c, wire = self._in.take(pattern, n)
        self._charge(wire)
        return data, c

    def _getc(self):
        data, _ = self._take(n=1)
        return data[0]

    def _readline(self, echo=True):
        """mp-readline: ('line', text) on Enter, ('ctrl', code) for Ctrl-A/B/D/E on an empty
        line and Ctrl-C anywhere."""
        line = bytearray()
        while True:
            c = self._getc()
            if c == 3 or (c in (1, 2, 4, 5) and not line):
                return "ctrl", c
            if c == 13:
                if echo:
                    self._emit(b"\r\n")
                return "line", line.decode("utf-8", "replace")
            if c in (8, 127):
                if line:
                    line.pop()
                    if echo:
                        self._emit(b"\x08 \x08")
            elif c == 27:                    # escape sequences (arrow keys): ignored
                if self._getc() in (ord("["), ord("O")):
                    self._getc()
            elif c >= 32 or c == 9:
                line.append(c)
                if echo:
                    self._emit(bytes([c]))

    def _input_line(self, prompt):
        """input() in board code reads a line from the REPL UART."""
        self._executing = False              # Ctrl-C is a character here
        try:
            kind, text = self._readline()
        finally:
            self._executing = True
        if kind == "ctrl":
            raise KeyboardInterrupt() if text == 3 else EOFError()
        return text

    def _input_char(self):
        """sys.stdin.read() in board code takes bytes from the REPL UART, no echo; Ctrl-C is
        the interrupt character (KeyboardInterrupt), not data."""
        self._executing = False
        try:
            c = self._getc()
        finally:
            self._executing = True
        if c == 3 and getattr(self.session, "kbd_intr", 3) == 3:
            raise KeyboardInterrupt()
        return c

    # ---- the REPL ---------------------------------------------------------------------
    def _repl_loop(self):
        try:
            self._run_board(lambda: self.session.boot(run_main=True))
            self._helpers()
            while self._running:
                step = self._raw_repl() if self.mode == RAW else self._friendly_repl()
                if step == "soft_reset":
                    self.stats.soft_resets += 1
                    self.session.kbd_intr = 3        # micropython.kbd_intr(-1) ends here
                    self._run_board(lambda: self.session.soft_reset(run_main=self.mode == FRIENDLY))
                    self._helpers()
        except _Closed:
            pass

    def _helpers(self):
        from tl2k210.maixpy.runtime import mp_repr
        out = self.session.out

        def show(value):                     # the friendly REPL prints expression values
            if value is not None:
                out.write(mp_repr(value) + "\n")
        self.session.builtins["__repl_print__"] = show

    def _friendly_repl(self):
        while self._running:
            self._emit(b">>> ")
            kind, val = self._readline()
            if kind == "ctrl":
                if val == 1:
                    self._emit(b"\r\n")
                    self.mode = RAW
                    return None
                if val == 2:
                    self._emit(b"\r\n" + _banner())
                elif val == 4:
                    self._emit(b"\r\n")
                    return "soft_reset"
                elif val == 5:
                    self._paste_mode()
                else:
                    self._emit(b"\r\n")
                continue
            src = val
            while src is not None and self._incomplete(src):
                self._emit(b"... ")
                kind, more = self._readline()
                if kind == "ctrl":
                    if more == 3:
                        self._emit(b"\r\n")
                        src = None
                    elif more == 4:
                        self._emit(b"\r\n")
                        break
                    continue
                src += "\n" + more
                if more == "":
                    break
            if src is not None and src.strip():
                self._execute(src, "single")
        return None

    @staticmethod
    def _incomplete(src):
        try:
            return codeop.compile_command(src, "<stdin>", "single") is None
        except (SyntaxError, ValueError, OverflowError):
            return False

    def _paste_mode(self):
        self._emit(b"\r\npaste mode; Ctrl-C to cancel, Ctrl-D to finish\r\n=== ")
        lines = []
        while True:
            kind, val = self._readline()
            if kind == "ctrl":
                if val == 3:
                    self._emit(b"\r\n")
                    return
                if val == 4:
                    self._emit(b"\r\n")
                    break
                continue
            lines.append(val)
            self._emit(b"=== ")
        self._execute("\n".join(lines) + "\n", "paste")

    def _raw_repl(self):
        restart = True
        while self._running:
            if restart:
                self._emit(RAW_BANNER)
                restart = False
            self._emit(b">")
            line, action = bytearray(), None
            while action is None:
                data, c = self._take(_RAW_CTRL)
                line += data
                if c is None:
                    continue
                if c == 1:
                    action = "restart"
                elif c == 2:
                    self._emit(b"\r\n" + _banner())
                    self.mode = FRIENDLY
                    return None
                elif c == 3:
                    line.clear()
                elif c == 4:
                    action = "run"
                elif c == 5 and self.raw_paste and not line:
                    action = "paste"
                else:
                    line.append(c)
            if action == "restart":
                restart = True
                continue
            if action == "paste":
                code = self._raw_paste()
                if code is None:
                    continue
                if isinstance(code, bytearray):         # not a raw-paste request after all
                    line = code
                    action = "run"
                else:
                    self._execute(code, "raw")
                    continue
            self._emit(b"OK")
            if not line:
                self._emit(b"\r\n")
                return "soft_reset"
            self._execute(bytes(line), "raw")
        return None

    def _raw_paste(self):
        """Ctrl-E seen at an empty raw line: 'A' Ctrl-A starts raw-paste mode (returns the code
        bytes); anything else is code (returned as a bytearray); None when cancelled."""
        got = bytearray([5])
        for want in (ord("A"), 1):
            c = self._getc()
            got.append(c)
            if c != want:
                return got
        self._emit(b"R\x01" + struct.pack("<H", RAW_PASTE_WINDOW))
        code, used = bytearray(), 0
        while True:
            data, c = self._take(_PASTE_CTRL)
            code += data
            used += len(data) + (1 if c is not None else 0)
            while used >= RAW_PASTE_WINDOW:
                used -= RAW_PASTE_WINDOW
                self._emit(b"\x01")          # the host may send another window
            if c == 4:
                self._emit(b"\x04")
                return bytes(code)
            if c == 3:
                self._emit(b"\x04")
                return None

    # ---- execution ---------------------------------------------------------------------
    def _run_board(self, fn):
        """Boot / soft reboot: errors are printed as the firmware prints them."""
        from tl2k210.maixpy.board import BoardStop
        self._executing = True
        try:
            fn()
        except _Closed:
            raise
        except SystemExit:
            pass
        except BoardStop as stop:
            self.board.stop_reason = None
            self._out_text(f"[tl2k210 host] {stop.reason}\n")
        except BaseException as exc:         # KeyboardInterrupt, or an error outside main.py
            self._out_text(self.session.format_exception(exc))
        finally:
            self._executing = False
            self.session._interrupt = False
            self._notes()

    def _execute(self, src, kind):
        from tl2k210.maixpy.board import BoardStop
        s = self.session
        text = src.decode("utf-8", "replace") if isinstance(src, (bytes, bytearray)) else src
        self.stats.commands += 1
        self._charge(EXEC_US + COMPILE_US_PER_BYTE * len(text))
        err = ""
        self._executing = True
        try:
            code = self._compile_single(text) if kind == "single" else s.compile(text, "<stdin>")
            s.exec(code)
        except _Closed:
            raise
        except SystemExit:                   # pyexec_system_exit is 0 in this core: no reset
            pass
        except BoardStop as stop:
            self.board.stop_reason = None
            err = f"[tl2k210 host] {stop.reason}\n"
        except BaseException as exc:
            err = s.format_exception(exc)
        finally:
            self._executing = False
            s._interrupt = False
        if kind == "raw":
            self._emit(b"\x04")
            self._out_text(err)
            self._emit(b"\x04")
        else:
            self._out_text(err)
        self._notes()

    def _compile_single(self, text):
        """Friendly-REPL input: like exec, but top-level expression values are printed."""
        s = self.session
        s.compile(text, "<stdin>", "single")            # MicroPython's syntax rules and errors
        tree = ast.parse(text, "<stdin>", mode="single")
        for i, st in enumerate(tree.body):
            if isinstance(st, ast.Expr):
                call = ast.Call(ast.Name("__repl_print__", ast.Load()), [st.value], [])
                tree.body[i] = ast.copy_location(ast.Expr(call), st)
        mod = ast.fix_missing_locations(ast.Module(tree.body, []))
        return compile(mod, "<stdin>", "exec", dont_inherit=True)

    def _notes(self):
        notes = self.board.notes
        if self.log is not None:
            for n in notes[self._notes_seen:]:
                self.log(n)
        self._notes_seen = len(notes)


def _banner() -> bytes:
    """The friendly REPL's banner (its last two lines; the ASCII art is _boot.py's)."""
    from tl2k210.maixpy.runtime import BANNER
    lines = [ln for ln in BANNER.strip("\n").split("\n") if ln]
    return ("\r\n".join(lines[-2:]) + "\r\n").encode()

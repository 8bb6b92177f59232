"""The MicroPython raw REPL of a MaixPy board, over any byte stream (a serial port, a pty, a
pyserial URL: `tl2k210.flash.transport.open_port`), and what tl2k210 does with it: run code with
its output streamed, list, upload and download files with checksums the board computes, raise
the baud rate.

    with Repl.open("/dev/ttyUSB0") as r:           # 115200 8N1: MaixPy's REPL (docs/flash-protocol.md#maixpy-repl)
        r.enter_raw()                              # Ctrl-C, Ctrl-A: "raw REPL; CTRL-B to exit"
        r.exec_ok("print(1 + 1)")                  # b'2\\r\\n'
        r.put(open("m.kmodel", "rb").read(), "/sd/m.kmodel", progress=Progress(True))

Protocol (MicroPython tools/pyboard.py semantics; docs/flash-protocol.md#maixpy-repl):
* `exec`: the code, Ctrl-D; the board answers `OK`, stdout, `\\x04`, stderr (the traceback),
  `\\x04`, `>`. Raw-paste mode (Ctrl-E A Ctrl-A -> `R\\x01` + window, flow control by `\\x01`)
  is used when the board offers it; MaixPy's MicroPython 1.11 core does not (it restarts the raw
  REPL, the fallback of pyboard.py/mpremote), and the client remembers that.
* `put`: the file goes to `PATH.part` in chunks: `_tl_w(offset, crc32, 'base64')`; the board
  decodes, checks the CRC-32 (ubinascii.crc32) and the offset, writes and answers the new size
  (`=N`), or `!N` (bad CRC) / `@N` (other offset). A reply that does not come or does not parse
  resynchronises (Ctrl-C, Ctrl-A) and asks the board where its file ends. At the end the board
  reads the whole file back and prints its SHA-256 (uhashlib); only an identical digest renames
  `PATH.part` to `PATH` and reports success. A later `put` of the same file resumes from a
  `.part` whose SHA-256 matches the local prefix, and skips a file already there with the same
  digest. Chunks shrink (4 KiB -> 256 B) on errors and grow back after 8 clean ones.
* every other request is `_tl_x(crc32, 'expr')`: the board evaluates `expr` only if its CRC-32
  matches, so a reply is the real result, a real error (its traceback passes through `_tl_x`),
  or line damage (resent); the helpers themselves arrive in CRC-checked pieces (BOOTSTRAP).
* `set_baud`: `machine.UART.repl_uart().init(B, 8, None, 1, read_buf_len=2048)`, the call
  MaixPy's `_boot.py` makes to switch the REPL UART to 1.5 Mbaud for MaixPy IDE
  (docs/maixpy-firmware.md#boot, docs/flash-protocol.md#maixpy-repl), without `ide=True`, so the
  REPL stays a plain REPL. The host follows after `OK`; the board sleeps before and after the
  switch. `close()` switches back to the initial rate (a board left at another rate answers
  garbage until RESET). Verified against the emulated board only. IDE mode itself
  (`/flash/ide_mode.conf` + reset) switches to the IDE's binary protocol, which this client does
  not speak, so it is not used.

Errors name the cause: no answer (port, power, firmware, baud), a busy board (main.py that
ignores Ctrl-C), no SD card, out of space (SPIFFS /flash is 3 MiB), tracebacks from the board.
"""
from __future__ import annotations

import ast
import base64
import hashlib
import re
import struct
import time
import zlib
from dataclasses import dataclass, field

from tl2k210.errors import Tl2k210Error
from tl2k210.k210.board_facts import REPL_BAUD

RAW_BANNER = b"raw REPL; CTRL-B to exit\r\n"
TIMEOUT = 30.0          # seconds one exchange may take beyond its idle allowance (--timeout)
DEADLINE = object()    # read_until's default `total`: the Repl's timeout
CHUNK_MAX, CHUNK_MIN = 4096, 256


class ReplError(Tl2k210Error):
    """Talking to the board's REPL failed; the message says why and what to do."""


class NoAnswerError(ReplError):
    pass


class BoardBusyError(ReplError):
    pass


class LineError(ReplError):
    """A reply did not come or did not parse (line noise, a lost byte): retryable."""


class DeadlineError(ReplError):
    """A reply kept coming past the operation's deadline (`Repl.timeout`): not retried."""


class BoardExecError(ReplError):
    """The code raised on the board; `.traceback` is the board's text."""

    def __init__(self, msg, traceback=""):
        super().__init__(msg)
        self.traceback = traceback


class NoSdCardError(ReplError):
    pass


class OutOfSpaceError(ReplError):
    pass


class TransferError(ReplError):
    pass


@dataclass
class PutResult:
    path: str
    size: int
    sha256: str
    status: str = "written"             # written | resumed | up to date
    resumed_from: int = 0
    sent_bytes: int = 0                 # payload bytes sent (retries included)
    retries: int = 0
    seconds: float = 0.0
    notes: list = field(default_factory=list)


def _wire(nbytes, baud):
    return nbytes * 10.0 / max(1, baud)


# Board-side helpers (MicroPython 1.11: no f-strings), sent once per connection / soft reboot.
HELPERS = """\
import uos as _tlo, ubinascii as _tlb, uhashlib as _tlh
try:
    _tlf.close()
except Exception:
    pass
_tlf = None
_tln = 0
def _tl_size(p):
    try:
        return _tlo.stat(p)[6]
    except OSError:
        return -1
def _tl_sha(p):
    h = _tlh.sha256()
    f = open(p, 'rb')
    while True:
        b = f.read(4096)
        if not b:
            break
        h.update(b)
    f.close()
    return _tlb.hexlify(h.digest()).decode()
def _tl_info(p, m):
    if m != '/flash' and m[1:] not in _tlo.listdir('/'):
        return None
    s = _tlo.statvfs(m)
    return (_tl_size(p + '.part'), _tl_size(p), s[1] * s[3])
def _tl_open(p, n):
    global _tlf, _tln
    _tl_close()
    _tlf = open(p, 'ab' if n else 'wb')
    _tln = n
    return n
def _tl_w(o, c, d):
    global _tln
    if o != _tln:
        print('@%d' % _tln)
        return
    d = _tlb.a2b_base64(d)
    if _tlb.crc32(d) & 0xffffffff != c:
        print('!%d' % _tln)
        return
    _tln += _tlf.write(d)
    print('=%d' % _tln)
def _tl_reopen(p):
    global _tlf, _tln
    try:
        _tlf.close()
    except Exception:
        pass
    _tln = max(0, _tl_size(p))
    _tlf = open(p, 'ab')
    return _tln
def _tl_close():
    global _tlf
    if _tlf:
        _tlf.close()
    _tlf = None
def _tl_rm(p):
    if _tl_size(p) >= 0:
        _tlo.remove(p)
        return True
    return False
def _tl_commit(t, p):
    if _tl_size(t) >= 0:
        if _tl_size(p) >= 0:
            _tlo.remove(p)
        _tlo.rename(t, p)
    return _tl_size(p)
def _tl_get(p, o, n):
    f = open(p, 'rb')
    f.seek(o)
    b = f.read(n)
    f.close()
    return (len(b), _tlb.crc32(b) & 0xffffffff, _tlb.b2a_base64(b).decode().strip())
def _tl_ls(d):
    r = []
    for n in _tlo.listdir(d):
        p = '/' + n if d == '/' else d.rstrip('/') + '/' + n
        try:
            st = _tlo.stat(p)
            r.append((n, st[0] & 0x4000 != 0, st[6]))
        except OSError:
            r.append((n, False, -1))
    return r
def _tl_x(c, s):
    if _tlb.crc32(s.encode()) & 0xffffffff != c:
        raise ValueError('damaged on the line')
    print(repr(eval(s)))
"""
# defines the helpers from CRC-checked pieces: a damaged piece is dropped and resent
BOOTSTRAP = """\
import ubinascii as _tlb
_tls = b''
def _tla(d, c):
    global _tls
    try:
        d = _tlb.a2b_base64(d)
    except Exception:
        d = None
    if d and _tlb.crc32(d) & 0xffffffff == c:
        _tls += d
    print(len(_tls))
print(len(_tls))
"""


def board_error(err: bytes | str, what: str) -> ReplError:
    """A board traceback as an error that says what it means."""
    text = err.decode("utf-8", "replace") if isinstance(err, (bytes, bytearray)) else err
    last = text.strip().splitlines()[-1] if text.strip() else "(no message)"
    if "ENOSPC" in text or "SPIFFS Error Code -10001" in text:
        return OutOfSpaceError(f"{what}: the board's file system is full ({last}); delete files "
                               "(`tl2k210 repl rm`) or use the SD card (--to /sd)")
    if "ENOENT" in text:
        return BoardExecError(f"{what}: no such file or folder on the board ({last}); "
                              "`tl2k210 repl ls` shows what is there", text)
    kpu = re.search(r"\[MAIXPY\]kpu: \w+ error:(\d+)", text)
    if kpu:
        from tl2k210.maixpy.KPU import CAUSES
        code = int(kpu.group(1))
        cause = CAUSES.get(code, "see docs/maixpy-firmware.md#error-codes")
        fix = {2006: ": a MaixPy minimum build leaves more heap for models (the emulated board: "
                     "`tl2k210 board --maixpy --runtime maixpy-minimum`), or use a smaller model "
                     "(lower MobileNet alpha or input size)",
               2002: ": check the address or file, and that the model is kmodel v3/v4"}.get(code, "")
        return BoardExecError(f"{what}: the board raised {last} (error {code}: {cause}{fix})", text)
    if "MemoryError" in text or "memory allocation failed" in text:
        return BoardExecError(f"{what}: the board ran out of GC heap ({last}); soft-reset it "
                              "(Ctrl-D) to free memory, or use smaller pieces", text)
    return BoardExecError(f"{what}: the board raised {last}", text)


class Repl:
    """One board on one open port (any pyserial-like object with read/write/baudrate)."""

    def __init__(self, port, raw_paste=True, reply_s=3.0, log=None, name="the board",
                 timeout=TIMEOUT):
        self.port = port
        self.name = name
        self.reply_s = reply_s
        self.timeout = timeout
        self.raw_paste = None if raw_paste else False   # None: not probed yet
        self.log = log or (lambda msg: None)
        self.in_raw = False
        self.initial_baud = getattr(port, "baudrate", REPL_BAUD)
        self._buf = bytearray()
        self._helpers = False
        self._cwd = None

    @classmethod
    def open(cls, url, baud=REPL_BAUD, **kw):
        from tl2k210.flash.transport import open_port
        port = open_port(url, baud, timeout=0.02, write_timeout=60.0)
        return cls(port, name=url, **kw)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def baud(self):
        return getattr(self.port, "baudrate", REPL_BAUD)

    # ---- bytes ---------------------------------------------------------------------------
    def _fill(self, wait):
        try:
            n = getattr(self.port, "in_waiting", 0) or 1
            data = self.port.read(n)
        except OSError as exc:
            raise ReplError(f"reading {self.name} failed: {exc}; is the board still plugged "
                            "in?") from None
        if data:
            self._buf += data
        elif wait:
            time.sleep(0.001)
        return len(data)

    def _write(self, data):
        try:
            self.port.write(data)
        except OSError as exc:
            raise ReplError(f"writing to {self.name} failed: {exc}; is the board still plugged "
                            "in?") from None

    def read_until(self, marker: bytes, idle=None, total=DEADLINE, on_data=None) -> bytes:
        """Bytes up to and including `marker`. `idle`: seconds without a byte before giving up;
        `total`: overall limit (None: none; by default `timeout` plus `idle`: a line that keeps
        sending without the marker raises DeadlineError). `on_data` streams what arrives before
        a one-byte marker. Raises LineError with what came."""
        deadline = total is DEADLINE
        if deadline:
            total = None if self.timeout is None else self.timeout + (idle or 0)
        t0 = last = time.monotonic()
        streamed = bytearray()
        while True:
            i = self._buf.find(marker)
            if i >= 0:
                out = bytes(streamed + self._buf[:i + len(marker)])
                if on_data is not None and i:
                    on_data(bytes(self._buf[:i]))
                del self._buf[:i + len(marker)]
                return out
            if on_data is not None and len(marker) == 1 and self._buf:
                on_data(bytes(self._buf))
                streamed += self._buf
                self._buf.clear()
            now = time.monotonic()
            if self._fill(True):
                last = now
            if deadline and total is not None and now - t0 > total:
                got = bytes(streamed + self._buf)
                raise DeadlineError(
                    f"{self.name} kept sending for {total:g} s without ending its reply "
                    f"({len(got):,} bytes, the last: {got[-60:]!r}): is a program printing on "
                    "that port? Press RESET, check the port, or allow more time with --timeout")
            if (idle is not None and now - last > idle) or (total is not None and now - t0 > total):
                got = bytes(streamed + self._buf)
                raise LineError(f"{self.name} did not send {marker!r} (got {len(got)} bytes: "
                                f"{got[-80:]!r})")

    def _read_n(self, n, idle):
        last = time.monotonic()
        while len(self._buf) < n:
            if self._fill(True):
                last = time.monotonic()
            elif time.monotonic() - last > idle:
                raise LineError(f"{self.name} sent {bytes(self._buf)!r}, expected {n} bytes")
        out = bytes(self._buf[:n])
        del self._buf[:n]
        return out

    def drain(self, quiet=0.1, limit=2.0) -> bytes:
        """Read until the line has been quiet for `quiet` seconds (at most `limit`)."""
        t0 = last = time.monotonic()
        while time.monotonic() - last < quiet and time.monotonic() - t0 < limit:
            if self._fill(True):
                last = time.monotonic()
        out = bytes(self._buf)
        self._buf.clear()
        return out

    # ---- raw REPL -------------------------------------------------------------------------
    def enter_raw(self, soft_reset=False, tries=3):
        """Interrupt what runs (Ctrl-C) and enter the raw REPL (Ctrl-A)."""
        seen = bytearray()
        for attempt in range(tries):
            self._write(b"\r\x03\x03")
            seen += self.drain(quiet=0.1 + 0.1 * attempt, limit=1.0)
            self._write(b"\r\x01")
            try:
                seen += self.read_until(RAW_BANNER + b">", idle=1.0 + attempt, total=2.5)
                self.in_raw = True
                break
            except LineError:
                seen += self.drain(quiet=0.05, limit=0.5)
        else:
            raise self._diagnose(bytes(seen))
        if soft_reset:
            self.soft_reset()
        return self

    def _diagnose(self, seen: bytes) -> ReplError:
        where = f"{self.name} at {self.baud} baud"
        if not seen:
            return NoAnswerError(
                f"no answer from {where}: is this the board's port and is the board powered? A "
                "board in kflash's ISP mode or without MaixPy firmware does not answer "
                "(`tl2k210 flash` the firmware, then press RESET). The REPL runs at 115200; if an "
                "earlier `tl2k210 repl -b` was interrupted, press RESET or pass --initial-baud. "
                "A main.py that ignores Ctrl-C and prints nothing looks the same: press RESET")
        printable = sum(32 <= c < 127 or c in (9, 10, 13) for c in seen) / len(seen)
        if printable < 0.7:
            return NoAnswerError(
                f"garbled answer from {where} ({seen[:24]!r}...): the board talks at another baud "
                "rate (MaixPy IDE mode is 1.5 Mbaud; an interrupted `tl2k210 repl -b` leaves it "
                "at that rate): press RESET, or pass --initial-baud")
        tail = seen.decode("utf-8", "replace").strip().splitlines()[-3:]
        return BoardBusyError(
            f"{where} keeps running code that does not stop on Ctrl-C (a main.py loop with a bare "
            "`except:`, `except KeyboardInterrupt` or micropython.kbd_intr(-1)?) and never entered "
            "the raw REPL; its last "
            f"output: {' | '.join(tail)!r}. Press RESET and connect within _boot.py's 200 ms "
            "Ctrl-C window, or remove main.py (SD card in a PC)")

    def exit_raw(self):
        if self.in_raw:
            self._write(b"\r\x02")
            self.in_raw = False

    def interrupt(self):
        self._write(b"\x03")

    def soft_reset(self):
        """Ctrl-D at the raw prompt: `soft reboot`, _boot.py and boot.py (not main.py), then the
        raw REPL again. Board variables (and our helpers) are gone."""
        self._write(b"\x04")
        self.read_until(b"soft reboot\r\n", idle=5.0)
        self.read_until(RAW_BANNER + b">", idle=30.0)
        self._helpers = False
        self._cwd = None

    def resync(self, tries=4):
        """After a lost or garbled reply: cancel, clear, and come back to a fresh raw prompt."""
        for attempt in range(tries):
            self._write(b"\x03\x03")
            seen = self.drain(quiet=0.15, limit=3.0)
            if b"soft reboot" in seen:
                self._helpers = False
            self._write(b"\r\x01")
            try:
                out = self.read_until(RAW_BANNER + b">", idle=2.0, total=10.0)
            except LineError:
                if attempt == tries - 1:
                    raise
                continue
            if b"soft reboot" in out:
                self._helpers = False
            self.in_raw = True
            return

    def _send(self, data: bytes):
        if self.raw_paste is not False:
            self._write(b"\x05A\x01")
            r = self._read_n(2, self.reply_s)
            if r == b"R\x01":
                self.raw_paste = True
                return self._paste(data)
            if r != b"R\x00":            # a core without raw paste restarted the raw REPL
                self.read_until(RAW_BANNER[2:] + b">", idle=self.reply_s)
            self.raw_paste = False
        self._write(data + b"\x04")
        r = self._read_n(2, _wire(len(data) + 8, self.baud) + self.reply_s)
        if r != b"OK":
            raise LineError(f"{self.name} did not accept the command (answered {r!r})")

    def _paste(self, data: bytes):
        window = struct.unpack("<H", self._read_n(2, self.reply_s))[0]
        remain, i = window, 0
        wait = _wire(window + 8, self.baud) + self.reply_s
        while i < len(data):
            while remain == 0 or self._buf or getattr(self.port, "in_waiting", 0):
                c = self._read_n(1, wait)
                if c == b"\x01":
                    remain += window
                elif c == b"\x04":
                    self._write(b"\x04")
                    raise LineError(f"{self.name} ended the raw paste early")
                else:
                    raise LineError(f"unexpected {c!r} from {self.name} during raw paste")
            piece = data[i:i + remain]
            self._write(piece)
            remain -= len(piece)
            i += len(piece)
        self._write(b"\x04")
        ack = self.read_until(b"\x04", idle=wait)
        if ack.strip(b"\x01") != b"\x04":
            raise LineError(f"{self.name} answered {ack!r} to the end of the raw paste")

    def exec(self, code, on_output=None, idle=10.0, total=DEADLINE):
        """Run `code` in the raw REPL: (stdout, stderr) bytes; stdout streams to `on_output`.
        `idle`: seconds without output before giving up (None: wait for ever); `total`: the
        overall limit (default: the Repl's timeout beyond `idle`; None: none)."""
        if not self.in_raw:
            self.enter_raw()
        data = code.encode("utf-8") if isinstance(code, str) else bytes(code)
        self._send(data)
        out = self.read_until(b"\x04", idle=idle, total=total, on_data=on_output)[:-1]
        err = self.read_until(b"\x04", idle=idle, total=total)[:-1]
        self.read_until(b">", idle=self.reply_s)
        return out, err

    def exec_ok(self, code, what="running code", idle=10.0, on_output=None) -> bytes:
        out, err = self.exec(code, on_output=on_output, idle=idle)
        if err:
            raise board_error(err, what)
        return out

    def eval(self, expr, what="evaluating", idle=10.0):
        out = self.exec_ok(f"print(repr({expr}))", what, idle)
        try:
            return ast.literal_eval(out.decode("utf-8", "replace").strip())
        except (ValueError, SyntaxError):
            raise LineError(f"{what}: could not parse the board's answer {out[:80]!r}") from None

    # ---- helpers on the board --------------------------------------------------------------
    def helpers(self, tries=8, piece=256):
        """Define the board-side helpers from CRC-checked pieces (BOOTSTRAP), then run them only
        if their CRC-32 matches: a damaged definition is resent, never executed."""
        if self._helpers:
            return
        src = HELPERS.encode()
        for attempt in range(tries):
            try:
                if self.exec_ok(BOOTSTRAP, "starting tl2k210's helpers").strip() != b"0":
                    raise LineError("the helper bootstrap was damaged")
                have, bad = 0, 0
                while have < len(src):
                    blob = src[have:have + piece]
                    try:
                        out = self.exec_ok(f"_tla('{base64.b64encode(blob).decode()}',"
                                           f"{zlib.crc32(blob)})", "sending tl2k210's helpers")
                        n = int(out.strip())
                    except (LineError, BoardExecError, ValueError):
                        n = None
                    if n == have + len(blob):
                        have = n
                        continue
                    bad += 1                    # a damaged piece (the board dropped it)
                    if n is None:
                        self.resync()
                    elif n != have or bad > 20:
                        raise LineError(f"the board holds {n} helper bytes, expected {have}")
                out = self.exec_ok(f"if _tlb.crc32(_tls) & 0xffffffff == {zlib.crc32(src)}:\n"
                                   "    exec(_tls.decode())\n    _tls = b''\n    print('ok')\n",
                                   "defining tl2k210's helpers")
                if out.strip() == b"ok":
                    self._helpers = True
                    return
                raise LineError("the helpers arrived damaged")
            except (LineError, BoardExecError, ValueError) as exc:
                if attempt == tries - 1:
                    raise ReplError(f"could not define tl2k210's helpers on the board ({exc}); "
                                    "the line loses bytes: check the cable or use a lower -b") from None
                self.resync()

    def call(self, expr, what, idle=10.0, tries=6):
        """Evaluate `expr` (a call of the helpers) on the board and return its value. The board
        runs it only if its CRC-32 matches (`_tl_x`), so a reply is either the real result, a
        real error (raised, as ReplError), or line damage (resynchronise and ask again)."""
        cmd = f"_tl_x({zlib.crc32(expr.encode())},{expr!r})"
        for attempt in range(tries):
            try:
                self.helpers()
                out, err = self.exec(cmd, idle=idle)
                if err:
                    text = err.decode("utf-8", "replace")
                    if "name '_tl_x' isn't defined" in text:
                        self._helpers = False           # the board rebooted under us
                        continue
                    if "in _tl_x" in text and "damaged on the line" not in text:
                        raise board_error(err, what)    # the expression itself raised
                    raise LineError(text.strip().splitlines()[-1])   # the command was damaged
                try:
                    return ast.literal_eval(out.decode("utf-8", "replace").strip())
                except (ValueError, SyntaxError):
                    raise LineError(f"could not parse the board's answer {out[:80]!r}") from None
            except LineError as exc:
                if attempt == tries - 1:
                    raise ReplError(f"{what}: {exc}; the line to the board loses bytes: check "
                                    "the cable, or use a lower -b") from None
                self.log(f"{what}: {exc}; resynchronising")
                self.resync()

    def cwd(self):
        if self._cwd is None:
            self._cwd = self.call("_tlo.getcwd()", "asking the board's folder")
        return self._cwd

    def abspath(self, path):
        if path.startswith("/"):
            return path.rstrip("/") or "/"
        base = self.cwd()
        while path.startswith("./"):
            path = path[2:]
        return (base.rstrip("/") + "/" + path) if path else base

    # ---- files ------------------------------------------------------------------------------
    def ls(self, path=None):
        """[(name, is_dir, size)] of a board folder (default: the board's cwd)."""
        d = self.abspath(path) if path else self.cwd()
        return self.call(f"_tl_ls({d!r})", f"listing {d}")

    def rm(self, path):
        p = self.abspath(path)
        if not self.call(f"_tl_rm({p!r})", f"removing {p}"):
            raise BoardExecError(f"no file {p} on the board (`tl2k210 repl ls` shows what is there)")

    def size(self, path):
        p = self.abspath(path)
        return self.call(f"_tl_size({p!r})", f"stat {p}")

    def sha256(self, path):
        p = self.abspath(path)
        return self.call(f"_tl_sha({p!r})", f"hashing {p}", idle=300)

    def get(self, path, progress=None, chunk=3072) -> bytes:
        """Download a board file; each piece is checked against the board's CRC-32."""
        p = self.abspath(path)
        total = self.size(p)
        if total < 0:
            raise BoardExecError(f"no file {p} on the board (`tl2k210 repl ls` shows what is "
                                 "there)")
        out = bytearray()
        if progress:
            progress.start(p.rsplit("/", 1)[-1], total)
        bad = 0
        while len(out) < total:
            n = min(chunk, total - len(out))
            k, crc, b64 = self.call(f"_tl_get({p!r},{len(out)},{n})", f"reading {p}")
            try:
                data = base64.b64decode(b64, validate=True)
                ok = len(data) == k == n and zlib.crc32(data) == crc
            except ValueError:
                ok = False
            if not ok:
                bad += 1
                if bad > 20:
                    raise TransferError(f"reading {p}: too many damaged replies; check the line")
                continue
            out += data
            if progress:
                progress.update(len(out))
        return bytes(out)

    def put(self, data: bytes, path: str, progress=None, resume=True) -> PutResult:
        """Upload `data` to the board file `path` (see the module docstring). Raises on any
        failure; success means the board computed the file's SHA-256 and it matches."""
        t0 = time.monotonic()
        p = self.abspath(path)
        mount = "/" + p.split("/")[1] if p.count("/") >= 2 else p
        if mount not in ("/flash", "/sd"):
            raise ReplError(f"{p}: MaixPy files live under /flash (SPIFFS) or /sd (SD card); "
                            f"use --to /flash or --to /sd")
        part = p + ".part"
        sha = hashlib.sha256(data).hexdigest()
        res = PutResult(p, len(data), sha)
        info = self.call(f"_tl_info({p!r},{mount!r})", f"checking {p}")
        if info is None:
            raise NoSdCardError(f"{p}: the board has no SD card (no /sd): MaixPy mounts a "
                                "FAT-formatted card at boot, so insert one and press RESET, or "
                                "put the file on /flash (--to /flash)")
        part_size, final_size, free = info
        if final_size == len(data) and self.sha256(p) == sha:
            res.status = "up to date"
            res.seconds = time.monotonic() - t0
            return res
        start = 0
        if resume and 0 < part_size <= len(data) and \
                self.sha256(part) == hashlib.sha256(data[:part_size]).hexdigest():
            start = part_size
        stale = part_size if start == 0 and part_size > 0 else 0    # truncated by the upload
        if len(data) - start - stale > free:
            room = "3 MiB SPIFFS" if mount == "/flash" else "SD card"
            keep = " (the old copy stays until the new one is verified)" if final_size >= 0 else ""
            raise OutOfSpaceError(
                f"{p}: out of space on {mount} ({room}): {free // 1024} KiB free, the file needs "
                f"{(len(data) - start) // 1024} KiB more{keep}; remove files (`tl2k210 repl rm`) "
                f"or put it on the {'SD card (--to /sd)' if mount == '/flash' else 'flash'}")
        for attempt in range(2):
            self._upload(data, part, start, res, progress)
            self.call("_tl_close()", "closing the file")
            got = self.sha256(part)
            if got == sha:
                break
            res.notes.append(f"the board's SHA-256 of {part} was {got[:16]}..., not "
                             f"{sha[:16]}...: uploading again from the start")
            self.log(res.notes[-1])
            start = 0
        else:
            raise TransferError(f"{p}: the board's copy kept differing from the file (SHA-256 "
                                f"{got[:16]}... != {sha[:16]}...); nothing was renamed, "
                                f"{part} is left on the board; check the cable or use a lower -b")
        size = self.call(f"_tl_commit({part!r},{p!r})", f"renaming {part} to {p}")
        if size != len(data):
            raise TransferError(f"{p}: after the rename the board reports {size} bytes, not "
                                f"{len(data)}")
        res.resumed_from = start
        res.status = "resumed" if start else "written"
        res.seconds = time.monotonic() - t0
        return res

    def _upload(self, data, part, start, res, progress):
        total = len(data)
        label = part.rsplit("/", 1)[-1][:-5]
        if progress:
            progress.start(label, total, done=start)
        self.call(f"_tl_open({part!r},{start})", f"opening {part}")
        off, size, clean = start, CHUNK_MAX, 0
        budget = 30 + 2 * (total - start) // 1024
        while off < total:
            piece = data[off:off + size]
            cmd = f"_tl_w({off},{zlib.crc32(piece)},'{base64.b64encode(piece).decode()}')"
            res.sent_bytes += len(piece)
            reply = None
            try:
                self.helpers()
                out, err = self.exec(cmd, idle=max(5.0, _wire(len(cmd), self.baud) * 2 + 2))
                reply = out.decode("ascii", "replace").strip() if not err else None
            except LineError as exc:
                self.log(f"{part} @{off}: {exc}")
            m = re.fullmatch(r"([=@!])(\d+)", reply or "")
            if m and m.group(1) == "=" and int(m.group(2)) == off + len(piece):
                off += len(piece)
                clean += 1
                if clean >= 8 and size < CHUNK_MAX:
                    size, clean = size * 2, 0
                if progress:
                    progress.update(off)
                continue
            res.retries += 1
            clean, size = 0, max(CHUNK_MIN, size // 2)
            if res.retries > budget:
                raise TransferError(f"{part}: {res.retries} chunks failed (last at byte {off}); "
                                    "the line loses too much: check the cable or use a lower -b. "
                                    "The part uploaded so far stays; run the same put to resume")
            if m and m.group(1) in "@!" and 0 <= int(m.group(2)) <= total:
                off = int(m.group(2))           # the board says where its file ends
                continue
            self.resync()
            off = self._reopen(part, total)

    def _reopen(self, part, total):
        n = self.call(f"_tl_reopen({part!r})", f"reopening {part}")
        if not isinstance(n, int) or not 0 <= n <= total:
            raise TransferError(f"{part}: the board reports an unexpected size ({n!r})")
        return n

    # ---- baud -----------------------------------------------------------------------------------
    def set_baud(self, baud):
        """Switch the REPL UART and the host to `baud` (see the module docstring)."""
        old = self.baud
        if baud == old:
            return
        if not self.in_raw:
            self.enter_raw()
        code = (b"import time\nfrom machine import UART\ntime.sleep_ms(20)\n"
                b"UART.repl_uart().init(%d, 8, None, 1, read_buf_len=2048)\ntime.sleep_ms(50)\n"
                % baud)
        self._write(code + b"\x04")
        if self._read_n(2, _wire(len(code), old) + self.reply_s) != b"OK":
            self.resync()
            raise ReplError(f"{self.name} did not accept the baud change")
        try:
            self.port.flush()
        except Exception:
            pass
        self.port.baudrate = baud
        try:
            end = self.read_until(b">", idle=2.0)
            if not end.endswith(b"\x04\x04>"):
                raise LineError(f"unexpected {end[-40:]!r}")
            self.exec_ok("print(1)", "checking the new baud rate")
            self.log(f"REPL at {baud} baud")
            return
        except LineError:
            pass
        try:                                    # back to the old rate: did the board switch?
            self.port.baudrate = old
            self.resync()
        except ReplError:
            raise NoAnswerError(f"lost {self.name} after switching to {baud} baud (the USB-serial "
                                "bridge may not do that rate): press RESET (the REPL restarts "
                                "at 115200) and use a lower -b") from None
        raise ReplError(f"{self.name} did not switch to {baud} baud (machine.UART.repl_uart() "
                        f"missing in this firmware?); staying at {old}")

    def close(self):
        try:
            if self.baud != self.initial_baud and self.in_raw:
                self.set_baud(self.initial_baud)
            self.exit_raw()
        except ReplError:
            pass
        finally:
            try:
                self.port.close()
            except Exception:
                pass

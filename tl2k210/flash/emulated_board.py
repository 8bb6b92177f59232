"""An emulated K210 board: mask-ROM ISP, the stage-2 flash stub and a 16 MiB SPI flash kept in a
file, behind a pseudo-terminal (or driven directly through :class:`K210Core`).

It is strict like the chip: malformed frames get ``[op, E1]``, bad CRCs ``[op, E2]``, unknown
commands ``[op, E3]``; the stub only runs if the SRAM holds a known stage-2 program (a stub
uploaded to the wrong addresses hangs the board); after a reboot the emulated bootrom checks the
address-0 envelope (flag, length, SHA-256) and prints MaixPy's banner or the ROM's
"boot failed with exit code 233" line.

Boot mode comes from the RESET/IO16 wiring of a board preset (DTR/RTS reach it through
:meth:`EmulatedBoard.set_line`, the :class:`~tl2k210.flash.transport.LineShim`, or the
unix-datagram socket used by ``shim/sitecustomize.py``), or, with ``wiring="isp_on_open"``, the
board resets into the ROM ISP whenever the port is opened (a pty shows no DTR/RTS).

Line speed is simulated (bytes x 10 / baud) when ``throttle`` is on; the host's baud rate is read
from the pty (TCGETS2) and bytes sent at a different rate than the board's UART are lost.
Seeded fault injection drops, corrupts or delays host->board bytes at a given per-byte rate.
"""
import array
import fcntl
import math
import mmap
import os
import random
import select
import socket
import struct
import tempfile
import threading
import time
import tty
from dataclasses import dataclass, field

from tl2k210.flash import image as fw_image
from tl2k210.flash import isp, slip
from tl2k210.flash.boards import FLASH_SIZE_16M, get_board
from tl2k210.flash.isp import Op, Reason

TCGETS2 = 0x802C542A
BAUD_TOLERANCE = 0.03
RX_SLACK_S = 0.010        # see _read_host: emulator wake-up latency is not line idle time
SAMPLE_DELAY_S = 0.02     # IO16 is sampled this long after RESET is released (or at first byte)
STUB_START_S = 0.01       # C5 -> stub running
MAIXPY_BANNER = ("\r\n __  __              _____  __   __  _____   __     __\r\n"
                 "[MaixPy] init end\r\n"
                 "MicroPython (tl2k210 emulated board) with kendryte-k210\r\n>>> ")


@dataclass
class FaultConfig:
    rate: float = 0.0                       # per host->board byte
    kinds: tuple = ("corrupt", "drop")      # chosen uniformly per fault
    seed: int = 0
    delay_s: tuple = (0.05, 0.2)            # for "delay" faults
    stop_after_bytes: int = None            # board goes silent after this many stub-stage bytes


@dataclass
class BoardStats:
    rx_bytes: int = 0
    faults: dict = field(default_factory=dict)
    frames: int = 0
    errors_replied: dict = field(default_factory=dict)
    lost_bytes_baud_mismatch: int = 0
    boots: list = field(default_factory=list)
    # data phase as seen by the board: first FLASH_WRITE byte on the wire .. last write acked
    write_t0: float = None
    write_t1: float = None
    write_bytes: int = 0

    def write_efficiency(self, baud):
        """Acknowledged FLASH_WRITE payload / line capacity over the data phase."""
        if self.write_t0 is None or self.write_t1 is None or self.write_t1 <= self.write_t0:
            return 0.0
        return self.write_bytes / (baud / 10.0 * (self.write_t1 - self.write_t0))


def wiring_lines(wiring):
    """(RESET line, IO16 line) of a board preset; (None, None) for isp_on_open / manual."""
    if wiring in ("isp_on_open", "manual"):
        return None, None
    b = get_board(wiring)
    if not b.reset_line:
        raise ValueError(f"the emulator has no wiring model for board {wiring!r}")
    return b.reset_line, b.boot_line


class K210Core:
    """The transport-independent chip: ``feed(bytes, now)`` and ``tick(now)`` return bytes to send
    back; ``set_line`` models RESET/IO16."""

    ROM, STUB, APP, RESET, DEAD = "rom", "stub", "app", "reset", "dead"

    def __init__(self, flash, wiring="dan", known_stubs=None, stats=None, write_time_s=0.0,
                 erase_busy_polls=2, initial_state=None):
        self.flash = flash                    # a writable buffer (mmap or bytearray)
        self.flash_size = len(flash)
        self.sram = bytearray(isp.SRAM_SIZE)
        self.known_stubs = list(known_stubs) if known_stubs is not None else None
        self.stats = stats or BoardStats()
        self.write_time_s = write_time_s
        self.erase_busy_polls = erase_busy_polls
        self.decoder = slip.Decoder()
        self.baud = isp.ROM_BAUD
        self.flash_ready = False
        self._busy = 0
        self._pending = []                    # (time, callable)
        self._release_at = None
        self.lines = {"dtr": False, "rts": False}
        self.wiring = wiring
        self.reset_line, self.boot_line = wiring_lines(wiring)
        self.state = initial_state or (self.ROM if wiring in ("isp_on_open", "manual")
                                       else self.APP)
        self.boot_ok = None
        self.boot_message = ""

    # ---- pins ---------------------------------------------------------------------------
    def set_line(self, line, asserted, now):
        self.lines[line] = bool(asserted)
        if self.reset_line is None:
            return
        if line == self.reset_line:
            if asserted:                      # RESET pin low: chip held in reset
                self.state = self.RESET
                self._release_at = None
                self._pending.clear()
            elif self.state == self.RESET:
                self._release_at = now        # sample IO16 a little later (docs/flash-protocol.md#board-reset-wiring)

    def _sample_boot_pin(self):
        self._release_at = None
        if self.lines.get(self.boot_line):    # IO16 low -> ROM ISP
            return self.enter_rom()
        return self.boot_from_flash()

    def enter_rom(self):
        self.state = self.ROM
        self.baud = isp.ROM_BAUD
        self.flash_ready = False
        self.decoder.reset()
        return b""

    def power_on_reset_into_isp(self):
        """What a board does when its port open toggles it into ISP (or BOOT is held)."""
        self._pending.clear()
        self._release_at = None
        return self.enter_rom()

    def boot_from_flash(self):
        self.baud = isp.ROM_BAUD
        self.decoder.reset()
        try:
            fw_image.unwrap(self.flash)
            self.boot_ok, self.boot_message = True, "ok"
            self.state = self.APP
            self.stats.boots.append("ok")
            return MAIXPY_BANNER.encode()
        except fw_image.ImageError as exc:
            self.boot_ok, self.boot_message = False, str(exc)
            self.state = self.APP
            self.stats.boots.append("failed: " + str(exc))
            return (fw_image.BOOT_FAIL_MESSAGE + "\r\n").encode()

    # ---- time ---------------------------------------------------------------------------
    def tick(self, now):
        out = b""
        if self._release_at is not None and now - self._release_at >= SAMPLE_DELAY_S:
            out += self._sample_boot_pin()
        due = [p for p in self._pending if p[0] <= now]
        if due:
            self._pending = [p for p in self._pending if p[0] > now]
            for _, fn in due:
                out += fn() or b""
        return out

    # ---- bytes --------------------------------------------------------------------------
    def feed(self, data, now):
        if self._release_at is not None:
            self.tick(now + SAMPLE_DELAY_S)   # the first byte after release fixes the boot mode
        if self.state in (self.RESET, self.DEAD, self.APP):
            return b""
        out = bytearray()
        for payload, ok in self.decoder.feed(data):
            self.stats.frames += 1
            reply = self._handle(payload, ok, now)
            if reply:
                out += slip.encode(reply)
            if self.state not in (self.ROM, self.STUB):
                break
        return bytes(out)

    def _error(self, op, reason):
        self.stats.errors_replied[reason] = self.stats.errors_replied.get(reason, 0) + 1
        return isp.response(op, reason)

    def _handle(self, payload, ok, now):
        req, reason = isp.parse_request(payload)
        op = payload[0]
        if req is not None and not ok and reason == Reason.OK:
            reason = Reason.BAD_DATA_CHECKSUM     # an invalid escape garbles the data
        if self.state == self.ROM:
            return self._rom(op, req, reason, now)
        return self._stub(op, req, reason, now)

    def _rom(self, op, req, reason, now):
        if op == Op.NOP:
            return isp.response(op, Reason.OK)
        if op not in (Op.MEMORY_WRITE, Op.MEMORY_BOOT, Op.CHANGE_BAUDRATE):
            return self._error(op, Reason.INVALID_COMMAND)
        if reason != Reason.OK:
            return self._error(op, reason)
        if op == Op.MEMORY_WRITE:
            off = self._sram_offset(req.address, len(req.data))
            if off is None:
                return self._error(op, Reason.INVALID_COMMAND)
            self.sram[off:off + len(req.data)] = req.data
            return isp.response(op, Reason.OK)
        if op == Op.CHANGE_BAUDRATE:
            if len(req.data) == 4:
                self.baud = struct.unpack("<I", req.data)[0]
            return b""
        # MEMORY_BOOT: no reply; the program starts
        self._pending.append((now + STUB_START_S, lambda a=req.address: self._start_program(a)))
        return b""

    def _sram_offset(self, address, n):
        for base in (isp.SRAM_START, isp.SRAM_UNCACHED_ALIAS):
            if base <= address and address + n <= base + isp.SRAM_SIZE:
                return address - base
        return None

    def _start_program(self, address):
        off = self._sram_offset(address, 1)
        if off is None:
            self.state = self.DEAD
            return b""
        stubs = self.known_stubs
        if stubs is None:
            from tl2k210.flash.stub import kflash_stub
            stubs = self.known_stubs = [kflash_stub()]
        if stubs and not any(bytes(self.sram[off:off + len(s)]) == s for s in stubs):
            self.state = self.DEAD           # corrupted program: the CPU runs off into garbage
            return b""
        self.state = self.STUB
        self.decoder.reset()
        self.flash_ready = False
        return b""

    def _stub(self, op, req, reason, now):
        if op in (Op.FLASH_NOP,):
            return isp.response(op, Reason.OK)
        if op == Op.REBOOT:
            self._pending.append((now + 0.001, self.boot_from_flash))
            return isp.response(op, Reason.OK)
        if op == Op.FLASH_STATUS:
            if self._busy > 0:
                self._busy -= 1
                return isp.response(op, Reason.FLASH_BUSY)
            return isp.response(op, Reason.OK)
        if op not in isp.STAGE2_OPS:
            return self._error(op, Reason.INVALID_COMMAND)
        if reason != Reason.OK:
            return self._error(op, reason)
        if op == Op.UARTHS_BAUDRATE_SET:
            if len(req.data) != 4:
                return self._error(op, Reason.BAD_DATA_LEN)
            self.baud = struct.unpack("<I", req.data)[0]
            return b""                        # kflash reads no reply here
        if op == Op.FLASH_INIT:
            self.flash_ready = True
            return isp.response(op, Reason.OK)
        if not self.flash_ready:
            return self._error(op, Reason.INVALID_COMMAND)
        if op == Op.FLASH_WRITE:
            n = len(req.data)
            if n > isp.FLASH_CHUNK:
                return self._error(op, Reason.BAD_DATA_LEN)
            if req.address + n > self.flash_size:
                return self._error(op, Reason.BAD_WRITE)
            self.flash[req.address:req.address + n] = req.data
            if self.write_time_s:
                time.sleep(self.write_time_s * n / isp.FLASH_CHUNK)
            self.stats.write_bytes += n
            self.stats.write_t1 = time.monotonic()
            return isp.response(op, Reason.OK)
        if op in (Op.FLASH_ERASE, Op.FLASH_ERASE_NONBLOCKING):
            start, length = req.address, req.data_len
            if (start, length) == (0, 0):
                start, length = 0, self.flash_size
            if start + length > self.flash_size:
                return self._error(op, Reason.BAD_ERASE)
            self.flash[start:start + length] = b"\xff" * length
            if op == Op.FLASH_ERASE_NONBLOCKING:
                self._busy = self.erase_busy_polls
            return isp.response(op, Reason.OK)
        return self._error(op, Reason.INVALID_COMMAND)


def pty_baud(master_fd):
    """The baud rate the host program set on the slave side of a pty, read from its master
    (TCGETS2: c_ospeed, exact also for non-standard rates; docs/flash-protocol.md#emulated-board-on-a-pty), or None."""
    buf = array.array("i", [0] * 64)
    try:
        fcntl.ioctl(master_fd, TCGETS2, buf)
        return buf[10] or None
    except OSError:
        return None


def new_flash_file(path, size=FLASH_SIZE_16M):
    """Create (or reset) a flash file full of 0xFF (erased NOR flash)."""
    with open(path, "wb") as f:
        block = b"\xff" * (1 << 20)
        left = size
        while left > 0:
            f.write(block[:min(left, len(block))])
            left -= len(block)
    return path


class LineFaults:
    """Seeded host->board line faults (FaultConfig): `apply(data)` returns the bytes the board
    receives and the extra line delay; counts go to `stats.faults` (any object with that dict).
    Shared by the ISP board and the MaixPy REPL board (tl2k210.maixpy.repl_board)."""

    def __init__(self, cfg: FaultConfig, stats):
        self.cfg = cfg
        self.stats = stats
        self.rng = random.Random(cfg.seed)
        self.seen = 0
        self.next_at = self._gap() if cfg.rate > 0 else None

    def _gap(self):
        u = self.rng.random()
        return self.seen + 1 + int(math.log(1.0 - u) / math.log(1.0 - self.cfg.rate))

    def apply(self, data):
        """Returns (data, delay_s)."""
        if self.next_at is None:
            self.seen += len(data)
            return data, 0.0
        out = bytearray()
        delay = 0.0
        start = self.seen
        pos = 0
        while self.next_at <= start + len(data):
            i = self.next_at - 1 - start
            out += data[pos:i]
            kind = self.rng.choice(self.cfg.kinds)
            self.stats.faults[kind] = self.stats.faults.get(kind, 0) + 1
            if kind == "corrupt":
                out.append(data[i] ^ self.rng.randrange(1, 256))
            elif kind == "delay":
                out.append(data[i])
                delay += self.rng.uniform(*self.cfg.delay_s)
            # "drop": nothing
            pos = i + 1
            self.seen = start + pos
            self.next_at = self._gap()
        out += data[pos:]
        self.seen = start + len(data)
        return bytes(out), delay


class LoopbackPort:
    """An in-process byte pipe to a :class:`K210Core`: a pyserial-like port with no pty and no
    thread (time-based events run when the port is read). Shows that the flasher only needs a
    byte stream; DTR/RTS go straight to the emulated pins."""

    def __init__(self, core: K210Core, baudrate=isp.ROM_BAUD, timeout=0.02):
        self.core = core
        self.baudrate = baudrate
        self.timeout = timeout
        self._rx = bytearray()
        self._lines = {"dtr": False, "rts": False}
        self.is_open = True

    def _pump(self, out=b""):
        self._rx += self.core.tick(time.monotonic()) + out

    def write(self, data):
        if abs(self.baudrate - self.core.baud) <= BAUD_TOLERANCE * self.core.baud:
            self._pump(self.core.feed(bytes(data), time.monotonic()))
        return len(data)

    @property
    def in_waiting(self):
        self._pump()
        return len(self._rx)

    def read(self, n=1):
        end = time.monotonic() + (self.timeout or 0)
        while True:
            self._pump()
            if self._rx or time.monotonic() >= end:
                break
            time.sleep(0.001)
        out = bytes(self._rx[:n])
        del self._rx[:n]
        return out

    def reset_input_buffer(self):
        self._pump()
        self._rx.clear()

    def flush(self):
        pass

    def close(self):
        self.is_open = False

    def __setattr__(self, name, value):
        if name in ("dtr", "rts"):
            self._lines[name] = bool(value)
            self._pump(self.core.set_line(name, bool(value), time.monotonic()) or b"")
        else:
            object.__setattr__(self, name, value)


class EmulatedBoard:
    """A K210 board behind a pty. Use as a context manager::

        with EmulatedBoard(flash_path, wiring="dan", throttle=False) as board:
            run_flasher(port=board.port, lines=board.set_line)
        board.flash_bytes(0x300000, n), board.core.boot_ok

    ``board.port`` is the pty path; ``board.lines_socket`` + ``transport.shim_env`` route an
    unmodified subprocess's DTR/RTS here.
    """

    def __init__(self, flash_path=None, wiring="dan", throttle=False, faults: FaultConfig = None,
                 flash_size=FLASH_SIZE_16M, known_stubs=None, write_time_s=0.0, reset_flash=None,
                 check_baud=True):
        wiring_lines(wiring)                # an unknown wiring is refused before any file exists
        self._tmpdir = tempfile.mkdtemp(prefix="tl2k210-board-")
        self.flash_path = flash_path or os.path.join(self._tmpdir, "flash.bin")
        if reset_flash or not os.path.exists(self.flash_path) or \
                os.path.getsize(self.flash_path) != flash_size:
            new_flash_file(self.flash_path, flash_size)
        self._flash_fh = open(self.flash_path, "r+b")
        self.flash = mmap.mmap(self._flash_fh.fileno(), flash_size)
        self.stats = BoardStats()
        self.core = K210Core(self.flash, wiring, known_stubs, self.stats, write_time_s)
        self.throttle = throttle
        self.check_baud = check_baud        # off when a relay (e.g. socket://) owns the pty
        self.faults = LineFaults(faults or FaultConfig(), self.stats)
        self.stop_after = (faults.stop_after_bytes if faults else None)
        self._stub_rx = 0
        self.output_log = bytearray()       # everything the board sent (banner, replies)
        self._lock = threading.RLock()
        self._events = []
        self._running = False
        self.master, slave = os.openpty()
        tty.setraw(self.master)
        tty.setraw(slave)
        self.port = os.ttyname(slave)
        os.close(slave)                     # so that the host closing the port is visible (HUP)
        self._port_open = False
        self._sockdir = None
        self.lines_socket = os.path.join(self._tmpdir, "lines.sock")
        if len(os.fsencode(self.lines_socket)) > 100:   # sun_path holds 108 bytes (long TMPDIR)
            self._sockdir = tempfile.mkdtemp(prefix="tl2k210-", dir="/tmp")
            self.lines_socket = os.path.join(self._sockdir, "lines.sock")
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.bind(self.lines_socket)
        self._rx_line_free = 0.0
        self._rx_streaming = False
        self._read_baud = None              # the host's rate at the previous read
        self._thread = None

    # ---- public API --------------------------------------------------------------------
    def start(self):
        self._running = True
        self._thread = threading.Thread(target=self._loop, name="emulated-k210", daemon=True)
        self._thread.start()
        return self

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.close()

    def set_line(self, line, asserted):
        """DTR/RTS sink: ``set_line("dtr", True)`` asserts DTR (pin low)."""
        with self._lock:
            self._emit(self.core.set_line(line, asserted, time.monotonic()))

    def flash_bytes(self, address, length):
        with self._lock:
            return bytes(self.flash[address:address + length])

    @property
    def state(self):
        return self.core.state

    def close(self):
        self._running = False
        if self._thread:
            self._thread.join(timeout=5)
        try:
            self.flash.flush()
        finally:
            for closer in (self.flash.close, self._flash_fh.close, self._sock.close,
                           lambda: os.close(self.master)):
                try:
                    closer()
                except (OSError, ValueError):
                    pass
            for remove, path in ((os.unlink, self.lines_socket), (os.rmdir, self._sockdir),
                                 (os.unlink, self.flash_path if self.flash_path.startswith(
                                     self._tmpdir) else None), (os.rmdir, self._tmpdir)):
                try:
                    if path:
                        remove(path)
                except OSError:
                    pass

    # ---- internals ---------------------------------------------------------------------
    def _host_baud(self):
        return pty_baud(self.master)

    def _emit(self, data):
        if not data:
            return
        self._rx_streaming = False          # the host now has to react: its turnaround counts
        self.output_log += data
        if self.throttle:
            time.sleep(len(data) * 10.0 / max(self.core.baud, 1))
        try:
            os.write(self.master, data)
        except OSError:
            pass

    def _loop(self):
        poller = select.poll()
        poller.register(self.master, select.POLLIN)
        poller.register(self._sock, select.POLLIN)
        while self._running:
            events = dict(poller.poll(5))
            now = time.monotonic()
            with self._lock:
                if self._sock.fileno() in events:
                    self._read_lines(now)
                ev = events.get(self.master, 0)
                if ev & select.POLLHUP:
                    self._port_open = False
                    time.sleep(0.002)           # nobody has the port open
                elif not self._port_open:
                    self._port_open = True
                    if self.core.wiring == "isp_on_open":
                        self.core.power_on_reset_into_isp()
                if ev & select.POLLIN and not ev & select.POLLHUP:
                    self._read_host(now)
                self._emit(self.core.tick(time.monotonic()))

    def _read_lines(self, now):
        while True:
            try:
                msg = self._sock.recv(64, socket.MSG_DONTWAIT)
            except (BlockingIOError, OSError):
                return
            try:
                line, value = msg.decode().split()
                self._emit(self.core.set_line(line, value == "1", now))
            except ValueError:
                pass

    def _read_host(self, now):
        try:
            data = os.read(self.master, 65536)
        except OSError:
            return
        if not data:
            return
        self.stats.rx_bytes += len(data)
        host_baud = self._host_baud() if self.check_baud else None
        # the rate is read now, not when the bytes left: where the host changed it since the last
        # read (kflash: the baud-change command, 50 ms, then the new rate), a read this thread got
        # to late may hold bytes sent at the old one
        rates = {host_baud, self._read_baud} if host_baud != self._read_baud else {host_baud}
        self._read_baud = host_baud
        if host_baud and not any(r and abs(r - self.core.baud) <= BAUD_TOLERANCE * self.core.baud for r in rates):
            self.stats.lost_bytes_baud_mismatch += len(data)   # garbled at the wrong rate
            return
        data, delay = self.faults.apply(data)
        # When did this chunk start on the wire? Mid-frame, the host's adapter had it queued
        # (its TX buffer keeps the line busy across write calls), so it follows the previous
        # chunk back to back; this thread's own wake-up latency (< RX_SLACK_S) is not line
        # idle time. After the board has answered, the host's turnaround counts in full.
        if self._rx_streaming and now - self._rx_line_free < RX_SLACK_S:
            start = self._rx_line_free
        else:
            start = max(self._rx_line_free, now)
        self._rx_streaming = True
        if self.core.state == K210Core.STUB and self.core.flash_ready and \
                self.stats.write_t0 is None:
            self.stats.write_t0 = start
        if self.throttle or delay:
            wire = len(data) * 10.0 / max(self.core.baud, 1) if self.throttle else 0.0
            self._rx_line_free = start + wire + delay
            pause = self._rx_line_free - time.monotonic()
            if pause > 0:
                self._lock.release()
                try:
                    time.sleep(pause)
                finally:
                    self._lock.acquire()
        if self.core.state == K210Core.STUB and self.stop_after is not None:
            self._stub_rx += len(data)
            if self._stub_rx > self.stop_after:
                self.core.state = K210Core.DEAD          # stops answering, keeps draining
                return
        self._emit(self.core.feed(data, time.monotonic()))

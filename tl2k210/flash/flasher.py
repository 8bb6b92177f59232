"""The flasher: ROM greeting (with board auto-detection), stub upload, stub boot, baud change,
chunked flash writes with bounded retries, verification and reboot.

Robustness rules (each one fixes a failure seen in kflash 1.1.6, docs/flash-protocol.md#known-failures-of-kflash):
- a rejected or unanswered frame is resent *unchanged, at the same address*;
- before a resend the link is resynchronised: wait for the line to go quiet, flush, send a NOP
  and discard everything up to the NOP's own reply, so a late reply to an earlier frame can
  never be taken as the acknowledgement of a later one;
- every wait is bounded; a board that stops answering raises BoardTimeoutError;
- each failed frame halves the frame size (64 KiB -> 4 KiB) so retries can succeed on a noisy
  line; 8 clean frames in a row double it again; the total number of failures is bounded;
- success is reported only after every byte was acknowledged in sync and the acknowledged
  ledger reproduces each image's SHA-256.
"""
import hashlib
import time
from dataclasses import dataclass, field

from tl2k210.flash import isp, slip
from tl2k210.flash.boards import (AUTODETECT_ORDER, GREETING_TIMEOUT_S, MAX_BAUD, MIN_BAUD, STEP_S,
                                  get_board)
from tl2k210.flash.errors import (BoardTimeoutError, FlashError, GreetingError, StubError,
                                  TransferError)
from tl2k210.flash.isp import Op, Reason
from tl2k210.flash.stub import load_stub
from tl2k210.progress import Progress  # noqa: F401  (re-exported)

DEFAULT_BAUD = 1_500_000
MIN_CHUNK = isp.FLASH_SECTOR
ROM_OK = (Reason.OK, Reason.DEFAULT)    # the ROM's success codes (kflash accepts both)
STUB_OK = (Reason.OK,)
NO_REPLY = "no reply"
UNEXPECTED = "unexpected reply"


@dataclass
class Timeouts:
    greeting_s: float = GREETING_TIMEOUT_S   # ROM greeting, per attempt
    reply_s: float = 1.0                     # added to the wire time of a frame
    write_s: float = 3.0                     # extra for FLASH_WRITE (erase + program time)
    nop_s: float = 0.5                       # resync NOP reply
    max_busy_s: float = 30.0                 # FLASH_BUSY tolerated for this long per frame


@dataclass
class FlashReport:
    board: str = ""
    baud: int = 0
    images: list = field(default_factory=list)   # dicts: address, size, sha256, name
    seconds: float = 0.0
    data_seconds: float = 0.0
    data_bytes: int = 0
    retries: int = 0
    verified: bool = False
    rebooted: bool = False
    warnings: list = field(default_factory=list)

    @property
    def efficiency(self):
        """Payload bytes / line capacity during the data phase."""
        if not self.data_seconds or not self.baud:
            return 0.0
        return self.data_bytes / (self.baud / 10.0 * self.data_seconds)


def wire_seconds(nbytes, baud):
    return nbytes * 10.0 / baud


class Flasher:
    """Drives one board over one open port (any pyserial-like object)."""

    def __init__(self, port, board=None, baud=DEFAULT_BAUD, stub=None, log=None,
                 progress=None, timeouts=None, chunk=isp.FLASH_CHUNK, max_attempts=8,
                 max_failures=200):
        self.port = port
        self.board = get_board(board) if isinstance(board, str) else board
        self.baud = int(baud)
        if not MIN_BAUD <= self.baud <= MAX_BAUD:
            raise FlashError(f"baud {baud} is out of range: use {MIN_BAUD}..{MAX_BAUD} "
                             "(see tl2k210.flash.boards)")
        self.stub = stub
        self.log = log or (lambda msg: None)
        self.progress = progress or Progress(False)
        self.t = timeouts or Timeouts()
        self.chunk = chunk
        self.max_attempts = max_attempts
        self.max_failures = max_failures
        self.decoder = slip.Decoder()
        self.frames = []
        self.failures = 0
        self._chunk_fails = 0
        self.lines_ok = True
        self.host_baud = isp.ROM_BAUD
        self.board_used = None
        self.report = FlashReport(baud=self.baud)
        try:
            self.port.timeout = 0.02
        except Exception:
            pass

    # ---- link ---------------------------------------------------------------------------
    def _send(self, payload):
        frame = slip.encode(payload)
        try:
            self.port.write(frame)
        except Exception as exc:        # pyserial write timeout, disconnected device
            raise BoardTimeoutError(f"writing to the port failed ({exc}); the board or the USB "
                                    "adapter stopped accepting data: replug it and retry") from None

    def _read_frame(self, deadline):
        while True:
            if self.frames:
                return self.frames.pop(0)
            if time.monotonic() >= deadline:
                return None
            try:
                n = self.port.in_waiting
                data = self.port.read(n if n else 1)
            except Exception as exc:
                raise BoardTimeoutError(f"reading from the port failed ({exc}); was the board "
                                        "unplugged? Replug it and retry") from None
            if data:
                self.frames.extend(self.decoder.feed(data))

    def _await(self, op, timeout, skip_others=False):
        """Wait for ``[op, reason]``. Returns the reason, NO_REPLY or UNEXPECTED."""
        deadline = time.monotonic() + timeout
        while True:
            fr = self._read_frame(deadline)
            if fr is None:
                return NO_REPLY
            payload, ok = fr
            rop, reason, text = isp.parse_response(payload)
            if rop == Op.DEBUG_INFO and reason is not None:
                self.log(f"board: {text}")
                continue
            if ok and rop == op and reason is not None and len(payload) == 2:
                return reason
            if not skip_others:
                return UNEXPECTED

    def _flush_input(self):
        try:
            self.port.reset_input_buffer()
        except Exception:
            pass
        self.decoder.reset()
        self.frames.clear()

    def _drain_quiet(self, quiet=0.03, limit=1.0):
        """Read until the line has been quiet for ``quiet`` seconds (at most ``limit``)."""
        end = time.monotonic() + limit
        last = time.monotonic()
        while time.monotonic() < end and time.monotonic() - last < quiet:
            try:
                if self.port.read(max(1, self.port.in_waiting)):
                    last = time.monotonic()
            except Exception:
                break
        self._flush_input()

    def _set_lines(self, step):
        for line, value in step:
            try:
                setattr(self.port, line, value)
            except Exception:
                if self.lines_ok:
                    self.log("the port has no DTR/RTS control lines (a pty or socket?): not "
                             "resetting the board; it must already be in ISP mode")
                self.lines_ok = False
                return False
        return True

    def _run_sequence(self, seq):
        for step in seq:
            if not self._set_lines(step):
                return False
            time.sleep(STEP_S)
        return True

    def _set_host_baud(self, baud):
        try:
            self.port.flush()
        except Exception:
            pass
        self.port.baudrate = baud
        self.host_baud = baud

    def _reply_timeout(self, nbytes, extra=0.0):
        return wire_seconds(nbytes * 2 + 64, self.host_baud) + self.t.reply_s + extra

    def _try(self, payload, op, ok_codes, extra=0.0):
        """One attempt: send, wait (riding out FLASH_BUSY). Returns (ok, description)."""
        busy_until = time.monotonic() + self.t.max_busy_s
        while True:
            self._send(payload)
            r = self._await(op, self._reply_timeout(len(payload), extra))
            if r in ok_codes:
                return True, ""
            if r == Reason.FLASH_BUSY and time.monotonic() < busy_until:
                time.sleep(0.05)
                continue
            return False, r if isinstance(r, str) else isp.reason_name(r)

    def _resync(self, nop_op, what):
        tries = 4
        for _ in range(tries):
            self._drain_quiet()
            self._send(isp.nop_request(nop_op))
            r = self._await(nop_op, self.t.nop_s + wire_seconds(64, self.host_baud),
                            skip_others=True)
            if r in (Reason.OK, Reason.DEFAULT):
                self.frames.clear()
                return
        raise BoardTimeoutError(
            f"the board stopped answering during {what} (no reply to {tries} NOP probes); "
            "check power and cable, replug the board and retry, or use a lower --baud")

    def _transact(self, payload, op, nop_op, what, ok_codes=STUB_OK, extra=0.0):
        attempts = 0
        while True:
            ok, desc = self._try(payload, op, ok_codes, extra)
            if ok:
                return attempts
            attempts += 1
            self._note_failure(what, desc, attempts)
            self._resync(nop_op, what)

    def _note_failure(self, what, desc, attempts):
        self.failures += 1
        self.report.retries += 1
        self.log(f"{what}: {desc}; resending (attempt {attempts + 1})")
        if attempts >= self.max_attempts or self.failures > self.max_failures:
            raise TransferError(
                f"{what}: the board rejected or lost the frame {attempts} times (last: {desc}); "
                "the serial line is too noisy: use a lower --baud or a shorter USB cable")

    # ---- stage 1 ------------------------------------------------------------------------
    def _greet_rom(self):
        self._flush_input()
        self._send(isp.nop_request(Op.NOP))
        return self._await(Op.NOP, self.t.greeting_s, skip_others=True) in ROM_OK

    def connect(self):
        """Reset into the ROM ISP and greet it; auto-detects the board when none was given."""
        self._set_host_baud(isp.ROM_BAUD)
        if self.board is not None:
            candidates, rounds = [self.board], 5
        else:
            seen = []
            for name in AUTODETECT_ORDER:
                if name not in seen:
                    seen.append(name)
            candidates, rounds = [get_board(n) for n in seen], 3
        for _ in range(rounds):
            for b in candidates:
                if self.lines_ok and b.isp_sequence:
                    self._run_sequence(b.isp_sequence)
                if self._greet_rom():
                    self.board_used = b
                    self.report.board = b.name if self.lines_ok else "(no reset lines)"
                    self.log(f"ROM ISP answered (board {self.report.board})")
                    return b
                if not self.lines_ok:
                    break
        tried = ", ".join(b.name for b in candidates)
        hint = ("" if self.board else " auto-detection tried " + tried + ";")
        raise GreetingError(
            f"greeting failed: no K210 ROM ISP answered on this port (presets tried: {tried})."
            f"{hint} check --port, pass the right --board (e.g. -B goE for Maixduino/M5StickV, "
            "-B bit_mic for Maix Bit 2.0), or hold BOOT while pressing RESET; close other "
            "programs using the port")

    def upload_stub(self):
        data = load_stub(self.stub) if not isinstance(self.stub, (bytes, bytearray)) \
            else bytes(self.stub)
        self.progress.start("stage-2 program", len(data))
        for off in range(0, len(data), isp.ROM_CHUNK):
            chunk = data[off:off + isp.ROM_CHUNK]
            req = isp.request(Op.MEMORY_WRITE, isp.STUB_ADDRESS + off, chunk)
            self._transact(req, Op.MEMORY_WRITE, Op.NOP, "uploading the stage-2 program",
                           ok_codes=ROM_OK)
            self.progress.update(off + len(chunk))
        return data

    def _greet_stub(self, tries, timeout=0.3):
        for _ in range(tries):
            self._flush_input()
            self._send(isp.nop_request(Op.FLASH_NOP))
            if self._await(Op.FLASH_NOP, timeout + wire_seconds(64, self.host_baud),
                           skip_others=True) == Reason.OK:
                return True
            time.sleep(0.05)
        return False

    def boot_stub(self):
        for _ in range(3):
            self._send(isp.request(Op.MEMORY_BOOT, isp.STUB_ADDRESS))
            r = self._await(Op.MEMORY_BOOT, 0.03 + wire_seconds(64, self.host_baud))
            if r != NO_REPLY:               # a damaged boot frame gets an error: resend it
                self.log(f"boot request answered with {r}; resending")
                self._resync(Op.NOP, "booting the stage-2 program")
                continue
            if self._greet_stub(tries=10):
                return
            if self._greet_rom():           # still in the ROM: the boot frame was lost
                continue
            break
        raise StubError("the stage-2 flash program did not start after upload; replug the board "
                        "and retry (or pass a different --stub FILE)")

    # ---- stage 2 ------------------------------------------------------------------------
    def change_baud(self, baud):
        if baud == self.host_baud:
            return
        for _ in range(3):
            self._send(isp.u32_request(Op.UARTHS_BAUDRATE_SET, baud))
            self._set_host_baud(self.host_baud)        # drain TX at the old rate
            time.sleep(0.05)
            self._set_host_baud(baud)
            if self._greet_stub(tries=5):
                self.log(f"switched to {baud} baud")
                return
            self._set_host_baud(isp.ROM_BAUD)          # the request may have been lost
            if not self._greet_stub(tries=3):
                break
        raise FlashError(f"the board does not answer at {baud} baud; the USB-serial bridge may "
                         "not support it: retry with a lower --baud (e.g. 1000000 or 115200)")

    def init_flash(self, chip=1):
        self._transact(isp.request(Op.FLASH_INIT, chip), Op.FLASH_INIT, Op.FLASH_NOP,
                       "initialising the SPI flash")

    def write(self, address, data, label="image"):
        """Write ``data`` at ``address`` in frames aligned to the frame size; returns the
        ledger of acknowledged (address, bytes)."""
        ledger = []
        size = self.chunk
        clean = 0
        pos = 0
        self.progress.start(label[:18], len(data))
        while pos < len(data):
            addr = address + pos
            n = min(size - addr % size, len(data) - pos)
            chunk = bytes(data[pos:pos + n])
            req = isp.request(Op.FLASH_WRITE, addr, chunk)
            what = f"writing 0x{addr:06x}..0x{addr + n:06x}"
            ok, desc = self._try(req, Op.FLASH_WRITE, STUB_OK, self.t.write_s)
            if not ok:
                clean = 0
                self._chunk_fails += 1
                fails = self._chunk_fails
                self._note_failure(what, desc, fails)
                self._resync(Op.FLASH_NOP, what)
                if size > MIN_CHUNK:          # a smaller frame is a fresh attempt at this address
                    size //= 2
                    self._chunk_fails = 0
                    self.log(f"noisy line: frame size now {size} bytes")
                continue                      # same data (or its first part), same address
            self._chunk_fails = 0
            ledger.append((addr, chunk))
            pos += n
            clean += 1
            if clean >= 8 and size < self.chunk:
                size *= 2
                clean = 0
            self.progress.update(pos)
        return ledger

    def reboot(self):
        ok, _ = self._try(isp.nop_request(Op.REBOOT), Op.REBOOT, STUB_OK)
        if not ok and self.lines_ok and self.board_used is not None:
            ok = self._run_sequence(self.board_used.boot_sequence) and \
                bool(self.board_used.boot_sequence)
        return ok

    # ---- all of it ----------------------------------------------------------------------
    def run(self, images, verify=True, reboot=True):
        t0 = time.monotonic()
        for img in images:
            if img.end > (self.board or get_board("dan")).flash_size:
                raise FlashError(f"{img.name}: ends at 0x{img.end:x}, beyond the flash")
        self.connect()
        self.upload_stub()
        self.boot_stub()
        self.change_baud(self.baud)
        self.init_flash()
        data_bytes, data_t0 = 0, time.monotonic()
        for img in images:
            blob = img.flash_bytes()
            ledger = self.write(img.address, blob, img.name or f"0x{img.address:x}")
            data_bytes += len(blob)
            digest = hashlib.sha256(blob).hexdigest()
            if verify:
                self._verify(img, blob, ledger)
            self.report.images.append({"address": img.address, "size": len(blob),
                                       "sha256": digest, "name": img.name,
                                       "envelope": img.envelope})
        self.report.data_seconds = time.monotonic() - data_t0
        self.report.data_bytes = data_bytes
        if verify:
            self._final_sync()
        self.report.verified = bool(verify)
        if reboot:
            self.report.rebooted = self.reboot()
            if not self.report.rebooted:
                self.report.warnings.append("the board did not confirm the reboot; press RESET")
        self.report.seconds = time.monotonic() - t0
        return self.report

    def _final_sync(self):
        """Every frame has been answered exactly once: the next reply must be our NOP's."""
        self._send(isp.nop_request(Op.FLASH_NOP))
        r = self._await(Op.FLASH_NOP, self.t.nop_s + wire_seconds(64, self.host_baud))
        if r != Reason.OK:
            self.log(f"final sync got {r}; resynchronising")
            self._resync(Op.FLASH_NOP, "final verification")

    def _verify(self, img, blob, ledger):
        h = hashlib.sha256()
        expect = img.address
        for addr, chunk in ledger:
            if addr != expect:
                raise FlashError(f"verification failed for {img.name}: acknowledged frames are "
                                 f"not contiguous at 0x{addr:x}; nothing was reported as written")
            h.update(chunk)
            expect += len(chunk)
        if expect != img.address + len(blob) or h.digest() != hashlib.sha256(blob).digest():
            raise FlashError(f"verification failed for {img.name}: the acknowledged data does not "
                             "match the image; flash again")
        if img.envelope:
            from tl2k210.flash import image as fw_image
            fw_image.unwrap(blob)


def flash_images(images, port=None, url=None, board=None, baud=DEFAULT_BAUD, stub=None,
                 verify=True, reboot=True, progress=None, log=None, timeouts=None):
    """Flash ``images`` (FlashImage list) through an open ``port`` or the port ``url``."""
    from tl2k210.flash.transport import open_port

    own = port is None
    if own:
        port = open_port(url, isp.ROM_BAUD, write_timeout=30.0)
    try:
        f = Flasher(port, board=board, baud=baud, stub=stub, log=log, progress=progress,
                    timeouts=timeouts)
        return f.run(images, verify=verify, reboot=reboot)
    finally:
        if own:
            try:
                port.close()
            except Exception:
                pass


__all__ = ["Flasher", "FlashReport", "Progress", "Timeouts", "flash_images",
           "DEFAULT_BAUD"]

"""Opening ports with errors a user can act on, and the DTR/RTS line shim for emulated boards.

Any pyserial URL works (``/dev/ttyUSB0``, ``COM3``, a pty path, ``socket://host:port``,
``loop://``). A pty has no modem-control lines: setting DTR/RTS raises ``OSError(ENOTTY)``; the
flasher then carries on without a reset sequence. :class:`LineShim` forwards the two setters of a
port to an emulated board instead (for tests), and ``shim/sitecustomize.py`` does the same for
unmodified subprocesses such as the kflash CLI.
"""
import errno
import os
import sys

from tl2k210 import paths
from tl2k210.errors import Tl2k210Error
from tl2k210.flash.errors import PortError

LINES_ENV = "TL2K210_LINES_SOCKET"   # unix datagram socket of an emulated board
SHIM_DIR = str(paths.PACKAGE / "flash" / "shim")


def open_port(url: str, baudrate: int, timeout: float = 0.05, write_timeout: float = None):
    """Open ``url`` with an exclusive lock where the OS supports it (POSIX), so that a second
    program on the same port is reported as "busy" instead of garbling the transfer."""
    import serial

    kw = dict(baudrate=baudrate, timeout=timeout, write_timeout=write_timeout)
    if os.name == "posix":
        kw["exclusive"] = True
    try:
        return serial.serial_for_url(url, **kw)
    except (serial.SerialException, OSError, ValueError) as exc:
        raise port_error(url, exc) from None


def port_error(url, exc) -> PortError:
    code = getattr(exc, "errno", None)
    text = str(exc)
    if code == errno.ENOENT or "No such file" in text or "FileNotFoundError" in text:
        return PortError(f"serial port {url} does not exist; is the board plugged in? List ports "
                         "with `python -m serial.tools.list_ports` and pass --port")
    if code == errno.EACCES or "Permission denied" in text:
        return PortError(f"permission denied opening {url}; add yourself to the serial group "
                         "(`sudo usermod -aG dialout $USER`, then log in again) or run with access "
                         "to the device")
    if code in (errno.EBUSY, errno.EAGAIN) or "busy" in text.lower() or "lock" in text.lower():
        return PortError(f"serial port {url} is busy: close MaixPy IDE, a serial terminal or "
                         "another flasher that has it open, then retry")
    return PortError(f"cannot open serial port {url}: {text}")


class LineShim:
    """Wrap a serial port so that DTR/RTS changes go to ``sink(line, asserted)`` (an emulated
    board) instead of the device, which a pty does not support. Everything else is delegated."""

    def __init__(self, port, sink):
        object.__setattr__(self, "_port", port)
        object.__setattr__(self, "_sink", sink)
        object.__setattr__(self, "_lines", {"dtr": True, "rts": True})

    def __getattr__(self, name):
        return getattr(self._port, name)

    def __setattr__(self, name, value):
        if name in ("dtr", "rts"):
            self._lines[name] = bool(value)
            self._sink(name, bool(value))
        else:
            setattr(self._port, name, value)

    @property
    def dtr(self):
        return self._lines["dtr"]

    @property
    def rts(self):
        return self._lines["rts"]

    def setDTR(self, value=True):  # pyserial 2.x names, used by kflash
        self.dtr = value

    def setRTS(self, value=True):
        self.rts = value


def shim_env(socket_path: str, base_env=None) -> dict:
    """Environment for a subprocess whose pyserial DTR/RTS changes must reach the emulated board
    listening on ``socket_path``."""
    env = dict(os.environ if base_env is None else base_env)
    env[LINES_ENV] = socket_path
    env["PYTHONPATH"] = SHIM_DIR + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


# USB vendor ids of the boards' serial bridges: WCH (CH340/CH552), FTDI, Prolific, Silicon Labs, Sipeed
KFLASH_USB_VIDS = ("1A86", "0403", "067B", "10C4", "C251")


def auto_port(board):
    """The serial port of the one K210-like USB bridge plugged in (the second port of an FT2232
    board: its K210 UART), or an error saying what to plug in or pass."""
    try:
        from serial.tools import list_ports
    except ImportError:  # pragma: no cover
        raise Tl2k210Error("pyserial is not installed; pip install pyserial") from None
    ports = sorted(p for p in list_ports.comports()
                   if any(v in (p.hwid or "").upper() for v in KFLASH_USB_VIDS))
    if not ports:
        raise Tl2k210Error("no K210-like USB serial port found (CH340/CH552/FTDI/CP210x); plug "
                           "the board in or pass --port")
    if board in ("goE", "maixduino") and len(ports) > 1:
        return ports[1].device      # open-ec: the K210 UART is the second port
    if len(ports) > 1:
        names = ", ".join(p.device for p in ports)
        print(f"tl2k210: several serial ports ({names}); using {ports[0].device}; pass --port "
              "to choose", file=sys.stderr)
    return ports[0].device

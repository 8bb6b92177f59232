"""Shared helpers for the MaixPy REPL tests: an emulated REPL board and a raw byte client."""
import os
import time

import serial

from tl2k210.maixpy.repl_board import ReplBoard

RAW = b"raw REPL; CTRL-B to exit\r\n"


def board(tmp_path, sd=True, **kw):
    """A started ReplBoard with host folders tmp_path/fs (/flash) and tmp_path/sd (/sd)."""
    fs = tmp_path / "fs"
    fs.mkdir(exist_ok=True)
    sdir = None
    if sd:
        sdir = tmp_path / "sd"
        sdir.mkdir(exist_ok=True)
    b = ReplBoard(fs=str(fs), sd=str(sdir) if sdir else None, **kw).start()
    b.fs, b.sd = fs, sdir
    return b


class Wire:
    """A plain serial client: write bytes, read until a marker (for protocol-level tests)."""

    def __init__(self, port, baud=115200):
        self.s = serial.Serial(port, baud, timeout=0.05)
        self.buf = b""

    def send(self, data):
        self.s.write(data)

    def until(self, marker, timeout=10.0):
        end = time.monotonic() + timeout
        while marker not in self.buf:
            if time.monotonic() > end:
                raise AssertionError(f"no {marker!r} in {self.buf[-300:]!r}")
            self.buf += self.s.read(4096)
        i = self.buf.index(marker) + len(marker)
        out, self.buf = self.buf[:i], self.buf[i:]
        return out

    def read(self, n, timeout=5.0):
        end = time.monotonic() + timeout
        while len(self.buf) < n and time.monotonic() < end:
            self.buf += self.s.read(4096)
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def quiet(self, t=0.3):
        end = time.monotonic() + t
        while time.monotonic() < end:
            self.buf += self.s.read(4096)
        out, self.buf = self.buf, b""
        return out

    def raw(self):
        self.send(b"\r\x03\x03")
        self.quiet(0.2)
        self.send(b"\r\x01")
        self.until(RAW + b">")

    def close(self):
        self.s.close()


def client_env():
    """Environment for client subprocesses (mpremote, ampy, tl2k210) using this tree."""
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    return env

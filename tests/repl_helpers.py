"""Shared helpers for the MaixPy REPL tests: an emulated REPL board and a raw byte client."""
import os
import time

import pytest
import serial

from tl2k210.maixpy.repl import Repl
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



@pytest.fixture
def b(tmp_path):
    """A started emulated REPL board (closed after the test); import it as a fixture."""
    bd = board(tmp_path)
    assert bd.wait_idle()
    yield bd
    bd.close()


@pytest.fixture
def r(b):
    """Our raw-REPL client on `b`, in raw mode."""
    with Repl.open(b.port) as rr:
        rr.enter_raw()
        yield rr

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


def calib_photos(folder, size=32):
    """Five scikit-image photos at size x size (calibration images / test inputs)."""
    from PIL import Image
    from skimage import data
    folder.mkdir(parents=True, exist_ok=True)
    for i, name in enumerate(["astronaut", "coffee", "chelsea", "rocket", "camera"]):
        Image.fromarray(getattr(data, name)()).convert("RGB").resize((size, size)).save(
            folder / f"{i}.png")
    return folder


def tiny_onnx(path, channels):
    """A 3-conv net (channels -> 8 -> 8 -> 4, 32x32) in ONNX with seeded weights."""
    import numpy as np
    from onnx import helper, save

    from front_helpers import make_model
    rng = np.random.default_rng(channels)
    w1 = (rng.standard_normal((8, channels, 3, 3)) * 0.3).astype(np.float32)
    w2 = (rng.standard_normal((8, 8, 3, 3)) * 0.2).astype(np.float32)
    w3 = (rng.standard_normal((4, 8, 1, 1)) * 0.3).astype(np.float32)
    b = [(rng.standard_normal(8) * 0.1).astype(np.float32) for _ in range(2)]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c2"], ["r2"]),
             helper.make_node("Conv", ["r2", "w3", "b3"], ["y"])]
    m = make_model(nodes, [("x", [1, channels, 32, 32])], [("y", [1, 4, 32, 32])],
                   {"w1": w1, "b1": b[0], "w2": w2, "b2": b[1], "w3": w3,
                    "b3": np.zeros(4, np.float32)})
    save(m, str(path))

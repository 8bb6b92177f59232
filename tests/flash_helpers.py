"""Shared helpers for the flash tests: emulated boards, running tl2k210 and stock kflash."""
import contextlib
import hashlib
import os
import random
import subprocess
import sys

import pytest

from conftest import REPO
from tl2k210 import paths
from tl2k210.flash import image as fw_image
from tl2k210.flash.emulated_board import EmulatedBoard, FaultConfig
from tl2k210.flash.flasher import Flasher
from tl2k210.flash.transport import LineShim, shim_env

PY = sys.executable


def shared_testdata():
    d = paths.testdata_dir()
    if d is None or not d.is_dir():
        pytest.skip(f"test data not found at {d} (set TL2K210_TESTDATA)")
    return d


def have_kflash():
    try:
        import kflash  # noqa: F401
        return True
    except ImportError:
        return False


needs_kflash = pytest.mark.skipif(not have_kflash(), reason="kflash 1.1.6 is not installed "
                                  "(it also provides the stage-2 program)")


def payload(n, seed=0):
    return random.Random(seed).randbytes(n)


def sha(b):
    return hashlib.sha256(b).hexdigest()


@contextlib.contextmanager
def board(tmp_path, name="flash.bin", **kw):
    b = EmulatedBoard(str(tmp_path / name), **kw).start()
    try:
        yield b
    finally:
        b.close()


def open_shimmed(b, baud=115200):
    """A pyserial port on the board's pty whose DTR/RTS reach the emulated board."""
    import serial

    ser = serial.Serial(b.port, baud, timeout=0.02)
    return LineShim(ser, b.set_line)


def flash_ours(b, images, board_name=None, baud=2_000_000, **kw):
    port = open_shimmed(b)
    try:
        return Flasher(port, board=board_name, baud=baud, **kw).run(images)
    finally:
        port.close()


def cli_env(b=None):
    env = shim_env(b.lines_socket) if b is not None else dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [env.get("PYTHONPATH"), str(REPO)] if p)
    return env


def run_tl2k210(args, b=None, timeout=120):
    p = subprocess.run([PY, "-m", "tl2k210.cli", *args], env=cli_env(b), capture_output=True,
                       text=True, timeout=timeout, cwd=str(REPO))
    return p.returncode, p.stdout + p.stderr


def run_kflash_cli(b, args, timeout=60):
    """Stock kflash 1.1.6 as a subprocess; DTR/RTS reach the board through the sitecustomize
    shim. Returns (returncode or None on timeout, output)."""
    try:
        p = subprocess.run([PY, "-m", "kflash", "-p", b.port, "-n", *args], env=cli_env(b),
                           capture_output=True, text=True, timeout=timeout)
        return p.returncode, p.stdout + p.stderr
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else ""
        return None, out


def firmware_at_0(b, payload_bytes):
    """The firmware payload the emulated bootrom would load, or None if it rejects flash 0."""
    try:
        return fw_image.unwrap(b.flash_bytes(0, len(payload_bytes) + 64))
    except fw_image.ImageError:
        return None


__all__ = ["FaultConfig", "board", "payload", "sha", "flash_ours", "run_tl2k210",
           "run_kflash_cli", "shared_testdata", "needs_kflash", "firmware_at_0", "open_shimmed"]

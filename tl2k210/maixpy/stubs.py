"""Minimal host stand-ins for the other MicroPython/MaixPy modules demo scripts import:
`time`/`utime` (with `clock()` and `ticks_ms`), `gc` (`mem_free`), `os`/`uos`, `machine`,
`Maix` (GPIO, FPIOA, freq, utils), `board` (`board_info`), `fpioa_manager` (`fm`).
Pin/FPIOA calls are accepted and do nothing. `Maix.GPIO` input pins read the board's scripted
button (the BOOT key: `run_script(..., button=[frame, ...])` holds it down, value() == 0, while
those camera frames (0-based) are the latest taken); output pins keep what was written."""
from __future__ import annotations

import gc as _gc
import os as _os
import time as _time
import types

from tl2k210.maixpy import board as _board


def _module(name, doc, **attrs):
    m = types.ModuleType(name, doc)
    m.__dict__.update(attrs)
    return m


class _Clock:
    def __init__(self):
        self._t = _time.perf_counter()
        self._dt = 0.0

    def tick(self):
        self._t = _time.perf_counter()

    def fps(self):
        self._dt = _time.perf_counter() - self._t
        return 1.0 / self._dt if self._dt > 0 else 0.0

    def avg(self):
        return 1000 * self._dt


class _Anything:
    """Accepts any attribute/call (GPIO pins, FPIOA functions, board_info pins...)."""

    def __init__(self, name="obj"):
        self._name = name

    def __getattr__(self, item):
        if item.startswith("__"):
            raise AttributeError(item)
        return _Anything(f"{self._name}.{item}")

    def __call__(self, *a, **k):
        return _Anything(f"{self._name}()")

    def __int__(self):
        return 0

    __index__ = __int__

    def __repr__(self):
        return f"<{self._name}>"


class _GPIO:
    """`Maix.GPIO(GPIO.GPIOHS0, GPIO.IN[, GPIO.PULL_UP])` with the scripted button behind it."""
    IN, OUT = 0, 3
    PULL_NONE, PULL_DOWN, PULL_UP = 0, 1, 2
    IRQ_NONE, IRQ_RISING, IRQ_FALLING, IRQ_BOTH = 0, 1, 2, 3
    WAKEUP_NOT_SUPPORT = 0

    def __init__(self, gpio_id, mode=IN, pull=PULL_NONE, value=None):
        self._id, self._mode, self._out = gpio_id, mode, 0 if value is None else int(bool(value))

    def value(self, v=None):
        if v is not None:
            self._out = int(bool(v))
            return None
        if self._mode == self.OUT:
            return self._out
        return 0 if _board.current().button_down() else 1

    def irq(self, *a, **k):
        return None

    def disirq(self):
        return None

    def mode(self, m=None):
        if m is not None:
            self._mode = m
        return self._mode


for _i in range(32):
    setattr(_GPIO, f"GPIOHS{_i}", _i)
for _i in range(8):
    setattr(_GPIO, f"GPIO{_i}", 32 + _i)


def _host(path):
    return str(_board.current().host_path(path))


def make_modules() -> dict:
    t0 = _time.monotonic()
    utime = _module(
        "utime", "MicroPython time on the host",
        time=_time.time, sleep=_time.sleep,
        sleep_ms=lambda ms: _time.sleep(ms / 1000), sleep_us=lambda us: _time.sleep(us / 1e6),
        ticks_ms=lambda: int((_time.monotonic() - t0) * 1000),
        ticks_us=lambda: int((_time.monotonic() - t0) * 1e6),
        ticks_diff=lambda a, b: a - b, ticks_add=lambda a, b: a + b,
        clock=_Clock, localtime=_time.localtime, mktime=_time.mktime)
    gc = _module("gc", "MicroPython gc on the host", collect=_gc.collect, enable=_gc.enable,
                 disable=_gc.disable, mem_free=lambda: 2 * 1024 * 1024,
                 mem_alloc=lambda: 512 * 1024, threshold=lambda *a: -1)
    uos = _module("uos", "MicroPython os on the host (board paths mapped)",
                  listdir=lambda p="/": _os.listdir(_host(p)),
                  remove=lambda p: _os.remove(_host(p)),
                  stat=lambda p: tuple(_os.stat(_host(p))),
                  getcwd=lambda: "/flash", chdir=lambda p: None, sep="/",
                  uname=lambda: ("sipeed_m1", "sipeed_m1", "host", "tl2k210",
                                 "Sipeed_M1 with kendryte-k210 (emulated)"))
    machine = _module("machine", "MaixPy machine on the host", reset=lambda: None,
                      freq=lambda *a: 400000000, UART=_Anything("UART"), I2C=_Anything("I2C"),
                      SPI=_Anything("SPI"), PWM=_Anything("PWM"), Timer=_Anything("Timer"),
                      unique_id=lambda: b"\x00" * 32)
    maix = _module("Maix", "MaixPy Maix on the host", GPIO=_GPIO, FPIOA=_Anything("FPIOA"),
                   I2S=_Anything("I2S"), FFT=_Anything("FFT"), freq=_Anything("freq"),
                   utils=_module("Maix.utils", "", gc_heap_size=lambda *a: 0x80000))
    board = _module("board", "MaixPy board on the host", board_info=_Anything("board_info"))
    fpioa = _module("fpioa_manager", "MaixPy fpioa_manager on the host", fm=_Anything("fm"))
    return {"utime": utime, "time": utime, "gc": gc, "uos": uos, "os": uos, "machine": machine,
            "Maix": maix, "board": board, "fpioa_manager": fpioa}

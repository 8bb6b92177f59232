"""The board's clock: what `time.ticks_ms()`, `time.clock()`, `sensor.snapshot()` see.

By default the clock is VIRTUAL: it starts at power-on (the boot time below) and advances only
by what the board would spend - the camera's frame period (snapshot waits for the next frame end),
the kmodel latency of each forward/run_yolo2 (tl2k210/k210/cost.py), the costs below for the LCD,
drawing and image calls, sleeps, and a per-line cost of the script's own MicroPython code. So a
script prints the fps and `t:%dms` a board would print, however slow the host is.
`--wall-clock` (Clock(wall=True)) gives host time instead (time.sleep really sleeps).

Basis of each cost (estimates, not measured by us on a board; docs/maixpy-firmware.md#timing):
* BOOT_US: _boot.py sleeps 200 x 1 ms waiting for Ctrl-C, after the firmware's init (heap,
  SPIFFS mount, SD probe, LCD/sensor off): ticks_ms() at main.py's first line is ~0.5 s.
* FRAME_US: OV2640/OV7740/GC0328 at XCLK 24 MHz in the SVGA-mode register set, scaled: ~30 fps.
  Single buffer: snapshot() waits for the end of the next frame; dual_buff: it returns at once
  when a finished frame is waiting.
* SWAP_NS_PER_PIXEL: snapshot's RGB565 byte swap, split over both cores: the firmware comment
  gives 1.7 ms for half a QVGA frame per core -> 1.7 ms per QVGA frame = 22 ns/pixel.
* lcd.display: 2 bytes/pixel over the 8-line SPI bus at lcd.init(freq=) (15 MHz default) = one
  byte per clock, plus the byte-swap copy (22 ns/pixel): 320x240 -> 10.2 + 1.7 = 11.9 ms
  (docs/maixpy-firmware.md#timing: 11-15 ms). Border fills cost the same per pixel as the transfer.
* Drawing/image calls: CALL_US for the MicroPython call and OpenMV argument parsing, plus
  PIXEL_NS per pixel written (~4 cycles of the 400 MHz CPU).
* LINE_US: one executed line of the script's own Python code on MicroPython 1.11 at 400 MHz
  (a few bytecodes, ~0.5-3 us); a rough average, known error about x3 - scripts that loop over
  pixels in Python are slow on a board, and this is what makes the host say so.
* KPU_CALL_US: kpu.forward/run_yolo2 bookkeeping around the model (image checks, DMA setup,
  output copy).
* kpu.load copies the model into RAM: from flash ~10 MB/s (bbs.sipeed.com/t/1811: a 4.2 MB
  model loads in 421 ms), from the SD card ~2 MB/s (SPI mode, FAT reads).
* kpu.load_flash streams weights at every run: x2.65 single buffer, x2.1 dual buffer (the same
  thread: 40 ms from RAM, 106 / 83 ms from flash).
"""
from __future__ import annotations

import time

BOOT_US = 520_000            # ticks_ms() at main.py's first line
BOOT_SLEEP_US = 200_000      # of which _boot.py's Ctrl-C window (again at each soft reboot)
FRAME_US = 33_333
SWAP_NS_PER_PIXEL = 22
CALL_US = 8
PIXEL_NS = 10
LINE_US = 1.5
KPU_CALL_US = 150
GC_COLLECT_US_PER_KIB = 2    # gc.collect(): a mark-sweep of the GC heap's blocks, ~1 ms for the
                             # default 512 KiB (an order of magnitude, not measured on a board; a
                             # free collect had made a launcher's fps counter divide by zero)
SNAPSHOT_TIMEOUT_US = 300_000
FLASH_READ_US_PER_BYTE = 0.1
SD_READ_US_PER_BYTE = 0.5
LOAD_FLASH_SLOWDOWN = {False: 2.65, True: 2.1}


def lcd_display_us(pixels: int, freq: int) -> int:
    return int(2 * pixels * 1e6 / max(1, freq) + pixels * SWAP_NS_PER_PIXEL / 1000)


def draw_us(pixels: int) -> int:
    return int(CALL_US + pixels * PIXEL_NS / 1000)


class Clock:
    """Board time in microseconds since power-on. `advance` moves it (virtual mode) and checks
    the watchdog; `frame()` records a camera frame (resets the watchdog)."""

    def __init__(self, wall: bool = False, timeout: float = 60.0):
        self.wall = wall
        self.timeout = timeout
        self._t = BOOT_US - BOOT_SLEEP_US if not wall else 0
        self._host0 = time.perf_counter()
        self._last_frame_board = 0
        self._last_frame_host = self._host0
        self.board = None                 # the Board (for stop())

    def now_us(self) -> int:
        if self.wall:
            return BOOT_US + int((time.perf_counter() - self._host0) * 1e6)
        return int(self._t)

    def advance(self, us: float):
        if us > 0 and not self.wall:
            self._t += us
        self.check()

    def sleep(self, us: float):
        if us <= 0:
            return
        if self.wall:
            end = time.perf_counter() + us / 1e6
            while True:
                self.check()
                left = end - time.perf_counter()
                if left <= 0:
                    break
                time.sleep(min(left, 0.2))
        else:
            end = self._t + us
            s = getattr(self.board, "session", None)
            while s is not None and not s._in_callback:     # timers fire during a sleep
                due = [t[0] for t in s.timers if t[2]._callback is not None]
                if not due or min(due) > end:
                    break
                self._t = max(self._t, min(due))
                s._run_callbacks(self._t)
            if s is not None and s.baton is not None:      # other _threads run meanwhile
                s.baton.run_at(end)
                self.check()
                return
            self.advance(end - self._t)

    def until(self, t_us: float):
        """Wait until board time `t_us` (camera frame ends)."""
        if self.wall:
            self.sleep(t_us - self.now_us())
        elif t_us > self._t:
            self.advance(t_us - self._t)

    def frame(self):
        self._last_frame_board = self.now_us()
        self._last_frame_host = time.perf_counter()

    def check(self):
        if self.timeout is None or self.timeout <= 0 or self.board is None:
            return
        if self.board.stop_reason is not None:
            raise self.board.stop_reason
        s = getattr(self.board, "session", None)
        if s is not None and s._interrupt and not s.in_board_thread():
            s._interrupt = False
            raise KeyboardInterrupt()
        board_idle = (self.now_us() - self._last_frame_board) / 1e6
        host_idle = time.perf_counter() - self._last_frame_host
        if board_idle > self.timeout or host_idle > self.timeout:
            what = "board" if (board_idle > self.timeout and not self.wall) else "host"
            self.board.stop(f"stopped after {self.timeout:g} s ({what} time) without a camera "
                            f"frame (--timeout {self.timeout:g}): the script loops without "
                            "sensor.snapshot()", "timeout")

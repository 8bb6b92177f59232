"""The emulated board behind the host MaixPy modules.

A `Board` holds what a Sipeed Maix board has: its 16 MiB SPI flash (a file, as `tl2k210.flash`'s
emulated board writes it; `kpu.load(ADDR)` reads models from it), the `/flash` (SPIFFS) and `/sd`
(FAT) file systems (host folders, see `vfs.py`), the camera's queue of photos, the LCD's output,
the firmware build (`runtime`: heaps and kmodel versions, tl2k210/k210/firmware.py), the board's
clock (virtual by default, see `timing.py`), GPIO/UART/PWM logs, and the host notes that explain
board-side errors. One Board is current at a time (`current()`); a `Session` installs its own.

    board.flash_kfpkg("face.kfpkg", "flash.bin")  # "flash" a package into an image file
    board.flash_kmodel("m.kmodel", "flash.bin", 0x500000, fresh=False)
"""
from __future__ import annotations

import os
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tl2k210.errors import Tl2k210Error
from tl2k210.k210 import firmware
from tl2k210.k210.board_facts import FLASH_BYTES, MAIXPY_MODEL_AREA

FLASH_SIZE = FLASH_BYTES
ERASED = 0xFF
#: a script that shows LCD frames but never takes a camera frame (an animation, a menu loop)
#: stops after this many (each frame is kept, and a PNG); a splash screen before the camera
#: starts is far shorter
LCD_FRAMES_WITHOUT_CAMERA = 100
#: what a Maix Dock/Bit's board-config script writes under the "board_info" key of
#: /flash/config.json (the same pin map MaixPy <= v0.5 had hard-coded; docs/maixpy-firmware.md#machine-maix-and-board)
MAIX_BOARD_INFO = dict({f"PIN{i}": i for i in range(48)}, BOOT_KEY=16, LED_R=14, LED_G=13,
                       LED_B=12, LED_W=32, BACK=11, ENTER=10, NEXT=16, WIFI_TX=6, WIFI_RX=7,
                       WIFI_EN=8, WIFI_SPI_CSXX=8, MIC0_WS=19, MIC0_DATA=20, MIC0_BCK=18,
                       I2S0_WS=33, I2S0_OUT_D1=34, I2S0_SCLK=35, I2C_SCL=30, I2C_SDA=31,
                       SPI0_MOSI=28, SPI0_MISO=26, SPI0_SCLK=27, SPI0_CS0=29, SPI0_CS1=25,
                       ESP32_CS=25, ESP32_RST=8, ESP32_RDY=9, ESP32_MOSI=28, ESP32_MISO=26,
                       ESP32_SCLK=27)


#: M5StickV / UnitV (sipeed/MaixPy-v1 projects/maixpy_m5stickv): its frozen board.py's pin names
M5STICKV_BOARD_INFO = dict(pin_num=48, ISP_RX=4, ISP_TX=5, WIFI_TX=39, WIFI_RX=38, CONNEXT_A=35,
                           CONNEXT_B=34, MPU_SDA=29, MPU_SCL=28, MPU_INT=23, SPK_LRCLK=14, SPK_BCLK=15,
                           SPK_DIN=17, SPK_SD=25, MIC_LRCLK=10, MIC_DAT=12, MIC_CLK=13, LED_W=7, LED_R=6,
                           LED_G=9, LED_B=8, BUTTON_A=36, BUTTON_B=37)


@dataclass(frozen=True)
class Profile:
    """A board's MaixPy build as scripts see it: its board_info (from /flash/config.json, or a
    frozen board.py of its own), the names its _boot.py leaves in __main__, its LCD's default
    size, the I2C devices on its bus ((scl, sda, address, kind)) and its frozen modules."""
    config_type: str
    board_info: dict
    frozen_board_info: bool = False
    boot_names: tuple = ()
    lcd_size: tuple = (320, 240)
    i2c: tuple = ()
    modules: tuple = ()


PROFILES = {
    "maix": Profile("dock", MAIX_BOARD_INFO),
    # its _boot.py: `import gc, uos, sys; import machine; from board import board_info; from
    # fpioa_manager import fm; from pye_mp import pye; from Maix import FPIOA, GPIO`; the AXP192
    # power chip at I2C 0x34 on pins 28/29, which its frozen pmu.py drives, and the MPU6886 IMU at
    # 0x68 beside it (early units had an SH200Q at 0x6C instead); CONFIG_LCD_DEFAULT 240x135
    "m5stickv": Profile("m5stickv", M5STICKV_BOARD_INFO, True,
                        ("gc", "uos", "sys", "machine", "board_info", "fm", "pye", "FPIOA", "GPIO"),
                        (240, 135), ((28, 29, 0x34, "axp192"), (28, 29, 0x68, "mpu6886")), ("pmu",)),
}


#: machine.reset() reboots a board booted from a folder (boot.py, main.py) this many times in a run
#: (the MaixPy docs' heap recipe: set utils.gc_heap_size, reset once); a script that resets on
#: every boot ends there
MAX_REBOOTS = 3


class BoardStop(BaseException):
    """Ends a run from the board side: the camera has no more photos, the watchdog fired, or
    the host was asked to stop. A BaseException so a script's `except Exception:` does not
    swallow it (a bare `except:` that does is handled: the board keeps raising it)."""

    def __init__(self, reason: str, kind: str = "camera"):
        super().__init__(reason)
        self.reason, self.kind = reason, kind


StopDemo = BoardStop   # the name earlier code used


class Board:
    """flash: the 16 MiB flash image FILE kpu.load(ADDR) reads (None: erased, or env
    TL2K210_FLASH); fs: host folder seen as /flash (None: a temporary one); sd: host folder seen
    as /sd (None: no card); images: the camera's photos (paths or PIL images) in order;
    max_frames: stop after that many (a script that takes none: after LCD_FRAMES_WITHOUT_CAMERA
    LCD frames); out: LCD PNG folder or .png; button: camera frames
    (0-based) during which the BOOT key is held; runtime: a MaixPy build of
    tl2k210/k210/firmware.py; wall_clock: host time instead of board time; timeout: seconds
    without a camera frame before the watchdog stops the run (None: never); camera: ov2640 |
    ov7740 | gc0328 (windowing)."""

    def __init__(self, flash=None, images=(), out=None, max_frames=None, sd=None, fs=None,
                 button=(), runtime="maixpy", wall_clock=False, timeout=60.0, camera="ov2640",
                 board="maix"):
        from tl2k210.maixpy import timing, vfs
        self.flash_path = Path(flash) if flash else (Path(os.environ["TL2K210_FLASH"])
                                                     if os.environ.get("TL2K210_FLASH") else None)
        self.runtime = firmware.get(runtime)
        if board not in PROFILES:
            raise Tl2k210Error(f"--board {board}: choose from {', '.join(PROFILES)}")
        self.profile = PROFILES[board]
        self.i2c_devices = {(scl, sda, addr): I2C_DEVICES[kind]() for scl, sda, addr, kind in self.profile.i2c}
        if not self.runtime.maixpy:
            raise Tl2k210Error(f"--runtime {runtime}: not a MaixPy firmware; choose from "
                               f"{', '.join(firmware.MAIXPY_RUNTIMES)}")
        self.images = list(images)
        self.max_frames = len(self.images) if max_frames is None else min(max_frames, len(self.images))
        self.frames_taken = 0
        self.rtc_offset = 0       # seconds time.set_time moved the RTC (modules.py utime)
        self.frame_times = []     # board ms at each camera frame delivered
        self.camera = camera
        self.out = Path(out) if out else None
        self.lcd_frames = []      # RGB888 HWC arrays, one per lcd.display()/draw_string()
        self.lcd_texts = []       # per frame: [(x, y, text)] drawn on what was shown
        self.lcd_pngs = []        # paths written
        self.vfs = vfs.VFS(sd=sd, flash=fs, defaults={
            "freq.conf": _freq_conf(self.runtime.gc_heap),
            "config.json": ('{"type": "%s", "board_info": %s}' % (self.profile.config_type,
                                                                 _json(self.profile.board_info))).encode()})
        self.vfs.note = self.note
        self.kpu_tasks = []       # loaded kpu_net objects (MaixPy allows 5)
        self.sys_used = 0         # system-heap bytes taken (models, dual_buff)
        self.notes = []           # host-side hints (why a MaixPy error happened)
        self._noted = set()
        self.button = set(int(f) for f in button)   # camera frames (0-based) with BOOT held down
        self.gpio_log = []        # (t_ms, gpio id, value) for every output write
        self.uart_log = {}        # uart id -> bytearray written
        self.clock = timing.Clock(wall=wall_clock, timeout=timeout)
        self.sensor = None        # sensor state (sensor.py)
        self.lcd = None           # lcd state (lcd.py)
        self.gc = None            # GC heap model (heap.py), set by the session
        self.stop_reason = None
        self.reboots = 0          # machine.reset()s the runner rebooted
        self._heap_from_conf()

    def reboot(self):
        """machine.reset(): the board starts again -- its flash, SD card, camera, LCD and clock
        go on; what the firmware kept in RAM is gone, and a GC heap size utils.gc_heap_size wrote
        to /flash/freq.conf takes effect."""
        self.kpu_tasks, self.sys_used, self.sensor, self.lcd, self.gc = [], 0, None, None, None
        self.stop_reason = None
        self._heap_from_conf()

    def conf_heap(self) -> int:
        """The GC heap size /flash/freq.conf says (cpu, pll1, heap: three u32)."""
        import struct
        try:
            raw = self.vfs.read_bytes("/flash/freq.conf")
        except OSError:
            return self.runtime.gc_heap
        return struct.unpack_from("<I", raw, 8)[0] if len(raw) >= 12 else self.runtime.gc_heap

    def set_conf_heap(self, size: int):
        """utils.gc_heap_size(size): freq.conf's heap, for the next boot."""
        import struct
        try:
            raw = bytearray(self.vfs.read_bytes("/flash/freq.conf"))
        except OSError:
            raw = bytearray(_freq_conf(self.runtime.gc_heap))
        raw[8:12] = struct.pack("<I", size)
        with self.vfs.open("/flash/freq.conf", "wb") as f:
            f.write(bytes(raw))

    def _heap_from_conf(self):
        """The GC heap the board boots with: freq.conf's; what the GC heap does not take, the
        system heap (models, frame buffers) has."""
        import dataclasses
        heap = self.conf_heap()
        if heap and heap != self.runtime.gc_heap:
            self.runtime = dataclasses.replace(self.runtime, gc_heap=heap,
                                               model_budget=self.runtime.model_budget + self.runtime.gc_heap - heap)

    def i2c_device(self, scl, sda, addr):
        """The device at `addr` of the I2C bus on pins scl/sda, or None (no answer: EIO)."""
        return self.i2c_devices.get((scl, sda, addr))

    # -- notes -------------------------------------------------------------------------------
    def note(self, text: str, key=None):
        """Record a host note once (per key)."""
        key = text if key is None else key
        if key not in self._noted:
            self._noted.add(key)
            self.notes.append(text)

    def button_down(self) -> bool:
        """Is the scripted button (BOOT key) held down now, i.e. during the latest frame taken?"""
        return self.frames_taken - 1 in self.button

    def stop(self, reason: str, kind: str):
        self.stop_reason = BoardStop(reason, kind)
        raise self.stop_reason

    # -- system heap (models, frame buffers) ---------------------------------------------------
    @property
    def sys_free(self) -> int:
        return self.runtime.model_budget - self.sys_used

    # -- flash ---------------------------------------------------------------------------------
    def read_flash(self, address: int, length: int) -> bytes:
        """`length` bytes at `address`; a board without a flash file reads erased flash (0xFF)."""
        if address < 0 or address >= FLASH_SIZE:
            return b""
        length = max(0, min(length, FLASH_SIZE - address))
        if self.flash_path is None:
            self.note("no flash image is set (--flash/--kfpkg/--kmodel, run_script(flash=...) or "
                      "TL2K210_FLASH): the host flash reads as erased 0xFF", "noflash")
            return bytes([ERASED]) * length
        try:
            with open(self.flash_path, "rb") as fh:
                fh.seek(address)
                data = fh.read(length)
        except OSError as exc:
            raise Tl2k210Error(f"cannot read flash image {self.flash_path}: {exc.strerror}") from None
        return data + bytes([ERASED]) * (length - len(data))

    # -- file systems --------------------------------------------------------------------------
    def host_path(self, path) -> Path:
        """The host file behind a board path (relative paths follow the board's cwd)."""
        return self.vfs.host_path(path)

    def close(self):
        self.vfs.close()


def _json(d):
    import json
    return json.dumps(d)


def _freq_conf(gc_heap):
    import struct
    return struct.pack("<III", 400_000_000, 400_000_000, gc_heap)   # cpu, pll1 (KPU), gc heap


_current = None


def current() -> Board:
    global _current
    if _current is None:
        _current = Board()
    return _current


def console(text: str):
    """Firmware console output (mp_printf to mp_plat_print): the session's stdout, else the host's."""
    s = getattr(current(), "session", None)
    if s is not None:
        s.out.write(text)
    else:
        sys.stdout.write(text)


def install(board):
    """Make `board` current; returns the previous one (to restore)."""
    global _current
    prev, _current = _current, board
    return prev


@contextmanager
def installed(board):
    """`board` current within the block, the previous one again after it."""
    prev = install(board)
    try:
        yield board
    finally:
        install(prev)


def use_flash(path):
    """Point the current board (and later `Board()`s via TL2K210_FLASH) at a flash image file."""
    current().flash_path = Path(path) if path else None
    if path:
        os.environ["TL2K210_FLASH"] = os.fspath(path)
    else:
        os.environ.pop("TL2K210_FLASH", None)


def flash_kfpkg(kfpkg, flash_path, fresh: bool = True) -> Path:
    """Write a .kfpkg's images into a flash image file at their addresses, as kflash would
    (a fresh erased 16 MiB image unless `fresh` is False and the file exists)."""
    from tl2k210.flash.kfpkg import read_kfpkg
    return write_flash(flash_path, [(i.address, i.flash_bytes()) for i in read_kfpkg(kfpkg)], fresh)


def flash_kmodel(kmodel_path, flash_path, address=MAIXPY_MODEL_AREA, fresh: bool = True) -> Path:
    """Write a raw kmodel at `address` (what a kfpkg with sha256Prefix false does)."""
    return write_flash(flash_path, [(address, Path(kmodel_path).read_bytes())], fresh)


def write_flash(flash_path, images, fresh: bool = True) -> Path:
    from tl2k210.flash.emulated_board import new_flash_file
    flash_path = Path(flash_path)
    if fresh or not flash_path.exists():
        new_flash_file(flash_path, FLASH_SIZE)
    with open(flash_path, "r+b") as fh:
        for address, data in images:
            if address < 0 or address + len(data) > FLASH_SIZE:
                raise Tl2k210Error(f"image of {len(data)} bytes at 0x{address:x} does not fit "
                                   f"in a {FLASH_SIZE >> 20} MiB flash")
            fh.seek(address)
            fh.write(data)
    return flash_path


def host_seconds() -> float:
    return time.perf_counter()


#: the AXP192's ADC readings as the M5StickV's frozen pmu.py reads them: {its getter: (the register
#: of the high 8 bits, the low bits' count in the next one, the step, the offset)}, the AXP192
#: datasheet's scales (mV, mA, degC)
AXP192_ADC = {"getVbatVoltage": (0x78, 4, 1.1, 0.0), "getUSBVoltage": (0x56, 4, 1.7, 0.0),
              "getUSBInputCurrent": (0x58, 4, 0.625, 0.0), "getConnextVoltage": (0x5A, 4, 1.7, 0.0),
              "getConnextInputCurrent": (0x5C, 4, 0.625, 0.0), "getBatteryChargeCurrent": (0x7A, 5, 0.5, 0.0),
              "getBatteryDischargeCurrent": (0x7C, 5, 0.5, 0.0), "getTemperature": (0x5E, 4, 0.1, -144.7)}
#: what the emulated chip reads: a charged battery on USB
AXP192_READINGS = {"getVbatVoltage": 4100, "getUSBVoltage": 5000, "getUSBInputCurrent": 100, "getTemperature": 40.0}


class Registers:
    """An I2C chip of 256 byte registers: a one-byte write sets the pointer, the bytes after it
    write from there; a read returns from the pointer on (`refresh` first brings the chip's
    readings up to date)."""

    def __init__(self):
        self.regs = bytearray(256)
        self.ptr = 0

    def refresh(self):
        pass

    def write(self, data: bytes):
        if data:
            self.ptr = data[0]
            for i, v in enumerate(data[1:]):
                self.regs[(self.ptr + i) & 0xFF] = v

    def read(self, n: int) -> bytes:
        self.refresh()
        out = bytes(self.regs[(self.ptr + i) & 0xFF] for i in range(n))
        self.ptr = (self.ptr + n) & 0xFF
        return out


class Axp192(Registers):
    """The M5StickV's AXP192 power chip as its frozen pmu.py reads it: the ADC registers hold
    AXP192_READINGS, the rest read what was written (backlight 0x91, ADC enable 0x82, ...)."""

    def __init__(self):
        super().__init__()
        for name, value in AXP192_READINGS.items():
            reg, bits, step, offset = AXP192_ADC[name]
            code = int(round((value - offset) / step))
            self.regs[reg], self.regs[reg + 1] = (code >> bits) & 0xFF, code & ((1 << bits) - 1)
        self.regs[0x91] = 0xC0           # backlight (LDO2/GPIO0 voltage) as the firmware leaves it


#: the MPU6886 (the M5StickV's IMU, I2C 0x68) at rest on a table: its WHO_AM_I, the accelerometer
#: (g) and gyroscope (deg/s) on x, y, z, the die temperature (degC), and the datasheet's scales:
#: accelerometer LSB/g at ACCEL_CONFIG's full-scale codes 0-3 (+-2/4/8/16 g), gyroscope LSB/(deg/s)
#: at GYRO_CONFIG's (+-250/500/1000/2000), temperature raw/326.8 + 25
MPU6886 = dict(who_am_i=0x19, accel=(0.0, 0.0, 1.0), gyro=(0.0, 0.0, 0.0), temperature=35.0,
               accel_lsb=(16384, 8192, 4096, 2048), gyro_lsb=(131.0, 65.5, 32.8, 16.4))


class Mpu6886(Registers):
    """The M5StickV's 6-axis IMU as MicroPython MPU6886 drivers read it: WHO_AM_I (0x75), the
    big-endian readings from ACCEL_XOUT_H (0x3B: accelerometer, temperature, gyroscope), scaled
    by the full-scale ranges written to GYRO_CONFIG (0x1B) and ACCEL_CONFIG (0x1C); asleep (reset,
    or PWR_MGMT_1's bit 6) it reads zeros, as the chip does until a driver wakes it."""

    def __init__(self):
        super().__init__()
        self.reset()

    def reset(self):
        self.regs[:] = bytes(256)
        self.regs[0x75] = MPU6886["who_am_i"]
        self.regs[0x6B] = 0x40           # PWR_MGMT_1 after reset: asleep, the readings 0, until woken

    def write(self, data: bytes):
        super().write(data)
        if self.regs[0x6B] & 0x80:       # DEVICE_RESET
            self.reset()

    def refresh(self):
        m = MPU6886
        if self.regs[0x6B] & 0x40:
            return
        accel = [v * m["accel_lsb"][(self.regs[0x1C] >> 3) & 3] for v in m["accel"]]
        gyro = [v * m["gyro_lsb"][(self.regs[0x1B] >> 3) & 3] for v in m["gyro"]]
        values = accel + [(m["temperature"] - 25) * 326.8] + gyro
        for i, v in enumerate(values):
            code = max(-32768, min(32767, int(round(v)))) & 0xFFFF
            self.regs[0x3B + 2 * i], self.regs[0x3C + 2 * i] = code >> 8, code & 0xFF


I2C_DEVICES = {"axp192": Axp192, "mpu6886": Mpu6886}


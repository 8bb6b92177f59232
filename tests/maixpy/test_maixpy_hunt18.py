"""Departures from MicroPython 1.11 / MaixPy v0.6.2 found by running real K210 repositories'
scripts on the host (round 66's second hunt), each reproduced by a small board script."""
from test_maixpy_runtime import run  # noqa: F401  (the board-script runner)
from tl2k210.maixpy import run_folder


def test_ustruct_packs_an_integer_as_its_low_bytes(tmp_path):
    """modstruct.c -> mp_binary_set_int stores the low bytes with no range check: a drone script
    (LZBUAV/K210_Python) packs a MAVLink start byte 0xFE as 'b' and a 16-bit CRC as 'h'; CPython's
    struct raised "byte format requires -128 <= number <= 127" on frame 1."""
    res = run(tmp_path, """
import ustruct
print(ustruct.pack('<b38sh', 0xFE, b'x', 0xFFF0)[:2], ustruct.pack('<bBhH', 255, -1, 40000, -2))
print(ustruct.pack('<2b', 200, 300), ustruct.unpack('<h', ustruct.pack('<H', 0xFFFF)))
""")
    assert res.error is None, res.traceback
    assert res.lines == ["b'\\xfex' b'\\xff\\xff@\\x9c\\xfe\\xff'", "b'\\xc8,' (-1,)"]


def test_a_folder_without_init_is_a_namespace_package(tmp_path):
    """builtinimport.c: a folder on sys.path is a package, its __init__.py loaded only where there
    is one; Sipeed's MaixUI imports `driver.camera` from a driver/ folder without one (it had been
    ImportError: no module named 'driver')."""
    sd = tmp_path / "sd"
    (sd / "driver").mkdir(parents=True)
    (sd / "driver" / "camera.py").write_text("NAME = 'cam'\n")
    (sd / "ui").mkdir()
    (sd / "ui" / "__init__.py").write_text("INIT = 1\n")
    (sd / "ui" / "canvas.py").write_text("W = 240\n")
    (sd / "main.py").write_text("import driver.camera as camera\nfrom ui.canvas import W\nimport ui\n"
                                "print(camera.NAME, W, ui.INIT)\n")
    res = run_folder(sd, raise_errors=False)
    assert res.error is None, res.traceback
    assert res.lines[-1] == "cam 240 1"


def test_an_unexpected_indent_is_an_indentation_error(tmp_path):
    """parse.c: MP_TOKEN_INDENT is "IndentationError: unexpected indent" (the MaixPy docs' own KPU
    feature-map routine ends with one); only other errors are "SyntaxError: invalid syntax"."""
    res = run(tmp_path, "x = 1\n   print(x)\n")
    assert res.error is not None and "IndentationError: unexpected indent" in res.traceback
    res = run(tmp_path, "if 1:\n        x = 1\n    y = 2\n")
    assert "IndentationError: unindent doesn't match any outer indentation level" in res.traceback
    res = run(tmp_path, "x = (1,\n")
    assert "SyntaxError: invalid syntax" in res.traceback


def test_machine_reset_reboots_and_the_heap_size_set_takes_effect(tmp_path):
    """The MaixPy docs' recipe for a big model: utils.gc_heap_size(256 KiB) writes freq.conf and
    machine.reset() reboots with it, the system heap then 256 KiB larger (the run had ended at
    the reset). A script that resets on every boot stops after MAX_REBOOTS."""
    from tl2k210.maixpy.board import MAX_REBOOTS
    sd = tmp_path / "sd"
    sd.mkdir()
    (sd / "main.py").write_text("""import gc, machine
from Maix import utils
print("heap", utils.gc_heap_size(), gc.mem_free() + gc.mem_alloc(), utils.heap_free())
if utils.gc_heap_size() != 256 * 1024:
    utils.gc_heap_size(256 * 1024)
    machine.reset()
print("after", utils.gc_heap_size(), gc.mem_free() + gc.mem_alloc(), utils.heap_free())
""")
    res = run_folder(sd, raise_errors=False)
    assert res.error is None and res.stop == "end", res.traceback
    assert res.lines == ["heap 524288 518144 2097152", "heap 262144 259072 2359296", "after 262144 259072 2359296"]
    (sd / "main.py").write_text("import machine\nprint('boot')\nmachine.reset()\n")
    res = run_folder(sd, raise_errors=False)
    assert res.stop == "reset" and res.lines.count("boot") == MAX_REBOOTS + 1


def test_spi_has_its_chip_select_constants(tmp_path):
    """machine_spi.c: SPI.CS0..CS3 select the chip read/write(cs=) drives (the MaixPy docs' SPI
    example writes with cs=SPI.CS0; the host had no such attribute)."""
    res = run(tmp_path, """
from machine import SPI
spi = SPI(SPI.SPI1, mode=SPI.MODE_MASTER, baudrate=10000000, polarity=0, phase=0, bits=8,
          firstbit=SPI.MSB, sck=28, mosi=29, miso=30, cs0=27)
spi.write(b'12345678', cs=SPI.CS0)
print(SPI.CS0, SPI.CS1, SPI.CS2, SPI.CS3, len(spi.read(5, write=0x00, cs=SPI.CS0)))
""")
    assert res.error is None, res.traceback
    assert res.lines == ["0 1 2 3 5"]


def test_uctypes_imports_and_memory_access_says_it_is_not_emulated(tmp_path):
    """uctypes is a core module of the build (the MaixPy docs list it); its constants are
    moductypes.c's, and what touches memory by address raises OSError EOPNOTSUPP with a note."""
    res = run(tmp_path, """
import uctypes
print(uctypes.UINT8, uctypes.INT32, uctypes.FLOAT64, uctypes.PTR, uctypes.ARRAY, uctypes.LITTLE_ENDIAN)
try:
    uctypes.bytearray_at(0x50440000, 4)
except OSError as e:
    print(e)
""")
    assert res.error is None, res.traceback
    assert res.lines == ["0 671088640 -134217728 536870912 -1073741824 0", "[Errno 95] EOPNOTSUPP"]
    assert any("uctypes.bytearray_at" in n for n in res.notes)


def test_gc_collect_takes_board_time_and_audio_takes_its_buffer_positionally(tmp_path):
    """gc.collect() advances the board clock (a mark-sweep of the heap: Sipeed's MaixUI launcher
    divided by its loop's 0 ms); py_audio.c takes the sample buffer as Audio's first positional
    argument (the MaixPy docs' I2S loop-back)."""
    res = run(tmp_path, """
import gc, time, audio
t = time.ticks_us()
gc.collect()
print(time.ticks_diff(time.ticks_us(), t) >= 1000)
a = audio.Audio(bytearray(1024))
print(type(a).__name__)
""")
    assert res.error is None, res.traceback
    assert res.lines == ["True", "Audio"]


def test_an_m5stickv_board_has_its_pins_lcd_and_power_chip(tmp_path):
    """M5StickV / UnitV apps (ksasao/brownie, the M5StickV book's samples) stopped at
    board_info.SPK_SD and the AXP192 power chip: the m5stickv profile is that build's frozen
    board.py pin names, the names its _boot.py leaves in __main__ (fm, board_info, GPIO), its
    240x135 LCD, and the AXP192 at I2C 0x34 (pins 28/29) its frozen pmu.py reads."""
    sd = tmp_path / "sd"
    sd.mkdir()
    (sd / "main.py").write_text("""import lcd, pmu
from machine import I2C
print(board_info.SPK_SD, board_info.BUTTON_A, board_info.LED_W, fm.board_info.MPU_SCL, GPIO.GPIOHS0 >= 0)
lcd.init()
print(lcd.width(), lcd.height())
axp = pmu.axp192()
axp.enableADCs(True)
axp.setScreenBrightness(9)
print('%.1f %.1f %.1f' % (axp.getVbatVoltage(), axp.getUSBVoltage(), axp.getTemperature()))
i2c = I2C(I2C.I2C0, freq=400000, scl=28, sda=29)
print(i2c.scan(), i2c.readfrom_mem(0x34, 0x91, 1), i2c.readfrom_mem(0x34, 0x82, 1))
try:
    i2c.readfrom_mem(0x6C, 0x30, 1)
except OSError as e:
    print(e)
""")
    res = run_folder(sd, raise_errors=False, board="m5stickv")
    assert res.error is None, res.traceback
    assert res.lines[-5:] == ["25 36 7 28 True", "240 135", "4099.7 4999.7 40.0", "[52, 104] b'\\x90' b'\\xff'",
                              "[Errno 5] EIO"]
    res = run_folder(sd, raise_errors=False)          # a Maix Dock's build: none of that
    assert res.error is not None and "ImportError: no module named 'pmu'" in res.traceback


def test_an_m5stickv_boot_objects_belong_to_the_running_board(tmp_path, monkeypatch):
    """The m5stickv profile's `fm` (its _boot.py's fpioa_manager) was made before the board was
    current, so it bound a second, default board: a pin it registered was not the script's FPIOA's,
    and that board's temporary flash folder was left in the temp dir (one per run of the suite)."""
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    sd = tmp_path / "sd"
    sd.mkdir()
    (sd / "main.py").write_text("""from Maix import FPIOA
fm.register(12, fm.fpioa.GPIO0)
print(FPIOA().get_Pin_num(FPIOA.GPIO0))
""")
    res = run_folder(sd, raise_errors=False, board="m5stickv")
    assert res.error is None, res.traceback
    assert res.lines[-1:] == ["12"]
    assert not list(tmp_path.glob("tl2k210-flashfs-*"))


def test_an_m5stickv_imu_reads_gravity_at_the_range_its_driver_sets(tmp_path):
    """M5StickV IMU scripts (an MPU6886 driver as M5Stack's samples write it) stopped at EIO: the
    m5stickv profile has the MPU6886 at 0x68, asleep and reading zeros until woken, then at rest
    on a table: 1 g on z at the full-scale range the driver wrote, no rotation, its die warm."""
    sd = tmp_path / "sd"
    sd.mkdir()
    (sd / "main.py").write_text("""import ustruct, utime
from machine import I2C
i2c = I2C(I2C.I2C0, freq=400000, scl=28, sda=29)
print(hex(i2c.readfrom_mem(0x68, 0x75, 1)[0]), ustruct.unpack('>hhh', i2c.readfrom_mem(0x68, 0x3B, 6)))
i2c.writeto_mem(0x68, 0x6B, bytearray([0x80]))
utime.sleep_ms(10)
i2c.writeto_mem(0x68, 0x6B, bytearray([0x01]))
i2c.writeto_mem(0x68, 0x1C, bytearray([0x10]))
i2c.writeto_mem(0x68, 0x1B, bytearray([0x18]))
ax, ay, az, t, gx, gy, gz = ustruct.unpack('>hhhhhhh', i2c.readfrom_mem(0x68, 0x3B, 14))
print(ax / 4096, ay / 4096, az / 4096, '%.1f' % (t / 326.8 + 25), gx / 16.4, gz / 16.4)
i2c.writeto_mem(0x68, 0x1C, 0)
print(ustruct.unpack('>h', i2c.readfrom_mem(0x68, 0x3F, 2))[0])
""")
    res = run_folder(sd, raise_errors=False, board="m5stickv")
    assert res.error is None, res.traceback
    assert res.lines[-3:] == ["0x19 (0, 0, 0)", "0.0 0.0 1.0 35.0 0.0 0.0", "16384"]


def test_the_repl_board_takes_the_m5stickv_profile_too(tmp_path):
    """`tl2k210 board --maixpy --board m5stickv`: mpremote / ampy / `tl2k210 repl` talk to an
    M5StickV build (its pin names, its pmu)."""
    from repl_helpers import board
    from tl2k210.maixpy.repl import Repl
    b = board(tmp_path, board="m5stickv")
    try:
        assert b.wait_idle()
        with Repl.open(b.port) as r:
            out = r.exec_ok("import pmu\nprint(board_info.BUTTON_A, pmu.axp192().getKeyStatus())").decode()
        assert out.split() == ["36", "-1"]
    finally:
        b.close()

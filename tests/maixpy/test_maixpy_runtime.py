"""The host MaixPy's MicroPython world, argument rules, boot, clock, memory and watchdog, each
against what docs/maixpy-firmware.md says a MaixPy v1 board does (its section anchors in the
comments and docstrings). Small board scripts; the KPU parts use the testdata face detector."""
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from PIL import Image

from conftest import REPO, data_path
from tl2k210.maixpy import board, run_folder, run_script
from tl2k210.maixpy.runtime import Session

CAM = "import sensor, image, lcd\nsensor.reset()\nsensor.set_pixformat(sensor.RGB565)\n" \
      "sensor.set_framesize(sensor.QVGA)\n"
#: what sensor.reset() prints on a board with an OV2640 (sensor.c v0.6.2: cambus_init's
#: sccb_i2c_init on the default bus 2, sensro_ov_detect, sensor_init_dvp)
PROBE = ["init i2c2", "[MAIXPY]: find ov2640", "[MAIXPY]: find ov sensor"]


def after_probe(res):
    """The lines a CAM script printed after sensor.reset()'s probe lines (asserted here)."""
    assert res.lines[:3] == PROBE, res.lines[:3]
    return res.lines[3:]


def run(tmp_path, body, name="main.py", **kw):
    p = tmp_path / name
    p.write_text(body)
    kw.setdefault("raise_errors", False)
    return run_script(p, **kw)


@pytest.fixture(scope="module")
def photo(tmp_path_factory):
    skdata = pytest.importorskip("skimage.data")
    p = tmp_path_factory.mktemp("photo") / "astronaut.png"
    Image.fromarray(skdata.astronaut()).save(p)
    return p


@pytest.fixture(scope="module")
def face_flash(tmp_path_factory):
    km = data_path("kmodels", "facedetect_320x240_v3.kmodel")
    return board.flash_kmodel(km, tmp_path_factory.mktemp("flash") / "flash.bin", 0x300000)


# ---------------------------------------------------------------------------------------------
# 1. the MicroPython surface (#micropython-surface)
def test_sys_is_micropythons(tmp_path):
    res = run(tmp_path, """
import sys, uio
print(sys.platform, sys.implementation.name, sys.implementation.version, sys.version, sys.path)
s = uio.StringIO()
try:
    {}['k']
except KeyError as e:
    sys.print_exception(e, s)
print(s.getvalue().splitlines())
print(hasattr(sys, 'exc_info'), hasattr(sys, 'getsizeof'), 'sys' in sys.modules)
""")
    assert res.error is None, res.traceback
    assert res.lines == [
        "MaixPy micropython (0, 6, 2) 3.4.0 ['', '.', '/flash']",
        "['Traceback (most recent call last):', '  File \"main.py\", line 6, in <module>', \"KeyError: 'k'\"]",
        "False False True"]


def test_module_names_like_the_port(tmp_path):
    """u-modules and the weak links; `import io` fails on a board (no weak link, #micropython-surface)."""
    res = run(tmp_path, """
import ujson, json, ustruct, struct, ubinascii, binascii, uhashlib, hashlib, ure, re
import ucollections, collections, uerrno, errno, math, utime, time, uos, os, gc, machine, Maix
import micropython, array, urandom, uheapq, uzlib, _thread, cmath, builtins
print(ujson.dumps({"pi": math.pi, "l": [1, 2.5]}), ujson.loads('{"a": [1, 2]}')["a"])
print(ustruct.pack("<HI", 1, 2), ustruct.calcsize("<HI"), ubinascii.hexlify(b"\\x01\\xab"))
print(ubinascii.crc32(b"maix"), len(uhashlib.sha256(b"abc").digest()), hasattr(uhashlib, "md5"))
print(hasattr(uhashlib.sha256(), "hexdigest"), ure.match("k(\\\\d+)", "k210").group(1))
d = ucollections.deque((), 3)
for i in range(5):
    d.append(i)
print(list(d), uerrno.ENOENT, uerrno.errorcode[uerrno.ENOENT], math.sqrt(2))
print(1/3, 2.0, [0.1, 1e-08], (1.5,), 3.0 * 1e10)
print(hasattr(os, "sep"), hasattr(os, "path"), hasattr(machine, "Pin"), Maix.freq.get())
import io
""")
    assert res.lines == [
        '{"pi": 3.141593, "l": [1, 2.5]} [1, 2]',
        "b'\\x01\\x00\\x02\\x00\\x00\\x00' 6 b'01ab'",
        "1274837045 32 False",
        "False 210",
        "[2, 3, 4] 2 ENOENT 1.414214",
        "0.3333333 2.0 [0.1, 1e-08] (1.5,) 3e+10",
        "False False False (400, 400)"]
    assert res.traceback.endswith("ImportError: no module named 'io'\n")
    assert any("import uio" in n for n in res.notes)


def test_micropython_syntax_and_error_texts(tmp_path):
    res = run(tmp_path, 'x = 1\nprint(f"{x}")\n')
    assert res.traceback.endswith('  File "main.py", line 2\nSyntaxError: invalid syntax\n')
    assert any("f-strings are not supported" in n for n in res.notes)
    res = run(tmp_path, "def f():\n    return undefined_name\nf()\n")
    assert res.traceback == ('Traceback (most recent call last):\n  File "main.py", line 3, in <module>\n'
                             '  File "main.py", line 2, in f\nNameError: name \'undefined_name\' isn\'t defined\n')
    res = run(tmp_path, "try:\n    open('/sd/x.txt')\nexcept OSError as e:\n    print(e, e.args[0])\n"
                        "print(1 // 0)\n")
    assert res.lines == ["[Errno 2] ENOENT 2"]
    assert res.traceback.endswith("ZeroDivisionError: divide by zero\n")


def test_os_follows_the_emulated_flash_and_sd(tmp_path):
    """uos on SPIFFS (flat, no mkdir) and FAT (directories), relative paths from the cwd (#filesystems)."""
    sd, fs = tmp_path / "sd", tmp_path / "fs"
    sd.mkdir()
    fs.mkdir()
    (sd / "anchors.txt").write_text("1.5, 2.5")
    res = run(tmp_path, """
import os
print(os.getcwd(), os.listdir('/'), os.listdir())
print(open('anchors.txt').read(), os.stat('anchors.txt')[6])
os.mkdir('/sd/models')
with open('models/a.bin', 'wb') as f:
    f.write('str into a binary file')
os.rename('/sd/models/a.bin', '/sd/models/b.bin')
print(os.listdir('/sd/models'), os.stat('/sd/models')[0] == 0x4000)
os.chdir('/flash')
print(os.getcwd(), 'freq.conf' in os.listdir(), 'config.json' in os.listdir('/flash/whatever'))
with open('dir/flat.txt', 'w') as f:
    f.write('x')
os.chdir('/flash/dir')
print(os.getcwd(), 'dir/flat.txt' in os.listdir('/flash'), os.stat('dir/flat.txt')[7:])
try:
    os.mkdir('/flash/sub')
except NotImplementedError as e:
    print('mkdir:', e)
try:
    os.remove('/flash/nothing')
except OSError as e:
    print('remove:', e)
os.remove('dir/flat.txt')
print('dir/flat.txt' in os.listdir('/flash'))
""", sd=sd, fs=fs)
    assert res.error is None, res.traceback
    assert res.lines == [
        "/sd ['flash', 'sd'] ['anchors.txt']",
        "1.5, 2.5 8",
        "['b.bin'] True",
        "/flash True True",
        "/flash True (0, 0, 0)",
        "mkdir: SPIFFS not support",
        "[MaixPy]:SPIFFS Error Code -10002",
        "remove: [Errno 2] ENOENT",
        "False"]
    assert (sd / "models" / "b.bin").read_bytes() == b"str into a binary file"
    assert sorted(p.name for p in fs.rglob("*")) == ["dir"]     # freq.conf/config.json not written


def test_gc_heap_counts_images_and_raises_memoryerror(tmp_path):
    """518 144-byte pool; a 320x240 RGB565 image is 153 600 bytes, three fit, not four (#gc-heap, #checklist)."""
    res = run(tmp_path, """
import gc, image
gc.collect()
total = gc.mem_free() + gc.mem_alloc()
a = gc.mem_free()
imgs = [image.Image()]
b = gc.mem_free()
imgs.append(image.Image())
imgs.append(image.Image())
print(total, a - b)
try:
    imgs.append(image.Image())
except MemoryError as e:
    print('MemoryError', str(e)[:38])
del imgs
gc.collect()
print(gc.mem_free() == a)
""")
    assert res.error is None, res.traceback
    assert res.lines == ["518144 153600", "MemoryError Out of normal MicroPython Heap Memory!",
                         "True"]


def test_board_info_and_fpioa_manager(tmp_path):
    res = run(tmp_path, """
from board import board_info
from fpioa_manager import fm
from Maix import GPIO
print(board_info.LED_R, board_info.LED_G, board_info.LED_B, board_info.BOOT_KEY, board_info.PIN9)
fm.register(board_info.LED_R, fm.fpioa.GPIO0)
fm.register(board_info.LED_G, fm.fpioa.GPIO0)
led = GPIO(GPIO.GPIO0, GPIO.OUT)
led.value(1)
try:
    GPIO(GPIO.GPIO1, GPIO.OUT, GPIO.PULL_UP)
except ValueError as e:
    print(e)
try:
    GPIO(GPIO.GPIO1, GPIO.OUT, value=1, drive=7)
except TypeError as e:
    print(e)
""")
    assert res.error is None, res.traceback
    assert res.lines == ["14 13 12 16 9",
                         "[Warning] function is used by fm.fpioa.GPIO0(pin:14)",
                         "When this pin is in output mode, it is not allowed to pull up and down.",
                         "extra keyword arguments given"]
    assert [w[1:] for w in res.board.gpio_log] == [(32, 1)]
    fs = tmp_path / "bare_flash"
    fs.mkdir()
    (fs / "config.json").write_text('{"type": "none"}')
    res = run(tmp_path, "from board import board_info\nprint(board_info.BOOT_KEY)\nboard_info.LED_R\n",
              fs=fs)
    assert res.lines == ["[Warning] Not loaded from /flash/config.json to board_info.", "16"]
    assert res.traceback.endswith("AttributeError: type object 'board_info' has no attribute 'LED_R'\n")


# ---------------------------------------------------------------------------------------------
# 2. argument rules (#argument-rules, #colours, #lcd, #checklist)
def test_openmv_keywords_ignored_with_one_note(tmp_path):
    res = run(tmp_path, """
import image
img = image.Image(size=(40, 30))
img.draw_rectangle((5, 5, 20, 10), color=(255, 0, 0), tickness=5)
img.draw_rectangle(5, 5, 20, 10, color=(255, 0, 0), tickness=5)
print(img.get_pixel(5, 5), img.get_pixel(6, 6), img.get_pixel(4, 5))
img.draw_line(0, 29, 39, 29, (0, 255, 0), 3, colour=1)
print(img.get_pixel(20, 29), img.get_pixel(20, 28), img.get_pixel(20, 27))
img.set_pixel(0, 0, (255, 0, 0), color=(0, 0, 255))     # the keyword overrides slot 2
print(img.get_pixel(0, 0))
""")
    assert res.error is None, res.traceback
    assert res.lines == ["(255, 0, 0) (0, 0, 0) (0, 0, 0)",
                         "(0, 255, 0) (0, 255, 0) (0, 0, 0)",
                         "(0, 0, 255)"]
    notes = [n for n in res.notes if "tickness" in n]
    assert len(notes) == 1 and "ignored, as a board ignores it" in notes[0]
    assert any("colour" in n for n in res.notes)


@pytest.mark.parametrize("call, error", [
    ("img.draw_rectangle(1.0, 2, 3, 4)", "TypeError: can't convert float to int"),
    ("img.draw_rectangle((1, 2, 3))", "ValueError: requested length 4 but object has length 3"),
    ("img.draw_rectangle(1, 2, 3)", "OSError: Not enough positional arguments!"),
    ("img.draw_circle(5, 5, 3, color=None)", "TypeError: object 'NoneType' isn't a tuple or list"),
    ("img.draw_string(0, 0, 'x', scale=0)", "OSError: Error: 0 < scale!"),
    ("img.resize(w=10, h=10)", "TypeError: function doesn't take keyword arguments"),
    ("img.resize(10.0, 10)", "TypeError: can't convert float to int"),
    ("lcd.init(type=1, colour=lcd.RED)", "TypeError: extra keyword arguments given"),
    ("lcd.draw_string(0, 0, 'x', fg=lcd.RED)", "TypeError: function doesn't take keyword arguments"),
    ("time.sleep_ms(1.5)", "TypeError: can't convert float to int"),
    ("image.Image('/sd/none.jpg')", "OSError: [Errno 2] ENOENT"),
])
def test_firmware_argument_errors(tmp_path, call, error):
    res = run(tmp_path, f"import image, lcd, time\nlcd.init()\nimg = image.Image(size=(20, 20))\n{call}\n")
    assert res.traceback.endswith(error + "\n"), res.traceback


def test_colours_raw_rgb565_and_tuples(tmp_path):
    """Ints are byte-swapped RGB565 (lcd.RED = 0x00F8), tuples are clamped and rounded (#colours)."""
    res = run(tmp_path, """
import image, lcd
img = image.Image(size=(8, 2))
for i, c in enumerate((lcd.RED, lcd.GREEN, lcd.BLUE, 0xF800, (300, -5, 128), (1, 3, 6))):
    img.set_pixel(i, 0, c)
print([img.get_pixel(i, 0) for i in range(6)])
print(img.get_pixel(0, 0, rgbtuple=False), img.get_pixel(7, 1), img.get_pixel(8, 0))
g = img.to_grayscale(copy=True)
g.set_pixel(0, 1, 77)
print(g.format(), img.format(), g.get_pixel(0, 0), g.get_pixel(0, 1))
""")
    assert res.error is None, res.traceback
    assert res.lines == ["[(255, 0, 0), (0, 255, 0), (0, 0, 255), (0, 28, 197), (255, 0, 132), (0, 4, 8)]",
                         "248 (0, 0, 0) None",
                         "4 2 75 77"]


def test_draw_string_geometry(tmp_path):
    """8x12 glyphs scaled by a float: 16x24 cells at scale 2, a newline goes back to x and down
    24 + y_spacing 2 (#methods)."""
    res = run(tmp_path, """
import image, lcd
lcd.init()
img = image.Image(size=(80, 60))
img.draw_string(3, 2, "AB\\nC", color=(255, 255, 255), scale=2.0, mono_space=True)
lcd.display(img, oft=(0, 0))
""")
    assert res.error is None, res.traceback
    on = res.frames[0][:60, :80].any(-1)
    ys, xs = np.nonzero(on)
    assert on[2:26, 3:19].any() and on[2:26, 19:35].any() and on[28:52, 3:19].any()
    assert xs.min() >= 3 and xs.max() < 35 and ys.min() >= 2 and ys.max() < 52
    assert not on[28:52, 19:35].any()                         # nothing right of the C


def test_lcd_clear_keyword_is_ignored_and_display_centres(tmp_path):
    res = run(tmp_path, """
import lcd, image
lcd.init()
lcd.clear(color=(255, 0, 0))
img = image.Image(size=(100, 50))
img.draw_rectangle(0, 0, 100, 50, color=lcd.WHITE, fill=True)
img.draw_string(2, 2, "hi")
lcd.display(img)
lcd.draw_string(10, 200, "fps 10", lcd.GREEN, lcd.BLACK)
lcd.display(img, oft=(0, 0))
""")
    assert res.error is None, res.traceback
    cleared, first, second = res.frames
    assert not cleared.any()
    assert first.shape == (240, 320, 3) and not first[:95].any()    # black: clear(color=) ignored
    assert (first[95:145, 110:210] == 255).all() or (first[96:144, 111:209] == 255).all()
    assert res.texts[1] == [(112, 97, "hi"), (10, 200, "fps 10")]
    assert (second[:50, :100] == 255).mean() > 0.9 and (second[95:145, 110:210] == 255).mean() > 0.9
    # display(oft=) does not clear: the centred copy and the lcd text are still on screen
    assert res.texts[2] == [(112, 97, "hi"), (10, 200, "fps 10"), (2, 2, "hi")]


def test_sensor_reset_and_skip_frames_keywords(tmp_path, photo):
    res = run(tmp_path, CAM + """
import time
t = time.ticks_ms()
sensor.skip_frames(n=3)
print(time.ticks_ms() - t)
t = time.ticks_ms()
sensor.skip_frames(3)
print(time.ticks_ms() - t)
sensor.reset(foo=1)
""", images=[photo])
    assert res.error is None, res.traceback
    assert res.lines == PROBE + ["333", "100"] + PROBE   # n= is not read: 300 ms of frames, not 3 frames
    assert any("skip_frames: keyword 'n='" in n for n in res.notes)


# ---------------------------------------------------------------------------------------------
# 3. boot rules (#boot)
def test_boot_folder_runs_boot_then_main_in_one_namespace(tmp_path):
    card = tmp_path / "card"
    card.mkdir()
    (card / "boot.py").write_text("import os\nshared = 'from boot.py'\nprint('boot', os.getcwd())\n"
                                  "raise ValueError('boot.py failed')\n")
    (card / "main.py").write_text("import sys\nprint('main', shared, sys.path)\nimport helper\n"
                                  "print(helper.ANSWER, time.ticks_ms() > 400)\n")
    (card / "helper.py").write_text("ANSWER = 42\n")
    res = run_folder(card, raise_errors=False)
    assert res.lines == ["boot /sd", "Traceback (most recent call last):",
                         '  File "boot.py", line 4, in <module>', "ValueError: boot.py failed",
                         "main from boot.py ['', '.', '/sd', '/flash']", "42 True"]
    res = run_folder(card, raise_errors=False, on="flash")
    assert res.lines[0] == "boot /flash" and res.lines[4].endswith("['', '.', '/flash']")


def test_cli_demo_folder(tmp_path, capsys):
    from tl2k210.cli import main
    card = tmp_path / "card"
    card.mkdir()
    (card / "main.py").write_text("import os\nprint('cwd', os.getcwd(), open('n.txt').read())\n")
    (card / "n.txt").write_text("7")
    rc = main(["demo", str(card), "--out", str(tmp_path / "lcd")])
    out = capsys.readouterr().out
    assert rc == 0 and "cwd /sd 7" in out and "board time" in out


# ---------------------------------------------------------------------------------------------
# 4. board time (#time, #timing)
def test_clock_fps_follows_frames_and_model_latency(tmp_path, photo, face_flash):
    from tl2k210.k210 import cost, kmodel
    est = cost.estimate(kmodel.load(data_path("kmodels", "facedetect_320x240_v3.kmodel"))).ms
    res = run(tmp_path, CAM + """
import KPU as kpu, time
lcd.init()
task = kpu.load(0x300000)
kpu.init_yolo2(task, 0.5, 0.3, 5, (1.889, 2.5245, 2.9465, 3.94056, 3.99987, 5.3658, 5.155437, 6.92275, 6.718375, 9.01025))
clock = time.clock()
while True:
    img = sensor.snapshot()
    clock.tick()
    t = time.ticks_us()
    kpu.run_yolo2(task, img)
    dt = time.ticks_us() - t
    fps = clock.fps()
    t = time.ticks_us()
    lcd.display(img)
    print(dt, fps, time.ticks_us() - t, time.ticks_ms())
""", images=[photo] * 4, flash=face_flash)
    rows = [line.split() for line in after_probe(res)]
    assert len(rows) == 4
    for dt, fps, disp, _ in rows:
        # the cost model's latency + the region layer on the CPU (9000 values, ~1.4 ms)
        assert 0 <= int(dt) / 1000 - est < 2.0
        assert abs(float(fps) - 1000 / int(int(dt) / 1000 + 0.999)) < 4
        assert 11_000 <= int(disp) <= 15_000                          # lcd.display 320x240
    frames = [int(r[3]) for r in rows]
    assert all(b - a in (33, 34) for a, b in zip(frames, frames[1:]))   # one frame period a loop


def test_dual_buffer_returns_a_waiting_frame(tmp_path, photo):
    body = CAM.replace("sensor.reset()", "sensor.reset(dual_buff={d})") + """
import time
sensor.snapshot()
time.sleep_ms(40)
t = time.ticks_us()
sensor.snapshot()
print(time.ticks_us() - t)
"""
    single = run(tmp_path, body.format(d=False), images=[photo] * 2)
    dual = run(tmp_path, body.format(d=True), images=[photo] * 2)
    assert int(after_probe(single)[0]) > 20_000 and int(after_probe(dual)[0]) < 5_000


def test_wall_clock_option(tmp_path):
    body = "import time\nt = time.ticks_ms()\ntime.sleep_ms(200)\nprint(time.ticks_ms() - t)\n"
    t0 = time.perf_counter()
    virtual = run(tmp_path, body)
    t_virtual = time.perf_counter() - t0
    t0 = time.perf_counter()
    wall = run(tmp_path, body, wall_clock=True)
    assert virtual.lines == ["200"] and t_virtual < 0.19 + 1.0
    assert 200 <= int(wall.lines[0]) < 1000 and time.perf_counter() - t0 >= 0.2   # a loaded host


# ---------------------------------------------------------------------------------------------
# 5. board memory (#gc-heap, #kpuload)
def test_runtime_budgets_decide_what_loads(tmp_path):
    mb = data_path("corpus", "kmodels", "onlab__mbnet75.kmodel")
    flash = board.flash_kmodel(mb, tmp_path / "flash.bin", 0x200000)
    body = ("import KPU as kpu, Maix\nprint(Maix.utils.heap_free())\nt = kpu.load(0x200000)\n"
            "print(t.model_size(), Maix.utils.heap_free())\n")
    full = run(tmp_path, body, flash=flash)
    assert full.lines == ["2097152"]
    assert str(full.error) == "[MAIXPY]kpu: load error:2006, ERR_NO_MEM: memory not enough"
    assert any(n.startswith("error 2006: not enough memory for this model under the 'maixpy' "
                            "firmware: model 2.66 MB + KPU buffers 0.19 MB = 2.84 MB > 2.10 MB free")
               and "maixpy-minimum" in n for n in full.notes)
    minimum = run(tmp_path, body, flash=flash, runtime="maixpy-minimum")
    from tl2k210.k210 import kmodel
    main = kmodel.load(mb).main_mem_usage
    assert minimum.error is None and minimum.lines == ["4194304", f"2655688 {4194304 - 2655688 - main}"]


def test_v4_model_on_a_v3_only_build(tmp_path):
    v4 = data_path("kmodels", "yolo20_v4.kmodel")
    flash = board.flash_kmodel(v4, tmp_path / "flash.bin", 0x500000)
    res = run(tmp_path, "import KPU as kpu\nkpu.load(0x500000)\n", flash=flash, runtime="maixpy-minimum")
    assert str(res.error) == "[MAIXPY]kpu: load error:2002, ERR_KMODEL_VERSION: only support kmodel V3 now"
    res = run(tmp_path, "import KPU as kpu\nprint(kpu.load(0x500000).model_size())\n", flash=flash)
    assert res.lines == ["1352232"]


# ---------------------------------------------------------------------------------------------
# 6. loops and watchdog
@pytest.mark.parametrize("loop, kind, wall", [
    ("while True:\n    time.sleep_ms(100)\n", "board", False),
    ("while True:\n    try:\n        pass\n    except:\n        pass\n", "", False),   # either
    ("while True:\n    try:\n        pass\n    except:\n        pass\n", "host", True)])
def test_watchdog_stops_a_script_without_camera_frames(tmp_path, loop, kind, wall):
    """A bare `except:` does not keep the script alive: the board keeps raising the stop."""
    t0 = time.perf_counter()
    res = run(tmp_path, "import time\n" + loop, timeout=1.0, wall_clock=wall)
    assert res.stop == "timeout" and "without a camera frame (--timeout 1)" in res.stop_reason
    assert f"({kind} time)" in res.stop_reason if kind else True
    assert time.perf_counter() - t0 < 20


def test_sigterm_cleans_the_temporary_flash_image(tmp_path):
    km = data_path("kmodels", "facedetect_320x240_v3.kmodel")
    script = tmp_path / "loop.py"
    script.write_text("import KPU as kpu, time\nt = kpu.load(0x300000)\nprint('loaded', flush=True)\n"
                      "while True:\n    time.sleep_ms(1)\n")
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")
    p = subprocess.Popen([sys.executable, "-m", "tl2k210.cli", "demo", str(script), "--kmodel",
                          f"{km}@0x300000", "--wall-clock", "--timeout", "120",
                          "--out", str(tmp_path / "lcd")],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    first = p.stdout.readline()
    flash = first.split("| flash ")[1].split(" |")[0]
    assert os.path.exists(flash)
    assert p.stdout.readline().strip() == "loaded"
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 143 and "SIGTERM" in err
    assert not os.path.exists(flash) and not os.path.exists(os.path.dirname(flash))


# ---------------------------------------------------------------------------------------------
# 7. the persistent board (REPL backend, issue 14)
def test_session_exec_eval_and_soft_reset(tmp_path, face_flash):
    sd = tmp_path / "sd"
    sd.mkdir()
    with Session(sd=sd, flash=face_flash) as s:
        s.boot()
        s.exec("import KPU as kpu\ntask = kpu.load(0x300000)\nx = 41")
        assert s.eval("x + 1") == 42 and s.eval("task.model_size()") == 388776
        s.exec("print('hello', 1/3)")
        t = s.eval("time.ticks_ms()")
        with pytest.raises(NameError):
            s.exec("y")
        s.soft_reset()
        assert s.board.kpu_tasks == [] and s.board.sys_used == 0
        with pytest.raises(NameError) as ei:
            s.exec("x")
        assert s.format_exception(ei.value).endswith("NameError: name 'x' isn't defined\n")
        assert s.eval("time.ticks_ms()") >= t + 200         # ticks keep counting over a reset
        assert s.output().splitlines() == ["hello 0.3333333", "MPY: soft reboot"]


def test_session_interrupt_and_input(tmp_path):
    import threading
    answers = iter(["maix"])
    with Session(wall_clock=True, on_input=lambda prompt: next(answers)) as s:
        s.boot()
        threading.Timer(0.3, s.interrupt).start()
        with pytest.raises(KeyboardInterrupt):
            s.exec("while True:\n    time.sleep_ms(50)\n")
        s.exec("name = input('who? ')\nprint('hi', name)")
        assert s.output().splitlines() == ["who? hi maix"]


# ---------------------------------------------------------------------------------------------
# the KPU API in detail (#kpu)
@pytest.mark.parametrize("fmt", ["v3", "v4"])
def test_get_output_reads_any_output_of_the_last_forward(tmp_path, fmt):
    """Maix_kpu.c's get_output wraps output idx's buffer, which every run fills, whichever index
    forward returned: a BlazeFace script reads scores with forward and boxes with get_output(task,
    1); the host gave None (hunt 22). Both outputs are the emulator's, in the formats' shapes."""
    import onnx
    from onnx import helper

    from front_helpers import make_model, rand
    from tl2k210.compiler import ConvertOptions, convert
    from tl2k210.k210.emulator import Emulator
    n = helper.make_node
    m = make_model([n("Conv", ["x", "w1"], ["a"]), n("Conv", ["x", "w2"], ["b"])], [("x", [1, 3, 8, 8])],
                   [("a", None), ("b", None)], {"w1": rand(2, 3, 1, 1), "w2": rand(5, 3, 1, 1)})
    onnx.save(m, tmp_path / "two.onnx")
    sd = tmp_path / "sd"
    sd.mkdir()
    np.save(tmp_path / "cal.npy", np.random.default_rng(0).uniform(0, 1, (8, 3, 8, 8)).astype(np.float32))
    convert(tmp_path / "two.onnx", sd / "two.kmodel", ConvertOptions(dataset=str(tmp_path / "cal.npy"),
                                                                      format=fmt, progress=False, min_sqnr=0))
    shapes = "kpu.set_outputs(task, 0, 8, 8, 2)\nkpu.set_outputs(task, 1, 8, 8, 5)\n" if fmt == "v4" else ""
    res = run(tmp_path, f"""
import KPU as kpu
import image
task = kpu.load("/sd/two.kmodel")
{shapes}img = image.Image(size=(8, 8))
img.pix_to_ai()
a = kpu.forward(task, img)
b = kpu.get_output(task, 1)
print(a.size(), b.size(), b[0], b[-1])
try:
    kpu.get_output(task, 2)
except OSError as e:
    print("OSError", e)
""", sd=sd)
    assert res.error is None, res.traceback
    outs = Emulator.load(sd / "two.kmodel").run(np.zeros((3, 8, 8), np.uint8))
    size, bsize, first, last = res.lines[0].split()
    assert (int(size), int(bsize)) == (np.asarray(outs[0]).nbytes, np.asarray(outs[1]).nbytes)
    assert float(first) == pytest.approx(float(np.ravel(outs[1])[0]), rel=1e-6)
    assert float(last) == pytest.approx(float(np.ravel(outs[1])[-1]), rel=1e-6)
    assert res.lines[1].startswith("OSError")


def test_kpu_layers_fmaps_netinfo_and_yolo_objects(tmp_path, photo, face_flash):
    from tl2k210.k210.emulator import Emulator
    res = run(tmp_path, CAM + """
import KPU as kpu
task = kpu.load(0x300000)
img = sensor.snapshot()
info = kpu.netinfo(task)
print(len(info), info[0].wi(), info[0].hi(), info[0].chi(), info[0].cho(), info[-1].type())
print(kpu.set_layers(task, 3), kpu.set_layers(task, 99))
fm = kpu.forward(task, img)
print(fm.w(), fm.h(), fm.ch(), fm.size(), fm.index(), fm[0], fm[-1])
ch0 = kpu.fmap(fm, 0)
print(ch0.width(), ch0.height(), ch0.get_pixel(0, 0) == fm[0])
first = fm[:4]
kpu.set_layers(task, 0)
kpu.forward(task, image.Image(size=(320, 240)).to_grayscale() if False else img)
print(kpu.fmap_free(fm), kpu.get_output(task, 0).size())
kpu.init_yolo2(task, 0.5, 0.3, 5, (1.889, 2.5245, 2.9465, 3.94056, 3.99987, 5.3658, 5.155437, 6.92275, 6.718375, 9.01025))
f = kpu.run_yolo2(task, img, "ignored", dma=1)[0]
print(f.rect() == (f.x(), f.y(), f.w(), f.h()), round(f.value(), 3), f.classid(), f.index(), f.objnum())
print(f)
kpu.memtest()
print(kpu.deinit(task))
try:
    kpu.deinit(1)
except TypeError as e:
    print(e)
try:
    kpu.forward(task, img, 0, dam=1)
except TypeError as e:
    print(e)
""", images=[photo], flash=face_flash)
    assert res.error is None, res.traceback
    lines = after_probe(res)
    assert lines[0] == "layer[0]: K210_CONV, wi=320, hi=240, wo=160, ho=120, chi=3, cho=16, dw=0, kernel_type=1, pool_type=1, para_size=432"
    n = len([ln for ln in lines if ln.startswith("layer[")])
    assert n == 24 and lines[n] == "24 320 240 3 16 12"
    assert lines[n + 1:n + 3] == ["err: set layers_length to 99, but max 24", "True False"]
    emu = Emulator.load(data_path("kmodels", "facedetect_320x240_v3.kmodel"))
    from tl2k210.imaging import load_rgb, to_model_input
    _, trace = emu.run(to_model_input(load_rgb(photo), (3, 240, 320), rgb565=True), trace=True)
    layer2 = trace[2][1]                               # the 3rd layer's uint8 (C, H, W) map
    c, h, w = layer2.shape
    assert lines[n + 3] == f"{w} {h} {c} {layer2.size} 2 {layer2.reshape(-1)[0]} {layer2.reshape(-1)[-1]}"
    assert lines[n + 4] == f"{w} {h} True"
    assert lines[n + 5] == "None 36000"
    assert lines[n + 6] == "True 0.935 0 0 1"
    assert lines[n + 7].startswith('{"x":117, "y":23, "w":47, "h":63, "value":0.93')
    assert lines[n + 8].startswith("###free gc heap memory : ") and lines[n + 9].startswith("###free sys heap memory: ")
    assert lines[n + 10:] == ["True", "[MAIXPY]kpu: kpu_net type error", "extra keyword arguments given"]


@pytest.mark.parametrize("blob, code", [
    (b"\xff" * 64, 2002),                                       # erased flash
    ((3).to_bytes(4, "little") + bytes(8) + (1).to_bytes(4, "little") + bytes(8) + (1).to_bytes(4, "little")
     + bytes(8) + (10240).to_bytes(4, "little") + (10 ** 6).to_bytes(4, "little"), 2005),  # truncated
    ((1).to_bytes(4, "little") + bytes(60), 2002),               # legacy kmodel v1
])
def test_kpu_load_error_codes(tmp_path, blob, code):
    fs = tmp_path / "fs"
    fs.mkdir()
    (fs / "m.kmodel").write_bytes(blob)
    res = run(tmp_path, "import KPU as kpu\nkpu.load('/flash/m.kmodel')\n", fs=fs)
    assert f"load error:{code}, " in res.traceback
    assert any(n.startswith(f"error {code}: ") for n in res.notes)


def test_openmv_analysis_methods(tmp_path):
    res = run(tmp_path, """
import image
img = image.Image(size=(60, 40))
img.draw_rectangle(10, 5, 12, 8, color=(255, 0, 0), fill=True)
img.draw_line(0, 39, 59, 9, color=(0, 255, 0), thickness=1)
b = img.find_blobs([(30, 100, 40, 127, 0, 127)], pixels_threshold=20)
print(len(b), b[0].rect(), b[0].pixels(), b[0].cx(), b[0].cy(), b[0][0:4])
line = img.get_regression([(30, 100, -128, -20, 0, 127)])
print(abs(line.x1()) <= 1, abs(line.y1() - 39) <= 1, abs(line.x2() - 59) <= 1, abs(line.y2() - 9) <= 1)
g = img.to_grayscale(copy=True)
h = g.get_histogram()
print(len(h.bins()), h.get_percentile(0.99).value() > 50, g.get_statistics().max())
try:
    img.find_edges(image.EDGE_CANNY)
except OSError as e:
    print(e, hasattr(img, 'morph'), hasattr(img, 'no_such_method'))
""")
    assert res.error is None, res.traceback
    assert res.lines[0] == "1 (10, 5, 12, 8) 96 16 9 (10, 5, 12, 8)"
    assert res.lines[1] == "True True True True"        # the green line's ends (x_stride 2)
    assert res.lines[2].startswith("256 True ")
    # a firmware method the host does not emulate: there, and OSError EOPNOTSUPP with a note
    # (it had been AttributeError, which says the firmware lacks it; round 66's second hunt)
    assert res.lines[3] == "[Errno 95] EOPNOTSUPP True False"
    assert any("find_edges" in n for n in res.notes)


def test_timer_callbacks_and_boot_key_irq(tmp_path, photo):
    """machine.Timer callbacks on the board clock; the BOOT key's IRQ on its scripted edges."""
    res = run(tmp_path, CAM + """
from machine import Timer
from Maix import GPIO
from fpioa_manager import fm
ticks = []
def on_timer(t):
    ticks.append(time.ticks_ms())
tim = Timer(Timer.TIMER0, Timer.CHANNEL0, mode=Timer.MODE_PERIODIC, period=100, unit=Timer.UNIT_MS, callback=on_timer)
fm.register(16, fm.fpioa.GPIOHS0)
key = GPIO(GPIO.GPIOHS0, GPIO.IN, GPIO.PULL_UP)
def on_key(pin):
    print('key', pin.value())
key.irq(on_key, GPIO.IRQ_FALLING)
import time
t0 = time.ticks_ms()
time.sleep_ms(350)
tim.stop()
time.sleep_ms(300)
print(len(ticks), [t - t0 for t in ticks])
while True:
    sensor.snapshot()
""", images=[photo] * 4, button=[2])
    assert after_probe(res) == ["3 [100, 200, 300]", "key 0"]


# ---------------------------------------------------------------------------------------------
# gaps found running MaixPy-v1_scripts (hand-written reproductions)
def test_set_time_moves_the_rtc(tmp_path):
    """modutime.c: set_time((y, m, d, h, mi, s, ...)) sets the RTC; time() and localtime()
    count on from it."""
    res = run(tmp_path, """
import time
print(time.set_time((2017, 4, 25, 15, 40, 51, 1, 115)))
print(time.time(), time.localtime()[:6])
time.sleep(2)
print(time.time(), time.localtime()[:6])
""")
    assert res.error is None, res.traceback
    assert res.lines == ["True", "546450051 (2017, 4, 25, 15, 40, 51)",
                         "546450053 (2017, 4, 25, 15, 40, 53)"]


def test_timer_callback_gets_the_timer_and_arg_is_callback_arg(tmp_path):
    """machine_timer.c: mp_sched_schedule(self->callback, self) -- the callback's argument is
    the Timer even with arg=; the arg is Timer.callback_arg(); period is an int (MP_ARG_INT)."""
    res = run(tmp_path, """
from machine import Timer
import time
def cb(t):
    print(type(t).__name__, t.callback_arg())
tim = Timer(Timer.TIMER0, Timer.CHANNEL0, mode=Timer.MODE_ONE_SHOT, period=100, callback=cb, arg='x')
print(tim.period())
time.sleep_ms(150)
try:
    Timer(Timer.TIMER1, Timer.CHANNEL0, period=1.5, callback=cb)
except TypeError as e:
    print(e)
""")
    assert res.error is None, res.traceback
    assert res.lines == ["100", "Timer x", "can't convert float to int"]


def test_software_i2c_buses_exist(tmp_path):
    """machine_i2c.c (MICROPY_PY_MACHINE_SW_I2C=1 in v0.6.2): I2C3..I2C5 are software buses."""
    res = run(tmp_path, """
from machine import I2C
i2c = I2C(I2C.I2C3, freq=100000, scl=28, sda=29)
print(I2C.I2C3, I2C.I2C5, I2C.MODE_MASTER_SOFT, i2c.scan())
try:
    I2C(6)
except ValueError as e:
    print(e)
""")
    assert res.error is None, res.traceback
    assert res.lines == ["3 5 2 []", "[MAIXPY]I2C: I2C(6) doesn't exist"]


def test_affine_transform_is_a_9_tuple_from_dst_to_src(tmp_path, photo):
    """py_image.c: get_affine_transform returns T as 9 floats mapping a dst point to its src
    point; warp_affine_ai(src, dst, T) takes any 9-sequence and fills dst's AI buffer."""
    res = run(tmp_path, CAM + """
T = image.get_affine_transform([(0, 0), (240, 0), (240, 240)], [(60, 60), (240, 0), (220, 200)])
print(type(T).__name__, len(T), ['%.2f' % v for v in T])
img = sensor.snapshot()
dst = image.Image(size=(64, 64))
dst.pix_to_ai()
image.warp_affine_ai(img, dst, [1.0, 0.0, 100.0, 0.0, 1.0, 20.0, 0.0, 0.0, 1.0])
dst.ai_to_pix()
print(dst.get_pixel(0, 0) == img.get_pixel(100, 20), dst.get_pixel(63, 63) == img.get_pixel(163, 83))
try:
    image.warp_affine_ai(img, image.Image(size=(8, 8)), T)
except ValueError as e:
    print(e)
""", images=[photo])
    assert res.error is None, res.traceback
    assert after_probe(res) == ["tuple 9 ['1.34', '-0.12', '-62.37', '0.12', '1.34', '-56.84', '0.00', "
                         "'0.00', '1.00']", "True True", "only support ai image affine"]


def test_load_flash_reads_a_word_swapped_model(tmp_path, photo):
    """kpu.load_flash(addr, dual, batch, spi): the model at addr is stored 32-bit word-swapped
    (model_le2be.py); it loads and runs like kpu.load of the plain file."""
    from tl2k210.maixpy.KPU import _swap_words
    km = data_path("kmodels", "facedetect_320x240_v3.kmodel").read_bytes()
    km += b"\0" * (-len(km) % 4)
    flash = board.write_flash(tmp_path / "flash.bin", [(0x600000, _swap_words(km))])
    res = run(tmp_path, CAM + """
import KPU as kpu
task = kpu.load_flash(0x600000, 1, 0xC000, 60000000)
kpu.init_yolo2(task, 0.5, 0.3, 5, (1.889, 2.5245, 2.9465, 3.94056, 3.99987, 5.3658, 5.155437, 6.92275, 6.718375, 9.01025))
print(task.model_size() > 0, kpu.run_yolo2(task, sensor.snapshot()) is not None)
""", images=[photo], flash=flash)
    assert res.error is None, res.traceback
    assert res.lines == PROBE + ["True True"]


def test_i2s_record_returns_an_audio_object(tmp_path):
    """Maix_i2s.c: I2S.record(points) returns an audio object of `points` 32-bit samples;
    scripts hand audio.to_bytes() to FFT.run (silence on the host)."""
    res = run(tmp_path, """
from Maix import I2S
rx = I2S(I2S.DEVICE_0)
rx.channel_config(rx.CHANNEL_0, rx.RECEIVER, align_mode=I2S.STANDARD_MODE)
rx.set_sample_rate(16000)
a = rx.record(256)
print(len(a.to_bytes()), set(a.to_bytes()))
""")
    assert res.error is None, res.traceback
    assert res.lines == ["1024 {0}"]


def test_bytes_literals_keep_utf8_as_micropython_does(tmp_path):
    """MicroPython's lexer is 8-bit clean: b'...' with non-ASCII text holds its UTF-8 bytes
    (Sipeed's font demo: img.draw_string(x, y, b'...')); CPython would refuse the script."""
    res = run(tmp_path, """
a = b'\u4f60\u597d'
c = b'x\\n\u00e9'
d = '\u4f60'
print(len(a), a[0], len(c), c[1], len(d), rb'\\n' == b'\\\\n')
""")
    assert res.error is None, res.traceback
    assert res.lines == ["6 228 4 10 1 True"]


def test_a_filesystem_on_a_script_block_device_says_it_is_not_emulated(tmp_path):
    """uos.VfsSpiffs / VfsFat over a script's own block device (Sipeed's RAM-disk demo): an
    OSError the script can catch and a note, not CPython's 'object() takes no arguments'."""
    res = run(tmp_path, """
import uos
class RAMBlockDev:
    def __init__(self, n):
        self.data = bytearray(n * 512)
try:
    fs = uos.VfsSpiffs(RAMBlockDev(64))
except OSError as e:
    print('OSError', e.args[0] == 95)
""")
    assert res.error is None, res.traceback
    assert res.lines == ["OSError True"]
    assert any("VfsSpiffs" in n for n in res.notes)


def test_an_lcd_loop_without_the_camera_stops_after_its_frames(tmp_path):
    """Sipeed's LCD animations loop on lcd.display() and never take a camera frame: the run
    stops after 100 LCD frames, not one PNG per frame until the watchdog (1,769 in 20 s)."""
    from tl2k210.maixpy.runner import run_script
    script = tmp_path / "anim.py"
    script.write_text("import lcd, image\nlcd.init()\nimg = image.Image()\ni = 0\nwhile True:\n"
                      "    img.draw_rectangle(i % 300, 10, 10, 10, fill=True)\n    lcd.display(img)\n    i += 1\n")
    res = run_script(script, out=tmp_path / "out")
    assert res.error is None and res.stop == "lcd" and len(res.frames) == len(res.pngs) == 100


def test_fft_freq_amplitude_and_run(tmp_path):
    """Maix.FFT (Maix_fft.c): freq and amplitude in the firmware's integers; run on a 32-bit
    sample buffer (low 16 bits real) finds a tone in its bin; shift halves per selected stage."""
    res = run(tmp_path, """
from Maix import FFT
import math, struct
print(FFT.freq(64, 16000)[:3])
print(FFT.amplitude([(3, 4), (-6, 8), (0, 0), (1, 1)]))
buf = b''.join(struct.pack('<I', int(1000 * math.cos(2 * math.pi * 8 * i / 64)) & 0xFFFF) for i in range(64))
out = FFT.run(buf, 64)
amp = FFT.amplitude(out)
print(len(out), amp.index(max(amp)), out[8][0], FFT.run(buf, 64, 0b111111)[8][0])
try:
    FFT.run(buf, 100)
except ValueError as e:
    print(e)
""")
    assert res.error is None, res.traceback
    assert res.lines == ["[0, 250, 500]", "[2, 5, 0, 0]", "64 8 31997 499", "[MAIXPY]FFT:invalid points"]

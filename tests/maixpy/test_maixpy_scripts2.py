"""Departures from MaixPy v0.6.2 found by running the rest of Sipeed's MaixPy-v1_scripts on the
host (round 44), each reproduced by a small hand-written board script. The firmware source each
behaviour follows is named in the docstring (sipeed/MaixPy-v1, and MicroPython 1.11 for the core)."""

import numpy as np

from test_maixpy_runtime import CAM, PROBE, after_probe, photo, run  # noqa: F401  (the board-script runner and the photo fixture)


def test_bytearray_and_struct_s_take_a_str(tmp_path):
    """objarray.c bytearray_make_new / array_construct: one non-int argument is read through
    the buffer protocol, which a str has (its UTF-8 bytes); modstruct.c packs an 's' item from
    any buffer, a str included. CPython refuses both."""
    res = run(tmp_path, """
import ustruct
b = bytearray('h\\u00e9')
print(b, type(b) == bytearray, isinstance(b, bytearray), bytearray('ab', 'utf-8'), bytearray(2))
print(ustruct.pack('>H3sH', 1, 'abc', 2), ustruct.pack('>sB', 'B', 7), ustruct.pack('2s', b'xy'))
""")
    assert res.error is None, res.traceback
    assert res.lines == ["bytearray(b'h\\xc3\\xa9') True True bytearray(b'ab') bytearray(b'\\x00\\x00')",
                         "b'\\x00\\x01abc\\x00\\x02' b'B\\x07' b'xy'"]


def test_yuv422_is_the_rgb565_camera_mode(tmp_path, photo):
    """sensor.c sensor_set_pixformat (v0.6.2): on the OV2640/OV7740/GC0328 RGB565 falls
    through to PIXFORMAT_YUV422 -- both set DVP_CFG_YUV_FORMAT -- so YUV422 is accepted and
    snapshot() gives the same RGB565 frame; BAYER is refused."""
    res = run(tmp_path, """
import sensor
sensor.reset()
print(sensor.set_pixformat(sensor.YUV422))
sensor.set_framesize(sensor.QVGA)
a = sensor.snapshot()
print(a.width(), a.height(), a.format() == sensor.RGB565)
try:
    sensor.set_pixformat(sensor.BAYER)
except OSError as e:
    print(e)
""", images=[photo])
    assert res.error is None, res.traceback
    assert res.lines == PROBE + ["True", "320 240 True", "Pixel format is not supported!"]


def test_draw_font_draws_a_bitmap_glyph(tmp_path):
    """py_image.c py_image_draw_font / font.c imlib_draw_font (v0.6.2): w x h bits, rows of
    8-column bands h bytes apart (font[y] is columns 0-7, font[y + h] columns 8-15); scale
    repeats pixels (fast_roundf truncates); w must be a multiple of 8 and the length match."""
    res = run(tmp_path, """
import image
img = image.Image(size=(40, 40))
img.draw_font(0, 0, 8, 8, b'\\x81' + bytes(6) + b'\\x01', color=(255, 255, 255))
print([(x, y) for y in range(8) for x in range(8) if img.get_pixel(x, y)[0]])
g = bytearray(32)
g[0], g[16], g[31] = 0x80, 0x01, 0x01
img = image.Image(size=(40, 40))
img.draw_font(2, 3, 16, 16, bytes(g), scale=2, color=(255, 0, 0))
print([(x, y) for y in range(40) for x in range(40) if img.get_pixel(x, y)[0]])
try:
    img.draw_font(0, 0, 12, 8, bytes(8))
except OSError as e:
    print(e)
""")
    assert res.error is None, res.traceback
    assert res.lines == [
        "[(0, 0), (7, 0), (7, 7)]",
        "[(2, 3), (3, 3), (32, 3), (33, 3), (2, 4), (3, 4), (32, 4), (33, 4), "
        "(32, 33), (33, 33), (32, 34), (33, 34)]",
        "Error: font arg_w_font %% 8 == 0 && arg_w_font <= 32!"]   # the firmware's literal %%


def test_i2s_play_takes_an_audio_object_and_audio_records_a_wav(tmp_path):
    """Maix_i2s.c Maix_i2s_play plays an audio object (what record() returns) and
    wait_record() exists; py_audio.c Audio(path=, is_create=True, samplerate=) opens the file,
    record(a) appends the low 16 bits of each 32-bit sample, wav.c wav_finish writes the
    header (2 channels, 16 bits) and prints its fields."""
    sd = tmp_path / "sd"
    sd.mkdir()
    res = run(tmp_path, """
from Maix import I2S
import audio, time
rx = I2S(I2S.DEVICE_0)
rx.channel_config(I2S.CHANNEL_0, I2S.RECEIVER)
rx.set_sample_rate(16000)
tx = I2S(I2S.DEVICE_2)
tx.channel_config(I2S.CHANNEL_1, I2S.TRANSMITTER)
tx.set_sample_rate(16000)
rec = audio.Audio(path='/sd/r.wav', is_create=True, samplerate=16000)
t0 = time.ticks_ms()
for i in range(3):
    a = rx.record(1600)
    rx.wait_record()
    tx.play(a)
    rec.record(a)
print(time.ticks_diff(time.ticks_ms(), t0) // 100)
rec.finish()
""", sd=sd)
    assert res.error is None, res.traceback
    assert res.lines == ["6", "[MAIXPY]: numchannels = 2", "[MAIXPY]: samplerate = 16000",
                         "[MAIXPY]: byterate = 64000", "[MAIXPY]: blockalign = 4",
                         "[MAIXPY]: bitspersample = 16"]
    import wave
    with wave.open(str(sd / "r.wav")) as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate(), w.getnframes()) == \
            (2, 2, 16000, 3 * 1600 * 2 // 4)


def test_a_thread_ends_quietly_when_the_run_stops(tmp_path, monkeypatch):
    """modthread.c: a _thread runs until the board stops; when the host stops the run (here
    the watchdog) a sleeping thread ends with it, not with a host traceback from threading."""
    import threading
    import time
    escaped = []
    monkeypatch.setattr(threading, "excepthook", lambda a: escaped.append(a.exc_type.__name__))
    res = run(tmp_path, """
import _thread, time
def f(name):
    while True:
        time.sleep(1)
_thread.start_new_thread(f, ('a',))
while True:
    time.sleep_ms(10)
""", timeout=2)
    time.sleep(0.3)
    assert res.error is None and res.stop == "timeout", (res.stop, res.traceback)
    assert escaped == []


def test_fpioa_moves_a_function_and_fm_is_the_frozen_module(tmp_path):
    """Kendryte SDK fpioa.c fpioa_set_function: a function lives on one pin (setting it on
    another frees the old one) and FUNC_RESV0 frees a pin, so fm.unregister(pin) frees its
    function; Maix_fpioa.c checks pin/function ranges; builtin_py/fpioa_manager.py (frozen):
    register(..., force=False) raises Exception with the '[Warning] ...' text."""
    res = run(tmp_path, """
from fpioa_manager import fm
from Maix import FPIOA
fm.register(12, fm.fpioa.GPIOHS0)
fm.register(13, fm.fpioa.GPIOHS0)
print(fm.get_pin_by_function(fm.fpioa.GPIOHS0))
fm.unregister(13)
print(fm.get_pin_by_function(fm.fpioa.GPIOHS0), fm.get_gpio_used()[0])
fm.register(12, fm.fpioa.GPIO0)
try:
    fm.register(13, fm.fpioa.GPIO0, force=False)
except Exception as e:
    print(type(e).__name__, e)
fm.register(12, fm.fpioa.GPIOHS1)
print(fm.get_pin_by_function(fm.fpioa.GPIO0), fm.get_pin_by_function(fm.fpioa.GPIOHS1))
try:
    FPIOA().set_function(49, fm.fpioa.GPIO1)
except ValueError as e:
    print(e)
""")
    assert res.error is None, res.traceback
    assert res.lines == ["[Warning] function is used by fm.fpioa.GPIOHS0(pin:12)", "13",
                         "None ('fm.fpioa.GPIOHS0', None)",
                         "Exception [Warning] function is used by fm.fpioa.GPIO0(pin:12)",
                         "None 12", "Don't have this Pin"]


def test_const_folds_without_import_and_tabs_count_to_8(tmp_path):
    """py/parse.c (MICROPY_COMP_CONST): `X = const(int)` folds at parse time without an
    import, later uses of X anywhere (methods included) are the int, a leading '_' name is not
    assigned, a non-int is 'constant must be an integer'; py/lexer.c moves a tab to the next
    multiple of 8 columns, so tab/space-mixed indentation that agrees compiles."""
    res = run(tmp_path, """
_A = const(0x10)
B = const(_A << 2)
class K:
    _C = const(3)
    def f(self):
        return _C + _A
print(B, K().f(), 'B' in globals(), '_A' in globals())
if True:
\tx = 1
        y = 2
print(x, y)
try:
    exec("Z = const('a')")
except SyntaxError as e:
    print(e)
""")
    assert res.error is None, res.traceback
    assert res.lines == ["64 19 True False", "1 2", "constant must be an integer"]


def test_modules_onewire_on_an_empty_bus_and_no_htpa(tmp_path):
    """v0.6.2 modules/py_modules.c has onewire (py_onewire.c): onewire(fpioa function) needs
    the function on a pin ('gpio error'); with no device the pulled-up line gives reset()
    False, bits 1, search() []; crc8 is the Dallas CRC. htpa is not in the default build."""
    res = run(tmp_path, """
from fpioa_manager import fm
from modules import onewire
try:
    onewire(fm.fpioa.GPIOHS2)
except ValueError as e:
    print(e)
fm.register(14, fm.fpioa.GPIOHS2)
ow = onewire(fm.fpioa.GPIOHS2)
print(ow.reset(), ow.readbyte(), ow.readbuffer(2), ow.search(65), ow.writebyte(0xCC))
print(ow.crc8(b'\\x28\\xff\\x4b\\x6e\\x91\\x16\\x04'), ow.crc8(b'\\x02\\x1c\\xb8\\x01\\x00\\x00\\x00'))
try:
    from modules import htpa
except ImportError as e:
    print(e)
""")
    assert res.error is None, res.traceback
    assert res.lines == ["gpio error", "False 255 bytearray(b'\\xff\\xff') [] None",
                         "%d 162" % _dallas_crc8(b"\x28\xff\x4b\x6e\x91\x16\x04"),
                         "cannot import name htpa"]


def _dallas_crc8(data):
    crc = 0
    for byte in data:
        for _ in range(8):
            mix = (crc ^ byte) & 1
            crc >>= 1
            if mix:
                crc ^= 0x8C
            byte >>= 1
    return crc


def test_a_gpio_object_is_callable(tmp_path):
    """Maix_gpio.c Maix_gpio_call (the type's .call): pin() reads, pin(x) writes with
    mp_obj_is_true, at most one argument, no keywords -- value() is the same function."""
    res = run(tmp_path, """
from Maix import GPIO
from fpioa_manager import fm
fm.register(12, fm.fpioa.GPIOHS3)
p = GPIO(GPIO.GPIOHS3, GPIO.OUT)
print(p(1), p(), p(0), p(), p('x'), p.value())
try:
    p(1, 2)
except TypeError as e:
    print('TypeError')
""")
    assert res.error is None, res.traceback
    assert res.lines == ["None 1 None 0 None 1", "TypeError"]
    assert [w[1:] for w in res.board.gpio_log] == [(3, 1), (3, 0), (3, 1)]


def test_network_has_wiznet5k(tmp_path):
    """v0.6.2's default build has network.WIZNET5K (config_defaults.mk
    CONFIG_MAIXPY_WIZNET5K_ENABLE=y; modnwwiznet5k.c wiznet5k_make_new_helper checks spi and
    cs); past those checks the emulated board has no network, as for ESP32_SPI."""
    res = run(tmp_path, """
import network
from machine import SPI
spi = SPI(4, mode=SPI.MODE_MASTER, baudrate=600000, sck=21, mosi=8, miso=15)
for kw in ({'spi': 1}, {'spi': spi, 'cs': 40}, {'spi': spi, 'cs': 20}):
    try:
        network.WIZNET5K(**kw)
    except Exception as e:
        print(type(e).__name__, e)
""")
    assert res.error is None, res.traceback
    assert res.lines == ["TypeError [MAIXPY]spi: object type error", "ValueError CS value error",
                         "OSError [Errno 113] EHOSTUNREACH"]


def test_video_open_checks_then_says_avi_is_not_emulated(tmp_path):
    """video/py_video.c py_video_open (v0.6.2 default build): a non-.avi path is
    NotImplementedError, a missing file to play the file system's ENOENT; AVI playback and
    recording are not emulated on the host: OSError 95 (MicroPython's name EOPNOTSUPP) with a
    note, where the host used to hand back an object that silently did nothing."""
    res = run(tmp_path, """
import video
for args, kw in ((('/sd/a.mp4',), {}), (('/sd/none.avi',), {}), (('/sd/rec.avi',), {'record': True})):
    try:
        video.open(*args, **kw)
    except Exception as e:
        print('OSError' if isinstance(e, OSError) else type(e).__name__, e)
try:
    video.open('/sd/rec.avi', fps=5)
except TypeError as e:
    print(e)
""", sd=tmp_path)
    assert res.error is None, res.traceback
    assert res.lines == ["NotImplementedError [MaixPy] video: format not support",
                         "OSError [Errno 2] ENOENT", "OSError [Errno 95] EOPNOTSUPP",
                         "extra keyword arguments given"]
    assert any("AVI recording is not emulated" in n for n in res.notes)


def test_mic_array_get_dir_and_a_clear_error_for_the_closed_map(tmp_path):
    """Maix_mic_array.c (v0.6.2): get_map() needs init() (ETIMEDOUT after 100 ms otherwise);
    the map itself comes from the closed lib_mic, so the host says it cannot emulate it
    (OSError EOPNOTSUPP + note); get_dir(img) is the open 12-sector average (sum cast to uint8,
    capped at 15) of a 16x16 grayscale image; set_led takes 12 brightnesses and an RGB."""
    res = run(tmp_path, """
from Maix import MIC_ARRAY as mic
import image
try:
    mic.get_map()
except OSError as e:
    print(e)
print(mic.init())
try:
    mic.get_map()
except OSError as e:
    print(e)
img = image.Image(size=(16, 16)).to_grayscale()
for i in (197, 198, 199, 213):
    img.set_pixel(i % 16, i // 16, 70)
for i in (0, 1, 2, 3, 16):
    img.set_pixel(i % 16, i // 16, 255)
print(mic.get_dir(img), mic.set_led(mic.get_dir(img), (0, 0, 255)))
try:
    mic.get_dir(image.Image(size=(16, 8)).to_grayscale())
except ValueError as e:
    print(e)
""")
    assert res.error is None, res.traceback
    assert res.lines == ["[Errno 110] ETIMEDOUT", "True", "[Errno 95] EOPNOTSUPP",
                         "(1, 0, 0, 0, 12, 0, 0, 0, 0, 0, 0, 0) True",   # 280 & 255 // 14, 1275 & 255 // 20
                         "image type error, only support 16*16 grayscale image"]
    assert any("closed lib_mic" in n for n in res.notes)


def test_lcd_init_has_no_lcd_type_keyword_and_five_types(tmp_path):
    """v0.6.2 omv/py/py_lcd.c py_lcd_init: mp_arg_parse_all over type..clk -- there is no
    lcd_type keyword (a panel's lcd_type is read from config.json) -- and the type enum ends at
    LCD_TWATCH (4): anything else is ValueError 'type error'."""
    res = run(tmp_path, """
import lcd
for kw in ({'type': 5}, {'type': 1, 'lcd_type': 3}):
    try:
        lcd.init(**kw)
    except Exception as e:
        print(type(e).__name__, e)
lcd.init(type=4)
print(lcd.width(), lcd.height())
""")
    assert res.error is None, res.traceback
    assert res.lines == ["ValueError type error", "TypeError extra keyword arguments given",
                         "240 240"]


def test_binocular_reset_initialises_the_camera(tmp_path, photo):
    """py_sensor.c py_binocular_sensor_reset (v0.6.2) resets a binocular module; sensor.c
    sensor_shutdown only drives PWDN, which there selects the sensor, so frames keep coming
    after shutdown(True) -- the host used to leave the camera uninitialised ('Not init!')."""
    res = run(tmp_path, """
import sensor
sensor.binocular_reset()
sensor.shutdown(False)
sensor.set_pixformat(sensor.RGB565)
sensor.set_framesize(sensor.QVGA)
sensor.shutdown(True)
sensor.run(1)
a = sensor.snapshot()
sensor.shutdown(False)
b = sensor.snapshot()
print(a.width(), b.height())
""", images=[photo, photo])
    assert res.error is None, res.traceback
    # binocular_sensor_reset: the bus line and binocular_sensor_scan's chip line only
    assert res.lines == ["init i2c2", "[MAIXPY]: find ov2640", "320 240"]


def test_pye_mp_is_frozen_and_says_the_editor_is_not_emulated(tmp_path):
    """v0.6.2 freezes builtin_py/pye_mp.py (the full-screen editor): `from pye_mp import pye`
    works on a board; running the interactive editor is not emulated -- a clear OSError."""
    res = run(tmp_path, """
from pye_mp import pye
try:
    pye('/flash/boot.py')
except OSError as e:
    print(e)
""")
    assert res.error is None, res.traceback
    assert res.lines == ["[Errno 95] EOPNOTSUPP"]
    assert any("full-screen editor" in n for n in res.notes)


def test_nes_imports_and_says_its_emulator_is_not_emulated(tmp_path):
    """v0.6.2's default build has the nes module (py_nes.c: init, load, loop, free, input,
    INPUT/KEYBOARD/JOYSTICK), so `import nes` works; the NES emulator is not emulated on the
    host: a clear OSError with a note, not an ImportError a board would not raise."""
    res = run(tmp_path, """
import nes
print(nes.KEYBOARD, nes.JOYSTICK)
try:
    nes.init(nes.KEYBOARD)
except OSError as e:
    print(e)
""")
    assert res.error is None, res.traceback
    assert res.lines == ["1 2", "[Errno 95] EOPNOTSUPP"]
    assert any("NES emulator" in n for n in res.notes)


def test_kpu_classifier_load_checks_then_says_not_emulated(tmp_path):
    """Maix_kpu_classifier.c (v0.6.2): classifier is a type whose locals hold load(model, path
    [, class_num, sample_num]); it checks 'must be model' / 'path err', then the closed library
    would load the file -- the host says it cannot (was: 'function' has no attribute 'load')."""
    from conftest import data_path
    from tl2k210.maixpy import board
    km = data_path("kmodels", "facedetect_320x240_v3.kmodel")
    flash = board.flash_kmodel(km, tmp_path / "flash.bin", 0x300000)
    res = run(tmp_path, """
import KPU as kpu
m = kpu.load(0x300000)
for a in ((1, 'x.classifier'), (m, 3)):
    try:
        kpu.classifier.load(*a)
    except ValueError as e:
        print(e)
try:
    kpu.classifier.load(m, '3_classes.classifier')
except OSError as e:
    print(e)
""", flash=flash)
    assert res.error is None, res.traceback
    assert res.lines == ["must be model", "path err", "[MAIXPY]kpu: classifier not emulated on the host"]


def test_draw_string_takes_bytes_as_the_firmware(tmp_path):
    """font.c imlib_draw_string (v0.6.2) reads the text with mp_obj_str_get_str, which takes
    a str or a bytes object (py/objstr.c); bytes draw as the same characters, a bytearray is
    refused with bad_implicit_conversion's text (MICROPY_ERROR_REPORTING_DETAILED)."""
    res = run(tmp_path, """
import image
a = image.Image(size=(80, 20))
b = image.Image(size=(80, 20))
a.draw_string(2, 2, 'hi 42', color=(255, 255, 255))
b.draw_string(2, 2, b'hi 42', color=(255, 255, 255))
print(a.get_statistics().mean() > 0, all(a.get_pixel(x, y) == b.get_pixel(x, y) for x in range(80) for y in range(20)))
try:
    b.draw_string(2, 2, bytearray(b'x'))
except TypeError as e:
    print(e)
""")
    assert res.error is None, res.traceback
    assert res.lines == ["True True", "can't convert 'bytearray' object to str implicitly"]


def test_a_native_object_prints_as_its_type_name(tmp_path):
    """py/obj.c mp_obj_print_helper: an object of a native type without a print slot prints
    as <TypeName> (record_wav.py prints its I2S, the socket demos their socket): not the host's
    '<tl2k210.maixpy.periph.I2S object at 0x...>'. repr() too; an instance of the script's own
    class is '<A object at 3ffd5e30>' (py/objtype.c), not '<__main__.A object at 0x...>'."""
    res = run(tmp_path, """
from Maix import I2S
import socket
i = I2S(I2S.DEVICE_0)
print(i, repr(i), [i], socket.socket())
class A:
    pass
a = A()
print(repr(a) == '<A object at %x>' % id(a), a)
""")
    assert res.error is None, res.traceback
    assert res.lines[0] == "<I2S> <I2S> [<I2S>] <socket>"
    assert res.lines[1].startswith("True <A object at ")


def test_an_os_error_is_of_type_oserror(tmp_path):
    """MicroPython 1.11 has OSError only: a missing file's error is an OSError whose args[0] is
    ENOENT (py/mperrno.h), where CPython's OSError(2, ...) makes a FileNotFoundError that a
    script's type(e) shows (and whose name MicroPython would not even know)."""
    res = run(tmp_path, """
import uos
for f in (lambda: open('/sd/none.txt'), lambda: uos.stat('/flash/none'), lambda: uos.remove('/sd/none')):
    try:
        f()
    except OSError as e:
        print(type(e).__name__, type(e) is OSError, e.args[0], e)
""")
    assert res.error is None, res.traceback
    assert res.lines == ["OSError True 2 [Errno 2] ENOENT"] * 3


def test_lcd_rotation_keeps_the_panels_pixels_and_draw_string_bounds_are_configured(tmp_path):
    """Sipeed's hardware/demo_lcd.py: v0.6.2 py_lcd_rotation only sets the panel's scan
    direction, so its memory keeps what clear(RED) wrote (the host cleared it to black when the
    rotation turned the screen); py_lcd_draw_string bounds x by the configured width and y by
    that width - 16 (HEAD lcd_para.width, not swapped by rotation) and reads x, y as
    uint16, so a negative x wraps and draws nothing."""
    res = run(tmp_path, """
import lcd
lcd.init()
lcd.clear(lcd.RED)
lcd.rotation(1)
print(lcd.width(), lcd.height())
lcd.draw_string(10, 10, "rot1", lcd.WHITE, lcd.RED)
lcd.draw_string(10, 300, "y 300", lcd.WHITE, lcd.BLUE)
lcd.draw_string(10, 305, "y 305", lcd.WHITE, lcd.BLUE)
lcd.draw_string(-10, 20, "x -10", lcd.WHITE, lcd.BLUE)
""")
    assert res.error is None, res.traceback
    assert res.lines == ["240 320"]
    frame = res.frames[-1]
    assert frame.shape == (320, 240, 3) and (frame[100:200] == (255, 0, 0)).all()    # red, turned
    assert [t[2] for t in res.texts[-1]] == ["rot1", "y 300"]


def test_socket_without_a_network_object_has_no_nic(tmp_path):
    """modusocket.c: connect, bind and sendto first pick the network interface for the address
    (socket_select_nic), and with no network.* object made there is none: OSError('no available
    NIC'), the board's message (Sipeed's socket demos on a board without Wi-Fi set up)."""
    res = run(tmp_path, """
import usocket
s = usocket.socket()
for f, a in ((s.connect, (('192.168.0.2', 80),)), (s.bind, (('0.0.0.0', 80),)), (s.sendto, (b'x', ('1.2.3.4', 5)))):
    try:
        f(*a)
    except OSError as e:
        print(e)
""")
    assert res.error is None, res.traceback
    assert res.lines == ["no available NIC"] * 3


def test_gpio_out_of_range_is_an_invalid_pin(tmp_path):
    """Maix_gpio.c mp_maixpy_pin_make_new: an id outside the 40 GPIO objects is
    ValueError('invalid pin') (Sipeed's chainable RGB LED demo on a board without that wiring)."""
    res = run(tmp_path, """
from Maix import GPIO
try:
    GPIO(40, GPIO.OUT)
except ValueError as e:
    print(e)
""")
    assert res.error is None, res.traceback
    assert res.lines == ["invalid pin"]


def test_conv3_is_the_kpus_3x3_conv_of_each_plane(tmp_path, photo):
    """Sipeed's machine_vision/demo_image_deal.py: img.conv3(kern) (v0.6.2 py_image.c ->
    conv.c imlib_conv3 -> sipeed_conv.c) convolves each colour plane of the AI buffer with the 3x3
    kernel on the KPU (16-bit weights), in place, and rebuilds the pixels; the host raised
    AttributeError. The KPU layer's result is the float convolution clipped to 0..255 within a
    level of the KPU's rounding; an identity kernel gives the snapshot back; an image without an
    AI buffer prints the firmware's message and stays as it was."""
    from tl2k210.maixpy.image import _sipeed_conv3
    r = np.random.default_rng(0)
    ai = r.integers(0, 256, (3, 20, 70), dtype=np.uint8)
    xp = np.pad(ai.astype(np.float64), ((0, 0), (1, 1), (1, 1)))
    for k in ((0, 0, 0, 0, 1, 0, 0, 0, 0), (-1, -1, -1, -1, 8, -1, -1, -1, -1), (2, 0, 0, 0, -1, 0, 0, 0, -1),
              [1 / 9] * 9, (0.5, -0.25, 0, 1.5, 0.1, 0, 0, 0, -2)):
        kk = np.asarray(k, np.float64).reshape(3, 3)
        ref = sum(kk[dy, dx] * xp[:, dy:dy + 20, dx:dx + 70] for dy in range(3) for dx in range(3))
        got = _sipeed_conv3(ai, k).astype(np.float64)
        assert np.abs(got - np.clip(ref, 0, 255)).max() <= 1.0, k
    np.testing.assert_array_equal(_sipeed_conv3(ai, (0, 0, 0, 0, 1, 0, 0, 0, 0)), ai)
    res = run(tmp_path, CAM + """
img = sensor.snapshot()
before = img.copy()
img.conv3((0,0,0, 0,1,0, 0,0,0))
print(img.get_pixel(100, 100) == before.get_pixel(100, 100))
img.conv3(kern=(-1,-1,-1,-1,8,-1,-1,-1,-1))
print(img.get_pixel(100, 100) != before.get_pixel(100, 100))
img = image.Image(size=(8, 8))
img.conv3(kern=(0,0,0, 0,1,0, 0,0,0))
img.conv3()
""", images=[photo])
    assert res.error is None, res.traceback
    assert after_probe(res) == ["True", "True", "pix_ai or pixels is NULL!", "please input 9 kern parm!"]

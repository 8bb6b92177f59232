"""Departures from MaixPy v0.6.2 found by running the rest of Sipeed's MaixPy-v1_scripts on the
host (round 44), each reproduced by a small hand-written board script. The firmware source each
behaviour follows is named in the docstring (sipeed/MaixPy-v1, and MicroPython 1.11 for the core)."""
import pytest

from tl2k210.maixpy import run_script


def run(tmp_path, body, name="main.py", **kw):
    p = tmp_path / name
    p.write_text(body)
    kw.setdefault("raise_errors", False)
    return run_script(p, **kw)


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


@pytest.fixture(scope="module")
def photo(tmp_path_factory):
    skdata = pytest.importorskip("skimage.data")
    from PIL import Image
    p = tmp_path_factory.mktemp("photo") / "astronaut.png"
    Image.fromarray(skdata.astronaut()).save(p)
    return p


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
    assert res.lines == ["True", "320 240 True", "Pixel format is not supported!"]

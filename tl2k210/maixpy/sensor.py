"""MaixPy `sensor` module on the host: the camera sees the board's queue of photos
(docs/maixpy-firmware.md#sensor, #timing).

`snapshot()` takes the next photo, resizes it to the frame size (bilinear), applies the window
(`set_windowing`: on the OV2640/OV7740 the DVP captures the TOP-LEFT w x h - issue #191 - only
GC0328 centres it; Board(camera=...)), mirror and flip, and delivers it in the pixel format
(RGB565 as the sensor quantises it, or grayscale), with the KPU AI buffer filled as the DVP does.
The image IS the frame buffer: without dual_buff every snapshot reuses the same buffer, so an
earlier Image changes under you, as on a board. After the last photo the run ends (BoardStop).

Timing (timing.py): frames end every FRAME_US from set_framesize; single buffer: snapshot waits
for the next frame end; dual_buff: returns at once when a finished frame is waiting. Then the
RGB565 byte swap. reset/snapshot/skip_frames read their options from keywords only, and ignore
unknown ones (one host note each).
"""
from __future__ import annotations

import numpy as np
from PIL import Image as _PIL

from tl2k210.maixpy import args as A
from tl2k210.maixpy import board as _board
from tl2k210.maixpy import image as _image
from tl2k210.maixpy import timing

BAYER, RGB565, YUV422, GRAYSCALE, JPEG = 1, 2, 3, 4, 5

FRAMESIZES = {   # code: (name, w, h)  (the firmware's resolution table)
    1: ("QQCIF", 88, 72), 2: ("QCIF", 176, 144), 3: ("CIF", 352, 288), 4: ("QQSIF", 88, 60),
    5: ("QSIF", 176, 120), 6: ("SIF", 352, 240), 7: ("QQQQVGA", 40, 30), 8: ("QQQVGA", 80, 60),
    9: ("QQVGA", 160, 120), 10: ("QVGA", 320, 240), 11: ("VGA", 640, 480),
    12: ("HQQQVGA", 60, 40), 13: ("HQQVGA", 120, 80), 14: ("HQVGA", 240, 160),
    15: ("B64X32", 64, 32), 16: ("B64X64", 64, 64), 17: ("B128X64", 128, 64),
    18: ("B128X128", 128, 128), 19: ("B240X240", 240, 240), 20: ("LCD", 128, 160),
    21: ("QQVGA2", 128, 160), 22: ("WVGA", 720, 480), 23: ("WVGA2", 752, 480),
    24: ("SVGA", 800, 600), 25: ("SXGA", 1280, 1024), 26: ("UXGA", 1600, 1200),
}
MAX_K210 = (640, 480)
SENSOR_IDS = {"ov2640": 0x2642, "ov7740": 0x7742, "gc0328": 0x9D}
DUAL_BUFF_BYTES = 384 * 1024


class State:
    def __init__(self):
        self.reset_done = False
        self.pixformat = 0
        self.framesize = 0
        self.window = None          # (x, y, w, h) as the script asked
        self.hmirror = self.vflip = False
        self.running = False
        self.dual = False
        self.binocular = False      # binocular_reset: two sensors, PWDN selects one
        self.t0 = 0                 # capture start (board us)
        self.last_frame = -1        # index of the frame last returned
        self.fbs = [None, None]
        self.fb_i = 0


def _s() -> State:
    b = _board.current()
    if b.sensor is None:
        b.sensor = State()
    return b.sensor


def reset(*args, **kwargs):
    A.ignore_unknown("sensor.reset", kwargs, {"freq", "set_regs", "dual_buff", "choice"})
    b = _board.current()
    lines, found = _probe_lines(b, choice=A.get_int(kwargs.get("choice", 0)))
    _say(lines)
    if not found:
        b.sensor = State()        # sensor.reset_set stays false: snapshot says "Not init!"
        b.clock.advance(100_000)
        b.note(f"sensor.reset(choice=...): the emulated board's camera is {b.camera} "
               "(Board(camera=...))", "choice")
        raise OSError("Reset Failed")
    _reset(b, kwargs)
    return None


def _reset(b, kwargs):
    old = _s()
    st = State()
    st.reset_done = True
    st.dual = bool(kwargs.get("dual_buff", False))
    if old.dual:
        b.sys_used -= DUAL_BUFF_BYTES
    if st.dual:
        b.sys_used += DUAL_BUFF_BYTES
    b.sensor = st
    b.clock.advance(100_000)      # I2C probe + register upload


#: what sensor.c (v0.6.2) prints while it probes each emulated camera: sensro_ov_detect's
#: "find <chip>" and sensor_init_dvp's "find ov sensor", or sensro_gc_detect's id and name
_PROBE = {"ov2640": "[MAIXPY]: find ov2640\n[MAIXPY]: find ov sensor\n",
          "ov7740": "[MAIXPY]: find ov7740\n[MAIXPY]: find ov sensor\n",
          "gc0328": "[MAIXPY]: sensor id = 9d\n[MAIXPY]: find gc0328\n"}


def _i2c_line(b) -> str:
    """cambus_init -> sccb_i2c_init prints "init i2c<n>\\r\\n" for a hardware I2C bus (0..2);
    sensor_load_config's default bus is 2 unless /flash/config.json's "sensor" dict says
    otherwise (i2c_num -2: SCCB, -1: soft, both silent)."""
    n = 2
    try:
        import json
        with b.vfs.open("/flash/config.json", "r") as f:
            cfg = json.loads(f.read()).get("sensor")
        if isinstance(cfg, dict) and isinstance(cfg.get("i2c_num"), int):
            n = cfg["i2c_num"]
    except (OSError, ValueError, AttributeError):
        pass
    return "init i2c%d\r\n" % n if 0 <= n <= 2 else ""


def _probe_lines(b, choice=0) -> str:
    """sensor_init_dvp: the bus line, then the probe (choice=1 OV only, 2 GC only, 3 MT only);
    a camera the choice excludes prints "[MAIXPY]: no sensor" (and reset fails)."""
    cam = b.camera if b.camera in _PROBE else "ov2640"
    kind = 2 if cam == "gc0328" else 1
    if choice and choice != kind:
        return _i2c_line(b) + "[MAIXPY]: no sensor\n", False
    return _i2c_line(b) + _PROBE[cam], True


def _say(text):
    """Firmware console output (mp_printf to mp_plat_print): the session's stdout."""
    if text:
        _board.console(text)


def _need_reset():
    if not _s().reset_done:
        raise RuntimeError("Not init!")


def set_pixformat(*args, **kwargs):
    if len(args) != 1:
        raise ValueError("arg err")
    fmt = A.get_int(args[0])
    if fmt not in (RGB565, YUV422, GRAYSCALE, JPEG):
        raise OSError("Pixel format is not supported!")
    # sensor.c sensor_set_pixformat: on the OV2640/OV7740/GC0328 RGB565 falls through to
    # YUV422 -- both set DVP_CFG_YUV_FORMAT, and the DVP hands over RGB565 frames
    _s().pixformat = RGB565 if fmt == YUV422 else fmt
    return True


def set_framesize(*args, **kwargs):
    if len(args) != 1:
        raise ValueError("arg err")
    fs = A.get_int(args[0])
    st = _s()
    if fs not in FRAMESIZES:
        raise OSError(22, "EINVAL")
    _, w, h = FRAMESIZES[fs]
    if w > MAX_K210[0] or h > MAX_K210[1]:
        _board.current().note(f"sensor.set_framesize: {FRAMESIZES[fs][0]} is larger than the "
                              "K210's VGA maximum", "fs-big")
        raise OSError(22, "EINVAL")
    st.framesize, st.window = fs, None
    st.running = True                        # set_framesize starts capture itself
    st.t0 = _board.current().clock.now_us()
    st.last_frame = -1
    return None


def set_windowing(*args, **kwargs):
    st = _s()
    roi = args[0] if args else kwargs.get("roi")
    roi = A.seq(roi)
    if st.framesize == 0:
        raise RuntimeError("Not init!")
    _, fw, fh = FRAMESIZES[st.framesize]
    if len(roi) == 2:
        w, h = (A.get_int(v) for v in roi)
        x, y = (fw - w) // 2, (fh - h) // 2
    elif len(roi) == 4:
        x, y, w, h = (A.get_int(v) for v in roi)
    else:
        raise ValueError("The tuple/list must either be (x, y, w, h) or (w, h)")
    if w < 8 or h < 8:
        raise ValueError("The selected window is too small")
    if x < 0 or y < 0 or x + w > fw or y + h > fh:
        raise ValueError("The selected window is outside the bounds of the frame")
    if w % 8:
        raise ValueError("value must be multiple of 8")
    st.window = (x, y, w, h)
    return True


def set_hmirror(*args, **kwargs):
    _need_reset()
    _s().hmirror = bool(args[0]) if args else False
    return None


def set_vflip(*args, **kwargs):
    _need_reset()
    _s().vflip = bool(args[0]) if args else False
    return None


def run(*args, **kwargs):
    _s().running = bool(A.get_int(args[0])) if args else True
    return True


def _frame_us():
    return timing.FRAME_US


def skip_frames(*args, **kwargs):
    """skip_frames([n][, time=300]): n frames, or `time` ms of frames; `n=` as a keyword is not
    read by the firmware (it waits 300 ms)."""
    A.ignore_unknown("sensor.skip_frames", kwargs, {"time"})
    _need_reset()
    b = _board.current()
    T = _frame_us()
    if args:
        n = A.get_int(args[0])
        t = kwargs.get("time")
        dur = n * T if t is None else min(n * T, A.get_int(t) * 1000)
    else:
        dur = A.get_int(kwargs.get("time", 300)) * 1000
    b.clock.advance(max(T, (dur + T - 1) // T * T))
    b.clock.frame()
    return None


def width():
    st = _s()
    return FRAMESIZES[st.framesize][1] if st.framesize else 0


def height():
    st = _s()
    return FRAMESIZES[st.framesize][2] if st.framesize else 0


def get_id():
    return SENSOR_IDS.get(_board.current().camera, 0x2642)


def _true(*args, **kwargs):
    return True


def _none(*args, **kwargs):
    return None


set_brightness = set_contrast = set_saturation = set_gainceiling = set_colorbar = _true
set_auto_gain = set_auto_whitebal = set_auto_exposure = set_special_effect = _none
set_lens_correction = set_jb_quality = _none


def set_framerate(*args, **kwargs):
    if args and A.get_int(args[0]) not in (2, 8, 15, 25, 30, 60):
        raise ValueError("Invalid framerate")
    return None


def get_gain_db():
    return 0.0


def get_exposure_us():
    return 33333


def get_rgb_gain_db():
    return (0.0, 0.0, 0.0)


def get_fb():
    return None


def shutdown(*args, **kwargs):
    st = _s()
    if st.binocular:            # sensor.c sensor_shutdown only drives PWDN: on a binocular
        return None             # module that picks which sensor answers, frames keep coming
    st.running = not (args and args[0])


def binocular_reset(*args, **kwargs):
    """py_sensor.c py_binocular_sensor_reset / sensor.c binocular_sensor_reset: resets both
    sensors of a binocular module (PWDN selects one, sensor.shutdown(0/1) switches). The host's
    board has that module when a script asks for it: two OV2640s that see the same photos."""
    A.ignore_unknown("sensor.binocular_reset", kwargs, {"freq"})
    b = _board.current()
    # binocular_sensor_reset: cambus_init's bus line, then binocular_sensor_scan's chip line
    # (no "find ov sensor": that is sensor_init_dvp's, which the binocular path skips)
    _say(_i2c_line(b) + "[MAIXPY]: find ov2640\n")
    _reset(b, {})
    _s().binocular = True
    _board.current().note("sensor.binocular_reset: the emulated binocular module's two sensors "
                          "both see the --image photos; shutdown(0/1) selects one", "binocular")
    return None


def sleep(*args, **kwargs):
    return None


flush = deinit = _none


def __write_reg(*args):
    return None


def __read_reg(*args):
    return 0


def _window_for(st, fw, fh):
    if st.window is None:
        return 0, 0, fw, fh
    x, y, w, h = st.window
    if _board.current().camera in ("ov2640", "ov7740"):
        _board.current().note("sensor.set_windowing on an OV2640/OV7740: the DVP captures the "
                              "top-left w x h of the frame (the firmware ignores x, y there; "
                              "issue #191); Board(camera='gc0328') centres it", "window-topleft")
        return 0, 0, w, h
    return x, y, w, h


def snapshot(*args, **kwargs):
    A.ignore_unknown("sensor.snapshot", kwargs, {"update_jb"})
    st = _s()
    b = _board.current()
    if not st.reset_done or st.framesize == 0 or st.pixformat == 0:
        raise RuntimeError("Not init!")
    if st.pixformat == JPEG:
        raise OSError("Operation not supported on JPEG")
    T = _frame_us()
    now = b.clock.now_us()
    if not st.running:
        b.clock.advance(timing.SNAPSHOT_TIMEOUT_US)
        b.note("sensor.snapshot after sensor.run(0): no frame comes (RuntimeError after 300 ms, "
               "as on a board)", "run0")
        raise RuntimeError("Sensor timeout!")
    done = (now - st.t0) // T          # frames finished so far
    if st.dual and done - 1 > st.last_frame:
        k = done - 1
    else:
        k = max(done, st.last_frame + 1)
        b.clock.until(st.t0 + (k + 1) * T)
    st.last_frame = k
    if b.frames_taken >= b.max_frames:
        b.stop(f"camera: all {b.frames_taken} photo(s) shown", "camera")
    src = b.images[b.frames_taken]
    was = b.button_down()
    b.frames_taken += 1
    if b.button_down() != was:
        for g in getattr(b, "gpio_irqs", []):
            g._edge(b.button_down())
    b.frame_times.append(b.clock.now_us() / 1000)
    b.clock.frame()
    _, fw, fh = FRAMESIZES[st.framesize]
    pil = src if isinstance(src, _PIL.Image) else _load(src)
    pil = pil.convert("RGB")
    if pil.size != (fw, fh):
        pil = pil.resize((fw, fh), _PIL.BILINEAR)
    rgb = np.asarray(pil, np.uint8)
    x, y, w, h = _window_for(st, fw, fh)
    rgb = rgb[y:y + h, x:x + w]
    if st.hmirror:
        rgb = rgb[:, ::-1]
    if st.vflip:
        rgb = rgb[::-1]
    px = (_image._gray(rgb) if st.pixformat == GRAYSCALE else _image._lattice(rgb))
    i = st.fb_i if not st.dual else (st.fb_i ^ 1)
    st.fb_i = i
    fb = st.fbs[i]
    if fb is None or fb.shape != px.shape:
        fb = st.fbs[i] = np.ascontiguousarray(px)
    else:
        np.copyto(fb, px)
    img = _image.Image(fb, st.pixformat, fb=True)
    img.pix_to_ai()               # the DVP writes the planar AI buffer too
    b.clock.advance(w * h * timing.SWAP_NS_PER_PIXEL / 1000)
    return img


def _load(path):
    from tl2k210.imaging import load_rgb
    return load_rgb(path)


def make_module(s):
    from tl2k210.maixpy.modules import module
    names = dict(reset=reset, set_pixformat=set_pixformat, set_framesize=set_framesize,
                 set_windowing=set_windowing, set_hmirror=set_hmirror, set_vflip=set_vflip,
                 run=run, skip_frames=skip_frames, snapshot=snapshot, width=width, height=height,
                 get_id=get_id, set_brightness=set_brightness, set_contrast=set_contrast,
                 set_saturation=set_saturation, set_gainceiling=set_gainceiling,
                 set_colorbar=set_colorbar, set_auto_gain=set_auto_gain,
                 set_auto_whitebal=set_auto_whitebal, set_auto_exposure=set_auto_exposure,
                 set_special_effect=set_special_effect, set_lens_correction=set_lens_correction,
                 set_jb_quality=set_jb_quality, set_framerate=set_framerate,
                 get_gain_db=get_gain_db, get_exposure_us=get_exposure_us,
                 get_rgb_gain_db=get_rgb_gain_db, get_fb=get_fb, shutdown=shutdown, sleep=sleep,
                 flush=flush, deinit=deinit, binocular_reset=binocular_reset,
                 __write_reg=__write_reg, __read_reg=__read_reg,
                 BAYER=BAYER, RGB565=RGB565, YUV422=YUV422, GRAYSCALE=GRAYSCALE, JPEG=JPEG,
                 OV2640=0x2642, OV7740=0x7742, GC0328=0x9D, OV9650=0x96, OV7725=0x77, MT9V034=0x13)
    names.update({name: code for code, (name, _, _) in FRAMESIZES.items()})
    return module("sensor", "MaixPy sensor: the board's camera sees a queue of photos", **names)

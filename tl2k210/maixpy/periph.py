"""Board peripherals and the frozen MaixPy modules: `machine`, `Maix`, `board`, `fpioa_manager`,
`audio`, `network`/`usocket` (docs/maixpy-firmware.md#machine-maix-and-board).

What a script writes to the hardware is recorded on the board, so tests can assert on it:
GPIO output writes (`board.gpio_log`: (ms, gpio, value)), UART bytes (`board.uart_log`), PWM
duties. Inputs: a GPIO routed (fm.register) from pin 16 (the BOOT key) reads the scripted button
(`button=[frames]`: pressed = 0 while those camera frames are the latest) and its `irq` handler
runs on the key's edges; other inputs read their pull level. machine.Timer callbacks run on the
board clock (between lines of the script, like MicroPython's scheduler). Audio playback advances
the board clock by the WAV's duration.
Argument rules: GPIO, UART, Timer, PWM, I2C, SPI use mp_arg_parse_all (unknown keywords raise
TypeError "extra keyword arguments given").
"""
from __future__ import annotations

import json

from tl2k210.k210.board_facts import REPL_BAUD, UART_DEFAULT_BAUD
from tl2k210.maixpy.args import REQUIRED, get_float, get_int, parse_all
from tl2k210.maixpy import board as _board
from tl2k210.maixpy.modules import module
from tl2k210.maixpy.vfs import oserror

# K210 FPIOA function numbers (kendryte-standalone-sdk fpioa.h order)
_FUNCS = (["JTAG_TCLK", "JTAG_TDI", "JTAG_TMS", "JTAG_TDO"] + [f"SPI0_D{i}" for i in range(8)]
          + [f"SPI0_SS{i}" for i in range(4)] + ["SPI0_ARB", "SPI0_SCLK", "UARTHS_RX", "UARTHS_TX",
                                                 "RESV6", "RESV7", "CLK_SPI1", "CLK_I2C1"]
          + [f"GPIOHS{i}" for i in range(32)] + [f"GPIO{i}" for i in range(8)]
          + ["UART1_RX", "UART1_TX", "UART2_RX", "UART2_TX", "UART3_RX", "UART3_TX"]
          + [f"SPI1_D{i}" for i in range(8)] + [f"SPI1_SS{i}" for i in range(4)]
          + ["SPI1_ARB", "SPI1_SCLK", "SPI_SLAVE_D0", "SPI_SLAVE_SS", "SPI_SLAVE_SCLK"]
          + [f"I2S{k}_{n}" for k in range(3) for n in
             ["MCLK", "SCLK", "WS"] + [f"IN_D{i}" for i in range(4)] + [f"OUT_D{i}" for i in range(4)]]
          + [f"RESV{i}" for i in range(6)]
          + ["I2C0_SCLK", "I2C0_SDA", "I2C1_SCLK", "I2C1_SDA", "I2C2_SCLK", "I2C2_SDA",
             "CMOS_XCLK", "CMOS_RST", "CMOS_PWDN", "CMOS_VSYNC", "CMOS_HREF", "CMOS_PCLK"]
          + [f"CMOS_D{i}" for i in range(8)] + ["SCCB_SCLK", "SCCB_SDA"]
          + [f"UART{u}_{n}" for u in (1, 2, 3) for n in
             ("CTS", "DSR", "DCD", "RI", "SIR_IN", "DTR", "RTS", "OUT2", "OUT1", "SIR_OUT", "BAUD",
              "RE", "DE", "RS485_EN")]
          + [f"TIMER{t}_TOGGLE{i}" for t in range(3) for i in range(1, 5)]
          + ["CLK_SPI2", "CLK_I2C2"])
FUNC = {n: i for i, n in enumerate(_FUNCS)}
BOOT_PIN = 16


def _fpioa_state(b):
    if not hasattr(b, "fpioa"):
        b.fpioa = {}          # function number -> pin
    return b.fpioa


def _fpioa_set(b, pin, func):
    """fpioa.c fpioa_set_function (Kendryte SDK): the pin's old function goes, `func` leaves
    any other pin, and FUNC_RESV0 just frees the pin."""
    st = _fpioa_state(b)
    for f, p in list(st.items()):
        if p == pin:
            del st[f]
    if func != FUNC["RESV0"]:
        st[func] = pin


class FPIOA:
    locals().update(FUNC)

    def __init__(self):
        from tl2k210.maixpy import board as _b
        self._b = _b.current()

    def set_function(self, *args, **kwargs):
        """Maix_fpioa.c Maix_set_function + the SDK's fpioa_set_function: a pin has one
        function and a function one pin -- setting it moves it off any other pin; RESV0 frees
        the pin."""
        a = parse_all(args, kwargs, [("pin", 0), ("func", 0), ("set_sl", -1), ("set_st", -1),
                                     ("set_io_driving", -1)])
        pin, func = get_int(a["pin"]), get_int(a["func"])
        if pin > 48:
            raise ValueError("Don't have this Pin")
        if func < 0 or func > 204:
            raise ValueError("This function is invalid")
        if pin < 0 or pin >= 48:
            sess = getattr(self._b, "session", None)
            if sess is not None:
                sess.out.write("[Maix]:Opps!Can not set fpioa\n")
            raise oserror(5)
        _fpioa_set(self._b, pin, func)
        return True

    def get_Pin_num(self, *args, **kwargs):
        """Maix_fpioa.c Maix_get_Pin_num: the (first) pin with that function, else None."""
        func = get_int(parse_all(args, kwargs, [("func", 0)])["func"])
        if func < 0 or func > 204:
            raise ValueError("This function is invalid")
        return _fpioa_state(self._b).get(func)

    def help(self, *a):
        return None


class GPIO:
    """Maix.GPIO(id, mode=IN, pull=PULL_NONE, *, value=)."""
    IN, OUT = 0, 3
    PULL_NONE, PULL_DOWN, PULL_UP = 0, 1, 2
    IRQ_NONE, IRQ_RISING, IRQ_FALLING, IRQ_BOTH = 0, 1, 2, 3
    WAKEUP_NOT_SUPPORT = 0
    locals().update({f"GPIOHS{i}": i for i in range(32)})
    locals().update({f"GPIO{i}": 32 + i for i in range(8)})

    def __init__(self, *args, **kwargs):
        from tl2k210.maixpy import board as _b
        a = parse_all(args, kwargs, [("id", REQUIRED), ("mode", 0), ("pull", 0), ("*value", None)])
        self._b = _b.current()
        self._id, self._mode, self._pull = get_int(a["id"]), get_int(a["mode"]), get_int(a["pull"])
        if not 0 <= self._id < 40:
            raise ValueError("invalid pin")        # Maix_gpio.c mp_maixpy_pin_make_new
        if self._mode == self.OUT and self._pull != self.PULL_NONE:
            raise ValueError("When this pin is in output mode, it is not allowed to pull up and down.")
        self._out = 0 if a["value"] is None else int(bool(a["value"]))
        self._irq = None

    def _pin(self):
        func = FUNC[f"GPIOHS{self._id}"] if self._id < 32 else FUNC[f"GPIO{self._id - 32}"]
        return _fpioa_state(self._b).get(func)

    def __call__(self, *v, **kw):
        """Maix_gpio.c Maix_gpio_call: pin() reads, pin(x) writes (mp_obj_is_true), as value()."""
        if kw:
            raise TypeError("function doesn't take keyword arguments")
        if len(v) > 1:
            raise TypeError("function expected at most 1 arguments, got %d" % len(v))
        return self.value(*v)

    def value(self, *v):
        if len(v) > 1:
            raise TypeError("function expected at most 2 arguments, got %d" % (len(v) + 1))
        if v:
            self._out = int(bool(v[0]))
            self._b.gpio_log.append((self._b.clock.now_us() // 1000, self._id, self._out))
            return None
        if self._mode == self.OUT:
            return self._out
        if self._pin() == BOOT_PIN:
            return 0 if self._b.button_down() else 1
        return 1 if self._pull == self.PULL_UP else 0

    def irq(self, *args, **kwargs):
        """Edges of the BOOT key (the scripted button) call the handler between lines, as
        MicroPython's scheduler does; other pins have no edges on the host."""
        a = parse_all(args, kwargs, [("handler", None), ("trigger", self.IRQ_BOTH), ("wake", 0),
                                     ("priority", 7)])
        self._irq = (a["handler"], get_int(a["trigger"]))
        if not hasattr(self._b, "gpio_irqs"):
            self._b.gpio_irqs = []
        self._b.gpio_irqs.append(self)
        if self._pin() != BOOT_PIN:
            self._b.note("GPIO.irq on a pin other than the BOOT key (16): no edges are emulated "
                         "there, the handler is never called", "gpio-irq")

    def disirq(self):
        self._irq = None

    def _edge(self, pressed: bool):
        """The BOOT key changed: falling edge when pressed (pull-up key), rising when released."""
        if self._irq is None or self._pin() != BOOT_PIN or self._irq[0] is None:
            return
        want = self.IRQ_FALLING if pressed else self.IRQ_RISING
        if self._irq[1] in (want, self.IRQ_BOTH):
            s = getattr(self._b, "session", None)
            if s is not None:
                s.schedule(self._irq[0], self)

    def mode(self, *m):
        if m:
            self._mode = get_int(m[0])
        return self._mode


class I2S:
    DEVICE_0, DEVICE_1, DEVICE_2 = 0, 1, 2
    CHANNEL_0, CHANNEL_1, CHANNEL_2, CHANNEL_3 = 0, 1, 2, 3
    IGNORE_MODE, STANDARD_MODE, RIGHT_JUSTIFYING_MODE, LEFT_JUSTIFYING_MODE = 0, 1, 2, 4
    RESOLUTION_12_BIT, RESOLUTION_16_BIT, RESOLUTION_20_BIT, RESOLUTION_24_BIT, \
        RESOLUTION_32_BIT = 1, 2, 3, 4, 5
    SCLK_CYCLES_16, SCLK_CYCLES_24, SCLK_CYCLES_32 = 0, 1, 2
    TRANSMITTER, RECEIVER = 0, 1

    def __init__(self, *args, **kwargs):
        a = parse_all(args, kwargs, [("device_num", REQUIRED), ("pll2", 0), ("mclk", 0)])
        self.device, self.rate = get_int(a["device_num"]), 16000

    def channel_config(self, *args, **kwargs):
        parse_all(args, kwargs, [("channel", REQUIRED), ("mode", REQUIRED), ("resolution", 2),
                                 ("cycles", 2), ("align_mode", 1)])

    def set_sample_rate(self, rate):
        self.rate = get_int(rate)

    def play(self, audio):
        """Maix_i2s.c Maix_i2s_play: plays an audio object's `points` 32-bit samples (what
        record() returns, or audio.Audio(array=...)); board time advances by their length."""
        from tl2k210.maixpy import board as _b
        if hasattr(audio, "to_bytes"):
            n = len(audio.to_bytes()) // 4
        elif isinstance(audio, (bytes, bytearray, memoryview)):
            n = len(bytes(audio)) // 4
        else:
            raise TypeError(f"can't convert {type(audio).__name__} to audio")
        _b.current().clock.advance(n * 1e6 / max(1, self.rate))

    def wait_record(self):
        """Maix_i2s.c Maix_i2s_wait_record: waits for the record DMA (done on the host)."""
        return None

    def record(self, points):
        """Maix_i2s.c: an audio.Audio object of `points` 32-bit samples (L/R 16-bit each);
        the emulated microphone hears silence."""
        from tl2k210.maixpy import board as _b
        _b.current().clock.advance(get_int(points) * 1e6 / max(1, self.rate))
        return _RecordedAudio(bytes(4 * get_int(points)))


class _RecordedAudio:
    """What I2S.record returns (type audio): to_bytes() gives the raw sample buffer."""

    def __init__(self, data: bytes):
        self._data = data

    def to_bytes(self):
        return self._data

    def finish(self):
        return None


class FFT:
    """Maix.FFT (Maix_fft.c): the K210's FFT accelerator on I2S samples. freq and amplitude are
    the firmware's integer arithmetic; run computes the DFT in float64, scales it by 2 for each
    stage `shift` selects and truncates it to int16 (the hardware rounds at each of its fixed-point
    stages: within a few LSB of it)."""

    @staticmethod
    def run(*args, **kwargs):
        """run(byte, points=64, shift=0, direction=1): the low 16 bits of each 32-bit sample of
        `byte` are the real input; a list of `points` (re, im) int tuples."""
        import numpy as np
        a = parse_all(args, kwargs, [("byte", None), ("points", 64), ("shift", 0), ("direction", 1)])
        points, shift, direction = get_int(a["points"]), get_int(a["shift"]), get_int(a["direction"])
        if points not in (64, 128, 256, 512):
            raise ValueError("[MAIXPY]FFT:invalid points")
        if a["byte"] is None:
            raise ValueError("[MAIXPY]FFT:invalid byte")
        data = bytes(memoryview(a["byte"]))
        if len(data) % 4:
            raise ValueError("[MAIXPY]FFT:Buffer length must be a multiple of 4")
        if len(data) < 4 * points:
            from tl2k210.maixpy.KPU import print_
            print_("[MAIXPY]FFT:Zero padding")
            data += bytes(4 * points - len(data))
        x = np.frombuffer(data[:4 * points], "<u4").astype(np.uint16).view(np.int16).astype(np.float64)
        y = np.fft.fft(x) if direction else np.fft.ifft(x) * points     # FFT_DIR_FORWARD = 1
        stages = points.bit_length() - 1
        y = y / 2 ** bin(shift & ((1 << stages) - 1)).count("1")
        re, im = (np.trunc(v).astype(np.int64).astype(np.uint16).view(np.int16) for v in (y.real, y.imag))
        return [(int(r), int(i)) for r, i in zip(re, im)]

    @staticmethod
    def freq(*args, **kwargs):
        """freq(points=64, sample_rate=16000): [sample_rate // points * i for i < points]."""
        a = parse_all(args, kwargs, [("points", 64), ("sample_rate", 16000)])
        points, rate = get_int(a["points"]), get_int(a["sample_rate"])
        return [rate // points * i for i in range(points)]

    @staticmethod
    def amplitude(lst):
        """amplitude(list of (re, im)): 2 * floor(sqrt(re^2 + im^2)) // len(list), per item."""
        import math
        if not isinstance(lst, list):
            raise ValueError("[MAIXPY]FFT:obj is not a list")
        return [2 * math.isqrt((int(t[0]) ** 2 + int(t[1]) ** 2) & 0xFFFFFFFF) // len(lst) for t in lst]


class _Anything:
    """Accepts any attribute/call: peripherals the host does not model (MIC_ARRAY...)."""

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


_MIC_SECTORS = (
    (197, 198, 199, 213, 214, 215, 228, 229, 230, 231, 244, 245, 246, 247),
    (178, 179, 192, 193, 194, 195, 196, 208, 209, 210, 211, 212, 224, 225, 226, 227, 240, 241, 242, 243),
    (128, 129, 130, 131, 144, 145, 146, 147, 160, 161, 162, 163, 176, 177),
    (64, 65, 80, 81, 82, 83, 96, 97, 98, 99, 112, 113, 114, 115),
    (0, 1, 2, 3, 16, 17, 18, 19, 32, 33, 34, 35, 36, 48, 49, 50, 51, 52, 66, 67),
    (4, 5, 6, 7, 20, 21, 22, 23, 37, 38, 39, 53, 54, 55),
    (8, 9, 10, 11, 24, 25, 26, 27, 40, 41, 42, 56, 57, 58),
    (12, 13, 14, 15, 28, 29, 30, 31, 43, 44, 45, 46, 47, 59, 60, 61, 62, 63, 76, 77),
    (78, 79, 92, 93, 94, 95, 108, 109, 110, 111, 124, 125, 126, 127),
    (140, 141, 142, 143, 156, 157, 158, 159, 173, 172, 174, 175, 190, 191),
    (188, 189, 203, 204, 205, 206, 207, 219, 220, 221, 222, 223, 236, 237, 238, 239, 252, 253, 254, 255),
    (200, 201, 202, 216, 217, 218, 232, 233, 234, 235, 248, 249, 250, 251),
)


def make_mic_array(b):
    """Maix.MIC_ARRAY (v0.6.2 Maix/Maix_mic_array.c, CONFIG_MAIXPY_MIC_ARRAY_ENABLE=y). The
    sound-source map comes from the closed lib_mic (no source): get_map() after init() raises
    OSError EOPNOTSUPP with a note that says so; without init() no map comes (ETIMEDOUT after
    100 ms, as the firmware). get_dir is the firmware's 12-sector average of a 16x16 grayscale
    image (the sum cast to uint8 before the division, capped at 15); set_led checks its 12 + 3
    values; init sets the I2S0 pins on the FPIOA."""
    state = {"init": False}

    def init(*args, **kwargs):
        a = parse_all(args, kwargs, [(n, d) for n, d in (
            ("i2s_d0", 23), ("i2s_d1", 22), ("i2s_d2", 21), ("i2s_d3", 20), ("i2s_ws", 19),
            ("i2s_sclk", 18), ("sk9822_dat", 24), ("sk9822_clk", 25))])
        for name, func in (("i2s_d0", "I2S0_IN_D0"), ("i2s_d1", "I2S0_IN_D1"), ("i2s_d2", "I2S0_IN_D2"),
                           ("i2s_d3", "I2S0_IN_D3"), ("i2s_ws", "I2S0_WS"), ("i2s_sclk", "I2S0_SCLK")):
            _fpioa_set(b, get_int(a[name]), FUNC[func])
        state["init"] = True
        return True

    def deinit():
        state["init"] = False
        return True

    def get_map():
        if not state["init"]:
            b.clock.advance(100_000)
            raise oserror(110)                    # MP_ETIMEDOUT
        b.note("MIC_ARRAY.get_map: the sound-source map is computed by the closed lib_mic "
               "library (no source code), which the host cannot emulate", "mic")
        raise oserror(95)

    def get_dir(*args, **kwargs):
        from tl2k210.maixpy import image as _image
        if not args or not isinstance(args[0], _image.Image):
            raise TypeError("Can't convert <class 'type'> to type")
        img = args[0]
        if img.width() != 16 or img.height() != 16 or img._fmt != _image.GRAYSCALE:
            raise ValueError("image type error, only support 16*16 grayscale image")
        data = img._px.reshape(-1)
        out = []
        for sector in _MIC_SECTORS:
            tmp = (sum(int(data[i]) for i in sector) & 0xFF) // len(sector)
            out.append(15 if tmp > 15 else tmp)
        return tuple(out)

    def set_led(*args, **kwargs):
        from tl2k210.maixpy.args import seq
        if len(args) < 2:
            raise TypeError("function missing %d required positional arguments" % (2 - len(args)))
        [get_int(v) for v in seq(args[0], 12)]
        [get_int(v) for v in seq(args[1], 3)]
        return True

    return module("MIC_ARRAY", "", init=init, deinit=deinit, get_map=get_map, get_dir=get_dir,
                  set_led=set_led)


def make_Maix(s):
    b = s.board
    state = {"cpu": 400_000_000, "pll1": 400_000_000}

    def freq_get():
        return (state["cpu"] // 1_000_000, state["pll1"] // 1_000_000)

    def freq_set(*args, **kwargs):
        a = parse_all(args, kwargs, [("cpu", 400), ("pll1", 400), ("kpu_div", 1)])
        b.note("Maix.freq.set: the host keeps the latency model at 400 MHz (cost.py) and does "
               "not reset the board", "freq")
        state.update(cpu=get_int(a["cpu"]) * 1_000_000)

    def gc_heap_size(*size):
        """The heap freq.conf sets for the next boot; with a size, write it (MaixPy: reboot to apply)."""
        if not size:
            return b.conf_heap()
        b.set_conf_heap(get_int(size[0]))
        return None

    utils = module("Maix.utils", "", gc_heap_size=gc_heap_size,
                   heap_free=lambda: b.sys_free,
                   flash_read=lambda addr, n: b.read_flash(get_int(addr), get_int(n)))
    m = module("machine", "MaixPy Maix (its __name__ is 'machine' on a board)", GPIO=GPIO,
               FPIOA=FPIOA, I2S=I2S, Audio=make_audio(s).Audio, FFT=FFT,
               MIC_ARRAY=make_mic_array(b),
               freq=module("freq", "", get=freq_get, set=freq_set,
                           get_cpu=lambda: state["cpu"] // 1_000_000,
                           get_kpu=lambda: state["pll1"] // 1_000_000),
               utils=utils, config=module("config", "", get_value=lambda k, d=None: d))
    return m


# ---------------------------------------------------------------------------------------------
class UART:
    UART1, UART2, UART3, UARTHS = 0, 1, 2, 3

    def __init__(self, *args, **kwargs):
        from tl2k210.maixpy import board as _b
        a = parse_all(args, kwargs, [("uart", REQUIRED), ("baudrate", UART_DEFAULT_BAUD), ("bits", 8),
                                     ("parity", None), ("stop", 1), ("*timeout", 1000),
                                     ("*read_buf_len", 4096), ("*ide", False), ("*from_ide", True)])
        self._b, self.id = _b.current(), get_int(a["uart"])
        self.baud = get_int(a["baudrate"])

    def init(self, *args, **kwargs):
        a = parse_all(args, kwargs, [("baudrate", UART_DEFAULT_BAUD), ("bits", 8), ("parity", None),
                                     ("stop", 1), ("*timeout", 1000), ("*read_buf_len", 4096),
                                     ("*ide", False), ("*from_ide", True)])
        self.baud = get_int(a["baudrate"])
        hook = getattr(self._b, "on_repl_baud", None) if getattr(self, "_repl", False) else None
        if hook is not None:       # the REPL board's line follows (repl_board.py)
            hook(self.baud)

    def write(self, data):
        data = data.encode() if isinstance(data, str) else bytes(data)
        self._b.uart_log.setdefault(self.id, bytearray()).extend(data)
        self._b.clock.advance(len(data) * 10 * 1e6 / max(1, self.baud))
        return len(data)

    def read(self, n=None):
        return None

    readline = read

    def readinto(self, buf, n=None):
        return None

    def any(self):
        return 0

    def deinit(self):
        pass

    @staticmethod
    def repl_uart():
        """The REPL's UART (UARTHS); `init(baudrate, ...)` changes the rate the REPL talks at, as
        _boot.py does for MaixPy IDE mode (1.5 Mbaud, docs/maixpy-firmware.md#boot)."""
        from tl2k210.maixpy import board as _b
        u = UART(UART.UARTHS, getattr(_b.current(), "repl_baud", REPL_BAUD))
        u._repl = True
        return u


class Timer:
    TIMER0, TIMER1, TIMER2 = 0, 1, 2
    CHANNEL0, CHANNEL1, CHANNEL2, CHANNEL3 = 0, 1, 2, 3
    MODE_ONE_SHOT, MODE_PERIODIC, MODE_PWM = 0, 1, 2
    UNIT_S, UNIT_MS, UNIT_US, UNIT_NS = 0, 1, 2, 3

    def __init__(self, *args, **kwargs):
        from tl2k210.maixpy import board as _b
        a = parse_all(args, kwargs, [("id", REQUIRED), ("channel", REQUIRED), ("*mode", 0),
                                     ("*period", 1000), ("*unit", 1), ("*callback", None),
                                     ("*arg", None), ("*start", True), ("*priority", 1),
                                     ("*div", 0)])
        self.id, self.channel, self.mode = a["id"], a["channel"], a["mode"]
        self._b = _b.current()
        self._callback, self._arg = a["callback"], a["arg"]
        self._period, self._unit = get_int(a["period"]), get_int(a["unit"])   # MP_ARG_INT
        if a["start"]:
            self.start()

    def _period_us(self):
        return self._period * {0: 1e6, 1: 1e3, 2: 1.0, 3: 1e-3}.get(self._unit, 1e3)

    def start(self):
        s = getattr(self._b, "session", None)
        if s is not None and self.mode != self.MODE_PWM:
            s.add_timer(self, self._period_us(), self.mode == self.MODE_PERIODIC)

    def stop(self):
        s = getattr(self._b, "session", None)
        if s is not None:
            s.remove_timer(self)

    def restart(self):
        self.start()

    def deinit(self):
        self.stop()

    def period(self, *p):
        if p:
            self._period = get_int(p[0])
            self.start()
        return self._period

    def callback(self, *c):
        if c:
            self._callback = c[0]
        return self._callback

    def callback_arg(self):
        """The `arg=` given at construction; the callback itself always receives the Timer
        (machine_timer.c: mp_sched_schedule(self->callback, self))."""
        return self._arg


class PWM:
    def __init__(self, *args, **kwargs):
        from tl2k210.maixpy import board as _b
        a = parse_all(args, kwargs, [("timer", REQUIRED), ("freq", 1000), ("duty", 50),
                                     ("pin", REQUIRED), ("enable", True)])
        self._b = _b.current()
        self.pin, self._freq = get_int(a["pin"]), get_float(a["freq"])
        self.duty(a["duty"])

    def duty(self, *d):
        if d:
            self._duty = get_float(d[0])
            self._b.__dict__.setdefault("pwm_log", []).append(
                (self._b.clock.now_us() // 1000, self.pin, self._duty))
            return None
        return self._duty

    def freq(self, *f):
        if f:
            self._freq = get_float(f[0])
        return self._freq

    def enable(self):
        pass

    def disable(self):
        pass

    def deinit(self):
        pass


class I2C:
    # machine_i2c.c (v0.6.2, MICROPY_PY_MACHINE_SW_I2C=1): I2C3-5 are software buses
    I2C0, I2C1, I2C2, I2C3, I2C4, I2C5 = 0, 1, 2, 3, 4, 5
    MODE_MASTER, MODE_SLAVE, MODE_MASTER_SOFT = 0, 1, 2
    I2C_EV_START, I2C_EV_RESTART, I2C_EV_STOP = 0, 1, 2

    def __init__(self, *args, **kwargs):
        a = parse_all(args, kwargs, [("id", REQUIRED), ("*mode", 0), ("*scl", None), ("*sda", None),
                                     ("*freq", 400000), ("*timeout", 1000), ("*addr", 0),
                                     ("*addr_size", 7), ("*on_receive", None),
                                     ("*on_transmit", None), ("*on_event", None),
                                     ("*us_delay", 0)])
        self.id = get_int(a["id"])
        if not 0 <= self.id <= 5:
            raise ValueError(f"[MAIXPY]I2C: I2C({self.id}) doesn't exist")
        self.pins = (a["scl"], a["sda"])

    # the board profile's devices on these pins answer (the M5StickV's AXP192 at 0x34 on 28/29);
    # any other address is no device: EIO
    def _dev(self, addr):
        d = _board.current().i2c_device(*self.pins, get_int(addr))
        if d is None:
            raise OSError(5, "EIO")
        return d

    def scan(self):
        b = _board.current()
        return sorted(a for (scl, sda, a) in b.i2c_devices if (scl, sda) == self.pins)

    def writeto(self, addr, buf, stop=True):
        self._dev(addr).write(bytes(buf))
        return len(buf)

    def readfrom(self, addr, nbytes, stop=True):
        return self._dev(addr).read(get_int(nbytes))

    def readfrom_into(self, addr, buf, stop=True):
        buf[:] = self._dev(addr).read(len(buf))

    def writeto_mem(self, addr, memaddr, buf, mem_size=8):
        data = bytes([get_int(buf) & 0xFF]) if isinstance(buf, int) else bytes(buf)
        self._dev(addr).write(bytes([get_int(memaddr) & 0xFF]) + data)

    def readfrom_mem(self, addr, memaddr, nbytes, mem_size=8):
        d = self._dev(addr)
        d.write(bytes([get_int(memaddr) & 0xFF]))
        return d.read(get_int(nbytes))

    def readfrom_mem_into(self, addr, memaddr, buf, mem_size=8):
        buf[:] = self.readfrom_mem(addr, memaddr, len(buf), mem_size)

    def deinit(self):
        pass


class SPI:
    SPI0, SPI1, SPI2, SPI_SOFT = 0, 1, 2, 3
    MODE_MASTER, MODE_MASTER_2, MODE_MASTER_4, MODE_MASTER_8, MODE_SLAVE = 0, 1, 2, 3, 4
    MSB, LSB = 0, 1
    CS0, CS1, CS2, CS3 = 0, 1, 2, 3     # machine_spi.c: the chip select read/write(cs=) drives

    def __init__(self, *args, **kwargs):
        self.args = args

    def write(self, *a, **k):
        return None

    def read(self, n, *a, **k):
        return bytes(get_int(n))

    def readinto(self, buf, *a, **k):
        return None

    def write_readinto(self, w, r, *a, **k):
        return None

    def deinit(self):
        pass


class WDT:
    def __init__(self, *args, **kwargs):
        a = parse_all(args, kwargs, [("id", 0), ("timeout", 5000), ("callback", None),
                                     ("context", None)])
        from tl2k210.maixpy import board as _b
        _b.current().note("machine.WDT: the host watchdog is --timeout; WDT.feed() is a no-op",
                          "wdt")

    def feed(self):
        pass

    def stop(self):
        pass


def make_machine(s):
    b = s.board

    def reset():
        b.stop("machine.reset(): the board reboots and runs boot.py and main.py again (the host does so "
               f"for a folder it boots, up to {_board.MAX_REBOOTS} times a run; a script run ends here)", "reset")

    return module("machine", "MaixPy machine (no Pin, RTC or freq: those are Maix.*)",
                  UART=UART, Timer=Timer, PWM=PWM, I2C=I2C, SPI=SPI, WDT=WDT,
                  SDCard=_Anything("SDCard"), reset=reset, reset_cause=lambda: 0,
                  unique_id=lambda: bytes(32), PWRON_RESET=0, HARD_RESET=1, WDT_RESET=2,
                  DEEPSLEEP_RESET=3, SOFT_RESET=4)


# ---------------------------------------------------------------------------------------------
def make_board(s):
    """board.board_info from the "board_info" key of /flash/config.json
    (docs/maixpy-firmware.md#machine-maix-and-board)."""
    info = None
    try:
        with s.board.vfs.open("/flash/config.json", "r") as f:
            info = json.loads(f.read()).get("board_info")
    except (OSError, ValueError):
        info = None

    profile = s.board.profile
    if profile.frozen_board_info:        # its frozen board.py: the pin names, not config.json
        info = profile.board_info

    class board_info:
        BOOT_KEY = 16

        @classmethod
        def set(cls, key, value=None):
            setattr(cls, key, value)

        @classmethod
        def all(cls):
            return [k for k in dir(cls) if not k.startswith("_")]

        @classmethod
        def load(cls, __map__={}):
            for k, v in __map__.items():
                setattr(cls, k, v)

    if isinstance(info, dict):
        board_info.load(info)
        if profile.frozen_board_info:
            del board_info.BOOT_KEY      # not one of the M5StickV's names
    else:
        s.out.write("[Warning] Not loaded from /flash/config.json to board_info.\n")
    return module("board", "MaixPy frozen board.py", board_info=board_info)


def make_fpioa_manager(s):
    b = s.board
    fpioa = FPIOA()

    class fm:
        pass

    fm.fpioa = fpioa
    fm.board_info = s.import_module("board").board_info

    # the frozen builtin_py/fpioa_manager.py of v0.6.2, method for method
    def get_pin_by_function(function):
        return fpioa.get_Pin_num(function)

    def str_function(function):
        if fpioa.GPIOHS0 <= function and function <= fpioa.GPIO7:
            if fpioa.GPIO0 <= function:
                return "fm.fpioa.GPIO%d" % (function - fpioa.GPIO0)
            return "fm.fpioa.GPIOHS%d" % (function - fpioa.GPIOHS0)
        return "unknown"

    def register(pin, function, force=True):
        pin_used = get_pin_by_function(function)
        if pin_used == pin:
            return None
        if pin_used is not None:
            info = "[Warning] function is used by %s(pin:%d)" % (str_function(function), pin_used)
            if force is False:
                raise Exception(info)
            s.out.write(info + "\n")
        fpioa.set_function(pin, function)
        return None

    def unregister(pin):
        fpioa.set_function(pin, fpioa.RESV0)

    def get_gpio_used():
        return [(str_function(f), get_pin_by_function(f))
                for f in range(fpioa.GPIOHS0, fpioa.GPIO7 + 1)]

    fm.register = staticmethod(register)
    fm.unregister = staticmethod(unregister)
    fm.get_pin_by_function = staticmethod(get_pin_by_function)
    fm.str_function = staticmethod(str_function)
    fm.get_gpio_used = staticmethod(get_gpio_used)
    fm.help = staticmethod(lambda *a: None)
    return module("fpioa_manager", "MaixPy frozen fpioa_manager.py", fm=fm,
                  board_info=fm.board_info, FPIOA=FPIOA)


def make_ide_debug(s):
    return module("ide_debug", "")


# ---------------------------------------------------------------------------------------------
def make_audio(s):
    b = s.board

    class Audio:
        """audio.Audio(path=WAV): play_process(i2s) parses the WAV, play() plays one chunk
        (board time advances by its duration), 0 at the end."""

        def __init__(self, *args, **kwargs):
            # py_audio.c Maix_audio_init_helper: array and path positional or keyword, the rest
            # keyword-only (the MaixPy docs' I2S loop-back: Audio(rx.record(256).to_bytes()))
            a = parse_all(args, kwargs, [("array", None), ("path", None), ("*is_create", False),
                                         ("*samplerate", 44100), ("*points", 1024)])
            self.path, self._wav, self._pos, self._vol = a["path"], None, 0, 100
            self._fp, self._data = None, b""
            if a["array"] is not None:
                self._data = bytes(memoryview(a["array"]))
            elif self.path is not None and a["is_create"]:
                # py_audio.c Maix_audio_init_helper: is_create opens the file "wb" and leaves
                # room for the 44-byte WAV header that finish() writes
                self._fp = b.vfs.open(self.path, "wb")
                self._fp.write(bytes(44))
                self._rate, self._size = get_int(a["samplerate"]), 0
                self._data = b""
            elif self.path is not None:
                self._data = b.vfs.read_bytes(self.path)

        def play_process(self, i2s):
            import io
            import wave
            try:
                w = wave.open(io.BytesIO(self._data))
            except (wave.Error, EOFError):
                return None
            self._wav, self._i2s = w, i2s
            return [w.getnchannels(), w.getframerate(), w.getframerate() * w.getsampwidth(),
                    w.getsampwidth() * w.getnchannels(), 8 * w.getsampwidth(), w.getnframes()]

        def play(self):
            if self._wav is None:
                return None
            frames = self._wav.readframes(1024)
            if not frames:
                return 0
            n = len(frames) // (self._wav.getsampwidth() * self._wav.getnchannels())
            b.clock.advance(n * 1e6 / max(1, self._wav.getframerate()))
            return 1

        def volume(self, v=None):
            if v is not None:
                self._vol = v
            return self._vol

        def finish(self):
            """wav.c wav_finish: a recording gets its header (2 channels, 16 bits, the
            samplerate given) and the file is closed; a playback is stopped."""
            self._wav = None
            if self._fp is not None:
                import struct
                blockalign = 2 * 16 // 8
                byterate = self._rate * blockalign
                for k, v in (("numchannels", 2), ("samplerate", self._rate), ("byterate", byterate),
                             ("blockalign", blockalign), ("bitspersample", 16)):
                    s.out.write(f"[MAIXPY]: {k} = {v}\n")
                self._fp.seek(0)
                self._fp.write(b"RIFF" + struct.pack("<I", 36 + self._size) + b"WAVE" +
                               b"fmt " + struct.pack("<IHHIIHH", 16, 1, 2, self._rate, byterate,
                                                     blockalign, 16) +
                               b"data" + struct.pack("<I", self._size))
                self._fp.close()
                self._fp = None

        def record(self, rec):
            """py_audio.c Maix_audio_record: appends the low 16 bits of each 32-bit sample of
            `rec` (an I2S.record() audio object) to the file opened with is_create=True."""
            if self._fp is None:
                return None
            import struct
            raw = rec.to_bytes()
            n = len(raw) // 4
            words = struct.unpack("<%dI" % n, raw[:4 * n])
            self._fp.write(struct.pack("<%dH" % n, *(w & 0xFFFF for w in words)))
            self._size += 2 * n
            return None

        def to_bytes(self):
            return bytes(self._data) if self.path or self._data else b""

    return module("audio", "MaixPy audio (WAV playback on the board clock)", Audio=Audio)


def _no_network(s, what):
    s.board.note(f"{what}: there is no network on the emulated board", ("net", what))
    return oserror(113)     # EHOSTUNREACH


def make_network(s):
    class _Net:
        def __init__(self, *a, **k):
            raise _no_network(s, "network")

    class WIZNET5K:
        """wiznet5k/modnwwiznet5k.c (CONFIG_MAIXPY_WIZNET5K_ENABLE=y in v0.6.2's default
        build): WIZNET5K(spi=machine.SPI, cs=0..31) checks its arguments as the firmware does;
        then, as for the Wi-Fi modules, the emulated board has no network."""

        def __init__(self, *args, **kwargs):
            if len(args) > 3:
                raise TypeError("function expected at most 3 arguments, got %d" % len(args))
            a = parse_all((), kwargs, [("*spi", None), ("*cs", 20)])
            if not isinstance(a["spi"], SPI):
                raise TypeError("[MAIXPY]spi: object type error")
            if not 0 <= get_int(a["cs"]) <= 31:
                raise ValueError("CS value error")
            raise _no_network(s, "network.WIZNET5K")

    return module("network", "", ESP32_SPI=_Net, ESP8285=_Net, WLAN=_Net, WIZNET5K=WIZNET5K,
                  STA_IF=0, AP_IF=1)


def make_usocket(s):
    class socket:
        def __init__(self, *a, **k):
            pass

        def _no_nic(self, *a, **k):
            # modusocket.c: connect, bind and sendto pick a NIC for the address first
            # (socket_select_nic -> modnetwork.c mod_network_find_nic), and no network.* object
            # registered one
            _no_network(s, "socket")
            raise OSError("no available NIC")

        def _net(self, *a, **k):
            raise _no_network(s, "socket")

        connect = bind = sendto = _no_nic
        send = sendall = recv = recvfrom = listen = accept = _net

        def settimeout(self, t):
            pass

        def close(self):
            pass

    def getaddrinfo(*a, **k):
        raise _no_network(s, "socket.getaddrinfo")

    return module("usocket", "", socket=socket, getaddrinfo=getaddrinfo, AF_INET=2, SOCK_STREAM=1,
                  SOCK_DGRAM=2, SOL_SOCKET=1, SO_REUSEADDR=4)


make_socket = make_usocket


class onewire:
    """modules.onewire (v0.6.2 modules/onewire/py_onewire.c) on an empty bus: the pull-up
    keeps the line high, so reset() sees no presence pulse (False), every bit read is 1
    (bytes 0xFF), search() finds no ROM ([]); writes only take their slot time."""
    _RESET_US, _BIT_US = 960, 66

    def __init__(self, *args, **kwargs):
        from tl2k210.maixpy import board as _b
        a = parse_all(args, kwargs, [("gpio", REQUIRED)])
        self._b, g = _b.current(), get_int(a["gpio"])
        if _fpioa_state(self._b).get(g) is None or not (
                FUNC["GPIOHS0"] <= g <= FUNC["GPIOHS31"] or FUNC["GPIO0"] <= g <= FUNC["GPIO7"]):
            raise ValueError("gpio error")
        self._gpio = g - (FUNC["GPIO0"] if g >= FUNC["GPIO0"] else FUNC["GPIOHS0"])

    def _t(self, us):
        self._b.clock.advance(us)

    def reset(self):
        self._t(self._RESET_US)
        return False

    def readbit(self):
        self._t(self._BIT_US)
        return 1

    def readbyte(self):
        self._t(8 * self._BIT_US)
        return 0xFF

    def readbuffer(self, count):
        n = get_int(count)
        self._t(8 * n * self._BIT_US)
        return bytearray(b"\xff" * n)

    def writebit(self, value):
        get_int(value)
        self._t(self._BIT_US)

    def writebyte(self, value):
        get_int(value)
        self._t(8 * self._BIT_US)

    def writebuffer(self, data):
        self._t(8 * len(bytes(memoryview(data))) * self._BIT_US)

    def select(self, rom):
        n = len(bytes(memoryview(rom)))
        self._t(self._RESET_US + 8 * (1 + n) * self._BIT_US)

    def search(self, diff):
        get_int(diff)
        self._t(0xFF * self._RESET_US)            # 255 tries, no presence pulse on any
        return []

    def skip(self):
        self._t(8 * self._BIT_US)

    def depower(self):
        return None

    @staticmethod
    def crc8(data):
        crc = 0
        for byte in bytes(memoryview(data)):
            for _ in range(8):
                fb = (crc ^ byte) & 1
                if fb:
                    crc ^= 0x18
                crc = (crc >> 1) & 0x7F
                if fb:
                    crc |= 0x80
                byte >>= 1
        return crc

    def __repr__(self):
        return "[Maixduino]onewire:(%#x) gpio=%d\r\n" % (id(self) & 0xFFFFFFFF, self._gpio)


def make_modules(s):
    """v0.6.2 modules/py_modules.c: ultrasonic, onewire, ws2812 (CONFIG_MAIXPY_WS2812_ENABLE=y);
    htpa and amg88xx are not in the default build (config_defaults.mk)."""
    return module("modules", "MaixPy modules (ultrasonic, onewire, ws2812)",
                  ws2812=_Anything("ws2812"), ultrasonic=_Anything("ultrasonic"),
                  onewire=onewire)


def make_video(s):
    """video/py_video.c py_video_open (v0.6.2, CONFIG_MAIXPY_VIDEO_ENABLE=y): the keywords are
    checked, a path not ending in .avi is NotImplementedError, a missing file to play is the
    file system's OSError; AVI playback (MJPEG decode to the LCD) and recording are not
    emulated: OSError EOPNOTSUPP with a note, not a stand-in that silently does nothing."""
    def open(*args, **kwargs):
        if not args:
            raise TypeError("function missing 1 required positional arguments")
        path = args[0]
        if not isinstance(path, str):
            raise TypeError(f"can't convert {type(path).__name__} to str")
        a = parse_all(args[1:], kwargs, [("*record", False), ("*interval", 100000), ("*quality", 50),
                                         ("*width", 320), ("*height", 240), ("*audio", False),
                                         ("*sample_rate", 44100), ("*channels", 1)])
        if not path.endswith(".avi"):
            raise NotImplementedError("[MaixPy] video: format not support")
        if not a["record"]:
            s.board.vfs.open(path, "rb").close()   # ENOENT (with the host's note) first
        what = "recording" if a["record"] else "playback"
        s.board.note(f"video.open: AVI {what} is not emulated on the host", ("video", what))
        raise oserror(95)

    return module("video", "", open=open)


def make_touchscreen(s):
    return module("touchscreen", "", init=lambda *a, **k: None, read=lambda: (0, 0, 0),
                  STATUS_IDLE=0, STATUS_RELEASE=1, STATUS_PRESS=2, STATUS_MOVE=3)


def make_pmu(s):
    """The M5StickV build's frozen pmu.py: axp192() on I2C0 (pins 28/29), the registers and
    scales that file reads; a board without the chip has no such module (ImportError)."""
    if "pmu" not in s.board.profile.modules:
        raise ImportError("no module named 'pmu'")

    class PMUError(Exception):
        pass

    class NotFoundError(PMUError):
        pass

    class OutOfRange(PMUError):
        pass

    class axp192:
        ADDR = 52

        def __init__(self, i2cDev=None):
            self.i2cDev = i2cDev if i2cDev is not None else I2C(I2C.I2C0, freq=400000, scl=28, sda=29)
            if self.ADDR not in self.i2cDev.scan():
                raise NotFoundError()

        def _w(self, reg, value):
            self.i2cDev.writeto_mem(self.ADDR, reg, value, mem_size=8)

        def _r(self, reg):
            self.i2cDev.writeto(self.ADDR, bytes([reg]))
            return self.i2cDev.readfrom(self.ADDR, 1)[0]

        def _adc(self, reg, bits, step, offset):
            return ((self._r(reg) << bits) + self._r(reg + 1)) * step + offset

        def enableADCs(self, enable):
            self._w(0x82, 0xFF if enable else 0x00)

        def enableCoulombCounter(self, enable):
            self._w(0xB8, 0x80 if enable else 0x00)

        def stopCoulombCounter(self):
            self._w(0xB8, 0xC0)

        def clearCoulombCounter(self):
            self._w(0xB8, 0xA0)

        def getBatteryInstantWatts(self):
            return ((self._r(0x70) << 16) + (self._r(0x71) << 8) + self._r(0x72)) * 1.1 * 0.5 / 1000

        def setK210Vcore(self, vol):
            if vol > 1.05 or vol < 0.8:
                raise OutOfRange("Voltage is invaild for K210")
            self._w(0x23, int((vol - 0.7) * 1000 / 25))

        def setScreenBrightness(self, brightness):
            if brightness > 15 or brightness < 0:
                raise OutOfRange("Range for brightness is from 0 to 15")
            self._w(0x91, (int(brightness) & 0x0F) << 4)

        def getKeyStatus(self):          # -1: no press, 1: short, 2: long
            k = self._r(0x46)
            return 1 if k & 0x02 else 2 if k & 0x01 else -1

        def setEnterSleepMode(self):
            for reg, value in ((0x31, 0x0F), (0x91, 0x00), (0x12, 0x00)):
                self._w(reg, value)

        def enablePMICSleepMode(self, enable):
            s.board.note("pmu.axp192.enablePMICSleepMode: the power key's sleep timer is not emulated",
                         "pmu-sleep")
            self._w(0x36, 0x27 if enable else 0x6C)

    for name, adc in _board.AXP192_ADC.items():     # getVbatVoltage, getUSBVoltage, ...
        setattr(axp192, name, lambda self, adc=adc: self._adc(*adc))
    return module("pmu", "M5StickV frozen pmu.py (AXP192)", axp192=axp192, PMUError=PMUError,
                  NotFoundError=NotFoundError, OutOfRange=OutOfRange)


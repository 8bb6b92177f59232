"""The modules a MaixPy v1 board has (docs/maixpy-firmware.md#micropython-surface), built per Session.

`BUILTIN` maps every importable name to a factory `f(session) -> module`. Names without the `u`
prefix exist only where the port defines a weak link (binascii, collections, errno, heapq, json,
os, random, re, struct, zlib, hashlib, time); `import io` fails as it does on a board (use
`uio`). The core modules follow MicroPython 1.11's subset and differences:

* sys: platform 'MaixPy', implementation (name='micropython', version=(0, 6, 2)), version
  '3.4.0', print_exception(exc[, file]), exit, path, argv, modules, stdin/stdout/stderr; no
  exc_info, no getsizeof;
* time/utime: the board clock (timing.py): ticks_ms/us/cpu/diff/add, sleep (float seconds),
  sleep_ms/us (ints only), time() = seconds since the RTC's 2000-01-01 at power-on, localtime,
  mktime, clock() objects with tick/fps/avg/reset;
* os/uos: the board's /flash and /sd (vfs.py); no os.sep, os.path, os.environ;
* gc: mem_free/mem_alloc from the board heap (heap.py), collect() returns None;
* uhashlib: sha256 only (update, digest; no hexdigest); ujson floats at single precision.
"""
from __future__ import annotations

import array as _array
import binascii as _binascii
import cmath as _cmath
import collections as _collections
import errno as _errno
import hashlib as _hashlib
import heapq as _heapq
import io as _io
import json as _json
import math as _math
import random as _random
import re as _re
import struct as _struct
import sys as _sys
import threading as _threading
import types
import zlib as _zlib

from tl2k210.maixpy import timing
from tl2k210.maixpy.args import get_int
from tl2k210.maixpy.runtime import _Err, mp_float, mp_repr, mp_str
from tl2k210.maixpy.vfs import EPOCH_2000, oserror

BUILTIN = {}
IMPORT_HINTS = {
    "io": "MicroPython 1.11 on MaixPy has no weak link for io: `import uio` (this fails on a "
          "board too)",
    "select": "MaixPy is built without uselect", "uselect": "MaixPy is built without uselect",
    "numpy": "numpy does not exist on MaixPy; the `ulab` module (a small numpy subset) does",
    "os.path": "MicroPython's os has no os.path", "pathlib": "not a MicroPython module",
    "typing": "not a MicroPython module", "datetime": "not a MicroPython module (use utime)",
    "cv2": "OpenCV does not exist on MaixPy; the `image` module has the OpenMV filters",
    "PIL": "PIL does not exist on MaixPy; use the `image` module",
}
for _m in ("lvgl", "speech_recognizer", "ucryptolib_hw", "mfrc522"):
    IMPORT_HINTS[_m] = ("a MaixPy firmware module (optional builds) that the host does not "
                        "emulate; a board with that build would import it")


def builtin(*names):
    def deco(fn):
        for n in names:
            BUILTIN[n] = fn
        return fn
    return deco


def module(name, doc="", **attrs):
    m = types.ModuleType(name, doc)
    m.__dict__.update(attrs)
    return m


def _pick(src, names):
    return {n: getattr(src, n) for n in names if hasattr(src, n)}


def _board(s):
    return s.board


# ---------------------------------------------------------------------------------------------
# builtins
class _BytearrayType(type):
    """The script's `bytearray` is the real type for isinstance, issubclass and ==."""

    def __instancecheck__(cls, obj):
        return isinstance(obj, bytearray)

    def __subclasscheck__(cls, sub):
        return issubclass(sub, bytearray)

    def __eq__(cls, other):
        return other is bytearray or type.__eq__(cls, other) is True

    def __hash__(cls):
        return hash(bytearray)


class mp_bytearray(bytearray, metaclass=_BytearrayType):
    """objarray.c bytearray_make_new (MicroPython 1.11): one non-int argument is read through
    the buffer protocol, which a str has, so bytearray('ab') is bytearray(b'ab'); a 2nd/3rd
    argument (encoding, errors) is accepted and not used."""

    def __new__(cls, *args):
        if len(args) > 3:
            raise TypeError("function expected at most 3 arguments, got %d" % len(args))
        if args and isinstance(args[0], str):
            args = (args[0].encode(),)
        elif len(args) > 1:
            args = args[:1]
        if cls is mp_bytearray:
            return bytearray(*args)
        return bytearray.__new__(cls, *args)

    def __init__(self, *args):
        if type(self) is not mp_bytearray:
            if args and isinstance(args[0], str):
                args = (args[0].encode(),)
            bytearray.__init__(self, *args[:1])


mp_bytearray.__name__ = mp_bytearray.__qualname__ = "bytearray"
mp_bytearray.__module__ = "builtins"


def make_builtins(s):
    import builtins as py
    b = dict(vars(py))
    for gone in ("exit", "quit", "copyright", "credits", "license", "breakpoint", "memoryview2"):
        b.pop(gone, None)
    out = s.out

    def _print(*args, sep=" ", end="\n", file=None, flush=False):
        text = (" " if sep is None else str(sep)).join(mp_str(a) for a in args) + \
               ("\n" if end is None else str(end))
        (file or out).write(text)

    def _open(file, mode="r", *args, **kw):
        if isinstance(file, int):
            raise oserror(_errno.EBADF)
        return s.board.vfs.open(file, mode)

    def _input(prompt=""):
        out.write(str(prompt))
        if s.on_input is None:
            raise EOFError("the emulated board has no serial input (host)")
        return s.host_wait(s.on_input, str(prompt))

    def _exec(source, globals=None, locals=None):
        code = source if isinstance(source, types.CodeType) else s.compile(str(source), "<string>")
        g = globals if globals is not None else _sys._getframe(1).f_globals
        loc = locals if locals is not None else (_sys._getframe(1).f_locals if globals is None else g)
        return py.exec(code, g, loc)

    def _eval(source, globals=None, locals=None):
        code = source if isinstance(source, types.CodeType) else s.compile(str(source), "<string>", "eval")
        g = globals if globals is not None else _sys._getframe(1).f_globals
        loc = locals if locals is not None else (_sys._getframe(1).f_locals if globals is None else g)
        return py.eval(code, g, loc)

    def _compile(source, filename, mode, *a, **k):
        return s.compile(source if isinstance(source, str) else source.decode(), filename, mode)

    def _help(obj=None):
        out.write("Welcome to MicroPython on the Sipeed Maix (tl2k210 host emulation)!\n"
                  if obj is None else f"object {obj!r} is of type {type(obj).__name__}\n")

    def _dir(*args):
        """py/modbuiltins.c mp_builtin_dir (mpdir.py)."""
        from tl2k210.maixpy import mpdir
        if len(args) > 1:
            raise TypeError("function expected at most 1 arguments, got %d" % len(args))
        if args:
            return mpdir.dir_object(args[0])
        g = _sys._getframe(1).f_globals
        return mpdir.dir_namespace(g, s.dir_history if g is s.globals else ())

    b.update(print=_print, open=_open, input=_input, exec=_exec, eval=_eval, compile=_compile,
             bytearray=mp_bytearray, repr=mp_repr, dir=_dir,
             help=_help, __import__=s._import)
    return b


# ---------------------------------------------------------------------------------------------
class _Implementation(tuple):
    def __new__(cls):
        return super().__new__(cls, ("micropython", (0, 6, 2)))

    name = property(lambda self: self[0])
    version = property(lambda self: self[1])

    def __repr__(self):
        return "(name='micropython', version=(0, 6, 2))"


class Stdin:
    """sys.stdin: lib/utils/sys_stdio_mphal.c (MaixPy's core @ced340d). read(n) takes n
    characters from the REPL UART, blocking for each (mp_hal_stdin_rx_chr), '\\r' read as
    '\\n'; readline() up to '\\n'; write raises EPERM. The characters come from the session's
    console input (Session.read_char: a REPL board's UART, or its on_input lines); a run without
    one waits as a board would, until the watchdog stops it."""

    def __init__(self, s):
        self._s = s

    def __repr__(self):
        return "<io.FileIO 0>"

    def read(self, size=-1):
        size = -1 if size is None else get_int(size)
        out = []
        while size < 0 or len(out) < size:
            c = self._s.read_char()
            if c is None:                          # the console went away (host)
                break
            out.append(c)
        return "".join(out)

    def readline(self, size=-1):
        size = -1 if size is None else get_int(size)
        out = []
        while size < 0 or len(out) < size:
            c = self._s.read_char()
            if c is None:
                break
            out.append(c)
            if c == "\n":
                break
        return "".join(out)

    def readlines(self):
        return [self.readline()]

    def readinto(self, buf, size=None):
        n = len(buf) if size is None else min(len(buf), get_int(size))
        data = self.read(n).encode("utf-8")[:n]
        buf[:len(data)] = data
        return len(data)

    def write(self, data):
        raise oserror(_errno.EPERM)

    def close(self):
        return None

    def __enter__(self):
        return self

    def __exit__(self, *a):
        return None

    def __iter__(self):
        return self

    def __next__(self):
        line = self.readline()
        if not line:
            raise StopIteration
        return line


def make_sys(s):
    def print_exception(exc, file=None):
        if file is not None and not hasattr(file, "write"):
            raise TypeError("stream operation not supported")
        (file or s.out).write(s.format_exception(exc))

    def _exit(code=0):
        raise SystemExit(code)

    return module("sys", "MicroPython sys (MaixPy)", path=[], argv=[], modules=s.modules,
                  platform="MaixPy", implementation=_Implementation(), version="3.4.0",
                  version_info=(3, 4, 0), byteorder="little", maxsize=2 ** 63 - 1,
                  stdin=Stdin(s), stdout=s.out, stderr=_Err(s.out),
                  print_exception=print_exception, exit=_exit)


@builtin("sys")
def _sys_mod(s):
    return s.sys


@builtin("builtins")
def _builtins_mod(s):
    return module("builtins", "", **s.builtins)


# ---------------------------------------------------------------------------------------------
# time
class clock:
    """time.clock(): tick() / fps() / avg() with the firmware's rules (docs/maixpy-firmware.md#time)."""

    def __init__(self, board):
        self._b = board
        self.reset()

    def _ms(self):
        return self._b.clock.now_us() // 1000

    def reset(self):
        self.t_start, self.t_ticks, self.t_frame = 0, 0, 0
        self._avg_ticks, self._avg_frames = 0, 0

    def tick(self):
        self.t_start = self._ms()

    def fps(self):
        self.t_frame += 1
        dt = self._ms() - self.t_start
        self.t_ticks += dt
        self._avg_ticks += dt
        self._avg_frames += 1
        fps = float("inf") if self.t_ticks == 0 else 1000.0 / (self.t_ticks / self.t_frame)
        if self.t_ticks >= 2000:
            self.t_ticks, self.t_frame = 0, 0
        return fps

    def avg(self):
        return float(self._avg_ticks) / max(1, self._avg_frames)

    def __repr__(self):
        return f"t_start:{self.t_start}, t_ticks:{self.t_ticks}, t_frame:{self.t_frame}\n"


@builtin("utime", "time")
def _time(s):
    from tl2k210.maixpy.args import get_float, get_int
    b = s.board
    c = b.clock

    def ticks_ms():
        c.check()
        return c.now_us() // 1000

    def ticks_us():
        c.check()
        return c.now_us()

    def ticks_cpu():
        return c.now_us() * 400

    def sleep(sec):
        c.sleep(get_float(sec) * 1e6)

    def sleep_ms(ms):
        c.sleep(get_int(ms) * 1000)

    def sleep_us(us):
        c.sleep(get_int(us))

    def _now():
        # the RTC: 2000-01-01 00:00:00 at power-on, moved by set_time (b.rtc_offset seconds)
        return c.now_us() // 1_000_000 + b.rtc_offset

    def _secs(six):
        """Seconds since 2000 of (year, month, day, hour, minute, second)."""
        import calendar
        return calendar.timegm(tuple(six) + (0, 0, 0)) - EPOCH_2000

    def localtime(secs=None):
        import time as t
        secs = _now() if secs is None else get_int(secs)
        tm = t.gmtime(secs + EPOCH_2000)
        return (tm.tm_year, tm.tm_mon, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                tm.tm_wday, tm.tm_yday)

    def mktime(tup):
        if len(tup) not in (8, 9):
            raise TypeError("mktime needs a tuple of length 8 or 9")
        return _secs(tup[:6])

    def set_time(tup):
        """modutime.c: rtc_timer_set(year, mon, mday, hour, min, sec) from the first six items;
        time(), localtime() then count on from there. True on success."""
        try:
            secs = _secs(get_int(v) for v in list(tup)[:6])
        except (ValueError, OverflowError):
            return False
        b.rtc_offset = secs - c.now_us() // 1_000_000
        return True

    return module("utime", "MicroPython utime on the board clock (tl2k210/maixpy/timing.py)",
                  ticks_ms=ticks_ms, ticks_us=ticks_us, ticks_cpu=ticks_cpu, ticks=ticks_ms,
                  ticks_diff=lambda a, b: get_int(a) - get_int(b),
                  ticks_add=lambda a, b: get_int(a) + get_int(b),
                  sleep=sleep, sleep_ms=sleep_ms, sleep_us=sleep_us, time=_now,
                  localtime=localtime, mktime=mktime, set_time=set_time,
                  clock=lambda: clock(b))


# ---------------------------------------------------------------------------------------------
@builtin("uos", "os")
def _os(s):
    v = s.board.vfs

    def uname():
        return _Uname()

    def urandom(n):
        import os
        return os.urandom(n)

    def ilistdir(path=None):
        return v.ilistdir(path)

    def mount(*a, **k):
        raise oserror(_errno.EPERM)

    def flash_format():
        s.board.note("os.flash_format(): the host /flash folder is left as it is", "format")

    def vfs(kind):
        class Vfs:            # a filesystem over a script's own block device: not emulated
            def __init__(self, *a, **k):
                s.board.note(f"uos.{kind} (a filesystem on a script's own block device) is not emulated on "
                             "the host: only /flash and /sd are mounted", kind)
                raise oserror(_errno.EOPNOTSUPP)
        Vfs.__name__ = Vfs.__qualname__ = kind
        return Vfs

    return module("uos", "MicroPython uos over the board's /flash and /sd (vfs.py)",
                  uname=uname, urandom=urandom, ilistdir=ilistdir, listdir=v.listdir,
                  mkdir=v.mkdir, rmdir=v.rmdir, chdir=v.chdir, getcwd=v.getcwd, remove=v.remove,
                  rename=v.rename, stat=v.stat, statvfs=v.statvfs, sync=lambda: None,
                  mount=mount, umount=mount, set_REPLio=lambda *a: None, dupterm=lambda *a: None,
                  flash_format=flash_format, VfsSpiffs=vfs("VfsSpiffs"), VfsFat=vfs("VfsFat"))


class _Uname(tuple):
    _f = ("sysname", "nodename", "release", "version", "machine")

    def __new__(cls):
        return super().__new__(cls, ("MaixPy", "MaixPy", "0.6.2", "v0.6.2-0-tl2k210 on 2020-12-16",
                                     "Sipeed_M1 with kendryte-k210"))

    def __getattr__(self, k):
        if k in self._f:
            return self[self._f.index(k)]
        raise AttributeError(k)

    def __repr__(self):
        return "(" + ", ".join(f"{k}='{v}'" for k, v in zip(self._f, self)) + ")"


# ---------------------------------------------------------------------------------------------
@builtin("gc")
def _gc(s):
    import gc as pygc
    state = {"on": True, "threshold": -1}

    def collect():
        pygc.collect()
        s.board.clock.advance(int(timing.GC_COLLECT_US_PER_KIB * s.board.runtime.gc_heap / 1024))
        return None

    def threshold(n=None):
        if n is None:
            return state["threshold"]
        state["threshold"] = n

    return module("gc", "MicroPython gc: the board's GC heap (heap.py)", collect=collect,
                  mem_free=lambda: s.board.gc.free(),
                  mem_alloc=lambda: s.board.gc.used,
                  enable=lambda: state.update(on=True), disable=lambda: state.update(on=False),
                  isenabled=lambda: state["on"], threshold=threshold)


@builtin("micropython")
def _micropython(s):
    def mem_info(verbose=None):
        h = s.board.gc
        s.out.write(f"stack: 2048 out of 16384\nGC: total: {h.pool}, used: {h.used}, "
                    f"free: {h.free()}\n")

    ident = lambda f: f   # noqa: E731
    return module("micropython", "", const=lambda x: x, opt_level=lambda *a: 0, mem_info=mem_info,
                  qstr_info=lambda *a: None, stack_use=lambda: 2048, heap_lock=lambda: None,
                  heap_unlock=lambda: None, kbd_intr=lambda c: setattr(s, "kbd_intr", c),
                  schedule=lambda f, a: f(a), alloc_emergency_exception_buf=lambda n: None,
                  native=ident, viper=ident, asm_thumb=ident)


# ---------------------------------------------------------------------------------------------
# io
@builtin("uio")
def _uio(s):
    return module("uio", "MicroPython uio", StringIO=_io.StringIO, BytesIO=_io.BytesIO,
                  open=s.builtins["open"], FileIO=_io.FileIO, TextIOWrapper=_io.TextIOWrapper,
                  IOBase=_io.IOBase)


@builtin("ujson", "json")
def _ujson(s):
    def dumps(obj):
        if isinstance(obj, bool) or obj is None:
            return {True: "true", False: "false", None: "null"}[obj]
        if isinstance(obj, float):
            return mp_float(obj)
        if isinstance(obj, int):
            return str(obj)
        if isinstance(obj, str):
            return _json.dumps(obj)
        if isinstance(obj, (list, tuple)):
            return "[" + ", ".join(dumps(v) for v in obj) + "]"
        if isinstance(obj, dict):
            return "{" + ", ".join(f"{_json.dumps(str(k))}: {dumps(v)}" for k, v in obj.items()) + "}"
        raise TypeError(f"can't convert {type(obj).__name__} to json")

    def dump(obj, stream):
        stream.write(dumps(obj))

    def loads(text):
        if isinstance(text, (bytes, bytearray)):
            text = text.decode()
        try:
            return _json.loads(text)
        except ValueError:
            raise ValueError("syntax error in JSON") from None

    def load(stream):
        return loads(stream.read())

    return module("ujson", "MicroPython ujson (floats at single precision)", dumps=dumps,
                  dump=dump, loads=loads, load=load)


def _packed_items(fmt, values):
    """modstruct.c (MicroPython 1.11) packs an 's' item from anything with the buffer protocol,
    str included (its UTF-8 bytes); CPython's struct takes only bytes/bytearray there. And an
    integer item is stored as its low bytes, without CPython's range check (mp_binary_set_int: a
    MAVLink script packs 0xFE as 'b' and a 16-bit CRC as 'h')."""
    fmt = fmt.decode() if isinstance(fmt, (bytes, bytearray)) else str(fmt)
    out, i, num = list(values), 0, ""
    order = fmt[0] if fmt[:1] in ("<", ">", "!", "=", "@") else "@"
    for ch in fmt.lstrip("<>!=@"):
        if ch.isdigit():
            num += ch
            continue
        cnt, num = (int(num) if num else 1), ""
        if ch == "s":
            if i < len(out):
                v = out[i]
                if isinstance(v, str):
                    out[i] = v.encode()
                elif not isinstance(v, (bytes, bytearray)):
                    try:
                        out[i] = bytes(memoryview(v))
                    except TypeError:
                        pass
            i += 1
        elif ch in "bBhHiIlLqQ":
            bits = 8 * _struct.calcsize(order + ch)
            for k in range(i, min(i + cnt, len(out))):
                if isinstance(out[k], int) and not isinstance(out[k], bool):
                    v = out[k] & ((1 << bits) - 1)
                    out[k] = v - (1 << bits) if ch.islower() and v >> (bits - 1) else v
            i += cnt
        elif ch != "x" and not ch.isspace():
            i += cnt
    return out


@builtin("ustruct", "struct")
def _ustruct(s):
    def pack(fmt, *values):
        return _struct.pack(fmt, *_packed_items(fmt, values))

    def pack_into(fmt, buffer, offset, *values):
        return _struct.pack_into(fmt, buffer, offset, *_packed_items(fmt, values))

    return module("ustruct", "", pack=pack, pack_into=pack_into,
                  **_pick(_struct, ("unpack", "calcsize", "unpack_from")))


@builtin("ubinascii", "binascii")
def _ubinascii(s):
    def hexlify(data, sep=None):
        h = _binascii.hexlify(bytes(data))
        if sep:
            sep = sep.encode() if isinstance(sep, str) else bytes(sep)
            h = sep.join(h[i:i + 2] for i in range(0, len(h), 2))
        return h

    return module("ubinascii", "", hexlify=hexlify, unhexlify=_binascii.unhexlify,
                  a2b_base64=_binascii.a2b_base64, b2a_base64=_binascii.b2a_base64,
                  crc32=_binascii.crc32)


class sha256:
    """uhashlib.sha256 (MaixPy's build: sha256 only; update and digest, no hexdigest)."""

    def __init__(self, data=b""):
        self._h = _hashlib.sha256()
        if data:
            self.update(data)

    def update(self, data):
        self._h.update(data.encode() if isinstance(data, str) else bytes(data))

    def digest(self):
        return self._h.digest()


@builtin("uhashlib", "hashlib")
def _uhashlib(s):
    return module("uhashlib", "MaixPy uhashlib: sha256 only", sha256=sha256)


@builtin("ure", "re")
def _ure(s):
    return module("ure", "", **_pick(_re, ("compile", "match", "search", "sub", "split")),
                  DEBUG=0)


@builtin("ucollections", "collections")
def _ucollections(s):
    def deque(iterable, maxlen, flags=0):
        return _collections.deque(iterable, maxlen)

    return module("ucollections", "", namedtuple=_collections.namedtuple,
                  OrderedDict=_collections.OrderedDict, deque=deque)


@builtin("uerrno", "errno")
def _uerrno(s):
    names = ("EPERM", "ENOENT", "EIO", "EBADF", "EAGAIN", "ENOMEM", "EACCES", "EEXIST", "ENODEV",
             "EISDIR", "EINVAL", "EOPNOTSUPP", "EADDRINUSE", "ECONNABORTED", "ECONNRESET",
             "ENOBUFS", "ENOTCONN", "ETIMEDOUT", "ECONNREFUSED", "EHOSTUNREACH", "EALREADY",
             "EINPROGRESS")
    attrs = {n: getattr(_errno, n) for n in names if hasattr(_errno, n)}
    return module("uerrno", "", errorcode={v: k for k, v in attrs.items()}, **attrs)


@builtin("math")
def _m(s):
    return module("math", "", **{k: v for k, v in vars(_math).items() if not k.startswith("_")})


@builtin("cmath")
def _cm(s):
    return module("cmath", "", **{k: v for k, v in vars(_cmath).items() if not k.startswith("_")})


@builtin("urandom", "random")
def _urandom(s):
    r = _random.Random(0)
    return module("urandom", "", getrandbits=r.getrandbits, seed=r.seed, randint=r.randint,
                  randrange=r.randrange, choice=r.choice, random=r.random, uniform=r.uniform)


@builtin("uheapq", "heapq")
def _uheapq(s):
    return module("uheapq", "", heappush=_heapq.heappush, heappop=_heapq.heappop,
                  heapify=_heapq.heapify)


@builtin("uzlib", "zlib")
def _uzlib(s):
    def decompress(data, wbits=15, bufsize=0):
        return _zlib.decompress(bytes(data), wbits)

    return module("uzlib", "", decompress=decompress)


@builtin("array")
def _arr(s):
    return module("array", "", array=_array.array)


@builtin("_thread")
def _thread(s):
    from tl2k210.maixpy import threads

    def start_new_thread(fn, args, kwargs=None):
        return threads.start_new_thread(s, fn, args, kwargs)

    def allocate_lock():
        return threads.lock(s)

    size = [0]

    def stack_size(*a):
        """returns the previous size; 0 means the default (modthread.c)"""
        old = size[0]
        if a:
            size[0] = get_int(a[0])
        return old

    def _exit():
        raise SystemExit()

    return module("_thread", "", start_new_thread=start_new_thread,
                  allocate_lock=allocate_lock, get_ident=_threading.get_ident,
                  stack_size=stack_size, exit=_exit, LockType=threads.lock)


def not_emulated(s, note, key):
    """A board function the host does not emulate: it records `note` (once per `key`) and raises
    OSError EOPNOTSUPP, as docs/maixpy-host.md says of all such."""
    def f(*a, **k):
        s.board.note(note, key)
        raise oserror(_errno.EOPNOTSUPP)
    return f


@builtin("ucryptolib")
def _ucryptolib(s):
    class aes:
        def __init__(self, *a, **k):
            s.board.note("ucryptolib.aes is not emulated on the host", "aes")
            raise oserror(_errno.EOPNOTSUPP)
    return module("ucryptolib", "", aes=aes)


@builtin("uctypes")
def _uctypes(s):
    """moductypes.c (MicroPython 1.11, in the MaixPy build): its type constants, so that a script's
    layouts import; what reads or writes memory by address (struct, bytes_at, bytearray_at,
    addressof, sizeof of a layout) is not emulated on the host: OSError EOPNOTSUPP with a note."""
    def small(x, bits):     # TYPE2SMALLINT: ((int32)(x << (32 - bits))) >> 1, arithmetic
        v = (x << (32 - bits)) & 0xFFFFFFFF
        return (v - (1 << 32) if v >> 31 else v) >> 1
    types_ = ("UINT8", "INT8", "UINT16", "INT16", "UINT32", "INT32", "UINT64", "INT64", "BFUINT8",
              "BFINT8", "BFUINT16", "BFINT16", "BFUINT32", "BFINT32", "FLOAT32", "FLOAT64")
    consts = {name: small(k, 4) for k, name in enumerate(types_)}       # VAL_TYPE_BITS 4
    consts.update(VOID=0, PTR=small(1, 2), ARRAY=small(2, 2), NATIVE=2, LITTLE_ENDIAN=0, BIG_ENDIAN=1,
                  BF_POS=17, BF_LEN=22)         # AGG_TYPE_BITS 2; OFFSET_BITS, + BITF_OFF_BITS
    return module("uctypes", "MicroPython uctypes (memory access not emulated)", **consts,
                  **{n: not_emulated(s, f"uctypes.{n}: memory by address is not emulated on the host", "uctypes")
                     for n in ("struct", "bytes_at", "bytearray_at", "addressof", "sizeof")})


@builtin("nes")
def _nes(s):
    """nes/py_nes.c (CONFIG_MAIXPY_NES_ENABLE=y in v0.6.2's default build): the module imports
    with its constants; the NES emulator itself (InfoNES on the LCD) is not emulated on the
    host, so init/load/loop/input/free raise OSError EOPNOTSUPP with a note."""
    return module("nes", "MaixPy nes (not emulated)", INPUT=0, KEYBOARD=1, JOYSTICK=2,
                  **{n: not_emulated(s, f"nes.{n}: the NES emulator of the firmware is not emulated on the host",
                                     "nes") for n in ("init", "load", "loop", "free", "input")})


@builtin("pye_mp")
def _pye_mp(s):
    """builtin_py/pye_mp.py, frozen into v0.6.2: pye(*files) is a full-screen VT100 editor on
    the serial terminal -- an interactive tool the host does not emulate."""
    def pye(*content, tab_size=4, undo=50, device=0):
        s.board.note("pye_mp.pye: the frozen full-screen editor needs an interactive serial "
                     "terminal; not emulated on the host", "pye")
        raise oserror(_errno.EOPNOTSUPP)
    return module("pye_mp", "MaixPy frozen pye_mp.py (the editor is not emulated)", pye=pye)


# the MaixPy modules proper (their factories live with their implementations)
def _lazy(modname, attr="make_module"):
    def factory(s):
        import importlib
        return getattr(importlib.import_module(modname), attr)(s)
    return factory


for _name, _mod in (("image", "tl2k210.maixpy.image"), ("sensor", "tl2k210.maixpy.sensor"),
                    ("lcd", "tl2k210.maixpy.lcd"), ("KPU", "tl2k210.maixpy.KPU"),
                    ("maix", "tl2k210.maixpy.canmv"), ("ulab", "tl2k210.maixpy.ulab")):
    BUILTIN[_name] = _lazy(_mod)
for _name in ("machine", "Maix", "board", "fpioa_manager", "audio", "network", "usocket",
              "socket", "modules", "video", "touchscreen", "ide_debug", "pmu"):
    BUILTIN[_name] = _lazy("tl2k210.maixpy.periph", "make_" + _name)

"""Argument rules of the MaixPy firmware (docs/maixpy-firmware.md#micropython-surface,
#argument-rules, #colours, #checklist).

Two parsers exist in the firmware and both are reproduced here:

* OpenMV's `py_helper_keyword_*` (image methods, lcd.display/clear, sensor.reset/snapshot/
  skip_frames, kpu.load, kpu.run_yolo2): each option is ONE keyword name looked up in the kwargs,
  falling back to a fixed positional slot, then to a default. A keyword overrides a positional
  value in the same slot; **unknown keywords are ignored** (`draw_rectangle(r, tickness=3)` draws
  thickness 1) - the host records a note once per function and keyword;
* MicroPython's `mp_arg_parse_all` (lcd.init, KPU.init_yolo2, KPU.forward, GPIO, UART...):
  unknown keywords raise `TypeError: extra keyword arguments given`, too many positionals
  `extra positional arguments given`, a missing required one `'x' argument required`.

Ints are read with `mp_obj_get_int` (a float raises `TypeError: can't convert float to int`,
bools are 1/0), floats with `mp_obj_get_float` (ints and bools accepted). Colours are an int
(written raw: byte-swapped RGB565 on RGB565 images, 0..255 on grayscale) or a 3-tuple/list of
ints (clamped to 0..255).
"""
from __future__ import annotations

from tl2k210.maixpy import board as _board

_MISSING = object()


def type_name(v) -> str:
    t = type(v).__name__
    return {"NoneType": "NoneType", "bool": "bool"}.get(t, t)


def get_int(v, what=""):
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, int):
        return v
    if isinstance(v, float):
        raise TypeError("can't convert float to int")
    try:
        import numpy as np
        if isinstance(v, np.integer):
            return int(v)
    except ImportError:
        pass
    raise TypeError(f"can't convert {type_name(v)} to int")


def get_float(v, what=""):
    if isinstance(v, (bool, int, float)):
        return float(v)
    try:
        import numpy as np
        if isinstance(v, (np.integer, np.floating)):
            return float(v)
    except ImportError:
        pass
    raise TypeError(f"can't convert {type_name(v)} to float")


def seq(v, n=None):
    """A tuple/list (mp_obj_get_array); `n` checks the length like the firmware."""
    if not isinstance(v, (tuple, list)):
        raise TypeError(f"object '{type_name(v)}' isn't a tuple or list")
    if n is not None and len(v) != n:
        raise ValueError(f"requested length {n} but object has length {len(v)}")
    return v


def ignore_unknown(fname: str, kwargs: dict, known) -> None:
    """Drop keywords the firmware does not look up, with one host note per function+keyword."""
    for k in kwargs:
        if k not in known:
            _board.current().note(
                f"{fname}: keyword '{k}=' is not one the firmware reads (it knows "
                f"{', '.join(sorted(known)) or 'none'}); ignored, as a board ignores it",
                key=(fname, k))


def kw(args, kwargs, name, slot, default=_MISSING):
    """py_helper_keyword_*: kwargs[name], else args[slot], else default."""
    if name in kwargs:
        return kwargs[name]
    if slot is not None and 0 <= slot < len(args):
        return args[slot]
    if default is _MISSING:
        raise OSError("Not enough positional arguments!")
    return default


def consume_array(args, start: int, n: int, kwargs=None, name=None):
    """Leading geometry as n separate ints or one tuple/list (py_helper_consume_array):
    returns (ints, next positional slot)."""
    if start < len(args) and isinstance(args[start], (tuple, list)):
        v = seq(args[start], n)
        return [get_int(x) for x in v], start + 1
    if len(args) - start < n:
        raise OSError("Not enough positional arguments!")
    return [get_int(x) for x in args[start:start + n]], start + n


def check_arity(args, n_min, n_max=None):
    """mp_arg_check_num for the positional count."""
    n = len(args)
    if n < n_min:
        raise TypeError(f"function missing {n_min - n} required positional arguments")
    if n_max is not None and n > n_max:
        if n_min == n_max:
            raise TypeError(f"function takes {n_max} positional arguments but {n} were given")
        raise TypeError(f"function expected at most {n_max} arguments, got {n}")


def parse_all(args, kwargs, spec):
    """mp_arg_parse_all. `spec`: [(name, default)]; default REQUIRED marks a required arg,
    a name starting with '*' is keyword-only. Returns {name: value}. As in the firmware, a
    keyword that repeats a positional argument counts as an extra keyword."""
    positional = [s for s in spec if not s[0].startswith("*")]
    if len(args) > len(positional):
        raise TypeError("extra positional arguments given")
    out, used = {}, 0
    for i, (raw, default) in enumerate(spec):
        name = raw.lstrip("*")
        if not raw.startswith("*") and i < len(args):
            out[name] = args[i]
        elif name in kwargs:
            out[name] = kwargs[name]
            used += 1
        elif default is REQUIRED:
            raise TypeError(f"'{name}' argument required")
        else:
            out[name] = default
    if used < len(kwargs):
        raise TypeError("extra keyword arguments given")
    return out


REQUIRED = object()


# ---------------------------------------------------------------------------------------------
# colours
def _r8_to_r5(v):
    return (v * 31 + 127) // 255


def _g8_to_g6(v):
    return (v * 63 + 127) // 255


def r5_to_r8(v):
    return (v * 255 + 15) // 31


def g6_to_g8(v):
    return (v * 255 + 31) // 63


def rgb_to_raw565(r, g, b) -> int:
    """(r, g, b) -> the raw (byte-swapped) RGB565 int a MaixPy RGB565 pixel holds."""
    s = (_r8_to_r5(r) << 11) | (_g8_to_g6(g) << 5) | _b8(b)
    return ((s & 0xFF) << 8) | (s >> 8)


def _b8(b):
    return _r8_to_r5(b)


def raw565_to_rgb(v: int):
    """The raw int -> the (r, g, b) a board's get_pixel returns (COLOR_R5_TO_R8 tables)."""
    v &= 0xFFFF
    s = ((v & 0xFF) << 8) | (v >> 8)
    return r5_to_r8(s >> 11), g6_to_g8((s >> 5) & 0x3F), r5_to_r8(s & 0x1F)


def color(v, gray: bool, default=-1):
    """A colour argument -> (r, g, b) on the RGB565 lattice, or a 0..255 gray value."""
    if v is _MISSING:
        v = default
    if isinstance(v, (bool, int)) and not isinstance(v, float):
        iv = int(v)
        if gray:
            return iv & 0xFF if iv != -1 else 255
        return raw565_to_rgb(iv & 0xFFFF if iv != -1 else 0xFFFF)
    if isinstance(v, float):
        raise TypeError("can't convert float to int")
    t = seq(v)
    if len(t) != 3:
        raise ValueError(f"requested length 3 but object has length {len(t)}")
    r, g, b = (min(255, max(0, get_int(c))) for c in t)
    if gray:
        return (r * 38 + g * 75 + b * 15) >> 7
    return raw565_to_rgb(rgb_to_raw565(r, g, b))

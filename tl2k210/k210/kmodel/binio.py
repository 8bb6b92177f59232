"""Bounds-checked little-endian reading and declarative body structs.

Every read names the field it is for, so a truncated or absurd file raises
``KmodelFormatError`` with the byte offset and field name; nothing is allocated before its
size has been checked against the bytes actually present.
"""
from __future__ import annotations

import struct

import numpy as np

from tl2k210.errors import KmodelFormatError

# Composite field types: name -> (struct format, number of values). Composite values are tuples.
TYPES = {
    "u32": ("I", 1), "i32": ("i", 1), "f32": ("f", 1), "u8": ("B", 1), "bool": ("?3x", 1),
    "shape3": ("3I", 3),         # kpu_model_shape_t {width, height, channels}
    "shape4": ("4i", 4),         # runtime_shape_t {N, C, H, W}
    "range": ("4I", 4),          # memory_range {memory_type, datatype, start, size}
    "padding": ("2i", 2),        # {before, after}
    "vrange": ("2f", 2),         # value_range<float> {min, max}
    "qparam": ("if", 2),         # quant_param_t {zero_point, scale}
    "scalar": ("I4s", 2),        # {datatype, storage[4]}
    "pad4": ("8i", 8),           # padding[4]
}


class Struct:
    """A fixed-size little-endian record declared once as ``"name:type name:type ..."``."""

    def __init__(self, spec: str):
        self.fields = []
        fmt = "<"
        for item in spec.split():
            name, typ = item.split(":")
            f, n = TYPES[typ]
            self.fields.append((name, typ, n))
            fmt += f
        self._st = struct.Struct(fmt)
        self.size = self._st.size
        self.names = [f[0] for f in self.fields]

    def unpack(self, buf, offset: int = 0) -> dict:
        flat = self._st.unpack_from(buf, offset)
        out, i = {}, 0
        for name, typ, n in self.fields:
            out[name] = flat[i] if n == 1 else tuple(flat[i:i + n])
            i += n
        return out

    def pack(self, values: dict) -> bytes:
        flat = []
        for name, typ, n in self.fields:
            if name not in values:
                raise KmodelFormatError(f"cannot write this body: field {name!r} ({typ}) is missing; "
                                        f"a body needs {', '.join(self.names)}", None, name)
            v = values[name]
            flat.extend([v] if n == 1 else v)
        try:
            return self._st.pack(*flat)
        except (struct.error, TypeError) as exc:
            raise KmodelFormatError(f"cannot write this body ({exc}); fields: "
                                    f"{', '.join(self.names)}") from None


class Reader:
    """Cursor over a bytes object; every access is checked and names its field."""

    def __init__(self, data: bytes, pos: int = 0):
        self.data = memoryview(data)
        self.pos = pos

    def __len__(self):
        return len(self.data)

    def need(self, n: int, field: str, at: int | None = None) -> int:
        at = self.pos if at is None else at
        if n < 0 or at < 0 or at + n > len(self.data):
            raise KmodelFormatError(
                f"file ends inside {field}: needs {n} bytes at offset {at}, file has "
                f"{len(self.data)} bytes (truncated or corrupt kmodel)", at, field)
        return at

    def struct(self, st: Struct, field: str) -> dict:
        at = self.need(st.size, field)
        self.pos += st.size
        return st.unpack(self.data, at)

    def u32(self, field: str) -> int:
        at = self.need(4, field)
        self.pos += 4
        return struct.unpack_from("<I", self.data, at)[0]

    def bytes(self, n: int, field: str, at: int | None = None) -> bytes:
        at = self.need(n, field, at)
        if at == self.pos:
            self.pos += n
        return bytes(self.data[at:at + n])

    def array(self, dtype, count: int, field: str, at: int | None = None) -> np.ndarray:
        dt = np.dtype(dtype).newbyteorder("<")
        n = count * dt.itemsize
        raw = self.bytes(n, field, at)
        return np.frombuffer(raw, dtype=dt).astype(dt.newbyteorder("="))


def align_up(x: int, a: int) -> int:
    return (x + a - 1) // a * a



def padded_body(body: bytes, pos: int, recorded: int):
    """(body zero-padded, the padding): to the body size a read file recorded (so it is rewritten
    byte for byte), else to the next 8-aligned file offset (what nncase's writers do)."""
    want = recorded if recorded and recorded >= len(body) else align_up(pos + len(body), 8) - pos
    return body + bytes(want - len(body)), want - len(body)

def drop_tail(out: bytes, omitted: int, pad: int) -> bytes:
    """`out` without the last `omitted` bytes when they are the last body's zero padding: a model
    read from a file that ended before that padding (nncase v0.1, some v4 writers;
    docs/kmodel-format.md#reader-rules) is written back byte for byte. A model made here has
    omitted = 0 and keeps its padding."""
    if 0 < omitted <= pad:
        return out[:-omitted]
    return out


def check(cond: bool, message: str, offset: int | None = None, field: str | None = None):
    if not cond:
        raise KmodelFormatError(message, offset, field)


class Notes:
    """Deviations from nncase's writer habits, one line per kind with the places it occurs."""

    def __init__(self):
        self.kinds = {}

    def add(self, what: str, where: str | None = None):
        self.kinds.setdefault(what, []).append(where)

    def lines(self) -> list:
        out = []
        for what, places in self.kinds.items():
            places = [p for p in places if p]
            if not places:
                out.append(what)
                continue
            more = f" and {len(places) - 6} more" if len(places) > 6 else ""
            out.append(f"{what} ({len(places)}x: {'; '.join(places[:6])}{more})")
        return out

"""SLIP framing (RFC 1055 style) as used by the K210 ROM ISP and the stage-2 stub.

A frame is ``C0 <escaped payload> C0``; payload 0xDB -> DB DD, 0xC0 -> DB DC. Nothing else is
escaped. The decoder treats every C0 as a delimiter and the bytes between two delimiters as one
frame (empty frames are skipped), which resynchronises by itself after line noise.
"""
END = 0xC0
ESC = 0xDB
ESC_END = 0xDC
ESC_ESC = 0xDD

_END_B = bytes([END])


def encode(payload: bytes) -> bytes:
    """Return the framed, escaped bytes for ``payload``."""
    body = bytes(payload).replace(b"\xdb", b"\xdb\xdd").replace(b"\xc0", b"\xdb\xdc")
    return _END_B + body + _END_B


def decode_body(body: bytes):
    """Un-escape the bytes between two delimiters. Returns (payload, ok); ok is False when the
    body holds an invalid escape sequence (those raw bytes are then kept as they are)."""
    body = bytes(body)
    if b"\xdb" not in body:
        return body, True
    parts = body.split(b"\xdb")
    out = [parts[0]]
    ok = True
    for part in parts[1:]:
        head = part[:1]
        if head == b"\xdc":
            out.append(b"\xc0" + part[1:])
        elif head == b"\xdd":
            out.append(b"\xdb" + part[1:])
        else:
            ok = False
            out.append(b"\xdb" + part)
    return b"".join(out), ok


class Decoder:
    """Incremental decoder: ``feed(data)`` returns the list of complete frames as
    ``(payload, ok)`` tuples. Bytes before the first delimiter are kept as the start of a frame
    (a dropped opening C0 then costs nothing)."""

    def __init__(self):
        self._buf = bytearray()

    def feed(self, data: bytes):
        frames = []
        buf = self._buf
        for part_end in _split_keep(data):
            chunk, closed = part_end
            buf += chunk
            if closed:
                if buf:
                    frames.append(decode_body(bytes(buf)))
                buf.clear()
        return frames

    def reset(self):
        self._buf.clear()

    @property
    def pending(self) -> int:
        return len(self._buf)


def _split_keep(data: bytes):
    """Yield (chunk, closed_by_delimiter) pieces of ``data``."""
    start = 0
    while True:
        i = data.find(_END_B, start)
        if i < 0:
            if start < len(data):
                yield data[start:], False
            return
        yield data[start:i], True
        start = i + 1

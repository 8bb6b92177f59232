"""MaixPy `KPU` module (`import KPU as kpu`) on the host, backed by the bit-exact emulator.

Mirrors MaixPy-v1 `Maix_kpu.c`: argument checks and error texts (ValueError
"[MAIXPY]kpu: load error:2002, ERR_KMODEL_VERSION: ..." etc.), `kpu.load(addr)` reading the
model from the board's flash, `run_yolo2` returning None when nothing is found.
"""
from __future__ import annotations

import hashlib
import struct

import numpy as np

from tl2k210.errors import KmodelFormatError, Tl2k210Error
from tl2k210.maixpy import board as _board
from tl2k210.maixpy import image as _image

MAX_MODELS = 5
_MAX_MODEL = 12 * 1024 * 1024   # more than the K210's 8 MiB SRAM can ever hold

ERRORS = {
    2001: "ERR_PARAM",
    2002: "ERR_KMODEL_VERSION: only support kmodel V3/V4 now",
    2003: "ERR_KMODEL_FORMAT: layer_header.body_size <= 0",
    2004: "ERR_DECRYPT: decrypt model fail",
    2005: "ERR_READ_FILE: read file fail",
    2006: "ERR_NO_MEM: memory not enough",
    2007: "ERR_GET_CONV_LAYER: first layer should be conv layer",
    2008: "ERR_RUN_MODEL",
    2009: "ERR_MODELS_FULL: up to 5 models",
    2010: "ERR_PERMITION",
    2011: "ERR_IDX_OUTRANGE: index out of range",
    2012: "ERR_SIZE_NOTMATCH: set_outputs size not match",
    2013: "ERR_OUTPUTS_NODONE: need kpu.set_outputs()",
    2014: "ERR_NOT_IMPLEMENT",
    2015: "ERR_UNKNOWN",
}


class KpuError(ValueError):
    """ValueError with MaixPy's text; `.code` and `.host_detail` (why, on the host)."""

    def __init__(self, code, what="load", host_detail=""):
        self.code, self.host_detail = code, host_detail
        super().__init__(f"[MAIXPY]kpu: {what} error:{code}, {ERRORS[code]}")


def _load_error(code, detail=""):
    if detail:
        _board.current().notes.append(f"kpu.load: {detail}")
    return KpuError(code, "load", detail)


# ---------------------------------------------------------------------------------------------
def model_size(read) -> int | None:
    """Exact byte size of a v3/v4 kmodel from its headers (what the firmware reads from flash),
    None when it is not a v3/v4 kmodel. `read(offset, n)` returns model bytes (or bytes)."""
    if isinstance(read, (bytes, bytearray)):
        blob = bytes(read)
        read = lambda off, n: blob[off:off + n]   # noqa: E731
    try:
        first, second = struct.unpack("<II", read(0, 8))
        if first == 3:
            n_layers, n_out = struct.unpack("<I", read(12, 4))[0], struct.unpack("<I", read(24, 4))[0]
            at = 28 + 8 * n_out
            sizes = struct.unpack(f"<{2 * n_layers}I", read(at, 8 * n_layers))[1::2]
            return at + 8 * n_layers + sum(sizes)
        if first == 0x4B4D444C and second == 4:
            const, nodes, ni, no = struct.unpack("<4I", read(16, 4) + read(24, 12))
            at = 40 + 32 * ni + 16 * no + const
            sizes = struct.unpack(f"<{2 * nodes}I", read(at, 8 * nodes))[1::2]
            return at + 8 * nodes + sum(sizes)
    except struct.error:
        return None
    return None


class kpu_net:
    """What `kpu.load` returns."""

    def __init__(self, model, data: bytes, addr=0, path=""):
        self._model, self._addr, self._path, self._size = model, addr, path, len(data)
        self._key = hashlib.sha1(data).hexdigest()
        self._emu = None
        self._yolo = None
        self._outputs = {}      # idx -> (w, h, ch) from set_outputs
        self._alive = True

    def model_addr(self):
        return self._addr

    def model_size(self):
        return self._size

    def model_path(self):
        return self._path

    def net_arg(self):
        return None

    def __repr__(self):
        return (f'{{"model_addr": {self._addr}, "model_size": {self._size}, '
                f'"model_path": "{self._path}"}}')

    # host helpers
    @property
    def model(self):
        return self._model

    def emulator(self):
        if self._emu is None:
            self._emu = _emulator(self._model, self._key)
        return self._emu


_EMUS = {}


def _emulator(model, key):
    from tl2k210.k210.emulator import Emulator
    if key not in _EMUS:
        if len(_EMUS) >= 4:
            _EMUS.pop(next(iter(_EMUS)))
        _EMUS[key] = Emulator(model)
    return _EMUS[key]


def load(arg, *args):
    b = _board.current()
    if isinstance(arg, bool) or not isinstance(arg, (int, str)):
        raise TypeError("only support str path or int flash address")
    if isinstance(arg, int):
        if arg <= 0:
            raise ValueError("model_addr must > 0")
        head = b.read_flash(arg, 8)
        size = model_size(lambda off, n: b.read_flash(arg + off, min(n, _MAX_MODEL)))
        if size is None:
            raise _load_error(2002, f"no v3/v4 kmodel at flash 0x{arg:x} (first bytes "
                                    f"{head[:8].hex()}; erased flash reads ff)")
        if size > _MAX_MODEL:
            raise _load_error(2006, f"the header at 0x{arg:x} claims {size} bytes")
        data, path = b.read_flash(arg, size), ""
    else:
        if not any(s in arg for s in (".kmodel", ".smodel", ".emodel")):
            raise ValueError("model format don't match, only supply .kmodel")
        if ".kmodel" not in arg:
            raise _load_error(2004, f"{arg}: encrypted models (.smodel/.emodel) are not emulated")
        try:
            data = b.host_path(arg).read_bytes()
        except OSError as exc:
            raise _load_error(2005, f"{arg} -> {b.host_path(arg)}: {exc.strerror}") from None
        path = arg
    if len(b.kpu_tasks) >= MAX_MODELS:
        raise _load_error(2009)
    model = _parse(data)
    task = kpu_net(model, data, addr=arg if isinstance(arg, int) else 0, path=path)
    b.kpu_tasks.append(task)
    return task


def _parse(data: bytes):
    from tl2k210.k210 import kmodel
    try:
        version = kmodel.detect_version(data)
    except KmodelFormatError as exc:
        raise _load_error(2002, str(exc)) from None
    try:
        return kmodel.loads(data)
    except KmodelFormatError as exc:
        code = 2003 if "body_size" in str(exc) else 2015
        raise _load_error(code, f"kmodel v{version}: {exc}") from None


def deinit(task):
    b = _board.current()
    if task in b.kpu_tasks:
        b.kpu_tasks.remove(task)
    task._alive = False
    return True


def memtest():
    b = _board.current()
    used = sum(t.model_size() for t in b.kpu_tasks)
    print(f"[MAIXPY]: (host) {len(b.kpu_tasks)} model(s) loaded, {used} bytes")


# ---------------------------------------------------------------------------------------------
class KpuFmap:
    """`kpu.forward` result: `fm[:]` is a list of numbers, `len(fm)`, `fm.shape` (host)."""

    def __init__(self, data: np.ndarray, shape):
        self._data = np.asarray(data)
        self.shape = tuple(shape)

    def __getitem__(self, i):
        v = self._data.reshape(-1)[i]
        return v.tolist() if isinstance(i, slice) else v.item()

    def __len__(self):
        return int(self._data.size)

    def __repr__(self):
        return f"<fmap {self.shape} {self._data.dtype}>"

    def array(self):
        """Host helper: the numpy array."""
        return self._data.reshape(self.shape)


def _input(task, img_or_list):
    """Planar input for the emulator, with MaixPy's checks."""
    if not getattr(task, "_alive", False):
        raise ValueError("kpu_net was deinit")
    m = task.model
    if isinstance(img_or_list, (list, tuple)):
        (shape, dtype) = task.emulator().input_spec()
        x = np.asarray(img_or_list, np.float32)
        if x.size != int(np.prod(shape)):
            raise ValueError(f"input list has {x.size} values, model wants {int(np.prod(shape))}")
        return x.reshape(shape).astype(dtype)
    if not isinstance(img_or_list, _image.Image):
        raise TypeError("img must be image.Image or list")
    img = img_or_list
    if m.version == 3:
        first = m.layers[0]
        if first.conv is None:
            raise ValueError("first layer not conv layer!")
        c, h, w = first.conv.in_shape
    else:
        (_, c, h, w) = (1,) * (4 - len(m.input_shapes[0])) + tuple(m.input_shapes[0])
    fmt_c = 1 if img.format() == _image.GRAYSCALE else 3
    if fmt_c != c:
        raise ValueError("check img format err!")
    if img.width() != w:
        raise ValueError(f"img w={img.width()}, but model w={w}")
    if img.height() != h:
        raise ValueError(f"img h={img.height()}, but model h={h}")
    ai = img.ai_buffer()
    if ai is None or ai.shape != (c, h, w):
        raise ValueError("img has no AI buffer of the model size (pix_ai is NULL): call "
                         "img.pix_to_ai() after resize/copy/cut")
    x = ai
    if m.version == 4:
        shape, dtype = task.emulator().input_spec()
        x = x.reshape(shape).astype(dtype)
    return x


def _run(task, x):
    from tl2k210.errors import EmulatorError
    try:
        return task.emulator().run(x)
    except EmulatorError as exc:
        _board.current().notes.append(f"emulator: {exc}")
        raise KpuError(2008, "run", str(exc)) from None


def forward(task, img_or_list, out_index=0, dma=1):
    x = _input(task, img_or_list)
    outs = _run(task, x)
    if not 0 <= out_index < len(outs):
        raise KpuError(2011, "forward", f"model has {len(outs)} outputs")
    out = outs[out_index]
    m = task.model
    if m.version == 4:
        if out_index not in task._outputs:
            raise KpuError(2013, "forward")
        w, h, ch = task._outputs[out_index]
        return KpuFmap(out.astype(np.float32), (ch, h, w))
    last = m.layers[-1]
    if last.conv is not None and out.dtype == np.uint8:
        return KpuFmap(out, last.conv.out_shape)
    return KpuFmap(out, (out.size,))


def set_outputs(task, idx, w, h, ch):
    m = task.model
    n = len(m.outputs)
    if not 0 <= idx < n:
        raise KpuError(2011, "set_outputs")
    if m.version == 4:
        want = _v4_output_count(m, idx)
        if want is not None and want != w * h * ch:
            raise KpuError(2012, "set_outputs", f"output {idx} holds {want} values, "
                                                f"{w}x{h}x{ch} = {w * h * ch}")
    task._outputs[idx] = (int(w), int(h), int(ch))
    return True


def _v4_output_count(m, idx):
    try:
        _, dtype, _, size = m.outputs[idx]   # range: memory, dtype, start, size (bytes)
    except (IndexError, TypeError, ValueError):
        return None
    return size // (4 if dtype == 0 else 1)


def fmap_free(fm):
    return None


def netinfo(task):
    m = task.model
    items = m.layers if m.version == 3 else m.nodes
    return [getattr(it, "name", "?") for it in items]


def fmap(fm, ch):
    """`kpu.fmap(fm, ch)`: one channel of a uint8 map as a grayscale image."""
    a = fm.array()
    if a.ndim != 3 or a.dtype != np.uint8:
        raise ValueError("fmap is not a uint8 feature map")
    return _image.Image._from(np.ascontiguousarray(a[ch]), _image.GRAYSCALE)




# ---------------------------------------------------------------------------------------------
class kpu_yolo2_find:
    def __init__(self, x, y, w, h, value, classid, index, objnum):
        self._v = (x, y, w, h, value, classid, index, objnum)

    def rect(self):
        return self._v[:4]

    def x(self):
        return self._v[0]

    def y(self):
        return self._v[1]

    def w(self):
        return self._v[2]

    def h(self):
        return self._v[3]

    def value(self):
        return self._v[4]

    def classid(self):
        return self._v[5]

    def index(self):
        return self._v[6]

    def objnum(self):
        return self._v[7]

    def __getitem__(self, i):
        return self._v[i]

    def __repr__(self):
        x, y, w, h, v, c, i, n = self._v
        return (f'{{"x":{x}, "y":{y}, "w":{w}, "h":{h}, "value":{v:f}, "classid":{c}, '
                f'"index":{i}, "objnum":{n}}}')


def init_yolo2(task, threshold, nms_value, anchor_num, anchor, dma=1):
    if not 0 <= threshold <= 1:
        raise ValueError("threshold must be in [0, 1]")
    if not 0 <= nms_value <= 1:
        raise ValueError("nms_value must be in [0, 1]")
    if anchor_num <= 0:
        raise ValueError("anchor_num must > 0")
    anchor = [float(a) for a in anchor]
    if len(anchor) != 2 * anchor_num:
        raise ValueError(f"anchor len must be {2 * anchor_num}")
    task._yolo = (float(threshold), float(nms_value), int(anchor_num), anchor)
    return True


def _grid(task, size):
    from tl2k210.k210.yolo import region_grid
    try:
        return region_grid(task.model, size)
    except ValueError as exc:
        raise Tl2k210Error(str(exc)) from None


def run_yolo2(task, img):
    from tl2k210.k210 import yolo
    if task._yolo is None:
        raise ValueError("yolo2 not init: call kpu.init_yolo2() first")
    x = _input(task, img)
    out = np.asarray(_run(task, x)[0], np.float32)
    threshold, nms, na, anchors = task._yolo
    gw, gh = _grid(task, out.size)
    iw, ih = img.width(), img.height()
    boxes = yolo.decode(out, anchors, gw, gh, iw, ih, threshold, nms)
    found = []
    for b in boxes:   # region_layer.c: clamp into the image, truncate to ints
        x0, y0 = max(0.0, b.x), max(0.0, b.y)
        w = min(b.w - (x0 - b.x), iw - x0)
        h = min(b.h - (y0 - b.y), ih - y0)
        found.append((int(x0), int(y0), int(w), int(h), b.value, b.classid, b.index))
    if not found:
        return None
    return [kpu_yolo2_find(*f, len(found)) for f in found]

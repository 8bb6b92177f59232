"""MaixPy `KPU` module (`import KPU as kpu`) on the host, backed by the bit-exact emulator
(docs/maixpy-firmware.md#kpu; MaixPy-v1 Maix_kpu.c, sipeed_kpu.h, sipeed_yolo2.c).

* `load(addr | path)`: an int reads the model from the board's flash image (size from the v3/v4
  header: raw flash has no file length), a str from /sd or /flash (must contain .kmodel,
  .smodel or .emodel). The firmware build (`runtime`, tl2k210/k210/firmware.py) decides which
  kmodel versions load and how much system heap the model + its main-memory buffers may take:
  too much is error 2006, as on the board. At most 5 models.
* `forward(task, img | floats[, out_index, dma])`: the third argument is the OUTPUT INDEX;
  `set_layers(task, n)` stops a run after n layers. v3 results: 'B' uint8 maps with the last
  conv's w/h/ch, or 'f' with h = ch = 1 and w = the BYTE count; v4: 'f' with the shape
  `set_outputs` declared (required; a wrong size prints the firmware's error and returns False).
  An fmap points into the model's output buffer: the next run overwrites it.
* `run_yolo2`: the region layer of sipeed_yolo2.c; a list of objects (index order) or None.
* Every run advances the board clock by the model's estimated latency (k210/cost.py).
* Errors carry the firmware's codes and texts; the host adds a note saying why (`board.notes`).
"""
from __future__ import annotations

import hashlib
import struct

import numpy as np

from tl2k210.errors import EmulatorError, KmodelFormatError
from tl2k210.maixpy import args as A
from tl2k210.maixpy import board as _board
from tl2k210.maixpy import image as _image
from tl2k210.maixpy import timing

MAX_MODELS = 5
_MAX_MODEL = 12 * 1024 * 1024   # more than the K210's 8 MiB SRAM can ever hold

ERRORS = {
    2001: "ERR_PARAM: please check param, load address or kmodel file name",
    2002: "ERR_KMODEL_VERSION: only support kmodel V3/V4 now",
    2003: "ERR_KMODEL_FORMAT: layer_header.body_size <=0",
    2004: "ERR_DECRYPT: check smodel match with your board",
    2005: "ERR_READ_FILE: read file failed",
    2006: "ERR_NO_MEM: memory not enough",
    2007: "ERR_GET_CONV_LAYER: first layer should be conv layer",
    2008: "ERR_RUN_MODEL: maybe model dirty",
    2009: "ERR_MODELS_FULL: we only support load 5 models in the same time",
    2010: "ERR_PERMITION",
    2011: "SIPEED_KPU_ERR_IDX_OUTRANGE",
    2012: "SIPEED_KPU_ERR_SIZE_NOTMATCH",
    2013: "ERR_OUTPUTS_SET: need kpu.set_outputs() to set shape",
    2014: "ERR_NOT_IMPLEMENT",
    2015: "ERR_UNKNOWN",
}
# what each code means on the host (cause -> fix), for the notes
CAUSES = {
    2001: "the path does not name a file on the board",
    2002: "no v3/v4 kmodel there (erased flash reads 0xFF, wrong address, or a version this "
          "firmware does not load)",
    2003: "the kmodel is corrupt",
    2005: "the file could not be read to the size its header claims",
    2006: "the model does not fit in the system heap this firmware leaves",
    2009: "5 models are loaded already: kpu.deinit() one",
    2013: "a kmodel v4 needs kpu.set_outputs(task, idx, w, h, ch) before forward/run_yolo2",
    2015: "the firmware does not know this model (kmodel v5+ from nncase >= 1.0?)",
}
_KPU_MSG = "[MAIXPY]kpu: "


class KpuError(ValueError):
    """ValueError with MaixPy's text; `.code` and `.host_detail` (why, on the host)."""

    def __init__(self, code, what="load", host_detail="", text=None):
        self.code, self.host_detail = code, host_detail
        super().__init__(f"{_KPU_MSG}{what} error:{code}, {text or ERRORS[code]}")


class KpuRunError(OSError):
    pass


def _b():
    return _board.current()


def _note_error(code, detail):
    """The host note mapping a firmware code to its cause here ("error 2006: not enough ...")."""
    cause = CAUSES.get(code, ERRORS[code])
    _b().note(f"error {code}: {detail}" if detail else f"error {code}: {cause}", ("kpu", code, detail))


def _load_error(code, detail="", text=None):
    _note_error(code, detail)
    return KpuError(code, "load", detail, text)


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
            if n_layers > 100000 or n_out > 100000:
                return None
            at = 28 + 8 * n_out
            sizes = struct.unpack(f"<{2 * n_layers}I", read(at, 8 * n_layers))[1::2]
            return at + 8 * n_layers + sum(sizes)
        if first == 0x4B4D444C and second == 4:
            const, nodes, ni, no = struct.unpack("<4I", read(16, 4) + read(24, 12))
            if nodes > 100000 or ni > 1000 or no > 1000:
                return None
            at = 40 + 32 * ni + 16 * no + const
            sizes = struct.unpack(f"<{2 * nodes}I", read(at, 8 * nodes))[1::2]
            return at + 8 * nodes + sum(sizes)
    except struct.error:
        return None
    return None


def _version_of(head: bytes):
    """3, 4, ('KMDL', v) for other KMDL versions, 1 for legacy, None for garbage."""
    if len(head) < 8:
        return None
    first, second = struct.unpack("<II", head[:8])
    if first == 3:
        return 3
    if first == 0x4B4D444C:
        return 4 if second == 4 else ("KMDL", second)
    if first == 1:
        return 1
    return None


class kpu_net:
    """What `kpu.load` returns."""

    def __init__(self, model, data: bytes, addr=0, path="", mem=0):
        self._model, self._addr, self._path, self._size = model, addr, path, len(data)
        self._key = hashlib.sha1(data).hexdigest()
        self._yolo = None
        self._outputs = {}      # idx -> (w, h, ch) from set_outputs
        self._layers = 0        # set_layers (0 = all)
        self._alive = True
        self._mem = mem         # system heap taken
        self._fmaps = {}        # idx -> the output buffer fmaps point into
        self._last = None       # every output of the last forward (get_output reads any of them)
        self._flash = None      # load_flash: (dual, batch, speed)
        from tl2k210.k210 import cost
        self._est = cost.estimate(model)

    def model_addr(self):
        return self._addr

    def model_size(self):
        return self._size

    def model_path(self):
        return self._path

    def net_arg(self):
        return None

    def __repr__(self):
        path = self._path if self._path else "(null)"
        return (f'{{"model_addr": {self._addr if not self._path else 0}, "model_size": '
                f'{self._size}, "model_path": "{path}", "net_args": None}}')

    # host helpers
    @property
    def model(self):
        return self._model

    def emulator(self):
        return _emulator(self._model, self._key)

    def latency_ms(self) -> float:
        """The cost model's estimate of one full run on the board."""
        return self._est.ms


_EMUS = {}
_RESULTS = {}


def _emulator(model, key):
    from tl2k210.k210.emulator import Emulator
    if key not in _EMUS:
        if len(_EMUS) >= 12:
            _EMUS.pop(next(iter(_EMUS)))
        _EMUS[key] = Emulator(model)
    return _EMUS[key]


def _is_task(t):
    return isinstance(t, kpu_net)


def _task(t):
    if not _is_task(t):
        raise TypeError(f"{_KPU_MSG}kpu_net type error")
    return t


# ---------------------------------------------------------------------------------------------
def load(*args, **kwargs):
    b = _b()
    A.check_arity(args, 1)
    A.ignore_unknown("kpu.load", kwargs, set())          # only args[0] is read
    arg = args[0]
    if isinstance(arg, bool) or not isinstance(arg, (int, str)):
        raise TypeError(f"{_KPU_MSG}only accept int or string")
    rt = b.runtime
    if isinstance(arg, int):
        if arg <= 0:
            raise ValueError(f"{_KPU_MSG}model_addr must > 0 ")
        head = b.read_flash(arg, 8)
        data = _load_bytes(lambda off, n: b.read_flash(arg + off, min(n, _MAX_MODEL)),
                           head, f"flash 0x{arg:x}", rt)
        path = ""
        b.clock.advance(len(data) * timing.FLASH_READ_US_PER_BYTE)
    else:
        if not any(s in arg for s in (".kmodel", ".smodel", ".emodel")):
            raise ValueError(f"{_KPU_MSG}model format don't match, only supply .kmodel ")
        if ".kmodel" not in arg:
            raise _load_error(2004, f"{arg}: encrypted models (.smodel/.emodel) are bound to one "
                                    "board's key and cannot be emulated")
        try:
            blob = b.vfs.read_bytes(arg)
        except OSError:
            raise _load_error(2001, f"no file {arg} (cwd {b.vfs.getcwd()}, SD card "
                                    f"{'present' if b.vfs.has_sd else 'absent'})") from None
        data = _load_bytes(lambda off, n: blob[off:off + n], blob[:8], arg, rt, file_size=len(blob))
        path = arg
        b.clock.advance(len(data) * timing.SD_READ_US_PER_BYTE)
    if len(b.kpu_tasks) >= MAX_MODELS:
        raise _load_error(2009)
    model = _parse(data, path or f"flash 0x{arg:x}")
    main = model.main_memory
    need = len(data) + main
    if need > b.sys_free:
        raise _load_error(2006, _no_mem_text(len(data), main, b))
    task = kpu_net(model, data, addr=arg if isinstance(arg, int) else 0, path=path, mem=need)
    b.sys_used += need
    b.kpu_tasks.append(task)
    return task


def _no_mem_text(size, main, b):
    rt = b.runtime
    mb = 1e6
    others = ""
    if b.kpu_tasks:
        others = f" ({len(b.kpu_tasks)} model(s) already loaded take {sum(t._mem for t in b.kpu_tasks) / mb:.2f} MB)"
    fix = ("use --runtime maixpy-minimum (about 4 MB for models) or a smaller model (a smaller "
           "MobileNet alpha / input)" if rt.name == "maixpy" else "use a smaller model or "
           "kpu.load_flash (streams the weights from flash)")
    return (f"not enough memory for this model under the '{rt.name}' firmware: model "
            f"{size / mb:.2f} MB + KPU buffers {main / mb:.2f} MB = {(size + main) / mb:.2f} MB > "
            f"{b.sys_free / mb:.2f} MB free{others}; {fix}")


def _load_bytes(read, head, where, rt, file_size=None) -> bytes:
    v = _version_of(head)
    if v not in rt.kmodel_versions:
        if v == 4:
            raise _load_error(2002, f"{where} holds a kmodel v4 (nncase v0.2) and the "
                                    f"'{rt.name}' firmware loads V3 only: use a V4-capable build "
                                    "(--runtime maixpy or maixpy-minimum-v4)", rt.version_text())
        if isinstance(v, tuple) and v[1] >= 5 and 4 in rt.kmodel_versions:
            raise _load_error(2015, f"{where} is a kmodel v{v[1]} (nncase >= 1.0); MaixPy loads "
                                    "only v3/v4 (issue #423)")
        erased = "; erased flash reads ff" if bytes(head[:4]) == bytes([255]) * 4 else ""
        what = {1: "a legacy kmodel v1 (2018 Kendryte compiler)",
                None: f"no kmodel (first bytes {bytes(head[:8]).hex()}{erased})"}
        detail = what.get(v, f"a kmodel v{v[1]}" if isinstance(v, tuple) else "?")
        raise _load_error(2002, f"{where}: {detail}", rt.version_text())
    size = model_size(read)
    if size is None or size <= 0:
        raise _load_error(2003, f"{where}: unreadable layer table")
    if size > _MAX_MODEL:
        raise _load_error(2006, f"{where}: the header claims {size} bytes, more than the "
                                "K210's memory")
    if file_size is not None and size > file_size + 7:
        raise _load_error(2005, f"{where}: the header claims {size} bytes, the file has {file_size}")
    return read(0, size)


def _parse(data: bytes, where: str):
    from tl2k210.k210 import kmodel
    try:
        return kmodel.loads(data)
    except KmodelFormatError as exc:
        code = 2003 if ("body" in str(exc) or "size" in str(exc)) else 2015
        raise _load_error(code, f"{where}: {exc}") from None


def release(b, task):
    if task in b.kpu_tasks:
        b.kpu_tasks.remove(task)
        b.sys_used = max(0, b.sys_used - task._mem)
    task._alive = False
    task._yolo = None


def deinit(*args, **kwargs):
    A.check_arity(args, 1, 1)
    task = _task(args[0])
    release(_b(), task)
    return True


def memtest(*args, **kwargs):
    b = _b()
    gc_free = b.gc.free() // 1024 if b.gc else 0
    sys_free = b.sys_free // 1024
    print_(f"###free gc heap memory : {gc_free} KB")
    print_(f"###free sys heap memory: {sys_free} KB")
    b.clock.advance(2000)
    return None


def print_(text):
    _board.console(text + "\n")


# ---------------------------------------------------------------------------------------------
class fmap:
    """A `forward` result: a view of the model's output buffer (overwritten by the next run)."""

    def __init__(self, buf: np.ndarray, typecode: str, w: int, h: int, ch: int, index: int):
        self._buf, self._tc, self._w, self._h, self._ch, self._index = buf, typecode, w, h, ch, index

    def size(self):
        return int(self._buf.nbytes)

    def index(self):
        return self._index

    def w(self):
        return self._w

    def h(self):
        return self._h

    def ch(self):
        return self._ch

    def typecode(self):
        _b().note("fmap.typecode(): the firmware casts the code value to a pointer (broken on a "
                  "board); the host returns the code", "typecode")
        return self._tc

    def _flat(self):
        return self._buf.reshape(-1)

    def __getitem__(self, i):
        flat = self._flat()
        if isinstance(i, slice):
            if i.step not in (None, 1):
                raise OSError("only slices with step=1 (aka None) are supported")
            vals = flat[i].tolist()
            if self._tc == "f":
                b = _b()
                if b.gc is not None:
                    n = b.gc.alloc(b.gc.float_tuple_bytes(len(vals)))
                    out = _FloatTuple(vals)
                    out._heap, out._n = b.gc, n
                    return out
            return tuple(vals)
        return flat[A.get_int(i)].item()

    def __setitem__(self, i, v):
        self._flat()[A.get_int(i)] = v

    def __len__(self):
        raise TypeError("object of type 'fmap' has no len()")

    def __iter__(self):
        raise TypeError("'fmap' object isn't iterable")

    def __bytes__(self):
        return self._buf.tobytes()

    def __buffer__(self, flags):
        return memoryview(self._buf.reshape(-1).view(np.uint8))

    def __repr__(self):
        return (f'{{"size": {self.size()}, "index": {self._index}, "w": {self._w}, "h": '
                f'{self._h}, "ch": {self._ch}, "typecode": "{self._tc}"}}')

    # host helper
    def array(self):
        if self._tc == "f" and self._h == 1 and self._ch == 1:
            return self._buf.reshape(-1)
        return self._buf.reshape(self._ch, self._h, self._w)

    @property
    def shape(self):
        return self.array().shape


KpuFmap = fmap


class _FloatTuple(tuple):
    """fmap[:] of a float map: a tuple whose heap blocks are given back when it is freed."""

    def __del__(self):
        h = self.__dict__.get("_heap")
        if h is not None:
            h.release(self._n)


def _model_input(task):
    m = task.model
    if m.version == 3:
        first = m.layers[0]
        if first.conv is None:
            return None
        return first.conv.in_shape, np.uint8
    shape, dtype = task.emulator().input_spec()
    n, c, h, w = (1,) * (4 - len(shape)) + tuple(shape)
    return (c, h, w), dtype


def _img_error(msg=None):
    if msg:
        print_(msg)
    return ValueError(f"{_KPU_MSG}check img format err!\r\n")


def _input(task, img_or_list):
    """The model input the firmware hands to the runtime, with its checks and texts."""
    if not task._alive:
        raise OSError(f"{_KPU_MSG}kpu_net was deinit")
    if isinstance(img_or_list, (list, tuple)):
        shape, dtype = task.emulator().input_spec()
        x = np.asarray([A.get_float(v) for v in img_or_list], np.float32)
        if x.size != int(np.prod(shape)):
            raise ValueError(f"{_KPU_MSG}input list has {x.size} values, the model takes "
                             f"{int(np.prod(shape))}")
        return x.reshape(shape).astype(dtype)
    if not isinstance(img_or_list, _image.Image):
        raise TypeError(f"{_KPU_MSG}img must be image or list")
    img = img_or_list
    spec = _model_input(task)
    if spec is None:
        raise _img_error("[MAIXPY]kpu: first layer not conv layer!")
    (c, h, w), dtype = spec
    fmt_c = 1 if img.format() == _image.GRAYSCALE else (3 if img.format() == _image.RGB565 else 0)
    if img.width() != w or img.height() != h:
        _b().note(f"kpu: the image is {img.width()}x{img.height()}, the model takes {w}x{h}: "
                  "set_windowing((w, h)) or resize(w, h) + pix_to_ai()", ("size", w, h))
        raise _img_error(f"[MAIXPY]kpu: img w={img.width()},h={img.height()}, but model w={w},h={h}")
    if fmt_c != c:
        _b().note(f"kpu: the model takes {c} channel(s), the image has {fmt_c} "
                  f"({'RGB565' if fmt_c == 3 else 'grayscale'})", ("fmt", c))
        raise _img_error()
    ai = img._ai_buffer()
    if ai is None or ai.shape != (c, h, w):
        _b().note("kpu: the image has no AI buffer: images made by image.Image(), resize(), "
                  "cut(), copy() need img.pix_to_ai() before the KPU can read them", "pix_ai")
        raise _img_error("[MAIXPY]kpu: pix_ai is NULL!")
    if task.model.version == 4:
        shape, dt = task.emulator().input_spec()
        if dt != np.uint8:
            _b().note("kpu: this v4 model takes float32 input; the firmware hands it the uint8 "
                      "AI buffer (UNCERTAIN what a board computes); the host feeds the pixel "
                      "values 0..255 as floats", "float-input")
        return ai.reshape(shape).astype(dt)
    return ai


def _run(task, x):
    """All outputs (and the per-layer trace when set_layers is active) + board time."""
    key = (task._key, task._layers, hashlib.sha1(np.ascontiguousarray(x).view(np.uint8)).hexdigest())
    b = _b()
    hit = _RESULTS.get(key)
    if hit is None:
        try:
            if task._layers:
                outs, trace = task.emulator().run(x, trace=True)
                hit = (outs, trace[task._layers - 1][1])
            else:
                hit = (task.emulator().run(x), None)
        except EmulatorError as exc:
            if "not emulated" in str(exc):       # a host limit, not what a board does
                b.stop(f"host limit: the emulator cannot run this model yet ({exc}); a board "
                       "would run it", "host")
            b.note(f"emulator: {exc}", ("emu", str(exc)))
            raise KpuRunError(f"{_KPU_MSG}run error:2008, {ERRORS[2008]}") from exc
        if len(_RESULTS) > 16:
            _RESULTS.pop(next(iter(_RESULTS)))
        _RESULTS[key] = hit
    est = task._est
    if task._layers:
        from tl2k210.k210 import cost
        est = cost.partial(est, task._layers - 1)
    ms = est.ms
    if task._flash is not None:
        ms *= timing.LOAD_FLASH_SLOWDOWN[bool(task._flash[0])]
    b.clock.advance(ms * 1000 + timing.KPU_CALL_US)
    return hit


def _v3_result(task, arr, idx, partial_layer=None):
    m = task.model
    layer = m.layers[partial_layer] if partial_layer is not None else m.layers[-1]
    a = np.asarray(arr)
    if layer.conv is not None and a.dtype == np.uint8:
        ch, h, w = layer.conv.out_shape
        return "B", a.reshape(ch, h, w), w, h, ch
    tc = "f" if a.dtype == np.float32 else "B"
    return tc, a.reshape(-1), a.nbytes, 1, 1


def _store(task, idx, tc, arr, w, h, ch, index):
    """Write into the task's output buffer in place (earlier fmaps see the new data)."""
    old = task._fmaps.get(idx)
    if old is not None and old._buf.shape == arr.shape and old._buf.dtype == arr.dtype:
        np.copyto(old._buf, arr)
        old._tc, old._w, old._h, old._ch, old._index = tc, w, h, ch, index
        return old
    fm = fmap(np.array(arr, copy=True), tc, w, h, ch, index)
    task._fmaps[idx] = fm
    return fm


def forward(*args, **kwargs):
    a = A.parse_all(args, kwargs, [("kpu_net", A.REQUIRED), ("img", A.REQUIRED),
                                   ("out_index", 0), ("dma", -1)])
    task = _task(a["kpu_net"])
    idx = A.get_int(a["out_index"])
    x = _input(task, a["img"])
    outs, partial = _run(task, x)
    m = task.model
    n_out = len(m.outputs)
    task._last = outs
    if partial is not None:
        tc, arr, w, h, ch = _v3_result(task, partial, 0, task._layers - 1) if m.version == 3 else \
            ("f", np.asarray(partial, np.float32).reshape(-1), np.asarray(partial).size, 1, 1)
        return _store(task, ("layer", idx), tc, arr, w, h, ch, task._layers - 1)
    if not 0 <= idx < n_out:
        _note_error(2011, f"out_index {idx}: the model has {n_out} output(s)")
        raise KpuRunError(f"{_KPU_MSG}forward error:2011, {ERRORS[2011]}")
    return _output_fmap(task, idx, outs[idx], KpuRunError(f"{_KPU_MSG}forward error:2013, {ERRORS[2013]}"))


def _output_fmap(task, idx, out, unshaped):
    """Output `idx`'s buffer (values `out`) as the fmap forward and get_output return: v3 typed
    and shaped by the model's last layer, v4 floats shaped by set_outputs (else `unshaped`)."""
    m = task.model
    last = len(m.items) - 1
    if m.version == 4:
        if idx not in task._outputs:
            _note_error(2013, f"output {idx} holds {np.asarray(out).size} values")
            raise unshaped
        w, h, ch = task._outputs[idx]
        return _store(task, idx, "f", np.asarray(out, np.float32).reshape(-1), w, h, ch, last)
    tc, arr, w, h, ch = _v3_result(task, out, idx)
    return _store(task, idx, tc, arr, w, h, ch, last)


def get_output(*args, **kwargs):
    """Output `idx` of the last forward as an fmap, whichever index forward returned: the firmware
    (Maix_kpu.c py_kpu_get_output) wraps output idx's buffer, which every run fills -- how scripts
    read a multi-output model (BlazeFace's scores and boxes, MTCNN's three heads); the host had
    returned None for any index forward had not (hunt 22). kmodel v3 takes the typecode and
    w, h, ch from the model's LAST layer whatever idx is (as forward does); v4 from set_outputs."""
    A.check_arity(args, 2, 2)
    if not isinstance(args[0], kpu_net) or not isinstance(args[1], int):
        raise ValueError(f"{_KPU_MSG}get_output arg format error: get_output(task, int idx)")
    task = _task(args[0])
    idx, m = args[1], task.model
    if not 0 <= idx < len(m.outputs):       # (the library's error code here is not known: UNCERTAIN)
        _note_error(2011, f"get_output index {idx}: the model has {len(m.outputs)} output(s)")
        raise OSError("get_output err" if m.version == 4 else "2011")
    out = task._last[idx] if task._last is not None else np.zeros(_output_count(m, idx), np.float32)
    return _output_fmap(task, idx, out, OSError("get_outputs_shape err"))


def _output_count(m, idx):
    """Values of output `idx` as float32 (the firmware's size check divides the bytes by 4)."""
    if m.version == 4:
        return m.outputs[idx][3] // 4
    addr, size = m.outputs[idx]
    return size // 4


def set_outputs(*args, **kwargs):
    A.check_arity(args, 4)
    if len(args) < 5:
        _b().note("kpu.set_outputs takes (task, idx, w, h, ch); the firmware declares 4 and reads "
                  "a 5th (garbage on a board)", "set_outputs4")
        raise ValueError(f"{_KPU_MSG}set_outputs arg format error: (task, idx, w, h, ch)")
    task = _task(args[0])
    vals = args[1:5]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in vals):
        raise ValueError(f"{_KPU_MSG}set_outputs arg format error: idx, w, h, ch must be int")
    idx, w, h, ch = vals
    m = task.model
    if not 0 <= idx < len(m.outputs):
        print_(f"{_KPU_MSG}set_outputs arg value error: idx {idx}, err:2011 ({ERRORS[2011]})")
        _note_error(2011, f"set_outputs index {idx}: the model has {len(m.outputs)} output(s)")
        return False
    want = _output_count(m, idx)
    if want != w * h * ch:
        print_(f"{_KPU_MSG}set_outputs arg value error: w,h,ch {w},{h},{ch}, err:2012 "
               f"({ERRORS[2012]})")
        _note_error(2012, f"set_outputs(task, {idx}, {w}, {h}, {ch}) = {w * h * ch} values but "
                          f"output {idx} holds {want} floats ({want * 4} bytes); the shape is not "
                          "set")
        return False
    if m.version == 3:
        _b().note("kpu.set_outputs on a kmodel v3: the firmware accepts a matching shape "
                  "(UNCERTAIN: closed library); v3 results keep their own shape", "set_outputs_v3")
    task._outputs[idx] = (w, h, ch)
    return True


def set_layers(*args, **kwargs):
    A.check_arity(args, 2, 2)
    task = _task(args[0])
    n = A.get_int(args[1])
    total = len(task.model.items)
    if n <= 0:
        task._layers = 0
        return True
    if n > total:
        print_(f"err: set layers_length to {n}, but max {total}")
        return False
    task._layers = n
    return True


def fmap_free(*args, **kwargs):
    return None


def _fmap_image(*args, **kwargs):
    A.check_arity(args, 2, 2)
    fm, ch = args[0], A.get_int(args[1])
    if fm._tc != "B":
        raise ValueError(f"{_KPU_MSG}can't convet float fmap yet\r\n")
    if not 0 <= ch < fm._ch:
        raise ValueError(f"{_KPU_MSG}ch err,input 0~{fm._ch}\r\n")
    plane = fm._buf.reshape(fm._ch, fm._h, fm._w)[ch]
    return _image.Image(plane, _image.GRAYSCALE, ai=plane[None], fb=True)


class _LayerInfo:
    def __init__(self, **v):
        self._v = v

    def __getattr__(self, k):
        if k.startswith("_"):
            raise AttributeError(k)
        return lambda: self._v[k]

    def __repr__(self):
        return "{" + ", ".join(f'"{k}": {v}' for k, v in self._v.items()) + "}"


def netinfo(*args, **kwargs):
    A.check_arity(args, 1, 1)
    task = _task(args[0])
    m = task.model
    items = m.items
    out = []
    for i, it in enumerate(items):
        if it.conv is not None:
            c = it.conv
            ci, hi, wi = c.in_shape
            co, ho, wo = c.out_shape
            para = int(c.weights.nbytes)
            info = _LayerInfo(index=i, type=it.type if m.version == 3 else it.opcode, wi=wi, hi=hi,
                              wo=wo, ho=ho, chi=ci, cho=co, dw=int(c.depthwise),
                              kernel_type=c.args["kernel_type"], pool_type=c.args["pool_type"],
                              para_size=para)
        else:
            body = len(getattr(it, "raw", b"") or b"") or 0
            info = _LayerInfo(index=i, type=it.type if m.version == 3 else it.opcode, wi=0, hi=0,
                              wo=0, ho=0, chi=0, cho=0, dw=0, kernel_type=0, pool_type=0,
                              para_size=body)
        print_(f"layer[{i}]: {it.name}, wi={info.wi()}, hi={info.hi()}, wo={info.wo()}, "
               f"ho={info.ho()}, chi={info.chi()}, cho={info.cho()}, dw={info.dw()}, "
               f"kernel_type={info.kernel_type()}, pool_type={info.pool_type()}, "
               f"para_size={info.para_size()}")
        out.append(info)
    return out


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
        raise TypeError("'kpu_yolo2_find' object isn't subscriptable")

    def __repr__(self):
        x, y, w, h, v, c, i, n = self._v
        return (f'{{"x":{x}, "y":{y}, "w":{w}, "h":{h}, "value":{v:f}, "classid":{c}, '
                f'"index":{i}, "objnum":{n}}}')


def init_yolo2(*args, **kwargs):
    A.check_arity(args, 5)
    a = A.parse_all(args, kwargs, [("kpu_net", A.REQUIRED), ("threshold", A.REQUIRED),
                                   ("nms_value", A.REQUIRED), ("anchor_number", A.REQUIRED),
                                   ("anchor", A.REQUIRED), ("dma", -1)])
    task = _task(a["kpu_net"])
    threshold, nms = A.get_float(a["threshold"]), A.get_float(a["nms_value"])
    if not 0 <= threshold <= 1:
        raise ValueError(f"{_KPU_MSG}threshold only support 0 to 1")
    if not 0 <= nms <= 1:
        raise ValueError(f"{_KPU_MSG}nms_value only support 0 to 1")
    na = A.get_int(a["anchor_number"])
    if na <= 0:
        raise ValueError(f"{_KPU_MSG}anchor_number should > 0")
    anchor = [A.get_float(v) for v in A.seq(a["anchor"], 2 * na)]
    task._yolo = (threshold, nms, na, anchor)
    return True


def _region_shape(task, out):
    m = task.model
    if m.version == 4:
        if 0 not in task._outputs:
            _note_error(2013, "run_yolo2 on a kmodel v4 without kpu.set_outputs(task, 0, w, h, ch)")
            raise KpuRunError(f"{_KPU_MSG}run error:2013, {ERRORS[2013]}")
        return task._outputs[0]
    from tl2k210.k210.yolo import region_grid
    try:
        gw, gh = region_grid(m, np.asarray(out).size)
    except ValueError as exc:
        raise KpuRunError(f"{_KPU_MSG}run error:2008, {ERRORS[2008]}") from exc
    return gw, gh, np.asarray(out).size // (gw * gh)


def run_yolo2(*args, **kwargs):
    from tl2k210.k210 import yolo
    A.check_arity(args, 2)
    A.ignore_unknown("kpu.run_yolo2", kwargs, set())     # extra arguments are not read
    task = _task(args[0])
    if task._yolo is None:
        raise OSError(f"{_KPU_MSG}run_yolo2 before init_yolo2 (undefined on a board)")
    img = args[1]
    x = _input(task, img)
    outs, _ = _run(task, x)
    out = np.asarray(outs[0], np.float32)
    gw, gh, ch = _region_shape(task, out)
    threshold, nms, na, anchors = task._yolo
    classes = ch // 5 - 5
    if na * (5 + classes) != ch:
        _b().note(f"run_yolo2: the firmware derives the class count assuming 5 anchors "
                  f"({ch} channels -> {classes} classes); with {na} anchors a board decodes "
                  "garbage (UNCERTAIN); the host decodes with the real anchor count", "na5")
        classes = ch // na - 5
    iw, ih = img.width(), img.height()
    try:
        boxes = yolo.decode(out.reshape(-1)[:na * (5 + classes) * gw * gh], anchors, gw, gh, iw, ih,
                            threshold, nms)
    except ValueError as exc:
        raise KpuRunError(f"{_KPU_MSG}run error:2008, {ERRORS[2008]}") from exc
    _b().clock.advance(gw * gh * na * (5 + classes) * 0.15)     # region layer on the CPU
    boxes.sort(key=lambda bx: bx.index)
    found = []
    for bx in boxes:            # sipeed_yolo2.c: centre +- half size, stored as uint32
        found.append((max(0, int(bx.x)), max(0, int(bx.y)), max(0, int(bx.w)), max(0, int(bx.h)),
                      bx.value, bx.classid))
    if not found:
        return None
    if len(found) > 10:
        _b().note(f"run_yolo2 found {len(found)} objects; the firmware's buffer holds 10 "
                  "(undefined on a board); the host returns them all", "yolo10")
    return [kpu_yolo2_find(*f, i, len(found)) for i, f in enumerate(found)]


# ---------------------------------------------------------------------------------------------
def face_encode(*args, **kwargs):
    A.check_arity(args, 1, 1)
    v = [A.get_float(x) for x in A.seq(args[0])]
    if len(v) > 512:
        raise ValueError(f"{_KPU_MSG}feature len must <= 200")
    return bytearray(int(min(127, max(-128, round(x * 128)))) & 0xFF for x in v)


def face_compare(*args, **kwargs):
    A.check_arity(args, 2, 2)
    a = np.frombuffer(bytes(args[0]), np.int8).astype(np.float64)
    c = np.frombuffer(bytes(args[1]), np.int8).astype(np.float64)
    if a.size != c.size:
        raise ValueError(f"{_KPU_MSG}feature len not match")
    n = np.linalg.norm(a) * np.linalg.norm(c)
    cos = float(a @ c / n) if n else 0.0
    return (cos + 1) / 2 * 100


def load_flash(*args, **kwargs):
    usage = "load_flash(model_addr, is_dual_buf, batch_size, spi_speed)"
    A.check_arity(args, 4, 4)
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in args):
        raise ValueError(f"{_KPU_MSG}{usage}")
    addr, dual, batch, speed = args
    b = _b()
    head = b.read_flash(addr, 8)
    if _version_of(_swap_words(head)) not in (3,):
        raise ValueError(f"{_KPU_MSG}load_flash error:2002, {b.runtime.version_text()}")
    size = model_size(lambda off, n: _swap_words(b.read_flash(addr + off - off % 4,
                                                              n + off % 4 + 4))[off % 4:off % 4 + n])
    if size is None:
        raise ValueError(f"{_KPU_MSG}load_flash error:2003, {ERRORS[2003]}")
    data = _swap_words(b.read_flash(addr, (size + 3) // 4 * 4))[:size]
    model = _parse(data, f"flash 0x{addr:x}")
    task = kpu_net(model, data, addr=addr, mem=batch * (2 if dual else 1))
    task._flash = (dual, batch, speed)
    b.sys_used += task._mem
    b.kpu_tasks.append(task)
    return task


def _swap_words(data: bytes) -> bytes:
    n = len(data) // 4 * 4
    return np.frombuffer(data[:n], ">u4").astype("<u4").tobytes() + data[n:]


def _classifier_not_emulated():
    _b().note("kpu.classifier (self-learning classifier) is not emulated: its training "
              "library is closed", "classifier")
    return OSError(f"{_KPU_MSG}classifier not emulated on the host")


class classifier:
    """Maix_kpu_classifier.c (v0.6.2): a type -- classifier(model, class_num, sample_num) and
    classifier.load(model, path[, class_num, sample_num]) (a plain function in its locals). The
    training/prediction library is closed: after the argument checks the host says it cannot
    emulate it."""

    def __init__(self, *args, **kwargs):
        raise _classifier_not_emulated()

    @staticmethod
    def load(*args):
        if not 2 <= len(args) <= 4:
            raise TypeError("function expected at most 4 arguments, got %d" % len(args)
                            if len(args) > 4 else
                            "function missing %d required positional arguments" % (2 - len(args)))
        if isinstance(args[0], classifier):
            raise ValueError("must be class")
        if not isinstance(args[0], kpu_net):
            raise ValueError("must be model")
        if not isinstance(args[1], str):
            raise ValueError("path err")
        raise _classifier_not_emulated()


def make_module(s):
    from tl2k210.maixpy.modules import module
    return module("KPU", "MaixPy KPU on the bit-exact emulator", load=load, load_flash=load_flash,
                  set_outputs=set_outputs, init_yolo2=init_yolo2, run_yolo2=run_yolo2,
                  deinit=deinit, set_layers=set_layers, forward=forward, get_output=get_output,
                  fmap=_fmap_image, fmap_free=fmap_free, netinfo=netinfo, memtest=memtest,
                  face_encode=face_encode, face_compare=face_compare, classifier=classifier)



_FloatTuple.__name__ = _FloatTuple.__qualname__ = "tuple"    # type(fmap[:]).__name__ == 'tuple'

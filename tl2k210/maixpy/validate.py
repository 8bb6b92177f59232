"""`tl2k210 validate MODEL.kmodel --port P`: hardware in the loop. The model runs on a MaixPy
board (kpu.forward over the REPL) and on the bit-exact emulator (and, given `--float SRC`, the
float model in onnxruntime) on the same inputs; per output and per layer the report gives
max |diff|, cosine and SQNR, and says where a gap comes from:

* runtime: the board's numbers differ from the emulator's on the very input the KPU read;
* quantization: board = emulator, but both differ from the float model on that input (above
  80 dB SQNR the verdict is "float": float32 rounding of layers that run in float);
* preprocessing: what the board's input path does to the pixels (MaixPy images are RGB565: a
  24-bit photo loses its low bits before `pix_to_ai`) moves the float model's output more than
  quantization does.

On the board (MaixPy v1 API, docs/maixpy-firmware.md#kpu): the model is uploaded (`tl2k210 repl put`,
skipped when the same SHA-256 is there) or read from flash (`--address`, checked against the
local file with `Maix.utils.flash_read` + uhashlib); each input is uploaded as a BMP at the
model's input size and loaded with `image.Image(path)` + `pix_to_ai()` (grayscale models get an
8-bit grayscale BMP, exact), vector inputs go as float32 bytes to `kpu.forward(task, [floats])`.
Outputs are `kpu.forward(task, img, i)` (v4: after `set_outputs`); layer n is
`kpu.set_layers(task, n)` + `forward` (the third argument of forward is the output index, not a
layer: docs/maixpy-firmware.md#forward-and-feature-maps). The board sends each map's CRC-32
first and its bytes (base64, 1024 values a line) only when the CRC differs from the emulator's, so
a matching model costs a few bytes per layer at 115200.
"""
from __future__ import annotations

import math
import os
import zlib
from dataclasses import dataclass, field

import numpy as np

from tl2k210.errors import Tl2k210Error
from tl2k210.maixpy.repl import Repl, ReplError

BOARD_CODE = """\
import KPU as kpu, image, ubinascii as _tlb, ustruct as _tls
def _tl_map(fm, f, want):
    n = fm.size() // (1 if f == 'B' else 4)
    c = 0
    i = 0
    while i < n:
        k = min(1024, n - i)
        v = fm[i:i + k]
        c = _tlb.crc32(bytes(v) if f == 'B' else _tls.pack('<%df' % k, *v), c)
        i += k
    c = c & 0xffffffff
    print('#', fm.size(), fm.w(), fm.h(), fm.ch(), c)
    if c != want:
        i = 0
        while i < n:
            k = min(1024, n - i)
            v = fm[i:i + k]
            print(_tlb.b2a_base64(bytes(v) if f == 'B' else _tls.pack('<%df' % k, *v)).decode().strip())
            i += k
        print('$')
def _tl_vec(b):
    d = _tlb.a2b_base64(b)
    return list(_tls.unpack('<%df' % (len(d) // 4), d))
"""


@dataclass
class Sample:
    name: str
    exact: np.ndarray           # what the user gave: CHW uint8 pixels, or a float32 vector
    board: np.ndarray           # what the KPU reads on the board (RGB565 lattice for colour)
    kind: str                   # image | vector


@dataclass
class Row:
    kind: str                   # output | layer
    index: int
    name: str
    shape: tuple
    pairs: dict = field(default_factory=dict)     # pair -> {max_abs_diff, cosine, sqnr_db}
    verdict: str = ""


def metrics(ref, test):
    from tl2k210.quantize.metrics import cosine, sqnr_db
    r, t = np.asarray(ref, np.float64).ravel(), np.asarray(test, np.float64).ravel()
    if r.size != t.size:
        return {"max_abs_diff": None, "cosine": None, "sqnr_db": None,
                "note": f"sizes differ ({r.size} vs {t.size})"}
    same = np.array_equal(r, t)
    return {"max_abs_diff": float(np.max(np.abs(r - t))) if r.size else 0.0,
            "cosine": 1.0 if same else cosine(r, t), "sqnr_db": sqnr_db(r, t)}


# ---- inputs ---------------------------------------------------------------------------------
def model_input(emu):
    shape, dtype = emu.input_spec()
    shape = tuple(shape)
    if len(shape) == 4:
        shape = shape[1:]
    return shape, dtype


def load_samples(paths, emu, limit=16) -> list[Sample]:
    """--input files -> samples; no files: the astronaut photo (scikit-image) or, without it,
    seeded random pixels."""
    from PIL import Image

    from tl2k210.imaging import open_image, rgb565_roundtrip
    from tl2k210.quantize.dataset import IMAGE_SUFFIXES, load_arrays
    shape, dtype = model_input(emu)
    image = len(shape) == 3            # (C, H, W): pixels through an image on the board
    out = []

    def add(name, chw):
        chw = np.ascontiguousarray(chw, np.uint8)
        board = chw if chw.shape[0] == 1 else \
            np.ascontiguousarray(rgb565_roundtrip(chw.transpose(1, 2, 0)).transpose(2, 0, 1))
        out.append(Sample(name, chw, board, "image"))

    if not paths:
        if not image:
            raise Tl2k210Error(f"the model takes {shape[0]} values, not an image: pass --input "
                               "FILE.npy with float32 vectors")
        c, h, w = shape
        try:
            from skimage import data
            pil = Image.fromarray(data.astronaut()).convert("L" if c == 1 else "RGB")
            pil = pil.resize((w, h), Image.BILINEAR)
            a = np.asarray(pil)
            add("astronaut (scikit-image)", a[None] if c == 1 else a.transpose(2, 0, 1))
        except ImportError:
            rng = np.random.default_rng(0)
            add("random pixels (seed 0)", rng.integers(0, 256, (c, h, w)))
        return out
    for p in paths:
        if os.path.splitext(p)[1].lower() in IMAGE_SUFFIXES:
            if not image:
                raise Tl2k210Error(f"{p}: the model takes a vector of {shape[0]} values, not an "
                                   "image; pass a .npy of float32 vectors")
            c, h, w = shape
            pil = open_image(p, "L" if c == 1 else "RGB")
            if pil.size != (w, h):
                pil = pil.resize((w, h), Image.BILINEAR)
            a = np.asarray(pil)
            add(os.path.basename(p), a[None] if c == 1 else a.transpose(2, 0, 1))
            continue
        flat = False
        try:
            arrays = load_arrays(p, (1,) + shape, keep_dtype=True)
        except Tl2k210Error:
            if not image or dtype != np.float32:
                raise
            try:           # a float32 tensor input given as flat vectors: (N, C*H*W)
                arrays, flat = load_arrays(p, (1, int(np.prod(shape))), keep_dtype=True), True
            except Tl2k210Error:
                arrays = []
            if not all(np.issubdtype(a.dtype, np.floating) for a in arrays) or not arrays:
                raise Tl2k210Error(f"{p}: the model takes float32 {shape} (or "
                                   f"{int(np.prod(shape))} values a sample); this file holds "
                                   "neither") from None
        for k, a in enumerate(arrays):
            a = a[0]
            name = f"{os.path.basename(p)}[{k}]"
            if image and a.dtype == np.uint8 and not flat:
                add(name, a)
            elif image and not (np.issubdtype(a.dtype, np.floating) and dtype == np.float32):
                raise Tl2k210Error(f"{name}: this model takes uint8 pixels (0..255) as {shape} "
                                   f"or channels-last; this array is {a.dtype}")
            elif image:                # a float32 input tensor (nncase v4): forward's float list
                v = np.ascontiguousarray(a, np.float32).reshape(-1)
                out.append(Sample(name, v, v, "vector"))
            else:
                v = np.asarray(a, np.float32).reshape(-1)
                out.append(Sample(name, v, v, "vector"))
    return out[:limit]


def bmp_bytes(chw: np.ndarray) -> bytes:
    import io

    from PIL import Image
    img = Image.fromarray(chw[0]) if chw.shape[0] == 1 else Image.fromarray(chw.transpose(1, 2, 0))
    buf = io.BytesIO()
    img.save(buf, format="BMP")
    return buf.getvalue()


# ---- references -------------------------------------------------------------------------------
def emulator_maps(emu, x, per_layer):
    """{('output', i) | ('layer', n): array as the board's fmap holds it}."""
    shape, dtype = emu.input_spec()
    outs, trace = emu.run(np.asarray(x).astype(dtype).reshape(shape), trace=True)
    maps = {("output", i): np.ascontiguousarray(o) for i, o in enumerate(outs)}
    if per_layer:
        for n, (_, y) in enumerate(trace, 1):
            y = np.asarray(y)
            maps[("layer", n)] = np.ascontiguousarray(y if y.dtype == np.uint8 else y.astype(np.float32))
    return maps


def layer_names(model):
    items = model.items
    return [getattr(it, "name", type(it).__name__) for it in items]


class FloatModel:
    """The float source model in onnxruntime, fed like the board feeds the kmodel."""

    def __init__(self, src, pre: dict):
        from tl2k210 import frontends
        from tl2k210.compiler import ConvertOptions, load_options, source_graph
        from tl2k210.k210.flow import run_pipeline
        from tl2k210.quantize.calibrate import FloatRunner
        self.opts = ConvertOptions(**pre)
        model = frontends.load_model(src, **load_options(self.opts))
        self.graph, _ = run_pipeline(source_graph(model, self.opts))
        self.run = FloatRunner(self.graph, expose_all=False)
        self._all = None

    def tensors(self, sample_values, kind):
        """Every tensor of the float graph on this input: {name: array}."""
        from tl2k210.quantize.calibrate import FloatRunner
        if self._all is None:
            self._all = FloatRunner(self.graph, expose_all=True)
        return {k: np.asarray(v, np.float64) for k, v in
                self._all(self._input(sample_values, kind)).items()}

    def _input(self, sample_values, kind):
        from tl2k210.compiler import pixel_mapping
        shape = self.graph.tensors[self.graph.inputs[0]].shape
        x = np.asarray(sample_values, np.float64)
        if kind == "image":
            if self.opts.channel_order.upper() == "BGR" and x.shape[0] == 3:
                x = x[::-1]
            scale, offset = pixel_mapping(self.opts, x.shape[0])
            x = x * scale[:, None, None] + offset[:, None, None]
        return x.astype(np.float32).reshape(shape)

    def __call__(self, sample_values, kind):
        ref = self.run(self._input(sample_values, kind))
        return [np.asarray(ref[o], np.float32) for o in self.graph.outputs]


def match_tensor(emu_map, tensors):
    """The float tensor a kmodel layer's map stands for: same shape (C, H, W) or, for flat maps,
    the same size, in C, H, W order or in H, W, C order (a v3 TENSORFLOW_FLATTEN writes TF's);
    uint8 maps are dequantized by the least-squares affine fit (the kmodel does not store the
    scale of inner layers), float maps compared as they are. Returns (name, fitted emulator
    values, the float values in their order) or (None, None, None)."""
    from tl2k210.quantize.metrics import sqnr_db
    e = np.asarray(emu_map, np.float64)
    best = (None, None, None, -np.inf)
    for name, t in tensors.items():
        t = np.squeeze(t, 0) if t.ndim == 4 and t.shape[0] == 1 else t
        if t.size != e.size or (e.ndim == 3 and t.shape != e.shape):
            continue
        orders = [t.ravel()] + ([t.transpose(1, 2, 0).ravel()] if e.ndim == 1 and t.ndim == 3 else [])
        for r in orders:
            q = e.ravel()
            if emu_map.dtype == np.uint8:
                a = np.vstack([q, np.ones_like(q)]).T
                coef = np.linalg.lstsq(a, r, rcond=None)[0]
                q = a @ coef
            sq = sqnr_db(r, q)
            if sq > best[3]:
                best = (name, q, r, sq)
    return best[:3]


# ---- the board ---------------------------------------------------------------------------------
class BoardModel:
    """The kmodel loaded on the board through a raw REPL; `maps(sample)` runs it."""

    def __init__(self, repl: Repl, model, blob: bytes, src: str, address=None, to=None,
                 progress=None, log=print):
        self.r, self.model, self.log = repl, model, log
        self.dir = None
        if address is not None:
            self._check_flash(address, blob)
            load = f"{address:#x}"
        else:
            self.dir = repl.abspath(to) if to else repl.cwd()
            path = self.dir.rstrip("/") + "/" + os.path.basename(src)
            res = repl.put(blob, path, progress=progress)
            log(f"model {path}: {res.size} bytes, {res.status}")
            load = repr(path)
        self.dir = self.dir or repl.cwd()
        repl.exec_ok(BOARD_CODE, "defining validate's helpers on the board")
        repl.exec_ok(f"_tlv = kpu.load({load})", "kpu.load of the model", idle=120)
        if model.version == 4:
            for i, o in enumerate(model.outputs):
                repl.exec_ok(f"kpu.set_outputs(_tlv, {i}, {o[3] // 4}, 1, 1)", "kpu.set_outputs")

    def _check_flash(self, address, blob):
        import hashlib
        code = ("import Maix, uhashlib, ubinascii\nh = uhashlib.sha256()\ni = 0\n"
                f"while i < {len(blob)}:\n    n = min(4096, {len(blob)} - i)\n"
                f"    h.update(Maix.utils.flash_read({address} + i, n))\n    i += n\n"
                "print(ubinascii.hexlify(h.digest()).decode())")
        got = self.r.exec_ok(code, f"reading the flash at {address:#x}", idle=120).decode().strip()
        if got != hashlib.sha256(blob).hexdigest():
            raise Tl2k210Error(f"the {len(blob)} bytes at flash {address:#x} are not this kmodel "
                               f"(board SHA-256 {got[:16]}...): flash it there first (`tl2k210 "
                               "flash MODEL.kmodel@ADDR`) or let validate upload it (drop "
                               "--address)")

    def load_input(self, k, sample: Sample):
        # the previous input and feature map first: a 320x240 image and its pix_to_ai copy hold
        # 384,000 B of the 512 KiB GC heap, and the next image did not fit beside them
        self.r.exec_ok("_tli = None\n_fm = None\n__import__('gc').collect()", "freeing the previous input")
        if sample.kind == "vector":
            import base64
            b64 = base64.b64encode(np.asarray(sample.exact, "<f4").tobytes()).decode()
            self.r.exec_ok(f"_tli = _tl_vec('{b64}')", "sending the input vector")
            return
        path = f"{self.dir.rstrip('/')}/_tl_in{k}.bmp"
        self.r.put(bmp_bytes(sample.exact), path)
        gray = ".to_grayscale()" if sample.exact.shape[0] == 1 else ""
        try:
            self.r.exec_ok(f"_tli = image.Image({path!r})\n_tli{gray}\n_tli.pix_to_ai()",
                           f"loading {path}")
        finally:           # the card keeps no upload, whatever the load did
            self.r.exec_ok(f"__import__('uos').remove({path!r})", f"removing {path}")

    def fmap(self, key, expect: np.ndarray):
        """The board's fmap for an output or layer: (bytes or None when equal to `expect`,
        (size, w, h, ch))."""
        f = "B" if expect.dtype == np.uint8 else "f"
        want = zlib.crc32(expect.tobytes())
        kind, i = key
        run = f"kpu.forward(_tlv, _tli, {i})" if kind == "output" else \
            f"kpu.set_layers(_tlv, {i})\n_fm = kpu.forward(_tlv, _tli)\nkpu.set_layers(_tlv, 0)"
        code = (f"_fm = {run}\n" if kind == "output" else run + "\n") + f"_tl_map(_fm, '{f}', {want})"
        for attempt in range(3):
            out = self.r.exec_ok(code, f"kpu.forward ({kind} {i})", idle=300)
            lines = out.decode("ascii", "replace").split()
            try:
                h = lines.index("#")
                size, w, hh, ch, crc = (int(v) for v in lines[h + 1:h + 6])
            except (ValueError, IndexError):
                raise ReplError(f"unexpected answer to kpu.forward ({kind} {i}): {out[:120]!r}") from None
            if crc == want:
                return None, (size, w, hh, ch)
            import base64
            data = b"".join(base64.b64decode(s) for s in lines[h + 6:] if s != "$")
            if zlib.crc32(data) == crc:
                return data, (size, w, hh, ch)
            self.log(f"{kind} {i}: the map's bytes arrived damaged; reading it again")
        raise ReplError(f"{kind} {i}: the board's map kept arriving damaged; check the line")

    def close(self):
        try:
            self.r.exec_ok("kpu.deinit(_tlv)", "kpu.deinit")
        except ReplError:
            pass


# ---- the run ------------------------------------------------------------------------------------
def validate(repl: Repl, kmodel_path, inputs=(), per_layer=False, float_src=None, pre=None,
             address=None, to=None, progress=None, log=print, limit=16):
    """Returns the report dict (see `report_table`)."""
    from tl2k210.fileio import read_bytes
    from tl2k210.k210 import kmodel as kfmt
    from tl2k210.k210.emulator import Emulator
    blob = read_bytes(kmodel_path, 64 * 1024 * 1024, "kmodel")
    model = kfmt.loads(blob)
    emu = Emulator(model)
    samples = load_samples(inputs, emu, limit)
    fl = FloatModel(float_src, pre or {}) if float_src else None
    names = layer_names(model)
    board = BoardModel(repl, model, blob, kmodel_path, address, to, progress, log)
    acc = {}                                   # key -> {"board": [], "emu": [], ...}
    info = {}
    try:
        for k, s in enumerate(samples):
            board.load_input(k, s)
            ref = emulator_maps(emu, s.board, per_layer)
            exact = emulator_maps(emu, s.exact, False) if s.kind == "image" else None
            f_board = fl(s.board, s.kind) if fl else None
            f_exact = fl(s.exact, s.kind) if fl else None
            f_all = fl.tensors(s.board, s.kind) if fl and per_layer else None
            for key in sorted(ref, key=lambda t: (t[0] != "output", t[1])):
                e = ref[key]
                data, shp = board.fmap(key, e)
                b = e if data is None else np.frombuffer(data, e.dtype if len(data) == e.nbytes
                                                         else np.uint8)
                a = acc.setdefault(key, {"board": [], "emu": [], "emu_exact": [], "float": [],
                                         "float_exact": [], "layer_float": [], "layer_fit": [],
                                         "tensor": None})
                info[key] = shp
                a["emu_dtype"] = e.dtype
                a["board"].append(np.asarray(b, np.float64).ravel())
                a["emu"].append(np.asarray(e, np.float64).ravel())
                if key[0] == "layer" and f_all is not None:
                    name, fit, wanted = match_tensor(e, f_all if a["tensor"] is None else
                                                     {a["tensor"]: f_all[a["tensor"]]})
                    if name is not None:
                        a["tensor"] = name
                        a["layer_float"].append(wanted)
                        a["layer_fit"].append(fit)
                if key[0] == "output":
                    i = key[1]
                    if exact is not None:
                        a["emu_exact"].append(np.asarray(exact[key], np.float64).ravel())
                    if f_board is not None and i < len(f_board):
                        a["float"].append(f_board[i].astype(np.float64).ravel())
                        a["float_exact"].append(f_exact[i].astype(np.float64).ravel())
            log(f"input {k + 1}/{len(samples)} ({s.name}) done")
    finally:
        board.close()
    rows = []
    first_bad = None
    for key in sorted(acc, key=lambda t: (t[0] != "output", t[1])):
        a = acc[key]
        cat = {n: np.concatenate(v) if v else None for n, v in a.items()
               if n not in ("tensor", "emu_dtype")}
        kind, i = key
        name = f"output {i}" if kind == "output" else f"layer {i} ({names[i - 1]})"
        row = Row(kind, i, name, tuple(info[key][1:]))
        row.pairs["board_vs_emulator"] = metrics(cat["emu"], cat["board"])
        floats_ok = kind == "output" and cat["float"] is not None and \
            cat["float"].size == cat["emu"].size and _out_dtype(emu, i) == np.float32
        if floats_ok:
            row.pairs["emulator_vs_float"] = metrics(cat["float"], cat["emu"])
            if any(s.kind == "image" for s in samples):     # vectors have no RGB565 path
                row.pairs["float_rgb565_vs_exact"] = metrics(cat["float_exact"], cat["float"])
        if kind == "layer" and cat["layer_float"] is not None:
            row.pairs["emulator_vs_float"] = dict(metrics(cat["layer_float"], cat["layer_fit"]),
                                                  tensor=a["tensor"],
                                                  fit="affine" if ref_is_u8(acc, key) else "none")
        row.verdict = verdict(row, fl is not None and kind == "output", floats_ok)
        if kind == "layer" and "emulator_vs_float" in row.pairs and \
                row.verdict.startswith("board = emulator"):
            ef = row.pairs["emulator_vs_float"]
            row.verdict = (f"{'float' if ef['sqnr_db'] >= FLOAT_DB else 'quantization'}: board = "
                           f"emulator; {ef['sqnr_db']:.1f} dB vs the float tensor {ef['tensor']}")
        if kind == "layer" and first_bad is None and row.pairs["board_vs_emulator"]["max_abs_diff"] != 0:
            first_bad = name
        rows.append(row)
    return {"kmodel": str(kmodel_path), "version": model.version, "samples": [s.name for s in samples],
            "float_model": str(float_src) if float_src else None, "per_layer": per_layer,
            "first_differing_layer": first_bad, "rows": [row_dict(r) for r in rows]}


def ref_is_u8(acc, key):
    return acc[key]["emu_dtype"] == np.uint8


def _out_dtype(emu, i):
    """Float outputs only compare with the float model (a uint8 KPU map has no scale here)."""
    if emu.model.version == 4:
        return np.float32
    return emu.model.output_specs()[i][0]


# above this SQNR a gap is float32 rounding (layers computed in float), not quantization: uint8
# quantization of a full-range signal is at best 6.02 * 8 + 1.76 = 49.9 dB
FLOAT_DB = 80.0


def verdict(row: Row, has_float, floats_ok):
    be = row.pairs["board_vs_emulator"]
    if be.get("max_abs_diff") is None:
        return f"runtime: the board's map has another size ({be.get('note')})"
    if be["max_abs_diff"] > 0:
        return "runtime: the board differs from the bit-exact emulator on the same input"
    if not has_float:
        return "board = emulator (bit-exact)"
    if not floats_ok:
        return "board = emulator; no float comparison (uint8 map or the float model's output has another size)"
    q = row.pairs["emulator_vs_float"]["sqnr_db"]
    if q >= FLOAT_DB:
        return f"float: board = emulator = float model up to float rounding ({q:.0f} dB)"
    p = row.pairs.get("float_rgb565_vs_exact", {}).get("sqnr_db", math.inf)
    if p < q:
        return "preprocessing: board = emulator; the RGB565 input path moves the float output more than quantization"
    return "quantization: board = emulator, both differ from the float model"


def _num(v):
    if isinstance(v, float) and math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return v


def row_dict(r: Row):
    return {"kind": r.kind, "index": r.index, "name": r.name, "shape": list(r.shape),
            "verdict": r.verdict,
            "pairs": {k: {m: _num(v) for m, v in d.items()} for k, d in r.pairs.items()}}


def _fmt(v, spec):
    if v is None:
        return "-"
    if isinstance(v, str):
        return v
    return format(v, spec)


def report_table(rep) -> list[str]:
    from tl2k210.tables import text_table
    tensors = any("tensor" in r["pairs"].get("emulator_vs_float", {}) for r in rep["rows"])
    cols = ["map", "board-emu max|d|", "cos", "SQNR dB", "emu-float max|d|", "cos", "SQNR dB"] + \
        (["float tensor"] if tensors else []) + ["RGB565-exact SQNR dB", "gap"]
    rows = []
    for r in rep["rows"]:
        be = r["pairs"]["board_vs_emulator"]
        ef = r["pairs"].get("emulator_vs_float", {})
        pp = r["pairs"].get("float_rgb565_vs_exact", {})
        rows.append([r["name"], _fmt(be.get("max_abs_diff"), ".4g"), _fmt(be.get("cosine"), ".6f"),
                     _fmt(be.get("sqnr_db"), ".1f"), _fmt(ef.get("max_abs_diff"), ".4g"),
                     _fmt(ef.get("cosine"), ".6f"), _fmt(ef.get("sqnr_db"), ".1f")] +
                    ([ef.get("tensor", "-")] if tensors else []) +
                    [_fmt(pp.get("sqnr_db"), ".1f"), r["verdict"].split(":")[0]])
    return text_table(cols, rows)


def plot(rep, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise Tl2k210Error("--plot needs matplotlib (pip install matplotlib)") from None
    outs = [r for r in rep["rows"] if r["kind"] == "output"]
    layers = [r for r in rep["rows"] if r["kind"] == "layer"]
    fig, axes = plt.subplots(1, 2 if layers else 1, figsize=(12 if layers else 6, 4), squeeze=False)
    cap = 100.0

    def db(v):
        return cap if v in ("inf", None) or (isinstance(v, float) and v > cap) else float(v)
    ax = axes[0][0]
    pairs = [("board_vs_emulator", "board vs emulator"), ("emulator_vs_float", "emulator vs float"),
             ("float_rgb565_vs_exact", "float: RGB565 input vs exact")]
    pairs = [(k, lab) for k, lab in pairs if any(k in r["pairs"] for r in outs)]
    width = 0.8 / len(pairs)
    for j, (key, label) in enumerate(pairs):
        vals = [db(r["pairs"].get(key, {}).get("sqnr_db", None)) if key in r["pairs"] else 0
                for r in outs]
        ax.bar(np.arange(len(outs)) + j * width, vals, width, label=label)
    ax.set_xticks(np.arange(len(outs)) + width * (len(pairs) - 1) / 2)
    ax.set_xticklabels([r["name"] for r in outs])
    ax.set_ylabel(f"SQNR dB (>= {cap:g} = identical)")
    ax.set_ylim(0, cap * 1.05)
    ax.set_title("outputs")
    ax.legend(fontsize=8)
    if layers:
        ax = axes[0][1]
        ax.plot([r["index"] for r in layers],
                [db(r["pairs"]["board_vs_emulator"]["sqnr_db"]) for r in layers], "o-",
                label="board vs emulator")
        fl = [r for r in layers if "emulator_vs_float" in r["pairs"]]
        if fl:
            ax.plot([r["index"] for r in fl], [db(r["pairs"]["emulator_vs_float"]["sqnr_db"])
                                               for r in fl], "s--", label="emulator vs float")
        ax.legend(fontsize=8, loc="lower left")
        ax.set_xlabel("layer")
        ax.set_ylabel(f"SQNR dB (>= {cap:g} = identical)")
        ax.set_ylim(0, cap * 1.05)
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax2 = ax.twinx()
        ax2.bar([r["index"] for r in layers],
                [r["pairs"]["board_vs_emulator"]["max_abs_diff"] or 0 for r in layers],
                alpha=0.3, color="red", label="max |diff|")
        ax2.set_ylabel("max |diff| (LSB for uint8 maps)")
        ax.set_title("per layer: board vs emulator" + (" vs float" if fl else ""))
    fig.suptitle(os.path.basename(rep["kmodel"]))
    fig.tight_layout()
    import io
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    from tl2k210.fileio import atomic_write
    atomic_write(path, buf.getvalue(), "--plot")

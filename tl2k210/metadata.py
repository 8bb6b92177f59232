"""`MODEL.kmodel.json`: what a kmodel needs to be used, written beside it by `convert` and `zoo
build` and carried in the `.kfpkg`, so that `run --decode`, `compare`, `demo` and `deploy` know
the preprocessing, the task and its decode parameters without flags (flags still override).

The schema is the `ModelMetadata` dataclass (one place; README "Model metadata" documents it).
A file whose `kmodel.sha256` is not the kmodel's belongs to another kmodel: readers warn and
ignore it. The file is untrusted input, checked once when it is read (`check`): a regular file of
at most 1 MiB, UTF-8 JSON, the schema's types, finite numbers, the ranges the matching flags
accept (`--threshold`, `--nms`, `--std`, `--anchors`, `-a`...). A file that fails any of that,
or of a newer schema version, is ignored with a warning naming the key; a missing one is simply
absent. It is written atomically, replacing a link planted in its place, never its target.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import re
import stat
import sys
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import numpy as np

from tl2k210.errors import Tl2k210Error
from tl2k210.fileio import SIDECAR_SUFFIX, atomic_write, sidecar_path
from tl2k210.flash.kfpkg import read_kfpkg
from tl2k210.k210 import yolo
from tl2k210.k210.board_facts import FLASH_BYTES
from tl2k210.k210.kmodel import detect_version
from tl2k210.tables import printable

SCHEMA = "tl2k210-kmodel-metadata"
VERSION = 1
SUFFIX = SIDECAR_SUFFIX
TASKS = ("yolo2", "classify", "embed", "image")
MAX_BYTES = 1 << 20         # a sidecar is a few KiB: read no more (a .kfpkg member neither)
MAX_CONSTANT_VALUES = 32768  # a constant output's values kept (ST's 256 px SSD: 6,825 anchors, 27,300)
MAX_DEPTH = 16              # the schema nests 3 deep
# an indented JSON array of numbers (raw newlines never occur inside JSON strings)
_NUMBERS = re.compile(r"\[\n\s*((?:-?[0-9][0-9.eE+-]*,?\n\s*)+)\]")


@dataclass
class ModelMetadata:
    kmodel: dict                 # {file, sha256, bytes, version (3|4)}
    input: dict                  # {layout "NCHW", shape [1,C,H,W], dtype "uint8"|"float32",
                                 #  range [lo, hi], mean [..], std [..], bgr}
    outputs: list                # [{name, shape}]
    constants: dict = field(default_factory=dict)  # {name: {shape, values}}: the source model's
                                 # constant outputs (an SSD's anchors), which the kmodel does not compute
    task: str | None = None      # TASKS, or None when not told
    anchors: list | None = None  # YOLOv2 (w, h) pairs, flattened, in grid cells
    labels: list | None = None   # class names
    decode: dict = field(default_factory=dict)    # threshold, nms, top, ... of the task
    firmware: dict = field(default_factory=dict)  # {runtime, budget_bytes, needs_bytes,
                                                  #  script, flash_address}
    source: str | None = None    # the model it was converted from
    tl2k210_version: str = ""
    schema: str = SCHEMA
    version: int = VERSION

    def to_json(self) -> str:
        d = asdict(self)
        d = {"schema": d.pop("schema"), "version": d.pop("version"), **d}
        # one key per line, short lists of numbers on one line
        return _NUMBERS.sub(lambda m: "[" + " ".join(m.group(1).split()) + "]", json.dumps(d, indent=1)) + "\n"

    @classmethod
    def from_dict(cls, d: dict) -> "ModelMetadata":
        """Raises ValueError naming the key when `d` breaks the schema (`check`)."""
        check(d)
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})

    @property
    def flash_address(self) -> int | None:
        a = self.firmware.get("flash_address")
        if a is None or isinstance(a, int):
            return a
        return int(str(a), 0)

    @property
    def planes(self) -> str:
        """The order of the kmodel's input planes: "bgr" for a --bgr kmodel made before the swap
        was folded into its first layer (the host swapped the image: `run`, `compare`), else
        "rgb", the camera's, which MaixPy's kpu.forward feeds as they are."""
        return "bgr" if self.input.get("bgr") and self.input.get("planes") != "rgb" else "rgb"

    def summary_lines(self) -> list[str]:
        """What `inspect` prints (control characters escaped: the text comes from a file)."""
        i = self.input
        pre = (f"pixels 0..255 -> range {i.get('range')}, mean {i.get('mean')}, std {i.get('std')}, "
               + ("BGR planes" if self.planes == "bgr" else "BGR model, the kmodel reads the camera's RGB planes"
                  if i.get("bgr") else "RGB") if i.get("range") else "values as the float model takes them")
        lines = [f"task              {self.task or '-'}",
                 f"input             {'x'.join(map(str, i.get('shape', [])))} {i.get('layout', '')} "
                 f"{i.get('dtype', '')}, {pre}",
                 "outputs           " + ", ".join(f"{o['name']} {'x'.join(map(str, o['shape']))}"
                                                  for o in self.outputs)]
        if self.anchors:
            lines.append(f"anchors           {', '.join(str(v) for v in self.anchors)}")
        if self.labels:
            more = f" ... ({len(self.labels)} labels)" if len(self.labels) > 8 else ""
            lines.append(f"labels            {', '.join(self.labels[:8])}{more}")
        if self.decode:
            lines.append("decode            " + ", ".join(f"{k} {v}" for k, v in self.decode.items()))
        fw = self.firmware
        if fw:
            parts = [f"checked against '{fw['runtime']}' ({fw.get('needs_bytes', 0):,} of "
                     f"{fw.get('budget_bytes', 0):,} B)"] if fw.get("runtime") else []
            if fw.get("flash_address") is not None:
                parts.append(f"flash address {fw['flash_address']}")
            if fw.get("script"):
                parts.append(f"script {fw['script']}")
            lines.append("firmware          " + ", ".join(parts))
        lines.append(f"made by           tl2k210 {self.tl2k210_version} from {self.source or '?'}")
        return [printable(ln) for ln in lines]


# ---- the schema, checked once when a file is read ----------------------------------------------
def _is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _need(ok, key, why):
    if not ok:
        raise ValueError(f"{key} {why}")


def _walk(v, key="", depth=0):
    """No more nesting than the schema has, and every number finite (JSON has no NaN)."""
    _need(depth <= MAX_DEPTH, key or "the document", f"is nested more than {MAX_DEPTH} deep")
    if isinstance(v, float):
        _need(math.isfinite(v), key, f"is {v}, not a finite number")
    elif isinstance(v, dict):
        for k, x in v.items():
            _walk(x, f"{key}.{k}" if key else str(k), depth + 1)
    elif isinstance(v, list):
        for i, x in enumerate(v):
            _walk(x, f"{key}[{i}]", depth + 1)


def _ints(v, key, lo=0):
    _need(isinstance(v, list) and 0 < len(v) <= 8 and all(_is_int(x) and x >= lo for x in v),
          key, f"must be a list of integers >= {lo} (a shape), not {_short(v)}")


def _numbers(v, key, positive=False):
    _need(v is None or (isinstance(v, list) and v and all(_is_num(x) for x in v)), key,
          f"must be a list of finite numbers, not {_short(v)}")
    if v is not None and positive:
        _need(all(x > 0 for x in v), key, f"values must be positive (as --std), not {_short(v)}")


def _short(v) -> str:
    text = json.dumps(v)
    return text if len(text) <= 40 else text[:37] + "..."


def _dict(d, key):
    v = d.get(key)
    _need(isinstance(v, dict), key, f"must be an object, not {_short(v)}")
    return v


def _text(d, key, where, required=False):
    v = d.get(key)
    _need(isinstance(v, str) if required else v is None or isinstance(v, str), f"{where}.{key}",
          f"must be a string, not {_short(v)}")


def _check_kmodel(d):
    k = _dict(d, "kmodel")
    _need(isinstance(k.get("file"), str) and k["file"], "kmodel.file", "must name the kmodel file")
    _need(isinstance(k.get("sha256"), str) and re.fullmatch(r"[0-9a-f]{64}", k["sha256"]),
          "kmodel.sha256", f"must be 64 hex digits, not {_short(k.get('sha256'))}")
    _need(k.get("bytes") is None or (_is_int(k["bytes"]) and k["bytes"] >= 0), "kmodel.bytes",
          "must be a size in bytes")
    _need(k.get("version") in (None, 3, 4) and not isinstance(k.get("version"), bool),
          "kmodel.version", "must be 3 or 4")


def _check_input(d):
    i = _dict(d, "input")
    _ints(i.get("shape"), "input.shape", lo=1)
    if i.get("source_shape") is not None:
        _ints(i["source_shape"], "input.source_shape", lo=1)
    _text(i, "layout", "input")
    _text(i, "start", "input")
    _need(i.get("dtype") in (None, "uint8", "float32"), "input.dtype", "must be uint8 or float32")
    r = i.get("range")
    _need(r is None or (isinstance(r, list) and len(r) == 2 and all(_is_num(x) for x in r)
                        and r[0] < r[1]), "input.range",
          f"must be [MIN, MAX] with MAX > MIN (as --input-range), not {_short(r)}")
    _numbers(i.get("mean"), "input.mean")
    _numbers(i.get("std"), "input.std", positive=True)
    _need(i.get("bgr") in (None, True, False), "input.bgr", f"must be true or false, not {_short(i.get('bgr'))}")
    _need(i.get("planes") in (None, "rgb"), "input.planes", f"must be \"rgb\" or absent, not {_short(i.get('planes'))}")
    pinned = i.get("pinned")
    _need(pinned is None or isinstance(pinned, dict), "input.pinned", f"must be an object, not {_short(pinned)}")
    for name, vals in (pinned or {}).items():
        _need(isinstance(vals, list), f"input.pinned.{name}", f"must be a list of numbers, not {_short(vals)}")
        _numbers(vals, f"input.pinned.{name}")


def _check_outputs(d):
    outs = d.get("outputs")
    _need(isinstance(outs, list), "outputs", f"must be a list, not {_short(outs)}")
    for n, o in enumerate(outs):
        _need(isinstance(o, dict), "outputs", f"must list objects {{name, shape}}, not {_short(o)}")
        _text(o, "name", f"outputs[{n}]", required=True)
        _ints(o.get("shape"), f"outputs[{n}].shape")


def _check_task(d):
    t, a = d.get("task"), d.get("anchors")
    _need(t is None or t in TASKS, "task", f"must be one of {', '.join(TASKS)}, not {_short(t)}")
    _numbers(a, "anchors")
    if t == "yolo2" and a is not None:          # what --anchors accepts
        _need(len(a) % 2 == 0 and all(x > 0 for x in a), "anchors",
              "must be positive (w, h) pairs, as --anchors")
    labels = d.get("labels")
    _need(labels is None or (isinstance(labels, list) and all(isinstance(x, str) for x in labels)),
          "labels", "must be a list of strings")


def _check_decode(d):
    dec = _dict(d, "decode") if "decode" in d else {}
    for k in ("threshold", "nms"):                # what --threshold / --nms accept
        v = dec.get(k)
        _need(v is None or (_is_num(v) and 0 <= v <= 1), f"decode.{k}",
              f"must be a number in 0..1 (as --{k}), not {_short(v)}")


def _check_firmware(d):
    fw = _dict(d, "firmware") if "firmware" in d else {}
    _text(fw, "runtime", "firmware")
    _text(fw, "script", "firmware")
    for k in ("budget_bytes", "needs_bytes"):
        _need(fw.get(k) is None or (_is_int(fw[k]) and fw[k] >= 0), f"firmware.{k}",
              f"must be a size in bytes, not {_short(fw.get(k))}")
    a = fw.get("flash_address")
    if a is not None:
        try:
            n = a if _is_int(a) else int(a, 0)
        except (TypeError, ValueError):
            n = -1
        _need(0 <= n < FLASH_BYTES, "firmware.flash_address",
              f"must be an address in 0..0x{FLASH_BYTES - 1:x} (as -a), not {_short(a)}")


def _check_strings(d):
    _need(d.get("source") is None or isinstance(d["source"], str), "source", "must be a string")
    _need(isinstance(d.get("tl2k210_version", ""), str), "tl2k210_version", "must be a string")


def _check_constants(d):
    cs = d.get("constants") or {}
    _need(isinstance(cs, dict), "constants", f"must be an object {{name: {{shape, values}}}}, not {_short(cs)}")
    for name, c in cs.items():
        _need(isinstance(c, dict), f"constants.{name}", f"must be an object {{shape, values}}, not {_short(c)}")
        _ints(c.get("shape"), f"constants.{name}.shape")
        _numbers(c.get("values"), f"constants.{name}.values")
        _need(c.get("values") is None or len(c["values"]) == math.prod(c["shape"]), f"constants.{name}.values",
              f"must hold {math.prod(c['shape'])} values (its shape), not {len(c.get('values') or ())}")


CHECKS = (_check_kmodel, _check_input, _check_outputs, _check_constants, _check_task, _check_decode,
          _check_firmware, _check_strings)


def check(d) -> None:
    """Raise ValueError("KEY why") for the first thing in the document `d` that breaks the schema."""
    _walk(d)
    for c in CHECKS:
        c(d)



def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def path_for(kmodel_path) -> Path:
    return sidecar_path(kmodel_path)


def write_for(kmodel_path, meta: ModelMetadata) -> Path | None:
    """Write MODEL.kmodel.json beside the kmodel, atomically, replacing whatever is at that
    path (a link planted there is replaced, its target untouched); not for a kmodel written to a
    device or pipe: there is no "beside"."""
    if not Path(kmodel_path).is_file():
        return None
    p = path_for(kmodel_path)
    atomic_write(p, meta.to_json().encode(), "metadata", follow=False)
    return p


def _warn(msg):
    print(f"warning: {printable(msg)}", file=sys.stderr)     # names and values from a file


def _document(raw: bytes, where: str) -> ModelMetadata | None:
    """The metadata in `raw` (a file's bytes), checked (`check`); None, warned, when it is not
    usable."""
    try:
        d = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        _warn(f"{where} is not UTF-8 text (byte {exc.start}); ignoring it: write it again or "
              "delete it")
        return None
    except RecursionError:
        _warn(f"{where} is nested too deep to be metadata; ignoring it: delete it")
        return None
    except ValueError as exc:
        _warn(f"{where} is not valid metadata ({exc}); ignoring it")
        return None
    if not isinstance(d, dict) or d.get("schema") != SCHEMA:
        _warn(f"{where} is not a tl2k210 model metadata file; ignoring it")
        return None
    v = d.get("version", 0)
    if not _is_int(v):
        _warn(f"{where} is not valid metadata (version must be an integer, not {_short(v)}); "
              "ignoring it")
        return None
    if v > VERSION:
        _warn(f"{where} has metadata version {v} (this tl2k210 reads up to {VERSION}); ignoring it")
        return None
    try:
        return ModelMetadata.from_dict(d)
    except ValueError as exc:
        _warn(f"{where} is not valid metadata (key {exc}); ignoring it: fix that key or delete "
              "the file")
        return None


def parse(text, data: bytes, where: str) -> ModelMetadata | None:
    """Metadata from JSON text if it describes `data` (the kmodel bytes), else None (warned)."""
    meta = _document(text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text, where)
    if meta is None:
        return None
    want = meta.kmodel["sha256"]
    if want != sha256(data):
        _warn(f"{where} describes another kmodel (sha256 {want[:12]}..., this one is "
              f"{sha256(data)[:12]}...); ignoring it")
        return None
    return meta


def _read(p) -> bytes | None:
    """The bytes of the file at `p` if it is a regular file of at most MAX_BYTES (a FIFO, a
    device or a giant is never read; warned); None (silently) when there is none."""
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as exc:
        _warn(f"cannot read {p} ({exc.strerror}); ignoring it")
        return None
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            _warn(f"{p} is not a regular file; ignoring it: metadata is a small JSON file")
            return None
        if st.st_size > MAX_BYTES:
            _warn(f"{p} is {st.st_size:,} bytes, more than the 1 MiB metadata can be; ignoring it")
            return None
        raw = fh.read(MAX_BYTES + 1)
    return raw if len(raw) <= MAX_BYTES else None


def load_for(kmodel_path, data: bytes | None = None) -> ModelMetadata | None:
    """The metadata beside a kmodel file, if any and if it is this kmodel's."""
    p = path_for(kmodel_path)
    raw = _read(p)
    if raw is None:
        return None
    if data is None:
        data = Path(kmodel_path).read_bytes()
    return parse(raw, data, str(p))


def from_kfpkg(path, images=None) -> ModelMetadata | None:
    """The metadata a .kfpkg carries (member NAME.kmodel.json) for one of its flashed images
    (`images`: FlashImage list, read from the package when None), if any."""
    found = kfpkg_metadata(path, images)
    return next(iter(found.values()), None)


def kfpkg_metadata(path, images=None) -> dict:
    """{sha256 of an image's data: ModelMetadata} for every NAME.kmodel.json the package
    carries that describes one of its images (the others are warned about and ignored)."""
    import zipfile

    try:
        with zipfile.ZipFile(path) as zf:
            texts = {i.filename: zf.read(i) for i in zf.infolist()
                     if i.filename.endswith(".kmodel" + SUFFIX) and i.file_size <= MAX_BYTES}
    except (OSError, zipfile.BadZipFile):
        return {}
    if not texts:
        return {}
    by_sha = {sha256(img.data) for img in (images if images is not None else read_kfpkg(path))}
    found, strays = {}, []
    for name, raw in texts.items():
        meta = _document(raw, f"{path}:{name}")
        if meta is None:
            continue
        want = meta.kmodel["sha256"]
        if want in by_sha:
            found.setdefault(want, meta)
        else:
            strays.append(name)
    if strays and not found:
        _warn(f"{path}: {', '.join(strays)} describe{'s' if len(strays) == 1 else ''} no image of "
              "the package (sha256 differs); ignoring it")
    return found


def build(data: bytes, name: str, *, input: dict, outputs: list, task=None, anchors=None,
          labels=None, decode=None, firmware=None, source=None, constants=None) -> ModelMetadata:
    from tl2k210 import __version__
    if task is not None and task not in TASKS:
            raise Tl2k210Error(f"task {task!r}: choose from {', '.join(TASKS)}")
    return ModelMetadata(
        kmodel={"file": name, "sha256": sha256(data), "bytes": len(data), "version": detect_version(data)},
        input=input, outputs=outputs, constants=dict(constants or {}), task=task,
        anchors=list(anchors) if anchors else None,
        labels=list(labels) if labels else None, decode=dict(decode or {}),
        firmware=dict(firmware or {}), source=source, tl2k210_version=__version__)


def check_decode(model, extra: dict | None) -> None:
    """Refuse YOLOv2 anchors/labels that the model's region output cannot carry (channels =
    anchors x (5 + classes)), before they are written into its metadata: on the board such a
    pair fails in kpu.init_yolo2 / region_layer_init; and a classifier's labels that are not one
    per output value (Coral's 1001-way MobileNet with ImageNet's 1000: every label one off).
    `model` is the kmodel just lowered."""
    extra = extra or {}
    anchors, labels = extra.get("anchors"), extra.get("labels")
    if extra.get("task") == "classify" and labels:
        n = model.output_size()
        if len(labels) != n:
            bg = " (a TF-slim / Coral classifier counts a background class first: add it)" if n == len(labels) + 1 else ""
            raise Tl2k210Error(f"--labels names {len(labels)} label(s) for a {n}-way classifier output{bg}: "
                               "give one label per output value, in order")
        return
    if (extra.get("task") or ("yolo2" if anchors else None)) != "yolo2":
        return
    if not anchors:
        raise Tl2k210Error("task yolo2 needs its anchors: give --anchors w,h,w,h,... (grid cells, as in "
                           "the MaixPy script's kpu.init_yolo2)")
    if len(anchors) % 2:
        raise Tl2k210Error(f"--anchors has {len(anchors)} numbers; give (w,h) pairs")
    yolo.region_layout(model, model.output_size(), len(anchors) // 2, labels)


def for_conversion(data: bytes, output, graph, opts, image: bool, budget: int, need: int,
                   source: str) -> ModelMetadata:
    """The metadata of a kmodel `tl2k210.compiler.convert` just made; `opts.metadata` adds what
    the compiler cannot know (task, anchors, labels, decode, script, flash_address)."""
    from tl2k210.passes.input_nchw import input_layout
    extra = dict(opts.metadata or {})

    def dims(t):
        return [int(d) for d in (graph.tensors[t].shape or ())]
    shape = dims(graph.inputs[0])
    inp = {"layout": input_layout(graph) or "flat", "shape": shape,
           "dtype": "uint8" if image else "float32", "range": None, "mean": None, "std": None,
           "bgr": False}
    if image:       # the kmodel takes 0..255 pixels; this is what the float model wanted
        inp.update(range=[float(v) for v in opts.input_range], mean=[float(v) for v in opts.mean],
                   std=[float(v) for v in opts.std], bgr=opts.channel_order.upper() == "BGR")
    if image and graph.meta.get("bgr_folded"):   # --bgr folded into the first layer: it reads R, G, B
        inp["planes"] = "rgb"
    x = graph.inputs[0]       # the source's input (as --input-shape gave it, without a batch axis)
    was = graph.meta.get("unbatched", {}).get(x) or graph.meta.get("relabelled", {}).get(x)
    if was is not None:       # ... which passes.input_nchw relabelled (compare feeds it so)
        inp["source_shape"] = [int(d) for d in was]
    if opts.inputs:           # --inputs: the source model's tensor the kmodel is fed (compare starts there)
        inp["start"] = graph.inputs[0]
    if opts.input_values:     # the other inputs, pinned by --input-value
        inp["pinned"] = {x: [float(v) for v in vals] for x, vals in opts.input_values}
    outs = [{"name": o, "shape": dims(o)} for o in graph.outputs]
    # float32's shortest decimals: 27,300 anchors in about 330 KB, well within MAX_BYTES
    consts = {o: {"shape": list(np.shape(v)) or [1],
                  "values": [float(str(x)) for x in np.ravel(v).astype(np.float32)]
                  if np.size(v) <= MAX_CONSTANT_VALUES else None}
              for o, v in graph.meta.get("constant_outputs", {}).items()}
    fw = {"runtime": opts.runtime, "budget_bytes": budget, "needs_bytes": need}
    fw.update({k: extra.pop(k) for k in ("script", "flash_address") if extra.get(k) is not None})
    if isinstance(fw.get("flash_address"), int):
        fw["flash_address"] = f"0x{fw['flash_address']:x}"
    return build(data, Path(output).name, input=inp, outputs=outs, firmware=fw, constants=consts,
                 source=extra.pop("source", source), task=extra.pop("task", None),
                 anchors=extra.pop("anchors", None), labels=extra.pop("labels", None),
                 decode=extra.pop("decode", None))

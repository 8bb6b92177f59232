"""`MODEL.kmodel.json`: what a kmodel needs to be used, written beside it by `convert` and `zoo
build` and carried in the `.kfpkg`, so that `run --decode`, `compare`, `demo` and `deploy` know
the preprocessing, the task and its decode parameters without flags (flags still override).

The schema is the `ModelMetadata` dataclass (one place; README "Model metadata" documents it).
A file whose `kmodel.sha256` is not the kmodel's belongs to another kmodel: readers warn and
ignore it. A file of a newer schema version, or one that does not parse, is ignored with a
warning too; a missing one is simply absent.
"""
from __future__ import annotations

import hashlib
import json
import re
import sys
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from tl2k210.errors import Tl2k210Error
from tl2k210.fileio import SIDECAR_SUFFIX, atomic_write, sidecar_path
from tl2k210.flash.kfpkg import read_kfpkg
from tl2k210.k210 import yolo
from tl2k210.k210.board_facts import FLASH_BYTES
from tl2k210.k210.kmodel import detect_version

SCHEMA = "tl2k210-kmodel-metadata"
VERSION = 1
SUFFIX = SIDECAR_SUFFIX
TASKS = ("yolo2", "classify", "embed", "image")
# an indented JSON array of numbers (raw newlines never occur inside JSON strings)
_NUMBERS = re.compile(r"\[\n\s*((?:-?[0-9][0-9.eE+-]*,?\n\s*)+)\]")


@dataclass
class ModelMetadata:
    kmodel: dict                 # {file, sha256, bytes, version (3|4)}
    input: dict                  # {layout "NCHW", shape [1,C,H,W], dtype "uint8"|"float32",
                                 #  range [lo, hi], mean [..], std [..], bgr}
    outputs: list                # [{name, shape}]
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
        """Raises TypeError/ValueError when a field has the wrong type."""
        known = {f.name for f in fields(cls)}
        meta = cls(**{k: v for k, v in d.items() if k in known})
        for name, kind in _TYPES.items():
            v = getattr(meta, name)
            if not isinstance(v, kind) and not (v is None and name in _OPTIONAL):
                raise TypeError(f"{name} is {type(v).__name__}, not {kind.__name__}")
        if meta.anchors is not None and not all(isinstance(a, (int, float)) for a in meta.anchors):
            raise TypeError("anchors must be numbers")
        if meta.labels is not None and not all(isinstance(s, str) for s in meta.labels):
            raise TypeError("labels must be strings")
        if not all(isinstance(v, (int, float)) for k, v in meta.decode.items() if k in ("threshold", "nms")):
            raise TypeError("decode threshold/nms must be numbers")
        if not all(isinstance(v, int) for v in meta.input.get("shape", [])):
            raise TypeError("input shape must be integers")
        meta.flash_address      # noqa: B018  (parses, or raises ValueError)
        return meta

    @property
    def flash_address(self) -> int | None:
        a = self.firmware.get("flash_address")
        if a is None or isinstance(a, int):
            return a
        return int(str(a), 0)

    def summary_lines(self) -> list[str]:
        """What `inspect` prints."""
        i = self.input
        pre = (f"pixels 0..255 -> range {i.get('range')}, mean {i.get('mean')}, std {i.get('std')}, "
               f"{'BGR' if i.get('bgr') else 'RGB'}" if i.get("range") else "values as the float model takes them")
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
        return lines


_TYPES = {"kmodel": dict, "input": dict, "outputs": list, "task": str, "anchors": list, "labels": list,
          "decode": dict, "firmware": dict, "source": str, "tl2k210_version": str}
_OPTIONAL = {"task", "anchors", "labels", "source"}


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def path_for(kmodel_path) -> Path:
    return sidecar_path(kmodel_path)


def write_for(kmodel_path, meta: ModelMetadata) -> Path | None:
    """Write MODEL.kmodel.json beside the kmodel, atomically (not for a kmodel written to a
    device or pipe: there is no "beside")."""
    if not Path(kmodel_path).is_file():
        return None
    p = path_for(kmodel_path)
    atomic_write(p, meta.to_json().encode(), "metadata")
    return p


def _warn(msg):
    print(f"warning: {msg}", file=sys.stderr)


def parse(text, data: bytes, where: str) -> ModelMetadata | None:
    """Metadata from JSON text if it describes `data` (the kmodel bytes), else None (warned)."""
    try:
        d = json.loads(text)
        if not isinstance(d, dict) or d.get("schema") != SCHEMA:
            _warn(f"{where} is not a tl2k210 model metadata file; ignoring it")
            return None
        if int(d.get("version", 0)) > VERSION:
            _warn(f"{where} has metadata version {d.get('version')} (this tl2k210 reads up to "
                  f"{VERSION}); ignoring it")
            return None
        meta = ModelMetadata.from_dict(d)
        want = meta.kmodel.get("sha256")
    except (ValueError, TypeError, AttributeError) as exc:
        _warn(f"{where} is not valid metadata ({exc}); ignoring it")
        return None
    if want != sha256(data):
        _warn(f"{where} describes another kmodel (sha256 {str(want)[:12]}..., this one is "
              f"{sha256(data)[:12]}...); ignoring it")
        return None
    return meta


def load_for(kmodel_path, data: bytes | None = None) -> ModelMetadata | None:
    """The metadata beside a kmodel file, if any and if it is this kmodel's."""
    p = path_for(kmodel_path)
    try:
        text = p.read_text()
    except (OSError, UnicodeDecodeError):
        return None
    if data is None:
        data = Path(kmodel_path).read_bytes()
    return parse(text, data, str(p))


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
            texts = {i.filename: zf.read(i).decode("utf-8", "replace") for i in zf.infolist()
                     if i.filename.endswith(".kmodel" + SUFFIX) and i.file_size < FLASH_BYTES}
    except (OSError, zipfile.BadZipFile):
        return {}
    if not texts:
        return {}
    by_sha = {sha256(img.data): img.data for img in (images if images is not None else read_kfpkg(path))}
    found, strays = {}, []
    for name, text in texts.items():
        try:
            want = json.loads(text).get("kmodel", {}).get("sha256")
        except (ValueError, AttributeError):
            want = None
        meta = parse(text, by_sha[want], f"{path}:{name}") if want in by_sha else None
        if meta is not None:
            found.setdefault(want, meta)
        elif want not in by_sha:
            strays.append(name)
    if strays and not found:
        _warn(f"{path}: {', '.join(strays)} describe{'s' if len(strays) == 1 else ''} no image of "
              "the package (sha256 differs); ignoring it")
    return found


def build(data: bytes, name: str, *, input: dict, outputs: list, task=None, anchors=None,
          labels=None, decode=None, firmware=None, source=None) -> ModelMetadata:
    from tl2k210 import __version__
    if task is not None and task not in TASKS:
            raise Tl2k210Error(f"task {task!r}: choose from {', '.join(TASKS)}")
    return ModelMetadata(
        kmodel={"file": name, "sha256": sha256(data), "bytes": len(data), "version": detect_version(data)},
        input=input, outputs=outputs, task=task, anchors=list(anchors) if anchors else None,
        labels=list(labels) if labels else None, decode=dict(decode or {}),
        firmware=dict(firmware or {}), source=source, tl2k210_version=__version__)


def check_decode(model, extra: dict | None) -> None:
    """Refuse YOLOv2 anchors/labels that the model's region output cannot carry (channels =
    anchors x (5 + classes)), before they are written into its metadata: on the board such a
    pair fails in kpu.init_yolo2 / region_layer_init. `model` is the KModelV3 just lowered."""
    extra = extra or {}
    anchors, labels = extra.get("anchors"), extra.get("labels")
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
    outs = [{"name": o, "shape": dims(o)} for o in graph.outputs]
    fw = {"runtime": opts.runtime, "budget_bytes": budget, "needs_bytes": need}
    fw.update({k: extra.pop(k) for k in ("script", "flash_address") if extra.get(k) is not None})
    if isinstance(fw.get("flash_address"), int):
        fw["flash_address"] = f"0x{fw['flash_address']:x}"
    return build(data, Path(output).name, input=inp, outputs=outs, firmware=fw,
                 source=extra.pop("source", source), task=extra.pop("task", None),
                 anchors=extra.pop("anchors", None), labels=extra.pop("labels", None),
                 decode=extra.pop("decode", None))

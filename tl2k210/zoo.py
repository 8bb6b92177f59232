"""The model zoo: one folder per network under `models/`, its conversion recipe declared once as
data (`recipe.toml`), built into kmodel + kfpkg + MaixPy script + report by `tl2k210 zoo build`.

recipe.toml keys:
  name, summary, task ("yolo2" | "classify" | "embed" | "image")
  network          "build" or "build:KEY=VALUE,..." — function in the folder's network.py
  weights          file in the folder (written by its train.py), or "testdata:REL/PATH"
  weights_format   "tl2k210" (default: arrays in model.all_weights order) or "keras_order"
  calibration      "data:FUNCTION" (function in the folder's data.py returning HWC uint8 images)
                   or "testdata:REL/DIR" (a folder of images)
  input            {width, height, channels, range = [lo, hi], mean = [...], std = [...]}
  flash_address    where the kmodel goes in flash (MaixPy: kpu.load(ADDRESS))
  firmware         MaixPy script in firmware/ that runs it on a board
  [decode]         task parameters (anchors, threshold, nms, labels, ...)
  [convert]        ConvertOptions overrides (float_fc, weight_bits, method, ...)
"""
from __future__ import annotations

import importlib.util
import json
import re
import tempfile
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tl2k210 import metadata, paths
from tl2k210.errors import Tl2k210Error


@dataclass
class Recipe:
    name: str
    folder: Path
    summary: str
    task: str
    network: str
    weights: str
    input: dict
    calibration: str
    flash_address: int
    firmware: str
    weights_format: str = "tl2k210"
    decode: dict = field(default_factory=dict)
    convert: dict = field(default_factory=dict)

    @property
    def input_shape(self):
        i = self.input
        return (1, i.get("channels", 3), i["height"], i["width"])


def recipes() -> dict[str, Recipe]:
    out = {}
    for f in sorted(paths.models_dir().glob("*/recipe.toml")):
        out[f.parent.name] = load_recipe(f.parent)
    return out


def load_recipe(folder: Path) -> Recipe:
    with open(folder / "recipe.toml", "rb") as fh:
        d = tomllib.load(fh)
    try:
        return Recipe(folder=folder, **d)
    except TypeError as exc:
        raise Tl2k210Error(f"{folder / 'recipe.toml'}: {exc}") from None


def get(name: str) -> Recipe:
    all_ = recipes()
    key = name.replace("-", "_")
    if key not in all_:
        raise Tl2k210Error(f"no zoo model {name!r}; available: {', '.join(all_) or 'none'}")
    return all_[key]


def _module(folder: Path, stem: str):
    path = folder / f"{stem}.py"
    spec = importlib.util.spec_from_file_location(f"tl2k210_zoo_{folder.name}_{stem}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _resolve(ref: str, folder: Path) -> Path:
    if ref.startswith("testdata:"):
        rel = ref.split(":", 1)[1]
        p = paths.testdata(rel)
        if p is None:
            where = paths.testdata_dir()
            raise Tl2k210Error(f"{where / rel if where else rel} missing: this recipe reads the "
                               "tl2k210 test data; set TL2K210_TESTDATA to its folder")
        return p
    return folder / ref


# ---------------------------------------------------------------------------------------------
def save_weights(net, path):
    """TensorLayer model weights as arrays in `all_weights` order (arrays.save_npz: atomic)."""
    from tl2k210.arrays import save_npz
    save_npz(path, [w.numpy() for w in net.all_weights])


def load_weights(net, path):
    from tl2k210.arrays import load_npz
    found = dict(load_npz(path))          # numbers only: an object array is refused by its key
    arrays = [found[f"arr_{i}"] for i in range(len(found)) if f"arr_{i}" in found]
    if len(arrays) != len(net.all_weights):
        raise Tl2k210Error(f"{path}: {len(arrays)} arrays for a network with {len(net.all_weights)} weights")
    for w, a in zip(net.all_weights, arrays):
        if tuple(w.shape) != a.shape:
            raise Tl2k210Error(f"{path}: weight {w.name} is {tuple(w.shape)}, file has {a.shape}")
        w.assign(a)


def build_network(r: Recipe, with_weights: bool = True):
    from tl2k210 import quiet
    from tl2k210.frontends.tensorlayer import fast_layer_init
    quiet.tensorflow()          # network.py imports TensorLayer, which imports TensorFlow
    fast_layer_init()
    mod = _module(r.folder, "network")
    fn, _, kw = r.network.partition(":")
    kwargs = {}
    for item in filter(None, kw.split(",")):
        k, v = item.split("=")
        kwargs[k] = json.loads(v)
    net = getattr(mod, fn)(**kwargs)
    if with_weights:
        wpath = _resolve(r.weights, r.folder)
        if not wpath.exists():
            raise Tl2k210Error(f"{wpath} missing: train it first with `python {r.folder / 'train.py'}`")
        if r.weights_format == "keras_order":
            mod.load_keras_order_npz(net, wpath)
        else:
            load_weights(net, wpath)
    net.eval()
    return net


def calibration_images(r: Recipe) -> list[np.ndarray]:
    kind, _, ref = r.calibration.partition(":")
    if kind == "data":
        return list(getattr(_module(r.folder, "data"), ref)())
    if kind == "testdata":
        from tl2k210.imaging import open_image
        folder = _resolve(r.calibration, r.folder)
        return [np.asarray(open_image(p)) for p in sorted(folder.iterdir())
                if p.suffix.lower() in (".jpg", ".jpeg", ".png", ".bmp")]
    raise Tl2k210Error(f"{r.name}: calibration {r.calibration!r} is neither data:FN nor testdata:DIR")


def labels(r: Recipe) -> list[str] | None:
    """The recipe's class names: [decode] labels as a list, or "testdata:FILE" (one per line)."""
    spec = r.decode.get("labels")
    if isinstance(spec, str):
        path = _resolve(spec, r.folder)
        return [ln.strip() for ln in path.read_text().splitlines() if ln.strip()]
    return list(spec) if spec else None


_ANCHOR_LINE = re.compile(r"^anchor = \(.*\)$", re.M)


def detector_anchors(r: Recipe) -> list | None:
    """The YOLOv2 anchors the recipe's MaixPy script decodes with: its own [decode] anchors, or
    those of the zoo detector its [decode] `detector` names; None when it decodes none."""
    if r.decode.get("anchors") is not None:
        return list(r.decode["anchors"])
    det = r.decode.get("detector")
    return detector_anchors(get(det)) if det else None


def render_script(text: str, anchors, where="the MaixPy script") -> str:
    """`text` with its one `anchor = (...)` line (the anchors it passes to kpu.init_yolo2) set to
    `anchors`; unchanged when `anchors` is None."""
    if anchors is None:
        return text
    out, n = _ANCHOR_LINE.subn(f"anchor = {tuple(float(v) for v in anchors)!r}", text)
    if n != 1:
        raise Tl2k210Error(f"{where} has {n} lines `anchor = (...)`; it needs exactly one, the anchors "
                           "it passes to kpu.init_yolo2, for the model's anchors to be written there")
    return out


def _metadata(r: Recipe) -> dict:
    """What MODEL.kmodel.json gets from the recipe (tl2k210/metadata.py)."""
    decode = {k: v for k, v in r.decode.items() if k not in ("anchors", "labels")}
    return {"task": r.task, "anchors": r.decode.get("anchors"), "labels": labels(r),
            "decode": decode, "script": r.firmware, "flash_address": r.flash_address,
            "source": f"zoo:{r.name} ({r.network}, {r.weights})"}


def build(name: str, out_dir, progress: bool = True) -> dict:
    """kmodel + kfpkg + MaixPy script + report for one zoo network; returns the report. The
    output folder is created first (and removed again if the build fails)."""
    from tl2k210.fileio import make_folder, remove_folders
    r = get(name)
    out = Path(out_dir)
    created = make_folder(out, "--out")
    try:
        return _build(r, out, progress)
    except BaseException:
        remove_folders(created)
        raise


def convert_options(r: Recipe, calib_dir, **kw):
    """The recipe's ConvertOptions, its calibration images written into `calib_dir` as PNGs."""
    from PIL import Image

    from tl2k210.compiler import ConvertOptions
    for k, img in enumerate(calibration_images(r)):
        Image.fromarray(np.asarray(img, np.uint8)).save(Path(calib_dir) / f"{k:04d}.png")
    i = r.input
    return ConvertOptions(dataset=calib_dir, input_range=tuple(i.get("range", (0.0, 1.0))),
                          mean=tuple(i.get("mean", (0.0,))), std=tuple(i.get("std", (1.0,))), **kw, **r.convert)


def _build(r: Recipe, out: Path, progress: bool) -> dict:
    from tl2k210.compiler import convert
    from tl2k210.fileio import atomic_write, check_outputs
    from tl2k210.flash.kfpkg import FlashImage, write_kfpkg
    products = [out / f"{r.name}{ext}" for ext in (".kmodel", ".kmodel.json", ".kfpkg", "_main.py",
                                                    ".report.json", ".report.txt")]
    script = paths.firmware_dir() / r.firmware
    sources = [r.folder, script]
    if r.calibration.startswith("testdata:"):
        sources.append(_resolve(r.calibration, r.folder))
    check_outputs([("--out", p) for p in products], sources)
    text = script.read_text() if script.exists() else None
    if text is not None and f"0x{r.flash_address:x}" not in text.lower():
        raise Tl2k210Error(f"{script} does not load the model from 0x{r.flash_address:x} "
                           "(the recipe's flash_address); make the script's kpu.load() address "
                           "and the recipe's flash_address agree")
    if text is not None:       # the board script decodes with the model's anchors (the recipe's)
        text = render_script(text, detector_anchors(r), script)
    net = build_network(r)
    with tempfile.TemporaryDirectory(prefix="tl2k210-calib-") as calib:
        kpath = out / f"{r.name}.kmodel"
        receipt = convert(net, kpath, convert_options(r, calib, progress=progress, metadata=_metadata(r)))
    kbytes = kpath.read_bytes()
    meta = metadata.path_for(kpath)
    write_kfpkg([FlashImage(r.flash_address, kbytes, envelope=False, name=kpath.name)],
                out / f"{r.name}.kfpkg", extras={meta.name: meta.read_bytes()})
    if text is not None:
        atomic_write(out / f"{r.name}_main.py", text.encode())
    report = {"name": r.name, "summary": r.summary, "kmodel": str(kpath), "kfpkg": str(out / f"{r.name}.kfpkg"),
              "metadata": str(meta),
              "flash_address": f"0x{r.flash_address:x}", "firmware": str(script) if script.exists() else None,
              "receipt": json.loads(receipt.to_json())}
    atomic_write(out / f"{r.name}.report.json", json.dumps(report, indent=1).encode())
    atomic_write(out / f"{r.name}.report.txt", receipt.table().encode())
    return report

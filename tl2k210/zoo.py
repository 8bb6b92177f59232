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
import io
import json
import os
import sys
import tempfile
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tl2k210.errors import Tl2k210Error

REPO = Path(__file__).resolve().parents[1]
MODELS = REPO / "models"
FIRMWARE = REPO / "firmware"
TESTDATA = Path(os.environ.get("TL2K210_TESTDATA", REPO.parent / "shared" / "testdata"))


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
    for f in sorted(MODELS.glob("*/recipe.toml")):
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
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    spec.loader.exec_module(mod)
    return mod


def _resolve(ref: str, folder: Path) -> Path:
    if ref.startswith("testdata:"):
        p = TESTDATA / ref.split(":", 1)[1]
        if not p.exists():
            raise Tl2k210Error(f"{p} missing (set TL2K210_TESTDATA)")
        return p
    return folder / ref


# ---------------------------------------------------------------------------------------------
def save_weights(net, path):
    """TensorLayer model weights as arrays in `all_weights` order (np.savez, atomic)."""
    from tl2k210.fileio import atomic_write
    buf = io.BytesIO()
    np.savez_compressed(buf, *[np.asarray(w.numpy()) for w in net.all_weights])
    atomic_write(path, buf.getvalue())


def load_weights(net, path):
    with np.load(path) as z:
        arrays = [z[f"arr_{i}"] for i in range(len(z.files))]
    if len(arrays) != len(net.all_weights):
        raise Tl2k210Error(f"{path}: {len(arrays)} arrays for a network with {len(net.all_weights)} weights")
    for w, a in zip(net.all_weights, arrays):
        if tuple(w.shape) != a.shape:
            raise Tl2k210Error(f"{path}: weight {w.name} is {tuple(w.shape)}, file has {a.shape}")
        w.assign(a)


def build_network(r: Recipe, with_weights: bool = True):
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


def _build(r: Recipe, out: Path, progress: bool) -> dict:
    from PIL import Image

    from tl2k210.compiler import ConvertOptions, convert
    from tl2k210.fileio import atomic_write, check_outputs
    from tl2k210.flash.kfpkg import FlashImage, write_kfpkg
    products = [out / f"{r.name}{ext}" for ext in (".kmodel", ".kfpkg", "_main.py", ".report.json",
                                                    ".report.txt")]
    sources = [r.folder, FIRMWARE / r.firmware]
    if r.calibration.startswith("testdata:"):
        sources.append(_resolve(r.calibration, r.folder))
    check_outputs([("--out", p) for p in products], sources)
    script = FIRMWARE / r.firmware
    text = script.read_text() if script.exists() else None
    if text is not None and f"0x{r.flash_address:x}" not in text.lower():
        raise Tl2k210Error(f"{script} does not load the model from 0x{r.flash_address:x} "
                           "(the recipe's flash_address)")
    net = build_network(r)
    with tempfile.TemporaryDirectory(prefix="tl2k210-calib-") as calib:
        for i, img in enumerate(calibration_images(r)):
            Image.fromarray(np.asarray(img, np.uint8)).save(Path(calib) / f"{i:04d}.png")
        i = r.input
        opts = ConvertOptions(dataset=calib, input_range=tuple(i.get("range", (0.0, 1.0))),
                              mean=tuple(i.get("mean", (0.0,))), std=tuple(i.get("std", (1.0,))),
                              progress=progress, **r.convert)
        kpath = out / f"{r.name}.kmodel"
        receipt = convert(net, kpath, opts)
    kbytes = kpath.read_bytes()
    write_kfpkg([FlashImage(r.flash_address, kbytes, envelope=False, name=f"{r.name}.kmodel")],
                out / f"{r.name}.kfpkg")
    if text is not None:
        atomic_write(out / f"{r.name}_main.py", text.encode())
    report = {"name": r.name, "summary": r.summary, "kmodel": str(kpath), "kfpkg": str(out / f"{r.name}.kfpkg"),
              "flash_address": f"0x{r.flash_address:x}", "firmware": str(script) if script.exists() else None,
              "receipt": json.loads(receipt.to_json())}
    atomic_write(out / f"{r.name}.report.json", json.dumps(report, indent=1).encode())
    atomic_write(out / f"{r.name}.report.txt", receipt.table().encode())
    return report


# ---------------------------------------------------------------------------------------------
def add_zoo_parser(sub):
    p = sub.add_parser("zoo", help="the model zoo: list networks, build kmodel + kfpkg + script",
                       description="TensorLayer networks designed for the KPU, trained by the "
                       "scripts in models/, converted by tl2k210.")
    zs = p.add_subparsers(dest="zoo_verb", metavar="ACTION")
    zs.required = True
    lp = zs.add_parser("list", help="list the zoo networks")
    lp.set_defaults(func=cmd_list)
    bp = zs.add_parser("build", help="build NAME into kmodel + kfpkg + MaixPy script + report")
    bp.add_argument("name")
    bp.add_argument("--out", default="out/zoo", help="output folder (out/zoo)")
    bp.add_argument("-q", "--quiet", action="store_true")
    bp.set_defaults(func=cmd_build)


def cmd_list(args):
    rows = []
    for name, r in recipes().items():
        w = _resolve(r.weights, r.folder)
        rows.append((name, r.task, f"{r.input['width']}x{r.input['height']}", f"0x{r.flash_address:x}",
                     "yes" if w.exists() else "no (run train.py)", r.summary))
    cols = ("name", "task", "input", "flash", "weights", "summary")
    from tl2k210.tables import text_table
    print("\n".join(text_table(cols, rows, rule=False)))
    return 0


def cmd_build(args):
    if not str(args.out).strip():
        raise Tl2k210Error("--out: empty path; give an output folder (default out/zoo)")
    rep = build(args.name, args.out, progress=not args.quiet)
    print(Path(rep["kmodel"]).with_suffix(".report.txt").read_text())
    print(f"\nwrote {rep['kmodel']}, {rep['kfpkg']} (model at {rep['flash_address']})"
          + (f", {Path(args.out) / (rep['name'] + '_main.py')}" if rep["firmware"] else ""))
    return 0

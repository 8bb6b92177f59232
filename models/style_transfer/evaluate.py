"""Evaluate the style-transfer kmodel against the float TensorLayer network on the held-out photos.

    .venv/bin/python models/style_transfer/evaluate.py [--kmodel ~/.cache/tl2k210/zoo/style_transfer.kmodel] [--out DIR]

Builds the kmodel from the recipe when --kmodel is not given (zoo.build into --out). For each
held-out photo (data.heldout_photos(): astronaut, chelsea, tiger; centre square -> 128x128):
PSNR and SSIM (skimage.metrics, data_range 1, over RGB) of the kmodel output (bit-exact KPU
emulator) vs the float output, the mean absolute difference between the stylised output and the
content (how far the style moved it), and a side-by-side PNG content | float | kmodel.
Writes DIR/style_transfer_eval.json and DIR/NAME_side_by_side.png; prints the JSON.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from tl2k210 import paths

sys.path.insert(0, str(paths.models_dir().parent))   # `models.<name>` imports (checkout or wheel)
HERE = paths.models_dir() / "style_transfer"

from models.style_transfer import data  # noqa: E402

SIZE = data.SIZE


def to_uint8(y: np.ndarray) -> np.ndarray:
    return (np.clip(y, 0.0, 1.0) * 255 + 0.5).astype(np.uint8)


def float_outputs(images):
    """HWC uint8 images -> HWC float outputs of the float TensorLayer network (recipe weights)."""
    from tl2k210 import zoo
    net = zoo.build_network(zoo.get("style_transfer"))
    return [np.asarray(net(img[None].astype(np.float32) / 255.0).numpy()[0], np.float32) for img in images]


def kmodel_outputs(kmodel_path, images):
    """HWC uint8 images -> HWC float outputs of the kmodel on the bit-exact emulator."""
    from tl2k210.k210.emulator import Emulator
    emu = Emulator.load(kmodel_path)
    outs = []
    for img in images:
        o = np.asarray(emu.run(np.ascontiguousarray(img.transpose(2, 0, 1)))[0], np.float32)
        outs.append(o.reshape(3, img.shape[0], img.shape[1]).transpose(1, 2, 0))
    return outs


def metrics(ref: np.ndarray, test: np.ndarray) -> dict:
    from skimage.metrics import peak_signal_noise_ratio, structural_similarity
    ref, test = np.clip(ref, 0, 1).astype(np.float64), np.clip(test, 0, 1).astype(np.float64)
    return {"psnr_db": float(peak_signal_noise_ratio(ref, test, data_range=1.0)),
            "ssim": float(structural_similarity(ref, test, data_range=1.0, channel_axis=-1))}


def side_by_side(content, *outs) -> np.ndarray:
    gap = np.full((content.shape[0], 4, 3), 255, np.uint8)
    parts = [content]
    for o in outs:
        parts += [gap, to_uint8(o)]
    return np.concatenate(parts, 1)


def evaluate(kmodel_path, out_dir) -> dict:
    from PIL import Image
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    photos = {k: data.center_square(v) for k, v in data.heldout_photos().items()}
    names, images = list(photos), list(photos.values())
    fl, km = float_outputs(images), kmodel_outputs(kmodel_path, images)
    rep = {"kmodel": str(kmodel_path), "photos": {}}
    for name, img, f, k in zip(names, images, fl, km):
        x = img.astype(np.float32) / 255.0
        r = metrics(f, k)
        r["float_vs_content_mad"] = float(np.abs(f - x).mean())
        r["kmodel_vs_content_mad"] = float(np.abs(k - x).mean())
        r["kmodel_vs_float_max_abs"] = float(np.abs(k - f).max())
        png = out_dir / f"{name}_side_by_side.png"
        Image.fromarray(side_by_side(img, f, k)).save(png)
        r["png"] = str(png)
        rep["photos"][name] = r
    ps = [r["psnr_db"] for r in rep["photos"].values()]
    ss = [r["ssim"] for r in rep["photos"].values()]
    rep["mean_psnr_db"], rep["min_psnr_db"] = float(np.mean(ps)), float(np.min(ps))
    rep["mean_ssim"], rep["min_ssim"] = float(np.mean(ss)), float(np.min(ss))
    rep["mean_float_vs_content_mad"] = float(np.mean([r["float_vs_content_mad"] for r in rep["photos"].values()]))
    (out_dir / "style_transfer_eval.json").write_text(json.dumps(rep, indent=1))
    return rep


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kmodel", help="kmodel to evaluate (default: build it from the recipe)")
    ap.add_argument("--out", default="out/style_transfer_eval")
    ap.add_argument("--sample", help="also write the rows of all photos stacked into this PNG "
                    "(256-colour palette; the README's sample.png)")
    a = ap.parse_args(argv)
    kmodel = a.kmodel
    if kmodel is None:
        from tl2k210 import zoo
        rep = zoo.build("style_transfer", a.out, progress=False)
        kmodel = rep["kmodel"]
        print(Path(kmodel).with_suffix(".report.txt").read_text())
    rep = evaluate(kmodel, a.out)
    if a.sample:
        from PIL import Image
        rows = [np.asarray(Image.open(r["png"])) for r in rep["photos"].values()]
        gap = np.full((4, rows[0].shape[1], 3), 255, np.uint8)
        stacked = [rows[0]] + [p for r in rows[1:] for p in (gap, r)]
        Image.fromarray(np.concatenate(stacked, 0)).quantize(   # 256-colour PNG: small to commit
            colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE).save(a.sample, optimize=True)
    print(json.dumps(rep, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`make demo`: build the face-detection zoo model from its committed weights, flash its .kfpkg
into an emulated board, run the unchanged MaixPy firmware script on the host on a real photo,
and write the annotated PNG and the report.

Until models/face_detect/weights.npz exists (models/face_detect/README.md, Training), the demo
uses MaixPy's own face-detection package from the testdata with the same firmware script.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from tl2k210 import paths
from tl2k210.k210.board_facts import MAIXPY_MODEL_AREA


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default="out/demo")
    ap.add_argument("--image", help="photo (default: scikit-image's astronaut)")
    ap.add_argument("-v", "--verbose", action="store_true", help="show TensorFlow's own log output")
    args = ap.parse_args(argv)
    from tl2k210 import quiet
    quiet.set_verbose(args.verbose)
    from tl2k210 import zoo
    from tl2k210.k210 import kmodel
    from tl2k210.k210.inspect import describe, render
    from tl2k210.k210.kmodel import atomic_write
    from tl2k210.maixpy import board
    from tl2k210.maixpy.runner import run_script

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    image = args.image
    if image is None:
        from PIL import Image
        from skimage import data
        image = str(out / "astronaut.png")
        Image.fromarray(data.astronaut()).save(image)
    recipe = zoo.get("face_detect") if (paths.models_dir() / "face_detect" / "recipe.toml").exists() else None
    if recipe is not None and (recipe.folder / "weights.npz").exists():
        print("building the face_detect zoo model from its committed weights ...", file=sys.stderr)
        built = zoo.build("face_detect", out / "zoo", progress=True)
        kfpkg = Path(built["kfpkg"])
        source = "zoo face_detect (TensorLayer, trained by models/face_detect/train.py and train_torch.py)"
        receipt_text = (out / "zoo" / "face_detect.report.txt").read_text()
    else:
        kfpkg = paths.testdata("kfpkg", "face_model_at_0x300000.kfpkg")
        if kfpkg is None:
            print(f"demo needs {paths.models_dir() / 'face_detect' / 'weights.npz'} or the test "
                  "data's kfpkg/face_model_at_0x300000.kfpkg", file=sys.stderr)
            return 2
        source = "MaixPy's face_model_at_0x300000.kfpkg (testdata; the zoo model is not trained yet)"
        receipt_text = ""
    with tempfile.TemporaryDirectory(prefix="tl2k210-flash-") as tmp:
        flash = board.flash_kfpkg(kfpkg, Path(tmp) / "flash.bin")
        result = run_script(paths.firmware_dir() / "face_detect.py", images=[image], flash=flash,
                            out=out, max_frames=1)
    if result.error is not None:
        print(result.traceback, file=sys.stderr)
        return 1
    png = Path(result.pngs[-1]) if result.pngs else None
    if png is not None:
        png.replace(out / "facedetect.png")
        png = out / "facedetect.png"
    from tl2k210.flash.kfpkg import read_kfpkg
    model = kmodel.loads(next(i.data for i in read_kfpkg(kfpkg) if i.address == MAIXPY_MODEL_AREA))
    info = describe(model, "flash@0x300000")
    report = {"model": source, "image": image, "script": "firmware/face_detect.py",
              "printed": result.lines, "png": str(png) if png else None,
              "summary": {k: info[k] for k in ("version", "layer_count", "kpu_layers", "cpu_layers",
                                                "total_macs", "peak_kpu_ram", "main_memory")}}
    atomic_write(out / "report.json", json.dumps(report, indent=1).encode())
    text = "\n".join([f"model: {source}", f"photo: {image}", "firmware/face_detect.py printed:"]
                     + [f"  {ln}" for ln in result.lines] + ["", receipt_text or render(info)])
    atomic_write(out / "report.txt", text.encode())
    print(text)
    print(f"\nwrote {png}, {out / 'report.json'}, {out / 'report.txt'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

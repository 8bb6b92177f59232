"""`make demo`: run a real face-detection kmodel on the bit-exact emulator on a real photo,
write the annotated PNG and a report (the compiler issue upgrades this to a zoo model)."""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from tl2k210 import imaging
from tl2k210.k210 import kmodel, yolo
from tl2k210.k210.emulator import Emulator
from tl2k210.k210.inspect import describe, render
from tl2k210.k210.kmodel import atomic_write

REPO = Path(__file__).resolve().parents[1]
TESTDATA = Path(os.environ.get("TL2K210_TESTDATA", REPO.parent / "shared" / "testdata"))
FACE_ANCHORS = [1.889, 2.5245, 2.9465, 3.94056, 3.99987, 5.3658, 5.155437, 6.92275, 6.718375, 9.01025]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default="out/demo")
    ap.add_argument("--image", help="photo (default: scikit-image's astronaut)")
    args = ap.parse_args(argv)
    model_path = TESTDATA / "kmodels" / "facedetect_320x240_v3.kmodel"
    if not model_path.exists():
        print(f"demo needs {model_path} (set TL2K210_TESTDATA)", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.image:
        img, name = imaging.load_rgb(args.image), args.image
    else:
        from PIL import Image
        from skimage import data
        img, name = Image.fromarray(data.astronaut()), "skimage.data.astronaut()"
    model = kmodel.load(model_path)
    emu = Emulator(model)
    x = imaging.to_model_input(img, (3, 240, 320), rgb565=True)   # as the camera delivers it
    emu.run(x)  # warm-up (thread pool, caches)
    t = time.perf_counter()
    output = emu.run(x)[0]
    ms = 1000 * (time.perf_counter() - t)
    boxes = yolo.decode(output, FACE_ANCHORS, 20, 15, 320, 240, threshold=0.5, nms=0.3)
    shown = imaging.draw_boxes(img.resize((320, 240)), boxes, ["face"])
    png = out / "facedetect.png"
    import io
    buf = io.BytesIO()
    shown.save(buf, format="PNG")
    atomic_write(png, buf.getvalue())
    info = describe(model, str(model_path), model_path.stat().st_size)
    report = {
        "model": str(model_path), "image": name, "emulator_ms": round(ms, 1),
        "boxes": [dict(x=round(b.x, 1), y=round(b.y, 1), w=round(b.w, 1), h=round(b.h, 1),
                       score=round(b.value, 4)) for b in boxes],
        "output_stats": {"min": float(np.min(output)), "max": float(np.max(output))},
        "model_summary": {k: info[k] for k in ("version", "layer_count", "kpu_layers", "cpu_layers",
                                                "total_macs", "peak_kpu_ram", "main_memory")},
    }
    atomic_write(out / "report.json", json.dumps(report, indent=1).encode())
    text = render(info) + "\n\n" + "\n".join(
        [f"input: {name} -> 320x240 RGB565 -> RGB888 planar", f"emulated in {ms:.1f} ms",
         f"{len(boxes)} face(s):"] + [f"  score {b.value:.3f}  x={b.x:.0f} y={b.y:.0f} w={b.w:.0f} "
                                      f"h={b.h:.0f}" for b in boxes])
    atomic_write(out / "report.txt", text.encode())
    print(text)
    print(f"\nwrote {png}, {out / 'report.json'}, {out / 'report.txt'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Host face recognition: detect (the face detector kmodel) -> crop -> embed (the embedder
kmodel) -> cosine match against enrolled faces, all on the bit-exact KPU emulator, with the same
image operations as firmware/face_recognition.py on a board (tl2k210.maixpy's image module):

  frame    the photo resized to the camera's 320x240 (bilinear), RGB565 like the sensor
  detect   YOLOv2 region decode (anchors, threshold 0.5, NMS 0.3), boxes clamped as MaixPy does
  crop     face_box(): a square of side max(w, h) centred on the box, kept inside the frame;
           img.cut(...).resize(64, 64), pix_to_ai()
  embed    kmodel output (128 floats), L2-normalised on the CPU
  match    cosine similarity with every enrolled embedding; the best one if >= the recipe's
           [decode] threshold, else "unknown"

    .venv/bin/python -m models.face_recognition.recognize \\
        --enroll astronaut=astronaut.png --enroll grace=grace_hopper.jpg \\
        --image group.png [--image ...] --out out/face_recognition/ [--embedder K] [--detector K] \\
        [--letterbox]

The embedder defaults to face_recognition.kmodel in the zoo folder (~/.cache/tl2k210/zoo, where
`tl2k210 zoo build` writes; built if missing), the detector to face_detect.kmodel there if
built, else the testdata facedetect_320x240_v3.kmodel.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tl2k210 import paths

sys.path.insert(0, str(paths.models_dir().parent))   # `models.<name>` imports (checkout or wheel)
# MaixPy's face anchors: for a detector without tl2k210 metadata (MaixPy's own face model)
from models.face_detect.network import MAIXPY_ANCHORS  # noqa: E402

FRAME_W, FRAME_H = 320, 240
SIZE = 64
DETECT_THRESHOLD, DETECT_NMS = 0.5, 0.3


def default_detector() -> Path:
    built = paths.zoo_dir() / "face_detect.kmodel"
    if built.is_file():
        return built
    testdata = paths.testdata("kmodels", "facedetect_320x240_v3.kmodel")
    if testdata is None:
        raise SystemExit("no face detector: `tl2k210 zoo build face_detect` or pass --detector")
    return testdata


def default_threshold() -> float:
    from tl2k210 import zoo
    return float(zoo.get("face_recognition").decode.get("threshold", 0.5))


def letterbox(rgb, fill=0):
    """A photo padded (centred, `fill` grey) to the camera's 4:3, so that the stretch to 320x240
    keeps its aspect (ORL's 92x112 portraits would otherwise be widened 1.6x)."""
    rgb = np.asarray(rgb, np.uint8)
    if rgb.ndim == 2:
        rgb = np.repeat(rgb[..., None], 3, 2)
    h, w = rgb.shape[:2]
    W, H = max(w, -(-h * 4 // 3)), max(h, -(-w * 3 // 4))
    out = np.full((H, W, 3), fill, np.uint8)
    y, x = (H - h) // 2, (W - w) // 2
    out[y:y + h, x:x + w] = rgb
    return out


def face_box(x, y, w, h, fw=FRAME_W, fh=FRAME_H):
    """The square crop (x, y, s, s) for a detection box, inside the frame (same integer
    arithmetic as the MaixPy script)."""
    s = min(max(w, h), fw, fh)
    x0 = min(max(0, x + w // 2 - s // 2), fw - s)
    y0 = min(max(0, y + h // 2 - s // 2), fh - s)
    return x0, y0, s, s


@dataclass
class Match:
    box: tuple          # detection (x, y, w, h) on the 320x240 frame
    name: str           # enrolled name or "unknown"
    score: float        # best cosine similarity
    embedding: np.ndarray


class Recognizer:
    def __init__(self, embedder, detector=None, threshold=None):
        from tl2k210.k210.emulator import Emulator
        self.embedder = Emulator.load(embedder)
        from tl2k210 import metadata
        detector = detector or default_detector()
        self.detector = Emulator.load(detector)
        meta = metadata.load_for(detector)       # the zoo detector's anchors: its metadata's
        self.anchors = list(meta.anchors) if meta is not None and meta.anchors else MAIXPY_ANCHORS
        self.threshold = default_threshold() if threshold is None else float(threshold)
        self.names, self.gallery = [], []

    @staticmethod
    def frame(rgb):
        """The camera frame: a MaixPy image.Image (RGB565, AI buffer filled) of the photo."""
        from PIL import Image as PIL

        from tl2k210.maixpy import image
        pil = rgb if isinstance(rgb, PIL.Image) else PIL.fromarray(np.asarray(rgb, np.uint8))
        pil = pil.convert("RGB").resize((FRAME_W, FRAME_H), PIL.BILINEAR)
        img = image.Image._from_rgb(np.asarray(pil, np.uint8), image.RGB565)
        img.pix_to_ai()
        return img

    def detect(self, img):
        from tl2k210.k210 import yolo
        out = np.asarray(self.detector.run(img._ai_buffer())[0], np.float32)
        boxes = []
        for b in yolo.decode(out, self.anchors, 20, 15, FRAME_W, FRAME_H, DETECT_THRESHOLD, DETECT_NMS):
            x0, y0 = max(0.0, b.x), max(0.0, b.y)          # region_layer.c clamp + truncation
            w, h = min(b.w - (x0 - b.x), FRAME_W - x0), min(b.h - (y0 - b.y), FRAME_H - y0)
            boxes.append((int(x0), int(y0), int(w), int(h)))
        return boxes

    def embed(self, img, box):
        """L2-normalised embedding of the face in `box` of a frame image."""
        x, y, s, _ = face_box(*box, img.width(), img.height())
        face = img.cut(x, y, s, s).resize(SIZE, SIZE)
        face.pix_to_ai()
        e = np.asarray(self.embedder.run(face._ai_buffer())[0], np.float64).reshape(-1)
        return e / max(float(np.linalg.norm(e)), 1e-12)

    def enroll(self, name, rgb):
        """Enroll the largest face of a photo under `name`; returns its box."""
        img = self.frame(rgb)
        boxes = self.detect(img)
        if not boxes:
            raise ValueError(f"enroll {name}: no face found")
        box = max(boxes, key=lambda b: b[2] * b[3])
        self.names.append(name)
        self.gallery.append(self.embed(img, box))
        return box

    def recognise(self, rgb):
        """[Match] for every detected face of a photo, and the frame image."""
        img = self.frame(rgb)
        out = []
        for box in self.detect(img):
            e = self.embed(img, box)
            if self.gallery:
                scores = np.stack(self.gallery) @ e
                k = int(np.argmax(scores))
                name = self.names[k] if scores[k] >= self.threshold else "unknown"
                out.append(Match(box, name, float(scores[k]), e))
            else:
                out.append(Match(box, "unknown", 0.0, e))
        return out, img

    def labelled(self, rgb, path=None):
        """Recognise and draw boxes + "name score" on the 320x240 frame; write a PNG if `path`."""
        matches, img = self.recognise(rgb)
        for m in matches:
            color = (0, 255, 0) if m.name != "unknown" else (255, 0, 0)
            img.draw_rectangle(m.box, color=color, thickness=2)
            img.draw_string(m.box[0], max(0, m.box[1] - 12), f"{m.name} {m.score:.2f}", color=color)
        if path:
            from PIL import Image as PIL
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            PIL.fromarray(img._to_rgb888()).save(path)
        return matches, img


def _embedder_path(arg):
    if arg:
        return Path(arg)
    k = paths.zoo_dir() / "face_recognition.kmodel"
    if not k.is_file():
        from tl2k210 import zoo
        zoo.build("face_recognition", k.parent, progress=False)
    return k


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--enroll", action="append", required=True, metavar="NAME=IMG",
                    help="enroll the largest face of IMG as NAME (repeat)")
    ap.add_argument("--image", action="append", required=True, metavar="IMG", help="photo to recognise (repeat)")
    ap.add_argument("--out", default="out/face_recognition",
                    help="a .png (one image) or a folder for the labelled frames")
    ap.add_argument("--embedder", help="embedder kmodel (default: the zoo folder's face_recognition.kmodel)")
    ap.add_argument("--detector", help="detector kmodel (default: the zoo folder's face_detect.kmodel or testdata)")
    ap.add_argument("--threshold", type=float, help="cosine threshold (default: the recipe's)")
    ap.add_argument("--letterbox", action="store_true",
                    help="pad every photo to 4:3 before the camera-frame stretch (portraits such as ORL's)")
    args = ap.parse_args(argv)
    from tl2k210.imaging import load_rgb as load

    def load_rgb(path):
        return letterbox(load(path)) if args.letterbox else load(path)

    rec = Recognizer(_embedder_path(args.embedder), args.detector, args.threshold)
    for item in args.enroll:
        name, _, path = item.partition("=")
        box = rec.enroll(name, load_rgb(path))
        print(f"enrolled {name} from {path} (face {box})")
    out = Path(args.out)
    for i, path in enumerate(args.image):
        dst = out if out.suffix == ".png" and len(args.image) == 1 else out / f"{Path(path).stem}_labelled.png"
        matches, _ = rec.labelled(load_rgb(path), dst)
        for m in matches:
            print(f"{path}: face {m.box} -> {m.name} ({m.score:.3f})")
        if not matches:
            print(f"{path}: no face")
        print(f"wrote {dst}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Teacher embeddings for distillation: canmv_examples' feature_extraction.kmodel (the anchor of
evaluate.py, 64x64 RGB in, 192-d out) run on the bit-exact KPU emulator over the training crops.

    .venv/bin/python -m models.face_recognition.teacher --data TRAINING_DIR --out DIR [--views 3]

For each view v (0: the un-jittered central crop; 1, 2, ...: data.augment jitter from
np.random.default_rng([TEACHER_SEED, v])) writes DIR/view{v}.npz (atomic): `images` uint8
(N, 64, 64, 3) -- the very crops the student will be trained on -- `labels` int32 (N,), and
`teacher` float32 (N, 192), the kmodel's raw outputs for those crops. N = the training images of
data.train_identities(min_images=1): LFW folds 2-10, never fold 1. The cache is data derived from
face images: it stays outside the repository. Views already written are kept (resume).

--webfaces: the unlabelled Caltech 10k WebFaces faces instead (data._webfaces_images: the
LFW framing from their landmark boxes, faces under --min-side px skipped), labels -1 (no
identity): extra faces for train.py --extra-teacher, never the same folder as the LFW cache.
"""
from __future__ import annotations

import argparse
import io
import sys
import time
from pathlib import Path

import numpy as np

from tl2k210 import paths

sys.path.insert(0, str(paths.models_dir().parent))   # `models.<name>` imports (checkout or wheel)

from models.face_recognition import data  # noqa: E402
from models.face_recognition.evaluate import ANCHOR_KMODEL  # noqa: E402

TEACHER_SEED = 3


def view_crops(imgs96, view: int) -> np.ndarray:
    if view == 0:
        return np.stack([data.center_crop(a) for a in imgs96])
    rng = np.random.default_rng([TEACHER_SEED, view])
    return np.stack([data.augment(a, rng) for a in imgs96])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", help="get-face-training.sh output folder (default $TL2K210_FACE_DATA)")
    ap.add_argument("--out", required=True, help="cache folder (outside the repository)")
    ap.add_argument("--views", type=int, default=3)
    ap.add_argument("--min-images", type=int, default=1)
    ap.add_argument("--webfaces", action="store_true", help="the unlabelled Caltech WebFaces faces, not LFW")
    ap.add_argument("--min-side", type=int, default=24, help="--webfaces: smallest face crop, px")
    args = ap.parse_args(argv)
    root = str(data.training_dir(args.data))
    from tl2k210.fileio import atomic_write
    from tl2k210.k210.emulator import Emulator
    emu = Emulator.load(paths.testdata(*ANCHOR_KMODEL), threads=1)
    imgs96, labels = (data._webfaces_images(root, args.min_side) if args.webfaces
                      else data._train_images(root, args.min_images))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for v in range(args.views):
        f = out / f"view{v}.npz"
        if f.is_file():
            continue
        t0 = time.time()
        crops = view_crops(imgs96, v)
        emb = np.stack([np.asarray(emu.run(np.ascontiguousarray(c.transpose(2, 0, 1)))[0], np.float32).reshape(-1)
                        for c in crops])
        buf = io.BytesIO()
        np.savez(buf, images=crops, labels=labels, teacher=emb)
        atomic_write(f, buf.getvalue())
        print(f"view {v}: {len(crops)} crops, {(time.time() - t0) / len(crops) * 1e3:.1f} ms per crop -> {f}",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Hard-negative mining for the face detector: face-free frames (`data.negative_candidate`:
regions of the face-mask set's photos clear of every face box, and skimage/sklearn photo crops
and dead leaves; never the evaluation's nonface_scenes) on which a detector fires;
`train --hard-negatives FILE` then shows them as face-free frames.

    .venv/bin/python -m models.face_detect.mine --data TRAINING_DIR --weights W.npz \\
        [--candidates 3000] [--keep 600] [--max-score 0.9] --out TRAINING_DIR/hard_negatives.txt

Scores each candidate frame by the detector's highest objectness (sigmoid) over the grid,
keeps the `--keep` highest below `--max-score` (above it a region may hold a face the boxes
miss) and writes `score path x y w h flip` lines,
the path relative to the output's folder (so it must lie inside TRAINING_DIR).
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

from tl2k210 import paths

sys.path.insert(0, str(paths.models_dir().parent))   # `models.<name>` imports (checkout or wheel)

from models.face_detect import data  # noqa: E402
from models.face_detect.network import N_ANCHORS, build  # noqa: E402

MINE_SEED = 5


def scores(net, frames, batch=16):
    """Highest objectness (sigmoid) of each frame."""
    out = []
    for i in range(0, len(frames), batch):
        x = np.stack(frames[i:i + batch]).astype(np.float32) / 255.0
        p = np.asarray(net(x)).reshape(len(x), -1, N_ANCHORS, 6)[..., 4]
        out += list(1 / (1 + np.exp(-p.reshape(len(x), -1).max(1))))
    return np.array(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", help="get-face-training.sh output (default $TL2K210_FACE_DATA)")
    ap.add_argument("--weights", required=True, help="the detector that mines (zoo.save_weights npz)")
    ap.add_argument("--candidates", type=int, default=3000)
    ap.add_argument("--keep", type=int, default=600)
    ap.add_argument("--max-score", type=float, default=0.9)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    root = data.training_dir(args.data)
    out = Path(args.out)
    try:
        out.resolve().parent.relative_to(root.resolve())
    except ValueError:
        data.fail(f"--out {out}: must lie inside the training folder {root}")
    from tl2k210 import quiet, zoo
    quiet.tensorflow()
    net = build(batch=None)
    zoo.load_weights(net, args.weights)
    net.eval()
    specs, s, pending = [], [], []
    for i in range(args.candidates):
        spec = data.negative_candidate(np.random.default_rng([MINE_SEED, i]), root)
        if spec is not None:
            pending.append(spec)
        if len(pending) == 64 or (i + 1 == args.candidates and pending):
            s += list(scores(net, [data.negative_frame(sp) for sp in pending]))
            specs += pending
            pending = []
            print(f"{i + 1}/{args.candidates} candidates", flush=True)
    order = [k for k in np.argsort(-np.array(s), kind="stable") if s[k] < args.max_score][:args.keep]
    rel = {k: specs[k][0] if specs[k][0] == "background" else os.path.relpath(specs[k][0], out.resolve().parent)
           for k in order}
    lines = [f"{s[k]:.4f} {rel[k]} "
             f"{' '.join(str(v) for v in specs[k][1:5])} {int(specs[k][5])}" for k in order]
    from tl2k210.fileio import atomic_write
    atomic_write(out, ("\n".join(lines) + "\n").encode())
    sc = np.array(s)
    print(f"{len(specs)} regions from {args.candidates} candidates; objectness >= 0.5 on "
          f"{int((sc >= 0.5).sum())}, >= {args.max_score} on {int((sc >= args.max_score).sum())}; kept "
          f"{len(order)} (scores {s[order[-1]]:.3f}..{s[order[0]]:.3f}) in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Train the face detector on real faces (data.py: Caltech WebFaces + the face-mask set,
augmented; face-free frames from skimage/sklearn photos and dead leaves), from scratch or from
--init weights (cut down to this network's channels by `slimmed`).

    .venv/bin/python -m models.face_detect.train --data TRAINING_DIR [--init W.npz]

TRAINING_DIR is what ../shared/data/get-face-training.sh fetched. The command of the committed
weights is in README.md.

TensorFlow 2 eager + tf.function. The variables trained are the TensorLayer model's own
(`net.all_weights`); the training forward is written with tf.nn ops on those variables because
TL 2.2.5's BatchNorm cannot be traced inside tf.function (it swaps its moving-stat variables) --
it computes exactly what the TL model computes (checked at start-up in eval mode) plus batch-stat
BatchNorm with TL's moving-average rule (decay 0.9).

YOLOv2 loss: per GT box, the cell holding its centre and the anchor with the best shape IoU are
responsible; BCE on sigmoid(tx, ty) vs the in-cell offset, squared error on tw, th vs
log(w / anchor), scaled by (2 - w*h); objectness BCE, 5x for responsible anchors, 1x for the
others except those whose predicted box already overlaps a face by IoU > 0.6 (ignored).

--init-anchors: the --init weights were trained with other anchors; the head's tw/th biases are
shifted by log(old / new) so that the model predicts the same boxes with network.ANCHORS
(`--steps 0` writes just that). --hard-negatives: mine.py's face-free frames, HARD_P of the
batch. --average A,B: the mean of weight files (a model and its fine-tune), nothing trained.

Resumable: a tf.train.Checkpoint (weights + Adam state + step) in --ckpt (default
out/face_detect_train); every --save-every steps it also writes weights.npz (atomically, via
zoo.save_weights). Batch i is generated from np.random.default_rng([TRAIN_SEED, i]) so a resumed
run sees the same data as an uninterrupted one.
With --threads 1 (the default) a run is bit-reproducible.
"""
from __future__ import annotations

import argparse
import os
import queue
import sys
import threading
import time

import numpy as np

from tl2k210 import paths

sys.path.insert(0, str(paths.models_dir().parent))   # `models.<name>` imports (checkout or wheel)
HERE = paths.models_dir() / "face_detect"

from models.face_detect import data  # noqa: E402
from models.face_detect.network import ANCHORS, N_ANCHORS, build  # noqa: E402

GW, GH, CELL = 20, 15, 16
MAX_BOXES = 48
ANCH = np.asarray(ANCHORS, np.float32).reshape(N_ANCHORS, 2)  # grid units


def targets(boxes_list):
    """numpy targets for a batch: mask, txy, twh, scale (B, GH, GW, A, ...) and padded boxes."""
    b = len(boxes_list)
    mask = np.zeros((b, GH, GW, N_ANCHORS), np.float32)
    txy = np.zeros((b, GH, GW, N_ANCHORS, 2), np.float32)
    twh = np.zeros((b, GH, GW, N_ANCHORS, 2), np.float32)
    scale = np.zeros((b, GH, GW, N_ANCHORS), np.float32)
    gt = np.zeros((b, MAX_BOXES, 4), np.float32)  # cx, cy, w, h in grid units
    for i, boxes in enumerate(boxes_list):
        for j, (x, y, w, h) in enumerate(boxes[:MAX_BOXES]):
            cx, cy, gw, gh = (x + w / 2) / CELL, (y + h / 2) / CELL, w / CELL, h / CELL
            gt[i, j] = (cx, cy, gw, gh)
            col, row = min(int(cx), GW - 1), min(int(cy), GH - 1)
            inter = np.minimum(ANCH[:, 0], gw) * np.minimum(ANCH[:, 1], gh)
            a = int(np.argmax(inter / (ANCH[:, 0] * ANCH[:, 1] + gw * gh - inter)))
            mask[i, row, col, a] = 1
            txy[i, row, col, a] = (cx - col, cy - row)
            twh[i, row, col, a] = (np.log(gw / ANCH[a, 0]), np.log(gh / ANCH[a, 1]))
            scale[i, row, col, a] = 2.0 - (w * h) / (data.W * data.H)
    return mask, txy, twh, scale, gt


def slimmed(arrays, channels):
    """Weights of a wider detector (zoo.save_weights order: per conv the kernel, BatchNorm beta,
    gamma, moving mean, moving var; then the region head) cut to `channels`: each layer keeps
    the output channels with the largest BatchNorm |gamma| (network slimming, Liu et al. 2017)
    and the next layer the matching input channels."""
    out, keep_in = [], np.arange(arrays[0].shape[2])
    for i, c in enumerate(channels):
        w, beta, gamma, mm, mv = arrays[i * 5:i * 5 + 5]
        if c > w.shape[3]:
            data.fail(f"--init: conv{i + 1} has {w.shape[3]} channels, fewer than the {c} wanted")
        keep = np.sort(np.argsort(-np.abs(gamma), kind="stable")[:c])
        out += [w[:, :, keep_in][..., keep], beta[keep], gamma[keep], mm[keep], mv[keep]]
        keep_in = keep
    return out + [arrays[-2][:, :, keep_in], arrays[-1]]


def frames(step, size, root, hard=()):
    """The `size` augmented training frames of `step`, from rng([TRAIN_SEED, step])."""
    rng = np.random.default_rng([data.TRAIN_SEED, step])
    return [data.sample(rng, root, hard) for _ in range(size)]


def batch_arrays(pairs):
    imgs, boxes = zip(*pairs)
    return (np.stack(imgs).astype(np.float32) / 255.0,) + targets(boxes)


def producer(start, end, size, root, hard, q):
    for s in range(start, end):
        q.put((s, frames(s, size, root, hard)))


def reanchored(head_bias, old, new):
    """The region head's bias for `new` anchors that predicts the boxes the `old` anchors did:
    w = anchor * exp(tw), so tw gains log(old / new) (per anchor, w and h)."""
    b = np.array(head_bias, np.float32).reshape(N_ANCHORS, 6)
    b[:, 2:4] += np.log(np.asarray(old, np.float32).reshape(N_ANCHORS, 2) / ANCH)
    return b.reshape(-1)


def average(paths, out):
    """The element-wise mean of zoo.save_weights npz files, written (atomically) to `out`."""
    from tl2k210.arrays import load_npz, save_npz
    sets = [dict(load_npz(p)) for p in paths]
    if any(set(s) != set(sets[0]) or any(s[k].shape != sets[0][k].shape for k in s) for s in sets):
        data.fail(f"--average {','.join(paths)}: the files hold different networks")
    save_npz(out, [np.mean([s[k] for s in sets], 0).astype(sets[0][k].dtype)
                   for k in sorted(sets[0], key=lambda k: int(k.split("_")[1]))])
    print(f"wrote the mean of {len(paths)} weight files to {out}")
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=5000, help="total steps (the LR schedule spans them)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--ckpt", default="out/face_detect_train")
    ap.add_argument("--weights", default=str(HERE / "weights.npz"))
    ap.add_argument("--save-every", type=int, default=250)
    ap.add_argument("--init", help="start from these weights (a zoo.save_weights npz of this network or a "
                    "wider one, cut down by `slimmed`; ignored when resuming a checkpoint)")
    ap.add_argument("--init-anchors", help="the anchors --init was trained with (w,h,...), when not "
                    "network.ANCHORS: the head's tw/th biases are shifted so the boxes stay the same")
    ap.add_argument("--hard-negatives", help="mined hard negatives (mine.py's file): HARD_P of the frames")
    ap.add_argument("--average", metavar="A.npz,B.npz,...", help="write the mean of these weights "
                    "(same network) to --weights and stop: a weight average of a model and its "
                    "fine-tune (WiSE-FT, Wortsman et al. 2022)")
    ap.add_argument("--data", help="get-face-training.sh output folder (default $TL2K210_FACE_DATA)")
    ap.add_argument("--noobj-weight", type=float, default=2.0,
                    help="weight of the no-object (background) objectness loss; higher = fewer false boxes")
    ap.add_argument("--threads", type=int, default=1,
                    help="TensorFlow threads; 1 (default) makes a run bit-reproducible, more may be faster")
    ap.add_argument("--max-minutes", type=float, default=0, help="stop (after saving) when exceeded; 0 = no limit")
    args = ap.parse_args(argv)
    if args.average:
        return average(args.average.split(","), args.weights)
    root = data.training_dir(args.data)

    import tensorflow as tf
    from tl2k210 import zoo
    tf.random.set_seed(0)
    # bit-reproducible: deterministic kernels, and one TF thread (with more, the reduction order
    # of the gradient sums varies from run to run and Adam amplifies it); the data producer
    # runs on the second core
    tf.config.experimental.enable_op_determinism()
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    np.random.seed(0)
    net = build(batch=None)
    ws = net.all_weights
    convs = [ws[i * 5] for i in range(6)]
    bns = [ws[i * 5 + 1:i * 5 + 5] for i in range(6)]  # beta, gamma, moving_mean, moving_var
    head_w, head_b = ws[30], ws[31]
    for beta, gamma, mm, mv in bns:
        mm.assign(tf.zeros_like(mm))
        mv.assign(tf.ones_like(mv))
    hb = np.zeros((N_ANCHORS, 6), np.float32)
    hb[:, 4] = -4.0  # objectness prior ~ 2 %
    head_b.assign(hb.reshape(-1))
    if args.init:
        with np.load(args.init, allow_pickle=False) as z:
            arrays = slimmed([z[f"arr_{i}"] for i in range(len(z.files))], [int(c.shape[-1]) for c in convs])
        if args.init_anchors:
            arrays[-1] = reanchored(arrays[-1], [float(v) for v in args.init_anchors.split(",")], ANCH)
        for w, a in zip(ws, arrays):
            w.assign(a)
        print(f"initialised from {args.init}" + (f" (anchors {args.init_anchors} -> {ANCHORS})"
                                                  if args.init_anchors else ""), flush=True)
    hard = data.read_hard_negatives(args.hard_negatives) if args.hard_negatives else []
    train_vars = [w for w in ws if "moving" not in w.name]

    def forward(x, training):
        n = x
        for i in range(6):
            n = tf.nn.conv2d(n, convs[i], 1, "SAME")
            beta, gamma, mm, mv = bns[i]
            if training:
                m, v = tf.nn.moments(n, [0, 1, 2])
                mm.assign(0.9 * mm + 0.1 * m)
                mv.assign(0.9 * mv + 0.1 * v)
            else:
                m, v = mm, mv
            n = tf.nn.leaky_relu(tf.nn.batch_normalization(n, m, v, beta, gamma, 1e-5), 0.1)
            if i < 4:
                n = tf.nn.max_pool2d(n, 2, 2, "VALID")
        return tf.nn.conv2d(n, head_w, 1, "SAME") + head_b

    net.eval()
    probe = np.random.default_rng(0).random((1, data.H, data.W, 3), dtype=np.float32)
    diff = float(np.abs(net(probe).numpy() - forward(probe, False).numpy()).max())
    assert diff < 1e-4, f"training forward differs from the TL model by {diff}"

    sched = tf.keras.optimizers.schedules.CosineDecay(args.lr * 0.05, max(1, args.steps), alpha=0.01,
                                                      warmup_target=args.lr, warmup_steps=min(200, args.steps // 10))
    opt = tf.keras.optimizers.Adam(args.lr)  # LR set per step from `sched` (the step, not opt.iterations)
    opt.build(train_vars)  # create the Adam slots now so that a checkpoint restores them
    step_var = tf.Variable(0, dtype=tf.int64)
    ckpt = tf.train.Checkpoint(vars=ws, opt=opt, step=step_var)
    mgr = tf.train.CheckpointManager(ckpt, args.ckpt, max_to_keep=2)
    if mgr.latest_checkpoint:
        try:
            ckpt.restore(mgr.latest_checkpoint).assert_existing_objects_matched()
        except (ValueError, AssertionError) as exc:  # a checkpoint from an older optimizer setup
            tf.train.Checkpoint(vars=ws, step=step_var).restore(mgr.latest_checkpoint).expect_partial()
            print(f"optimizer state not restored ({str(exc).splitlines()[0][:80]}); weights and step are", flush=True)
        print(f"resumed from {mgr.latest_checkpoint} at step {int(step_var.numpy())}", flush=True)
    anchors = tf.constant(ANCH)
    col = tf.reshape(tf.range(GW, dtype=tf.float32), (1, 1, GW, 1))
    row = tf.reshape(tf.range(GH, dtype=tf.float32), (1, GH, 1, 1))

    def bce(logits, labels):
        return tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits)

    @tf.function
    def train_step(x, mask, txy, twh, scale, gt):
        with tf.GradientTape() as tape:
            out = forward(x, True)
            p = tf.reshape(out, (-1, GH, GW, N_ANCHORS, 6))
            # predicted boxes (grid units) for the ignore mask
            px = col + tf.sigmoid(p[..., 0])
            py = row + tf.sigmoid(p[..., 1])
            pw = tf.exp(tf.minimum(p[..., 2], 4.0)) * anchors[:, 0]
            ph = tf.exp(tf.minimum(p[..., 3], 4.0)) * anchors[:, 1]
            g = gt[:, None, None, None]  # (B,1,1,1,M,4)
            iw = tf.maximum(0.0, tf.minimum(px[..., None] + pw[..., None] / 2, g[..., 0] + g[..., 2] / 2)
                            - tf.maximum(px[..., None] - pw[..., None] / 2, g[..., 0] - g[..., 2] / 2))
            ih = tf.maximum(0.0, tf.minimum(py[..., None] + ph[..., None] / 2, g[..., 1] + g[..., 3] / 2)
                            - tf.maximum(py[..., None] - ph[..., None] / 2, g[..., 1] - g[..., 3] / 2))
            inter = iw * ih
            ious = inter / (pw[..., None] * ph[..., None] + g[..., 2] * g[..., 3] - inter + 1e-9)
            ignore = tf.cast(tf.stop_gradient(tf.reduce_max(ious, -1)) > 0.6, tf.float32)
            noobj = (1.0 - mask) * (1.0 - ignore)
            nb = tf.cast(tf.shape(x)[0], tf.float32)
            l_xy = tf.reduce_sum(mask[..., None] * scale[..., None] * bce(p[..., 0:2], txy)) / nb
            l_wh = tf.reduce_sum(mask[..., None] * scale[..., None] * tf.square(p[..., 2:4] - twh)) / nb
            l_obj = 5.0 * tf.reduce_sum(mask * bce(p[..., 4], tf.ones_like(mask))) / nb
            l_noobj = args.noobj_weight * tf.reduce_sum(noobj * bce(p[..., 4], tf.zeros_like(mask))) / nb
            l_cls = 0.01 * tf.reduce_mean(tf.square(p[..., 5]))
            l_wd = 1e-4 * tf.add_n([tf.reduce_sum(tf.square(c)) for c in convs + [head_w]])
            loss = l_xy + l_wh + l_obj + l_noobj + l_cls + l_wd
        grads = tape.gradient(loss, train_vars)
        grads, _ = tf.clip_by_global_norm(grads, 10.0)
        opt.apply_gradients(zip(grads, train_vars))
        return tf.stack([loss, l_xy, l_wh, l_obj, l_noobj])

    start = int(step_var.numpy())
    q = queue.Queue(maxsize=4)
    threading.Thread(target=producer, args=(start, args.steps, args.batch, root, hard, q), daemon=True).start()
    t0 = time.time()
    acc = np.zeros(5)
    n_acc = 0

    def save(step):
        step_var.assign(step)
        mgr.save()
        net.eval()
        zoo.save_weights(net, args.weights)
        print(f"saved step {step}: {args.weights}", flush=True)

    step = start
    for step in range(start, args.steps):
        s, pairs = q.get()
        assert s == step
        b = batch_arrays(pairs)
        opt.learning_rate = float(sched(step))
        acc += train_step(*[tf.constant(a) for a in b]).numpy()
        n_acc += 1
        if (step + 1) % 50 == 0:
            el = time.time() - t0
            print(f"step {step + 1}/{args.steps} loss {acc[0] / n_acc:.3f} (xy {acc[1] / n_acc:.3f} wh {acc[2] / n_acc:.3f} "
                  f"obj {acc[3] / n_acc:.3f} noobj {acc[4] / n_acc:.3f}) lr {float(sched(step)):.2e} "
                  f"{el / (step + 1 - start):.2f} s/step, {el / 60:.1f} min", flush=True)
            acc[:] = 0
            n_acc = 0
        if (step + 1) % args.save_every == 0 or step + 1 == args.steps:
            save(step + 1)
        if args.max_minutes and time.time() - t0 > args.max_minutes * 60:
            save(step + 1)
            print("time limit reached", flush=True)
            break
    if start >= args.steps:   # nothing to train (--steps 0): the --init weights as loaded
        save(start)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.exit(main())

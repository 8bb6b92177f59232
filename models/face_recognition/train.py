"""Train the face embedder (network.py) on the LFW people of View-2 folds 2-10 (data.py).

    .venv/bin/python -m models.face_recognition.train --data TRAINING_DIR

TRAINING_DIR is what ../shared/data/get-face-training.sh fetched; the command of the committed
weights is in README.md.

Loss: CosFace (large-margin cosine softmax, s=30, m=0.35) over the training identities. The
class-centre matrix is a training-only variable; the network output is the 128-d embedding.

TensorFlow 2 eager + tf.function. The variables trained are the TensorLayer model's own
(`net.all_weights`); the training forward walks network.LAYERS with tf.nn ops on them because
TL 2.2.5's BatchNorm cannot be traced inside tf.function -- it computes exactly what the TL model
computes in eval mode (checked at start-up) plus batch-stat BatchNorm with TL's moving-average
rule (decay 0.9). Batch i comes from np.random.default_rng([TRAIN_SEED, i]); tf/np seeds fixed.
Writes weights.npz (zoo.save_weights, atomic) every --save-every steps and at the end.

Distillation (--teacher DIR, the cache teacher.py writes: crops and the anchor kmodel's 192-d
embeddings of them): batches are drawn from the cached crops instead of fresh jitter, and the loss
adds --distill x the cosine distance between a linear projection (128 -> 192, a training-only
variable, started at the least-squares fit of the --init model) of the student's embedding and
the teacher's, and --relation x the mean squared difference of the two in-batch cosine-similarity
matrices (what verification compares), to the CosFace loss.

Unlabelled faces (--extra-teacher DIR, a teacher.py --webfaces cache, labels -1): --extra-fraction
of every batch is drawn from them (the same seeded rng, after the labelled draw); they take part
in the distillation and relation losses only, their CosFace term is masked out (the class loss is
the mean over the labelled crops of the batch).
"""
from __future__ import annotations

import argparse
import queue
import sys
import threading
import time

import numpy as np

from tl2k210 import paths

sys.path.insert(0, str(paths.models_dir().parent))   # `models.<name>` imports (checkout or wheel)
HERE = paths.models_dir() / "face_recognition"

from models.face_recognition import data  # noqa: E402
from models.face_recognition.network import BN_EPS, LAYERS, build  # noqa: E402


def cached_batch(step, size, cache, extra=None, extra_fraction=0.0):
    """(images, labels, teacher) of batch `step` from a teacher cache: `size` crops drawn by
    rng([TRAIN_SEED, step]), the last round(size * extra_fraction) of them from the unlabelled
    cache `extra` (labels -1)."""
    rng = np.random.default_rng([data.TRAIN_SEED, step])
    n_x = int(round(size * extra_fraction)) if extra is not None else 0
    parts = [(cache, rng.integers(0, len(cache[0]), size - n_x))]
    if n_x:
        parts.append((extra, rng.integers(0, len(extra[0]), n_x)))
    return tuple(np.concatenate([c[k][idx] for c, idx in parts]) for k in range(3))


def producer(start, end, size, root, min_images, q, cache=None, extra=None, extra_fraction=0.0):
    for s in range(start, end):
        if cache is None:
            q.put((s, data.train_batch(s, size, root, min_images) + (None,)))
        else:
            q.put((s, cached_batch(s, size, cache, extra, extra_fraction)))


def labelled_mean(v, y):
    """The mean of the per-crop values v over the labelled crops (y >= 0) of the batch (0 if none):
    unlabelled crops take no part in CosFace."""
    import tensorflow as tf
    m = tf.cast(y >= 0, v.dtype)
    return tf.reduce_sum(m * v) / tf.maximum(tf.reduce_sum(m), 1.0)


def load_teacher(folder):
    """(images uint8 (N, 64, 64, 3), labels int32 (N,), teacher float32 (N, D)) of all the views
    in a teacher.py cache folder, the teacher embeddings L2-normalised (labels -1: unlabelled)."""
    from pathlib import Path
    files = sorted(Path(folder).glob("view*.npz"))
    if not files:
        data.fail(f"no teacher cache (view*.npz) in {folder}: run python -m models.face_recognition.teacher")
    parts = [np.load(f, allow_pickle=False) for f in files]
    t = np.concatenate([p["teacher"] for p in parts]).astype(np.float32)
    t /= np.linalg.norm(t, axis=1, keepdims=True) + 1e-9
    print(f"teacher cache: {len(files)} views, {len(t)} crops", flush=True)
    return np.concatenate([p["images"] for p in parts]), np.concatenate([p["labels"] for p in parts]), t


def mean_embeddings(net, root, min_images, n_cls):
    """(EMBED, n_cls): each person's mean L2-normalised embedding of the central crops."""
    imgs, labels = data._train_images(root, min_images)
    crops = np.stack([data.center_crop(a) for a in imgs]).astype(np.float32) / 255.0
    e = np.concatenate([net(crops[i:i + 256]).numpy() for i in range(0, len(crops), 256)])
    e /= np.linalg.norm(e, axis=1, keepdims=True) + 1e-9
    sums = np.zeros((n_cls, e.shape[1]), np.float32)
    np.add.at(sums, labels, e)
    return (sums / (np.linalg.norm(sums, axis=1, keepdims=True) + 1e-9)).T


def widen(old, shapes, noise=0.05, seed=0):
    """Net2WiderNet: the arrays of a narrower network of the same LAYERS topology (a zoo.save_weights
    npz, `all_weights` order) -> arrays of `shapes`, computing the same function. Each new channel
    of a conv/pw copies an existing one (its filter and BatchNorm); a dw keeps its input's channel
    map; the next summing layer (pw or the Dense) splits the source channel's input weights between
    its copies in random positive fractions (sum 1), so the output is unchanged. `noise` x the
    filter's std is then added to the copies' producing filters to break their symmetry (Adam would
    otherwise move proportional gradients identically)."""
    rng = np.random.default_rng(seed)
    out, k = [], 0
    g, frac = np.arange(3), np.ones(3)       # new input channel -> old one, its share
    for kind, c, s in LAYERS:
        f, bn = old[k], old[k + 1:k + 5]
        if kind == "dw":
            out += [f[:, :, g]] + [b[g] for b in bn]   # per channel: same map, shares carried on
        else:
            f = f[:, :, g] * frac[None, None, :, None]
            n_old, n_new = f.shape[3], shapes[k][3]
            g = np.r_[np.arange(n_old), rng.integers(0, n_old, n_new - n_old)]
            u = rng.uniform(0.5, 1.5, n_new)
            frac = u / np.bincount(g, u, n_old)[g]
            f = f[..., g].copy()
            f[..., n_old:] += noise * f.std() * rng.standard_normal(f[..., n_old:].shape)
            out += [f] + [b[g] for b in bn]
        assert out[-5].shape == tuple(shapes[k]), (kind, c, out[-5].shape, shapes[k])
        k += 5
    out += [old[k][g] * frac[:, None], old[k + 1]]
    return [a.astype(np.float32) for a in out]


def load_init(net, path):
    """--init: the weights of this network, or (Net2WiderNet, `widen`) of a narrower one."""
    from tl2k210 import zoo
    from tl2k210.arrays import load_npz
    found = dict(load_npz(path))
    arrays = [found[f"arr_{i}"] for i in range(len(found))]
    shapes = [tuple(w.shape) for w in net.all_weights]
    if [a.shape for a in arrays] == shapes:
        return zoo.load_weights(net, path)
    for w, a in zip(net.all_weights, widen(arrays, shapes)):
        w.assign(a)
    print(f"widened {path} to this network (Net2WiderNet)", flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=2500)
    ap.add_argument("--batch", type=int, default=96)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--scale", type=float, default=30.0, help="CosFace s")
    ap.add_argument("--margin", type=float, default=0.35, help="CosFace m")
    ap.add_argument("--weights", default=str(HERE / "weights.npz"))
    ap.add_argument("--save-every", type=int, default=500)
    ap.add_argument("--data", help="get-face-training.sh output folder (default $TL2K210_FACE_DATA)")
    ap.add_argument("--threads", type=int, default=1, help="TensorFlow threads")
    ap.add_argument("--max-minutes", type=float, default=0, help="stop (after saving) when exceeded")
    ap.add_argument("--min-images", type=int, default=2,
                    help="train on the people of folds 2-10 with at least this many images (1: all)")
    ap.add_argument("--init", help="start from these weights (a zoo.save_weights npz of this network, or of a "
                    "narrower one of the same layers: widened, see widen()); the class centres start at the "
                    "people's mean embeddings")
    ap.add_argument("--teacher", help="teacher.py cache folder: distil the anchor kmodel's embeddings")
    ap.add_argument("--extra-teacher", help="teacher.py --webfaces cache folder: unlabelled faces, distilled "
                    "only (needs --teacher)")
    ap.add_argument("--extra-fraction", type=float, default=0.5,
                    help="share of each batch drawn from --extra-teacher")
    ap.add_argument("--distill", type=float, default=5.0, help="weight of the cosine distance to the teacher")
    ap.add_argument("--relation", type=float, default=20.0,
                    help="weight of the in-batch similarity-matrix distance to the teacher's")
    args = ap.parse_args(argv)
    root = str(data.training_dir(args.data))
    if args.extra_teacher and not args.teacher:
        ap.error("--extra-teacher needs --teacher")

    import tensorflow as tf
    from tl2k210 import zoo
    tf.random.set_seed(0)
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    np.random.seed(0)
    net = build(batch=None)
    ws = list(net.all_weights)
    layers, k = [], 0
    for kind, c, s in LAYERS:
        layers.append((kind, s, ws[k], ws[k + 1:k + 5]))   # filters; beta, gamma, moving mean/var
        k += 5
    dense_w, dense_b = ws[k], ws[k + 1]
    assert k + 2 == len(ws)
    n_cls = len(data.train_identities(root, args.min_images))
    centres = tf.Variable(tf.random.normal((dense_w.shape[1], n_cls), stddev=0.05, seed=1), name="centres")
    if args.init:
        load_init(net, args.init)
        net.eval()
        centres.assign(mean_embeddings(net, root, args.min_images, n_cls))
        print(f"initialised from {args.init}; centres = the {n_cls} people's mean embeddings", flush=True)
    train_vars = [w for w in ws if "moving" not in w.name] + [centres]
    cache = load_teacher(args.teacher) if args.teacher else None
    extra = load_teacher(args.extra_teacher) if args.extra_teacher else None
    if cache is not None:
        proj = tf.Variable(tf.zeros((dense_w.shape[1], cache[2].shape[1])), name="proj")
        if args.init:   # least-squares start: the init model's embeddings of the first view -> teacher
            n0 = len(data._train_images(root, args.min_images)[0])
            x0 = cache[0][:n0].astype(np.float32) / 255.0
            e0 = np.concatenate([net(x0[i:i + 256]).numpy() for i in range(0, n0, 256)])
            e0 /= np.linalg.norm(e0, axis=1, keepdims=True) + 1e-9
            proj.assign(np.linalg.lstsq(e0, cache[2][:n0], rcond=None)[0].astype(np.float32))
        train_vars.append(proj)

    def forward(x, training):
        n = x
        for kind, s, w, (beta, gamma, mm, mv) in layers:
            if s == 2:
                n = tf.pad(n, [[0, 0], [1, 1], [1, 1], [0, 0]])
            pad = "VALID" if s == 2 else "SAME"
            if kind == "dw":
                n = tf.nn.depthwise_conv2d(n, w, [1, s, s, 1], pad)
            else:
                n = tf.nn.conv2d(n, w, s, pad)
            if training:
                m, v = tf.nn.moments(n, [0, 1, 2])
                mm.assign(0.9 * mm + 0.1 * m)
                mv.assign(0.9 * mv + 0.1 * v)
            else:
                m, v = mm, mv
            n = tf.nn.relu(tf.nn.batch_normalization(n, m, v, beta, gamma, BN_EPS))
        n = tf.reduce_mean(n, [1, 2])
        return tf.matmul(n, dense_w) + dense_b

    net.eval()
    probe = np.random.default_rng(0).random((2, data.SIZE, data.SIZE, 3), dtype=np.float32)
    diff = float(np.abs(net(probe).numpy() - forward(probe, False).numpy()).max())
    assert diff < 1e-4, f"training forward differs from the TL model by {diff}"

    sched = tf.keras.optimizers.schedules.CosineDecay(args.lr * 0.05, args.steps, alpha=0.01,
                                                      warmup_target=args.lr, warmup_steps=min(150, args.steps // 10))
    opt = tf.keras.optimizers.Adam(sched)
    decayed = [w for kind, s, w, _ in layers] + [dense_w]

    @tf.function
    def train_step(x, y, t=None):
        with tf.GradientTape() as tape:
            e = tf.math.l2_normalize(forward(x, True), 1)
            cos = tf.matmul(e, tf.math.l2_normalize(centres, 0))
            onehot = tf.one_hot(y, n_cls)             # label -1 (unlabelled): all zeros
            logits = args.scale * (cos - args.margin * onehot)
            l_cls = labelled_mean(tf.nn.softmax_cross_entropy_with_logits(onehot, logits), y)
            l_wd = 5e-5 * tf.add_n([tf.reduce_sum(tf.square(w)) for w in decayed])
            loss = l_cls + l_wd
            if t is not None:
                p = tf.math.l2_normalize(tf.matmul(e, proj), 1)
                l_kd = tf.reduce_mean(1.0 - tf.reduce_sum(p * t, 1))
                l_rel = tf.reduce_mean(tf.square(tf.matmul(e, e, transpose_b=True) - tf.matmul(t, t, transpose_b=True)))
                loss += args.distill * l_kd + args.relation * l_rel
        grads = tape.gradient(loss, train_vars)
        grads, _ = tf.clip_by_global_norm(grads, 10.0)
        opt.apply_gradients(zip(grads, train_vars))
        acc = labelled_mean(tf.cast(tf.equal(tf.argmax(cos, 1, output_type=tf.int32), y), tf.float32), y)
        return tf.stack([loss, acc, l_kd if t is not None else 0.0])

    def save(step):
        net.eval()
        zoo.save_weights(net, args.weights)
        print(f"saved step {step}: {args.weights}", flush=True)

    q = queue.Queue(maxsize=6)
    threading.Thread(target=producer, args=(0, args.steps, args.batch, root, args.min_images, q, cache,
                                            extra, args.extra_fraction), daemon=True).start()
    t0 = time.time()
    acc = np.zeros(3)
    n_acc = 0
    for step in range(args.steps):
        s, (x, y, t) = q.get()
        assert s == step
        acc += train_step(tf.constant(x.astype(np.float32) / 255.0), tf.constant(y.astype(np.int32)),
                          *([] if t is None else [tf.constant(t)])).numpy()
        n_acc += 1
        if (step + 1) % 50 == 0:
            el = time.time() - t0
            print(f"step {step + 1}/{args.steps} loss {acc[0] / n_acc:.3f} train-acc {acc[1] / n_acc:.3f} "
                  + (f"teacher-cos {1 - acc[2] / n_acc:.3f} " if cache is not None else "")
                  + f"lr {float(sched(step)):.2e} {el / (step + 1):.3f} s/step, {el / 60:.1f} min", flush=True)
            acc[:] = 0
            n_acc = 0
        if (step + 1) % args.save_every == 0:
            save(step + 1)
        if args.max_minutes and time.time() - t0 > 60 * args.max_minutes:
            print(f"time limit: stopping at step {step + 1}", flush=True)
            save(step + 1)
            return 0
    save(args.steps)
    print(f"done in {(time.time() - t0) / 60:.1f} min", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

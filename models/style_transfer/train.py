"""Train the style-transfer network (Johnson-style perceptual losses) on the seeded data.py crops.

    .venv/bin/python models/style_transfer/train.py --steps 3000 --batch 4

Loss network: the first 5 depthwise-separable blocks of MobileNetV1 alpha=0.25 with the ImageNet
weights of the testdata (weights/mobilenetv1_0.25_tensorlayer.npz), BatchNorm folded, TF 'SAME'
padding, input scaled to [-1, 1] -- a frozen feature extractor written with tf.nn ops.
  style    sum over conv_pw_1..5 of ||Gram(F(y)) - Gram(F(style))||^2, Gram = F^T F / (H W C)
  content  ||F(y) - F(x)||^2 on conv_pw_3 (1/4 resolution)
  tv       total variation of y
The transformer's training forward uses tf.nn ops on the TensorLayer model's own variables
(checked against the TL model at start-up); it starts from a seeded He-normal initialisation.

Resumable: tf.train.Checkpoint (weights + Adam + step) in --ckpt (default out/style_transfer_train);
every --save-every steps and at the end it writes weights.npz (zoo.save_weights, atomic).
Batch i is data.train_batch(i) (seeded by i), so a resumed run sees the same data.
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from tl2k210 import paths
from tl2k210.arrays import load_params

sys.path.insert(0, str(paths.models_dir().parent))   # `models.<name>` imports (checkout or wheel)
HERE = paths.models_dir() / "style_transfer"

from models.style_transfer import data  # noqa: E402
from models.style_transfer.network import build, layer_specs  # noqa: E402

INIT_SEED = 11
MOBILENET = "weights/mobilenetv1_0.25_tensorlayer.npz"      # in the test data (TL2K210_TESTDATA)
STYLE_LAYERS = (1, 2, 3, 4, 5)
CONTENT_LAYER = 3
BLOCK_STRIDES = (1, 2, 1, 2, 1)


def loss_net():
    """tf function: NHWC [0,1] -> {pw_i: features}, MobileNetV1 0.25 blocks 1..5, BN folded."""
    import tensorflow as tf
    weights = paths.testdata(MOBILENET)
    if weights is None:
        raise SystemExit(f"the loss network needs the test data's {MOBILENET} (set TL2K210_TESTDATA)")
    p = load_params(weights)
    it = iter(p)

    def folded(depthwise=False):
        k = np.asarray(next(it), np.float32)
        g, b, m, v = (np.asarray(next(it), np.float32) for _ in range(4))
        s = g / np.sqrt(v + 1e-3)
        k = k * (s.reshape(1, 1, -1, 1) if depthwise else s)
        return tf.constant(k), tf.constant(b - m * s)

    conv1 = folded()
    blocks = [(folded(True), folded(), st) for st in BLOCK_STRIDES]

    def f(x):
        x = x * 2.0 - 1.0
        x = tf.nn.relu6(tf.nn.conv2d(x, conv1[0], 2, "SAME") + conv1[1])
        out = {}
        for i, ((dk, db), (pk, pb), st) in enumerate(blocks, 1):
            x = tf.nn.relu6(tf.nn.depthwise_conv2d(x, dk, (1, st, st, 1), "SAME") + db)
            x = tf.nn.relu6(tf.nn.conv2d(x, pk, 1, "SAME") + pb)
            out[i] = x
        return out
    return f


def gram(f):
    import tensorflow as tf
    b, h, w, c = f.shape
    m = tf.reshape(f, (-1, h * w, c))
    return tf.matmul(m, m, transpose_a=True) / float(h * w * c)


def forward(ws, x, res):
    """The transformer with tf.nn ops on the TL variables (W, b per conv in layer_specs order)."""
    import tensorflow as tf
    acts = {"relu": tf.nn.relu, "sigmoid": tf.nn.sigmoid, None: lambda t: t}
    n, skip, k = x, None, 0
    for lname, kind, _cin, _cout, act in layer_specs(res):
        W, b = ws[k], ws[k + 1]
        k += 2
        if lname.endswith("a"):
            skip = n
        if kind == "down":
            n = tf.nn.conv2d(tf.pad(n, [[0, 0], [1, 1], [1, 1], [0, 0]]), W, 2, "VALID") + b
        else:
            if kind == "up":
                n = tf.repeat(tf.repeat(n, 2, axis=1), 2, axis=2)
            n = tf.nn.conv2d(n, W, 1, "SAME") + b
        n = acts[act](n)
        if lname.startswith("res") and lname.endswith("b"):
            n = skip + n
    return n


def he_init(net, res):
    rng = np.random.default_rng(INIT_SEED)
    specs = layer_specs(res)
    for (lname, _k, cin, cout, _a), (W, b) in zip(specs, zip(net.all_weights[::2], net.all_weights[1::2])):
        std = np.sqrt(2.0 / (9 * cin)) * (0.1 if lname.endswith("b") and lname.startswith("res") else 1.0)
        W.assign(rng.normal(0, std, W.shape).astype(np.float32))
        b.assign(np.zeros(b.shape, np.float32))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--style-weight", type=float, default=1e4)
    ap.add_argument("--content-weight", type=float, default=8.0)
    ap.add_argument("--tv-weight", type=float, default=1.0)
    ap.add_argument("--style-size", type=int, default=256, help="style image side for its Grams")
    ap.add_argument("--ckpt", default="out/style_transfer_train")
    ap.add_argument("--out", default=str(HERE / "weights.npz"))
    ap.add_argument("--save-every", type=int, default=250)
    ap.add_argument("--max-minutes", type=float, default=15.0, help="stop (and save) after this long")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args(argv)

    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(a.threads)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    from PIL import Image
    from tl2k210 import zoo

    net = build(batch=a.batch)
    res = sum(1 for s in layer_specs() if s[0].endswith("a"))
    he_init(net, res)
    ws = net.all_weights
    net.eval()
    x0 = data.train_batch(0, a.batch)
    diff = float(np.abs(net(x0).numpy() - forward(ws, x0, res).numpy()).max())
    if diff > 1e-4:
        raise SystemExit(f"training forward differs from the TensorLayer model by {diff}")

    feats = loss_net()
    style = np.asarray(Image.fromarray(data.style_image()).resize((a.style_size,) * 2, Image.BILINEAR),
                       np.float32)[None] / 255.0
    targets = {i: gram(f) for i, f in feats(tf.constant(style)).items() if i in STYLE_LAYERS}

    opt = tf.keras.optimizers.Adam(a.lr)
    step = tf.Variable(0, dtype=tf.int64)
    ckpt = tf.train.Checkpoint(weights=ws, opt=opt, step=step)
    mgr = tf.train.CheckpointManager(ckpt, a.ckpt, max_to_keep=1)
    if mgr.latest_checkpoint:
        ckpt.restore(mgr.latest_checkpoint)
        print(f"resumed from {mgr.latest_checkpoint} at step {int(step)}", flush=True)

    @tf.function
    def train_step(x, lr):
        opt.learning_rate.assign(lr)
        with tf.GradientTape() as tape:
            y = forward(ws, x, res)
            fy, fx = feats(y), feats(x)
            ls = tf.add_n([tf.reduce_mean(tf.square(gram(fy[i]) - targets[i])) for i in STYLE_LAYERS])
            lc = tf.reduce_mean(tf.square(fy[CONTENT_LAYER] - fx[CONTENT_LAYER]))
            ltv = tf.reduce_mean(tf.abs(y[:, 1:] - y[:, :-1])) + tf.reduce_mean(tf.abs(y[:, :, 1:] - y[:, :, :-1]))
            loss = a.style_weight * ls + a.content_weight * lc + a.tv_weight * ltv
        g = tape.gradient(loss, ws)
        opt.apply_gradients(zip(g, ws))
        return loss, ls, lc, ltv

    t0, last = time.time(), time.time()
    while int(step) < a.steps:
        i = int(step)
        lr = a.lr * (0.1 ** (i / a.steps))   # exponential decay to lr/10
        loss, ls, lc, ltv = train_step(tf.constant(data.train_batch(i, a.batch)), tf.constant(lr, tf.float32))
        step.assign_add(1)
        done = int(step)
        if done % 50 == 0 or done == 1:
            print(f"step {done:5d}  loss {float(loss):.4f}  style {a.style_weight * float(ls):.4f}  "
                  f"content {a.content_weight * float(lc):.4f}  tv {a.tv_weight * float(ltv):.4f}  "
                  f"lr {lr:.2e}  {time.time() - t0:.0f}s", flush=True)
        timeout = time.time() - t0 > a.max_minutes * 60
        if done % a.save_every == 0 or done == a.steps or timeout:
            mgr.save()
            zoo.save_weights(net, a.out)
            print(f"saved {a.out} at step {done} ({time.time() - last:.0f}s since last save)", flush=True)
            last = time.time()
        if timeout:
            print(f"stopping after {a.max_minutes} min at step {done}", flush=True)
            break
    zoo.save_weights(net, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

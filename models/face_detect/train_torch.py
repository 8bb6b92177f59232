"""Train the face detector with PyTorch on a GPU: the same network, data, targets and YOLOv2 loss
as train.py (TensorFlow, CPU), many more frames.

    python -m models.face_detect.train_torch --data TRAINING_DIR --init W.npz --steps N --out DIR

TRAINING_DIR is what ../shared/data/get-face-training.sh fetched, or `pack`'s smaller copy of it
(below). The frames are train.frames(step) -- data.sample from rng([TRAIN_SEED, step]) -- made by
--workers processes; the network is network.CHANNELS' convs + BatchNorm + LeakyReLU(0.1) + 2x2
max pools and the 1x1 region head, NCHW; the loss is train.py's (train.targets). Weights go out in
zoo.save_weights' npz layout (per conv: kernel HWIO, BatchNorm beta, gamma, moving mean, moving
var; then the head's kernel and bias), so `tl2k210 zoo build face_detect` takes them unchanged.
DIR receives weights.npz (the exponential moving average of the weights, decay --ema), raw.npz
(the last weights) and log.txt, every --save-every steps and at the end.

--negatives K: K face-free regions of the face-mask set's photos and background frames
(data.negative_candidate, not mined), HARD_P of the frames.

`python -m models.face_detect.train_torch pack SRC DST` writes a copy of SRC small enough to
send to a GPU machine: longer side <= 256 px, WebP quality 60 (the boxes rescaled), and the
face-free background photos as backgrounds.npz (uint8), which then replace data._backgrounds
(those need scikit-image's data files).
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

import numpy as np

from tl2k210 import paths
from tl2k210.arrays import save_npz

sys.path.insert(0, str(paths.models_dir().parent))   # `models.<name>` imports (checkout or wheel)
HERE = paths.models_dir() / "face_detect"

from models.face_detect import data, train  # noqa: E402
from models.face_detect.network import CHANNELS, N_ANCHORS  # noqa: E402

PACK_SIDE, PACK_QUALITY = 256, 60


# ------------------------------------------------------------------ data
def _read_rgb_pil(path):
    from PIL import Image
    with Image.open(path) as im:
        return np.asarray(im.convert("RGB"))


def use_pack(root: Path):
    """Read images with PIL (WebP), and the pack's backgrounds when it has them."""
    data._read_rgb = _read_rgb_pil
    bg = root / "backgrounds.npz"
    if bg.exists():
        with np.load(bg, allow_pickle=False) as z:
            arrays = [z[f"arr_{i}"].astype(np.float32) / 255.0 for i in range(len(z.files))]
        data._backgrounds = lambda: arrays


def pack(src: Path, dst: Path):
    """A small copy of the detection training sets (see the module docstring)."""
    from PIL import Image
    for sub, boxfile, col in (("caltech_webfaces", "boxes_derived.txt", 1), ("face_mask_kaggle", "boxes.txt", 2)):
        rows = {}
        for line in open(src / sub / boxfile):
            p = line.split()
            if p:
                rows.setdefault(p[0], []).append(p)
        (dst / sub / "images").mkdir(parents=True, exist_ok=True)
        out = []
        for name, rs in sorted(rows.items()):
            with Image.open(src / sub / "images" / name) as im:
                im = im.convert("RGB")
            s = min(1.0, PACK_SIDE / max(im.size))
            if s < 1:
                im = im.resize((max(1, round(im.width * s)), max(1, round(im.height * s))), Image.LANCZOS)
            new = name.rsplit(".", 1)[0] + ".webp"
            im.save(dst / sub / "images" / new, "WEBP", quality=PACK_QUALITY, method=6)
            out += [" ".join([new] + p[1:col] + ["%.1f" % (float(v) * s) for v in p[col:col + 4]]) for p in rs]
        (dst / sub / boxfile).write_text("\n".join(out) + "\n")
    bgs = [(np.clip(a, 0, 1) * 255 + 0.5).astype(np.uint8) for a in data._backgrounds()]
    np.savez_compressed(dst / "backgrounds.npz", *bgs)
    print(f"packed {src} -> {dst}")


_HARD = []


def _worker_init(root, hard):
    use_pack(Path(root))
    _HARD[:] = hard


def make_batch(args):
    """Step `step`'s frames as (uint8 NHWC images, mask, txy, twh, scale, gt)."""
    step, size, root = args
    pairs = train.frames(step, size, root, _HARD)
    imgs, boxes = zip(*pairs)
    return (step, np.stack(imgs)) + train.targets(boxes)


def ordered_batches(pool, steps, size, root, depth):
    """The batches of steps 0.. in order, at most `depth` made ahead (bounded memory)."""
    from collections import deque
    pending = deque()
    for s in range(steps):
        pending.append(pool.apply_async(make_batch, ((s, size, root),)))
        if len(pending) >= depth:
            yield pending.popleft().get()
    while pending:
        yield pending.popleft().get()


# ------------------------------------------------------------------ network
def build(torch, channels):
    nn = torch.nn
    layers, cin = [], 3
    for i, c in enumerate(channels):
        layers += [nn.Conv2d(cin, c, 3, padding=1, bias=False), nn.BatchNorm2d(c, eps=1e-5, momentum=0.1),
                   nn.LeakyReLU(0.1)]
        if i < 4:
            layers.append(nn.MaxPool2d(2))
        cin = c
    return nn.Sequential(*layers, nn.Conv2d(cin, N_ANCHORS * 6, 1))


def _convs_bns(net):
    mods = list(net)
    convs = [m for m in mods if m.__class__.__name__ == "Conv2d"]
    bns = [m for m in mods if m.__class__.__name__ == "BatchNorm2d"]
    return convs[:-1], bns, convs[-1]


def load_arrays(torch, net, arrays):
    convs, bns, head = _convs_bns(net)
    with torch.no_grad():
        for i, (c, b) in enumerate(zip(convs, bns)):
            w, beta, gamma, mm, mv = arrays[i * 5:i * 5 + 5]
            c.weight.copy_(torch.from_numpy(np.ascontiguousarray(w.transpose(3, 2, 0, 1))))
            b.bias.copy_(torch.from_numpy(beta))
            b.weight.copy_(torch.from_numpy(gamma))
            b.running_mean.copy_(torch.from_numpy(mm))
            b.running_var.copy_(torch.from_numpy(mv))
        head.weight.copy_(torch.from_numpy(np.ascontiguousarray(arrays[-2].transpose(3, 2, 0, 1))))
        head.bias.copy_(torch.from_numpy(arrays[-1]))


def arrays_of(net):
    convs, bns, head = _convs_bns(net)
    out = []
    for c, b in zip(convs, bns):
        out += [c.weight.detach().cpu().numpy().transpose(2, 3, 1, 0), b.bias.detach().cpu().numpy(),
                b.weight.detach().cpu().numpy(), b.running_mean.cpu().numpy(), b.running_var.cpu().numpy()]
    out += [head.weight.detach().cpu().numpy().transpose(2, 3, 1, 0), head.bias.detach().cpu().numpy()]
    return [np.ascontiguousarray(a, np.float32) for a in out]


# ------------------------------------------------------------------ training
def lr_at(step, steps, lr, warmup, done=0.0):
    """Linear warm-up from 5 %, then cosine to 1 % at `steps` -- or sooner, at the share `done`
    of --max-minutes when that is larger (a run on a time budget still ends its schedule)."""
    if step < warmup:
        return lr * (0.05 + 0.95 * step / warmup)
    t = max((step - warmup) / max(1, steps - warmup), done)
    return lr * (0.01 + 0.99 * 0.5 * (1 + math.cos(math.pi * min(1.0, t))))


def loss_fn(torch, out, mask, txy, twh, scale, gt, anchors, noobj_weight):
    """train.py's YOLOv2 loss; `out` is the head's NCHW output."""
    F = torch.nn.functional
    b = out.shape[0]
    p = out.permute(0, 2, 3, 1).reshape(b, train.GH, train.GW, N_ANCHORS, 6)
    col = torch.arange(train.GW, device=out.device, dtype=out.dtype).view(1, 1, train.GW, 1)
    row = torch.arange(train.GH, device=out.device, dtype=out.dtype).view(1, train.GH, 1, 1)
    with torch.no_grad():
        px, py = col + torch.sigmoid(p[..., 0]), row + torch.sigmoid(p[..., 1])
        pw = torch.exp(torch.clamp(p[..., 2], max=4.0)) * anchors[:, 0]
        ph = torch.exp(torch.clamp(p[..., 3], max=4.0)) * anchors[:, 1]
        g = gt[:, None, None, None]
        iw = (torch.minimum(px[..., None] + pw[..., None] / 2, g[..., 0] + g[..., 2] / 2)
              - torch.maximum(px[..., None] - pw[..., None] / 2, g[..., 0] - g[..., 2] / 2)).clamp(min=0)
        ih = (torch.minimum(py[..., None] + ph[..., None] / 2, g[..., 1] + g[..., 3] / 2)
              - torch.maximum(py[..., None] - ph[..., None] / 2, g[..., 1] - g[..., 3] / 2)).clamp(min=0)
        inter = iw * ih
        ious = inter / (pw[..., None] * ph[..., None] + g[..., 2] * g[..., 3] - inter + 1e-9)
        ignore = (ious.amax(-1) > 0.6).float()
        noobj = (1 - mask) * (1 - ignore)

    def bce(logits, labels):
        return F.binary_cross_entropy_with_logits(logits, labels, reduction="none")
    l_xy = (mask[..., None] * scale[..., None] * bce(p[..., 0:2], txy)).sum() / b
    l_wh = (mask[..., None] * scale[..., None] * (p[..., 2:4] - twh) ** 2).sum() / b
    l_obj = 5.0 * (mask * bce(p[..., 4], torch.ones_like(mask))).sum() / b
    l_noobj = noobj_weight * (noobj * bce(p[..., 4], torch.zeros_like(mask))).sum() / b
    l_cls = 0.01 * (p[..., 5] ** 2).mean()
    return l_xy + l_wh + l_obj + l_noobj + l_cls, torch.stack([l_xy, l_wh, l_obj, l_noobj])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", help="training folder (get-face-training.sh's or `pack`'s)")
    ap.add_argument("--init", default=str(HERE / "weights.npz"), help="start weights ('' = from scratch)")
    ap.add_argument("--steps", type=int, default=10000)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=300)
    ap.add_argument("--ema", type=float, default=0.999)
    ap.add_argument("--noobj-weight", type=float, default=2.0)
    ap.add_argument("--negatives", type=int, default=1600, help="face-free regions shown HARD_P of the time")
    ap.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 1))
    ap.add_argument("--out", default="out/face_detect_torch")
    ap.add_argument("--save-every", type=int, default=1000)
    ap.add_argument("--max-minutes", type=float, default=0, help="stop (after saving) when exceeded")
    ap.add_argument("--device", default="cuda")
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["pack"]:
        pack(Path(argv[1]), Path(argv[2]))
        return 0
    args = ap.parse_args(argv)
    root = data.training_dir(args.data)
    use_pack(root)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = open(out / "log.txt", "a")

    def say(msg):
        print(msg, flush=True)
        log.write(msg + "\n")
        log.flush()

    rng = np.random.default_rng([data.TRAIN_SEED, 10 ** 6])
    hard = []
    while len(hard) < args.negatives:
        c = data.negative_candidate(rng, root)
        if c is not None:
            hard.append(c)
    import multiprocessing as mp
    pool = mp.get_context("fork").Pool(args.workers, _worker_init, (str(root), hard))
    batches = ordered_batches(pool, args.steps, args.batch, str(root), depth=2 * args.workers)

    import torch
    torch.manual_seed(0)
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    dev = torch.device(args.device)
    net = build(torch, CHANNELS)
    if args.init:
        with np.load(args.init, allow_pickle=False) as z:
            arrays = [z[f"arr_{i}"] for i in range(len(z.files))]
        load_arrays(torch, net, train.slimmed(arrays, CHANNELS))
        say(f"initialised from {args.init}")
    else:                     # train.py's start: objectness prior ~2 %
        with torch.no_grad():
            head = _convs_bns(net)[2]
            head.bias.zero_()
            head.bias.view(N_ANCHORS, 6)[:, 4] = -4.0
    net = net.to(dev).to(memory_format=torch.channels_last)
    ema = build(torch, CHANNELS).to(dev)
    ema.load_state_dict(net.state_dict())
    anchors = torch.from_numpy(train.ANCH).to(dev)
    convs, _, head = _convs_bns(net)
    decayed = [c.weight for c in convs] + [head.weight]
    opt = torch.optim.Adam(net.parameters(), lr=args.lr)

    def save(step):
        save_npz(out / "weights.npz", arrays_of(ema))
        save_npz(out / "raw.npz", arrays_of(net))
        say(f"saved step {step}")

    e_float = [v for v in ema.state_dict().values() if v.dtype.is_floating_point]
    n_float = [v for v in net.state_dict().values() if v.dtype.is_floating_point]
    e_int = [v for v in ema.state_dict().values() if not v.dtype.is_floating_point]
    n_int = [v for v in net.state_dict().values() if not v.dtype.is_floating_point]
    t0 = time.time()
    acc, n_acc, wait = torch.zeros(5, device=dev), 0, 0.0
    net.train()
    step = 0
    for step in range(args.steps):
        tw = time.time()
        s, imgs, mask, txy, twh, scale, gt = next(batches)
        wait += time.time() - tw
        x = torch.from_numpy(imgs).to(dev, non_blocking=True).permute(0, 3, 1, 2).float().div_(255.0)
        x = x.contiguous(memory_format=torch.channels_last)
        t = [torch.from_numpy(a).to(dev, non_blocking=True) for a in (mask, txy, twh, scale, gt)]
        done = (time.time() - t0) / (args.max_minutes * 60) if args.max_minutes else 0.0
        lr = lr_at(step, args.steps, args.lr, args.warmup, done)
        for gparam in opt.param_groups:
            gparam["lr"] = lr
        loss, parts = loss_fn(torch, net(x), *t, anchors, args.noobj_weight)
        loss = loss + 1e-4 * sum((w ** 2).sum() for w in decayed)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 10.0)
        opt.step()
        with torch.no_grad():       # two fused calls a step, no host sync
            d = min(args.ema, (1 + step) / (10 + step))
            torch._foreach_lerp_(e_float, n_float, 1 - d)
            for e, p in zip(e_int, n_int):
                e.copy_(p)
            acc += torch.cat([loss.detach()[None], parts.detach()])
        n_acc += 1
        if (step + 1) % 100 == 0:
            el = time.time() - t0
            a = (acc / n_acc).tolist()
            say(f"step {step + 1}/{args.steps} loss {a[0]:.3f} (xy {a[1]:.3f} wh {a[2]:.3f} obj {a[3]:.3f} "
                f"noobj {a[4]:.3f}) lr {lr:.2e} "
                f"{(step + 1) / el:.1f} steps/s, data wait {wait / el:.0%}, {el / 60:.1f} min")
            acc.zero_()
            n_acc = 0
        if (step + 1) % args.save_every == 0:
            save(step + 1)
        if done >= 1.0:
            say("time limit reached")
            break
    save(step + 1)
    pool.terminate()
    return 0


if __name__ == "__main__":
    sys.exit(main())

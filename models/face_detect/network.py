"""Tiny-YOLOv2 face detector for the K210 KPU, in TensorLayer 2.x layers.

320x240 RGB in [0, 1] -> 20x15 grid x 30 channels (5 anchors x (tx, ty, tw, th, obj, class)),
anchor-major, the layout MaixPy's kpu.init_yolo2 / run_yolo2 decode.

Every layer is KPU-friendly: 3x3 'SAME' stride-1 convs + BatchNorm + LeakyReLU(0.1), four 2x2/2
max pools fused into the preceding conv (stride 16), one linear 1x1 conv head.
"""
import time
import tomllib

from tl2k210 import paths

# the anchors (w, h pairs, grid cells) are one fact: recipe.toml [decode] anchors (k-means fit to the
# training boxes, anchors.py), which `zoo build` writes into the kmodel's metadata
with open(paths.models_dir() / "face_detect" / "recipe.toml", "rb") as _fh:
    ANCHORS = list(tomllib.load(_fh)["decode"]["anchors"])
# MaixPy's face model's (facedetect_320x240_v3, its example scripts): the evaluation's anchor model
MAIXPY_ANCHORS = [1.889, 2.5245, 2.9465, 3.94056, 3.99987, 5.3658, 5.155437, 6.92275, 6.718375, 9.01025]
N_ANCHORS = 5
N_CLASSES = 1
CHANNELS = (12, 24, 32, 64, 96, 96)  # conv1..conv4 are followed by a 2x2 max pool; 171 M MACs


def build(width=320, height=240, batch=1, name=None):
    import tensorlayer as tl
    from tensorlayer.layers import BatchNorm, Conv2d, Input, MaxPool2d

    x = Input([batch, height, width, 3], name="input")
    n = x
    for i, c in enumerate(CHANNELS, 1):
        n = Conv2d(c, (3, 3), (1, 1), padding="SAME", b_init=None, name=f"conv{i}")(n)
        # TensorLayer's own name for LeakyReLU(0.1): Model.save stores it as text (a local function
        # would be pickled by value, which tl2k210 does not load)
        n = BatchNorm(act="lrelu0.1", name=f"bn{i}")(n)
        if i <= 4:
            n = MaxPool2d((2, 2), (2, 2), padding="VALID", name=f"pool{i}")(n)
    n = Conv2d(N_ANCHORS * (5 + N_CLASSES), (1, 1), (1, 1), padding="SAME", name="region")(n)
    # TensorLayer wants a unique model name per process (zoo re-imports this module: no counter)
    return tl.models.Model(inputs=x, outputs=n, name=name or f"face_detect_{time.monotonic_ns()}")

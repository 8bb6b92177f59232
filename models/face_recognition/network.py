"""Compact MobileFaceNet-style face embedder for the K210 KPU, in TensorLayer 2.x layers.

64x64 RGB in [0, 1] -> 128-d float embedding (not normalised: L2 normalisation is done on the
CPU, by the MaixPy script / host code, before cosine matching).

Every conv is KPU-friendly: a 3x3 stem and depthwise-separable blocks (DepthwiseConv2d 3x3 +
1x1 Conv2d, each + BatchNorm + ReLU), stride 2 as explicit ZeroPad2d((1,1),(1,1)) + VALID (the
KPU's pick pool), a 1x1 expansion to 512 channels, GlobalMeanPool2d (CPU) and a linear Dense
128 (a KPU 1x1 conv on a 4x4-padded map). MobileFaceNet's PReLU and 7x7 global depthwise conv
are not KPU operations: ReLU and a global mean pool replace them.

`LAYERS` is the single description of the network: build() makes the TL model from it and
train.py's tf.function forward walks the same list over `net.all_weights`.
"""
import time

SIZE = 64
EMBED = 128
# (kind, channels, stride); "conv" = 3x3 full conv, "dw" = 3x3 depthwise, "pw" = 1x1 conv
LAYERS = [("conv", 32, 2),
          ("dw", 32, 1), ("pw", 64, 1),
          ("dw", 64, 2), ("pw", 96, 1),
          ("dw", 96, 1), ("pw", 96, 1),
          ("dw", 96, 2), ("pw", 128, 1),
          ("dw", 128, 1), ("pw", 128, 1),
          ("dw", 128, 2), ("pw", 256, 1),
          ("dw", 256, 1), ("pw", 256, 1),
          ("pw", 512, 1)]
BN_EPS = 1e-5


def build(size=SIZE, embed=EMBED, batch=1, name=None):
    import tensorflow as tf
    import tensorlayer as tl
    from tensorlayer.layers import (BatchNorm, Conv2d, Dense, DepthwiseConv2d, GlobalMeanPool2d, Input,
                                    ZeroPad2d)

    x = Input([batch, size, size, 3], name="input")
    n = x
    for i, (kind, c, s) in enumerate(LAYERS, 1):
        pad = "VALID" if s == 2 else "SAME"
        if s == 2:
            n = ZeroPad2d(((1, 1), (1, 1)), name=f"pad{i}")(n)
        if kind == "conv":
            n = Conv2d(c, (3, 3), (s, s), padding=pad, b_init=None, name=f"conv{i}")(n)
        elif kind == "dw":
            n = DepthwiseConv2d((3, 3), (s, s), padding=pad, b_init=None, name=f"dw{i}")(n)
        else:
            n = Conv2d(c, (1, 1), (1, 1), padding="SAME", b_init=None, name=f"pw{i}")(n)
        n = BatchNorm(epsilon=BN_EPS, act=tf.nn.relu, name=f"bn{i}")(n)
    n = GlobalMeanPool2d(name="gap")(n)
    n = Dense(embed, name="embedding")(n)
    # TensorLayer wants a unique model name per process (zoo re-imports this module)
    return tl.models.Model(inputs=x, outputs=n, name=name or f"face_recognition_{time.monotonic_ns()}")

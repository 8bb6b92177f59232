"""Round 43's never-seen models: 20 small architectures of the kinds K210 users bring, built with
seeded, BN-recalibrated weights and saved as a user's tools would save them (Keras 2 `.h5` via
tf_keras, float / full-int8 (int8, uint8 or float IO) / dynamic-range TFLite, tf2onnx ONNX at
opsets 13 and 17, two Keras 3 `.keras` files), for `bench/unseen.py` (docs/results.md says what
they found):

    python bench/unseen_models.py OUT [NAME ...]
    python bench/unseen.py OUT --runtime maixpy sdk --markdown

`--set 2` builds round 44's second set instead (MODELS2: inverted residuals, hard-swish / swish
gates, Conv1D, Inception branches, FPN, factorised and 7x7 convs, unfused BNs, Maximum /
Minimum / Subtract, map softmax, Reshape-Dense-Reshape, odd channel counts, Rescaling, a
BlazeFace-like and an LPRNet-like net, a Keras 3 QVGA multi-label net):

    python bench/unseen_models.py OUT2 --set 2 [NAME ...]

`--set 3` builds round 45's (MODELS3: a YOLOv5n-like SiLU detector with SPPF and 3 heads,
MobileNetV3-Large / GhostNet / EfficientNet-lite / PP-LCNet / RepVGG-like nets, a DS-CNN on a
49x10 MFCC, a PFLD-like regressor with two outputs, style nets with reflect padding and
instance norm, resizes by 1.5 and to a fixed size, ASPP dilations, depthwise multipliers on a
75x100 frame, a tiny ViT block, a CBAM-like attention gate, a Keras 3 GhostNet with hard_silu):

    python bench/unseen_models.py OUT3 --set 3 [NAME ...]

`--set 4` builds round 48's (MODELS4: a YOLOv8n-like anchor-free head with DFL and dist2bbox
decode, a CenterNet-like heatmap with the max-pool peak trick, ShuffleNetV2 units (tf.split,
reshape-transpose-reshape shuffle, MaxPool 3x3 s2 on an odd map), SqueezeNet 1.1 fire modules,
a DenseNet-like block, a ResNet-v2 pre-activation net, a ConvNeXt-like block (7x7 depthwise,
LayerNorm, Dense 4x GELU, layer scale), Keras preprocessing layers in the model (Rescaling,
Normalization, Resizing, CenterCrop), an ESPCN-like pixel-shuffle super-resolution net, a
grouped Conv2D / SeparableConv2D depth_multiplier 2 / GroupNormalization net, a two-input
siamese net, a 3-output net, an LSTM / GRU net, a Keras 3 ConvNeXt-like net with preprocessing
layers; float16 and int16x8 TFLite exports beside the other formats):

    python bench/unseen_models.py OUT4 --set 4 [NAME ...]

`--set 5` builds round 49's (MODELS5, bench/unseen_torchlike.py: ONNX as PyTorch's exporters
write it at opsets 11 / 13 / 17 / 18 -- torchvision-style MobileNetV3-small, ShuffleNetV2,
MnasNet, RegNet, EfficientNet-B0, bilinear resizes with align_corners True and False,
PixelShuffle / PixelUnshuffle, HardSwish, `x.view(x.size(0), -1)`, dynamic batch -- and
onnxruntime.quantization's QDQ / QOperator / dynamic int8 files of some of them):

    python bench/unseen_models.py OUT5 --set 5 [NAME ...]

A model whose input is not 3-channel gets NAME.npy calibration arrays beside it."""
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras as K2  # noqa: E402

from tl2k210 import paths  # noqa: E402

sys.path.insert(0, str(paths.checkout() / "tests"))
import devcorpus  # noqa: E402

ARGS = sys.argv[1:]
SET = "1"
if "--set" in ARGS:
    k = ARGS.index("--set")
    SET = ARGS[k + 1]
    del ARGS[k:k + 2]
OUT = ARGS[0] if ARGS else sys.exit(__doc__)
L = K2.layers
only = set(ARGS[1:])


def bn_act(x, act):
    x = L.BatchNormalization(gamma_initializer=K2.initializers.RandomUniform(0.6, 1.4),
                             beta_initializer=K2.initializers.RandomUniform(-0.2, 0.2))(x)
    if act == "relu6":
        return L.ReLU(6.0)(x)
    if act == "leaky":
        return L.LeakyReLU(0.1)(x)
    if act == "prelu":
        return L.PReLU(alpha_initializer=K2.initializers.Constant(0.25), shared_axes=[1, 2])(x)
    if act == "elu":
        return L.ELU()(x)
    if act == "hard_swish":   # tf_keras has none: x * hard_sigmoid(x)
        return L.Multiply()([x, L.Activation("hard_sigmoid")(x)])
    return L.Activation(act)(x)


def recal(model, h, w, c):
    bns = [l for l in model._flatten_layers() if isinstance(l, L.BatchNormalization)]
    for b in bns:
        b.momentum = 0.0
    x = calib(h, w, c)
    if bns:
        model(feeds(model, x), training=True)
    return model


def feeds(model, x):
    """x for a one-input model; for a two-input one, x and x reversed (two different images)."""
    return x if len(model.inputs) == 1 else [x, x[::-1].copy()]


def calib(h, w, c):
    return devcorpus.photos(h, w, c, 0.0, 1.0).astype(np.float32)


# ------------------------------------------------------------------ builders
def sepconv_cls():
    i = L.Input((128, 128, 3))
    x = L.Conv2D(16, 3, 2, padding="same", use_bias=False)(i); x = bn_act(x, "relu6")
    for c, s in [(32, 1), (48, 2), (64, 2), (96, 2)]:
        x = L.SeparableConv2D(c, 3, s, padding="same", use_bias=False)(x); x = bn_act(x, "relu6")
    x = L.GlobalAveragePooling2D()(x); x = L.Dropout(0.2)(x)
    x = L.Dense(10, activation="softmax")(x)
    return K2.Model(i, x)


def convt_autoencoder():
    i = L.Input((96, 96, 3))
    x = L.Conv2D(16, 3, 2, padding="same")(i); x = bn_act(x, "relu")
    x = L.Conv2D(32, 3, 2, padding="same")(x); x = bn_act(x, "relu")
    x = L.Conv2D(8, 3, 1, padding="same", activation="relu")(x)
    x = L.Conv2DTranspose(32, 3, 2, padding="same")(x); x = bn_act(x, "relu")
    x = L.Conv2DTranspose(16, 3, 2, padding="same")(x); x = bn_act(x, "relu")
    x = L.Conv2D(3, 3, padding="same", activation="sigmoid")(x)
    return K2.Model(i, x)


def unet(interp):
    def f():
        i = L.Input((128, 128, 3))
        e1 = bn_act(L.Conv2D(16, 3, padding="same")(i), "relu")
        p1 = L.MaxPooling2D()(e1)
        e2 = bn_act(L.Conv2D(32, 3, padding="same")(p1), "relu")
        p2 = L.MaxPooling2D()(e2)
        b = bn_act(L.Conv2D(64, 3, padding="same")(p2), "relu")
        u2 = L.UpSampling2D(interpolation=interp)(b)
        d2 = bn_act(L.Conv2D(32, 3, padding="same")(L.Concatenate()([u2, e2])), "relu")
        u1 = L.UpSampling2D(interpolation=interp)(d2)
        d1 = bn_act(L.Conv2D(16, 3, padding="same")(L.Concatenate()([u1, e1])), "relu")
        o = L.Conv2D(4, 1, activation="softmax")(d1)
        return K2.Model(i, o)
    return f


def tiny_yolo2():
    i = L.Input((208, 208, 3))
    x = i
    for c in [16, 32, 64, 128]:
        x = L.Conv2D(c, 3, padding="same", use_bias=False)(x); x = bn_act(x, "leaky")
        x = L.MaxPooling2D()(x)
    x = L.Conv2D(256, 3, padding="same", use_bias=False)(x); x = bn_act(x, "leaky")
    x = L.Conv2D(128, 3, padding="same", use_bias=False)(x); x = bn_act(x, "leaky")
    x = L.Conv2D(5 * (5 + 2), 1)(x)   # 13x13x35
    return K2.Model(i, x)


def landmark_prelu():
    i = L.Input((112, 112, 3))
    x = i
    for c in [16, 32, 48, 64]:
        x = L.Conv2D(c, 3, 2, padding="same")(x); x = bn_act(x, "prelu")
        x = L.DepthwiseConv2D(3, padding="same")(x); x = bn_act(x, "prelu")
    x = L.AveragePooling2D(7)(x)
    x = L.Flatten()(x)
    x = L.Dense(64)(x); x = L.PReLU()(x)
    x = L.Dense(10)(x)
    return K2.Model(i, x)


def elu_net():
    i = L.Input((96, 96, 3))
    x = i
    for c in [16, 32, 64]:
        x = L.Conv2D(c, 3, padding="same")(x); x = bn_act(x, "elu")
        x = L.MaxPooling2D()(x)
    x = L.GlobalAveragePooling2D()(x)
    x = L.Dense(5, activation="softmax")(x)
    return K2.Model(i, x)


def se_net():
    i = L.Input((128, 128, 3))
    x = L.Conv2D(16, 3, 2, padding="same")(i); x = bn_act(x, "relu")
    for c in [32, 64]:
        x = L.Conv2D(c, 3, 2, padding="same")(x); x = bn_act(x, "relu")
        s = L.GlobalAveragePooling2D()(x)
        s = L.Dense(c // 4, activation="relu")(s)
        s = L.Dense(c, activation="hard_sigmoid")(s)
        s = L.Reshape((1, 1, c))(s)
        x = L.Multiply()([x, s])
    x = L.GlobalAveragePooling2D()(x)
    x = L.Dense(8)(x)
    return K2.Model(i, x)


def globalmax_cls():
    i = L.Input((96, 96, 3))
    x = L.Conv2D(24, 5, 2, padding="same")(i); x = bn_act(x, "relu")
    x = L.Conv2D(48, 3, 2, padding="same")(x); x = bn_act(x, "relu")
    x = L.GlobalMaxPooling2D()(x); x = L.Dropout(0.3)(x)
    x = L.Dense(4, activation="softmax")(x)
    return K2.Model(i, x)


def zeropad_mnv1():
    i = L.Input((160, 160, 3))
    x = L.ZeroPadding2D(((0, 1), (0, 1)))(i)
    x = L.Conv2D(16, 3, 2, padding="valid", use_bias=False)(x); x = bn_act(x, "relu6")
    for c, s in [(32, 1), (64, 2), (64, 1), (128, 2)]:
        if s == 2:
            x = L.ZeroPadding2D(((0, 1), (0, 1)))(x)
        x = L.DepthwiseConv2D(3, s, padding="same" if s == 1 else "valid", use_bias=False)(x); x = bn_act(x, "relu6")
        x = L.Conv2D(c, 1, use_bias=False)(x); x = bn_act(x, "relu6")
    x = L.GlobalAveragePooling2D()(x)
    x = L.Reshape((1, 1, 128))(x)
    x = L.Conv2D(10, 1)(x)
    x = L.Reshape((10,))(x)
    x = L.Activation("softmax")(x)
    return K2.Model(i, x)


def dilated():
    i = L.Input((128, 128, 3))
    x = L.Conv2D(16, 3, 2, padding="same")(i); x = bn_act(x, "relu")
    x = L.Conv2D(32, 3, padding="same", dilation_rate=2)(x); x = bn_act(x, "relu")
    x = L.Conv2D(32, 3, padding="same", dilation_rate=4)(x); x = bn_act(x, "relu")
    x = L.Conv2D(3, 1)(x)
    return K2.Model(i, x)


def avgpool_reshape():
    i = L.Input((96, 96, 3))
    x = L.Conv2D(16, 3, padding="same")(i); x = bn_act(x, "relu")
    x = L.AveragePooling2D(2)(x)
    x = L.Conv2D(32, 3, padding="same")(x); x = bn_act(x, "relu")
    x = L.AveragePooling2D(4)(x)   # 12x12x32
    x = L.Conv2D(8, 1)(x)
    x = L.Reshape((12 * 12 * 8,))(x)
    x = L.Dense(32, activation="relu")(x)
    x = L.Dense(3)(x)
    return K2.Model(i, x)


def gray_digits():
    i = L.Input((64, 64, 1))
    x = L.Conv2D(16, 3, activation="relu")(i)
    x = L.MaxPooling2D()(x)
    x = L.Conv2D(32, 3, activation="relu")(x)
    x = L.MaxPooling2D()(x)
    x = L.Flatten()(x)
    x = L.Dense(64, activation="relu")(x)
    x = L.Dense(10, activation="softmax")(x)
    return K2.Model(i, x)


def resnet_qvga():
    i = L.Input((240, 320, 3))
    x = L.Conv2D(16, 3, 2, padding="same")(i); x = bn_act(x, "relu")
    for c in [16, 32, 32]:
        s = 2 if c != x.shape[-1] else 1
        y = L.Conv2D(c, 3, s, padding="same")(x); y = bn_act(y, "relu")
        y = L.Conv2D(c, 3, padding="same")(y); y = L.BatchNormalization()(y)
        sc = x if s == 1 else L.Conv2D(c, 1, s)(x)
        x = L.ReLU()(L.Add()([y, sc]))
    x = L.Conv2D(6, 1)(x)
    return K2.Model(i, x)


def two_head():
    i = L.Input((128, 128, 3))
    x = i
    for c in [16, 32, 64]:
        x = L.Conv2D(c, 3, 2, padding="same")(x); x = bn_act(x, "leaky")
    g = L.GlobalAveragePooling2D()(x)
    cls = L.Dense(3, activation="softmax", name="cls")(g)
    box = L.Dense(4, activation="sigmoid", name="box")(g)
    return K2.Model(i, [cls, box])


def dw_mult2():
    i = L.Input((128, 128, 3))
    x = L.DepthwiseConv2D(3, 2, padding="same", depth_multiplier=4)(i); x = bn_act(x, "relu")
    x = L.DepthwiseConv2D(5, 2, padding="same", depth_multiplier=2)(x); x = bn_act(x, "relu")
    x = L.Conv2D(32, 1)(x); x = bn_act(x, "relu")
    x = L.GlobalAveragePooling2D()(x)
    x = L.Dense(6)(x)
    return K2.Model(i, x)


def crop_concat():
    i = L.Input((112, 112, 3))
    a = bn_act(L.Conv2D(16, 3, padding="same")(i), "relu")
    b = bn_act(L.Conv2D(16, 5, padding="same")(i), "tanh")
    x = L.Concatenate()([a, b])
    x = L.MaxPooling2D(3, 2, padding="same")(x)
    x = L.Cropping2D(((4, 4), (4, 4)))(x)
    x = L.Conv2D(32, 3, 2, padding="same")(x); x = bn_act(x, "sigmoid")
    x = L.Conv2D(2, 1)(x)
    return K2.Model(i, x)


def convt_k4s2():
    i = L.Input((64, 64, 3))
    x = L.Conv2D(32, 3, 2, padding="same")(i); x = bn_act(x, "relu")
    x = L.Conv2D(64, 3, 2, padding="same")(x); x = bn_act(x, "relu")
    x = L.Conv2DTranspose(32, 4, 2, padding="same")(x); x = bn_act(x, "relu")
    x = L.Conv2DTranspose(1, 4, 2, padding="same", activation="sigmoid")(x)
    return K2.Model(i, x)


MODELS = {   # name: (builder, (h,w,c), formats)
    "sepconv_cls128": (sepconv_cls, (128, 128, 3), ["float", "int8io"]),
    "convt_ae96": (convt_autoencoder, (96, 96, 3), ["float", "h5"]),
    "unet_nearest128": (unet("nearest"), (128, 128, 3), ["onnx13", "uint8io"]),
    "unet_bilinear128": (unet("bilinear"), (128, 128, 3), ["float", "onnx17"]),
    "tinyyolo2_208": (tiny_yolo2, (208, 208, 3), ["uint8io", "h5"]),
    "landmark_prelu112": (landmark_prelu, (112, 112, 3), ["onnx13", "int8io"]),
    "elu_net96": (elu_net, (96, 96, 3), ["float"]),
    "se_net128": (se_net, (128, 128, 3), ["floatio_int8", "onnx13"]),
    "globalmax96": (globalmax_cls, (96, 96, 3), ["float", "dynrange"]),
    "zeropad_mnv1_160": (zeropad_mnv1, (160, 160, 3), ["dynrange", "int8io"]),
    "dilated128": (dilated, (128, 128, 3), ["float", "onnx13"]),
    "avgpool_reshape96": (avgpool_reshape, (96, 96, 3), ["h5", "int8io"]),
    "gray_digits64": (gray_digits, (64, 64, 1), ["h5", "float"]),
    "resnet_qvga": (resnet_qvga, (240, 320, 3), ["int8io", "onnx17"]),
    "two_head128": (two_head, (128, 128, 3), ["float", "onnx13"]),
    "dw_mult128": (dw_mult2, (128, 128, 3), ["float", "int8io"]),
    "crop_concat112": (crop_concat, (112, 112, 3), ["float", "onnx13"]),
    "convt_k4s2_64": (convt_k4s2, (64, 64, 3), ["int8io", "onnx13"]),
}


# ------------------------------------------------------------------ round 44's set (--set 2)
def inv_res(x, c, s, t=4, act="relu6"):
    y = bn_act(L.Conv2D(x.shape[-1] * t, 1, use_bias=False)(x), act)
    y = bn_act(L.DepthwiseConv2D(3, s, padding="same", use_bias=False)(y), act)
    y = L.BatchNormalization()(L.Conv2D(c, 1, use_bias=False)(y))
    return L.Add()([x, y]) if s == 1 and c == x.shape[-1] else y


def mnv2_relu6():
    i = L.Input((128, 128, 3))
    x = bn_act(L.Conv2D(16, 3, 2, padding="same", use_bias=False)(i), "relu6")
    for c, s in [(16, 1), (24, 2), (24, 1), (32, 2), (32, 1), (64, 2)]:
        x = inv_res(x, c, s)
    x = bn_act(L.Conv2D(128, 1, use_bias=False)(x), "relu6")
    x = L.GlobalAveragePooling2D()(x)
    return K2.Model(i, L.Dense(7, activation="softmax")(x))


def hswish_se():
    i = L.Input((96, 96, 3))
    x = bn_act(L.Conv2D(16, 3, 2, padding="same")(i), "hard_swish")
    for c in [24, 40]:
        x = bn_act(L.DepthwiseConv2D(5, 2, padding="same")(x), "swish")
        s = L.GlobalAveragePooling2D(keepdims=True)(x)
        s = L.Conv2D(8, 1, activation="relu")(s)
        s = L.Conv2D(x.shape[-1], 1, activation="sigmoid")(s)
        x = L.Multiply()([x, s])
        x = bn_act(L.Conv2D(c, 1)(x), "hard_swish")
    x = L.GlobalAveragePooling2D()(x)
    return K2.Model(i, L.Dense(5)(x))


def crnn_conv1d():
    i = L.Input((64, 128, 1))
    x = bn_act(L.Conv2D(16, 3, padding="same")(i), "relu")
    x = L.MaxPooling2D()(x)
    x = bn_act(L.Conv2D(32, 3, padding="same")(x), "relu")
    x = L.MaxPooling2D((4, 2))(x)                      # 8 x 32 x 32
    x = L.Permute((2, 1, 3))(x)                         # time-major: 32 x 8 x 32
    x = L.Reshape((32, 8 * 32))(x)
    x = L.Conv1D(64, 3, padding="same", activation="relu")(x)
    x = L.Conv1D(12, 1)(x)
    return K2.Model(i, L.Softmax()(x))


def inception():
    i = L.Input((112, 112, 3))
    x = bn_act(L.Conv2D(24, 3, 2, padding="same")(i), "relu")
    x = L.MaxPooling2D(3, 2, padding="same")(x)
    for _ in range(2):
        a = bn_act(L.Conv2D(16, 1)(x), "relu")
        b = bn_act(L.Conv2D(24, 3, padding="same")(bn_act(L.Conv2D(12, 1)(x), "relu")), "relu")
        c = bn_act(L.Conv2D(8, 5, padding="same")(bn_act(L.Conv2D(4, 1)(x), "relu")), "relu")
        d = bn_act(L.Conv2D(8, 1)(L.AveragePooling2D(3, 1, padding="same")(x)), "relu")
        x = L.Concatenate()([a, b, c, d])
    x = L.MaxPooling2D(3, 2, padding="same")(x)
    x = L.GlobalAveragePooling2D()(x)
    return K2.Model(i, L.Dense(10, activation="softmax")(x))


def fpn_upadd():
    i = L.Input((160, 160, 3))
    x = bn_act(L.Conv2D(16, 7, 2, padding="same")(i), "relu")
    c3 = bn_act(L.Conv2D(32, 3, 2, padding="same")(x), "relu")      # 40
    c4 = bn_act(L.Conv2D(64, 3, 2, padding="same")(c3), "relu")     # 20
    c5 = bn_act(L.Conv2D(96, 3, 2, padding="same")(c4), "relu")     # 10
    p5 = L.Conv2D(32, 1)(c5)
    p4 = L.Add()([L.UpSampling2D()(p5), L.Conv2D(32, 1)(c4)])
    p3 = L.Add()([L.UpSampling2D()(p4), L.Conv2D(32, 1)(c3)])
    return K2.Model(i, L.Conv2D(6, 3, padding="same")(p3))


def factorised():
    i = L.Input((96, 96, 3))
    x = bn_act(L.Conv2D(16, 5, 2, padding="same")(i), "relu")
    x = bn_act(L.Conv2D(16, (1, 7), padding="same")(x), "relu")
    x = bn_act(L.Conv2D(24, (7, 1), padding="same")(x), "relu")
    x = bn_act(L.Conv2D(32, 7, 2, padding="same")(x), "relu")
    x = bn_act(L.Conv2D(32, (1, 3), padding="same")(x), "relu")
    x = bn_act(L.Conv2D(32, (3, 1), padding="same")(x), "relu")
    x = L.GlobalAveragePooling2D()(x)
    return K2.Model(i, L.Dense(4)(x))


def bn_unfused():
    i = L.Input((96, 96, 3))
    a = L.Conv2D(16, 3, 2, padding="same")(i)
    b = L.Conv2D(8, 5, 2, padding="same")(i)
    x = L.ReLU()(L.BatchNormalization()(L.Concatenate()([a, b])))
    y = L.Conv2D(24, 3, padding="same")(x)
    x = L.ReLU()(L.BatchNormalization()(L.Add()([x, y])))
    x = L.Conv2D(32, 3, 2, padding="same")(x)
    x = L.BatchNormalization()(L.MaxPooling2D()(x))
    return K2.Model(i, L.Conv2D(5, 1)(L.ReLU()(x)))


def elementwise():
    i = L.Input((96, 96, 3))
    x = bn_act(L.Conv2D(16, 3, 2, padding="same")(i), "relu")
    a = L.Conv2D(16, 3, padding="same")(x)
    b = L.Conv2D(16, 1)(x)
    m = L.Maximum()([a, b])
    n = L.Minimum()([a, b])
    d = L.Subtract()([m, n])
    s = L.Subtract()([x, L.AveragePooling2D(3, 1, padding="same")(x)])
    x = L.Concatenate()([d, s])
    x = bn_act(L.Conv2D(16, 3, 2, padding="same")(x), "relu")
    return K2.Model(i, L.Conv2D(4, 1)(x))


def seg_softmax():
    i = L.Input((96, 160, 3))
    x = bn_act(L.Conv2D(16, 3, 2, padding="same")(i), "relu")
    x = bn_act(L.Conv2D(32, 3, 2, padding="same")(x), "relu")
    x = bn_act(L.Conv2D(32, 3, padding="same", dilation_rate=2)(x), "relu")
    x = L.UpSampling2D(4)(L.Conv2D(3, 1)(x))
    return K2.Model(i, L.Softmax(axis=-1)(x))


def reshape_dense_head():
    i = L.Input((64, 64, 3))
    x = bn_act(L.Conv2D(16, 3, 2, padding="same")(i), "relu")
    x = bn_act(L.Conv2D(16, 3, 2, padding="same")(x), "relu")
    x = bn_act(L.Conv2D(8, 3, 2, padding="same")(x), "relu")     # 8x8x8
    x = L.Reshape((8 * 8 * 8,))(x)
    x = L.Dense(64, activation="relu")(x)
    x = L.Dense(4 * 4 * 6)(x)
    x = L.Reshape((4, 4, 6))(x)
    return K2.Model(i, L.Conv2D(6, 1, activation="sigmoid")(x))


def multilabel_odd():
    i = L.Input((80, 80, 3))
    x = i
    for c in [5, 13, 27]:
        x = bn_act(L.Conv2D(c, 3, 2, padding="same")(x), "relu")
    x = L.GlobalAveragePooling2D()(x)
    x = L.Dense(13, activation="relu")(x)
    return K2.Model(i, L.Dense(6, activation="sigmoid")(x))


def gray_odd():
    i = L.Input((120, 160, 1))
    x = L.Rescaling(2.0, offset=-1.0)(i)
    for c in [3, 5, 13]:
        x = bn_act(L.Conv2D(c, 3, padding="same")(x), "relu")
        x = L.MaxPooling2D()(x)
    x = bn_act(L.Conv2D(27, 3, padding="same")(x), "relu")      # 15x20x27
    return K2.Model(i, L.Conv2D(3, 1)(x))


def blazeface():
    def blaze(x, c, s):
        y = L.DepthwiseConv2D(5, s, padding="same")(x)
        y = L.BatchNormalization()(L.Conv2D(c, 1)(y))
        if s == 2:
            x = L.MaxPooling2D()(x)
        if c != x.shape[-1]:
            x = L.Concatenate()([x, L.Conv2D(c - x.shape[-1], 1)(x)])
        return L.ReLU()(L.Add()([x, y]))
    i = L.Input((128, 128, 3))
    x = bn_act(L.Conv2D(24, 5, 2, padding="same")(i), "relu")       # 64
    x = blaze(x, 24, 1)
    x = blaze(x, 32, 2)                                               # 32
    x = blaze(x, 48, 2)                                               # 16
    a = x
    x = blaze(x, 64, 2)                                               # 8
    x = blaze(x, 64, 1)
    outs = []
    for f, n in [(a, 2), (x, 6)]:
        outs.append(L.Reshape((-1, 1))(L.Conv2D(n, 1, activation="sigmoid")(f)))
        outs.append(L.Reshape((-1, 4))(L.Conv2D(n * 4, 1)(f)))
    return K2.Model(i, [L.Concatenate(axis=1)([outs[0], outs[2]]), L.Concatenate(axis=1)([outs[1], outs[3]])])


def lprnet():
    def small(x, c):
        y = bn_act(L.Conv2D(c // 4, 1)(x), "relu")
        y = bn_act(L.Conv2D(c // 4, (3, 1), padding="same")(y), "relu")
        y = bn_act(L.Conv2D(c // 4, (1, 3), padding="same")(y), "relu")
        return bn_act(L.Conv2D(c, 1)(y), "relu")
    i = L.Input((24, 94, 3))
    x = bn_act(L.Conv2D(32, 3, padding="same")(i), "relu")
    x = L.MaxPooling2D(3, 1, padding="same")(x)
    x = small(x, 64)
    x = L.MaxPooling2D((1, 2))(x)                                     # 24 x 47
    x = small(x, 64)
    x = L.MaxPooling2D((2, 1))(x)                                     # 12 x 47
    x = bn_act(L.Conv2D(64, (1, 4))(x), "relu")                       # 12 x 44
    x = bn_act(L.Conv2D(37, (12, 1))(x), "relu")                      # 1 x 44 x 37 classes
    return K2.Model(i, L.Softmax()(x))


def dense_flat_gate():
    i = L.Input((64, 96, 3))
    x = bn_act(L.Conv2D(12, 3, 2, padding="same")(i), "swish")
    x = bn_act(L.Conv2D(24, 3, 2, padding="same")(x), "swish")
    g = L.Conv2D(24, 1, activation="sigmoid")(x)
    x = L.Multiply()([x, g])
    x = L.MaxPooling2D(3, 2, padding="same")(x)                        # 8 x 12 x 24
    x = L.Flatten()(x)
    x = L.Dense(32, activation="swish")(x)
    return K2.Model(i, L.Dense(3, activation="softmax")(x))


class ChannelScale(L.Layer):
    """A learned per-channel multiplier: Multiply by a broadcast (1, 1, 1, C) vector."""
    def build(self, shape):
        self.s = self.add_weight(name="s", shape=(shape[-1],),
                                 initializer=K2.initializers.RandomUniform(0.5, 1.5))

    def call(self, x):
        return x * self.s


def chan_scale():
    i = L.Input((96, 96, 3))
    x = bn_act(L.Conv2D(16, 3, 2, padding="same")(i), "relu")
    x = ChannelScale()(x)
    x = L.Conv2D(32, 3, 2, padding="same")(x)
    x = L.ReLU()(ChannelScale()(x))
    x = L.GlobalAveragePooling2D()(x)
    return K2.Model(i, L.Dense(4)(x))


MODELS2 = {   # round 44: name: (builder, (h,w,c), formats)
    "mnv2_relu6_128": (mnv2_relu6, (128, 128, 3), ["float", "int8io"]),
    "hswish_se96": (hswish_se, (96, 96, 3), ["uint8io", "onnx13"]),
    "crnn_conv1d64x128": (crnn_conv1d, (64, 128, 1), ["h5", "float"]),
    "inception112": (inception, (112, 112, 3), ["h5", "onnx17"]),
    "fpn_upadd160": (fpn_upadd, (160, 160, 3), ["float", "uint8io"]),
    "factorised96": (factorised, (96, 96, 3), ["int8io", "onnx13"]),
    "bn_unfused96": (bn_unfused, (96, 96, 3), ["h5", "float"]),
    "elementwise96": (elementwise, (96, 96, 3), ["float", "onnx17"]),
    "seg_softmax96x160": (seg_softmax, (96, 160, 3), ["uint8io", "onnx13"]),
    "reshape_dense64": (reshape_dense_head, (64, 64, 3), ["float", "h5"]),
    "multilabel_odd80": (multilabel_odd, (80, 80, 3), ["int8io", "dynrange"]),
    "gray_odd120x160": (gray_odd, (120, 160, 1), ["h5", "int8io"]),
    "blazeface128": (blazeface, (128, 128, 3), ["float", "onnx13"]),
    "lprnet24x94": (lprnet, (24, 94, 3), ["float", "int8io"]),
    "dense_gate64x96": (dense_flat_gate, (64, 96, 3), ["uint8io", "h5"]),
    "chan_scale96": (chan_scale, (96, 96, 3), ["float", "onnx17"]),
}


def keras3_models2():
    """An inverted-residual classifier on a 240x320 (QVGA) frame with a GAP + sigmoid multi-label
    head, saved by Keras 3."""
    import keras
    L3 = keras.layers
    keras.utils.set_random_seed(44)

    def bn(x, act):
        return L3.Activation(act)(L3.BatchNormalization()(x))
    i = keras.Input((240, 320, 3))
    x = bn(L3.Conv2D(16, 3, 2, padding="same", use_bias=False)(i), "relu6")
    for c, s in [(16, 2), (24, 2), (24, 1), (32, 2)]:
        y = bn(L3.Conv2D(x.shape[-1] * 3, 1, use_bias=False)(x), "relu6")
        y = bn(L3.DepthwiseConv2D(3, s, padding="same", use_bias=False)(y), "relu6")
        y = L3.BatchNormalization()(L3.Conv2D(c, 1, use_bias=False)(y))
        x = L3.Add()([x, y]) if s == 1 and c == x.shape[-1] else y
    x = L3.GlobalAveragePooling2D()(x)
    m = keras.Model(i, L3.Dense(5, activation="sigmoid")(x))
    devcorpus.recalibrate_bn(m, 0, 1)
    m.save(f"{OUT}/k3_mnv2_qvga_multilabel.keras")


# ------------------------------------------------------------------ round 45's set (--set 3)
def conv_bn(x, c, k, s=1, act="relu", **kw):
    return bn_act(L.Conv2D(c, k, s, padding="same", use_bias=False, **kw)(x), act)


def yolo_fastest():
    """YOLOv5n-like: SiLU, CSP-ish blocks, SPPF (max pools 5 stride 1 'same' chained, so 5/9/13),
    upsample + concat necks, three heads at strides 8, 16, 32."""
    i = L.Input((160, 160, 3))
    x = conv_bn(i, 16, 3, 2, "swish")                       # 80
    x = conv_bn(x, 24, 3, 2, "swish")                       # 40
    c3 = conv_bn(x, 32, 3, 2, "swish")                      # 20
    a = conv_bn(c3, 16, 1, act="swish")
    b = conv_bn(conv_bn(c3, 16, 1, act="swish"), 16, 3, act="swish")
    c3 = conv_bn(L.Concatenate()([a, b]), 32, 1, act="swish")
    c4 = conv_bn(c3, 48, 3, 2, "swish")                     # 10
    c5 = conv_bn(c4, 64, 3, 2, "swish")                     # 5
    y = conv_bn(c5, 32, 1, act="swish")
    p1 = L.MaxPooling2D(5, 1, padding="same")(y)
    p2 = L.MaxPooling2D(5, 1, padding="same")(p1)
    p3 = L.MaxPooling2D(5, 1, padding="same")(p2)
    c5 = conv_bn(L.Concatenate()([y, p1, p2, p3]), 64, 1, act="swish")
    n4 = conv_bn(L.Concatenate()([L.UpSampling2D()(conv_bn(c5, 32, 1, act="swish")), c4]), 48, 3, act="swish")
    n3 = conv_bn(L.Concatenate()([L.UpSampling2D()(conv_bn(n4, 24, 1, act="swish")), c3]), 32, 3, act="swish")
    return K2.Model(i, [L.Conv2D(3 * 7, 1)(n3), L.Conv2D(3 * 7, 1)(n4), L.Conv2D(3 * 7, 1)(c5)])


def se_block(x, r, gate):
    c = x.shape[-1]
    s = L.GlobalAveragePooling2D(keepdims=True)(x)
    s = L.Conv2D(max(8, c // r), 1, activation="relu")(s)
    s = L.Conv2D(c, 1, activation=gate)(s)
    return L.Multiply()([x, s])


def mnv3_large():
    i = L.Input((112, 112, 3))
    x = conv_bn(i, 16, 3, 2, "hard_swish")
    for e, c, k, s, se, act in [(16, 16, 3, 1, False, "relu"), (64, 24, 3, 2, False, "relu"),
                                (72, 24, 3, 1, False, "relu"), (72, 40, 5, 2, True, "relu"),
                                (120, 40, 5, 1, True, "relu"), (240, 80, 3, 2, False, "hard_swish"),
                                (200, 80, 3, 1, False, "hard_swish"), (480, 112, 3, 1, True, "hard_swish")]:
        y = conv_bn(x, e, 1, act=act) if e != x.shape[-1] else x
        y = bn_act(L.DepthwiseConv2D(k, s, padding="same", use_bias=False)(y), act)
        if se:
            y = se_block(y, 4, "hard_sigmoid")
        y = L.BatchNormalization()(L.Conv2D(c, 1, use_bias=False)(y))
        x = L.Add()([x, y]) if s == 1 and c == x.shape[-1] else y
    x = conv_bn(x, 160, 1, act="hard_swish")
    x = L.GlobalAveragePooling2D(keepdims=True)(x)
    x = L.Conv2D(256, 1)(x); x = L.Multiply()([x, L.Activation("hard_sigmoid")(x)])
    x = L.Flatten()(L.Conv2D(10, 1)(x))
    return K2.Model(i, L.Softmax()(x))


def ghost(x, c, act="relu"):
    a = conv_bn(x, c // 2, 1, act=act)
    b = bn_act(L.DepthwiseConv2D(3, padding="same", use_bias=False)(a), act)
    return L.Concatenate()([a, b])


def ghostnet():
    i = L.Input((96, 96, 3))
    x = conv_bn(i, 16, 3, 2)
    for c, s in [(16, 1), (24, 2), (24, 1), (40, 2), (40, 1)]:
        y = ghost(x, c * 2)
        if s == 2:
            y = L.BatchNormalization()(L.DepthwiseConv2D(3, 2, padding="same", use_bias=False)(y))
        y = ghost(y, c, act="linear")
        sc = x if s == 1 and c == x.shape[-1] else L.BatchNormalization()(L.Conv2D(c, 1, use_bias=False)(
            L.DepthwiseConv2D(3, s, padding="same", use_bias=False)(x)))
        x = L.Add()([sc, y])
    x = L.GlobalAveragePooling2D()(x)
    return K2.Model(i, L.Dense(6)(x))


def efficientnet_lite():
    i = L.Input((112, 112, 3))
    x = conv_bn(i, 24, 3, 2, "relu6")
    for e, c, k, s in [(1, 16, 3, 1), (4, 24, 3, 2), (4, 24, 3, 1), (4, 40, 5, 2), (4, 40, 5, 1), (4, 64, 3, 2)]:
        y = conv_bn(x, x.shape[-1] * e, 1, act="relu6") if e != 1 else x
        y = bn_act(L.DepthwiseConv2D(k, s, padding="same", use_bias=False)(y), "relu6")
        y = L.BatchNormalization()(L.Conv2D(c, 1, use_bias=False)(y))
        x = L.Add()([x, y]) if s == 1 and c == x.shape[-1] else y
    x = conv_bn(x, 320, 1, act="relu6")
    x = L.GlobalAveragePooling2D()(x)
    return K2.Model(i, L.Dense(8, activation="softmax")(L.Dropout(0.2)(x)))


def pp_lcnet():
    i = L.Input((96, 96, 3))
    x = conv_bn(i, 16, 3, 2, "hard_swish")
    for c, k, s, se in [(32, 3, 1, False), (64, 3, 2, False), (64, 3, 1, False), (128, 5, 2, False),
                        (128, 5, 1, True), (256, 5, 2, True)]:
        x = bn_act(L.DepthwiseConv2D(k, s, padding="same", use_bias=False)(x), "hard_swish")
        if se:
            x = se_block(x, 4, "hard_sigmoid")
        x = conv_bn(x, c, 1, act="hard_swish")
    x = L.GlobalAveragePooling2D(keepdims=True)(x)
    x = L.Conv2D(256, 1)(x); x = L.Multiply()([x, L.Activation("hard_sigmoid")(x)])
    return K2.Model(i, L.Dense(5)(L.Flatten()(x)))


def repvgg():
    def block(x, c, s):
        a = L.BatchNormalization()(L.Conv2D(c, 3, s, padding="same", use_bias=False)(x))
        b = L.BatchNormalization()(L.Conv2D(c, 1, s, use_bias=False)(x))
        br = [a, b] + ([L.BatchNormalization()(x)] if s == 1 and c == x.shape[-1] else [])
        return L.ReLU()(L.Add()(br))
    i = L.Input((96, 96, 3))
    x = block(i, 16, 2)
    for c, s in [(32, 2), (32, 1), (64, 2), (64, 1), (96, 2)]:
        x = block(x, c, s)
    x = L.GlobalAveragePooling2D()(x)
    return K2.Model(i, L.Dense(10)(x))


def ds_cnn_kws():
    i = L.Input((49, 10, 1))
    x = bn_act(L.Conv2D(64, (10, 4), (2, 2), padding="same", use_bias=False)(i), "relu")   # 25x5
    for _ in range(4):
        x = bn_act(L.DepthwiseConv2D(3, padding="same", use_bias=False)(x), "relu")
        x = conv_bn(x, 64, 1)
    x = L.AveragePooling2D((25, 5))(x)
    x = L.Flatten()(x)
    return K2.Model(i, L.Dense(12, activation="softmax")(x))


def pfld():
    i = L.Input((112, 112, 3))
    x = conv_bn(i, 32, 3, 2)                                  # 56
    x = bn_act(L.DepthwiseConv2D(3, padding="same", use_bias=False)(x), "relu")
    for c, s in [(32, 2), (32, 1), (64, 2), (64, 1)]:         # 14
        x = inv_res(x, c, s, t=2, act="relu")
    aux = conv_bn(x, 32, 3, 2)                                # 7
    aux = L.GlobalMaxPooling2D()(conv_bn(aux, 32, 3))
    pose = L.Dense(3, name="pose")(L.Dense(32, activation="relu")(aux))
    s1 = conv_bn(x, 16, 3)                                    # 14x14x16
    s2 = conv_bn(s1, 32, 3, 2)                                # 7x7x32
    s3 = bn_act(L.Conv2D(64, 7, padding="valid")(s2), "relu")  # 1x1x64
    f = L.Concatenate()([L.Flatten()(L.GlobalAveragePooling2D(keepdims=True)(s1)),
                         L.Flatten()(L.GlobalAveragePooling2D(keepdims=True)(s2)), L.Flatten()(s3)])
    return K2.Model(i, [L.Dense(2 * 34, name="landmarks")(f), pose])


class ReflectPad(L.Layer):
    def __init__(self, p, **kw):
        super().__init__(**kw)
        self.p = p

    def call(self, x):
        p = self.p
        return tf.pad(x, [[0, 0], [p, p], [p, p], [0, 0]], mode="REFLECT")


class InstanceNorm(L.Layer):
    def build(self, shape):
        self.g = self.add_weight(name="g", shape=(shape[-1],), initializer=K2.initializers.RandomUniform(0.6, 1.4))
        self.b = self.add_weight(name="b", shape=(shape[-1],), initializer=K2.initializers.RandomUniform(-0.2, 0.2))

    def call(self, x):
        m, v = tf.nn.moments(x, axes=[1, 2], keepdims=True)
        return (x - m) * tf.math.rsqrt(v + 1e-3) * self.g + self.b


def style_transfer():
    def rconv(x, c, k, s=1):
        return L.Conv2D(c, k, s, padding="valid")(ReflectPad(k // 2)(x))
    i = L.Input((128, 128, 3))
    x = L.ReLU()(InstanceNorm()(rconv(i, 16, 9)))
    x = L.ReLU()(InstanceNorm()(rconv(x, 32, 3, 2)))
    y = L.ReLU()(InstanceNorm()(rconv(x, 32, 3)))
    x = L.Add()([x, InstanceNorm()(rconv(y, 32, 3))])
    x = L.UpSampling2D()(x)
    x = L.ReLU()(InstanceNorm()(rconv(x, 16, 3)))
    return K2.Model(i, L.Activation("sigmoid")(rconv(x, 3, 9)))


def style_reflect():
    """The same style net with reflect padding and no normalisation (a BN-folded export)."""
    def rconv(x, c, k, s=1):
        return L.Conv2D(c, k, s, padding="valid")(ReflectPad(k // 2)(x))
    i = L.Input((128, 128, 3))
    x = bn_act(rconv(i, 16, 9), "relu")
    x = bn_act(rconv(x, 32, 3, 2), "relu")
    y = bn_act(rconv(x, 32, 3), "relu")
    x = L.Add()([x, L.BatchNormalization()(rconv(y, 32, 3))])
    x = L.UpSampling2D()(x)
    x = bn_act(rconv(x, 16, 3), "relu")
    return K2.Model(i, L.Activation("sigmoid")(rconv(x, 3, 9)))


class Resize(L.Layer):
    def __init__(self, size, method, **kw):
        super().__init__(**kw)
        self.size, self.method = size, method

    def call(self, x):
        return tf.image.resize(x, self.size, method=self.method)


def resize_odd():
    """Resizes by 1.5 (bilinear) and to a fixed 20x20 (nearest)."""
    i = L.Input((96, 96, 3))
    x = conv_bn(i, 16, 3, 2)                                  # 48
    x = conv_bn(x, 32, 3, 2)                                  # 24
    y = conv_bn(x, 16, 3, 2)                                  # 12
    y = Resize((18, 18), "bilinear")(y)
    z = conv_bn(L.Concatenate()([Resize((18, 18), "nearest")(x), y]), 32, 3)
    z = Resize((20, 20), "nearest")(z)
    return K2.Model(i, L.Conv2D(4, 1)(z))


def aspp_dilated():
    """A DeepLab-like ASPP: dilation-2 and -3 convs, a dilation-2 depthwise conv, an image-pool
    branch broadcast back by upsampling."""
    i = L.Input((96, 96, 3))
    x = conv_bn(i, 16, 3, 2)
    x = conv_bn(x, 32, 3, 2)                                  # 24
    a = conv_bn(x, 16, 1)
    b = conv_bn(x, 16, 3, dilation_rate=2)
    c = conv_bn(x, 16, 3, dilation_rate=3)
    d = conv_bn(bn_act(L.DepthwiseConv2D(3, padding="same", dilation_rate=2, use_bias=False)(x), "relu"), 16, 1)
    g = L.UpSampling2D(24)(conv_bn(L.GlobalAveragePooling2D(keepdims=True)(x), 16, 1))
    x = conv_bn(L.Concatenate()([a, b, c, d, g]), 32, 1)
    return K2.Model(i, L.Conv2D(5, 1)(x))


def dwm2_odd():
    """A 75x100 (odd, non-square) frame; depthwise multipliers 2 inside the net."""
    i = L.Input((75, 100, 3))
    x = conv_bn(i, 8, 3, 2)                                   # 38x50
    x = bn_act(L.DepthwiseConv2D(3, 1, padding="same", depth_multiplier=2, use_bias=False)(x), "relu6")
    x = conv_bn(x, 24, 1, act="relu6")
    x = bn_act(L.DepthwiseConv2D(3, 2, padding="same", depth_multiplier=2, use_bias=False)(x), "relu6")
    x = conv_bn(x, 32, 1, act="relu6")                        # 19x25
    x = L.MaxPooling2D(3, 2)(x)                               # 9x12
    x = L.GlobalAveragePooling2D()(x)
    return K2.Model(i, L.Dense(7)(x))


def tiny_vit():
    """A patch-embedding conv, one Transformer block (LayerNorm, 2-head self-attention, MLP)."""
    i = L.Input((64, 64, 3))
    x = L.Conv2D(32, 8, 8)(i)                                 # 8x8x32
    x = L.Reshape((64, 32))(x)
    y = L.LayerNormalization()(x)
    y = L.MultiHeadAttention(2, 16)(y, y)
    x = L.Add()([x, y])
    y = L.LayerNormalization()(x)
    y = L.Dense(32)(L.Dense(64, activation="gelu")(y))
    x = L.Add()([x, y])
    x = L.GlobalAveragePooling1D()(x)
    return K2.Model(i, L.Dense(4)(x))


def conv_attention():
    """A spatial attention gate (CBAM-like: channel mean and max, 7x7 conv, sigmoid) and a
    non-local block's 1x1 convs with no matmul: what a CNN user calls attention."""
    i = L.Input((96, 96, 3))
    x = conv_bn(i, 16, 3, 2)
    x = conv_bn(x, 32, 3, 2)                                  # 24
    m = L.Lambda(lambda t: tf.reduce_mean(t, -1, keepdims=True))(x)
    n = L.Lambda(lambda t: tf.reduce_max(t, -1, keepdims=True))(x)
    a = L.Conv2D(1, 7, padding="same", activation="sigmoid")(L.Concatenate()([m, n]))
    x = L.Multiply()([x, a])
    x = conv_bn(x, 32, 3, 2)
    return K2.Model(i, L.Conv2D(3, 1)(x))


MODELS3 = {   # round 45: name: (builder, (h,w,c), formats)
    "yolov5n_like160": (yolo_fastest, (160, 160, 3), ["float", "onnx13"]),
    "mnv3_large112": (mnv3_large, (112, 112, 3), ["int8io", "h5"]),
    "ghostnet96": (ghostnet, (96, 96, 3), ["float", "onnx17"]),
    "effnet_lite112": (efficientnet_lite, (112, 112, 3), ["uint8io", "dynrange"]),
    "pp_lcnet96": (pp_lcnet, (96, 96, 3), ["float", "int8io"]),
    "repvgg96": (repvgg, (96, 96, 3), ["h5", "onnx13"]),
    "dscnn_kws49x10": (ds_cnn_kws, (49, 10, 1), ["int8io", "float"]),
    "pfld112": (pfld, (112, 112, 3), ["float", "onnx13"]),
    "style_inorm128": (style_transfer, (128, 128, 3), ["float", "onnx13"]),
    "style_reflect128": (style_reflect, (128, 128, 3), ["uint8io", "onnx17"]),
    "resize_odd96": (resize_odd, (96, 96, 3), ["float", "onnx13"]),
    "aspp_dilated96": (aspp_dilated, (96, 96, 3), ["int8io", "onnx13"]),
    "dwm2_75x100": (dwm2_odd, (75, 100, 3), ["uint8io", "h5"]),
    "tiny_vit64": (tiny_vit, (64, 64, 3), ["float", "onnx13"]),
    "conv_attention96": (conv_attention, (96, 96, 3), ["dynrange", "onnx17"]),
}


def keras3_models3():
    """A GhostNet-like net with Keras 3's own hard_silu / hard_sigmoid SE, saved by Keras 3."""
    import keras
    L3 = keras.layers
    keras.utils.set_random_seed(45)

    def bn(x, act):
        return L3.Activation(act)(L3.BatchNormalization()(x))
    i = keras.Input((112, 112, 3))
    x = bn(L3.Conv2D(16, 3, 2, padding="same", use_bias=False)(i), "hard_silu")
    for c, s in [(24, 2), (24, 1), (40, 2)]:
        a = bn(L3.Conv2D(c // 2, 1, use_bias=False)(x), "relu")
        y = L3.Concatenate()([a, bn(L3.DepthwiseConv2D(3, padding="same", use_bias=False)(a), "relu")])
        if s == 2:
            y = L3.BatchNormalization()(L3.DepthwiseConv2D(3, 2, padding="same", use_bias=False)(y))
        q = L3.GlobalAveragePooling2D(keepdims=True)(y)
        q = L3.Conv2D(c, 1, activation="hard_sigmoid")(L3.Conv2D(8, 1, activation="relu")(q))
        y = L3.Multiply()([y, q])
        x = L3.Add()([x, y]) if s == 1 and c == x.shape[-1] else y
    x = L3.GlobalAveragePooling2D()(x)
    m = keras.Model(i, L3.Dense(6)(x))
    devcorpus.recalibrate_bn(m, 0, 1)
    m.save(f"{OUT}/k3_ghost_hsilu112.keras")

# ------------------------------------------------------------------ round 48's set
def yolov8_head():
    """YOLOv8n-like anchor-free head at strides 8 and 16: decoupled box / class branches, DFL
    (4x16 bins, softmax over the bins, a 1x1 conv with arange weights), dist2bbox with grid and
    stride constants; the output is decoded boxes (pixels) concatenated with sigmoid scores."""
    nc, reg = 3, 16
    i = L.Input((128, 128, 3))
    x = conv_bn(i, 16, 3, 2, "swish"); x = conv_bn(x, 32, 3, 2, "swish")
    p3 = conv_bn(x, 32, 3, 2, "swish"); p4 = conv_bn(p3, 48, 3, 2, "swish")
    outs = []
    for f, s in [(p3, 8), (p4, 16)]:
        h = w = 128 // s
        b = conv_bn(conv_bn(f, 32, 3, act="swish"), 32, 3, act="swish")
        b = L.Conv2D(4 * reg, 1)(b)
        c = conv_bn(conv_bn(f, 32, 3, act="swish"), 32, 3, act="swish")
        c = L.Conv2D(nc, 1, activation="sigmoid")(c)
        b = L.Reshape((h * w, 4, reg))(b)
        b = L.Softmax(axis=-1)(b)
        proj = np.arange(reg, dtype=np.float32).reshape(1, 1, reg, 1)
        dfl = L.Conv2D(1, 1, use_bias=False, trainable=False,
                       kernel_initializer=K2.initializers.Constant(proj))
        d = L.Reshape((h * w, 4))(dfl(b))
        gy, gx = np.meshgrid(np.arange(h) + 0.5, np.arange(w) + 0.5, indexing="ij")
        grid = np.stack([gx.ravel(), gy.ravel()], -1).astype(np.float32)[None]
        lt, rb = L.Lambda(lambda t: t[..., :2])(d), L.Lambda(lambda t: t[..., 2:])(d)
        x1y1 = L.Lambda(lambda t, g=grid: g - t)(lt)
        x2y2 = L.Lambda(lambda t, g=grid: g + t)(rb)
        cxy = L.Lambda(lambda t: t * 0.5)(L.Add()([x1y1, x2y2]))
        wh = L.Subtract()([x2y2, x1y1])
        box = L.Lambda(lambda t, s=s: t * float(s))(L.Concatenate()([cxy, wh]))
        outs.append(L.Concatenate()([box, L.Reshape((h * w, nc))(c)]))
    return K2.Model(i, L.Concatenate(axis=1)(outs))


def centernet():
    """CenterNet-like heads: a sigmoid heatmap with the max-pool peak trick
    x * (maxpool3x3_same(x) == x), and a size head."""
    i = L.Input((96, 96, 3))
    x = conv_bn(i, 16, 3, 2); x = conv_bn(x, 32, 3, 2); x = conv_bn(x, 48, 3, 2)
    x = L.Conv2DTranspose(32, 4, 2, padding="same", use_bias=False)(x); x = bn_act(x, "relu")
    hm = L.Conv2D(4, 1, activation="sigmoid")(conv_bn(x, 32, 3))
    peak = L.MaxPooling2D(3, 1, padding="same")(hm)
    keep = L.Lambda(lambda t: tf.cast(tf.equal(t[0], t[1]), tf.float32))([peak, hm])
    hm = L.Multiply()([hm, keep])
    wh = L.Conv2D(2, 1)(conv_bn(x, 32, 3))
    return K2.Model(i, L.Concatenate()([hm, wh]))


def shuffle_unit(x, c, s):
    if s == 1:
        a, b = L.Lambda(lambda t: tf.split(t, 2, axis=-1))(x)
    else:
        a = L.DepthwiseConv2D(3, 2, padding="same", use_bias=False)(x); a = L.BatchNormalization()(a)
        a = conv_bn(a, c // 2, 1)
        b = x
    b = conv_bn(b, c // 2, 1)
    b = L.DepthwiseConv2D(3, s, padding="same", use_bias=False)(b); b = L.BatchNormalization()(b)
    b = conv_bn(b, c // 2, 1)
    y = L.Concatenate()([a, b])
    h, w = y.shape[1], y.shape[2]
    y = L.Reshape((h, w, 2, c // 2))(y)
    y = L.Permute((1, 2, 4, 3))(y)
    return L.Reshape((h, w, c))(y)


def shufflenet_v2():
    """ShuffleNetV2 units: tf.split channel split, reshape-transpose-reshape shuffle, and a
    MaxPool 3x3 stride 2 on an odd (47x47) map."""
    i = L.Input((96, 96, 3))
    x = bn_act(L.Conv2D(24, 3, 2, use_bias=False)(i), "relu")  # 47x47
    x = L.MaxPooling2D(3, 2, padding="same")(x)               # 24x24
    for c, s in [(48, 2), (48, 1), (96, 2), (96, 1)]:
        x = shuffle_unit(x, c, s)
    x = conv_bn(x, 128, 1)
    x = L.GlobalAveragePooling2D()(x)
    return K2.Model(i, L.Dense(8)(x))


def fire(x, s, e):
    x = L.Conv2D(s, 1, activation="relu")(x)
    return L.Concatenate()([L.Conv2D(e, 1, activation="relu")(x),
                            L.Conv2D(e, 3, padding="same", activation="relu")(x)])


def squeezenet11():
    """SqueezeNet 1.1: fire modules, 'valid' max pools on odd maps, a conv classifier + GAP."""
    i = L.Input((112, 112, 3))
    x = L.Conv2D(32, 3, 2, activation="relu")(i)              # 55
    x = L.MaxPooling2D(3, 2)(x)                               # 27
    x = fire(fire(x, 8, 32), 8, 32)
    x = L.MaxPooling2D(3, 2)(x)                               # 13
    x = fire(fire(x, 16, 48), 16, 48)
    x = L.MaxPooling2D(3, 2)(x)                               # 6
    x = fire(x, 24, 64)
    x = L.Dropout(0.5)(x)
    x = L.Conv2D(10, 1, activation="relu")(x)
    return K2.Model(i, L.GlobalAveragePooling2D()(x))     # logits, as torchvision's


def densenet():
    """DenseNet-like: pre-activation BN-ReLU-Conv layers, each concatenated onto the block's
    input; transitions BN-ReLU-1x1 conv-AvgPool."""
    i = L.Input((96, 96, 3))
    x = L.Conv2D(24, 3, 2, padding="same", use_bias=False)(i)
    for blk in range(2):
        for _ in range(4):
            y = L.Conv2D(32, 1, use_bias=False)(bn_act(x, "relu"))
            y = L.Conv2D(12, 3, padding="same", use_bias=False)(bn_act(y, "relu"))
            x = L.Concatenate()([x, y])
        x = L.Conv2D(x.shape[-1] // 2, 1, use_bias=False)(bn_act(x, "relu"))
        x = L.AveragePooling2D()(x)
    x = L.GlobalAveragePooling2D()(bn_act(x, "relu"))
    return K2.Model(i, L.Dense(10)(x))


def resnet_v2():
    """ResNet-v2 pre-activation blocks: BN-ReLU before each conv (not foldable into the
    previous conv), identity and 1x1-projection shortcuts."""
    i = L.Input((96, 96, 3))
    x = L.Conv2D(16, 3, 2, padding="same")(i)
    for c, s in [(16, 1), (32, 2), (32, 1), (64, 2)]:
        p = bn_act(x, "relu")
        sc = x if s == 1 and c == x.shape[-1] else L.Conv2D(c, 1, s)(p)
        y = L.Conv2D(c, 3, s, padding="same", use_bias=False)(p)
        y = L.Conv2D(c, 3, padding="same")(bn_act(y, "relu"))
        x = L.Add()([sc, y])
    x = L.GlobalAveragePooling2D()(bn_act(x, "relu"))
    return K2.Model(i, L.Dense(5)(x))


def convnext():
    """ConvNeXt-like: a 4x4 stride-4 patchify stem + LayerNorm, blocks of 7x7 depthwise,
    LayerNorm over channels, pointwise Dense 4x, GELU, Dense back, layer-scale, residual."""
    i = L.Input((64, 64, 3))
    x = L.LayerNormalization(epsilon=1e-6)(L.Conv2D(32, 4, 4)(i))
    for _ in range(2):
        y = L.DepthwiseConv2D(7, padding="same")(x)
        y = L.LayerNormalization(epsilon=1e-6)(y)
        y = L.Dense(128, activation="gelu")(y)
        y = L.Dense(32)(y)
        y = L.Lambda(lambda t: t * np.linspace(0.5, 1.0, 32, dtype=np.float32))(y)
        x = L.Add()([x, y])
    x = L.LayerNormalization(epsilon=1e-6)(L.GlobalAveragePooling2D()(x))
    return K2.Model(i, L.Dense(6)(x))


def preproc():
    """Keras preprocessing layers inside the model: Rescaling(1/255) + Normalization (ImageNet
    mean / variance), Resizing 120x160 -> 96x128 (bilinear), CenterCrop 96x96."""
    i = L.Input((120, 160, 3))
    x = L.Rescaling(1 / 255.0)(L.Rescaling(255.0)(i))
    x = L.Normalization(mean=[0.485, 0.456, 0.406], variance=[0.229 ** 2, 0.224 ** 2, 0.225 ** 2])(x)
    x = L.Resizing(96, 128)(x)
    x = L.CenterCrop(96, 96)(x)
    x = conv_bn(x, 16, 3, 2); x = conv_bn(x, 32, 3, 2); x = conv_bn(x, 48, 3, 2)
    x = L.GlobalAveragePooling2D()(x)
    return K2.Model(i, L.Dense(4, activation="softmax")(x))


def espcn():
    """ESPCN-like super resolution x3: 5x5 and 3x3 convs (tanh), a 3*9-channel conv and
    tf.nn.depth_to_space (pixel shuffle), a clipped image output."""
    i = L.Input((48, 48, 3))
    x = L.Conv2D(32, 5, padding="same", activation="tanh")(i)
    x = L.Conv2D(16, 3, padding="same", activation="tanh")(x)
    x = L.Conv2D(3 * 9, 3, padding="same")(x)
    x = L.Lambda(lambda t: tf.nn.depth_to_space(t, 3))(x)
    return K2.Model(i, L.ReLU(1.0)(x))


def grouped():
    """A grouped Conv2D (groups=4), a SeparableConv2D with depth_multiplier 2, GroupNormalization."""
    i = L.Input((96, 96, 3))
    x = conv_bn(i, 32, 3, 2)
    x = L.Conv2D(32, 3, padding="same", groups=4, use_bias=False)(x); x = bn_act(x, "relu")
    x = L.SeparableConv2D(48, 3, 2, padding="same", depth_multiplier=2)(x)
    x = L.Activation("relu")(L.GroupNormalization(groups=8)(x))
    x = L.Conv2D(64, 3, 2, padding="same", groups=4)(x)
    x = L.Activation("relu")(L.GroupNormalization(groups=4)(x))
    x = L.GlobalAveragePooling2D()(x)
    return K2.Model(i, L.Dense(10)(x))


def siamese():
    """Two inputs through one shared embedding net; the output is the squared difference's score."""
    a, b = L.Input((64, 64, 3)), L.Input((64, 64, 3))
    i = L.Input((64, 64, 3))
    x = conv_bn(i, 16, 3, 2); x = conv_bn(x, 32, 3, 2); x = conv_bn(x, 32, 3, 2)
    emb = K2.Model(i, L.Dense(16)(L.GlobalAveragePooling2D()(x)))
    d = L.Subtract()([emb(a), emb(b)])
    d = L.Multiply()([d, d])
    return K2.Model([a, b], L.Dense(1, activation="sigmoid")(d))


def three_out():
    """A face-attribute-like net with 3 outputs: age (linear), gender (sigmoid), 7 emotions
    (softmax), from one trunk."""
    i = L.Input((96, 96, 3))
    x = conv_bn(i, 16, 3, 2); x = conv_bn(x, 32, 3, 2); x = conv_bn(x, 48, 3, 2)
    x = conv_bn(x, 64, 3, 2)
    g = L.GlobalAveragePooling2D()(x)
    return K2.Model(i, [L.Dense(1)(g), L.Dense(1, activation="sigmoid")(g),
                        L.Dense(7, activation="softmax")(L.Dense(32, activation="relu")(g))])


def lstm_gru():
    """A conv front end, then LSTM and GRU over the 16 time steps (the K210 has no recurrence)."""
    i = L.Input((16, 20, 1))
    x = L.Reshape((16, 20))(i)
    x = L.Conv1D(24, 3, padding="same", activation="relu")(x)
    x = L.LSTM(24, return_sequences=True)(x)
    x = L.GRU(16)(x)
    return K2.Model(i, L.Dense(5, activation="softmax")(x))


MODELS4 = {   # round 48: name: (builder, (h,w,c), formats)
    "yolov8_head128": (yolov8_head, (128, 128, 3), ["float", "onnx13"]),
    "centernet96": (centernet, (96, 96, 3), ["onnx17", "int8io"]),
    "shufflenet_v2_96": (shufflenet_v2, (96, 96, 3), ["float", "onnx17"]),
    "squeezenet11_112": (squeezenet11, (112, 112, 3), ["uint8io", "h5"]),
    "densenet96": (densenet, (96, 96, 3), ["onnx13", "float16"]),
    "resnet_v2_96": (resnet_v2, (96, 96, 3), ["h5", "int16x8"]),
    "convnext64": (convnext, (64, 64, 3), ["float", "onnx17"]),
    "preproc120x160": (preproc, (120, 160, 3), ["h5", "float"]),
    "espcn48": (espcn, (48, 48, 3), ["float", "uint8io"]),
    "grouped96": (grouped, (96, 96, 3), ["onnx17", "dynrange", "h5"]),
    "siamese64": (siamese, (64, 64, 3), ["h5", "onnx13"]),
    "three_out96": (three_out, (96, 96, 3), ["float16", "int8io"]),
    "lstm_gru16x20": (lstm_gru, (16, 20, 1), ["h5", "onnx13"]),
}


def keras3_models4():
    """A ConvNeXt-like block net with Keras 3's preprocessing layers inside it, saved by Keras 3."""
    import keras
    L3 = keras.layers
    keras.utils.set_random_seed(48)
    i = keras.Input((80, 80, 3))
    x = L3.Rescaling(1 / 127.5, offset=-1.0)(L3.Rescaling(255.0)(i))
    x = L3.Resizing(64, 64)(x)
    x = L3.LayerNormalization(epsilon=1e-6)(L3.Conv2D(24, 4, 4)(x))
    y = L3.DepthwiseConv2D(7, padding="same")(x)
    y = L3.LayerNormalization(epsilon=1e-6)(y)
    y = L3.Dense(24, use_bias=True)(L3.Dense(96, activation="gelu")(y))
    x = L3.Add()([x, y])
    x = L3.GlobalAveragePooling2D()(x)
    m = keras.Model(i, L3.Dense(5)(x))
    m.save(f"{OUT}/k3_convnext_pre80.keras")


def tflite(model, shape, kind):
    conv = tf.lite.TFLiteConverter.from_keras_model(model)
    if kind != "float":
        conv.optimizations = [tf.lite.Optimize.DEFAULT]
    if kind == "float16":
        conv.target_spec.supported_types = [tf.float16]
    if kind in ("int8io", "uint8io", "floatio_int8", "int16x8"):
        x = calib(*shape)
        xs = feeds(model, x)
        xs = xs if isinstance(xs, list) else [xs]
        def rep():
            for k in range(len(x)):
                yield [a[k:k + 1] for a in xs]
        conv.representative_dataset = rep
        conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        if kind == "int16x8":
            conv.target_spec.supported_ops = [
                tf.lite.OpsSet.EXPERIMENTAL_TFLITE_BUILTINS_ACTIVATIONS_INT16_WEIGHTS_INT8]
        if kind == "int8io":
            conv.inference_input_type = conv.inference_output_type = tf.int8
        elif kind == "uint8io":
            conv.inference_input_type = conv.inference_output_type = tf.uint8
    return conv.convert()


def to_onnx(model, shape, opset, path):
    import tf2onnx
    if len(model.inputs) > 1:
        spec = tuple(tf.TensorSpec((1,) + shape, tf.float32, name=f"input{k}")
                     for k in range(len(model.inputs)))
        fn = tf.function(lambda *x: model(list(x), training=False))
        tf2onnx.convert.from_function(fn, input_signature=spec, opset=opset, output_path=path)
        return
    spec = (tf.TensorSpec((1,) + shape, tf.float32, name="input"),)
    fn = tf.function(lambda x: model(x, training=False))
    tf2onnx.convert.from_function(fn, input_signature=spec, opset=opset, output_path=path)


def keras3_models():
    """A LeakyReLU(0.1) YOLOv2-style detector and a hard-swish segmenter with squeeze-and-excite,
    Conv2DTranspose + BN and a bilinear upsampling, saved by Keras 3."""
    import keras
    L3 = keras.layers
    keras.utils.set_random_seed(3)

    def bn(x, act):
        x = L3.BatchNormalization()(x)
        return L3.LeakyReLU(negative_slope=0.1)(x) if act == "leaky" else L3.Activation(act)(x)
    i = keras.Input((224, 224, 3))
    x = i
    for c in [16, 32, 64, 128, 256]:
        x = L3.MaxPooling2D()(bn(L3.Conv2D(c, 3, padding="same", use_bias=False)(x), "leaky"))
    x = bn(L3.Conv2D(256, 3, padding="same", use_bias=False)(x), "leaky")
    m = keras.Model(i, L3.Conv2D(5 * 6, 1)(x))
    devcorpus.recalibrate_bn(m, 0, 1)
    m.save(f"{OUT}/k3_yolo2_224.keras")
    i = keras.Input((128, 128, 3))
    x = bn(L3.Conv2D(16, 3, 2, padding="same")(i), "hard_swish")
    s = L3.GlobalAveragePooling2D(keepdims=True)(x)
    s = L3.Conv2D(16, 1, activation="hard_sigmoid")(L3.Conv2D(4, 1, activation="relu")(s))
    x = L3.Multiply()([x, s])
    x = bn(L3.DepthwiseConv2D(3, 2, padding="same")(x), "hard_swish")
    x = bn(L3.Conv2D(32, 1)(x), "relu")
    x = bn(L3.Conv2DTranspose(16, 3, 2, padding="same")(x), "relu")
    x = L3.UpSampling2D(interpolation="bilinear")(x)
    m = keras.Model(i, L3.Conv2D(2, 1, activation="sigmoid")(x))
    devcorpus.recalibrate_bn(m, 0, 1)
    m.save(f"{OUT}/k3_seg_hswish128.keras")


os.makedirs(OUT, exist_ok=True)
if SET == "5":
    sys.path.insert(0, str(paths.checkout() / "bench"))
    from unseen_torchlike import FLOAT5, QUANT5, build as build5
    MODELS5 = {**FLOAT5, **QUANT5}   # round 49: float builders, then onnxruntime.quantization files
    build5(OUT, only & set(MODELS5))
    sys.exit(0)
if not only or "keras3" in only:
    {"2": keras3_models2, "3": keras3_models3, "4": keras3_models4}.get(SET, keras3_models)()
for name, (build, shape, formats) in {"2": MODELS2, "3": MODELS3, "4": MODELS4}.get(SET, MODELS).items():
    if only and name not in only:
        continue
    K2.utils.set_random_seed(sum(map(ord, name)))
    m = recal(build(), *shape)
    y = m.predict(feeds(m, calib(*shape)), verbose=0)
    ys = y if isinstance(y, list) else [y]
    print(name, m.count_params(), [f"{a.std():.3g}/{np.abs(a).max():.3g}" for a in ys], flush=True)
    for f in formats:
        p = f"{OUT}/{name}_{f}"
        if f == "h5":
            m.save(p + ".h5")
        elif f.startswith("onnx"):
            to_onnx(m, shape, int(f[4:]), p + ".onnx")
        else:
            data = tflite(m, shape, f)
            open(p + ".tflite", "wb").write(data)
        if shape[-1] != 3:
            np.save(p + ".npy", calib(*shape))

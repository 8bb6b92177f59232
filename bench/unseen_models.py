"""Round 43's never-seen models: 20 small architectures of the kinds K210 users bring, built with
seeded, BN-recalibrated weights and saved as a user's tools would save them (Keras 2 `.h5` via
tf_keras, float / full-int8 (int8, uint8 or float IO) / dynamic-range TFLite, tf2onnx ONNX at
opsets 13 and 17, two Keras 3 `.keras` files), for `bench/unseen.py` (docs/results.md says what
they found):

    python bench/unseen_models.py OUT [NAME ...]
    python bench/unseen.py OUT --runtime maixpy sdk --markdown

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

OUT = sys.argv[1] if len(sys.argv) > 1 else sys.exit(__doc__)
L = K2.layers
only = set(sys.argv[2:])


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
    return L.Activation(act)(x)


def recal(model, h, w, c):
    bns = [l for l in model._flatten_layers() if isinstance(l, L.BatchNormalization)]
    for b in bns:
        b.momentum = 0.0
    x = calib(h, w, c)
    if bns:
        model(x, training=True)
    return model


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


def tflite(model, shape, kind):
    conv = tf.lite.TFLiteConverter.from_keras_model(model)
    if kind != "float":
        conv.optimizations = [tf.lite.Optimize.DEFAULT]
    if kind in ("int8io", "uint8io", "floatio_int8"):
        x = calib(*shape)
        def rep():
            for k in range(len(x)):
                yield [x[k:k + 1]]
        conv.representative_dataset = rep
        conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        if kind == "int8io":
            conv.inference_input_type = conv.inference_output_type = tf.int8
        elif kind == "uint8io":
            conv.inference_input_type = conv.inference_output_type = tf.uint8
    return conv.convert()


def to_onnx(model, shape, opset, path):
    import tf2onnx
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
if not only or "keras3" in only:
    keras3_models()
for name, (build, shape, formats) in MODELS.items():
    if only and name not in only:
        continue
    K2.utils.set_random_seed(sum(map(ord, name)))
    m = recal(build(), *shape)
    y = m.predict(calib(*shape), verbose=0)
    ys = y if isinstance(y, list) else [y]
    print(name, m.count_params(), [f"{a.std():.3g}/{np.abs(a).max():.3g}" for a in ys], flush=True)
    for f in formats:
        p = f"{OUT}/{name}_{f}"
        if f == "h5":
            m.save(p + ".h5")
        elif f.startswith("onnx"):
            to_onnx(m, shape, int(f[4:]), p + ".onnx")
        else:
            open(p + ".tflite", "wb").write(tflite(m, shape, f))
        if shape[-1] != 3:
            np.save(p + ".npy", calib(*shape))

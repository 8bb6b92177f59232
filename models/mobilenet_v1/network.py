"""MobileNetV1 (alpha in {0.25, 0.5, 0.75, 1.0}, 224x224) in TensorLayer 2.x layers.

Built from DepthwiseConv2d + 1x1 Conv2d (TL's SeparableConv2d is broken on numpy >= 1.24).
Two ways to do stride 2:
  kpu_friendly=False  TF 'SAME' stride 2 (pads 0 before, 1 after), numerically identical to
                      keras.applications.MobileNet, so its ImageNet weights score as published;
  kpu_friendly=True   explicit ZeroPad2d((1,1),(1,1)) + VALID, symmetric: the KPU runs it with a
                      pick-pool (needs retraining/fine-tuning for full accuracy).
The head is GlobalMeanPool2d + Dense (the Keras 1x1 conv_preds on a 1x1 map) + optional softmax.
"""
from pathlib import Path

import numpy as np

from tl2k210.arrays import load_params

BLOCKS = [(64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2)] + [(512, 1)] * 5 + [(1024, 2), (1024, 1)]
ALPHAS = (0.25, 0.5, 0.75, 1.0)
EPS = 1e-3  # keras.applications BatchNormalization epsilon (TensorLayer defaults to 1e-5)


def mobilenet_v1(alpha=0.25, kpu_friendly=False, size=224, classes=1000, softmax=True, name=None):
    import tensorflow as tf
    import tensorlayer as tl
    from tensorlayer.layers import (BatchNorm, Conv2d, Dense, DepthwiseConv2d, GlobalMeanPool2d, Input,
                                    ZeroPad2d)
    if alpha not in ALPHAS:
        raise ValueError(f"alpha must be one of {ALPHAS}")

    def strided(n, layer_fn, stride):
        if stride == 2 and kpu_friendly:
            return layer_fn("VALID")(ZeroPad2d(((1, 1), (1, 1)))(n))
        return layer_fn("SAME")(n)

    relu6 = tf.nn.relu6
    x = Input([1, size, size, 3], name="input")
    n = strided(x, lambda p: Conv2d(int(32 * alpha), (3, 3), (2, 2), padding=p, b_init=None, name="conv1"), 2)
    n = BatchNorm(epsilon=EPS, act=relu6, name="conv1_bn")(n)
    for i, (filters, s) in enumerate(BLOCKS, 1):
        n = strided(n, lambda p: DepthwiseConv2d((3, 3), (s, s), padding=p, b_init=None, name=f"conv_dw_{i}"), s)
        n = BatchNorm(epsilon=EPS, act=relu6, name=f"conv_dw_{i}_bn")(n)
        n = Conv2d(int(filters * alpha), (1, 1), (1, 1), padding="SAME", b_init=None, name=f"conv_pw_{i}")(n)
        n = BatchNorm(epsilon=EPS, act=relu6, name=f"conv_pw_{i}_bn")(n)
    n = GlobalMeanPool2d(name="global_pool")(n)
    n = Dense(classes, act=tf.nn.softmax if softmax else None, name="preds")(n)
    return tl.models.Model(inputs=x, outputs=n, name=name or _unique_name(f"mobilenet_v1_{alpha}"))


def _unique_name(base):
    """TensorLayer refuses a second model with the same name in one process."""
    from tensorlayer.models import core
    name, k = base, 1
    while name in core._global_model_name_set:
        k += 1
        name = f"{base}_{k}"
    return name


def load_keras_order_npz(model, path):
    """Load the Maix-EMC npz (MANIFEST: one key `params`, arrays in layer order, BatchNorm vectors
    in Keras order gamma, beta, mean, variance; head = 1x1 conv kernel + bias) into `model`."""
    from tensorlayer.layers import BatchNorm, Conv2d, Dense, DepthwiseConv2d
    params = load_params(Path(path))
    it = iter(params)

    def put(var, value):
        value = np.asarray(value, np.float32)
        if value.size != int(np.prod(var.shape)):
            raise ValueError(f"{path}: array of shape {value.shape} does not fit {var.name} {tuple(var.shape)} "
                             "(wrong alpha or layer order?)")
        var.assign(value.reshape(tuple(var.shape)))

    for layer in model.all_layers:
        if isinstance(layer, BatchNorm):
            ws = {w.name.split("/")[-1].split(":")[0]: w for w in layer.all_weights}
            for key in ("gamma", "beta", "moving_mean", "moving_var"):
                put(ws[key], next(it))
        elif isinstance(layer, (Conv2d, DepthwiseConv2d, Dense)):
            for w in layer.all_weights:  # W then b
                put(w, next(it))
    left = sum(1 for _ in it)
    if left:
        raise ValueError(f"{path}: {left} arrays left over after filling the network (wrong alpha?)")
    return model

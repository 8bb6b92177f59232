"""The developer corpus: architectures K210 users bring, built offline and seeded (nothing is
downloaded; keras.applications with weights=None, hand-written Keras nets after the published
designs, the ONNX model zoo's architectures from the onnx wheel with seeded weights).

Each entry: name -> (builder, input (H, W, C), convert options, what it proves). Builders return a
Keras model or an onnx.ModelProto. Used by tests/test_devcorpus.py and bench/corpus.py.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np


def _keras():
    import keras
    return keras


def _seed(seed=0):
    _keras().utils.set_random_seed(seed)


PHOTOS = ["astronaut", "coffee", "chelsea", "rocket", "camera", "brick", "grass", "gravel",
          "immunohistochemistry", "retina", "hubble_deep_field", "coins"]


def save(name: str, model, folder: Path) -> Path:
    """Write a built entry as `convert` reads it: NAME.keras for a Keras model, NAME.onnx for an
    onnx.ModelProto (spaces in NAME become underscores)."""
    stem = Path(folder) / name.replace(" ", "_")
    if hasattr(model, "save"):
        model.save(stem.with_suffix(".keras"))
        return stem.with_suffix(".keras")
    import onnx
    onnx.save(model, stem.with_suffix(".onnx"))
    return stem.with_suffix(".onnx")


def photo_folder(d: Path) -> Path:
    """The 12 scikit-image photos saved as RGB PNGs in folder `d` (a calibration --dataset)."""
    from PIL import Image
    from skimage import data
    for n in PHOTOS:
        Image.fromarray(getattr(data, n)()).convert("RGB").save(d / f"{n}.png")
    return d


def photos(h, w, c=3, lo=-1.0, hi=1.0):
    """The 12 scikit-image photos (calibration's), resized, as an (N, H, W, C) float batch."""
    from PIL import Image
    from skimage import data
    out = []
    for n in PHOTOS:
        img = Image.fromarray(getattr(data, n)()).convert("L" if c == 1 else "RGB").resize((w, h), Image.BILINEAR)
        a = np.asarray(img, np.float32)
        out.append(a[..., None] if c == 1 else a)
    return np.stack(out) / 255 * (hi - lo) + lo


def recalibrate_bn(model, lo=-1.0, hi=1.0):
    """Batch-norm statistics estimated on the photos (one training-mode pass, momentum 0): a
    seeded network whose activations keep a trained network's O(1) scale. With Keras' default
    BN statistics (mean 0, variance 1: the identity) a random 52-layer MobileNetV2's features
    shrink to ~1e-11 -- a float model no quantizer, and no trained network, has."""
    import keras
    bns = [layer for layer in model._flatten_layers() if isinstance(layer, keras.layers.BatchNormalization)]
    if not bns:
        return model
    for b in bns:
        b.momentum = 0.0
    shape = model.inputs[0].shape
    x = photos(shape[1], shape[2], shape[3], lo, hi)
    model(x, training=True)
    return model


# ----------------------------------------------------------------------------------- keras.applications
def mobilenet_v2(alpha, size):
    def build():
        _seed()
        return recalibrate_bn(_keras().applications.MobileNetV2((size, size, 3), alpha=alpha, weights=None,
                                                                classifier_activation=None))
    return build


def mobilenet_v3_small(minimalistic):
    def build():
        _seed()
        return recalibrate_bn(_keras().applications.MobileNetV3Small(
            (224, 224, 3), weights=None, minimalistic=minimalistic, classifier_activation=None,
            include_preprocessing=True), 0, 255)
    return build


def efficientnet_b0(size=224, classes=1000):
    """EfficientNetB0 (Swish, squeeze-and-excite, 5x5 depthwise; 1152-channel stages). With its
    1000-class head the 5,236,192 kernel weights alone leave 6,688 B of the 'sdk' firmware's
    5 MiB: a 10-class head at 128x128 (3,968,992 weights) is what a K210 holds."""
    def build():
        _seed()
        return recalibrate_bn(_keras().applications.EfficientNetB0(
            input_shape=(size, size, 3), weights=None, classes=classes, classifier_activation=None), 0, 255)
    return build


def nasnet_mobile():
    _seed()
    return recalibrate_bn(_keras().applications.NASNetMobile((224, 224, 3), weights=None,
                                                             classifier_activation=None))


# ----------------------------------------------------------------------------------- hand-written nets
def _bn_act(x, act):
    L = _keras().layers
    x = L.BatchNormalization()(x)
    if act == "leaky":
        return L.LeakyReLU(0.1)(x)
    if act == "prelu":
        return L.PReLU(shared_axes=[1, 2])(x)
    return L.ReLU()(x)


def tiny_yolo_v3(width=1.0):
    """Darknet tiny-YOLOv3 at 224x224 (K210-sized): 3x3 conv + BN + LeakyReLU, max pools (the last
    one stride 1 'same'), two heads at 7x7 and 14x14, the second fed by a nearest 2x upsample
    concatenated with the 14x14 route (3 anchors x (5 + 20 classes) per cell). `width` scales
    every conv but the heads (1.0: Darknet's 8.7 M weights, more than any K210 firmware holds;
    0.5: 2.2 M)."""
    def f(n):
        return max(8, int(n * width))

    def build():
        _seed()
        keras = _keras()
        L = keras.layers
        i = keras.Input((224, 224, 3))
        x = i
        route = None
        for k, c in enumerate((16, 32, 64, 128, 256)):
            x = _bn_act(L.Conv2D(f(c), 3, padding="same", use_bias=False)(x), "leaky")
            if k == 4:
                route = x                                   # 14x14x256
            x = L.MaxPooling2D(2)(x)
        x = _bn_act(L.Conv2D(f(512), 3, padding="same", use_bias=False)(x), "leaky")
        x = L.MaxPooling2D(2, strides=1, padding="same")(x)
        x = _bn_act(L.Conv2D(f(1024), 3, padding="same", use_bias=False)(x), "leaky")
        x = _bn_act(L.Conv2D(f(256), 1, use_bias=False)(x), "leaky")
        h1 = _bn_act(L.Conv2D(f(512), 3, padding="same", use_bias=False)(x), "leaky")
        h1 = L.Conv2D(75, 1, name="yolo_7x7")(h1)
        y = _bn_act(L.Conv2D(f(128), 1, use_bias=False)(x), "leaky")
        y = L.Concatenate()([L.UpSampling2D(2)(y), route])
        h2 = _bn_act(L.Conv2D(f(256), 3, padding="same", use_bias=False)(y), "leaky")
        h2 = L.Conv2D(75, 1, name="yolo_14x14")(h2)
        return recalibrate_bn(keras.Model(i, [h1, h2], name="tiny_yolo_v3"), 0, 1)
    return build


def mobilefacenet():
    """MobileFaceNet (Chen et al. 2018) at 112x112, narrowed: PReLU after every expansion and
    depthwise conv, inverted residuals, the 7x7 global depthwise conv (GDConv) and a linear
    128-d embedding."""
    _seed()
    keras = _keras()
    L = keras.layers
    i = keras.Input((112, 112, 3))
    x = _bn_act(L.Conv2D(32, 3, strides=2, padding="same", use_bias=False)(i), "prelu")
    x = _bn_act(L.DepthwiseConv2D(3, padding="same", use_bias=False)(x), "prelu")
    for t, c, n, s in ((2, 32, 2, 2), (4, 64, 2, 2), (2, 64, 2, 1), (4, 64, 1, 2), (2, 64, 2, 1)):
        for k in range(n):
            y = _bn_act(L.Conv2D(x.shape[-1] * t, 1, use_bias=False)(x), "prelu")
            y = _bn_act(L.DepthwiseConv2D(3, strides=s if k == 0 else 1, padding="same", use_bias=False)(y), "prelu")
            y = L.BatchNormalization()(L.Conv2D(c, 1, use_bias=False)(y))
            x = L.Add()([x, y]) if k and x.shape[-1] == c else y
    x = _bn_act(L.Conv2D(256, 1, use_bias=False)(x), "prelu")
    x = L.BatchNormalization()(L.DepthwiseConv2D(7, use_bias=False, name="gdconv")(x))
    x = L.BatchNormalization()(L.Conv2D(128, 1, use_bias=False)(x))
    return recalibrate_bn(keras.Model(i, L.Flatten(name="embedding")(x), name="mobilefacenet"))


def blazeface():
    """BlazeFace-style front model (Bazarevsky et al. 2019) at 128x128: 5x5 depthwise convs in
    single and double BlazeBlocks, stride-2 blocks with a max-pooled shortcut, two heads (16x16 and
    8x8) of classifiers and box regressors."""
    _seed()
    keras = _keras()
    L = keras.layers

    def block(x, c, stride=1, double=False):
        y = L.DepthwiseConv2D(5, strides=stride, padding="same")(x)
        y = L.Conv2D(c // 2 if double else c, 1)(y)
        if double:
            y = L.DepthwiseConv2D(5, padding="same")(L.ReLU()(y))
            y = L.Conv2D(c, 1)(y)
        sc = L.MaxPooling2D(2)(x) if stride == 2 else x
        if sc.shape[-1] != c:
            sc = L.Conv2D(c, 1)(sc)
        return L.ReLU()(L.Add()([y, sc]))
    i = keras.Input((128, 128, 3))
    x = L.ReLU()(L.Conv2D(24, 5, strides=2, padding="same")(i))
    x = block(x, 24)
    x = block(x, 28)
    x = block(x, 32, 2)
    x = block(x, 36)
    x = block(x, 42)
    x = block(x, 48, 2, double=True)
    x16 = block(x, 48, double=True)
    x = block(x16, 96, 2, double=True)
    x8 = block(x, 96, double=True)
    outs = [L.Conv2D(2, 1, name="cls16")(x16), L.Conv2D(32, 1, name="box16")(x16),
            L.Conv2D(6, 1, name="cls8")(x8), L.Conv2D(96, 1, name="box8")(x8)]
    return keras.Model(i, outs, name="blazeface")


def ulffd_slim():
    """Ultra-Light-Fast face detector, version-slim (Linzaer 2019) at 320x240, NHWC: conv_bn /
    conv_dw blocks padded 1 on every side like the PyTorch original, four detection scales (40x30,
    20x15, 10x8, 5x4) each with a score head (a 2-class softmax where it has one anchor) and a box
    head."""
    _seed()
    keras = _keras()
    L = keras.layers
    b = 16

    def pad(x, s):   # the PyTorch original pads 1 on every side (TF 'same' would pad 0/1 at stride 2)
        return L.ZeroPadding2D(1)(x)

    def conv_bn(x, c, s):
        return L.ReLU()(L.BatchNormalization()(L.Conv2D(c, 3, strides=s, use_bias=False)(pad(x, s))))

    def conv_dw(x, c, s):
        x = L.ReLU()(L.BatchNormalization()(L.DepthwiseConv2D(3, strides=s, use_bias=False)(pad(x, s))))
        return L.ReLU()(L.BatchNormalization()(L.Conv2D(c, 1, use_bias=False)(x)))

    def head(x, anchors, name):
        s = L.ReLU()(L.DepthwiseConv2D(3, padding="same")(x))
        score = L.Softmax(axis=-1, name=f"{name}_scores")(L.Conv2D(anchors * 2, 1)(s)) if anchors == 1 else \
            L.Conv2D(anchors * 2, 1, name=f"{name}_logits")(s)
        box = L.Conv2D(anchors * 4, 1, name=f"{name}_boxes")(s)
        return [score, box]
    i = keras.Input((240, 320, 3), batch_size=1)
    x = conv_bn(i, b, 2)
    for c, s in ((b * 2, 1), (b * 2, 2), (b * 2, 1), (b * 4, 2), (b * 4, 1), (b * 4, 1)):
        x = conv_dw(x, c, s)
    outs = head(x, 1, "s40")
    for c, s in ((b * 8, 2), (b * 8, 1), (b * 8, 1)):
        x = conv_dw(x, c, s)
    outs += head(x, 2, "s20")
    for c, s in ((b * 16, 2), (b * 16, 1)):
        x = conv_dw(x, c, s)
    outs += head(x, 2, "s10")
    x = L.ReLU()(L.Conv2D(b * 16, 3, strides=2)(pad(L.ReLU()(L.Conv2D(b * 4, 1)(x)), 2)))
    outs += head(x, 3, "s5")
    return recalibrate_bn(keras.Model(i, outs, name="ulffd_slim"))


# ----------------------------------------------------------------------------------- ONNX model zoo
ZOO = ("squeezenet", "shufflenet", "bvlc_alexnet", "densenet121", "inception_v1", "inception_v2",
       "resnet50", "vgg19", "zfnet512")


def zoo_path(name):
    import onnx
    return Path(onnx.__file__).parent / "backend" / "test" / "data" / "light" / f"light_{name}.onnx"


def zoo_seeded(name, seed=0):
    """The zoo file with its constant weights (ConstantOfShape fills of 0.02: every channel the same)
    replaced by seeded He-normal ones, so the quantization error is measured on a network whose
    channels differ. Batch-norm statistics and biases stay the file's."""
    import onnx
    from onnx import numpy_helper
    m = onnx.load(str(zoo_path(name)))
    shapes = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
    rng = np.random.default_rng(seed)
    keep = []
    for n in m.graph.node:
        if n.op_type == "ConstantOfShape" and n.input[0] in shapes and len(shapes[n.input[0]]) >= 2:
            shape = [int(v) for v in shapes[n.input[0]]]
            fan_in = int(np.prod(shape[1:]))
            w = (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)
            m.graph.initializer.append(numpy_helper.from_array(w, n.output[0]))
        else:
            keep.append(n)
    del m.graph.node[:]
    m.graph.node.extend(keep)
    return m


def ideal_sqnr(graph, calib, photos, input_range=None, limit=100):
    """Output SQNR on `photos` of the float IR graph with ideal 8-bit quantization simulated
    (tl2k210.quantize.fake_quant, ranges calibrated on `calib` by minmax): what per-tensor uint8
    activations and 8-bit per-channel weights cost this network before any KPU mapping."""
    from tl2k210.compiler import ConvertOptions, model_inputs
    from tl2k210.quantize import calibrate
    from tl2k210.quantize.fake_quant import fake_quant_graph
    from tl2k210.quantize.metrics import sqnr_db
    opts = ConvertOptions(input_range=input_range)
    cal, _ = model_inputs(graph, str(calib), limit, opts)
    ev, _ = model_inputs(graph, str(photos), limit, opts)
    rng = calibrate.ranges(calibrate.collect(graph, [c[None] for c in cal], histograms=False), "minmax")
    fr = calibrate.FloatRunner(graph, False)
    qr = calibrate.FloatRunner(fake_quant_graph(graph, rng), False)
    ref, got = [fr(x[None]) for x in ev], [qr(x[None]) for x in ev]
    return min(sqnr_db(np.stack([r[o] for r in ref]), np.stack([q[o] for q in got])) for o in graph.outputs)


@dataclass
class Entry:
    build: object                 # () -> Keras model | onnx.ModelProto
    size: tuple                   # (H, W) of the input
    about: str
    options: dict = field(default_factory=dict)   # ConvertOptions overrides
    logits: bool = True           # output is a class vector (top-1 agreement)


def entries():
    e = {
        "MobileNetV2 a0.35 224": Entry(mobilenet_v2(0.35, 224), (224, 224), "keras.applications, weights=None",
                                       {"input_range": (-1, 1), "runtime": "maixpy-minimum"}),
        "MobileNetV2 a0.35 160": Entry(mobilenet_v2(0.35, 160), (160, 160), "keras.applications, weights=None",
                                       {"input_range": (-1, 1), "runtime": "maixpy-minimum"}),
        "MobileNetV2 a0.5 224": Entry(mobilenet_v2(0.5, 224), (224, 224), "keras.applications, weights=None",
                                      {"input_range": (-1, 1), "runtime": "maixpy-minimum"}),
        "MobileNetV2 a0.5 160": Entry(mobilenet_v2(0.5, 160), (160, 160), "keras.applications, weights=None",
                                      {"input_range": (-1, 1), "runtime": "maixpy-minimum"}),
        "MobileNetV3Small": Entry(mobilenet_v3_small(False), (224, 224), "keras.applications, hard-swish, SE",
                                  {"input_range": (0, 255), "runtime": "sdk"}),
        "MobileNetV3Small minimalistic": Entry(mobilenet_v3_small(True), (224, 224),
                                               "keras.applications, ReLU, no SE",
                                               {"input_range": (0, 255), "runtime": "maixpy-minimum"}),
        "EfficientNetB0": Entry(efficientnet_b0(), (224, 224), "keras.applications (5.3 M weights)",
                                {"input_range": (0, 255), "runtime": "sdk"}),
        "EfficientNetB0 128 10-class": Entry(efficientnet_b0(128, 10), (128, 128),
                                             "keras.applications, 10-class head (4.0 M weights)",
                                             {"input_range": (0, 255), "runtime": "sdk"}),
        "NASNetMobile": Entry(nasnet_mobile, (224, 224), "keras.applications (5.3 M weights)",
                              {"input_range": (-1, 1), "runtime": "maixpy-minimum"}),
        "tiny-YOLOv3": Entry(tiny_yolo_v3(), (224, 224), "two heads, upsample, concat (8.7 M weights)",
                             {"runtime": "sdk"}, logits=False),
        "tiny-YOLOv3 x0.5": Entry(tiny_yolo_v3(0.5), (224, 224), "half width (2.2 M weights)",
                                  {"runtime": "maixpy-minimum"}, logits=False),
        "MobileFaceNet": Entry(mobilefacenet, (112, 112), "PReLU, GDConv 7x7", {"input_range": (-1, 1)},
                               logits=False),
        "BlazeFace": Entry(blazeface, (128, 128), "5x5 depthwise, BlazeBlocks", {"input_range": (-1, 1)},
                           logits=False),
        "ULFFD slim 320x240": Entry(ulffd_slim, (240, 320), "NHWC 320x240, softmax score heads",
                                    {"input_range": (-1, 1)}, logits=False),
    }
    for z in ZOO:
        e[f"onnx zoo {z}"] = Entry((lambda z=z: zoo_seeded(z)), (224, 224), "onnx wheel light zoo, seeded weights",
                                   {"runtime": "sdk"})
    return e

"""TensorLayer `Model.save(path, save_weights=True)` .h5 files converted with no --network (issue 28).

The files are written by the installed TensorLayer (2.2 layout), and rewritten the way TensorLayer
2.1 wrote them (literal model_config with bare `tf.float32` and functions as cloudpickles by
reference, fixed-length bytes attributes as h5py 2 stored them). Each kmodel is run on the emulator
and checked against the TensorLayer model's own float output on photos."""
import functools
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from devcorpus import photo_folder, photos
from front_helpers import ort_run, tf
from tl2k210.compiler import ConvertOptions, convert
from tl2k210.errors import ModelLoadError
from tl2k210.frontends import load_model
from tl2k210.frontends.tl_config import read_config
from tl2k210.k210.emulator import Emulator
from tl2k210.quantize.metrics import sqnr_db


def _tl():
    tf()
    import tensorlayer as tl

    from tl2k210.frontends.tensorlayer import fast_layer_init
    fast_layer_init()
    return tl


def _seeded(model, x, seed=0):
    """He-initialised weights, BatchNorm statistics from the photos `x` (one training pass with
    decay 0), so that activations have a trained network's scale."""
    from tensorlayer.layers import BatchNorm
    rng = np.random.default_rng(seed)
    for w in model.all_weights:
        fan_in = int(np.prod(w.shape[:-1])) if len(w.shape) > 1 else 1
        w.assign((rng.standard_normal(w.shape) * np.sqrt(2 / fan_in) if len(w.shape) > 1 else
                  rng.uniform(0.8, 1.2, w.shape) if "gamma" in w.name or "var" in w.name else
                  rng.uniform(-0.1, 0.1, w.shape)).astype(np.float32))
    bns = [layer for layer in model.all_layers if isinstance(layer, BatchNorm)]
    for b in bns:
        b.decay = 0.0
    model.train()
    model(x)
    for b in bns:
        b.decay = 0.99
    model.eval()
    return model


@functools.lru_cache(maxsize=None)
def cifar_cnn():
    """The issue's CIFAR-10 CNN (Conv2d, BatchNorm, MaxPool2d, Flatten, Dense), the blocks of
    TensorLayer 2's CIFAR-10 example (conv without bias, BatchNorm + ReLU, pool) on 32x32 images."""
    tl = _tl()
    from tensorlayer.layers import BatchNorm, Conv2d, Dense, Flatten, Input, MaxPool2d
    relu = tf().nn.relu
    x = Input([None, 32, 32, 3], name="input")
    n = x
    for i, c in enumerate((32, 64), 1):
        n = Conv2d(c, (3, 3), (1, 1), padding="SAME", b_init=None, name=f"conv{i}")(n)
        n = BatchNorm(decay=0.99, act=relu, name=f"bn{i}")(n)
        n = MaxPool2d((2, 2), (2, 2), padding="SAME", name=f"pool{i}")(n)
    n = Flatten(name="flatten")(n)
    n = Dense(64, act=relu, name="dense1relu")(n)
    n = Dense(10, name="output")(n)
    return _seeded(tl.models.Model(x, n, name="cifar_cnn"), photos(32, 32, lo=0.0, hi=1.0))


def as_tl21(src, dst):
    """`src` (a TensorLayer 2.2 Model.save file) rewritten as TensorLayer 2.1 wrote it: dtypes bare
    (`'dtype': tf.float32`), functions as ('is_Func', base64 cloudpickle) -- TL 2.1's func2str --
    and every text attribute as fixed-length bytes (h5py 2)."""
    import h5py
    from tensorlayer.files.utils import func2str
    t = tf()
    fns = {"relu": t.nn.relu, "relu6": t.nn.relu6, "sigmoid": t.nn.sigmoid, "softmax": t.nn.softmax, "add": t.add}
    with h5py.File(src, "r") as f:
        cfg = read_config(f.attrs["model_config"])
    for layer in cfg["model_architecture"]:
        a = layer["args"]
        if "dtype" in a:
            a["dtype"] = t.float32                    # str() writes it bare: tf.float32
        for k in ("act", "combine_fn"):
            if k in a:      # read_config made it (name, leaky slope); TL 2.1 had no 'lrelu0.2'
                name, alpha = a[k]
                a[k] = ("is_Func", func2str(fns[name])) if alpha is None else f"lrelu{alpha}"
    shutil.copy(src, dst)
    with h5py.File(dst, "r+") as f:
        f.attrs["model_config"] = np.bytes_(str(cfg).encode("utf8"))
        f.attrs["layer_names"] = np.array([n.encode() for n in f.attrs["layer_names"]], "S")

        def fix(_, g):
            if isinstance(g, h5py.Group) and "weight_names" in g.attrs and len(g.attrs["weight_names"]):
                g.attrs["weight_names"] = np.array([n.encode() for n in g.attrs["weight_names"]], "S")
        f.visititems(fix)
    return str(cfg)


@pytest.fixture(scope="module")
def calib(tmp_path_factory):
    return photo_folder(tmp_path_factory.mktemp("photos"))


def kmodel_vs_tensorlayer(path, model, calib, tmp_path, hw):
    """(SQNR dB, top-1 agreement) of the kmodel converted from `path` against `model` on the photos."""
    k = tmp_path / (path.stem + ".kmodel")
    convert(path, k, ConvertOptions(dataset=calib, progress=False))
    x = photos(*hw, lo=0.0, hi=1.0)
    ref = model(x).numpy().reshape(len(x), -1)
    emu = Emulator.load(k)
    px = np.round(x * 255).astype(np.uint8).transpose(0, 3, 1, 2)
    got = np.stack([emu.run(p)[0].reshape(-1) for p in px])
    return sqnr_db(ref.astype(np.float64), got.astype(np.float64)), np.mean(ref.argmax(1) == got.argmax(1)), k


def test_cifar_cnn_model_save_both_layouts(calib, tmp_path):
    m = cifar_cnn()
    m.save(str(tmp_path / "cnn.h5"), save_weights=True)
    text = as_tl21(tmp_path / "cnn.h5", tmp_path / "cnn21.h5")
    assert "'dtype': tf.float32" in text and "('is_Func', 'gA" in text        # TL 2.1's literal
    with pytest.raises(ValueError):
        json.loads(text)                                     # not JSON: the JSONDecodeError
    q22, top22, k22 = kmodel_vs_tensorlayer(tmp_path / "cnn.h5", m, calib, tmp_path, (32, 32))
    q21, top21, k21 = kmodel_vs_tensorlayer(tmp_path / "cnn21.h5", m, calib, tmp_path, (32, 32))
    assert q22 >= 30 and top22 == 1.0, (q22, top22)
    assert k21.read_bytes() == k22.read_bytes()            # both layouts: the same network
    # the rebuilt float network is the TensorLayer model, exactly
    x = photos(32, 32, lo=0.0, hi=1.0)[:3]
    onnx_out = np.concatenate([ort_run(load_model(tmp_path / "cnn21.h5"), xi[None])[0] for xi in x])
    np.testing.assert_allclose(onnx_out, m(x).numpy(), rtol=1e-4, atol=1e-4)


def many_layers():
    """The other layers TensorLayer saves (one shared by two calls, a list input, two outputs)."""
    tl = _tl()
    t = tf()
    from tensorlayer.layers import (BatchNorm, Concat, Conv2d, Dense, DepthwiseConv2d, Dropout, Elementwise,
                                    Flatten, GlobalMeanPool2d, Input, MaxPool2d, MeanPool2d, PRelu, Reshape,
                                    UpSampling2d, ZeroPad2d)
    x = Input([1, 16, 16, 3], name="in")
    a = Conv2d(8, (3, 3), act="lrelu0.2", name="c1")(x)
    d = ZeroPad2d(((1, 1), (1, 1)), name="zp")(a)
    d = DepthwiseConv2d((3, 3), (2, 2), padding="VALID", depth_multiplier=2, b_init=None, name="dw")(d)
    d = BatchNorm(act=t.nn.relu6, name="bn")(d)
    shared = Conv2d(16, (1, 1), act=t.nn.sigmoid, name="reused")
    e = Elementwise(t.add, act=t.nn.relu, name="add")([shared(d), d])
    b = shared(MeanPool2d((3, 3), (1, 1), padding="SAME", name="mean")(d))
    n = Concat(-1, name="cat")([e, b])
    n = UpSampling2d((2, 2), method="nearest", name="up")(n)
    n = MaxPool2d((2, 2), (2, 2), name="max")(n)
    n = Dropout(0.5, name="drop")(PRelu(in_channels=32, name="prelu")(n))
    g = GlobalMeanPool2d(name="gap")(n)
    out = Dense(5, act=t.nn.softmax, name="fc")(Flatten(name="flat")(Reshape([1, 4, 8], name="rs")(g)))
    return _seeded(tl.models.Model(x, [out, g], name="many_layers"), photos(16, 16, lo=0.0, hi=1.0)[:1])


def test_every_layer_rebuilt_exactly(tmp_path):
    m = many_layers()
    m.save(str(tmp_path / "many.h5"), save_weights=True)
    as_tl21(tmp_path / "many.h5", tmp_path / "many21.h5")
    x = photos(16, 16, lo=0.0, hi=1.0)[3:4]
    ref = [r.numpy() for r in m(x)]
    for f in ("many.h5", "many21.h5"):
        got = ort_run(load_model(tmp_path / f), x)
        for r, g in zip(ref, got):
            np.testing.assert_allclose(g.reshape(r.shape), r, rtol=1e-5, atol=1e-6)


def test_separable_conv2d_as_tensorlayer_21_saved_it(tmp_path):
    """SeparableConv2d (the installed TensorLayer cannot build it on numpy >= 1.24): a file with one,
    laid out as TensorLayer 2.1 saved it (a Keras SeparableConv2D inside: depthwise_kernel,
    pointwise_kernel, bias), equals tf.nn.separable_conv2d."""
    import h5py
    tl = _tl()
    t = tf()
    from tensorlayer.layers import Conv2d, Input
    x = Input([1, 16, 16, 3], name="in")
    m = _seeded(tl.models.Model(x, Conv2d(8, (3, 3), name="c1")(x), name="sep_base"), photos(16, 16)[:1])
    m.save(str(tmp_path / "sep.h5"), save_weights=True)
    rng = np.random.default_rng(1)
    dk, pk, bias = (rng.standard_normal(s).astype(np.float32) * 0.3 for s in ((3, 3, 8, 2), (1, 1, 16, 6), (6,)))
    with h5py.File(tmp_path / "sep.h5", "r+") as f:
        cfg = read_config(f.attrs["model_config"])
        cfg["model_architecture"].append({"class": "SeparableConv2d", "args": {
            "n_filter": 6, "filter_size": (3, 3), "strides": (2, 2), "act": "relu", "padding": "same",
            "data_format": "channels_last", "dilation_rate": (1, 1), "depth_multiplier": 2, "name": "sep",
            "layer_type": "normal"}, "prev_layer": ["c1_node_0"]})
        cfg["outputs"] = "sep_node_0"
        cfg["model_architecture"][2]["args"]["act"] = "relu"
        f.attrs["model_config"] = str(cfg)
        f.attrs["layer_names"] = list(f.attrs["layer_names"]) + ["sep"]
        g = f.create_group("sep")
        g.attrs["weight_names"] = ["sep/depthwise_kernel:0", "sep/pointwise_kernel:0", "sep/bias:0"]
        for n, a in zip(g.attrs["weight_names"], (dk, pk, bias)):
            g[n] = a
    xs = photos(16, 16, lo=0.0, hi=1.0)[5:6]
    ref = t.nn.relu(t.nn.separable_conv2d(m(xs), dk, pk, (1, 2, 2, 1), "SAME") + bias).numpy()
    np.testing.assert_allclose(ort_run(load_model(tmp_path / "sep.h5"), xs)[0], ref, rtol=1e-5, atol=1e-5)


def test_local_response_norm_rebuilt_and_converted(tmp_path, calib):
    """TensorLayer's LocalResponseNorm (tf.nn.local_response_normalization) reads back as ONNX
    LRN and converts (passes/decompose.py lrn): the kmodel against the float model."""
    tl = _tl()
    from tensorlayer.layers import Conv2d, Input, LocalResponseNorm

    from tl2k210.compare import compare
    x = Input([1, 16, 16, 3], name="in")
    n = LocalResponseNorm(depth_radius=2, bias=1.0, alpha=1e-3, beta=0.75, name="lrn")(Conv2d(8, name="c")(x))
    m = _seeded(tl.models.Model(x, n, name="lrn_net"), photos(16, 16)[:1])
    m.save(str(tmp_path / "lrn.h5"), save_weights=True)
    xs = photos(16, 16, lo=0.0, hi=1.0)[:1]
    np.testing.assert_allclose(ort_run(load_model(tmp_path / "lrn.h5"), xs)[0], m(xs).numpy(), rtol=1e-5, atol=1e-6)
    convert(tmp_path / "lrn.h5", tmp_path / "lrn.kmodel", ConvertOptions(dataset=calib, progress=False))
    rep = compare(str(tmp_path / "lrn.h5"), str(tmp_path / "lrn.kmodel"), calib, limit=8)
    assert min(o["sqnr_db"] for o in rep["outputs"].values()) > 30


def test_partial_and_damaged_weight_groups(tmp_path):
    import h5py
    m = cifar_cnn()
    m.save(str(tmp_path / "a.h5"), save_weights=True)
    shutil.copy(tmp_path / "a.h5", tmp_path / "b.h5")

    def drop(path, layer, weight):
        with h5py.File(path, "r+") as f:
            del f[layer][layer][f"{weight}:0"]
            f[layer].attrs["weight_names"] = [n for n in f[layer].attrs["weight_names"] if weight not in n]
    drop(tmp_path / "a.h5", "bn1", "beta")      # BatchNorm(beta_init=None): no offset
    bn1 = next(layer for layer in m.all_layers if layer.name == "bn1")
    beta = next(w for w in bn1.all_weights if "beta" in w.name)
    keep = beta.numpy()
    x = photos(32, 32, lo=0.0, hi=1.0)[:2]
    try:
        beta.assign(np.zeros_like(keep))
        ref = m(x).numpy()
    finally:
        beta.assign(keep)
    got = np.concatenate([ort_run(load_model(tmp_path / "a.h5"), xi[None])[0] for xi in x])
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
    drop(tmp_path / "b.h5", "bn2", "moving_var")
    with pytest.raises(ModelLoadError, match=r"model_architecture\[5\] \(layer 'bn2', BatchNorm\): its weight "
                       r"group holds 3 arrays .*the layer has 4 weights"):
        load_model(tmp_path / "b.h5")
    m.save(str(tmp_path / "c.h5"), save_weights=False)
    with pytest.raises(ModelLoadError, match="save_weights=True"):
        load_model(tmp_path / "c.h5")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["face_detect", "face_recognition", "mobilenet_v1", "style_transfer"])
def test_zoo_network_saved_by_tensorlayer_converts_to_the_recipes_kmodel(name, zoo_build, tmp_path):
    """models/NAME through Model.save and back: the same kmodel bytes as `tl2k210 zoo build NAME`."""
    from tl2k210 import zoo
    from tl2k210.errors import Tl2k210Error
    r = zoo.get(name)
    try:
        net = zoo.build_network(r)
    except Tl2k210Error as e:
        pytest.skip(str(e))
    net.save(str(tmp_path / f"{name}.h5"), save_weights=True)
    (tmp_path / "calib").mkdir()
    convert(tmp_path / f"{name}.h5", tmp_path / "h5.kmodel", zoo.convert_options(r, tmp_path / "calib", progress=False))
    assert (tmp_path / "h5.kmodel").read_bytes() == Path(zoo_build(name)["kmodel"]).read_bytes()

"""TensorLayer `Model.save(path, save_weights=True)` .h5 files converted with no --network (issue 28).

The files are written by the installed TensorLayer (2.2 layout), and rewritten the way TensorLayer
2.1 wrote them (literal model_config with bare `tf.float32` and functions as cloudpickles by
reference, fixed-length bytes attributes as h5py 2 stored them). Each kmodel is run on the emulator
and checked against the TensorLayer model's own float output on photos."""
import functools
import json
import shutil

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
    fns = {("relu", None): t.nn.relu, ("relu6", None): t.nn.relu6, ("softmax", None): t.nn.softmax,
           ("add", None): t.add}
    with h5py.File(src, "r") as f:
        cfg = read_config(f.attrs["model_config"])
    for layer in cfg["model_architecture"]:
        a = layer["args"]
        if "dtype" in a:
            a["dtype"] = t.float32                    # str() writes it bare: tf.float32
        for k in ("act", "combine_fn"):
            if k in a:
                a[k] = ("is_Func", func2str(fns[a[k]]))
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

"""TensorLayer 2.x `tl.models.Model` (static) -> ONNX through tf.function + tf2onnx.

Applies the BatchNorm graph-capture fix TensorLayer 2.2.5 needs: after `model.eval()`, each
BatchNorm layer's moving_mean/moving_var are pointed back at the real variables in its weights
(TL 2.2.5 swaps them during build and capture then fails with "Can not convert a NoneType")."""
from pathlib import Path

from tl2k210.errors import Tl2k210Error

from . import ModelLoadError, tf_convert


def fix_batchnorm(model):
    from tensorlayer.layers import BatchNorm
    for layer in model.all_layers:
        if isinstance(layer, BatchNorm):
            ws = {w.name.split("/")[-1].split(":")[0]: w for w in layer.all_weights}
            layer.moving_mean, layer.moving_var = ws["moving_mean"], ws["moving_var"]
    return model


def _name(n):
    return n.decode("utf8") if isinstance(n, bytes) else str(n)


def _h5_arrays(group):
    """Weights of a TensorLayer hdf5 file in layer order (TL's own in-order loader breaks on
    h5py 3: it calls .decode on str)."""
    out = []
    for layer in (_name(n) for n in group.attrs["layer_names"]):
        g = group[layer]
        if "layer_names" in g.attrs:
            out += _h5_arrays(g)
        else:
            out += [g[_name(w)][()] for w in g.attrs.get("weight_names", [])]
    return out


def load_weights(model, path):
    """TensorLayer weight file (npz with 'params' in layer order, or TL hdf5) into `model`."""
    import numpy as np
    path = Path(path)
    try:
        if path.suffix.lower() == ".npz":
            from tl2k210.arrays import load_params
            params = load_params(path)
        else:
            import h5py
            with h5py.File(path, "r") as f:
                if "layer_names" not in f.attrs:
                    raise ModelLoadError(f"{path}: not a TensorLayer hdf5 weight file (no 'layer_names'); "
                                         "a Keras .h5 model loads without network=")
                params = _h5_arrays(f)
        ws = model.all_weights
        if len(params) != len(ws):
            raise ModelLoadError(f"{path}: {len(params)} arrays but the network has {len(ws)} weights")
        for i, (w, p) in enumerate(zip(ws, params)):
            if tuple(w.shape) != np.shape(p):
                raise ModelLoadError(f"{path}: array {i} has shape {np.shape(p)}, weight {w.name} "
                                     f"expects {tuple(w.shape)}")
            w.assign(np.asarray(p, np.float32))
    except Tl2k210Error:
        raise
    except Exception as e:
        raise ModelLoadError(f"{path}: cannot read TensorLayer weights: {type(e).__name__}: {e}") from e
    return model


def _static_input_shape(model):
    shapes = [tuple(t.shape) for t in model._inputs] if isinstance(model._inputs, list) else [tuple(model._inputs.shape)]
    if len(shapes) != 1:
        raise ModelLoadError("TensorLayer model with several inputs is not supported (one image input)")
    return shapes[0]


def from_tensorlayer(model, weights=None, input_shape=None, opset=None, batch=1):
    """input_shape (NHWC) is needed only for a dynamic (subclassed) TensorLayer model."""
    import tensorflow as tf
    import tf2onnx
    if getattr(model, "_inputs", None) is None and input_shape is None:
        raise ModelLoadError("dynamic TensorLayer model: pass input_shape=(1, H, W, C)")
    if weights is not None:
        load_weights(model, weights)
    model.eval()
    fix_batchnorm(model)
    shape = (batch, *(input_shape or _static_input_shape(model))[1:])
    spec = [tf.TensorSpec(shape, tf.float32, name="input")]
    # a static Model's forward is plain Python over its layers (no tensor-dependent control flow):
    # tracing without AutoGraph's source rewrites gives the same graph, ~5 s sooner (the zoo's four
    # kmodels byte for byte)
    fn = tf.function(lambda x: model(x), input_signature=spec, autograph=False)
    kw = {"opset": opset} if opset else {}
    return tf_convert(getattr(model, "name", "tensorlayer model"), tf2onnx.convert.from_function, fn,
                      input_signature=spec, **kw)


def fast_layer_init():
    """Make TensorLayer layer construction cheap (idempotent; no effect on what it builds).

    Every TL 2.2.5 layer calls `inspect.stack()` two or three times in its constructor (to record
    its init arguments and to guard "protected" methods). `inspect.stack()` reads the source
    context of every frame, and for frames of files loaded outside `sys.modules` (the zoo's
    network.py, test modules) scans all of `sys.modules` (thousands of entries once TensorFlow is
    imported) per frame: a MobileNetV1 took 5 s to construct under pytest, 0.3 s with this. TL only
    uses the frames of the stack, so it gets the same frames without the source lookups."""
    import inspect
    import sys
    import types
    try:
        from tensorlayer.decorators import method_decorator
        from tensorlayer.layers import core
    except ImportError:
        return
    if getattr(core.inspect, "_tl2k210_fast", False):
        return

    def stack(context=1):
        f, out = sys._getframe(1), []
        while f is not None:
            out.append(inspect.FrameInfo(f, f.f_code.co_filename, f.f_lineno, f.f_code.co_name, None, None))
            f = f.f_back
        return out

    shim = types.ModuleType("inspect")
    shim.__dict__.update(inspect.__dict__)
    shim.stack, shim._tl2k210_fast = stack, True
    core.inspect = method_decorator.inspect = shim

"""Keras models (objects, `.keras`, `.h5`) through tf2onnx.from_keras, batch fixed to 1."""
from . import ModelLoadError, tf_convert


def load_keras(path):
    import keras
    try:
        return keras.models.load_model(str(path), compile=False)
    except Exception as e:
        msg = str(e).strip().splitlines()
        hint = ("; it holds TensorLayer weights: load_model(path, network=your_tl_model)"
                if _is_tensorlayer_h5(path) else "")
        raise ModelLoadError(f"{path}: Keras could not load it: {type(e).__name__}: {msg[0] if msg else ''}"
                             f"{hint}") from e


def _is_tensorlayer_h5(path):
    try:
        import h5py
        with h5py.File(path, "r") as f:
            return "layer_names" in f.attrs and "model_config" not in f.attrs
    except Exception:
        return False


def from_keras(model, opset=None, batch=1):
    import tensorflow as tf
    where = getattr(model, "name", "keras model")
    if not hasattr(model, "inputs"):
        where = str(model)
        model = load_keras(model)
    spec = tuple(tf.TensorSpec((batch, *t.shape[1:]), t.dtype, name=t.name.split(":")[0]) for t in model.inputs)
    import tf2onnx
    kw = {"opset": opset} if opset else {}
    return tf_convert(where, tf2onnx.convert.from_keras, model, input_signature=spec, **kw)
